//! Diff throughput against the memory-bound limit.
//!
//! * `diff_parallel/*`: a BF16 shard (1 GiB; `DELTACAST_BENCH_BYTES` shrinks it) diffed with the
//!   default kernel on the whole rayon pool, at 0.1 %, 1 % and 10 % changed elements, next to
//!   `plain_read`, an XOR-fold of both buffers with the same chunking: the limit any diff can
//!   reach, since it must read both buffers too.
//! * `diff_serial/*`: every available kernel single-threaded on a 64 MiB BF16 buffer (or the
//!   big size, if smaller), with a single-threaded `plain_read` for scale.
//!
//! Throughput is shard bytes per second (the diff reads twice that: snapshot and current).
//!
//! Every iteration must see the same density, yet each one refreshes the snapshot. So the bench
//! keeps two "current" buffers, the pristine original `p` and its mutation `c`, and alternates:
//! with the snapshot at `p`, diffing against `c` finds the changes and refreshes it to `c`; the
//! next iteration diffs against `p`, which finds the same positions (old and new swapped) and
//! refreshes back to `p`. Every iteration does the full work at the intended density, with no
//! copy outside the timed region. The output `Changes` is reused (cleared each time), as a
//! sender reuses its buffers across syncs.

use std::hint::black_box;
use std::time::Instant;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use deltacast::diff::{
    available_impls, best_impl, diff_and_refresh, diff_serial_with, Changes, DiffImpl,
    PAR_CHUNK_ELEMS,
};
use rayon::prelude::*;

const WIDTH: usize = 2;
const DENSITIES: [(f64, &str); 3] = [(0.001, "0.1%"), (0.01, "1%"), (0.1, "10%")];
/// The serial kernels also at 50%, the densest point of the codec benchmarks.
const SERIAL_DENSITIES: [(f64, &str); 4] =
    [(0.001, "0.1%"), (0.01, "1%"), (0.1, "10%"), (0.5, "50%")];

/// Bytes of the big shard: 1 GiB unless `DELTACAST_BENCH_BYTES` says otherwise (rounded down to
/// whole elements). An unparsable value is ignored rather than trusted.
fn big_bytes() -> usize {
    let default = 1usize << 30;
    let bytes = std::env::var("DELTACAST_BENCH_BYTES")
        .ok()
        .and_then(|v| v.trim().parse::<usize>().ok())
        .unwrap_or(default);
    (bytes / WIDTH * WIDTH).max(WIDTH)
}

/// splitmix64: fast, seedable, and dependency-free.
fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A pristine random buffer, filled in parallel (1 GiB serially takes seconds).
fn pristine(bytes: usize) -> Vec<u8> {
    let mut p = vec![0u8; bytes];
    p.par_chunks_mut(1 << 20)
        .enumerate()
        .for_each(|(i, chunk)| {
            let mut s = i as u64 * 0x1234_5678_9abc_def1;
            for word in chunk.chunks_mut(8) {
                let r = splitmix(&mut s).to_le_bytes();
                word.copy_from_slice(&r[..word.len()]);
            }
        });
    p
}

/// `p` with each element changed with probability `density`: the low mantissa bits flip, as a
/// small optimizer step does to BF16 weights.
fn mutated(p: &[u8], density: f64) -> Vec<u8> {
    let threshold = (density * u64::MAX as f64) as u64;
    let mut c = p.to_vec();
    c.par_chunks_mut(1 << 20)
        .enumerate()
        .for_each(|(i, chunk)| {
            let mut s = (i as u64).wrapping_mul(0x5851_f42d_4c95_7f2d) ^ density.to_bits();
            for elem in chunk.chunks_exact_mut(WIDTH) {
                if splitmix(&mut s) < threshold {
                    elem[0] ^= (splitmix(&mut s) as u8 & 0x7) | 1;
                }
            }
        });
    c
}

/// The memory-bound limit: read both buffers once, with the diff's chunking, and fold.
fn plain_read_parallel(a: &[u8], b: &[u8]) -> u64 {
    let chunk = PAR_CHUNK_ELEMS * WIDTH;
    a.par_chunks(chunk)
        .zip(b.par_chunks(chunk))
        .map(|(x, y)| xor_fold(x, y))
        .reduce(|| 0, |l, r| l ^ r)
}

fn xor_fold(a: &[u8], b: &[u8]) -> u64 {
    let mut acc = [0u64; 8];
    for (x, y) in a.chunks_exact(64).zip(b.chunks_exact(64)) {
        for (k, acc) in acc.iter_mut().enumerate() {
            let xa = u64::from_le_bytes(x[8 * k..8 * k + 8].try_into().expect("8 bytes"));
            let ya = u64::from_le_bytes(y[8 * k..8 * k + 8].try_into().expect("8 bytes"));
            *acc ^= xa ^ ya;
        }
    }
    acc.iter().fold(0, |l, r| l ^ r)
}

