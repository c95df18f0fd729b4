//! A receiver that does not hold the state: it checks syncs and hands out what they change,
//! for an owner that keeps the bits elsewhere (an inference engine's own parameters, in its
//! own layout, one tensor-parallel share per rank).
//!
//! It runs the same checks as [`Receiver`](super::Receiver) (the one [`HeldState`] for
//! versions and digests, the same frame admission and chunk decoder), but reads the old bits
//! it needs from a [`HeldBits`] owner, every slot of a frame in one call, and keeps only the
//! decoded changes of the positions the owner holds: memory O(changes), never a copy of a
//! slot. Several such receivers may share one state (the ranks of a tensor-parallel group,
//! each holding part of every slot): each counts in its **part** of each slot's digest only
//! the elements the owner marks [`COUNTED`] (every element counted by exactly one member of
//! the group), the parts are summed across the group by the caller, and
//! [`settle`](ChangeReceiver::settle) compares the sums with the sender's digests. A sync
//! runs as:
//!
//! `receive` every frame → [`part`](ChangeReceiver::part) (summed over the group) →
//! `settle` → [`changes`](ChangeReceiver::changes) (written by the owner) → `commit`; or
//! `abort_sync` at any point (nothing is written before the owner writes the changes).

use crate::digest::{change, chunk_change, chunk_terms, element_hash, slot_salt};
use crate::dtype::load_bits;
use crate::error::CodecError;
use crate::error::{Error, Result};
use crate::held::{HeldState, Pending};
use crate::slot::SlotTable;
use crate::wire::{parse_frame, ChunkEntry, FrameKind, SlotDigest};

use rayon::prelude::*;

use super::chunks::{chunk_positions, chunk_values};
use super::{check_table, Staging, SyncOutcome};

/// The owner holds no copy of this element: its decoded value is dropped.
pub const NOT_HELD: u8 = 0;
/// The owner holds the element and will write it, but another member of its group counts it
/// in the digest (a replicated element).
pub const HELD: u8 = 1;
/// The owner holds the element and counts it in this receiver's part of the digest.
pub const COUNTED: u8 = 2;

/// Whoever holds the bits a [`ChangeReceiver`] checks syncs against.
pub trait HeldBits {
    /// The bits held at elements `positions` of `slot` (flat, row-major): one
    /// element of the slot's width per position into `old` (anything, e.g. zero, where none
    /// is held), and per position [`NOT_HELD`], [`HELD`] or [`COUNTED`] into `share`. Both
    /// are cleared first by the caller.
    fn read(
        &mut self,
        slot: u32,
        positions: &[u64],
        old: &mut Vec<u8>,
        share: &mut Vec<u8>,
    ) -> Result<()>;

    /// [`read`](HeldBits::read) of several `(slot, positions)` requests, appended to `old` and
    /// `share` in request order: every slot of a frame in one call, so an owner that pays per
    /// call (a device round trip) pays once per frame. By default one `read` per request.
    fn read_many(
        &mut self,
        requests: &[(u32, &[u64])],
        old: &mut Vec<u8>,
        share: &mut Vec<u8>,
    ) -> Result<()> {
        for &(slot, positions) in requests {
            self.read(slot, positions, old, share)?;
        }
        Ok(())
    }
}

/// The owner's bits of every element of chunk `e`'s range, for `ctx` positions (coded against
/// the old bits of the whole range): an owner that does not hold all of them cannot decode the
/// chunk (a sender to tensor-parallel shares must not choose `auto+ctx`).
fn read_whole_chunk<H: HeldBits>(
    table: &SlotTable,
    owner: &mut H,
    e: &ChunkEntry,
) -> Result<Vec<u8>> {
    let width = table.get(e.slot)?.dtype.width();
    // The range lies inside the slot (checked against the table by `parse_frame`).
    let positions: Vec<u64> = (e.start..e.start + e.range).collect();
    let (mut old, mut share) = (Vec::new(), Vec::new());
    owner.read(e.slot, &positions, &mut old, &mut share)?;
    if old.len() != positions.len() * width || share.len() != positions.len() {
        return Err(Error::InvalidArgument(format!(
            "the owner read {} bytes and {} shares for {} elements of {width} bytes",
            old.len(),
            share.len(),
            positions.len()
        )));
    }
    if share.contains(&NOT_HELD) {
        return Err(Error::Codec {
            slot: e.slot,
            start: e.start,
            source: CodecError::Unsupported {
                codec: "ctx",
                what: "positions at a receiver that does not hold the whole chunk",
            },
        });
    }
    Ok(old)
}

