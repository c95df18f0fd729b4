//! End-to-end property tests: sender → frames → receiver reproduces the sender's bits, for
//! every dtype, size, density, codec and bucket size; no frame exceeds the bucket size.

mod common;

use common::*;
use deltacast::codec::{CodecChoice, PosCodec, ValCodec};
use deltacast::flush::FlushConfig;
use deltacast::WeightSender;
use deltacast::{FrameKind, Receiver, Sender};
use proptest::prelude::*;

fn run_sync(sender: &mut Sender, receivers: &mut [Receiver], current: &[Vec<u8>]) -> (u64, usize) {
    let mut frames = Vec::new();
    let report = sender
        .sync(&slices(current), |f| {
            frames.push(f);
            Ok(())
        })
        .unwrap();
    let bucket = sender.config().bucket_size;
    for f in &frames {
        assert!(
            f.len() <= bucket,
            "frame of {} bytes above bucket {bucket}",
            f.len()
        );
    }
    for r in receivers.iter_mut() {
        let mut done = None;
        for (i, f) in frames.iter().enumerate() {
            let out = r.receive(f).unwrap();
            assert_eq!(out.is_some(), i + 1 == frames.len());
            done = out;
        }
        let outcome = done.unwrap();
        assert_eq!(outcome.state_digest, report.state_digest);
        assert_eq!(outcome.version, sender.version());
        assert_eq!(r.store(), &current.to_vec(), "receiver differs from sender");
        assert!(r.recompute_digests().is_empty());
    }
    (report.stats.changed, frames.len())
}

fn config(bucket: usize, chunk: u64, codec: CodecChoice) -> FlushConfig {
    FlushConfig {
        bucket_size: bucket,
        chunk_elems: chunk,
        codec,
    }
}

const CODECS: [CodecChoice; 5] = [
    CodecChoice::Auto,
    CodecChoice::AutoContext,
    CodecChoice::Fixed(PosCodec::Abs32, ValCodec::Raw),
    CodecChoice::Fixed(PosCodec::Bitmap, ValCodec::Raw),
    CodecChoice::Fixed(PosCodec::Steps, ValCodec::Escaped),
];

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, .. ProptestConfig::default() })]

    #[test]
    fn apply_of_diff_reproduces_new(seed in any::<u64>(), slots in 0usize..6, density in prop::sample::select(vec![0.0, 0.001, 0.02, 0.3, 1.0]),
                                    bucket in prop::sample::select(vec![1024usize, 1500, 4096, 1 << 20]), chunk in prop::sample::select(vec![1u64, 7, 64, 1000, 1 << 20]),
                                    codec in 0usize..CODECS.len()) {
        let mut rng = Rng(seed);
        let table = random_table(&mut rng, slots, 3000);
        let mut current = random_buffers(&mut rng, &table);
        let mut sender = Sender::new(table.clone(), config(bucket, chunk, CODECS[codec])).unwrap();
        let mut receivers = vec![Receiver::new(table.clone()), Receiver::new(table.clone())];
        run_sync(&mut sender, &mut receivers, &current);
        for _ in 0..3 {
            for (slot, buf) in table.slots().iter().zip(current.iter_mut()) {
                mutate(&mut rng, buf, slot.dtype.width(), density);
            }
            run_sync(&mut sender, &mut receivers, &current);
        }
    }
}

