//! `ctxgaps` positions: the changed elements of a chunk as gaps inside exponent classes, so
//! that coding touches the changes and a vector pass over the old bits, not every element
//! (docs/codecs.md, "ctxgaps").
//!
//! Why: `ctx` positions spend a range-coder step on every element of the range, ~10 ns each,
//! 20× the diff's time per element at 1 % changed. The gain of `ctx` comes from the old
//! exponent (an element changes when the step crosses half its ULP), and a few contiguous
//! exponent classes keep almost all of it (scripts/ctx_class_bound.py). Here both sides
//! split the range into at most 8 classes by the old exponent; inside each class the gap to
//! the next change is Golomb coded: the quotient with adaptive range-coder models per class
//! (the gaps of real steps are not geometric enough for a fixed prefix code: a static
//! Golomb code lands ~3.5 % above the class bound on the recorded trace, the adaptive
//! quotient within 1 %), the remainder as plain bits in a second stream.
//!
//! Both sides find the members of a class with three bit planes per 64 elements (the class
//! number's bits), built in one pass over the old bits; the walk through a class counts
//! members a word at a time.

use super::rc::{Decoder, Encoder, Model};
use crate::codec::bits::{bit_len, check_stream_len, mask, BitCursor, BitReader, BitWriter};
use crate::codec::no_bytes;
use crate::dtype::load_bits;
use crate::error::CodecError;

const CODEC: &str = "ctxgaps positions";

/// Exponent slots of the class map: the old exponent byte `e` falls in slot
/// `min(max(e − base, 0), SLOTS − 1)`.
const SLOTS: usize = 16;
/// Classes at most (three bit planes).
pub(crate) const MAX_CLASSES: usize = 8;
/// Adaptive models of the quotient per class: "q > j" for j = 0 .. QUOTIENT_MODELS − 1, the
/// last one shared by every larger j.
const QUOTIENT_MODELS: usize = 16;
/// A section's fixed head: the range-coded part's length, u32 little-endian.
const HEAD: usize = 4;
/// Remainders written per bit-writer block (each at most 32 bits).
const REMAINDERS_PER_BLOCK: usize = 1024;

/// Which class each old exponent byte is in: `lut[slot(e)]`, non-decreasing from 0, with
/// `classes = lut[SLOTS − 1] + 1`. On the wire as `base` and the 15 bits `steps` (bit `s`,
/// `1 ≤ s < 16`, set: the class number goes up by one at slot `s`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ClassMap {
    base: u8,
    steps: u16,
    lut: [u8; SLOTS],
    classes: usize,
}

impl ClassMap {
    fn new(base: u8, steps: u16) -> Option<Self> {
        if steps & 1 != 0 || steps.count_ones() as usize >= MAX_CLASSES {
            return None;
        }
        let mut lut = [0u8; SLOTS];
        let mut class = 0u8;
        for (s, slot) in lut.iter_mut().enumerate() {
            class += (steps >> s & 1) as u8;
            *slot = class;
        }
        Some(ClassMap {
            base,
            steps,
            lut,
            classes: class as usize + 1,
        })
    }

    #[inline(always)]
    fn slot(&self, exponent: u32) -> usize {
        (exponent.saturating_sub(self.base as u32) as usize).min(SLOTS - 1)
    }

    #[inline(always)]
    fn class(&self, exponent: u32) -> u8 {
        self.lut[self.slot(exponent)]
    }
}

/// The 8 bits below the sign of an element's bits: the class key (as `ctx`'s position class).
#[inline(always)]
fn exponent(bits: u32, nb: u32) -> u32 {
    (bits >> (nb - 9)) & 0xFF
}

/// Buffers kept per thread from chunk to chunk (a fresh one per chunk costs page faults).
#[derive(Default)]
struct Scratch {
    gaps: members::ClassGaps,
    remainders: Vec<(u64, u32)>,
    coded: Vec<u8>,
    /// The decoder's member index of each change inside its class, class after class.
    targets: Vec<u32>,
}

