//! The receiver: verifies every flush, stages a whole sync, and applies it only when every
//! flush verified and the digests prove the result equals the sender's state. A delta of one
//! flush (chunks not overlapping) is instead applied while it is decoded, one visit per
//! element, and written back if the digests do not prove it. Either way a receiver is never
//! left between two versions when `receive` returns.

use rayon::prelude::*;

use crate::codec::{decode_positions, decode_values, PosCodec, ValCodec};
use crate::digest::{chunk_change, chunk_terms, digest_slot};
use crate::error::{Error, Result};
use crate::slot::SlotTable;
use crate::wire::{parse_frame, ChunkEntry, Frame, FrameKind, SlotDigest};

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

/// One decoded chunk waiting for the rest of its sync.
#[derive(Debug)]
struct StagedChunk {
    slot: u32,
    start: u64,
    /// Elements of the chunk's range (`[start, start + range)` holds every position).
    range: u64,
    /// Positions relative to `start`; empty when every element of the range is set (seed/all).
    rel: Vec<u32>,
    all: bool,
    /// New bit patterns, `width` bytes each.
    values: Vec<u8>,
    /// Computed while decoding, from the bits held then (a staged sync writes nothing before it
    /// completes, so they are the bits before the sync): for a delta, how the chunk moves its
    /// slot's digest; for a seed, the digest terms of its elements.
    digest: u64,
    /// A delta element whose new bits equal the held bits (slot index), reported by
    /// `finish_sync` after the base digests were checked (a wrong base shows as that).
    noop: Option<u64>,
    /// The bits held before, at the chunk's positions: kept only by the one-pass apply of a
    /// single-flush delta, which writes them back if the sync does not verify.
    old: Vec<u8>,
}

/// A sync being received.
#[derive(Debug)]
struct Staging {
    kind: FrameKind,
    version: u64,
    next_flush: u32,
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
}

/// What a completed sync did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyncOutcome {
    pub kind: FrameKind,
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
    version: Option<u64>,
    digests: Vec<u64>,
    staging: Option<Staging>,
    apply_as_received: bool,
}

