//! A sender fed fp32 sources for block-FP8 slots: the receivers end up with exactly the block
//! quantization of those sources (E4M3FN elements and their fp32 scales in slots of their own),
//! step after step, and the digests agree. The oracle quantizes block by block with its own
//! code: each element by a search for the nearest E4M3FN value, not the crate's bit arithmetic.

mod common;

use common::*;
use deltacast::flush::FlushConfig;
use deltacast::{DType, Error, FrameKind, Receiver, Sender, SlotInfo, SlotTable, Source};

const BLOCK: usize = 128;

/// The value of E4M3FN bits from the format's definition.
fn e4m3_value(q: u8) -> f64 {
    let (e, m) = (((q >> 3) & 0xF) as i32, (q & 7) as f64);
    let v = if e == 0 {
        m / 8.0 * 2f64.powi(-6)
    } else {
        (1.0 + m / 8.0) * 2f64.powi(e - 7)
    };
    if q & 0x80 != 0 {
        -v
    } else {
        v
    }
}

/// The nearest finite E4M3FN pattern (ties to even), sign kept; NaN → 0x7F.
fn nearest(x: f32) -> u8 {
    if x.is_nan() {
        return 0x7F;
    }
    let sign = if x.is_sign_negative() { 0x80 } else { 0 };
    let a = (x as f64).abs();
    let mut best = (0u8, f64::INFINITY);
    for q in 0u8..=0x7E {
        let d = (e4m3_value(q) - a).abs();
        if d < best.1 || (d == best.1 && q & 1 == 0) {
            best = (q, d);
        }
    }
    best.0 | sign
}

/// (FP8 bytes, scale bytes) of `x` shaped `[batch, rows, cols]`.
fn oracle(x: &[f32], batch: usize, rows: usize, cols: usize) -> (Vec<u8>, Vec<u8>) {
    let (rb, cb) = (rows.div_ceil(BLOCK), cols.div_ceil(BLOCK));
    let mut q = vec![0u8; x.len()];
    let mut scales = vec![];
    for b in 0..batch {
        for i in 0..rb {
            for j in 0..cb {
                let at: Vec<usize> = (i * BLOCK..((i + 1) * BLOCK).min(rows))
                    .flat_map(|r| {
                        (j * BLOCK..((j + 1) * BLOCK).min(cols))
                            .map(move |c| (b * rows + r) * cols + c)
                    })
                    .collect();
                let nan = at.iter().any(|&e| x[e].is_nan());
                let amax = at.iter().fold(0f32, |m, &e| m.max(x[e].abs())).max(1e-4);
                let scale = if nan {
                    f32::from_bits(0x7FC0_0000)
                } else {
                    amax / 448.0
                };
                let inv = 1.0 / scale;
                for &e in &at {
                    q[e] = if nan {
                        0x7F
                    } else {
                        nearest((x[e] * inv).clamp(-448.0, 448.0))
                    };
                }
                scales.extend(scale.to_bits().to_le_bytes());
            }
        }
    }
    (q, scales)
}

/// Uniform in [0, 1).
fn unit(rng: &mut Rng) -> f32 {
    (rng.next_u64() >> 40) as f32 / (1u64 << 24) as f32
}

