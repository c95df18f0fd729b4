//! `gaps` positions: Golomb–Rice coded gaps between sorted positions, in blocks of
//! [`BLOCK`] positions that each decode on their own.
//!
//! Layout (docs/codecs.md has it byte by byte): a directory of one 7-byte entry per block
//! (`first: u32`, `bits: u16`, `k: u8`, little-endian), then one bit stream holding each
//! block's gaps in order. A block's bit offset is the sum of the `bits` of the blocks before
//! it, so threads (or a GPU) can decode all blocks at once after a prefix sum. The Rice
//! parameter is the exact best for each block's own gaps, which follows changes in density
//! along the tensor; quotients of [`ESC`] or more are escaped to the gap's plain binary, so
//! a code word never exceeds 48 bits whatever the input.
//!
//! Speed: the encoder's passes over a block's gaps run in a build for AVX2 where the CPU has
//! it (8 lanes; the length histogram then comes from counts below each power of two, with no
//! counter in memory); dense blocks (`k <= 6`) take their code words from a table of small gaps, four
//! per store; the decoder keeps the next bits in a register and refills only when fewer
//! remain than a plain code word needs.

use super::bitmap::{set_bits, SET_BITS_SLACK};
use super::bits::{bit_len, check_stream_len, mask, BitReader, BitWriter, BlockWriter};
#[cfg(target_arch = "x86_64")]
use super::bits::{put_words, Lanes};
use crate::error::CodecError;
use std::sync::OnceLock;

#[cfg(test)]
#[path = "trace_tests.rs"]
mod trace_tests;

/// Positions per block: the directory costs 56 bits per block (under 0.1 bit per position)
/// and a block is still small enough to be one unit of parallel work.
pub(crate) const BLOCK: usize = 1024;
/// Unary quotients this long are an escape: `ESC` zero bits, then the gap in `w` bits.
const ESC: u32 = 16;
/// Largest Rice parameter (gaps are below 2^32).
const MAX_K: u32 = 31;
const DIR_ENTRY: usize = 7;
/// Longest code word: max(ESC - 1 + 1 + MAX_K, ESC + 32).
const MAX_CODE: u32 = 48;

// A block's bit count must fit the u16 directory field whatever its gaps.
const _: () = assert!((BLOCK as u64 - 1) * MAX_CODE as u64 <= u16::MAX as u64);

/// Bits of an escaped gap: enough for the largest gap a range can hold.
fn escape_width(range: u32) -> u32 {
    bit_len(range.saturating_sub(1) as u64).max(1)
}

/// Exact bits of the Rice code of `gaps` with parameter `k`.
#[inline(always)]
fn rice_bits(gaps: &[u32], k: u32, w: u32) -> u32 {
    gaps.iter()
        .map(|&g| {
            let q = g >> k;
            if q < ESC {
                q + 1 + k
            } else {
                ESC + w
            }
        })
        .sum()
}

/// The `k` with the fewest bits for `gaps` (the smallest such `k` on ties) and that count.
///
/// Exact without sizing every `k`: a histogram of gap bit lengths gives, per `k`, a lower and
/// an upper bound on the block's bits (a gap of bit length `L` has a quotient between
/// `2^(L-1) >> k` and `(2^L - 1) >> k`). Only the `k` whose lower bound does not exceed the
/// smallest upper bound can win, and only those (usually two or three) are sized exactly.
///
/// `VECTOR`: take the histogram with [`length_histogram_vector`] (for builds with wide
/// vectors) rather than [`length_histogram`]; the result is the same.
#[inline(always)]
fn best_k<const VECTOR: bool>(gaps: &[u32], w: u32) -> (u32, u32) {
    let (hist, top) = if VECTOR {
        length_histogram_vector(gaps)
    } else {
        length_histogram(gaps)
    };
    // Beyond the bit length of the largest gap every quotient is 0 and bits only grow.
    let kmax = top.min(MAX_K);

    let mut bounds = [(0u64, 0u64); MAX_K as usize + 1];
    for k in 0..=kmax {
        let cost = |q: u64| {
            if q < ESC as u64 {
                q + 1 + k as u64
            } else {
                (ESC + w) as u64
            }
        };
        let (mut lo, mut hi) = (
            hist[0] as u64 * (1 + k as u64),
            hist[0] as u64 * (1 + k as u64),
        );
        for l in 1..=top {
            let count = hist[l as usize] as u64;
            let (qmin, qmax) = ((1u64 << (l - 1)) >> k, ((1u64 << l) - 1) >> k);
            let (a, b) = if qmax < ESC as u64 || qmin >= ESC as u64 {
                (cost(qmin), cost(qmax))
            } else {
                (
                    cost(qmin).min(cost(qmax)),
                    cost(ESC as u64 - 1).max(cost(qmax)),
                )
            };
            lo += count * a;
            hi += count * b;
        }
        bounds[k as usize] = (lo, hi);
    }
    let cap = bounds[..=kmax as usize]
        .iter()
        .map(|b| b.1)
        .min()
        .unwrap_or(0);
    let mut best: Option<(u32, u32)> = None;
    for k in 0..=kmax {
        if bounds[k as usize].0 <= cap {
            let bits = rice_bits(gaps, k, w);
            if best.is_none_or(|(_, b)| bits < b) {
                best = Some((k, bits));
            }
        }
    }
    best.unwrap_or((0, 0))
}

/// Histogram of the bit lengths of `gaps` and the largest length: counted by length in four
/// interleaved histograms (so runs of equal lengths do not all wait on one counter).
#[inline(always)]
fn length_histogram(gaps: &[u32]) -> ([u32; 33], u32) {
    let mut lanes = [[0u32; 33]; 4];
    let mut quads = gaps.chunks_exact(4);
    for quad in &mut quads {
        for (lane, &g) in lanes.iter_mut().zip(quad) {
            lane[bit_len(g as u64) as usize] += 1;
        }
    }
    for &g in quads.remainder() {
        lanes[0][bit_len(g as u64) as usize] += 1;
    }
    let hist: [u32; 33] = std::array::from_fn(|l| lanes.iter().map(|lane| lane[l]).sum());
    let top = hist.iter().rposition(|&c| c > 0).unwrap_or(0) as u32;
    (hist, top)
}

/// [`length_histogram`] from the counts of gaps below each power of two up to the largest gap:
/// a few passes of compares and adds, with no counter in memory. Faster where the compiler
/// can make them 8 lanes wide or more (AVX2: ~1.2× on the gaps encoder at 10% density, ~1.3×
/// at 50%); slower with 4 lanes.
#[inline(always)]
fn length_histogram_vector(gaps: &[u32]) -> ([u32; 33], u32) {
    // The bit length of the largest gap is that of all gaps or-ed together.
    let top = bit_len(gaps.iter().fold(0, |m, &g| m | g) as u64);
    let mut hist = [0u32; 33];
    let mut shorter = 0;
    for l in 0..=top {
        // Gaps of at most l bits: all of them for the largest gap's length.
        let below = if l == top {
            gaps.len() as u32
        } else {
            gaps.iter().fold(0u32, |n, &g| n + (g < 1 << l) as u32)
        };
        hist[l as usize] = below - shorter;
        shorter = below;
    }
    (hist, top)
}

/// A lower bound on the encoded size of `count` positions (directory plus one bit per gap),
/// so the chooser can skip encoding when another codec is already at least as small.
pub(crate) fn min_len(count: usize) -> u64 {
    let blocks = count.div_ceil(BLOCK);
    (blocks * DIR_ENTRY) as u64 + ((count - blocks) as u64).div_ceil(8)
}

/// A lower bound on the size of the section that codes `rel` (strictly increasing, each
/// `< range`), tight on dense chunks, from one pass over the positions: no gap histogram and
/// no exact sizing, so the chooser can skip [`directory`] when another codec is already
/// smaller.
///
/// Per block of `n` gaps summing to `s` with largest gap `g_max`, and for each `k`: when no gap
/// can be escaped (`g_max < ESC << k`), each code word has `floor(g / 2^k) + 1 + k` bits and
/// `floor(g / 2^k) >= (g - (2^k - 1)) / 2^k`, so the block has at least
/// `ceil((s - n (2^k - 1)) / 2^k) + n (1 + k)` bits; otherwise at least `n` times the
/// shortest code word, `min(1 + k, ESC + w)`. The block's best `k` costs at least the
/// smallest of these. On a half-dense chunk the bound at k = 0 is the exact size (`s + n`).
/// From 40 % the chooser takes the same bound from the bitmap's words ([`map_bounds`]).
pub(crate) fn lower_bound(rel: &[u32], range: u32) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if super::bits::x86_wide() {
        // SAFETY: as in `encode`.
        return unsafe { avx2::lower_bound(rel, range) };
    }
    lower_bound_impl(rel, range)
}

/// [`lower_bound`], inlined into its builds (the largest step per block is a max over
/// lanes: one instruction per 8 with AVX2, none for u32 in plain x86_64's SSE2).
#[inline(always)]
fn lower_bound_impl(rel: &[u32], range: u32) -> u64 {
    let w = escape_width(range) as u64;
    let blocks = rel.len().div_ceil(BLOCK);
    let mut bits = 0u64;
    for block in rel.chunks(BLOCK) {
        let n = (block.len() - 1) as u64;
        if n == 0 {
            continue;
        }
        let s = (block[block.len() - 1] - block[0]) as u64 - n;
        // Largest gap + 1 (a loop the compiler vectorizes).
        let max_step = block[1..]
            .iter()
            .zip(block)
            .fold(0u32, |m, (&b, &a)| m.max(b - a)) as u64;
        bits += block_bound(n, s, max_step - 1, w);
    }
    (blocks * DIR_ENTRY) as u64 + bits.div_ceil(8)
}

