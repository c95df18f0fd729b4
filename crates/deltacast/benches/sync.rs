//! Whole-sync throughput on one slot table: the sender (diff + digest + encode + framing) and
//! the receiver (verify + decode + digest check + apply), next to a plain memory copy of the
//! same bytes. Density 0.1%, 1% and 10% of BF16 elements, ±1 ULP mostly.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use deltacast::flush::FlushConfig;
use deltacast::{CodecChoice, DType, Receiver, Sender, SlotInfo, SlotTable};

fn elements() -> usize {
    std::env::var("DELTACAST_BENCH_ELEMS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(32 << 20)
}

fn table(n: usize) -> SlotTable {
    // Eight slots, like a few transformer matrices.
    SlotTable::new(
        (0..8)
            .map(|i| SlotInfo::new(format!("w{i}"), DType::BF16, vec![(n / 8) as u64]))
            .collect(),
    )
    .unwrap()
}

fn rng(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Base weights and a copy with `density` of the elements moved, mostly by ±1 in the low bits.
fn pair(n: usize, density: f64) -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    let mut s = 42u64;
    let base: Vec<Vec<u8>> = (0..8)
        .map(|_| {
            (0..n / 8)
                .flat_map(|_| (0x3c00u16 | (rng(&mut s) as u16 & 0x03ff)).to_le_bytes())
                .collect()
        })
        .collect();
    let threshold = (density * u64::MAX as f64) as u64;
    let next = base
        .iter()
        .map(|b| {
            let mut b = b.clone();
            for e in b.chunks_exact_mut(2) {
                if rng(&mut s) < threshold {
                    let v = u16::from_le_bytes([e[0], e[1]]);
                    let r = rng(&mut s);
                    let nv = if r.is_multiple_of(8) {
                        v ^ (r as u16 & 0x3ff | 1)
                    } else if r.is_multiple_of(2) {
                        v + 1
                    } else {
                        v - 1
                    };
                    e.copy_from_slice(&nv.to_le_bytes());
                }
            }
            b
        })
        .collect();
    (base, next)
}

fn slices(b: &[Vec<u8>]) -> Vec<&[u8]> {
    b.iter().map(Vec::as_slice).collect()
}

fn bench(c: &mut Criterion) {
    let n = elements();
    let t = table(n);
    let mut group = c.benchmark_group("sync");
    group.sample_size(10);
    group.throughput(Throughput::Bytes((n * 2) as u64));
    let (base, _) = pair(n, 0.0);
    group.bench_function("memcpy", |b| {
        let mut dst: Vec<Vec<u8>> = base.iter().map(|x| vec![0u8; x.len()]).collect();
        b.iter(|| {
            for (d, s) in dst.iter_mut().zip(&base) {
                d.copy_from_slice(s);
            }
        })
    });
    for density in [0.001, 0.01, 0.1] {
        let (a, bb) = pair(n, density);
        for codec in [CodecChoice::Auto, CodecChoice::parse("abs32+raw").unwrap()] {
            let cfg = FlushConfig {
                codec,
                ..FlushConfig::default()
            };
            let id = format!("{}@{}%", codec.name(), density * 100.0);
            group.bench_with_input(BenchmarkId::new("send", &id), &density, |bencher, _| {
                let mut sender = Sender::with_base(t.clone(), cfg, a.clone(), 1).unwrap();
                let (sa, sb) = (slices(&a), slices(&bb));
                let mut flip = false;
                bencher.iter(|| {
                    flip = !flip;
                    let mut bytes = 0usize;
                    sender
                        .delta(if flip { &sb } else { &sa }, |f| {
                            bytes += f.len();
                            Ok(())
                        })
                        .unwrap();
                    bytes
                })
            });
            // Frames for a → b; each iteration applies them to a fresh receiver holding a
            // (built outside the timed region).
            let mut sender = Sender::with_base(t.clone(), cfg, a.clone(), 1).unwrap();
            let mut forward = Vec::new();
            sender
                .delta(&slices(&bb), |f| {
                    forward.push(f);
                    Ok(())
                })
                .unwrap();
            group.bench_with_input(
                BenchmarkId::new("receive_apply", &id),
                &density,
                |bencher, _| {
                    bencher.iter_batched_ref(
                        || Receiver::with_state(t.clone(), a.clone(), Some(1)).unwrap(),
                        |receiver| {
                            for f in &forward {
                                receiver.receive(f).unwrap();
                            }
                        },
                        criterion::BatchSize::PerIteration,
                    )
                },
            );
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
