//! A binary range coder with adaptive counting models: the entropy stage of the `ctx` codecs.
//!
//! Integer arithmetic only, so that any implementation (a GPU one included) produces the same
//! bytes: docs/codecs.md ("ctx") specifies each step. The coder is the carry-less-cache design
//! of LZMA's range coder (32-bit range, 33-bit low, one cached byte plus a run of 0xFF bytes
//! waiting for a carry), without the leading zero byte that design always writes first.

use crate::error::CodecError;

/// Probabilities are fractions of 2^PROB_BITS.
pub(crate) const PROB_BITS: u32 = 15;
const PROB_ONE: u32 = 1 << PROB_BITS;
/// The range is renormalized (one byte shifted out) whenever it drops below this.
const TOP: u32 = 1 << 24;
/// A model's counts are halved when their sum reaches this (so it follows local changes).
pub(crate) const COUNT_LIMIT: u32 = 1 << 10;
/// Bits of the fixed-point reciprocals in [`RECIPROCAL`].
const RECIPROCAL_SHIFT: u32 = 37;
/// `ceil(2^37 / (2·t + 2))` for every count `t < COUNT_LIMIT`: the estimate's division as a
/// multiplication, exact for every numerator it meets (`(2·zeros + 1)·2^15 < 2^26`, and
/// `2^26 · 2048 ≤ 2^37`; the test `reciprocals_divide_exactly` checks them all). `ctx` values
/// code 10–15 % faster than with the division (A/B on the dev VM, 2026-12-07).
static RECIPROCAL: [u64; COUNT_LIMIT as usize] = {
    let mut r = [0u64; COUNT_LIMIT as usize];
    let mut t = 0;
    while t < COUNT_LIMIT as usize {
        let d = 2 * t as u64 + 2;
        r[t] = (1u64 << RECIPROCAL_SHIFT).div_ceil(d);
        t += 1;
    }
    r
};

/// An adaptive estimate of P(bit = 0): the Krichevsky–Trofimov estimate from the counts of the
/// zeros and ones coded in this context so far. The estimate is computed when the counts
/// change, not when it is used, so it is ready when the next bit needs it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Model {
    zeros: u32,
    total: u32,
    p0: u32,
}

impl Default for Model {
    fn default() -> Self {
        Model {
            zeros: 0,
            total: 0,
            p0: Self::estimate(0, 0),
        }
    }
}

impl Model {
    /// floor((2·zeros + 1)·2^15 / (2·total + 2)), which lies in [16, 2^15 − 16] for every
    /// `zeros ≤ total < COUNT_LIMIT` (the division by at most 2048 of a numerator between
    /// 2^15 and (2·total + 1)·2^15), so inside the coder's [1, 2^15 − 1] without a clamp on
    /// the path from one bit to the next (`estimates_stay_inside_the_coder_s_bounds`).
    #[inline(always)]
    fn estimate(zeros: u32, total: u32) -> u32 {
        let num = ((2 * zeros + 1) << PROB_BITS) as u64;
        let p = ((num * RECIPROCAL[total as usize]) >> RECIPROCAL_SHIFT) as u32;
        debug_assert!((1..PROB_ONE).contains(&p));
        p
    }

    /// P(0) in units of 2^-15.
    #[inline(always)]
    pub(crate) fn p0(&self) -> u32 {
        self.p0
    }

    #[inline(always)]
    pub(crate) fn update(&mut self, bit: bool) {
        self.zeros += (!bit) as u32;
        self.total += 1;
        if self.total == COUNT_LIMIT {
            self.zeros >>= 1;
            self.total >>= 1;
        }
        self.p0 = Self::estimate(self.zeros, self.total);
    }
}

/// Encodes bits into a byte vector.
pub(crate) struct Encoder<'o> {
    low: u64,
    range: u32,
    /// The byte waiting for a possible carry, and how many 0xFF bytes follow it.
    cache: u8,
    pending: u64,
    /// Whether `cache` holds a byte yet (the first shift has none to write).
    started: bool,
    out: &'o mut Vec<u8>,
}