/// A lower bound on the bits of one block of `n` gaps summing to `s`, none larger than
/// `g_max` (any upper bound on the largest gap will do: a larger one only weakens the bound),
/// with escapes `w` bits wide: the smallest over `k` of the bounds in [`lower_bound`].
///
/// The bound from the sum holds for every gap `g` whose code word has at least
/// `(g + 1) / 2^k + k` bits: all that are not escaped, and the escaped ones too when
/// `ESC + w >= (g_max + 1) / 2^k + k` (a few escaped gaps, each below 32, at `k = 0` in a
/// half-dense chunk's holes).
#[inline(always)]
fn block_bound(n: u64, s: u64, g_max: u64, w: u64) -> u64 {
    let mut best = u64::MAX;
    for k in 0..=MAX_K as u64 {
        // No bound at this `k` or above is below `n` times the shortest code word there.
        if n * (1 + k).min(ESC as u64 + w) >= best {
            break;
        }
        let scale = 1u64 << k;
        let escapes_cost_more = (ESC as u64 + w) << k >= g_max.saturating_add(1 + k * scale);
        let bound = if g_max < (ESC as u64) << k || escapes_cost_more {
            s.saturating_sub(n * (scale - 1)).div_ceil(scale) + n * (1 + k)
        } else {
            n * (1 + k).min(ESC as u64 + w)
        };
        best = best.min(bound);
    }
    best
}

/// A lower bound on the size of [`holes_directory`]'s section (the gaps of the elements whose
/// bit is clear in `changed`, the bitmap section of the changed positions), from one pass over
/// the bitmap's words without listing the holes: each block's first and last hole come from
/// the words' hole counts, its largest gap is bounded by whether a run of 16 or 32 set bits
/// (changed elements) starts in one of its words, and the block is bounded as in
/// [`lower_bound`]. Tight on half-dense chunks, where a run that long is rare (the bound at
/// `k = 0`, exact without escapes, needs every gap below 16; at `k = 1` below 32), so the
/// chooser can skip the exact holes sizing when the bitmap is already smaller.
pub(crate) fn holes_lower_bound(changed: &[u8], range: u32) -> u64 {
    map_bounds(changed, range, true).1.unwrap_or(0)
}

/// Lower bounds on the sizes of the `gaps` section of the changed positions (the set bits of
/// `changed`, their bitmap section) and, with `holes`, of [`holes_directory`]'s section, from
/// one pass over the bitmap's words (as [`holes_lower_bound`], the gaps' largest gap bounded
/// by runs of 16 or 32 clear bits). The chooser builds the bitmap of a dense chunk first, so
/// its bounds need no pass over the positions themselves.
pub(crate) fn map_bounds(changed: &[u8], range: u32, holes: bool) -> (u64, Option<u64>) {
    if holes {
        let (g, h) = map_bounds_dispatch::<true>(changed, range);
        (g, Some(h))
    } else {
        (map_bounds_dispatch::<false>(changed, range).0, None)
    }
}

/// [`map_bounds`] in the best build this CPU runs (the holes' bound 0 without `HOLES`).
fn map_bounds_dispatch<const HOLES: bool>(changed: &[u8], range: u32) -> (u64, u64) {
    #[cfg(target_arch = "x86_64")]
    if super::bits::x86_avx512() {
        // SAFETY: `x86_avx512` detected all the function's features.
        return unsafe { avx2::map_bounds_avx512::<HOLES>(changed, range) };
    }
    #[cfg(target_arch = "x86_64")]
    if super::bits::x86_wide() {
        // SAFETY: as in `encode`.
        return unsafe { avx2::map_bounds::<HOLES>(changed, range) };
    }
    map_bounds_impl::<HOLES, false>(changed, range)
}

/// An upper bound on the largest run of set bits that starts in `word` (`next` is the word
/// after it, zero past the end), within the precision the bounds need: 15, 31, or `u64::MAX`.
#[inline(always)]
fn run_bound(word: u64, next: u64) -> u64 {
    // A run of 16 set bits within `word`: bit j survives when bits j..j+15 are all set.
    let mut r = word & word >> 1;
    r &= r >> 2;
    r &= r >> 4;
    r &= r >> 8;
    if r == 0 && word.leading_ones() + next.trailing_ones() < 16 {
        return 15;
    }
    // Rare on a half-dense chunk: the same test for 32 over both words.
    let x = (next as u128) << 64 | word as u128;
    let mut r = x & x >> 1;
    r &= r >> 2;
    r &= r >> 4;
    r &= r >> 8;
    r &= r >> 16;
    if r as u64 == 0 {
        31
    } else {
        u64::MAX
    }
}

/// The open block of [`map_bounds_impl`] for one kind of listed element (changed or hole).
#[derive(Default)]
struct OpenBlock {
    /// Elements listed in the open block so far, its first, and the bound on its largest gap.
    count: u64,
    first: u64,
    g_max: u64,
    /// Bits of the closed blocks, and how many there are.
    bits: u64,
    full_blocks: u64,
}

impl OpenBlock {
    /// Word `i`, whose listed elements are the set bits of `listed`; every gap that starts in
    /// it is at most `runs`.
    #[inline(always)]
    fn word(&mut self, i: usize, mut listed: u64, runs: u64, w: u64) {
        let mut here = listed.count_ones() as u64;
        if self.count > 0 && self.count + here < BLOCK as u64 {
            // The common word: the open block goes on.
            self.count += here;
            self.g_max = self.g_max.max(runs);
            return;
        }
        if here == 0 {
            return;
        }
        if self.count == 0 {
            self.first = i as u64 * 64 + listed.trailing_zeros() as u64;
            self.g_max = 0;
        }
        self.g_max = self.g_max.max(runs);
        while self.count + here >= BLOCK as u64 {
            // The block's last element is the `take`-th of this word's remaining ones.
            let take = BLOCK as u64 - self.count;
            for _ in 1..take {
                listed &= listed - 1;
            }
            let at = i as u64 * 64 + listed.trailing_zeros() as u64;
            listed &= listed - 1;
            let n = BLOCK as u64 - 1;
            self.bits += block_bound(n, at - self.first - n, self.g_max, w);
            self.full_blocks += 1;
            here -= take;
            self.count = 0;
            if here > 0 {
                self.first = i as u64 * 64 + listed.trailing_zeros() as u64;
                self.g_max = runs;
            }
        }
        self.count += here;
    }

    /// Eight quiet words from word `i` (every run bound 15) whose `here` listed elements
    /// (the set bits of each word xor `flip`) end the open block: as [`OpenBlock::word`] on
    /// each of them, with the block's last element and the next block's first found by
    /// [`select_octet`] (no branch on where the block ends, no bit-by-bit walk).
    ///
    /// # Safety
    ///
    /// The CPU must have BMI2 and POPCNT.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "bmi2,popcnt")]
    #[inline]
    unsafe fn quiet_octet_end(
        &mut self,
        i: usize,
        words: &[[u8; 8]],
        flip: u64,
        here: u64,
        w: u64,
    ) {
        // The block is open and `here <= 512 < BLOCK`: exactly one block ends in the octet.
        debug_assert!(self.count > 0 && self.count + here >= BLOCK as u64 && here <= 512);
        let take = BLOCK as u64 - self.count;
        // SAFETY: the caller guarantees the features; `take + 1 <= here + 1` as required.
        let (last, next) = unsafe { select_octet(words, flip, take) };
        let base = i as u64 * 64;
        let n = BLOCK as u64 - 1;
        let g_max = self.g_max.max(15);
        self.bits += block_bound(n, base + last - self.first - n, g_max, w);
        self.full_blocks += 1;
        self.count = here - take;
        if self.count > 0 {
            self.first = base + next;
            self.g_max = 15;
        }
    }

    /// The section's bound, `last` giving the last listed element (when the open block has
    /// more than one).
    #[inline(always)]
    fn finish(mut self, last: impl FnOnce() -> Option<u64>, w: u64) -> u64 {
        if self.count > 1 {
            let last = last().unwrap_or(self.first);
            let n = self.count - 1;
            self.bits += block_bound(n, last - self.first - n, self.g_max, w);
        }
        let blocks = self.full_blocks + (self.count > 0) as u64;
        blocks * DIR_ENTRY as u64 + self.bits.div_ceil(8)
    }
}

/// The bit indices in `words` (eight, little-endian, bit `64 j + b` for bit `b` of word `j`)
/// of the `r`-th and the `r + 1`-th listed bit (the set bits of each word xor `flip`),
/// counted from 1; the second is garbage when there are only `r`. Branch free: the words'
/// counts pick the word of each, a bit deposit the bit.
///
/// # Safety
///
/// The CPU must have BMI2 and POPCNT; `words` has eight words, and at least `r >= 1`
/// listed bits.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "bmi2,popcnt")]
#[inline]
unsafe fn select_octet(words: &[[u8; 8]], flip: u64, r: u64) -> (u64, u64) {
    use std::arch::x86_64::_pdep_u64;
    debug_assert!(words.len() == 8 && r >= 1);
    let words: [u64; 8] = std::array::from_fn(|j| u64::from_le_bytes(words[j]) ^ flip);
    // For each rank: its word (the words whose listed bits all come before it), and the
    // listed bits before that word.
    let (mut seen, mut j, mut before, mut j_next, mut before_next) = (0u64, 0, 0u64, 0, 0u64);
    for &word in &words {
        let c = word.count_ones() as u64;
        let past = ((seen + c) < r) as u64;
        let past_next = ((seen + c) <= r) as u64;
        j += past as usize;
        before += c & past.wrapping_neg();
        j_next += past_next as usize;
        before_next += c & past_next.wrapping_neg();
        seen += c;
    }
    let pick = |j: usize, rank: u64| {
        let word = words[j % 8];
        let bit = _pdep_u64(1u64.wrapping_shl((rank - 1) as u32), word);
        (j % 8) as u64 * 64 + bit.trailing_zeros() as u64
    };
    (pick(j, r - before), pick(j_next, r + 1 - before_next))
}

