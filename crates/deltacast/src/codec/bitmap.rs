//! `bitmap` positions: one bit per element of the range, `ceil(range / 8)` bytes, bit `i`
//! (least significant bit first within each byte) set when element `i` changed.
//!
//! Costs a fixed `range / 8` bytes whatever the count, so it wins once changes are dense
//! (around a third of the range and up) where even ideal gap codes approach 1 bit per element.
//!
//! Speed (x86-64 with AVX-512 where the CPU has it, portable otherwise, same results): the
//! encoder stores a flag byte per position in a window and packs 64 flags to a word by one
//! byte mask; the decoder lists the positions of each 16 bits by one register compress.

use crate::error::CodecError;

pub fn encode(rel: &[u32], range: u32, out: &mut Vec<u8>) {
    let start = out.len();
    let len = range.div_ceil(8) as usize;
    #[cfg(target_arch = "x86_64")]
    if (rel.len() as u64) * DENSE_BELOW >= range as u64 {
        type Wide = unsafe fn(&[u32], &mut [std::mem::MaybeUninit<u8>]);
        let wide: Option<Wide> = if super::bits::x86_avx512() {
            Some(encode_dense_avx512)
        } else if super::bits::x86_wide() {
            Some(encode_dense_avx2)
        } else {
            None
        };
        if let Some(wide) = wide {
            // It writes every byte of the section: none is zeroed first (a memset of the
            // whole section was a measurable share of this encoder: docs/data/codecs/
            // README.md, "Figures behind the code").
            out.reserve(len);
            // SAFETY: the function's only requirement is its target features, detected just
            // above on this CPU; the `len` bytes past `start` are spare capacity (reserved).
            unsafe { wide(rel, &mut out.spare_capacity_mut()[..len]) };
            // SAFETY: the wide encoders write all `len` bytes.
            unsafe { out.set_len(start + len) };
            return;
        }
    }
    out.resize(start + len, 0);
    let map = &mut out[start..];
    if (rel.len() as u64) * DENSE_BELOW < range as u64 {
        encode_sparse(rel, map);
    } else {
        encode_dense(rel, map);
    }
}

/// [`encode_dense`] with vector packing: each window's end found as its flags are stored
/// (positions sixteen at a time while the last is still in the window: no search over
/// positions the stores have not read yet), and its flags packed 64 to a bitmap word by
/// `pack` (the flags' high bits, which it also clears). Writes every byte of `map` (so it may
/// be spare capacity). Same bytes. Inlined into each target-feature build below.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn encode_dense_packed(
    rel: &[u32],
    map: &mut [std::mem::MaybeUninit<u8>],
    pack: impl Fn(&mut [u8; 64]) -> u64,
) {
    use std::mem::MaybeUninit;
    let mut flags = [0u8; WINDOW];
    let mut i = 0;
    for (window, bytes) in map.chunks_mut(WINDOW / 8).enumerate() {
        let end = (window * WINDOW + bytes.len() * 8).min(u32::MAX as usize) as u32;
        // Positions at or past `end` belong to later windows; any below it (all of them
        // from this window when `rel` is sorted) are flagged here.
        // Sixteen at a time while the sixteenth is in the window (one check and one loop
        // branch per sixteen stores: faster than four at a time on dense chunks, see
        // docs/data/codecs/README.md, "Figures behind the code"), then four, then one.
        flag_runs::<16>(rel, &mut i, end, &mut flags);
        flag_runs::<4>(rel, &mut i, end, &mut flags);
        flag_runs::<1>(rel, &mut i, end, &mut flags);
        let (words, tail) = bytes.as_chunks_mut::<8>();
        let (sixty_fours, _) = flags.as_chunks_mut::<64>();
        for (word, sixty_four) in words.iter_mut().zip(sixty_fours.iter_mut()) {
            *word = pack(sixty_four).to_le_bytes().map(MaybeUninit::new);
        }
        if !tail.is_empty() {
            let at = words.len() * 64;
            let last = &mut flags[at..at + 64];
            let mut m = 0u64;
            for (bit, flag) in last.iter_mut().enumerate() {
                m |= ((*flag >> 7) as u64) << bit;
                *flag = 0;
            }
            for (b, x) in tail.iter_mut().zip(m.to_le_bytes()) {
                *b = MaybeUninit::new(x);
            }
        }
    }
}

