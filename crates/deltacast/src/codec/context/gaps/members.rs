//! The members of each class in `ctxgaps`: one pass over a range's bits turns the encoder's
//! changes into gaps inside their classes, and the decoder's gaps back into positions.
//!
//! A block of 64 elements holds the three bits of each element's class as bit planes; the
//! planes are made a strip of blocks at a time (so they stay in the first-level cache), and a
//! running count of each class's members across the blocks gives a change's index among its
//! class's members. Both sides pay one vector pass over the old bits and a few instructions
//! per block and per change, whatever the number of classes.

use super::{exponent, malformed, ClassMap, MAX_CLASSES};
use crate::codec::bits::mask;
use crate::dtype::load_bits;
use crate::error::CodecError;

/// Per block of 64 elements: the three bits of each element's class as planes, and which
/// elements of the block are in the range.
pub(super) type Block = [u64; 4];

/// Blocks whose planes are made at a time: 4096 elements, so that the planes of a strip stay in
/// the first-level cache while the strip's classes are counted and its changes placed.
const STRIP_BLOCKS: usize = 64;

/// Members of class `class` in a block.
#[inline(always)]
pub(super) fn members(p: &Block, class: u8) -> u64 {
    // Bit j of the class clear: the plane's complement (xor with all ones), without a branch.
    let flip = |j: u32| (class as u64 >> j & 1).wrapping_sub(1);
    (p[0] ^ flip(0)) & (p[1] ^ flip(1)) & (p[2] ^ flip(2)) & p[3]
}

/// The members of every class in a block, class `c` at index `c`.
#[inline(always)]
pub(super) fn class_members(p: &Block) -> [u64; MAX_CLASSES] {
    // Planes are zero outside the range, so only the complements need the range's mask.
    let (a, b, c) = (p[0], p[1], p[2]);
    let (not_a, not_b, not_c) = (!a & p[3], !b, !c);
    let low = [not_a & not_b, a & not_b, not_a & b, a & b];
    let mut m = [0u64; MAX_CLASSES];
    for (i, &l) in low.iter().enumerate() {
        m[i] = l & not_c;
        m[i + 4] = l & c;
    }
    m
}

/// The planes of the old bits `held` (`out.len()` blocks, the last one possibly partial).
pub(super) fn planes(width: usize, held: &[u8], map: &ClassMap, out: &mut [Block]) {
    debug_assert_eq!(out.len(), (held.len() / width).div_ceil(64));
    let mut done = 0;
    #[cfg(target_arch = "x86_64")]
    if width == 2 && std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: AVX2 is present (checked just above).
        done = unsafe { x86::planes_bf16(held, map, out) };
    }
    planes_scalar(width, held, map, done, &mut out[done..]);
}

/// The planes of blocks `first ..` of `held` into `out`, one element at a time.
pub(super) fn planes_scalar(
    width: usize,
    held: &[u8],
    map: &ClassMap,
    first: usize,
    out: &mut [Block],
) {
    let n = held.len() / width;
    let nb = 8 * width as u32;
    for (b, p) in (first..).zip(out.iter_mut()) {
        let start = b * 64;
        let end = (start + 64).min(n);
        let mut w = [0u64; 4];
        for i in start..end {
            let c = map.class(exponent(load_bits(held, width, i), nb)) as u64;
            let bit = (i - start) as u32;
            w[0] |= (c & 1) << bit;
            w[1] |= (c >> 1 & 1) << bit;
            w[2] |= (c >> 2 & 1) << bit;
        }
        w[3] = if end - start == 64 {
            u64::MAX
        } else {
            mask((end - start) as u32)
        };
        *p = w;
    }
}

/// The planes of a range a strip of blocks at a time (not a callback per block: the passes
/// that walk the strips are compiled with their own target features, which a closure would
/// not inherit).
struct Strips<'a> {
    width: usize,
    held: &'a [u8],
    map: &'a ClassMap,
    /// The first block of the next strip.
    first: usize,
    planes: [Block; STRIP_BLOCKS],
}

