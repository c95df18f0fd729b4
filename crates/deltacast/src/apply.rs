//! The receiver: verifies every flush, stages a whole sync, and applies it only when every
//! flush verified and the digests prove the result equals the sender's state. A delta of one
//! flush (chunks not overlapping) is instead applied while it is decoded, one visit per
//! element, and written back if the digests do not prove it. Either way a receiver is never
//! left between two versions when `receive` returns.
//!
//! A delta sync may mix delta frames (changed elements) and dense frames (every element of
//! the slots they name, as a GPU stage sends them when a delta would not be smaller): a dense
//! slot's new digest is summed afresh from its values, so its cover must be exact and no
//! other frame may touch it (docs/wire-format.md).

pub mod changes;
mod chunks;

use rayon::prelude::*;

use crate::digest::digest_slot;
use crate::error::{Error, Result};
use crate::held::{HeldState, Pending};
use crate::slot::SlotTable;
use crate::wire::{check_dense_cover, parse_frame, Frame, FrameKind, SlotDigest};
use chunks::{apply_chunks, chunk_bytes, decode_entry, write_back, write_frame, StagedChunk};

/// Where a receiver keeps its slots' bytes: owned buffers, or borrowed tensors (bindings).
pub trait SlotStore: Sync {
    fn slot(&self, id: u32) -> &[u8];
    fn slot_mut(&mut self, id: u32) -> &mut [u8];

    /// Every slot's bytes at once (index = slot id), so that a sync is applied to all slots in
    /// parallel. The default, `None`, applies one slot at a time (chunks of one slot still in
    /// parallel).
    fn slots_mut(&mut self) -> Option<Vec<&mut [u8]>> {
        None
    }
}

impl SlotStore for Vec<Vec<u8>> {
    fn slot(&self, id: u32) -> &[u8] {
        &self[id as usize]
    }

    fn slot_mut(&mut self, id: u32) -> &mut [u8] {
        &mut self[id as usize]
    }

    fn slots_mut(&mut self) -> Option<Vec<&mut [u8]>> {
        Some(self.iter_mut().map(Vec::as_mut_slice).collect())
    }
}

/// What the frames of a delta sync received so far did to one slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum SlotUse {
    Untouched,
    /// Delta chunks (any number of frames).
    Delta,
    /// Sent whole by the dense frame of this flush index; no other frame may touch it.
    Dense(u32),
}

/// A sync received whole and verified, waiting for [`Receiver::commit`].
#[derive(Debug)]
struct Verified {
    pending: Pending,
    chunks: Vec<StagedChunk>,
    kind: FrameKind,
    flushes: u32,
    wire_bytes: u64,
}

/// A sync being received.
#[derive(Debug)]
struct Staging {
    /// The sync's family (seed, delta: delta and dense frames, or verify), its version and
    /// the digests settled so far.
    pending: Pending,
    /// Every frame so far was dense (the outcome then says dense).
    all_dense: bool,
    next_flush: u32,
    /// Flush 0's `flush_count`: every frame of the sync must say the same.
    flush_count: u32,
    chunks: Vec<StagedChunk>,
    sender_digests: Vec<Option<SlotDigest>>,
    /// Per slot: elements staged so far. Chunks may come in any order (pieces of different
    /// trainer ranks interleave); overlaps are caught by the digest check, see `finish_sync`.
    slot_count: Vec<u64>,
    wire_bytes: u64,
    /// The chunks are already written to the store, with their old bits kept (a delta
    /// received with [`Receiver::set_apply_as_received`]); undone if the sync fails.
    in_place: bool,
    /// Per slot, with `in_place`: the ranges written so far, sorted by start (a chunk that
    /// overlaps one of them, which sharded senders may send, makes the sync go back to
    /// staging).
    written: Vec<Vec<(u64, u64)>>,
    /// Per slot, in a delta sync: delta chunks, or dense in which flush.
    slot_use: Vec<SlotUse>,
}

impl Staging {
    fn new(pending: Pending, flush_count: u32, slots: usize, in_place: bool) -> Self {
        Staging {
            pending,
            all_dense: true,
            next_flush: 0,
            flush_count,
            chunks: Vec::new(),
            sender_digests: vec![None; slots],
            slot_count: vec![0; slots],
            wire_bytes: 0,
            in_place,
            written: vec![Vec::new(); slots],
            slot_use: vec![SlotUse::Untouched; slots],
        }
    }