impl<'o> Encoder<'o> {
    pub(crate) fn new(out: &'o mut Vec<u8>) -> Self {
        Encoder {
            low: 0,
            range: u32::MAX,
            cache: 0,
            pending: 0,
            started: false,
            out,
        }
    }

    /// Codes `bit` with P(0) = `p0` / 2^15 (`1 ≤ p0 < 2^15`).
    #[inline(always)]
    pub(crate) fn bit(&mut self, p0: u32, bit: bool) {
        let bound = (self.range >> PROB_BITS) * p0;
        // Without a branch on the bit (random bits mispredict): `bound < range` always.
        let one = (bit as u32).wrapping_neg();
        self.low += (bound & one) as u64;
        self.range = (bound & !one) | ((self.range - bound) & one);
        while self.range < TOP {
            self.range <<= 8;
            self.shift_low();
        }
    }

    /// Codes `bit` with `model`, then updates it.
    #[inline(always)]
    pub(crate) fn model_bit(&mut self, model: &mut Model, bit: bool) {
        self.bit(model.p0(), bit);
        model.update(bit);
    }

    /// Codes the low `n` bits of `v`, most significant first, each with P(0) = 1/2.
    pub(crate) fn direct(&mut self, v: u32, n: u32) {
        for i in (0..n).rev() {
            self.bit(PROB_ONE / 2, (v >> i) & 1 == 1);
        }
    }

    fn shift_low(&mut self) {
        // Bits 24..31 of low are final unless a carry (bit 32) may still reach them.
        if self.low < 0xFF00_0000 || self.low >= 1 << 32 {
            let carry = (self.low >> 32) as u8;
            if self.started {
                self.out.push(self.cache.wrapping_add(carry));
            }
            for _ in 0..self.pending {
                self.out.push(0xFFu8.wrapping_add(carry));
            }
            self.pending = 0;
            self.cache = (self.low >> 24) as u8;
            self.started = true;
        } else {
            self.pending += 1;
        }
        self.low = (self.low & 0x00FF_FFFF) << 8;
    }

    /// Writes the last bytes (four bytes of low after the cached ones).
    pub(crate) fn finish(mut self) {
        for _ in 0..5 {
            self.shift_low();
        }
    }
}

/// Decodes bits from a byte slice; every read is checked.
pub(crate) struct Decoder<'i> {
    code: u32,
    range: u32,
    input: &'i [u8],
    at: usize,
    codec: &'static str,
}

impl<'i> Decoder<'i> {
    pub(crate) fn new(input: &'i [u8], codec: &'static str) -> Result<Self, CodecError> {
        if input.len() < 4 {
            return Err(CodecError::Truncated {
                needed: 4,
                available: input.len() as u64,
            });
        }
        let code = u32::from_be_bytes([input[0], input[1], input[2], input[3]]);
        Ok(Decoder {
            code,
            range: u32::MAX,
            input,
            at: 4,
            codec,
        })
    }

    #[inline(always)]
    pub(crate) fn bit(&mut self, p0: u32) -> Result<bool, CodecError> {
        let bound = (self.range >> PROB_BITS) * p0;
        // Without a branch on the bit, as the encoder.
        let bit = self.code >= bound;
        let one = (bit as u32).wrapping_neg();
        self.code -= bound & one;
        self.range = (bound & !one) | ((self.range - bound) & one);
        while self.range < TOP {
            let Some(&byte) = self.input.get(self.at) else {
                return Err(CodecError::Truncated {
                    needed: self.at as u64 + 1,
                    available: self.input.len() as u64,
                });
            };
            self.at += 1;
            self.range <<= 8;
            self.code = (self.code << 8) | byte as u32;
        }
        if self.code >= self.range {
            // Never so in a stream an encoder wrote: the code stays inside the range.
            return Err(CodecError::Malformed {
                codec: self.codec,
                reason: format!("code word outside the range at byte {}", self.at),
            });
        }
        Ok(bit)
    }

