//! Source dtype → wire dtype: fp32 source bits rounded to bf16 exactly as torch rounds them, so
//! a trainer that keeps fp32 master weights can sync the bf16 an engine holds without making a
//! converted copy first (the diff converts on the fly, see [`crate::diff::diff_f32_as_bf16`]).
//!
//! The rounding is round-to-nearest-even on the bit pattern: add `0x7FFF` plus the lowest kept
//! bit, keep the high half. It needs no float arithmetic, so it is the same on every target and
//! in every FPU mode; subnormals round like any other value (torch does not flush them), and
//! values past the largest bf16 round to ±Inf.
//!
//! NaN is where torch disagrees with itself. Measured with torch 2.14.0 on an AVX-512 CPU
//! (tests/data/bf16/README.md): a contiguous `.to(torch.bfloat16)` runs the vectorised kernel,
//! which turns every NaN, whatever its sign and payload, into `0xFFFF`; a strided tensor, a
//! 0-dim one, `ATEN_CPU_CAPABILITY=default`, or the scalar `c10::BFloat16` constructor give
//! `0x7FC0`. Every non-NaN pattern agrees between the two. The NaN result is therefore an
//! explicit choice ([`Bf16Rule`]), never a guess.

pub mod fp8;

/// How fp32 bits round to bf16; only the bits NaN becomes vary.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Bf16Rule {
    /// The bf16 bits every fp32 NaN becomes.
    pub nan: u16,
}

impl Bf16Rule {
    /// torch's contiguous CPU `.to(torch.bfloat16)` on AVX2/AVX-512 builds: NaN → `0xFFFF`.
    pub const TORCH_CPU: Bf16Rule = Bf16Rule { nan: 0xFFFF };
    /// torch's scalar path (`c10::BFloat16(float)`, strided or 0-dim tensors, or
    /// `ATEN_CPU_CAPABILITY=default`): NaN → `0x7FC0`.
    pub const TORCH_SCALAR: Bf16Rule = Bf16Rule { nan: 0x7FC0 };

    /// The bf16 bits of the fp32 value with bits `bits`.
    #[inline(always)]
    pub const fn convert(self, bits: u32) -> u16 {
        // Branch-free, so the slice loop vectorises: round every pattern, then pick NaN's bits.
        // The add wraps only for NaNs above 0xFFFF_7FFF, whose rounding is discarded anyway
        // (the largest non-NaN pattern is −Inf, 0xFF80_0000, and the bias is at most 0x8000).
        let bias = ((bits >> 16) & 1) + 0x7FFF;
        let rounded = (bits.wrapping_add(bias) >> 16) as u16;
        // Without the sign, NaNs are exactly the patterns above +Inf's.
        let is_nan = bits & 0x7FFF_FFFF > 0x7F80_0000;
        if is_nan {
            self.nan
        } else {
            rounded
        }
    }