#[test]
fn changes_on_chunk_and_bucket_boundaries() {
    let table = deltacast::SlotTable::new(vec![deltacast::SlotInfo::new(
        "w",
        deltacast::DType::BF16,
        vec![4096],
    )])
    .unwrap();
    let base: Vec<u8> = (0..4096u32)
        .flat_map(|i| (i as u16).to_le_bytes())
        .collect();
    for chunk in [1u64, 63, 64, 65, 1024] {
        for bucket in [1024usize, 1100, 2048] {
            let mut sender = Sender::new(
                table.clone(),
                config(
                    bucket,
                    chunk,
                    CodecChoice::Fixed(PosCodec::Abs32, ValCodec::Raw),
                ),
            )
            .unwrap();
            let mut receivers = vec![Receiver::new(table.clone())];
            let mut current = vec![base.clone()];
            run_sync(&mut sender, &mut receivers, &current);
            // Every element around every multiple of the chunk size, plus first and last.
            let mut positions = vec![0usize, 4095];
            let mut p = chunk as usize;
            while p < 4096 {
                positions.extend([p - 1, p, (p + 1).min(4095)]);
                p += chunk as usize;
            }
            positions.sort_unstable();
            positions.dedup();
            for &i in &positions {
                current[0][2 * i] ^= 0x5a;
            }
            let (changed, _) = run_sync(&mut sender, &mut receivers, &current);
            assert_eq!(changed, positions.len() as u64);
        }
    }
}

#[test]
fn nan_payloads_signed_zeros_and_subnormals_round_trip_and_count_as_changes() {
    let table = deltacast::SlotTable::new(vec![
        deltacast::SlotInfo::new("bf", deltacast::DType::BF16, vec![6]),
        deltacast::SlotInfo::new("f32", deltacast::DType::F32, vec![4]),
    ])
    .unwrap();
    let bf_old: Vec<u16> = vec![0x0000, 0x7fc1, 0x0001, 0x8000, 0x3f80, 0xffc1];
    let bf_new: Vec<u16> = vec![0x8000, 0x7fc2, 0x0002, 0x0000, 0x3f80, 0xffc1];
    let f_old: Vec<u32> = vec![0x7fc0_0001, 0, 1, 0x8000_0001];
    let f_new: Vec<u32> = vec![0x7fc0_0002, 0x8000_0000, 2, 0x8000_0001];
    let enc16 = |v: &[u16]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    let enc32 = |v: &[u32]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
    for codec in CODECS {
        let mut sender = Sender::new(table.clone(), config(4096, 1 << 20, codec)).unwrap();
        let mut receivers = vec![Receiver::new(table.clone())];
        run_sync(
            &mut sender,
            &mut receivers,
            &[enc16(&bf_old), enc32(&f_old)],
        );
        let (changed, _) = run_sync(
            &mut sender,
            &mut receivers,
            &[enc16(&bf_new), enc32(&f_new)],
        );
        assert_eq!(changed, 4 + 3);
    }
}

#[test]
fn seed_then_verify_frame_checks_memory() {
    let mut rng = Rng(5);
    let table = random_table(&mut rng, 4, 500);
    let current = random_buffers(&mut rng, &table);
    let mut sender = Sender::new(table.clone(), FlushConfig::default()).unwrap();
    let mut receivers = vec![Receiver::new(table.clone())];
    run_sync(&mut sender, &mut receivers, &current);
    let mut frames = Vec::new();
    sender
        .verify(|f| {
            frames.push(f);
            Ok(())
        })
        .unwrap();
    let outcome = receivers[0].receive(&frames[0]).unwrap().unwrap();
    assert_eq!(outcome.kind, FrameKind::Verify);
}

/// The acceptance bound of the codec issue: at any density the delta costs at most the dense
/// values plus 1% (and the framing), even with incompressible values.
#[test]
fn dense_deltas_never_cost_more_than_the_dense_values() {
    let n = 1usize << 18;
    for dtype in [
        deltacast::DType::F8E4M3,
        deltacast::DType::BF16,
        deltacast::DType::F32,
    ] {
        let width = dtype.width();
        let table =
            deltacast::SlotTable::new(vec![deltacast::SlotInfo::new("w", dtype, vec![n as u64])])
                .unwrap();
        for density in [0.3, 0.6, 0.9, 0.97, 0.999, 1.0] {
            let mut rng = Rng((density * 1000.0) as u64 + width as u64);
            let base = vec![rng.bytes(n * width)];
            let mut next = base.clone();
            // Random new patterns: values do not compress, positions must not add to them.
            for i in 0..n {
                if rng.chance(density) {
                    let at = i * width;
                    let old = next[0][at];
                    next[0][at] = old.wrapping_add(1 + (rng.below(255) as u8));
                }
            }
            let mut sender = Sender::new(table.clone(), FlushConfig::default()).unwrap();
            let mut receivers = vec![Receiver::new(table.clone())];
            run_sync(&mut sender, &mut receivers, &base);
            let mut wire = 0usize;
            let mut frames = Vec::new();
            let report = sender
                .sync(&slices(&next), |f| {
                    wire += f.len();
                    frames.push(f);
                    Ok(())
                })
                .unwrap();
            for f in &frames {
                receivers[0].receive(f).unwrap();
            }
            assert_eq!(receivers[0].store(), &next);
            let dense = (n * width) as f64;
            let framing = 64.0 * report.stats.chunks as f64 + 256.0;
            assert!(
                wire as f64 <= dense * 1.01 + framing,
                "{dtype} at {density}: {wire} bytes for {dense} dense ({:?})",
                report.stats.codecs
            );
        }
    }
}

