//! Encode and decode throughput of every position and value codec on one chunk of
//! 2^20 BF16 elements at 0.1%, 1%, 10% and 50% density, with AdamW-like ULP steps
//! (~87% ±1, a tail of small steps, ~1% jumps of hundreds to tens of thousands of ULPs),
//! and of the encoder's choice of codecs for the chunk (`chunk/auto`).
//!
//! Criterion reports changes per second (`elem/s`); elements of the range per second are
//! that divided by the density in the benchmark name. `cargo bench -p deltacast --bench codecs`.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use deltacast::codec::{
    decode_positions, decode_values, encode_chunk, encode_positions, encode_values, CodecChoice,
    PosCodec, ValCodec,
};
use deltacast::dtype::{from_ordered, to_ordered};
use std::hint::black_box;
use std::time::Duration;

const RANGE: u32 = 1 << 20;
const DENSITIES: [f64; 4] = [0.001, 0.01, 0.1, 0.5];

/// SplitMix64, seeded: the same chunk on every run.
struct Rng(u64);

impl Rng {
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
struct Chunk {
    rel: Vec<u32>,
    old: Vec<u8>,
    new: Vec<u8>,
}

fn chunk(density: f64) -> Chunk {
    let mut rng = Rng(density.to_bits());
    let rel: Vec<u32> = (0..RANGE).filter(|_| rng.unit() < density).collect();
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

fn codecs(c: &mut Criterion) {
    let chunks: Vec<(f64, Chunk)> = DENSITIES.iter().map(|&d| (d, chunk(d))).collect();
    let configure = |g: &mut criterion::BenchmarkGroup<'_, _>| {
        g.sample_size(10)
            .warm_up_time(Duration::from_millis(200))
            .measurement_time(Duration::from_millis(600));
    };

    for (name, decode) in [("positions/encode", false), ("positions/decode", true)] {
        let mut group = c.benchmark_group(name);
        configure(&mut group);
        for (density, ch) in &chunks {
            group.throughput(Throughput::Elements(ch.rel.len() as u64));
            for codec in [PosCodec::Abs32, PosCodec::Gaps, PosCodec::Bitmap] {
                let mut enc = Vec::new();
                encode_positions(codec, &ch.rel, RANGE, &mut enc);
                let id = BenchmarkId::new(codec.name(), format!("density={density}"));
                if decode {
                    let mut out = Vec::new();
                    group.bench_function(id, |b| {
                        b.iter(|| {
                            decode_positions(
                                codec,
                                black_box(&enc),
                                ch.rel.len() as u32,
                                RANGE,
                                &mut out,
                            )
                        })
                    });
                } else {
                    group.bench_function(id, |b| {
                        b.iter(|| {
                            enc.clear();
                            encode_positions(codec, black_box(&ch.rel), RANGE, &mut enc)
                        })
                    });
                }
            }
        }
        group.finish();
    }

    for (name, decode) in [("values/encode", false), ("values/decode", true)] {
        let mut group = c.benchmark_group(name);
        configure(&mut group);
        for (density, ch) in &chunks {
            group.throughput(Throughput::Elements(ch.rel.len() as u64));
            for codec in ValCodec::ALL {
                let mut enc = Vec::new();
                encode_values(codec, 2, &ch.old, &ch.new, &mut enc);
                let id = BenchmarkId::new(codec.name(), format!("density={density}"));
                if decode {
                    let mut out = Vec::new();
                    group.bench_function(id, |b| {
                        b.iter(|| decode_values(codec, 2, black_box(&enc), &ch.old, &mut out))
                    });
                } else {
                    group.bench_function(id, |b| {
                        b.iter(|| {
                            enc.clear();
                            encode_values(codec, 2, black_box(&ch.old), &ch.new, &mut enc)
                        })
                    });
                }
            }
        }
        group.finish();
    }
}

/// The whole choice for one chunk (`encode_chunk` with `Auto`): every candidate sized, the
/// smallest positions and values written.
fn auto(c: &mut Criterion) {
    let mut group = c.benchmark_group("chunk/auto");
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(200))
        .measurement_time(Duration::from_millis(600));
    for density in DENSITIES {
        let ch = chunk(density);
        group.throughput(Throughput::Elements(ch.rel.len() as u64));
        group.bench_function(
            BenchmarkId::new("encode", format!("density={density}")),
            |b| {
                b.iter(|| {
                    encode_chunk(
                        CodecChoice::Auto,
                        2,
                        black_box(&ch.rel),
                        RANGE,
                        &ch.old,
                        &ch.new,
                    )
                })
            },
        );
    }
    group.finish();
}

criterion_group!(benches, codecs, auto);
criterion_main!(benches);
