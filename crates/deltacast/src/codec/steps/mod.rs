//! `steps` positions (code 6) with `esc` values (code 3): one joint code for dense steps.
//!
//! The position section is a map of a 2-bit code per element of the chunk's range,
//! `ceil(range / 4)` bytes, element `i` at byte `i >> 2`, bits `2·(i & 3)` and `2·(i & 3) + 1`
//! (least significant first): `0` unchanged, `1` the ordered step `d = +1`, `2` the step
//! `d = −1`, `3` escaped. `d` is the `ulp` codec's step, `(ord(new) − ord(old)) mod 2^nb`. The
//! value section holds the new bits of the escaped elements only, raw, in position order.
//!
//! Why fixed-width codes: at 10–50 % density most changes are ±1 ULP, and a GPU thread finds
//! any element's code at a known byte and its escape by a prefix sum of code-3 counts, where
//! `bitmap` + `ulp` need a serial bit stream. It costs 2 bits per element of the range plus
//! the escapes' raw bits, so on size it wins only where the entropy codes spend more (the
//! chooser takes it only when strictly smaller: docs/codecs.md, "steps + esc").
//!
//! Encoders are canonical (`d = +1` is always code 1, `d = −1` always 2, anything else 3), so
//! every encoder writes the same bytes. Decoders check the map (its length, no code past the
//! range, its count) and the escapes' length; an escape equal to the held bits is left to the
//! receiver's no-op rule, which knows which held bits are real (a receiver holding part of a
//! chunk passes anything at the others).
//!
//! Speed (portable code, no branch on the data): the encoder computes a block's codes in lanes
//! of the element's width, then per change stores its map word (the word's codes so far kept
//! in a register) and its bits as the next escape, kept by advancing the count; the chooser
//! counts escapes the same way, stopping once the pair cannot win. The value decoder expands
//! the map two bytes at a time into the changes' codes by a table, then steps each old value;
//! positions are listed by the bitmap decoder from the map's nonzero codes.

#[cfg(test)]
mod tests;

use super::bitmap;
use crate::error::CodecError;

/// Code of a change whose ordered step is +1.
const UP: u64 = 1;
/// Code of a change whose ordered step is −1.
const DOWN: u64 = 2;
/// Code of a change whose new bits are in the value section.
const ESCAPED: u64 = 3;

/// Low bit of each 2-bit code of a word.
const LOW: u64 = 0x5555_5555_5555_5555;

/// Blocks of changes between the chooser's checks of the escape count against its limit.
const COUNT_BLOCK: usize = 1024;

/// Changes whose codes the encoder computes at a time.
const BLOCK: usize = 256;

/// Bytes of the map of a range of `range` elements.
pub fn map_len(range: u32) -> usize {
    (range as usize).div_ceil(4)
}

/// Whether elements of `width` bytes can be coded (1, 2 or 4).
pub fn supports(width: usize) -> bool {
    matches!(width, 1 | 2 | 4)
}

/// The low bit of every nonzero code of `w`.
#[inline(always)]
fn changed(w: u64) -> u64 {
    (w | w >> 1) & LOW
}

/// The low bit of every code 3 of `w`.
#[inline(always)]
fn escaped(w: u64) -> u64 {
    w & (w >> 1) & LOW
}

/// The map as little-endian words of 32 codes (the last one zero padded).
fn words(map: &[u8]) -> impl Iterator<Item = u64> + '_ {
    let (full, rest) = map.as_chunks::<8>();
    let last = (!rest.is_empty()).then(|| {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        u64::from_le_bytes(w)
    });
    full.iter().map(|w| u64::from_le_bytes(*w)).chain(last)
}

/// The even bits of `x` (the low bits of its 32 codes), packed into 32 bits in order.
#[inline(always)]
fn even_bits(x: u64) -> u32 {
    let x = x & LOW;
    let x = (x | x >> 1) & 0x3333_3333_3333_3333;
    let x = (x | x >> 2) & 0x0f0f_0f0f_0f0f_0f0f;
    let x = (x | x >> 4) & 0x00ff_00ff_00ff_00ff;
    let x = (x | x >> 8) & 0x0000_ffff_0000_ffff;
    (x | x >> 16) as u32
}

/// Per map byte: its nonzero codes in order, one per byte of the word (zero padded), and how
/// many there are.
const BYTE_CODES: [(u32, u8); 256] = {
    let mut table = [(0u32, 0u8); 256];
    let mut byte = 0;
    while byte < 256 {
        let (mut packed, mut n, mut j) = (0u32, 0u8, 0);
        while j < 4 {
            let code = (byte >> (2 * j)) & 3;
            if code != 0 {
                packed |= (code as u32) << (8 * n);
                n += 1;
            }
            j += 1;
        }
        table[byte] = (packed, n);
        byte += 1;
    }
    table
};