    /// The checks every frame of a sync passes before its chunks are decoded, in order: its
    /// place in the sync (version, flush index, family, flush count), then its structure (a
    /// dense frame's cover, chunk ranges inside their slots, no slot over-filled). Counts the
    /// frame as received.
    fn admit(&mut self, table: &SlotTable, frame: &Frame<'_>, bytes: usize) -> Result<()> {
        let h = frame.header;
        if self.pending.version() != h.version || self.next_flush != h.flush_index {
            return Err(Error::FlushOutOfOrder {
                version: self.pending.version(),
                expected: self.next_flush,
                got: h.flush_index,
            });
        }
        if self.pending.kind() != h.kind.family() {
            return Err(Error::Malformed(format!(
                "a {} frame in a {} sync",
                h.kind.name(),
                self.pending.kind().name()
            )));
        }
        if self.flush_count != h.flush_count {
            return Err(Error::Malformed(format!(
                "flush {} says the sync has {} flushes, flush 0 said {}",
                h.flush_index, h.flush_count, self.flush_count
            )));
        }
        self.next_flush += 1;
        self.wire_bytes += bytes as u64;
        self.all_dense &= h.kind == FrameKind::Dense;

        // Structural checks in order (a dense frame's cover first: it names the problem
        // best).
        self.claim_slots(table, frame)?;
        for e in &frame.entries {
            let slot = table.get(e.slot)?;
            let end = e.start + e.range; // no overflow: checked by parse_frame
            if end > slot.numel() {
                return Err(Error::Malformed(format!(
                    "chunk [{}, {end}) lies beyond slot `{}` of {} elements",
                    e.start,
                    slot.name,
                    slot.numel()
                )));
            }
            let staged = &mut self.slot_count[e.slot as usize];
            *staged += e.count;
            if *staged > slot.numel() {
                return Err(Error::Malformed(format!(
                    "sync carries more than {} elements for slot `{}`",
                    slot.numel(),
                    slot.name
                )));
            }
        }
        Ok(())
    }

    /// Keeps the sender's digest records of a frame (one per slot over the whole sync).
    fn record_digests(&mut self, table: &SlotTable, frame: &Frame<'_>) -> Result<()> {
        for d in &frame.digests {
            let slot = table.get(d.slot)?;
            let record = &mut self.sender_digests[d.slot as usize];
            if record.is_some() {
                return Err(Error::Malformed(format!(
                    "two digest records for slot `{}`",
                    slot.name
                )));
            }
            *record = Some(*d);
        }
        Ok(())
    }

    /// After the last frame: the sender's digest record of every slot, and for a seed every
    /// element of every slot received.
    fn sender_records(&self, table: &SlotTable) -> Result<Vec<SlotDigest>> {
        let mut sender = Vec::with_capacity(table.len());
        for (id, record) in self.sender_digests.iter().enumerate() {
            let slot = &table.slots()[id];
            let Some(record) = record else {
                return Err(Error::IncompleteSync(format!(
                    "no digest for slot `{}`",
                    slot.name
                )));
            };
            if self.pending.kind() == FrameKind::Seed && self.slot_count[id] != slot.numel() {
                return Err(Error::IncompleteSync(format!(
                    "seed carries {} of {} elements of slot `{}`",
                    self.slot_count[id],
                    slot.numel(),
                    slot.name
                )));
            }
            sender.push(*record);
        }
        Ok(sender)
    }
    /// The kind a completed sync reports: dense when every frame was dense.
    fn outcome_kind(&self) -> FrameKind {
        let kind = self.pending.kind();
        if kind == FrameKind::Delta && self.all_dense {
            FrameKind::Dense
        } else {
            kind
        }
    }

