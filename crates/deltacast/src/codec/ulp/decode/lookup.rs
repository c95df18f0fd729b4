//! Table lookups of the `ulp` decoder for narrow elements: the multi-symbol [`StepTable`]
//! of each `k`, the steps of one block being decoded ([`BlockSteps`]), and the cursor that
//! decodes a block a lookup at a time, with a branch to one code word at a time where the
//! table holds none ([`StepCursor`]).

use super::super::format::{le, nbits, ord16, to_le, unord16, valid_code, BLOCK};
use crate::codec::bits::{mask, BitReader};
use std::mem::MaybeUninit;
use std::sync::OnceLock;

/// Marks a decoded raw value (narrow elements: code numbers of an accepted code word have
/// at most 30 bits, so bit 31 is free).
const TAG: u32 = 1 << 31;

/// Decodes the code word in the low bits of `word` for a block with parameters `(k, c)`
/// (narrow elements, `k <= 15`, `c <= 17`, so a code word is at most 47 bits): the code
/// number, or the new bits with [`TAG`] for a raw value, and the code word's length.
#[inline(always)]
fn narrow_word<const W: usize>(word: u64, k: u32, c: u32) -> (u32, u32) {
    let nb = nbits::<W>();
    let z = word.trailing_zeros();
    if z >= c {
        (TAG | ((word >> c) & mask(nb)) as u32, c + nb)
    } else {
        // Short (z = 0): k payload bits. Long: z + k − 1 bits below a leading one.
        let long = (z != 0) as u32;
        let len = z + k - long;
        let u = ((word >> (z + 1)) & mask(len)) | ((long as u64) << len);
        (u as u32, z + 1 + len)
    }
}

/// Multi-symbol decoding table for blocks with parameter `k` (narrow elements): for each
/// value of the next [`LOOKUP`] stream bits, the code numbers of the code words that lie
/// wholly inside them (at most 8), their total length, and the smallest cap `c` under which
/// none of them is raw. On AdamW steps (k = 0, mostly 1- and 2-bit code words, ~2.2 bits a
/// value) one lookup yields ~5 values (~3.8 on the benchmark chunk's ~3 bits a value).
pub(super) struct StepTable {
    /// The code numbers (those below 256: a byte each, so that 12-bit lookups read no more
    /// of the table than 10-bit ones of 16-bit numbers did), padded to 8.
    pub(super) codes: [[u8; 8]; LOOKUP_SIZE],
    pub(super) count: [u8; LOOKUP_SIZE],
    pub(super) bits: [u8; LOOKUP_SIZE],
    /// Smallest `c` the entry holds for; 255 when it holds no code word.
    min_c: [u8; LOOKUP_SIZE],
    /// `bits | count << 8 | min_c << 16` of each entry: one load for all three.
    meta: [u32; LOOKUP_SIZE],
    /// The largest `min_c` of an entry that holds code words: under a cap at least this,
    /// every entry holds (see `fast::fast_step`).
    pub(super) max_c: u32,
}

/// A table entry's code numbers into a block's (one widening load and a store).
#[inline(always)]
pub(super) fn widen(to: &mut [u16], codes: &[u8; 8]) {
    for (t, &u) in to.iter_mut().zip(codes) {
        *t = u as u16;
    }
}

/// Largest `k` with a [`StepTable`] (code words of larger ones are long: few per lookup).
pub(super) const TABLE_K: u32 = 7;

/// Stream bits a [`StepTable`] lookup reads: 12 (the loop reads 40 KiB of the table, most
/// of it seldom; 10, 11 and 13 bits decoded slower: docs/data/codecs/README.md, "Figures
/// behind the code").
pub(super) const LOOKUP: u32 = 12;
const LOOKUP_SIZE: usize = 1 << LOOKUP;