/// [`encode_dense_packed`] for AVX-512BW: 64 flags packed by one byte mask of a register.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512bw")]
fn encode_dense_avx512(rel: &[u32], map: &mut [std::mem::MaybeUninit<u8>]) {
    use std::arch::x86_64::{
        _mm512_loadu_si512, _mm512_movepi8_mask, _mm512_setzero_si512, _mm512_storeu_si512,
    };
    encode_dense_packed(rel, map, |sixty_four| {
        // SAFETY: 64-byte unaligned load and store of a 64-byte array; this function's
        // target features.
        unsafe {
            let v = _mm512_loadu_si512(sixty_four.as_ptr() as *const _);
            _mm512_storeu_si512(sixty_four.as_mut_ptr() as *mut _, _mm512_setzero_si512());
            _mm512_movepi8_mask(v)
        }
    })
}

/// [`encode_dense_packed`] for AVX2: 64 flags packed by two byte masks of 32.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn encode_dense_avx2(rel: &[u32], map: &mut [std::mem::MaybeUninit<u8>]) {
    use std::arch::x86_64::{
        __m256i, _mm256_loadu_si256, _mm256_movemask_epi8, _mm256_setzero_si256,
        _mm256_storeu_si256,
    };
    encode_dense_packed(rel, map, |sixty_four| {
        let p = sixty_four.as_mut_ptr() as *mut __m256i;
        // SAFETY: two 32-byte unaligned loads and stores inside a 64-byte array; this
        // function's target features.
        unsafe {
            let (lo, hi) = (_mm256_loadu_si256(p), _mm256_loadu_si256(p.add(1)));
            _mm256_storeu_si256(p, _mm256_setzero_si256());
            _mm256_storeu_si256(p.add(1), _mm256_setzero_si256());
            (_mm256_movemask_epi8(lo) as u32 as u64)
                | (_mm256_movemask_epi8(hi) as u32 as u64) << 32
        }
    })
}

/// Flags `rel[*i..]` in `flags`, `N` positions at a time while the `N`th is below `end`.
#[inline(always)]
fn flag_runs<const N: usize>(rel: &[u32], i: &mut usize, end: u32, flags: &mut [u8; WINDOW]) {
    while let Some(run) = rel.get(*i..*i + N).and_then(|r| r.first_chunk::<N>()) {
        if run[N - 1] >= end {
            break;
        }
        for &p in run {
            flags[p as usize % WINDOW] = FLAG;
        }
        *i += N;
    }
}

/// Below one change in this many elements the bits are or-ed in one at a time; above it
/// [`encode_dense`]'s passes over the whole range cost less.
const DENSE_BELOW: u64 = 8;

/// One read-modify-write of the position's byte per position. At high density the or-s to
/// one byte wait on each other through memory (docs/data/codecs/README.md, "Figures behind
/// the code").
fn encode_sparse(rel: &[u32], map: &mut [u8]) {
    for &p in rel {
        map[(p / 8) as usize] |= 1 << (p % 8);
    }
}

/// Elements per window of [`encode_dense`]: its flag bytes stay in the L1 cache.
const WINDOW: usize = 1 << 13;

/// A window of the range at a time: one flag byte stored per position (independent stores,
/// no read), then the flags packed eight to a bitmap byte and cleared.
fn encode_dense(rel: &[u32], map: &mut [u8]) {
    let mut flags = [0u8; WINDOW];
    let mut rest = rel;
    for window in 0..map.len().div_ceil(WINDOW / 8) {
        let end = ((window as u64 + 1) * WINDOW as u64).min(u32::MAX as u64) as u32;
        // A window holds at most `WINDOW` positions: the search for its end reads only
        // lines that are read next anyway (over all the rest of the positions, its loads
        // missed the cache, a large share of this encoder on dense chunks:
        // docs/data/codecs/README.md, "Figures behind the code").
        let n = rest[..rest.len().min(WINDOW)].partition_point(|&p| p < end);
        let (here, later) = rest.split_at(n);
        rest = later;
        for &p in here {
            // Every position here is in this window: the mask only drops the bounds check.
            flags[p as usize % WINDOW] = FLAG;
        }
        pack_window(&mut flags, map, window);
    }
}

