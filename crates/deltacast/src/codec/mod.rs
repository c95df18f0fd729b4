//! Position and value codecs for one chunk.
//!
//! A chunk is a bounded run of elements `[start, start + range)` of one slot, with `count`
//! changes at sorted positions relative to `start` (so they always fit a u32, whatever the
//! slot size). Positions and values are coded independently, each into its own section; the
//! encoder picks the cheapest pair per chunk by exact size ([`encode_chunk`]).
//!
//! Every decoder validates everything it reads and returns a [`CodecError`], never panics and
//! never allocates more than the manifest's count allows (the count itself is bounded by the
//! chunk range and by the section length before a decoder sees it).

mod abs32;
mod bitmap;
mod bits;
mod context;
#[cfg(test)]
mod context_trace_tests;
mod gaps;
mod raw;
mod steps;
#[cfg(test)]
mod trace_tests;
mod ulp;

use crate::dtype::DType;
use crate::error::CodecError;

/// How the positions of a chunk are coded. The discriminant is the wire code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PosCodec {
    /// Every element of the range changed (seeds, or fully dense chunks): no position bytes.
    All = 0,
    /// Little-endian u32 per position (what the reference system ships).
    Abs32 = 1,
    /// Entropy-coded gaps in independently decodable blocks.
    Gaps = 2,
    /// One bit per element of the range.
    Bitmap = 3,
    /// `gaps` of the elements that did NOT change: for dense chunks, so positions never cost
    /// more than the values they spare.
    Holes = 4,
    /// The change mask range coded with probabilities conditioned on each element's old bits:
    /// decoding needs the receiver's bits of the whole chunk range ([`decode_positions_held`]).
    Context = 5,
    /// A 2-bit code per element of the range (unchanged, step +1, step −1, escaped): fixed
    /// width, so GPU kernels stream it. Only with [`ValCodec::Escaped`] values ([`check_pair`]).
    Steps = 6,
    /// The changes as gaps inside classes of the old exponent, each class's gaps Golomb coded
    /// with adaptive quotients: `ctx`'s gain at a cost per change, not per element. Decoding
    /// needs the receiver's bits of the whole chunk range, as `Context`.
    ContextGaps = 7,
}

/// How the new values of a chunk are coded. The discriminant is the wire code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValCodec {
    /// The new bit patterns, little-endian, `width` bytes each.
    Raw = 0,
    /// Signed distance old → new in the ordered-integer view, entropy coded with an escape.
    Ulp = 1,
    /// The same distance range coded with probabilities conditioned on the old value's sign
    /// and exponent.
    Context = 2,
    /// The new bits of the changes that `steps` positions mark escaped, raw; the other
    /// changes are ±1 steps the map itself carries. Only with [`PosCodec::Steps`].
    Escaped = 3,
}

impl PosCodec {
    pub const ALL: [PosCodec; 8] = [
        PosCodec::All,
        PosCodec::Abs32,
        PosCodec::Gaps,
        PosCodec::Bitmap,
        PosCodec::Holes,
        PosCodec::Context,
        PosCodec::Steps,
        PosCodec::ContextGaps,
    ];

    pub fn from_code(code: u8) -> Option<Self> {
        PosCodec::ALL.into_iter().find(|c| *c as u8 == code)
    }

    pub fn name(self) -> &'static str {
        match self {
            PosCodec::All => "all",
            PosCodec::Abs32 => "abs32",
            PosCodec::Gaps => "gaps",
            PosCodec::Bitmap => "bitmap",
            PosCodec::Holes => "holes",
            PosCodec::Context => "ctx",
            PosCodec::Steps => "steps",
            PosCodec::ContextGaps => "ctxgaps",
        }
    }

    /// Whether decoding needs the receiver's bits of the chunk's whole range (the context
    /// codecs): only a receiver that holds every element of the chunk can decode these.
    pub fn needs_held(self) -> bool {
        matches!(self, PosCodec::Context | PosCodec::ContextGaps)
    }
}

impl ValCodec {
    pub const ALL: [ValCodec; 4] = [
        ValCodec::Raw,
        ValCodec::Ulp,
        ValCodec::Context,
        ValCodec::Escaped,
    ];