thread_local! {
    static SCRATCH: std::cell::Cell<Scratch> = std::cell::Cell::new(Scratch::default());
}

/// Runs `f` with this thread's scratch (taken out meanwhile, so a nested call gets fresh
/// buffers instead of a borrow error).
fn with_scratch<R>(f: impl FnOnce(&mut Scratch) -> R) -> R {
    let mut s = SCRATCH.with(|c| c.take());
    let r = f(&mut s);
    // Kept for the next chunk only while small: a huge chunk's buffers are not held by the
    // thread afterwards.
    if s.targets.capacity().max(s.gaps.classes.capacity()) <= KEEP_CHANGES {
        SCRATCH.with(|c| c.set(s));
    }
    r
}

/// Changes a thread's scratch keeps room for between chunks.
const KEEP_CHANGES: usize = 1 << 22;

/// The Golomb parameter for `k` changes among `n` members: Gallager and Van Voorhis's
/// optimum for geometric gaps. The encoder's choice only; it travels in the section.
fn golomb_parameter(n: f64, k: u64) -> u32 {
    let p = (k as f64 / n.max(k as f64)).clamp(1e-9, 1.0);
    if p >= 0.5 {
        return 1;
    }
    let m = ((2.0 - p).ln() / -(1.0 - p).ln()).ceil();
    m.clamp(1.0, (1u64 << 31) as f64) as u32
}

/// Bits of the truncated binary code of `r < m`: (short length, threshold `u`) — values
/// below `u` take `b − 1` bits, the others `b`, with `b = bit_len(m − 1)`.
#[inline(always)]
fn truncated(m: u32) -> (u32, u64) {
    let b = bit_len((m - 1) as u64);
    (b.saturating_sub(1), (1u64 << b) - m as u64)
}

fn malformed(reason: String) -> CodecError {
    CodecError::Malformed {
        codec: CODEC,
        reason,
    }
}

/// Writes `x` as an Elias gamma code in plain range-coder bits: the bit length `L` of
/// `x + 1` as `L − 1` ones and a zero, then its `L − 1` bits below the leading one.
fn put_gamma(enc: &mut Encoder<'_>, x: u32) {
    let v = x as u64 + 1;
    let len = bit_len(v);
    for _ in 1..len {
        enc.direct(1, 1);
    }
    enc.direct(0, 1);
    let low = (v & mask(len - 1)) as u32;
    if len > 1 {
        enc.direct(low, len - 1);
    }
}

fn get_gamma(dec: &mut Decoder<'_>) -> Result<u32, CodecError> {
    let mut len = 1u32;
    while dec.direct(1)? == 1 {
        len += 1;
        if len > 32 {
            return Err(malformed("a number longer than 32 bits".into()));
        }
    }
    let low = if len > 1 { dec.direct(len - 1)? } else { 0 };
    let v = (1u64 << (len - 1)) | low as u64;
    u32::try_from(v - 1).map_err(|_| malformed("a number longer than 32 bits".into()))
}

