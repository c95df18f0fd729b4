//! The sharded trainer side of the GPU sync: [`GpuShardedSender`], one per trainer rank.
//!
//! Each trainer rank holds one contiguous run of every slot's elements (an FSDP2 dim-0 shard
//! of a contiguous parameter is one) and diffs only that run against its own snapshot, on its
//! own GPU. Nothing whole is ever assembled for a delta: per stage the ranks all-gather one
//! short row each (changes found, chunks, section bytes, digest contributions), from which
//! every rank takes the same decision; the leader (trainer rank 0) then gathers exactly the
//! chunk records and packed sections of every rank (grouped NCCL send/recv, no padding to a
//! common size), moves each rank's section offsets to where its sections landed, and sends
//! the stage on to the receivers as the single sender would: a [`super::GpuReceiver`] cannot
//! tell the two apart. The state digest is additive, so the slot digests are the sums of the
//! ranks' contributions.
//!
//! A seed, or a stage whose delta would not be smaller (or did not fit the delta buffers),
//! is sent whole: the leader gathers each slot's shards into a staging buffer of one slot and
//! broadcasts it, slot after slot.
//!
//! The ack: the receivers all-reduce their status with the leader as for a single sender.
//! The other trainer ranks do not wait for it: they return from `sync` once the leader holds
//! their part, and learn how the sync ended at the start of their next call, when the leader
//! broadcasts its outcome (refused or not, its time); so every rank keeps the same version,
//! the same seed-due flag and the same cost model (`choice`: the codecs must be chosen
//! alike on every rank before the diff; the model learns from the leader's times, and from the
//! bytes and changes every rank knows alike).

use std::ops::Range;
use std::time::Instant;

use deltacast::wire::FrameKind;
use deltacast::{SlotTable, WeightSender};

use super::chunks::{plan_chunks, write_chunks, StageChanges, StageTensor};
use super::diff_worker::run_list_diff;
use super::settings::Snapshot;
use super::sharded_setup::{
    agree_on_heads, agree_on_layout, all_gather_rows, check_shards, Buffers, GpuShard, RowBuffers,
    LEADER,
};
use super::WaitStream;
use super::{
    limits, ms, u64s, EntropyMode, GpuSenderConfig, GpuSyncReport, Growable, Phases, SendTotals,
};
use crate::choice::{CostModel, DeltaCodec, SyncCosts};
use crate::error::{CudaError, Result};
use crate::link::Link;
use crate::protocol::{
    decode_chunk_records, decode_header, decode_stage, rebase_chunk_records, Stage, TableLimits,
    CHUNK_RECORD_BYTES, HEADER_BYTES, SLOT_RECORD_BYTES,
};
use crate::{CodeScratch, DeviceBuffer, DiffInput, DiffOutput, DigestInput, Gpu};

/// Fixed words of a stage's row, before the digest contributions of its slots.
const ROW_FIXED: usize = 5;

/// One stage's row as every rank contributes it to the lockstep exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct StageRow {
    /// Whether the delta buffers held every change.
    complete: bool,
    found: u64,
    chunks: u64,
    /// Section bytes, padded to 8 so that the gathered sections keep their alignment.
    position_bytes: u64,
    value_bytes: u64,
}

impl StageRow {
    fn parse(row: &[u64]) -> StageRow {
        StageRow {
            complete: row[0] == 1,
            found: row[1],
            chunks: row[2],
            position_bytes: row[3],
            value_bytes: row[4],
        }
    }

    fn words(&self) -> [u64; ROW_FIXED] {
        [
            self.complete as u64,
            self.found,
            self.chunks,
            self.position_bytes,
            self.value_bytes,
        ]
    }
}