impl<'a> Strips<'a> {
    fn new(width: usize, held: &'a [u8], map: &'a ClassMap) -> Self {
        Strips {
            width,
            held,
            map,
            first: 0,
            planes: [[0; 4]; STRIP_BLOCKS],
        }
    }

    /// The next strip: the index of its first block and its blocks' planes.
    #[inline(always)]
    fn next_strip(&mut self) -> Option<(usize, &mut [Block])> {
        let n = self.held.len() / self.width;
        let first = self.first;
        if first * 64 >= n {
            return None;
        }
        let elements = first * 64..((first + STRIP_BLOCKS) * 64).min(n);
        let blocks = &mut self.planes[..elements.len().div_ceil(64)];
        let width = self.width;
        planes(
            width,
            &self.held[elements.start * width..elements.end * width],
            self.map,
            blocks,
        );
        self.first += STRIP_BLOCKS;
        Some((first, blocks))
    }
}

/// Sets bit `bit`'s class in a block's planes.
#[inline(always)]
fn set_class(w: &mut Block, bit: u32, class: u8) {
    let one = 1u64 << bit;
    for (j, plane) in w.iter_mut().take(3).enumerate() {
        if class >> j & 1 == 1 {
            *plane |= one;
        } else {
            *plane &= !one;
        }
    }
}

/// The index of the `g`-th (from 0) set bit of `v`; `g < v.count_ones()`.
#[inline(always)]
pub(super) fn select(mut v: u64, mut g: u32) -> u32 {
    let mut at = 0;
    for half in [32u32, 16, 8] {
        let low = (v & mask(half)).count_ones();
        if g >= low {
            g -= low;
            v >>= half;
            at += half;
        }
    }
    for _ in 0..g {
        v &= v - 1;
    }
    at + v.trailing_zeros()
}

/// Which build of the passes runs: the portable one, the one with BMI and one-instruction
/// popcounts, or the one with AVX-512 vector popcounts (every class of a block counted in one
/// instruction) and BMI2's `pdep` select.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Build {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Wide,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Build {
    /// The fastest build this CPU runs (detection is cached by the standard library).
    pub(super) fn best() -> Build {
        #[cfg(target_arch = "x86_64")]
        {
            if crate::codec::bits::x86_avx512() {
                return Build::Avx512;
            }
            if crate::codec::bits::x86_wide() {
                return Build::Wide;
            }
        }
        Build::Portable
    }

    /// `self` if this CPU runs it, else the portable build (the detection is cached, so the
    /// check costs a load; it keeps the unsafe calls below sound whatever a caller passes).
    fn checked(self) -> Build {
        match self {
            #[cfg(target_arch = "x86_64")]
            Build::Avx512 if !crate::codec::bits::x86_avx512() => Build::Portable,
            #[cfg(target_arch = "x86_64")]
            Build::Wide if !crate::codec::bits::x86_wide() => Build::Portable,
            b => b,
        }
    }

    /// Every build this CPU runs.
    #[cfg(test)]
    pub(super) fn every() -> Vec<Build> {
        let mut all = vec![Build::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if crate::codec::bits::x86_wide() {
                all.push(Build::Wide);
            }
            if crate::codec::bits::x86_avx512() {
                all.push(Build::Avx512);
            }
        }
        all
    }
}

/// The encoder's gaps, kept from chunk to chunk.
#[derive(Default)]
pub(super) struct ClassGaps {
    /// Each change's class.
    pub(super) classes: Vec<u8>,
    /// The gaps of each class, in position order.
    pub(super) by_class: Vec<Vec<u32>>,
}