/// Picks the class map for a chunk: `k_e` changes and about `n_e` elements per exponent.
/// The window's inner slots (1 to 14, one exponent each) go where most changes are; the
/// outer two take everything below and above (zeros and subnormals, the largest values). The
/// slots are then grouped into at most [`MAX_CLASSES`] runs by the smallest `Σ n·H(k/n)`
/// plus a few bytes per class that changed.
fn choose_map(n_e: &[f64; 256], k_e: &[u64; 256]) -> ClassMap {
    let inner = SLOTS - 2;
    let mut sum: u64 = k_e[1..=inner].iter().sum();
    let (mut best_sum, mut base) = (sum, 0u32);
    for b in 1..=(256 - 1 - inner) {
        sum = sum + k_e[b + inner] - k_e[b];
        if sum > best_sum {
            (best_sum, base) = (sum, b as u32);
        }
    }
    let (mut n, mut k) = ([0f64; SLOTS], [0f64; SLOTS]);
    for e in 0..256u32 {
        let s = (e.saturating_sub(base) as usize).min(SLOTS - 1);
        n[s] += n_e[e as usize];
        k[s] += k_e[e as usize] as f64;
    }
    // Prefix sums and the cost of slots a..b as one class.
    let (mut cn, mut ck) = ([0f64; SLOTS + 1], [0f64; SLOTS + 1]);
    for s in 0..SLOTS {
        cn[s + 1] = cn[s] + n[s];
        ck[s + 1] = ck[s] + k[s];
    }
    // Each run's cost once (the search below asks for each ~8 times; two logarithms each).
    let mut costs = [[0f64; SLOTS + 1]; SLOTS + 1];
    for a in 0..SLOTS {
        for b in a + 1..=SLOTS {
            let (nn, kk) = (cn[b] - cn[a], ck[b] - ck[a]);
            if kk <= 0.0 {
                continue;
            }
            let nn = nn.max(kk);
            let p = kk / nn;
            let h = if p >= 1.0 {
                0.0
            } else {
                -(p * p.log2() + (1.0 - p) * (1.0 - p).log2())
            };
            costs[a][b] = nn * h + 24.0;
        }
    }
    let cost = |a: usize, b: usize| costs[a][b];
    // best[j][b]: slots 0..b in j + 1 classes.
    let mut best = [[f64::INFINITY; SLOTS + 1]; MAX_CLASSES];
    let mut from = [[0usize; SLOTS + 1]; MAX_CLASSES];
    for (b, first) in best[0].iter_mut().enumerate().skip(1) {
        *first = cost(0, b);
    }
    for j in 1..MAX_CLASSES {
        for b in j + 1..=SLOTS {
            for a in j..b {
                let c = best[j - 1][a] + cost(a, b);
                if c < best[j][b] {
                    best[j][b] = c;
                    from[j][b] = a;
                }
            }
        }
    }
    let mut j = (0..MAX_CLASSES)
        .min_by(|&x, &y| best[x][SLOTS].total_cmp(&best[y][SLOTS]))
        .unwrap_or(0);
    let mut steps = 0u16;
    let mut b = SLOTS;
    while j > 0 {
        let a = from[j][b];
        steps |= 1 << a;
        b = a;
        j -= 1;
    }
    ClassMap::new(base as u8, steps).unwrap_or(ClassMap {
        base: 0,
        steps: 0,
        lut: [0; SLOTS],
        classes: 1,
    })
}

/// How many of the elements `elements` yields of `bits` have each exponent byte. Four
/// tables, so that runs of one exponent do not wait on each other's increments.
fn histogram(width: usize, bits: &[u8], elements: impl Iterator<Item = usize>) -> [u64; 256] {
    let nb = 8 * width as u32;
    let mut four = [[0u32; 256]; 4];
    for (j, i) in elements.enumerate() {
        four[j % 4][exponent(load_bits(bits, width, i), nb) as usize] += 1;
    }
    std::array::from_fn(|e| four.iter().map(|t| t[e] as u64).sum())
}

