//! The AVX2 and AVX-512 kernels of the `ulp` encoder: length histograms in byte lanes, bit
//! planes (GFNI) or by register compress, and the lane writers that compute and join code
//! words in vector registers. Each gives the same bits as its portable counterpart in
//! `encode.rs`, which calls them (and compiles itself for those features too).

use super::codes::{Code, Histogram, HIST, UNCHANGED_SLOT};
use super::format::{code_word, le, nbits, put_word, unchanged, BLOCK};
use crate::codec::bits::{bit_len, join_eight, put_words, BlockWriter, Joined, Lanes};
use std::mem::MaybeUninit;

/// `encode::histogram_narrow` in AVX2 byte lanes, 32 code numbers at a time: counts of code
/// numbers at or above each power of two up to 2^7 from their low byte saturated
/// (`min(u, 255)`) and from 2^8 on from their high byte, each a signed byte compare (bytes
/// biased by 128) against a constant, counted in byte lanes (at most 32 per lane in a block)
/// and summed at the end. Same histogram.
///
/// # Safety
///
/// The CPU must have the features of [`crate::codec::bits::x86_wide`].
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
#[inline]
pub(super) unsafe fn histogram_avx2<const W: usize>(codes: &[u16]) -> Histogram {
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
/// numbers of 9 bits or more (and the unchanged mark), ~3 % of the benchmarks' AdamW-like
/// steps (`deltacast_testkit::adamw_chunk`; fewer on the recorded trace), are gathered by
/// one register compress per 32 (AVX-512 VBMI2, no branch) and counted by length one by one;
/// those below come from the low byte pass as before. Same histogram.
///
/// # Safety
///
/// The CPU must have the features of [`crate::codec::bits::x86_wide`] and of
/// [`crate::codec::bits::x86_avx512`].
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,avx512f,avx512bw,avx512vbmi2")]
#[inline(never)]
pub(super) unsafe fn histogram_avx512<const W: usize>(codes: &[u16]) -> Histogram {
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
/// [`crate::codec::bits::x86_avx512`]. Detection is cached by the standard library.
#[inline]
pub(super) fn x86_gfni() -> bool {
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
/// The CPU must have the features of [`crate::codec::bits::x86_wide`], of
/// [`crate::codec::bits::x86_avx512`] and of [`x86_gfni`].
#[target_feature(
    enable = "avx2,bmi1,bmi2,lzcnt,popcnt,avx512f,avx512bw,avx512vbmi2,gfni,avx512bitalg"
)]
#[inline(never)]
pub(super) unsafe fn histogram_gfni<const W: usize>(codes: &[u16]) -> Histogram {
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

// The lane writer's scratch holds a whole block.
const _: () = assert!(BLOCK <= crate::codec::bits::LANES_MAX);

/// Bit length of `u < 2^24` from the exponent of its exact `f32` conversion: one vector
/// conversion and two integer operations per lane where `leading_zeros` has no vector
/// instruction (AVX2).
#[inline(always)]
fn bit_len_f32(u: u32) -> u32 {
    debug_assert!(u < 1 << 24);
    // 1 <= u: the exponent is 127 + floor(log2 u), so the length is exponent - 126; 0 has
    // exponent 0 and length 0.
    ((u as i32 as f32).to_bits() >> 23).max(126) - 126
}

/// `encode::write_values` of narrow elements with a cap `c <= nb` (every code word then fits
/// 32 bits) in the AVX2 build: each value's code word and length in one loop the compiler
/// vectorizes (no table, no branch), then the words of eight consecutive values joined in
/// vector lanes and written by one store when they fit 56 bits together (nearly always at
/// `k = 0`); blocks with `k = 0` (nearly all of AdamW steps) by [`write_k0`], all in
/// registers. Same bits as `encode::write_values`.
///
/// # Safety
///
/// The CPU must have the features of [`crate::codec::bits::x86_wide`].
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
#[inline]
pub(super) unsafe fn write_lanes<const W: usize, C: Code>(
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
            if crate::codec::bits::x86_avx512() {
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
/// The CPU must have the features of [`crate::codec::bits::x86_wide`].
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
#[inline(never)]
pub(super) unsafe fn write_k0<const W: usize>(
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
/// The CPU must have the features [`crate::codec::bits::x86_avx512`] checks.
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,avx512f,avx512bw,avx512cd")]
#[inline(never)]
pub(super) unsafe fn write_k0_avx512<const W: usize>(
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
    // at k = 0 on AdamW steps, a branch that fresh data mispredicts (slower than the AVX2
    // writer then: docs/data/codecs/README.md, "Figures behind the code"); an octet nearly
    // never does.
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
    // Thirty-two values per loop, one branch for their four octets (measured faster than one
    // branch per sixteen: docs/data/codecs/README.md, "Figures behind the code").
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
/// a masked `or` (two extra instructions per sixteen values in [`write_k0_avx512`], a
/// measurable share of a dense ulp encode: docs/data/codecs/README.md, "Figures behind the
/// code"). Same lanes.
///
/// # Safety
///
/// The CPU must have AVX-512F.
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

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
}