/// Of nine whole bitmap words: the set bits of the first eight, and whether
/// [`run_bound`] is 15 for each of them in both polarities (no run of 16 set bits, nor with
/// `HOLES` of 16 clear bits, within a word or across into the next: runs across are tested
/// within the 64 bits from bit 48 of a word, a sufficient test).
///
/// # Safety
///
/// The CPU must have AVX-512F and AVX-512 VPOPCNTDQ; `words` has at least nine words.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512vpopcntdq")]
#[inline]
unsafe fn octet_stats<const HOLES: bool>(words: &[[u8; 8]]) -> (u64, bool) {
    use std::arch::x86_64::*;
    debug_assert!(words.len() >= 9);
    // SAFETY: two 64-byte unaligned loads of words 0..8 and 1..9, all in `words`.
    let (w, n) = unsafe {
        (
            _mm512_loadu_si512(words.as_ptr().cast()),
            _mm512_loadu_si512(words[1..].as_ptr().cast()),
        )
    };
    let set = _mm512_reduce_add_epi64(_mm512_popcnt_epi64(w)) as u64;
    // Bit j survives when bits j..j+15 are all set.
    let run16 = |v: __m512i| {
        let r = _mm512_and_si512(v, _mm512_srli_epi64::<1>(v));
        let r = _mm512_and_si512(r, _mm512_srli_epi64::<2>(r));
        let r = _mm512_and_si512(r, _mm512_srli_epi64::<4>(r));
        _mm512_and_si512(r, _mm512_srli_epi64::<8>(r))
    };
    // Bits 48..63 of each word, then bits 0..47 of the next.
    let across = _mm512_or_si512(_mm512_srli_epi64::<48>(w), _mm512_slli_epi64::<16>(n));
    let ones = _mm512_set1_epi64(-1);
    // The changed positions' gaps are runs of clear bits.
    let mut runs = _mm512_or_si512(
        run16(_mm512_xor_si512(w, ones)),
        run16(_mm512_xor_si512(across, ones)),
    );
    if HOLES {
        runs = _mm512_or_si512(runs, _mm512_or_si512(run16(w), run16(across)));
    }
    (set, _mm512_test_epi64_mask(runs, runs) == 0)
}

/// [`map_bounds`]: the gaps bound, and the holes bound when `HOLES` (else 0).
#[inline(always)]
fn map_bounds_impl<const HOLES: bool, const VECTOR: bool>(
    changed: &[u8],
    range: u32,
) -> (u64, u64) {
    debug_assert_eq!(changed.len(), range.div_ceil(8) as usize);
    let w = escape_width(range) as u64;
    // The words, the last one padded with zeros, then a zero word to read past the end.
    let (full, tail) = changed.as_chunks::<8>();
    let mut padded = [0u8; 8];
    padded[..tail.len()].copy_from_slice(tail);
    let tail_word = u64::from_le_bytes(padded);
    let words = changed.len().div_ceil(8);
    let word_at = |i: usize| match full.get(i) {
        Some(bytes) => u64::from_le_bytes(*bytes),
        None if i == full.len() => tail_word,
        None => 0,
    };
    // Bits at or past the range are not holes (the bitmap keeps them clear): only the last
    // word has such bits.
    let last_valid = if range.is_multiple_of(64) {
        !0
    } else {
        mask(range % 64)
    };
    let holes_at = |i: usize| {
        if i + 1 < words {
            !word_at(i)
        } else if i + 1 == words {
            !word_at(i) & last_valid
        } else {
            0
        }
    };
    let (mut gaps, mut holes) = (OpenBlock::default(), OpenBlock::default());
    let mut i = 0;
    while i < words {
        // Eight words at once where no block ends among them and no run of 16 starts in
        // them (every block goes on, each word's run bound is 15): nearly all words of a
        // half-dense chunk. Else eight (or the last) words one by one.
        #[cfg(target_arch = "x86_64")]
        if VECTOR && i + 9 < words && gaps.count > 0 && (!HOLES || holes.count > 0) {
            // SAFETY: the caller's build has the features of `octet_stats`, and words
            // `i..i + 9` are all whole (`i + 9 < words`).
            let (set, quiet) = unsafe { octet_stats::<HOLES>(&full[i..i + 9]) };
            if quiet {
                // Each kind's block goes on over the eight words, or ends among them: then
                // its words one by one, their run bounds known.
                if gaps.count + set < BLOCK as u64 {
                    gaps.count += set;
                    gaps.g_max = gaps.g_max.max(15);
                } else {
                    // SAFETY: the caller's build has BMI2 and POPCNT (`octet_stats` above
                    // needs a build with them too).
                    unsafe { gaps.quiet_octet_end(i, &full[i..i + 8], 0, set, w) };
                }
                if HOLES {
                    if holes.count + (512 - set) < BLOCK as u64 {
                        holes.count += 512 - set;
                        holes.g_max = holes.g_max.max(15);
                    } else {
                        // SAFETY: as above.
                        unsafe { holes.quiet_octet_end(i, &full[i..i + 8], !0, 512 - set, w) };
                    }
                }
                i += 8;
                continue;
            }
        }
        for i in i..(i + 8).min(words) {
            let (word, next) = (word_at(i), word_at(i + 1));
            let (hole, next_holes) = (holes_at(i), holes_at(i + 1));
            // Every gap of a block that starts in this word is a run that starts in it: of
            // holes between changed positions, of changed positions between holes (past the
            // last word none goes on).
            gaps.word(i, word, run_bound(hole, next_holes), w);
            if HOLES {
                holes.word(i, hole, run_bound(word, next), w);
            }
        }
        i += 8;
    }
    let last_in = |at: &dyn Fn(usize) -> u64| {
        (0..words).rev().find_map(|i| {
            let bits = at(i);
            (bits != 0).then(|| i as u64 * 64 + 63 - bits.leading_zeros() as u64)
        })
    };
    let gaps = gaps.finish(|| last_in(&word_at), w);
    let holes = if HOLES {
        holes.finish(|| last_in(&holes_at), w)
    } else {
        0
    };
    (gaps, holes)
}

pub fn encode(rel: &[u32], range: u32, out: &mut Vec<u8>) {
    #[cfg(target_arch = "x86_64")]
    if super::bits::x86_wide() {
        // SAFETY: the function's only requirement is its target features, all of which
        // `x86_wide` detected just above on this CPU.
        return unsafe { avx2::encode(rel, range, out) };
    }
    encode_impl::<false>(rel, range, out)
}

/// The encoder's entry points compiled for AVX2, where the passes over a block's gaps (the
/// gaps themselves, the length histogram, the exact sizes) run 8 lanes wide: same results.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
    pub(super) fn encode(rel: &[u32], range: u32, out: &mut Vec<u8>) {
        super::encode_impl::<true>(rel, range, out)
    }

    #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
    pub(super) fn directory(rel: &[u32], range: u32) -> (Vec<u8>, u64) {
        super::directory_impl::<true>(rel, range)
    }

    #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
    pub(super) fn lower_bound(rel: &[u32], range: u32) -> u64 {
        super::lower_bound_impl(rel, range)
    }

    #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
    pub(super) fn map_bounds<const HOLES: bool>(changed: &[u8], range: u32) -> (u64, u64) {
        super::map_bounds_impl::<HOLES, false>(changed, range)
    }

    /// [`super::map_bounds_impl`] with eight words at a time by [`super::octet_stats`].
    #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,avx512f,avx512vpopcntdq")]
    pub(super) fn map_bounds_avx512<const HOLES: bool>(changed: &[u8], range: u32) -> (u64, u64) {
        super::map_bounds_impl::<HOLES, true>(changed, range)
    }

    #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
    pub(super) fn holes_directory(changed: &[u8], range: u32) -> (Vec<u8>, u64) {
        super::holes_directory_impl::<true>(changed, range)
    }
}

#[inline(always)]
fn encode_impl<const VECTOR: bool>(rel: &[u32], range: u32, out: &mut Vec<u8>) {
    if rel.is_empty() {
        return;
    }
    // One pass: size each block, then write it (as `directory` then `encode_with`, without
    // computing the gaps twice).
    let w = escape_width(range);
    let blocks = rel.len().div_ceil(BLOCK);
    let dir_start = out.len();
    out.resize(dir_start + blocks * DIR_ENTRY, 0);
    let mut dir = Vec::with_capacity(blocks * DIR_ENTRY);
    let mut gaps = [0u32; BLOCK];
    let mut table = None;
    // The lane writer needs the AVX2 build's features: checked once here, so that calling
    // the vector build (as tests do) on a CPU without them stays sound.
    #[cfg(target_arch = "x86_64")]
    let (use_lanes, mut lanes) = (VECTOR && super::bits::x86_wide(), Lanes::new());
    let mut writer = BitWriter::new(out);
    let mut total_bits = 0u64;
    for block in rel.chunks(BLOCK) {
        let gaps = block_gaps(block, &mut gaps);
        let (k, bits) = best_k::<VECTOR>(gaps, w);
        dir.extend_from_slice(&block[0].to_le_bytes());
        dir.extend_from_slice(&(bits as u16).to_le_bytes());
        dir.push(k as u8);
        total_bits += bits as u64;
        #[cfg(target_arch = "x86_64")]
        if use_lanes && k <= LANES_K {
            // SAFETY: `use_lanes` says that `x86_wide` detected the features it needs.
            writer.block(bits as u64, |out| unsafe {
                write_lanes(out, &mut lanes, gaps, k, w)
            });
            continue;
        }
        writer.block(bits as u64, |out| write_block(out, &mut table, gaps, k, w));
    }
    debug_assert_eq!(writer.bits_since(dir_start + dir.len()), total_bits);
    writer.finish();
    out[dir_start..dir_start + dir.len()].copy_from_slice(&dir);
}

/// The directory of the section that codes `rel` (each block's first position, exact bit
/// count and best `k`) and the section's exact size in bytes: everything but the bit stream,
/// so the chooser can size the section without writing it ([`encode_with`] writes it).
pub(crate) fn directory(rel: &[u32], range: u32) -> (Vec<u8>, u64) {
    #[cfg(target_arch = "x86_64")]
    if super::bits::x86_wide() {
        // SAFETY: as in `encode`.
        return unsafe { avx2::directory(rel, range) };
    }
    directory_impl::<false>(rel, range)
}

#[inline(always)]
fn directory_impl<const VECTOR: bool>(rel: &[u32], range: u32) -> (Vec<u8>, u64) {
    let w = escape_width(range);
    let mut dir = Vec::with_capacity(rel.len().div_ceil(BLOCK) * DIR_ENTRY);
    let mut gaps = [0u32; BLOCK];
    let mut total_bits = 0u64;
    for block in rel.chunks(BLOCK) {
        let (k, bits) = best_k::<VECTOR>(block_gaps(block, &mut gaps), w);
        dir.extend_from_slice(&block[0].to_le_bytes());
        dir.extend_from_slice(&(bits as u16).to_le_bytes());
        dir.push(k as u8);
        total_bits += bits as u64;
    }
    let len = dir.len() as u64 + total_bits.div_ceil(8);
    (dir, len)
}