/// A store that only lends one slot at a time (like borrowed tensors): the receiver applies
/// slot by slot, chunks of a slot in parallel, and must end with the same bits.
struct OneAtATime(Vec<Vec<u8>>);

impl deltacast::SlotStore for OneAtATime {
    fn slot(&self, id: u32) -> &[u8] {
        &self.0[id as usize]
    }

    fn slot_mut(&mut self, id: u32) -> &mut [u8] {
        &mut self.0[id as usize]
    }
}

#[test]
fn a_store_without_slots_mut_applies_the_same() {
    let mut rng = Rng(77);
    let table = random_table(&mut rng, 5, 40_000);
    let mut current = random_buffers(&mut rng, &table);
    let mut sender = Sender::new(table.clone(), config(1 << 16, 1000, CodecChoice::Auto)).unwrap();
    let zeros = table
        .slots()
        .iter()
        .map(|s| vec![0u8; s.nbytes() as usize])
        .collect();
    let mut plain = Receiver::with_state(table.clone(), OneAtATime(zeros), None).unwrap();
    let mut owned = Receiver::new(table.clone());
    for step in 0..4 {
        if step > 0 {
            for (slot, buf) in table.slots().iter().zip(current.iter_mut()) {
                mutate(
                    &mut rng,
                    buf,
                    slot.dtype.width(),
                    [0.3, 0.02, 0.001][step - 1],
                );
            }
        }
        let mut frames = Vec::new();
        let report = sender
            .sync(&slices(&current), |f| {
                frames.push(f);
                Ok(())
            })
            .unwrap();
        for f in &frames {
            plain.receive(f).unwrap();
            owned.receive(f).unwrap();
        }
        assert_eq!(plain.state_digest(), report.state_digest);
        assert_eq!(plain.store().0, current, "step {step}");
        assert_eq!(owned.store(), &current, "step {step}");
    }
}

mod staged;