/// A trainer rank's side of a sharded GPU sync.
pub struct GpuShardedSender {
    trainers: Link,
    /// The leader's communicator with the receivers (the leader is its root); `None` on the
    /// other ranks.
    receivers: Option<Link>,
    config: GpuSenderConfig,
    shards: Vec<GpuShard>,
    table: SlotTable,
    /// The receivers' bounds, to check the leader's own stages against.
    limits: TableLimits,
    /// Per slot, every rank's `(first_index, numel)` in rank order (checked to tile the slot).
    layout: Vec<Vec<(u64, u64)>>,
    snapshots: Vec<Snapshot>,
    /// This rank's digest contribution per slot, on the device (the diff adds its changes).
    digests_dev: DeviceBuffer,
    /// Every slot's whole digest at the last version (the same on every rank).
    digests: Vec<u64>,
    version: u64,
    needs_seed: bool,
    capacity: u64,
    stages: Vec<Range<usize>>,
    /// Per stage, the changes its last diff found (the diff's guess of its density).
    last_found: Vec<Option<u64>>,
    positions: DeviceBuffer,
    values: DeviceBuffer,
    old_values: Option<DeviceBuffer>,
    packed: Growable,
    packed_values: Growable,
    records: Growable,
    rows: RowBuffers,
    /// Leader: the gathered records and sections, a slot's staging, header and manifest.
    gathered_records: Growable,
    gathered_positions: Growable,
    gathered_values: Growable,
    staging: Growable,
    header: DeviceBuffer,
    manifest: Growable,
    status: DeviceBuffer,
    code_scratch: CodeScratch,
    costs: CostModel,
    /// Leader: how its last sync ended, for the next call's settle: (refused by, time in
    /// microseconds, version the receivers hold).
    outcome: [u64; 3],
    /// (entropy used, changes) of the last sync, recorded once the leader's time arrives.
    pending: Option<SyncCosts>,
    /// Changes of the last delta sync every rank recorded (the cost model's guess for the
    /// next; before the first, 2 % of the elements).
    expected_changes: u64,
    // Last: fields drop in order, and every buffer, stream and event above is released
    // in this context (the primary context, released with the last `Gpu` of the device).
    gpu: Gpu,
}

/// One sharded delta sync in progress.
struct ShardRun {
    version: u64,
    use_entropy: bool,
    after: Vec<u64>,
    totals: SendTotals,
    phases: Phases,
    mark: Instant,
}

impl GpuShardedSender {
    /// A trainer rank's sender over its `shards` (borrowed, one per slot in the slot order
    /// every rank shares; they must stay valid and unmoved for the life of the sender).
    /// `trainers` joins every trainer rank; the leader (trainer rank 0) also passes its
    /// communicator with the receivers, in which it is `config.root`. Collective: every rank
    /// checks, from an all-gather, that all hold the same slot table and that the shards of
    /// each slot follow each other in rank order and cover it exactly; all fail alike if not.
    ///
    /// # Safety
    /// Every pointer must be device memory of `gpu`'s device valid for its shard's bytes.
    pub unsafe fn new(
        gpu: Gpu,
        trainers: impl Into<Link>,
        receivers: Option<Link>,
        shards: Vec<GpuShard>,
        config: GpuSenderConfig,
    ) -> Result<GpuShardedSender> {
        let mut trainers = trainers.into();
        let local = check_shards(&trainers, &receivers, &shards, &config);
        let mut rows = RowBuffers::default();
        // Every rank takes part in each exchange whatever its own checks said, so that all
        // fail alike instead of waiting for a rank that left.
        let table = agree_on_heads(
            &gpu,
            &mut trainers,
            &mut rows,
            local.map(|t| (t, config.stage_bytes)),
            config.timeout,
        )?;
        let layout = agree_on_layout(&gpu, &mut trainers, &mut rows, &shards, &table, &config)?;
        let allocated = Buffers::allocate(&gpu, &shards, &table, &config);
        let flags = all_gather_rows(
            &gpu,
            &mut trainers,
            &mut rows,
            &[allocated.is_ok() as u64],
            config.timeout,
            "the allocations",
        )?;
        let buffers = allocated?;
        let failed: Vec<usize> = (0..flags.len()).filter(|&r| flags[r][0] != 1).collect();
        if !failed.is_empty() {
            return Err(CudaError::InvalidArgument(format!(
                "trainer rank(s) {failed:?} could not allocate their buffers"
            )));
        }
        let n = shards.len();
        Ok(GpuShardedSender {
            positions: buffers.positions,
            values: buffers.values,
            old_values: buffers.old_values,
            snapshots: buffers.snapshots,
            header: buffers.header,
            status: buffers.status,
            digests_dev: buffers.digests_dev,
            capacity: buffers.capacity,
            last_found: vec![None; buffers.stages.len()],
            stages: buffers.stages,
            packed: Growable::new(),
            packed_values: Growable::new(),
            records: Growable::new(),
            rows,
            gathered_records: Growable::new(),
            gathered_positions: Growable::new(),
            gathered_values: Growable::new(),
            staging: Growable::new(),
            manifest: Growable::new(),
            digests: vec![0; n],
            code_scratch: CodeScratch::new(),
            costs: CostModel::default(),
            outcome: [0; 3],
            pending: None,
            expected_changes: table.total_elements() / 50,
            layout,
            limits: limits(&table),
            gpu,
            trainers,
            receivers,
            config,
            shards,
            table,
            version: 0,
            needs_seed: true,
        })
    }