/// [`directory`] of the elements of `0..range` whose bit is clear in `changed` (the bitmap
/// section of the changed positions, read a 64-bit word at a time), without listing them all: the
/// holes of one block at a time are read out of the words ([`set_bits`]: no branch per element
/// on the unpredictable runs of a dense chunk) into a buffer and sized exactly as
/// [`directory`] sizes listed positions, so the result is the same by construction.
pub(crate) fn holes_directory(changed: &[u8], range: u32) -> (Vec<u8>, u64) {
    #[cfg(target_arch = "x86_64")]
    if super::bits::x86_wide() {
        // SAFETY: as in `encode`.
        return unsafe { avx2::holes_directory(changed, range) };
    }
    holes_directory_impl::<false>(changed, range)
}

#[inline(always)]
fn holes_directory_impl<const VECTOR: bool>(changed: &[u8], range: u32) -> (Vec<u8>, u64) {
    debug_assert_eq!(changed.len(), range.div_ceil(8) as usize);
    let w = escape_width(range);
    let mut dir = Vec::new();
    let mut total_bits = 0u64;
    // Holes read so far and not yet sized: up to a block, plus the rest of the word that
    // completed it, plus what `set_bits` may write past its last.
    let mut block = [0u32; BLOCK + 64 + SET_BITS_SLACK];
    let mut gaps = [0u32; BLOCK];
    let mut n = 0;
    // A function, not a closure: inlined, so that it is compiled with the target features of
    // the caller's build (the closure this was, called twice, was not inlined, and so got
    // none of them).
    #[inline(always)]
    fn close<const VECTOR: bool>(
        block: &[u32],
        gaps: &mut [u32; BLOCK],
        w: u32,
        dir: &mut Vec<u8>,
        total_bits: &mut u64,
    ) {
        let (k, bits) = best_k::<VECTOR>(block_gaps(block, gaps), w);
        dir.extend_from_slice(&block[0].to_le_bytes());
        dir.extend_from_slice(&(bits as u16).to_le_bytes());
        dir.push(k as u8);
        *total_bits += bits as u64;
    }
    for (i, bytes) in changed.chunks(8).enumerate() {
        let mut padded = [0u8; 8];
        padded[..bytes.len()].copy_from_slice(bytes);
        let word = u64::from_le_bytes(padded);
        let base = i as u32 * 64;
        // Bits at or past the range are not holes.
        let valid = if range - base >= 64 {
            !0
        } else {
            mask(range - base)
        };
        n = set_bits(!word & valid, base, &mut block, n);
        if n >= BLOCK {
            close::<VECTOR>(&block[..BLOCK], &mut gaps, w, &mut dir, &mut total_bits);
            block.copy_within(BLOCK..n, 0);
            n -= BLOCK;
        }
    }
    if n > 0 {
        close::<VECTOR>(&block[..n], &mut gaps, w, &mut dir, &mut total_bits);
    }
    let len = dir.len() as u64 + total_bits.div_ceil(8);
    (dir, len)
}

/// Appends the section that codes `rel` with directory `dir` from [`directory`]: the same
/// bytes as [`encode`].
pub(crate) fn encode_with(rel: &[u32], range: u32, dir: &[u8], out: &mut Vec<u8>) {
    debug_assert_eq!(dir.len(), rel.len().div_ceil(BLOCK) * DIR_ENTRY);
    let w = escape_width(range);
    out.extend_from_slice(dir);
    let mut gaps = [0u32; BLOCK];
    let mut table = None;
    let mut writer = BitWriter::new(out);
    for (block, entry) in rel.chunks(BLOCK).zip(dir.chunks_exact(DIR_ENTRY)) {
        let (_, bits, k) = read_entry(entry);
        let gaps = block_gaps(block, &mut gaps);
        writer.block(bits as u64, |out| write_block(out, &mut table, gaps, k, w));
    }
    writer.finish();
}

/// The gaps of `block` (its positions after the first, minus one) into `gaps`.
#[inline(always)]
fn block_gaps<'g>(block: &[u32], gaps: &'g mut [u32; BLOCK]) -> &'g [u32] {
    let gaps = &mut gaps[..block.len() - 1];
    for ((g, &a), &b) in gaps.iter_mut().zip(block).zip(&block[1..]) {
        *g = b - a - 1;
    }
    gaps
}

/// Writes one block's code words with parameter `k`. Dense blocks go through the table of
/// small gaps' code words (`table` keeps a copy for the last `k`: the loop measured ~3%
/// faster reading a local table); otherwise a plain code word is at most ESC + k bits, so up
/// to 56 / (ESC + k) of them share one store.
#[inline(always)]
fn write_block(
    out: &mut BlockWriter<'_>,
    table: &mut Option<(u32, SmallGaps)>,
    gaps: &[u32],
    k: u32,
    w: u32,
) {
    match k {
        0..=TABLE_K => {
            if table.as_ref().is_none_or(|&(table_k, _)| table_k != k) {
                *table = Some((k, SmallGaps::get(k).clone()));
            }
            let (_, table) = table.as_ref().unwrap();
            write_small(out, table, gaps, k, w)
        }
        _ if k <= 12 => write_gaps::<2>(out, gaps, k, w),
        _ => write_gaps::<1>(out, gaps, k, w),
    }
}

/// Largest `k` of [`write_lanes`]: a plain code word then has at most `ESC + k = 32` bits.
#[cfg(target_arch = "x86_64")]
const LANES_K: u32 = 32 - ESC;

// The lane writer's scratch holds a whole block.
#[cfg(target_arch = "x86_64")]
const _: () = assert!(BLOCK <= super::bits::LANES_MAX);

/// [`write_block`] for `k <= LANES_K` in the AVX2 build: every gap's code word and length in
/// one branch-free loop the compiler vectorizes, then written eight per store where they fit
/// ([`put_words`]); escapes (rare) are marked for the general path. Same bits as
/// [`write_block`].
///
/// # Safety
///
/// The CPU must have the features of [`super::bits::x86_wide`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
#[inline]
unsafe fn write_lanes(out: &mut BlockWriter<'_>, lanes: &mut Lanes, gaps: &[u32], k: u32, w: u32) {
    debug_assert!(k <= LANES_K && gaps.len() <= BLOCK);
    let m = gaps.len().min(BLOCK);
    let Lanes { word, len } = lanes;
    let mk = mask(k) as u32;
    for ((word, len), &g) in word[..m].iter_mut().zip(&mut len[..m]).zip(&gaps[..m]) {
        let q = g >> k;
        // All ones for an escape (a length of 64 marks it for the general path).
        let escape = ((q >= ESC) as u32).wrapping_neg();
        let q = q.min(ESC - 1);
        *word = (((g & mk) << 1 | 1) << q) & !escape;
        *len = (q + 1 + k) & !escape | 64 & escape;
    }
    put_words(out, &word[..m], &len[..m], |out, i| {
        // ESC zeros, then the gap in w bits.
        out.put((gaps[i] as u64) << ESC, ESC + w)
    });
}

/// The Rice code word of `g` (`g >> k < ESC`) and its length: `q` zeros, a one, then the
/// `k` low bits.
#[inline(always)]
fn rice_word(g: u32, k: u32) -> (u64, u32) {
    let q = g >> k;
    ((1 | ((g as u64 & mask(k)) << 1)) << q, q + 1 + k)
}

/// Largest `k` written through [`SmallGaps`]: it holds every gap below `ESC << k`.
const TABLE_K: u32 = 6;

/// Gaps below this are written through [`SmallGaps`].
const SMALL: u32 = ESC << TABLE_K;

/// The Rice code words of the gaps below [`SMALL`] for one `k <= TABLE_K`: looking a code
/// word up costs less than computing it. Built once per process and `k`.
#[derive(Clone)]
struct SmallGaps {
    word: [u32; SMALL as usize],
    /// Length of the code word; [`ESCAPED`] for an escaped gap.
    len: [u8; SMALL as usize],
}

/// [`SmallGaps`] length of an escaped gap: more than any four code words it holds (each at
/// most ESC + TABLE_K bits) may sum to while passing the store's check.
const ESCAPED: u8 = 64;

impl SmallGaps {
    fn new(k: u32) -> Self {
        let mut table = SmallGaps {
            word: [0; SMALL as usize],
            len: [ESCAPED; SMALL as usize],
        };
        // Gaps from ESC << k on are escapes: only the entries below are code words.
        for g in 0..ESC << k {
            let (word, len) = rice_word(g, k);
            (table.word[g as usize], table.len[g as usize]) = (word as u32, len as u8);
        }
        table
    }

    fn get(k: u32) -> &'static SmallGaps {
        static TABLES: [OnceLock<Box<SmallGaps>>; TABLE_K as usize + 1] =
            [const { OnceLock::new() }; TABLE_K as usize + 1];
        TABLES[k as usize].get_or_init(|| Box::new(SmallGaps::new(k)))
    }
}

/// Writes the code words of `gaps` (`k <= TABLE_K`) four per store when they are small and
/// fit one 56-bit store together (on dense blocks nearly always), else one by one.
#[inline(always)]
fn write_small(out: &mut BlockWriter<'_>, table: &SmallGaps, gaps: &[u32], k: u32, w: u32) {
    let mut quads = gaps.chunks_exact(4);
    for quad in &mut quads {
        let i = [quad[0], quad[1], quad[2], quad[3]].map(|g| (g % SMALL) as usize);
        let len = i.map(|i| table.len[i] as u32);
        let total = len[0] + len[1] + len[2] + len[3];
        if (quad[0] | quad[1] | quad[2] | quad[3]) < SMALL && total <= 56 {
            let word = table.word[i[0]] as u64
                | (table.word[i[1]] as u64) << len[0]
                | (table.word[i[2]] as u64) << (len[0] + len[1])
                | (table.word[i[3]] as u64) << (len[0] + len[1] + len[2]);
            out.put(word, total);
        } else {
            write_gaps::<1>(out, quad, k, w);
        }
    }
    write_gaps::<1>(out, quads.remainder(), k, w);
}