/// Packs `flags` into window `window`'s bytes of `map` and clears them.
#[inline(always)]
fn pack_window(flags: &mut [u8; WINDOW], map: &mut [u8], window: usize) {
    let start = (window * (WINDOW / 8)).min(map.len());
    let end = (start + WINDOW / 8).min(map.len());
    let bytes = &mut map[start..end];
    let (pairs, odd) = bytes.as_chunks_mut::<2>();
    let (sixteens, _) = flags.as_chunks_mut::<16>();
    for (pair, sixteen) in pairs.iter_mut().zip(sixteens.iter_mut()) {
        let lo = u64::from_le_bytes(sixteen[..8].try_into().unwrap_or_default());
        let hi = u64::from_le_bytes(sixteen[8..].try_into().unwrap_or_default());
        *pair = pack16(lo, hi).to_le_bytes();
        *sixteen = [0; 16];
    }
    if let Some(byte) = odd.first_mut() {
        let at = pairs.len() * 16;
        let eight = &mut flags[at..at + 8];
        *byte = pack8(u64::from_le_bytes(eight.try_into().unwrap_or_default()));
        eight.fill(0);
    }
}

/// A position's flag in [`encode_dense`]'s window: the low bit for [`pack8`], the high bit
/// for SSE2's byte mask.
const FLAG: u8 = 0x81;

/// Sixteen flags (the little-endian bytes of `lo`, then `hi`) as two bitmap bytes.
#[inline(always)]
fn pack16(lo: u64, hi: u64) -> u16 {
    #[cfg(target_arch = "x86_64")]
    {
        // One byte mask of the flags' high bits.
        use std::arch::x86_64::{_mm_movemask_epi8, _mm_set_epi64x};
        // SAFETY: both only need SSE2, which every x86_64 CPU has (it is part of the
        // target's baseline); neither touches memory.
        unsafe { _mm_movemask_epi8(_mm_set_epi64x(hi as i64, lo as i64)) as u16 }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        pack8(lo) as u16 | (pack8(hi) as u16) << 8
    }
}

/// The low bits of eight bytes, each 0 or 1, as the bits of one byte (byte `i` to bit `i`):
/// the multiply moves byte `i`'s bit from `8 i` to `56 + i`, and no two of its partial
/// products meet (so nothing carries).
#[inline(always)]
fn pack8(bytes: u64) -> u8 {
    ((bytes & 0x0101_0101_0101_0101).wrapping_mul(0x0102_0408_1020_4080) >> 56) as u8
}

pub fn decode(input: &[u8], count: u32, range: u32, out: &mut Vec<u32>) -> Result<(), CodecError> {
    out.clear();
    let needed = range.div_ceil(8) as u64;
    crate::codec::exact_len(input, needed, count as u64)?;
    let used = range % 8;
    if let (true, Some(&last)) = (used != 0, input.last()) {
        let stray = last >> used;
        if stray != 0 {
            let position = (needed - 1) * 8 + (used + stray.trailing_zeros()) as u64;
            return Err(CodecError::PositionOutOfRange {
                position,
                range: range as u64,
            });
        }
    }
    // Count first, so a wrong count fails before anything is allocated.
    let words = input.chunks_exact(8);
    let rest = words.remainder();
    let found: u64 = words.map(|w| word(w).count_ones() as u64).sum::<u64>()
        + rest.iter().map(|b| b.count_ones() as u64).sum::<u64>();
    if found != count as u64 {
        return Err(CodecError::BitmapCount {
            found,
            expected: count as u64,
        });
    }
    list(input, count as usize, out);
    debug_assert_eq!(out.len(), count as usize);
    Ok(())
}

