//! Each rollout process's side of the GPU sync: [`GpuReceiver`] checks and applies a sync
//! stage by stage, all or nothing (see the module above). What may start at the version held,
//! the base and new digests and what a failure leaves held are the core's decisions
//! ([`deltacast::held`], as for the CPU receiver); this file does the receiving, the journals
//! and the kernels.

use std::ops::Range;
use std::time::{Duration, Instant};

use deltacast::codec::{PosCodec, ValCodec};
use deltacast::wire::{ChunkEntry, FrameHeader, FrameKind};
use deltacast::{Bf16Rule, HeldState, Pending, SlotTable};

use super::{
    check_tensors, digest_inputs, limits, ms, slot_table, GpuSyncReport, GpuTensor, Growable,
    Phases,
};
use crate::error::{CudaError, Result};
use crate::link::Link;
use crate::protocol::{
    decode_header, decode_stage, Stage, TableLimits, CHUNK_RECORD_BYTES, HEADER_BYTES,
    SLOT_RECORD_BYTES,
};
mod commit;

use crate::{
    journal_layout, ApplyInput, ApplyPositions, ApplyValues, CodeScratch, DecodeInput,
    DecodePositions, DeviceBuffer, DevicePtr, Gpu, DECODE_SLACK,
};
use commit::{Later, Verified};

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

/// Where a sync's checked stages go: into the tensors as each is checked (`receive`), or
/// kept for [`GpuReceiver::commit`] (commit on demand).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Landing {
    Now,
    Later,
}

/// What a receiver gathers over the stages of one sync.
struct Incoming {
    landing: Landing,
    /// The checked stages not yet written (`Landing::Later`).
    later: Vec<Later>,
    /// The first refusal; later stages are received and dropped.
    failure: Option<CudaError>,
    /// The sync admitted at its first stage (its digests settled stage by stage, and whether
    /// a stage landed without a copy of what it replaced); `None` before or when refused.
    pending: Option<Pending>,
    applied: Vec<Applied>,
    changed: u64,
    payload_bytes: u64,
    chunks: u64,
    entropy: bool,
    steps: bool,
    dense_stages: u32,
    any_delta: bool,
}

/// The receiving side of a GPU sync: applies into tensors it is given, all or nothing.
pub struct GpuReceiver {
    comm: Link,
    root: usize,
    timeout: Duration,
    tensors: Vec<GpuTensor>,
    limits: TableLimits,
    /// The slot table of `tensors` (names for the refusals).
    table: SlotTable,
    /// The version held and its digests (none before the first seed, or after a sync that
    /// failed with a stage it could not undo).
    held: HeldState,
    header: DeviceBuffer,
    manifest: Growable,
    /// Whether a verified sync waits for [`commit`](Self::commit) instead of landing.
    commit_on_demand: bool,
    /// The verified sync that waits.
    verified: Option<Verified>,
    /// Per stage index.
    stages: Vec<StageBuffers>,
    /// Where the stages after a refusal are received (and dropped).
    discard: Growable,
    code_scratch: CodeScratch,
    status: DeviceBuffer,
    // Last: fields drop in order, and every buffer, stream and event above is released
    // in this context (the primary context, released with the last `Gpu` of the device).
    gpu: Gpu,
}