/// Writes the code words of `gaps`, `N` per store (`N · (ESC + k) <= 56`); a group with an
/// escape (rare: the best `k` makes quotients of 16 or more unlikely) is written one by one.
#[inline(always)]
fn write_gaps<const N: usize>(out: &mut BlockWriter<'_>, gaps: &[u32], k: u32, w: u32) {
    debug_assert!(N as u32 * (ESC + k) <= 56);
    let single = |out: &mut BlockWriter<'_>, g: u32| {
        if g >> k < ESC {
            let (word, len) = rice_word(g, k);
            out.put(word, len);
        } else {
            // ESC zeros, then the gap in w bits.
            out.put((g as u64) << ESC, ESC + w);
        }
    };
    let mut groups = gaps.chunks_exact(N);
    for group in &mut groups {
        // No quotient reaches ESC exactly when their OR does not.
        if group.iter().fold(0, |a, &g| a | g) >> k < ESC {
            let (mut word, mut len) = (0u64, 0u32);
            for &g in group {
                let (w, l) = rice_word(g, k);
                word |= w << len;
                len += l;
            }
            out.put(word, len);
        } else {
            for &g in group {
                single(out, g);
            }
        }
    }
    for &g in groups.remainder() {
        single(out, g);
    }
}

pub fn decode(input: &[u8], count: u32, range: u32, out: &mut Vec<u32>) -> Result<(), CodecError> {
    decode_impl::<true, true>(input, count, range, out)
}

/// [`decode`]; `DISPATCH`: in the BMI build where the CPU has its features, else portable;
/// `PAIRS`: two blocks at a time where they allow it (else one by one: the tests' second
/// decoder).
#[inline(always)]
fn decode_impl<const DISPATCH: bool, const PAIRS: bool>(
    input: &[u8],
    count: u32,
    range: u32,
    out: &mut Vec<u32>,
) -> Result<(), CodecError> {
    out.clear();
    let n = count as usize;
    if n == 0 {
        if !input.is_empty() {
            return Err(CodecError::TrailingBytes {
                count: 0,
                extra: input.len() as u64,
            });
        }
        return Ok(());
    }
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
    for entry in dir.chunks_exact(DIR_ENTRY) {
        let (_, bits, k) = read_entry(entry);
        if k > MAX_K {
            return Err(CodecError::Malformed {
                codec: "gaps",
                reason: format!("Rice parameter {k} above {MAX_K}"),
            });
        }
        total_bits += bits as u64;
    }
    check_stream_len("gaps", stream, total_bits, dir_len, count as u64)?;

    let w = escape_width(range);
    out.resize(n, 0);
    #[cfg(target_arch = "x86_64")]
    if DISPATCH && super::bits::x86_wide() {
        // SAFETY: the function's only requirement is its target features, all of which
        // `x86_wide` detected just above on this CPU.
        return unsafe { decode_blocks_bmi(dir, stream, range, w, out) };
    }
    decode_blocks::<false, PAIRS>(dir, stream, range, w, out)
}

/// [`decode_blocks`] compiled with BMI1/2 and LZCNT (shifts by a register without the `cl`
/// shuffle, one-instruction bit counts). Same results.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
fn decode_blocks_bmi(
    dir: &[u8],
    stream: &[u8],
    range: u32,
    w: u32,
    out: &mut [u32],
) -> Result<(), CodecError> {
    decode_blocks::<true, true>(dir, stream, range, w, out)
}

/// Decodes every block of a section whose directory and stream lengths were checked into
/// `out` (one slot per position), validating the rest: first positions in range and
/// increasing, each block's code words ending where its bit count says, positions in range.
#[inline(always)]
fn decode_blocks<const BMI: bool, const PAIRS: bool>(
    dir: &[u8],
    stream: &[u8],
    range: u32,
    w: u32,
    out: &mut [u32],
) -> Result<(), CodecError> {
    let reader = BitReader::new(stream);
    let blocks = dir.len() / DIR_ENTRY;
    // Checks in the order of a block-by-block decode: the header before the code words, the
    // code words' end and the last position after them.
    let head = |b: usize, first: u32, previous: Option<u64>| {
        if first >= range {
            return Err(CodecError::PositionOutOfRange {
                position: first as u64,
                range: range as u64,
            });
        }
        if previous.is_some_and(|p| first as u64 <= p) {
            return Err(CodecError::NotSorted {
                index: (b * BLOCK) as u64,
            });
        }
        Ok(())
    };
    let tail = |b: usize, (at, p): (usize, u64), end: usize| {
        if at != end {
            return Err(CodecError::Malformed {
                codec: "gaps",
                reason: format!(
                    "block {b} code words end at bit {at}, its directory entry says {end}"
                ),
            });
        }
        if p >= range as u64 {
            return Err(CodecError::PositionOutOfRange {
                position: p,
                range: range as u64,
            });
        }
        Ok(p)
    };
    let entry = |b: usize| read_entry(&dir[b * DIR_ENTRY..(b + 1) * DIR_ENTRY]);
    let mut pos = 0usize;
    let mut previous: Option<u64> = None;
    let mut b = 0;
    while b < blocks {
        let (first, bits, k) = entry(b);
        head(b, first, previous)?;
        let end = pos + bits as usize;
        let params = GapParams::new(k, w);
        if PAIRS && b + 1 < blocks {
            let (first_b, bits_b, k_b) = entry(b + 1);
            if let (true, Some(dst)) = (
                k_b == k,
                out.get_mut(b * BLOCK..(b + 2) * BLOCK)
                    .and_then(|d| <&mut [u32; 2 * BLOCK]>::try_from(d).ok()),
            ) {
                // The second block starts where its directory entry puts it, which is where
                // the first must end; its header is checked once the first has passed.
                let (ra, rb) = two_blocks::<BMI>(reader, (pos, first), (end, first_b), params, dst);
                let p = tail(b, ra, end)?;
                head(b + 1, first_b, Some(p))?;
                let end_b = end + bits_b as usize;
                previous = Some(tail(b + 1, rb, end_b)?);
                pos = end_b;
                b += 2;
                continue;
            }
        }
        let n = out.len();
        let dst = &mut out[b * BLOCK..((b + 1) * BLOCK).min(n)];
        let r = decode_block::<BMI>(reader, pos, first, params, dst);
        previous = Some(tail(b, r, end)?);
        pos = end;
        b += 1;
    }
    Ok(())
}

/// The decoding of one block's gaps in progress.
///
/// The next bits are cached in `buf`, refilled by one load when fewer than a plain code word
/// (15 zeros, a one and k bits) or an escape's zeros may need are left: `at` (the stream
/// position of `buf`'s lowest bit) is checked against a limit set at the load, so a code word
/// costs one count, a shift and one add on top of its fields. An escape (rare) reads its w
/// bits with a load of its own.
struct GapCursor {
    buf: u64,
    at: usize,
    /// Past this position, fewer than `ESC + k` bits of `buf` are the stream's.
    limit: usize,
    /// The last position decoded (u64: positions only grow and cannot overflow it here).
    p: u64,
}

/// A block's Rice parameter and what follows from it.
#[derive(Clone, Copy)]
struct GapParams {
    k: u32,
    k1: u32,
    mk: u64,
    w: u32,
}

impl GapParams {
    fn new(k: u32, w: u32) -> Self {
        GapParams {
            k,
            k1: k + 1,
            mk: mask(k),
            w,
        }
    }
}

impl GapCursor {
    #[inline(always)]
    fn new(reader: BitReader<'_>, at: usize, first: u32, params: GapParams) -> Self {
        let mut cursor = GapCursor {
            buf: 0,
            at,
            limit: 0,
            p: first as u64,
        };
        cursor.load(reader, params);
        cursor
    }

    /// Reloads `buf` from `at` (at least 57 of its bits are the stream's).
    #[inline(always)]
    fn load(&mut self, reader: BitReader<'_>, params: GapParams) {
        self.buf = reader.peek(self.at);
        self.limit = self.at + (64 - (self.at & 7)) - (ESC + params.k) as usize;
    }

    /// Decodes the next gap and returns the next position (truncated to u32: the caller
    /// checks the block's last one, `p`, against the range).
    #[inline(always)]
    fn next<const BMI: bool>(&mut self, reader: BitReader<'_>, params: GapParams) -> u32 {
        if self.at > self.limit {
            self.load(reader, params);
        }
        self.word::<BMI>(reader, params)
    }

    /// [`Self::next`] without the refill check: `buf` must hold at least `ESC + k` more
    /// bits of the stream.
    #[inline(always)]
    fn word<const BMI: bool>(&mut self, reader: BitReader<'_>, params: GapParams) -> u32 {
        let z = self.buf.trailing_zeros();
        let g = if z < ESC {
            // `k1` and `buf >> 1` are ready before the count: one add, then the shift, on
            // the chain from one code word to the next.
            let len = z + params.k1;
            let rest = (self.buf >> 1) >> z;
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `BMI` is set only in the BMI build, which runs only where `x86_wide`
            // detected its features. (One instruction, and no mask register held.)
            let low = if BMI {
                unsafe { std::arch::x86_64::_bzhi_u64(rest, params.k) }
            } else {
                rest & params.mk
            };
            #[cfg(not(target_arch = "x86_64"))]
            let low = rest & params.mk;
            let g = ((z as u64) << params.k) | low;
            self.buf >>= len;
            self.at += len as usize;
            g
        } else {
            // ESC zeros, then the gap in w bits.
            self.at += ESC as usize;
            let g = reader.peek(self.at) & mask(params.w);
            self.at += params.w as usize;
            self.load(reader, params);
            g
        };
        self.p += g + 1;
        self.p as u32
    }
}

/// Decodes the positions of one block (`dst`: its slots, `first` the first position) from
/// bit `pos` on; returns the bit after its code words and the last position (which may be
/// out of range: the caller checks it).
#[inline(always)]
fn decode_block<const BMI: bool>(
    reader: BitReader<'_>,
    pos: usize,
    first: u32,
    params: GapParams,
    dst: &mut [u32],
) -> (usize, u64) {
    let mut cursor = GapCursor::new(reader, pos, first, params);
    dst[0] = first;
    for slot in &mut dst[1..] {
        *slot = cursor.next::<BMI>(reader, params);
    }
    (cursor.at, cursor.p)
}