/// Lists the positions of the set bits of `map`, of which there are `count`, in order into
/// `out` (empty).
pub(super) fn list(map: &[u8], count: usize, out: &mut Vec<u32>) {
    // The vector listing costs the same per 16 bits whatever the count: not for bitmaps
    // with under one set bit per 64 (never chosen by the encoder), where the portable one
    // skips empty words.
    #[cfg(target_arch = "x86_64")]
    if count as u64 * 64 >= map.len() as u64 * 8 && super::bits::x86_avx512() {
        // SAFETY: `detected` checked the function's target features on this CPU.
        return unsafe { avx512::list(map, count, out) };
    }
    list_portable(map, count, out)
}

/// [`list`] a word at a time with [`set_bits`].
fn list_portable(map: &[u8], count: usize, out: &mut Vec<u32>) {
    // Room for the 8 entries past the last position that `set_bits` may write.
    out.resize(count + SET_BITS_SLACK, 0);
    let mut n = 0;
    for (i, chunk) in map.chunks(8).enumerate() {
        n = set_bits(word(chunk), (i * 64) as u32, out, n);
    }
    out.truncate(n);
}

/// [`list`] with AVX-512 VBMI2: each 16 bits of the bitmap select their positions from a
/// vector of 16 consecutive ones (one register compress), stored 16 entries at a time
/// whatever the count, the cursor then advanced by the count: no branch per bit or byte,
/// and the entries written straight into the vector's spare room (no zeroing first).
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// # Safety
    ///
    /// The CPU must have the features [`crate::codec::bits::x86_avx512`] checks.
    #[target_feature(enable = "avx512f,avx512vbmi2,popcnt")]
    pub(super) fn list(map: &[u8], count: usize, out: &mut Vec<u32>) {
        out.clear();
        out.reserve(count + 16);
        let room = out.capacity();
        // Every store writes 16 entries from the cursor, clamped to `last` so that they stay
        // in the allocation whatever the bits (with `count` right, no clamp happens). Each
        // store starts where the entries written so far end (or before, once clamped), so
        // the first `min(n, room)` entries are always written.
        let last = room - 16;
        let ptr = out.as_mut_ptr();
        let mut n = 0usize;
        let mut base = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
        let sixteen = _mm512_set1_epi32(16);
        let (pairs, odd) = map.as_chunks::<2>();
        for pair in pairs {
            let m = u16::from_le_bytes(*pair);
            let v = _mm512_maskz_compress_epi32(m, base);
            // SAFETY: `n.min(last) + 16 <= room`: the 16 entries stored are in the
            // allocation. Unaligned stores need no alignment.
            unsafe { _mm512_storeu_si512(ptr.add(n.min(last)) as *mut _, v) };
            n += m.count_ones() as usize;
            base = _mm512_add_epi32(base, sixteen);
        }
        if let Some(&m) = odd.first() {
            let v = _mm512_maskz_compress_epi32(m as u16, base);
            // SAFETY: as above.
            unsafe { _mm512_storeu_si512(ptr.add(n.min(last)) as *mut _, v) };
            n += m.count_ones() as usize;
        }
        // SAFETY: the first `min(n, room)` entries are written (above) and within capacity.
        unsafe { out.set_len(n.min(room)) };
        // Only with a wrong count: never leave more entries than it.
        out.truncate(count);
    }
}

/// Entries past the last written one that [`set_bits`] may overwrite.
pub(crate) const SET_BITS_SLACK: usize = 8;

/// The positions of the set bits of each byte value, in order, padded with zeros.
const BIT_POSITIONS: [[u8; 8]; 256] = {
    let mut table = [[0u8; 8]; 256];
    let mut byte = 0;
    while byte < 256 {
        let (mut n, mut bit) = (0, 0);
        while bit < 8 {
            if byte >> bit & 1 == 1 {
                table[byte][n] = bit as u8;
                n += 1;
            }
            bit += 1;
        }
        byte += 1;
    }
    table
};

