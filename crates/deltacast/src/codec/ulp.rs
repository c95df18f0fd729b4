//! `ulp` values: the signed step `d = ord(new) - ord(old)` (wrapping in the element's bits)
//! in the ordered-integer view of the bit patterns, entropy coded in blocks of [`BLOCK`]
//! values that each decode on their own.
//!
//! The ordered view is a bijection, so this is exact for every pattern (NaN payloads, ±0,
//! infinities, subnormals) and the decoder never does float arithmetic. Each step becomes a
//! code number `u = 2·(|d| − 1) + sign` (the sign is the low bit, so +1 → 0, −1 → 1, +2 → 2,
//! …), coded with a per-block parameter `k`:
//!
//! - `u < 2^k`: a one bit, then `u` in `k` bits;
//! - else, with `L` the bit length of `u` and `z = L − k`: `z` zero bits, a one, then the
//!   `L − 1` bits of `u` below its leading one (an Elias-gamma code of `L` above `k`);
//! - `z` of `c` or more (a per-block cap), `d = 0` (unchanged, only for callers that send
//!   it), or `c = 0`: `c` zero bits, then the new bit pattern itself.
//!
//! With `k = 0` this spends 1 bit on +1 and 2 on −1 (the ~87% case on real AdamW traces), a
//! few bits on small steps, and grows only logarithmically for the jumps of weights near
//! zero; the raw escape caps the cost of sign crossings and other huge steps. Block bits for
//! every `(k, c)` follow exactly from a histogram of bit lengths, so the encoder picks the
//! exact smallest pair per block in one pass. On the recorded traces it comes to ~2.2 bits
//! per value against an empirical entropy of ~2.1 (sign + Rice of |d|−1: ~2.7).
//!
//! Speed: the encoder computes a block's code numbers in a vectorized loop (16-bit lanes
//! for narrow elements), takes their length histogram from vectorized counts below each
//! power of two (narrow elements; in a build for AVX2 where the CPU has it, in byte lanes
//! 32 at a time, 2-byte ones by bit planes 64 at a time where it has GFNI; 4-byte elements
//! count small code numbers by value), and writes the code
//! words: in the AVX2 build of narrow elements computed in vector lanes and joined eight to
//! a store (at k = 0 all in registers, sixteen values at a time where the CPU has
//! AVX-512), otherwise
//! those of code numbers below 1024 (~99% of AdamW steps) from a table, three per store. The
//! decoder of narrow elements reads up to eight code words per lookup in a table of the next
//! 12 stream bits, two lookups and then one code word of any kind by arithmetic per step
//! (no branch on the data: long and raw words cost no misprediction on fresh data), two
//! blocks in turn, keeping code numbers (the loop is bound by ALU operations, so lengths
//! come from loads and the steps from the vectorized loop that then applies them to the
//! old bits); 4-byte elements decode one value at a time.

use super::bits::{bit_len, check_stream_len, mask, BitCursor, BitReader, BitWriter, BlockWriter};
#[cfg(target_arch = "x86_64")]
use super::bits::{join_eight, put_words, Joined, Lanes};
use crate::dtype::{from_ordered, to_ordered};
use crate::error::CodecError;
use std::mem::MaybeUninit;
use std::sync::OnceLock;

/// Values per block: the 4-byte directory entry costs 1/32 bit per value.
pub(crate) const BLOCK: usize = 1024;
const DIR_ENTRY: usize = 4;

// The smallest code of a block is never above all-raw (`c = 0`), so its bit count fits u16.
const _: () = assert!(BLOCK as u64 * 32 <= u16::MAX as u64);

/// A lower bound on the encoded size of `count` values (directory plus one bit per value),
/// so the chooser can skip encoding when raw is already at least as small.
pub(crate) fn min_len(count: usize) -> u64 {
    (count.div_ceil(BLOCK) * DIR_ENTRY) as u64 + (count as u64).div_ceil(8)
}

pub fn encode(width: usize, old: &[u8], new: &[u8], out: &mut Vec<u8>) {
    match width {
        1 => encode_width::<1>(old, new, out),
        2 => encode_width::<2>(old, new, out),
        4 => encode_width::<4>(old, new, out),
        _ => panic!("ulp: element width {width} is not 1, 2 or 4 bytes"),
    }
}

pub fn decode(width: usize, input: &[u8], old: &[u8], out: &mut Vec<u8>) -> Result<(), CodecError> {
    match width {
        1 => decode_width::<1, FAST>(input, old, out),
        2 => decode_width::<2, FAST>(input, old, out),
        4 => decode_width::<4, FAST>(input, old, out),
        _ => Err(CodecError::Unsupported {
            codec: "ulp",
            what: "elements of this width",
        }),
    }
}

/// Bits of a `W`-byte element.
const fn nbits<const W: usize>() -> u32 {
    8 * W as u32
}

/// The encoder's code number for an unchanged element: `2^nb − 2`, never a real code number
/// (it would duplicate −2^(nb−1)).
const fn unchanged<const W: usize>() -> u32 {
    (mask(nbits::<W>()) - 1) as u32
}

/// A `W`-byte little-endian element (a form the compiler vectorizes, unlike an indexed load).
#[inline(always)]
fn le<const W: usize>(bytes: &[u8; W]) -> u32 {
    let mut word = [0; 4];
    word[..W].copy_from_slice(bytes);
    u32::from_le_bytes(word)
}

/// `bits` as a `W`-byte little-endian element.
#[inline(always)]
fn to_le<const W: usize>(bits: u32) -> [u8; W] {
    bits.to_le_bytes()[..W].try_into().unwrap()
}

/// Narrow elements (`W <= 2`) in 16-bit arithmetic: loops over them vectorize eight lanes
/// wide. All ones when the top bit of the `nb`-bit value `x` is set.
#[inline(always)]
fn top16<const W: usize>(x: u16) -> u16 {
    ((x << (16 - nbits::<W>())) as i16 >> 15) as u16
}

/// [`to_ordered`] of a narrow element in 16-bit arithmetic: flips every bit of a negative
/// pattern, only the sign of a positive one.
#[inline(always)]
fn ord16<const W: usize>(x: u16) -> u16 {
    let all = mask(nbits::<W>()) as u16;
    let sign = 1 << (nbits::<W>() - 1);
    x ^ ((top16::<W>(x) & all) | sign)
}

/// [`from_ordered`] of a narrow element in 16-bit arithmetic.
#[inline(always)]
fn unord16<const W: usize>(o: u16) -> u16 {
    let all = mask(nbits::<W>()) as u16;
    let sign = 1 << (nbits::<W>() - 1);
    o ^ ((!top16::<W>(o) & all) | sign)
}

/// Code number of the step old → new, [`unchanged`] when they are equal.
#[inline(always)]
fn step_code<const W: usize>(old: u32, new: u32) -> u32 {
    if W <= 2 {
        // Same arithmetic in 16 bits: |d| − 1 is `d − 1` for d > 0 and `d ^ all` for d < 0
        // (all ones for d = 0, which makes u = all − 1, the unchanged mark).
        let all = mask(nbits::<W>()) as u16;
        let d = ord16::<W>(new as u16).wrapping_sub(ord16::<W>(old as u16)) & all;
        let negative = top16::<W>(d);
        let m1 = (d ^ (negative & all)).wrapping_sub(negative.wrapping_add(1));
        return (((m1 << 1) | (negative & 1)) & all) as u32;
    }
    let all = mask(nbits::<W>()) as u32;
    let d = to_ordered(new, W).wrapping_sub(to_ordered(old, W)) & all;
    let negative = d >> (nbits::<W>() - 1);
    let magnitude = if negative == 1 {
        d.wrapping_neg() & all
    } else {
        d
    };
    if d == 0 {
        unchanged::<W>()
    } else {
        ((magnitude - 1) << 1) | negative
    }
}

/// The step `d` (wrapping in 32 bits) of a valid code number `u`.
#[inline(always)]
fn step_of(u: u32) -> u32 {
    let negative = u & 1;
    let magnitude = (u >> 1) + 1;
    (magnitude ^ negative.wrapping_neg()).wrapping_add(negative)
}

/// Whether `u` is a valid code number for `nb`-bit elements (`2^nb − 2` and anything above
/// `2^nb − 1` are not).
#[inline(always)]
fn valid_code(u: u64, nb: u32) -> bool {
    let limit = mask(nb) - 1;
    u < limit || u == limit + 1
}

/// Slot of unchanged elements in the length histogram: above every real length (at most
/// `nb`), so [`best_params`] counts them as raw.
const UNCHANGED_SLOT: usize = 33;

/// Slots of the length histogram (a power of two: lengths index it without bounds checks).
const HIST: usize = 64;

/// Bit length histogram of one block: `[L]` for steps whose code number has `L` bits, and
/// `[UNCHANGED_SLOT]` for unchanged elements (always raw).
type Histogram = [u32; HIST];

/// The exact smallest `(k, c, bits)` for a block, preferring all-raw, then small `k`, then
/// small `c` on ties.
fn best_params(hist: &Histogram, items: u32, nb: u32) -> (u32, u32, u32) {
    let mut best = (0, 0, items * nb);
    for k in 0..nb {
        // Every code word with parameter k has at least k + 1 bits (short k + 1, long
        // 2L − k >= k + 2, raw c + nb >= nb + 1), and the bound grows with k: once it reaches
        // the best so far, no larger k can be smaller (ties keep the smaller k).
        if items * (k + 1) >= best.2 {
            break;
        }
        let short: u32 = hist[..=k as usize].iter().sum();
        let base = short * (k + 1);
        // A lower bound for every cap: a longer length L costs 2L − k bits coded or at least
        // nb + 1 raw, an unchanged element at least nb + 1. At or above the best so far, no
        // cap of this k is smaller (usually so for k = 1 past k = 0 on AdamW steps).
        let longer: u32 = (k + 1..=nb)
            .map(|l| hist[l as usize] * (2 * l - k).min(nb + 1))
            .sum();
        if base + longer + hist[UNCHANGED_SLOT] * (nb + 1) >= best.2 {
            continue;
        }
        // With cap c, lengths L = k + 1 .. k + c - 1 are gamma coded, the rest go raw.
        let mut coded = 0u32;
        let mut raw = items - short;
        for c in 1..=nb - k + 1 {
            let bits = base + coded + raw * (c + nb);
            if bits < best.2 {
                best = (k, c, bits);
            }
            let l = k + c;
            if l <= nb {
                coded += hist[l as usize] * (2 * l - k);
                raw -= hist[l as usize];
            }
        }
    }
    best
}

/// Code numbers below this (at most 8 bits, so code words of at most 16 bits when `k <= 15`)
/// are coded through a per-block table; the rest, unchanged and raw values take the general
/// path. On AdamW steps that is ~97% of the values.
const fn small<const W: usize>() -> u32 {
    if W == 1 {
        128
    } else {
        256
    }
}

/// A code word: `zeros` zero bits, then the low `len` bits of `tail` (`len <= 33`).
#[derive(Clone, Copy)]
struct Word {
    zeros: u32,
    tail: u64,
    len: u32,
}

/// Whether code number `u` goes raw in a block with parameters `(k, c)`: unchanged, or a
/// unary prefix `z` of `c` or more.
#[inline(always)]
fn is_raw<const W: usize>(u: u32, k: u32, c: u32) -> bool {
    u == unchanged::<W>() || bit_len(u as u64).saturating_sub(k) >= c
}

/// The code word of code number `u` with new bits `new_bits` in a block with parameters
/// `(k, c)`.
#[inline(always)]
fn code_word<const W: usize>(u: u32, new_bits: u32, k: u32, c: u32) -> Word {
    let l = bit_len(u as u64);
    let z = l.saturating_sub(k);
    if is_raw::<W>(u, k, c) {
        // c zeros, then the new bits.
        Word {
            zeros: c,
            tail: new_bits as u64,
            len: nbits::<W>(),
        }
    } else if z == 0 {
        // A one, then u in k bits.
        Word {
            zeros: 0,
            tail: ((u as u64) << 1) | 1,
            len: k + 1,
        }
    } else {
        // z zeros, a one, then u below its leading one.
        Word {
            zeros: z,
            tail: (((u ^ (1 << (l - 1))) as u64) << 1) | 1,
            len: l,
        }
    }
}

/// Writes `word`; only 4-byte elements have code words longer than one 56-bit store.
#[inline(always)]
fn put_word<const W: usize>(out: &mut BlockWriter<'_>, word: Word) {
    let total = word.zeros + word.len;
    if W <= 2 || total <= 56 {
        out.put(word.tail << word.zeros, total);
    } else {
        out.zeros(word.zeros);
        out.put(word.tail, word.len);
    }
}

/// Code numbers the writer's tables cover: all but ~1% of AdamW steps (steps of up to 512
/// ULPs), so that a group of three values rarely leaves the table path (a mispredicted
/// branch and the general path).
const TABLE: usize = 1024;

/// Code numbers below this are written from the [`SmallCodes`] table: all of [`TABLE`], but
/// for 1-byte elements only those below 128 (254 is their unchanged mark).
const fn held<const W: usize>() -> u32 {
    if W == 1 {
        128
    } else {
        TABLE as u32
    }
}

/// The code words of the code numbers below [`TABLE`] for one `k` whatever the cap (no value
/// raw). Built once per process and `k`.
struct KCodes {
    word: [u32; TABLE],
    /// Length of the code word; [`NOT_HELD`] when over 32 bits.
    len: [u8; TABLE],
    /// Unary prefix of the code word: a cap `c` at or below it makes the value raw.
    zeros: [u8; TABLE],
}

impl KCodes {
    fn new(k: u32) -> Self {
        let mut table = KCodes {
            word: [0; TABLE],
            len: [NOT_HELD; TABLE],
            zeros: [0; TABLE],
        };
        for u in 0..TABLE as u32 {
            // Never raw (nor unchanged: `u` is below every width's mark) with no cap.
            let word = code_word::<4>(u, 0, k, u32::MAX);
            let (total, i) = (word.zeros + word.len, u as usize);
            if total <= 32 {
                table.word[i] = (word.tail << word.zeros) as u32;
                table.len[i] = total as u8;
            }
            table.zeros[i] = word.zeros as u8;
        }
        table
    }

    fn get(k: u32) -> &'static KCodes {
        static TABLES: [OnceLock<Box<KCodes>>; 32] = [const { OnceLock::new() }; 32];
        TABLES[k as usize].get_or_init(|| Box::new(KCodes::new(k)))
    }
}

/// The code words of the code numbers below [`TABLE`] for one block's `(k, c)`: those of
/// [`KCodes`], with the values the cap sends raw left to the general path. Rebuilt when
/// `(k, c)` changes (rarely: most blocks of a tensor share them), a quick pass.
struct SmallCodes {
    key: Option<(u32, u32)>,
    word: [u32; TABLE],
    /// Length of the code word; [`NOT_HELD`] for the general path.
    len: [u8; TABLE],
}

/// [`SmallCodes`] length of values left to the general path: above the 48 bits of three
/// code words that share a store.
const NOT_HELD: u8 = 64;

impl SmallCodes {
    fn new() -> Self {
        SmallCodes {
            key: None,
            word: [0; TABLE],
            len: [NOT_HELD; TABLE],
        }
    }

    fn set(&mut self, k: u32, c: u32) {
        if self.key == Some((k, c)) {
            return;
        }
        self.key = Some((k, c));
        let codes = KCodes::get(k);
        self.word = codes.word;
        for (len, (&len_k, &zeros)) in self.len.iter_mut().zip(codes.len.iter().zip(&codes.zeros)) {
            *len = if zeros as u32 >= c { NOT_HELD } else { len_k };
        }
    }
}

/// Storage of code numbers in the encoder: 16 bits for narrow elements (so the loops over
/// them vectorize eight lanes wide), 32 for 4-byte ones.
trait Code: Copy + Into<u32> {
    fn of(u: u32) -> Self;

    /// The bit length histogram of one block's code numbers.
    fn histogram<const W: usize>(codes: &[Self]) -> Histogram;

    /// The code numbers as 16-bit ones, if they are.
    fn narrow(_codes: &[Self]) -> Option<&[u16]> {
        None
    }

    /// [`Code::histogram`] in the AVX2 build where there is one (narrow code numbers).
    ///
    /// # Safety
    ///
    /// The CPU must have the features of [`super::bits::x86_wide`].
    #[cfg(target_arch = "x86_64")]
    unsafe fn histogram_wide<const W: usize>(codes: &[Self]) -> Histogram {
        Self::histogram::<W>(codes)
    }
}

impl Code for u16 {
    fn of(u: u32) -> Self {
        u as u16
    }

    #[inline(always)]
    fn histogram<const W: usize>(codes: &[Self]) -> Histogram {
        histogram_narrow::<W>(codes)
    }

    fn narrow(codes: &[Self]) -> Option<&[u16]> {
        Some(codes)
    }