/// Each change's gap inside its class (the members of its class strictly between it and the
/// class's previous change) into `gaps`, class by class in position order. One pass over the
/// range: the planes of a block come from the bits after the sync `after` with each change's
/// class set from its old bits `old` (the decoder sees the old bits), and a running count of
/// each class's members gives a change's index among them. `build` is [`Build::best`] (the
/// tests pass each of [`Build::every`]); one this CPU does not run falls back to the portable
/// one.
pub(super) fn class_gaps(
    build: Build,
    width: usize,
    rel: &[u32],
    after: &[u8],
    old: &[u8],
    map: &ClassMap,
    gaps: &mut ClassGaps,
) {
    let nb = 8 * width as u32;
    let ClassGaps { classes, by_class } = gaps;
    classes.clear();
    classes.extend((0..rel.len()).map(|j| map.class(exponent(load_bits(old, width, j), nb))));
    by_class.resize_with(map.classes, Vec::new);
    by_class.iter_mut().for_each(Vec::clear);
    match build.checked() {
        Build::Portable => {
            class_gaps_with(Build::Portable, width, rel, after, map, classes, by_class)
        }
        // SAFETY: the function's only requirement is its target features, all of which
        // `Build::checked` found on this CPU.
        #[cfg(target_arch = "x86_64")]
        Build::Wide => unsafe { x86::class_gaps_wide(width, rel, after, map, classes, by_class) },
        // SAFETY: as above.
        #[cfg(target_arch = "x86_64")]
        Build::Avx512 => unsafe {
            x86::class_gaps_avx512(width, rel, after, map, classes, by_class)
        },
    }
}

#[inline(always)]
fn class_gaps_with(
    build: Build,
    width: usize,
    rel: &[u32],
    after: &[u8],
    map: &ClassMap,
    classes: &[u8],
    by_class: &mut [Vec<u32>],
) {
    // Members of each class before the current block, and the index the next gap counts from.
    let mut seen = [0u64; MAX_CLASSES];
    let mut from = [0u64; MAX_CLASSES];
    // `seen` before each block of the strip.
    let mut before = [[0u64; MAX_CLASSES]; STRIP_BLOCKS];
    let mut j = 0;
    let mut strips = Strips::new(width, after, map);
    // A strip at a time, so that no branch depends on which blocks hold changes: the strip's
    // changes get their old classes, then every block is counted, then every change placed.
    while let Some((first_block, blocks)) = strips.next_strip() {
        let end = ((first_block + blocks.len()) * 64) as u64;
        let first = j;
        while j < rel.len() && (rel[j] as u64) < end {
            let i = rel[j] as usize;
            set_class(
                &mut blocks[i / 64 - first_block],
                (i % 64) as u32,
                classes[j],
            );
            j += 1;
        }
        count_strip(build, blocks, &mut seen, &mut before);
        for (&i, &c) in rel[first..j].iter().zip(&classes[first..j]) {
            let (k, c) = (i as usize / 64 - first_block, c as usize);
            let below = members(&blocks[k], c as u8) & mask(i % 64);
            let index = before[k][c] + below.count_ones() as u64;
            by_class[c].push((index - from[c]) as u32);
            from[c] = index + 1;
        }
    }
}

/// The decoder's walk through the changes of each class: `targets` holds each change's index
/// among its class's members, class after class.
struct Cursors<'t> {
    targets: &'t [u32],
    /// The next change of each class, and the end of the class's changes, in `targets`.
    next: [usize; MAX_CLASSES],
    end: [usize; MAX_CLASSES],
    /// The next change's index among the class's members (`u64::MAX` once the class is done).
    want: [u64; MAX_CLASSES],
}

impl<'t> Cursors<'t> {
    fn new(targets: &'t [u32], counts: &[u32]) -> Self {
        let mut c = Cursors {
            targets,
            next: [0; MAX_CLASSES],
            end: [0; MAX_CLASSES],
            want: [u64::MAX; MAX_CLASSES],
        };
        let mut at = 0;
        for (class, &k) in counts.iter().enumerate() {
            (c.next[class], c.end[class]) = (at, at + k as usize);
            at += k as usize;
            c.refresh(class);
        }
        c
    }

    #[inline(always)]
    fn refresh(&mut self, class: usize) {
        self.want[class] = match self.targets.get(self.next[class]) {
            Some(&t) if self.next[class] < self.end[class] => t as u64,
            _ => u64::MAX,
        };
    }