/// The changes of one chunk at the positions the owner holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChangeChunk {
    pub slot: u32,
    pub start: u64,
    /// Every element of `[start, start + count)` (then `rel` is empty), or those at
    /// `start + rel[k]`.
    pub all: bool,
    pub rel: Vec<u32>,
    /// The new bits, one element of the slot's width per position.
    pub values: Vec<u8>,
    /// The bits held before (read from the owner while staging): what undoes a write.
    pub old: Vec<u8>,
}

impl ChangeChunk {
    /// Positions it sets.
    pub fn len(&self, width: usize) -> usize {
        self.values.len() / width.max(1)
    }

    pub fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// The slot positions it sets, in order.
    pub fn positions(&self, width: usize) -> Vec<u64> {
        if self.all {
            (0..self.len(width) as u64)
                .map(|k| self.start + k)
                .collect()
        } else {
            self.rel.iter().map(|&p| self.start + p as u64).collect()
        }
    }
}

/// A sync received whole, waiting for the group's digest sums.
#[derive(Debug)]
struct Gathered {
    pending: Pending,
    sender: Vec<SlotDigest>,
    /// Per slot: sent whole by a dense frame (its digest is summed afresh).
    dense: Vec<bool>,
    part: Vec<u64>,
    done: Done,
}

/// What a sync did, kept until its commit.
#[derive(Debug)]
struct Done {
    chunks: Vec<ChangeChunk>,
    kind: FrameKind,
    flushes: u32,
    wire_bytes: u64,
}

/// A sync being received: the shared staging checks, the changes kept, the digest part.
#[derive(Debug)]
struct Receiving {
    staging: Staging,
    chunks: Vec<ChangeChunk>,
    part: Vec<u64>,
    /// The first delta element whose new bits equal the held ones (slot, index), reported
    /// after the base digests were checked (a wrong base shows as that).
    noop: Option<(u32, u64)>,
}

/// Checks syncs for an owner of the bits; see the module docs.
pub struct ChangeReceiver {
    table: SlotTable,
    held: HeldState,
    receiving: Option<Receiving>,
    gathered: Option<Gathered>,
    verified: Option<(Pending, Done)>,
}

/// How far a frame took the sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Progress {
    /// More frames of the sync follow.
    Partial,
    /// The last frame: [`ChangeReceiver::part`] awaits the group's sums.
    Complete,
    /// The sender closed between syncs; nothing changed.
    Closed,
}

impl ChangeReceiver {
    /// A receiver that holds no version: the first sync must be a seed.
    pub fn new(table: SlotTable) -> Self {
        let held = HeldState::none(&table);
        ChangeReceiver {
            table,
            held,
            receiving: None,
            gathered: None,
            verified: None,
        }
    }

    pub fn table(&self) -> &SlotTable {
        &self.table
    }

    pub fn version(&self) -> Option<u64> {
        self.held.version()
    }

    /// The digest of each slot over the whole group (the sender's, once a sync committed).
    pub fn digests(&self) -> &[u64] {
        self.held.digests()
    }

    pub fn state_digest(&self) -> u64 {
        self.held.state_digest()
    }

    pub fn is_staging(&self) -> bool {
        self.receiving.is_some()
    }

    /// The last frame arrived: [`part`](Self::part) waits for [`settle`](Self::settle).
    pub fn awaits_group(&self) -> bool {
        self.gathered.is_some()
    }