    #[cfg(target_arch = "x86_64")]
    #[inline(always)]
    unsafe fn histogram_wide<const W: usize>(codes: &[Self]) -> Histogram {
        if W == 2 && super::bits::x86_avx512() {
            if x86_gfni() {
                // SAFETY: the caller guarantees the features of `x86_wide`, and
                // `x86_avx512` and `x86_gfni` detected the rest.
                return unsafe { histogram_gfni::<W>(codes) };
            }
            // SAFETY: the caller guarantees the features of `x86_wide`, and
            // `x86_avx512` detected the rest.
            return unsafe { histogram_avx512::<W>(codes) };
        }
        // SAFETY: the caller guarantees the features.
        unsafe { histogram_avx2::<W>(codes) }
    }
}

impl Code for u32 {
    fn of(u: u32) -> Self {
        u
    }

    fn histogram<const W: usize>(codes: &[Self]) -> Histogram {
        histogram::<W, u32>(codes)
    }
}

fn encode_width<const W: usize>(old: &[u8], new: &[u8], out: &mut Vec<u8>) {
    if W <= 2 {
        #[cfg(target_arch = "x86_64")]
        if super::bits::x86_avx512() {
            // SAFETY: the function's only requirement is its target features, all of which
            // `x86_avx512` detected just above on this CPU.
            return unsafe { encode_narrow_avx512::<W>(old, new, out) };
        }
        if super::bits::x86_wide() {
            // SAFETY: the function's only requirement is its target features, all of which
            // `x86_wide` detected just above on this CPU.
            return unsafe { encode_narrow_avx2::<W>(old, new, out) };
        }
        encode_codes::<W, u16, false>(old, new, out)
    } else {
        encode_codes::<W, u32, false>(old, new, out)
    }
}

/// [`encode_codes`] of narrow elements compiled for AVX2: the passes over a block's code
/// numbers (computing them, the length histogram) go 16 lanes wide. Same bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
fn encode_narrow_avx2<const W: usize>(old: &[u8], new: &[u8], out: &mut Vec<u8>) {
    encode_codes::<W, u16, true>(old, new, out)
}

/// [`encode_narrow_avx2`] with AVX-512 F and BW too: the code numbers' loop goes 32 lanes
/// wide (~2 % faster at 50 % on Zen 4). Same bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,avx512f,avx512bw")]
fn encode_narrow_avx512<const W: usize>(old: &[u8], new: &[u8], out: &mut Vec<u8>) {
    encode_codes::<W, u16, true>(old, new, out)
}

#[inline(always)]
fn encode_codes<const W: usize, C: Code, const LANES: bool>(
    old: &[u8],
    new: &[u8],
    out: &mut Vec<u8>,
) {
    debug_assert_eq!(old.len(), new.len());
    let n = new.len() / W;
    if n == 0 {
        return;
    }
    let nb = nbits::<W>();
    let blocks = n.div_ceil(BLOCK);
    let dir_start = out.len();
    out.resize(dir_start + blocks * DIR_ENTRY, 0);
    let mut dir = Vec::with_capacity(blocks * DIR_ENTRY);
    let mut codes = [C::of(0); BLOCK];
    let mut table = SmallCodes::new();
    // The lane writer needs the AVX2 build's features: checked once here, so that calling
    // the lane build on a CPU without them stays sound.
    #[cfg(target_arch = "x86_64")]
    let (use_lanes, mut lanes) = (LANES && super::bits::x86_wide(), Lanes::new());
    let mut writer = BitWriter::new(out);
    let mut total_bits = 0u64;
    for (old, new) in old.chunks(BLOCK * W).zip(new.chunks(BLOCK * W)) {
        let new = new.as_chunks::<W>().0;
        let codes = &mut codes[..new.len()];
        // Code numbers first (a loop the compiler vectorizes).
        for ((code, a), b) in codes.iter_mut().zip(old.as_chunks::<W>().0).zip(new) {
            *code = C::of(step_code::<W>(le(a), le(b)));
        }
        #[cfg(target_arch = "x86_64")]
        let hist = if use_lanes {
            // SAFETY: `use_lanes` says that `x86_wide` detected the features it needs.
            unsafe { C::histogram_wide::<W>(codes) }
        } else {
            C::histogram::<W>(codes)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let hist = C::histogram::<W>(codes);
        let (k, c, bits) = best_params(&hist, codes.len() as u32, nb);
        dir.extend_from_slice(&(bits as u16).to_le_bytes());
        dir.push(k as u8);
        dir.push(c as u8);
        total_bits += bits as u64;
        #[cfg(target_arch = "x86_64")]
        if use_lanes && W <= 2 && c <= nb {
            writer.block(
                bits as u64,
                #[inline(always)]
                // SAFETY: `use_lanes` says that `x86_wide` detected the features it needs.
                |out| unsafe { write_lanes::<W, C>(out, &mut lanes, codes, new, k, c) },
            );
            continue;
        }
        {
            table.set(k, c);
            writer.block(
                bits as u64,
                #[inline(always)]
                |out| write_values::<W, C>(out, &table, codes, new, k, c),
            );
        }
    }
    debug_assert_eq!(writer.bits_since(dir_start + dir.len()), total_bits);
    writer.finish();
    out[dir_start..dir_start + dir.len()].copy_from_slice(&dir);
}

/// The bit length histogram of one block's code numbers. Small code numbers are counted by
/// value (no bit length to compute) in four interleaved histograms, so runs of equal values
/// do not serialize on one counter, and folded into lengths at the end.
fn histogram<const W: usize, C: Code>(codes: &[C]) -> Histogram {
    // At most BLOCK / 4 per counter.
    let mut by_value = [[0u16; 256]; 4];
    let mut hist: Histogram = [0; HIST];
    for quad in codes.chunks(4) {
        for (lane, &u) in by_value.iter_mut().zip(quad) {
            let u: u32 = u.into();
            if u < small::<W>() {
                lane[u as u8 as usize] += 1;
            } else if u == unchanged::<W>() {
                hist[UNCHANGED_SLOT] += 1;
            } else {
                hist[bit_len(u as u64) as usize % HIST] += 1;
            }
        }
    }
    // Values 2^(L-1) .. 2^L - 1 have length L.
    for (l, slot) in hist.iter_mut().enumerate().take(9) {
        let values = if l == 0 { 0..1 } else { 1 << (l - 1)..1 << l };
        *slot += by_value
            .iter()
            .map(|lane| lane[values.clone()].iter().map(|&c| c as u32).sum::<u32>())
            .sum::<u32>();
    }
    hist
}

/// [`histogram`] of narrow code numbers (`W <= 2`, at most [`BLOCK`] of them), from the
/// counts of code numbers below each power of two: compares and adds in 16-bit lanes that the
/// compiler vectorizes, with no counter in memory. (Counting by value stalls on runs of equal
/// values, the rule on AdamW steps: each increment waits for the previous one to the same
/// counter.)
#[inline(always)]
fn histogram_narrow<const W: usize>(codes: &[u16]) -> Histogram {
    debug_assert!(W <= 2 && codes.len() <= BLOCK);
    // below[j]: code numbers below 2^j, for j < 16 (all of them are below 2^16); every
    // count is at most BLOCK, so u16 sums cannot overflow.
    let count = |limit: u16| codes.iter().fold(0u16, |n, &u| n + (u < limit) as u16);
    let mut below = [0u16; 17];
    for (j, slot) in below.iter_mut().enumerate().take(nbits::<W>() as usize) {
        *slot = count(1 << j);
    }
    below[nbits::<W>() as usize] = codes.len() as u16;
    let marks = codes
        .iter()
        .fold(0u16, |n, &u| n + (u as u32 == unchanged::<W>()) as u16);
    let mut hist: Histogram = [0; HIST];
    hist[0] = below[0] as u32;
    for l in 1..=nbits::<W>() as usize {
        hist[l] = (below[l] - below[l - 1]) as u32;
    }
    // The unchanged mark has nb bits but is counted apart (always raw).
    hist[nbits::<W>() as usize] -= marks as u32;
    hist[UNCHANGED_SLOT] = marks as u32;
    hist
}

/// [`histogram_narrow`] in AVX2 byte lanes, 32 code numbers at a time: counts of code numbers
/// at or above each power of two up to 2^7 from their low byte saturated (`min(u, 255)`)
/// and from 2^8 on from their high byte, each a signed byte compare (bytes biased by 128)
/// against a constant, counted in byte lanes (at most 32 per lane in a block) and summed at
/// the end. Same histogram.
///
/// # Safety
///
/// The CPU must have the features of [`super::bits::x86_wide`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
#[inline]
unsafe fn histogram_avx2<const W: usize>(codes: &[u16]) -> Histogram {
    use std::arch::x86_64::*;
    debug_assert!(W <= 2 && codes.len() <= BLOCK);
    let n = codes.len();
    let nb = nbits::<W>();
    let bias = _mm256_set1_epi8(-128);
    // Thresholds 2^t − 1 for t = 0..8, biased: x > 2^t − 1 means x >= 2^t.
    let thresholds: [__m256i; 8] =
        std::array::from_fn(|t| _mm256_set1_epi8((((1u32 << t) - 1) ^ 0x80) as u8 as i8));
    let mark = _mm256_set1_epi16(unchanged::<W>() as u16 as i16);
    let byte = _mm256_set1_epi16(255);
    let sum = |acc: __m256i| {
        let s = _mm256_sad_epu8(acc, _mm256_setzero_si256());
        let s = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        (_mm_cvtsi128_si64(s) + _mm_extract_epi64::<1>(s)) as u32
    };
    let mut groups = codes.chunks_exact(32);
    // above[j]: code numbers at or above 2^j.
    let mut above = [0u32; 17];
    let mut marks;
    {
        let mut acc = [_mm256_setzero_si256(); 8];
        let mut acc_marks = _mm256_setzero_si256();
        for group in groups.by_ref() {
            // SAFETY: each load reads 16 of the group's 32 u16 (unaligned loads).
            let (a, b) = unsafe {
                (
                    _mm256_loadu_si256(group.as_ptr().cast()),
                    _mm256_loadu_si256(group[16..].as_ptr().cast()),
                )
            };
            // (`packus` saturates signed lanes: clamped to 255 first.)
            let (a_low, b_low) = (_mm256_min_epu16(a, byte), _mm256_min_epu16(b, byte));
            let low = _mm256_xor_si256(_mm256_packus_epi16(a_low, b_low), bias);
            for (acc, &t) in acc.iter_mut().zip(&thresholds) {
                *acc = _mm256_sub_epi8(*acc, _mm256_cmpgt_epi8(low, t));
            }
            let m = _mm256_packs_epi16(_mm256_cmpeq_epi16(a, mark), _mm256_cmpeq_epi16(b, mark));
            acc_marks = _mm256_sub_epi8(acc_marks, m);
        }
        for (t, &acc) in acc.iter().enumerate() {
            above[t] = sum(acc);
        }
        marks = sum(acc_marks);
    }
    if W == 2 {
        let mut acc = [_mm256_setzero_si256(); 8];
        for group in codes.chunks_exact(32) {
            // SAFETY: as above.
            let (a, b) = unsafe {
                (
                    _mm256_loadu_si256(group.as_ptr().cast()),
                    _mm256_loadu_si256(group[16..].as_ptr().cast()),
                )
            };
            let high = _mm256_packus_epi16(_mm256_srli_epi16::<8>(a), _mm256_srli_epi16::<8>(b));
            let high = _mm256_xor_si256(high, bias);
            for (acc, &t) in acc.iter_mut().zip(&thresholds) {
                *acc = _mm256_sub_epi8(*acc, _mm256_cmpgt_epi8(high, t));
            }
        }
        for (t, &acc) in acc.iter().enumerate() {
            above[8 + t] = sum(acc);
        }
    }
    for &u in groups.remainder() {
        for (j, slot) in above.iter_mut().enumerate().take(nb as usize) {
            *slot += (u as u32 >= 1 << j) as u32;
        }
        marks += (u as u32 == unchanged::<W>()) as u32;
    }
    let mut hist: Histogram = [0; HIST];
    // Length l: at or above 2^(l−1), below 2^l (none at or above 2^nb).
    hist[0] = n as u32 - above[0];
    for l in 1..=nb as usize {
        hist[l] = above[l - 1] - if l < nb as usize { above[l] } else { 0 };
    }
    // The unchanged mark has nb bits but is counted apart (always raw).
    hist[nb as usize] -= marks;
    hist[UNCHANGED_SLOT] = marks;
    hist
}

/// [`histogram_avx2`] of 2-byte elements without its pass over the high bytes: the code
/// numbers of 9 bits or more (and the unchanged mark), ~3 % of AdamW steps, are gathered by
/// one register compress per 32 (AVX-512 VBMI2, no branch) and counted by length one by one;
/// those below come from the low byte pass as before. Same histogram.
///
/// # Safety
///
/// The CPU must have the features of [`super::bits::x86_wide`] and of
/// [`super::bits::x86_avx512`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,avx512f,avx512bw,avx512vbmi2")]
#[inline(never)]
unsafe fn histogram_avx512<const W: usize>(codes: &[u16]) -> Histogram {
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;
    debug_assert!(W == 2 && codes.len() <= BLOCK);
    let n = codes.len();
    let bias = _mm256_set1_epi8(-128);
    // Thresholds 2^t − 1 for t = 0..8, biased: x > 2^t − 1 means x >= 2^t.
    let thresholds: [__m256i; 8] =
        std::array::from_fn(|t| _mm256_set1_epi8((((1u32 << t) - 1) ^ 0x80) as u8 as i8));
    let byte = _mm256_set1_epi16(255);
    let nine_bits = _mm512_set1_epi16(256);
    let sum = |acc: __m256i| {
        let s = _mm256_sad_epu8(acc, _mm256_setzero_si256());
        let s = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
        (_mm_cvtsi128_si64(s) + _mm_extract_epi64::<1>(s)) as u32
    };
    // The code numbers of 9 bits or more: each store writes 32 lanes, of which the first
    // `count_ones` are kept (room for a whole block plus one store).
    let mut wide = [MaybeUninit::<u16>::uninit(); BLOCK + 32];
    let mut gathered = 0usize;
    // above[j]: code numbers at or above 2^j.
    let mut above = [0u32; 8];
    let mut groups = codes.chunks_exact(32);
    {
        let mut acc = [_mm256_setzero_si256(); 8];
        for group in groups.by_ref() {
            // SAFETY: the loads read the group's 32 u16 (unaligned loads); the store writes
            // 32 u16 at `gathered <= BLOCK - 32` (fewer than `n - 32` were gathered before
            // this group), inside `wide`.
            let (a, b, v) = unsafe {
                (
                    _mm256_loadu_si256(group.as_ptr().cast()),
                    _mm256_loadu_si256(group[16..].as_ptr().cast()),
                    _mm512_loadu_si512(group.as_ptr().cast()),
                )
            };
            // (`packus` saturates signed lanes: clamped to 255 first.)
            let (a_low, b_low) = (_mm256_min_epu16(a, byte), _mm256_min_epu16(b, byte));
            let low = _mm256_xor_si256(_mm256_packus_epi16(a_low, b_low), bias);
            for (acc, &t) in acc.iter_mut().zip(&thresholds) {
                *acc = _mm256_sub_epi8(*acc, _mm256_cmpgt_epi8(low, t));
            }
            let m = _mm512_cmpge_epu16_mask(v, nine_bits);
            // SAFETY: see above.
            unsafe {
                _mm512_storeu_si512(
                    wide.as_mut_ptr().add(gathered).cast(),
                    _mm512_maskz_compress_epi16(m, v),
                )
            };
            gathered += m.count_ones() as usize;
        }
        for (t, &acc) in acc.iter().enumerate() {
            above[t] = sum(acc);
        }
    }
    histogram_from_counts::<W>(n, above, groups.remainder(), &mut wide, gathered)
}

/// Whether this CPU also runs [`histogram_gfni`] (Ice Lake and Zen 4 on), beyond
/// [`super::bits::x86_avx512`]. Detection is cached by the standard library.
#[cfg(target_arch = "x86_64")]
#[inline]
fn x86_gfni() -> bool {
    std::arch::is_x86_feature_detected!("gfni")
        && std::arch::is_x86_feature_detected!("avx512bitalg")
}

/// [`histogram_avx512`] with the counts below 2^8 by bit planes, 64 code numbers at a time:
/// their low bytes saturated (`min(u, 255)`) become thermometer codes `2^L − 1` (`L` the
/// bit length, two nibble lookups), an 8×8 bit transpose per 8 values (one GF(2) affine
/// instruction with the codes as the matrix) makes byte `t` of each quadword hold bit `t`
/// of its 8 values, and one byte popcount counts them at or above 2^t: three instructions
/// per 64 values where the byte compares take sixteen. Same histogram.
///
/// # Safety
///
/// The CPU must have the features of [`super::bits::x86_wide`], of
/// [`super::bits::x86_avx512`] and of [`x86_gfni`].
#[cfg(target_arch = "x86_64")]
#[target_feature(
    enable = "avx2,bmi1,bmi2,lzcnt,popcnt,avx512f,avx512bw,avx512vbmi2,gfni,avx512bitalg"
)]
#[inline(never)]
unsafe fn histogram_gfni<const W: usize>(codes: &[u16]) -> Histogram {
    use std::arch::x86_64::*;
    use std::mem::MaybeUninit;
    debug_assert!(W == 2 && codes.len() <= BLOCK);
    let n = codes.len();
    let nine_bits = _mm512_set1_epi16(256);
    let byte = _mm512_set1_epi16(255);
    let nibble = _mm512_set1_epi8(0x0f);
    // 2^L − 1 for the bit length L of the low nibble, and of the high one (plus 4).
    let low_table = _mm512_broadcast_i32x4(_mm_setr_epi8(
        0, 1, 3, 3, 7, 7, 7, 7, 15, 15, 15, 15, 15, 15, 15, 15,
    ));
    let high_table = _mm512_broadcast_i32x4(_mm_setr_epi8(
        0, 0x1f, 0x3f, 0x3f, 0x7f, 0x7f, 0x7f, 0x7f, -1, -1, -1, -1, -1, -1, -1, -1,
    ));
    // Byte j of each quadword: 1 << j (picks bit j of each of the matrix's 8 bytes).
    let one_hot = _mm512_set1_epi64(0x8040_2010_0804_0201_u64 as i64);
    // The code numbers of 9 bits or more: each store writes 32 lanes, of which the first
    // `count_ones` are kept (room for a whole block plus one store).
    let mut wide = [MaybeUninit::<u16>::uninit(); BLOCK + 32];
    let mut gathered = 0usize;
    // Byte 8q + t: values of quadword q (of each 64) at or above 2^t; at most 8 per 64
    // values, 128 per block.
    let mut planes = _mm512_setzero_si512();
    let mut groups = codes.chunks_exact(64);
    for group in groups.by_ref() {
        let mut halves = [_mm512_setzero_si512(); 2];
        for (half, thirty_two) in halves.iter_mut().zip(group.chunks_exact(32)) {
            // SAFETY: the load reads 32 u16 of the group (unaligned); the store writes 32
            // u16 at `gathered <= BLOCK - 32` (fewer than `n - 32` were gathered before
            // these 32), inside `wide`.
            unsafe {
                let v = _mm512_loadu_si512(thirty_two.as_ptr().cast());
                let m = _mm512_cmpge_epu16_mask(v, nine_bits);
                _mm512_storeu_si512(
                    wide.as_mut_ptr().add(gathered).cast(),
                    _mm512_maskz_compress_epi16(m, v),
                );
                gathered += m.count_ones() as usize;
                *half = _mm512_min_epu16(v, byte);
            }
        }
        // The low bytes saturated, in any order (`packus` saturates signed lanes: clamped
        // to 255 first; a down-converting move is slower).
        let low = _mm512_packus_epi16(halves[0], halves[1]);
        let thermometer = _mm512_or_si512(
            _mm512_shuffle_epi8(low_table, _mm512_and_si512(low, nibble)),
            _mm512_shuffle_epi8(
                high_table,
                _mm512_and_si512(_mm512_srli_epi16::<4>(low), nibble),
            ),
        );
        let transposed = _mm512_gf2p8affine_epi64_epi8::<0>(one_hot, thermometer);
        planes = _mm512_add_epi8(planes, _mm512_popcnt_epi8(transposed));
    }
    let mut counts = [0u8; 64];
    // SAFETY: a 64-byte store into a 64-byte array.
    unsafe { _mm512_storeu_si512(counts.as_mut_ptr().cast(), planes) };
    // above[t]: code numbers at or above 2^t.
    let mut above = [0u32; 8];
    for (t, slot) in above.iter_mut().enumerate() {
        for q in 0..8 {
            *slot += counts[8 * q + t] as u32;
        }
    }
    histogram_from_counts::<W>(n, above, groups.remainder(), &mut wide, gathered)
}

