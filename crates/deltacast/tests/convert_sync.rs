//! A sender fed fp32 sources for bf16 slots: the receivers end up with exactly the torch-rule
//! rounding of those sources, step after step, and the digests agree. The oracle here rounds
//! with its own code (truncate, then round up past the half or at an odd tie), not the crate's.

mod common;

use common::*;
use deltacast::flush::FlushConfig;
use deltacast::{
    Bf16Rule, DType, Error, FrameKind, Receiver, Sender, SlotInfo, SlotTable, Source, WeightSender,
};

/// torch's fp32 → bf16, spelled differently from `Bf16Rule::convert`.
fn oracle_bf16(bits: u32, nan: u16) -> u16 {
    let (exp, mant) = ((bits >> 23) & 0xFF, bits & 0x7F_FFFF);
    if exp == 0xFF && mant != 0 {
        return nan;
    }
    let (hi, lo) = (bits >> 16, bits & 0xFFFF);
    let up = lo > 0x8000 || (lo == 0x8000 && hi & 1 == 1);
    (hi + u32::from(up)) as u16
}

fn oracle_slot(src: &[u32], nan: u16) -> Vec<u8> {
    src.iter()
        .flat_map(|&b| oracle_bf16(b, nan).to_le_bytes())
        .collect()
}

fn le(words: &[u32]) -> Vec<u8> {
    words.iter().flat_map(|w| w.to_le_bytes()).collect()
}

const EDGES: [u32; 12] = [
    0x7FC0_0000,
    0xFFC0_0001,
    0x7F80_0001,
    0x7F80_0000,
    0xFF80_0000,
    0x0000_0000,
    0x8000_0000,
    0x0000_8000,
    0x8000_8001,
    0x3F80_8000,
    0x3F81_8000,
    0x7F7F_FFFF,
];

fn pick(rng: &mut Rng) -> u32 {
    match rng.below(5) {
        0 => EDGES[rng.below(EDGES.len() as u64) as usize],
        1 => rng.next_u64() as u32,
        _ => ((rng.below(2_000_000) as f32 - 1e6) * 1e-6).to_bits(),
    }
}

/// One training-like step: most weights unchanged, some nudged below bf16 precision, some
/// moved for real, a few NaN payloads rewritten (invisible once rounded) or edges written.
fn step(rng: &mut Rng, w: &mut [u32]) {
    for b in w.iter_mut() {
        *b = match rng.below(20) {
            0 => *b ^ 1,
            1 => (f32::from_bits(*b) * 1.01).to_bits(),
            2 if (*b & 0x7FFF_FFFF) > 0x7F80_0000 => *b ^ 0x0000_0F00,
            3 => pick(rng),
            _ => *b,
        };
    }
}

