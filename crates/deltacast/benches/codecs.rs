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
use std::hint::black_box;
use std::time::Duration;

const RANGE: u32 = 1 << 20;
const DENSITIES: [f64; 4] = [0.001, 0.01, 0.1, 0.5];

use deltacast_testkit::adamw_chunk::{chunk, Chunk};

fn codecs(c: &mut Criterion) {
    let chunks: Vec<(f64, Chunk)> = DENSITIES.iter().map(|&d| (d, chunk(d, RANGE))).collect();
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
            // `esc` values decode only with their `steps` map (examples/codec_ab.rs times the pair).
            for codec in ValCodec::ALL
                .into_iter()
                .filter(|&c| c != ValCodec::Escaped)
            {
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
        let ch = chunk(density, RANGE);
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