    /// The sync was settled: its [`changes`](Self::changes) wait for [`commit`](Self::commit).
    pub fn awaits_commit(&self) -> bool {
        self.verified.is_some()
    }

    /// Drops the sync under way (received in part, waiting for the group or for its commit):
    /// the version held stays.
    pub fn abort_sync(&mut self) {
        if let Some(r) = self.receiving.take() {
            self.held.fail(r.staging.pending);
        }
        if let Some(g) = self.gathered.take() {
            self.held.fail(g.pending);
        }
        if let Some((pending, _)) = self.verified.take() {
            self.held.fail(pending);
        }
    }

    /// The owner's bits are no longer the version held (a write that failed half way):
    /// drops any sync and holds nothing; only a seed may follow.
    pub fn lose(&mut self) {
        self.abort_sync();
        self.held.lose();
    }

    /// Takes one frame, reading the old bits of its chunks from `owner`. Any error drops the
    /// sync (nothing was written anywhere).
    pub fn receive<H: HeldBits>(&mut self, frame: &[u8], owner: &mut H) -> Result<Progress> {
        if self.gathered.is_some() || self.verified.is_some() {
            return Err(Error::InvalidArgument(
                "a received sync waits for settle, commit or abort_sync".into(),
            ));
        }
        let result = self.receive_inner(frame, owner);
        if result.is_err() {
            if let Some(r) = self.receiving.take() {
                self.held.fail(r.staging.pending);
            }
        }
        result
    }

