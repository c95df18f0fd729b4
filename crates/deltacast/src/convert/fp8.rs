//! fp32 → block FP8: E4M3FN elements with one fp32 scale per 128×128 block of the last two
//! dimensions, the layout vLLM and SGLang load for block-quantized weights (`weight` in FP8
//! and `weight_scale_inv`, the factor that takes an FP8 element back to the weight's scale).
//!
//! The rule is vLLM's `per_block_cast_to_fp8(x, [128, 128], use_ue8m0=False)`
//! (vllm/utils/deep_gemm.py, vLLM 0.33.0), bit for bit on every block without NaN or ±Inf, with
//! the cases torch leaves to the platform pinned:
//!
//! - `amax` = max |x| over the block, at least fp32(1e-4);
//! - `scale` = amax / 448 and `inv` = 1 / scale, fp32 divisions rounded to nearest even (torch
//!   computes `1.0 / sf` as `sf.reciprocal()`, an IEEE division on CPU and CUDA);
//! - element = E4M3FN(clamp(x · inv, −448, 448)) by torch's own conversion
//!   (`fp8e4m3fn_from_fp32_value`: round to nearest even, subnormals kept); the clamp is the
//!   saturation torch ≥ 2.12 does itself and older versions turn into NaN;
//! - a block holding a NaN: scale `0x7FC00000` and every element `0x7F` (torch would give NaNs
//!   whose sign depends on the platform); a block holding ±Inf and no NaN: scale +Inf, inv 0,
//!   so finite elements become ±0 and the infinities `0x7F` (∞ · 0 is NaN), as in torch.
//!
//! Everything is integer work on bit patterns except the two divisions, the product and the
//! subnormal rounding, which are IEEE fp32 operations (no flush to zero), so the result is the
//! same on every target.

/// Elements per block side.
pub const BLOCK: usize = 128;
/// The largest finite E4M3FN value.
pub const E4M3_MAX: f32 = 448.0;
/// The E4M3FN pattern every NaN becomes.
pub const E4M3_NAN: u8 = 0x7F;
/// The scale of a block holding a NaN.
pub const SCALE_NAN: u32 = 0x7FC0_0000;
/// The smallest amax a scale is computed from (torch's `clamp(1e-4)` of an fp32 tensor).
const AMAX_FLOOR: f32 = 1e-4;

/// The E4M3FN bits of the fp32 value `bits`: torch's `fp8e4m3fn_from_fp32_value`
/// (round to nearest even; past the largest finite value, ±448), every NaN `0x7F`.
#[inline(always)]
pub fn e4m3fn(bits: u32) -> u8 {
    // 480.0, the first magnitude E4M3FN cannot hold.
    const OVER: u32 = 1087 << 20;
    // 2^14: adding it to a magnitude below 2^-6 leaves the subnormal's bits, rounded, at the
    // bottom of the sum's mantissa.
    const DENORM: u32 = 141 << 23;
    let sign = bits & 0x8000_0000;
    let f = bits ^ sign;
    // Every case is computed and one picked, with no branch, so that loops over elements
    // vectorize (the cases not picked may compute nonsense, e.g. Inf in the subnormal sum).
    let subnormal = (f32::from_bits(f) + f32::from_bits(DENORM))
        .to_bits()
        .wrapping_sub(DENORM);
    let odd = (f >> 20) & 1;
    // Rebias the exponent (127 → 7) and round half to even in one add; a carry into the NaN
    // pattern saturates.
    let normal = (f
        .wrapping_add(7u32.wrapping_sub(127) << 23)
        .wrapping_add(0x7FFFF + odd)
        >> 20)
        .min(0x7E);
    let magnitude = if f >= OVER {
        0x7E
    } else if f < 121 << 23 {
        subnormal
    } else {
        normal
    };
    let value = (magnitude | (sign >> 24)) as u8;
    if f > 0x7F80_0000 {
        E4M3_NAN
    } else {
        value
    }
}

