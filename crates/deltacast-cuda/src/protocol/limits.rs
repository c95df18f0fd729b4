//! What a GPU receiver knows of its own slots and bounds every announced size by, and the
//! plan both sides derive the same way for each chunk's sections (the stages of a sync are
//! planned by the core's [`deltacast::plan::plan_stages`]).

use deltacast::codec::{PosCodec, ValCodec};

use super::{MAX_TRAINER_RANKS, MIN_CHUNK_ELEMS};
use crate::error::{CudaError, Result};

/// Items per block of the entropy codecs (docs/codecs.md).
const CODE_BLOCK: u64 = 1024;

/// What the receiver knows of its own slots, against which every announced size is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableLimits {
    pub hash: u64,
    pub num_slots: usize,
    pub total_elements: u64,
    pub total_bytes: u64,
    /// Per slot: (elements, width).
    pub slots: Vec<(u64, usize)>,
    /// Per slot: whether its dtype steps along the ordered-integer view (a float), which
    /// `steps` chunks need.
    pub steppable: Vec<bool>,
}

impl TableLimits {
    fn range(&self, slots: std::ops::Range<usize>) -> &[(u64, usize)] {
        self.slots.get(slots).unwrap_or(&[])
    }

    /// Elements of the slots `slots`.
    pub fn elements(&self, slots: std::ops::Range<usize>) -> u64 {
        self.range(slots).iter().map(|&(n, _)| n).sum()
    }

    /// Bytes of the slots `slots`.
    pub fn bytes(&self, slots: std::ops::Range<usize>) -> u64 {
        self.range(slots).iter().map(|&(n, w)| n * w as u64).sum()
    }

    /// Chunks of a delta over `slots` never exceed, per slot, one per [`MIN_CHUNK_ELEMS`]
    /// elements (senders use a grid at least that coarse) plus one more per shard border
    /// (a sharded sender's ranks each cut the grid cell their shards meet in), nor the
    /// slot's elements (chunks hold at least one change each, and do not overlap). This
    /// bounds the manifest.
    pub fn max_chunks(&self, slots: std::ops::Range<usize>) -> u64 {
        self.range(slots)
            .iter()
            .map(|&(n, _)| n.min(n.div_ceil(MIN_CHUNK_ELEMS) + MAX_TRAINER_RANKS - 1))
            .sum()
    }

    /// Positions of a delta never exceed one bitmap of every element or one u32 per element,
    /// whichever is larger, plus 8 bytes of padding per chunk (a sender takes gaps only where
    /// they are smaller than abs32).
    pub fn max_position_bytes(&self, slots: std::ops::Range<usize>, chunks: u64) -> u64 {
        let elems = self.elements(slots);
        (elems.saturating_mul(4)).saturating_add(chunks.saturating_mul(8))
    }

    /// Values of a delta never exceed its slots' bytes (ulp only where smaller than raw) plus
    /// 8 bytes of padding per chunk.
    pub fn max_value_bytes(&self, slots: std::ops::Range<usize>, chunks: u64) -> u64 {
        self.bytes(slots).saturating_add(chunks.saturating_mul(8))
    }
}

/// The lengths a section may have: (least, most) bytes.
pub(crate) fn section_bounds(positions: PosCodec, count: u64, range: u64) -> (u64, u64) {
    let blocks = count.div_ceil(CODE_BLOCK);
    match positions {
        PosCodec::All => (0, 0),
        PosCodec::Abs32 => (count * 4, count * 4),
        PosCodec::Bitmap => (range.div_ceil(8), range.div_ceil(8)),
        PosCodec::Steps => (range.div_ceil(4), range.div_ceil(4)),
        // A directory entry per block, then 1 to 48 bits per gap.
        PosCodec::Gaps => (
            7 * blocks + (count - blocks).div_ceil(8),
            7 * blocks + (count - blocks) * 6,
        ),
        // The gaps of the unchanged elements; none: an empty section.
        PosCodec::Holes if count >= range => (0, 0),
        PosCodec::Holes => section_bounds(PosCodec::Gaps, range - count, range),
        // Not decoded on the GPU: refused before any length is looked at.
        PosCodec::Context | PosCodec::ContextGaps => (u64::MAX, 0),
    }
}

