//! The two gathers a sharded trainer's ranks make (see `sync::sharded`), over the IPC link:
//! through the root's connections, on the host. Unlike a broadcast's, these bytes are few
//! (rows of a plan) or one rank's encoded changes, and the ranks of one machine share its
//! memory, so going through the host costs a copy each way and keeps the link one-directional
//! on the GPU (only the root exports memory). Each call completes before it returns.

use cudarc::driver::{result as cu, sys};

use super::IpcComm;
use crate::error::{CudaError, Result};
use crate::gpu::{drv, guarded};
use crate::ipc_frame::Frame;
use crate::ipc_setup::{read_exact, read_frame, unexpected, write_frame};
use crate::protocol::check_gather;
use crate::wait::{poll, stream_done, Deadline};
use crate::DevicePtr;

impl IpcComm {
    /// Every rank's `count` u64 at `src`, side by side in rank order in every rank's `dst`
    /// (`nranks * count` u64), as `NcclComm::all_gather_u64` does; written when it returns.
    ///
    /// # Safety
    /// `src` (`count` u64) and `dst` (`nranks * count` u64) must be device memory of this
    /// rank's GPU; `stream` a live stream of its context.
    pub unsafe fn all_gather_u64(
        &mut self,
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        stream: u64,
    ) -> Result<()> {
        self.live()?;
        self.no_open_broadcast()?;
        // SAFETY: per this function's contract.
        let done = unsafe { self.gather_rows(src, dst, count, stream) };
        done.inspect_err(|_| self.abort())
    }

    /// Gathers to the root (rank 0) exactly the bytes every rank holds: rank r's `lens[r]`
    /// bytes at its `src` land in the root's `dst` right after those of the ranks before it,
    /// as `NcclComm::gather_exact` does. Every rank passes the same `lens`; the root refuses,
    /// before anything moves, lengths whose sum does not fit `dst_len`, and reads from each
    /// rank exactly its length. Complete when it returns.
    ///
    /// # Safety
    /// `src` must be device memory of this rank's GPU valid for `lens[rank]` bytes, and on the
    /// root `dst` for `dst_len` bytes; `stream` a live stream of its context.
    pub unsafe fn gather_exact(
        &mut self,
        src: DevicePtr,
        lens: &[u64],
        dst: DevicePtr,
        dst_len: u64,
        root: usize,
        stream: u64,
    ) -> Result<()> {
        self.live()?;
        self.no_open_broadcast()?;
        if root != 0 {
            return Err(CudaError::InvalidArgument(format!(
                "an IPC gather goes to rank 0, not {root}"
            )));
        }
        check_gather(lens, self.nranks, self.rank, root, dst_len)?;
        // SAFETY: per this function's contract.
        let done = unsafe { self.gather_parts(src, lens, dst, stream) };
        done.inspect_err(|_| self.abort())
    }

    unsafe fn gather_rows(
        &mut self,
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        stream: u64,
    ) -> Result<()> {
        let deadline = Deadline::after(self.timeout);
        let row = count * 8;
        // SAFETY: `src` holds `count` words (caller's contract).
        let mine = unsafe { download_after(src, row, stream, deadline)? };
        let all = if self.rank == 0 {
            let mut all = mine;
            for i in 0..self.peers.len() {
                all.extend(self.part_from_rank(i, row as u64, deadline, "a rank's row")?);
            }
            for p in &mut self.peers {
                write_frame(
                    p,
                    Frame::Part {
                        len: all.len() as u64,
                    },
                    &all,
                )?;
            }
            all
        } else {
            self.report_drained(true)?;
            write_frame(&mut self.peers[0], Frame::Part { len: row as u64 }, &mine)?;
            let want = (row * self.nranks) as u64;
            self.part_from_root(want, deadline)?
        };
        // SAFETY: `dst` holds `nranks * count` words (caller's contract).
        unsafe { upload_and_wait(&[(dst, &all)], stream, deadline) }
    }