    /// For a trainer rank that cannot make its sender (e.g. a binding found its arguments
    /// wrong): takes its part in the constructor's first exchange as a refusal, so that the
    /// other ranks' constructors fail at once instead of waiting out `timeout`; returns the
    /// error for this rank.
    pub fn decline(
        gpu: &Gpu,
        trainers: impl Into<Link>,
        timeout: std::time::Duration,
        why: String,
    ) -> CudaError {
        let mut trainers = trainers.into();
        let mut rows = RowBuffers::default();
        let declined = Err(CudaError::InvalidArgument(why));
        match agree_on_heads(gpu, &mut trainers, &mut rows, declined, timeout) {
            Err(e) => e,
            Ok(_) => CudaError::InvalidArgument("declined".into()),
        }
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// The stages a sync is cut into (slot ranges, the same on every rank).
    pub fn stages(&self) -> &[Range<usize>] {
        &self.stages
    }

    fn is_leader(&self) -> bool {
        self.trainers.rank() == LEADER
    }

    /// Sends every slot whole (collective), then keeps the new version. The leader's call
    /// decides: a rank that calls `seed` while the leader calls `sync` with no seed due
    /// takes part in that sync.
    ///
    /// # Safety
    /// `wait_stream` must be a live stream of the GPU's context, or 0.
    pub unsafe fn seed(&mut self, wait_stream: u64) -> Result<GpuSyncReport> {
        let settled = self.settle(true);
        if !self.fail_on_error(settled)? {
            // The leader called `sync` and no seed is due: this rank follows it.
            // SAFETY: per this function's contract.
            return unsafe { self.sync_settled(wait_stream) };
        }
        // SAFETY: per this function's contract.
        unsafe { self.seed_settled(wait_stream) }
    }

    /// The seed, after [`GpuShardedSender::settle`].
    ///
    /// # Safety
    /// As [`GpuShardedSender::seed`].
    unsafe fn seed_settled(&mut self, wait_stream: u64) -> Result<GpuSyncReport> {
        let started = Instant::now();
        self.needs_seed = true;
        self.last_found.iter_mut().for_each(|f| *f = None);
        let outcome = (|| {
            // SAFETY: per this function's contract.
            unsafe { self.gpu.wait_for_stream(wait_stream)? };
            let all = 0..self.shards.len();
            let mut after = self.digests.clone();
            self.refresh_and_sum(all.clone(), &mut after)?;
            let version = self.version + 1;
            let payload_bytes = self.send_whole(FrameKind::Seed, 0, 1, all, version, &after)?;
            let seed = SyncCosts {
                dense_bytes: self.table.total_bytes(),
                ..SyncCosts::default()
            };
            self.finish(version, after, started, Some(seed))?;
            Ok(payload_bytes)
        })();
        let payload_bytes = self.fail_on_error(outcome)?;
        let numel = self.table.total_elements();
        let mut report = GpuSyncReport::seed(self.version, numel, payload_bytes, started);
        report.choice = Some(self.costs.report());
        Ok(report)
    }

    /// Sends what changed since the last version (a seed first, when one is due), stage by
    /// stage (collective: every trainer rank calls it for every step).
    ///
    /// The leader returns once every receiver has applied and acked (a refusal is its
    /// `ReceiverRefused`); the other ranks return as soon as the leader holds their part,
    /// so that they can go on training while it sends, and learn the outcome at the start
    /// of their next call (after a refusal, that call seeds on every rank).
    ///
    /// # Safety
    /// As [`GpuShardedSender::seed`].
    pub unsafe fn sync(&mut self, wait_stream: u64) -> Result<GpuSyncReport> {
        let settled = self.settle(false);
        if self.fail_on_error(settled)? {
            // SAFETY: per this function's contract.
            return unsafe { self.seed_settled(wait_stream) };
        }
        // SAFETY: per this function's contract.
        unsafe { self.sync_settled(wait_stream) }
    }

    /// A delta sync, after [`GpuShardedSender::settle`].
    ///
    /// # Safety
    /// As [`GpuShardedSender::seed`].
    unsafe fn sync_settled(&mut self, wait_stream: u64) -> Result<GpuSyncReport> {
        let started = Instant::now();
        self.needs_seed = true;
        let allowed: &[DeltaCodec] = match self.config.entropy {
            EntropyMode::Off => &[DeltaCodec::Plain],
            EntropyMode::On => &[DeltaCodec::Entropy],
            EntropyMode::Auto => &[DeltaCodec::Plain, DeltaCodec::Entropy],
        };
        let codec = self
            .costs
            .codec(allowed, self.expected_changes, self.table.total_elements());
        let use_entropy = codec.entropy();
        let mut run = ShardRun {
            version: self.version + 1,
            use_entropy,
            after: self.digests.clone(),
            totals: SendTotals::default(),
            phases: Phases::new(),
            mark: started,
        };
        let outcome = (|| {
            // SAFETY: per this function's contract.
            unsafe { self.gpu.wait_for_stream(wait_stream)? };
            for s in 0..self.stages.len() {
                self.send_stage(s, &mut run)?;
            }
            let after = std::mem::take(&mut run.after);
            let any_delta = run.totals.any_delta(self.stages.len() as u32);
            // Only all-delta syncs teach the model (a mixed one's time cannot be split between
            // its kinds of stage here); their wire bytes are the leader's alone, so the
            // per-change figure takes in the link.
            let record = (run.totals.dense_stages == 0).then_some(SyncCosts {
                delta: any_delta.then_some(codec),
                delta_changes: run.totals.changed,
                ..SyncCosts::default()
            });
            self.finish(run.version, after, started, record)?;
            run.phases.lap("ack", &mut run.mark);
            Ok(())
        })();
        self.fail_on_error(outcome)?;
        let stages = self.stages.len() as u32;
        let numel = self.table.total_elements();
        let phases = run.phases.finish("shard");
        let mut report = run
            .totals
            .report(self.version, numel, codec, stages, ms(started), phases);
        report.choice = Some(self.costs.report());
        Ok(report)
    }

    /// The start of every call: the leader tells every rank how its last sync ended
    /// (refused or not, its time, the version the receivers hold) and whether this call
    /// seeds (it was asked to, or a seed is due), so that all take the same decisions from
    /// here: a seed after a refusal, the same call on every rank, and the same cost model
    /// (the leader's time of the last sync is what it learns from). Returns whether this
    /// call seeds.
    fn settle(&mut self, asked_seed: bool) -> Result<bool> {
        let stream = self.gpu.stream_handle();
        let status = self.status.ptr();
        if self.is_leader() {
            let seed = (asked_seed || self.needs_seed || self.outcome[0] != 0) as u64;
            let words: Vec<u8> = self
                .outcome
                .iter()
                .chain([&seed])
                .flat_map(|w| w.to_le_bytes())
                .collect();
            // SAFETY: our 32 status bytes (the copy synchronises the stream).
            unsafe { self.gpu.copy_to_device(status, &words)? };
        }
        // SAFETY: our 32 status bytes.
        unsafe {
            self.trainers
                .broadcast(status, status, 32, LEADER, stream, self.config.timeout)?
        };
        let done = self.gpu.record_done()?;
        self.trainers
            .wait(done, self.config.timeout, "the leader's last outcome")?;
        // SAFETY: written by the broadcast that completed.
        let words = u64s(&unsafe { self.gpu.download(status, 32)? });
        let (refused, micros, version, seed) = (words[0], words[1], words[2], words[3] != 0);
        if let Some(mut costs) = self.pending.take() {
            if refused == 0 {
                costs.time_ms = micros as f64 / 1e3;
                self.costs.record(&costs);
                if costs.delta.is_some() {
                    self.expected_changes = costs.delta_changes;
                }
            }
        }
        if refused != 0 {
            self.needs_seed = true;
            self.version = version;
        }
        self.outcome = [0, 0, self.version];
        Ok(seed)
    }

    /// Tells the receivers no sync follows (leader; a no-op on the other ranks).
    pub fn close(&mut self) -> Result<()> {
        if !self.is_leader() {
            return Ok(());
        }
        let close = Stage::close(self.version, self.table.hash());
        self.broadcast_head(&close)?;
        self.wait_receivers("the close")
    }

    /// After a failure part way the ranks are out of step: both communicators are aborted
    /// (make a new sender on new communicators); the peers fail at their next collective, at
    /// the latest when it times out. A refusal by a receiver is not such a failure: the leader reports
    /// it, the others learn it when the next call settles, and that call seeds.
    fn fail_on_error<T>(&mut self, outcome: Result<T>) -> Result<T> {
        if let Err(e) = &outcome {
            self.needs_seed = true;
            if matches!(e, CudaError::ReceiverRefused(_)) {
                // The ranks are still in step (the next call settles it).
                return outcome;
            }
            self.trainers.abort();
            if let Some(r) = &mut self.receivers {
                r.abort();
            }
        }
        outcome
    }

    /// One stage of a delta sync: diff, the lockstep row, then delta or whole.
    fn send_stage(&mut self, s: usize, run: &mut ShardRun) -> Result<()> {
        let range = self.stages[s].clone();
        let stages = self.stages.len() as u32;
        let inputs: Vec<DiffInput> = range
            .clone()
            .map(|i| {
                let sh = &self.shards[i];
                DiffInput {
                    snapshot: self.snapshots[i].ptr(),
                    current: sh.ptr,
                    numel: sh.numel,
                    width: sh.dtype.width(),
                    first_index: sh.first_index,
                    digest: Some((self.digests_dev.ptr() + 8 * i as u64, i as u32)),
                    // (Shards are in their slot's dtype: no conversion on this sender yet.)
                    f32_source: None,
                }
            })
            .collect();
        let old_values = self
            .old_values
            .as_ref()
            .filter(|_| run.use_entropy)
            .map(|b| b.ptr());
        let out = DiffOutput {
            positions: self.positions.ptr(),
            new_values: self.values.ptr(),
            old_values,
            capacity: self.capacity,
            expected: self.last_found[s],
        };
        // SAFETY: the shards (constructor contract) and our snapshots and buffers.
        let diff = unsafe { run_list_diff(&self.gpu, self.config.snapshot, &inputs, &out)? };
        self.last_found[s] = Some(diff.found);
        run.totals.diff_ms += diff.kernel_ms as f64;
        run.phases.lap("diff", &mut run.mark);
        let changes = StageChanges {
            diff: &diff,
            positions: out.positions,
            new_values: out.new_values,
            old_values,
        };
        let mut row = StageRow {
            complete: diff.is_complete(),
            found: diff.found,
            chunks: 0,
            position_bytes: 0,
            value_bytes: 0,
        };
        let mut words = vec![0u64; range.len()];
        let plan = if row.complete {
            let tensors: Vec<StageTensor> = range
                .clone()
                .map(|i| StageTensor {
                    slot: i as u32,
                    first_index: self.shards[i].first_index,
                    numel: self.shards[i].numel,
                    width: self.shards[i].dtype.width(),
                })
                .collect();
            // SAFETY: our buffers hold what the diff wrote.
            let plan = unsafe {
                plan_chunks(
                    &self.gpu,
                    &mut self.code_scratch,
                    &changes,
                    &tensors,
                    self.config.chunk_elems,
                )?
            };
            row.chunks = plan.records.len() as u64;
            row.position_bytes = plan.position_bytes.next_multiple_of(8);
            row.value_bytes = plan.value_bytes.next_multiple_of(8);
            // SAFETY: our digest words (the diff added every change's update).
            words = u64s(&unsafe {
                self.gpu.download(
                    self.digests_dev.ptr() + 8 * range.start as u64,
                    range.len() * 8,
                )?
            });
            Some(plan)
        } else {
            None
        };
        run.phases.lap("encode", &mut run.mark);
        let mut mine = row.words().to_vec();
        mine.extend_from_slice(&words);
        let all = self.exchange(&mine, "a stage's counts")?;
        run.phases.lap("exchange", &mut run.mark);
        let rows: Vec<StageRow> = all.iter().map(|r| StageRow::parse(r)).collect();
        run.totals.changed += rows.iter().map(|r| r.found).sum::<u64>();
        let stage_bytes: u64 = self.table.slots()[range.clone()]
            .iter()
            .map(|s| s.nbytes())
            .sum();
        let fixed = (HEADER_BYTES + range.len() * SLOT_RECORD_BYTES) as u64;
        let chunks: u64 = rows.iter().map(|r| r.chunks).sum();
        let positions: u64 = rows.iter().map(|r| r.position_bytes).sum();
        let values: u64 = rows.iter().map(|r| r.value_bytes).sum();
        let delta_bytes = fixed + chunks * CHUNK_RECORD_BYTES as u64 + positions + values;
        let dense_bytes = fixed + (range.len() * CHUNK_RECORD_BYTES) as u64 + stage_bytes;
        let all_complete = rows.iter().all(|r| r.complete);
        if all_complete {
            for (j, slot) in range.clone().enumerate() {
                run.after[slot] = all
                    .iter()
                    .fold(0u64, |acc, r| acc.wrapping_add(r[ROW_FIXED + j]));
            }
        }
        let plan = match plan {
            Some(plan) if all_complete && delta_bytes <= dense_bytes => plan,
            _ => {
                // Some rank's buffers overflowed, or the delta is not smaller: whole. After
                // an overflow the diff refreshed only what it wrote out, so every shard is
                // copied again; otherwise snapshots and digests are already current.
                if !all_complete {
                    self.refresh_and_sum(range.clone(), &mut run.after)?;
                }
                run.totals.payload_bytes += self.send_whole(
                    FrameKind::Dense,
                    s as u32,
                    stages,
                    range,
                    run.version,
                    &run.after,
                )?;
                run.totals.dense_stages += 1;
                run.phases.lap("send", &mut run.mark);
                return Ok(());
            }
        };
        // SAFETY: as plan_chunks, same changes.
        let (pptr, vptr) = unsafe {
            write_chunks(
                &self.gpu,
                &mut self.code_scratch,
                &changes,
                &plan,
                &mut self.packed,
                &mut self.packed_values,
                8,
            )?
        };
        run.phases.lap("encode", &mut run.mark);
        let mut records = vec![0u8; plan.records.len() * CHUNK_RECORD_BYTES];
        for (c, rec) in plan
            .records
            .iter()
            .zip(records.as_chunks_mut::<CHUNK_RECORD_BYTES>().0)
        {
            c.encode_into(rec);
        }
        let rptr = self.records.at_least(&self.gpu, records.len() as u64)?;
        // SAFETY: our buffer, sized above (synchronises the stream).
        unsafe { self.gpu.copy_to_device(rptr, &records)? };
        let record_lens: Vec<u64> = rows
            .iter()
            .map(|r| r.chunks * CHUNK_RECORD_BYTES as u64)
            .collect();
        let position_lens: Vec<u64> = rows.iter().map(|r| r.position_bytes).collect();
        let value_lens: Vec<u64> = rows.iter().map(|r| r.value_bytes).collect();
        let leader = self.is_leader();
        let (gr, gp, gv) = if leader {
            (
                self.gathered_records
                    .at_least(&self.gpu, chunks * CHUNK_RECORD_BYTES as u64)?,
                self.gathered_positions.at_least(&self.gpu, positions)?,
                self.gathered_values.at_least(&self.gpu, values)?,
            )
        } else {
            (0, 0, 0)
        };
        let stream = self.gpu.stream_handle();
        // SAFETY: every source holds this rank's bytes as its row says; on the leader each
        // destination was sized for the sums above. The buffers stay until the stream has
        // passed the gathers (the next use of any of them synchronises the stream first).
        unsafe {
            self.trainers.gather_exact(
                rptr,
                &record_lens,
                gr,
                chunks * CHUNK_RECORD_BYTES as u64,
                LEADER,
                stream,
            )?;
            self.trainers
                .gather_exact(pptr, &position_lens, gp, positions, LEADER, stream)?;
            self.trainers
                .gather_exact(vptr, &value_lens, gv, values, LEADER, stream)?;
        }
        if !leader {
            // The leader has this rank's part once the sends complete. (Waiting here, with
            // the timeout, rather than in the next stage's diff, which cannot time out.)
            let done = self.gpu.record_done()?;
            self.trainers
                .wait(done, self.config.timeout, "the gather to the leader")?;
            run.totals.payload_bytes += delta_bytes;
            run.totals.chunks += chunks;
            run.phases.lap("gather", &mut run.mark);
            return Ok(());
        }
        let done = self.gpu.record_done()?;
        self.trainers
            .wait(done, self.config.timeout, "the gather")?;
        run.phases.lap("gather", &mut run.mark);
        // SAFETY: the gathered records, complete (waited above).
        let mut gathered = unsafe {
            self.gpu
                .download(gr, (chunks * CHUNK_RECORD_BYTES as u64) as usize)?
        };
        let (mut at, mut pos_base, mut val_base) = (0usize, 0u64, 0u64);
        for r in &rows {
            let len = r.chunks as usize * CHUNK_RECORD_BYTES;
            rebase_chunk_records(&mut gathered[at..at + len], pos_base, val_base)?;
            at += len;
            pos_base += r.position_bytes;
            val_base += r.value_bytes;
        }
        let digests: Vec<(u64, u64)> = range
            .clone()
            .map(|slot| (self.digests[slot], run.after[slot]))
            .collect();
        // What the receivers will check first, checked here: a fault in the assembly is this
        // rank's error, not a protocol abort at every receiver.
        let stage = decode_chunk_records(&gathered)
            .and_then(|records| {
                Stage::delta(
                    run.version,
                    self.table.hash(),
                    s as u32,
                    stages,
                    range.start as u32,
                    &digests,
                    records,
                    positions,
                    values,
                )
            })
            .and_then(|stage| {
                let h = decode_header(&stage.encode_header(), &self.limits)?;
                decode_stage(h, &stage.encode_manifest(), &self.limits)
            })
            .map_err(|e| CudaError::Protocol(format!("the leader's own stage {s}: {e}")))?;
        self.broadcast_head(&stage)?;
        let root = self.config.root;
        let within = self.config.timeout;
        let receivers = self.receivers_mut()?;
        // SAFETY: the gathered sections, sized above; the stream orders the broadcasts after
        // the gathers that fill them.
        unsafe {
            receivers.broadcast_many(
                &[(gp, gp, positions), (gv, gv, values)],
                root,
                stream,
                within,
            )?;
        }
        // With the timeout, before the next stage's diff (which cannot time out) queues
        // behind these broadcasts.
        self.wait_receivers("a stage's broadcasts")?;
        run.totals.payload_bytes += delta_bytes;
        run.totals.chunks += chunks;
        run.phases.lap("send", &mut run.mark);
        Ok(())
    }

    fn receivers_mut(&mut self) -> Result<&mut Link> {
        self.receivers.as_mut().ok_or_else(|| {
            CudaError::InvalidArgument("only the leader talks to the receivers".into())
        })
    }

    /// Copies this rank's shards of `slots` into their snapshots, recomputes their digest
    /// contributions, and puts every slot's whole digest (the all-gathered sum) into `after`.
    fn refresh_and_sum(&mut self, slots: Range<usize>, after: &mut [u64]) -> Result<()> {
        for i in slots.clone() {
            let (sh, snap) = (&self.shards[i], &self.snapshots[i]);
            let len = sh.nbytes() as usize;
            // SAFETY: both valid for nbytes (constructor contract); the digest below
            // synchronises the stream before this returns.
            unsafe { snap.fill(&self.gpu, sh.ptr, len)? };
        }
        let inputs: Vec<DigestInput> = slots
            .clone()
            .map(|i| {
                let sh = &self.shards[i];
                DigestInput {
                    ptr: sh.ptr,
                    numel: sh.numel,
                    width: sh.dtype.width(),
                    first_index: sh.first_index,
                    slot: i as u32,
                    f32_source: None,
                }
            })
            .collect();
        // SAFETY: the shards (constructor contract). Synchronises the stream.
        let mine = unsafe { self.gpu.digest(&inputs)? };
        let bytes: Vec<u8> = mine.iter().flat_map(|d| d.to_le_bytes()).collect();
        // SAFETY: our digest words, one per slot; `slots` lies inside the table.
        unsafe {
            self.gpu
                .copy_to_device(self.digests_dev.ptr() + 8 * slots.start as u64, &bytes)?
        };
        let all = self.exchange(&mine, "the digests")?;
        for (j, slot) in slots.enumerate() {
            after[slot] = all.iter().fold(0u64, |acc, r| acc.wrapping_add(r[j]));
        }
        Ok(())
    }

    /// A seed or dense stage: the leader sends header and digests, then each slot whole,
    /// gathered from the shards into one slot's staging, entry by entry. Returns the bytes
    /// broadcast.
    fn send_whole(
        &mut self,
        kind: FrameKind,
        stage: u32,
        stages: u32,
        slots: Range<usize>,
        version: u64,
        after: &[u64],
    ) -> Result<u64> {
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
        let sizes: Vec<(u64, usize)> = self.table.slots()[slots.clone()]
            .iter()
            .map(|s| (s.numel(), s.dtype.width()))
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
        let leader = self.is_leader();
        if leader {
            self.broadcast_head(&whole)?;
        }
        let largest = self.table.slots()[slots.clone()]
            .iter()
            .map(|s| s.nbytes())
            .max()
            .unwrap_or(0);
        let staging = if leader {
            self.staging.at_least(&self.gpu, largest)?
        } else {
            0
        };
        let stream = self.gpu.stream_handle();
        let root = self.config.root;
        let within = self.config.timeout;
        for i in slots {
            let w = self.shards[i].dtype.width() as u64;
            let lens: Vec<u64> = self.layout[i].iter().map(|&(_, n)| n * w).collect();
            let src = self.shards[i].ptr;
            // SAFETY: the shard (constructor contract); on the leader the staging holds the
            // largest slot, and each entry of the slot lies inside it. The stream orders each
            // gather after the last slot's broadcasts.
            unsafe {
                self.trainers
                    .gather_exact(src, &lens, staging, largest, LEADER, stream)?;
                if leader {
                    let entries: Vec<(u64, u64)> = whole
                        .entries
                        .iter()
                        .filter(|e| e.slot as usize == i)
                        .map(|e| (e.start * w, e.val_len))
                        .collect();
                    let receivers = self.receivers_mut()?;
                    // Parts of one broadcast of the stage (what the receivers take as one):
                    // each slot's part is copied out of the staging before the next gather
                    // refills it, in stream order.
                    for (at, len) in entries {
                        receivers.broadcast_part(
                            staging + at,
                            staging + at,
                            len,
                            root,
                            stream,
                            within,
                        )?;
                    }
                }
            }
        }
        if leader {
            self.receivers_mut()?.broadcast_end(stream)?;
        }
        let done = self.gpu.record_done()?;
        self.trainers
            .wait(done, self.config.timeout, "a whole stage's gathers")?;
        Ok(whole.wire_bytes())
    }

    /// Leader: uploads and broadcasts a stage's header and manifest to the receivers (a
    /// close: only its header).
    fn broadcast_head(&mut self, stage: &Stage) -> Result<()> {
        let root = self.config.root;
        let within = self.config.timeout;
        let stream = self.gpu.stream_handle();
        let manifest = match stage.kind() {
            FrameKind::Close => Vec::new(),
            _ => stage.encode_manifest(),
        };
        let mptr = self.manifest.at_least(&self.gpu, manifest.len() as u64)?;
        let hptr = self.header.ptr();
        // SAFETY: our buffers, sized for what is copied (each copy synchronises the stream,
        // so no earlier broadcast still reads them).
        unsafe {
            self.gpu.copy_to_device(hptr, &stage.encode_header())?;
            self.gpu.copy_to_device(mptr, &manifest)?;
        }
        let receivers = self.receivers_mut()?;
        // SAFETY: as above; the buffers stay until the stream has passed the broadcasts.
        unsafe {
            receivers.broadcast(hptr, hptr, HEADER_BYTES, root, stream, within)?;
            if !manifest.is_empty() {
                receivers.broadcast(mptr, mptr, manifest.len(), root, stream, within)?;
            }
        }
        Ok(())
    }

    /// Leader: waits until everything enqueued has completed, watching the receivers'
    /// communicator.
    fn wait_receivers(&mut self, what: &'static str) -> Result<()> {
        let done = self.gpu.record_done()?;
        let timeout = self.config.timeout;
        self.receivers_mut()?.wait(done, timeout, what)
    }

    /// The end of a sync. The leader waits for the receivers' ack and keeps its outcome for
    /// the next [`GpuShardedSender::settle`]; the other ranks wait only until the leader has
    /// their part (their shards are then free to change) and take the new version as sent.
    /// `record`: what the cost model learns from this sync once the leader has told its time.
    fn finish(
        &mut self,
        version: u64,
        after: Vec<u64>,
        started: Instant,
        record: Option<SyncCosts>,
    ) -> Result<()> {
        self.pending = record;
        if self.is_leader() {
            let stream = self.gpu.stream_handle();
            let status = self.status.ptr();
            // SAFETY: our status word.
            unsafe {
                self.gpu.memset(status, 0, 8)?;
                self.receivers_mut()?
                    .all_reduce_max_u64(status, 1, stream)?;
            }
            self.wait_receivers("the receivers' ack")?;
            let micros = (started.elapsed().as_secs_f64() * 1e6) as u64;
            // SAFETY: our status word (the all-reduce completed).
            let refused = u64s(&unsafe { self.gpu.download(status, 8)? })[0];
            if refused != 0 {
                self.outcome = [refused, micros, self.version];
                self.needs_seed = true;
                return Err(CudaError::ReceiverRefused(refused));
            }
            self.outcome = [0, micros, version];
        } else {
            let done = self.gpu.record_done()?;
            self.trainers
                .wait(done, self.config.timeout, "the gather to the leader")?;
        }
        self.version = version;
        self.digests = after;
        self.needs_seed = false;
        Ok(())
    }

    /// All-gathers `row` (the same length on every rank) and returns every rank's row.
    fn exchange(&mut self, row: &[u64], what: &'static str) -> Result<Vec<Vec<u64>>> {
        all_gather_rows(
            &self.gpu,
            &mut self.trainers,
            &mut self.rows,
            row,
            self.config.timeout,
            what,
        )
    }
}

impl WeightSender for GpuShardedSender {
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
    /// Every slot's digest at the last version sent (the sums of the ranks' shards).
    fn digests(&self) -> &[u64] {
        &self.digests
    }
    fn request_seed(&mut self) {
        self.needs_seed = true;
    }
    fn sync(&mut self, stream: WaitStream) -> Result<GpuSyncReport> {
        // SAFETY: WaitStream's constructor carries the promise `sync` needs.
        unsafe { GpuShardedSender::sync(self, stream.handle()) }
    }
    fn seed(&mut self, stream: WaitStream) -> Result<GpuSyncReport> {
        // SAFETY: as in `sync`.
        unsafe { GpuShardedSender::seed(self, stream.handle()) }
    }
}