    fn receive_inner<H: HeldBits>(&mut self, bytes: &[u8], owner: &mut H) -> Result<Progress> {
        let frame = parse_frame(bytes)?;
        let h = frame.header;
        check_table(h.table_hash, &self.table)?;
        if h.kind == FrameKind::Close {
            self.held.check_close(self.receiving.is_some())?;
            return Ok(Progress::Closed);
        }
        if h.flush_index == 0 {
            let pending = self.held.begin(h.kind, h.version)?;
            if let Some(r) = self.receiving.take() {
                self.held.fail(r.staging.pending);
            }
            self.receiving = Some(Receiving {
                staging: Staging::new(pending, h.flush_count, self.table.len(), false),
                chunks: Vec::new(),
                part: vec![0; self.table.len()],
                noop: None,
            });
        }
        let Some(r) = self.receiving.as_mut() else {
            return Err(Error::FlushOutOfOrder {
                version: h.version,
                expected: 0,
                got: h.flush_index,
            });
        };
        r.staging.admit(&self.table, &frame, bytes.len())?;
        // The `ctx` chunks' whole ranges first (their positions are coded against them), then
        // every chunk's positions, in parallel.
        let mut held: Vec<Option<Vec<u8>>> = Vec::with_capacity(frame.entries.len());
        for e in &frame.entries {
            held.push(if e.pos_codec.needs_held() {
                Some(read_whole_chunk(&self.table, owner, e)?)
            } else {
                None
            });
        }
        let table = &self.table;
        let mut decoded = frame
            .entries
            .par_iter()
            .zip(&held)
            .map(|(e, held)| chunk_positions(table, &frame, e, held.as_deref()))
            .collect::<Result<Vec<_>>>()?;
        drop(held);
        // Per slot of the frame, its chunks (in order) and their positions; then one read of
        // every slot's positions from the owner.
        let mut order: Vec<usize> = (0..frame.entries.len()).collect();
        order.sort_by_key(|&k| frame.entries[k].slot); // stable: chunk order kept per slot
        let mut groups: Vec<(u32, std::ops::Range<usize>, Vec<u64>)> = Vec::new();
        let mut at = 0;
        while at < order.len() {
            let slot = frame.entries[order[at]].slot;
            let end = at
                + order[at..]
                    .iter()
                    .take_while(|&&k| frame.entries[k].slot == slot)
                    .count();
            let mut positions = Vec::new();
            for &k in &order[at..end] {
                let (e, (rel, all)) = (&frame.entries[k], &decoded[k]);
                if *all {
                    positions.extend(e.start..e.start + e.count);
                } else {
                    positions.extend(rel.iter().map(|&p| e.start + p as u64));
                }
            }
            groups.push((slot, at..end, positions));
            at = end;
        }
        let requests: Vec<(u32, &[u64])> = groups
            .iter()
            .map(|(slot, _, positions)| (*slot, positions.as_slice()))
            .collect();
        let (mut old_all, mut share_all) = (Vec::new(), Vec::new());
        owner.read_many(&requests, &mut old_all, &mut share_all)?;
        let mut want = (0usize, 0usize);
        for (slot, _, positions) in &groups {
            want.0 += positions.len() * self.table.get(*slot)?.dtype.width();
            want.1 += positions.len();
        }
        if (old_all.len(), share_all.len()) != want {
            return Err(Error::InvalidArgument(format!(
                "the owner read {} bytes and {} shares for {} elements of {} bytes",
                old_all.len(),
                share_all.len(),
                want.1,
                want.0
            )));
        }
        // Each chunk's share of what was read, then the chunks decoded in parallel and kept in
        // order.
        let mut jobs = Vec::with_capacity(frame.entries.len());
        let (mut old_at, mut share_at) = (0usize, 0usize);
        for (slot, chunks, positions) in &groups {
            let width = self.table.get(*slot)?.dtype.width();
            let mut first = 0; // of this chunk in `positions`
            for &k in &order[chunks.clone()] {
                let count = frame.entries[k].count as usize;
                let (rel, all) = std::mem::take(&mut decoded[k]);
                jobs.push(ChunkJob {
                    entry: k,
                    width,
                    rel,
                    all,
                    old: old_at..old_at + count * width,
                    share: share_at..share_at + count,
                    idx: &positions[first..first + count],
                });
                first += count;
                (old_at, share_at) = (old_at + count * width, share_at + count);
            }
        }
        let delta = h.kind == FrameKind::Delta;
        let done = jobs
            .into_par_iter()
            .map(|j| {
                let e = &frame.entries[j.entry];
                let (old, share) = (&old_all[j.old], &share_all[j.share]);
                let values = chunk_values(&frame, e, j.width, old)?;
                let (part, noop) =
                    chunk_part(e, j.width, j.all, &j.rel, j.idx, old, &values, share, delta);
                let chunk = keep_held(e.slot, e.start, j.all, j.rel, values, old, share, j.width);
                Ok((part, noop, chunk))
            })
            .collect::<Result<Vec<_>>>()?;
        for (part, noop, chunk) in done {
            let slot = chunk.slot as usize;
            r.part[slot] = r.part[slot].wrapping_add(part);
            if r.noop.is_none() {
                r.noop = noop;
            }
            r.chunks.push(chunk);
        }
        r.staging.record_digests(&self.table, &frame)?;
        if !h.is_final {
            return Ok(Progress::Partial);
        }
        let r = self
            .receiving
            .take()
            .ok_or_else(|| Error::IncompleteSync("no staged sync".into()))?;
        match self.gather(r, owner) {
            Ok(g) => {
                self.gathered = Some(g);
                Ok(Progress::Complete)
            }
            Err((pending, e)) => {
                self.held.fail(pending);
                Err(e)
            }
        }
    }

