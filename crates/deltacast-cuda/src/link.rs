//! What carries a GPU sync between the sender and its receivers: NCCL (GPUs of one or many
//! machines, one rank per GPU), the CUDA-IPC link (processes of one machine, any of them
//! on the same GPU), or frames of the core's format (a file, a socket: [`FrameLink`]).
//! [`crate::sync::GpuSender`] and [`crate::sync::GpuReceiver`] take any of them, and a sharded
//! trainer's ranks ([`crate::sync::GpuShardedSender`]) reach each other over NCCL or CUDA IPC.

use std::time::Duration;

use crate::error::{CudaError, Result};
use crate::frame_link::FrameLink;
use crate::ipc::IpcComm;
use crate::nccl::NcclComm;
use crate::DevicePtr;

/// A communicator of the GPU sync.
pub enum Link {
    Nccl(NcclComm),
    /// Boxed: its staging handles make it ~8 times an NCCL communicator's size.
    Ipc(Box<IpcComm>),
    /// Boxed: it holds a whole stage while assembling it.
    Frames(Box<FrameLink>),
}

impl From<FrameLink> for Link {
    fn from(c: FrameLink) -> Link {
        Link::Frames(Box::new(c))
    }
}

impl From<NcclComm> for Link {
    fn from(c: NcclComm) -> Link {
        Link::Nccl(c)
    }
}

impl From<IpcComm> for Link {
    fn from(c: IpcComm) -> Link {
        Link::Ipc(Box::new(c))
    }
}

impl Link {
    pub fn rank(&self) -> usize {
        match self {
            Link::Nccl(c) => c.rank(),
            Link::Ipc(c) => c.rank(),
            Link::Frames(c) => c.rank(),
        }
    }

    pub fn nranks(&self) -> usize {
        match self {
            Link::Nccl(c) => c.nranks(),
            Link::Ipc(c) => c.nranks(),
            Link::Frames(c) => c.nranks(),
        }
    }

    /// Broadcasts `len` bytes from `root`'s `src` into every rank's `dst`, enqueued on
    /// `stream`. `within` bounds how long a receiver of the IPC link waits for the
    /// broadcast to be announced (NCCL's waits are bounded in [`Link::wait`]).
    ///
    /// # Safety
    /// As [`NcclComm::broadcast`].
    pub unsafe fn broadcast(
        &mut self,
        src: DevicePtr,
        dst: DevicePtr,
        len: usize,
        root: usize,
        stream: u64,
        within: Duration,
    ) -> Result<()> {
        match self {
            // SAFETY: the caller's contract is NCCL's.
            Link::Nccl(c) => unsafe { c.broadcast(src, dst, len, root, stream) },
            // SAFETY: the same contract.
            Link::Ipc(c) => unsafe { c.broadcast(src, dst, len, root, stream, within) },
            // SAFETY: the same contract.
            Link::Frames(c) => unsafe { c.broadcast(src, dst, len, stream) },
        }
    }

    /// Broadcasts several `(src, dst, len)` segments from `root` as one (see
    /// [`IpcComm::broadcast_part`]: the IPC link lays them end to end through its slots);
    /// NCCL and frame links take them one by one. Both ends must use the same calls.
    ///
    /// # Safety
    /// As [`Link::broadcast`], for every segment.
    pub unsafe fn broadcast_many(
        &mut self,
        segments: &[(DevicePtr, DevicePtr, u64)],
        root: usize,
        stream: u64,
        within: Duration,
    ) -> Result<()> {
        for &(src, dst, len) in segments {
            // SAFETY: the caller's contract, segment by segment.
            unsafe { self.broadcast_part(src, dst, len, root, stream, within)? };
        }
        self.broadcast_end(stream)
    }

    /// One segment of a broadcast in parts (see [`IpcComm::broadcast_part`]); NCCL and frame
    /// links broadcast it at once.
    ///
    /// # Safety
    /// As [`Link::broadcast`]; on the IPC link's root `src` must stay unchanged until the
    /// stream has passed the part.
    pub unsafe fn broadcast_part(
        &mut self,
        src: DevicePtr,
        dst: DevicePtr,
        len: u64,
        root: usize,
        stream: u64,
        within: Duration,
    ) -> Result<()> {
        match self {
            // SAFETY: the caller's contract.
            Link::Ipc(c) => unsafe { c.broadcast_part(src, dst, len, root, stream, within) },
            // SAFETY: the caller's contract.
            _ => unsafe { self.broadcast(src, dst, len as usize, root, stream, within) },
        }
    }