/// The length histogram of `n` narrow code numbers, the tail of the two AVX-512 builds: they
/// counted in `above[t]` those at or above 2^t (t < 8) and listed the first `gathered` of 9
/// bits or more in `wide`, over all but `remainder` (fewer than one vector), counted here.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn histogram_from_counts<const W: usize>(
    n: usize,
    mut above: [u32; 8],
    remainder: &[u16],
    wide: &mut [MaybeUninit<u16>; BLOCK + 32],
    mut gathered: usize,
) -> Histogram {
    for &u in remainder {
        for (t, slot) in above.iter_mut().enumerate() {
            *slot += (u as u32 >= 1 << t) as u32;
        }
        if u >= 256 {
            wide[gathered] = MaybeUninit::new(u);
            gathered += 1;
        }
    }
    // SAFETY: the first `gathered` entries of `wide` were written (each vector store's first
    // `count_ones` lanes by the caller, each remainder value above).
    let wide = unsafe { std::slice::from_raw_parts(wide.as_ptr().cast::<u16>(), gathered) };
    let mut hist: Histogram = [0; HIST];
    for &u in wide {
        // The unchanged mark (16 bits) counted apart (always raw).
        if u as u32 == unchanged::<W>() {
            hist[UNCHANGED_SLOT] += 1;
        } else {
            hist[bit_len(u as u64) as usize % HIST] += 1;
        }
    }
    // Length l <= 8: at or above 2^(l−1), below 2^l (at or above 2^8: those listed).
    hist[0] = n as u32 - above[0];
    for l in 1..8 {
        hist[l] = above[l - 1] - above[l];
    }
    hist[8] = above[7] - wide.len() as u32;
    hist
}

/// Writes the code words of one block: code numbers `codes`, new bit patterns `new` (for
/// raw values), with parameters `(k, c)` and `table` filled for them. Code numbers the
/// table holds go three to a store when their code words fit one (nearly always).
#[inline(always)]
fn write_values<const W: usize, C: Code>(
    out: &mut BlockWriter<'_>,
    table: &SmallCodes,
    codes: &[C],
    new: &[[u8; W]],
    k: u32,
    c: u32,
) {
    // One value by the table when it has it, else by the general path.
    let one = |out: &mut BlockWriter<'_>, u: u32, i: usize| {
        let len = table.len[u as usize % TABLE] as u32;
        if u < held::<W>() && len <= 32 {
            out.put(table.word[u as usize % TABLE] as u64, len);
        } else {
            put_word::<W>(out, code_word::<W>(u, le(&new[i]), k, c));
        }
    };
    let mut triples = codes.chunks_exact(3);
    for (t, u) in (&mut triples).enumerate() {
        let u: [u32; 3] = [u[0].into(), u[1].into(), u[2].into()];
        let [i0, i1, i2] = u.map(|u| u as usize % TABLE);
        let [l0, l1, l2] = [i0, i1, i2].map(|i| table.len[i] as u32);
        // Entries the table does not hold have length 64, so one sum checks all three.
        if (u[0] | u[1] | u[2]) < held::<W>() && l0 + l1 + l2 <= 48 {
            let word = table.word[i0] as u64
                | (table.word[i1] as u64) << l0
                | (table.word[i2] as u64) << (l0 + l1);
            out.put(word, l0 + l1 + l2);
        } else {
            for (j, u) in u.into_iter().enumerate() {
                one(out, u, 3 * t + j);
            }
        }
    }
    let done = codes.len() - triples.remainder().len();
    for (j, &u) in triples.remainder().iter().enumerate() {
        one(out, u.into(), done + j);
    }
}

// The lane writer's scratch holds a whole block.
#[cfg(target_arch = "x86_64")]
const _: () = assert!(BLOCK <= super::bits::LANES_MAX);

/// Bit length of `u < 2^24` from the exponent of its exact `f32` conversion: one vector
/// conversion and two integer operations per lane where `leading_zeros` has no vector
/// instruction (AVX2).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn bit_len_f32(u: u32) -> u32 {
    debug_assert!(u < 1 << 24);
    // 1 <= u: the exponent is 127 + floor(log2 u), so the length is exponent - 126; 0 has
    // exponent 0 and length 0.
    ((u as i32 as f32).to_bits() >> 23).max(126) - 126
}

/// [`write_values`] of narrow elements with a cap `c <= nb` (every code word then fits 32
/// bits) in the AVX2 build: each value's code word and length in one loop the compiler
/// vectorizes (no table, no branch), then the words of eight consecutive values joined in
/// vector lanes and written by one store when they fit 56 bits together (nearly always at
/// `k = 0`); blocks with `k = 0` (nearly all of AdamW steps) by [`write_k0`], all in
/// registers. Same bits as [`write_values`].
///
/// # Safety
///
/// The CPU must have the features of [`super::bits::x86_wide`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
#[inline]
unsafe fn write_lanes<const W: usize, C: Code>(
    out: &mut BlockWriter<'_>,
    lanes: &mut Lanes,
    codes: &[C],
    new: &[[u8; W]],
    k: u32,
    c: u32,
) {
    let nb = nbits::<W>();
    debug_assert!(W <= 2 && c <= nb && k < nb);
    let m = codes.len().min(BLOCK);
    let Lanes { word, len } = lanes;
    if k == 0 {
        if let Some(codes) = C::narrow(codes) {
            if super::bits::x86_avx512() {
                // SAFETY: `x86_avx512` detected the AVX-512 features, and this function's
                // are the rest of those `write_k0_avx512` needs.
                unsafe { write_k0_avx512::<W>(out, &codes[..m], &new[..m], c) };
                return;
            }
            // SAFETY: this function's features are those `write_k0` needs.
            unsafe { write_k0::<W>(out, &codes[..m], &new[..m], c) };
            return;
        }
    }
    for (((w, l), &u), b) in word[..m]
        .iter_mut()
        .zip(&mut len[..m])
        .zip(&codes[..m])
        .zip(&new[..m])
    {
        let u: u32 = u.into();
        let bits = bit_len_f32(u);
        // Unary prefix (0 for a short word), and whether the value goes raw.
        let z = bits.max(k) - k;
        // All ones when raw (`|` of bools, not `||`: no branch, so the loop vectorizes).
        let raw = (((u == unchanged::<W>()) | (z >= c)) as u32).wrapping_neg();
        // Short (bits <= k): a one, then u in k bits. Long: z zeros, a one, then u below its
        // leading one. Both are `((u without its leading one if long) << 1 | 1) << z`.
        let lead = ((1 << bits) >> 1) & ((bits > k) as u32).wrapping_neg();
        let coded = (((u ^ lead) << 1) | 1) << z;
        let coded_len = z + bits.max(k + 1);
        // Raw: c zeros, then the new bits (c + nb <= 2 nb <= 32 bits).
        *w = (le(b) << c) & raw | coded & !raw;
        *l = (c + nb) & raw | coded_len & !raw;
    }
    // Every code word has at most 32 bits here: no value for the general path.
    put_words(out, &word[..m], &len[..m], |_, _| unreachable!());
}

/// The k = 0 words of [`write_lanes`] (narrow elements, cap `c <= nb`) computed eight at a
/// time in vector registers and joined there as [`put_words`] joins them (pairs, quads, the
/// octet by one store when it has at most 56 bits; else through `put_words`), with no
/// scratch lanes in between. z is the bit length (from the exponent of the exact `f32`
/// conversion), and the unchanged mark (nb bits, `c <= nb`) is raw by its length alone. Same
/// bits.
///
/// # Safety
///
/// The CPU must have the features of [`super::bits::x86_wide`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
#[inline(never)]
unsafe fn write_k0<const W: usize>(
    out: &mut BlockWriter<'_>,
    codes: &[u16],
    new: &[[u8; W]],
    c: u32,
) {
    use std::arch::x86_64::*;
    let nb = nbits::<W>();
    debug_assert!(W <= 2 && c <= nb && codes.len() == new.len());
    let one = _mm256_set1_epi32(1);
    let exponent_bias = _mm256_set1_epi32(126);
    let exponent_only = _mm256_castsi256_ps(_mm256_set1_epi32(0xff80_0000_u32 as i32));
    let cap_less_one = _mm256_set1_epi32(c as i32 - 1);
    let cap = _mm_cvtsi32_si128(c as i32);
    let raw_len = _mm256_set1_epi32((c + nb) as i32);
    let octets = codes.len() / 8;
    for (u, b) in codes.chunks_exact(8).zip(new.chunks_exact(8)) {
        // SAFETY: the loads read the 16 bytes of eight u16 and the 8 W bytes of eight
        // elements (unaligned loads).
        let (u, b) = unsafe {
            let u = _mm256_cvtepu16_epi32(_mm_loadu_si128(u.as_ptr().cast()));
            let b = if W == 1 {
                _mm256_cvtepu8_epi32(_mm_loadl_epi64(b.as_ptr().cast()))
            } else {
                _mm256_cvtepu16_epi32(_mm_loadu_si128(b.as_ptr().cast()))
            };
            (u, b)
        };
        // Bit length: exponent − 126, saturating at 0 (the exponent fits 16 bits); the leading
        // one (0 for 0) back from the conversion without its mantissa.
        let f = _mm256_cvtepi32_ps(u);
        let e = _mm256_srli_epi32::<23>(_mm256_castps_si256(f));
        let bits = _mm256_subs_epu16(e, exponent_bias);
        let raw = _mm256_cmpgt_epi32(bits, cap_less_one);
        let lead = _mm256_cvttps_epi32(_mm256_and_ps(f, exponent_only));
        let body = _mm256_xor_si256(u, lead);
        let coded = _mm256_sllv_epi32(_mm256_or_si256(_mm256_add_epi32(body, body), one), bits);
        let coded_len = _mm256_max_epu32(_mm256_add_epi32(bits, bits), one);
        let w = _mm256_blendv_epi8(coded, _mm256_sll_epi32(b, cap), raw);
        let l = _mm256_blendv_epi8(coded_len, raw_len, raw);
        // Pairs, quads and the octet, as in `put_words`.
        // (Lengths are below 256: one byte sum adds each pair's.)
        let pair_len = _mm256_sad_epu8(l, _mm256_setzero_si256());
        // SAFETY: this function has AVX2.
        let Joined {
            quad0,
            quad1,
            len0,
            len1,
            ..
        } = unsafe { join_eight(w, l, pair_len) };
        let octet_len = _mm_cvtsi128_si64(_mm_add_epi64(len0, len1)) as u64;
        if octet_len <= 56 {
            let octet = _mm_or_si128(quad0, _mm_sllv_epi64(quad1, len0));
            out.put(_mm_cvtsi128_si64(octet) as u64, octet_len as u32);
            continue;
        }
        let (mut words, mut lens) = ([0u32; 8], [0u32; 8]);
        // SAFETY: each store writes the 32 bytes of an 8-element u32 array.
        unsafe {
            _mm256_storeu_si256(words.as_mut_ptr().cast(), w);
            _mm256_storeu_si256(lens.as_mut_ptr().cast(), l);
        }
        put_words(out, &words, &lens, |_, _| unreachable!());
    }
    // The last values (fewer than eight) one by one.
    for (&u, b) in codes.iter().zip(new).skip(8 * octets) {
        let word = code_word::<W>(u as u32, le(b), 0, c);
        put_word::<W>(out, word);
    }
}

/// Sixteen values in [`write_k0_avx512`].
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct Sixteen {
    /// Their code words and lengths, in u32 lanes.
    words: std::arch::x86_64::__m512i,
    lens: std::arch::x86_64::__m512i,
    /// Their two octets joined (garbage when over 56 bits), and the octets' lengths.
    octets: [u64; 2],
    octet_lens: [u64; 2],
}

