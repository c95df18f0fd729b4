//! The branch-free steps of the `ulp` decoder for narrow elements (the decoder in use):
//! table lookups, then one code word of any kind by arithmetic, two blocks in turn.

use super::super::format::{nbits, valid_code, BLOCK};
use super::lookup::{widen, BlockSteps, StepTable, LOOKUP, TABLE_K};
use crate::codec::bits::{mask, BitReader};

/// The state of one block in the branch-free decoding loop: stream bit `pos` next, values
/// `..i` decoded, `raws` of them raw.
#[derive(Clone, Copy)]
pub(super) struct Fast {
    pub(super) pos: usize,
    pub(super) i: usize,
    pub(super) raws: usize,
}

/// [`fast_step`] mode bits: `k = 0` blocks.
pub(super) const K0: u8 = 1;
/// `k = 0` blocks with caps up to `nb`: every code word valid, so no check (the loop is
/// bound by its operations).
pub(super) const VALID: u8 = 2;
/// The build for BMI1/2 ([`fast_pair_bmi`]): BZHI by intrinsic.
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
pub(super) const BMI: u8 = 4;

/// Stream bits one [`fast_step`] with `lookups` lookups may read for a block with parameters
/// `(k, c)` (narrow elements): the lookups, then the longest code word (raw: `c` zeros and
/// `nb` bits; long: `z < c` zeros, a one, and `z + k - 1` bits).
fn fast_bits(lookups: u32, nb: u32, (k, c): (u32, u32)) -> u32 {
    lookups * LOOKUP + (c + nb).max(2 * c.saturating_sub(1) + k)
}

/// Entries of a [`k0_lens`] table: every count of leading zeros (`0..=64`), padded.
const LENS: usize = 72;

/// Lengths of `k = 0` code words of narrow elements by their count of leading zeros `z`,
/// under cap `c` (at most `nb + 1`): `max(2z, 1)` below the cap, `c + nb` (raw) from it.
/// One load in [`fast_step`] instead of five ALU operations.
fn k0_lens<const W: usize>(c: u32) -> &'static [u8; LENS] {
    const fn tables() -> [[[u8; LENS]; 18]; 2] {
        let mut t = [[[0; LENS]; 18]; 2];
        let mut w = 0;
        while w < 2 {
            let nb = 8 * (w + 1);
            let mut c = 0;
            while c < 18 {
                let mut z = 0;
                while z < LENS {
                    t[w][c][z] = if z >= c {
                        (c + nb) as u8
                    } else if z == 0 {
                        1
                    } else {
                        2 * z as u8
                    };
                    z += 1;
                }
                c += 1;
            }
            w += 1;
        }
        t
    }
    static LENS_BY_CAP: [[[u8; LENS]; 18]; 2] = tables();
    &LENS_BY_CAP[(W - 1) % 2][c as usize]
}