    pub fn from_code(code: u8) -> Option<Self> {
        ValCodec::ALL.into_iter().find(|c| *c as u8 == code)
    }

    pub fn name(self) -> &'static str {
        match self {
            ValCodec::Raw => "raw",
            ValCodec::Ulp => "ulp",
            ValCodec::Context => "ctx",
            ValCodec::Escaped => "esc",
        }
    }
}

/// The one rule on which codecs may code a chunk together, for both receivers and the
/// sharded sender's leader: `steps` positions and `esc` values go only with each other (an
/// escape is found by its code in the map), and, where the slot's `dtype` is known, only on a
/// dtype `ulp` carries (integer, bool and 8-byte words have no float order to step along).
/// Which codecs a frame kind allows (seed: raw values; dense: `all` + `raw`) is the wire's.
pub fn check_pair(pos: PosCodec, val: ValCodec, dtype: Option<DType>) -> Result<(), CodecError> {
    match (pos == PosCodec::Steps, val == ValCodec::Escaped) {
        (true, false) => Err(CodecError::Unsupported {
            codec: "steps",
            what: "values other than `esc` (the two go together)",
        }),
        (false, true) => Err(CodecError::Unsupported {
            codec: "esc",
            what: "positions other than `steps` (the two go together)",
        }),
        (true, true) if dtype.is_some_and(|d| !d.ulp_codable()) => Err(CodecError::Unsupported {
            codec: "steps",
            what: "a dtype without a float order (integer, bool or 8-byte elements)",
        }),
        _ => Ok(()),
    }
}

/// Appends the encoding of `rel` (strictly increasing, each `< range`) to `out`.
/// `All` requires `rel.len() == range` and writes nothing. `Context` and `ContextGaps` need the
/// chunk's bits ([`encode_context_positions`]) and `Steps` the values ([`encode_steps`]): here they write
/// nothing, and no caller in the crate asks.
pub fn encode_positions(codec: PosCodec, rel: &[u32], range: u32, out: &mut Vec<u8>) {
    debug_assert!(rel.windows(2).all(|w| w[0] < w[1]));
    debug_assert!(rel.last().is_none_or(|&p| p < range));
    debug_assert!(
        !codec.needs_held() && codec != PosCodec::Steps,
        "{} positions need the chunk's bits",
        codec.name()
    );
    match codec {
        PosCodec::All => debug_assert_eq!(rel.len() as u64, range as u64),
        PosCodec::Abs32 => abs32::encode(rel, out),
        PosCodec::Gaps => gaps::encode(rel, range, out),
        PosCodec::Bitmap => bitmap::encode(rel, range, out),
        PosCodec::Holes => gaps::encode(&complement(rel, range), range, out),
        PosCodec::Context | PosCodec::ContextGaps | PosCodec::Steps => {}
    }
}

/// The elements of `0..range` not in `sorted` (strictly increasing, each `< range`).
fn complement(sorted: &[u32], range: u32) -> Vec<u32> {
    // Run by run: every gap between two consecutive holes is a run of changed positions.
    let mut out = Vec::with_capacity((range as usize).saturating_sub(sorted.len()));
    let mut next = 0u32;
    for &hole in sorted {
        out.extend(next..hole);
        next = hole.saturating_add(1);
    }
    out.extend(next..range);
    out
}

/// A section that codes nothing (no element, or every position implied) must be empty: the
/// error counts the bytes left over.
pub(crate) fn no_bytes(input: &[u8], count: u64) -> Result<(), CodecError> {
    exact_len(input, 0, count)
}

/// A section of fixed size (`count` items in `needed` bytes) must be exactly that long.
pub(crate) fn exact_len(input: &[u8], needed: u64, count: u64) -> Result<(), CodecError> {
    let have = input.len() as u64;
    if have < needed {
        return Err(CodecError::Truncated {
            needed,
            available: have,
        });
    }
    if have > needed {
        return Err(CodecError::TrailingBytes {
            count,
            extra: have - needed,
        });
    }
    Ok(())
}

