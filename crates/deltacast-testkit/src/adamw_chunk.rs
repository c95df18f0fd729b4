//! The codec benchmarks' chunk (`deltacast`'s `benches/codecs.rs` and `examples/codec_ab.rs`):
//! sorted positions at a density over a range of BF16 elements, with AdamW-like ULP steps
//! (~87% ±1 as on the recorded trace, crates/deltacast/tests/data/traces/README.md; a tail of
//! small steps, ~1% jumps of hundreds to tens of thousands of ULPs), the same on every run.

use deltacast::dtype::{from_ordered, to_ordered};

/// SplitMix64, seeded: the same chunk on every run. Its own generator, not [`crate::Rng`]:
/// it draws `below` by a multiply-high where that one takes a remainder, and the chunk must
/// stay the bytes every recorded benchmark figure was measured on.
struct ChunkRng(u64);

impl ChunkRng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    fn below(&mut self, n: u64) -> u64 {
        ((self.next_u64() as u128 * n as u128) >> 64) as u64
    }
}

/// One chunk: sorted positions and the old and new BF16 bits there.
pub struct Chunk {
    pub rel: Vec<u32>,
    pub old: Vec<u8>,
    pub new: Vec<u8>,
}

/// The chunk at `density` over `range` elements.
pub fn chunk(density: f64, range: u32) -> Chunk {
    chunk_seeded(density, range, 0)
}

/// Another chunk of the same kind for each `seed` (0 gives [`chunk`]'s).
pub fn chunk_seeded(density: f64, range: u32, seed: u64) -> Chunk {
    let mut rng = ChunkRng(density.to_bits() ^ seed.wrapping_mul(0x9e37_79b9_7f4a_7c15));
    let rel: Vec<u32> = (0..range).filter(|_| rng.unit() < density).collect();
    let (mut old, mut new) = (Vec::new(), Vec::new());
    for _ in &rel {
        let w = ((rng.unit() * 2.0 - 1.0) * 0.05) as f32;
        let bits = w.to_bits() >> 16;
        let r = rng.unit();
        let mag = if r < 0.87 {
            1
        } else if r < 0.99 {
            let b = 1 + rng.below(7);
            (1 << b) + rng.below(1 << b)
        } else {
            let b = 8 + rng.below(8);
            (1 << b) + rng.below(1 << b)
        } as i64;
        let step = if rng.next_u64() & 1 == 0 { mag } else { -mag };
        let after = from_ordered(
            (to_ordered(bits, 2) as i64 + step).rem_euclid(1 << 16) as u32,
            2,
        );
        old.extend_from_slice(&(bits as u16).to_le_bytes());
        new.extend_from_slice(&(after as u16).to_le_bytes());
    }
    Chunk { rel, old, new }
}
