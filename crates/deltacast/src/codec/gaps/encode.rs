//! The `gaps` encoder: the gaps of each block, the exact best Rice parameter for them (from
//! a histogram of their bit lengths), the directory alone for the chooser to size a section
//! (of listed positions, or of a bitmap's holes), and the writers of the code words.

use super::format::{escape_width, read_entry, rice_word, BLOCK, DIR_ENTRY, ESC, MAX_K};
#[cfg(target_arch = "x86_64")]
use super::x86::{write_lanes, LANES_K};
use crate::codec::bitmap::{set_bits, SET_BITS_SLACK};
#[cfg(target_arch = "x86_64")]
use crate::codec::bits::Lanes;
use crate::codec::bits::{bit_len, mask, BitWriter, BlockWriter};
use std::sync::OnceLock;

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
/// can make them 8 lanes wide or more (AVX2: docs/data/codecs/README.md, "Figures behind the
/// code"); slower with 4 lanes.
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

/// The encoder's entry points compiled for AVX2, where the passes over a block's gaps (the
/// gaps themselves, the length histogram, the exact sizes) run 8 lanes wide: same results.
#[cfg(target_arch = "x86_64")]
pub(super) mod avx2 {
    #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
    pub(in super::super) fn encode(rel: &[u32], range: u32, out: &mut Vec<u8>) {
        super::encode_impl::<true>(rel, range, out)
    }

    #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
    pub(super) fn directory(rel: &[u32], range: u32) -> (Vec<u8>, u64) {
        super::directory_impl::<true>(rel, range)
    }

    #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
    pub(super) fn holes_directory(changed: &[u8], range: u32) -> (Vec<u8>, u64) {
        super::holes_directory_impl::<true>(changed, range)
    }
}

#[inline(always)]
pub(super) fn encode_impl<const VECTOR: bool>(rel: &[u32], range: u32, out: &mut Vec<u8>) {
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
    let (use_lanes, mut lanes) = (VECTOR && crate::codec::bits::x86_wide(), Lanes::new());
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
    if crate::codec::bits::x86_wide() {
        // SAFETY: as in `encode`.
        return unsafe { avx2::directory(rel, range) };
    }
    directory_impl::<false>(rel, range)
}

#[inline(always)]
pub(super) fn directory_impl<const VECTOR: bool>(rel: &[u32], range: u32) -> (Vec<u8>, u64) {
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
    if crate::codec::bits::x86_wide() {
        // SAFETY: as in `encode`.
        return unsafe { avx2::holes_directory(changed, range) };
    }
    holes_directory_impl::<false>(changed, range)
}

#[inline(always)]
pub(super) fn holes_directory_impl<const VECTOR: bool>(
    changed: &[u8],
    range: u32,
) -> (Vec<u8>, u64) {
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
///
/// [`encode`]: fn@super::encode
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
/// small gaps' code words (`table` keeps a copy for the last `k`: the loop measured faster
/// reading a local table, docs/data/codecs/README.md); otherwise a plain code word is at most
/// ESC + k bits, so up to 56 / (ESC + k) of them share one store.
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

#[cfg(test)]
mod tests {
    use super::super::decode::decode_impl;
    use super::super::reference::bitmap_of;
    use super::super::{decode, encode};
    use super::*;
    use crate::testutil::{bernoulli_positions, Rng};

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

    /// The portable build and the one this CPU runs (AVX2 where it has it) give the same
    /// bytes; the other tests check the latter against the reference encoder.
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
}