/// Decodes exactly `count` positions from all of `input` into `out` (cleared first).
/// Fails unless they are strictly increasing, below `range`, and use every byte of `input`.
pub fn decode_positions(
    codec: PosCodec,
    input: &[u8],
    count: u32,
    range: u32,
    out: &mut Vec<u32>,
) -> Result<(), CodecError> {
    out.clear();
    if count as u64 > range as u64 {
        return Err(CodecError::CountExceedsRange {
            count: count as u64,
            range: range as u64,
        });
    }
    match codec {
        PosCodec::All => {
            if count != range {
                return Err(CodecError::Malformed {
                    codec: "all",
                    reason: format!("count {count} differs from range {range}"),
                });
            }
            no_bytes(input, count as u64)?;
            out.extend(0..range);
            Ok(())
        }
        PosCodec::Abs32 => abs32::decode(input, count, range, out),
        PosCodec::Gaps => gaps::decode(input, count, range, out),
        PosCodec::Bitmap => bitmap::decode(input, count, range, out),
        PosCodec::Holes => {
            // `range − count` unchanged positions, validated by the gaps decoder, then inverted.
            let mut holes = Vec::new();
            gaps::decode(input, range - count, range, &mut holes)?;
            *out = complement(&holes, range);
            Ok(())
        }
        PosCodec::Context | PosCodec::ContextGaps => Err(CodecError::Unsupported {
            codec: codec.name(),
            what: "positions without the receiver's bits of the chunk",
        }),
        // The nonzero codes of the map: the values are not needed.
        PosCodec::Steps => steps::decode_positions(input, count, range, out),
    }
}

/// Writes a `steps` map of the changes at `rel` (strictly increasing, each `< range`) into
/// `map` and their `esc` values into `esc` (both cleared first): one pass over the changes,
/// `old` and `new` their bits, `width` bytes each (1, 2 or 4). Canonical: a change whose
/// ordered step is +1 is code 1, −1 code 2, anything else escaped (code 3).
pub fn encode_steps(
    width: usize,
    rel: &[u32],
    range: u32,
    old: &[u8],
    new: &[u8],
    map: &mut Vec<u8>,
    esc: &mut Vec<u8>,
) {
    steps::encode(width, rel, range, old, new, map, esc)
}

/// Checks a `steps` map of a chunk of `range` elements (exactly `ceil(range / 4)` bytes, no
/// code past the range) and returns its changes and escapes, without allocating: a receiver
/// checks the manifest's count and the `esc` section's length (`escapes · width`) with them
/// before it decodes anything.
pub fn steps_counts(map: &[u8], range: u32) -> Result<(u64, u64), CodecError> {
    steps::counts(map, range)
}

/// Decodes `esc` values into `out` (cleared first): `map` is the chunk's `steps` positions
/// section over `range` elements, `escaped` its value section, `old` the receiver's bits at
/// the changes' positions (`width` bytes each, one per nonzero code). Fails unless the map is
/// well formed and holds `old.len() / width` changes and `escaped` exactly its escapes. An
/// escape equal to the old bits is not refused here: that is the receiver's no-op rule, which
/// knows which of `old` are really held.
pub fn decode_steps_values(
    width: usize,
    map: &[u8],
    range: u32,
    escaped: &[u8],
    old: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    steps::decode_values(width, map, range, escaped, old, out)
}

/// Appends `ctx` or `ctxgaps` positions (`codec`, one that [`PosCodec::needs_held`]): `after`
/// holds the bits of the chunk's whole range after the sync, `old` the old bits at `rel` (so
/// the receiver's bits before the sync are known everywhere). Elements of 2 or 4 bytes
/// ([`context_supports`]).
pub fn encode_context_positions(
    codec: PosCodec,
    width: usize,
    rel: &[u32],
    after: &[u8],
    old: &[u8],
    out: &mut Vec<u8>,
) {
    debug_assert!(codec.needs_held());
    if codec == PosCodec::ContextGaps {
        context::gaps::encode_positions(width, rel, after, old, out)
    } else {
        context::encode_positions(width, rel, after, old, out)
    }
}

/// Whether the `ctx` codecs carry elements of `width` bytes.
pub fn context_supports(width: usize) -> bool {
    context::supports(width)
}

