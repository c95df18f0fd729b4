//! A stage's changes as chunks, shared by both senders: [`plan_chunks`] forms the chunks of
//! a diff's output and chooses each one's sections (sizes only, so that the caller can still
//! choose to send the stage whole), [`write_chunks`] writes the chosen sections.

use super::Growable;
use crate::error::Result;
use deltacast::codec::{PosCodec, ValCodec};
use deltacast::wire::ChunkEntry;

use crate::protocol::{choose_sections, ChunkChoice};
use crate::{
    ApplyPositions, CodeChunk, CodePlace, CodeScratch, CodeValues, DevicePtr, DiffResult,
    EncodeInput, Gpu, GridChunk, MapCode, MapDiff,
};

/// Where a diff wrote a stage's changes.
#[derive(Debug, Clone, Copy)]
pub(super) struct StageChanges<'a> {
    pub diff: &'a DiffResult,
    /// u64 slot indices.
    pub positions: DevicePtr,
    pub new_values: DevicePtr,
    /// The old bits: set when the entropy codecs size the chunks.
    pub old_values: Option<DevicePtr>,
}

/// One diffed tensor of a stage, in the order of the diff's inputs.
#[derive(Debug, Clone, Copy)]
pub(super) struct StageTensor {
    pub slot: u32,
    /// Slot index of its element 0 (0 unless it is a shard).
    pub first_index: u64,
    pub numel: u64,
    pub width: usize,
}

/// A stage's chunks with their sections chosen and placed, nothing written yet.
pub(super) struct ChunkPlan {
    /// The chunk records, offsets relative to the stage's packed position and value regions.
    pub records: Vec<ChunkEntry>,
    /// Bytes of the packed position sections (each section 4-aligned).
    pub position_bytes: u64,
    /// Bytes of the value sections: packed (entropy), else the end of the last chunk's
    /// values in the diff's own value buffer, which is sent as it is.
    pub value_bytes: u64,
    grid: Vec<GridChunk>,
    code_chunks: Vec<CodeChunk>,
    /// Per chunk: its grid index, choice and position offset.
    placed: Vec<(usize, ChunkChoice, u64)>,
}