/// One branch-free step of a block of narrow elements: `N` [`StepTable`] lookups in turn
/// (the code words each holds), then always one more code word (whatever its kind: short,
/// long or raw) decoded by arithmetic. No branch depends on the data but the one for an
/// invalid code number (never taken on intact sections), so long and raw words cost no
/// misprediction; the chain from one step to the next is a load of the stream, the lookups,
/// and the last word's length. Needs `k <= TABLE_K`, `table.max_c <= c <= nb + 1` (every
/// entry holds under the cap), `fast_bits(N, nb, (k, c)) <= 57` (one load holds the step)
/// and room for `8 N + 1` more values in the block; decodes exactly the words of
/// [`StepCursor::table_step`]s.
///
/// # Safety
///
/// `state.i + 8 N + 1 <= BLOCK` and `state.raws <= state.i` (every step keeps the latter):
/// the stores go unchecked, the loop being bound by ALU operations (a mask per store). With
/// [`BMI`] in `MODE`, the CPU must have BMI2.
///
/// [`StepCursor::table_step`]: super::lookup::StepCursor::table_step
#[inline(always)]
unsafe fn fast_step<const W: usize, const N: usize, const MODE: u8>(
    reader: BitReader<'_>,
    table: &StepTable,
    (k, c, lens): (u32, u32, &[u8; LENS]),
    state: &mut Fast,
    steps: &mut BlockSteps,
) -> Result<(), usize> {
    let nb = nbits::<W>();
    let k0 = MODE & K0 != 0;
    debug_assert!(!k0 || k == 0);
    debug_assert!(MODE & VALID == 0 || (k0 && c <= nb));
    let k = if k0 { 0 } else { k };
    debug_assert!(k <= TABLE_K && table.max_c <= c && c <= nb + 1);
    debug_assert!(fast_bits(N as u32, nb, (k, c)) <= 57);
    // At least 57 stream bits.
    let mut rest = reader.peek(state.pos);
    let (mut used, mut j) = (0, state.i);
    for _ in 0..N {
        let x = (rest & mask(LOOKUP)) as usize;
        // Length and count each by a load of its own: on x86 a byte load is no ALU
        // operation, unlike a byte taken out of a register (the loop is bound by ALU
        // operations, not by its chain).
        let bits = table.bits[x] as u32;
        debug_assert!(j + 8 <= steps.u.len());
        // SAFETY: j <= state.i + 8 (N − 1) (at most 8 values a lookup), so with the room the
        // caller promises j + 8 <= BLOCK + 8, the length of `u`.
        widen(
            unsafe { steps.u.get_unchecked_mut(j..j + 8) },
            &table.codes[x],
        );
        j += table.count[x] as usize;
        rest >>= bits;
        used += bits;
    }
    let z = rest.trailing_zeros();
    let raw = z >= c;
    let (u, len) = if k0 {
        // k = 0: the one and the z − 1 bits after it are `2 (u − 2^(z−1)) + 1` in z bits, so
        // setting bit z and halving gives u (0 for z = 0). Raw (z >= c), the reading is
        // discarded, so z needs no clamp (the shifts wrap); the length comes from `lens`.
        let top = 1u64.wrapping_shl(z);
        let low = rest.wrapping_shr(z);
        #[cfg(target_arch = "x86_64")]
        let low = if MODE & BMI != 0 {
            // SAFETY: only `fast_pair_bmi` runs this mode, on a CPU with BMI2. BZHI
            // takes the index as it is (a mask would take an AND more).
            unsafe { std::arch::x86_64::_bzhi_u64(low, z) }
        } else {
            low & top.wrapping_sub(1)
        };
        #[cfg(not(target_arch = "x86_64"))]
        let low = low & top.wrapping_sub(1);
        ((low | top) >> 1, lens[z as usize] as u32)
    } else {
        // The coded reading, discarded when raw (z clamped below c keeps its shifts in range).
        let zc = z.min(c);
        let long = (zc != 0) as u32;
        let len = zc + k - long;
        let coded = ((rest >> (zc + 1)) & mask(len)) | ((long as u64) << len);
        // No branch: raw words are ~8 % of the last words on AdamW steps, never predictable.
        (
            coded,
            std::hint::select_unpredictable(raw, c + nb, zc + 1 + len),
        )
    };
    // At k = 0 a coded word below the cap has z < c zeros, so its code number is below
    // 2^(c − 1): invalid only under the largest cap (`nb + 1`).
    if MODE & VALID == 0 && !raw && (!k0 || c > nb) && !valid_code(u, nb) {
        return Err(j);
    }
    let new_bits = (rest >> c) & mask(nb);
    debug_assert!(j < BLOCK && state.raws < BLOCK);
    // SAFETY: j <= state.i + 8 N < BLOCK and state.raws <= state.i < BLOCK (the caller's
    // room), within `u`, `raw_at` and `raw_bits`. Valid code numbers have at most 16 bits;
    // at a raw value anything goes (its raw bits are written over it).
    unsafe {
        *steps.u.get_unchecked_mut(j) = u as u16;
        *steps.raw_at.get_unchecked_mut(state.raws) = j as u16;
        *steps.raw_bits.get_unchecked_mut(state.raws) = new_bits as u16;
    }
    state.raws += raw as usize;
    state.pos += (used + len) as usize;
    state.i = j + 1;
    Ok(())
}

/// [`fast_pair`] compiled for BMI1/2 (shifts by a register without the `cl` shuffle, one
/// instruction masks): the same code.
///
/// # Safety
///
/// The CPU must have the features of [`crate::codec::bits::x86_wide`].
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
#[inline(never)]
pub(super) unsafe fn fast_pair_bmi<const W: usize, const MODE: u8>(
    reader: BitReader<'_>,
    table: &StepTable,
    params: (u32, u32, u32),
    cursors: (&mut Fast, &mut Fast),
    ends: (usize, usize),
    steps: (&mut BlockSteps, &mut BlockSteps),
) -> (Result<(), usize>, Result<(), usize>) {
    fast_pair::<W, MODE>(reader, table, params, cursors, ends, steps)
}

