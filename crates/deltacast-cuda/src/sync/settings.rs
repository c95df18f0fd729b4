//! What both GPU senders are set with and keep: their settings ([`GpuSenderConfig`]), the
//! choice of the entropy codecs ([`EntropyMode`], learned per link in `Auto`), and the
//! snapshot of the previous version, on the device or in pinned host memory.

use std::time::Duration;

use crate::error::{CudaError, Result};
use crate::protocol::MIN_CHUNK_ELEMS;
use crate::{DeviceBuffer, DevicePtr, Gpu, HostBuffer};

/// Default [`GpuSenderConfig::capacity`]: deltas up to 30 % of a stage's elements. At lr 1e-5
/// on Qwen2.5-0.5B (10–25 % changed) such deltas take 0.5–0.8× a full copy over CUDA IPC where
/// dense stages take 0.95× (1×H200, 2026-12-02, docs/data/gpu-sync/capacity-lr1e-5/); the
/// price is the delta buffers' memory: per buffer set (two when a sync has several stages)
/// `capacity × (8 + 2 × width)` bytes per element of the largest stage with the entropy codecs
/// possible (`Auto`, `On`), `capacity × (8 + width)` without: 3.6 bytes per BF16 element at
/// 0.3, 1.8 GB for Qwen2.5-0.5B, 7.7 GB for 7B in 2 GiB stages.
pub const DEFAULT_CAPACITY: f64 = 0.3;

/// Settings of a [`super::GpuSender`].
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSenderConfig {
    /// Rank that sends (the others receive).
    pub root: usize,
    /// Chunk grid in elements (at least [`MIN_CHUNK_ELEMS`]).
    pub chunk_elems: u64,
    /// Fraction of all elements the delta buffers hold (their memory); a stage changing more
    /// goes whole whatever the cost model predicts.
    pub capacity: f64,
    /// How long a sync may take before the communicator is aborted.
    pub timeout: Duration,
    /// Whether deltas also use the core's entropy codecs (see [`EntropyMode`]).
    pub entropy: EntropyMode,
    /// Where the snapshot allocated by the sender lives.
    pub snapshot: SnapshotPlace,
    /// Bytes per stage: the tensors are cut, whole and in order, into runs of at least this
    /// many bytes (the last takes the rest), each diffed, sent and applied as a unit, so that
    /// the receivers check and apply one run while the sender diffs the next. 0: one stage.
    pub stage_bytes: u64,
}

/// The default [`GpuSenderConfig::stage_bytes`]: a 7B model in BF16 (15.2 GB) goes in 7
/// stages, a 0.5B one (1 GB) in one.
pub const DEFAULT_STAGE_BYTES: u64 = 2 << 30;

/// Whether a delta sync sizes its chunks in the core's entropy codecs (gaps positions, ulp
/// values) and sends them where smaller: a fraction of abs32 / bitmap + raw's bytes on AdamW
/// steps, for more GPU time on both sides (sizing, writing, decoding; the diff keeps the old
/// bits). Worth it across nodes; over NVLink the larger frames go faster (docs/benchmarks.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EntropyMode {
    /// abs32 / bitmap positions and raw values only.
    Off,
    /// gaps / ulp wherever smaller, every sync.
    On,
    /// Each sync takes the codecs predicted faster on this link by the sender's cost model
    /// (`crate::choice`: the link's time per byte, measured from the seed, and each codec's
    /// measured time per change) among plain, entropy-coded and, where the sender can write
    /// it (float slots, snapshots on the device), the steps code of dense steps (2 bits an
    /// element, the other changes raw: docs/codecs.md); it tries another again every
    /// [`crate::choice::AUTO_PROBE_EVERY`] deltas while it is predicted within
    /// [`crate::choice::PROBE_WITHIN`] of the fastest.
    #[default]
    Auto,
}

/// Where a [`super::GpuSender`] keeps the snapshot it allocates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum SnapshotPlace {
    /// Device memory: as much again as the tensors, diffed at device bandwidth.
    #[default]
    Device,
    /// Page-locked host memory mapped into the device: no device memory for the snapshot;
    /// the diff reads it in place over PCIe and writes back only the changed vectors, so a
    /// sync's diff is bound by PCIe (at best the time of one host-to-device copy of the
    /// tensors). Takes as much pinned host RAM as the tensors. Not with snapshots lent by the
    /// caller.
    PinnedHost,
}

impl Default for GpuSenderConfig {
    fn default() -> Self {
        GpuSenderConfig {
            root: 0,
            chunk_elems: deltacast::flush::DEFAULT_CHUNK_ELEMS,
            capacity: DEFAULT_CAPACITY,
            timeout: Duration::from_secs(300),
            entropy: EntropyMode::Auto,
            snapshot: SnapshotPlace::Device,
            stage_bytes: DEFAULT_STAGE_BYTES,
        }
    }
}

impl GpuSenderConfig {
    /// The checks both senders make of their settings.
    pub(super) fn check(&self) -> Result<()> {
        if self.chunk_elems < MIN_CHUNK_ELEMS || self.chunk_elems > u32::MAX as u64 {
            return Err(CudaError::InvalidArgument(format!(
                "chunk_elems {} outside {MIN_CHUNK_ELEMS}..=2^32-1",
                self.chunk_elems
            )));
        }
        if !(self.capacity > 0.0 && self.capacity <= 1.0) {
            return Err(CudaError::InvalidArgument(format!(
                "capacity {} outside (0, 1]",
                self.capacity
            )));
        }
        Ok(())
    }
}

/// Where a snapshot lives: allocated here (on the device, or in pinned host memory the
/// kernels reach over PCIe), or memory the caller lends (e.g. a torch tensor, so that other
/// code can read the previous version too).
pub(super) enum Snapshot {
    Owned(DeviceBuffer),
    Borrowed(DevicePtr),
    Pinned(HostBuffer),
}

impl Snapshot {
    /// The device address the kernels use.
    pub(super) fn ptr(&self) -> DevicePtr {
        match self {
            Snapshot::Owned(b) => b.ptr(),
            Snapshot::Borrowed(p) => *p,
            Snapshot::Pinned(h) => h.ptr(),
        }
    }

    /// A snapshot of `bytes` allocated where `place` says.
    pub(super) fn allocate(gpu: &Gpu, place: SnapshotPlace, bytes: u64) -> Result<Snapshot> {
        match place {
            SnapshotPlace::Device => gpu.alloc(bytes as usize).map(Snapshot::Owned),
            SnapshotPlace::PinnedHost => gpu.alloc_pinned(bytes as usize).map(Snapshot::Pinned),
        }
    }

    /// Copies `len` bytes at `src` into the snapshot (enqueued on `gpu`'s stream).
    ///
    /// # Safety
    /// `src` must be valid for `len` bytes, the snapshot at least that long; a pinned
    /// snapshot must not be read by the host before the stream has passed the copy.
    pub(super) unsafe fn fill(&self, gpu: &Gpu, src: DevicePtr, len: usize) -> Result<()> {
        // SAFETY: per this function's contract.
        unsafe {
            match self {
                Snapshot::Pinned(h) => gpu.copy_to_pinned(h, 0, src, len),
                _ => gpu.copy_device(self.ptr(), src, len),
            }
        }
    }
}