/// [`decode_positions`] for a receiver that holds the chunk: `held` is its bits of the whole
/// range (`range · width` bytes), which `Context` positions are decoded against.
pub fn decode_positions_held(
    codec: PosCodec,
    input: &[u8],
    count: u32,
    range: u32,
    width: usize,
    held: &[u8],
    out: &mut Vec<u32>,
) -> Result<(), CodecError> {
    if !codec.needs_held() {
        return decode_positions(codec, input, count, range, out);
    }
    out.clear();
    if count as u64 > range as u64 {
        return Err(CodecError::CountExceedsRange {
            count: count as u64,
            range: range as u64,
        });
    }
    if codec == PosCodec::ContextGaps {
        return context::gaps::decode_positions(width, input, count, range, held, out);
    }
    context::decode_positions(width, input, count, range, held, out)
}

/// Appends the encoding of the new values to `out`. `old` and `new` hold the same number of
/// `width`-byte elements; `old` is what the receiver holds before the sync (ignored by `Raw`).
/// `Escaped` writes the section [`encode_steps`] writes (the escapes alone).
pub fn encode_values(codec: ValCodec, width: usize, old: &[u8], new: &[u8], out: &mut Vec<u8>) {
    match codec {
        ValCodec::Raw => raw::encode(new, out),
        ValCodec::Ulp => ulp::encode(width, old, new, out),
        ValCodec::Context => context::encode_values(width, old, new, out),
        ValCodec::Escaped => steps::encode_escapes(width, old, new, out),
    }
}

/// Decodes the new values of `old.len() / width` elements from all of `input` into `out`
/// (cleared first). `old` holds the receiver's current bits at the chunk's positions.
/// `Escaped` values need their map: [`decode_steps_values`].
pub fn decode_values(
    codec: ValCodec,
    width: usize,
    input: &[u8],
    old: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    out.clear();
    match codec {
        ValCodec::Raw => raw::decode(width, input, old.len() / width, out),
        ValCodec::Ulp => ulp::decode(width, input, old, out),
        ValCodec::Context => context::decode_values(width, input, old, out),
        ValCodec::Escaped => Err(CodecError::Unsupported {
            codec: "esc",
            what: "values without their `steps` positions",
        }),
    }
}

/// Which codecs the encoder may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CodecChoice {
    #[default]
    /// Pick the cheapest position and value codec per chunk by exact encoded size.
    Auto,
    /// Pick the cheapest position codec per chunk; values raw (what `Auto` becomes for a
    /// dtype the `ulp` codec must not carry, see [`CodecChoice::for_dtype`]).
    AutoRaw,
    /// [`Auto`](CodecChoice::Auto), and the context codecs where they are smaller (elements of
    /// 2 or 4 bytes): `ctxgaps` positions and `ctx` values. Opt-in: only a receiver that holds
    /// every element of a chunk can decode context positions (not a tensor-parallel share of a
    /// slot), and no GPU decoder has them yet.
    AutoContext,
    /// Always use this pair (positions fall back to `All` only for seeds). `steps+esc` is a
    /// pair; `steps` with other values falls back to `bitmap` positions (the other map of the
    /// range), `esc` with other positions to `ulp` values (the same steps, entropy coded).
    Fixed(PosCodec, ValCodec),
}

impl CodecChoice {
    /// Parses `auto`, `auto+raw`, `auto+ctx` or `POS+VAL`, e.g. `abs32+raw`, `gaps+ulp`,
    /// `steps+esc`.
    pub fn parse(text: &str) -> Option<Self> {
        if text == "auto" {
            return Some(CodecChoice::Auto);
        }
        if text == "auto+raw" {
            return Some(CodecChoice::AutoRaw);
        }
        if text == "auto+ctx" {
            return Some(CodecChoice::AutoContext);
        }
        let (p, v) = text.split_once('+')?;
        let pos = PosCodec::ALL.into_iter().find(|c| c.name() == p)?;
        let val = ValCodec::ALL.into_iter().find(|c| c.name() == v)?;
        Some(CodecChoice::Fixed(pos, val))
    }