/// [`fast_pair`] in the portable build.
#[inline(never)]
pub(super) fn fast_pair_outlined<const W: usize, const MODE: u8>(
    reader: BitReader<'_>,
    table: &StepTable,
    params: (u32, u32, u32),
    cursors: (&mut Fast, &mut Fast),
    ends: (usize, usize),
    steps: (&mut BlockSteps, &mut BlockSteps),
) -> (Result<(), usize>, Result<(), usize>) {
    fast_pair::<W, MODE>(reader, table, params, cursors, ends, steps)
}

/// [`fast_step`]s of two blocks with the same `k` in turn while both have room: their
/// chains are independent, so the CPU overlaps them. Stops at the first error of either.
#[inline(always)]
fn fast_pair<const W: usize, const MODE: u8>(
    reader: BitReader<'_>,
    table: &StepTable,
    (k, c_a, c_b): (u32, u32, u32),
    (a, b): (&mut Fast, &mut Fast),
    (m_a, m_b): (usize, usize),
    (steps_a, steps_b): (&mut BlockSteps, &mut BlockSteps),
) -> (Result<(), usize>, Result<(), usize>) {
    let nb = nbits::<W>();
    let (lens_a, lens_b) = (k0_lens::<W>(c_a), k0_lens::<W>(c_b));
    let (mut fa, mut fb) = (*a, *b);
    // The room `fast_step` needs is checked against these (as `Fast` keeps raws <= i).
    let (m_a, m_b) = (m_a.min(BLOCK), m_b.min(BLOCK));
    if fa.raws > fa.i || fb.raws > fb.i {
        return (Ok(()), Ok(()));
    }
    let mut result = (Ok(()), Ok(()));
    // Steps of `N` lookups while both blocks have room for `8 N + 1` more values.
    macro_rules! both {
        ($n:literal) => {
            while fa.i + 8 * $n < m_a && fb.i + 8 * $n < m_b {
                // SAFETY: the room is checked above, and the states keep raws <= i.
                let step = unsafe {
                    fast_step::<W, $n, MODE>(reader, table, (k, c_a, lens_a), &mut fa, steps_a)
                };
                if let Err(e) = step {
                    result = (Err(e), Ok(()));
                    break;
                }
                // SAFETY: as above.
                let step = unsafe {
                    fast_step::<W, $n, MODE>(reader, table, (k, c_b, lens_b), &mut fb, steps_b)
                };
                if let Err(e) = step {
                    result = (Ok(()), Err(e));
                    break;
                }
            }
        };
    }
    // Two lookups a step where one load holds them and any code word after them (caps up
    // to 16 or 17 at k = 0: nearly always), so the last word's arithmetic serves ~10 values.
    if fast_bits(2, nb, (k, c_a)).max(fast_bits(2, nb, (k, c_b))) <= 57 {
        both!(2);
    }
    if result == (Ok(()), Ok(())) {
        both!(1);
    }
    // The last values (fewer than 9 in one of the blocks) one word a step, still branch
    // free (the table path of `StepCursor::finish` branches at each long or raw word).
    if result == (Ok(()), Ok(())) {
        both!(0);
    }
    if result == (Ok(()), Ok(())) {
        result.0 = fast_rest::<W, MODE>(reader, table, (k, c_a, lens_a), &mut fa, m_a, steps_a);
    }
    if result == (Ok(()), Ok(())) {
        result.1 = fast_rest::<W, MODE>(reader, table, (k, c_b, lens_b), &mut fb, m_b, steps_b);
    }
    (*a, *b) = (fa, fb);
    result
}

/// The rest of one block by [`fast_step`]s (`m <= BLOCK` values in all, `state.raws <=
/// state.i`), after the other of its pair has ended.
#[inline(always)]
fn fast_rest<const W: usize, const MODE: u8>(
    reader: BitReader<'_>,
    table: &StepTable,
    (k, c, lens): (u32, u32, &[u8; LENS]),
    state: &mut Fast,
    m: usize,
    steps: &mut BlockSteps,
) -> Result<(), usize> {
    debug_assert!(m <= BLOCK && state.raws <= state.i);
    macro_rules! one {
        ($n:literal) => {
            while state.i + 8 * $n < m {
                // SAFETY: the room is checked above, m <= BLOCK, and raws <= i (see above).
                unsafe { fast_step::<W, $n, MODE>(reader, table, (k, c, lens), state, steps)? };
            }
        };
    }
    if fast_bits(2, nbits::<W>(), (k, c)) <= 57 {
        one!(2);
    }
    one!(1);
    one!(0);
    Ok(())
}