/// [`write_k0`] sixteen values at a time in AVX-512 registers: the bit length by one
/// leading-zero count, the word `((u without its leading one) << 1 | 1) << z` by one
/// three-input logic operation and two shifts, raw values chosen by a mask register, and the
/// words joined in the register (pairs, quads, then each octet by one store when it has at
/// most 56 bits, nearly always at k = 0). Same bits.
///
/// # Safety
///
/// The CPU must have the features [`super::bits::x86_avx512`] checks.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,avx512f,avx512bw,avx512cd")]
#[inline(never)]
unsafe fn write_k0_avx512<const W: usize>(
    out: &mut BlockWriter<'_>,
    codes: &[u16],
    new: &[[u8; W]],
    c: u32,
) {
    use std::arch::x86_64::*;
    let nb = nbits::<W>();
    debug_assert!(W <= 2 && c <= nb && codes.len() == new.len());
    let one = _mm512_set1_epi32(1);
    let thirty_two = _mm512_set1_epi32(32);
    let cap_vec = _mm512_set1_epi32(c as i32);
    let cap = _mm_cvtsi32_si128(c as i32);
    let raw_len = _mm512_set1_epi32((c + nb) as i32);
    let low = _mm512_set1_epi64(0xffff_ffff);
    // The second quad of each octet (64-bit lanes 2 and 6) to lanes 0 and 4.
    let next_quad = _mm512_setr_epi64(2, 3, 0, 1, 6, 7, 4, 5);
    // The words and lengths of sixteen values, and their two octets joined.
    let sixteen = |u: &[u16], b: &[[u8; W]]| {
        debug_assert!(u.len() >= 16 && b.len() >= 16);
        // SAFETY: the loads read the 32 bytes of sixteen u16 and the 16 W bytes of sixteen
        // elements (unaligned loads).
        let (u, b) = unsafe {
            let u = _mm512_cvtepu16_epi32(_mm256_loadu_si256(u.as_ptr().cast()));
            let b = if W == 1 {
                _mm512_cvtepu8_epi32(_mm_loadu_si128(b.as_ptr().cast()))
            } else {
                _mm512_cvtepu16_epi32(_mm256_loadu_si256(b.as_ptr().cast()))
            };
            (u, b)
        };
        let bits = _mm512_sub_epi32(thirty_two, _mm512_lzcnt_epi32(u));
        let raw = _mm512_cmpge_epu32_mask(bits, cap_vec);
        // (2u | 1) ^ (2^bits without its bit 0): 2^bits is the leading one of 2u (none when
        // u = 0, bits = 0, where its bit 0 would clear the one).
        let lead = _mm512_sllv_epi32(one, bits);
        let body = _mm512_ternarylogic_epi32::<0xde>(_mm512_add_epi32(u, u), one, lead);
        let coded = _mm512_sllv_epi32(body, bits);
        let coded_len = _mm512_max_epu32(_mm512_add_epi32(bits, bits), one);
        let w = _mm512_mask_blend_epi32(raw, coded, _mm512_sll_epi32(b, cap));
        let l = _mm512_mask_blend_epi32(raw, coded_len, raw_len);
        // Pairs (lengths are below 256: one byte sum adds each pair's), quads, octets.
        let even_len = _mm512_and_si512(l, low);
        let pair = _mm512_or_si512(
            _mm512_and_si512(w, low),
            _mm512_sllv_epi64(_mm512_srli_epi64::<32>(w), even_len),
        );
        let pair_len = _mm512_sad_epu8(l, _mm512_setzero_si512());
        // SAFETY: this function has AVX-512F.
        let high_pair = unsafe { sllv_epi64(_mm512_bsrli_epi128::<8>(pair), pair_len) };
        let quad = _mm512_or_si512(pair, high_pair);
        let quad_len = _mm512_add_epi64(pair_len, _mm512_bsrli_epi128::<8>(pair_len));
        // SAFETY: this function has AVX-512F.
        let high_quad = unsafe { sllv_epi64(_mm512_permutexvar_epi64(next_quad, quad), quad_len) };
        let octet = _mm512_or_si512(quad, high_quad);
        let octet_len = _mm512_add_epi64(quad_len, _mm512_permutexvar_epi64(next_quad, quad_len));
        let (octet0, octet1) = (
            _mm512_castsi512_si128(octet),
            _mm512_extracti32x4_epi32::<2>(octet),
        );
        let (len0, len1) = (
            _mm512_castsi512_si128(octet_len),
            _mm512_extracti32x4_epi32::<2>(octet_len),
        );
        Sixteen {
            words: w,
            lens: l,
            octets: [_mm_cvtsi128_si64(octet0), _mm_cvtsi128_si64(octet1)].map(|o| o as u64),
            octet_lens: [_mm_cvtsi128_si64(len0), _mm_cvtsi128_si64(len1)].map(|l| l as u64),
        }
    };
    // One store per octet: the sixteen words together exceed 56 bits a quarter of the time
    // at k = 0 on AdamW steps, a branch that fresh data mispredicts (a third slower than the
    // AVX2 writer then); an octet nearly never does.
    let put_sixteen = |out: &mut BlockWriter<'_>, x: Sixteen| {
        let ([octet0, octet1], [first, second]) = (x.octets, x.octet_lens);
        if first <= 56 && second <= 56 {
            out.put(octet0, first as u32);
            out.put(octet1, second as u32);
            return;
        }
        let (mut words, mut lens) = ([0u32; 16], [0u32; 16]);
        // SAFETY: each store writes the 64 bytes of a 16-element u32 array.
        unsafe {
            _mm512_storeu_si512(words.as_mut_ptr().cast(), x.words);
            _mm512_storeu_si512(lens.as_mut_ptr().cast(), x.lens);
        }
        put_words(out, &words, &lens, |_, _| unreachable!());
    };
    // Thirty-two values per loop, one branch for their four octets (~2 % faster than one
    // branch per sixteen).
    for (u, b) in codes.chunks_exact(32).zip(new.chunks_exact(32)) {
        let (x, y) = (sixteen(u, b), sixteen(&u[16..], &b[16..]));
        let ([x0, x1], [y0, y1]) = (x.octet_lens, y.octet_lens);
        if (x0 > 56) | (x1 > 56) | (y0 > 56) | (y1 > 56) {
            put_sixteen(out, x);
            put_sixteen(out, y);
            continue;
        }
        out.put(x.octets[0], x0 as u32);
        out.put(x.octets[1], x1 as u32);
        out.put(y.octets[0], y0 as u32);
        out.put(y.octets[1], y1 as u32);
    }
    let mut done = 32 * (codes.len() / 32);
    if codes.len() - done >= 16 {
        put_sixteen(out, sixteen(&codes[done..], &new[done..]));
        done += 16;
    }
    // The last values (fewer than sixteen) by the AVX2 writer.
    // SAFETY: the caller guarantees the features of `x86_wide`.
    unsafe { write_k0::<W>(out, &codes[done..], &new[done..], c) };
}

/// `vpsllvq` (lanes shifted by counts of 64 or more become 0) as one instruction: the
/// intrinsic, where the result is or-ed, compiles to a compare for counts of 64 or more and
/// a masked `or` (two extra instructions per sixteen values in [`write_k0_avx512`], ~4 % of
/// a half-dense ulp encode). Same lanes.
///
/// # Safety
///
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
#[inline]
unsafe fn sllv_epi64(
    a: std::arch::x86_64::__m512i,
    count: std::arch::x86_64::__m512i,
) -> std::arch::x86_64::__m512i {
    let shifted;
    // SAFETY: one AVX-512F register instruction (the caller guarantees the feature), no
    // memory, stack or flags touched.
    unsafe {
        std::arch::asm!(
            "vpsllvq {shifted}, {a}, {count}",
            shifted = lateout(zmm_reg) shifted,
            a = in(zmm_reg) a,
            count = in(zmm_reg) count,
            options(pure, nomem, nostack, preserves_flags),
        );
    }
    shifted
}

/// Marks a decoded raw value (narrow elements: code numbers of an accepted code word have
/// at most 30 bits, so bit 31 is free).
const TAG: u32 = 1 << 31;

/// Decodes the code word in the low bits of `word` for a block with parameters `(k, c)`
/// (narrow elements, `k <= 15`, `c <= 17`, so a code word is at most 47 bits): the code
/// number, or the new bits with [`TAG`] for a raw value, and the code word's length.
#[inline(always)]
fn narrow_word<const W: usize>(word: u64, k: u32, c: u32) -> (u32, u32) {
    let nb = nbits::<W>();
    let z = word.trailing_zeros();
    if z >= c {
        (TAG | ((word >> c) & mask(nb)) as u32, c + nb)
    } else {
        // Short (z = 0): k payload bits. Long: z + k − 1 bits below a leading one.
        let long = (z != 0) as u32;
        let len = z + k - long;
        let u = ((word >> (z + 1)) & mask(len)) | ((long as u64) << len);
        (u as u32, z + 1 + len)
    }
}

/// Multi-symbol decoding table for blocks with parameter `k` (narrow elements): for each
/// value of the next [`LOOKUP`] stream bits, the code numbers of the code words that lie
/// wholly inside them (at most 8), their total length, and the smallest cap `c` under which
/// none of them is raw. On AdamW steps (k = 0, mostly 1- and 2-bit code words, ~2.2 bits a
/// value) one lookup yields ~5 values (~3.8 on the benchmark chunk's ~3 bits a value).
struct StepTable {
    /// The code numbers (those below 256: a byte each, so that 12-bit lookups read no more
    /// of the table than 10-bit ones of 16-bit numbers did), padded to 8.
    codes: [[u8; 8]; LOOKUP_SIZE],
    count: [u8; LOOKUP_SIZE],
    bits: [u8; LOOKUP_SIZE],
    /// Smallest `c` the entry holds for; 255 when it holds no code word.
    min_c: [u8; LOOKUP_SIZE],
    /// `bits | count << 8 | min_c << 16` of each entry: one load for all three.
    meta: [u32; LOOKUP_SIZE],
    /// The largest `min_c` of an entry that holds code words: under a cap at least this,
    /// every entry holds (see [`fast_step`]).
    max_c: u32,
}

/// A table entry's code numbers into a block's (one widening load and a store).
#[inline(always)]
fn widen(to: &mut [u16], codes: &[u8; 8]) {
    for (t, &u) in to.iter_mut().zip(codes) {
        *t = u as u16;
    }
}

/// Largest `k` with a [`StepTable`] (code words of larger ones are long: few per lookup).
const TABLE_K: u32 = 7;

/// Stream bits a [`StepTable`] lookup reads: 12 (the loop reads 40 KiB of the table, most
/// of it seldom; on Zen 4, 11 bits decode ~1.5 % and 10 ~4 % slower, 13 ~8 % slower).
const LOOKUP: u32 = 12;
const LOOKUP_SIZE: usize = 1 << LOOKUP;

impl StepTable {
    fn new(k: u32, nb: u32) -> Self {
        let mut table = StepTable {
            codes: [[0; 8]; LOOKUP_SIZE],
            count: [0; LOOKUP_SIZE],
            bits: [0; LOOKUP_SIZE],
            min_c: [255; LOOKUP_SIZE],
            meta: [0; LOOKUP_SIZE],
            max_c: 0,
        };
        for x in 0..LOOKUP_SIZE as u32 {
            let (mut at, mut count, mut min_c) = (0, 0, 0);
            while count < 8 {
                // The code word at bit `at`, if it ends by bit LOOKUP: only bits below are known.
                let rest = x >> at;
                let z = (rest | 1 << (LOOKUP - at)).trailing_zeros();
                let (len, u) = if z == 0 {
                    (k + 1, (rest >> 1) & mask(k) as u32)
                } else {
                    let l = z + k;
                    (
                        2 * l - k,
                        (rest >> (z + 1)) & mask(l - 1) as u32 | 1 << (l - 1),
                    )
                };
                // An invalid code number (FP8: 254, at k >= 6) is left to the path that
                // reports it, a number above a byte to the arithmetic.
                if z >= LOOKUP - at || at + len > LOOKUP || !valid_code(u as u64, nb) || u > 255 {
                    break;
                }
                table.codes[x as usize][count] = u as u8;
                min_c = min_c.max(z + 1);
                count += 1;
                at += len;
            }
            if count > 0 {
                let x = x as usize;
                (table.count[x], table.bits[x], table.min_c[x]) =
                    (count as u8, at as u8, min_c as u8);
                table.max_c = table.max_c.max(min_c);
            }
            let x = x as usize;
            table.meta[x] =
                table.bits[x] as u32 | (table.count[x] as u32) << 8 | (table.min_c[x] as u32) << 16;
        }
        table
    }

    /// The table for `W`-byte elements (`W <= 2`) and `k <= TABLE_K`, built once per
    /// process.
    fn get<const W: usize>(k: u32) -> &'static StepTable {
        type Tables = [OnceLock<Box<StepTable>>; TABLE_K as usize + 1];
        static TABLES: [Tables; 2] =
            [const { [const { OnceLock::new() }; TABLE_K as usize + 1] }; 2];
        TABLES[(W - 1) % 2][k as usize].get_or_init(|| Box::new(StepTable::new(k, nbits::<W>())))
    }
}

/// The steps of one block of narrow elements being decoded, and its raw values apart: those
/// are written over the stepped values afterwards, so decoding them does not read the old
/// bits (a cache miss on data as large as a real chunk's, in the chain of lookups).
struct BlockSteps {
    /// The code numbers (anything at raw values), room for 8 past the block: the apply
    /// turns them into steps in vector lanes, off the decoding loop.
    u: [u16; BLOCK + 8],
    /// Index in the block and new bits of each raw value.
    raw_at: [u16; BLOCK],
    raw_bits: [u16; BLOCK],
    raws: usize,
}

impl BlockSteps {
    fn new() -> Box<Self> {
        Box::new(BlockSteps {
            u: [0; BLOCK + 8],
            raw_at: [0; BLOCK],
            raw_bits: [0; BLOCK],
            raws: 0,
        })
    }

    /// Records value `i` of the block from one code word decoded into `t` (see
    /// [`narrow_word`]). Fails with `i` for an invalid code number.
    #[inline(always)]
    fn word<const W: usize>(&mut self, t: u32, i: usize) -> Result<(), usize> {
        if t & TAG != 0 {
            // At most one per value of the block, so fewer than BLOCK.
            let r = self.raws % BLOCK;
            (self.raw_at[r], self.raw_bits[r]) = (i as u16, t as u16);
            self.raws += 1;
            self.u[i] = 0;
            Ok(())
        } else if valid_code(t as u64, nbits::<W>()) {
            self.u[i] = t as u16;
            Ok(())
        } else {
            Err(i)
        }
    }

    /// [`BlockSteps::apply`] compiled for AVX2 (16 lanes).
    ///
    /// # Safety
    ///
    /// The CPU must have the features of [`super::bits::x86_wide`].
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
    fn apply_wide<const W: usize>(&self, old: &[[u8; W]], out: &mut [[MaybeUninit<u8>; W]]) {
        self.apply(old, out)
    }

    /// [`BlockSteps::apply`] compiled for AVX-512 (32 lanes).
    ///
    /// # Safety
    ///
    /// The CPU must have the features [`super::bits::x86_avx512`] checks.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,avx512f,avx512bw")]
    fn apply_avx512<const W: usize>(&self, old: &[[u8; W]], out: &mut [[MaybeUninit<u8>; W]]) {
        self.apply(old, out)
    }

    /// The new bits of the block's values from their old bits: stepped (a loop the compiler
    /// vectorizes, writing every value of `out` that `old` has), then the raw values written.
    #[inline(always)]
    fn apply<const W: usize>(&self, old: &[[u8; W]], out: &mut [[MaybeUninit<u8>; W]]) {
        let all = mask(nbits::<W>()) as u16;
        for ((&u, a), o) in self.u.iter().zip(old).zip(out.iter_mut()) {
            // `step_of` in 16 bits (a valid code number has at most 16).
            let negative = u & 1;
            let d = (((u >> 1) + 1) ^ negative.wrapping_neg()).wrapping_add(negative);
            let stepped = ord16::<W>(le(a) as u16).wrapping_add(d) & all;
            *o = to_le::<W>(unord16::<W>(stepped) as u32).map(MaybeUninit::new);
        }
        for (&at, &bits) in self.raw_at.iter().zip(&self.raw_bits).take(self.raws) {
            if let Some(o) = out.get_mut(at as usize) {
                *o = to_le::<W>(bits as u32).map(MaybeUninit::new);
            }
        }
    }
}

/// The decoding of one block of narrow elements in progress: `steps[..i]` decoded, the next
/// stream bits (from `pos`) in a register, `avail` of them the stream's.
///
/// The register is refilled by a load when fewer are left than a lookup needs (every ~7
/// lookups), or than the 33 bits a long or raw code word may need on that path, so the
/// chain from one lookup to the next is the entry's load and a shift.
struct StepCursor {
    buf: u64,
    avail: u32,
    /// Stream position just past the bits of `buf` that are the stream's: the next bit is at
    /// `top - avail` (so consuming bits updates `avail` only).
    top: usize,
    i: usize,
}

impl StepCursor {
    #[inline(always)]
    fn new(reader: BitReader<'_>, pos: usize) -> Self {
        let mut cursor = StepCursor {
            buf: 0,
            avail: 0,
            top: pos,
            i: 0,
        };
        cursor.reload(reader);
        cursor
    }

    /// Stream position of the next bit.
    #[inline(always)]
    fn pos(&self) -> usize {
        self.top - self.avail as usize
    }

    #[inline(always)]
    fn reload(&mut self, reader: BitReader<'_>) {
        let pos = self.pos();
        self.buf = reader.peek(pos);
        self.avail = 64 - (pos & 7) as u32;
        self.top = pos + self.avail as usize;
    }