    pub fn name(&self) -> String {
        match self {
            CodecChoice::Auto => "auto".into(),
            CodecChoice::AutoRaw => "auto+raw".into(),
            CodecChoice::AutoContext => "auto+ctx".into(),
            CodecChoice::Fixed(p, v) => format!("{}+{}", p.name(), v.name()),
        }
    }

    /// The choice for the values of `dtype`: unchanged for the floats `ulp` can step along,
    /// else the same positions with raw values (integer and bool bits have no float order,
    /// and an 8-byte element's words are not floats); `steps`, which codes steps, becomes
    /// `bitmap`.
    pub fn for_dtype(self, dtype: DType) -> CodecChoice {
        if dtype.ulp_codable() {
            return self;
        }
        match self {
            CodecChoice::Auto | CodecChoice::AutoRaw | CodecChoice::AutoContext => {
                CodecChoice::AutoRaw
            }
            CodecChoice::Fixed(PosCodec::Steps, _) => {
                CodecChoice::Fixed(PosCodec::Bitmap, ValCodec::Raw)
            }
            CodecChoice::Fixed(pos, _) => CodecChoice::Fixed(pos, ValCodec::Raw),
        }
    }
}

/// One chunk encoded: the codecs used and the two sections.
#[derive(Debug, Clone, Default)]
pub struct EncodedChunk {
    pub pos_codec: Option<PosCodec>,
    pub val_codec: Option<ValCodec>,
    pub positions: Vec<u8>,
    pub values: Vec<u8>,
}

/// Encodes one delta chunk with `choice`. With `Auto`, every position codec that can carry the
/// chunk and every value codec are sized exactly and the smallest of each is kept; then the
/// `steps+esc` pair replaces them where it is strictly smaller.
pub fn encode_chunk(
    choice: CodecChoice,
    width: usize,
    rel: &[u32],
    range: u32,
    old: &[u8],
    new: &[u8],
) -> EncodedChunk {
    let mut chunk = EncodedChunk::default();
    encode_chunk_into(choice, width, rel, range, old, new, &mut chunk);
    chunk
}

/// [`encode_chunk`] into `out`, whose sections are cleared first but keep their capacity: a
/// sender that reuses one `EncodedChunk` across chunks writes into memory it already holds
/// (fresh section vectors cost page faults on every chunk, a large share of a dense encode:
/// docs/data/codecs/README.md, "Figures behind the code"). Same codecs and bytes.
pub fn encode_chunk_into(
    choice: CodecChoice,
    width: usize,
    rel: &[u32],
    range: u32,
    old: &[u8],
    new: &[u8],
    out: &mut EncodedChunk,
) {
    encode_chunk_with_state_into(choice, width, rel, range, old, new, None, out)
}