    unsafe fn gather_parts(
        &mut self,
        src: DevicePtr,
        lens: &[u64],
        dst: DevicePtr,
        stream: u64,
    ) -> Result<()> {
        let deadline = Deadline::after(self.timeout);
        if self.rank != 0 {
            let len = lens[self.rank];
            if len == 0 {
                return Ok(());
            }
            let n = usize::try_from(len)
                .map_err(|_| CudaError::InvalidArgument(format!("gather: {len} bytes")))?;
            // SAFETY: `src` holds `len` bytes (caller's contract).
            let mine = unsafe { download_after(src, n, stream, deadline)? };
            self.report_drained(true)?;
            return write_frame(&mut self.peers[0], Frame::Part { len }, &mine);
        }
        if lens[0] > 0 {
            guarded(|| {
                // SAFETY: `src` holds lens[0] bytes and the start of `dst` as many (checked
                // in `gather_exact`).
                unsafe {
                    cu::memcpy_dtod_async(dst, src, lens[0] as usize, stream as sys::CUstream)
                }
                .map_err(drv("cuMemcpyDtoDAsync"))
            })?;
        }
        let mut parts = Vec::with_capacity(self.peers.len());
        let mut at = dst + lens[0];
        for (i, &len) in lens.iter().enumerate().skip(1) {
            if len > 0 {
                parts.push((
                    at,
                    self.part_from_rank(i - 1, len, deadline, "a rank's part")?,
                ));
            }
            at += len;
        }
        let parts: Vec<(DevicePtr, &[u8])> = parts.iter().map(|(p, b)| (*p, &b[..])).collect();
        // SAFETY: the parts tile `dst` after the root's own (checked in `gather_exact`).
        unsafe { upload_and_wait(&parts, stream, deadline) }
    }

    /// Root: rank `i + 1`'s next `Part`, which must be `len` bytes (its drained pieces of
    /// earlier broadcasts may come first).
    fn part_from_rank(
        &mut self,
        i: usize,
        len: u64,
        deadline: Deadline,
        what: &'static str,
    ) -> Result<Vec<u8>> {
        loop {
            let (f, _) = read_frame(&mut self.peers[i], deadline, what)?;
            match f {
                Frame::Part { len: got } if got == len => break,
                Frame::Part { len: got } => {
                    return Err(CudaError::Protocol(format!(
                        "IPC link: rank {} sends {got} bytes where the plan says {len}",
                        i + 1
                    )))
                }
                f => self.drained(i, f)?,
            }
        }
        let mut bytes = vec![0u8; len as usize];
        read_exact(&mut self.peers[i], &mut bytes, deadline, what)?;
        Ok(bytes)
    }

    /// Another rank: the root's `Part` of `len` bytes.
    fn part_from_root(&mut self, len: u64, deadline: Deadline) -> Result<Vec<u8>> {
        let (f, _) = self.read_from_root(deadline, "every rank's row")?;
        if f != (Frame::Part { len }) {
            return Err(unexpected(f, &format!("a part of {len} bytes")));
        }
        let mut bytes = vec![0u8; len as usize];
        read_exact(&mut self.peers[0], &mut bytes, deadline, "every rank's row")?;
        Ok(bytes)
    }
}

/// `len` bytes at `src`, once `stream`'s work before it has completed (the link's all-reduce
/// reads its words so too).
///
/// # Safety
/// `src` must be device memory valid for `len` bytes; `stream` a live stream.
pub(super) unsafe fn download_after(
    src: DevicePtr,
    len: usize,
    stream: u64,
    deadline: Deadline,
) -> Result<Vec<u8>> {
    let stream = stream as sys::CUstream;
    poll(deadline, "the work before a gather", || stream_done(stream))?;
    let mut out = vec![0u8; len];
    if len > 0 {
        guarded(|| {
            // SAFETY: `src` holds `len` bytes; the stream that wrote them has completed.
            unsafe { cu::memcpy_dtoh_sync(&mut out, src) }.map_err(drv("cuMemcpyDtoH"))
        })?;
    }
    Ok(out)
}

/// Copies each `(dst, bytes)` to the device on `stream` and waits for the copies: on the
/// caller's stream, so that its next reads are ordered after them, and waited for, since the
/// host bytes must outlive them (a "synchronous" copy from pageable memory may return early).
///
/// # Safety
/// Each `dst` must be device memory valid for its bytes; `stream` a live stream.
pub(super) unsafe fn upload_and_wait(
    parts: &[(DevicePtr, &[u8])],
    stream: u64,
    deadline: Deadline,
) -> Result<()> {
    let stream = stream as sys::CUstream;
    for &(dst, bytes) in parts {
        if bytes.is_empty() {
            continue;
        }
        guarded(|| {
            // SAFETY: `dst` holds `bytes.len()` bytes (caller's contract); `bytes` lives until
            // the copies have completed (polled below).
            unsafe { cu::memcpy_htod_async(dst, bytes, stream) }.map_err(drv("cuMemcpyHtoDAsync"))
        })?;
    }
    poll(deadline, "a gather's result", || stream_done(stream))
}