/// Writes `base + i` for each set bit `i` of `word`, in order, to `out[n..]` and returns the
/// index after the last. `out` must have room for [`SET_BITS_SLACK`] entries past that index.
///
/// A byte at a time from a table of the set bits' positions, always writing 8 entries and
/// moving on by the byte's count: no branch per bit, whose exit mispredicts on the
/// unpredictable bits of a dense bitmap (a loop of `trailing_zeros` per set bit measured
/// slower on dense bitmaps, see docs/data/codecs/README.md, "Figures behind the code"; it is
/// kept for words with few bits set).
#[inline(always)]
pub(crate) fn set_bits(mut word: u64, base: u32, out: &mut [u32], mut n: usize) -> usize {
    // Without POPCNT the count below takes a dozen instructions: not for the empty words
    // of a sparse bitmap.
    if word == 0 {
        return n;
    }
    if word.count_ones() <= 8 {
        // Sparse words (the branch follows the density, so it predicts well): a bit at a
        // time costs less than eight bytes.
        while word != 0 {
            out[n] = base + word.trailing_zeros();
            n += 1;
            word &= word - 1;
        }
        return n;
    }
    for (j, byte) in word.to_le_bytes().into_iter().enumerate() {
        let at = base + 8 * j as u32;
        for (slot, &bit) in out[n..n + 8].iter_mut().zip(&BIT_POSITIONS[byte as usize]) {
            *slot = at + bit as u32;
        }
        n += byte.count_ones() as usize;
    }
    n
}