    /// Converts little-endian fp32 `source` into little-endian bf16 `dest`, element by element
    /// (a plain loop the compiler may vectorise).
    ///
    /// # Panics
    /// If `source` is not exactly twice as long as `dest` or `dest` is not whole elements (a
    /// caller bug: the lengths are checked against the slot table before).
    pub fn convert_slice(self, source: &[u8], dest: &mut [u8]) {
        assert_eq!(dest.len() % 2, 0, "bf16 buffer is not whole elements");
        assert_eq!(
            source.len(),
            2 * dest.len(),
            "fp32 source is not twice the bf16 size"
        );
        // Fixed-size groups give the compiler whole vectors to work on; the rest one by one.
        const GROUP: usize = 16;
        let mut dest_groups = dest.chunks_exact_mut(2 * GROUP);
        let mut source_groups = source.chunks_exact(4 * GROUP);
        for (d, s) in (&mut dest_groups).zip(&mut source_groups) {
            let mut bits = [0u32; GROUP];
            for (b, s) in bits.iter_mut().zip(s.chunks_exact(4)) {
                *b = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
            let mut half = [0u16; GROUP];
            for (h, &b) in half.iter_mut().zip(&bits) {
                *h = self.convert(b);
            }
            for (d, h) in d.chunks_exact_mut(2).zip(half) {
                d.copy_from_slice(&h.to_le_bytes());
            }
        }
        let (d_rest, s_rest) = (dest_groups.into_remainder(), source_groups.remainder());
        for (d, s) in d_rest.chunks_exact_mut(2).zip(s_rest.chunks_exact(4)) {
            let bits = u32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            d.copy_from_slice(&self.convert(bits).to_le_bytes());
        }
    }
}

impl Default for Bf16Rule {
    /// What a plain `.to(torch.bfloat16)` of a contiguous CPU tensor gives on x86 builds.
    fn default() -> Self {
        Bf16Rule::TORCH_CPU
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// torch's own results (tests/data/bf16/README.md) for every input in the vector file.
    #[test]
    fn matches_torch_vectors() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/data/bf16/torch_f32_to_bf16.bin"
        );
        let data = std::fs::read(path).expect("vector file is in the repository");
        let n = u32::from_le_bytes(data[..4].try_into().expect("count")) as usize;
        assert!(n > 200_000, "vector file too small: {n}");
        assert_eq!(data.len(), 4 + n * (4 + 2 + 2));
        let inputs = &data[4..4 + 4 * n];
        let vectorised = &data[4 + 4 * n..4 + 6 * n];
        let scalar = &data[4 + 6 * n..];
        let (mut nans, mut subnormals, mut infs) = (0, 0, 0);
        for i in 0..n {
            let bits = u32::from_le_bytes(inputs[4 * i..4 * i + 4].try_into().expect("4"));
            let want_v = u16::from_le_bytes(vectorised[2 * i..2 * i + 2].try_into().expect("2"));
            let want_s = u16::from_le_bytes(scalar[2 * i..2 * i + 2].try_into().expect("2"));
            assert_eq!(
                Bf16Rule::TORCH_CPU.convert(bits),
                want_v,
                "input {bits:#010x}"
            );
            assert_eq!(
                Bf16Rule::TORCH_SCALAR.convert(bits),
                want_s,
                "input {bits:#010x}"
            );
            let abs = bits & 0x7FFF_FFFF;
            nans += usize::from(abs > 0x7F80_0000);
            subnormals += usize::from(abs != 0 && abs < 0x0080_0000);
            infs += usize::from(abs == 0x7F80_0000);
        }
        // The file must really hold the edge cases it claims to.
        assert!(
            nans > 1000 && subnormals > 100 && infs >= 2,
            "{nans} {subnormals} {infs}"
        );
    }

    #[test]
    fn edges() {
        let r = Bf16Rule::TORCH_SCALAR;
        assert_eq!(r.convert(0x0000_0000), 0x0000);
        assert_eq!(r.convert(0x8000_0000), 0x8000);
        assert_eq!(r.convert(0x7F80_0000), 0x7F80);
        assert_eq!(r.convert(0xFF80_0000), 0xFF80);
        assert_eq!(r.convert(0x7F7F_FFFF), 0x7F80, "max finite rounds to +Inf");
        assert_eq!(r.convert(0x3F80_8000), 0x3F80, "tie to even (down)");
        assert_eq!(r.convert(0x3F81_8000), 0x3F82, "tie to even (up)");
        assert_eq!(r.convert(0x0000_8001), 0x0001, "subnormal rounds up");
        assert_eq!(r.convert(0xFF80_0001), 0x7FC0, "signalling negative NaN");
        assert_eq!(Bf16Rule::TORCH_CPU.convert(0x7FC0_0000), 0xFFFF);
    }

    #[test]
    fn slice_matches_element() {
        let bits: Vec<u32> = (0..1001u32).map(|i| i.wrapping_mul(0x9E37_79B9)).collect();
        let src: Vec<u8> = bits.iter().flat_map(|b| b.to_le_bytes()).collect();
        let mut dst = vec![0u8; 2 * bits.len()];
        Bf16Rule::TORCH_CPU.convert_slice(&src, &mut dst);
        for (i, b) in bits.iter().enumerate() {
            let got = u16::from_le_bytes([dst[2 * i], dst[2 * i + 1]]);
            assert_eq!(got, Bf16Rule::TORCH_CPU.convert(*b));
        }
    }
}