impl GpuReceiver {
    /// A receiver into `tensors` (borrowed; written in place by each applied sync).
    ///
    /// # Safety
    /// Every pointer must be device memory of `gpu`'s device valid for its tensor's bytes.
    pub unsafe fn new(
        gpu: Gpu,
        comm: impl Into<Link>,
        tensors: Vec<GpuTensor>,
        root: usize,
        timeout: Duration,
    ) -> Result<GpuReceiver> {
        let comm = comm.into();
        if root == comm.rank() || root >= comm.nranks() {
            return Err(CudaError::InvalidArgument(format!(
                "receiver rank {} with root {root} of {}",
                comm.rank(),
                comm.nranks()
            )));
        }
        // A receiver writes its tensors' bits: they are in the slot's dtype.
        check_tensors(&tensors, false)?;
        let table = slot_table(&tensors)?;
        // A seed's manifest (an entry and a digest record per slot) passes through the
        // manifest buffer and the pinned staging of downloads: both made to its size here,
        // not in the first sync (a page-locked allocation, and the free of a smaller one,
        // cost milliseconds there).
        let seed_manifest = table.len() * (CHUNK_RECORD_BYTES + SLOT_RECORD_BYTES);
        let mut manifest = Growable::new();
        manifest.at_least(&gpu, seed_manifest as u64)?;
        gpu.reserve_downloads(seed_manifest)?;
        Ok(GpuReceiver {
            header: gpu.alloc(HEADER_BYTES)?,
            status: gpu.alloc(8)?,
            commit_on_demand: false,
            verified: None,
            manifest,
            stages: Vec::new(),
            discard: Growable::new(),
            code_scratch: CodeScratch::new(),
            limits: limits(&table),
            held: HeldState::none(&table),
            table,
            gpu,
            comm,
            root,
            timeout,
            tensors,
        })
    }

    /// The version held (`None`: no seed yet, or a sync failed with a stage it could not
    /// undo, or [`verify`](Self::verify) found the weights changed).
    pub fn version(&self) -> Option<u64> {
        self.held.version()
    }

    pub fn digests(&self) -> &[u64] {
        self.held.digests()
    }

    pub fn gpu(&self) -> &Gpu {
        &self.gpu
    }

    /// Device bytes this receiver holds besides the tensors it was given (its receive
    /// buffers per stage, sized by the largest delta seen, with the journals of staged
    /// syncs; seeds and dense stages land in the tensors, or, committing on demand, in
    /// staging of their size).
    pub fn staging_bytes(&self) -> u64 {
        (HEADER_BYTES + 8) as u64
            + self.manifest.len()
            + self.stages.iter().map(StageBuffers::bytes).sum::<u64>()
            + self.discard.len()
            + self.code_scratch.len()
    }

