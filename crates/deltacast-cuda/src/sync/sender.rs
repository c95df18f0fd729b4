//! The trainer's side of the GPU sync: [`GpuSender`] diffs its tensors stage by stage
//! against their snapshot, encodes each stage and broadcasts it (see the module above).

mod choice;

use std::ops::Range;
use std::sync::Arc;
use std::time::Instant;

use deltacast::plan::plan_stages;
use deltacast::wire::FrameKind;
use deltacast::{SlotTable, WeightSender};

use super::chunks::{map_chunks, plan_chunks, write_chunks, StageChanges, StageTensor};
use super::diff_worker::{DiffJob, DiffTarget, DiffWorker, Diffed};
use super::settings::{EntropyMode, GpuSenderConfig, Snapshot, SnapshotPlace};
use super::stage_set::StageSet;
use super::WaitStream;
use super::{
    check_tensors, digest_inputs, ms, slot_table, u64s, GpuSyncReport, GpuTensor, Phases,
    SendTotals,
};
use crate::choice::{CostModel, DeltaCodec, SyncCosts};
use crate::error::{CudaError, Result};
use crate::link::Link;
use crate::protocol::{Stage, HEADER_BYTES};
use crate::{
    Bf16Rule, CodeScratch, DeviceBuffer, DevicePtr, DiffInput, DiffOutput, DiffResult, DigestInput,
    Gpu, GpuEvent, GpuStream, MapCode, MapDiff, MapOutput, ONE_PASS_ABOVE,
};

/// Elements of a steps chunk. A GPU receiver applies each chunk with one block of threads,
/// so a stage's chunks must be many to fill the device (7 500 for the 0.5B model), and small
/// enough that no block walks long after the others; the manifest costs 64 bytes per chunk
/// against the 16 KiB of its map.
const STEPS_CELL_ELEMS: u64 = 1 << 16;

/// Above this share of a stage's elements changed at its last sync, a plain delta is diffed
/// straight into bitmap + raw (MapCode::Bitmap: one bit an element, nothing to encode after
/// the diff) instead of listing 8-byte positions and encoding them: where the listing diff
/// goes to its one-pass form, and a bitmap is no larger than abs32 positions (1/32).
const BITMAP_ABOVE: f64 = ONE_PASS_ABOVE;

/// One delta sync in progress (sender): what its stages share and add up.
struct SyncRun {
    version: u64,
    codec: DeltaCodec,
    /// Per stage: sent whole without a diff (predicted cheaper than its delta).
    whole: Vec<bool>,
    /// Every slot's digest after the sync, filled stage by stage.
    after: Vec<u64>,
    totals: SendTotals,
    phases: Phases,
    /// The end of the last phase timed.
    mark: Instant,
}

/// The trainer side of a GPU sync.
pub struct GpuSender {
    /// The thread that runs the diffs on `diff_gpu`.
    diff_worker: DiffWorker,
    comm: Link,
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
    /// Whether stages may be diffed into a map code: the snapshots on the device, and every
    /// stage's steps map fits a set's position buffer.
    maps_ok: bool,
    /// Whether stages may go in the steps code: `maps_ok` and every slot a float.
    steps_ok: bool,
    stages: Vec<Range<usize>>,
    sets: Vec<StageSet>,
    code_scratch: CodeScratch,
    /// What each way of sending a stage costs on this link (see `choice`).
    costs: CostModel,
    /// Per stage: its changed elements at the last sync (None: unknown, e.g. after a seed).
    last_changed: Vec<Option<u64>>,
    /// Where the broadcasts run, so that they overlap the next stage's kernels.
    nccl_stream: GpuStream,
    /// Recorded on the GPU's stream when a stage is ready to send.
    ready: GpuEvent,
    /// Recorded on the NCCL stream after the ack.
    acked: GpuEvent,
    /// How fp32 sources round into bf16 slots.
    bf16_rule: Bf16Rule,
    status: DeviceBuffer,
    // Last: fields drop in order, and every buffer, stream and event above is released
    // in this context (the primary context, released with the last `Gpu` of the device).
    /// Encodes and sends (its stream has the device's greatest priority).
    gpu: Gpu,
    /// The caller's handle of the same device, with a stream and scratch of its own, for
    /// the diffs: the next stage's diff runs there while this one is encoded on `gpu`.
    diff_gpu: Arc<Gpu>,
}