    /// Slots a dense frame of this sync sent whole: their new digest starts from 0.
    fn dense_slots(&self) -> impl Iterator<Item = usize> + '_ {
        self.slot_use
            .iter()
            .enumerate()
            .filter(|(_, u)| matches!(u, SlotUse::Dense(_)))
            .map(|(id, _)| id)
    }

    /// Records what a delta or dense frame does to each slot, refusing a dense slot that is
    /// not covered exactly once by its frame or that another frame of the sync touches.
    fn claim_slots(&mut self, table: &SlotTable, frame: &Frame<'_>) -> Result<()> {
        let flush = frame.header.flush_index;
        let name = |slot: u32| &table.slots()[slot as usize].name;
        match frame.header.kind {
            FrameKind::Dense => {
                for slot in check_dense_cover(table, &frame.entries)? {
                    let used = &mut self.slot_use[slot as usize];
                    match *used {
                        SlotUse::Untouched => *used = SlotUse::Dense(flush),
                        SlotUse::Delta => {
                            return Err(Error::Malformed(format!(
                                "flush {flush} sends slot `{}` dense, an earlier flush of the sync carried delta chunks of it",
                                name(slot)
                            )));
                        }
                        SlotUse::Dense(other) => {
                            return Err(Error::Malformed(format!(
                                "slot `{}` is sent dense by flushes {other} and {flush}",
                                name(slot)
                            )));
                        }
                    }
                }
            }
            FrameKind::Delta => {
                for e in &frame.entries {
                    table.get(e.slot)?;
                    let used = &mut self.slot_use[e.slot as usize];
                    if let SlotUse::Dense(other) = *used {
                        return Err(Error::Malformed(format!(
                            "flush {flush} carries a delta chunk of slot `{}`, sent dense by flush {other}",
                            name(e.slot)
                        )));
                    }
                    *used = SlotUse::Delta;
                }
            }
            _ => {}
        }
        Ok(())
    }
}

/// What a completed sync did, or that the sender closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncOutcome {
    /// Seed, delta (a sync of delta frames, or of delta and dense frames), dense (dense frames
    /// only), verify, or close: the sender said no sync follows, nothing changed.
    pub kind: FrameKind,
    /// The version held after the sync (for a close: the version held, 0 if none).
    pub version: u64,
    pub flushes: u32,
    pub changed: u64,
    pub wire_bytes: u64,
    /// The combined state digest after the sync (what the receiver acks).
    pub state_digest: u64,
}

/// Receives syncs into a [`SlotStore`].
pub struct Receiver<S: SlotStore = Vec<Vec<u8>>> {
    table: SlotTable,
    store: S,
    /// The version held, its digests, and what syncs may start.
    held: HeldState,
    staging: Option<Staging>,
    apply_as_received: bool,
    /// Hold a verified sync until `commit` instead of applying it at its last flush.
    commit_on_demand: bool,
    verified: Option<Verified>,
}

impl Receiver<Vec<Vec<u8>>> {
    /// An empty receiver with zeroed buffers; it accepts only a seed.
    pub fn new(table: SlotTable) -> Self {
        let store = table
            .slots()
            .iter()
            .map(|s| vec![0u8; s.nbytes() as usize])
            .collect();
        let held = HeldState::none(&table);
        Receiver {
            table,
            store,
            held,
            staging: None,
            apply_as_received: false,
            commit_on_demand: false,
            verified: None,
        }
    }
}

impl<S: SlotStore> Receiver<S> {
    /// A receiver whose store already holds the state of `version` (e.g. a checkpoint on disk).
    /// Checks the store's sizes against the table and computes its digests.
    pub fn with_state(table: SlotTable, store: S, version: Option<u64>) -> Result<Self> {
        for (id, slot) in table.slots().iter().enumerate() {
            let len = store.slot(id as u32).len() as u64;
            if len != slot.nbytes() {
                return Err(Error::SlotMismatch {
                    slot: slot.name.clone(),
                    reason: format!("store holds {len} bytes, table says {}", slot.nbytes()),
                });
            }
        }
        let digests = (0..table.len() as u32)
            .map(|id| digest_slot(id, table.slots()[id as usize].dtype.width(), store.slot(id)))
            .collect();
        Ok(Receiver {
            table,
            store,
            held: HeldState::holding(version, digests),
            staging: None,
            apply_as_received: false,
            commit_on_demand: false,
            verified: None,
        })
    }

    pub fn table(&self) -> &SlotTable {
        &self.table
    }

    /// The version this receiver holds (None before its first seed).
    pub fn version(&self) -> Option<u64> {
        self.held.version()
    }

    pub fn store(&self) -> &S {
        &self.store
    }

    pub fn into_store(self) -> S {
        self.store
    }

    /// The store, writable. Writes bypass the running digests, as an engine writing into its
    /// weights would: [`recompute_digests`](Self::recompute_digests) finds them (fault tests).
    pub fn store_mut(&mut self) -> &mut S {
        &mut self.store
    }