impl StepTable {
    fn new(k: u32, nb: u32) -> Self {
        let mut table = StepTable {
            codes: [[0; 8]; LOOKUP_SIZE],
            count: [0; LOOKUP_SIZE],
            bits: [0; LOOKUP_SIZE],
            min_c: [255; LOOKUP_SIZE],
            meta: [0; LOOKUP_SIZE],
            max_c: 0,
        };
        for x in 0..LOOKUP_SIZE as u32 {
            let (mut at, mut count, mut min_c) = (0, 0, 0);
            while count < 8 {
                // The code word at bit `at`, if it ends by bit LOOKUP: only bits below are known.
                let rest = x >> at;
                let z = (rest | 1 << (LOOKUP - at)).trailing_zeros();
                let (len, u) = if z == 0 {
                    (k + 1, (rest >> 1) & mask(k) as u32)
                } else {
                    let l = z + k;
                    (
                        2 * l - k,
                        (rest >> (z + 1)) & mask(l - 1) as u32 | 1 << (l - 1),
                    )
                };
                // An invalid code number (FP8: 254, at k >= 6) is left to the path that
                // reports it, a number above a byte to the arithmetic.
                if z >= LOOKUP - at || at + len > LOOKUP || !valid_code(u as u64, nb) || u > 255 {
                    break;
                }
                table.codes[x as usize][count] = u as u8;
                min_c = min_c.max(z + 1);
                count += 1;
                at += len;
            }
            if count > 0 {
                let x = x as usize;
                (table.count[x], table.bits[x], table.min_c[x]) =
                    (count as u8, at as u8, min_c as u8);
                table.max_c = table.max_c.max(min_c);
            }
            let x = x as usize;
            table.meta[x] =
                table.bits[x] as u32 | (table.count[x] as u32) << 8 | (table.min_c[x] as u32) << 16;
        }
        table
    }

    /// The table for `W`-byte elements (`W <= 2`) and `k <= TABLE_K`, built once per
    /// process.
    pub(super) fn get<const W: usize>(k: u32) -> &'static StepTable {
        type Tables = [OnceLock<Box<StepTable>>; TABLE_K as usize + 1];
        static TABLES: [Tables; 2] =
            [const { [const { OnceLock::new() }; TABLE_K as usize + 1] }; 2];
        TABLES[(W - 1) % 2][k as usize].get_or_init(|| Box::new(StepTable::new(k, nbits::<W>())))
    }
}

/// The steps of one block of narrow elements being decoded, and its raw values apart: those
/// are written over the stepped values afterwards, so decoding them does not read the old
/// bits (a cache miss on data as large as a real chunk's, in the chain of lookups).
pub(super) struct BlockSteps {
    /// The code numbers (anything at raw values), room for 8 past the block: the apply
    /// turns them into steps in vector lanes, off the decoding loop.
    pub(super) u: [u16; BLOCK + 8],
    /// Index in the block and new bits of each raw value.
    pub(super) raw_at: [u16; BLOCK],
    pub(super) raw_bits: [u16; BLOCK],
    pub(super) raws: usize,
}

impl BlockSteps {
    pub(super) fn new() -> Box<Self> {
        Box::new(BlockSteps {
            u: [0; BLOCK + 8],
            raw_at: [0; BLOCK],
            raw_bits: [0; BLOCK],
            raws: 0,
        })
    }

    /// Records value `i` of the block from one code word decoded into `t` (see
    /// [`narrow_word`]). Fails with `i` for an invalid code number.
    #[inline(always)]
    fn word<const W: usize>(&mut self, t: u32, i: usize) -> Result<(), usize> {
        if t & TAG != 0 {
            // At most one per value of the block, so fewer than BLOCK.
            let r = self.raws % BLOCK;
            (self.raw_at[r], self.raw_bits[r]) = (i as u16, t as u16);
            self.raws += 1;
            self.u[i] = 0;
            Ok(())
        } else if valid_code(t as u64, nbits::<W>()) {
            self.u[i] = t as u16;
            Ok(())
        } else {
            Err(i)
        }
    }

    /// [`BlockSteps::apply`] compiled for AVX2 (16 lanes).
    ///
    /// # Safety
    ///
    /// The CPU must have the features of [`crate::codec::bits::x86_wide`].
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
    pub(super) fn apply_wide<const W: usize>(
        &self,
        old: &[[u8; W]],
        out: &mut [[MaybeUninit<u8>; W]],
    ) {
        self.apply(old, out)
    }