/// Alternating state for one density: see the module comment.
struct Alternating<'a> {
    p: &'a [u8],
    c: Vec<u8>,
    snapshot: Vec<u8>,
    snapshot_is_p: bool,
    out: Changes,
}

impl<'a> Alternating<'a> {
    fn new(p: &'a [u8], density: f64) -> Self {
        Alternating {
            p,
            c: mutated(p, density),
            snapshot: p.to_vec(),
            snapshot_is_p: true,
            out: Changes::default(),
        }
    }

    /// One diff at the intended density; returns the change count.
    fn step(&mut self, diff: impl FnOnce(&mut [u8], &[u8], &mut Changes)) -> usize {
        let current = if self.snapshot_is_p {
            &self.c[..]
        } else {
            self.p
        };
        self.out.clear();
        diff(&mut self.snapshot, current, &mut self.out);
        self.snapshot_is_p = !self.snapshot_is_p;
        self.out.len()
    }
}

/// Rounds of the interleaved check in [`paired`].
const PAIRED_ROUNDS: usize = 15;

/// Times `run(true)` (the plain read) and `run(false)` (the diff) alternately and prints their
/// best throughputs and ratio. On a shared machine the bandwidth drifts between criterion's
/// benchmarks, which run one after the other; interleaving puts both under the same
/// conditions, so this ratio is the figure to trust.
fn paired(label: &str, bytes: usize, mut run: impl FnMut(bool)) {
    let (mut best_plain, mut best_diff) = (f64::MAX, f64::MAX);
    let mut ratios = Vec::with_capacity(PAIRED_ROUNDS);
    for _ in 0..PAIRED_ROUNDS {
        let t = Instant::now();
        run(true);
        let tp = t.elapsed().as_secs_f64();
        let t = Instant::now();
        run(false);
        let td = t.elapsed().as_secs_f64();
        best_plain = best_plain.min(tp);
        best_diff = best_diff.min(td);
        ratios.push(tp / td);
    }
    ratios.sort_by(f64::total_cmp);
    let gib = bytes as f64 / (1u64 << 30) as f64;
    eprintln!(
        "{label}: plain_read {:.2} GiB/s, diff {:.2} GiB/s, best/best {:.0}%, \
         median of round ratios {:.0}% ({PAIRED_ROUNDS} interleaved rounds)",
        gib / best_plain,
        gib / best_diff,
        100.0 * best_plain / best_diff,
        100.0 * ratios[PAIRED_ROUNDS / 2],
    );
}

fn bench_parallel(c: &mut Criterion) {
    let bytes = big_bytes();
    let p = pristine(bytes);
    let mut group = c.benchmark_group("diff_parallel");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(bytes as u64));
    let q = mutated(&p, 0.01);
    group.bench_function(BenchmarkId::new("plain_read", bytes), |b| {
        b.iter(|| black_box(plain_read_parallel(&p, &q)))
    });
    drop(q);
    for (density, label) in DENSITIES {
        let mut state = Alternating::new(&p, density);
        let expected = state.step(|s, cur, out| diff_and_refresh(s, cur, WIDTH, 0, out));
        eprintln!(
            "diff_parallel {label}: {expected} changes of {} elements, kernel {}",
            bytes / WIDTH,
            best_impl()
        );
        paired(&format!("diff_parallel paired {label}"), bytes, |plain| {
            if plain {
                black_box(plain_read_parallel(state.p, &state.c));
            } else {
                black_box(state.step(|s, cur, out| diff_and_refresh(s, cur, WIDTH, 0, out)));
            }
        });
        group.bench_function(BenchmarkId::new(format!("diff_{label}"), bytes), |b| {
            b.iter(|| {
                let n = state.step(|s, cur, out| diff_and_refresh(s, cur, WIDTH, 0, out));
                debug_assert_eq!(n, expected);
                black_box(n)
            })
        });
    }
    group.finish();
}

fn bench_serial(c: &mut Criterion) {
    let bytes = big_bytes().min(64 << 20);
    let p = pristine(bytes);
    let mut group = c.benchmark_group("diff_serial");
    group.sample_size(10);
    group.throughput(Throughput::Bytes(bytes as u64));
    let q = mutated(&p, 0.01);
    group.bench_function(BenchmarkId::new("plain_read", bytes), |b| {
        b.iter(|| black_box(xor_fold(&p, &q)))
    });
    drop(q);
    for (density, label) in SERIAL_DENSITIES {
        let mut state = Alternating::new(&p, density);
        for kind in available_impls() {
            let run = |kind: DiffImpl| {
                move |s: &mut [u8], cur: &[u8], out: &mut Changes| {
                    diff_serial_with(kind, s, cur, WIDTH, 0, out)
                }
            };
            group.bench_function(BenchmarkId::new(format!("{kind}_{label}"), bytes), |b| {
                b.iter(|| black_box(state.step(run(kind))))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench_parallel, bench_serial);
criterion_main!(benches);