/// The changes of a checked map listed in order into `out`: the map turned into a bitmap of
/// its nonzero codes (half its size) and listed by the bitmap decoder's lister. `count` is the
/// map's number of changes (checked by the caller).
fn list_changes(map: &[u8], range: u32, count: usize, out: &mut Vec<u32>) {
    let mut changes = Vec::with_capacity(map.len().div_ceil(8) * 4);
    for w in words(map) {
        changes.extend_from_slice(&even_bits(changed(w)).to_le_bytes());
    }
    changes.truncate((range as usize).div_ceil(8));
    bitmap::list(&changes, count, out);
}

/// Checks the map's length and that no code past the range is set.
fn check_map(map: &[u8], range: u32) -> Result<(), CodecError> {
    let needed = map_len(range) as u64;
    crate::codec::exact_len(map, needed, range as u64)?;
    let used = range % 4;
    if let (true, Some(&last)) = (used != 0, map.last()) {
        let stray = last >> (2 * used);
        if stray != 0 {
            return Err(CodecError::PositionOutOfRange {
                position: (needed - 1) * 4 + (used + stray.trailing_zeros() / 2) as u64,
                range: range as u64,
            });
        }
    }
    Ok(())
}

/// Checks the map of a chunk of `range` elements ([`check_map`]) and counts its changes
/// (nonzero codes) and escapes (code 3), without allocating: what a receiver checks the
/// manifest's count and the value section's length against before decoding.
pub fn counts(map: &[u8], range: u32) -> Result<(u64, u64), CodecError> {
    check_map(map, range)?;
    Ok(words(map).fold((0, 0), |(c, e), w| {
        (
            c + changed(w).count_ones() as u64,
            e + escaped(w).count_ones() as u64,
        )
    }))
}

/// The bits of a little-endian element of `W` bytes.
#[inline(always)]
fn bits<const W: usize>(x: &[u8; W]) -> u32 {
    let mut b = [0u8; 4];
    b[..W].copy_from_slice(x);
    u32::from_le_bytes(b)
}

/// All ones in the element's `8·W` bits.
#[inline(always)]
const fn mask<const W: usize>() -> u32 {
    if W == 4 {
        u32::MAX
    } else {
        (1 << (8 * W)) - 1
    }
}

/// [`crate::dtype::to_ordered`] without a branch: sign clear → set it; sign set → invert all.
#[inline(always)]
fn ord<const W: usize>(x: u32) -> u32 {
    let top = 8 * W as u32 - 1;
    x ^ (((x >> top).wrapping_neg() & mask::<W>()) | 1 << top)
}

/// [`crate::dtype::from_ordered`] without a branch: top bit set → clear it; else invert all.
#[inline(always)]
fn unord<const W: usize>(o: u32) -> u32 {
    let top = 8 * W as u32 - 1;
    o ^ ((((o >> top) ^ 1).wrapping_neg() & mask::<W>()) | 1 << top)
}

/// The canonical codes of changes, computed in lanes of the element's own width (so the
/// loops vectorize 16, 8 or 4 to 128 bits), one module per width.
macro_rules! lanes {
    ($($name:ident: $t:ty, $w:literal;)*) => {$(
        mod $name {
            use super::{DOWN, ESCAPED, UP};

            const TOP: u32 = <$t>::BITS - 1;

            /// [`crate::dtype::to_ordered`] at the element's width.
            #[inline(always)]
            fn ord(x: $t) -> $t {
                x ^ ((x >> TOP).wrapping_neg() | 1 << TOP)
            }

            /// The step `d` from `a` to `b` (wrapping at the element's width).
            #[inline(always)]
            fn step(a: &[u8; $w], b: &[u8; $w]) -> $t {
                ord(<$t>::from_le_bytes(*b)).wrapping_sub(ord(<$t>::from_le_bytes(*a)))
            }

            /// The code of each change `old[i]` → `new[i]` into `out[i]`.
            pub(super) fn codes(old: &[[u8; $w]], new: &[[u8; $w]], out: &mut [u8]) {
                for ((c, a), b) in out.iter_mut().zip(old).zip(new) {
                    let d = step(a, b);
                    let (up, down) = ((d == 1) as u8, (d == <$t>::MAX) as u8);
                    *c = ESCAPED as u8 - up * (ESCAPED - UP) as u8 - down * (ESCAPED - DOWN) as u8;
                }
            }

            /// How many of the changes (at most 255) escape: `d` neither +1 nor −1, that is
            /// `d + 1` neither 2 nor 0.
            pub(super) fn escapes(old: &[[u8; $w]], new: &[[u8; $w]]) -> usize {
                debug_assert!(old.len() <= 255);
                old.iter()
                    .zip(new)
                    .map(|(a, b)| (step(a, b).wrapping_add(1) & !2 != 0) as u8)
                    .fold(0u8, |n, e| n.wrapping_add(e)) as usize
            }
        }
    )*};
}

