//! Syncs laid out as the GPU sends them, built with the library's own writers: one frame per
//! stage of consecutive slots, each stage dense (every element, `all` + `raw`) or delta
//! (changed elements), carrying the digest records of its own slots and chunks of only those;
//! sections split at `values_start`, `flush_count` known in advance.

#![allow(dead_code)]

use std::ops::Range;

use deltacast::codec::{CodecChoice, PosCodec, ValCodec};
use deltacast::digest::digest_slot;
use deltacast::flush::{encode_changes, FlushConfig};
use deltacast::wire::{FrameKind, FrameWriter, SlotDigest};
use deltacast::SlotTable;

/// How one stage sends its slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Dense,
    Delta,
}

/// The elements of `base` and `next` (`width` bytes each) that differ: positions and bits.
pub fn diff(base: &[u8], next: &[u8], width: usize) -> (Vec<u64>, Vec<u8>, Vec<u8>) {
    let (mut positions, mut old, mut new) = (Vec::new(), Vec::new(), Vec::new());
    for (i, (a, b)) in base
        .chunks_exact(width)
        .zip(next.chunks_exact(width))
        .enumerate()
    {
        if a != b {
            positions.push(i as u64);
            old.extend_from_slice(a);
            new.extend_from_slice(b);
        }
    }
    (positions, old, new)
}

/// The frames of a delta sync to `version` from `base` to `next`, one per stage. Dense chunks
/// hold at most `chunk_elems` elements; delta chunks are cut on that grid and coded with
/// `codec`.
pub fn staged_sync(
    table: &SlotTable,
    version: u64,
    base: &[Vec<u8>],
    next: &[Vec<u8>],
    stages: &[(Range<usize>, Stage)],
    chunk_elems: u64,
    codec: CodecChoice,
) -> Vec<Vec<u8>> {
    staged_sync_aligned(table, version, base, next, stages, chunk_elems, codec, None)
}

/// [`staged_sync`] with the sections aligned to `align` = (positions, values) instead of the
/// GPU's (4, the stage's widest element): `(1, 1)` packs them at odd offsets.
#[allow(clippy::too_many_arguments)]
pub fn staged_sync_aligned(
    table: &SlotTable,
    version: u64,
    base: &[Vec<u8>],
    next: &[Vec<u8>],
    stages: &[(Range<usize>, Stage)],
    chunk_elems: u64,
    codec: CodecChoice,
    align: Option<(usize, usize)>,
) -> Vec<Vec<u8>> {
    let config = FlushConfig {
        // One frame per stage whatever its size.
        bucket_size: 1 << 40,
        chunk_elems,
        codec,
    };
    let count = stages.len() as u32;
    let mut frames = Vec::new();
    for (index, (slots, stage)) in stages.iter().enumerate() {
        let kind = match stage {
            Stage::Dense => FrameKind::Dense,
            Stage::Delta => FrameKind::Delta,
        };
        let widest = slots
            .clone()
            .map(|s| table.slots()[s].dtype.width())
            .max()
            .unwrap_or(1);
        let mut w = FrameWriter::new(kind, version, table.hash(), index as u32)
            .with_flush_count(count)
            .split_sections(align.map_or(4, |a| a.0), align.map_or(widest, |a| a.1));
        for s in slots.clone() {
            let info = &table.slots()[s];
            let width = info.dtype.width();
            let slot = s as u32;
            match stage {
                Stage::Dense => {
                    let mut start = 0;
                    while start < info.numel() {
                        let range = chunk_elems.min(info.numel() - start);
                        let bytes = &next[s][start as usize * width..][..range as usize * width];
                        w.push_chunk(
                            slot,
                            PosCodec::All,
                            ValCodec::Raw,
                            start,
                            range,
                            range,
                            &[],
                            bytes,
                        );
                        start += range;
                    }
                }
                Stage::Delta => {
                    let (positions, old, new) = diff(&base[s], &next[s], width);
                    encode_changes(
                        &config,
                        false,
                        slot,
                        info.numel(),
                        info.dtype,
                        &positions,
                        &old,
                        &new,
                        |c| {
                            w.push_chunk(
                                c.slot,
                                c.pos_codec,
                                c.val_codec,
                                c.start,
                                c.range,
                                c.count,
                                &c.positions,
                                &c.values,
                            );
                            Ok(())
                        },
                    )
                    .unwrap();
                }
            }
            w.push_digest(SlotDigest {
                slot,
                base: digest_slot(slot, width, &base[s]),
                new: digest_slot(slot, width, &next[s]),
            });
        }
        frames.push(w.finish(index + 1 == stages.len()));
    }
    frames
}
