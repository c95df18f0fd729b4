//! Helpers shared by the deltacast crates' integration tests, benchmarks and examples (a
//! dev-dependency only, never published): a seeded generator, random slot tables and
//! buffers, mutations with special bit patterns, and in [`adamw_chunk`] the codec
//! benchmarks' chunk.

pub mod adamw_chunk;
pub mod hostile;

use deltacast::{DType, SlotInfo, SlotTable};

/// A small deterministic generator (splitmix64) so failures reproduce from the seed.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    pub fn chance(&mut self, p: f64) -> bool {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64 <= p
    }

    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// Special bit patterns per width: NaN payloads, ±0, ±inf, subnormals, max.
pub fn specials(width: usize) -> Vec<u32> {
    match width {
        1 => vec![0x00, 0x80, 0x7f, 0xff, 0x01, 0x81, 0x7c, 0xfc, 0x7e, 0x79],
        2 => vec![
            0x0000, 0x8000, 0x7fc0, 0x7fc1, 0xffc1, 0x7f80, 0xff80, 0x0001, 0x8001, 0x7c01, 0x7e00,
            0xffff,
        ],
        _ => vec![
            0,
            0x8000_0000,
            0x7fc0_0000,
            0x7fc0_0001,
            0xffc0_0123,
            0x7f80_0000,
            0xff80_0000,
            1,
            0x8000_0001,
            0xffff_ffff,
        ],
    }
}

/// Mutates `density` of the elements of `buf`, some to special patterns, some by ±1 in the last bit.
pub fn mutate(rng: &mut Rng, buf: &mut [u8], width: usize, density: f64) {
    let n = buf.len() / width;
    let sp = specials(width);
    for i in 0..n {
        if !rng.chance(density) {
            continue;
        }
        let at = i * width;
        let mut bits = [0u8; 4];
        bits[..width].copy_from_slice(&buf[at..at + width]);
        let old = u32::from_le_bytes(bits);
        let new = match rng.below(4) {
            0 => sp[rng.below(sp.len() as u64) as usize],
            1 => old ^ 1,
            2 => old.wrapping_add(1 + rng.below(1000) as u32),
            _ => rng.next_u64() as u32,
        };
        let mask = if width == 4 {
            u32::MAX
        } else {
            (1u32 << (width * 8)) - 1
        };
        let new = if new & mask == old {
            old ^ 1
        } else {
            new & mask
        };
        buf[at..at + width].copy_from_slice(&new.to_le_bytes()[..width]);
    }
}

/// A random table of `n` slots of random dtypes and shapes (including empty and odd sizes).
pub fn random_table(rng: &mut Rng, n: usize, max_numel: u64) -> SlotTable {
    let slots = (0..n)
        .map(|i| {
            let dtype = DType::ALL[rng.below(5) as usize];
            let shape = match rng.below(4) {
                0 => vec![rng.below(max_numel + 1)],
                1 => vec![rng.below(17) + 1, rng.below(max_numel / 17 + 1) + 1],
                2 => vec![],
                _ => vec![rng.below(5), rng.below(7) + 1, 3],
            };
            SlotInfo::new(format!("layer.{i}.weight"), dtype, shape)
        })
        .collect();
    SlotTable::new(slots).expect("a random table is valid")
}

pub fn random_buffers(rng: &mut Rng, table: &SlotTable) -> Vec<Vec<u8>> {
    table
        .slots()
        .iter()
        .map(|s| {
            let mut b = rng.bytes(s.nbytes() as usize);
            // Sprinkle specials into the base too.
            mutate(rng, &mut b, s.dtype.width(), 0.05);
            b
        })
        .collect()
}

pub fn slices(bufs: &[Vec<u8>]) -> Vec<&[u8]> {
    bufs.iter().map(Vec::as_slice).collect()
}
