//! The chunk level of the receiver: decoding a manifest entry against the bits held, and
//! writing decoded chunks into a store in parallel (disjoint parts of each slot), keeping the
//! bits they replace so that a sync that does not verify can be written back.

use rayon::prelude::*;

use super::SlotStore;
use crate::codec::{
    check_pair, decode_positions_held, decode_steps_values, decode_values, steps_counts, PosCodec,
    ValCodec,
};
use crate::digest::{chunk_change, chunk_terms};
use crate::error::{Error, Result};
use crate::slot::SlotTable;
use crate::wire::{ChunkEntry, Frame, FrameKind};

/// One decoded chunk waiting for the rest of its sync.
#[derive(Debug)]
pub(super) struct StagedChunk {
    pub(super) slot: u32,
    pub(super) start: u64,
    /// Elements of the chunk's range (`[start, start + range)` holds every position).
    pub(super) range: u64,
    /// Positions relative to `start`; empty when every element of the range is set (seed/all).
    pub(super) rel: Vec<u32>,
    pub(super) all: bool,
    /// New bit patterns, `width` bytes each.
    pub(super) values: Vec<u8>,
    /// Computed while decoding, from the bits held then (a staged sync writes nothing before it
    /// completes, so they are the bits before the sync): for a delta chunk, how it moves its
    /// slot's digest; for a seed or dense chunk, the digest terms of its elements.
    pub(super) digest: u64,
    /// A delta element whose new bits equal the held bits (slot index), reported by
    /// `finish_sync` after the base digests were checked (a wrong base shows as that).
    pub(super) noop: Option<u64>,
    /// The bits held before, at the chunk's positions: kept only by the one-pass apply of a
    /// single-flush delta, which writes them back if the sync does not verify.
    pub(super) old: Vec<u8>,
}

/// Decodes the positions of manifest entry `e`, relative to its start (empty when every
/// element of its range is set: `all`), after checking that its value section can hold its
/// count. Returns them and whether the chunk is `all`. `held` is the receiver's bits of the
/// chunk's whole range, which `ctx` positions are decoded against (a receiver that does not
/// hold them passes `None` and gets a codec error for such a chunk).
pub(super) fn chunk_positions(
    table: &SlotTable,
    frame: &Frame<'_>,
    e: &ChunkEntry,
    held: Option<&[u8]>,
) -> Result<(Vec<u32>, bool)> {
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
    // The pair against the slot's dtype (the frame's parse checked the pair alone).
    check_pair(e.pos_codec, e.val_codec, Some(slot.dtype)).map_err(codec_err)?;
    // Refuse a count the value section cannot hold before decoding positions: `all` and
    // `holes` positions take no bytes per position, so a tiny frame could otherwise make the
    // receiver allocate 4 bytes per element of the range. Raw values are exactly `width` bytes
    // each; an ulp code word is at least one bit; `esc` values are exactly the escapes the
    // `steps` map marks, `width` bytes each (the map's length checked before it is counted).
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
        // A range-coded value may take less than a bit, but a stream has at least 4 bytes.
        // (What it may expand to is bounded by the chunk range the receiver holds.)
        ValCodec::Context if count > 0 && e.val_len < 4 => {
            return Err(codec_err(crate::error::CodecError::Truncated {
                needed: 4,
                available: e.val_len,
            }));
        }
        ValCodec::Escaped => {
            let (_, escapes) = steps_counts(frame.positions(e), range).map_err(codec_err)?;
            let needed = escapes * width as u64;
            if e.val_len != needed {
                return Err(codec_err(crate::error::CodecError::Malformed {
                    codec: "esc",
                    reason: format!(
                        "section has {} bytes, the map's {escapes} escapes need {needed}",
                        e.val_len
                    ),
                }));
            }
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
        decode_positions_held(
            e.pos_codec,
            frame.positions(e),
            count,
            range,
            width,
            held.unwrap_or(&[]),
            &mut rel,
        )
        .map_err(codec_err)?;
    }
    Ok((rel, all))
}