/// [`encode_chunk_into`] for a sender that knows the bits of the chunk's whole range after the
/// sync (`after`, `range · width` bytes): the only case where `ctx` positions can be written
/// (with `AutoContext` or a fixed `ctx` choice; without `after` these fall back to `gaps`).
#[allow(clippy::too_many_arguments)]
pub fn encode_chunk_with_state_into(
    choice: CodecChoice,
    width: usize,
    rel: &[u32],
    range: u32,
    old: &[u8],
    new: &[u8],
    after: Option<&[u8]>,
    out: &mut EncodedChunk,
) {
    out.positions.clear();
    out.values.clear();
    let after = after.filter(|a| a.len() as u64 == range as u64 * width as u64);
    match choice {
        CodecChoice::Fixed(PosCodec::Steps, ValCodec::Escaped) if steps::supports(width) => {
            steps::encode(
                width,
                rel,
                range,
                old,
                new,
                &mut out.positions,
                &mut out.values,
            );
            out.pos_codec = Some(PosCodec::Steps);
            out.val_codec = Some(ValCodec::Escaped);
        }
        CodecChoice::Fixed(pos, val) => {
            let pos = match pos {
                PosCodec::All if rel.len() as u64 != range as u64 => PosCodec::Abs32,
                p if p.needs_held() && (after.is_none() || !context::supports(width)) => {
                    PosCodec::Gaps
                }
                // Without `esc` values (or elements it codes): the other map of the range.
                PosCodec::Steps => PosCodec::Bitmap,
                other => other,
            };
            let val = match val {
                ValCodec::Context if !context::supports(width) => ValCodec::Ulp,
                // Without `steps` positions: the same steps, entropy coded.
                ValCodec::Escaped => ValCodec::Ulp,
                other => other,
            };
            match (pos.needs_held(), after) {
                (true, Some(after)) => {
                    encode_context_positions(pos, width, rel, after, old, &mut out.positions)
                }
                _ => encode_positions(pos, rel, range, &mut out.positions),
            }
            encode_values(val, width, old, new, &mut out.values);
            out.pos_codec = Some(pos);
            out.val_codec = Some(val);
        }
        CodecChoice::Auto => {
            out.pos_codec = Some(choose_positions(rel, range, &mut out.positions));
            out.val_codec = Some(choose_values(width, old, new, &mut out.values));
            prefer_steps(width, rel, range, old, new, out);
        }
        CodecChoice::AutoRaw => {
            out.pos_codec = Some(choose_positions(rel, range, &mut out.positions));
            encode_values(ValCodec::Raw, width, old, new, &mut out.values);
            out.val_codec = Some(ValCodec::Raw);
        }
        CodecChoice::AutoContext => {
            let mut pos = choose_positions(rel, range, &mut out.positions);
            let mut val = choose_values(width, old, new, &mut out.values);
            if context::supports(width) {
                // Kept only when strictly smaller (today's codecs win ties).
                let mut scratch = Vec::new();
                // `ctxgaps`, not `ctx`: within 2 % of its bytes on the recorded trace at ~10×
                // its speed (docs/codecs.md, "ctxgaps"); `ctx` stays a fixed choice.
                if let (Some(after), false) = (after, pos == PosCodec::All) {
                    let codec = PosCodec::ContextGaps;
                    encode_context_positions(codec, width, rel, after, old, &mut scratch);
                    if scratch.len() < out.positions.len() {
                        std::mem::swap(&mut scratch, &mut out.positions);
                        pos = codec;
                    }
                }
                scratch.clear();
                context::encode_values(width, old, new, &mut scratch);
                if scratch.len() < out.values.len() {
                    std::mem::swap(&mut scratch, &mut out.values);
                    val = ValCodec::Context;
                }
            }
            out.pos_codec = Some(pos);
            out.val_codec = Some(val);
            prefer_steps(width, rel, range, old, new, out);
        }
    }
}

/// Replaces the pair chosen in `out` by `steps+esc` when that is strictly smaller. Its size is
/// exact, `ceil(range / 4) + escapes · width`; the escapes are counted only when the map alone
/// is smaller than the chosen total (sparse chunks pay nothing), and the count stops as soon
/// as it shows the pair cannot win.
fn prefer_steps(
    width: usize,
    rel: &[u32],
    range: u32,
    old: &[u8],
    new: &[u8],
    out: &mut EncodedChunk,
) {
    let total = out.positions.len() + out.values.len();
    let map = steps::map_len(range);
    if map >= total || !steps::supports(width) {
        return;
    }
    // The most escapes that keep `map + escapes · width < total`.
    let limit = (total - map - 1) / width;
    if steps::count_escapes(width, old, new, limit).is_none() {
        return;
    }
    steps::encode(
        width,
        rel,
        range,
        old,
        new,
        &mut out.positions,
        &mut out.values,
    );
    debug_assert!(out.positions.len() + out.values.len() < total);
    out.pos_codec = Some(PosCodec::Steps);
    out.val_codec = Some(ValCodec::Escaped);
}

/// Encodes one seed chunk: the cheapest positions (or none when every element of the range is
/// carried) and raw values, since a seed must not depend on what the receiver held.
pub fn encode_seed_chunk(rel: &[u32], range: u32, new: &[u8]) -> EncodedChunk {
    let mut chunk = EncodedChunk::default();
    encode_seed_chunk_into(rel, range, new, &mut chunk);
    chunk
}

/// [`encode_seed_chunk`] into `out` (cleared first, capacity kept, as [`encode_chunk_into`]).
pub fn encode_seed_chunk_into(rel: &[u32], range: u32, new: &[u8], out: &mut EncodedChunk) {
    out.positions.clear();
    out.values.clear();
    out.pos_codec = Some(choose_positions(rel, range, &mut out.positions));
    out.val_codec = Some(ValCodec::Raw);
    out.values.extend_from_slice(new);
}