    /// Running per-slot digests.
    pub fn digests(&self) -> &[u64] {
        self.held.digests()
    }

    /// The combined digest acked to the sender: the sum of the slot digests.
    pub fn state_digest(&self) -> u64 {
        self.held.state_digest()
    }

    /// Recomputes every slot's digest from memory and returns the slots whose bytes no longer
    /// match the running digest (weights changed behind the receiver's back).
    /// An unseeded receiver holds no state to check and reports none.
    pub fn recompute_digests(&self) -> Vec<u32> {
        if self.held.version().is_none() {
            return Vec::new();
        }
        let digests = self.held.digests();
        (0..self.table.len() as u32)
            .into_par_iter()
            .filter(|&id| {
                digest_slot(
                    id,
                    self.table.slots()[id as usize].dtype.width(),
                    self.store.slot(id),
                ) != digests[id as usize]
            })
            .collect()
    }

    /// Whether a sync is half received.
    pub fn is_staging(&self) -> bool {
        self.staging.is_some()
    }

    /// Drops a half-received sync (e.g. after a lost connection), or a verified one waiting
    /// for [`commit`](Self::commit). The state is as it was before the sync (flushes already
    /// written in place are written back).
    pub fn abort_sync(&mut self) {
        self.drop_staging();
        if let Some(v) = self.verified.take() {
            self.held.fail(v.pending);
        }
    }

    /// Splits each sync into *stage* and *commit*: with this on, a sync's last flush verifies
    /// it whole (every check and digest, from the bits held) but writes nothing, `receive`
    /// returns `None` and [`awaits_commit`](Self::awaits_commit) says so; the store keeps
    /// serving the version held until [`commit`](Self::commit) writes the sync in one pass
    /// (the only part that needs readers paused), or [`abort_sync`](Self::abort_sync) drops
    /// it. Takes precedence over [`set_apply_as_received`](Self::set_apply_as_received)
    /// (nothing is written before the commit). Off by default.
    pub fn set_commit_on_demand(&mut self, on: bool) {
        self.commit_on_demand = on;
    }

    /// Whether a verified sync waits for [`commit`](Self::commit).
    pub fn awaits_commit(&self) -> bool {
        self.verified.is_some()
    }

    /// Writes the verified sync that waits (see [`set_commit_on_demand`](Self::set_commit_on_demand))
    /// and takes its version.
    pub fn commit(&mut self) -> Result<SyncOutcome> {
        let v = self
            .verified
            .take()
            .ok_or_else(|| Error::InvalidArgument("no verified sync waits for a commit".into()))?;
        let version = self.held.commit(&self.table, v.pending)?;
        let changed = apply_chunks(&self.table, &mut self.store, &v.chunks);
        Ok(SyncOutcome {
            kind: v.kind,
            version,
            flushes: v.flushes,
            changed,
            wire_bytes: v.wire_bytes,
            state_digest: self.state_digest(),
        })
    }

    /// Whether the flushes of a multi-flush delta are written into the store as they arrive
    /// (keeping the bits they replace) instead of staged until the last one verified. On: no
    /// pass over the state after the last flush, so the apply overlaps the link; but between
    /// flushes the store holds parts of two versions, so nothing may read it while
    /// [`is_staging`](Self::is_staging) (and a store that outlives a crash, such as a file,
    /// can be left mixed). A sync that fails is still undone whole: any error, and
    /// [`abort_sync`](Self::abort_sync), write the old bits back. Off by default. (A
    /// single-flush delta is always written in one pass and undone on failure.)
    pub fn set_apply_as_received(&mut self, on: bool) {
        self.apply_as_received = on;
    }

    /// Whether flushes are written as they arrive ([`set_apply_as_received`](Self::set_apply_as_received)).
    pub fn applies_as_received(&self) -> bool {
        self.apply_as_received
    }

    /// Drops the sync being received, writing back what it wrote in place (so the version
    /// held stays).
    fn drop_staging(&mut self) {
        if let Some(staging) = self.staging.take() {
            if staging.in_place {
                self.undo_in_place(&staging.chunks);
            }
            self.held.fail(staging.pending);
        }
    }

    /// Writes the old bits of chunks written in place back (chunks never overlap there).
    fn undo_in_place(&mut self, chunks: &[StagedChunk]) {
        write_back(&self.table, &mut self.store, chunks);
    }

