//! What the kernel suites share (tests/gpu.rs, gpu_apply.rs, gpu_entropy.rs): the GPU, bit
//! patterns that compare wrongly as floats, and random steps over them.
#![allow(dead_code)]

use deltacast::dtype::load_bits;
use deltacast_cuda::Gpu;
use deltacast_testkit::Rng;

/// The GPU; without one the test fails, saying why.
pub fn gpu() -> Gpu {
    Gpu::new(0).unwrap_or_else(|e| panic!("this test needs a GPU (GPU 0): {e}"))
}

pub fn mask(width: usize) -> u32 {
    if width == 4 {
        u32::MAX
    } else {
        (1u32 << (8 * width)) - 1
    }
}

/// A bit pattern: random, or one of the floats that compare wrongly as floats.
pub fn special(rng: &mut Rng, width: usize) -> u32 {
    let pats: &[u32] = match width {
        1 => &[0x00, 0x80, 0x7f, 0xff, 0x01, 0x81, 0x78, 0xf8],
        2 => &[
            0x0000, 0x8000, 0x7fc0, 0x7fc1, 0xffff, 0x7f81, 0x0001, 0x8001, 0x7f80, 0xff80,
        ],
        _ => &[
            0,
            0x8000_0000,
            0x7fc0_0000,
            0x7fc0_0001,
            0xffff_ffff,
            0x7f80_0001,
            1,
            0x8000_0001,
            0x7f80_0000,
        ],
    };
    if rng.chance(0.3) {
        pats[rng.below(pats.len() as u64) as usize]
    } else {
        rng.next_u64() as u32 & mask(width)
    }
}

pub fn fill_old(rng: &mut Rng, numel: usize, width: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(numel * width);
    for _ in 0..numel {
        out.extend_from_slice(&special(rng, width).to_le_bytes()[..width]);
    }
    out
}

/// `old` with about `density` of its elements changed to other bits (±1 ULP mostly, specials).
pub fn mutate(rng: &mut Rng, old: &[u8], width: usize, density: f64) -> Vec<u8> {
    let mut new = old.to_vec();
    for i in 0..old.len() / width {
        if !rng.chance(density) {
            continue;
        }
        let o = load_bits(old, width, i);
        let mut n = match rng.below(4) {
            0 => o.wrapping_add(1) & mask(width),
            1 => o.wrapping_sub(1) & mask(width),
            2 => o ^ (1 << (8 * width - 1)), // sign flip: +0 <-> -0
            _ => special(rng, width),
        };
        if n == o {
            n ^= 1;
        }
        new[i * width..(i + 1) * width].copy_from_slice(&n.to_le_bytes()[..width]);
    }
    new
}

pub fn dl(gpu: &Gpu, ptr: u64, len: usize) -> Vec<u8> {
    // SAFETY: the tests only download what they allocated.
    unsafe { gpu.download(ptr, len) }.expect("download")
}

pub fn u64s(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