/// An element of a block with inverse scale `inv`.
#[inline(always)]
pub fn quantize(bits: u32, inv: f32) -> u8 {
    // `clamp` keeps NaN, which `e4m3fn` maps to its one pattern.
    e4m3fn(
        (f32::from_bits(bits) * inv)
            .clamp(-E4M3_MAX, E4M3_MAX)
            .to_bits(),
    )
}

/// The scale of a block whose largest magnitude has bits `amax` (NaN patterns above +Inf).
#[inline]
pub fn scale_of(amax: u32) -> u32 {
    if amax > 0x7F80_0000 {
        return SCALE_NAN;
    }
    (f32::from_bits(amax).max(AMAX_FLOOR) / E4M3_MAX).to_bits()
}

/// The factor a block's elements are multiplied by: `1 / scale` (NaN for a NaN scale).
#[inline]
pub fn inverse(scale: u32) -> f32 {
    1.0 / f32::from_bits(scale)
}

/// How a tensor of at least two dimensions splits into blocks: `batch` matrices (the product
/// of the leading dimensions) of `rows × cols`, each cut into 128×128 blocks (the last ones
/// short). Scales are row-major over `[batch, row blocks, col blocks]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockGrid {
    pub batch: usize,
    pub rows: usize,
    pub cols: usize,
}

impl BlockGrid {
    /// The grid of a tensor of `shape`; None for fewer than two dimensions or a size that
    /// does not fit this machine's memory.
    pub fn of(shape: &[u64]) -> Option<BlockGrid> {
        let [lead @ .., rows, cols] = shape else {
            return None;
        };
        let batch = lead
            .iter()
            .try_fold(1u64, |a, &d| a.checked_mul(d))
            .and_then(|b| usize::try_from(b).ok())?;
        let (rows, cols) = (usize::try_from(*rows).ok()?, usize::try_from(*cols).ok()?);
        batch.checked_mul(rows)?.checked_mul(cols)?;
        Some(BlockGrid { batch, rows, cols })
    }

    pub fn row_blocks(&self) -> usize {
        self.rows.div_ceil(BLOCK)
    }

    pub fn col_blocks(&self) -> usize {
        self.cols.div_ceil(BLOCK)
    }

    /// Elements of the tensor.
    pub fn elements(&self) -> usize {
        self.batch * self.rows * self.cols
    }

    /// Scales of the tensor (one per block).
    pub fn scales(&self) -> usize {
        self.batch * self.row_blocks() * self.col_blocks()
    }

    /// The shape of the scale tensor of a tensor of `shape`: the last two dimensions divided
    /// by the block, rounded up.
    pub fn scale_shape(shape: &[u64]) -> Vec<u64> {
        let mut s = shape.to_vec();
        let n = s.len();
        for d in s.iter_mut().skip(n.saturating_sub(2)) {
            *d = d.div_ceil(BLOCK as u64);
        }
        s
    }

    /// The index of the first scale of flat element `e`'s row, and the element's column.
    #[inline]
    fn row_start(&self, e: usize) -> (usize, usize) {
        let row = e / self.cols;
        let (b, r) = (row / self.rows, row % self.rows);
        (
            (b * self.row_blocks() + r / BLOCK) * self.col_blocks(),
            e % self.cols,
        )
    }

    /// Calls `f(first, end, inv)` for each run of flat elements `[first, end)` within
    /// `[from, to)` that shares one block (so one factor), in order.
    #[inline(always)]
    pub fn runs(&self, inv: &[f32], from: usize, to: usize, mut f: impl FnMut(usize, usize, f32)) {
        if self.cols == 0 {
            return;
        }
        let mut e = from;
        while e < to {
            let (row_scales, col) = self.row_start(e);
            let row_end = (e - col + self.cols).min(to);
            let mut c = col;
            while e < row_end {
                let end = (e + BLOCK - c % BLOCK).min(row_end);
                f(e, end, inv[row_scales + c / BLOCK]);
                c += end - e;
                e = end;
            }
        }
    }
}