    /// Moves class `class` on to its next change.
    #[inline(always)]
    fn advance(&mut self, class: usize) {
        self.next[class] += 1;
        self.refresh(class);
    }

    /// The first class with a change left.
    fn unfinished(&self) -> Option<usize> {
        (0..MAX_CLASSES).find(|&c| self.next[c] < self.end[c])
    }
}

/// Puts the changes of each class at their members (`targets`: each change's index among its
/// class's members, class after class, `counts[c]` of class `c`) and lists them in position
/// order into `out`, in one pass over the old bits `held`: a running count of each class's
/// members says in which block the class's next change lies. `out` is left empty when a
/// class ends first. `build` as in [`class_gaps`].
pub(super) fn place_changes(
    build: Build,
    width: usize,
    held: &[u8],
    map: &ClassMap,
    targets: &[u32],
    counts: &[u32],
    out: &mut Vec<u32>,
) -> Result<(), CodecError> {
    out.clear();
    out.reserve(targets.len());
    let mut cursors = Cursors::new(targets, counts);
    let c = &mut cursors;
    match build.checked() {
        Build::Portable => place_changes_with(Build::Portable, width, held, map, c, out),
        // SAFETY: as in `class_gaps`.
        #[cfg(target_arch = "x86_64")]
        Build::Wide => unsafe { x86::place_changes_wide(width, held, map, c, out) },
        // SAFETY: as in `class_gaps`.
        #[cfg(target_arch = "x86_64")]
        Build::Avx512 => unsafe { x86::place_changes_avx512(width, held, map, c, out) },
    }
    if let Some(c) = cursors.unfinished() {
        out.clear();
        return Err(malformed(format!(
            "class {c} has fewer than {} changes' worth of elements",
            counts[c]
        )));
    }
    Ok(())
}

#[inline(always)]
fn place_changes_with(
    build: Build,
    width: usize,
    held: &[u8],
    map: &ClassMap,
    cursors: &mut Cursors<'_>,
    out: &mut Vec<u32>,
) {
    let mut seen = [0u64; MAX_CLASSES];
    let mut before = [[0u64; MAX_CLASSES]; STRIP_BLOCKS];
    let mut changed = [0u64; STRIP_BLOCKS];
    let mut strips = Strips::new(width, held, map);
    // A strip at a time, so that no branch depends on which blocks hold changes: every block
    // is counted, then each class's changes in the strip are found by a search of the counts,
    // then the strip's changes are listed in position order.
    while let Some((first_block, blocks)) = strips.next_strip() {
        count_strip(build, blocks, &mut seen, &mut before);
        for c in 0..map.classes {
            while cursors.want[c] < seen[c] {
                let t = cursors.want[c];
                let k = block_of(&before, c, t);
                let bit = select_in(
                    build,
                    members(&blocks[k], c as u8),
                    (t - before[k][c]) as u32,
                );
                changed[k] |= 1 << bit;
                cursors.advance(c);
            }
        }
        for (k, w) in changed[..blocks.len()].iter_mut().enumerate() {
            let (mut v, at) = (std::mem::take(w), ((first_block + k) * 64) as u32);
            while v != 0 {
                out.push(at + v.trailing_zeros());
                v &= v - 1;
            }
        }
    }
}

/// The block of a strip that holds member `t` of class `c`: the last block with at most `t`
/// members of `c` before it (`before` as [`count_strip`] leaves it), by a search without
/// branches.
#[inline(always)]
fn block_of(before: &[[u64; MAX_CLASSES]; STRIP_BLOCKS], c: usize, t: u64) -> usize {
    let mut k = 0;
    let mut step = STRIP_BLOCKS / 2;
    while step > 0 {
        k += if before[k + step][c] <= t { step } else { 0 };
        step /= 2;
    }
    k
}