lanes! {
    w1: u8, 1;
    w2: u16, 2;
    w4: u32, 4;
}

/// The width's code function for the generic loops.
type Codes<const W: usize> = fn(&[[u8; W]], &[[u8; W]], &mut [u8]);

/// Writes the map of the changes at `rel` (strictly increasing, each `< range`) into `map`
/// and their escapes into `esc` (both cleared first). `old` and `new` hold the changes' bits,
/// `width` bytes each (1, 2 or 4).
pub fn encode(
    width: usize,
    rel: &[u32],
    range: u32,
    old: &[u8],
    new: &[u8],
    map: &mut Vec<u8>,
    esc: &mut Vec<u8>,
) {
    match width {
        1 => encode_w::<1>(rel, range, old, new, map, esc, w1::codes),
        2 => encode_w::<2>(rel, range, old, new, map, esc, w2::codes),
        4 => encode_w::<4>(rel, range, old, new, map, esc, w4::codes),
        _ => panic!("steps: element width {width} is not 1, 2 or 4 bytes"),
    }
}

/// One pass over the changes, a block at a time, without a branch on the data: the block's
/// codes computed first (a loop the compiler vectorizes), then each change's code added to its
/// map word's codes so far (kept in a register, cleared when the word changes) and the word
/// stored, and its new bits stored as the next escape, kept by advancing the count.
fn encode_w<const W: usize>(
    rel: &[u32],
    range: u32,
    old: &[u8],
    new: &[u8],
    map: &mut Vec<u8>,
    esc: &mut Vec<u8>,
    codes_of: Codes<W>,
) {
    let (old, new) = (old.as_chunks::<W>().0, new.as_chunks::<W>().0);
    debug_assert!(rel.len() == old.len() && rel.len() == new.len());
    debug_assert!(rel.windows(2).all(|w| w[0] < w[1]));
    debug_assert!(rel.last().is_none_or(|&p| p < range));
    // Whole words while coding (cut to the map's length after: the codes past the range
    // are zero).
    map.clear();
    map.resize(map_len(range).div_ceil(8) * 8, 0);
    esc.clear();
    esc.resize(rel.len() * W, 0);
    let words = map.as_chunks_mut::<8>().0;
    let escapes = esc.as_chunks_mut::<W>().0;
    let mut kept = 0;
    let (mut at, mut acc) = (u32::MAX, 0u64);
    let mut codes = [0u8; BLOCK];
    for ((rel, old), new) in rel
        .chunks(BLOCK)
        .zip(old.chunks(BLOCK))
        .zip(new.chunks(BLOCK))
    {
        codes_of(old, new, &mut codes);
        for ((&p, &code), n) in rel.iter().zip(&codes).zip(new) {
            let word = p >> 5;
            acc &= ((word == at) as u64).wrapping_neg();
            acc |= (code as u64) << (2 * (p & 31));
            at = word;
            words[word as usize] = acc.to_le_bytes();
            // `kept` counts the escapes before this change: below `rel.len()`.
            escapes[kept] = *n;
            kept += (code as u64 == ESCAPED) as usize;
        }
    }
    map.truncate(map_len(range));
    esc.truncate(kept * W);
}

/// Appends the value section alone: the new bits of the changes that escape, in order.
pub fn encode_escapes(width: usize, old: &[u8], new: &[u8], out: &mut Vec<u8>) {
    fn go<const W: usize>(old: &[u8], new: &[u8], out: &mut Vec<u8>, codes_of: Codes<W>) {
        let (old, new) = (old.as_chunks::<W>().0, new.as_chunks::<W>().0);
        let mut codes = [0u8; BLOCK];
        for (old, new) in old.chunks(BLOCK).zip(new.chunks(BLOCK)) {
            codes_of(old, new, &mut codes);
            for (&c, n) in codes.iter().zip(new) {
                if c as u64 == ESCAPED {
                    out.extend_from_slice(n);
                }
            }
        }
    }
    match width {
        1 => go::<1>(old, new, out, w1::codes),
        2 => go::<2>(old, new, out, w2::codes),
        4 => go::<4>(old, new, out, w4::codes),
        _ => panic!("esc: element width {width} is not 1, 2 or 4 bytes"),
    }
}