/// Syncs laid out as the GPU sends them (one frame per stage of consecutive slots, each stage
/// dense or delta with the digest records of its own slots, sections split at values_start),
/// over random tables (empty and odd-sized slots, every dtype), random changes with NaN
/// payloads, ±0 and subnormals among them, random stage cuts and chunk grids: the receiver
/// ends exactly where the changes, applied by hand from a map, say, whether it stages, writes
/// flushes as they arrive, or borrows one slot at a time.
#[test]
fn staged_dense_and_delta_mixes_apply_like_a_naive_reference() {
    use staged::Stage;
    use std::collections::HashMap;

    let mut mixed = 0;
    for case in 0..80u64 {
        let mut rng = Rng(1000 + case);
        let n = 1 + rng.below(6) as usize;
        let table = random_table(&mut rng, n, 3000);
        let base = random_buffers(&mut rng, &table);
        // The reference: (slot, element) → new bits, applied by hand.
        let mut changes: HashMap<(usize, usize), Vec<u8>> = HashMap::new();
        for (s, info) in table.slots().iter().enumerate() {
            let w = info.dtype.width();
            let density = [0.0, 0.01, 0.3, 1.0][rng.below(4) as usize];
            let sp = specials(w);
            for i in 0..info.numel() as usize {
                if !rng.chance(density) {
                    continue;
                }
                let bits = if rng.chance(0.3) {
                    sp[rng.below(sp.len() as u64) as usize]
                } else {
                    rng.next_u64() as u32
                };
                let new = bits.to_le_bytes()[..w].to_vec();
                if new != base[s][i * w..(i + 1) * w] {
                    changes.insert((s, i), new);
                }
            }
        }
        let mut expected = base.clone();
        for (&(s, i), bits) in &changes {
            let w = bits.len();
            expected[s][i * w..(i + 1) * w].copy_from_slice(bits);
        }
        // Stages: consecutive runs of slots, each dense or delta (sometimes one stage of all).
        let mut stages = Vec::new();
        let mut first = 0;
        while first < n {
            let len = if case % 5 == 0 {
                n
            } else {
                1 + rng.below((n - first) as u64) as usize
            };
            let len = len.min(n - first);
            let kind = if rng.chance(0.5) {
                Stage::Dense
            } else {
                Stage::Delta
            };
            stages.push((first..first + len, kind));
            first += len;
        }
        let chunk = [1u64, 7, 64, 1000, 1 << 20][rng.below(5) as usize];
        let codec = CODECS[rng.below(CODECS.len() as u64) as usize];
        // Every third case packs the sections at odd offsets (alignment is not a rule).
        let align = (case % 3 == 1).then_some((1, 1));
        let frames =
            staged::staged_sync_aligned(&table, 2, &base, &expected, &stages, chunk, codec, align);
        let all_dense = stages.iter().all(|(_, k)| *k == Stage::Dense);
        mixed += usize::from(!all_dense && stages.iter().any(|(_, k)| *k == Stage::Dense));
        let changed: u64 = stages
            .iter()
            .flat_map(|(slots, kind)| slots.clone().map(move |s| (s, *kind)))
            .map(|(s, kind)| match kind {
                Stage::Dense => table.slots()[s].numel(),
                Stage::Delta => changes.keys().filter(|&&(cs, _)| cs == s).count() as u64,
            })
            .sum();
        let want_digest = (0..n)
            .map(|s| {
                deltacast::digest::digest_slot(
                    s as u32,
                    table.slots()[s].dtype.width(),
                    &expected[s],
                )
            })
            .fold(0u64, u64::wrapping_add);
        let check = |outcome: Option<deltacast::SyncOutcome>, what: &str| {
            let outcome = outcome.unwrap_or_else(|| panic!("case {case} {what}: no outcome"));
            let kind = if all_dense {
                FrameKind::Dense
            } else {
                FrameKind::Delta
            };
            assert_eq!(outcome.kind, kind, "case {case} {what}");
            assert_eq!(outcome.version, 2);
            assert_eq!(outcome.flushes as usize, frames.len());
            assert_eq!(outcome.changed, changed, "case {case} {what}");
            assert_eq!(outcome.state_digest, want_digest);
        };
        for in_place in [false, true] {
            let mut r = Receiver::with_state(table.clone(), base.clone(), Some(1)).unwrap();
            r.set_apply_as_received(in_place);
            let mut last = None;
            for (i, f) in frames.iter().enumerate() {
                last = r.receive(f).unwrap();
                assert_eq!(last.is_some(), i + 1 == frames.len());
            }
            check(last, if in_place { "in place" } else { "staged" });
            assert_eq!(r.store(), &expected, "case {case} (in place: {in_place})");
            assert!(r.recompute_digests().is_empty());
        }
        let mut one =
            Receiver::with_state(table.clone(), OneAtATime(base.clone()), Some(1)).unwrap();
        let mut last = None;
        for f in &frames {
            last = one.receive(f).unwrap();
        }
        check(last, "one slot at a time");
        assert_eq!(one.store().0, expected, "case {case} (one slot at a time)");
    }
    assert!(
        mixed >= 20,
        "only {mixed} syncs mixed dense and delta frames"
    );
}