/// [`decode_block`] of two whole blocks with the same parameters at once, the second from
/// bit `pos_b` on: their chains from one code word to the next are independent, so the CPU
/// overlaps them. Returns each block's `(end bit, last position)`.
/// [`decode_two_blocks`], or where `N` code words always fit the bits of one load,
/// [`decode_two_blocks_grouped`].
#[inline(always)]
fn two_blocks<const BMI: bool>(
    reader: BitReader<'_>,
    a: (usize, u32),
    b: (usize, u32),
    params: GapParams,
    dst: &mut [u32; 2 * BLOCK],
) -> ((usize, u64), (usize, u64)) {
    match params.k {
        0..=3 => decode_two_blocks_grouped::<BMI, 3>(reader, a, b, params, dst),
        4..=12 => decode_two_blocks_grouped::<BMI, 2>(reader, a, b, params, dst),
        _ => decode_two_blocks::<BMI>(reader, a, b, params, dst),
    }
}

/// [`decode_two_blocks`] for `N (ESC + k) <= 57`: a plain code word has at most `ESC + k`
/// bits and a load at least 57, so `N` of them always fit one load; each cursor is loaded
/// every `N` code words (and after an escape) with no check of the bits left, so its loop
/// carries only the bits, the position and the last position (fewer registers, no branch).
#[inline(always)]
fn decode_two_blocks_grouped<const BMI: bool, const N: usize>(
    reader: BitReader<'_>,
    (pos_a, first_a): (usize, u32),
    (pos_b, first_b): (usize, u32),
    params: GapParams,
    dst: &mut [u32; 2 * BLOCK],
) -> ((usize, u64), (usize, u64)) {
    debug_assert!(N as u32 * (ESC + params.k) <= 57);
    let mut a = GapCursor::new(reader, pos_a, first_a, params);
    let mut b = GapCursor::new(reader, pos_b, first_b, params);
    let (da, db) = dst.split_at_mut(BLOCK);
    da[0] = first_a;
    db[0] = first_b;
    let mut groups_a = da[1..].chunks_exact_mut(N);
    let mut groups_b = db[1..].chunks_exact_mut(N);
    for (ga, gb) in (&mut groups_a).zip(&mut groups_b) {
        a.buf = reader.peek(a.at);
        b.buf = reader.peek(b.at);
        for (sa, sb) in ga.iter_mut().zip(gb) {
            *sa = a.word::<BMI>(reader, params);
            *sb = b.word::<BMI>(reader, params);
        }
    }
    // The rest with the checked reads, from fresh loads.
    a.load(reader, params);
    b.load(reader, params);
    for (sa, sb) in groups_a
        .into_remainder()
        .iter_mut()
        .zip(groups_b.into_remainder())
    {
        *sa = a.next::<BMI>(reader, params);
        *sb = b.next::<BMI>(reader, params);
    }
    ((a.at, a.p), (b.at, b.p))
}

#[inline(always)]
fn decode_two_blocks<const BMI: bool>(
    reader: BitReader<'_>,
    (pos_a, first_a): (usize, u32),
    (pos_b, first_b): (usize, u32),
    params: GapParams,
    dst: &mut [u32; 2 * BLOCK],
) -> ((usize, u64), (usize, u64)) {
    let mut a = GapCursor::new(reader, pos_a, first_a, params);
    let mut b = GapCursor::new(reader, pos_b, first_b, params);
    let (da, db) = dst.split_at_mut(BLOCK);
    da[0] = first_a;
    db[0] = first_b;
    for (sa, sb) in da[1..].iter_mut().zip(&mut db[1..]) {
        *sa = a.next::<BMI>(reader, params);
        *sb = b.next::<BMI>(reader, params);
    }
    ((a.at, a.p), (b.at, b.p))
}

