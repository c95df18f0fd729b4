//! The GPU sync: a trainer rank ([`GpuSender`]) pushes its tensors to receivers
//! ([`GpuReceiver`]) over NCCL, sending only the changed elements (message layout in
//! [`crate::protocol`]).
//!
//! Per sync the sender runs one batched diff over every tensor against its snapshot (which
//! the diff refreshes in place, and whose per-slot digests it updates, fused), forms the
//! core's chunks on the GPU with both abs32 and bitmap sections, keeps the smaller of the two
//! per chunk, packs them with one kernel, and broadcasts header, manifest, positions and
//! values. When the delta would be as large as the tensors themselves, or more elements
//! changed than the delta buffers hold, it sends the tensors whole instead (dense). Receivers
//! check everything against their own slot table, check every chunk and compute their new
//! digests on the GPU, and only then scatter; an all-reduce of their status is the ack.
//!
//! Tensors are borrowed by device pointer (a torch tensor's `data_ptr()`), never freed; both
//! sides make their own stream wait for the caller's stream (torch's current stream) first,
//! and return only once their work is complete.

use std::time::{Duration, Instant};

use deltacast::{DType, SlotInfo, SlotTable};

use crate::error::{CudaError, Result};
use crate::nccl::NcclComm;
use crate::protocol::{
    choose_sections, ChunkPositions, ChunkRecord, ChunkValues, Header, Manifest, SyncKind,
    TableLimits, HEADER_BYTES, MIN_CHUNK_ELEMS,
};
use crate::{
    ApplyInput, ApplyPositions, CodeChunk, CodePlace, CodeScratch, CodeValues, DecodeInput,
    DecodePositions, DeviceBuffer, DevicePtr, DiffInput, DiffOutput, DigestInput, EncodeInput, Gpu,
    HostBuffer, DECODE_SLACK,
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
}

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
    /// Wall time of each phase, in order (sender: diff, encode, send+ack; receiver: wait,
    /// manifest, payload, apply, ack), in milliseconds.
    pub phases: Vec<(&'static str, f64)>,
}

