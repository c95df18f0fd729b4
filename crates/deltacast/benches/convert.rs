//! The converting diff (fp32 source, bf16 snapshot) next to the plain bf16 diff of the same
//! tensor, both on the whole rayon pool, at 1 % and 10 % of elements changed after rounding.
//! `DELTACAST_BENCH_ELEMS` sets the tensor size (default 2^24 elements).
//!
//! As in benches/diff.rs, each iteration alternates between two sources, the pristine one and
//! its mutation, so every iteration finds the same changes and refreshes the snapshot back.
//!
//! One run, 2026-12-02, 2-core AMD EPYC VM (shared, load ~1), 2^24 elements: plain bf16 1.78 ms
//! (1 %) / 2.79 ms (10 %), converting 4.74 ms / 5.03 ms, i.e. 2.7× / 1.8× the plain diff, which
//! reads 64 MiB to the converting diff's 96 MiB. The conversion is auto-vectorised only.
//!
//! `f32_to_fp8`: the same source quantized to block FP8 on the fly (a [n / 4096, 4096] matrix;
//! the scales' pass is not in it). 2026-12-07, the same kind of VM without AVX-512, idle, 2^24
//! elements: plain bf16 3.37 ms (1 %) / 7.37 ms (10 %), fp32 → bf16 6.87 / 10.83 ms, fp32 → FP8
//! 5.85 / 5.84 ms (12.5 / 14.1 ms before its loop was built for AVX2 and made branch-free).

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use deltacast::convert::fp8::{block_scales, inverses, quantize_range, BlockGrid};
use deltacast::diff::{diff_and_refresh, diff_f32_as_bf16, diff_f32_as_fp8, Changes};
use deltacast::Bf16Rule;

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn elems() -> usize {
    std::env::var("DELTACAST_BENCH_ELEMS")
        .ok()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(1 << 24)
}

fn bench(c: &mut Criterion) {
    let n = elems();
    let rule = Bf16Rule::TORCH_CPU;
    let mut g = c.benchmark_group("convert_diff");
    g.throughput(Throughput::Elements(n as u64));
    for (density, label) in [(0.01, "1%"), (0.1, "10%")] {
        let mut s = 26u64;
        // Weights of magnitude ~1; a changed element moves by a bf16 ulp or more.
        let p32: Vec<u32> = (0..n)
            .map(|_| ((splitmix(&mut s) >> 40) as f32 / (1u64 << 24) as f32 + 0.5).to_bits())
            .collect();
        let threshold = (density * u64::MAX as f64) as u64;
        let c32: Vec<u32> = p32
            .iter()
            .map(|&b| {
                if splitmix(&mut s) < threshold {
                    b ^ 0x0001_0000
                } else {
                    b
                }
            })
            .collect();
        let bytes = |w: &[u32]| w.iter().flat_map(|b| b.to_le_bytes()).collect::<Vec<u8>>();
        let (p, cur) = (bytes(&p32), bytes(&c32));
        let half = |src: &[u8]| {
            let mut out = vec![0u8; src.len() / 2];
            rule.convert_slice(src, &mut out);
            out
        };
        let (p16, c16) = (half(&p), half(&cur));
        let mut out = Changes::default();

        let mut snap = p16.clone();
        let mut flip = false;
        g.bench_function(BenchmarkId::new("plain_bf16", label), |b| {
            b.iter(|| {
                flip = !flip;
                out.clear();
                let src = if flip { &c16 } else { &p16 };
                diff_and_refresh(&mut snap, src, 2, 0, &mut out);
                black_box(out.len())
            })
        });
        let mut snap = p16.clone();
        let mut flip = false;
        g.bench_function(BenchmarkId::new("f32_to_bf16", label), |b| {
            b.iter(|| {
                flip = !flip;
                out.clear();
                let src = if flip { &cur } else { &p };
                diff_f32_as_bf16(&mut snap, src, rule, 0, &mut out);
                black_box(out.len())
            })
        });
        // Block FP8 of the same source as a [n / 4096, 4096] matrix: the diff quantizing on
        // the fly with the block factors of the pristine source (the scales' own pass, one
        // read of the source per sync, is not in it).
        let grid = BlockGrid::of(&[(n / 4096) as u64, 4096]).expect("2-D");
        let (mut scales, mut inv) = (vec![], vec![]);
        block_scales(&grid, &p, &mut scales);
        inverses(&scales, &mut inv);
        let mut snap = vec![0u8; n];
        quantize_range(&grid, &inv, &p, 0, &mut snap);
        let mut flip = false;
        g.bench_function(BenchmarkId::new("f32_to_fp8", label), |b| {
            b.iter(|| {
                flip = !flip;
                out.clear();
                let src = if flip { &cur } else { &p };
                diff_f32_as_fp8(&mut snap, src, &grid, &inv, 0, &mut out);
                black_box(out.len())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
