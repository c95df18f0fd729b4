//! The receiver: verifies every flush, stages a whole sync, and applies it only when every
//! flush verified and the digests prove the result equals the sender's state. A receiver is
//! never left between two versions.

use rayon::prelude::*;

use crate::codec::{decode_positions, decode_values, PosCodec, ValCodec};
use crate::digest::{change, digest_range, digest_slot, element_hash, slot_salt};
use crate::dtype::{load_bits, store_bits};
use crate::error::{Error, Result};
use crate::slot::SlotTable;
use crate::wire::{parse_frame, ChunkEntry, Frame, FrameKind, SlotDigest};

/// Where a receiver keeps its slots' bytes: owned buffers, or borrowed tensors (bindings).
pub trait SlotStore: Sync {
    fn slot(&self, id: u32) -> &[u8];
    fn slot_mut(&mut self, id: u32) -> &mut [u8];
}

impl SlotStore for Vec<Vec<u8>> {
    fn slot(&self, id: u32) -> &[u8] {
        &self[id as usize]
    }

    fn slot_mut(&mut self, id: u32) -> &mut [u8] {
        &mut self[id as usize]
    }
}

/// One decoded chunk waiting for the rest of its sync.
#[derive(Debug)]
struct StagedChunk {
    slot: u32,
    start: u64,
    /// Positions relative to `start`; empty when every element of the range is set (seed/all).
    rel: Vec<u32>,
    all: bool,
    /// New bit patterns, `width` bytes each.
    values: Vec<u8>,
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

    /// Drops a half-received sync (e.g. after a lost connection). The state is untouched.
    pub fn abort_sync(&mut self) {
        self.staging = None;
    }

    /// Takes one flush. Returns `Some` when it completed a sync that was verified and applied.
    /// Any error drops the whole staged sync and leaves the state as it was.
    pub fn receive(&mut self, frame: &[u8]) -> Result<Option<SyncOutcome>> {
        let result = self.receive_inner(frame);
        if result.is_err() {
            self.staging = None;
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
            self.staging = Some(Staging {
                kind: h.kind,
                version: h.version,
                next_flush: 0,
                chunks: Vec::new(),
                sender_digests: vec![None; self.table.len()],
                slot_count: vec![0; self.table.len()],
                wire_bytes: 0,
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
        let store = &self.store;
        let table = &self.table;
        let decoded: Vec<Result<StagedChunk>> = frame
            .entries
            .par_iter()
            .map(|e| decode_entry(table, store, &frame, e))
            .collect();
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

    /// Verifies a fully staged sync and applies it.
    fn finish_sync(&mut self, staging: Staging) -> Result<SyncOutcome> {
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
                let deltas: Vec<Result<(u32, u64)>> = staging
                    .chunks
                    .par_iter()
                    .map(|c| Ok((c.slot, self.chunk_digest_change(c)?)))
                    .collect();
                for delta in deltas {
                    let (slot, d) = delta?;
                    next[slot as usize] = next[slot as usize].wrapping_add(d);
                }
                next
            }
            FrameKind::Seed => {
                let mut next = vec![0u64; self.table.len()];
                let parts: Vec<(u32, u64)> = staging
                    .chunks
                    .par_iter()
                    .map(|c| (c.slot, self.chunk_seed_digest(c)))
                    .collect();
                for (slot, d) in parts {
                    next[slot as usize] = next[slot as usize].wrapping_add(d);
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

        // Everything verified: apply.
        let mut changed = 0u64;
        for c in &staging.chunks {
            let width = self.table.slots()[c.slot as usize].dtype.width();
            let dst = self.store.slot_mut(c.slot);
            if c.all {
                let at = c.start as usize * width;
                dst[at..at + c.values.len()].copy_from_slice(&c.values);
                changed += (c.values.len() / width) as u64;
            } else {
                let base = c.start as usize;
                for (k, &p) in c.rel.iter().enumerate() {
                    store_bits(
                        dst,
                        width,
                        base + p as usize,
                        load_bits(&c.values, width, k),
                    );
                }
                changed += c.rel.len() as u64;
            }
        }
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

    /// How a delta chunk moves its slot's digest, from the old bits held here. A delta element
    /// whose new bits equal the held bits is refused: the sender never sends one, and refusing it
    /// makes a position sent twice always change the digest (so overlapping chunks are caught).
    fn chunk_digest_change(&self, c: &StagedChunk) -> Result<u64> {
        let width = self.table.slots()[c.slot as usize].dtype.width();
        let salt = slot_salt(c.slot);
        let held = self.store.slot(c.slot);
        let mut sum = 0u64;
        let n = c.values.len() / width;
        for k in 0..n {
            let index = c.start + if c.all { k as u64 } else { c.rel[k] as u64 };
            let old = load_bits(held, width, index as usize);
            let new = load_bits(&c.values, width, k);
            if old == new {
                let slot = &self.table.slots()[c.slot as usize].name;
                return Err(Error::Malformed(format!(
                    "delta for slot `{slot}` sets element {index} to the value it already holds"
                )));
            }
            sum = sum.wrapping_add(change(salt, index, old, new));
        }
        Ok(sum)
    }

    /// The digest terms of a seed chunk (independent of what the receiver held).
    fn chunk_seed_digest(&self, c: &StagedChunk) -> u64 {
        let width = self.table.slots()[c.slot as usize].dtype.width();
        if c.all {
            return digest_range(c.slot, width, &c.values, c.start);
        }
        let salt = slot_salt(c.slot);
        c.rel.iter().enumerate().fold(0u64, |sum, (k, &p)| {
            sum.wrapping_add(element_hash(
                salt,
                c.start + p as u64,
                load_bits(&c.values, width, k),
            ))
        })
    }
}

/// Decodes one manifest entry against the receiver's current state.
fn decode_entry<S: SlotStore>(
    table: &SlotTable,
    store: &S,
    frame: &Frame<'_>,
    e: &ChunkEntry,
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
    if !all {
        decode_positions(e.pos_codec, frame.positions(e), count, range, &mut rel)
            .map_err(codec_err)?;
    } else {
        decode_positions(PosCodec::All, frame.positions(e), count, range, &mut rel)
            .map_err(codec_err)?;
        rel = Vec::new();
    }
    let mut values = Vec::new();
    match e.val_codec {
        // Length checked above.
        ValCodec::Raw => values.extend_from_slice(frame.values(e)),
        codec => {
            let held = store.slot(e.slot);
            let mut old = Vec::with_capacity(count as usize * width);
            if all {
                let at = e.start as usize * width;
                old.extend_from_slice(&held[at..at + count as usize * width]);
            } else {
                for &p in &rel {
                    let at = (e.start as usize + p as usize) * width;
                    old.extend_from_slice(&held[at..at + width]);
                }
            }
            decode_values(codec, width, frame.values(e), &old, &mut values).map_err(codec_err)?;
        }
    }
    Ok(StagedChunk {
        slot: e.slot,
        start: e.start,
        rel,
        all,
        values,
    })
}