    /// The checks of a sync received whole that need no other member of the group: every
    /// digest record, a seed's every element, the base digests, no no-op. A verify reads
    /// every element held to sum its part.
    fn gather<H: HeldBits>(
        &self,
        r: Receiving,
        owner: &mut H,
    ) -> std::result::Result<Gathered, (Pending, Error)> {
        let Receiving {
            staging,
            chunks,
            mut part,
            noop,
        } = r;
        let checks = || -> Result<Vec<SlotDigest>> {
            let sender = staging.sender_records(&self.table)?;
            match staging.pending.kind() {
                FrameKind::Delta => {
                    for rec in &sender {
                        self.held.check_base(&self.table, rec.slot, rec.base)?;
                    }
                    if let Some((slot, index)) = noop {
                        let slot = &self.table.slots()[slot as usize].name;
                        return Err(Error::Malformed(format!(
                            "delta for slot `{slot}` sets element {index} to the value it already holds"
                        )));
                    }
                }
                FrameKind::Verify => {}
                _ => {}
            }
            Ok(sender)
        };
        let sender = match checks() {
            Ok(s) => s,
            Err(e) => return Err((staging.pending, e)),
        };
        if staging.pending.kind() == FrameKind::Verify {
            if let Err(e) = self.verify_part(owner, &mut part) {
                return Err((staging.pending, e));
            }
        }
        let mut dense = vec![false; self.table.len()];
        for id in staging.dense_slots() {
            dense[id] = true;
        }
        let kind = staging.outcome_kind();
        Ok(Gathered {
            sender,
            dense,
            part,
            done: Done {
                chunks,
                kind,
                flushes: staging.next_flush,
                wire_bytes: staging.wire_bytes,
            },
            pending: staging.pending,
        })
    }

    /// A verify's part: the digest terms of every element the owner counts, read slot by slot.
    fn verify_part<H: HeldBits>(&self, owner: &mut H, part: &mut [u64]) -> Result<()> {
        let (mut old, mut share) = (Vec::new(), Vec::new());
        for (id, slot) in self.table.slots().iter().enumerate() {
            let count = usize::try_from(slot.numel())
                .map_err(|_| Error::InvalidArgument(format!("slot `{}` too large", slot.name)))?;
            let width = slot.dtype.width();
            old.clear();
            share.clear();
            let positions: Vec<u64> = (0..count as u64).collect();
            owner.read(id as u32, &positions, &mut old, &mut share)?;
            if old.len() != count * width || share.len() != count {
                return Err(Error::InvalidArgument(format!(
                    "the owner read {} bytes and {} shares for slot `{}`",
                    old.len(),
                    share.len(),
                    slot.name
                )));
            }
            let salt = slot_salt(id as u32);
            part[id] = share
                .iter()
                .enumerate()
                .filter(|(_, &s)| s == COUNTED)
                .fold(0u64, |sum, (k, _)| {
                    sum.wrapping_add(element_hash(salt, k as u64, load_bits(&old, width, k)))
                });
        }
        Ok(())
    }

    /// This member's part of each slot's digest change for the sync received whole (a
    /// delta's Σ h(new) − h(old), a seed's or dense slot's or verify's Σ h), over the
    /// elements it counts; `None` unless [`awaits_group`](Self::awaits_group).
    pub fn part(&self) -> Option<&[u64]> {
        self.gathered.as_ref().map(|g| g.part.as_slice())
    }

    /// Settles the sync with `group`, the sum (wrapping) over the group of every member's
    /// [`part`](Self::part): each slot's digest must come to the sender's. Refused, the sync
    /// is dropped (a failed verify drops the version held: the bits are not the sender's).
    pub fn settle(&mut self, group: &[u64]) -> Result<()> {
        let Some(mut g) = self.gathered.take() else {
            return Err(Error::InvalidArgument(
                "no received sync waits for settle".into(),
            ));
        };
        if group.len() != self.table.len() {
            let n = self.table.len();
            self.held.fail(g.pending);
            return Err(Error::InvalidArgument(format!(
                "{} digest sums for {n} slots",
                group.len()
            )));
        }
        let kind = g.pending.kind();
        let held = self.held.digests();
        let mut result = Ok(());
        for rec in &g.sender {
            let id = rec.slot as usize;
            let computed = match kind {
                FrameKind::Delta if !g.dense[id] => held[id].wrapping_add(group[id]),
                _ => group[id],
            };
            result = g.pending.settle(&self.table, rec.slot, computed, rec.new);
            if result.is_err() {
                break;
            }
        }
        match result {
            Ok(()) => {
                self.verified = Some((g.pending, g.done));
                Ok(())
            }
            Err(e) => {
                if kind == FrameKind::Verify {
                    self.held.lose();
                }
                self.held.fail(g.pending);
                Err(e)
            }
        }
    }

