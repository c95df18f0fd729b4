//! The `ulp` decoder: directory checks, then narrow elements block by block (two at a
//! time through [`fast`] steps or [`lookup`] tables) and 4-byte ones a value at a time.

mod fast;
mod lookup;

use super::format::{le, nbits, read_entry, step_of, to_le, valid_code, BLOCK, DIR_ENTRY};
use crate::codec::bits::{check_stream_len, mask, prefetch, BitCursor, BitReader};
use crate::codec::no_bytes;
use crate::dtype::{from_ordered, to_ordered};
use crate::error::CodecError;
use fast::{fast_pair_bmi, fast_pair_outlined, Fast, BMI, K0, VALID};
use lookup::{lockstep, BlockSteps, StepCursor, StepTable, TABLE_K};
use std::mem::MaybeUninit;

/// How [`decode_width`] decodes narrow elements: one value at a time (as 4-byte elements
/// always are), through [`StepTable`] lookups with a branch to the one value path at each
/// code word the table does not hold, or (the decoder in use) through branch-free
/// `fast::fast_step`s where the block's cap allows (else the lookups). The first two are the
/// tests' reference decoders.
const ONE_AT_A_TIME: u8 = 0;
#[cfg(test)]
const LOOKUPS: u8 = 1;
pub(super) const FAST: u8 = 2;
/// [`FAST`] in its portable build only (tests).
#[cfg(test)]
const FAST_PORTABLE: u8 = 3;

pub(super) fn decode_width<const W: usize, const HOW: u8>(
    input: &[u8],
    old: &[u8],
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    out.clear();
    let n = old.len() / W;
    if n == 0 {
        return no_bytes(input, 0);
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
    // Not zeroed first (a pass over the whole output, a measurable share of the decoding
    // time: docs/data/codecs/README.md, "Figures behind the code"): the narrow decoder
    // writes every value.
    out.reserve(n * W);
    let spare = out.spare_capacity_mut()[..n * W].as_chunks_mut::<W>().0;
    decode_narrow::<W, HOW>(reader, dir, old.as_chunks::<W>().0, spare)?;
    // SAFETY: `decode_narrow` wrote all n elements of the spare capacity (each block's
    // apply writes every value of the block, and the blocks cover them all).
    unsafe { out.set_len(n * W) };
    Ok(())
}

/// The narrow elements' decoder, into `out` (as many elements as `old`, each written once it
/// returns Ok): blocks in pairs where they can, see `fast::fast_pair`.
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
    let bmi = HOW == FAST && crate::codec::bits::x86_wide();
    #[cfg(not(target_arch = "x86_64"))]
    let bmi = false;
    #[cfg(target_arch = "x86_64")]
    let avx512 = bmi && crate::codec::bits::x86_avx512();
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
        // The old values of the next two blocks on their way while these decode (their
        // apply would wait on memory otherwise).
        let next = ((b + 2) * BLOCK).min(n)..((b + 4) * BLOCK).min(n);
        prefetch(&old[next]);
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

#[cfg(test)]
mod tests {
    use super::super::reference::{patterns, round_trip, specials};
    use super::super::{decode, encode};
    use super::*;
    use crate::testutil::{adamw_bf16, Rng};

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
}
