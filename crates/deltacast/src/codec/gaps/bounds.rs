//! Lower bounds on the size of a `gaps` section, for the chooser to skip sizing it exactly
//! when another codec is already smaller: from one pass over the positions, or over the
//! words of the chunk's bitmap section (the changed positions' gaps and the holes' at once).

use super::format::{escape_width, BLOCK, DIR_ENTRY, ESC, MAX_K};
#[cfg(target_arch = "x86_64")]
use super::x86::{octet_stats, select_octet};
use crate::codec::bits::mask;

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
///
/// [`directory`]: super::encode::directory
pub(crate) fn lower_bound(rel: &[u32], range: u32) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if crate::codec::bits::x86_wide() {
        // SAFETY: as in `encode`.
        return unsafe { avx2::lower_bound(rel, range) };
    }
    lower_bound_impl(rel, range)
}

/// [`lower_bound`], inlined into its builds (the largest step per block is a max over
/// lanes: one instruction per 8 with AVX2, none for u32 in plain x86_64's SSE2).
#[inline(always)]
pub(super) fn lower_bound_impl(rel: &[u32], range: u32) -> u64 {
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
///
/// [`holes_directory`]: super::encode::holes_directory
pub(crate) fn holes_lower_bound(changed: &[u8], range: u32) -> u64 {
    map_bounds(changed, range, true).1.unwrap_or(0)
}

/// Lower bounds on the sizes of the `gaps` section of the changed positions (the set bits of
/// `changed`, their bitmap section) and, with `holes`, of [`holes_directory`]'s section, from
/// one pass over the bitmap's words (as [`holes_lower_bound`], the gaps' largest gap bounded
/// by runs of 16 or 32 clear bits). The chooser builds the bitmap of a dense chunk first, so
/// its bounds need no pass over the positions themselves.
///
/// [`holes_directory`]: super::encode::holes_directory
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
    if crate::codec::bits::x86_avx512() {
        // SAFETY: `x86_avx512` detected all the function's features.
        return unsafe { avx2::map_bounds_avx512::<HOLES>(changed, range) };
    }
    #[cfg(target_arch = "x86_64")]
    if crate::codec::bits::x86_wide() {
        // SAFETY: as in `encode`.
        return unsafe { avx2::map_bounds::<HOLES>(changed, range) };
    }
    map_bounds_impl::<HOLES, false>(changed, range)
}

/// The bounds compiled for AVX2 (and AVX-512), as the encoder's entry points: same results.
#[cfg(target_arch = "x86_64")]
mod avx2 {
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

/// [`map_bounds`]: the gaps bound, and the holes bound when `HOLES` (else 0).
#[inline(always)]
pub(super) fn map_bounds_impl<const HOLES: bool, const VECTOR: bool>(
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

#[cfg(test)]
mod tests {
    use super::super::encode::{directory, holes_directory};
    use super::super::reference::bitmap_of;
    use super::*;
    use crate::testutil::{bernoulli_positions, Rng};

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
}