    /// The changes of the settled sync at the positions the owner holds, for it to write
    /// (empty unless [`awaits_commit`](Self::awaits_commit)).
    pub fn changes(&self) -> &[ChangeChunk] {
        self.verified
            .as_ref()
            .map_or(&[], |(_, d)| d.chunks.as_slice())
    }

    /// The owner wrote the [`changes`](Self::changes): the sync's version and digests are held.
    pub fn commit(&mut self) -> Result<SyncOutcome> {
        let (pending, done) = self
            .verified
            .take()
            .ok_or_else(|| Error::InvalidArgument("no settled sync waits for a commit".into()))?;
        let version = self.held.commit(&self.table, pending)?;
        let changed = done
            .chunks
            .iter()
            .map(|c| c.len(self.table.slots()[c.slot as usize].dtype.width()) as u64)
            .sum();
        Ok(SyncOutcome {
            kind: done.kind,
            version,
            flushes: done.flushes,
            changed,
            wire_bytes: done.wire_bytes,
            state_digest: self.state_digest(),
        })
    }
}

/// One chunk of a frame to decode: its entry, its positions and its part of the owner's read.
struct ChunkJob<'a> {
    entry: usize,
    width: usize,
    rel: Vec<u32>,
    all: bool,
    old: std::ops::Range<usize>,
    share: std::ops::Range<usize>,
    /// Its slot positions.
    idx: &'a [u64],
}

/// A chunk's term of this member's digest part (the elements it counts), and its first
/// element whose new bits equal the held ones, if a delta has one (slot, index).
#[allow(clippy::too_many_arguments)]
fn chunk_part(
    e: &ChunkEntry,
    width: usize,
    all: bool,
    rel: &[u32],
    idx: &[u64],
    old: &[u8],
    values: &[u8],
    share: &[u8],
    delta: bool,
) -> (u64, Option<(u32, u64)>) {
    let slot = e.slot;
    if share.iter().all(|&s| s == COUNTED) {
        // Every element counted here (TP 1, or a rank's own shard): the vectorized sums.
        let rel_of = (!all).then_some(rel);
        return if delta {
            let (sum, same) = chunk_change(slot, width, e.start, rel_of, old, values);
            (sum, same.map(|k| (slot, idx[k])))
        } else {
            (chunk_terms(slot, width, e.start, rel_of, values), None)
        };
    }
    let salt = slot_salt(slot);
    let (mut part, mut noop) = (0u64, None);
    for (k, &s) in share.iter().enumerate() {
        if s == NOT_HELD {
            continue;
        }
        let (o, n) = (load_bits(old, width, k), load_bits(values, width, k));
        if delta && o == n && noop.is_none() {
            noop = Some((slot, idx[k]));
        }
        if s == COUNTED {
            part = part.wrapping_add(if delta {
                change(salt, idx[k], o, n)
            } else {
                element_hash(salt, idx[k], n)
            });
        }
    }
    (part, noop)
}

/// A decoded chunk cut down to the positions the owner holds.
#[allow(clippy::too_many_arguments)]
fn keep_held(
    slot: u32,
    start: u64,
    all: bool,
    rel: Vec<u32>,
    values: Vec<u8>,
    old: &[u8],
    share: &[u8],
    width: usize,
) -> ChangeChunk {
    if share.iter().all(|&s| s != NOT_HELD) {
        return ChangeChunk {
            slot,
            start,
            all,
            rel,
            values,
            old: old.to_vec(),
        };
    }
    let mut kept = ChangeChunk {
        slot,
        start,
        all: false,
        rel: Vec::new(),
        values: Vec::new(),
        old: Vec::new(),
    };
    for (k, &s) in share.iter().enumerate() {
        if s == NOT_HELD {
            continue;
        }
        kept.rel.push(if all { k as u32 } else { rel[k] });
        kept.values
            .extend_from_slice(&values[k * width..(k + 1) * width]);
        kept.old.extend_from_slice(&old[k * width..(k + 1) * width]);
    }
    kept
}