/// Forms the chunks of a stage's changes (the core's grid of `chunk_elems`, tightened to
/// the changes) and sizes every section; with the entropy codecs, each chunk is sized
/// exactly in gaps and ulp on the GPU and the smallest pair is kept.
///
/// # Safety
/// `changes` must hold what `changes.diff` says was written, for `tensors` in order.
pub(super) unsafe fn plan_chunks(
    gpu: &Gpu,
    code_scratch: &mut CodeScratch,
    changes: &StageChanges,
    tensors: &[StageTensor],
    chunk_elems: u64,
) -> Result<ChunkPlan> {
    let diff = changes.diff;
    let encode: Vec<EncodeInput> = tensors
        .iter()
        .zip(&diff.tensors)
        .map(|(t, r)| EncodeInput {
            change_offset: r.offset,
            change_count: r.written,
            first_index: t.first_index,
            numel: t.numel,
        })
        .collect();
    // Counting run: the chunks, no sections yet.
    // SAFETY: positions hold every change written by the diff.
    let grid =
        unsafe { gpu.encode_positions(changes.positions, &encode, chunk_elems, None, None)? };
    let code_chunks: Vec<CodeChunk> = match changes.old_values {
        Some(old) => grid
            .iter()
            .map(|g| {
                let r = &diff.tensors[g.input];
                let w = tensors[g.input].width;
                let at = r.value_offset + (g.lo - r.offset) * w as u64;
                CodeChunk {
                    positions: changes.positions + g.lo * 8,
                    new_bits: changes.new_values + at,
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
    let entropy = changes.old_values.is_some();
    // (Sized even when there are no chunks: `write_chunks` writes what was sized last.)
    let sizes = if entropy {
        // SAFETY: the positions and both value buffers hold every chunk's changes.
        unsafe { gpu.entropy_size(code_scratch, &code_chunks)? }
    } else {
        Vec::new()
    };
    let mut records = Vec::with_capacity(grid.len());
    let mut placed = Vec::with_capacity(grid.len());
    let mut position_bytes = 0u64;
    let mut value_bytes = 0u64;
    for (i, g) in grid.iter().enumerate() {
        let r = &diff.tensors[g.input];
        let t = &tensors[g.input];
        let w = t.width as u64;
        let choice = choose_sections(g.count, g.range, w, sizes.get(i).map(|s| (s.gaps, s.ulp)));
        // Bitmaps are written as whole u32 words; every section starts 4-aligned.
        let room = match choice.positions {
            PosCodec::Bitmap => g.range.div_ceil(32) * 4,
            _ => choice.position_len.next_multiple_of(4),
        };
        let value_offset = if entropy {
            let at = value_bytes;
            value_bytes += choice.value_len.next_multiple_of(4);
            at
        } else {
            // The diff's output is sent as it is: each chunk's values are already there.
            let at = r.value_offset + (g.lo - r.offset) * w;
            value_bytes = value_bytes.max(at + choice.value_len);
            at
        };
        placed.push((i, choice, position_bytes));
        records.push(ChunkEntry {
            slot: t.slot,
            pos_codec: choice.positions,
            val_codec: choice.values,
            start: g.start,
            range: g.range,
            count: g.count,
            pos_offset: position_bytes,
            pos_len: choice.position_len,
            val_offset: value_offset,
            val_len: choice.value_len,
        });
        position_bytes += room;
    }
    Ok(ChunkPlan {
        records,
        position_bytes,
        value_bytes,
        grid,
        code_chunks,
        placed,
    })
}

/// Writes the planned sections: positions into `packed`, values into `packed_values` (the
/// entropy codecs; otherwise the diff's value buffer is the value section). Each buffer gets
/// `pad_to`-byte multiples of room, the padding zeroed. Returns the position and value
/// buffers to send.
///
/// # Safety
/// As [`plan_chunks`], with the same `changes`.
pub(super) unsafe fn write_chunks(
    gpu: &Gpu,
    code_scratch: &mut CodeScratch,
    changes: &StageChanges,
    plan: &ChunkPlan,
    packed: &mut Growable,
    packed_values: &mut Growable,
    pad_to: u64,
) -> Result<(DevicePtr, DevicePtr)> {
    let pos_room = plan.position_bytes.next_multiple_of(pad_to);
    let pptr = packed.at_least(gpu, pos_room)?;
    let entropy = changes.old_values.is_some();
    let vptr = if entropy {
        let value_room = plan.value_bytes.next_multiple_of(pad_to);
        let pv = packed_values.at_least(gpu, value_room)?;
        // SAFETY: our buffers, at least this long; the entropy writer ORs into zeros.
        unsafe {
            gpu.memset(pptr, 0, pos_room as usize)?;
            gpu.memset(pv, 0, value_room as usize)?;
        }
        pv
    } else {
        if pos_room > plan.position_bytes {
            // SAFETY: our buffer; the padding after the last section.
            unsafe {
                gpu.memset(
                    pptr + plan.position_bytes,
                    0,
                    (pos_room - plan.position_bytes) as usize,
                )?
            };
        }
        changes.new_values
    };
    let listed: Vec<_> = plan
        .placed
        .iter()
        .filter_map(|&(i, c, off)| {
            let codec = match c.positions {
                PosCodec::Abs32 => ApplyPositions::Abs32,
                PosCodec::Bitmap => ApplyPositions::Bitmap,
                _ => return None,
            };
            Some((plan.grid[i], codec, pptr + off))
        })
        .collect();
    // SAFETY: positions hold every chunk's changes; each destination is a disjoint, 4-aligned
    // run of `packed` with room for its section in whole words.
    unsafe { gpu.encode_place(changes.positions, &listed)? };
    if entropy {
        let places: Vec<CodePlace> = plan
            .placed
            .iter()
            .zip(&plan.records)
            .map(|(&(_, c, off), r)| CodePlace {
                gaps: (c.positions == PosCodec::Gaps).then_some(pptr + off),
                values: Some((
                    match c.values {
                        ValCodec::Ulp => CodeValues::Ulp,
                        ValCodec::Raw | ValCodec::Context | ValCodec::Escaped => CodeValues::Raw,
                    },
                    vptr + r.val_offset,
                )),
            })
            .collect();
        // SAFETY: as entropy_size; destinations zeroed above, disjoint, 4-aligned, with room
        // for each section in whole words.
        unsafe { gpu.entropy_write(code_scratch, &plan.code_chunks, &places)? };
    }
    Ok((pptr, vptr))
}

/// A map diff's chunks: one per cell with changes, its map section where the diff wrote it
/// in the map region and its escapes where the diff compacted them in the value region, so
/// that both regions go as they are. steps + esc (docs/codecs.md, "steps + esc"), or bitmap +
/// raw (every change escaped). Returns the records and the bytes of each region they use.
pub(super) fn map_chunks(diff: &MapDiff, tensors: &[StageTensor]) -> (Vec<ChunkEntry>, u64, u64) {
    let (pos_codec, val_codec) = match diff.code {
        MapCode::Steps => (PosCodec::Steps, ValCodec::Escaped),
        MapCode::Bitmap => (PosCodec::Bitmap, ValCodec::Raw),
    };
    let bits = diff.code.bits();
    let mut records = Vec::new();
    let (mut pos_end, mut val_end) = (0u64, 0u64);
    for (t, r) in tensors.iter().zip(&diff.tensors) {
        let w = t.width as u64;
        let mut g = r.escape0;
        for (c, cell) in r.cells.iter().enumerate() {
            let start = c as u64 * diff.cell_elems;
            let range = diff.cell_elems.min(t.numel - start);
            let escapes = cell.escapes as u64;
            if cell.changes > 0 {
                // Cells are whole diff tiles: each starts on a whole byte of the map.
                let pos_offset = r.map_offset + start * bits / 8;
                let pos_len = (range * bits).div_ceil(8);
                records.push(ChunkEntry {
                    slot: t.slot,
                    pos_codec,
                    val_codec,
                    start: t.first_index + start,
                    range,
                    count: cell.changes as u64,
                    pos_offset,
                    pos_len,
                    val_offset: g * w,
                    val_len: escapes * w,
                });
                pos_end = pos_end.max(pos_offset + pos_len);
                val_end = val_end.max((g + escapes) * w);
            }
            g += escapes;
        }
    }
    (records, pos_end.next_multiple_of(4), val_end)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{map_layout, DiffInput, MapCell, MapTensorResult};
    use deltacast::codec::{decode_positions, decode_steps_values, decode_values};
    use deltacast::dtype::{load_bits, to_ordered};
    use deltacast_testkit::Rng;

    /// The code of one element, from docs/codecs.md ("steps + esc").
    fn code(old: u32, new: u32, width: usize) -> u8 {
        let all = if width == 4 {
            u32::MAX
        } else {
            (1 << (8 * width)) - 1
        };
        let d = to_ordered(new, width).wrapping_sub(to_ordered(old, width)) & all;
        match (old == new, d) {
            (true, _) => 0,
            (_, 1) => 1,
            (_, d) if d == all => 2,
            _ => 3,
        }
    }

    #[test]
    fn map_chunks_name_the_sections_a_steps_diff_writes() {
        map_chunks_name_the_sections(MapCode::Steps, 0x57e9);
    }

    #[test]
    fn map_chunks_name_the_sections_a_bitmap_diff_writes() {
        map_chunks_name_the_sections(MapCode::Bitmap, 0xb17a);
    }

    /// What dc_diff_steps / dc_diff_bitmap leave for a stage of tensors of every width (not
    /// in width order): each tensor's codes in the map region at its `map_layout` offset, the
    /// escapes compacted tensor after tensor in width order (change g at g * width), the
    /// cells' counts. The chunks must name exactly those sections, and the core decode them
    /// to the new bits.
    fn map_chunks_name_the_sections(map_code: MapCode, seed: u64) {
        let mut rng = Rng(seed);
        let cell = 16_384u64;
        let shapes = [
            (40_000u64, 2usize),
            (5u64, 4),
            (70_001u64, 1),
            (16_384u64, 2),
            (33u64, 4),
        ];
        let tensors: Vec<StageTensor> = shapes
            .iter()
            .enumerate()
            .map(|(i, &(numel, width))| StageTensor {
                slot: 3 + i as u32,
                first_index: 0,
                numel,
                width,
            })
            .collect();
        let inputs: Vec<DiffInput> = tensors
            .iter()
            .map(|t| DiffInput {
                snapshot: 0,
                current: 0,
                numel: t.numel,
                width: t.width,
                first_index: 0,
                digest: None,
                f32_source: None,
            })
            .collect();
        let (map_offsets, map_len) = map_layout(&inputs, map_code);
        let mut map = vec![0u8; map_len as usize];
        let (mut olds, mut news) = (vec![], vec![]);
        let mut codes: Vec<Vec<u8>> = vec![];
        for t in &tensors {
            let mask = if t.width == 4 {
                u32::MAX
            } else {
                (1 << (8 * t.width)) - 1
            };
            let old: Vec<u32> = (0..t.numel).map(|_| rng.next_u64() as u32 & mask).collect();
            let new: Vec<u32> = old
                .iter()
                .map(|&o| match rng.below(8) {
                    0 => o.wrapping_add(1) & mask,
                    1 => o.wrapping_sub(1) & mask,
                    2 => rng.next_u64() as u32 & mask,
                    _ => o,
                })
                .collect();
            codes.push(
                old.iter()
                    .zip(&new)
                    .map(|(&o, &n)| match map_code {
                        MapCode::Steps => code(o, n, t.width),
                        // Changed: 3, "escaped" (its bits are the raw values).
                        MapCode::Bitmap => 3 * u8::from(o != n),
                    })
                    .collect(),
            );
            olds.push(old);
            news.push(new);
        }
        // The escapes in the diff's order: tensors by width (stably), elements in order.
        let mut order: Vec<usize> = (0..tensors.len()).collect();
        order.sort_by_key(|&i| tensors[i].width);
        let mut escapes = vec![0u8; 4 * tensors.iter().map(|t| t.numel as usize).sum::<usize>()];
        let mut results = vec![MapTensorResult::default(); tensors.len()];
        let mut g = 0u64;
        for &i in &order {
            let (t, c) = (&tensors[i], &codes[i]);
            let escape0 = g;
            for (e, &k) in c.iter().enumerate() {
                let e64 = e as u64;
                match map_code {
                    MapCode::Steps => {
                        map[(map_offsets[i] + e64 / 4) as usize] |= k << (2 * (e % 4))
                    }
                    MapCode::Bitmap => {
                        map[(map_offsets[i] + e64 / 8) as usize] |= u8::from(k != 0) << (e % 8)
                    }
                }
                if k == 3 {
                    let w = t.width;
                    let bytes = news[i][e].to_le_bytes();
                    escapes[g as usize * w..(g as usize + 1) * w].copy_from_slice(&bytes[..w]);
                    g += 1;
                }
            }
            let cells = c
                .chunks(cell as usize)
                .map(|part| MapCell {
                    changes: part.iter().filter(|&&k| k != 0).count() as u32,
                    escapes: part.iter().filter(|&&k| k == 3).count() as u32,
                })
                .collect();
            results[i] = MapTensorResult {
                map_offset: map_offsets[i],
                changes: c.iter().filter(|&&k| k != 0).count() as u64,
                escape0,
                cells,
            };
        }
        let diff = MapDiff {
            code: map_code,
            found: results.iter().map(|r| r.changes).sum(),
            escapes: g,
            tensors: results,
            cell_elems: cell,
            kernel_ms: 0.0,
        };
        let (records, pos_bytes, val_bytes) = map_chunks(&diff, &tensors);
        assert!(pos_bytes <= map_len && pos_bytes % 4 == 0);
        let mut seen: Vec<Vec<bool>> = tensors
            .iter()
            .map(|t| vec![false; t.numel as usize])
            .collect();
        for r in &records {
            let i = (r.slot - 3) as usize;
            let w = tensors[i].width;
            let codecs = match map_code {
                MapCode::Steps => (PosCodec::Steps, ValCodec::Escaped),
                MapCode::Bitmap => (PosCodec::Bitmap, ValCodec::Raw),
            };
            assert_eq!((r.pos_codec, r.val_codec), codecs);
            assert!(
                r.pos_offset % 4 == 0 && r.val_offset % w as u64 == 0,
                "{r:?}"
            );
            assert!(r.pos_offset + r.pos_len <= pos_bytes && r.val_offset + r.val_len <= val_bytes);
            let sec = &map[r.pos_offset as usize..(r.pos_offset + r.pos_len) as usize];
            let esc = &escapes[r.val_offset as usize..(r.val_offset + r.val_len) as usize];
            let mut rel = Vec::new();
            decode_positions(r.pos_codec, sec, r.count as u32, r.range as u32, &mut rel)
                .unwrap_or_else(|e| panic!("{r:?}: {e}"));
            let old: Vec<u8> = rel
                .iter()
                .flat_map(|&p| olds[i][(r.start + p as u64) as usize].to_le_bytes()[..w].to_vec())
                .collect();
            let mut got = Vec::new();
            match map_code {
                MapCode::Steps => decode_steps_values(w, sec, r.range as u32, esc, &old, &mut got),
                MapCode::Bitmap => decode_values(r.val_codec, w, esc, &old, &mut got),
            }
            .unwrap_or_else(|e| panic!("{r:?}: {e}"));
            for (k, &p) in rel.iter().enumerate() {
                let e = (r.start + p as u64) as usize;
                assert_eq!(
                    load_bits(&got, w, k),
                    news[i][e],
                    "slot {} element {e}",
                    r.slot
                );
                assert!(!seen[i][e], "element {e} of slot {} twice", r.slot);
                seen[i][e] = true;
            }
        }
        for (i, c) in codes.iter().enumerate() {
            for (e, &k) in c.iter().enumerate() {
                assert_eq!(seen[i][e], k != 0, "slot {} element {e}", tensors[i].slot);
            }
        }
    }
}