/// [`select`], in two instructions on the AVX-512 build (which has BMI2).
#[inline(always)]
fn select_in(build: Build, v: u64, g: u32) -> u32 {
    match build {
        // SAFETY: `Avx512` reaches here only in the AVX-512 build of the passes, which has
        // BMI2.
        #[cfg(target_arch = "x86_64")]
        Build::Avx512 => unsafe { x86::select_bmi2(v, g) },
        _ => select(v, g),
    }
}

/// Counts the members of each class in every block of a strip: `before[k]` gets the members
/// before block `k` (`u64::MAX` past the strip's last block) and `seen` those up to the
/// strip's end.
#[inline(always)]
fn count_strip(
    build: Build,
    blocks: &[Block],
    seen: &mut [u64; MAX_CLASSES],
    before: &mut [[u64; MAX_CLASSES]; STRIP_BLOCKS],
) {
    for (p, b) in blocks.iter().zip(before.iter_mut()) {
        *b = *seen;
        match build {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: `Avx512` reaches here only in the AVX-512 build of the passes.
            Build::Avx512 => unsafe { x86::add_counts(p, seen) },
            _ => {
                for (s, m) in seen.iter_mut().zip(class_members(p)) {
                    *s += m.count_ones() as u64;
                }
            }
        }
    }
    before[blocks.len()..].fill([u64::MAX; MAX_CLASSES]);
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use super::{Block, Build, ClassMap, Cursors, MAX_CLASSES};
    use crate::codec::context::gaps::SLOTS;
    use std::arch::x86_64::*;

    /// [`super::class_gaps`] with one-instruction bit counts.
    #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
    pub(super) fn class_gaps_wide(
        width: usize,
        rel: &[u32],
        after: &[u8],
        map: &ClassMap,
        classes: &[u8],
        by_class: &mut [Vec<u32>],
    ) {
        super::class_gaps_with(Build::Wide, width, rel, after, map, classes, by_class)
    }

    /// [`super::class_gaps`] with the counts of all classes in one vector popcount.
    #[target_feature(
        enable = "avx2,bmi1,bmi2,lzcnt,popcnt,avx512f,avx512bw,avx512cd,avx512vbmi2,avx512vpopcntdq"
    )]
    pub(super) fn class_gaps_avx512(
        width: usize,
        rel: &[u32],
        after: &[u8],
        map: &ClassMap,
        classes: &[u8],
        by_class: &mut [Vec<u32>],
    ) {
        super::class_gaps_with(Build::Avx512, width, rel, after, map, classes, by_class)
    }

    /// [`super::place_changes`] with one-instruction bit counts.
    #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
    pub(super) fn place_changes_wide(
        width: usize,
        held: &[u8],
        map: &ClassMap,
        cursors: &mut Cursors<'_>,
        out: &mut Vec<u32>,
    ) {
        super::place_changes_with(Build::Wide, width, held, map, cursors, out)
    }

    /// [`super::place_changes`] with the counts of all classes in one vector popcount.
    #[target_feature(
        enable = "avx2,bmi1,bmi2,lzcnt,popcnt,avx512f,avx512bw,avx512cd,avx512vbmi2,avx512vpopcntdq"
    )]
    pub(super) fn place_changes_avx512(
        width: usize,
        held: &[u8],
        map: &ClassMap,
        cursors: &mut Cursors<'_>,
        out: &mut Vec<u32>,
    ) {
        super::place_changes_with(Build::Avx512, width, held, map, cursors, out)
    }

    /// Lane `c` of `FLIP[j]`: all ones where bit `j` of `c` is clear (the lanes that take
    /// plane `j`'s complement).
    const FLIP: [[i64; MAX_CLASSES]; 3] = [
        [-1, 0, -1, 0, -1, 0, -1, 0],
        [-1, -1, 0, 0, -1, -1, 0, 0],
        [-1, -1, -1, -1, 0, 0, 0, 0],
    ];

    /// The members of each class of a block, one class per lane: each plane broadcast, its
    /// complement taken in the lanes whose class has that bit clear, the three ANDed.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn members_512(p: &Block) -> __m512i {
        // SAFETY: each `FLIP` row is 8 i64s, one unaligned 64-byte vector.
        let (f0, f1, f2) = unsafe {
            (
                _mm512_loadu_si512(FLIP[0].as_ptr().cast()),
                _mm512_loadu_si512(FLIP[1].as_ptr().cast()),
                _mm512_loadu_si512(FLIP[2].as_ptr().cast()),
            )
        };
        let a = _mm512_xor_si512(_mm512_set1_epi64(p[0] as i64), f0);
        let b = _mm512_xor_si512(_mm512_set1_epi64(p[1] as i64), f1);
        let c = _mm512_xor_si512(_mm512_set1_epi64(p[2] as i64), f2);
        // 0x80: a AND b AND c.
        let abc = _mm512_ternarylogic_epi64::<0x80>(a, b, c);
        _mm512_and_si512(abc, _mm512_set1_epi64(p[3] as i64))
    }

    /// [`super::select`] in two instructions: the `g`-th set bit deposited, then found.
    #[inline]
    #[target_feature(enable = "bmi1,bmi2")]
    pub(super) fn select_bmi2(v: u64, g: u32) -> u32 {
        _pdep_u64(1 << g, v).trailing_zeros()
    }

    /// Adds the members of each class in a block to `seen`.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vpopcntdq")]
    pub(super) fn add_counts(p: &Block, seen: &mut [u64; MAX_CLASSES]) {
        let counts = _mm512_popcnt_epi64(members_512(p));
        // SAFETY: `seen` is 8 u64s, one unaligned 64-byte vector.
        unsafe {
            let s = _mm512_loadu_si512(seen.as_ptr().cast());
            _mm512_storeu_si512(seen.as_mut_ptr().cast(), _mm512_add_epi64(s, counts));
        }
    }

    /// The planes of every whole block of 2-byte elements; returns how many blocks it did
    /// (the rest, a partial block, is the caller's).
    ///
    /// # Safety
    ///
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn planes_bf16(held: &[u8], map: &ClassMap, out: &mut [Block]) -> usize {
        let whole = held.len() / 128;
        let mut lut = [0i8; 32];
        for (s, &c) in map.lut.iter().enumerate() {
            lut[s] = c as i8;
            lut[s + SLOTS] = c as i8;
        }
        // SAFETY (every load below): block `b < whole` spans bytes 128·b .. 128·b + 128 of
        // `held`, inside it; the loads are unaligned.
        let lut = _mm256_loadu_si256(lut.as_ptr().cast());
        let base = _mm256_set1_epi8(map.base as i8);
        let top = _mm256_set1_epi8((SLOTS - 1) as i8);
        let low8 = _mm256_set1_epi16(0xFF);
        let ptr = held.as_ptr();
        for (b, p) in out.iter_mut().enumerate().take(whole) {
            let mut w = [0u64; 4];
            for half in 0..2 {
                let at = ptr.add(b * 128 + half * 64);
                let a0 = _mm256_loadu_si256(at.cast());
                let a1 = _mm256_loadu_si256(at.add(32).cast());
                // The exponent byte of each element, in element order.
                let e0 = _mm256_and_si256(_mm256_srli_epi16::<7>(a0), low8);
                let e1 = _mm256_and_si256(_mm256_srli_epi16::<7>(a1), low8);
                let e = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi16(e0, e1));
                let slot = _mm256_min_epu8(_mm256_subs_epu8(e, base), top);
                let class = _mm256_shuffle_epi8(lut, slot);
                let shift = 32 * half as u32;
                w[0] |=
                    (_mm256_movemask_epi8(_mm256_slli_epi16::<7>(class)) as u32 as u64) << shift;
                w[1] |=
                    (_mm256_movemask_epi8(_mm256_slli_epi16::<6>(class)) as u32 as u64) << shift;
                w[2] |=
                    (_mm256_movemask_epi8(_mm256_slli_epi16::<5>(class)) as u32 as u64) << shift;
            }
            w[3] = u64::MAX;
            *p = w;
        }
        whole
    }
}