/// Phase end times (since the start) into phase durations.
fn cumulative_to_spans(ends: Vec<(&'static str, f64)>) -> Vec<(&'static str, f64)> {
    let mut last = 0.0;
    ends.into_iter()
        .map(|(name, end)| {
            let span = end - last;
            last = end;
            (name, span)
        })
        .collect()
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

/// Broadcasts every tensor whole, slot after slot (seed and dense; the root sends from its
/// tensors, receivers write into theirs).
fn broadcast_tensors(
    comm: &mut NcclComm,
    gpu: &Gpu,
    tensors: &[GpuTensor],
    root: usize,
) -> Result<()> {
    for t in tensors {
        // SAFETY: each tensor is valid for nbytes (the caller's promise at construction).
        unsafe { comm.broadcast(t.ptr, t.ptr, t.nbytes() as usize, root, gpu.stream_handle())? };
    }
    Ok(())
}

fn digest_inputs(tensors: &[GpuTensor]) -> Vec<DigestInput> {
    tensors
        .iter()
        .enumerate()
        .map(|(i, t)| DigestInput {
            ptr: t.ptr,
            numel: t.numel(),
            width: t.dtype.width(),
            first_index: 0,
            slot: i as u32,
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

/// The trainer side of a GPU sync.
pub struct GpuSender {
    gpu: Gpu,
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
    capacity: u64,
    positions: DeviceBuffer,
    values: DeviceBuffer,
    /// The old bits of the changes (entropy mode: the ulp steps need them).
    old_values: Option<DeviceBuffer>,
    packed: Growable,
    /// The value sections, packed (entropy mode; otherwise `values` is sent as it is).
    packed_values: Growable,
    code_scratch: CodeScratch,
    auto: AutoEntropy,
    header: DeviceBuffer,
    manifest: Growable,
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
        let total = table.total_elements();
        let capacity = ((total as f64 * config.capacity).ceil() as u64).clamp(1, total.max(1));
        let max_width = tensors.iter().map(|t| t.dtype.width()).max().unwrap_or(1) as u64;
        let n = tensors.len();
        Ok(GpuSender {
            // (The entropy coder reads its inputs 16 bytes at a time: DECODE_SLACK past the
            // end keeps those reads inside the buffers.)
            positions: gpu.alloc((capacity * 8 + DECODE_SLACK) as usize)?,
            values: gpu
                .alloc(((capacity * max_width).next_multiple_of(8) + DECODE_SLACK) as usize)?,
            old_values: if config.entropy != EntropyMode::Off {
                Some(
                    gpu.alloc(
                        ((capacity * max_width).next_multiple_of(8) + DECODE_SLACK) as usize,
                    )?,
                )
            } else {
                None
            },
            packed: Growable::new(),
            packed_values: Growable::new(),
            code_scratch: CodeScratch::new(),
            auto: AutoEntropy::default(),
            header: gpu.alloc(HEADER_BYTES)?,
            manifest: Growable::new(),
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

    /// Device bytes this sender holds besides the tensors: the snapshot when allocated here
    /// on the device, the delta buffers (sized by `capacity`), the packed positions, and the
    /// diff's per-tile slots in the GPU's scratch (1/8 of the bytes diffed, once a delta ran).
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
            + [&self.positions, &self.values]
                .iter()
                .map(|b| b.len() as u64)
                .sum::<u64>()
            + self.old_values.as_ref().map_or(0, |b| b.len() as u64)
            + self.packed.len()
            + self.packed_values.len()
            + self.code_scratch.len()
            + self.manifest.len()
            + self.gpu.large_scratch_bytes()
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

    /// Sends a seed (every tensor whole) and takes a fresh snapshot.
    ///
    /// # Safety
    /// `wait_stream` must be a live stream of the GPU's context, or 0.
    pub unsafe fn seed(&mut self, wait_stream: u64) -> Result<GpuSyncReport> {
        let started = Instant::now();
        self.needs_seed = true;
        // SAFETY: per this function's contract.
        unsafe { self.gpu.wait_for_stream(wait_stream)? };
        self.refresh_whole()?;
        let all = self.table.total_elements();
        self.send_whole(SyncKind::Seed, all, started, 0.0)
    }

    /// Sends what changed since the last version (a seed first, when one is due).
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
        let inputs: Vec<DiffInput> = self
            .tensors
            .iter()
            .zip(&self.snapshots)
            .enumerate()
            .map(|(i, (t, s))| DiffInput {
                snapshot: s.ptr(),
                current: t.ptr,
                numel: t.numel(),
                width: t.dtype.width(),
                first_index: 0,
                digest: Some((self.digests_dev.ptr() + 8 * i as u64, i as u32)),
            })
            .collect();
        let use_entropy = match self.config.entropy {
            EntropyMode::Off => false,
            EntropyMode::On => true,
            EntropyMode::Auto => self.auto.choose(),
        };
        let entropy = self
            .old_values
            .as_ref()
            .filter(|_| use_entropy)
            .map(|b| b.ptr());
        let out = DiffOutput {
            positions: self.positions.ptr(),
            new_values: self.values.ptr(),
            old_values: entropy,
            capacity: self.capacity,
        };
        // SAFETY: tensors and snapshots are valid (constructor contract), the outputs are
        // ours and sized for `capacity`.
        let diff = unsafe {
            match self.config.snapshot {
                SnapshotPlace::PinnedHost => self.gpu.diff_batch_host_snapshot(&inputs, &out)?,
                _ => self.gpu.diff_batch(&inputs, &out)?,
            }
        };
        let diff_ms = diff.kernel_ms as f64;
        let mut phases = vec![("diff", ms(started))];
        let before = self.digests.clone();
        if !diff.is_complete() {
            // More changed than the buffers hold: send everything. The diff refreshed only
            // the snapshot of the tiles it wrote out; the rest is copied whole.
            self.refresh_whole()?;
            return self.send_whole(SyncKind::Dense, diff.found, started, diff_ms);
        }
        // SAFETY: our digest words (the diff added every change's digest update).
        let after = u64s(&unsafe {
            self.gpu
                .download(self.digests_dev.ptr(), self.tensors.len() * 8)?
        });
        let encode: Vec<EncodeInput> = self
            .tensors
            .iter()
            .zip(&diff.tensors)
            .map(|(t, r)| EncodeInput {
                change_offset: r.offset,
                change_count: r.written,
                first_index: 0,
                numel: t.numel(),
            })
            .collect();
        // Counting run: the chunks (grid cells tightened to their changes), no sections yet.
        // SAFETY: positions hold every change written by the diff.
        let grid = unsafe {
            self.gpu.encode_positions(
                self.positions.ptr(),
                &encode,
                self.config.chunk_elems,
                None,
                None,
            )?
        };
        // Entropy mode: every chunk sized exactly in gaps and ulp, on the GPU.
        let code_chunks: Vec<CodeChunk> = match entropy {
            Some(old) => grid
                .iter()
                .map(|g| {
                    let r = &diff.tensors[g.input];
                    let w = self.tensors[g.input].dtype.width();
                    let at = r.value_offset + (g.lo - r.offset) * w as u64;
                    CodeChunk {
                        positions: self.positions.ptr() + g.lo * 8,
                        new_bits: self.values.ptr() + at,
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
            let t = &self.tensors[g.input];
            let r = &diff.tensors[g.input];
            let w = t.dtype.width() as u64;
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
                slot: g.input as u32,
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
            digests: before.iter().copied().zip(after.iter().copied()).collect(),
            chunks,
        }
        .encode();
        let delta_bytes = HEADER_BYTES as u64 + manifest.len() as u64 + pos_bytes + value_bytes;
        if delta_bytes >= self.table.total_bytes() {
            // Dense wins: the snapshot and digests are already current.
            self.digests = after;
            return self.send_whole(SyncKind::Dense, diff.found, started, diff_ms);
        }
        let packed = self.packed.at_least(&self.gpu, pos_bytes)?;
        let values_ptr = if entropy.is_some() {
            let pv = self.packed_values.at_least(&self.gpu, value_bytes)?;
            // SAFETY: our buffers, at least this long; the entropy writer ORs into zeros.
            unsafe {
                self.gpu.memset(packed, 0, pos_bytes as usize)?;
                self.gpu.memset(pv, 0, value_bytes as usize)?;
            }
            pv
        } else {
            self.values.ptr()
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
        unsafe { self.gpu.encode_place(self.positions.ptr(), &listed)? };
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
        phases.push(("encode", ms(started)));
        let header = Header {
            kind: SyncKind::Delta,
            version: self.version + 1,
            table_hash: self.table.hash(),
            num_slots: self.tensors.len() as u32,
            num_chunks: grid.len() as u64,
            manifest_bytes: manifest.len() as u64,
            position_bytes: pos_bytes,
            value_bytes,
        };
        let stream = self.gpu.stream_handle();
        let root = self.config.root;
        self.broadcast_head(&header, &manifest)?;
        // SAFETY: packed and values_ptr hold pos_bytes / value_bytes written above.
        unsafe {
            self.comm
                .broadcast(packed, packed, pos_bytes as usize, root, stream)?;
            self.comm
                .broadcast(values_ptr, values_ptr, value_bytes as usize, root, stream)?;
        }
        self.finish(header.version, after)?;
        phases.push(("send+ack", ms(started)));
        let time_ms = ms(started);
        self.auto.record(entropy.is_some(), time_ms, diff.found);
        Ok(GpuSyncReport {
            kind: SyncKind::Delta,
            version: self.version,
            changed: diff.found,
            numel: self.table.total_elements(),
            payload_bytes: delta_bytes,
            chunks: grid.len() as u64,
            time_ms,
            diff_ms,
            entropy: entropy.is_some(),
            phases: cumulative_to_spans(phases),
        })
    }

    /// Tells the receivers no sync follows (their `receive` returns `None`).
    pub fn close(&mut self) -> Result<()> {
        let header = Header {
            kind: SyncKind::Close,
            version: self.version,
            table_hash: self.table.hash(),
            num_slots: self.tensors.len() as u32,
            num_chunks: 0,
            manifest_bytes: 0,
            position_bytes: 0,
            value_bytes: 0,
        };
        // No manifest follows a close (receivers stop at the header).
        self.broadcast_head(&header, &[])?;
        let done = self.gpu.record_done()?;
        self.comm.wait(done, self.config.timeout, "the close")
    }

    /// Copies every tensor into its snapshot and recomputes the digests.
    fn refresh_whole(&mut self) -> Result<()> {
        for (t, s) in self.tensors.iter().zip(&self.snapshots) {
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
        self.digests = unsafe { self.gpu.digest(&digest_inputs(&self.tensors))? };
        let bytes: Vec<u8> = self.digests.iter().flat_map(|d| d.to_le_bytes()).collect();
        // SAFETY: our digest words, one per slot.
        unsafe { self.gpu.copy_to_device(self.digests_dev.ptr(), &bytes)? };
        Ok(())
    }

    fn broadcast_head(&mut self, header: &Header, manifest: &[u8]) -> Result<()> {
        let stream = self.gpu.stream_handle();
        let root = self.config.root;
        let mptr = self.manifest.at_least(&self.gpu, manifest.len() as u64)?;
        // SAFETY: our buffers, sized for what is copied.
        unsafe {
            self.gpu
                .copy_to_device(self.header.ptr(), &header.encode())?;
            self.gpu.copy_to_device(mptr, manifest)?;
            self.comm.broadcast(
                self.header.ptr(),
                self.header.ptr(),
                HEADER_BYTES,
                root,
                stream,
            )?;
            self.comm
                .broadcast(mptr, mptr, manifest.len(), root, stream)?;
        }
        Ok(())
    }

    /// Seed or dense: header, digests, then every tensor whole.
    fn send_whole(
        &mut self,
        kind: SyncKind,
        changed: u64,
        started: Instant,
        diff_ms: f64,
    ) -> Result<GpuSyncReport> {
        let before = if kind == SyncKind::Seed {
            vec![0; self.tensors.len()]
        } else {
            self.digests_before_dense()
        };
        let after = self.digests.clone();
        let manifest = Manifest {
            digests: before.into_iter().zip(after.iter().copied()).collect(),
            chunks: Vec::new(),
        }
        .encode();
        let header = Header {
            kind,
            version: self.version + 1,
            table_hash: self.table.hash(),
            num_slots: self.tensors.len() as u32,
            num_chunks: 0,
            manifest_bytes: manifest.len() as u64,
            position_bytes: 0,
            value_bytes: self.table.total_bytes(),
        };
        self.broadcast_head(&header, &manifest)?;
        broadcast_tensors(&mut self.comm, &self.gpu, &self.tensors, self.config.root)?;
        self.finish(header.version, after)?;
        Ok(GpuSyncReport {
            kind,
            version: self.version,
            changed,
            numel: self.table.total_elements(),
            payload_bytes: HEADER_BYTES as u64 + manifest.len() as u64 + self.table.total_bytes(),
            chunks: 0,
            time_ms: ms(started),
            diff_ms,
            entropy: false,
            phases: Vec::new(),
        })
    }

    /// A dense sync does not depend on what the receiver held; it says 0 for "any".
    fn digests_before_dense(&self) -> Vec<u64> {
        vec![0; self.tensors.len()]
    }

    /// The ack: an all-reduce (max) of every rank's status; the sender contributes 0.
    fn finish(&mut self, version: u64, after: Vec<u64>) -> Result<()> {
        let stream = self.gpu.stream_handle();
        // SAFETY: our status word.
        unsafe {
            self.gpu.memset(self.status.ptr(), 0, 8)?;
            self.comm.all_reduce_max_u64(self.status.ptr(), 1, stream)?;
        }
        let done = self.gpu.record_done()?;
        self.comm.wait(done, self.config.timeout, "the sync")?;
        // SAFETY: our status word; the stream has passed the all-reduce.
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
    positions: Growable,
    values: Growable,
    /// Positions decoded from gaps sections (u32 each) and values decoded from ulp sections.
    decoded_positions: Growable,
    decoded_values: Growable,
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
            positions: Growable::new(),
            values: Growable::new(),
            decoded_positions: Growable::new(),
            decoded_values: Growable::new(),
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
    /// buffers, sized by the largest delta seen; seeds and dense syncs land in the tensors).
    pub fn staging_bytes(&self) -> u64 {
        (HEADER_BYTES + 8) as u64
            + self.manifest.len()
            + self.positions.len()
            + self.values.len()
            + self.decoded_positions.len()
            + self.decoded_values.len()
            + self.code_scratch.len()
    }

    /// Receives and applies the next sync; `None` when the sender closed. `idle_timeout`
    /// bounds the wait for the sync to start (default: forever, as a training step may be
    /// long); after it the communicator is aborted. A refused sync
    /// (digest, base version, checks) is acked as refused, applies nothing, and returns the
    /// error; protocol errors abort the communicator (peers fail too, never hang).
    ///
    /// # Safety
    /// `wait_stream` must be a live stream of the GPU's context, or 0.
    pub unsafe fn receive(
        &mut self,
        wait_stream: u64,
        idle_timeout: Option<Duration>,
    ) -> Result<Option<GpuSyncReport>> {
        let started = Instant::now();
        // SAFETY: per this function's contract.
        unsafe { self.gpu.wait_for_stream(wait_stream)? };
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
        // Waiting for the next sync can take a whole training step: no timeout unless asked.
        let idle = idle_timeout.unwrap_or(Duration::from_secs(u64::MAX / 4));
        self.comm.wait(done, idle, "waiting for the next sync")?;
        let mut phases = vec![("wait", ms(started))];
        // SAFETY: our header buffer, complete.
        let head = unsafe { self.gpu.download(self.header.ptr(), HEADER_BYTES)? };
        let header = match Header::decode(&head, &self.limits) {
            Ok(h) => h,
            Err(e) => {
                // Without a trustworthy header the next broadcasts cannot be matched.
                self.comm.abort();
                return Err(e);
            }
        };
        if header.kind == SyncKind::Close {
            return Ok(None);
        }
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
        let manifest = match Manifest::decode(&mbytes, &header, &self.limits) {
            Ok(m) => m,
            Err(e) => {
                self.comm.abort();
                return Err(e);
            }
        };
        phases.push(("manifest", ms(started)));
        let outcome = match header.kind {
            SyncKind::Delta => self.apply_delta(&header, &manifest, started, &mut phases),
            _ => self.apply_whole(&header, &manifest),
        };
        // The ack: 1 when this receiver refused.
        let refused = outcome.is_err() as u8;
        // SAFETY: our status word.
        unsafe {
            self.gpu.memset(self.status.ptr(), 0, 8)?;
            self.gpu.memset(self.status.ptr(), refused, 1)?;
            self.comm.all_reduce_max_u64(self.status.ptr(), 1, stream)?;
        }
        let done = self.gpu.record_done()?;
        self.comm.wait(done, self.timeout, "the ack")?;
        phases.push(("ack", ms(started)));
        let changed = outcome?;
        Ok(Some(GpuSyncReport {
            kind: header.kind,
            version: self.version,
            changed,
            numel: self.limits.total_elements,
            payload_bytes: HEADER_BYTES as u64
                + header.manifest_bytes
                + header.position_bytes
                + header.value_bytes,
            chunks: header.num_chunks,
            time_ms: ms(started),
            diff_ms: 0.0,
            entropy: manifest
                .chunks
                .iter()
                .any(|c| c.positions == ChunkPositions::Gaps || c.values == ChunkValues::Ulp),
            phases: cumulative_to_spans(phases),
        }))
    }

    fn apply_delta(
        &mut self,
        header: &Header,
        manifest: &Manifest,
        started: Instant,
        phases: &mut Vec<(&'static str, f64)>,
    ) -> Result<u64> {
        let stream = self.gpu.stream_handle();
        // The decoders look a few bytes past a section's end: the slack keeps that inside.
        let pptr = self
            .positions
            .at_least(&self.gpu, header.position_bytes + DECODE_SLACK)?;
        let vptr = self
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
        phases.push(("payload", ms(started)));
        if self.version == 0 || header.version != self.version + 1 {
            return Err(CudaError::BaseMismatch {
                held: self.version,
                slot: 0,
                expected: manifest.digests.first().map_or(0, |d| d.0),
                actual: self.digests.first().copied().unwrap_or(0),
            });
        }
        for (slot, (&(before, _), &held)) in manifest.digests.iter().zip(&self.digests).enumerate()
        {
            if before != held {
                return Err(CudaError::BaseMismatch {
                    held: self.version,
                    slot: slot as u32,
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
        let sp = self
            .decoded_positions
            .at_least(&self.gpu, pos_stage + DECODE_SLACK)?;
        let sv = self.decoded_values.at_least(&self.gpu, val_stage)?;
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
            phases.push(("decode", ms(started)));
        }
        let expected: Vec<u64> = manifest.digests.iter().map(|d| d.1).collect();
        // SAFETY: sections lie inside the received buffers (Manifest::decode checked the
        // offsets against the announced lengths, which the buffers hold); slots are ours.
        let new = unsafe {
            self.gpu
                .apply_verified(&inputs, false, &self.digests, &expected)?
        };
        self.digests = new;
        self.version = header.version;
        phases.push(("apply", ms(started)));
        Ok(manifest.chunks.iter().map(|c| c.count).sum())
    }

    fn apply_whole(&mut self, header: &Header, manifest: &Manifest) -> Result<u64> {
        // The bytes land in the tensors directly (no second copy of the model): until the
        // digests check, this receiver holds no version.
        self.version = 0;
        broadcast_tensors(&mut self.comm, &self.gpu, &self.tensors, self.root)?;
        let done = self.gpu.record_done()?;
        self.comm.wait(done, self.timeout, "the tensors")?;
        // SAFETY: our tensors (constructor contract).
        let got = unsafe { self.gpu.digest(&digest_inputs(&self.tensors))? };
        for (slot, (&(_, expected), &actual)) in manifest.digests.iter().zip(&got).enumerate() {
            if expected != actual {
                return Err(CudaError::DigestMismatch {
                    slot: slot as u32,
                    expected,
                    actual,
                });
            }
        }
        self.digests = got;
        self.version = header.version;
        Ok(self.limits.total_elements)
    }

    /// Recomputes the digests of the bits held and compares them with the ones recorded:
    /// finds weights changed behind the receiver's back (then it needs a seed).
    pub fn verify(&mut self) -> Result<()> {
        // SAFETY: our tensors (constructor contract).
        let got = unsafe { self.gpu.digest(&digest_inputs(&self.tensors))? };
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