/// Appends the `ctxgaps` positions of a chunk: `rel` its changes (strictly increasing),
/// `after` the bits of its whole range after the sync, `old` the old bits at `rel`. Nothing
/// is written for no change. `width` must be 2 or 4.
pub fn encode_positions(width: usize, rel: &[u32], after: &[u8], old: &[u8], out: &mut Vec<u8>) {
    debug_assert!(width == 2 || width == 4);
    debug_assert_eq!(old.len(), rel.len() * width);
    if rel.is_empty() {
        return;
    }
    let range = after.len() / width;
    // Exponents: of the changes exactly, of the range by a sample (the map and the Golomb
    // parameters are the encoder's choice; a rough count serves).
    let k_e = histogram(width, old, 0..rel.len());
    // Runs of 64 neighbours spread over the range: a stride through it touched every other
    // cache line of the chunk (8 % of the encoder's time at 10 % changed).
    let runs = range.div_ceil(64).min(256);
    let spacing = range / runs;
    let run = |r: usize| r * spacing..(r * spacing + 64).min(range);
    let sampled: usize = (0..runs).map(|r| run(r).len()).sum();
    let counts = histogram(width, after, (0..runs).flat_map(run));
    let mut n_e: [f64; 256] = std::array::from_fn(|e| counts[e] as f64);
    let scale = range as f64 / sampled as f64;
    n_e.iter_mut().for_each(|n| *n *= scale);
    let map = choose_map(&n_e, &k_e);
    // Elements and changes per class, then each class's parameter.
    let mut per_class = vec![(0f64, 0u64); map.classes];
    for e in 0..256 {
        let (n, k) = &mut per_class[map.class(e as u32) as usize];
        *n += n_e[e];
        *k += k_e[e];
    }
    let params: Vec<u32> = per_class
        .iter()
        .map(|&(n, k)| golomb_parameter(n, k))
        .collect();
    with_scratch(|s| encode_with(width, rel, after, old, &map, &params, s, out));
}

/// [`encode_positions`] with the class map and each class's Golomb parameter given, in this
/// thread's scratch `s`.
#[allow(clippy::too_many_arguments)]
fn encode_with(
    width: usize,
    rel: &[u32],
    after: &[u8],
    old: &[u8],
    map: &ClassMap,
    params: &[u32],
    s: &mut Scratch,
    out: &mut Vec<u8>,
) {
    let build = members::Build::best();
    members::class_gaps(build, width, rel, after, old, map, &mut s.gaps);
    let by_class = &s.gaps.by_class;
    let start = out.len();
    out.extend_from_slice(&[0; HEAD]);
    let remainders = &mut s.remainders;
    remainders.clear();
    let coded = &mut s.coded;
    coded.clear();
    {
        let mut enc = Encoder::new(coded);
        enc.direct(map.base as u32, 8);
        enc.direct((map.steps >> 1) as u32, 15);
        for list in &by_class[..map.classes - 1] {
            put_gamma(&mut enc, list.len() as u32);
        }
        for (list, &m) in by_class.iter().zip(params) {
            if !list.is_empty() {
                put_gamma(&mut enc, m - 1);
            }
        }
        for (list, &m) in by_class.iter().zip(params) {
            let mut models = [Model::default(); QUOTIENT_MODELS];
            let (short, u) = truncated(m);
            for &gap in list {
                let (q, r) = (gap / m, (gap % m) as u64);
                for j in 0..q {
                    enc.model_bit(&mut models[(j as usize).min(QUOTIENT_MODELS - 1)], true);
                }
                enc.model_bit(&mut models[(q as usize).min(QUOTIENT_MODELS - 1)], false);
                if m > 1 {
                    remainders.push(if r < u {
                        (r, short)
                    } else {
                        let t = r - u;
                        ((u + (t >> 1)) | (t & 1) << short, short + 1)
                    });
                }
            }
        }
        enc.finish();
    }
    let coded_len = coded.len() as u32;
    out[start..start + HEAD].copy_from_slice(&coded_len.to_le_bytes());
    out.extend_from_slice(coded);
    let mut w = BitWriter::new(out);
    for block in remainders.chunks(REMAINDERS_PER_BLOCK) {
        let bits: u64 = block.iter().map(|&(_, len)| len as u64).sum();
        w.block(bits, |b| {
            for &(word, len) in block {
                b.put(word, len);
            }
        });
    }
    w.finish();
}