    /// [`BlockSteps::apply`] compiled for AVX-512 (32 lanes).
    ///
    /// # Safety
    ///
    /// The CPU must have the features [`crate::codec::bits::x86_avx512`] checks.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt,avx512f,avx512bw")]
    pub(super) fn apply_avx512<const W: usize>(
        &self,
        old: &[[u8; W]],
        out: &mut [[MaybeUninit<u8>; W]],
    ) {
        self.apply(old, out)
    }

    /// The new bits of the block's values from their old bits: stepped (a loop the compiler
    /// vectorizes, writing every value of `out` that `old` has), then the raw values written.
    #[inline(always)]
    pub(super) fn apply<const W: usize>(&self, old: &[[u8; W]], out: &mut [[MaybeUninit<u8>; W]]) {
        let all = mask(nbits::<W>()) as u16;
        for ((&u, a), o) in self.u.iter().zip(old).zip(out.iter_mut()) {
            // `step_of` in 16 bits (a valid code number has at most 16).
            let negative = u & 1;
            let d = (((u >> 1) + 1) ^ negative.wrapping_neg()).wrapping_add(negative);
            let stepped = ord16::<W>(le(a) as u16).wrapping_add(d) & all;
            *o = to_le::<W>(unord16::<W>(stepped) as u32).map(MaybeUninit::new);
        }
        for (&at, &bits) in self.raw_at.iter().zip(&self.raw_bits).take(self.raws) {
            if let Some(o) = out.get_mut(at as usize) {
                *o = to_le::<W>(bits as u32).map(MaybeUninit::new);
            }
        }
    }
}

/// The decoding of one block of narrow elements in progress: `steps[..i]` decoded, the next
/// stream bits (from `pos`) in a register, `avail` of them the stream's.
///
/// The register is refilled by a load when fewer are left than a lookup needs (every ~7
/// lookups), or than the 33 bits a long or raw code word may need on that path, so the
/// chain from one lookup to the next is the entry's load and a shift.
pub(super) struct StepCursor {
    buf: u64,
    avail: u32,
    /// Stream position just past the bits of `buf` that are the stream's: the next bit is at
    /// `top - avail` (so consuming bits updates `avail` only).
    top: usize,
    pub(super) i: usize,
}

impl StepCursor {
    #[inline(always)]
    pub(super) fn new(reader: BitReader<'_>, pos: usize) -> Self {
        let mut cursor = StepCursor {
            buf: 0,
            avail: 0,
            top: pos,
            i: 0,
        };
        cursor.reload(reader);
        cursor
    }

    /// Stream position of the next bit.
    #[inline(always)]
    pub(super) fn pos(&self) -> usize {
        self.top - self.avail as usize
    }

    #[inline(always)]
    fn reload(&mut self, reader: BitReader<'_>) {
        let pos = self.pos();
        self.buf = reader.peek(pos);
        self.avail = 64 - (pos & 7) as u32;
        self.top = pos + self.avail as usize;
    }

    /// One lookup in `table` (the block's `k`), or one code word the table does not hold
    /// (long, raw). Needs room for 8 more steps in the block.
    #[inline(always)]
    fn table_step<const W: usize>(
        &mut self,
        reader: BitReader<'_>,
        table: &StepTable,
        (k, c): (u32, u32),
        steps: &mut BlockSteps,
    ) -> Result<(), usize> {
        if self.avail < LOOKUP {
            self.reload(reader);
        }
        let x = (self.buf & mask(LOOKUP)) as usize;
        let meta = table.meta[x];
        let i = self.i;
        if meta >> 16 > c {
            // At most c + nb <= 33 bits.
            if self.avail < 33 {
                self.reload(reader);
            }
            let (t, len) = narrow_word::<W>(self.buf, k, c);
            steps.word::<W>(t, i)?;
            self.i = i + 1;
            self.buf >>= len;
            self.avail -= len;
            return Ok(());
        }
        widen(&mut steps.u[i..i + 8], &table.codes[x]);
        self.i = i + (meta >> 8 & 0xff) as usize;
        let bits = meta & 0xff;
        self.buf >>= bits;
        self.avail -= bits;
        Ok(())
    }

