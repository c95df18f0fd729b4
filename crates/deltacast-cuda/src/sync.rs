//! The GPU sync: a trainer rank ([`GpuSender`]) pushes its tensors to receivers
//! ([`GpuReceiver`]) over NCCL, sending only the changed elements (message layout in
//! [`crate::protocol`]).
//!
//! A sync runs in stages, each a consecutive run of tensors of about
//! [`GpuSenderConfig::stage_bytes`]. Per stage the sender runs one batched diff over its
//! tensors against their snapshot (which the diff refreshes in place, and whose per-slot
//! digests it updates, fused), forms the core's chunks on the GPU with both abs32 and bitmap
//! sections (and gaps / ulp with the entropy codecs), keeps the smallest per chunk, packs them,
//! and broadcasts header, manifest, positions and values on a stream of its own, so that the
//! broadcast and the receivers' work on one stage overlap the sender's diff of the next. The
//! diffs run back to back from a thread of their own, on a stream of their own (the caller's
//! `Gpu`); the encoding runs on a second handle whose stream has the greatest priority. When
//! a stage's delta would be as large as its tensors, or more elements changed than the delta
//! buffers hold, that stage is sent whole instead (dense). Receivers check everything against
//! their own slot table, check every chunk and compute their new digests on the GPU, and only
//! then scatter, keeping the overwritten bits of each stage until the last stage applied: a
//! stage that fails undoes the ones before it, so a sync applies whole or not at all. An
//! all-reduce of their status is the ack.
//!
//! Tensors are borrowed by device pointer (a torch tensor's `data_ptr()`), never freed; both
//! sides make their own stream wait for the caller's stream (torch's current stream) first,
//! and return only once their work is complete.

use std::ops::Range;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

use deltacast::{DType, SlotInfo, SlotTable};

use crate::error::{CudaError, Result};
use crate::nccl::NcclComm;
use crate::protocol::{
    choose_sections, plan_stages, ChunkPositions, ChunkRecord, ChunkValues, Header, Manifest,
    SyncKind, TableLimits, HEADER_BYTES, MIN_CHUNK_ELEMS,
};
use crate::{
    journal_layout, ApplyInput, ApplyPositions, CodeChunk, CodePlace, CodeScratch, CodeValues,
    DecodeInput, DecodePositions, DeviceBuffer, DevicePtr, DiffInput, DiffOutput, DiffResult,
    DigestInput, EncodeInput, Gpu, GpuEvent, GpuStream, HostBuffer, DECODE_SLACK,
};

/// One tensor of a sync: a slot, by device pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuTensor {
    pub name: String,
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Device address of its first element (contiguous, aligned to the element width).
    pub ptr: DevicePtr,
}

impl GpuTensor {
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    fn nbytes(&self) -> u64 {
        self.numel() * self.dtype.width() as u64
    }
}

/// Settings of a [`GpuSender`].
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSenderConfig {
    /// Rank that sends (the others receive).
    pub root: usize,
    /// Chunk grid in elements (at least [`MIN_CHUNK_ELEMS`]).
    pub chunk_elems: u64,
    /// Fraction of all elements the delta buffers hold; a step changing more goes dense.
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
/// values) and sends them where smaller: ~1.2 bytes per change on AdamW steps instead of ~6,
/// for more GPU time on both sides (sizing, writing, decoding; the diff keeps the old bits).
/// Worth it where the link is slow (across nodes); on NVLink sending 5× the bytes is faster.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EntropyMode {
    /// abs32 / bitmap positions and raw values only.
    Off,
    On,
    /// Measures both: the first two deltas try each, then every sync takes the one with the
    /// lower sync time per changed element so far, trying the other again after
    /// [`AUTO_PROBE_EVERY`] deltas times how many times slower it was (links and step sizes
    /// change; a probe of a much slower mode is rarer, so probes cost under 1/16 on average).
    #[default]
    Auto,
}

/// How often [`EntropyMode::Auto`] retries the mode it is not using, for a mode less than
/// twice as slow (one k times as slow is retried k times less often, at most 64 times).
pub const AUTO_PROBE_EVERY: u64 = 16;

/// [`EntropyMode::Auto`]'s record: per mode (off, on) the smoothed sync time per changed
/// element.
#[derive(Debug, Clone, Default)]
struct AutoEntropy {
    cost: [Option<f64>; 2],
    /// Deltas since the other mode was last tried.
    since_probe: u64,
}

impl AutoEntropy {
    fn choose(&mut self) -> bool {
        match self.cost {
            [_, None] => true,
            [None, _] => false,
            [Some(off), Some(on)] => {
                let best = on < off;
                let ratio = (on.max(off) / on.min(off).max(f64::MIN_POSITIVE)).floor();
                let period = AUTO_PROBE_EVERY * (ratio as u64).clamp(1, 64);
                self.since_probe += 1;
                if self.since_probe >= period {
                    self.since_probe = 0;
                    !best
                } else {
                    best
                }
            }
        }
    }

    fn record(&mut self, entropy: bool, time_ms: f64, changed: u64) {
        let x = time_ms / changed.max(1) as f64;
        let c = &mut self.cost[entropy as usize];
        *c = Some(c.map_or(x, |old| 0.5 * old + 0.5 * x));
    }
}

/// Where a [`GpuSender`] keeps the snapshot it allocates.
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
            capacity: 0.05,
            timeout: Duration::from_secs(300),
            entropy: EntropyMode::Auto,
            snapshot: SnapshotPlace::Device,
            stage_bytes: DEFAULT_STAGE_BYTES,
        }
    }
}

/// What one sync did, for metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSyncReport {
    pub kind: SyncKind,
    pub version: u64,
    /// Elements that differ from the previous version (every element for a seed).
    pub changed: u64,
    pub numel: u64,
    /// Bytes broadcast: header, manifest, positions and values (or the tensors).
    pub payload_bytes: u64,
    pub chunks: u64,
    /// Wall time of the whole call, until every receiver acked.
    pub time_ms: f64,
    /// Device time of the diff kernels (senders; 0 for receivers and seeds).
    pub diff_ms: f64,
    /// Whether the delta was sized in the entropy codecs (senders; receivers: whether it
    /// carried gaps or ulp sections).
    pub entropy: bool,
    /// Stages of the sync, and how many of them were sent whole.
    pub stages: u32,
    pub dense_stages: u32,
    /// Wall time of each phase summed over the stages, in order of first appearance (sender:
    /// diff, encode, send, ack; receiver: wait, manifest, payload, decode, apply, ack), in
    /// milliseconds. On the sender the broadcasts overlap the next stage's diff, so the
    /// phases add up to the call's time while the work they name overlaps.
    pub phases: Vec<(&'static str, f64)>,
}

/// Phase times, summed by name over the stages of a sync; with `DELTACAST_STAGE_TRACE=1`
/// also every phase's end on the wall clock, printed to stderr when the sync ends (the
/// sender's and receivers' lines line up across processes, to see where stages wait).
#[derive(Debug, Default)]
struct Phases {
    sums: Vec<(&'static str, f64)>,
    trace: Option<Vec<(&'static str, f64)>>,
}

/// Milliseconds on the wall clock (within the last 1000 s, to stay readable).
fn wall_ms() -> f64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (t.as_secs() % 1000) as f64 * 1e3 + t.subsec_nanos() as f64 / 1e6
}

impl Phases {
    fn new() -> Self {
        let traced = std::env::var("DELTACAST_STAGE_TRACE").is_ok_and(|v| v == "1");
        Phases {
            sums: Vec::new(),
            trace: traced.then(Vec::new),
        }
    }

    /// Adds the time since `*mark` to phase `name` and moves the mark to now.
    fn lap(&mut self, name: &'static str, mark: &mut Instant) {
        let now = Instant::now();
        let span = (now - *mark).as_secs_f64() * 1e3;
        *mark = now;
        match self.sums.iter_mut().find(|(n, _)| *n == name) {
            Some((_, t)) => *t += span,
            None => self.sums.push((name, span)),
        }
        self.mark(name, wall_ms());
    }

    /// Records an event at wall-clock time `at` (traced syncs only).
    fn mark(&mut self, name: &'static str, at: f64) {
        if let Some(t) = &mut self.trace {
            t.push((name, at));
        }
    }