fn le(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// An AdamW-like step on fp32 masters: every weight moves by about `lr`, a few elements take
/// edge values.
fn step(rng: &mut Rng, w: &mut [f32], lr: f32) {
    for x in w.iter_mut() {
        *x = match rng.below(4000) {
            0 => [f32::INFINITY, -0.0, 0.0, 1e-42, 5e3][rng.below(5) as usize],
            1 if x.is_infinite() => 0.25,
            _ => *x - lr * (unit(rng) * 2.0 - 1.0),
        };
    }
}

#[test]
fn f32_sources_reach_receivers_as_block_fp8() {
    let mut rng = Rng(448);
    // An FP8 matrix with short edge blocks, a 3-D expert stack whose scale slot comes first,
    // and a bf16 slot beside them (converted too).
    let table = SlotTable::new(vec![
        SlotInfo::new("q.weight", DType::F8E4M3, vec![200, 300]),
        SlotInfo::new("q.weight_scale_inv", DType::F32, vec![2, 3]),
        SlotInfo::new("experts.w13_weight_scale_inv", DType::F32, vec![3, 2, 1]),
        SlotInfo::new("norm", DType::BF16, vec![300]),
        SlotInfo::new("experts.w13_weight", DType::F8E4M3, vec![3, 130, 64]),
    ])
    .unwrap();
    let shapes = [(1usize, 200usize, 300usize), (3, 130, 64)];
    let fp8_ids = [0usize, 4];
    let scale_ids = [1usize, 2];
    let mut masters: Vec<Vec<f32>> = shapes
        .iter()
        .map(|&(b, r, c)| {
            (0..b * r * c)
                .map(|_| (unit(&mut rng) - 0.5) * 0.1)
                .collect()
        })
        .collect();
    let mut norm: Vec<f32> = (0..300).map(|_| unit(&mut rng)).collect();
    let mut sender = Sender::new(table.clone(), FlushConfig::default()).unwrap();
    let mut receivers = [Receiver::new(table.clone()), Receiver::new(table.clone())];
    let mut changed_some = false;
    for s in 0..6 {
        if s > 0 {
            let lr = if s == 3 { 3e-3 } else { 2e-5 };
            for m in masters.iter_mut() {
                step(&mut rng, m, lr);
            }
            step(&mut rng, &mut norm, 1e-3);
        }
        // Expert 0's first block stays tiny (its amax under the floor) and has a zero.
        for m in masters[1].iter_mut().take(BLOCK * 64) {
            *m = (unit(&mut rng) - 0.5) * 1e-5;
        }
        masters[1][77] = 0.0;
        if s == 4 {
            masters[0][1000] = f32::NAN;
        }
        if s == 5 {
            masters[0][1000] = 0.5;
        }
        let bytes: Vec<Vec<u8>> = masters.iter().map(|m| le(m)).collect();
        let norm_bytes = le(&norm);
        let sources = [
            Source::new(DType::F32, &bytes[0]),
            Source::derived(),
            Source::derived(),
            Source::new(DType::F32, &norm_bytes),
            Source::new(DType::F32, &bytes[1]),
        ];
        let mut frames = Vec::new();
        let report = sender
            .sync_from(&sources, |f| {
                frames.push(f);
                Ok(())
            })
            .unwrap();
        assert_eq!(
            report.kind,
            if s == 0 {
                FrameKind::Seed
            } else {
                FrameKind::Delta
            }
        );
        changed_some |= s > 0 && report.stats.changed > 0;
        for r in receivers.iter_mut() {
            let mut done = None;
            for f in &frames {
                done = r.receive(f).unwrap();
            }
            let outcome = done.expect("the last frame completes the sync");
            assert_eq!(outcome.state_digest, report.state_digest);
            assert!(r.recompute_digests().is_empty());
            for (k, &(b, rows, cols)) in shapes.iter().enumerate() {
                let (q, scales) = oracle(&masters[k], b, rows, cols);
                assert!(r.store()[fp8_ids[k]] == q, "step {s}: FP8 slot {k}");
                assert_eq!(r.store()[scale_ids[k]], scales, "step {s}: scales {k}");
            }
        }
    }
    assert!(
        changed_some,
        "the steps changed nothing: the test would prove nothing"
    );
}

#[test]
fn fp8_sources_are_refused_where_the_table_cannot_hold_them() {
    let f32s = le(&[0.5f32; 256]);
    let try_sync = |slots: Vec<SlotInfo>, sources: &[Source<'_>]| -> Error {
        let mut sender =
            Sender::new(SlotTable::new(slots).unwrap(), FlushConfig::default()).unwrap();
        sender.sync_from(sources, |_| Ok(())).unwrap_err()
    };
    let fp8 = |shape: Vec<u64>| SlotInfo::new("w", DType::F8E4M3, shape);
    let scales = |shape: Vec<u64>| SlotInfo::new("w_scale_inv", DType::F32, shape);
    let cases: Vec<(Vec<SlotInfo>, Vec<Source<'_>>, &str)> = vec![
        // One dimension: no blocks.
        (
            vec![fp8(vec![256]), scales(vec![2])],
            vec![Source::new(DType::F32, &f32s), Source::derived()],
            "two or more dimensions",
        ),
        // No scale slot.
        (
            vec![fp8(vec![16, 16])],
            vec![Source::new(DType::F32, &f32s)],
            "lacks",
        ),
        // A scale slot of the wrong shape, or dtype.
        (
            vec![fp8(vec![16, 16]), scales(vec![2, 1])],
            vec![Source::new(DType::F32, &f32s), Source::derived()],
            "needs F32 [1, 1]",
        ),
        (
            vec![
                fp8(vec![16, 16]),
                SlotInfo::new("w_scale_inv", DType::BF16, vec![1, 1]),
            ],
            vec![Source::new(DType::F32, &f32s), Source::derived()],
            "needs F32",
        ),
        // The scale slot given bits of its own.
        (
            vec![fp8(vec![16, 16]), scales(vec![1, 1])],
            vec![
                Source::new(DType::F32, &f32s),
                Source::new(DType::F32, &f32s[..4]),
            ],
            "no source of its own",
        ),
        // A wrong source length.
        (
            vec![fp8(vec![16, 16]), scales(vec![1, 1])],
            vec![Source::new(DType::F32, &f32s[..8]), Source::derived()],
            "source has 8 bytes",
        ),
    ];
    for (slots, sources, why) in cases {
        let err = try_sync(slots, &sources);
        assert!(err.to_string().contains(why), "{err} (wanted: {why})");
    }
    // A source of another dtype has no conversion.
    let err = try_sync(
        vec![fp8(vec![16, 16]), scales(vec![1, 1])],
        &[Source::new(DType::BF16, &f32s[..512]), Source::derived()],
    );
    assert!(matches!(err, Error::UnsupportedConversion { .. }), "{err}");
}