    /// Takes one flush. Returns `Some` when it completed a sync that was verified and applied.
    /// Any error drops the whole staged sync and leaves the state as it was.
    pub fn receive(&mut self, frame: &[u8]) -> Result<Option<SyncOutcome>> {
        if self.verified.is_some() {
            // Refused without touching the sync that waits.
            return Err(Error::InvalidArgument(
                "a verified sync waits for commit or abort_sync".into(),
            ));
        }
        let result = self.receive_inner(frame);
        if result.is_err() {
            self.drop_staging();
        }
        result
    }

    fn receive_inner(&mut self, bytes: &[u8]) -> Result<Option<SyncOutcome>> {
        let frame = parse_frame(bytes)?;
        let h = frame.header;
        check_table(h.table_hash, &self.table)?;
        if h.kind == FrameKind::Close {
            // Refused mid-sync: `receive` drops the half-received sync (its in-place writes
            // undone).
            self.held.check_close(self.staging.is_some())?;
            return Ok(Some(SyncOutcome {
                kind: FrameKind::Close,
                version: self.held.version().unwrap_or(0),
                flushes: 1,
                changed: 0,
                wire_bytes: bytes.len() as u64,
                state_digest: self.state_digest(),
            }));
        }
        let family = h.kind.family();
        if h.flush_index == 0 {
            let pending = self.held.begin(h.kind, h.version)?;
            // A new sync replaces one left half received (its in-place writes undone).
            self.drop_staging();
            let in_place =
                self.apply_as_received && !self.commit_on_demand && family == FrameKind::Delta;
            self.staging = Some(Staging::new(
                pending,
                h.flush_count,
                self.table.len(),
                in_place,
            ));
        }
        let Some(staging) = self.staging.as_mut() else {
            return Err(Error::FlushOutOfOrder {
                version: h.version,
                expected: 0,
                got: h.flush_index,
            });
        };
        staging.admit(&self.table, &frame, bytes.len())?;
        if h.flush_index == 0
            && h.is_final
            && staging.pending.kind() == FrameKind::Delta
            && !self.commit_on_demand
        {
            // The whole sync is this one verified flush: apply it in one pass, undo on failure.
            let wire_bytes = staging.wire_bytes;
            if let Some(outcome) = self.apply_single(&frame, wire_bytes)? {
                return Ok(Some(outcome));
            }
        }
        if self.staging.as_ref().is_some_and(|s| s.in_place) && !self.write_in_place(&frame)? {
            // Overlapping ranges: back to staging, from the bits before the sync.
            if let Some(staging) = self.staging.as_mut() {
                staging.in_place = false;
                let chunks = std::mem::take(&mut staging.chunks);
                self.undo_in_place(&chunks);
                if let Some(staging) = self.staging.as_mut() {
                    staging.chunks = chunks;
                }
            }
        }
        let Some(staging) = self.staging.as_mut() else {
            return Err(Error::IncompleteSync("no staged sync".into()));
        };
        let written_in_place = staging.in_place;
        let store = &self.store;
        let table = &self.table;
        let kind = h.kind;
        let decoded: Vec<Result<StagedChunk>> = if written_in_place {
            Vec::new()
        } else {
            frame
                .entries
                .par_iter()
                .map(|e| {
                    let width = table.get(e.slot)?.dtype.width();
                    let held = chunk_bytes(store.slot(e.slot), width, e);
                    decode_entry(table, held, &frame, e, kind, false)
                })
                .collect()
        };
        for chunk in decoded {
            staging.chunks.push(chunk?);
        }
        staging.record_digests(&self.table, &frame)?;
        if !h.is_final {
            return Ok(None);
        }
        let staging = self
            .staging
            .take()
            .ok_or_else(|| Error::IncompleteSync("no staged sync".into()))?;
        if self.commit_on_demand && staging.pending.kind() != FrameKind::Verify {
            self.stage_verified(staging)?;
            return Ok(None);
        }
        self.finish_sync(staging).map(Some)
    }

    /// Verifies a fully received sync and keeps it for [`Receiver::commit`].
    fn stage_verified(&mut self, mut staging: Staging) -> Result<()> {
        if let Err(e) = self.verify_staged(&mut staging) {
            self.held.fail(staging.pending);
            return Err(e);
        }
        let kind = staging.outcome_kind();
        self.verified = Some(Verified {
            kind,
            flushes: staging.next_flush,
            wire_bytes: staging.wire_bytes,
            pending: staging.pending,
            chunks: staging.chunks,
        });
        Ok(())
    }