/// Decodes the new values of entry `e` (`width`-byte elements): raw ones as they are, ulp
/// steps (and `steps` map codes) applied to `old`, the bits held at the chunk's positions
/// (the step decoding itself does not depend on them, so a receiver that holds only some
/// positions may pass anything at the others and ignore what they decode to).
pub(super) fn chunk_values(
    frame: &Frame<'_>,
    e: &ChunkEntry,
    width: usize,
    old: &[u8],
) -> Result<Vec<u8>> {
    match e.val_codec {
        // Length checked by `chunk_positions`.
        ValCodec::Raw => Ok(frame.values(e).to_vec()),
        // The escapes and the map's steps (`check_pair`: the positions are a `steps` map).
        ValCodec::Escaped => {
            let mut values = Vec::new();
            decode_steps_values(
                width,
                frame.positions(e),
                e.range as u32,
                frame.values(e),
                old,
                &mut values,
            )
            .map_err(|source| Error::Codec {
                slot: e.slot,
                start: e.start,
                source,
            })?;
            Ok(values)
        }
        codec => {
            let mut values = Vec::new();
            decode_values(codec, width, frame.values(e), old, &mut values).map_err(|source| {
                Error::Codec {
                    slot: e.slot,
                    start: e.start,
                    source,
                }
            })?;
            Ok(values)
        }
    }
}

/// Decodes one manifest entry against the receiver's current state.
/// `held` is the chunk's range of its slot as the receiver holds it; `keep_old` keeps the bits
/// read there (at the chunk's positions) in the result.
pub(super) fn decode_entry(
    table: &SlotTable,
    held: &[u8],
    frame: &Frame<'_>,
    e: &ChunkEntry,
    kind: FrameKind,
    keep_old: bool,
) -> Result<StagedChunk> {
    let width = table.get(e.slot)?.dtype.width();
    let count = e.count as u32;
    let (rel, all) = chunk_positions(table, frame, e, Some(held))?;
    let positions = (!all).then_some(rel.as_slice());
    // The held bits at the chunk's positions: what ulp steps start from and what a delta's
    // digest change subtracts. One pass over the held state, whose cache lines are the cost.
    let held_old = |old: &mut Vec<u8>| gather(width, held, positions, count as usize, old);
    let mut old = Vec::new();
    if e.val_codec != ValCodec::Raw {
        held_old(&mut old);
    }
    let values = chunk_values(frame, e, width, &old)?;
    let (digest, noop) = match kind {
        FrameKind::Delta => {
            if old.len() != values.len() {
                held_old(&mut old);
            }
            let (sum, noop) = chunk_change(e.slot, width, e.start, positions, &old, &values);
            let noop = noop.map(|k| e.start + positions.map_or(k as u64, |rel| rel[k] as u64));
            (sum, noop)
        }
        // A dense chunk may resend a held value: no no-op rule, and its slot's digest is
        // summed afresh (its cover is exact, checked before decoding).
        FrameKind::Seed | FrameKind::Dense => (
            chunk_terms(e.slot, width, e.start, positions, &values),
            None,
        ),
        // Verify and close frames carry no entries (parse_frame).
        FrameKind::Verify | FrameKind::Close => (0, None),
    };
    if !keep_old {
        old = Vec::new();
    } else if old.len() != values.len() {
        held_old(&mut old);
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
pub(super) fn chunk_bytes<'h>(held: &'h [u8], width: usize, e: &ChunkEntry) -> &'h [u8] {
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

/// Decodes a delta or dense frame's chunks against the bits held and writes each at once, one
/// part per chunk in parallel, keeping each chunk's old bits (the one-pass apply, for a
/// single-flush sync and for flushes applied as received). `None`, before anything is written, when the
/// store cannot lend all slots at once or two chunks' ranges overlap (staging computes every
/// digest change from the bits before the sync, which is what refuses an element sent twice,
/// wire-format.md; applied in turn they would not). A decoding error leaves its part
/// untouched, writes back what the other parts wrote, and is returned.
pub(super) fn write_frame<S: SlotStore>(
    table: &SlotTable,
    store: &mut S,
    frame: &Frame<'_>,
) -> Result<Option<Vec<StagedChunk>>> {
    let kind = frame.header.kind;
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
                match decode_entry(table, held, frame, e, kind, true) {
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
pub(super) fn write_back<S: SlotStore>(table: &SlotTable, store: &mut S, chunks: &[StagedChunk]) {
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
pub(super) fn apply_chunks<S: SlotStore>(
    table: &SlotTable,
    store: &mut S,
    chunks: &[StagedChunk],
) -> u64 {
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