pub(crate) fn value_bounds(values: ValCodec, count: u64, width: u64) -> (u64, u64) {
    let blocks = count.div_ceil(CODE_BLOCK);
    match values {
        ValCodec::Raw => (count * width, count * width),
        // The escaped changes' raw bits: none to all of them.
        ValCodec::Escaped => (0, count * width),
        // A directory entry per block, then 1 to (2·nb + 1) bits per value.
        ValCodec::Ulp => (
            4 * blocks + count.div_ceil(8),
            4 * blocks + (count * (16 * width + 1)).div_ceil(8),
        ),
        // Not decoded on the GPU: refused before any length is looked at.
        ValCodec::Context => (u64::MAX, 0),
    }
}

/// Checks the shards of one slot of `numel` elements as the trainer ranks hold them, in rank
/// order (`runs[r]` = (first element, elements) of rank r's shard): the non-empty ones must
/// follow each other with no gap or overlap, from element 0, and cover the slot exactly.
/// (Where an empty shard says it starts does not matter.)
pub fn check_shard_runs(name: &str, numel: u64, runs: &[(u64, u64)]) -> Result<()> {
    let bad = |why: String| Err(CudaError::InvalidArgument(why));
    let mut next = 0u64;
    for &(first, count) in runs {
        if count > 0 && first != next {
            return bad(format!(
                "the shards of `{name}` do not follow each other in rank order: {runs:?}"
            ));
        }
        next = next.saturating_add(count);
    }
    if next != numel {
        return bad(format!(
            "the shards of `{name}` hold {next} of its {numel} elements: {runs:?}"
        ));
    }
    Ok(())
}

/// The sections chosen for one chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkChoice {
    pub positions: PosCodec,
    pub values: ValCodec,
    pub position_len: u64,
    pub value_len: u64,
}

/// The smallest sections for a chunk of `count` changes over `range` elements of `width`
/// bytes: positions abs32, bitmap or (when sized, `entropy = Some((gaps, ulp))`) gaps; values
/// raw or ulp, ulp only with listed positions. Ties keep the simpler codec. Never larger than
/// abs32 + raw or bitmap + raw.
pub fn choose_sections(
    count: u64,
    range: u64,
    width: u64,
    entropy: Option<(u64, u64)>,
) -> ChunkChoice {
    let abs32 = count * 4;
    let bitmap = range.div_ceil(8);
    let raw = count * width;
    let (list, list_len) = match entropy {
        Some((gaps, _)) if gaps < abs32 => (PosCodec::Gaps, gaps),
        _ => (PosCodec::Abs32, abs32),
    };
    let (values, value_len) = match entropy {
        Some((_, ulp)) if ulp < raw => (ValCodec::Ulp, ulp),
        _ => (ValCodec::Raw, raw),
    };
    if bitmap + raw <= list_len + value_len {
        ChunkChoice {
            positions: PosCodec::Bitmap,
            values: ValCodec::Raw,
            position_len: bitmap,
            value_len: raw,
        }
    } else {
        ChunkChoice {
            positions: list,
            values,
            position_len: list_len,
            value_len,
        }
    }
}

/// The checks of a gather's arguments both trainer links make before anything moves: a
/// length per rank, a root among them, and (on the root) lengths whose sum fits `dst_len`.
#[cfg(feature = "cuda")]
pub(crate) fn check_gather(
    lens: &[u64],
    nranks: usize,
    rank: usize,
    root: usize,
    dst_len: u64,
) -> Result<()> {
    if lens.len() != nranks || root >= nranks {
        return Err(CudaError::InvalidArgument(format!(
            "gather: {} lengths and root {root} for {nranks} ranks",
            lens.len()
        )));
    }
    let total = lens.iter().try_fold(0u64, |a, &l| a.checked_add(l));
    if rank == root && total.is_none_or(|t| t > dst_len) {
        return Err(CudaError::InvalidArgument(format!(
            "gather: {lens:?} bytes do not fit the {dst_len} at the root"
        )));
    }
    Ok(())
}
