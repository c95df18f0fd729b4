//! Test helpers shared by the unit tests: a seeded generator and change-set makers.
#![allow(dead_code)]

/// SplitMix64: small, seeded and good enough for test data (no dependency on `rand`'s API).
pub(crate) struct Rng(pub u64);

impl Rng {
    pub(crate) fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (`n > 0`).
    pub(crate) fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }

    /// Uniform in `[0, 1)`.
    pub(crate) fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// True with probability `p` (never for `p = 0`; one draw either way).
    pub(crate) fn chance(&mut self, p: f64) -> bool {
        self.unit() <= p && p > 0.0
    }

    pub(crate) fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// Sorted positions in `0..range`, each present with probability `density`.
pub(crate) fn bernoulli_positions(rng: &mut Rng, range: u32, density: f64) -> Vec<u32> {
    if density >= 1.0 {
        return (0..range).collect();
    }
    (0..range).filter(|_| rng.unit() < density).collect()
}

/// A signed ULP step drawn like AdamW on BF16: ~87% ±1 (as on the recorded trace,
/// crates/deltacast/tests/data/traces/README.md), then a decaying tail of small steps, and
/// ~1% jumps of hundreds to tens of thousands of ULPs (weights near zero).
pub(crate) fn adamw_step(rng: &mut Rng) -> i64 {
    let sign = if rng.next_u64() & 1 == 0 { 1 } else { -1 };
    let r = rng.unit();
    let mag = if r < 0.87 {
        1
    } else if r < 0.99 {
        let bits = 1 + rng.below(7) as u32;
        (1u64 << bits) + rng.below(1u64 << bits)
    } else {
        let bits = 8 + rng.below(8) as u32;
        (1u64 << bits) + rng.below(1u64 << bits)
    };
    sign * mag as i64
}

/// `n` BF16 weights (a spread of magnitudes around ±0.02) and their values after
/// one AdamW-like step each (ULP steps from [`adamw_step`], wrapping in the ordered view).
pub(crate) fn adamw_bf16(rng: &mut Rng, n: usize) -> (Vec<u8>, Vec<u8>) {
    use crate::dtype::{from_ordered, to_ordered};
    let mut old = Vec::with_capacity(2 * n);
    let mut new = Vec::with_capacity(2 * n);
    for _ in 0..n {
        let w = (rng.unit() * 2.0 - 1.0) * 0.05;
        let bits = (((w as f32).to_bits()) >> 16) as u16 as u32;
        let step = adamw_step(rng);
        let moved = (to_ordered(bits, 2) as i64 + step).rem_euclid(1 << 16) as u32;
        let after = from_ordered(moved, 2);
        old.extend_from_slice(&(bits as u16).to_le_bytes());
        new.extend_from_slice(&(after as u16).to_le_bytes());
    }
    (old, new)
}