/// The scales of every block of the fp32 tensor `source` (little-endian, `grid.elements()`
/// values), as fp32 bits, into `out` (replaced).
///
/// # Panics
/// If `source` is not `4 · grid.elements()` bytes (a caller bug: lengths are checked against
/// the slot table first).
pub fn block_scales(grid: &BlockGrid, source: &[u8], out: &mut Vec<u32>) {
    assert_eq!(
        source.len(),
        4 * grid.elements(),
        "fp32 source does not match its block grid"
    );
    out.clear();
    out.resize(grid.scales(), 0);
    if grid.elements() == 0 {
        return;
    }
    // Largest magnitude per block as bits: non-negative floats order as their bit patterns,
    // and NaNs lie above +Inf, so one integer max finds both.
    let (cb, rows) = (grid.col_blocks(), grid.rows);
    for (row, bytes) in source.chunks_exact(4 * grid.cols).enumerate() {
        let (b, r) = (row / rows, row % rows);
        let first = (b * grid.row_blocks() + r / BLOCK) * cb;
        for (k, block) in bytes.chunks(4 * BLOCK).enumerate() {
            let m = block
                .chunks_exact(4)
                .map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]]) & 0x7FFF_FFFF)
                .fold(0u32, u32::max);
            let slot = &mut out[first + k];
            *slot = (*slot).max(m);
        }
    }
    for s in out.iter_mut() {
        *s = scale_of(*s);
    }
}

/// `1 / scale` of every scale.
pub fn inverses(scales: &[u32], out: &mut Vec<f32>) {
    out.clear();
    out.extend(scales.iter().map(|&s| inverse(s)));
}

/// Quantizes elements `[first, first + dest.len())` of `source` (the whole tensor's fp32
/// bytes) into `dest` with the factors `inv` of `grid`'s blocks.
///
/// # Panics
/// If the range is outside the tensor (a caller bug).
pub fn quantize_range(grid: &BlockGrid, inv: &[f32], source: &[u8], first: usize, dest: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the AVX2 build's one feature, detected on this CPU (cached by std).
        return unsafe { quantize_range_avx2(grid, inv, source, first, dest) };
    }
    quantize_range_portable(grid, inv, source, first, dest)
}

/// [`quantize_range_portable`] compiled for AVX2: eight elements a vector instead of four (the
/// loop is branch-free, so the compiler vectorizes it). Same bytes.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn quantize_range_avx2(
    grid: &BlockGrid,
    inv: &[f32],
    source: &[u8],
    first: usize,
    dest: &mut [u8],
) {
    quantize_range_portable(grid, inv, source, first, dest)
}