/// Decodes `count` positions from all of `input`; `held` is the old bits of the whole range.
pub fn decode_positions(
    width: usize,
    input: &[u8],
    count: u32,
    range: u32,
    held: &[u8],
    out: &mut Vec<u32>,
) -> Result<(), CodecError> {
    out.clear();
    super::check_held(CODEC, width, range, held)?;
    if count == 0 {
        return no_bytes(input, 0);
    }
    if count > range {
        return Err(CodecError::CountExceedsRange {
            count: count as u64,
            range: range as u64,
        });
    }
    let Some(head) = input.get(..HEAD) else {
        return Err(CodecError::Truncated {
            needed: HEAD as u64,
            available: input.len() as u64,
        });
    };
    let coded_len = u32::from_le_bytes([head[0], head[1], head[2], head[3]]) as usize;
    let Some(coded) = input.get(HEAD..HEAD + coded_len) else {
        return Err(CodecError::Truncated {
            needed: HEAD as u64 + coded_len as u64,
            available: input.len() as u64,
        });
    };
    let stream = &input[HEAD + coded_len..];
    let mut dec = Decoder::new(coded, CODEC)?;
    let base = dec.direct(8)? as u8;
    let steps = (dec.direct(15)? << 1) as u16;
    let map = ClassMap::new(base, steps).ok_or_else(|| {
        malformed(format!(
            "{} classes (at most {MAX_CLASSES})",
            steps.count_ones() + 1
        ))
    })?;
    let mut counts = vec![0u32; map.classes];
    let mut left = count;
    for c in counts.iter_mut().take(map.classes - 1) {
        *c = get_gamma(&mut dec)?;
        left = left
            .checked_sub(*c)
            .ok_or_else(|| malformed(format!("class counts above the {count} changes")))?;
    }
    counts[map.classes - 1] = left;
    let mut params = vec![0u32; map.classes];
    for (m, &k) in params.iter_mut().zip(&counts) {
        if k > 0 {
            *m = get_gamma(&mut dec)?
                .checked_add(1)
                .ok_or_else(|| malformed("a Golomb parameter of 2^32".into()))?;
        }
    }

    with_scratch(|s| {
        // The gaps first, class by class as they travel: each change's index among its
        // class's members.
        let targets = &mut s.targets;
        targets.clear();
        targets.reserve(count as usize);
        let mut bits = BitCursor::new(BitReader::new(stream), 0);
        for (class, (&k, &m)) in counts.iter().zip(&params).enumerate() {
            if k == 0 {
                // No parameter travels for a class without changes.
                continue;
            }
            let mut models = [Model::default(); QUOTIENT_MODELS];
            let (short, u) = truncated(m);
            let mut from = 0u64;
            for _ in 0..k {
                let mut q = 0u64;
                while dec.model_bit(&mut models[(q as usize).min(QUOTIENT_MODELS - 1)])? {
                    q += 1;
                    if q * m as u64 > range as u64 {
                        return Err(malformed(format!("a gap past the range in class {class}")));
                    }
                }
                let r = if m == 1 {
                    0
                } else {
                    // Both cases of the truncated code computed, one kept (no branch on data).
                    bits.need(short + 1);
                    let x = bits.bits() & mask(short);
                    let long = x >= u;
                    let wide = u
                        .wrapping_add(x.wrapping_sub(u).wrapping_mul(2))
                        .wrapping_add(bits.bits() >> short & 1);
                    bits.skip(short + long as u32);
                    if long {
                        wide
                    } else {
                        x
                    }
                };
                let index = from + q * m as u64 + r;
                if index >= range as u64 {
                    return Err(malformed(format!("a gap past the range in class {class}")));
                }
                targets.push(index as u32);
                from = index + 1;
            }
        }
        dec.finish(count as u64)?;
        check_stream_len(
            CODEC,
            stream,
            bits.pos() as u64,
            HEAD + coded_len,
            count as u64,
        )?;
        members::place_changes(
            members::Build::best(),
            width,
            held,
            &map,
            targets,
            &counts,
            out,
        )?;
        // Every change lands on a member not taken before, so this holds for any input.
        debug_assert_eq!(out.len(), count as usize);
        Ok(())
    })
}

mod members;
#[cfg(test)]
mod tests;