/// The number of changes (`old` → `new`, `width` bytes each) that escape, or `None` as soon
/// as it exceeds `limit` (the chooser's bound: counting stops once the pair cannot win).
pub fn count_escapes(width: usize, old: &[u8], new: &[u8], limit: usize) -> Option<usize> {
    type Escapes<const W: usize> = fn(&[[u8; W]], &[[u8; W]]) -> usize;
    fn go<const W: usize>(old: &[u8], new: &[u8], limit: usize, f: Escapes<W>) -> Option<usize> {
        let (old, new) = (old.as_chunks::<W>().0, new.as_chunks::<W>().0);
        let mut n = 0;
        for (o, nw) in old.chunks(COUNT_BLOCK).zip(new.chunks(COUNT_BLOCK)) {
            n += o
                .chunks(255)
                .zip(nw.chunks(255))
                .map(|(a, b)| f(a, b))
                .sum::<usize>();
            if n > limit {
                return None;
            }
        }
        Some(n)
    }
    match width {
        1 => go::<1>(old, new, limit, w1::escapes),
        2 => go::<2>(old, new, limit, w2::escapes),
        4 => go::<4>(old, new, limit, w4::escapes),
        _ => None,
    }
}

/// Decodes the positions of the `count` changes of a map over `range` elements into `out`
/// (cleared first). Fails unless the map is exactly `ceil(range / 4)` bytes, sets no code
/// past the range and holds exactly `count` changes (counted before anything is allocated).
pub fn decode_positions(
    map: &[u8],
    count: u32,
    range: u32,
    out: &mut Vec<u32>,
) -> Result<(), CodecError> {
    out.clear();
    let (found, _) = counts(map, range)?;
    if found != count as u64 {
        return Err(count_mismatch(found, count as u64));
    }
    list_changes(map, range, count as usize, out);
    Ok(())
}

fn count_mismatch(found: u64, expected: u64) -> CodecError {
    CodecError::Malformed {
        codec: "steps",
        reason: format!("map holds {found} changes, expected {expected}"),
    }
}

/// Decodes the new bits of the changes of a map over `range` elements into `out` (cleared
/// first): `escaped` is the value section, `old` the held bits at the changes' positions
/// (one element of `width` bytes per change, in order). Fails unless the map is well formed,
/// holds `old.len() / width` changes, and `escaped` holds exactly its escapes.
pub fn decode_values(
    width: usize,
    map: &[u8],
    range: u32,
    escaped: &[u8],
    old: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    out.clear();
    match width {
        1 => decode_w::<1>(map, range, escaped, old, out),
        2 => decode_w::<2>(map, range, escaped, old, out),
        4 => decode_w::<4>(map, range, escaped, old, out),
        _ => Err(CodecError::Unsupported {
            codec: "esc",
            what: "elements of this width",
        }),
    }
}

fn decode_w<const W: usize>(
    map: &[u8],
    range: u32,
    escaped: &[u8],
    old: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    let (changes, escapes) = counts(map, range)?;
    let old = old.as_chunks::<W>().0;
    if changes != old.len() as u64 {
        return Err(count_mismatch(changes, old.len() as u64));
    }
    let needed = escapes * W as u64;
    crate::codec::exact_len(escaped, needed, escapes)?;
    let escaped = escaped.as_chunks::<W>().0;
    // The changes' codes first, in order, two map bytes at a time: their nonzero codes stored
    // eight at a time whatever their number, the cursor then moved on by it (no branch on the
    // data; the values need no positions). `old.len()` codes in all (counted above), so the
    // stores stay inside the slack.
    let mut codes = vec![0u8; old.len() + 8];
    let mut k = 0;
    let (pairs, odd) = map.as_chunks::<2>();
    for &[a, b] in pairs.iter().chain(odd.first().map(|&a| [a, 0]).as_ref()) {
        let ((lo, n), (hi, m)) = (BYTE_CODES[a as usize], BYTE_CODES[b as usize]);
        let packed = lo as u64 | (hi as u64) << (8 * n);
        if let Some(at) = codes.get_mut(k..k + 8) {
            at.copy_from_slice(&packed.to_le_bytes());
        }
        k += (n + m) as usize;
    }
    out.resize(old.len() * W, 0);
    // Step per code: none, +1, −1 (mod 2^nb), and none for an escape.
    let steps = [0, 1, mask::<W>(), 0];
    let mut e = 0;
    for ((&code, o), dst) in codes.iter().zip(old).zip(out.as_chunks_mut::<W>().0) {
        let code = (code & 3) as usize;
        let stepped = unord::<W>(ord::<W>(bits(o)).wrapping_add(steps[code]) & mask::<W>());
        // Past the last escape only steps follow: any bits will do there.
        let raw = escaped.get(e).map_or(0, bits);
        let is_escape = code as u64 == ESCAPED;
        let value = if is_escape { raw } else { stepped };
        dst.copy_from_slice(&value.to_le_bytes()[..W]);
        e += is_escape as usize;
    }
    Ok(())
}