    /// One lookup in `table` (the block's `k`), or one code word the table does not hold
    /// (long, raw). Needs room for 8 more steps in the block.
    #[inline(always)]
    fn table_step<const W: usize>(
        &mut self,
        reader: BitReader<'_>,
        table: &StepTable,
        (k, c): (u32, u32),
        steps: &mut BlockSteps,
    ) -> Result<(), usize> {
        if self.avail < LOOKUP {
            self.reload(reader);
        }
        let x = (self.buf & mask(LOOKUP)) as usize;
        let meta = table.meta[x];
        let i = self.i;
        if meta >> 16 > c {
            // At most c + nb <= 33 bits.
            if self.avail < 33 {
                self.reload(reader);
            }
            let (t, len) = narrow_word::<W>(self.buf, k, c);
            steps.word::<W>(t, i)?;
            self.i = i + 1;
            self.buf >>= len;
            self.avail -= len;
            return Ok(());
        }
        widen(&mut steps.u[i..i + 8], &table.codes[x]);
        self.i = i + (meta >> 8 & 0xff) as usize;
        let bits = meta & 0xff;
        self.buf >>= bits;
        self.avail -= bits;
        Ok(())
    }

    /// Decodes the rest of the block (`old`: its old bits) into `steps[..old.len()]`,
    /// moving `pos` past its code words. Fails with the index in the block of an invalid
    /// code number.
    fn finish<const W: usize>(
        &mut self,
        reader: BitReader<'_>,
        (k, c): (u32, u32),
        old: &[[u8; W]],
        steps: &mut BlockSteps,
    ) -> Result<(), usize> {
        let m = old.len().min(BLOCK);
        if k <= TABLE_K && c > 0 {
            let table = StepTable::get::<W>(k);
            while self.i + 8 <= m {
                self.table_step::<W>(reader, table, (k, c), steps)?;
            }
        }
        // The rest (and blocks without a table) a few code words per load.
        let mut i = self.i;
        let mut pos = self.pos();
        while i + 4 <= m {
            let words: [(u32, u32); 4] = reader.read_n(&mut pos, |word| {
                let (t, len) = narrow_word::<W>(word, k, c);
                ((t, len), len)
            });
            for (j, (t, _)) in words.into_iter().enumerate() {
                steps.word::<W>(t, i + j)?;
            }
            i += 4;
        }
        while i < m {
            let (t, len) = narrow_word::<W>(reader.peek(pos), k, c);
            pos += len as usize;
            steps.word::<W>(t, i)?;
            i += 1;
        }
        self.i = i;
        // Where the block's code words end.
        self.top = pos;
        self.avail = 0;
        Ok(())
    }
}

/// Table steps of two blocks with the same `k` (caps `c_a`, `c_b`) in turn while both have
/// room: their chains of lookups are independent, so the CPU overlaps them. Stops at the
/// first error of either. Not inlined: on its own, the loop keeps both cursors in registers.
#[inline(never)]
fn lockstep<const W: usize>(
    reader: BitReader<'_>,
    table: &StepTable,
    (k, c_a, c_b): (u32, u32, u32),
    (a, b): (&mut StepCursor, &mut StepCursor),
    (old_a, old_b): (&[[u8; W]], &[[u8; W]]),
    (steps_a, steps_b): (&mut BlockSteps, &mut BlockSteps),
) -> (Result<(), usize>, Result<(), usize>) {
    while a.i + 8 <= old_a.len().min(BLOCK) && b.i + 8 <= old_b.len().min(BLOCK) {
        if let Err(i) = a.table_step::<W>(reader, table, (k, c_a), steps_a) {
            return (Err(i), Ok(()));
        }
        if let Err(i) = b.table_step::<W>(reader, table, (k, c_b), steps_b) {
            return (Ok(()), Err(i));
        }
    }
    (Ok(()), Ok(()))
}

/// The state of one block in the branch-free decoding loop: stream bit `pos` next, values
/// `..i` decoded, `raws` of them raw.
#[derive(Clone, Copy)]
struct Fast {
    pos: usize,
    i: usize,
    raws: usize,
}

/// [`fast_step`] mode bits: `k = 0` blocks.
const K0: u8 = 1;
/// `k = 0` blocks with caps up to `nb`: every code word valid, so no check (the loop is
/// bound by its operations).
const VALID: u8 = 2;
/// The build for BMI1/2 ([`fast_pair_bmi`]): BZHI by intrinsic.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
const BMI: u8 = 4;

/// Stream bits one [`fast_step`] with `lookups` lookups may read for a block with parameters
/// `(k, c)` (narrow elements): the lookups, then the longest code word (raw: `c` zeros and
/// `nb` bits; long: `z < c` zeros, a one, and `z + k - 1` bits).
fn fast_bits(lookups: u32, nb: u32, (k, c): (u32, u32)) -> u32 {
    lookups * LOOKUP + (c + nb).max(2 * c.saturating_sub(1) + k)
}

/// Entries of a [`k0_lens`] table: every count of leading zeros (`0..=64`), padded.
const LENS: usize = 72;

/// Lengths of `k = 0` code words of narrow elements by their count of leading zeros `z`,
/// under cap `c` (at most `nb + 1`): `max(2z, 1)` below the cap, `c + nb` (raw) from it.
/// One load in [`fast_step`] instead of five ALU operations.
fn k0_lens<const W: usize>(c: u32) -> &'static [u8; LENS] {
    const fn tables() -> [[[u8; LENS]; 18]; 2] {
        let mut t = [[[0; LENS]; 18]; 2];
        let mut w = 0;
        while w < 2 {
            let nb = 8 * (w + 1);
            let mut c = 0;
            while c < 18 {
                let mut z = 0;
                while z < LENS {
                    t[w][c][z] = if z >= c {
                        (c + nb) as u8
                    } else if z == 0 {
                        1
                    } else {
                        2 * z as u8
                    };
                    z += 1;
                }
                c += 1;
            }
            w += 1;
        }
        t
    }
    static LENS_BY_CAP: [[[u8; LENS]; 18]; 2] = tables();
    &LENS_BY_CAP[(W - 1) % 2][c as usize]
}