    /// The summed phases; prints the trace first, when there is one.
    fn finish(self, who: &str) -> Vec<(&'static str, f64)> {
        if let Some(t) = &self.trace {
            let line: Vec<String> = t.iter().map(|(n, at)| format!("{n}@{at:.3}")).collect();
            eprintln!("deltacast trace {who}: {}", line.join(" "));
        }
        self.sums
    }
}

/// Where a snapshot lives: allocated here (on the device, or in pinned host memory the
/// kernels reach over PCIe), or memory the caller lends (e.g. a torch tensor, so that other
/// code can read the previous version too).
enum Snapshot {
    Owned(DeviceBuffer),
    Borrowed(DevicePtr),
    Pinned(HostBuffer),
}

impl Snapshot {
    /// The device address the kernels use.
    fn ptr(&self) -> DevicePtr {
        match self {
            Snapshot::Owned(b) => b.ptr(),
            Snapshot::Borrowed(p) => *p,
            Snapshot::Pinned(h) => h.ptr(),
        }
    }
}

/// A buffer that grows on demand (never past what the caller checked).
struct Growable {
    buf: Option<DeviceBuffer>,
}

impl Growable {
    fn new() -> Self {
        Growable { buf: None }
    }

    fn len(&self) -> u64 {
        self.buf.as_ref().map_or(0, |b| b.len() as u64)
    }