fn relay(
    sender: &mut Sender,
    receivers: &mut [Receiver],
    sources: &[Source<'_>],
) -> (FrameKind, u64) {
    let mut frames = Vec::new();
    let report = sender
        .sync_from(sources, |f| {
            frames.push(f);
            Ok(())
        })
        .unwrap();
    for r in receivers.iter_mut() {
        let mut done = None;
        for f in &frames {
            done = r.receive(f).unwrap();
        }
        let outcome = done.expect("last frame completes the sync");
        assert_eq!(outcome.state_digest, report.state_digest);
        assert_eq!(outcome.version, sender.version());
        assert!(r.recompute_digests().is_empty());
    }
    (report.kind, report.stats.changed)
}

#[test]
fn f32_sources_reach_receivers_as_torch_bf16() {
    for rule in [Bf16Rule::TORCH_CPU, Bf16Rule::TORCH_SCALAR] {
        let mut rng = Rng(2026 + u64::from(rule.nan));
        // Converted slots of odd, empty and multi-chunk sizes, next to plain bf16 and f32 ones.
        let table = SlotTable::new(vec![
            SlotInfo::new("a", DType::BF16, vec![4097]),
            SlotInfo::new("plain_bf16", DType::BF16, vec![33]),
            SlotInfo::new("empty", DType::BF16, vec![0]),
            SlotInfo::new("master_f32", DType::F32, vec![7, 3]),
            SlotInfo::new("b", DType::BF16, vec![3, 1_000_003]),
            SlotInfo::new("one", DType::BF16, vec![1]),
        ])
        .unwrap();
        let converted = [0usize, 2, 4, 5];
        let mut fp32: Vec<Vec<u32>> = table
            .slots()
            .iter()
            .map(|s| (0..s.numel()).map(|_| pick(&mut rng)).collect())
            .collect();
        let mut sender = Sender::new(table.clone(), FlushConfig::default()).unwrap();
        sender.set_bf16_rule(rule);
        let mut receivers = vec![Receiver::new(table.clone()), Receiver::new(table.clone())];
        let mut expected_prev: Option<Vec<Vec<u8>>> = None;
        for s in 0..5 {
            if s > 0 {
                for w in &mut fp32 {
                    step(&mut rng, w);
                }
            }
            // The plain bf16 slot is fed its own bits (the low halves of the fp32 draw).
            let bytes: Vec<Vec<u8>> = fp32
                .iter()
                .enumerate()
                .map(|(i, w)| match i {
                    1 => w.iter().flat_map(|b| (*b as u16).to_le_bytes()).collect(),
                    _ => le(w),
                })
                .collect();
            let sources: Vec<Source<'_>> = table
                .slots()
                .iter()
                .enumerate()
                .map(|(i, slot)| {
                    let dtype = if converted.contains(&i) {
                        DType::F32
                    } else {
                        slot.dtype
                    };
                    Source::new(dtype, &bytes[i])
                })
                .collect();
            let expected: Vec<Vec<u8>> = (0..table.len())
                .map(|i| {
                    if converted.contains(&i) {
                        oracle_slot(&fp32[i], rule.nan)
                    } else {
                        bytes[i].clone()
                    }
                })
                .collect();
            let (kind, changed) = relay(&mut sender, &mut receivers, &sources);
            if let Some(prev) = &expected_prev {
                assert_eq!(kind, FrameKind::Delta);
                // Exactly the elements whose rounded bits moved went out.
                let want: u64 = table
                    .slots()
                    .iter()
                    .enumerate()
                    .map(|(i, slot)| {
                        let w = slot.dtype.width();
                        prev[i]
                            .chunks(w)
                            .zip(expected[i].chunks(w))
                            .filter(|(a, b)| a != b)
                            .count() as u64
                    })
                    .sum();
                assert_eq!(changed, want, "step {s}");
                assert!(
                    want > 0 && want < table.total_elements() / 4,
                    "step {s}: {want}"
                );
            } else {
                assert_eq!(kind, FrameKind::Seed);
            }
            for r in &receivers {
                assert!(
                    r.store() == &expected,
                    "step {s}: receiver is not the rounding of fp32"
                );
            }
            expected_prev = Some(expected);
        }
    }
}

#[test]
fn unsupported_pairs_and_wrong_lengths_are_typed_errors() {
    let table = SlotTable::new(vec![
        SlotInfo::new("w", DType::BF16, vec![4]),
        SlotInfo::new("m", DType::F32, vec![2]),
    ])
    .unwrap();
    let mut sender = Sender::new(table, FlushConfig::default()).unwrap();
    let f32s = [0u8; 16];
    let bf16s = [0u8; 8];
    let m = [0u8; 8];
    let mut sink = |_f: Vec<u8>| Ok(());
    for (from, bytes) in [(DType::F16, &bf16s[..]), (DType::F64, &f32s[..])] {
        let err = sender
            .sync_from(
                &[Source::new(from, bytes), Source::new(DType::F32, &m)],
                &mut sink,
            )
            .unwrap_err();
        assert!(
            matches!(err, Error::UnsupportedConversion { ref slot, from: f, to: DType::BF16 } if slot == "w" && f == from),
            "{err}"
        );
    }
    // No bf16 → f32 widening.
    let err = sender
        .sync_from(
            &[
                Source::new(DType::BF16, &bf16s),
                Source::new(DType::BF16, &[0u8; 4]),
            ],
            &mut sink,
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::UnsupportedConversion {
                from: DType::BF16,
                to: DType::F32,
                ..
            }
        ),
        "{err}"
    );
    // An fp32 source the size of the bf16 slot (a common slip) is refused, not half-read.
    let err = sender
        .sync_from(
            &[Source::new(DType::F32, &bf16s), Source::new(DType::F32, &m)],
            &mut sink,
        )
        .unwrap_err();
    assert!(
        matches!(err, Error::SlotMismatch { ref slot, .. } if slot == "w"),
        "{err}"
    );
    let err = sender
        .sync_from(&[Source::new(DType::F32, &f32s)], &mut sink)
        .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err}");
    // Nothing went out: the next sync is still the first seed.
    assert_eq!(sender.version(), 0);
    let report = sender
        .sync_from(
            &[Source::new(DType::F32, &f32s), Source::new(DType::F32, &m)],
            &mut sink,
        )
        .unwrap();
    assert_eq!(report.kind, FrameKind::Seed);
}