/// Writes the cheapest positions section into `out` (cleared first) and returns its codec.
fn choose_positions(rel: &[u32], range: u32, out: &mut Vec<u8>) -> PosCodec {
    out.clear();
    if rel.len() as u64 == range as u64 {
        return PosCodec::All;
    }
    // abs32 and bitmap sizes follow from the count and range; gaps is sized exactly only
    // when its smallest possible size could match the better of the two. The first of abs32,
    // gaps, bitmap with the smallest size wins, as if all were encoded.
    let abs32 = rel.len() as u64 * 4;
    let bitmap = (range as u64).div_ceil(8);
    // Up to a third of the range gaps all but always wins (bitmap does from ~40%, holes only
    // past half), so it is written at once; denser chunks size it from its directory alone
    // when a lower bound says it could tie, and write it only if it wins. From 40 % the
    // bitmap section (the likely winner) is built first, in `out`, and both lower bounds,
    // gaps and holes, come from its words in one pass.
    let mut gaps_dir = None;
    // Whether `out` holds the bitmap section (else it is empty or holds gaps, written at once).
    let mut out_is_map = false;
    let mut holes_bound = None;
    let gaps_len = if gaps::min_len(rel.len()) > abs32.min(bitmap) {
        u64::MAX
    } else if rel.len() <= range as usize / 3 {
        gaps::encode(rel, range, out);
        out.len() as u64
    } else if (rel.len() as u64) * 5 < range as u64 * 2 {
        // Below 40 % gaps usually still wins: no bitmap built in vain (no holes either).
        if gaps::lower_bound(rel, range) > abs32.min(bitmap) {
            u64::MAX
        } else {
            let (dir, len) = gaps::directory(rel, range);
            gaps_dir = Some(dir);
            len
        }
    } else {
        bitmap::encode(rel, range, out);
        out_is_map = true;
        let holes_count = range as usize - rel.len();
        let (gaps_bound, holes) = gaps::map_bounds(out, range, holes_count < rel.len());
        holes_bound = holes;
        if gaps_bound > abs32.min(bitmap) {
            // Dense: gaps cannot even tie (ties go to gaps), as its exact size would show.
            u64::MAX
        } else {
            let (dir, len) = gaps::directory(rel, range);
            gaps_dir = Some(dir);
            len
        }
    };
    let best = abs32.min(bitmap).min(gaps_len);
    // Dense chunks: code the few unchanged elements instead, when strictly smaller. They are
    // sized from the bitmap of the changed positions, which is kept for the bitmap section
    // (the likely winner when holes are considered); the holes are listed only if they win.
    let holes_count = range as usize - rel.len();
    if holes_count < rel.len() && gaps::min_len(holes_count) < best {
        // Past half the range gaps was never written at once: `out` holds no gaps section.
        debug_assert!(out_is_map || out.is_empty());
        if !out_is_map {
            bitmap::encode(rel, range, out);
            out_is_map = true;
        }
        // Half-dense chunks: a one-pass lower bound on the holes' size often shows they
        // cannot be strictly smaller, as their exact size would (holes win only when smaller).
        let bound = holes_bound.unwrap_or_else(|| gaps::holes_lower_bound(out, range));
        if bound < best {
            let (dir, len) = gaps::holes_directory(out, range);
            if len < best {
                let holes = complement(rel, range);
                out.clear();
                gaps::encode_with(&holes, range, &dir, out);
                return PosCodec::Holes;
            }
        }
    }
    let codec = if abs32 <= gaps_len && abs32 <= bitmap {
        PosCodec::Abs32
    } else if gaps_len <= bitmap {
        // Sized from its directory (`out` may hold the bitmap), or else already in `out`.
        if let Some(dir) = gaps_dir {
            out.clear();
            gaps::encode_with(rel, range, &dir, out);
        }
        return PosCodec::Gaps;
    } else if out_is_map {
        return PosCodec::Bitmap;
    } else {
        PosCodec::Bitmap
    };
    out.clear();
    encode_positions(codec, rel, range, out);
    codec
}