#[inline(always)]
fn quantize_range_portable(
    grid: &BlockGrid,
    inv: &[f32],
    source: &[u8],
    first: usize,
    dest: &mut [u8],
) {
    let src = &source[4 * first..4 * (first + dest.len())];
    grid.runs(inv, first, first + dest.len(), |a, b, f| {
        let (s, d) = (
            &src[4 * (a - first)..4 * (b - first)],
            &mut dest[a - first..b - first],
        );
        for (q, w) in d.iter_mut().zip(s.chunks_exact(4)) {
            *q = quantize(u32::from_le_bytes([w[0], w[1], w[2], w[3]]), f);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    /// The value of E4M3FN bits, from the format's definition (bias 7, 3 mantissa bits,
    /// S.1111.111 NaN, no infinities).
    fn value(q: u8) -> f64 {
        let sign = if q & 0x80 != 0 { -1.0 } else { 1.0 };
        let (e, m) = (((q >> 3) & 0xF) as i32, (q & 7) as f64);
        if e == 0xF && m == 7.0 {
            return f64::NAN;
        }
        sign * if e == 0 {
            m / 8.0 * 2f64.powi(-6)
        } else {
            (1.0 + m / 8.0) * 2f64.powi(e - 7)
        }
    }

    /// Independent oracle: the nearest E4M3FN value by search over all 254 finite patterns,
    /// ties to the even pattern, magnitudes beyond 448 to ±448.
    fn nearest(x: f32) -> u8 {
        if x.is_nan() {
            return E4M3_NAN;
        }
        let sign = if x.is_sign_negative() { 0x80 } else { 0 };
        if x.is_infinite() {
            return 0x7E | sign;
        }
        let x = x as f64;
        let mut best = 0u8;
        let mut dist = f64::INFINITY;
        for q in 0u8..=0x7E {
            let d = (value(q) - x.abs()).abs();
            if d < dist || (d == dist && q & 1 == 0) {
                best = q;
                dist = d;
            }
        }
        // −0.0 and negative values keep their sign (torch keeps −0).
        best | sign
    }

    #[test]
    fn every_pattern_class_matches_the_nearest_value() {
        let mut rng = Rng(8);
        let mut probes: Vec<u32> = vec![
            0,
            0x8000_0000,
            1,
            0x8000_0001,
            0x7F80_0000,
            0xFF80_0000,
            0x7FC0_0000,
            0xFFC0_0001,
            448f32.to_bits(),
            464f32.to_bits(),
            464f32.to_bits() + 1,
            479.9f32.to_bits(),
            480f32.to_bits(),
            2f32.powi(-6).to_bits(),
            2f32.powi(-9).to_bits(),
            2f32.powi(-10).to_bits(),
            (2f32.powi(-10) * 1.0001).to_bits(),
            (2f32.powi(-9) * 1.5).to_bits(),
        ];
        // Every E4M3FN value, and the midpoints between neighbours (exact ties) and their
        // fp32 neighbours.
        for q in 0u8..=0x7E {
            let v = value(q) as f32;
            probes.push(v.to_bits());
            let next = value(q + 1);
            if !next.is_nan() {
                let mid = ((value(q) + next) / 2.0) as f32;
                probes.extend([mid.to_bits(), mid.to_bits() + 1, mid.to_bits() - 1]);
            }
        }
        for _ in 0..200_000 {
            let x = (rng.unit() as f32 * 2.0 - 1.0) * 2f32.powi(rng.below(30) as i32 - 14);
            probes.push(x.to_bits());
        }
        for &p in &probes {
            for bits in [p, p ^ 0x8000_0000] {
                let x = f32::from_bits(bits);
                assert_eq!(e4m3fn(bits), nearest(x), "{x:e} ({bits:#010x})");
            }
        }
    }

    /// The naive rule on one block: amax, the scale and every element, from the definition.
    fn naive_block(values: &[f32]) -> (u32, Vec<u8>) {
        if values.iter().any(|v| v.is_nan()) {
            return (SCALE_NAN, vec![E4M3_NAN; values.len()]);
        }
        let amax = values.iter().fold(0f32, |a, v| a.max(v.abs())).max(1e-4);
        let scale = amax / 448.0;
        let inv = 1.0 / scale;
        let q = values
            .iter()
            .map(|&v| nearest((v * inv).clamp(-448.0, 448.0)))
            .collect();
        (scale.to_bits(), q)
    }

    fn le(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn tensors_match_a_block_by_block_oracle() {
        let mut rng = Rng(128);
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            0.0,
            -0.0,
            1e-40,
            -3e-39,
        ];
        for shape in [
            vec![1u64, 1],
            vec![3, 5],
            vec![128, 128],
            vec![129, 127],
            vec![300, 257],
            vec![2, 130, 200],
            vec![2, 3, 1, 129],
            vec![0, 7],
            vec![7, 0],
        ] {
            let grid = BlockGrid::of(&shape).unwrap();
            let n = grid.elements();
            let mut x: Vec<f32> = (0..n)
                .map(|_| (rng.unit() as f32 - 0.5) * 2f32.powi(rng.below(12) as i32 - 8))
                .collect();
            // A few specials, a tiny block (amax under the floor), an all-zero one.
            for _ in 0..n / 5000 + 1 {
                if n > 0 {
                    let at = rng.below(n as u64) as usize;
                    x[at] = specials[rng.below(specials.len() as u64) as usize];
                }
            }
            let mut scales = vec![];
            block_scales(&grid, &le(&x), &mut scales);
            assert_eq!(scales.len(), grid.scales());
            assert_eq!(
                BlockGrid::scale_shape(&shape).iter().product::<u64>() as usize,
                grid.scales()
            );
            let mut inv = vec![];
            inverses(&scales, &mut inv);
            let mut q = vec![0u8; n];
            quantize_range(&grid, &inv, &le(&x), 0, &mut q);
            // Oracle: gather each block's elements by coordinates.
            let (rb, cb) = (grid.row_blocks(), grid.col_blocks());
            for b in 0..grid.batch {
                for i in 0..rb {
                    for j in 0..cb {
                        let mut at = vec![];
                        for r in i * BLOCK..((i + 1) * BLOCK).min(grid.rows) {
                            for c in j * BLOCK..((j + 1) * BLOCK).min(grid.cols) {
                                at.push((b * grid.rows + r) * grid.cols + c);
                            }
                        }
                        let vals: Vec<f32> = at.iter().map(|&e| x[e]).collect();
                        let (s, want) = naive_block(&vals);
                        let k = (b * rb + i) * cb + j;
                        assert_eq!(scales[k], s, "{shape:?} block {k}");
                        let got: Vec<u8> = at.iter().map(|&e| q[e]).collect();
                        assert_eq!(got, want, "{shape:?} block {k}");
                    }
                }
            }
            // Any sub-range quantizes the same as the whole.
            if n > 10 {
                let (a, len) = (n / 3, n / 2);
                let mut part = vec![0u8; len];
                quantize_range(&grid, &inv, &le(&x), a, &mut part);
                assert_eq!(part, q[a..a + len]);
            }
        }
    }

    #[test]
    fn edge_blocks() {
        let grid = BlockGrid::of(&[2, 3]).unwrap();
        let cases: [(&[f32; 6], u32, [u8; 6]); 4] = [
            // All zero: amax floored at 1e-4, elements +0 / −0.
            (
                &[0.0, -0.0, 0.0, 0.0, 0.0, 0.0],
                (1e-4f32 / 448.0).to_bits(),
                [0, 0x80, 0, 0, 0, 0],
            ),
            // amax exactly representable: it maps to 448.
            (
                &[448.0, -448.0, 1.0, 0.0, 0.0, 0.0],
                1f32.to_bits(),
                [0x7E, 0xFE, 0x38, 0, 0, 0],
            ),
            // Inf, no NaN: scale +Inf, finite → ±0, Inf → NaN.
            (
                &[f32::INFINITY, -1.0, 1.0, 0.0, 0.0, 0.0],
                f32::INFINITY.to_bits(),
                [0x7F, 0x80, 0, 0, 0, 0],
            ),
            // NaN anywhere: the whole block NaN.
            (&[f32::NAN, 1.0, 2.0, 3.0, 4.0, 5.0], SCALE_NAN, [0x7F; 6]),
        ];
        for (x, scale, q) in cases {
            let mut s = vec![];
            block_scales(&grid, &le(x), &mut s);
            assert_eq!(s, [scale], "{x:?}");
            let mut inv = vec![];
            inverses(&s, &mut inv);
            let mut got = [0u8; 6];
            quantize_range(&grid, &inv, &le(x), 0, &mut got);
            assert_eq!(got, q, "{x:?}");
        }
        assert_eq!(BlockGrid::of(&[5]), None);
        assert_eq!(BlockGrid::scale_shape(&[4, 300, 129]), vec![4, 3, 2]);
    }
}
