//! The `gaps` decoder: directory checks, then blocks two at a time where they share `k`
//! (their chains of code words overlap), the next stream bits cached in a register.

use super::format::{escape_width, read_entry, BLOCK, DIR_ENTRY, ESC, MAX_K};
use crate::codec::bits::{check_stream_len, mask, BitReader};
use crate::codec::no_bytes;
use crate::error::CodecError;

/// [`decode`]; `DISPATCH`: in the BMI build where the CPU has its features, else portable;
/// `PAIRS`: two blocks at a time where they allow it (else one by one: the tests' second
/// decoder).
///
/// [`decode`]: fn@super::decode
#[inline(always)]
pub(super) fn decode_impl<const DISPATCH: bool, const PAIRS: bool>(
    input: &[u8],
    count: u32,
    range: u32,
    out: &mut Vec<u32>,
) -> Result<(), CodecError> {
    out.clear();
    let n = count as usize;
    if n == 0 {
        return no_bytes(input, 0);
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
    if DISPATCH && crate::codec::bits::x86_wide() {
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

#[cfg(test)]
mod tests {
    use super::super::{decode, encode};
    use super::*;
    use crate::testutil::{bernoulli_positions, Rng};

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

    /// The BMI build of the decoder (where the CPU has it), the portable one, and the
    /// portable one decoding one block at a time (no pairs of blocks in lockstep) agree on
    /// sections of every density, intact or damaged (some blocks pass, the rest fail in
    /// different ways): same positions, same errors.
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
}