    /// Ends a broadcast in parts (the IPC link announces its last piece).
    pub fn broadcast_end(&mut self, stream: u64) -> Result<()> {
        match self {
            Link::Ipc(c) => c.broadcast_end(stream),
            _ => Ok(()),
        }
    }

    /// Element-wise maximum of `count` u64 at `buf` over every rank, in place.
    ///
    /// # Safety
    /// As [`NcclComm::all_reduce_max_u64`].
    pub unsafe fn all_reduce_max_u64(
        &mut self,
        buf: DevicePtr,
        count: usize,
        stream: u64,
    ) -> Result<()> {
        match self {
            // SAFETY: the caller's contract.
            Link::Nccl(c) => unsafe { c.all_reduce_max_u64(buf, count, stream) },
            // SAFETY: the caller's contract.
            Link::Ipc(c) => unsafe { c.all_reduce_max_u64(buf, count, stream) },
            // SAFETY: the caller's contract.
            Link::Frames(c) => unsafe { c.all_reduce_max_u64(buf, count, stream) },
        }
    }

    /// Every rank's `count` u64 at `src`, in rank order in every rank's `dst`.
    ///
    /// # Safety
    /// As [`NcclComm::all_gather_u64`].
    pub unsafe fn all_gather_u64(
        &mut self,
        src: DevicePtr,
        dst: DevicePtr,
        count: usize,
        stream: u64,
    ) -> Result<()> {
        match self {
            // SAFETY: the caller's contract.
            Link::Nccl(c) => unsafe { c.all_gather_u64(src, dst, count, stream) },
            // SAFETY: the caller's contract.
            Link::Ipc(c) => unsafe { c.all_gather_u64(src, dst, count, stream) },
            Link::Frames(_) => Err(trainer_link_only("an all-gather")),
        }
    }

    /// Gathers to `root` exactly the bytes every rank holds (see
    /// [`NcclComm::gather_exact`]; the IPC link's root is rank 0).
    ///
    /// # Safety
    /// As [`NcclComm::gather_exact`].
    pub unsafe fn gather_exact(
        &mut self,
        src: DevicePtr,
        lens: &[u64],
        dst: DevicePtr,
        dst_len: u64,
        root: usize,
        stream: u64,
    ) -> Result<()> {
        match self {
            // SAFETY: the caller's contract.
            Link::Nccl(c) => unsafe { c.gather_exact(src, lens, dst, dst_len, root, stream) },
            // SAFETY: the caller's contract.
            Link::Ipc(c) => unsafe { c.gather_exact(src, lens, dst, dst_len, root, stream) },
            Link::Frames(_) => Err(trainer_link_only("a gather")),
        }
    }

    /// Waits for `event`, aborting the communicator after `timeout` or on a peer's failure.
    pub fn wait(&mut self, event: u64, timeout: Duration, what: &'static str) -> Result<()> {
        match self {
            Link::Nccl(c) => c.wait(event, timeout, what),
            Link::Ipc(c) => c.wait(event, timeout, what),
            Link::Frames(c) => c.wait(event, timeout, what),
        }
    }

    /// How long a receiver waits for a broadcast's bytes once the call returned, when it
    /// would otherwise wait `idle` for a sync to start: NCCL's broadcast returns at once, so
    /// the whole idle wait is still ahead; the IPC link's returns once the sync announced
    /// itself, so only its timeout is.
    pub fn announced_wait(&self, idle: Duration) -> Duration {
        match self {
            Link::Nccl(_) | Link::Frames(_) => idle,
            Link::Ipc(c) => c.announced_wait(idle),
        }
    }

    /// Ends this rank's part in the link once the sender closed it (the IPC link's farewell:
    /// see [`IpcComm::leave`]; nothing for NCCL).
    pub fn leave(&mut self) {
        if let Link::Ipc(c) = self {
            c.leave();
        }
    }

    pub fn abort(&mut self) {
        match self {
            Link::Nccl(c) => c.abort(),
            Link::Ipc(c) => c.abort(),
            Link::Frames(c) => c.abort(),
        }
    }
}

/// A frame link carries one sender's sync to its receivers, not the collectives between
/// trainer ranks.
fn trainer_link_only(what: &str) -> CudaError {
    CudaError::InvalidArgument(format!(
        "{what} between trainer ranks needs NCCL or the CUDA-IPC link, not a frame link"
    ))
}