/// One branch-free step of a block of narrow elements: `N` [`StepTable`] lookups in turn
/// (the code words each holds), then always one more code word (whatever its kind: short,
/// long or raw) decoded by arithmetic. No branch depends on the data but the one for an
/// invalid code number (never taken on intact sections), so long and raw words cost no
/// misprediction; the chain from one step to the next is a load of the stream, the lookups,
/// and the last word's length. Needs `k <= TABLE_K`, `table.max_c <= c <= nb + 1` (every
/// entry holds under the cap), `fast_bits(N, nb, (k, c)) <= 57` (one load holds the step)
/// and room for `8 N + 1` more values in the block; decodes exactly the words of
/// [`StepCursor::table_step`]s.
///
/// # Safety
///
/// `state.i + 8 N + 1 <= BLOCK` and `state.raws <= state.i` (every step keeps the latter):
/// the stores go unchecked, the loop being bound by ALU operations (a mask per store). With
/// [`BMI`] in `MODE`, the CPU must have BMI2.
#[inline(always)]
unsafe fn fast_step<const W: usize, const N: usize, const MODE: u8>(
    reader: BitReader<'_>,
    table: &StepTable,
    (k, c, lens): (u32, u32, &[u8; LENS]),
    state: &mut Fast,
    steps: &mut BlockSteps,
) -> Result<(), usize> {
    let nb = nbits::<W>();
    let k0 = MODE & K0 != 0;
    debug_assert!(!k0 || k == 0);
    debug_assert!(MODE & VALID == 0 || (k0 && c <= nb));
    let k = if k0 { 0 } else { k };
    debug_assert!(k <= TABLE_K && table.max_c <= c && c <= nb + 1);
    debug_assert!(fast_bits(N as u32, nb, (k, c)) <= 57);
    // At least 57 stream bits.
    let mut rest = reader.peek(state.pos);
    let (mut used, mut j) = (0, state.i);
    for _ in 0..N {
        let x = (rest & mask(LOOKUP)) as usize;
        // Length and count each by a load of its own: on x86 a byte load is no ALU
        // operation, unlike a byte taken out of a register (the loop is bound by ALU
        // operations, not by its chain).
        let bits = table.bits[x] as u32;
        debug_assert!(j + 8 <= steps.u.len());
        // SAFETY: j <= state.i + 8 (N − 1) (at most 8 values a lookup), so with the room the
        // caller promises j + 8 <= BLOCK + 8, the length of `u`.
        widen(
            unsafe { steps.u.get_unchecked_mut(j..j + 8) },
            &table.codes[x],
        );
        j += table.count[x] as usize;
        rest >>= bits;
        used += bits;
    }
    let z = rest.trailing_zeros();
    let raw = z >= c;
    let (u, len) = if k0 {
        // k = 0: the one and the z − 1 bits after it are `2 (u − 2^(z−1)) + 1` in z bits, so
        // setting bit z and halving gives u (0 for z = 0). Raw (z >= c), the reading is
        // discarded, so z needs no clamp (the shifts wrap); the length comes from `lens`.
        let top = 1u64.wrapping_shl(z);
        let low = rest.wrapping_shr(z);
        #[cfg(target_arch = "x86_64")]
        let low = if MODE & BMI != 0 {
            // SAFETY: only `fast_pair_bmi` runs this mode, on a CPU with BMI2. BZHI
            // takes the index as it is (a mask would take an AND more).
            unsafe { std::arch::x86_64::_bzhi_u64(low, z) }
        } else {
            low & top.wrapping_sub(1)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let low = low & top.wrapping_sub(1);
        ((low | top) >> 1, lens[z as usize] as u32)
    } else {
        // The coded reading, discarded when raw (z clamped below c keeps its shifts in range).
        let zc = z.min(c);
        let long = (zc != 0) as u32;
        let len = zc + k - long;
        let coded = ((rest >> (zc + 1)) & mask(len)) | ((long as u64) << len);
        // No branch: raw words are ~8 % of the last words on AdamW steps, never predictable.
        (
            coded,
            std::hint::select_unpredictable(raw, c + nb, zc + 1 + len),
        )
    };
    // At k = 0 a coded word below the cap has z < c zeros, so its code number is below
    // 2^(c − 1): invalid only under the largest cap (`nb + 1`).
    if MODE & VALID == 0 && !raw && (!k0 || c > nb) && !valid_code(u, nb) {
        return Err(j);
    }
    let new_bits = (rest >> c) & mask(nb);
    debug_assert!(j < BLOCK && state.raws < BLOCK);
    // SAFETY: j <= state.i + 8 N < BLOCK and state.raws <= state.i < BLOCK (the caller's
    // room), within `u`, `raw_at` and `raw_bits`. Valid code numbers have at most 16 bits;
    // at a raw value anything goes (its raw bits are written over it).
    unsafe {
        *steps.u.get_unchecked_mut(j) = u as u16;
        *steps.raw_at.get_unchecked_mut(state.raws) = j as u16;
        *steps.raw_bits.get_unchecked_mut(state.raws) = new_bits as u16;
    }
    state.raws += raw as usize;
    state.pos += (used + len) as usize;
    state.i = j + 1;
    Ok(())
}

/// [`fast_pair`] compiled for BMI1/2 (shifts by a register without the `cl` shuffle, one
/// instruction masks): the same code.
///
/// # Safety
///
/// The CPU must have the features of [`super::bits::x86_wide`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
#[inline(never)]
unsafe fn fast_pair_bmi<const W: usize, const MODE: u8>(
    reader: BitReader<'_>,
    table: &StepTable,
    params: (u32, u32, u32),
    cursors: (&mut Fast, &mut Fast),
    ends: (usize, usize),
    steps: (&mut BlockSteps, &mut BlockSteps),
) -> (Result<(), usize>, Result<(), usize>) {
    fast_pair::<W, MODE>(reader, table, params, cursors, ends, steps)
}

/// [`fast_pair`] in the portable build.
#[inline(never)]
fn fast_pair_outlined<const W: usize, const MODE: u8>(
    reader: BitReader<'_>,
    table: &StepTable,
    params: (u32, u32, u32),
    cursors: (&mut Fast, &mut Fast),
    ends: (usize, usize),
    steps: (&mut BlockSteps, &mut BlockSteps),
) -> (Result<(), usize>, Result<(), usize>) {
    fast_pair::<W, MODE>(reader, table, params, cursors, ends, steps)
}

/// [`fast_step`]s of two blocks with the same `k` in turn while both have room: their
/// chains are independent, so the CPU overlaps them. Stops at the first error of either.
#[inline(always)]
fn fast_pair<const W: usize, const MODE: u8>(
    reader: BitReader<'_>,
    table: &StepTable,
    (k, c_a, c_b): (u32, u32, u32),
    (a, b): (&mut Fast, &mut Fast),
    (m_a, m_b): (usize, usize),
    (steps_a, steps_b): (&mut BlockSteps, &mut BlockSteps),
) -> (Result<(), usize>, Result<(), usize>) {
    let nb = nbits::<W>();
    let (lens_a, lens_b) = (k0_lens::<W>(c_a), k0_lens::<W>(c_b));
    let (mut fa, mut fb) = (*a, *b);
    // The room `fast_step` needs is checked against these (as `Fast` keeps raws <= i).
    let (m_a, m_b) = (m_a.min(BLOCK), m_b.min(BLOCK));
    if fa.raws > fa.i || fb.raws > fb.i {
        return (Ok(()), Ok(()));
    }
    let mut result = (Ok(()), Ok(()));
    // Steps of `N` lookups while both blocks have room for `8 N + 1` more values.
    macro_rules! both {
        ($n:literal) => {
            while fa.i + 8 * $n < m_a && fb.i + 8 * $n < m_b {
                // SAFETY: the room is checked above, and the states keep raws <= i.
                let step = unsafe {
                    fast_step::<W, $n, MODE>(reader, table, (k, c_a, lens_a), &mut fa, steps_a)
                };
                if let Err(e) = step {
                    result = (Err(e), Ok(()));
                    break;
                }
                // SAFETY: as above.
                let step = unsafe {
                    fast_step::<W, $n, MODE>(reader, table, (k, c_b, lens_b), &mut fb, steps_b)
                };
                if let Err(e) = step {
                    result = (Ok(()), Err(e));
                    break;
                }
            }
        };
    }
    // Two lookups a step where one load holds them and any code word after them (caps up
    // to 16 or 17 at k = 0: nearly always), so the last word's arithmetic serves ~10 values.
    if fast_bits(2, nb, (k, c_a)).max(fast_bits(2, nb, (k, c_b))) <= 57 {
        both!(2);
    }
    if result == (Ok(()), Ok(())) {
        both!(1);
    }
    // The last values (fewer than 9 in one of the blocks) one word a step, still branch
    // free (the table path of `StepCursor::finish` branches at each long or raw word).
    if result == (Ok(()), Ok(())) {
        both!(0);
    }
    if result == (Ok(()), Ok(())) {
        result.0 = fast_rest::<W, MODE>(reader, table, (k, c_a, lens_a), &mut fa, m_a, steps_a);
    }
    if result == (Ok(()), Ok(())) {
        result.1 = fast_rest::<W, MODE>(reader, table, (k, c_b, lens_b), &mut fb, m_b, steps_b);
    }
    (*a, *b) = (fa, fb);
    result
}

/// The rest of one block by [`fast_step`]s (`m <= BLOCK` values in all, `state.raws <=
/// state.i`), after the other of its pair has ended.
#[inline(always)]
fn fast_rest<const W: usize, const MODE: u8>(
    reader: BitReader<'_>,
    table: &StepTable,
    (k, c, lens): (u32, u32, &[u8; LENS]),
    state: &mut Fast,
    m: usize,
    steps: &mut BlockSteps,
) -> Result<(), usize> {
    debug_assert!(m <= BLOCK && state.raws <= state.i);
    macro_rules! one {
        ($n:literal) => {
            while state.i + 8 * $n < m {
                // SAFETY: the room is checked above, m <= BLOCK, and raws <= i (see above).
                unsafe { fast_step::<W, $n, MODE>(reader, table, (k, c, lens), state, steps)? };
            }
        };
    }
    if fast_bits(2, nbits::<W>(), (k, c)) <= 57 {
        one!(2);
    }
    one!(1);
    one!(0);
    Ok(())
}

/// How [`decode_width`] decodes narrow elements: one value at a time (as 4-byte elements
/// always are), through [`StepTable`] lookups with a branch to the one value path at each
/// code word the table does not hold, or (the decoder in use) through branch-free
/// [`fast_step`]s where the block's cap allows (else the lookups). The first two are the
/// tests' reference decoders.
const ONE_AT_A_TIME: u8 = 0;
#[cfg(test)]
const LOOKUPS: u8 = 1;
const FAST: u8 = 2;
/// [`FAST`] in its portable build only (tests).
#[cfg(test)]
const FAST_PORTABLE: u8 = 3;

fn decode_width<const W: usize, const HOW: u8>(
    input: &[u8],
    old: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    out.clear();
    let n = old.len() / W;
    if n == 0 {
        if !input.is_empty() {
            return Err(CodecError::TrailingBytes {
                count: 0,
                extra: input.len() as u64,
            });
        }
        return Ok(());
    }
    let nb = nbits::<W>();
    let blocks = n.div_ceil(BLOCK);
    let dir_len = blocks * DIR_ENTRY;
    if input.len() < dir_len {
        return Err(CodecError::Truncated {
            needed: dir_len as u64,
            available: input.len() as u64,
        });
    }
    let (dir, stream) = input.split_at(dir_len);
    let mut total_bits = 0u64;
    for (b, entry) in dir.chunks_exact(DIR_ENTRY).enumerate() {
        let (bits, k, c) = read_entry(entry);
        if k >= nb || c > nb + 1 {
            return Err(CodecError::Malformed {
                codec: "ulp",
                reason: format!(
                    "block {b} has parameters k = {k}, c = {c} (at most {} and {})",
                    nb - 1,
                    nb + 1
                ),
            });
        }
        total_bits += bits as u64;
    }
    check_stream_len("ulp", stream, total_bits, dir_len, n as u64)?;

    let reader = BitReader::new(stream);
    if W > 2 || HOW == ONE_AT_A_TIME {
        out.resize(n * W, 0);
        return decode_wide::<W>(reader, dir, old, out);
    }
    // Not zeroed first (a pass over the whole output, ~2-7 % of the decoding time): the
    // narrow decoder writes every value.
    out.reserve(n * W);
    let spare = out.spare_capacity_mut()[..n * W].as_chunks_mut::<W>().0;
    decode_narrow::<W, HOW>(reader, dir, old.as_chunks::<W>().0, spare)?;
    // SAFETY: `decode_narrow` wrote all n elements of the spare capacity (each block's
    // apply writes every value of the block, and the blocks cover them all).
    unsafe { out.set_len(n * W) };
    Ok(())
}

/// The narrow elements' decoder, into `out` (as many elements as `old`, each written once it
/// returns Ok): blocks in pairs where they can, see [`fast_pair`].
fn decode_narrow<const W: usize, const HOW: u8>(
    reader: BitReader<'_>,
    dir: &[u8],
    old: &[[u8; W]],
    out: &mut [[MaybeUninit<u8>; W]],
) -> Result<(), CodecError> {
    let n = old.len().min(out.len());
    let nb = nbits::<W>();
    let blocks = n.div_ceil(BLOCK);
    let (mut steps_a, mut steps_b) = (BlockSteps::new(), BlockSteps::new());
    let block = |b: usize| b * BLOCK..((b + 1) * BLOCK).min(n);
    let entry = |b: usize| read_entry(&dir[b * DIR_ENTRY..(b + 1) * DIR_ENTRY]);
    let end_check = |b: usize, pos: usize, end: usize| {
        if pos != end {
            return Err(CodecError::Malformed {
                codec: "ulp",
                reason: format!(
                    "block {b} code words end at bit {pos}, its directory entry says {end}"
                ),
            });
        }
        Ok(())
    };
    #[cfg(target_arch = "x86_64")]
    let bmi = HOW == FAST && super::bits::x86_wide();
    #[cfg(not(target_arch = "x86_64"))]
    let bmi = false;
    #[cfg(target_arch = "x86_64")]
    let avx512 = bmi && super::bits::x86_avx512();
    let apply = |steps: &BlockSteps, old: &[[u8; W]], out: &mut [[MaybeUninit<u8>; W]]| {
        #[cfg(target_arch = "x86_64")]
        if avx512 {
            // SAFETY: `avx512` says that `x86_avx512` detected the features it needs.
            return unsafe { steps.apply_avx512(old, out) };
        }
        #[cfg(target_arch = "x86_64")]
        if bmi {
            // SAFETY: `bmi` says that `x86_wide` detected the features it needs.
            return unsafe { steps.apply_wide(old, out) };
        }
        steps.apply(old, out)
    };
    let mut pos = 0usize;
    let mut b = 0;
    while b < blocks {
        let (bits, k, c) = entry(b);
        let end = pos + bits as usize;
        let old_a = &old[block(b)];
        (steps_a.raws, steps_b.raws) = (0, 0);
        let mut first = StepCursor::new(reader, pos);
        let (_, k_b, c_b) = entry((b + 1).min(blocks - 1));
        let pair = b + 1 < blocks && k_b == k && c_b > 0;
        if k <= TABLE_K && c > 0 && (pair || HOW >= FAST) {
            // Two blocks with the same table: their chains of lookups are
            // independent, so the CPU overlaps them. The second starts where its directory
            // entry puts it, which is where the first must end; it is checked after the
            // first, and its first error (if any) reported only then, as if decoded after it.
            // A lone block (the last one, or one before another table) goes as the first of
            // a pair with an empty second, for the fast steps too.
            let (c_b, range_b, end_b) = if pair {
                (c_b, block(b + 1), end + entry(b + 1).0 as usize)
            } else {
                let at = block(b).end;
                (c, at..at, end)
            };
            let old_b = &old[range_b.clone()];
            let table = StepTable::get::<W>(k);
            let (first_err, second_err, mut second);
            if HOW >= FAST && table.max_c <= c.min(c_b) {
                // Branch free: no misprediction at long or raw words.
                let (mut fa, mut fb) = (
                    Fast { pos, i: 0, raws: 0 },
                    Fast {
                        pos: end,
                        i: 0,
                        raws: 0,
                    },
                );
                let cursors = (&mut fa, &mut fb);
                let ends = (old_a.len().min(BLOCK), old_b.len().min(BLOCK));
                let steps = (&mut *steps_a, &mut *steps_b);
                let params = (k, c, c_b);
                macro_rules! pair {
                    ($mode:expr) => {{
                        #[cfg(target_arch = "x86_64")]
                        if bmi {
                            // SAFETY: `bmi` says that `x86_wide` detected the features it
                            // needs.
                            unsafe {
                                fast_pair_bmi::<W, { $mode | BMI }>(
                                    reader, table, params, cursors, ends, steps,
                                )
                            }
                        } else {
                            fast_pair_outlined::<W, { $mode }>(
                                reader, table, params, cursors, ends, steps,
                            )
                        }
                        #[cfg(not(target_arch = "x86_64"))]
                        fast_pair_outlined::<W, { $mode }>(
                            reader, table, params, cursors, ends, steps,
                        )
                    }};
                }
                (first_err, second_err) = if k != 0 {
                    pair!(0)
                } else if c.max(c_b) <= nb {
                    pair!(K0 | VALID)
                } else {
                    pair!(K0)
                };
                (first, second) = (
                    StepCursor::new(reader, fa.pos),
                    StepCursor::new(reader, fb.pos),
                );
                (first.i, second.i) = (fa.i, fb.i);
                (steps_a.raws, steps_b.raws) = (fa.raws, fb.raws);
            } else {
                second = StepCursor::new(reader, end);
                (first_err, second_err) = lockstep::<W>(
                    reader,
                    table,
                    (k, c, c_b),
                    (&mut first, &mut second),
                    (old_a, old_b),
                    (&mut *steps_a, &mut *steps_b),
                );
            }
            first_err.map_err(|i| bad_code(b * BLOCK + i, nb))?;
            first
                .finish(reader, (k, c), old_a, &mut steps_a)
                .map_err(|i| bad_code(b * BLOCK + i, nb))?;
            end_check(b, first.pos(), end)?;
            apply(&steps_a, old_a, &mut out[block(b)]);
            second_err
                .and_then(|()| second.finish(reader, (k, c_b), old_b, &mut steps_b))
                .map_err(|i| bad_code((b + 1) * BLOCK + i, nb))?;
            end_check(b + 1, second.pos(), end_b)?;
            apply(&steps_b, old_b, &mut out[range_b]);
            pos = end_b;
            b += 1 + pair as usize;
            continue;
        }
        first
            .finish(reader, (k, c), old_a, &mut steps_a)
            .map_err(|i| bad_code(b * BLOCK + i, nb))?;
        end_check(b, first.pos(), end)?;
        apply(&steps_a, old_a, &mut out[block(b)]);
        pos = end;
        b += 1;
    }
    Ok(())
}

/// Decodes 4-byte elements, one value at a time with the next bits cached in a register:
/// their code words may exceed what one load holds, so the prefix and the rest are read
/// separately.
#[inline(never)]
fn decode_wide<const W: usize>(
    reader: BitReader<'_>,
    dir: &[u8],
    old: &[u8],
    out: &mut [u8],
) -> Result<(), CodecError> {
    let nb = nbits::<W>();
    let all = mask(nb) as u32;
    let blocks = old
        .as_chunks::<W>()
        .0
        .chunks(BLOCK)
        .zip(out.as_chunks_mut::<W>().0.chunks_mut(BLOCK));
    // Blocks are contiguous, so one cursor walks them all.
    let mut cursor = BitCursor::new(reader, 0);
    for (b, (entry, (old, out))) in dir.chunks_exact(DIR_ENTRY).zip(blocks).enumerate() {
        let (bits, k, c) = read_entry(entry);
        let end = cursor.pos() + bits as usize;
        for (j, (a, o)) in old.iter().zip(out).enumerate() {
            let i = b * BLOCK + j;
            // The prefix: at most c <= 33 zeros, then a one (past the cached bits they read
            // as zero, so fewer than c + 1 are never mistaken for a prefix).
            cursor.need(c + 1);
            let z = cursor.bits().trailing_zeros();
            let new_bits = if z >= c {
                cursor.skip(c);
                cursor.need(nb);
                let raw = cursor.bits() & mask(nb);
                cursor.skip(nb);
                raw as u32
            } else {
                if z + k > nb {
                    return Err(bad_code(i, nb));
                }
                let (len, top) = if z == 0 {
                    (k, 0)
                } else {
                    (z + k - 1, 1u64 << (z + k - 1))
                };
                cursor.skip(z + 1);
                cursor.need(len);
                let u = (cursor.bits() & mask(len)) | top;
                cursor.skip(len);
                if !valid_code(u, nb) {
                    return Err(bad_code(i, nb));
                }
                let d = step_of(u as u32);
                from_ordered(to_ordered(le(a), W).wrapping_add(d) & all, W)
            };
            *o = to_le(new_bits);
        }
        if cursor.pos() != end {
            return Err(CodecError::Malformed {
                codec: "ulp",
                reason: format!(
                    "block {b} code words end at bit {}, its directory entry says {end}",
                    cursor.pos()
                ),
            });
        }
    }
    Ok(())
}

#[cold]
fn bad_code(index: usize, nb: u32) -> CodecError {
    CodecError::Malformed {
        codec: "ulp",
        reason: format!("value {index}: step code outside a {nb}-bit element"),
    }
}

/// `(bit count, k, c)` of one directory entry.
#[inline]
fn read_entry(entry: &[u8]) -> (u32, u32, u32) {
    (
        u16::from_le_bytes([entry[0], entry[1]]) as u32,
        entry[2] as u32,
        entry[3] as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{adamw_bf16, adamw_step, Rng};

    /// The one-instruction `vpsllvq` shifts lanes as the intrinsic does, counts of 64 and
    /// more (zero) included.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn sllv_epi64_matches_the_intrinsic() {
        use std::arch::x86_64::*;
        if !crate::codec::bits::x86_avx512() {
            return;
        }
        let mut rng = Rng(77);
        for round in 0..2000 {
            let a: [u64; 8] = std::array::from_fn(|_| rng.next_u64());
            let counts: [u64; 8] = std::array::from_fn(|j| match round % 3 {
                0 => rng.below(64),
                1 => rng.below(300),
                _ => [0, 63, 64, 65, 255, 1 << 32, u64::MAX, 1][j],
            });
            // SAFETY: `x86_avx512` detected AVX-512F; 64-byte loads and stores of 8-element
            // u64 arrays.
            let (got, want) = unsafe {
                let (va, vc) = (
                    _mm512_loadu_si512(a.as_ptr().cast()),
                    _mm512_loadu_si512(counts.as_ptr().cast()),
                );
                let (mut got, mut want) = ([0u64; 8], [0u64; 8]);
                _mm512_storeu_si512(got.as_mut_ptr().cast(), sllv_epi64(va, vc));
                _mm512_storeu_si512(want.as_mut_ptr().cast(), _mm512_sllv_epi64(va, vc));
                (got, want)
            };
            assert_eq!(got, want, "{a:x?} << {counts:?}");
        }
    }
    use proptest::prelude::*;

    /// Independent reference encoder from the format description: i64 arithmetic, one bool
    /// per bit, and every `(k, c)` tried by actually encoding the block.
    fn reference_encode(width: usize, old: &[u8], new: &[u8]) -> Vec<u8> {
        let nb = 8 * width as u32;
        let modulus = 1i64 << nb;
        let read = |bytes: &[u8], i: usize| {
            let mut v = 0u32;
            for j in 0..width {
                v |= (bytes[i * width + j] as u32) << (8 * j);
            }
            v
        };
        let ord = |bits: u32| -> i64 {
            let sign = 1i64 << (nb - 1);
            let b = bits as i64;
            if b & sign != 0 {
                modulus - 1 - b
            } else {
                b + sign
            }
        };
        let push = |bits: &mut Vec<bool>, v: u64, len: u32| {
            for i in 0..len {
                bits.push((v >> i) & 1 == 1);
            }
        };
        let n = new.len() / width;
        let mut dir = Vec::new();
        let mut stream: Vec<bool> = Vec::new();
        for start in (0..n).step_by(BLOCK) {
            let mut best: Option<(Vec<bool>, u32, u32)> = None;
            for c in 0..=nb + 1 {
                for k in 0..nb {
                    let mut bits = Vec::new();
                    for i in start..n.min(start + BLOCK) {
                        let mut d = (ord(read(new, i)) - ord(read(old, i))).rem_euclid(modulus);
                        if d >= modulus / 2 {
                            d -= modulus;
                        }
                        let raw = |bits: &mut Vec<bool>| {
                            bits.extend(std::iter::repeat_n(false, c as usize));
                            push(bits, read(new, i) as u64, nb);
                        };
                        if d == 0 || c == 0 {
                            raw(&mut bits);
                            continue;
                        }
                        let u = (2 * (d.abs() - 1) + (d < 0) as i64) as u64;
                        let l = 64 - u.leading_zeros();
                        if l <= k {
                            bits.push(true);
                            push(&mut bits, u, k);
                        } else if l - k < c {
                            bits.extend(std::iter::repeat_n(false, (l - k) as usize));
                            bits.push(true);
                            push(&mut bits, u, l - 1);
                        } else {
                            raw(&mut bits);
                        }
                    }
                    // Order of preference on ties: all-raw, then smaller k, then smaller c.
                    let key = |b: &Vec<bool>, k: u32, c: u32| (b.len(), c != 0, k, c);
                    if best
                        .as_ref()
                        .is_none_or(|(b, bk, bc)| key(&bits, k, c) < key(b, *bk, *bc))
                    {
                        best = Some((bits, k, c));
                    }
                    if c == 0 {
                        break; // k does not matter when everything is raw
                    }
                }
            }
            let (bits, k, c) = best.unwrap();
            dir.extend_from_slice(&(bits.len() as u16).to_le_bytes());
            dir.push(k as u8);
            dir.push(c as u8);
            stream.extend(bits);
        }
        let mut bytes = vec![0u8; stream.len().div_ceil(8)];
        for (i, &bit) in stream.iter().enumerate() {
            if bit {
                bytes[i / 8] |= 1 << (i % 8);
            }
        }
        dir.extend(bytes);
        dir
    }

    fn round_trip(width: usize, old: &[u8], new: &[u8]) -> Vec<u8> {
        let mut enc = Vec::new();
        encode(width, old, new, &mut enc);
        let mut dec = vec![1, 2, 3];
        decode(width, &enc, old, &mut dec).unwrap();
        assert_eq!(dec, new, "width {width}");
        enc
    }

    fn patterns(width: usize, values: &[u32]) -> Vec<u8> {
        values
            .iter()
            .flat_map(|v| v.to_le_bytes()[..width].to_vec())
            .collect()
    }

    /// Bit patterns that matter per width: ±0, ±smallest subnormal, ±1.0, ±largest finite,
    /// ±inf, quiet and signalling NaNs with payloads, and the extremes of the ordered view.
    fn specials(width: usize) -> Vec<u32> {
        match width {
            1 => vec![
                0x00, 0x80, 0x01, 0x81, 0x38, 0xb8, 0x7e, 0xfe, 0x7f, 0xff, 0x7c, 0xfc, 0x7d, 0x40,
            ],
            2 => vec![
                0x0000, 0x8000, 0x0001, 0x8001, 0x3f80, 0xbf80, 0x7f7f, 0xff7f, 0x7f80, 0xff80,
                0x7fc0, 0xffc0, 0x7f81, 0xff81, 0x7fff, 0xffff, 0x007f, 0x0080,
            ],
            _ => vec![
                0x0000_0000,
                0x8000_0000,
                0x0000_0001,
                0x8000_0001,
                0x3f80_0000,
                0xbf80_0000,
                0x7f7f_ffff,
                0xff7f_ffff,
                0x7f80_0000,
                0xff80_0000,
                0x7fc0_0000,
                0xffc0_0000,
                0x7f80_0001,
                0xffc0_1234,
                0x7fff_ffff,
                0xffff_ffff,
                0x007f_ffff,
                0x0080_0000,
            ],
        }
    }

    #[test]
    fn every_pair_of_fp8_patterns() {
        let (old, new): (Vec<u32>, Vec<u32>) = (0..256u32)
            .flat_map(|a| (0..256u32).map(move |b| (a, b)))
            .unzip();
        let (old, new) = (patterns(1, &old), patterns(1, &new));
        round_trip(1, &old, &new);
        let sample = 3000;
        assert_eq!(
            round_trip(1, &old[..sample], &new[..sample]),
            reference_encode(1, &old[..sample], &new[..sample])
        );
    }

    #[test]
    fn special_patterns_of_every_width() {
        for width in [1usize, 2, 4] {
            let nb = 8 * width as u32;
            let sp = specials(width);
            let (mut old, mut new) = (Vec::new(), Vec::new());
            for &a in &sp {
                for &b in &sp {
                    old.push(a);
                    new.push(b);
                }
            }
            // Maximal wrap-around distances: ord 0 ↔ ord 2^(nb-1) and ord 0 → ord 2^(nb-1) - 1.
            let half = 1u32 << (nb - 1);
            for (a, b) in [
                (0, half),
                (half, 0),
                (0, half - 1),
                (half - 1, 0),
                (half + 1, 0),
                (0, half + 1),
            ] {
                old.push(from_ordered(a, width));
                new.push(from_ordered(b, width));
            }
            let (old, new) = (patterns(width, &old), patterns(width, &new));
            assert_eq!(
                round_trip(width, &old, &new),
                reference_encode(width, &old, &new),
                "width {width}"
            );
            // All unchanged (d = 0 everywhere) and a single value.
            assert_eq!(
                round_trip(width, &old, &old),
                reference_encode(width, &old, &old)
            );
            round_trip(width, &old[..width], &new[..width]);
        }
    }

    #[test]
    fn random_steps_of_every_width() {
        let mut rng = Rng(21);
        for width in [1usize, 2, 4] {
            let nb = 8 * width as u32;
            for n in [0usize, 1, 2, 1023, 1024, 1025, 2100] {
                let (mut old, mut new) = (Vec::new(), Vec::new());
                for i in 0..n {
                    let a = rng.next_u64() as u32 & mask(nb) as u32;
                    let step = match i % 4 {
                        0 => adamw_step(&mut rng),
                        1 => (rng.next_u64() as i64) >> (64 - nb + rng.below(nb as u64) as u32),
                        2 => rng.below(5) as i64 - 2,
                        _ => (rng.next_u64() as i64) >> (64 - nb),
                    };
                    let b = (to_ordered(a, width) as i64 + step).rem_euclid(1 << nb) as u32;
                    old.push(a);
                    new.push(from_ordered(b, width));
                }
                let (old, new) = (patterns(width, &old), patterns(width, &new));
                let enc = round_trip(width, &old, &new);
                if width < 4 || n <= 1025 {
                    assert_eq!(
                        enc,
                        reference_encode(width, &old, &new),
                        "width {width}, {n} values"
                    );
                }
            }
        }
    }

    #[test]
    fn adamw_like_steps_cost_about_two_bits() {
        let mut rng = Rng(22);
        let (old, new) = adamw_bf16(&mut rng, 1 << 16);
        let enc = round_trip(2, &old, &new);
        let bits = enc.len() as f64 * 8.0 / (1 << 16) as f64;
        assert!(bits < 3.0, "{bits:.3} bits per value");
    }

    #[test]
    fn rejects_bad_sections() {
        let mut rng = Rng(23);
        let (old, new) = adamw_bf16(&mut rng, 2500);
        let enc = round_trip(2, &old, &new);
        let mut out = Vec::new();
        for cut in 0..enc.len() {
            assert!(
                decode(2, &enc[..cut], &old, &mut out).is_err(),
                "prefix of {cut} bytes"
            );
        }
        assert!(decode(2, &[enc.clone(), vec![0]].concat(), &old, &mut out).is_err());
        assert!(decode(2, &enc, &old[..old.len() - 2], &mut out).is_err());
        assert!(decode(2, &enc, &[old.clone(), vec![0, 0]].concat(), &mut out).is_err());
        assert!(decode(3, &enc, &old, &mut out).is_err());
        let mut bad = enc.clone();
        bad[2] = 16; // k = 16 for 16-bit elements
        assert!(decode(2, &bad, &old, &mut out).is_err());
        let mut bad = enc.clone();
        bad[3] = 18; // c = 18 for 16-bit elements
        assert!(decode(2, &bad, &old, &mut out).is_err());
        // The one code number that would duplicate −2^(nb−1): u = 2^nb − 2 (k = 7, c = 2 in width 1:
        // one zero, a one, then the 7 bits below the leading one of 0xfe).
        let section = [9u8, 0, 7, 2, 0b1111_1010, 0b0000_0001];
        assert!(decode(1, &section, &[0], &mut out).is_err());
        let section = [9u8, 0, 7, 2, 0b1111_1110, 0b0000_0001];
        decode(1, &section, &[from_ordered(0, 1) as u8], &mut out).unwrap();
        assert_eq!(out, [from_ordered(0x80, 1) as u8]);
    }

    #[test]
    fn bit_flips_never_panic() {
        let mut rng = Rng(24);
        for width in [1usize, 2, 4] {
            let n = 700;
            let old: Vec<u8> = (0..n * width).map(|_| rng.next_u64() as u8).collect();
            let new: Vec<u8> = old
                .iter()
                .enumerate()
                .map(|(i, &b)| {
                    if i % width == 0 {
                        b ^ (rng.below(4) as u8)
                    } else {
                        b
                    }
                })
                .collect();
            let enc = round_trip(width, &old, &new);
            let mut out = Vec::new();
            for bit in 0..enc.len() * 8 {
                let mut bad = enc.clone();
                bad[bit / 8] ^= 1 << (bit % 8);
                if decode(width, &bad, &old, &mut out).is_ok() {
                    assert_eq!(out.len(), new.len());
                    // Raising a block's cap c above every code word it holds changes nothing.
                    let dir_len = n.div_ceil(BLOCK) * DIR_ENTRY;
                    let in_cap = bit / 8 < dir_len && (bit / 8) % DIR_ENTRY == 3;
                    assert!(
                        out != new || in_cap,
                        "width {width}: flip of bit {bit} went unnoticed"
                    );
                }
            }
        }
    }

    fn value_pairs() -> impl Strategy<Value = (usize, Vec<u8>, Vec<u8>)> {
        (
            prop::sample::select(vec![1usize, 2, 4]),
            prop::collection::vec((any::<u32>(), any::<i32>(), 0u8..4), 0..1500),
        )
            .prop_map(|(width, items)| {
                let nb = 8 * width as u32;
                let (mut old, mut new) = (Vec::new(), Vec::new());
                for (a, s, kind) in items {
                    let a = a & mask(nb) as u32;
                    let step = match kind {
                        0 => (s % 3) as i64,
                        1 => (s >> (s as u32 & 31)) as i64,
                        2 => (s % 300) as i64,
                        _ => s as i64,
                    };
                    let b = from_ordered(
                        (to_ordered(a, width) as i64 + step).rem_euclid(1 << nb) as u32,
                        width,
                    );
                    old.extend_from_slice(&a.to_le_bytes()[..width]);
                    new.extend_from_slice(&b.to_le_bytes()[..width]);
                }
                (width, old, new)
            })
    }

    #[test]
    fn narrow_arithmetic_matches_the_ordered_view() {
        fn check<const W: usize>(patterns: impl Iterator<Item = u32> + Clone) {
            for a in patterns.clone() {
                assert_eq!(ord16::<W>(a as u16) as u32, to_ordered(a, W));
                assert_eq!(unord16::<W>(a as u16) as u32, from_ordered(a, W));
            }
            for (a, b) in patterns
                .clone()
                .flat_map(|a| patterns.clone().map(move |b| (a, b)))
            {
                let nb = 8 * W as u32;
                let modulus = 1i64 << nb;
                let mut d = (to_ordered(b, W) as i64 - to_ordered(a, W) as i64).rem_euclid(modulus);
                if d >= modulus / 2 {
                    d -= modulus;
                }
                let u = if d == 0 {
                    unchanged::<W>()
                } else {
                    (2 * (d.abs() - 1) + (d < 0) as i64) as u32
                };
                assert_eq!(step_code::<W>(a, b), u, "width {W}: {a:#x} -> {b:#x}");
            }
        }
        check::<1>(0..256);
        let mut rng = Rng(25);
        let sample: Vec<u32> = (0..300).map(|_| rng.next_u64() as u16 as u32).collect();
        check::<2>(
            sample
                .into_iter()
                .chain([0, 1, 0x7fff, 0x8000, 0x8001, 0xfffe, 0xffff]),
        );
    }

    /// The portable build of the narrow encoder and the one this CPU runs (AVX2 where it has
    /// it) give the same bytes; the other tests check the latter against the reference.
    #[test]
    fn portable_and_dispatched_builds_agree() {
        let mut rng = Rng(28);
        for width in [1usize, 2] {
            let sp = specials(width);
            for n in [1usize, 2, 3, 4, 5, 1023, 1024, 1025, 3001] {
                let (old, new) = if width == 2 && n % 2 == 1 {
                    adamw_bf16(&mut rng, n)
                } else {
                    // Special patterns (±0, subnormals, NaNs, infinities) to and from anything.
                    let pick = |rng: &mut Rng| {
                        if rng.below(3) == 0 {
                            sp[rng.below(sp.len() as u64) as usize]
                        } else {
                            rng.next_u64() as u32 & mask(8 * width as u32) as u32
                        }
                    };
                    let old: Vec<u32> = (0..n).map(|_| pick(&mut rng)).collect();
                    let new: Vec<u32> = old
                        .iter()
                        .map(|&a| match rng.below(4) {
                            0 => pick(&mut rng),
                            1 => a,
                            _ => from_ordered(
                                (to_ordered(a, width) as i64 + rng.below(5) as i64 - 2)
                                    .rem_euclid(1 << (8 * width))
                                    as u32,
                                width,
                            ),
                        })
                        .collect();
                    (patterns(width, &old), patterns(width, &new))
                };
                let mut portable = Vec::new();
                match width {
                    1 => encode_codes::<1, u16, false>(&old, &new, &mut portable),
                    _ => encode_codes::<2, u16, false>(&old, &new, &mut portable),
                }
                let mut dispatched = Vec::new();
                encode(width, &old, &new, &mut dispatched);
                assert_eq!(portable, dispatched, "width {width}, {n} values");
                // The AVX2 build too where the dispatch picks the AVX-512 one.
                #[cfg(target_arch = "x86_64")]
                if crate::codec::bits::x86_wide() {
                    let mut avx2 = Vec::new();
                    // SAFETY: `x86_wide` detected the build's features on this CPU.
                    unsafe {
                        match width {
                            1 => encode_narrow_avx2::<1>(&old, &new, &mut avx2),
                            _ => encode_narrow_avx2::<2>(&old, &new, &mut avx2),
                        }
                    }
                    assert_eq!(portable, avx2, "width {width}, {n} values, AVX2");
                }
                let mut dec = Vec::new();
                decode(width, &portable, &old, &mut dec).unwrap();
                assert_eq!(dec, new);
            }
        }
    }

    /// The narrow decoder (table lookups from a register of stream bits, pairs of blocks in
    /// lockstep) and the one value at a time decoder agree on intact and damaged sections:
    /// same values, same errors.
    #[test]
    fn table_and_one_at_a_time_decoders_agree() {
        fn check<const W: usize>(rng: &mut Rng) {
            let nb = 8 * W as u32;
            for scale in [0u32, 1, 3, 6, 10, nb] {
                for n in [1usize, 9, 40, 1024, 1500, 2100, 4113] {
                    let old: Vec<u32> = (0..n)
                        .map(|_| rng.next_u64() as u32 & mask(nb) as u32)
                        .collect();
                    let new: Vec<u32> = old
                        .iter()
                        .map(|&a| {
                            let step = match rng.below(10) {
                                0..=6 => rng.below(3) as i64 - 1,
                                7 => (rng.next_u64() >> 40) as i64,
                                _ => rng.below(1 << scale) as i64 - (1 << scale) / 2,
                            };
                            from_ordered(
                                (to_ordered(a, W) as i64 + step).rem_euclid(1 << nb) as u32,
                                W,
                            )
                        })
                        .collect();
                    let (old, new) = (patterns(W, &old), patterns(W, &new));
                    let mut enc = Vec::new();
                    encode(W, &old, &new, &mut enc);
                    for damage in 0..30 {
                        let mut bad = enc.clone();
                        if damage > 0 {
                            let i = rng.below(bad.len() as u64) as usize;
                            bad[i] ^= 1 << rng.below(8);
                        }
                        let (mut a, mut b) = (Vec::new(), Vec::new());
                        let ra = decode_width::<W, FAST>(&bad, &old, &mut a);
                        let rb = decode_width::<W, ONE_AT_A_TIME>(&bad, &old, &mut b);
                        assert_eq!(ra, rb, "width {W} scale {scale} n {n} damage {damage}");
                        if ra.is_ok() {
                            assert_eq!(a, b);
                        }
                        if damage == 0 {
                            assert_eq!(a, new);
                        }
                    }
                }
            }
        }
        let mut rng = Rng(30);
        check::<1>(&mut rng);
        check::<2>(&mut rng);
    }

    /// The branch-free decoder (the one in use) against the table lookups with a branch at
    /// each code word they do not hold, and both against the one value at a time decoder,
    /// on blocks of every `k` up to past the tables' (steps of every scale), every cap (also
    /// set in the directory by hand, below the tables' holding ones and above what a block
    /// needs), raw and unchanged values, special patterns, odd lengths, and damaged bits
    /// anywhere: same values, same errors.
    #[test]
    fn fast_and_lookup_decoders_agree() {
        fn check<const W: usize>(rng: &mut Rng) {
            let nb = 8 * W as u32;
            let sp = specials(W);
            let agree = |bad: &[u8], old: &[u8], what: &str| {
                let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
                let ra = decode_width::<W, FAST>(bad, old, &mut a);
                let rb = decode_width::<W, LOOKUPS>(bad, old, &mut b);
                let rc = decode_width::<W, ONE_AT_A_TIME>(bad, old, &mut c);
                let mut p = Vec::new();
                let rp = decode_width::<W, FAST_PORTABLE>(bad, old, &mut p);
                assert_eq!(ra, rb, "width {W}: {what}");
                assert_eq!(ra, rc, "width {W}: {what}");
                assert_eq!(ra, rp, "width {W}: {what}");
                if ra.is_ok() {
                    assert_eq!(a, b, "width {W}: {what}");
                    assert_eq!(a, c, "width {W}: {what}");
                    assert_eq!(a, p, "width {W}: {what}");
                }
                a
            };
            for scale in 0..=nb {
                for n in [1usize, 9, 17, 18, 40, 1024, 1025, 2048, 2100, 3090, 4113] {
                    let old: Vec<u32> = (0..n)
                        .map(|_| match rng.below(8) {
                            0 => sp[rng.below(sp.len() as u64) as usize],
                            _ => rng.next_u64() as u32 & mask(nb) as u32,
                        })
                        .collect();
                    let new: Vec<u32> = old
                        .iter()
                        .map(|&a| {
                            let step = match rng.below(20) {
                                0 => 0,
                                1 => return sp[rng.below(sp.len() as u64) as usize],
                                2 => (rng.next_u64() >> 40) as i64,
                                3..=12 => rng.below(3) as i64 - 1,
                                _ => {
                                    let m = rng.below(1 << scale) as i64 + 1;
                                    if rng.below(2) == 0 {
                                        m
                                    } else {
                                        -m
                                    }
                                }
                            };
                            from_ordered(
                                (to_ordered(a, W) as i64 + step).rem_euclid(1 << nb) as u32,
                                W,
                            )
                        })
                        .collect();
                    let (old, new) = (patterns(W, &old), patterns(W, &new));
                    let mut enc = Vec::new();
                    encode(W, &old, &new, &mut enc);
                    assert_eq!(agree(&enc, &old, "intact"), new);
                    let dir_len = n.div_ceil(BLOCK) * DIR_ENTRY;
                    for damage in 0..40 {
                        let mut bad = enc.clone();
                        if damage < 10 {
                            // A block's k or cap set to anything it may hold.
                            let b = rng.below(dir_len as u64 / 4) as usize;
                            if damage % 2 == 0 {
                                bad[4 * b + 3] = rng.below(nb as u64 + 2) as u8;
                            } else {
                                bad[4 * b + 2] = rng.below(TABLE_K as u64 + 2) as u8;
                            }
                        } else {
                            for _ in 0..1 + damage % 3 {
                                let i = rng.below(bad.len() as u64) as usize;
                                bad[i] ^= 1 << rng.below(8);
                            }
                        }
                        agree(&bad, &old, &format!("scale {scale} n {n} damage {damage}"));
                    }
                }
            }
        }
        let mut rng = Rng(31);
        check::<1>(&mut rng);
        check::<2>(&mut rng);
    }

    /// Every narrow decoder on `input`: the one in use, its portable build, the table
    /// lookups and the one value at a time decoder give the same values and the same errors.
    fn narrow_decoders_agree<const W: usize>(input: &[u8], old: &[u8], what: &str) {
        let mut outs = [(); 4].map(|()| Vec::new());
        let results = [
            decode_width::<W, FAST>(input, old, &mut outs[0]),
            decode_width::<W, FAST_PORTABLE>(input, old, &mut outs[1]),
            decode_width::<W, LOOKUPS>(input, old, &mut outs[2]),
            decode_width::<W, ONE_AT_A_TIME>(input, old, &mut outs[3]),
        ];
        for (x, (r, o)) in results.iter().zip(&outs).enumerate().skip(1) {
            assert_eq!(&results[0], r, "width {W}, decoder {x}: {what}");
            if r.is_ok() {
                assert_eq!(&outs[0], o, "width {W}, decoder {x}: {what}");
            }
        }
    }

    /// The decoders on what the fast one sees most: `k = 0` blocks of ±1 steps (long runs
    /// of one- and two-bit words) with a few longer and raw ones at several rates, old
    /// values with special patterns (±0, subnormals, NaNs, infinities), lengths around the
    /// fast steps' room (8, 16) and a block's end, every cap set in the directory by hand
    /// (other lengths, other raw words, the largest cap's invalid code numbers), cut short
    /// and with flipped bits: same values, same errors, no panic.
    #[test]
    fn decoders_agree_on_runs_of_unit_steps() {
        fn check<const W: usize>(rng: &mut Rng) {
            let nb = 8 * W as u32;
            let sp = specials(W);
            for tail in [1usize, 2, 8, 9, 10, 16, 17, 18, 63, 64, 65, 1023, 1024] {
                for blocks in [0usize, 1, 2, 3] {
                    let n = blocks * BLOCK + tail;
                    // Percent of steps that are not ±1.
                    let other = [0, 1, 13, 40][rng.below(4) as usize];
                    let old: Vec<u32> = (0..n)
                        .map(|_| match rng.below(16) {
                            0 => sp[rng.below(sp.len() as u64) as usize],
                            _ => rng.next_u64() as u32 & mask(nb) as u32,
                        })
                        .collect();
                    let new: Vec<u32> = old
                        .iter()
                        .map(|&a| {
                            let r = rng.below(100);
                            let m = if r >= other {
                                1
                            } else if !r.is_multiple_of(4) {
                                let b = 1 + rng.below(7);
                                (1 << b) + rng.below(1 << b) as i64
                            } else {
                                rng.below(1 << nb) as i64
                            };
                            let step = if rng.below(2) == 0 { m } else { -m };
                            from_ordered(
                                (to_ordered(a, W) as i64 + step).rem_euclid(1 << nb) as u32,
                                W,
                            )
                        })
                        .collect();
                    let (old, new) = (patterns(W, &old), patterns(W, &new));
                    let mut enc = Vec::new();
                    encode(W, &old, &new, &mut enc);
                    let mut dec = Vec::new();
                    decode(W, &enc, &old, &mut dec).unwrap();
                    assert_eq!(dec, new, "width {W}, {n} values, {other} %");
                    let what = format!("{n} values, {other} % not ±1");
                    narrow_decoders_agree::<W>(&enc, &old, &what);
                    let dir_len = n.div_ceil(BLOCK) * DIR_ENTRY;
                    for c in 0..=nb + 1 {
                        let mut bad = enc.clone();
                        for b in 0..dir_len / DIR_ENTRY {
                            bad[DIR_ENTRY * b + 3] = c as u8;
                        }
                        narrow_decoders_agree::<W>(&bad, &old, &format!("{what}, caps {c}"));
                    }
                    for cut in [1, 2, 9, enc.len() / 2] {
                        let short = &enc[..enc.len().saturating_sub(cut)];
                        narrow_decoders_agree::<W>(short, &old, &format!("{what}, cut {cut}"));
                    }
                    for flips in 0..12 {
                        let mut bad = enc.clone();
                        for _ in 0..1 + flips % 3 {
                            let i = dir_len + rng.below((bad.len() - dir_len) as u64) as usize;
                            bad[i] ^= 1 << rng.below(8);
                        }
                        narrow_decoders_agree::<W>(&bad, &old, &format!("{what}, flips"));
                    }
                }
            }
        }
        let mut rng = Rng(33);
        check::<1>(&mut rng);
        check::<2>(&mut rng);
    }

    /// The dispatched narrow encoder (the lane writer where the CPU has AVX2) against the
    /// portable one (the table writer) on steps of every scale, so blocks get every `k` and
    /// cap, with unchanged elements, special patterns, and odd lengths (partial octets).
    #[test]
    fn lane_writer_matches_table_writer() {
        let mut rng = Rng(29);
        for width in [1usize, 2] {
            let nb = 8 * width as u32;
            let sp = specials(width);
            for scale in 0..=nb {
                for n in [1usize, 2, 7, 8, 9, 15, 16, 17, 63, 1000, 1024, 1031, 2053] {
                    let old: Vec<u32> = (0..n)
                        .map(|_| match rng.below(8) {
                            0 => sp[rng.below(sp.len() as u64) as usize],
                            _ => rng.next_u64() as u32 & mask(nb) as u32,
                        })
                        .collect();
                    let new: Vec<u32> = old
                        .iter()
                        .map(|&a| {
                            let step = match rng.below(16) {
                                0 => 0,
                                1 => return sp[rng.below(sp.len() as u64) as usize],
                                2..=8 => rng.below(3) as i64 - 1,
                                _ => {
                                    let m = rng.below(1 << scale) as i64 + 1;
                                    if rng.below(2) == 0 {
                                        m
                                    } else {
                                        -m
                                    }
                                }
                            };
                            from_ordered(
                                (to_ordered(a, width) as i64 + step).rem_euclid(1 << nb) as u32,
                                width,
                            )
                        })
                        .collect();
                    let (old, new) = (patterns(width, &old), patterns(width, &new));
                    let mut portable = Vec::new();
                    match width {
                        1 => encode_codes::<1, u16, false>(&old, &new, &mut portable),
                        _ => encode_codes::<2, u16, false>(&old, &new, &mut portable),
                    }
                    let mut dispatched = Vec::new();
                    encode(width, &old, &new, &mut dispatched);
                    assert_eq!(
                        portable, dispatched,
                        "width {width}, scale {scale}, {n} values"
                    );
                    if n <= 1031 {
                        assert_eq!(portable, reference_encode(width, &old, &new));
                    }
                }
            }
        }
    }

    /// The lane writer (both its k = 0 loop and the general one) against the table writer
    /// for every cap it takes (`0..=nb`; 0: all raw), on code numbers of every length, the unchanged
    /// mark and new bits of any pattern, at odd lengths: same bits.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn lane_writer_matches_table_writer_for_every_cap() {
        fn check<const W: usize>(rng: &mut Rng) {
            let nb = 8 * W as u32;
            let mut lanes = Lanes::new();
            for k in 0..3 {
                for c in 0..=nb {
                    for n in [
                        1usize, 7, 8, 9, 15, 16, 17, 31, 32, 33, 47, 48, 63, 64, 65, 100, 1024,
                    ] {
                        // Every other n mostly short words (the AVX-512 writer's octets
                        // then nearly all fit their store), else any mix.
                        let any = if n % 2 == 0 { 10 } else { 60 };
                        let codes: Vec<u16> = (0..n)
                            .map(|_| match rng.below(any) {
                                0 => unchanged::<W>() as u16,
                                1..=6 | 10.. => rng.below(2) as u16,
                                _ => {
                                    let len = rng.below(nb as u64 + 1) as u32;
                                    let u = rng.next_u64() as u32 & mask(len) as u32;
                                    (if u == unchanged::<W>() { 0 } else { u }) as u16
                                }
                            })
                            .collect();
                        let new: Vec<[u8; W]> =
                            (0..n).map(|_| to_le::<W>(rng.next_u64() as u32)).collect();
                        let bits: u64 = codes
                            .iter()
                            .zip(&new)
                            .map(|(&u, b)| {
                                let word = code_word::<W>(u as u32, le(b), k, c);
                                (word.zeros + word.len) as u64
                            })
                            .sum();
                        let mut table = SmallCodes::new();
                        table.set(k, c);
                        let mut by_table = vec![0xa5];
                        let mut writer = BitWriter::new(&mut by_table);
                        writer.block(bits, |out| {
                            write_values::<W, u16>(out, &table, &codes, &new, k, c)
                        });
                        writer.finish();
                        let mut by_lanes = vec![0xa5];
                        let mut writer = BitWriter::new(&mut by_lanes);
                        writer.block(bits, |out| {
                            // SAFETY: `x86_wide` detected the features it needs (below).
                            unsafe { write_lanes::<W, u16>(out, &mut lanes, &codes, &new, k, c) }
                        });
                        writer.finish();
                        assert_eq!(by_table, by_lanes, "width {W}, k {k}, c {c}, {n} values");
                        if k == 0 {
                            // Both k = 0 writers, whichever the lane writer took.
                            let mut by_avx2 = vec![0xa5];
                            let mut writer = BitWriter::new(&mut by_avx2);
                            // SAFETY: `x86_wide` detected the features it needs (below).
                            writer
                                .block(bits, |out| unsafe { write_k0::<W>(out, &codes, &new, c) });
                            writer.finish();
                            assert_eq!(by_table, by_avx2, "AVX2 width {W}, c {c}, {n} values");
                            if crate::codec::bits::x86_avx512() {
                                let mut by_avx512 = vec![0xa5];
                                let mut writer = BitWriter::new(&mut by_avx512);
                                writer.block(bits, |out| {
                                    // SAFETY: `x86_wide` (below) and `x86_avx512` detected the
                                    // features it needs.
                                    unsafe { write_k0_avx512::<W>(out, &codes, &new, c) }
                                });
                                writer.finish();
                                assert_eq!(
                                    by_table, by_avx512,
                                    "AVX-512 width {W}, c {c}, {n} values"
                                );
                            }
                        }
                    }
                }
            }
        }
        if !crate::codec::bits::x86_wide() {
            return;
        }
        let mut rng = Rng(32);
        check::<1>(&mut rng);
        check::<2>(&mut rng);
    }

    #[test]
    fn narrow_histogram_matches_counting_by_value() {
        fn check<const W: usize>(rng: &mut Rng) {
            let nb = 8 * W as u32;
            for n in [
                0usize, 1, 7, 8, 9, 31, 32, 33, 63, 64, 65, 95, 96, 255, 1023, 1024,
            ] {
                for mix in 0..6 {
                    // Mostly small code numbers (as AdamW steps), every length, and the
                    // unchanged mark; `mix` 3 is all unchanged.
                    let codes: Vec<u16> = (0..n)
                        .map(|_| match (mix, rng.below(10)) {
                            // Every lane's counters full (the largest code number), and the
                            // byte boundaries.
                            (5, _) => mask(nb) as u16,
                            (4, _) => {
                                let edges = [0u32, 1, 127, 128, 253, 255, 256, 257, 32767, 32768];
                                let u = edges[rng.below(edges.len() as u64) as usize];
                                let u = u & mask(nb) as u32;
                                (if u == unchanged::<W>() { 0 } else { u }) as u16
                            }
                            (3, _) | (2, 0) => unchanged::<W>() as u16,
                            (0, _) | (_, 1..=6) => rng.below(4) as u16,
                            _ => {
                                let len = rng.below(nb as u64 + 1) as u32;
                                let u = rng.next_u64() as u32 & mask(len) as u32;
                                (if u == unchanged::<W>() { 0 } else { u }) as u16
                            }
                        })
                        .collect();
                    assert_eq!(
                        histogram_narrow::<W>(&codes),
                        histogram::<W, u16>(&codes),
                        "width {W}, {n} codes, mix {mix}"
                    );
                    #[cfg(target_arch = "x86_64")]
                    if crate::codec::bits::x86_wide() {
                        // SAFETY: `x86_wide` detected the features it needs.
                        let wide = unsafe { histogram_avx2::<W>(&codes) };
                        assert_eq!(wide, histogram::<W, u16>(&codes), "width {W}, {n} codes");
                        if W == 2 && crate::codec::bits::x86_avx512() {
                            // SAFETY: as above, and `x86_avx512` detected the rest.
                            let gathered = unsafe { histogram_avx512::<W>(&codes) };
                            assert_eq!(gathered, wide, "width {W}, {n} codes, AVX-512");
                            if x86_gfni() {
                                // SAFETY: as above, and `x86_gfni` detected the rest.
                                let planes = unsafe { histogram_gfni::<W>(&codes) };
                                assert_eq!(planes, wide, "width {W}, {n} codes, GFNI");
                            }
                        }
                    }
                }
            }
        }
        let mut rng = Rng(27);
        check::<1>(&mut rng);
        check::<2>(&mut rng);
    }

    #[test]
    fn step_tables_agree_with_code_words() {
        fn check<const W: usize>(rng: &mut Rng) {
            let nb = 8 * W as u32;
            for k in 0..=TABLE_K {
                let table = StepTable::get::<W>(k);
                let mut max_c = 0;
                for x in 0..LOOKUP_SIZE {
                    if table.count[x] > 0 {
                        max_c = max_c.max(table.min_c[x] as u32);
                    }
                    for c in 1..=nb + 1 {
                        if (table.min_c[x] as u32) > c {
                            continue;
                        }
                        // Whatever follows the LOOKUP bits, the words decode as the table says.
                        let word = x as u64 | (rng.next_u64() << LOOKUP);
                        let mut used = 0;
                        for &code in &table.codes[x][..table.count[x] as usize] {
                            let (u, len) = narrow_word::<W>(word >> used, k, c);
                            assert!(u & TAG == 0, "k {k} x {x:#b} c {c}: raw word");
                            assert!(valid_code(u as u64, nb), "k {k} x {x:#b}: code {u}");
                            assert_eq!(u, code as u32, "k {k} x {x:#b} c {c}");
                            used += len;
                        }
                        assert_eq!(used, table.bits[x] as u32, "k {k} x {x:#b} c {c}");
                        assert!(used <= LOOKUP && table.count[x] > 0);
                        let meta = table.meta[x];
                        assert_eq!(meta & 0xff, used);
                        assert_eq!(meta >> 8 & 0xff, table.count[x] as u32);
                        assert_eq!(meta >> 16, table.min_c[x] as u32);
                    }
                }
                assert_eq!(table.max_c, max_c, "width {W}, k {k}");
            }
        }
        let mut rng = Rng(26);
        check::<1>(&mut rng);
        check::<2>(&mut rng);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn prop_round_trip((width, old, new) in value_pairs()) {
            let mut enc = Vec::new();
            encode(width, &old, &new, &mut enc);
            let mut dec = Vec::new();
            decode(width, &enc, &old, &mut dec).unwrap();
            prop_assert_eq!(&dec, &new);
            if width < 4 || old.len() <= 400 * width {
                prop_assert_eq!(enc, reference_encode(width, &old, &new));
            }
        }

        #[test]
        fn prop_decoder_never_panics(width in prop::sample::select(vec![1usize, 2, 3, 4]), input in prop::collection::vec(any::<u8>(), 0..400), old in prop::collection::vec(any::<u8>(), 0..2000)) {
            let mut out = Vec::new();
            if decode(width, &input, &old, &mut out).is_ok() {
                prop_assert_eq!(out.len(), old.len() / width * width);
            }
        }

        #[test]
        fn prop_decoder_survives_damaged_sections((width, old, new) in value_pairs(), at in any::<usize>(), byte in any::<u8>()) {
            let mut enc = Vec::new();
            encode(width, &old, &new, &mut enc);
            if !enc.is_empty() {
                let i = at % enc.len();
                enc[i] ^= byte | 1;
                let mut out = Vec::new();
                if decode(width, &enc, &old, &mut out).is_ok() {
                    prop_assert_eq!(out.len(), new.len());
                }
            }
        }
    }
}