/// Up to 8 bytes as a little-endian word (missing high bytes read as zero).
#[inline(always)]
fn word(bytes: &[u8]) -> u64 {
    match bytes.first_chunk::<8>() {
        Some(full) => u64::from_le_bytes(*full),
        None => {
            let mut padded = [0u8; 8];
            padded[..bytes.len()].copy_from_slice(bytes);
            u64::from_le_bytes(padded)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{bernoulli_positions, Rng};
    use proptest::prelude::*;

    /// Independent oracle: the bitmap written bit by bit from the definition.
    fn reference(rel: &[u32], range: u32) -> Vec<u8> {
        (0..range.div_ceil(8))
            .map(|byte| {
                (0..8)
                    .filter(|bit| rel.binary_search(&(byte * 8 + bit)).is_ok())
                    .fold(0u8, |acc, bit| acc | 1 << bit)
            })
            .collect()
    }

    fn round_trip(rel: &[u32], range: u32) -> Vec<u8> {
        let mut enc = vec![];
        encode(rel, range, &mut enc);
        assert_eq!(enc.len(), range.div_ceil(8) as usize);
        let mut dec = vec![3];
        decode(&enc, rel.len() as u32, range, &mut dec).unwrap();
        assert_eq!(dec, rel);
        enc
    }

    #[test]
    fn round_trips_at_every_density() {
        let mut rng = Rng(11);
        for range in [1u32, 2, 7, 8, 9, 63, 64, 65, 1000, 4097] {
            for density in [0.0, 0.001, 0.01, 0.1, 0.5, 1.0] {
                let rel = bernoulli_positions(&mut rng, range, density);
                assert_eq!(round_trip(&rel, range), reference(&rel, range));
            }
            round_trip(&[0], range);
            round_trip(&[range - 1], range);
        }
        let rel = bernoulli_positions(&mut rng, 1 << 20, 0.3);
        round_trip(&rel, 1 << 20);
    }

    /// Both encoders against the bit-by-bit oracle on either side of the switch between
    /// them, over several windows and odd ranges; `pack8` on every byte.
    #[test]
    fn sparse_and_dense_encoders_agree() {
        for byte in 0..=255u8 {
            let spread = (0..8).fold(0u64, |x, i| x | ((byte >> i & 1) as u64) << (8 * i));
            assert_eq!(pack8(spread), byte);
        }
        let mut rng = Rng(13);
        for range in [1u32, 7, 64, 65, 8191, 8192, 8193, 3 * 8192 + 77, 100_003] {
            for density in [
                0.0, 0.01, 0.05, 0.0625, 0.07, 0.3, 0.5, 0.75, 0.9, 0.99, 1.0,
            ] {
                let rel = bernoulli_positions(&mut rng, range, density);
                let expected = reference(&rel, range);
                let mut sparse = vec![0; range.div_ceil(8) as usize];
                encode_sparse(&rel, &mut sparse);
                let mut dense = vec![0; range.div_ceil(8) as usize];
                encode_dense(&rel, &mut dense);
                assert_eq!(sparse, expected, "range {range} density {density}");
                assert_eq!(dense, expected, "range {range} density {density}");
                #[cfg(target_arch = "x86_64")]
                {
                    type Wide = fn(&[u32], &mut [std::mem::MaybeUninit<u8>]);
                    let mut wide_ones: Vec<(&str, Wide)> = vec![];
                    if crate::codec::bits::x86_avx512() {
                        // SAFETY: the features were detected just above.
                        wide_ones.push(("avx512", |r, m| unsafe { encode_dense_avx512(r, m) }));
                    }
                    if crate::codec::bits::x86_wide() {
                        // SAFETY: as above.
                        wide_ones.push(("avx2", |r, m| unsafe { encode_dense_avx2(r, m) }));
                    }
                    for (name, f) in wide_ones {
                        // It writes every byte, whatever the memory held.
                        let mut wide =
                            vec![std::mem::MaybeUninit::new(0x5a); range.div_ceil(8) as usize];
                        f(&rel, &mut wide);
                        // SAFETY: every byte was initialized (by the vector, then the encoder).
                        let wide: Vec<u8> =
                            wide.iter().map(|b| unsafe { b.assume_init() }).collect();
                        assert_eq!(wide, expected, "{name} range {range} density {density}");
                    }
                }
                // After bytes already in the output.
                let mut out = vec![0xa5];
                encode(&rel, range, &mut out);
                assert_eq!(out[1..], expected[..], "range {range} density {density}");
                // Into a reused vector whose spare capacity holds other bytes (the dense
                // AVX-512 path writes the section without zeroing it first).
                let mut reused = vec![0xffu8; 2 * range.div_ceil(8) as usize + 64];
                reused.truncate(3);
                encode(&rel, range, &mut reused);
                assert_eq!(reused[..3], [0xff; 3]);
                assert_eq!(reused[3..], expected[..], "range {range} density {density}");
            }
        }
    }

    #[test]
    fn set_bits_lists_every_set_bit_in_order() {
        let mut rng = Rng(12);
        let mut out = vec![7u32; 3 + 64 + SET_BITS_SLACK];
        for density in [0.0, 0.05, 0.13, 0.3, 0.5, 0.9, 1.0] {
            for _ in 0..200 {
                let word = (0..64).fold(0u64, |w, i| w | ((rng.unit() < density) as u64) << i);
                let base = rng.next_u64() as u32 >> 7;
                let expected: Vec<u32> = (0..64)
                    .filter(|i| word >> i & 1 == 1)
                    .map(|i| base + i)
                    .collect();
                let n = set_bits(word, base, &mut out, 3);
                assert_eq!(&out[3..n], &expected[..], "{word:#x}");
            }
        }
    }

    /// The AVX-512 listing (where the CPU has it) against the portable one, entry for entry:
    /// odd lengths (a lone last byte), empty, all set, every density; and with a wrong count
    /// (which `decode` never passes) it stays in bounds and lists no more than that.
    #[test]
    fn listings_agree() {
        let mut rng = Rng(14);
        for bytes in [0usize, 1, 2, 3, 7, 8, 9, 15, 16, 17, 63, 64, 65, 1001, 4096] {
            for density in [0.0, 0.01, 0.3, 0.5, 0.9, 1.0] {
                let map: Vec<u8> = (0..bytes)
                    .map(|_| (0..8).fold(0u8, |b, i| b | ((rng.unit() < density) as u8) << i))
                    .collect();
                let count = map.iter().map(|b| b.count_ones() as usize).sum::<usize>();
                let expected: Vec<u32> = (0..bytes as u32 * 8)
                    .filter(|&i| map[i as usize / 8] >> (i % 8) & 1 == 1)
                    .collect();
                let mut portable = vec![9; 5];
                list_portable(&map, count, &mut portable);
                assert_eq!(portable, expected, "{bytes} bytes, density {density}");
                let mut out = vec![9; 3];
                list(&map, count, &mut out);
                assert_eq!(out, expected, "{bytes} bytes, density {density}");
                #[cfg(target_arch = "x86_64")]
                if crate::codec::bits::x86_avx512() {
                    // The right count (whatever the density), and wrong ones.
                    for given in [count, 0, count / 2, count.saturating_sub(1)] {
                        let mut out = vec![5; 3];
                        // SAFETY: the features were detected just above.
                        unsafe { avx512::list(&map, given, &mut out) };
                        assert_eq!(out, expected[..given], "count {given} of {count}");
                    }
                }
            }
        }
    }

    #[test]
    fn rejects_bad_sections() {
        let rel = [0u32, 5, 9, 12];
        let mut enc = vec![];
        encode(&rel, 13, &mut enc);
        let mut out = vec![];
        assert!(decode(&enc[..1], 4, 13, &mut out).is_err());
        assert!(decode(&[enc.clone(), vec![0]].concat(), 4, 13, &mut out).is_err());
        assert_eq!(
            decode(&enc, 3, 13, &mut out),
            Err(CodecError::BitmapCount {
                found: 4,
                expected: 3
            })
        );
        let mut stray = enc.clone();
        stray[1] |= 1 << 6;
        assert_eq!(
            decode(&stray, 5, 13, &mut out),
            Err(CodecError::PositionOutOfRange {
                position: 14,
                range: 13
            })
        );
        assert!(decode(&[], 0, 0, &mut out).is_ok());
        assert!(matches!(
            decode(&[0xff; 8], u32::MAX, u32::MAX, &mut out),
            Err(CodecError::Truncated { .. })
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn prop_round_trip(range in 1u32..5000, raw in prop::collection::vec(any::<u32>(), 0..2000)) {
            let mut rel: Vec<u32> = raw.iter().map(|r| r % range).collect();
            rel.sort_unstable();
            rel.dedup();
            let mut enc = vec![];
            encode(&rel, range, &mut enc);
            prop_assert_eq!(&enc, &reference(&rel, range));
            let mut dec = vec![];
            decode(&enc, rel.len() as u32, range, &mut dec).unwrap();
            prop_assert_eq!(dec, rel);
        }

        #[test]
        fn prop_decoder_never_panics(input in prop::collection::vec(any::<u8>(), 0..300), range in 0u32..3000, count in any::<u32>()) {
            let count = count % (range + 1);
            let mut out = vec![];
            if decode(&input, count, range, &mut out).is_ok() {
                prop_assert_eq!(out.len(), count as usize);
                prop_assert!(out.windows(2).all(|w| w[0] < w[1]) && out.iter().all(|&p| p < range));
            }
        }

        #[test]
        fn prop_truncated_or_flipped(range in 1u32..3000, raw in prop::collection::vec(any::<u32>(), 1..500), at in any::<usize>(), bit in 0u8..8) {
            let mut rel: Vec<u32> = raw.iter().map(|r| r % range).collect();
            rel.sort_unstable();
            rel.dedup();
            let mut enc = vec![];
            encode(&rel, range, &mut enc);
            let mut out = vec![];
            prop_assert!(decode(&enc[..at % enc.len()], rel.len() as u32, range, &mut out).is_err());
            let i = at % enc.len();
            enc[i] ^= 1 << bit;
            // One flipped bit changes the popcount or sets a bit beyond the range.
            prop_assert!(decode(&enc, rel.len() as u32, range, &mut out).is_err());
        }
    }
}