/// `(first position, bit count, k)` of one directory entry.
#[inline]
fn read_entry(entry: &[u8]) -> (u32, u32, u32) {
    let first = u32::from_le_bytes([entry[0], entry[1], entry[2], entry[3]]);
    let bits = u16::from_le_bytes([entry[4], entry[5]]) as u32;
    (first, bits, entry[6] as u32)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{bernoulli_positions, Rng};
    use proptest::prelude::*;

    /// Independent reference encoder: one bool per bit, every k tried by actually encoding.
    fn reference_encode(rel: &[u32], range: u32) -> Vec<u8> {
        fn push_bits(bits: &mut Vec<bool>, value: u64, len: u32) {
            for i in 0..len {
                bits.push((value >> i) & 1 == 1);
            }
        }
        fn block_bits(block: &[u32], k: u32, w: u32) -> Vec<bool> {
            let mut bits = Vec::new();
            for pair in block.windows(2) {
                let g = (pair[1] - pair[0] - 1) as u64;
                let q = g >> k;
                if q < ESC as u64 {
                    bits.extend(std::iter::repeat_n(false, q as usize));
                    bits.push(true);
                    push_bits(&mut bits, g, k);
                } else {
                    bits.extend(std::iter::repeat_n(false, ESC as usize));
                    push_bits(&mut bits, g, w);
                }
            }
            bits
        }
        if rel.is_empty() {
            return Vec::new();
        }
        let w = if range <= 2 {
            1
        } else {
            32 - (range - 1).leading_zeros()
        };
        let mut dir = Vec::new();
        let mut stream = Vec::new();
        for block in rel.chunks(BLOCK) {
            let best = (0..=MAX_K)
                .map(|k| (block_bits(block, k, w), k))
                .min_by_key(|(b, k)| (b.len(), *k))
                .unwrap();
            dir.extend_from_slice(&block[0].to_le_bytes());
            dir.extend_from_slice(&(best.0.len() as u16).to_le_bytes());
            dir.push(best.1 as u8);
            stream.extend(best.0);
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

    fn round_trip(rel: &[u32], range: u32) -> Vec<u8> {
        let mut enc = Vec::new();
        encode(rel, range, &mut enc);
        let mut dec = vec![7];
        decode(&enc, rel.len() as u32, range, &mut dec).unwrap();
        assert_eq!(dec, rel, "range {range}, {} positions", rel.len());
        enc
    }

    #[test]
    fn round_trips_at_every_density() {
        let mut rng = Rng(1);
        for range in [1u32, 2, 3, 7, 8, 9, 1000, 4097, 65_537, 1 << 20] {
            for density in [0.0, 0.001, 0.01, 0.1, 0.5, 0.9, 1.0] {
                let rel = bernoulli_positions(&mut rng, range, density);
                let enc = round_trip(&rel, range);
                assert_eq!(
                    enc,
                    reference_encode(&rel, range),
                    "range {range} density {density}"
                );
            }
            round_trip(&[0], range);
            round_trip(&[range - 1], range);
            if range > 1 {
                round_trip(&[0, range - 1], range);
            }
        }
    }

    #[test]
    fn block_boundaries_and_huge_gaps() {
        let mut rng = Rng(2);
        for n in [1023usize, 1024, 1025, 2047, 2048, 2049, 3 * 1024 + 5] {
            let rel = bernoulli_positions(&mut rng, 1 << 22, n as f64 / (1 << 22) as f64);
            let enc = round_trip(&rel, 1 << 22);
            assert_eq!(enc, reference_encode(&rel, 1 << 22));
            let dense: Vec<u32> = (0..n as u32).collect();
            round_trip(&dense, n as u32 + 1);
        }
        // Largest range, escapes of 32-bit gaps, positions at both ends.
        let rel = [0, 1, 5, 1 << 31, u32::MAX - 3, u32::MAX - 1];
        assert_eq!(round_trip(&rel, u32::MAX), reference_encode(&rel, u32::MAX));
        // Dense runs separated by huge gaps in one block: the escape keeps a small k.
        let mut rel: Vec<u32> = Vec::new();
        for run in 0..8u32 {
            rel.extend((0..100).map(|i| run * 50_000_000 + i));
        }
        let enc = round_trip(&rel, u32::MAX);
        assert_eq!(enc, reference_encode(&rel, u32::MAX));
        assert_eq!(enc[6], 0, "k stays 0 with escaped jumps");
    }

    #[test]
    fn size_tracks_the_entropy_of_iid_positions() {
        let mut rng = Rng(3);
        let range = 1u32 << 20;
        for density in [0.001, 0.01, 0.05, 0.2, 0.5] {
            let rel = bernoulli_positions(&mut rng, range, density);
            let mut enc = Vec::new();
            encode(&rel, range, &mut enc);
            let p = rel.len() as f64 / range as f64;
            let bound = range as f64 * -(p * p.log2() + (1.0 - p) * (1.0 - p).log2()) / 8.0;
            let ratio = enc.len() as f64 / bound;
            println!(
                "density {density}: {} bytes, iid bound {bound:.0}, ratio {ratio:.4}",
                enc.len()
            );
            assert!(
                ratio < 1.06,
                "density {density}: {} bytes, bound {bound:.0}, ratio {ratio:.3}",
                enc.len()
            );
        }
    }

    #[test]
    fn rejects_bad_sections() {
        let rel: Vec<u32> = (0..3000u32).map(|i| i * 7 + (i % 3)).collect();
        let range = 30_000;
        let mut enc = Vec::new();
        encode(&rel, range, &mut enc);
        let mut out = Vec::new();
        for cut in 0..enc.len() {
            assert!(
                decode(&enc[..cut], 3000, range, &mut out).is_err(),
                "prefix of {cut} bytes"
            );
        }
        let mut longer = enc.clone();
        longer.push(0);
        assert!(decode(&longer, 3000, range, &mut out).is_err());
        assert!(decode(&enc, 2999, range, &mut out).is_err());
        assert!(decode(&enc, 3001, range, &mut out).is_err());
        assert!(
            decode(&enc, 3000, rel[2999], &mut out).is_err(),
            "last position out of range"
        );
        assert!(decode(&[], 0, 10, &mut out).is_ok());
        assert!(decode(&[0], 0, 10, &mut out).is_err());
        // A huge count with a tiny section fails on the directory size, before allocating.
        assert!(matches!(
            decode(&[0; 7], u32::MAX - 1, u32::MAX, &mut out),
            Err(CodecError::Truncated { .. })
        ));
        // Second block starting at or before the end of the first.
        let mut bad = enc.clone();
        bad[DIR_ENTRY..DIR_ENTRY + 4].copy_from_slice(&rel[1023].to_le_bytes());
        assert_eq!(
            decode(&bad, 3000, range, &mut out),
            Err(CodecError::NotSorted { index: 1024 })
        );
        // k out of bounds.
        let mut bad = enc.clone();
        bad[6] = 32;
        assert!(decode(&bad, 3000, range, &mut out).is_err());
    }

    #[test]
    fn bit_flips_never_panic_and_stay_valid() {
        let mut rng = Rng(4);
        let range = 50_000;
        let rel = bernoulli_positions(&mut rng, range, 0.05);
        let mut enc = Vec::new();
        encode(&rel, range, &mut enc);
        let mut out = Vec::new();
        for bit in 0..enc.len() * 8 {
            let mut bad = enc.clone();
            bad[bit / 8] ^= 1 << (bit % 8);
            if decode(&bad, rel.len() as u32, range, &mut out).is_ok() {
                assert_ne!(out, rel, "flip of bit {bit} went unnoticed");
                assert_eq!(out.len(), rel.len());
                assert!(out.windows(2).all(|w| w[0] < w[1]) && out.iter().all(|&p| p < range));
            }
        }
    }

    /// `select_octet` finds the `r`-th and `r + 1`-th listed bits as a walk over the bits
    /// does, in both polarities, on random, sparse, full and empty words.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn select_octet_matches_a_walk() {
        if !(std::arch::is_x86_feature_detected!("bmi2")
            && std::arch::is_x86_feature_detected!("popcnt"))
        {
            return;
        }
        let mut rng = Rng(41);
        for round in 0..4000 {
            let words: Vec<[u8; 8]> = (0..8)
                .map(|_| {
                    let x = match round % 4 {
                        0 => rng.next_u64(),
                        1 => rng.next_u64() & rng.next_u64() & rng.next_u64(),
                        2 => [0, !0][rng.below(2) as usize],
                        _ => rng.next_u64() | rng.next_u64(),
                    };
                    x.to_le_bytes()
                })
                .collect();
            for flip in [0, !0u64] {
                let listed: Vec<u64> = (0..512u64)
                    .filter(|&b| {
                        (u64::from_le_bytes(words[b as usize / 64]) ^ flip) >> (b % 64) & 1 == 1
                    })
                    .collect();
                for r in 1..=listed.len() as u64 {
                    // SAFETY: the features were detected above; eight words, `r` listed.
                    let (at, next) = unsafe { select_octet(&words, flip, r) };
                    assert_eq!(at, listed[r as usize - 1], "round {round} r {r}");
                    if let Some(&want) = listed.get(r as usize) {
                        assert_eq!(next, want, "round {round} r {r}");
                    }
                }
            }
        }
    }

    /// The dispatched bounds equal the portable ones where a block ends exactly at the last
    /// listed element of eight quiet words (nothing left open), and on half-dense chunks
    /// whose blocks end at every offset within eight words.
    #[test]
    fn map_bounds_builds_agree_where_blocks_end() {
        let check = |rel: &[u32], range: u32, what: &str| {
            let map = bitmap_of(rel, range);
            assert_eq!(
                map_bounds(&map, range, false).0,
                map_bounds_impl::<false, false>(&map, range).0,
                "{what}"
            );
            let (gaps, holes) = map_bounds_impl::<true, false>(&map, range);
            assert_eq!(map_bounds(&map, range, true), (gaps, Some(holes)), "{what}");
        };
        let mut rng = Rng(43);
        // 1024 changed elements fill words 0..16: the first block ends at the last bit of
        // the second eight, then half-dense changes (holes likewise, inverted).
        for lead in [1024u32, 1023, 1025, 512, 1536, 2048] {
            let range = 200_000;
            let mut rel: Vec<u32> = (0..lead).collect();
            rel.extend((lead..range).filter(|_| rng.below(2) == 0));
            check(&rel, range, &format!("lead {lead}"));
            let holes: Vec<u32> = (0..range)
                .filter(|p| rel.binary_search(p).is_err())
                .collect();
            check(&holes, range, &format!("holes lead {lead}"));
        }
        for density in [0.3, 0.4, 0.5, 0.6, 0.7] {
            for range in [4097u32, 70_001, 300_000] {
                let rel = bernoulli_positions(&mut rng, range, density);
                check(&rel, range, &format!("{range} {density}"));
            }
        }
    }

    fn bitmap_of(rel: &[u32], range: u32) -> Vec<u8> {
        let mut map = Vec::new();
        super::super::bitmap::encode(rel, range, &mut map);
        map
    }

    #[test]
    fn holes_directory_equals_the_complement_s() {
        let mut rng = Rng(9);
        for range in [1u32, 2, 3, 1023, 1024, 1025, 2049, 5000, 1 << 16] {
            for density in [0.0, 0.3, 0.5, 0.9, 0.99, 0.999, 1.0] {
                let rel = bernoulli_positions(&mut rng, range, density);
                let holes: Vec<u32> = (0..range)
                    .filter(|p| rel.binary_search(p).is_err())
                    .collect();
                let expected = if holes.is_empty() {
                    (Vec::new(), 0)
                } else {
                    directory(&holes, range)
                };
                assert_eq!(
                    holes_directory(&bitmap_of(&rel, range), range),
                    expected,
                    "range {range} density {density}"
                );
            }
        }
        // Runs that cross block boundaries in every way.
        for run in [1u32, 2, 1023, 1024, 1025, 3000] {
            let range = 20_000;
            let rel: Vec<u32> = (0..range).filter(|p| (p / run) % 2 == 1).collect();
            let holes: Vec<u32> = (0..range).filter(|p| (p / run) % 2 == 0).collect();
            assert_eq!(
                holes_directory(&bitmap_of(&rel, range), range),
                directory(&holes, range),
                "run {run}"
            );
        }
    }

    /// The holes' lower bound never exceeds their exact size (portable and dispatched builds
    /// alike), at every density, odd ranges, runs long enough to escape, runs across block
    /// and word boundaries; and it is tight on half-dense chunks.
    #[test]
    fn holes_lower_bound_is_below_the_exact_size() {
        let check = |rel: &[u32], range: u32, what: &str| {
            let map = bitmap_of(rel, range);
            let exact = holes_directory(&map, range).1;
            let bound = holes_lower_bound(&map, range);
            assert_eq!(
                bound,
                map_bounds_impl::<true, false>(&map, range).1,
                "{what}"
            );
            assert!(bound <= exact, "{what}: {bound} > {exact}");
            // The changed positions' gaps bound from the same pass, with or without the
            // holes', in both builds.
            let gaps_bound = map_bounds(&map, range, false).0;
            assert_eq!(
                map_bounds(&map, range, true),
                (gaps_bound, Some(bound)),
                "{what}"
            );
            assert_eq!(
                gaps_bound,
                map_bounds_impl::<false, false>(&map, range).0,
                "{what}"
            );
            let gaps_exact = directory(rel, range).1;
            assert!(
                gaps_bound <= gaps_exact,
                "{what}: {gaps_bound} > {gaps_exact}"
            );
            // As tight as the bound from the positions wherever no run of 16 clear bits
            // makes the bitmap's bound on a block's largest gap looser than its exact one.
            let mut longest = rel
                .first()
                .map_or(0, |&p| p.max(range - 1 - rel[rel.len() - 1]));
            for pair in rel.windows(2) {
                longest = longest.max(pair[1] - pair[0] - 1);
            }
            if longest < 16 {
                assert_eq!(gaps_bound, lower_bound(rel, range), "{what}");
            }
            (bound, exact)
        };
        let mut rng = Rng(36);
        for range in [
            1u32,
            2,
            3,
            63,
            64,
            65,
            1023,
            1025,
            2049,
            5001,
            70_001,
            1 << 20,
        ] {
            for density in [
                0.0, 0.01, 0.1, 0.3, 0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.8, 0.9, 0.95, 0.99, 0.999,
                1.0,
            ] {
                let rel = bernoulli_positions(&mut rng, range, density);
                let (bound, exact) = check(&rel, range, &format!("{range} {density}"));
                if density == 0.5 && range == 1 << 20 {
                    assert!(bound * 100 >= exact * 99, "{bound} vs {exact}");
                }
            }
        }
        // Runs of changed elements of every length around the escape thresholds (16 and 32
        // at k = 0 and 1, 64 and more), placed at random so they cross words and blocks.
        for long in [8u64, 15, 16, 17, 31, 32, 33, 63, 64, 65, 200, 5000] {
            for every in [3u64, 50, 1000] {
                let range = 100_000 + rng.below(200) as u32;
                let mut rel = Vec::new();
                let mut p = 0u32;
                while p < range {
                    let run = if rng.below(every) == 0 {
                        long
                    } else {
                        rng.below(3)
                    };
                    for _ in 0..run {
                        if p < range {
                            rel.push(p);
                        }
                        p += 1;
                    }
                    p += 1 + rng.below(2) as u32;
                }
                check(&rel, range, &format!("runs {long} every {every}"));
            }
        }
        // Alternating runs crossing block boundaries in every way.
        for run in [1u32, 2, 15, 16, 31, 32, 1023, 1024, 1025, 3000] {
            let range = 20_000;
            let rel: Vec<u32> = (0..range).filter(|p| (p / run) % 2 == 1).collect();
            check(&rel, range, &format!("alternating {run}"));
        }
    }

    /// `block_bound`'s early exit gives the minimum over every `k`.
    #[test]
    fn block_bound_is_the_minimum_over_every_k() {
        let every_k = |n: u64, s: u64, g_max: u64, w: u64| {
            (0..=MAX_K as u64)
                .map(|k| {
                    let scale = 1u64 << k;
                    if g_max < (ESC as u64) << k
                        || (ESC as u64 + w) << k >= g_max.saturating_add(1 + k * scale)
                    {
                        s.saturating_sub(n * (scale - 1)).div_ceil(scale) + n * (1 + k)
                    } else {
                        n * (1 + k).min(ESC as u64 + w)
                    }
                })
                .min()
                .unwrap_or(u64::MAX)
        };
        let mut rng = Rng(38);
        for _ in 0..20_000 {
            let below_power = |rng: &mut Rng| {
                let bits = rng.below(33);
                rng.below(1 << bits)
            };
            let n = rng.below(BLOCK as u64);
            let s = below_power(&mut rng);
            let g_max = match rng.below(4) {
                0 => u64::MAX,
                _ => below_power(&mut rng),
            };
            let w = 1 + rng.below(32);
            assert_eq!(
                block_bound(n, s, g_max, w),
                every_k(n, s, g_max, w),
                "{n} {s} {g_max} {w}"
            );
        }
    }

    #[test]
    fn both_length_histograms_agree() {
        let mut rng = Rng(31);
        for n in [0usize, 1, 3, 4, 5, 31, 1023] {
            for top in [0u32, 1, 2, 5, 13, 31, 32] {
                let gaps: Vec<u32> = (0..n)
                    .map(|_| {
                        let len = rng.below(top as u64 + 1) as u32;
                        (rng.next_u64() & mask(len)) as u32
                    })
                    .collect();
                assert_eq!(
                    length_histogram_vector(&gaps),
                    length_histogram(&gaps),
                    "{n} gaps of up to {top} bits"
                );
            }
        }
        assert_eq!(
            length_histogram_vector(&[u32::MAX, 0, 1 << 31]),
            length_histogram(&[u32::MAX, 0, 1 << 31])
        );
    }

    /// The portable build and the one this CPU runs (AVX2 where it has it) give the same
    /// bytes; the other tests check the latter against the reference encoder.
    /// The BMI build of the decoder (where the CPU has it), the portable one, and the
    /// portable one decoding one block at a time (no pairs of blocks in lockstep) agree on
    /// sections of every density, intact or damaged (some blocks pass, the rest fail in
    /// different ways): same positions, same errors.
    /// The chooser's lower bound never exceeds the exact size, at every density, with
    /// escapes and huge gaps, and matches it on half-dense chunks without escapes.
    #[test]
    fn lower_bound_is_below_the_exact_size() {
        let mut rng = Rng(35);
        for range in [2u32, 3, 100, 1025, 5000, 70_000, 1 << 20] {
            for density in [0.0001, 0.001, 0.01, 0.1, 0.3, 0.5, 0.7, 0.9, 0.999, 1.0] {
                let rel = bernoulli_positions(&mut rng, range, density);
                let exact = directory(&rel, range).1;
                let bound = lower_bound(&rel, range);
                assert_eq!(bound, lower_bound_impl(&rel, range));
                assert!(
                    bound <= exact,
                    "range {range} density {density}: {bound} > {exact}"
                );
                if density == 0.5 && range == 1 << 20 {
                    assert!(bound * 100 >= exact * 99, "{bound} vs {exact}");
                }
            }
        }
        for scale in 0..=30u32 {
            for n in [2usize, 9, 1025, 3000] {
                let mut rel = Vec::with_capacity(n);
                let mut p = rng.below(100);
                for _ in 0..n {
                    rel.push(p as u32);
                    p += match rng.below(20) {
                        0 => rng.below(1 << (scale + 6).min(31)),
                        _ => rng.below(1 << scale),
                    } + 1;
                }
                if p > u32::MAX as u64 {
                    continue;
                }
                let range = p as u32;
                let (exact, bound) = (directory(&rel, range).1, lower_bound(&rel, range));
                assert!(bound <= exact, "scale {scale}, {n}: {bound} > {exact}");
            }
        }
    }

    #[test]
    fn portable_and_dispatched_decoders_agree() {
        let mut rng = Rng(34);
        for range in [3u32, 1025, 70_000, 1 << 20] {
            for density in [0.0003, 0.01, 0.1, 0.3, 0.6] {
                let rel = bernoulli_positions(&mut rng, range, density);
                let mut enc = Vec::new();
                encode(&rel, range, &mut enc);
                for damage in 0..40 {
                    let mut bad = enc.clone();
                    if damage > 0 && !bad.is_empty() {
                        let i = rng.below(bad.len() as u64) as usize;
                        bad[i] ^= 1 << rng.below(8);
                    }
                    let count = rel.len() as u32;
                    let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
                    // One block at a time, portable: the reference.
                    let ra = decode_impl::<false, false>(&bad, count, range, &mut a);
                    let rb = decode(&bad, count, range, &mut b);
                    let rc = decode_impl::<false, true>(&bad, count, range, &mut c);
                    assert_eq!(ra, rb, "range {range} density {density} damage {damage}");
                    assert_eq!(ra, rc, "range {range} density {density} damage {damage}");
                    if ra.is_ok() {
                        assert_eq!(a, b);
                        assert_eq!(a, c);
                    }
                    if damage == 0 {
                        assert_eq!(a, rel);
                    }
                }
            }
        }
    }

    /// Gaps of every scale (so blocks get every `k` the AVX2 build writes in lanes and
    /// above), with escaped jumps mixed in and odd block lengths: portable and vector builds
    /// give the same bytes, which decode back.
    #[test]
    fn vector_writer_agrees_at_every_k_with_escapes() {
        let mut rng = Rng(33);
        for scale in 0..=24u32 {
            for n in [2usize, 9, 17, 1000, 1025, 2100, 4200] {
                let mut rel = Vec::with_capacity(n);
                let mut p = rng.below(100);
                for _ in 0..n {
                    rel.push(p as u32);
                    let gap = match rng.below(20) {
                        0 => rng.below(1 << (scale + 6).min(31)),
                        _ => rng.below(1 << scale),
                    };
                    p += gap + 1;
                }
                if p > u32::MAX as u64 {
                    continue;
                }
                let range = p as u32;
                let mut portable = Vec::new();
                encode_impl::<false>(&rel, range, &mut portable);
                let mut vector = Vec::new();
                encode_impl::<true>(&rel, range, &mut vector);
                assert_eq!(portable, vector, "scale {scale}, {n} positions");
                let mut dispatched = Vec::new();
                encode(&rel, range, &mut dispatched);
                assert_eq!(portable, dispatched, "scale {scale}, {n} positions");
                let mut out = Vec::new();
                decode(&portable, n as u32, range, &mut out).unwrap();
                assert_eq!(out, rel);
                // Every k and escapes through the decoders too (pairs of blocks, grouped
                // loads where k allows), against one block at a time, intact or damaged.
                for damage in 0..8 {
                    let mut bad = portable.clone();
                    if damage > 0 {
                        let i = rng.below(bad.len() as u64) as usize;
                        bad[i] ^= 1 << rng.below(8);
                    }
                    let (mut a, mut b) = (Vec::new(), Vec::new());
                    let ra = decode_impl::<false, false>(&bad, n as u32, range, &mut a);
                    let rb = decode(&bad, n as u32, range, &mut b);
                    assert_eq!(ra, rb, "scale {scale}, {n} positions, damage {damage}");
                    if ra.is_ok() {
                        assert_eq!(a, b);
                    }
                }
            }
        }
    }

    #[test]
    fn portable_and_dispatched_builds_agree() {
        let mut rng = Rng(32);
        for range in [1u32, 2, 1025, 5000, 1 << 16, 1 << 20] {
            for density in [
                0.0, 0.0001, 0.001, 0.01, 0.05, 0.1, 0.2, 0.35, 0.5, 0.7, 0.9, 0.99, 1.0,
            ] {
                let rel = bernoulli_positions(&mut rng, range, density);
                let mut portable = Vec::new();
                encode_impl::<false>(&rel, range, &mut portable);
                let mut vector = Vec::new();
                encode_impl::<true>(&rel, range, &mut vector);
                let mut dispatched = Vec::new();
                encode(&rel, range, &mut dispatched);
                assert_eq!(portable, vector, "range {range} density {density}");
                assert_eq!(portable, dispatched, "range {range} density {density}");
                assert_eq!(directory_impl::<false>(&rel, range), directory(&rel, range));
                assert_eq!(directory_impl::<true>(&rel, range), directory(&rel, range));
                let map = bitmap_of(&rel, range);
                assert_eq!(
                    holes_directory_impl::<false>(&map, range),
                    holes_directory(&map, range)
                );
                assert_eq!(
                    holes_directory_impl::<true>(&map, range),
                    holes_directory(&map, range)
                );
            }
        }
    }

    fn sorted_positions() -> impl Strategy<Value = (Vec<u32>, u32)> {
        (
            1u32..200_000,
            prop::collection::vec(any::<u32>(), 0..3000),
            any::<bool>(),
        )
            .prop_map(|(range, raw, clustered)| {
                let mut rel: Vec<u32> = if clustered {
                    // Runs of neighbours around a few centres, to exercise small and large k.
                    raw.iter()
                        .map(|&r| ((r >> 16) % 8) * (range / 8) + (r & 0xff))
                        .filter(|&p| p < range)
                        .collect()
                } else {
                    raw.iter().map(|&r| r % range).collect()
                };
                rel.sort_unstable();
                rel.dedup();
                (rel, range)
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn prop_round_trip((rel, range) in sorted_positions()) {
            let mut enc = Vec::new();
            encode(&rel, range, &mut enc);
            let mut dec = Vec::new();
            decode(&enc, rel.len() as u32, range, &mut dec).unwrap();
            prop_assert_eq!(&dec, &rel);
            prop_assert_eq!(enc, reference_encode(&rel, range));
        }

        #[test]
        fn prop_decoder_never_panics(input in prop::collection::vec(any::<u8>(), 0..400), range in 1u32..u32::MAX, count in any::<u32>()) {
            let count = count % (range.min(5000) + 1);
            let mut out = Vec::new();
            if decode(&input, count, range, &mut out).is_ok() {
                prop_assert_eq!(out.len(), count as usize);
                prop_assert!(out.windows(2).all(|w| w[0] < w[1]) && out.iter().all(|&p| p < range));
            }
        }

        #[test]
        fn prop_decoder_survives_damaged_sections((rel, range) in sorted_positions(), at in any::<usize>(), byte in any::<u8>()) {
            let mut enc = Vec::new();
            encode(&rel, range, &mut enc);
            if !enc.is_empty() {
                let i = at % enc.len();
                enc[i] ^= byte | 1;
            }
            let mut out = Vec::new();
            if decode(&enc, rel.len() as u32, range, &mut out).is_ok() {
                prop_assert!(out.windows(2).all(|w| w[0] < w[1]) && out.iter().all(|&p| p < range));
            }
        }
    }
}