    #[inline(always)]
    pub(crate) fn model_bit(&mut self, model: &mut Model) -> Result<bool, CodecError> {
        let bit = self.bit(model.p0())?;
        model.update(bit);
        Ok(bit)
    }

    pub(crate) fn direct(&mut self, n: u32) -> Result<u32, CodecError> {
        let mut v = 0u32;
        for _ in 0..n {
            v = (v << 1) | self.bit(PROB_ONE / 2)? as u32;
        }
        Ok(v)
    }

    /// Fails unless every byte of the input was read.
    pub(crate) fn finish(self, count: u64) -> Result<(), CodecError> {
        if self.at != self.input.len() {
            return Err(CodecError::TrailingBytes {
                count,
                extra: (self.input.len() - self.at) as u64,
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    #[test]
    fn reciprocals_divide_exactly() {
        for total in 0..COUNT_LIMIT {
            for zeros in 0..=total {
                let exact =
                    (((2 * zeros + 1) << PROB_BITS) / (2 * total + 2)).clamp(1, PROB_ONE - 1);
                assert_eq!(
                    Model::estimate(zeros, total),
                    exact,
                    "zeros {zeros} total {total}"
                );
            }
        }
    }

    /// The spec keeps an estimate in [1, 2^15 − 1]; the counts never take it out, so the
    /// coder needs no clamp (every count the models reach, exhaustively).
    #[test]
    fn estimates_stay_inside_the_coder_s_bounds() {
        for total in 0..COUNT_LIMIT {
            for zeros in 0..=total {
                let unclamped = ((2 * zeros + 1) << PROB_BITS) / (2 * total + 2);
                assert!(
                    (16..=PROB_ONE - 16).contains(&unclamped),
                    "zeros {zeros} total {total}: {unclamped}"
                );
            }
        }
    }

    #[test]
    fn bits_round_trip_at_every_skew() {
        let mut rng = Rng(5);
        for p in [0.0, 0.001, 0.1, 0.5, 0.9, 0.999, 1.0] {
            for n in [1usize, 2, 7, 100, 5000] {
                let bits: Vec<bool> = (0..n).map(|_| rng.unit() < p).collect();
                let mut out = Vec::new();
                let mut enc = Encoder::new(&mut out);
                let (mut m, mut direct) = (Model::default(), 0u32);
                for (i, &b) in bits.iter().enumerate() {
                    enc.model_bit(&mut m, b);
                    if i % 97 == 0 {
                        direct = direct.wrapping_mul(31).wrapping_add(i as u32);
                        enc.direct(direct & 0x1FFF, 13);
                    }
                }
                enc.finish();
                let mut dec = Decoder::new(&out, "test").unwrap();
                let (mut m, mut direct) = (Model::default(), 0u32);
                for (i, &b) in bits.iter().enumerate() {
                    assert_eq!(dec.model_bit(&mut m).unwrap(), b, "p {p} n {n} at {i}");
                    if i % 97 == 0 {
                        direct = direct.wrapping_mul(31).wrapping_add(i as u32);
                        assert_eq!(dec.direct(13).unwrap(), direct & 0x1FFF);
                    }
                }
                dec.finish(n as u64).unwrap();
                // Near the entropy: KT learning costs O(log n) bits, the flush 4 bytes.
                let h = if p > 0.0 && p < 1.0 {
                    -(p * p.log2() + (1.0 - p) * (1.0 - p).log2())
                } else {
                    0.0
                };
                let ideal = (n as f64 * h + n.div_ceil(97) as f64 * 13.0) / 8.0;
                assert!(
                    (out.len() as f64) < ideal * 1.05 + 40.0,
                    "p {p} n {n}: {} bytes, ideal {ideal:.0}",
                    out.len()
                );
            }
        }
    }
}
