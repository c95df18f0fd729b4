//! A link between processes of one machine through CUDA IPC, for when NCCL cannot be used:
//! two processes on one GPU (NCCL refuses two ranks on one device), or a host without NCCL.
//! It offers what the GPU sync needs of a communicator: broadcasts from rank 0, an
//! all-reduce (max) of a few words, and the two gathers of a sharded trainer's ranks
//! (`gather.rs`, through the host).
//!
//! The root (rank 0) owns `slots` staging buffers on its GPU and exports them, with one
//! "filled" event each, by CUDA IPC handles; every other rank maps them. Whoever holds those
//! handles can read (and write) the buffers, so the set-up ([`crate::ipc_setup`]) hands them
//! only to a rank that proved it holds the shared [`Secret`], over loopback only. A broadcast is cut
//! into slot-sized pieces; piece `seq` goes through slot `seq % slots`:
//!
//! - root: once every rank has reported piece `seq - slots` drained, copies the piece into the
//!   slot on its stream, records "filled", and sends `Filled{seq, len, slot}` on each rank's
//!   TCP connection;
//! - each rank: reads that frame, makes its stream wait for "filled", copies the slot into
//!   its destination and records an event of its own; when that copy has completed (at the
//!   latest before it needs the slot's next piece) it sends `Drained{seq}`.
//!
//! No rank synchronises its GPU per piece: the root runs up to `slots` pieces ahead, and a
//! rank reports its copies in batches, when it waits for its stream anyway. The all-reduce is
//! host-side: each rank's words go to the root by TCP, the maximum comes back.
//!
//! Only the root exports anything, so the others must let go first: a rank releases what it
//! mapped and says `Bye` when the sender closes the sync ([`IpcComm::leave`], on the close
//! header), when it reads the root's `Bye`, or when it is dropped; the root's `leave` (on
//! `close`) and drop say `Bye` and wait, a few seconds at most, for every rank's `Bye` or end
//! of connection before freeing the slots.
//!
//! A lost peer closes its connection: reads fail with [`CudaError::Link`] and the sync that
//! was running fails (receivers undo what they applied). Every wait, on a socket or on the
//! GPU, is bounded by a timeout.

use std::collections::VecDeque;
use std::net::{Shutdown, TcpStream};
use std::time::Duration;

use cudarc::driver::{result as cu, sys};

use crate::error::{CudaError, Result};
use crate::gpu::{drv, guarded, release_in};
use crate::ipc_frame::{Frame, IPC_HANDLE_BYTES, MAX_REDUCE_WORDS, MAX_SLOTS};
use crate::ipc_setup::{
    await_bye, confirm_joined, join_root, link, loopback_addresses, read_frame, unexpected,
    write_frame, Refusal, RootListener, Staging, DEFAULT_HANDSHAKE_TIMEOUT,
};
use crate::sync::u64s;
use crate::wait::{event_done, poll, Deadline};
use crate::{DeviceBuffer, DevicePtr, Gpu};
pub use deltacast_net::{generate_token, Secret, SECRET_ENV};

mod gather;

/// Staging of the root: how many slots, of how many bytes, the timeout of the set-up and of
/// each wait for a peer, and (root) how long one connection may take to authenticate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpcOptions {
    pub slots: u64,
    pub slot_bytes: u64,
    pub timeout: Duration,
    pub handshake_timeout: Duration,
}

impl IpcOptions {
    /// Refuses a rank outside `0..nranks`, fewer than 2 ranks, and staging out of bounds
    /// (before anything touches the GPU).
    pub fn check(&self, nranks: usize, rank: usize) -> Result<()> {
        if nranks < 2 || rank >= nranks {
            return Err(CudaError::InvalidArgument(format!(
                "rank {rank} of {nranks} (an IPC link joins at least 2 ranks)"
            )));
        }
        if self.slots == 0 || self.slots > MAX_SLOTS || self.slot_bytes < 256 {
            return Err(CudaError::InvalidArgument(format!(
                "{} staging slots of {} bytes (1 to {MAX_SLOTS} slots, at least 256 bytes)",
                self.slots, self.slot_bytes
            )));
        }
        Ok(())
    }
}

