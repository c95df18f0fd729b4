//! Each rollout process's side of the GPU sync: [`GpuReceiver`] checks and applies a sync
//! stage by stage, all or nothing (see the module above).

use std::ops::Range;
use std::time::{Duration, Instant};

use super::{
    check_tensors, digest_inputs, limits, ms, slot_table, GpuSyncReport, GpuTensor, Growable,
    Phases,
};
use crate::error::{CudaError, Result};
use crate::link::Link;
use crate::protocol::{
    ChunkPositions, ChunkRecord, ChunkValues, Header, Manifest, SyncKind, TableLimits, HEADER_BYTES,
};
use crate::{
    journal_layout, ApplyInput, ApplyPositions, CodeScratch, DecodeInput, DecodePositions,
    DeviceBuffer, DevicePtr, Gpu, DECODE_SLACK,
};

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
    comm: Link,
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
                    // Nothing follows: let go of the link (the IPC link's root waits for
                    // that before freeing its staging).
                    self.comm.leave();
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
                wait,
            )?
        };
        let done = self.gpu.record_done()?;
        let wait = self.comm.announced_wait(wait);
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
                self.timeout,
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
                    .broadcast(ptr, ptr, len as usize, self.root, stream, self.timeout)?
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
        let sized = bufs
            .positions
            .at_least(&self.gpu, header.position_bytes + DECODE_SLACK)
            .and_then(|p| {
                let v = bufs
                    .values
                    .at_least(&self.gpu, header.value_bytes + DECODE_SLACK)?;
                Ok((p, v))
            });
        let (pptr, vptr) = match sized {
            Ok(ptrs) => ptrs,
            Err(e) => {
                // Refused for want of memory: the stage's broadcasts must still be matched.
                self.discard_stage(header)?;
                return Err(e);
            }
        };
        // SAFETY: sized above (bounded by this receiver's own table in Header::decode).
        unsafe {
            self.comm.broadcast(
                pptr,
                pptr,
                header.position_bytes as usize,
                self.root,
                stream,
                self.timeout,
            )?;
            self.comm.broadcast(
                vptr,
                vptr,
                header.value_bytes as usize,
                self.root,
                stream,
                self.timeout,
            )?;
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

    /// Copies the bytes of the tensors of `slots` into stage `stage`'s journal (enqueued
    /// before the stage's broadcasts): (tensor, copy, bytes) of each.
    fn journal_whole(&mut self, stage: usize, slots: Range<usize>) -> Result<Vec<(u64, u64, u64)>> {
        let bytes: u64 = self.tensors[slots.clone()].iter().map(|t| t.nbytes()).sum();
        let base = self.stages[stage].journal.at_least(&self.gpu, bytes)?;
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
            match self.journal_whole(stage, slots.clone()) {
                Ok(saved) => got.applied.push(Applied::Whole { saved }),
                Err(e) => {
                    // Refused before anything was written: the broadcasts must still be
                    // matched.
                    self.discard_stage(header)?;
                    return Err(e);
                }
            }
        } else {
            got.clobbered = true;
        }
        for t in &self.tensors[slots.clone()] {
            // SAFETY: each tensor is valid for nbytes (the caller's promise at construction).
            unsafe {
                self.comm.broadcast(
                    t.ptr,
                    t.ptr,
                    t.nbytes() as usize,
                    self.root,
                    stream,
                    self.timeout,
                )?
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