impl GpuSender {
    /// A sender over `tensors` (borrowed: they must stay valid, and unmoved, for the life of
    /// the sender). `snapshots`, when given, are the caller's device memory for the snapshot
    /// (one per tensor, same size); else they are allocated here, where `config.snapshot`
    /// says (lending snapshots with [`SnapshotPlace::PinnedHost`] is an `InvalidArgument`).
    ///
    /// Tensors may hold fp32 for bf16 slots ([`GpuTensor::source`]): the kernels round them
    /// by [`GpuSender::bf16_rule`] as they read them, and whole sends of those slots go from
    /// the snapshot (device memory then: not with [`SnapshotPlace::PinnedHost`]).
    ///
    /// # Safety
    /// Every pointer must be device memory of `gpu`'s device valid for its tensor's bytes (in
    /// its source dtype).
    pub unsafe fn new(
        gpu: Gpu,
        comm: impl Into<Link>,
        tensors: Vec<GpuTensor>,
        snapshots: Option<Vec<DevicePtr>>,
        config: GpuSenderConfig,
    ) -> Result<GpuSender> {
        config.check()?;
        let comm = comm.into();
        if config.root != comm.rank() {
            return Err(CudaError::InvalidArgument(format!(
                "the sender is rank {}, the root is {}",
                comm.rank(),
                config.root
            )));
        }
        check_tensors(&tensors, true)?;
        let table = slot_table(&tensors)?;
        if config.snapshot == SnapshotPlace::PinnedHost {
            // A converted slot's whole sends come from its snapshot, which must be device
            // memory for the links to read it.
            if let Some(t) = tensors.iter().find(|t| t.source != t.dtype) {
                return Err(CudaError::InvalidArgument(format!(
                    "tensor `{}` is {} for a {} slot: converting sources need the snapshot on \
                     the device (SnapshotPlace::Device)",
                    t.name, t.source, t.dtype
                )));
            }
        }
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
                .map(|t| Snapshot::allocate(&gpu, config.snapshot, t.nbytes()))
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
        let maps_ok = config.snapshot == SnapshotPlace::Device
            && sets
                .first()
                .is_some_and(|set| set.holds_maps(&tensors, &stages));
        let steps_ok = maps_ok && tensors.iter().all(|t| t.dtype.ulp_codable());
        Ok(GpuSender {
            maps_ok,
            steps_ok,
            diff_worker: DiffWorker::start(Arc::clone(&diff_gpu))?,
            diff_gpu,
            sets,
            code_scratch: CodeScratch::new(),
            costs: CostModel::default(),
            last_changed: vec![None; stages.len()],
            nccl_stream: gpu.new_stream(true)?,
            ready: gpu.new_event()?,
            acked: gpu.new_event()?,
            bf16_rule: Bf16Rule::default(),
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

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The stages a sync is cut into (slot ranges).
    pub fn stages(&self) -> &[Range<usize>] {
        &self.stages
    }

    /// How fp32 sources round into bf16 slots: [`Bf16Rule::TORCH_CPU`] (NaN → `0xFFFF`, the
    /// CPU `deltacast::Sender`'s default) unless set.
    pub fn bf16_rule(&self) -> Bf16Rule {
        self.bf16_rule
    }

    /// Sets how fp32 sources round into bf16 slots from the next sync on (as
    /// `deltacast::Sender::set_bf16_rule`; a NaN already sent under the old rule then shows
    /// as a change).
    pub fn set_bf16_rule(&mut self, rule: Bf16Rule) {
        self.bf16_rule = rule;
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
        let (mut after, _) = self.refresh(all.clone())?;
        let version = self.version + 1;
        let payload_bytes = self.send_whole(FrameKind::Seed, 0, 1, all, version, &mut after)?;
        self.finish(version, after)?;
        let numel = self.table.total_elements();
        let mut report = GpuSyncReport::seed(self.version, numel, payload_bytes, started);
        self.costs.record(&SyncCosts {
            time_ms: report.time_ms,
            dense_bytes: payload_bytes,
            ..SyncCosts::default()
        });
        self.last_changed.iter_mut().for_each(|c| *c = None);
        report.choice = Some(self.costs.report());
        Ok(report)
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
        let (whole, codec) = self.plan_sync()?;
        let mut run = SyncRun {
            version: self.version + 1,
            codec,
            whole,
            after: self.digests.clone(),
            totals: SendTotals::default(),
            phases: Phases::new(),
            mark: started,
        };
        // SAFETY: per this function's contract.
        unsafe { self.diff_gpu.wait_for_stream(wait_stream)? };
        for set in 0..self.sets.len() {
            self.wait_set(set)?;
        }
        if let Err(e) = self.send_stages(&mut run) {
            // No diff may still run once the sync has failed: the next call reseeds, and
            // its copies into the snapshots must not race one.
            self.diff_worker.drain();
            return Err(e);
        }
        let SyncRun {
            version,
            after,
            totals,
            mut phases,
            mut mark,
            ..
        } = run;
        self.finish(version, after)?;
        phases.lap("ack", &mut mark);
        let time_ms = ms(started);
        let stages = self.stages.len() as u32;
        let any_delta = totals.any_delta(stages);
        self.costs.record(&SyncCosts {
            time_ms,
            diff_ms: totals.diff_ms,
            diffed_bytes: totals.diffed_bytes,
            dense_bytes: totals.dense_bytes,
            delta: any_delta.then_some(codec),
            delta_changes: totals.delta_changes,
            delta_bytes: Some(totals.delta_bytes),
            delta_map_bytes: totals.delta_map_bytes,
        });
        let numel = self.table.total_elements();
        let mut report = totals.report(
            self.version,
            numel,
            codec,
            stages,
            time_ms,
            phases.finish("sender"),
        );
        report.choice = Some(self.costs.report());
        Ok(report)
    }

    /// Every stage of a delta sync: the diffs run back to back on the diff thread while this
    /// thread encodes and sends each stage as its diff arrives. The first diffs go to the free
    /// sets; the diff for stage `s + sets` is handed over once stage `s`'s broadcasts are
    /// enqueued, and its stream waits on the device for them before writing that set.
    /// Stages predicted cheaper whole are not diffed: they are sent whole, their snapshot and
    /// digests refreshed (and their changes counted) in one pass.
    fn send_stages(&mut self, run: &mut SyncRun) -> Result<()> {
        let stages = self.stages.len();
        let nsets = self.sets.len();
        for s in 0..stages.min(nsets) {
            if !run.whole[s] {
                self.submit_diff(s, run.codec, None)?;
            }
        }
        for s in 0..stages {
            if run.whole[s] {
                self.send_whole_stage(s, run)?;
            } else {
                let (diff, begun, ended) = self.diff_worker.next()?;
                run.phases.mark("diff-begun", begun);
                run.phases.mark("diff-ended", ended);
                run.phases.lap("diff", &mut run.mark);
                match diff? {
                    Diffed::List(diff) => self.send_stage(s, &diff, run)?,
                    Diffed::Map(diff) => self.send_map_stage(s, &diff, run)?,
                }
            }
            let next = s + nsets;
            if next < stages && !run.whole[next] {
                let sent = Arc::clone(&self.sets[s % nsets].sent);
                self.submit_diff(next, run.codec, Some(sent))?;
            }
        }
        Ok(())
    }

    /// Stage `s` whole without a diff: refresh, count, send.
    fn send_whole_stage(&mut self, s: usize, run: &mut SyncRun) -> Result<()> {
        let range = self.stages[s].clone();
        let (digests, changed) = self.refresh(range.clone())?;
        run.after[range].copy_from_slice(&digests);
        let changed = changed.unwrap_or(0);
        self.last_changed[s] = Some(changed);
        run.totals.changed += changed;
        self.send_stage_whole(s, run, "whole")
    }

    /// Hands stage `s`'s diff to the diff thread, to run after `after` (its set's last
    /// broadcasts) when given.
    fn submit_diff(
        &mut self,
        s: usize,
        codec: DeltaCodec,
        after: Option<Arc<GpuEvent>>,
    ) -> Result<()> {
        let (inputs, list) = self.diff_args(s, codec.entropy());
        let bufs = &self.sets[s % self.sets.len()];
        let map = |code, cell_elems| {
            DiffTarget::Map(MapOutput {
                code,
                map: bufs.positions.ptr(),
                escapes: bufs.values.ptr(),
                capacity: self.capacity,
                cell_elems,
            })
        };
        let out = match codec {
            DeltaCodec::Steps => map(MapCode::Steps, STEPS_CELL_ELEMS),
            DeltaCodec::Plain if self.dense_plain(s) => {
                map(MapCode::Bitmap, self.config.chunk_elems)
            }
            _ => DiffTarget::List(list),
        };
        self.diff_worker.submit(DiffJob {
            inputs,
            out,
            place: self.config.snapshot,
            after,
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
                    f32_source: t.f32_source(self.bf16_rule),
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
            expected: self.last_changed[s],
        };
        (inputs, out)
    }

    /// Whether stage `s`'s plain delta is diffed into a bitmap (see [`BITMAP_ABOVE`]): when
    /// its last sync changed more than that share of its elements.
    fn dense_plain(&self, s: usize) -> bool {
        let elements = self.stage_elements(s) as f64;
        self.maps_ok && self.last_changed[s].is_some_and(|n| n as f64 > BITMAP_ABOVE * elements)
    }

    /// Encodes stage `s` from its diff and starts its broadcasts (delta, or whole when that
    /// is predicted faster or the delta did not fit); `after` gets the stage's new digests.
    fn send_stage(&mut self, s: usize, diff: &DiffResult, run: &mut SyncRun) -> Result<()> {
        let set = s % self.sets.len();
        self.begin_diffed_stage(s, diff.kernel_ms, diff.found, run)?;
        if !diff.is_complete() {
            // More changed than the buffers hold: whole. The diff refreshed only the snapshot
            // of the tiles it wrote out; the rest is brought up to date.
            return self.send_stage_whole_refreshed(s, run);
        }
        self.take_stage_digests(s, run)?;
        let bufs = &self.sets[set];
        let entropy = bufs
            .old_values
            .as_ref()
            .filter(|_| run.codec.entropy())
            .map(|b| b.ptr());
        let changes = StageChanges {
            diff,
            positions: bufs.positions.ptr(),
            new_values: bufs.values.ptr(),
            old_values: entropy,
        };
        let tensors = self.stage_tensors(s);
        // SAFETY: the set's buffers hold what the diff wrote.
        let plan = unsafe {
            plan_chunks(
                &self.gpu,
                &mut self.code_scratch,
                &changes,
                &tensors,
                self.config.chunk_elems,
            )?
        };
        run.phases.mark_now("counted");
        let (pos_bytes, value_bytes) = (plan.position_bytes, plan.value_bytes);
        let wire = self.delta_wire(s, plan.records.len(), pos_bytes + value_bytes);
        if self.whole_after_diff(s, diff.found, wire, run.codec) {
            // Whole is predicted faster: the snapshot and digests are already current.
            return self.send_stage_whole(s, run, "encode");
        }
        let bufs = &mut self.sets[set];
        // SAFETY: as plan_chunks, same changes.
        let (packed, values_ptr) = unsafe {
            write_chunks(
                &self.gpu,
                &mut self.code_scratch,
                &changes,
                &plan,
                &mut bufs.packed,
                &mut bufs.packed_values,
                4,
            )?
        };
        run.phases.mark_now("placed");
        let regions = [(packed, pos_bytes), (values_ptr, value_bytes)];
        self.send_delta_stage(s, plan.records, regions, diff.found, 0, run)
    }

    /// Sends stage `s` from its map diff: its maps and escapes as the diff wrote them, or
    /// whole when that is predicted faster or the escapes did not fit; `after` gets the
    /// stage's new digests.
    fn send_map_stage(&mut self, s: usize, diff: &MapDiff, run: &mut SyncRun) -> Result<()> {
        let set = s % self.sets.len();
        self.begin_diffed_stage(s, diff.kernel_ms, diff.found, run)?;
        if !diff.is_complete(self.capacity) {
            // More escapes than the buffer holds: whole. The snapshot is current; the digest
            // words are not.
            return self.send_stage_whole_refreshed(s, run);
        }
        self.take_stage_digests(s, run)?;
        let (records, pos_bytes, value_bytes) = map_chunks(diff, &self.stage_tensors(s));
        let wire = self.delta_wire(s, records.len(), pos_bytes + value_bytes);
        let codec = match diff.code {
            MapCode::Steps => DeltaCodec::Steps,
            MapCode::Bitmap => DeltaCodec::Plain,
        };
        if self.whole_after_diff(s, diff.found, wire, codec) {
            return self.send_stage_whole(s, run, "encode");
        }
        let bufs = &self.sets[set];
        let regions = [
            (bufs.positions.ptr(), pos_bytes),
            (bufs.values.ptr(), value_bytes),
        ];
        // The cost model counts the steps maps per element; a plain delta's bytes, bitmaps
        // or not, per change.
        let map_bytes = match diff.code {
            MapCode::Steps => pos_bytes,
            MapCode::Bitmap => 0,
        };
        if diff.code == MapCode::Bitmap {
            run.totals.bitmap_stages += 1;
        }
        self.send_delta_stage(s, records, regions, diff.found, map_bytes, run)
    }

    /// What every diffed stage starts with: its set free (the encoder writes it, the
    /// broadcasts read it), its diff's time, bytes and changes counted.
    fn begin_diffed_stage(
        &mut self,
        s: usize,
        kernel_ms: f32,
        found: u64,
        run: &mut SyncRun,
    ) -> Result<()> {
        self.wait_set(s % self.sets.len())?;
        run.phases.mark_now("set-free");
        run.totals.diff_ms += kernel_ms as f64;
        run.totals.diffed_bytes += self.stage_bytes(s);
        run.totals.changed += found;
        self.last_changed[s] = Some(found);
        Ok(())
    }

    /// Stage `s` whole, its snapshot and digests current; `phase` names the time it took.
    fn send_stage_whole(&mut self, s: usize, run: &mut SyncRun, phase: &'static str) -> Result<()> {
        let stages = self.stages.len() as u32;
        let bytes = self.send_whole(
            FrameKind::Dense,
            s as u32,
            stages,
            self.stages[s].clone(),
            run.version,
            &mut run.after,
        )?;
        run.totals.add_dense(bytes);
        run.phases.lap(phase, &mut run.mark);
        Ok(())
    }

    /// Stage `s` whole after a diff that could not finish its snapshot and digests (its
    /// output overflowed): they are brought up to date first.
    fn send_stage_whole_refreshed(&mut self, s: usize, run: &mut SyncRun) -> Result<()> {
        let range = self.stages[s].clone();
        let (got, _) = self.refresh(range.clone())?;
        run.after[range].copy_from_slice(&got);
        self.send_stage_whole(s, run, "encode")
    }

    /// The stage's new digests, from the words the diff added its changes to.
    fn take_stage_digests(&mut self, s: usize, run: &mut SyncRun) -> Result<()> {
        let range = self.stages[s].clone();
        // SAFETY: our digest words (the diff added every change's digest update).
        let words = u64s(&unsafe {
            self.gpu.download(
                self.digests_dev.ptr() + 8 * range.start as u64,
                range.len() * 8,
            )?
        });
        run.after[range].copy_from_slice(&words);
        run.phases.mark_now("digest-words");
        Ok(())
    }

    fn stage_bytes(&self, s: usize) -> u64 {
        self.tensors[self.stages[s].clone()]
            .iter()
            .map(|t| t.nbytes())
            .sum()
    }

    fn stage_elements(&self, s: usize) -> u64 {
        self.tensors[self.stages[s].clone()]
            .iter()
            .map(|t| t.numel())
            .sum()
    }

    fn stage_tensors(&self, s: usize) -> Vec<StageTensor> {
        self.stages[s]
            .clone()
            .map(|i| StageTensor {
                slot: i as u32,
                first_index: 0,
                numel: self.tensors[i].numel(),
                width: self.tensors[i].dtype.width(),
            })
            .collect()
    }

    /// Starts the broadcasts of stage `s` as a delta of `records` over its position and value
    /// `regions` (device pointer, bytes), and counts it (`map_bytes`: of its bytes, those
    /// every element costs).
    fn send_delta_stage(
        &mut self,
        s: usize,
        records: Vec<deltacast::wire::ChunkEntry>,
        regions: [(DevicePtr, u64); 2],
        found: u64,
        map_bytes: u64,
        run: &mut SyncRun,
    ) -> Result<()> {
        let range = self.stages[s].clone();
        let num_chunks = records.len();
        let wire = self.delta_wire(s, num_chunks, regions[0].1 + regions[1].1);
        let digests: Vec<(u64, u64)> = self.digests[range.clone()]
            .iter()
            .copied()
            .zip(run.after[range.clone()].iter().copied())
            .collect();
        let stage = Stage::delta(
            run.version,
            self.table.hash(),
            s as u32,
            self.stages.len() as u32,
            range.start as u32,
            &digests,
            records,
            regions[0].1,
            regions[1].1,
        )?;
        run.phases.lap("encode", &mut run.mark);
        self.broadcast_stage(s % self.sets.len(), &stage, &regions)?;
        run.phases.lap("send", &mut run.mark);
        run.totals.payload_bytes += wire;
        run.totals.delta_bytes += wire;
        run.totals.delta_map_bytes += map_bytes;
        run.totals.delta_changes += found;
        run.totals.chunks += num_chunks as u64;
        Ok(())
    }

    /// Tells the receivers no sync follows (their `receive` returns `None`).
    pub fn close(&mut self) -> Result<()> {
        let close = Stage::close(self.version, self.table.hash());
        // No manifest follows a close (receivers stop at the header).
        self.wait_set(0)?;
        self.broadcast_stage(0, &close, &[])?;
        self.wait_set(0)?;
        // The receivers let go of the link on the close; the IPC link's root waits for that.
        self.comm.leave();
        Ok(())
    }

    /// Brings the snapshots of slots `slots` up to date and recomputes their digests
    /// (returned, and written to the device's digest words), with the count of elements
    /// that differed where the snapshots are device memory (one pass; a pinned snapshot is
    /// copied whole, then digested, and not counted).
    fn refresh(&mut self, slots: Range<usize>) -> Result<(Vec<u64>, Option<u64>)> {
        let inputs = digest_inputs(&self.tensors, slots.clone(), self.bf16_rule);
        let (got, changed) = if self.any_pinned(slots.clone()) {
            (self.copy_and_digest(slots.clone(), &inputs)?, None)
        } else {
            let snaps: Vec<DevicePtr> = self.snapshots[slots.clone()]
                .iter()
                .map(|s| s.ptr())
                .collect();
            // SAFETY: tensors and snapshots valid for their bytes (constructor contract),
            // distinct; the call synchronises the stream before it returns.
            let (got, counts) = unsafe { self.gpu.digest_refresh(&inputs, &snaps)? };
            (got, Some(counts.iter().sum()))
        };
        let bytes: Vec<u8> = got.iter().flat_map(|d| d.to_le_bytes()).collect();
        // SAFETY: our digest words, one per slot; `slots` lies inside the table.
        unsafe {
            self.gpu
                .copy_to_device(self.digests_dev.ptr() + 8 * slots.start as u64, &bytes)?
        };
        Ok((got, changed))
    }

    /// Copies the tensors of `slots` over their snapshots, then digests them (tensors in their
    /// slot's dtype: the constructor refuses converting sources with pinned snapshots).
    fn copy_and_digest(&mut self, slots: Range<usize>, inputs: &[DigestInput]) -> Result<Vec<u64>> {
        for i in slots.clone() {
            let (t, s) = (&self.tensors[i], &self.snapshots[i]);
            if t.converts() {
                return Err(CudaError::InvalidArgument(format!(
                    "tensor `{}` converts: its snapshot cannot be a plain copy",
                    t.name
                )));
            }
            let len = t.nbytes() as usize;
            // SAFETY: both valid for nbytes (constructor contract); a pinned snapshot is
            // only touched by the host through `&mut self`, and `digest` below synchronises
            // the stream before this returns.
            unsafe { s.fill(&self.gpu, t.ptr, len)? };
        }
        // SAFETY: the tensors (constructor contract). Synchronises the stream.
        unsafe { self.gpu.digest(inputs) }
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
    /// far on the GPU's stream. Returns without waiting; `wait_set` waits. A close has no
    /// manifest: only its header is sent.
    fn broadcast_stage(
        &mut self,
        set: usize,
        stage: &Stage,
        payload: &[(DevicePtr, u64)],
    ) -> Result<()> {
        let root = self.config.root;
        let within = self.config.timeout;
        let side = self.nccl_stream.handle();
        let manifest = match stage.kind() {
            FrameKind::Close => Vec::new(),
            _ => stage.encode_manifest(),
        };
        let bufs = &mut self.sets[set];
        let mptr = bufs.manifest.at_least(&self.gpu, manifest.len() as u64)?;
        // SAFETY: our buffers, sized for what is copied, not in flight (the caller waited);
        // the NCCL stream waits for the GPU's stream, so each broadcast reads finished data
        // (the diff's and encoder's output, and the tensors after the caller's stream).
        unsafe {
            self.gpu
                .copy_to_device(bufs.header.ptr(), &stage.encode_header())?;
            self.gpu.copy_to_device(mptr, &manifest)?;
            self.gpu
                .record_event(&self.ready, self.gpu.stream_handle())?;
            self.gpu.stream_wait_event(side, &self.ready)?;
            self.comm.broadcast(
                bufs.header.ptr(),
                bufs.header.ptr(),
                HEADER_BYTES,
                root,
                side,
                within,
            )?;
            if !manifest.is_empty() {
                self.comm
                    .broadcast(mptr, mptr, manifest.len(), root, side, within)?;
            }
            let segments: Vec<(DevicePtr, DevicePtr, u64)> =
                payload.iter().map(|&(ptr, len)| (ptr, ptr, len)).collect();
            self.comm.broadcast_many(&segments, root, side, within)?;
            self.gpu.record_event(&bufs.sent, side)?;
        }
        bufs.in_flight = true;
        Ok(())
    }

    /// Seed or dense stage: header, digests, then each entry's section straight from its
    /// tensor, or from its snapshot where the tensor converts (every caller has brought the
    /// snapshot up to date first: refreshed or diffed). Returns the bytes broadcast.
    fn send_whole(
        &mut self,
        kind: FrameKind,
        stage: u32,
        stages: u32,
        slots: Range<usize>,
        version: u64,
        after: &mut [u64],
    ) -> Result<u64> {
        let set = stage as usize % self.sets.len();
        self.wait_set(set)?;
        // A seed does not depend on what the receiver held: its "before" is 0; a dense
        // stage starts from the previous version, like a delta.
        let digests: Vec<(u64, u64)> = slots
            .clone()
            .map(|i| {
                let before = if kind == FrameKind::Seed {
                    0
                } else {
                    self.digests[i]
                };
                (before, after[i])
            })
            .collect();
        let sizes: Vec<(u64, usize)> = self.tensors[slots.clone()]
            .iter()
            .map(|t| (t.numel(), t.dtype.width()))
            .collect();
        let whole = Stage::whole(
            kind,
            version,
            self.table.hash(),
            (stage, stages),
            slots.start as u32,
            &sizes,
            &digests,
        );
        let payload: Vec<(DevicePtr, u64)> = whole
            .entries
            .iter()
            .map(|e| {
                let i = e.slot as usize;
                let t = &self.tensors[i];
                let base = if t.converts() {
                    self.snapshots[i].ptr()
                } else {
                    t.ptr
                };
                (base + e.start * t.dtype.width() as u64, e.val_len)
            })
            .collect();
        self.broadcast_stage(set, &whole, &payload)?;
        Ok(whole.wire_bytes())
    }

    /// The ack: an all-reduce (max) of every rank's status after the last stage; the sender
    /// contributes 0.
    fn finish(&mut self, version: u64, after: Vec<u64>) -> Result<()> {
        let side = self.nccl_stream.handle();
        // SAFETY: our status word; the NCCL stream waits for its zeroing.
        unsafe {
            self.gpu.memset(self.status.ptr(), 0, 8)?;
            self.gpu
                .record_event(&self.ready, self.gpu.stream_handle())?;
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

impl WeightSender for GpuSender {
    type Input<'a> = WaitStream;
    type Report = GpuSyncReport;
    type Error = CudaError;

    fn slot_table(&self) -> &SlotTable {
        &self.table
    }
    /// The version the last sync produced.
    fn version(&self) -> u64 {
        self.version
    }
    /// Per-slot digests of the last version sent.
    fn digests(&self) -> &[u64] {
        &self.digests
    }
    fn request_seed(&mut self) {
        self.needs_seed = true;
    }
    fn sync(&mut self, stream: WaitStream) -> Result<GpuSyncReport> {
        // SAFETY: WaitStream's constructor carries the promise `sync` needs.
        unsafe { GpuSender::sync(self, stream.handle()) }
    }
    fn seed(&mut self, stream: WaitStream) -> Result<GpuSyncReport> {
        // SAFETY: as in `sync`.
        unsafe { GpuSender::seed(self, stream.handle()) }
    }
}