impl Default for IpcOptions {
    /// Four slots of 64 MiB: pieces large enough that a copy dwarfs its frame, enough slots
    /// that the root runs a few pieces ahead of the slowest rank.
    fn default() -> Self {
        IpcOptions {
            slots: 4,
            slot_bytes: 64 << 20,
            timeout: Duration::from_secs(300),
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
        }
    }
}

/// How long the root waits for the other ranks to let go of its slots, and a rank for its
/// copies out of them, before freeing anyway.
const FAREWELL: Duration = Duration::from_secs(10);

/// One staging slot as this rank sees it.
struct Slot {
    /// The root's buffer (owned there, mapped by the others).
    ptr: DevicePtr,
    /// The root's "filled" event (opened from its handle by the others).
    filled: sys::CUevent,
    /// Others: recorded after their copy out of the slot (an event of their own).
    copied: sys::CUevent,
}

/// A piece of a broadcast in parts: its slot, its bytes (root: filled so far; others: as
/// announced) and, on the other ranks, how many of them were copied out.
#[derive(Debug, Clone, Copy)]
struct OpenPiece {
    slot: usize,
    len: u64,
    used: u64,
}

/// One rank of an IPC link (see the module documentation).
pub struct IpcComm {
    rank: usize,
    nranks: usize,
    /// The device's primary context, retained here (released on drop, after the slots): the
    /// `Gpu` this link was made with may be dropped first.
    device: sys::CUdevice,
    ctx: sys::CUcontext,
    /// Root: the connection of each other rank (index rank - 1). Others: the root's, alone.
    peers: Vec<TcpStream>,
    /// Root: pieces each other rank has reported drained (index rank - 1).
    drained_upto: Vec<u64>,
    slots: Vec<Slot>,
    /// Root: the slots' memory (the `Slot::ptr`s).
    owned: Vec<DeviceBuffer>,
    /// Others: pieces copied but not yet reported drained, oldest first: (seq, slot).
    pending: VecDeque<(u64, usize)>,
    slot_bytes: u64,
    timeout: Duration,
    /// Pieces broadcast so far (both sides count the same).
    seq: u64,
    /// The piece being filled (root) or emptied (others) by a broadcast in parts.
    open: Option<OpenPiece>,
    /// Set by a failure: the connections are shut for writing, nothing more is sent.
    aborted: bool,
    /// Set by `leave`: the farewell is done (what was mapped is released).
    left: bool,
    /// Root: connections turned away during the set-up (the first few).
    refused: Vec<Refusal>,
}

// SAFETY: a context handle, event handles and sockets; the driver API is thread-safe and
// every method takes `&mut self`.
unsafe impl Send for IpcComm {}
unsafe impl Sync for IpcComm {}