    /// Decodes the rest of the block (`old`: its old bits) into `steps[..old.len()]`,
    /// moving `pos` past its code words. Fails with the index in the block of an invalid
    /// code number.
    pub(super) fn finish<const W: usize>(
        &mut self,
        reader: BitReader<'_>,
        (k, c): (u32, u32),
        old: &[[u8; W]],
        steps: &mut BlockSteps,
    ) -> Result<(), usize> {
        let m = old.len().min(BLOCK);
        if k <= TABLE_K && c > 0 {
            let table = StepTable::get::<W>(k);
            while self.i + 8 <= m {
                self.table_step::<W>(reader, table, (k, c), steps)?;
            }
        }
        // The rest (and blocks without a table) a few code words per load.
        let mut i = self.i;
        let mut pos = self.pos();
        while i + 4 <= m {
            let words: [(u32, u32); 4] = reader.read_n(&mut pos, |word| {
                let (t, len) = narrow_word::<W>(word, k, c);
                ((t, len), len)
            });
            for (j, (t, _)) in words.into_iter().enumerate() {
                steps.word::<W>(t, i + j)?;
            }
            i += 4;
        }
        while i < m {
            let (t, len) = narrow_word::<W>(reader.peek(pos), k, c);
            pos += len as usize;
            steps.word::<W>(t, i)?;
            i += 1;
        }
        self.i = i;
        // Where the block's code words end.
        self.top = pos;
        self.avail = 0;
        Ok(())
    }
}

/// Table steps of two blocks with the same `k` (caps `c_a`, `c_b`) in turn while both have
/// room: their chains of lookups are independent, so the CPU overlaps them. Stops at the
/// first error of either. Not inlined: on its own, the loop keeps both cursors in registers.
#[inline(never)]
pub(super) fn lockstep<const W: usize>(
    reader: BitReader<'_>,
    table: &StepTable,
    (k, c_a, c_b): (u32, u32, u32),
    (a, b): (&mut StepCursor, &mut StepCursor),
    (old_a, old_b): (&[[u8; W]], &[[u8; W]]),
    (steps_a, steps_b): (&mut BlockSteps, &mut BlockSteps),
) -> (Result<(), usize>, Result<(), usize>) {
    while a.i + 8 <= old_a.len().min(BLOCK) && b.i + 8 <= old_b.len().min(BLOCK) {
        if let Err(i) = a.table_step::<W>(reader, table, (k, c_a), steps_a) {
            return (Err(i), Ok(()));
        }
        if let Err(i) = b.table_step::<W>(reader, table, (k, c_b), steps_b) {
            return (Ok(()), Err(i));
        }
    }
    (Ok(()), Ok(()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    #[test]
    fn step_tables_agree_with_code_words() {
        fn check<const W: usize>(rng: &mut Rng) {
            let nb = 8 * W as u32;
            for k in 0..=TABLE_K {
                let table = StepTable::get::<W>(k);
                let mut max_c = 0;
                for x in 0..LOOKUP_SIZE {
                    if table.count[x] > 0 {
                        max_c = max_c.max(table.min_c[x] as u32);
                    }
                    for c in 1..=nb + 1 {
                        if (table.min_c[x] as u32) > c {
                            continue;
                        }
                        // Whatever follows the LOOKUP bits, the words decode as the table says.
                        let word = x as u64 | (rng.next_u64() << LOOKUP);
                        let mut used = 0;
                        for &code in &table.codes[x][..table.count[x] as usize] {
                            let (u, len) = narrow_word::<W>(word >> used, k, c);
                            assert!(u & TAG == 0, "k {k} x {x:#b} c {c}: raw word");
                            assert!(valid_code(u as u64, nb), "k {k} x {x:#b}: code {u}");
                            assert_eq!(u, code as u32, "k {k} x {x:#b} c {c}");
                            used += len;
                        }
                        assert_eq!(used, table.bits[x] as u32, "k {k} x {x:#b} c {c}");
                        assert!(used <= LOOKUP && table.count[x] > 0);
                        let meta = table.meta[x];
                        assert_eq!(meta & 0xff, used);
                        assert_eq!(meta >> 8 & 0xff, table.count[x] as u32);
                        assert_eq!(meta >> 16, table.min_c[x] as u32);
                    }
                }
                assert_eq!(table.max_c, max_c, "width {W}, k {k}");
            }
        }
        let mut rng = Rng(26);
        check::<1>(&mut rng);
        check::<2>(&mut rng);
    }
}