    /// Writes one flush of a delta received in place (see
    /// [`set_apply_as_received`](Self::set_apply_as_received)): each chunk decoded against the
    /// bits held and written at once, keeping its old bits, as the single-flush apply does.
    /// `false`, before anything of this flush is written, when a chunk's range overlaps
    /// another of this flush or one written before in this sync, or the store cannot lend all
    /// slots at once. A decoding error writes this flush's chunks back and is returned (the
    /// caller then writes back the flushes before it).
    fn write_in_place(&mut self, frame: &Frame<'_>) -> Result<bool> {
        let Some(staging) = self.staging.as_mut() else {
            return Err(Error::IncompleteSync("no staged sync".into()));
        };
        for e in &frame.entries {
            // The written range with the largest start below this chunk's end is the only
            // one that can overlap it (they are disjoint and sorted).
            let ranges = &staging.written[e.slot as usize];
            let below = ranges.partition_point(|&(start, _)| start < e.start + e.range);
            if below > 0 && ranges[below - 1].1 > e.start {
                return Ok(false);
            }
        }
        let Some(chunks) = write_frame(&self.table, &mut self.store, frame)? else {
            return Ok(false);
        };
        for c in chunks {
            let ranges = &mut staging.written[c.slot as usize];
            let at = ranges.partition_point(|&(start, _)| start < c.start);
            ranges.insert(at, (c.start, c.start + c.range));
            staging.chunks.push(c);
        }
        Ok(true)
    }

    /// A delta sync of a single flush, delta or dense (already checksummed and checked for
    /// structure, a dense frame's cover too):
    /// decodes and applies it in one pass over the held state, chunk by chunk in parallel,
    /// keeping each chunk's old bits; then checks no-ops and digests and, if anything fails,
    /// writes the old bits back, so the state ends as it was. Reading the held bits and writing
    /// the new ones in the same visit saves the second pass over the state that staging needs.
    /// `None`, before anything is written, when the store cannot lend all slots at once or two
    /// chunks' ranges overlap (the caller then stages as usual).
    fn apply_single(&mut self, frame: &Frame<'_>, wire_bytes: u64) -> Result<Option<SyncOutcome>> {
        // The sender's digests, all present and the base ones ours, before anything is written.
        let mut sender: Vec<Option<SlotDigest>> = vec![None; self.table.len()];
        for d in &frame.digests {
            let slot = self.table.get(d.slot)?;
            let record = &mut sender[d.slot as usize];
            if record.is_some() {
                return Err(Error::Malformed(format!(
                    "two digest records for slot `{}`",
                    slot.name
                )));
            }
            *record = Some(*d);
        }
        let mut expected = Vec::with_capacity(self.table.len());
        for (id, record) in sender.iter().enumerate() {
            let slot = &self.table.slots()[id];
            let Some(record) = record else {
                return Err(Error::IncompleteSync(format!(
                    "no digest for slot `{}`",
                    slot.name
                )));
            };
            self.held.check_base(&self.table, id as u32, record.base)?;
            expected.push(record.new);
        }
        let Some(chunks) = write_frame(&self.table, &mut self.store, frame)? else {
            return Ok(None);
        };
        let table = &self.table;
        let mut failure = None;
        let mut next = self.held.digests().to_vec();
        for id in self.staging.iter().flat_map(Staging::dense_slots) {
            next[id] = 0;
        }
        let mut changed = 0u64;
        for c in &chunks {
            if failure.is_none() {
                if let Some(index) = c.noop {
                    let slot = &table.slots()[c.slot as usize].name;
                    failure = Some(Error::Malformed(format!(
                        "delta for slot `{slot}` sets element {index} to the value it already holds"
                    )));
                }
            }
            next[c.slot as usize] = next[c.slot as usize].wrapping_add(c.digest);
            changed += if c.all { c.range } else { c.rel.len() as u64 };
        }
        let Some(staging) = self.staging.as_mut() else {
            return Err(Error::IncompleteSync("no staged sync".into()));
        };
        if failure.is_none() {
            failure = (0..next.len()).find_map(|id| {
                let settled = staging
                    .pending
                    .settle(table, id as u32, next[id], expected[id]);
                settled.err()
            });
        }
        if let Some(err) = failure {
            // Undo: every written chunk gets its old bits back (`receive` then drops the
            // staging, the version held kept).
            write_back(&self.table, &mut self.store, &chunks);
            return Err(err);
        }
        let staging = self
            .staging
            .take()
            .ok_or_else(|| Error::IncompleteSync("no staged sync".into()))?;
        if let Err(e) = self.held.commit(&self.table, staging.pending) {
            write_back(&self.table, &mut self.store, &chunks);
            return Err(e);
        }
        Ok(Some(SyncOutcome {
            kind: frame.header.kind,
            version: frame.header.version,
            flushes: 1,
            changed,
            wire_bytes,
            state_digest: self.state_digest(),
        }))
    }