    fn at_least(&mut self, gpu: &Gpu, len: u64) -> Result<DevicePtr> {
        let len = (len.max(256) as usize).next_multiple_of(256);
        if self.buf.as_ref().is_none_or(|b| b.len() < len) {
            self.buf = None;
            // An eighth more than asked: deltas grow a little from step to step, and each
            // reallocation would cost a free (a device synchronisation) and an allocation.
            self.buf = Some(gpu.alloc((len + len / 8).next_multiple_of(256))?);
        }
        Ok(self.buf.as_ref().map_or(0, |b| b.ptr()))
    }
}

fn slot_table(tensors: &[GpuTensor]) -> Result<SlotTable> {
    SlotTable::new(
        tensors
            .iter()
            .map(|t| SlotInfo::new(t.name.clone(), t.dtype, t.shape.clone()))
            .collect(),
    )
    .map_err(|e| CudaError::InvalidArgument(e.to_string()))
}

fn limits(table: &SlotTable) -> TableLimits {
    TableLimits {
        hash: table.hash(),
        num_slots: table.len(),
        total_elements: table.total_elements(),
        total_bytes: table.total_bytes(),
        slots: table
            .slots()
            .iter()
            .map(|s| (s.numel(), s.dtype.width()))
            .collect(),
    }
}

fn check_tensors(tensors: &[GpuTensor]) -> Result<()> {
    for t in tensors {
        let w = t.dtype.width() as u64;
        if t.numel() > 0 && t.ptr % w != 0 {
            return Err(CudaError::InvalidArgument(format!(
                "tensor `{}` is not aligned to its element width",
                t.name
            )));
        }
    }
    Ok(())
}

/// The digest inputs of the tensors of slots `slots`.
fn digest_inputs(tensors: &[GpuTensor], slots: Range<usize>) -> Vec<DigestInput> {
    slots
        .map(|i| {
            let t = &tensors[i];
            DigestInput {
                ptr: t.ptr,
                numel: t.numel(),
                width: t.dtype.width(),
                first_index: 0,
                slot: i as u32,
            }
        })
        .collect()
}

fn u64s(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect()
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

/// One diff of a stage, with the snapshot where `place` says.
///
/// # Safety
/// As [`Gpu::diff_batch`].
unsafe fn run_diff(
    gpu: &Gpu,
    place: SnapshotPlace,
    inputs: &[DiffInput],
    out: &DiffOutput,
) -> Result<DiffResult> {
    // SAFETY: per this function's contract.
    unsafe {
        match place {
            SnapshotPlace::PinnedHost => gpu.diff_batch_host_snapshot(inputs, out),
            SnapshotPlace::Device => gpu.diff_batch(inputs, out),
        }
    }
}

/// One set of a sender's delta buffers. A stage uses a set from its diff until its
/// broadcasts complete; with two sets the next stage's diff writes the other while they run.
struct StageSet {
    /// The diff's output: u64 positions, new bits, and old bits (entropy codecs only).
    positions: DeviceBuffer,
    values: DeviceBuffer,
    old_values: Option<DeviceBuffer>,
    packed: Growable,
    /// The value sections, packed (entropy codecs; otherwise `values` is sent as it is).
    packed_values: Growable,
    header: DeviceBuffer,
    manifest: Growable,
    /// Recorded on the NCCL stream after this set's last broadcast (shared with the diff
    /// thread, whose stream waits for it).
    sent: Arc<GpuEvent>,
    in_flight: bool,
}

impl StageSet {
    fn new(gpu: &Gpu, capacity: u64, max_width: u64, entropy: bool) -> Result<StageSet> {
        // (The entropy coder reads its inputs 16 bytes at a time: DECODE_SLACK past the end
        // keeps those reads inside the buffers.)
        let value_bytes = ((capacity * max_width).next_multiple_of(8) + DECODE_SLACK) as usize;
        Ok(StageSet {
            positions: gpu.alloc((capacity * 8 + DECODE_SLACK) as usize)?,
            values: gpu.alloc(value_bytes)?,
            old_values: if entropy {
                Some(gpu.alloc(value_bytes)?)
            } else {
                None
            },
            packed: Growable::new(),
            packed_values: Growable::new(),
            header: gpu.alloc(HEADER_BYTES)?,
            manifest: Growable::new(),
            sent: Arc::new(gpu.new_event()?),
            in_flight: false,
        })
    }

    fn bytes(&self) -> u64 {
        (self.positions.len() + self.values.len() + self.header.len()) as u64
            + self.old_values.as_ref().map_or(0, |b| b.len() as u64)
            + self.packed.len()
            + self.packed_values.len()
            + self.manifest.len()
    }
}

/// What the stages of one sync add up to (sender).
#[derive(Debug, Default)]
struct SendTotals {
    changed: u64,
    payload_bytes: u64,
    chunks: u64,
    diff_ms: f64,
    dense_stages: u32,
}

/// The trainer side of a GPU sync.
pub struct GpuSender {
    /// Encodes and sends (its stream has the device's greatest priority).
    gpu: Gpu,
    /// The caller's handle of the same device, with a stream and scratch of its own, for
    /// the diffs: the next stage's diff runs there while this one is encoded on `gpu`.
    diff_gpu: Arc<Gpu>,
    comm: NcclComm,
    config: GpuSenderConfig,
    tensors: Vec<GpuTensor>,
    table: SlotTable,
    snapshots: Vec<Snapshot>,
    /// Per-slot digests of the snapshot, on the device (the diff adds its changes there).
    digests_dev: DeviceBuffer,
    digests: Vec<u64>,
    version: u64,
    /// Set when the receivers cannot be trusted to hold `version` (first sync, a refusal).
    needs_seed: bool,
    /// Changes one stage's delta buffers hold.
    capacity: u64,
    stages: Vec<Range<usize>>,
    sets: Vec<StageSet>,
    code_scratch: CodeScratch,
    auto: AutoEntropy,
    /// Where the broadcasts run, so that they overlap the next stage's kernels.
    nccl_stream: GpuStream,
    /// Recorded on the GPU's stream when a stage is ready to send.
    ready: GpuEvent,
    /// Recorded on the NCCL stream after the ack.
    acked: GpuEvent,
    status: DeviceBuffer,
}

impl GpuSender {
    /// A sender over `tensors` (borrowed: they must stay valid, and unmoved, for the life of
    /// the sender). `snapshots`, when given, are the caller's device memory for the snapshot
    /// (one per tensor, same size); else they are allocated here, where `config.snapshot`
    /// says (lending snapshots with [`SnapshotPlace::PinnedHost`] is an `InvalidArgument`).
    ///
    /// # Safety
    /// Every pointer must be device memory of `gpu`'s device valid for its tensor's bytes.
    pub unsafe fn new(
        gpu: Gpu,
        comm: NcclComm,
        tensors: Vec<GpuTensor>,
        snapshots: Option<Vec<DevicePtr>>,
        config: GpuSenderConfig,
    ) -> Result<GpuSender> {
        if config.chunk_elems < MIN_CHUNK_ELEMS || config.chunk_elems > u32::MAX as u64 {
            return Err(CudaError::InvalidArgument(format!(
                "chunk_elems {} outside {MIN_CHUNK_ELEMS}..=2^32-1",
                config.chunk_elems
            )));
        }
        if !(config.capacity > 0.0 && config.capacity <= 1.0) {
            return Err(CudaError::InvalidArgument(format!(
                "capacity {} outside (0, 1]",
                config.capacity
            )));
        }
        if config.root != comm.rank() {
            return Err(CudaError::InvalidArgument(format!(
                "the sender is rank {}, the root is {}",
                comm.rank(),
                config.root
            )));
        }
        check_tensors(&tensors)?;
        let table = slot_table(&tensors)?;
        // The caller's handle runs the diffs; a second one, whose stream has the device's
        // greatest priority, encodes and sends, so that its short kernels run ahead of the
        // next stage's diff instead of queueing behind its blocks.
        let encoder = Gpu::with_options(gpu.ordinal(), gpu.tuning(), true)?;
        let diff_gpu = Arc::new(gpu);
        let gpu = encoder;
        let snapshots = match snapshots {
            Some(ptrs) => {
                if ptrs.len() != tensors.len() {
                    return Err(CudaError::InvalidArgument(format!(
                        "{} snapshots for {} tensors",
                        ptrs.len(),
                        tensors.len()
                    )));
                }
                if config.snapshot != SnapshotPlace::Device {
                    return Err(CudaError::InvalidArgument(
                        "snapshots lent by the caller are device memory: they cannot be put in \
                         pinned host memory (lend none, or keep SnapshotPlace::Device)"
                            .into(),
                    ));
                }
                ptrs.into_iter().map(Snapshot::Borrowed).collect()
            }
            None => tensors
                .iter()
                .map(|t| match config.snapshot {
                    SnapshotPlace::Device => gpu.alloc(t.nbytes() as usize).map(Snapshot::Owned),
                    SnapshotPlace::PinnedHost => {
                        gpu.alloc_pinned(t.nbytes() as usize).map(Snapshot::Pinned)
                    }
                })
                .collect::<Result<Vec<_>>>()?,
        };
        let slot_bytes: Vec<u64> = tensors.iter().map(|t| t.nbytes()).collect();
        let stages = plan_stages(&slot_bytes, config.stage_bytes);
        let stage_elems = stages
            .iter()
            .map(|r| tensors[r.clone()].iter().map(|t| t.numel()).sum::<u64>())
            .max()
            .unwrap_or(0);
        let capacity =
            ((stage_elems as f64 * config.capacity).ceil() as u64).clamp(1, stage_elems.max(1));
        let max_width = tensors.iter().map(|t| t.dtype.width()).max().unwrap_or(1) as u64;
        let entropy = config.entropy != EntropyMode::Off;
        // Two sets when there is a next stage to overlap, else one.
        let sets = (0..stages.len().min(2))
            .map(|_| StageSet::new(&gpu, capacity, max_width, entropy))
            .collect::<Result<Vec<_>>>()?;
        let n = tensors.len();
        Ok(GpuSender {
            diff_gpu,
            sets,
            code_scratch: CodeScratch::new(),
            auto: AutoEntropy::default(),
            nccl_stream: gpu.new_stream(true)?,
            ready: gpu.new_event()?,
            acked: gpu.new_event()?,
            status: gpu.alloc(8)?,
            digests_dev: gpu.alloc_zeroed(n.max(1) * 8)?,
            digests: vec![0; n],
            gpu,
            comm,
            config,
            tensors,
            table,
            snapshots,
            version: 0,
            needs_seed: true,
            capacity,
            stages,
        })
    }

    /// The version the last sync produced.
    pub fn version(&self) -> u64 {
        self.version
    }

    /// Per-slot digests of the last version sent.
    pub fn digests(&self) -> &[u64] {
        &self.digests
    }

    pub fn slot_table(&self) -> &SlotTable {
        &self.table
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The stages a sync is cut into (slot ranges).
    pub fn stages(&self) -> &[Range<usize>] {
        &self.stages
    }

    /// Device bytes this sender holds besides the tensors: the snapshot when allocated here
    /// on the device, the delta buffers (one or two sets, each sized by `capacity` times the
    /// largest stage), the packed sections, and the diff's per-tile slots in the GPU's
    /// scratch (1/8 of the bytes diffed, once a delta ran).
    pub fn staging_bytes(&self) -> u64 {
        let owned: u64 = self
            .snapshots
            .iter()
            .map(|s| match s {
                Snapshot::Owned(b) => b.len() as u64,
                Snapshot::Borrowed(_) | Snapshot::Pinned(_) => 0,
            })
            .sum();
        owned
            + self.sets.iter().map(StageSet::bytes).sum::<u64>()
            + self.code_scratch.len()
            + self.gpu.large_scratch_bytes()
            + self.diff_gpu.large_scratch_bytes()
    }

    /// Pinned host bytes this sender holds: the snapshot with [`SnapshotPlace::PinnedHost`],
    /// else 0.
    pub fn host_bytes(&self) -> u64 {
        self.snapshots
            .iter()
            .map(|s| match s {
                Snapshot::Pinned(h) => h.len() as u64,
                Snapshot::Owned(_) | Snapshot::Borrowed(_) => 0,
            })
            .sum()
    }

    /// Sends a seed (every tensor whole, one stage) and takes a fresh snapshot.
    ///
    /// # Safety
    /// `wait_stream` must be a live stream of the GPU's context, or 0.
    pub unsafe fn seed(&mut self, wait_stream: u64) -> Result<GpuSyncReport> {
        let started = Instant::now();
        self.needs_seed = true;
        // SAFETY: per this function's contract.
        unsafe { self.gpu.wait_for_stream(wait_stream)? };
        let all = 0..self.tensors.len();
        let mut after = self.refresh(all.clone())?;
        let version = self.version + 1;
        let payload_bytes = self.send_whole(SyncKind::Seed, 0, 1, all, version, &mut after)?;
        self.finish(version, after)?;
        Ok(GpuSyncReport {
            kind: SyncKind::Seed,
            version: self.version,
            changed: self.table.total_elements(),
            numel: self.table.total_elements(),
            payload_bytes,
            chunks: 0,
            time_ms: ms(started),
            diff_ms: 0.0,
            entropy: false,
            stages: 1,
            dense_stages: 1,
            phases: Vec::new(),
        })
    }

    /// Sends what changed since the last version (a seed first, when one is due), stage by
    /// stage.
    ///
    /// # Safety
    /// As [`GpuSender::seed`].
    pub unsafe fn sync(&mut self, wait_stream: u64) -> Result<GpuSyncReport> {
        if self.needs_seed {
            // SAFETY: per this function's contract.
            return unsafe { self.seed(wait_stream) };
        }
        let started = Instant::now();
        // Until this sync is acked, the receivers' state is unknown: a failure anywhere below
        // leaves a seed due.
        self.needs_seed = true;
        // SAFETY: per this function's contract.
        unsafe { self.gpu.wait_for_stream(wait_stream)? };
        let use_entropy = match self.config.entropy {
            EntropyMode::Off => false,
            EntropyMode::On => true,
            EntropyMode::Auto => self.auto.choose(),
        };
        let version = self.version + 1;
        let mut after = self.digests.clone();
        let mut totals = SendTotals::default();
        let mut phases = Phases::new();
        let mut mark = started;
        let place = self.config.snapshot;
        // SAFETY: per this function's contract.
        unsafe { self.diff_gpu.wait_for_stream(wait_stream)? };
        let nsets = self.sets.len();
        for set in 0..nsets {
            self.wait_set(set)?;
        }
        let stages = self.stages.len();
        let args: Vec<_> = (0..stages)
            .map(|s| self.diff_args(s, use_entropy))
            .collect();
        let sent_events: Vec<Arc<GpuEvent>> =
            self.sets.iter().map(|b| Arc::clone(&b.sent)).collect();
        let diff_gpu = Arc::clone(&self.diff_gpu);
        // The diffs run back to back on their own stream, from a thread of their own, while
        // this thread encodes and sends each stage as its diff arrives. A set's buffers are
        // handed back (`freed`) once its stage's broadcasts are enqueued; the diff stream then
        // waits, on the device, for those broadcasts before the next diff into that set.
        let (freed_tx, freed_rx) = mpsc::channel::<()>();
        let (diffed_tx, diffed_rx) = mpsc::channel::<(Result<DiffResult>, f64, f64)>();
        std::thread::scope(|scope| -> Result<()> {
            scope.spawn(move || {
                for (s, (inputs, out)) in args.into_iter().enumerate() {
                    if s >= nsets {
                        if freed_rx.recv().is_err() {
                            return; // the sync stopped
                        }
                        // SAFETY: our event, recorded after the set's last broadcasts.
                        let waited =
                            unsafe { diff_gpu.stream_wait_event(0, &sent_events[s % nsets]) };
                        if let Err(e) = waited {
                            let _ = diffed_tx.send((Err(e), 0.0, 0.0));
                            return;
                        }
                    }
                    let begun = wall_ms();
                    // SAFETY: tensors and snapshots are valid (constructor contract); the
                    // outputs are the set's, sized for `capacity`, and nothing else writes
                    // them or these tensors' snapshots until the diff returns.
                    let diff = unsafe { run_diff(&diff_gpu, place, &inputs, &out) };
                    let failed = diff.is_err();
                    if diffed_tx.send((diff, begun, wall_ms())).is_err() || failed {
                        return;
                    }
                }
            });
            let sent = (0..stages).try_for_each(|s| {
                let (diff, begun, ended) = diffed_rx
                    .recv()
                    .map_err(|_| CudaError::Panicked("the diff thread stopped".into()))?;
                phases.mark("diff-begun", begun);
                phases.mark("diff-ended", ended);
                phases.lap("diff", &mut mark);
                self.send_stage(
                    s,
                    &diff?,
                    version,
                    use_entropy,
                    &mut after,
                    &mut totals,
                    &mut phases,
                    &mut mark,
                )?;
                // The diff thread may now reuse this stage's set (a send fails only when
                // the diff thread stopped, and then its result says why).
                let _ = freed_tx.send(());
                Ok(())
            });
            // Stops the diff thread if this one stopped early.
            drop(freed_tx);
            sent
        })?;
        self.finish(version, after)?;
        phases.lap("ack", &mut mark);
        let time_ms = ms(started);
        let stages = self.stages.len() as u32;
        let any_delta = totals.dense_stages < stages;
        if any_delta {
            self.auto.record(use_entropy, time_ms, totals.changed);
        }
        Ok(GpuSyncReport {
            kind: if any_delta {
                SyncKind::Delta
            } else {
                SyncKind::Dense
            },
            version: self.version,
            changed: totals.changed,
            numel: self.table.total_elements(),
            payload_bytes: totals.payload_bytes,
            chunks: totals.chunks,
            time_ms,
            diff_ms: totals.diff_ms,
            entropy: use_entropy && any_delta,
            stages,
            dense_stages: totals.dense_stages,
            phases: phases.finish("sender"),
        })
    }

    /// The diff's inputs and outputs for stage `s` (into its set of buffers).
    fn diff_args(&self, s: usize, use_entropy: bool) -> (Vec<DiffInput>, DiffOutput) {
        let inputs = self.stages[s]
            .clone()
            .map(|i| {
                let t = &self.tensors[i];
                DiffInput {
                    snapshot: self.snapshots[i].ptr(),
                    current: t.ptr,
                    numel: t.numel(),
                    width: t.dtype.width(),
                    first_index: 0,
                    digest: Some((self.digests_dev.ptr() + 8 * i as u64, i as u32)),
                }
            })
            .collect();
        let bufs = &self.sets[s % self.sets.len()];
        let out = DiffOutput {
            positions: bufs.positions.ptr(),
            new_values: bufs.values.ptr(),
            old_values: bufs
                .old_values
                .as_ref()
                .filter(|_| use_entropy)
                .map(|b| b.ptr()),
            capacity: self.capacity,
        };
        (inputs, out)
    }

    /// Encodes stage `s` from its diff and starts its broadcasts (delta, or dense when that
    /// is smaller or the delta did not fit); `after` gets the stage's new digests.
    #[allow(clippy::too_many_arguments)]
    fn send_stage(
        &mut self,
        s: usize,
        diff: &DiffResult,
        version: u64,
        use_entropy: bool,
        after: &mut [u64],
        totals: &mut SendTotals,
        phases: &mut Phases,
        mark: &mut Instant,
    ) -> Result<()> {
        let range = self.stages[s].clone();
        let stages = self.stages.len() as u32;
        let set = s % self.sets.len();
        // The encoder writes the set too: its last broadcasts must be over.
        self.wait_set(set)?;
        phases.mark("set-free", wall_ms());
        let bufs = &self.sets[set];
        let positions = bufs.positions.ptr();
        let new_values = bufs.values.ptr();
        let entropy = bufs
            .old_values
            .as_ref()
            .filter(|_| use_entropy)
            .map(|b| b.ptr());
        totals.diff_ms += diff.kernel_ms as f64;
        totals.changed += diff.found;
        let stage_bytes: u64 = self.tensors[range.clone()].iter().map(|t| t.nbytes()).sum();
        if !diff.is_complete() {
            // More changed than the buffers hold: send the stage whole. The diff refreshed
            // only the snapshot of the tiles it wrote out; the rest is copied whole.
            let got = self.refresh(range.clone())?;
            after[range.clone()].copy_from_slice(&got);
            totals.payload_bytes +=
                self.send_whole(SyncKind::Dense, s as u32, stages, range, version, after)?;
            totals.dense_stages += 1;
            phases.lap("encode", mark);
            return Ok(());
        }
        // SAFETY: our digest words (the diff added every change's digest update).
        let words = u64s(&unsafe {
            self.gpu.download(
                self.digests_dev.ptr() + 8 * range.start as u64,
                range.len() * 8,
            )?
        });
        after[range.clone()].copy_from_slice(&words);
        phases.mark("digest-words", wall_ms());
        let encode: Vec<EncodeInput> = range
            .clone()
            .zip(&diff.tensors)
            .map(|(i, r)| EncodeInput {
                change_offset: r.offset,
                change_count: r.written,
                first_index: 0,
                numel: self.tensors[i].numel(),
            })
            .collect();
        // Counting run: the chunks (grid cells tightened to their changes), no sections yet.
        // SAFETY: positions hold every change written by the diff.
        let grid = unsafe {
            self.gpu
                .encode_positions(positions, &encode, self.config.chunk_elems, None, None)?
        };
        phases.mark("counted", wall_ms());
        let width_of = |local: usize| self.tensors[range.start + local].dtype.width();
        // Entropy codecs: every chunk sized exactly in gaps and ulp, on the GPU.
        let code_chunks: Vec<CodeChunk> = match entropy {
            Some(old) => grid
                .iter()
                .map(|g| {
                    let r = &diff.tensors[g.input];
                    let w = width_of(g.input);
                    let at = r.value_offset + (g.lo - r.offset) * w as u64;
                    CodeChunk {
                        positions: positions + g.lo * 8,
                        new_bits: new_values + at,
                        old_bits: old + at,
                        count: g.count,
                        start: g.start,
                        range: g.range,
                        width: w,
                    }
                })
                .collect(),
            None => Vec::new(),
        };
        let sizes = match entropy {
            // SAFETY: the positions and both value buffers hold every chunk's changes.
            Some(_) => unsafe {
                self.gpu
                    .entropy_size(&mut self.code_scratch, &code_chunks)?
            },
            None => Vec::new(),
        };
        let mut chunks = Vec::with_capacity(grid.len());
        let mut placed = Vec::with_capacity(grid.len());
        let mut pos_bytes = 0u64;
        let mut value_bytes = 0u64;
        for (i, g) in grid.iter().enumerate() {
            let r = &diff.tensors[g.input];
            let w = width_of(g.input) as u64;
            let choice =
                choose_sections(g.count, g.range, w, sizes.get(i).map(|s| (s.gaps, s.ulp)));
            // Bitmaps are written as whole u32 words; every section starts 4-aligned.
            let room = match choice.positions {
                ChunkPositions::Bitmap => g.range.div_ceil(32) * 4,
                _ => choice.position_len.next_multiple_of(4),
            };
            let value_offset = if entropy.is_some() {
                let at = value_bytes;
                value_bytes += choice.value_len.next_multiple_of(4);
                at
            } else {
                // The diff's output is sent as it is: each chunk's values are already there.
                let at = r.value_offset + (g.lo - r.offset) * w;
                value_bytes = value_bytes.max(at + choice.value_len);
                at
            };
            placed.push((i, choice, pos_bytes, value_offset));
            chunks.push(ChunkRecord {
                slot: (range.start + g.input) as u32,
                positions: choice.positions,
                values: choice.values,
                start: g.start,
                range: g.range,
                count: g.count,
                position_offset: pos_bytes,
                position_len: choice.position_len,
                value_offset,
                value_len: choice.value_len,
            });
            pos_bytes += room;
        }
        let manifest = Manifest {
            digests: self.digests[range.clone()]
                .iter()
                .copied()
                .zip(after[range.clone()].iter().copied())
                .collect(),
            chunks,
        }
        .encode();
        let delta_bytes = HEADER_BYTES as u64 + manifest.len() as u64 + pos_bytes + value_bytes;
        let dense_bytes =
            (HEADER_BYTES + range.len() * crate::protocol::SLOT_RECORD_BYTES) as u64 + stage_bytes;
        if delta_bytes > dense_bytes {
            // Dense wins: the snapshot and digests are already current.
            totals.payload_bytes +=
                self.send_whole(SyncKind::Dense, s as u32, stages, range, version, after)?;
            totals.dense_stages += 1;
            phases.lap("encode", mark);
            return Ok(());
        }
        let packed = self.sets[set].packed.at_least(&self.gpu, pos_bytes)?;
        let values_ptr = if entropy.is_some() {
            let pv = self.sets[set]
                .packed_values
                .at_least(&self.gpu, value_bytes)?;
            // SAFETY: our buffers, at least this long; the entropy writer ORs into zeros.
            unsafe {
                self.gpu.memset(packed, 0, pos_bytes as usize)?;
                self.gpu.memset(pv, 0, value_bytes as usize)?;
            }
            pv
        } else {
            new_values
        };
        let listed: Vec<_> = placed
            .iter()
            .filter_map(|&(i, c, off, _)| {
                let codec = match c.positions {
                    ChunkPositions::Abs32 => ApplyPositions::Abs32,
                    ChunkPositions::Bitmap => ApplyPositions::Bitmap,
                    ChunkPositions::Gaps => return None,
                };
                Some((grid[i], codec, packed + off))
            })
            .collect();
        // SAFETY: positions hold every chunk's changes; each destination is a disjoint,
        // 4-aligned run of `packed` with room for its section in whole words.
        unsafe { self.gpu.encode_place(positions, &listed)? };
        phases.mark("placed", wall_ms());
        if entropy.is_some() {
            let places: Vec<CodePlace> = placed
                .iter()
                .map(|&(_, c, off, voff)| CodePlace {
                    gaps: (c.positions == ChunkPositions::Gaps).then_some(packed + off),
                    values: Some((
                        match c.values {
                            ChunkValues::Ulp => CodeValues::Ulp,
                            ChunkValues::Raw => CodeValues::Raw,
                        },
                        values_ptr + voff,
                    )),
                })
                .collect();
            // SAFETY: as entropy_size; destinations zeroed above, disjoint, 4-aligned, with
            // room for each section in whole words.
            unsafe {
                self.gpu
                    .entropy_write(&mut self.code_scratch, &code_chunks, &places)?
            };
        }
        phases.lap("encode", mark);
        let header = Header {
            kind: SyncKind::Delta,
            version,
            table_hash: self.table.hash(),
            num_slots: self.tensors.len() as u32,
            num_chunks: grid.len() as u64,
            manifest_bytes: manifest.len() as u64,
            position_bytes: pos_bytes,
            value_bytes,
            stage: s as u32,
            stages,
            first_slot: range.start as u32,
            stage_slots: range.len() as u32,
        };
        self.broadcast_stage(
            set,
            &header,
            &manifest,
            &[(packed, pos_bytes), (values_ptr, value_bytes)],
        )?;
        phases.lap("send", mark);
        totals.payload_bytes += delta_bytes;
        totals.chunks += grid.len() as u64;
        Ok(())
    }

    /// Tells the receivers no sync follows (their `receive` returns `None`).
    pub fn close(&mut self) -> Result<()> {
        let header = Header::whole(
            SyncKind::Close,
            self.version,
            self.table.hash(),
            self.tensors.len() as u32,
            0,
            0,
            0,
            0,
        );
        // No manifest follows a close (receivers stop at the header).
        self.wait_set(0)?;
        self.broadcast_stage(0, &header, &[], &[])?;
        self.wait_set(0)
    }

    /// Copies the tensors of slots `slots` into their snapshots and recomputes their digests
    /// (returned, and written to the device's digest words).
    fn refresh(&mut self, slots: Range<usize>) -> Result<Vec<u64>> {
        for i in slots.clone() {
            let (t, s) = (&self.tensors[i], &self.snapshots[i]);
            let len = t.nbytes() as usize;
            // SAFETY: both valid for nbytes (constructor contract); a pinned snapshot is
            // only touched by the host through `&mut self`, and `digest` below synchronises
            // the stream before this returns.
            unsafe {
                match s {
                    Snapshot::Pinned(h) => self.gpu.copy_to_pinned(h, 0, t.ptr, len)?,
                    _ => self.gpu.copy_device(s.ptr(), t.ptr, len)?,
                }
            }
        }
        // SAFETY: the tensors (constructor contract). Synchronises the stream.
        let got = unsafe {
            self.gpu
                .digest(&digest_inputs(&self.tensors, slots.clone()))?
        };
        let bytes: Vec<u8> = got.iter().flat_map(|d| d.to_le_bytes()).collect();
        // SAFETY: our digest words, one per slot; `slots` lies inside the table.
        unsafe {
            self.gpu
                .copy_to_device(self.digests_dev.ptr() + 8 * slots.start as u64, &bytes)?
        };
        Ok(got)
    }

    /// Waits until set `set`'s last broadcasts completed (the host may then reuse it).
    fn wait_set(&mut self, set: usize) -> Result<()> {
        let bufs = &mut self.sets[set];
        if bufs.in_flight {
            self.comm.wait(
                bufs.sent.handle(),
                self.config.timeout,
                "a stage's broadcasts",
            )?;
            bufs.in_flight = false;
        }
        Ok(())
    }

    /// Uploads a stage's header and manifest into set `set` and broadcasts them and then
    /// `payload` (device address, bytes) on the NCCL stream, after everything enqueued so
    /// far on the GPU's stream. Returns without waiting; `wait_set` waits.
    fn broadcast_stage(
        &mut self,
        set: usize,
        header: &Header,
        manifest: &[u8],
        payload: &[(DevicePtr, u64)],
    ) -> Result<()> {
        let root = self.config.root;
        let side = self.nccl_stream.handle();
        let bufs = &mut self.sets[set];
        let mptr = bufs.manifest.at_least(&self.gpu, manifest.len() as u64)?;
        // SAFETY: our buffers, sized for what is copied, not in flight (the caller waited);
        // the NCCL stream waits for the GPU's stream, so each broadcast reads finished data
        // (the diff's and encoder's output, and the tensors after the caller's stream).
        unsafe {
            self.gpu
                .copy_to_device(bufs.header.ptr(), &header.encode())?;
            self.gpu.copy_to_device(mptr, manifest)?;
            self.gpu.record_event(&self.ready, 0)?;
            self.gpu.stream_wait_event(side, &self.ready)?;
            self.comm.broadcast(
                bufs.header.ptr(),
                bufs.header.ptr(),
                HEADER_BYTES,
                root,
                side,
            )?;
            self.comm
                .broadcast(mptr, mptr, manifest.len(), root, side)?;
            for &(ptr, len) in payload {
                self.comm.broadcast(ptr, ptr, len as usize, root, side)?;
            }
            self.gpu.record_event(&bufs.sent, side)?;
        }
        bufs.in_flight = true;
        Ok(())
    }

    /// Seed or dense stage: header, digests, then the stage's tensors whole. Returns the
    /// bytes broadcast.
    fn send_whole(
        &mut self,
        kind: SyncKind,
        stage: u32,
        stages: u32,
        slots: Range<usize>,
        version: u64,
        after: &mut [u64],
    ) -> Result<u64> {
        let set = stage as usize % self.sets.len();
        self.wait_set(set)?;
        // A seed or dense stage does not depend on what the receiver held: "before" is 0.
        let manifest = Manifest {
            digests: after[slots.clone()].iter().map(|&a| (0, a)).collect(),
            chunks: Vec::new(),
        }
        .encode();
        let bytes: u64 = self.tensors[slots.clone()].iter().map(|t| t.nbytes()).sum();
        let header = Header {
            kind,
            version,
            table_hash: self.table.hash(),
            num_slots: self.tensors.len() as u32,
            num_chunks: 0,
            manifest_bytes: manifest.len() as u64,
            position_bytes: 0,
            value_bytes: bytes,
            stage,
            stages,
            first_slot: slots.start as u32,
            stage_slots: slots.len() as u32,
        };
        let payload: Vec<(DevicePtr, u64)> = self.tensors[slots]
            .iter()
            .map(|t| (t.ptr, t.nbytes()))
            .collect();
        self.broadcast_stage(set, &header, &manifest, &payload)?;
        Ok(HEADER_BYTES as u64 + manifest.len() as u64 + bytes)
    }

    /// The ack: an all-reduce (max) of every rank's status after the last stage; the sender
    /// contributes 0.
    fn finish(&mut self, version: u64, after: Vec<u64>) -> Result<()> {
        let side = self.nccl_stream.handle();
        // SAFETY: our status word; the NCCL stream waits for its zeroing.
        unsafe {
            self.gpu.memset(self.status.ptr(), 0, 8)?;
            self.gpu.record_event(&self.ready, 0)?;
            self.gpu.stream_wait_event(side, &self.ready)?;
            self.comm.all_reduce_max_u64(self.status.ptr(), 1, side)?;
            self.gpu.record_event(&self.acked, side)?;
        }
        self.comm
            .wait(self.acked.handle(), self.config.timeout, "the sync")?;
        // Every broadcast before the all-reduce has completed.
        for set in &mut self.sets {
            set.in_flight = false;
        }
        // SAFETY: our status word; the all-reduce that wrote it has completed.
        let status = u64s(&unsafe { self.gpu.download(self.status.ptr(), 8)? })[0];
        if status != 0 {
            self.needs_seed = true;
            return Err(CudaError::ReceiverRefused(status));
        }
        self.version = version;
        self.digests = after;
        self.needs_seed = false;
        Ok(())
    }
}

/// A receiver's buffers for one stage index of a sync (kept for the whole sync: an applied
/// stage may have to be undone from them).
struct StageBuffers {
    positions: Growable,
    values: Growable,
    /// Positions decoded from gaps sections (u32 each) and values decoded from ulp sections.
    decoded_positions: Growable,
    decoded_values: Growable,
    /// The bits a journaled scatter overwrote.
    journal: Growable,
}

impl StageBuffers {
    fn new() -> Self {
        StageBuffers {
            positions: Growable::new(),
            values: Growable::new(),
            decoded_positions: Growable::new(),
            decoded_values: Growable::new(),
            journal: Growable::new(),
        }
    }

    fn bytes(&self) -> u64 {
        self.positions.len()
            + self.values.len()
            + self.decoded_positions.len()
            + self.decoded_values.len()
            + self.journal.len()
    }
}

/// A stage applied during the sync being received, with what undoes it.
enum Applied {
    /// A delta: its chunks, and the journal of the bits its scatter overwrote.
    Delta {
        inputs: Vec<ApplyInput>,
        journal: DevicePtr,
    },
    /// A dense stage: (tensor, copy of its previous bytes, bytes) per tensor.
    Whole {
        saved: Vec<(DevicePtr, DevicePtr, u64)>,
    },
}

/// What a receiver gathers over the stages of one sync.
struct Incoming {
    /// The first refusal; later stages are received and dropped.
    failure: Option<CudaError>,
    applied: Vec<Applied>,
    /// A seed or dense stage has landed in the tensors without a copy of what it replaced
    /// (a failure then leaves no version held).
    clobbered: bool,
    /// The digests after the stages applied so far.
    digests: Vec<u64>,
    changed: u64,
    payload_bytes: u64,
    chunks: u64,
    entropy: bool,
    dense_stages: u32,
    any_delta: bool,
}

/// The receiving side of a GPU sync: applies into tensors it is given, all or nothing.
pub struct GpuReceiver {
    gpu: Gpu,
    comm: NcclComm,
    root: usize,
    timeout: Duration,
    tensors: Vec<GpuTensor>,
    limits: TableLimits,
    /// Digests of the bits held, valid when `version > 0`.
    digests: Vec<u64>,
    /// 0: holds nothing trustworthy (before the first seed, after a failed whole sync).
    version: u64,
    header: DeviceBuffer,
    manifest: Growable,
    /// Per stage index.
    stages: Vec<StageBuffers>,
    /// Where the stages after a refusal are received (and dropped).
    discard: Growable,
    code_scratch: CodeScratch,
    status: DeviceBuffer,
}

impl GpuReceiver {
    /// A receiver into `tensors` (borrowed; written in place by each applied sync).
    ///
    /// # Safety
    /// Every pointer must be device memory of `gpu`'s device valid for its tensor's bytes.
    pub unsafe fn new(
        gpu: Gpu,
        comm: NcclComm,
        tensors: Vec<GpuTensor>,
        root: usize,
        timeout: Duration,
    ) -> Result<GpuReceiver> {
        if root == comm.rank() || root >= comm.nranks() {
            return Err(CudaError::InvalidArgument(format!(
                "receiver rank {} with root {root} of {}",
                comm.rank(),
                comm.nranks()
            )));
        }
        check_tensors(&tensors)?;
        let table = slot_table(&tensors)?;
        let n = tensors.len();
        Ok(GpuReceiver {
            header: gpu.alloc(HEADER_BYTES)?,
            status: gpu.alloc(8)?,
            manifest: Growable::new(),
            stages: Vec::new(),
            discard: Growable::new(),
            code_scratch: CodeScratch::new(),
            limits: limits(&table),
            digests: vec![0; n],
            version: 0,
            gpu,
            comm,
            root,
            timeout,
            tensors,
        })
    }

    /// The version held (0: none yet, or the last whole sync failed).
    pub fn version(&self) -> u64 {
        self.version
    }

    pub fn digests(&self) -> &[u64] {
        &self.digests
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Device bytes this receiver holds besides the tensors it was given (its receive
    /// buffers per stage, sized by the largest delta seen, with the journals of staged
    /// syncs; seeds and dense stages land in the tensors).
    pub fn staging_bytes(&self) -> u64 {
        (HEADER_BYTES + 8) as u64
            + self.manifest.len()
            + self.stages.iter().map(StageBuffers::bytes).sum::<u64>()
            + self.discard.len()
            + self.code_scratch.len()
    }

    /// Receives and applies the next sync, stage by stage; `None` when the sender closed.
    /// `idle_timeout` bounds the wait for the sync to start (default: forever, as a training
    /// step may be long); after it the communicator is aborted. A refused sync (digest, base
    /// version, checks, in any stage) is undone, acked as refused, and returns the error: the
    /// receiver keeps the version it held (none, when a seed or dense stage had already
    /// landed). Protocol errors abort the communicator (peers fail too, never hang).
    ///
    /// # Safety
    /// `wait_stream` must be a live stream of the GPU's context, or 0.
    pub unsafe fn receive(
        &mut self,
        wait_stream: u64,
        idle_timeout: Option<Duration>,
    ) -> Result<Option<GpuSyncReport>> {
        let started = Instant::now();
        let mut mark = started;
        let mut phases = Phases::new();
        // SAFETY: per this function's contract.
        unsafe { self.gpu.wait_for_stream(wait_stream)? };
        let mut got = Incoming {
            failure: None,
            applied: Vec::new(),
            clobbered: false,
            digests: self.digests.clone(),
            changed: 0,
            payload_bytes: 0,
            chunks: 0,
            entropy: false,
            dense_stages: 0,
            any_delta: false,
        };
        let last = match self.receive_stages(idle_timeout, &mut got, &mut phases, &mut mark) {
            Ok(Some(last)) => last,
            Ok(None) => return Ok(None),
            Err(e) => {
                // The link failed (or lied) part way: put back what this sync applied.
                self.undo(&mut got);
                if got.clobbered {
                    self.version = 0;
                }
                return Err(e);
            }
        };
        // Every stage applied and verified: this receiver holds the new version, whatever
        // becomes of the ack (a sender that misses it reseeds).
        let refused = match got.failure.take() {
            Some(e) => {
                if got.clobbered {
                    self.version = 0;
                }
                Some(e)
            }
            None => {
                self.digests = std::mem::take(&mut got.digests);
                self.version = last.version;
                None
            }
        };
        // The ack: 1 when this receiver refused.
        let stream = self.gpu.stream_handle();
        // SAFETY: our status word.
        unsafe {
            self.gpu.memset(self.status.ptr(), 0, 8)?;
            self.gpu
                .memset(self.status.ptr(), refused.is_some() as u8, 1)?;
            self.comm.all_reduce_max_u64(self.status.ptr(), 1, stream)?;
        }
        let done = self.gpu.record_done()?;
        self.comm.wait(done, self.timeout, "the ack")?;
        phases.lap("ack", &mut mark);
        if let Some(e) = refused {
            return Err(e);
        }
        Ok(Some(GpuSyncReport {
            kind: if got.any_delta {
                SyncKind::Delta
            } else {
                last.kind
            },
            version: self.version,
            changed: got.changed,
            numel: self.limits.total_elements,
            payload_bytes: got.payload_bytes,
            chunks: got.chunks,
            time_ms: ms(started),
            diff_ms: 0.0,
            entropy: got.entropy,
            stages: last.stages,
            dense_stages: got.dense_stages,
            phases: phases.finish("receiver"),
        }))
    }

    /// Receives the stages of one sync, applying each (or, after a refusal, dropping it);
    /// returns the last stage's header, or `None` when the sender closed. A refusal is left
    /// in `got.failure` with the stages before it undone; an `Err` is a failure of the link
    /// or the protocol (the caller undoes what was applied).
    fn receive_stages(
        &mut self,
        idle_timeout: Option<Duration>,
        got: &mut Incoming,
        phases: &mut Phases,
        mark: &mut Instant,
    ) -> Result<Option<Header>> {
        let mut prev: Option<Header> = None;
        loop {
            // Waiting for the next sync can take a whole training step: no timeout unless
            // asked; the stages of a sync follow each other.
            let wait = match prev {
                None => idle_timeout.unwrap_or(Duration::from_secs(u64::MAX / 4)),
                Some(_) => self.timeout,
            };
            let header = self.receive_header(wait)?;
            phases.lap("wait", mark);
            if header.kind == SyncKind::Close {
                if prev.is_none() {
                    return Ok(None);
                }
                self.comm.abort();
                return Err(CudaError::Protocol(
                    "a close in the middle of a sync".into(),
                ));
            }
            if let Err(e) = header.follows(prev.as_ref()) {
                self.comm.abort();
                return Err(e);
            }
            let manifest = self.receive_manifest(&header)?;
            phases.lap("manifest", mark);
            got.payload_bytes += HEADER_BYTES as u64
                + header.manifest_bytes
                + header.position_bytes
                + header.value_bytes;
            got.chunks += header.num_chunks;
            if got.failure.is_some() {
                self.discard_stage(&header)?;
                phases.lap("payload", mark);
            } else {
                let applied = match header.kind {
                    SyncKind::Delta => self.apply_delta(&header, &manifest, got, phases, mark),
                    _ => self.apply_whole(&header, &manifest, got),
                };
                phases.lap("apply", mark);
                if let Err(e) = applied {
                    self.undo(got);
                    got.failure = Some(e);
                }
            }
            if header.stage + 1 == header.stages {
                return Ok(Some(header));
            }
            prev = Some(header);
        }
    }

    /// Receives and checks a stage's header (a bad one aborts the communicator: without it
    /// the next broadcasts cannot be matched).
    fn receive_header(&mut self, wait: Duration) -> Result<Header> {
        let stream = self.gpu.stream_handle();
        // SAFETY: our header buffer.
        unsafe {
            self.comm.broadcast(
                self.header.ptr(),
                self.header.ptr(),
                HEADER_BYTES,
                self.root,
                stream,
            )?
        };
        let done = self.gpu.record_done()?;
        self.comm.wait(done, wait, "waiting for the next sync")?;
        // SAFETY: our header buffer, complete.
        let head = unsafe { self.gpu.download(self.header.ptr(), HEADER_BYTES)? };
        Header::decode(&head, &self.limits).inspect_err(|_| self.comm.abort())
    }

    /// Receives and checks a stage's manifest (bounded by the checked header).
    fn receive_manifest(&mut self, header: &Header) -> Result<Manifest> {
        let stream = self.gpu.stream_handle();
        let mptr = self.manifest.at_least(&self.gpu, header.manifest_bytes)?;
        // SAFETY: sized above.
        unsafe {
            self.comm.broadcast(
                mptr,
                mptr,
                header.manifest_bytes as usize,
                self.root,
                stream,
            )?
        };
        let done = self.gpu.record_done()?;
        self.comm.wait(done, self.timeout, "the manifest")?;
        // SAFETY: complete (waited above).
        let mbytes = unsafe { self.gpu.download(mptr, header.manifest_bytes as usize)? };
        Manifest::decode(&mbytes, header, &self.limits).inspect_err(|_| self.comm.abort())
    }

    /// Receives a stage after this sync was refused, into scratch: the broadcasts must be
    /// matched, the bytes are not used.
    fn discard_stage(&mut self, header: &Header) -> Result<()> {
        let stream = self.gpu.stream_handle();
        let lens: Vec<u64> = match header.kind {
            SyncKind::Delta => vec![header.position_bytes, header.value_bytes],
            _ => self.tensors[header.slots()]
                .iter()
                .map(|t| t.nbytes())
                .collect(),
        };
        let most = lens.iter().copied().max().unwrap_or(0);
        let ptr = self.discard.at_least(&self.gpu, most)?;
        for len in lens {
            // SAFETY: scratch of at least `len` bytes (bounded by the checked header and
            // this receiver's own tensors).
            unsafe {
                self.comm
                    .broadcast(ptr, ptr, len as usize, self.root, stream)?
            };
        }
        let done = self.gpu.record_done()?;
        self.comm.wait(done, self.timeout, "a refused stage")
    }

    /// Undoes the stages applied during this sync, last first.
    fn undo(&mut self, got: &mut Incoming) {
        while let Some(a) = got.applied.pop() {
            // SAFETY: the chunks and journals of this sync's stages; their buffers are kept
            // until the sync ends; each saved copy holds its tensor's bytes.
            let undone = unsafe {
                match &a {
                    Applied::Delta { inputs, journal } => self.gpu.apply_undo(inputs, *journal),
                    Applied::Whole { saved } => saved.iter().try_for_each(|&(t, copy, len)| {
                        self.gpu.copy_device(t, copy, len as usize)
                    }),
                }
            };
            if undone.is_err() {
                // The tensors are in an unknown state.
                got.clobbered = true;
            }
        }
        if self.gpu.synchronize().is_err() {
            got.clobbered = true;
        }
        got.digests = self.digests.clone();
    }

    fn apply_delta(
        &mut self,
        header: &Header,
        manifest: &Manifest,
        got: &mut Incoming,
        phases: &mut Phases,
        mark: &mut Instant,
    ) -> Result<()> {
        let stream = self.gpu.stream_handle();
        let stage = header.stage as usize;
        while self.stages.len() <= stage {
            self.stages.push(StageBuffers::new());
        }
        let bufs = &mut self.stages[stage];
        // The decoders look a few bytes past a section's end: the slack keeps that inside.
        let pptr = bufs
            .positions
            .at_least(&self.gpu, header.position_bytes + DECODE_SLACK)?;
        let vptr = bufs
            .values
            .at_least(&self.gpu, header.value_bytes + DECODE_SLACK)?;
        // SAFETY: sized above (bounded by this receiver's own table in Header::decode).
        unsafe {
            self.comm.broadcast(
                pptr,
                pptr,
                header.position_bytes as usize,
                self.root,
                stream,
            )?;
            self.comm
                .broadcast(vptr, vptr, header.value_bytes as usize, self.root, stream)?;
        }
        let done = self.gpu.record_done()?;
        self.comm.wait(done, self.timeout, "the delta")?;
        phases.lap("payload", mark);
        let first = header.first_slot as usize;
        if self.version == 0 || header.version != self.version + 1 {
            return Err(CudaError::BaseMismatch {
                held: self.version,
                slot: first as u32,
                expected: manifest.digests.first().map_or(0, |d| d.0),
                actual: self.digests.get(first).copied().unwrap_or(0),
            });
        }
        for (i, &(before, _)) in manifest.digests.iter().enumerate() {
            let held = self.digests[first + i];
            if before != held {
                return Err(CudaError::BaseMismatch {
                    held: self.version,
                    slot: (first + i) as u32,
                    expected: before,
                    actual: held,
                });
            }
        }
        // Entropy-coded sections are decoded into staging first (positions as abs32, values
        // as raw), then checked and applied like the others.
        let width = |c: &ChunkRecord| self.tensors[c.slot as usize].dtype.width() as u64;
        let mut pos_stage = 0u64;
        let mut val_stage = 0u64;
        let mut stage_at = Vec::with_capacity(manifest.chunks.len());
        for c in &manifest.chunks {
            stage_at.push((pos_stage, val_stage));
            // 16-aligned, so the decoders can write whole vectors.
            if c.positions == ChunkPositions::Gaps {
                pos_stage += (c.count * 4).next_multiple_of(16);
            }
            if c.values == ChunkValues::Ulp {
                val_stage += (c.count * width(c)).next_multiple_of(16);
            }
        }
        let bufs = &mut self.stages[stage];
        let sp = bufs
            .decoded_positions
            .at_least(&self.gpu, pos_stage + DECODE_SLACK)?;
        let sv = bufs.decoded_values.at_least(&self.gpu, val_stage)?;
        let mut decode = Vec::new();
        let mut decode_chunk = Vec::new();
        let mut inputs = Vec::with_capacity(manifest.chunks.len());
        for (k, (c, &(ps, vs))) in manifest.chunks.iter().zip(&stage_at).enumerate() {
            let t = &self.tensors[c.slot as usize];
            let w = t.dtype.width() as u64;
            let wire_pos = pptr + c.position_offset;
            let wire_val = vptr + c.value_offset;
            let (positions, pos_section, pos_len) = match c.positions {
                ChunkPositions::Abs32 => (ApplyPositions::Abs32, wire_pos, c.position_len),
                ChunkPositions::Bitmap => (ApplyPositions::Bitmap, wire_pos, c.position_len),
                ChunkPositions::Gaps => (ApplyPositions::Abs32, sp + ps, c.count * 4),
            };
            let (val_section, val_len) = match c.values {
                ChunkValues::Raw => (wire_val, c.value_len),
                ChunkValues::Ulp => (sv + vs, c.count * w),
            };
            if c.positions == ChunkPositions::Gaps || c.values == ChunkValues::Ulp {
                decode_chunk.push(k);
                decode.push(DecodeInput {
                    held: t.ptr,
                    slot_numel: t.numel(),
                    width: t.dtype.width(),
                    start: c.start,
                    range: c.range,
                    count: c.count,
                    positions: match c.positions {
                        ChunkPositions::Gaps => DecodePositions::Gaps {
                            section: wire_pos,
                            len: c.position_len,
                            out: sp + ps,
                        },
                        _ => DecodePositions::Abs32 {
                            section: wire_pos,
                            len: c.position_len,
                        },
                    },
                    values: (c.values == ChunkValues::Ulp).then_some((
                        wire_val,
                        c.value_len,
                        sv + vs,
                    )),
                });
            }
            inputs.push(ApplyInput {
                dst: t.ptr,
                slot_numel: t.numel(),
                width: t.dtype.width(),
                slot: c.slot,
                start: c.start,
                range: c.range,
                count: c.count,
                positions,
                pos_section,
                pos_len,
                val_section,
                val_len,
            });
        }
        // SAFETY: every section lies inside the received buffers, which hold DECODE_SLACK
        // bytes past the announced lengths (Manifest::decode checked the offsets); the
        // staging was sized above; the slots are ours. Nothing is written to the slots.
        let failed = unsafe { self.gpu.entropy_decode(&mut self.code_scratch, &decode)? };
        if let Some(e) = failed.first() {
            return Err(CudaError::BadChunk {
                chunk: decode_chunk[e.chunk],
                reason: e.reason,
            });
        }
        if !decode.is_empty() {
            got.entropy = true;
            phases.lap("decode", mark);
        }
        // Digests of every slot: the stage's from the manifest, the others as held (they
        // get no chunk here, so their change is 0).
        let mut expected = self.digests.clone();
        for (i, &(_, a)) in manifest.digests.iter().enumerate() {
            expected[first + i] = a;
        }
        // The last stage is never undone; the others keep what they overwrite.
        let journaled = header.stage + 1 < header.stages;
        // SAFETY: sections lie inside the received buffers (Manifest::decode checked the
        // offsets against the announced lengths, which the buffers hold); slots are ours;
        // the journal is sized by its layout.
        let new = unsafe {
            if journaled {
                let journal = self.stages[stage]
                    .journal
                    .at_least(&self.gpu, journal_layout(&inputs).1)?;
                let new = self.gpu.apply_verified_journaled(
                    &inputs,
                    &self.digests,
                    &expected,
                    journal,
                )?;
                got.applied.push(Applied::Delta { inputs, journal });
                new
            } else {
                self.gpu
                    .apply_verified(&inputs, false, &self.digests, &expected)?
            }
        };
        for i in header.slots() {
            got.digests[i] = new[i];
        }
        got.changed += manifest.chunks.iter().map(|c| c.count).sum::<u64>();
        got.any_delta = true;
        Ok(())
    }

    /// A seed or dense stage: the bytes land in the tensors directly. A dense stage that is
    /// not the last first copies the bytes it replaces into its journal (so that a later
    /// stage's failure can undo it); a seed or a last stage does not, so a failure of its
    /// own digests leaves no version held.
    fn apply_whole(
        &mut self,
        header: &Header,
        manifest: &Manifest,
        got: &mut Incoming,
    ) -> Result<()> {
        let stream = self.gpu.stream_handle();
        let slots = header.slots();
        if header.kind == SyncKind::Dense && header.stage + 1 < header.stages {
            let stage = header.stage as usize;
            while self.stages.len() <= stage {
                self.stages.push(StageBuffers::new());
            }
            let bytes: u64 = self.tensors[slots.clone()].iter().map(|t| t.nbytes()).sum();
            let base = self.stages[stage].journal.at_least(&self.gpu, bytes)?;
            let mut saved = Vec::with_capacity(slots.len());
            let mut at = base;
            for t in &self.tensors[slots.clone()] {
                // SAFETY: the journal holds the stage's bytes; the tensor is ours. Enqueued
                // on the stream the broadcast below follows.
                unsafe { self.gpu.copy_device(at, t.ptr, t.nbytes() as usize)? };
                saved.push((t.ptr, at, t.nbytes()));
                at += t.nbytes();
            }
            got.applied.push(Applied::Whole { saved });
        } else {
            got.clobbered = true;
        }
        for t in &self.tensors[slots.clone()] {
            // SAFETY: each tensor is valid for nbytes (the caller's promise at construction).
            unsafe {
                self.comm
                    .broadcast(t.ptr, t.ptr, t.nbytes() as usize, self.root, stream)?
            };
        }
        let done = self.gpu.record_done()?;
        self.comm.wait(done, self.timeout, "the tensors")?;
        // SAFETY: our tensors (constructor contract).
        let digests = unsafe {
            self.gpu
                .digest(&digest_inputs(&self.tensors, slots.clone()))?
        };
        for (i, (&(_, expected), &actual)) in manifest.digests.iter().zip(&digests).enumerate() {
            if expected != actual {
                return Err(CudaError::DigestMismatch {
                    slot: (slots.start + i) as u32,
                    expected,
                    actual,
                });
            }
        }
        got.digests[slots.clone()].copy_from_slice(&digests);
        got.changed += self.tensors[slots].iter().map(|t| t.numel()).sum::<u64>();
        got.dense_stages += 1;
        Ok(())
    }

    /// Recomputes the digests of the bits held and compares them with the ones recorded:
    /// finds weights changed behind the receiver's back (then it needs a seed).
    pub fn verify(&mut self) -> Result<()> {
        let all = 0..self.tensors.len();
        // SAFETY: our tensors (constructor contract).
        let got = unsafe { self.gpu.digest(&digest_inputs(&self.tensors, all))? };
        for (slot, (&expected, &actual)) in self.digests.iter().zip(&got).enumerate() {
            if expected != actual {
                self.version = 0;
                return Err(CudaError::DigestMismatch {
                    slot: slot as u32,
                    expected,
                    actual,
                });
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_entropy_tries_both_then_keeps_the_faster_and_probes_the_other() {
        let mut auto = AutoEntropy::default();
        assert!(auto.choose(), "first: entropy");
        auto.record(true, 30.0, 1000);
        assert!(!auto.choose(), "second: without");
        auto.record(false, 10.0, 1000);
        // Without is 3× faster: kept, entropy retried once every 3 × AUTO_PROBE_EVERY deltas.
        let run = |auto: &mut AutoEntropy, n: u64, on: f64, off: f64| -> Vec<bool> {
            (0..n)
                .map(|_| {
                    let e = auto.choose();
                    auto.record(e, if e { on } else { off }, 1000);
                    e
                })
                .collect()
        };
        let chosen = run(&mut auto, 6 * AUTO_PROBE_EVERY, 30.0, 10.0);
        assert_eq!(chosen.iter().filter(|&&e| e).count(), 2, "{chosen:?}");
        // Nearly equal: retried every AUTO_PROBE_EVERY.
        let mut close = AutoEntropy::default();
        close.record(true, 10.5, 1000);
        close.record(false, 10.0, 1000);
        let chosen = run(&mut close, 4 * AUTO_PROBE_EVERY, 10.5, 10.0);
        assert_eq!(chosen.iter().filter(|&&e| e).count(), 4);
        // The link slows down: a probe of entropy shows it is now the faster one, and it is
        // kept from then on.
        let chosen = run(&mut auto, 8 * AUTO_PROBE_EVERY, 30.0, 90.0);
        let first_on = chosen.iter().position(|&e| e).expect("entropy retried");
        assert!(first_on <= 3 * AUTO_PROBE_EVERY as usize);
        let after = &chosen[first_on..];
        let offs = after.iter().filter(|&&e| !e).count();
        assert!(
            offs <= after.len() / AUTO_PROBE_EVERY as usize + 1,
            "only probes go back: {chosen:?}"
        );
        // Per changed element: a bigger step with the same time per change costs the same.
        let mut a = AutoEntropy::default();
        a.record(true, 10.0, 100);
        a.record(false, 50.0, 1000);
        assert!(!a.choose());
    }
}