fn words_bytes(words: &[u64]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

fn new_event(interprocess: bool) -> Result<sys::CUevent> {
    let mut flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
    if interprocess {
        // An IPC event must also disable timing.
        flags |= sys::CUevent_flags::CU_EVENT_INTERPROCESS as u32;
    }
    let mut ev: sys::CUevent = std::ptr::null_mut();
    // SAFETY: writes one event handle.
    unsafe { sys::cuEventCreate(&mut ev, flags) }
        .result()
        .map_err(drv("cuEventCreate"))?;
    Ok(ev)
}

fn event_handle(ev: sys::CUevent) -> Result<[u8; IPC_HANDLE_BYTES]> {
    let mut h = sys::CUipcEventHandle_st { reserved: [0; 64] };
    // SAFETY: an IPC event of ours; writes one handle.
    unsafe { sys::cuIpcGetEventHandle(&mut h, ev) }
        .result()
        .map_err(drv("cuIpcGetEventHandle"))?;
    Ok(h.reserved.map(|c| c as u8))
}

fn open_event(bytes: &[u8]) -> Result<sys::CUevent> {
    let mut h = sys::CUipcEventHandle_st { reserved: [0; 64] };
    for (d, &s) in h.reserved.iter_mut().zip(bytes) {
        *d = s as std::ffi::c_char;
    }
    let mut ev: sys::CUevent = std::ptr::null_mut();
    // SAFETY: writes one event handle; the driver checks the handle it is given.
    unsafe { sys::cuIpcOpenEventHandle(&mut ev, h) }
        .result()
        .map_err(drv("cuIpcOpenEventHandle"))?;
    Ok(ev)
}

fn mem_handle(ptr: DevicePtr) -> Result<[u8; IPC_HANDLE_BYTES]> {
    let mut h = sys::CUipcMemHandle_st { reserved: [0; 64] };
    // SAFETY: `ptr` is the base of a cuMemAlloc allocation of ours; writes one handle.
    unsafe { sys::cuIpcGetMemHandle(&mut h, ptr) }
        .result()
        .map_err(drv("cuIpcGetMemHandle"))?;
    Ok(h.reserved.map(|c| c as u8))
}

fn open_mem(bytes: &[u8]) -> Result<DevicePtr> {
    let mut h = sys::CUipcMemHandle_st { reserved: [0; 64] };
    for (d, &s) in h.reserved.iter_mut().zip(bytes) {
        *d = s as std::ffi::c_char;
    }
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: writes one address; the driver checks the handle. Lazy peer access lets a
    // rank on another GPU of the machine map it too.
    unsafe {
        sys::cuIpcOpenMemHandle_v2(
            &mut ptr,
            h,
            sys::CUipcMem_flags::CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS as u32,
        )
    }
    .result()
    .map_err(drv("cuIpcOpenMemHandle"))?;
    Ok(ptr)
}

/// The size of the allocation `ptr` starts (a mapped slot's, to check the root's word).
fn allocation_bytes(ptr: DevicePtr) -> Result<u64> {
    let (mut base, mut size): (sys::CUdeviceptr, usize) = (0, 0);
    // SAFETY: writes one address and one size.
    unsafe { sys::cuMemGetAddressRange_v2(&mut base, &mut size, ptr) }
        .result()
        .map_err(drv("cuMemGetAddressRange"))?;
    Ok(if base == ptr { size as u64 } else { 0 })
}

impl IpcComm {
    /// Joins the link at `address` (a loopback `host:port`; any other is refused) as `rank`
    /// of `nranks`, on `gpu`'s device: rank 0 listens there and sets up the staging, the
    /// others connect (retrying until the root listens). Every connection first proves it
    /// holds `secret` (and the root proves it to the rank): nothing else is read from or
    /// sent to a peer that has not. Blocks until every rank has joined, at most
    /// `options.timeout`.
    pub fn new(
        gpu: &Gpu,
        address: &str,
        nranks: usize,
        rank: usize,
        secret: &Secret,
        options: IpcOptions,
    ) -> Result<IpcComm> {
        options.check(nranks, rank)?;
        let deadline = Deadline::after(options.timeout);
        // Before any GPU work: a refused address or a port in use fails at once.
        let listener = if rank == 0 {
            Some(RootListener::bind(address)?)
        } else {
            loopback_addresses(address)?;
            None
        };
        gpu.make_current()?;
        let device = guarded(|| cu::device::get(gpu.ordinal() as i32).map_err(drv("cuDeviceGet")))?;
        // SAFETY: retains the primary context of a valid device; released in `drop`.
        let ctx = guarded(|| {
            unsafe { cu::primary_ctx::retain(device) }.map_err(drv("cuDevicePrimaryCtxRetain"))
        })?;
        let mut comm = IpcComm {
            rank,
            nranks,
            device,
            ctx,
            peers: Vec::new(),
            drained_upto: vec![0; nranks - 1],
            slots: Vec::new(),
            owned: Vec::new(),
            pending: VecDeque::new(),
            slot_bytes: options.slot_bytes,
            timeout: options.timeout,
            seq: 0,
            open: None,
            aborted: false,
            left: false,
            refused: Vec::new(),
        };
        let joined = match &listener {
            Some(l) => comm.set_up_root(gpu, l, secret, options, deadline),
            None => comm.set_up_rank(address, secret, deadline),
        };
        joined.inspect_err(|_| comm.abort())?;
        Ok(comm)
    }

    pub fn rank(&self) -> usize {
        self.rank
    }

    pub fn nranks(&self) -> usize {
        self.nranks
    }

    /// Root: the connections turned away during the set-up because they did not authenticate
    /// (the first [`crate::ipc_setup::MAX_KEPT_REFUSALS`]; all are logged). Empty elsewhere.
    pub fn refused(&self) -> &[Refusal] {
        &self.refused
    }

    fn set_up_root(
        &mut self,
        gpu: &Gpu,
        listener: &RootListener,
        secret: &Secret,
        options: IpcOptions,
        deadline: Deadline,
    ) -> Result<()> {
        for _ in 0..options.slots {
            let buf = gpu.alloc(options.slot_bytes as usize)?;
            self.slots.push(Slot {
                ptr: buf.ptr(),
                filled: guarded(|| new_event(true))?,
                copied: std::ptr::null_mut(),
            });
            self.owned.push(buf);
        }
        let mut handles = Vec::with_capacity(2 * self.slots.len() * IPC_HANDLE_BYTES);
        for s in &self.slots {
            handles.extend_from_slice(&guarded(|| mem_handle(s.ptr))?);
        }
        for s in &self.slots {
            handles.extend_from_slice(&guarded(|| event_handle(s.filled))?);
        }
        let staging = Staging {
            slots: options.slots,
            slot_bytes: options.slot_bytes,
            handles: &handles,
        };
        let joined = listener.accept_ranks(
            self.nranks,
            secret,
            staging,
            deadline.left(),
            options.handshake_timeout,
        )?;
        self.peers = joined.peers;
        self.refused = joined.refused;
        Ok(())
    }

    fn set_up_rank(&mut self, address: &str, secret: &Secret, deadline: Deadline) -> Result<()> {
        let (mut s, offered) = join_root(address, self.rank, self.nranks, secret, deadline.left())?;
        self.slot_bytes = offered.slot_bytes;
        for i in 0..offered.slots as usize {
            let (m, e) = offered.slot(i);
            let ptr = guarded(|| open_mem(m))?;
            // Kept at once, so that a failure below still releases what was opened (Drop).
            self.slots.push(Slot {
                ptr,
                filled: std::ptr::null_mut(),
                copied: std::ptr::null_mut(),
            });
            let mapped = guarded(|| allocation_bytes(ptr))?;
            if mapped < offered.slot_bytes {
                return Err(CudaError::Protocol(format!(
                    "IPC link: the root announces slots of {} bytes, one maps {mapped}",
                    offered.slot_bytes
                )));
            }
            let k = self.slots.len() - 1;
            self.slots[k].filled = guarded(|| open_event(e))?;
            self.slots[k].copied = guarded(|| new_event(false))?;
        }
        confirm_joined(&mut s, offered.slots)?;
        self.peers.push(s);
        Ok(())
    }

    /// Another call between the parts of a broadcast would desynchronise the ranks.
    fn no_open_broadcast(&self) -> Result<()> {
        match self.open {
            None => Ok(()),
            Some(_) => Err(CudaError::InvalidArgument(
                "IPC link: a broadcast in parts is not ended (broadcast_end)".into(),
            )),
        }
    }

    fn live(&self) -> Result<()> {
        if self.left {
            return Err(link("link", "closed by the sender; make a new one"));
        }
        if self.aborted {
            return Err(link(
                "link",
                "aborted after an earlier failure; make a new one",
            ));
        }
        // SAFETY: our context (retained in `new`, released in `drop`).
        guarded(|| unsafe { cu::ctx::set_current(self.ctx) }.map_err(drv("cuCtxSetCurrent")))
    }

    /// Broadcasts `len` bytes from the root's `src` into every rank's `dst`, enqueued on
    /// `stream`. Waits at most `within`: the root, for the ranks to drain the slots it needs;
    /// another rank, for each piece to be announced. Returns once every piece is enqueued.
    ///
    /// # Safety
    /// `src` (root) and `dst` must be device memory of this rank's GPU, valid for `len` bytes
    /// until the stream has passed the broadcast.
    pub unsafe fn broadcast(
        &mut self,
        src: DevicePtr,
        dst: DevicePtr,
        len: usize,
        root: usize,
        stream: u64,
        within: Duration,
    ) -> Result<()> {
        // SAFETY: per this function's contract.
        unsafe { self.broadcast_part(src, dst, len as u64, root, stream, within)? };
        self.broadcast_end(stream)
    }

    /// One segment of a broadcast in parts, laid after the ones before it through the slots,
    /// so that many small tensors share a piece (each piece costs a message and a wait,
    /// whatever its size); [`IpcComm::broadcast_end`] ends the broadcast (a part may lie in a
    /// piece not yet announced until then). Both ends must broadcast the same parts.
    ///
    /// # Safety
    /// As [`IpcComm::broadcast`]; `src` (root) must stay unchanged until the stream has
    /// passed the copy of this part into the slots.
    pub unsafe fn broadcast_part(
        &mut self,
        src: DevicePtr,
        dst: DevicePtr,
        len: u64,
        root: usize,
        stream: u64,
        within: Duration,
    ) -> Result<()> {
        self.live()?;
        if root != 0 {
            return Err(CudaError::InvalidArgument(format!(
                "an IPC link broadcasts from rank 0, not {root}"
            )));
        }
        let deadline = Deadline::after(within);
        let stream = stream as sys::CUstream;
        let done = if self.rank == 0 {
            // SAFETY: per this function's contract.
            unsafe { self.send_part(src, dst, len, stream, deadline) }
        } else {
            // SAFETY: per this function's contract.
            unsafe { self.take_part(dst, len, stream, deadline) }
        };
        done.inspect_err(|_| self.abort())
    }

    /// Ends a broadcast in parts: the root announces its last piece; another rank checks
    /// that it took the whole of the root's last piece.
    pub fn broadcast_end(&mut self, stream: u64) -> Result<()> {
        self.live()?;
        let done = if self.rank == 0 {
            match self.open.take() {
                Some(piece) if piece.len > 0 => self.announce(piece, stream as sys::CUstream),
                _ => Ok(()),
            }
        } else if let Some(piece) = self.open.take() {
            Err(CudaError::Protocol(format!(
                "IPC link: the root's piece {} holds {} bytes, the broadcast ended after {}",
                self.seq, piece.len, piece.used
            )))
        } else {
            Ok(())
        };
        done.inspect_err(|_| self.abort())
    }

    /// Root: one part into the slots, announcing each piece it fills.
    unsafe fn send_part(
        &mut self,
        src: DevicePtr,
        dst: DevicePtr,
        len: u64,
        stream: sys::CUstream,
        deadline: Deadline,
    ) -> Result<()> {
        if src != dst && len > 0 {
            // SAFETY: both valid for `len` (the caller's contract).
            guarded(|| {
                unsafe { cu::memcpy_dtod_async(dst, src, len as usize, stream) }
                    .map_err(drv("cuMemcpyDtoDAsync"))
            })?;
        }
        let nslots = self.slots.len() as u64;
        let mut at = 0;
        while at < len {
            let piece = match self.open.take() {
                Some(p) => p,
                None => {
                    let seq = self.seq;
                    if seq >= nslots {
                        // Every rank's copy of the slot's last piece has completed.
                        self.await_drained(seq - nslots, deadline)?;
                    }
                    OpenPiece {
                        slot: (seq % nslots) as usize,
                        len: 0,
                        used: 0,
                    }
                }
            };
            let n = (len - at).min(self.slot_bytes - piece.len);
            let to = self.slots[piece.slot].ptr + piece.len;
            guarded(|| {
                // SAFETY: `to..to + n` lies in the slot (piece.len + n <= slot_bytes);
                // `src + at..` in the source (at + n <= len).
                unsafe { cu::memcpy_dtod_async(to, src + at, n as usize, stream) }
                    .map_err(drv("cuMemcpyDtoDAsync"))
            })?;
            at += n;
            let piece = OpenPiece {
                len: piece.len + n,
                ..piece
            };
            if piece.len == self.slot_bytes {
                self.announce(piece, stream)?;
            } else {
                self.open = Some(piece);
            }
        }
        Ok(())
    }

    /// Root: records the piece's "filled" event and tells every rank where it is.
    fn announce(&mut self, piece: OpenPiece, stream: sys::CUstream) -> Result<()> {
        let filled = self.slots[piece.slot].filled;
        guarded(|| {
            // SAFETY: our event and the caller's stream.
            unsafe { cu::event::record(filled, stream) }.map_err(drv("cuEventRecord"))
        })?;
        let seq = self.seq;
        for p in &mut self.peers {
            write_frame(
                p,
                Frame::Filled {
                    seq,
                    len: piece.len,
                    slot: piece.slot as u64,
                },
                &[],
            )?;
        }
        self.seq += 1;
        Ok(())
    }

    /// Root: reads frames until every rank has drained piece `seq`.
    fn await_drained(&mut self, seq: u64, deadline: Deadline) -> Result<()> {
        for i in 0..self.peers.len() {
            while self.drained_upto[i] <= seq {
                let (f, _) = read_frame(&mut self.peers[i], deadline, "a rank taking a piece")?;
                self.drained(i, f)?;
            }
        }
        Ok(())
    }

    /// Root: takes rank `i + 1`'s frame `f` as a drained piece (they come in order, and
    /// only for pieces sent).
    fn drained(&mut self, i: usize, f: Frame) -> Result<()> {
        match f {
            Frame::Drained { seq } if seq == self.drained_upto[i] && seq < self.seq => {
                self.drained_upto[i] += 1;
                Ok(())
            }
            Frame::Bye => Err(link("read", format!("rank {} left the link", i + 1))),
            f => Err(unexpected(f, "a drained piece, in order")),
        }
    }

    /// Another rank: reads the root's next frame; a `Bye` releases what was mapped, answers
    /// it and fails.
    fn read_from_root(
        &mut self,
        deadline: Deadline,
        what: &'static str,
    ) -> Result<(Frame, Vec<u8>)> {
        let got = read_frame(&mut self.peers[0], deadline, what)?;
        if got.0 == Frame::Bye {
            self.leave();
            return Err(link("read", format!("the root closed the link ({what})")));
        }
        Ok(got)
    }

    /// Another rank: reports, in order, the copies that have completed; with `all`, waits for
    /// every one first (at most the link's timeout).
    fn report_drained(&mut self, all: bool) -> Result<()> {
        let deadline = Deadline::after(self.timeout);
        while let Some(&(seq, k)) = self.pending.front() {
            let ev = self.slots[k].copied;
            if all {
                poll(deadline, "a copy out of a slot", || event_done(ev))?;
            } else if !event_done(ev)? {
                break;
            }
            write_frame(&mut self.peers[0], Frame::Drained { seq }, &[])?;
            self.pending.pop_front();
        }
        Ok(())
    }

    /// Another rank: one part out of the slots, taking the root's pieces as they come.
    unsafe fn take_part(
        &mut self,
        dst: DevicePtr,
        len: u64,
        stream: sys::CUstream,
        deadline: Deadline,
    ) -> Result<()> {
        let mut at = 0;
        while at < len {
            let piece = match self.open.take() {
                Some(p) => p,
                None => self.next_piece(stream, deadline)?,
            };
            let n = (len - at).min(piece.len - piece.used);
            let from = self.slots[piece.slot].ptr + piece.used;
            guarded(|| {
                // SAFETY: `dst + at..` lies in the destination (caller's contract, at + n <=
                // len); `from..from + n` in the slot, which maps at least `slot_bytes` >=
                // piece.len bytes (checked when mapped and in `next_piece`).
                unsafe { cu::memcpy_dtod_async(dst + at, from, n as usize, stream) }
                    .map_err(drv("cuMemcpyDtoDAsync"))
            })?;
            at += n;
            let piece = OpenPiece {
                used: piece.used + n,
                ..piece
            };
            if piece.used == piece.len {
                let copied = self.slots[piece.slot].copied;
                guarded(|| {
                    // SAFETY: our event, the caller's stream.
                    unsafe { cu::event::record(copied, stream) }.map_err(drv("cuEventRecord"))
                })?;
                self.pending.push_back((self.seq, piece.slot));
                self.seq += 1;
            } else {
                self.open = Some(piece);
            }
        }
        Ok(())
    }

    /// Another rank: reports the copies the root waits for, reads the next piece's `Filled`
    /// (its number and slot ours to expect, its length at most a slot) and makes the stream
    /// wait for it.
    fn next_piece(&mut self, stream: sys::CUstream, deadline: Deadline) -> Result<OpenPiece> {
        let nslots = self.slots.len() as u64;
        // The root refills a slot only after our copy of its last piece: report it.
        while self
            .pending
            .front()
            .is_some_and(|&(seq, _)| seq + nslots <= self.seq)
        {
            let (seq, k) = self.pending[0];
            let ev = self.slots[k].copied;
            poll(
                Deadline::after(self.timeout),
                "a copy out of a slot",
                || event_done(ev),
            )?;
            write_frame(&mut self.peers[0], Frame::Drained { seq }, &[])?;
            self.pending.pop_front();
        }
        let (f, _) = self.read_from_root(deadline, "the next piece of a broadcast")?;
        let k = (self.seq % nslots) as usize;
        match f {
            Frame::Filled { seq, len, slot }
                if seq == self.seq && slot == k as u64 && len > 0 && len <= self.slot_bytes =>
            {
                let filled = self.slots[k].filled;
                guarded(|| {
                    // SAFETY: the root's event; its last record is this piece's copy (it
                    // records it again only after our `Drained` for this piece).
                    unsafe {
                        cu::stream::wait_event(
                            stream,
                            filled,
                            sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                        )
                    }
                    .map_err(drv("cuStreamWaitEvent"))
                })?;
                Ok(OpenPiece {
                    slot: k,
                    len,
                    used: 0,
                })
            }
            f => Err(unexpected(
                f,
                &format!(
                    "piece {} in slot {k}, of 1 to {} bytes",
                    self.seq, self.slot_bytes
                ),
            )),
        }
    }

    /// Element-wise maximum of `count` u64 at `buf` over every rank, in place. Waits for
    /// `stream` first (the words are read on the host), and leaves the result written when
    /// it returns.
    ///
    /// # Safety
    /// `buf` must be device memory valid for `count` u64.
    pub unsafe fn all_reduce_max_u64(
        &mut self,
        buf: DevicePtr,
        count: usize,
        stream: u64,
    ) -> Result<()> {
        self.live()?;
        self.no_open_broadcast()?;
        if count as u64 > MAX_REDUCE_WORDS {
            return Err(CudaError::InvalidArgument(format!(
                "an IPC all-reduce of {count} words (at most {MAX_REDUCE_WORDS})"
            )));
        }
        // SAFETY: per this function's contract.
        let done = unsafe { self.reduce(buf, count, stream) };
        done.inspect_err(|_| self.abort())
    }

    unsafe fn reduce(&mut self, buf: DevicePtr, count: usize, stream: u64) -> Result<()> {
        let deadline = Deadline::after(self.timeout);
        // SAFETY: `buf` holds `count` words (caller's contract).
        let mut words = u64s(&unsafe { gather::download_after(buf, count * 8, stream, deadline)? });
        let words_frame = Frame::Reduce {
            words: count as u64,
        };
        if self.rank == 0 {
            for i in 0..self.peers.len() {
                let got = loop {
                    let (f, trailer) = read_frame(&mut self.peers[i], deadline, "a rank's ack")?;
                    if f == words_frame {
                        break u64s(&trailer);
                    }
                    self.drained(i, f)?;
                };
                for (w, g) in words.iter_mut().zip(got) {
                    *w = (*w).max(g);
                }
            }
            let out = words_bytes(&words);
            for p in &mut self.peers {
                write_frame(
                    p,
                    Frame::Reduced {
                        words: count as u64,
                    },
                    &out,
                )?;
            }
        } else {
            self.report_drained(true)?;
            write_frame(&mut self.peers[0], words_frame, &words_bytes(&words))?;
            let (f, trailer) = self.read_from_root(deadline, "the all-reduce's result")?;
            if f != (Frame::Reduced {
                words: count as u64,
            }) {
                return Err(unexpected(f, "the all-reduce's result"));
            }
            words = u64s(&trailer);
        }
        // SAFETY: `buf` holds `count` words (caller's contract).
        unsafe { gather::upload_and_wait(&[(buf, &words_bytes(&words))], stream, deadline) }
    }

    /// Waits until `event` (recorded on the stream after the link's calls) has completed; after
    /// `timeout`, or on an error, aborts the link so that no rank stays blocked in it. Then
    /// reports the copies that have completed (other ranks).
    pub fn wait(&mut self, event: u64, timeout: Duration, what: &'static str) -> Result<()> {
        self.live()?;
        let waited = poll(Deadline::after(timeout), what, || {
            event_done(event as sys::CUevent)
        })
        .and_then(|()| {
            if self.rank == 0 {
                Ok(())
            } else {
                self.report_drained(false)
            }
        });
        waited.inspect_err(|_| self.abort())
    }

    /// How long to wait for a broadcast's bytes once its call returned, for a caller that
    /// would otherwise wait `idle` (for a sync to start): here the announcement came within
    /// the call, so the bytes follow within the link's timeout.
    pub fn announced_wait(&self, _idle: Duration) -> Duration {
        self.timeout
    }

    /// Ends this rank's part in the link, orderly: another rank waits for its copies,
    /// releases what it mapped of the root's and says `Bye`; the root says `Bye` and waits
    /// (at most a few seconds) for each rank's, so that none still maps its slots when they
    /// are freed. Later calls fail; dropping is then quick.
    pub fn leave(&mut self) {
        if self.left {
            return;
        }
        if self.rank == 0 {
            let deadline = Deadline::after(self.timeout.min(FAREWELL));
            for p in &mut self.peers {
                if !self.aborted && write_frame(p, Frame::Bye, &[]).is_err() {
                    continue;
                }
                await_bye(p, deadline);
            }
        } else {
            self.release_mapped();
            if let Some(root) = self.peers.first_mut().filter(|_| !self.aborted) {
                let _ = write_frame(root, Frame::Bye, &[]);
            }
        }
        for p in &self.peers {
            let _ = p.shutdown(Shutdown::Both);
        }
        self.left = true;
    }

    /// After a failure: shuts the connections for writing, so that every peer's next read
    /// fails and none waits for this rank (reading stays open for the farewell on drop).
    pub fn abort(&mut self) {
        if !self.aborted {
            for p in &self.peers {
                let _ = p.shutdown(Shutdown::Write);
            }
            self.aborted = true;
        }
    }

    /// Another rank: waits (a few seconds at most) for its copies out of the slots, then
    /// closes what it opened of the root's, once.
    fn release_mapped(&mut self) {
        if self.rank == 0 {
            return;
        }
        let slots = std::mem::take(&mut self.slots);
        self.pending.clear();
        let deadline = Deadline::after(self.timeout.min(FAREWELL));
        release_in(self.ctx, || {
            for s in &slots {
                if !s.copied.is_null() {
                    let _ = poll(deadline, "a copy out of a slot", || event_done(s.copied));
                }
            }
            // SAFETY: each handle was opened (or created) here and is released once, after
            // the copies out of its slot (waited for above, or given up on).
            unsafe {
                for s in &slots {
                    for ev in [s.filled, s.copied] {
                        if !ev.is_null() {
                            let _ = cu::event::destroy(ev);
                        }
                    }
                    if s.ptr != 0 {
                        let _ = sys::cuIpcCloseMemHandle(s.ptr);
                    }
                }
            }
        });
    }
}

impl Drop for IpcComm {
    fn drop(&mut self) {
        self.leave();
        let slots = std::mem::take(&mut self.slots);
        let owned = std::mem::take(&mut self.owned);
        let device = self.device;
        let deadline = Deadline::after(self.timeout.min(FAREWELL));
        release_in(self.ctx, || {
            // The root's own copies into the slots first (a few seconds at most).
            for s in &slots {
                let _ = poll(deadline, "a copy into a slot", || event_done(s.filled));
            }
            // SAFETY: the root's own events and memory, released once.
            unsafe {
                for s in &slots {
                    if !s.filled.is_null() {
                        let _ = cu::event::destroy(s.filled);
                    }
                }
            }
            drop(owned);
            // SAFETY: the retain of `new`, released once, after everything of this context.
            let _ = unsafe { cu::primary_ctx::release(device) };
        });
    }
}
