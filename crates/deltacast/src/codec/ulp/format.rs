//! The `ulp` section's format: blocks of [`BLOCK`] values behind a directory of 4-byte
//! entries (bit count, `k`, cap `c`), the code number of each step in the ordered view, and
//! the code word of a code number under a block's `(k, c)`. The encoder and the decoders
//! share these definitions; docs/codecs.md specifies them byte by byte.

use crate::codec::bits::{bit_len, mask, BlockWriter};
use crate::dtype::to_ordered;

/// Values per block: the 4-byte directory entry costs 1/32 bit per value.
pub(crate) const BLOCK: usize = 1024;
pub(super) const DIR_ENTRY: usize = 4;

// The smallest code of a block is never above all-raw (`c = 0`), so its bit count fits u16.
const _: () = assert!(BLOCK as u64 * 32 <= u16::MAX as u64);

/// A lower bound on the encoded size of `count` values (directory plus one bit per value),
/// so the chooser can skip encoding when raw is already at least as small.
pub(crate) fn min_len(count: usize) -> u64 {
    (count.div_ceil(BLOCK) * DIR_ENTRY) as u64 + (count as u64).div_ceil(8)
}

/// Bits of a `W`-byte element.
pub(super) const fn nbits<const W: usize>() -> u32 {
    8 * W as u32
}

/// The encoder's code number for an unchanged element: `2^nb − 2`, never a real code number
/// (it would duplicate −2^(nb−1)).
pub(super) const fn unchanged<const W: usize>() -> u32 {
    (mask(nbits::<W>()) - 1) as u32
}

/// A `W`-byte little-endian element (a form the compiler vectorizes, unlike an indexed load).
#[inline(always)]
pub(super) fn le<const W: usize>(bytes: &[u8; W]) -> u32 {
    let mut word = [0; 4];
    word[..W].copy_from_slice(bytes);
    u32::from_le_bytes(word)
}

/// `bits` as a `W`-byte little-endian element.
#[inline(always)]
pub(super) fn to_le<const W: usize>(bits: u32) -> [u8; W] {
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
pub(super) fn ord16<const W: usize>(x: u16) -> u16 {
    let all = mask(nbits::<W>()) as u16;
    let sign = 1 << (nbits::<W>() - 1);
    x ^ ((top16::<W>(x) & all) | sign)
}

/// [`from_ordered`] of a narrow element in 16-bit arithmetic.
///
/// [`from_ordered`]: crate::dtype::from_ordered
#[inline(always)]
pub(super) fn unord16<const W: usize>(o: u16) -> u16 {
    let all = mask(nbits::<W>()) as u16;
    let sign = 1 << (nbits::<W>() - 1);
    o ^ ((!top16::<W>(o) & all) | sign)
}

/// Code number of the step old → new, [`unchanged`] when they are equal.
#[inline(always)]
pub(super) fn step_code<const W: usize>(old: u32, new: u32) -> u32 {
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
pub(super) fn step_of(u: u32) -> u32 {
    let negative = u & 1;
    let magnitude = (u >> 1) + 1;
    (magnitude ^ negative.wrapping_neg()).wrapping_add(negative)
}

/// Whether `u` is a valid code number for `nb`-bit elements (`2^nb − 2` and anything above
/// `2^nb − 1` are not).
#[inline(always)]
pub(super) fn valid_code(u: u64, nb: u32) -> bool {
    let limit = mask(nb) - 1;
    u < limit || u == limit + 1
}

/// A code word: `zeros` zero bits, then the low `len` bits of `tail` (`len <= 33`).
#[derive(Clone, Copy)]
pub(super) struct Word {
    pub(super) zeros: u32,
    pub(super) tail: u64,
    pub(super) len: u32,
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
pub(super) fn code_word<const W: usize>(u: u32, new_bits: u32, k: u32, c: u32) -> Word {
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
pub(super) fn put_word<const W: usize>(out: &mut BlockWriter<'_>, word: Word) {
    let total = word.zeros + word.len;
    if W <= 2 || total <= 56 {
        out.put(word.tail << word.zeros, total);
    } else {
        out.zeros(word.zeros);
        out.put(word.tail, word.len);
    }
}

/// `(bit count, k, c)` of one directory entry.
#[inline]
pub(super) fn read_entry(entry: &[u8]) -> (u32, u32, u32) {
    (
        u16::from_le_bytes([entry[0], entry[1]]) as u32,
        entry[2] as u32,
        entry[3] as u32,
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::from_ordered;
    use crate::testutil::Rng;

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
}