    /// Verifies a fully received sync and applies it: a staged one as `commit` writes it, one
    /// written in place only verified, and written back if it does not verify.
    fn finish_sync(&mut self, mut staging: Staging) -> Result<SyncOutcome> {
        if !staging.in_place {
            self.stage_verified(staging)?;
            return self.commit();
        }
        if let Err(e) = self.verify_staged(&mut staging) {
            self.undo_in_place(&staging.chunks);
            self.held.fail(staging.pending);
            return Err(e);
        }
        let kind = staging.outcome_kind();
        let Staging {
            pending,
            chunks,
            next_flush: flushes,
            wire_bytes,
            ..
        } = staging;
        // Held from here on (a refusal puts back what was written in place).
        let version = match self.held.commit(&self.table, pending) {
            Ok(version) => version,
            Err(e) => {
                self.undo_in_place(&chunks);
                return Err(e);
            }
        };
        Ok(SyncOutcome {
            kind,
            version,
            flushes,
            changed: chunks
                .iter()
                .map(|c| if c.all { c.range } else { c.rel.len() as u64 })
                .sum(),
            wire_bytes,
            state_digest: self.state_digest(),
        })
    }

    /// Settles the digests after a fully received sync, computed from the bits held before
    /// it (its chunks' digest changes were taken when they were decoded), once every check
    /// passed: a digest record per slot, a seed's every element, the base digests, no no-op,
    /// and the sender's new digests.
    fn verify_staged(&self, staging: &mut Staging) -> Result<()> {
        let sender = staging.sender_records(&self.table)?;

        // Digests after the sync, computed from the bits this receiver actually holds, before
        // anything is written.
        let new_digests: Vec<u64> = match staging.pending.kind() {
            FrameKind::Delta => {
                for rec in &sender {
                    self.held.check_base(&self.table, rec.slot, rec.base)?;
                }
                let mut next = self.held.digests().to_vec();
                for id in staging.dense_slots() {
                    next[id] = 0;
                }
                for c in &staging.chunks {
                    if let Some(index) = c.noop {
                        let slot = &self.table.slots()[c.slot as usize].name;
                        return Err(Error::Malformed(format!(
                            "delta for slot `{slot}` sets element {index} to the value it already holds"
                        )));
                    }
                    next[c.slot as usize] = next[c.slot as usize].wrapping_add(c.digest);
                }
                next
            }
            FrameKind::Seed => {
                let mut next = vec![0u64; self.table.len()];
                for c in &staging.chunks {
                    next[c.slot as usize] = next[c.slot as usize].wrapping_add(c.digest);
                }
                next
            }
            // A staged sync's kind is its family: seed, delta or verify.
            FrameKind::Verify | FrameKind::Close | FrameKind::Dense => {
                let actual: Vec<u64> = (0..self.table.len() as u32)
                    .into_par_iter()
                    .map(|id| {
                        digest_slot(
                            id,
                            self.table.slots()[id as usize].dtype.width(),
                            self.store.slot(id),
                        )
                    })
                    .collect();
                actual
            }
        };
        for (rec, &computed) in sender.iter().zip(&new_digests) {
            staging
                .pending
                .settle(&self.table, rec.slot, computed, rec.new)?;
        }
        Ok(())
    }
}

/// A frame is for this receiver's slot table, or refused before anything else is read.
pub(crate) fn check_table(frame: u64, table: &SlotTable) -> Result<()> {
    if frame != table.hash() {
        return Err(Error::SlotTableMismatch {
            frame,
            local: table.hash(),
        });
    }
    Ok(())
}