impl Receiver<Vec<Vec<u8>>> {
    /// An empty receiver with zeroed buffers; it accepts only a seed.
    pub fn new(table: SlotTable) -> Self {
        let store = table
            .slots()
            .iter()
            .map(|s| vec![0u8; s.nbytes() as usize])
            .collect();
        // No state to prove yet: digests start meaningful at the first seed.
        let digests = vec![0; table.len()];
        Receiver {
            table,
            store,
            version: None,
            digests,
            staging: None,
            apply_as_received: false,
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
            version,
            digests,
            staging: None,
            apply_as_received: false,
        })
    }

    pub fn table(&self) -> &SlotTable {
        &self.table
    }

    /// The version this receiver holds (None before its first seed).
    pub fn version(&self) -> Option<u64> {
        self.version
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
        &self.digests
    }

    /// The combined digest acked to the sender: the sum of the slot digests.
    pub fn state_digest(&self) -> u64 {
        self.digests.iter().fold(0u64, |a, &d| a.wrapping_add(d))
    }

    /// Recomputes every slot's digest from memory and returns the slots whose bytes no longer
    /// match the running digest (weights changed behind the receiver's back).
    /// An unseeded receiver holds no state to check and reports none.
    pub fn recompute_digests(&self) -> Vec<u32> {
        if self.version.is_none() {
            return Vec::new();
        }
        (0..self.table.len() as u32)
            .into_par_iter()
            .filter(|&id| {
                digest_slot(
                    id,
                    self.table.slots()[id as usize].dtype.width(),
                    self.store.slot(id),
                ) != self.digests[id as usize]
            })
            .collect()
    }

    /// Whether a sync is half received.
    pub fn is_staging(&self) -> bool {
        self.staging.is_some()
    }

    /// Drops a half-received sync (e.g. after a lost connection). The state is as it was
    /// before the sync (flushes already written in place are written back).
    pub fn abort_sync(&mut self) {
        self.drop_staging();
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

    /// Drops the sync being received, writing back what it wrote in place.
    fn drop_staging(&mut self) {
        if let Some(staging) = self.staging.take() {
            if staging.in_place {
                self.undo_in_place(&staging.chunks);
            }
        }
    }

    /// Writes the old bits of chunks written in place back (chunks never overlap there).
    fn undo_in_place(&mut self, chunks: &[StagedChunk]) {
        write_back(&self.table, &mut self.store, chunks);
    }

    /// Takes one flush. Returns `Some` when it completed a sync that was verified and applied.
    /// Any error drops the whole staged sync and leaves the state as it was.
    pub fn receive(&mut self, frame: &[u8]) -> Result<Option<SyncOutcome>> {
        let result = self.receive_inner(frame);
        if result.is_err() {
            self.drop_staging();
        }
        result
    }

    fn receive_inner(&mut self, bytes: &[u8]) -> Result<Option<SyncOutcome>> {
        let frame = parse_frame(bytes)?;
        let h = frame.header;
        if h.table_hash != self.table.hash() {
            return Err(Error::SlotTableMismatch {
                frame: h.table_hash,
                local: self.table.hash(),
            });
        }
        if h.flush_index == 0 {
            match h.kind {
                FrameKind::Delta | FrameKind::Verify => {
                    let expected = if h.kind == FrameKind::Delta {
                        // No version follows u64::MAX (a seed may bring a receiver there).
                        self.version.and_then(|v| v.checked_add(1))
                    } else {
                        self.version
                    };
                    if expected != Some(h.version) {
                        return Err(Error::VersionMismatch {
                            current: self.version.unwrap_or(0),
                            got: h.version,
                            expected: expected.unwrap_or(0),
                        });
                    }
                }
                FrameKind::Seed => {}
            }
            // A new sync replaces one left half received (its in-place writes undone).
            self.drop_staging();
            self.staging = Some(Staging {
                kind: h.kind,
                version: h.version,
                next_flush: 0,
                chunks: Vec::new(),
                sender_digests: vec![None; self.table.len()],
                slot_count: vec![0; self.table.len()],
                wire_bytes: 0,
                in_place: self.apply_as_received && h.kind == FrameKind::Delta,
                written: vec![Vec::new(); self.table.len()],
            });
        }
        let Some(staging) = self.staging.as_mut() else {
            return Err(Error::FlushOutOfOrder {
                version: h.version,
                expected: 0,
                got: h.flush_index,
            });
        };
        if staging.version != h.version
            || staging.kind != h.kind
            || staging.next_flush != h.flush_index
        {
            return Err(Error::FlushOutOfOrder {
                version: staging.version,
                expected: staging.next_flush,
                got: h.flush_index,
            });
        }
        staging.next_flush += 1;
        staging.wire_bytes += bytes.len() as u64;

        // Structural checks in order, then decode the chunks in parallel.
        for e in &frame.entries {
            let slot = self.table.get(e.slot)?;
            let end = e.start + e.range; // no overflow: checked by parse_frame
            if end > slot.numel() {
                return Err(Error::Malformed(format!(
                    "chunk [{}, {end}) lies beyond slot `{}` of {} elements",
                    e.start,
                    slot.name,
                    slot.numel()
                )));
            }
            let staged = &mut staging.slot_count[e.slot as usize];
            *staged += e.count;
            if *staged > slot.numel() {
                return Err(Error::Malformed(format!(
                    "sync carries more than {} elements for slot `{}`",
                    slot.numel(),
                    slot.name
                )));
            }
        }
        if h.flush_index == 0 && h.is_final && staging.kind == FrameKind::Delta {
            // The whole sync is this one verified flush: apply it in one pass, undo on failure.
            let wire_bytes = staging.wire_bytes;
            if let Some(outcome) = self.apply_single_delta(&frame, wire_bytes)? {
                self.staging = None;
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
        let kind = staging.kind;
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
        for d in &frame.digests {
            let slot = self.table.get(d.slot)?;
            let record = &mut staging.sender_digests[d.slot as usize];
            if record.is_some() {
                return Err(Error::Malformed(format!(
                    "two digest records for slot `{}`",
                    slot.name
                )));
            }
            *record = Some(*d);
        }
        if !h.is_final {
            return Ok(None);
        }
        let staging = self
            .staging
            .take()
            .ok_or_else(|| Error::IncompleteSync("no staged sync".into()))?;
        self.finish_sync(staging).map(Some)
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

    /// A delta sync of a single flush (already checksummed and checked for structure):
    /// decodes and applies it in one pass over the held state, chunk by chunk in parallel,
    /// keeping each chunk's old bits; then checks no-ops and digests and, if anything fails,
    /// writes the old bits back, so the state ends as it was. Reading the held bits and writing
    /// the new ones in the same visit saves the second pass over the state that staging needs.
    /// `None`, before anything is written, when the store cannot lend all slots at once or two
    /// chunks' ranges overlap (the caller then stages as usual).
    fn apply_single_delta(
        &mut self,
        frame: &Frame<'_>,
        wire_bytes: u64,
    ) -> Result<Option<SyncOutcome>> {
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
            if record.base != self.digests[id] {
                return Err(Error::BaseDigestMismatch {
                    slot: slot.name.clone(),
                    expected: record.base,
                    actual: self.digests[id],
                });
            }
            expected.push(record.new);
        }
        let Some(chunks) = write_frame(&self.table, &mut self.store, frame)? else {
            return Ok(None);
        };
        let table = &self.table;
        let mut failure = None;
        let mut next = self.digests.clone();
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
        if failure.is_none() {
            if let Some(id) = (0..next.len()).find(|&id| next[id] != expected[id]) {
                failure = Some(Error::DigestMismatch {
                    slot: table.slots()[id].name.clone(),
                    expected: expected[id],
                    actual: next[id],
                });
            }
        }
        if let Some(err) = failure {
            // Undo: every written chunk gets its old bits back.
            write_back(&self.table, &mut self.store, &chunks);
            return Err(err);
        }
        self.digests = next;
        self.version = Some(frame.header.version);
        Ok(Some(SyncOutcome {
            kind: FrameKind::Delta,
            version: frame.header.version,
            flushes: 1,
            changed,
            wire_bytes,
            state_digest: self.state_digest(),
        }))
    }

    /// Verifies a fully received sync and applies it (a sync written in place is only
    /// verified, and written back if it does not verify).
    fn finish_sync(&mut self, staging: Staging) -> Result<SyncOutcome> {
        let new_digests = match self.verify_staged(&staging) {
            Ok(digests) => digests,
            Err(e) => {
                if staging.in_place {
                    self.undo_in_place(&staging.chunks);
                }
                return Err(e);
            }
        };
        let changed = if staging.in_place {
            staging
                .chunks
                .iter()
                .map(|c| if c.all { c.range } else { c.rel.len() as u64 })
                .sum()
        } else {
            apply_chunks(&self.table, &mut self.store, &staging.chunks)
        };
        self.digests = new_digests;
        self.version = Some(staging.version);
        Ok(SyncOutcome {
            kind: staging.kind,
            version: staging.version,
            flushes: staging.next_flush,
            changed,
            wire_bytes: staging.wire_bytes,
            state_digest: self.state_digest(),
        })
    }

    /// The digests after a fully received sync, computed from the bits held before it (its
    /// chunks' digest changes were taken when they were decoded), once every check passed:
    /// a digest record per slot, a seed's every element, the base digests, no no-op, and the
    /// sender's new digests.
    fn verify_staged(&self, staging: &Staging) -> Result<Vec<u64>> {
        let mut sender = Vec::with_capacity(self.table.len());
        for (id, record) in staging.sender_digests.iter().enumerate() {
            let slot = &self.table.slots()[id];
            let Some(record) = record else {
                return Err(Error::IncompleteSync(format!(
                    "no digest for slot `{}`",
                    slot.name
                )));
            };
            if staging.kind == FrameKind::Seed && staging.slot_count[id] != slot.numel() {
                return Err(Error::IncompleteSync(format!(
                    "seed carries {} of {} elements of slot `{}`",
                    staging.slot_count[id],
                    slot.numel(),
                    slot.name
                )));
            }
            sender.push(*record);
        }

        // Digests after the sync, computed from the bits this receiver actually holds, before
        // anything is written.
        let new_digests: Vec<u64> = match staging.kind {
            FrameKind::Delta => {
                for (id, rec) in sender.iter().enumerate() {
                    if rec.base != self.digests[id] {
                        return Err(Error::BaseDigestMismatch {
                            slot: self.table.slots()[id].name.clone(),
                            expected: rec.base,
                            actual: self.digests[id],
                        });
                    }
                }
                let mut next = self.digests.clone();
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
            FrameKind::Verify => {
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
        for (id, rec) in sender.iter().enumerate() {
            if rec.new != new_digests[id] {
                return Err(Error::DigestMismatch {
                    slot: self.table.slots()[id].name.clone(),
                    expected: rec.new,
                    actual: new_digests[id],
                });
            }
        }
        Ok(new_digests)
    }
}

/// Decodes one manifest entry against the receiver's current state.
/// `held` is the chunk's range of its slot as the receiver holds it; `keep_old` keeps the bits
/// read there (at the chunk's positions) in the result.
fn decode_entry(
    table: &SlotTable,
    held: &[u8],
    frame: &Frame<'_>,
    e: &ChunkEntry,
    kind: FrameKind,
    keep_old: bool,
) -> Result<StagedChunk> {
    let slot = table.get(e.slot)?;
    let width = slot.dtype.width();
    let codec_err = |source| Error::Codec {
        slot: e.slot,
        start: e.start,
        source,
    };
    // `count` ≤ `range` ≤ u32::MAX (parse_frame); a section can only yield that many items.
    let range = e.range as u32;
    let count = e.count as u32;
    let all = e.pos_codec == PosCodec::All;
    // Refuse a count the value section cannot hold before decoding positions: `all` and
    // `holes` positions take no bytes per position, so a tiny frame could otherwise make the
    // receiver allocate 4 bytes per element of the range. Raw values are exactly `width` bytes
    // each; an ulp code word is at least one bit.
    match e.val_codec {
        ValCodec::Raw if e.val_len != count as u64 * width as u64 => {
            return Err(codec_err(crate::error::CodecError::Malformed {
                codec: "raw",
                reason: format!(
                    "section has {} bytes, {count} values need {}",
                    e.val_len,
                    count as u64 * width as u64
                ),
            }));
        }
        ValCodec::Ulp if e.val_len.saturating_mul(8) < count as u64 => {
            return Err(codec_err(crate::error::CodecError::Truncated {
                needed: (count as u64).div_ceil(8),
                available: e.val_len,
            }));
        }
        _ => {}
    }
    let mut rel = Vec::new();
    if all {
        // Every element of the range: nothing to expand (a seed's `all` chunks would otherwise
        // materialize one u32 per element).
        if count != range {
            return Err(codec_err(crate::error::CodecError::Malformed {
                codec: "all",
                reason: format!("count {count} differs from range {range}"),
            }));
        }
        let input = frame.positions(e);
        if !input.is_empty() {
            return Err(codec_err(crate::error::CodecError::TrailingBytes {
                count: count as u64,
                extra: input.len() as u64,
            }));
        }
    } else {
        decode_positions(e.pos_codec, frame.positions(e), count, range, &mut rel)
            .map_err(codec_err)?;
    }
    let positions = (!all).then_some(rel.as_slice());
    // The held bits at the chunk's positions: what ulp steps start from and what a delta's
    // digest change subtracts. One pass over the held state, whose cache lines are the cost.
    let held_old = |old: &mut Vec<u8>| gather(width, held, positions, count as usize, old);
    let mut old = Vec::new();
    let values = match e.val_codec {
        // Length checked above.
        ValCodec::Raw => frame.values(e).to_vec(),
        codec => {
            held_old(&mut old);
            let mut values = Vec::new();
            decode_values(codec, width, frame.values(e), &old, &mut values).map_err(codec_err)?;
            values
        }
    };
    let (digest, noop) = match kind {
        FrameKind::Delta => {
            if old.len() != values.len() {
                held_old(&mut old);
            }
            let (sum, noop) = chunk_change(e.slot, width, e.start, positions, &old, &values);
            let noop = noop.map(|k| e.start + positions.map_or(k as u64, |rel| rel[k] as u64));
            (sum, noop)
        }
        FrameKind::Seed => (
            chunk_terms(e.slot, width, e.start, positions, &values),
            None,
        ),
        // Verify frames carry no entries (parse_frame).
        FrameKind::Verify => (0, None),
    };
    if !keep_old {
        old = Vec::new();
    }
    Ok(StagedChunk {
        slot: e.slot,
        start: e.start,
        range: e.range,
        rel,
        all,
        values,
        digest,
        noop,
        old,
    })
}

/// The bytes of chunk `e`'s range in its slot `held` (inside the slot: checked against the
/// table before decoding).
fn chunk_bytes<'h>(held: &'h [u8], width: usize, e: &ChunkEntry) -> &'h [u8] {
    let at = e.start as usize * width;
    &held[at..at + e.range as usize * width]
}

/// The `width`-byte elements of `held` (a chunk's range) at `positions` (every element when
/// `None`, then `count` of them) into `out`.
fn gather(width: usize, held: &[u8], positions: Option<&[u32]>, count: usize, out: &mut Vec<u8>) {
    fn at<const W: usize>(held: &[u8], rel: &[u32], out: &mut Vec<u8>) {
        let held = held.as_chunks::<W>().0;
        out.resize(rel.len() * W, 0);
        for (o, &p) in out.as_chunks_mut::<W>().0.iter_mut().zip(rel) {
            *o = held[p as usize];
        }
    }
    out.clear();
    match (positions, width) {
        (None, _) => out.extend_from_slice(&held[..count * width]),
        (Some(rel), 1) => at::<1>(held, rel, out),
        (Some(rel), 2) => at::<2>(held, rel, out),
        (Some(rel), _) => at::<4>(held, rel, out),
    }
}

/// Decodes a delta frame's chunks against the bits held and writes each at once, one part per
/// chunk in parallel, keeping each chunk's old bits (the one-pass apply, for a single-flush
/// delta and for flushes applied as received). `None`, before anything is written, when the
/// store cannot lend all slots at once or two chunks' ranges overlap (staging computes every
/// digest change from the bits before the sync, which is what refuses an element sent twice,
/// wire-format.md; applied in turn they would not). A decoding error leaves its part
/// untouched, writes back what the other parts wrote, and is returned.
fn write_frame<S: SlotStore>(
    table: &SlotTable,
    store: &mut S,
    frame: &Frame<'_>,
) -> Result<Option<Vec<StagedChunk>>> {
    let Some(slots) = store.slots_mut() else {
        return Ok(None);
    };
    let mut by_slot: Vec<Vec<&ChunkEntry>> = vec![Vec::new(); table.len()];
    for e in &frame.entries {
        by_slot[e.slot as usize].push(e);
    }
    let mut jobs: Vec<SlotPart<'_, &ChunkEntry>> = Vec::new();
    for ((dst, list), slot) in slots.into_iter().zip(&mut by_slot).zip(table.slots()) {
        split_parts(dst, slot.dtype.width(), list, &mut jobs);
    }
    if jobs.iter().any(|job| job.items.len() > 1) {
        return Ok(None);
    }
    let mut results: Vec<(Vec<StagedChunk>, Option<Error>)> = jobs
        .par_iter_mut()
        .map(|job| {
            let mut done = Vec::with_capacity(job.items.len());
            for e in &job.items {
                let at = (e.start - job.first) as usize * job.width;
                let held = &job.part[at..at + e.range as usize * job.width];
                match decode_entry(table, held, frame, e, FrameKind::Delta, true) {
                    Ok(c) => {
                        write_chunk(job.part, job.width, job.first, &c, &c.values);
                        done.push(c);
                    }
                    Err(err) => return (done, Some(err)),
                }
            }
            (done, None)
        })
        .collect();
    if let Some(err) = results.iter_mut().find_map(|(_, e)| e.take()) {
        jobs.par_iter_mut()
            .zip(&results)
            .for_each(|(job, (done, _))| {
                for c in done.iter().rev() {
                    write_chunk(job.part, job.width, job.first, c, &c.old);
                }
            });
        return Err(err);
    }
    Ok(Some(
        results.into_iter().flat_map(|(done, _)| done).collect(),
    ))
}

/// Writes the old bits of chunks written in place back (such chunks never overlap).
fn write_back<S: SlotStore>(table: &SlotTable, store: &mut S, chunks: &[StagedChunk]) {
    let mut by_slot: Vec<Vec<&StagedChunk>> = vec![Vec::new(); table.len()];
    for c in chunks {
        by_slot[c.slot as usize].push(c);
    }
    let Some(slots) = store.slots_mut() else {
        // Chunks are only written in place into stores that lend all slots at once.
        return;
    };
    let mut jobs = Vec::new();
    for ((dst, list), slot) in slots.into_iter().zip(&mut by_slot).zip(table.slots()) {
        split_parts(dst, slot.dtype.width(), list, &mut jobs);
    }
    jobs.into_par_iter().for_each(|p| {
        for c in p.items.iter().rev() {
            write_chunk(p.part, p.width, p.first, c, &c.old);
        }
    });
}

/// Applies verified chunks: every slot's chunks in parallel, each into its own disjoint part
/// of the slot (chunks whose ranges overlap, which a sharded sender may produce, go into one
/// part, in order). Returns the number of elements written.
fn apply_chunks<S: SlotStore>(table: &SlotTable, store: &mut S, chunks: &[StagedChunk]) -> u64 {
    let mut by_slot: Vec<Vec<&StagedChunk>> = vec![Vec::new(); table.len()];
    for c in chunks {
        by_slot[c.slot as usize].push(c);
    }
    let changed = chunks
        .iter()
        .map(|c| if c.all { c.range } else { c.rel.len() as u64 })
        .sum();
    let widths: Vec<usize> = table.slots().iter().map(|s| s.dtype.width()).collect();
    if let Some(slots) = store.slots_mut() {
        let mut jobs = Vec::new();
        for ((dst, list), width) in slots.into_iter().zip(&mut by_slot).zip(&widths) {
            split_parts(dst, *width, list, &mut jobs);
        }
        jobs.into_par_iter().for_each(apply_part);
    } else {
        for (id, list) in by_slot.iter_mut().enumerate() {
            if list.is_empty() {
                continue;
            }
            let mut jobs = Vec::new();
            split_parts(store.slot_mut(id as u32), widths[id], list, &mut jobs);
            jobs.into_par_iter().for_each(apply_part);
        }
    }
    changed
}

/// One unit of parallel apply: a part of a slot starting at element `first`, its element
/// width, and the chunks (staged, or a frame's entries) that lie inside it, in start order.
struct SlotPart<'a, T> {
    part: &'a mut [u8],
    width: usize,
    first: u64,
    items: Vec<T>,
}

/// A chunk's `[start, start + range)` in its slot.
trait Span {
    fn span(&self) -> (u64, u64);
}

impl Span for &StagedChunk {
    fn span(&self) -> (u64, u64) {
        (self.start, self.range)
    }
}

impl Span for &ChunkEntry {
    fn span(&self) -> (u64, u64) {
        (self.start, self.range)
    }
}

/// Cuts `dst` (a whole slot) into disjoint parts, one per group of chunks with overlapping
/// ranges (`list` is sorted by start here).
fn split_parts<'a, T: Span + Copy>(
    mut dst: &'a mut [u8],
    width: usize,
    list: &mut [T],
    parts: &mut Vec<SlotPart<'a, T>>,
) {
    list.sort_by_key(|c| c.span().0);
    let mut consumed = 0u64; // elements of the slot before `dst`
    let mut i = 0;
    while i < list.len() {
        let (first, range) = list[i].span();
        let mut end = first + range;
        let mut j = i + 1;
        while j < list.len() && list[j].span().0 < end {
            let (start, range) = list[j].span();
            end = end.max(start + range);
            j += 1;
        }
        // Chunk ranges lie inside the slot (checked when received), and groups are ascending.
        let rest = std::mem::take(&mut dst);
        let (_, rest) = rest.split_at_mut((first - consumed) as usize * width);
        let (part, rest) = rest.split_at_mut((end - first) as usize * width);
        dst = rest;
        consumed = end;
        parts.push(SlotPart {
            part,
            width,
            first,
            items: list[i..j].to_vec(),
        });
        i = j;
    }
}

fn apply_part(p: SlotPart<'_, &StagedChunk>) {
    for c in p.items {
        write_chunk(p.part, p.width, p.first, c, &c.values);
    }
}

/// Writes `values` (a chunk's new bits, or its old bits to undo it) at chunk `c`'s positions
/// of `part`, a part of the slot starting at element `first`.
fn write_chunk(part: &mut [u8], width: usize, first: u64, c: &StagedChunk, values: &[u8]) {
    fn scatter<const W: usize>(dst: &mut [u8], rel: &[u32], values: &[u8]) {
        let dst = dst.as_chunks_mut::<W>().0;
        for (&p, v) in rel.iter().zip(values.as_chunks::<W>().0) {
            dst[p as usize] = *v;
        }
    }
    let at = (c.start - first) as usize * width;
    if c.all {
        part[at..at + values.len()].copy_from_slice(values);
        return;
    }
    let dst = &mut part[at..at + c.range as usize * width];
    match width {
        1 => scatter::<1>(dst, &c.rel, values),
        2 => scatter::<2>(dst, &c.rel, values),
        _ => scatter::<4>(dst, &c.rel, values),
    }
}