/// Writes the cheapest values section into `out` (cleared first) and returns its codec.
fn choose_values(width: usize, old: &[u8], new: &[u8], out: &mut Vec<u8>) -> ValCodec {
    // raw costs exactly the new bytes; ulp is encoded only when it could be smaller (raw
    // wins ties, as the first codec).
    out.clear();
    let raw = new.len() as u64;
    if ulp::min_len(new.len() / width.max(1)) < raw {
        encode_values(ValCodec::Ulp, width, old, new, out);
        if (out.len() as u64) < raw {
            return ValCodec::Ulp;
        }
        out.clear();
    }
    encode_values(ValCodec::Raw, width, old, new, out);
    ValCodec::Raw
}

#[cfg(test)]
mod dtype_choice_tests {
    use super::*;

    #[test]
    fn non_float_dtypes_never_get_ulp_values() {
        let ulp = CodecChoice::Fixed(PosCodec::Gaps, ValCodec::Ulp);
        for d in DType::ALL {
            let (auto, fixed) = (CodecChoice::Auto.for_dtype(d), ulp.for_dtype(d));
            if d.ulp_codable() {
                assert_eq!((auto, fixed), (CodecChoice::Auto, ulp), "{d}");
            } else {
                assert_eq!(auto, CodecChoice::AutoRaw, "{d}");
                assert_eq!(
                    fixed,
                    CodecChoice::Fixed(PosCodec::Gaps, ValCodec::Raw),
                    "{d}"
                );
            }
        }
        // One-ULP steps, where `auto` would pick ulp: `auto+raw` keeps raw, same positions.
        let rel: Vec<u32> = (0..4000).map(|i| i * 3).collect();
        let old: Vec<u8> = (0..rel.len() as u32)
            .flat_map(|i| (i << 8).to_le_bytes())
            .collect();
        let new: Vec<u8> = (0..rel.len() as u32)
            .flat_map(|i| ((i << 8) + 1).to_le_bytes())
            .collect();
        let auto = encode_chunk(CodecChoice::Auto, 4, &rel, 12_000, &old, &new);
        assert_eq!(auto.val_codec, Some(ValCodec::Ulp));
        let raw = encode_chunk(CodecChoice::AutoRaw, 4, &rel, 12_000, &old, &new);
        assert_eq!(raw.val_codec, Some(ValCodec::Raw));
        assert_eq!(
            (raw.pos_codec, &raw.positions),
            (auto.pos_codec, &auto.positions)
        );
        assert_eq!(raw.values, new);
        assert_eq!(CodecChoice::parse("auto+raw"), Some(CodecChoice::AutoRaw));
        assert_eq!(CodecChoice::AutoRaw.name(), "auto+raw");
    }
}

#[cfg(test)]
mod holes_tests {
    use super::*;

    #[test]
    fn holes_round_trip_and_validate() {
        for range in [1u32, 2, 7, 64, 1000, 4099] {
            for keep_every in [1u32, 2, 3, 50, 5000] {
                // Everything changed except every `keep_every`-th element.
                let rel: Vec<u32> = (0..range)
                    .filter(|i| keep_every == 1 || i % keep_every != 0)
                    .collect();
                let mut enc = Vec::new();
                encode_positions(PosCodec::Holes, &rel, range, &mut enc);
                let mut out = Vec::new();
                decode_positions(PosCodec::Holes, &enc, rel.len() as u32, range, &mut out).unwrap();
                assert_eq!(out, rel, "range {range} every {keep_every}");
                // A wrong count is an error, never a panic.
                if !rel.is_empty() {
                    assert!(decode_positions(
                        PosCodec::Holes,
                        &enc,
                        rel.len() as u32 - 1,
                        range,
                        &mut out
                    )
                    .is_err());
                }
            }
        }
        // The chooser prefers holes for a 99% dense chunk.
        let rel: Vec<u32> = (0..100_000).filter(|i| i % 100 != 7).collect();
        let mut bytes = vec![1, 2, 3];
        let codec = choose_positions(&rel, 100_000, &mut bytes);
        assert_eq!(codec, PosCodec::Holes);
        assert!(bytes.len() < 100_000 / 8 / 4);
    }
}