    /// Receives and applies the next sync, stage by stage; `None` when the sender closed.
    /// With [`set_commit_on_demand`](Self::set_commit_on_demand) on, it receives, checks and
    /// acks the sync whole but writes nothing: the sync waits for [`commit`](Self::commit).
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
        if self.verified.is_some() {
            return Err(CudaError::InvalidArgument(
                "a verified sync waits for commit or abort_sync".into(),
            ));
        }
        let started = Instant::now();
        let mut mark = started;
        let mut phases = Phases::new();
        // SAFETY: per this function's contract.
        unsafe { self.gpu.wait_for_stream(wait_stream)? };
        let landing = if self.commit_on_demand {
            Landing::Later
        } else {
            Landing::Now
        };
        let mut got = Incoming {
            landing,
            later: Vec::new(),
            failure: None,
            pending: None,
            applied: Vec::new(),
            changed: 0,
            payload_bytes: 0,
            chunks: 0,
            entropy: false,
            steps: false,
            dense_stages: 0,
            any_delta: false,
        };
        let last = match self.receive_stages(idle_timeout, &mut got, &mut phases, &mut mark) {
            Ok(Some(last)) => last,
            Ok(None) => return Ok(None),
            Err(e) => {
                // The link failed (or lied) part way: put back what this sync applied.
                self.undo(&mut got);
                if let Some(pending) = got.pending.take() {
                    self.held.fail(pending);
                }
                return Err(e);
            }
        };
        // Every stage applied and verified: this receiver holds the new version, whatever
        // becomes of the ack (a sender that misses it reseeds).
        let pending = got.pending.take();
        let refused = match (got.failure.take(), pending) {
            (Some(e), pending) => {
                if let Some(pending) = pending {
                    self.held.fail(pending);
                }
                Some(e)
            }
            (None, Some(pending)) if landing == Landing::Later => self
                .await_commit(pending, std::mem::take(&mut got.later))
                .err(),
            (None, Some(pending)) => self.held.commit(&self.table, pending).err().map(Into::into),
            (None, None) => Some(CudaError::Protocol("a sync that was never admitted".into())),
        };
        // The ack: 1 when this receiver refused. A verified sync waiting for its commit
        // whose ack fails is dropped: the caller sees the error, and nothing is written.
        if let Err(e) = self.ack(refused.is_some()) {
            self.abort_sync();
            return Err(e);
        }
        phases.lap("ack", &mut mark);
        if let Some(e) = refused {
            return Err(e);
        }
        let report = GpuSyncReport {
            kind: if got.any_delta {
                FrameKind::Delta
            } else {
                last.kind()
            },
            version: last.header.version,
            changed: got.changed,
            numel: self.limits.total_elements,
            payload_bytes: got.payload_bytes,
            chunks: got.chunks,
            time_ms: ms(started),
            diff_ms: 0.0,
            entropy: got.entropy,
            steps: got.steps,
            stages: last.count(),
            dense_stages: got.dense_stages,
            bitmap_stages: 0,
            phases: phases.finish("receiver"),
            choice: None,
        };
        if let Some(v) = &mut self.verified {
            v.report = Some(report.clone());
        }
        Ok(Some(report))
    }

    /// Sends this receiver's ack (1: it refused) and waits for the link to complete it.
    fn ack(&mut self, refused: bool) -> Result<()> {
        let stream = self.gpu.stream_handle();
        // SAFETY: our status word.
        unsafe {
            self.gpu.memset(self.status.ptr(), 0, 8)?;
            self.gpu.memset(self.status.ptr(), refused as u8, 1)?;
            self.comm.all_reduce_max_u64(self.status.ptr(), 1, stream)?;
        }
        let done = self.gpu.record_done()?;
        self.comm.wait(done, self.timeout, "the ack")
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
    ) -> Result<Option<Stage>> {
        let mut prev: Option<Stage> = None;
        loop {
            // Waiting for the next sync can take a whole training step: no timeout unless
            // asked; the stages of a sync follow each other.
            let wait = match prev {
                None => idle_timeout.unwrap_or(Duration::from_secs(u64::MAX / 4)),
                Some(_) => self.timeout,
            };
            let header = self.receive_header(wait)?;
            phases.lap("wait", mark);
            if header.kind == FrameKind::Close {
                if let Err(e) = self.held.check_close(prev.is_some()) {
                    self.comm.abort();
                    return Err(e.into());
                }
                // Nothing follows: let go of the link (the IPC link's root waits for that
                // before freeing its staging).
                self.comm.leave();
                return Ok(None);
            }
            let stage = self.receive_manifest(header)?;
            if let Err(e) = stage.follows(prev.as_ref(), self.tensors.len()) {
                self.comm.abort();
                return Err(e);
            }
            if prev.is_none() {
                // The gate: whether a sync of this kind may start at the version held.
                match self.held.begin(stage.kind(), stage.header.version) {
                    Ok(pending) => got.pending = Some(pending),
                    Err(e) => got.failure = Some(e.into()),
                }
            }
            phases.lap("manifest", mark);
            got.payload_bytes += stage.wire_bytes();
            got.chunks += match stage.kind() {
                FrameKind::Delta => stage.entries.len() as u64,
                _ => 0,
            };
            // (A stage is applied only in a sync admitted at its first stage.)
            if got.failure.is_some() || got.pending.is_none() {
                self.discard_stage(&stage)?;
                phases.lap("payload", mark);
            } else {
                let applied = match stage.kind() {
                    FrameKind::Delta => self.apply_delta(&stage, got, phases, mark),
                    _ => self.apply_whole(&stage, got),
                };
                phases.lap("apply", mark);
                match applied {
                    Ok(()) => {}
                    // The link failed under the stage: nothing can be matched any more.
                    Err(e) if e.is_link_failure() => return Err(e),
                    Err(e) => {
                        self.undo(got);
                        got.failure = Some(e);
                    }
                }
            }
            if stage.is_last() {
                return Ok(Some(stage));
            }
            prev = Some(stage);
        }
    }

    /// Receives and checks a stage's header (a bad one aborts the communicator: without it
    /// the next broadcasts cannot be matched).
    fn receive_header(&mut self, wait: Duration) -> Result<FrameHeader> {
        let stream = self.gpu.stream_handle();
        // SAFETY: our header buffer.
        unsafe {
            self.comm.broadcast(
                self.header.ptr(),
                self.header.ptr(),
                HEADER_BYTES,
                self.root,
                stream,
                wait,
            )?
        };
        let done = self.gpu.record_done()?;
        let wait = self.comm.announced_wait(wait);
        self.comm.wait(done, wait, "waiting for the next sync")?;
        // SAFETY: our header buffer, complete.
        let head = unsafe { self.gpu.download(self.header.ptr(), HEADER_BYTES)? };
        decode_header(&head, &self.limits).inspect_err(|_| self.comm.abort())
    }

    /// Receives and checks a stage's manifest (bounded by the checked header).
    fn receive_manifest(&mut self, header: FrameHeader) -> Result<Stage> {
        let stream = self.gpu.stream_handle();
        let len = header.entry_count as u64 * 64 + header.digest_count as u64 * 24;
        let mptr = self.manifest.at_least(&self.gpu, len)?;
        // SAFETY: sized above.
        unsafe {
            self.comm
                .broadcast(mptr, mptr, len as usize, self.root, stream, self.timeout)?
        };
        let done = self.gpu.record_done()?;
        self.comm.wait(done, self.timeout, "the manifest")?;
        // SAFETY: complete (waited above).
        let mbytes = unsafe { self.gpu.download(mptr, len as usize)? };
        decode_stage(header, &mbytes, &self.limits).inspect_err(|_| self.comm.abort())
    }

    /// Receives a stage after this sync was refused, into scratch: the broadcasts must be
    /// matched, the bytes are not used.
    fn discard_stage(&mut self, stage: &Stage) -> Result<()> {
        let stream = self.gpu.stream_handle();
        let lens: Vec<u64> = match stage.kind() {
            FrameKind::Delta => vec![stage.position_bytes(), stage.value_bytes()],
            _ => stage.entries.iter().map(|e| e.val_len).collect(),
        };
        let most = lens.iter().copied().max().unwrap_or(0);
        let ptr = self.discard.at_least(&self.gpu, most)?;
        let segments: Vec<(u64, u64, u64)> = lens.iter().map(|&len| (ptr, ptr, len)).collect();
        // SAFETY: scratch of at least each segment's bytes (bounded by the checked header
        // and this receiver's own tensors); what lands there is dropped.
        unsafe {
            self.comm
                .broadcast_many(&segments, self.root, stream, self.timeout)?
        };
        let done = self.gpu.record_done()?;
        self.comm.wait(done, self.timeout, "a refused stage")
    }

    /// Undoes the stages applied during this sync, last first.
    fn undo(&mut self, got: &mut Incoming) {
        if !self.undo_applied(&mut got.applied) {
            // The tensors are in an unknown state.
            got.pending.iter_mut().for_each(Pending::clobber);
        }
    }

    /// Puts back what `applied` overwrote, last first; whether all of it was put back.
    fn undo_applied(&mut self, applied: &mut Vec<Applied>) -> bool {
        let mut all = true;
        while let Some(a) = applied.pop() {
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
            all &= undone.is_ok();
        }
        all && self.gpu.synchronize().is_ok()
    }

    fn apply_delta(
        &mut self,
        stage: &Stage,
        got: &mut Incoming,
        phases: &mut Phases,
        mark: &mut Instant,
    ) -> Result<()> {
        let stream = self.gpu.stream_handle();
        let index = stage.index() as usize;
        while self.stages.len() <= index {
            self.stages.push(StageBuffers::new());
        }
        let bufs = &mut self.stages[index];
        // The decoders look a few bytes past a section's end: the slack keeps that inside.
        let sized = bufs
            .positions
            .at_least(&self.gpu, stage.position_bytes() + DECODE_SLACK)
            .and_then(|p| {
                let v = bufs
                    .values
                    .at_least(&self.gpu, stage.value_bytes() + DECODE_SLACK)?;
                Ok((p, v))
            });
        let (pptr, vptr) = match sized {
            Ok(ptrs) => ptrs,
            Err(e) => {
                // Refused for want of memory: the stage's broadcasts must still be matched.
                self.discard_stage(stage)?;
                return Err(e);
            }
        };
        // SAFETY: sized above (bounded by this receiver's own table in Header::decode).
        unsafe {
            self.comm.broadcast_many(
                &[
                    (pptr, pptr, stage.position_bytes()),
                    (vptr, vptr, stage.value_bytes()),
                ],
                self.root,
                stream,
                self.timeout,
            )?;
        }
        let done = self.gpu.record_done()?;
        self.comm.wait(done, self.timeout, "the delta")?;
        phases.lap("payload", mark);
        self.check_base(stage)?;
        // Entropy-coded sections are decoded into staging first (positions as abs32, values
        // as raw), then checked and applied like the others.
        let width = |c: &ChunkEntry| self.tensors[c.slot as usize].dtype.width() as u64;
        let mut pos_stage = 0u64;
        let mut val_stage = 0u64;
        let mut stage_at = Vec::with_capacity(stage.entries.len());
        for c in &stage.entries {
            stage_at.push((pos_stage, val_stage));
            // 16-aligned, so the decoders can write whole vectors. Holes take their own
            // decoded holes and then the changes' positions.
            match c.pos_codec {
                PosCodec::Gaps => pos_stage += (c.count * 4).next_multiple_of(16),
                PosCodec::Holes if c.count < c.range => {
                    pos_stage += holes_area(c) + (c.count * 4).next_multiple_of(16)
                }
                // The ulp decoder reads the bitmap's positions as a list.
                PosCodec::Bitmap if c.val_codec == ValCodec::Ulp => {
                    pos_stage += (c.count * 4).next_multiple_of(16)
                }
                _ => {}
            }
            if c.val_codec == ValCodec::Ulp {
                val_stage += (c.count * width(c)).next_multiple_of(16);
            }
        }
        let bufs = &mut self.stages[index];
        let sp = bufs
            .decoded_positions
            .at_least(&self.gpu, pos_stage + DECODE_SLACK)?;
        let sv = bufs.decoded_values.at_least(&self.gpu, val_stage)?;
        let mut decode = Vec::new();
        let mut decode_chunk = Vec::new();
        let mut inputs = Vec::with_capacity(stage.entries.len());
        for (k, (c, &(ps, vs))) in stage.entries.iter().zip(&stage_at).enumerate() {
            let t = &self.tensors[c.slot as usize];
            let w = t.dtype.width() as u64;
            let wire_pos = pptr + stage.position_offset(c);
            let wire_val = vptr + stage.value_offset(c);
            // decode_stage lets only all, abs32, gaps, bitmap, holes and steps through.
            // Holes without a hole (an empty section, checked by its bounds) are all.
            let holes = (c.pos_codec == PosCodec::Holes && c.count < c.range).then(|| {
                let at = sp + ps;
                (at, at + holes_area(c))
            });
            let (positions, pos_section, pos_len) = match c.pos_codec {
                PosCodec::All => (ApplyPositions::All, wire_pos, 0),
                PosCodec::Holes => match holes {
                    Some((_, out)) => (ApplyPositions::Abs32, out, c.count * 4),
                    None => (ApplyPositions::All, wire_pos, 0),
                },
                PosCodec::Bitmap => (ApplyPositions::Bitmap, wire_pos, c.pos_len),
                PosCodec::Steps => (ApplyPositions::Steps, wire_pos, c.pos_len),
                PosCodec::Gaps => (ApplyPositions::Abs32, sp + ps, c.count * 4),
                _ => (ApplyPositions::Abs32, wire_pos, c.pos_len),
            };
            let (val_section, val_len, values) = match c.val_codec {
                ValCodec::Raw | ValCodec::Context => (wire_val, c.val_len, ApplyValues::Raw),
                ValCodec::Escaped => (wire_val, c.val_len, ApplyValues::Escaped),
                ValCodec::Ulp => (sv + vs, c.count * w, ApplyValues::Raw),
            };
            if c.pos_codec == PosCodec::Gaps || holes.is_some() || c.val_codec == ValCodec::Ulp {
                decode_chunk.push(k);
                decode.push(DecodeInput {
                    held: t.ptr,
                    slot_numel: t.numel(),
                    width: t.dtype.width(),
                    start: c.start,
                    range: c.range,
                    count: c.count,
                    positions: match c.pos_codec {
                        PosCodec::Gaps => DecodePositions::Gaps {
                            section: wire_pos,
                            len: c.pos_len,
                            out: sp + ps,
                        },
                        PosCodec::All => DecodePositions::All,
                        PosCodec::Bitmap => DecodePositions::Bitmap {
                            section: wire_pos,
                            len: c.pos_len,
                            out: sp + ps,
                        },
                        PosCodec::Holes => match holes {
                            Some((at, out)) => DecodePositions::Holes {
                                section: wire_pos,
                                len: c.pos_len,
                                holes: at,
                                out,
                            },
                            None => DecodePositions::All,
                        },
                        _ => DecodePositions::Abs32 {
                            section: wire_pos,
                            len: c.pos_len,
                        },
                    },
                    values: (c.val_codec == ValCodec::Ulp).then_some((
                        wire_val,
                        c.val_len,
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
                values,
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
        if stage.entries.iter().any(|c| c.pos_codec == PosCodec::Steps) {
            got.steps = true;
        }
        if !decode.is_empty() {
            got.entropy = true;
            phases.lap("decode", mark);
        }
        // Every chunk checked and the stage's digests computed from the bits held (the
        // held digest plus the change), settled against the sender's; only then the
        // scatter, so a refusal writes nothing.
        // SAFETY: sections lie inside the received buffers (Manifest::decode checked the
        // offsets against the announced lengths, which the buffers hold); slots are ours.
        let check = unsafe { self.gpu.apply_check(&inputs, false, self.tensors.len())? };
        if let Some(e) = check.errors.first() {
            return Err(CudaError::BadChunk {
                chunk: e.chunk,
                reason: e.reason,
            });
        }
        let mut outside = (0..self.tensors.len()).filter(|i| !stage.slots().contains(i));
        if outside.any(|i| check.digest_change[i] != 0) {
            return Err(CudaError::Protocol(
                "a chunk of a slot outside its stage".into(),
            ));
        }
        let pending = admitted(&mut got.pending)?;
        for d in &stage.digests {
            let slot = d.slot as usize;
            let computed = self.held.digests()[slot].wrapping_add(check.digest_change[slot]);
            pending.settle(&self.table, d.slot, computed, d.new)?;
        }
        got.changed += stage.entries.iter().map(|c| c.count).sum::<u64>();
        got.any_delta = true;
        if got.landing == Landing::Later {
            got.later.push(Later::Delta { index, inputs });
            return Ok(());
        }
        // The last stage is never undone; the others keep what they overwrite.
        let journaled = !stage.is_last();
        // SAFETY: as the check above, every chunk checked clean; the journal is sized by its
        // layout.
        let scattered = unsafe {
            if journaled {
                let journal = self.stages[index]
                    .journal
                    .at_least(&self.gpu, journal_layout(&inputs).1)?;
                let done = self.gpu.apply_scatter_journaled(&inputs, journal);
                if done.is_ok() {
                    got.applied.push(Applied::Delta { inputs, journal });
                }
                done
            } else {
                self.gpu.apply_scatter(&inputs)
            }
        };
        if !journaled || scattered.is_err() {
            // Written with nothing to undo it from (or part way): a failure from here on
            // leaves no version held.
            pending.clobber();
        }
        scattered
    }

    /// The delta or dense stage's base: per slot of the stage, the digest it starts from is
    /// the one held (the version was checked when the sync was admitted).
    fn check_base(&self, stage: &Stage) -> Result<()> {
        for d in &stage.digests {
            self.held.check_base(&self.table, d.slot, d.base)?;
        }
        Ok(())
    }

    /// Copies the bytes of the tensors of `slots` into stage `index`'s journal (enqueued
    /// before the stage's broadcasts): (tensor, copy, bytes) of each.
    fn journal_whole(&mut self, index: usize, slots: Range<usize>) -> Result<Vec<(u64, u64, u64)>> {
        let bytes: u64 = self.tensors[slots.clone()].iter().map(|t| t.nbytes()).sum();
        let base = self.stages[index].journal.at_least(&self.gpu, bytes)?;
        let mut saved = Vec::with_capacity(slots.len());
        let mut at = base;
        for t in &self.tensors[slots] {
            // SAFETY: the journal holds the stage's bytes; the tensor is ours. Enqueued on
            // the stream the broadcasts follow.
            unsafe { self.gpu.copy_device(at, t.ptr, t.nbytes() as usize)? };
            saved.push((t.ptr, at, t.nbytes()));
            at += t.nbytes();
        }
        Ok(saved)
    }

    /// A seed or dense stage: each entry's section lands in its tensor directly. A dense
    /// stage (whose base is checked like a delta's) that is not the last first copies the
    /// bytes it replaces into its journal (so that a later stage's failure can undo it); a
    /// seed or a last stage does not, so a failure of its own digests leaves no version held.
    fn apply_whole(&mut self, stage: &Stage, got: &mut Incoming) -> Result<()> {
        let stream = self.gpu.stream_handle();
        let slots = stage.slots();
        if stage.kind() == FrameKind::Dense {
            if let Err(e) = self.check_base(stage) {
                self.discard_stage(stage)?;
                return Err(e);
            }
        }
        // Where each tensor's new bytes land: the tensor, or (landing later) its place in
        // the stage's staging.
        let mut lands: Vec<DevicePtr> = self.tensors[slots.clone()].iter().map(|t| t.ptr).collect();
        if got.landing == Landing::Later {
            let index = stage.index() as usize;
            while self.stages.len() <= index {
                self.stages.push(StageBuffers::new());
            }
            let (offsets, bytes) = staged_layout(&self.tensors[slots.clone()]);
            let staged = match self.stages[index].values.at_least(&self.gpu, bytes) {
                Ok(p) => p,
                Err(e) => {
                    self.discard_stage(stage)?;
                    return Err(e);
                }
            };
            for (land, off) in lands.iter_mut().zip(offsets) {
                *land = staged + off;
            }
            got.later.push(Later::Whole {
                index,
                slots: slots.clone(),
                staged: lands.clone(),
            });
        } else if stage.kind() == FrameKind::Dense && !stage.is_last() {
            let index = stage.index() as usize;
            while self.stages.len() <= index {
                self.stages.push(StageBuffers::new());
            }
            match self.journal_whole(index, slots.clone()) {
                Ok(saved) => got.applied.push(Applied::Whole { saved }),
                Err(e) => {
                    // Refused before anything was written: the broadcasts must still be
                    // matched.
                    self.discard_stage(stage)?;
                    return Err(e);
                }
            }
        } else {
            admitted(&mut got.pending)?.clobber();
        }
        let segments: Vec<(u64, u64, u64)> = stage
            .entries
            .iter()
            .map(|e| {
                let t = &self.tensors[e.slot as usize];
                let dst = lands[e.slot as usize - slots.start] + e.start * t.dtype.width() as u64;
                (dst, dst, e.val_len)
            })
            .collect();
        // SAFETY: decode_stage checked that the entries tile their slots, so each lies
        // inside its tensor, valid for nbytes (the caller's promise at construction), or
        // inside the tensor's place in the staging, sized by the same bytes.
        unsafe {
            self.comm
                .broadcast_many(&segments, self.root, stream, self.timeout)?
        };
        let done = self.gpu.record_done()?;
        self.comm.wait(done, self.timeout, "the tensors")?;
        let mut inputs = digest_inputs(&self.tensors, slots.clone(), Bf16Rule::default());
        for (input, &land) in inputs.iter_mut().zip(&lands) {
            input.ptr = land;
        }
        // SAFETY: our tensors (constructor contract), or the staging sized for them above.
        let digests = unsafe { self.gpu.digest(&inputs)? };
        let pending = admitted(&mut got.pending)?;
        for (d, &actual) in stage.digests.iter().zip(&digests) {
            pending.settle(&self.table, d.slot, actual, d.new)?;
        }
        got.changed += self.tensors[slots].iter().map(|t| t.numel()).sum::<u64>();
        got.dense_stages += 1;
        Ok(())
    }

    /// Recomputes the digests of the bits held and compares them with the ones recorded:
    /// finds weights changed behind the receiver's back (then it holds no version and needs
    /// a seed). Nothing held: nothing to check.
    pub fn verify(&mut self) -> Result<()> {
        let all = 0..self.tensors.len();
        // SAFETY: our tensors (constructor contract).
        // (The rule is not used: no tensor here converts.)
        let got = unsafe {
            self.gpu
                .digest(&digest_inputs(&self.tensors, all, Bf16Rule::default()))?
        };
        Ok(self.held.verify(&self.table, &got)?)
    }
}

/// Where a whole stage's tensors wait in its staging when it lands later: each at an offset
/// aligned for the digest kernel's widest loads; the bytes in all.
fn staged_layout(tensors: &[GpuTensor]) -> (Vec<u64>, u64) {
    const ALIGN: u64 = 256;
    let mut at = 0u64;
    let offsets = tensors
        .iter()
        .map(|t| {
            let off = at;
            at = (at + t.nbytes()).next_multiple_of(ALIGN);
            off
        })
        .collect();
    (offsets, at)
}

/// The staging a holes chunk's decoded holes take (16-aligned, as the decoders write whole
/// vectors); its changes' positions follow.
fn holes_area(c: &ChunkEntry) -> u64 {
    ((c.range - c.count) * 4).next_multiple_of(16)
}

fn admitted(pending: &mut Option<Pending>) -> Result<&mut Pending> {
    pending
        .as_mut()
        .ok_or_else(|| CudaError::Protocol("a stage of a sync that was not admitted".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_tensors_start_aligned_and_do_not_overlap() {
        let t = |dtype: deltacast::DType, n: u64| GpuTensor {
            name: String::new(),
            dtype,
            shape: vec![n],
            ptr: 0,
            source: dtype,
        };
        use deltacast::DType::{BF16, F32, F8E4M3};
        let tensors = [
            t(BF16, 300_009),
            t(BF16, 0),
            t(F8E4M3, 7),
            t(F32, 12_289),
            t(BF16, 1),
        ];
        let (offsets, total) = staged_layout(&tensors);
        for (k, (off, t)) in offsets.iter().zip(&tensors).enumerate() {
            assert_eq!(off % 256, 0, "tensor {k}");
            let end = off + t.nbytes();
            assert!(end <= total, "tensor {k}");
            if let Some(next) = offsets.get(k + 1) {
                assert!(end <= *next, "tensor {k} overlaps the next");
            }
        }
        assert_eq!(staged_layout(&[]), (Vec::new(), 0));
    }
}
