//! The `ulp` encoder: per block, the code numbers of the steps, their length histogram,
//! the exact best `(k, c)` from it, and the code words written (from tables of small code
//! numbers in the portable build; by the lane writers of `x86` in the AVX2 build).

use super::codes::{Code, Histogram, HIST, UNCHANGED_SLOT};
use super::format::{code_word, le, nbits, put_word, step_code, unchanged, BLOCK, DIR_ENTRY};
#[cfg(target_arch = "x86_64")]
use super::x86;
#[cfg(target_arch = "x86_64")]
use crate::codec::bits::Lanes;
use crate::codec::bits::{bit_len, BitWriter, BlockWriter};
use std::sync::OnceLock;

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
/// path. That is ~97% of the values of the benchmarks' AdamW-like chunk
/// (`deltacast_testkit::adamw_chunk`) and more of the recorded trace's
/// (crates/deltacast/tests/data/traces/README.md).
const fn small<const W: usize>() -> u32 {
    if W == 1 {
        128
    } else {
        256
    }
}

/// Code numbers the writer's tables cover: all but under 1% of AdamW steps (steps of up to
/// 512 ULPs), on the recorded trace (crates/deltacast/tests/data/traces/README.md) and on the
/// benchmarks' AdamW-like chunk alike, so that a group of three values rarely leaves the table
/// path (a mispredicted branch and the general path).
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
pub(super) struct SmallCodes {
    key: Option<(u32, u32)>,
    word: [u32; TABLE],
    /// Length of the code word; [`NOT_HELD`] for the general path.
    len: [u8; TABLE],
}

/// [`SmallCodes`] length of values left to the general path: above the 48 bits of three
/// code words that share a store.
const NOT_HELD: u8 = 64;

impl SmallCodes {
    pub(super) fn new() -> Self {
        SmallCodes {
            key: None,
            word: [0; TABLE],
            len: [NOT_HELD; TABLE],
        }
    }

    pub(super) fn set(&mut self, k: u32, c: u32) {
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
        if W == 2 && crate::codec::bits::x86_avx512() {
            if x86::x86_gfni() {
                // SAFETY: the caller guarantees the features of `x86_wide`, and
                // `x86_avx512` and `x86_gfni` detected the rest.
                return unsafe { x86::histogram_gfni::<W>(codes) };
            }
            // SAFETY: the caller guarantees the features of `x86_wide`, and
            // `x86_avx512` detected the rest.
            return unsafe { x86::histogram_avx512::<W>(codes) };
        }
        // SAFETY: the caller guarantees the features.
        unsafe { x86::histogram_avx2::<W>(codes) }
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

pub(super) fn encode_width<const W: usize>(old: &[u8], new: &[u8], out: &mut Vec<u8>) {
    if W <= 2 {
        #[cfg(target_arch = "x86_64")]
        if crate::codec::bits::x86_avx512() {
            // SAFETY: the function's only requirement is its target features, all of which
            // `x86_avx512` detected just above on this CPU.
            return unsafe { encode_narrow_avx512::<W>(old, new, out) };
        }
        if crate::codec::bits::x86_wide() {
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
pub(super) fn encode_narrow_avx2<const W: usize>(old: &[u8], new: &[u8], out: &mut Vec<u8>) {
    encode_codes::<W, u16, true>(old, new, out)
}

/// [`encode_narrow_avx2`] with AVX-512 F and BW too: the code numbers' loop goes 32 lanes
/// wide (a little faster on dense chunks: docs/data/codecs/README.md, "Figures behind the
/// code"). Same bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,avx512f,avx512bw")]
pub(super) fn encode_narrow_avx512<const W: usize>(old: &[u8], new: &[u8], out: &mut Vec<u8>) {
    encode_codes::<W, u16, true>(old, new, out)
}

#[inline(always)]
pub(super) fn encode_codes<const W: usize, C: Code, const LANES: bool>(
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
    let (use_lanes, mut lanes) = (LANES && crate::codec::bits::x86_wide(), Lanes::new());
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
                |out| unsafe { x86::write_lanes::<W, C>(out, &mut lanes, codes, new, k, c) },
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

/// Writes the code words of one block: code numbers `codes`, new bit patterns `new` (for
/// raw values), with parameters `(k, c)` and `table` filled for them. Code numbers the
/// table holds go three to a store when their code words fit one (nearly always).
#[inline(always)]
pub(super) fn write_values<const W: usize, C: Code>(
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

#[cfg(test)]
mod tests {
    #[cfg(target_arch = "x86_64")]
    use super::super::format::to_le;
    use super::super::reference::{patterns, reference_encode, specials};
    #[cfg(target_arch = "x86_64")]
    use super::super::x86::{
        histogram_avx2, histogram_avx512, histogram_gfni, write_k0, write_k0_avx512, write_lanes,
        x86_gfni,
    };
    use super::super::{decode, encode};
    use super::*;
    use crate::codec::bits::mask;
    use crate::dtype::{from_ordered, to_ordered};
    use crate::testutil::{adamw_bf16, Rng};

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
}
