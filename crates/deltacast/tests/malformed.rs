//! Hostile and broken input: every case is an error that names the problem, and the receiver's
//! weights, digests and version stay exactly as they were.

mod common;

use common::*;
use deltacast::codec::{CodecChoice, PosCodec, ValCodec};
use deltacast::flush::FlushConfig;
use deltacast::wire::{checksum, split_frames, CHECKSUM_LEN, HEADER_LEN, WIRE_VERSION};
use deltacast::{DType, Error, Receiver, Sender, SlotInfo, SlotTable};

struct Setup {
    table: SlotTable,
    sender: Sender,
    receiver: Receiver,
    next: Vec<Vec<u8>>,
}

/// A receiver at version 1 and the frames of version 2 (several frames); with `in_place` the
/// receiver writes each flush as it arrives ([`Receiver::set_apply_as_received`]), so every
/// refusal below must also write back what earlier flushes wrote.
fn setup(seed: u64, in_place: bool) -> (Setup, Vec<Vec<u8>>) {
    let (mut s, frames) = setup_with(seed, 2048);
    s.receiver.set_apply_as_received(in_place);
    assert!(
        frames.len() >= 3,
        "want a multi-frame sync, got {}",
        frames.len()
    );
    (s, frames)
}

/// A receiver at version 1 and the frames of version 2, in flushes of up to `bucket_size`.
fn setup_with(seed: u64, bucket_size: usize) -> (Setup, Vec<Vec<u8>>) {
    let mut rng = Rng(seed);
    let table = SlotTable::new(vec![
        SlotInfo::new("a", DType::BF16, vec![64, 50]),
        SlotInfo::new("b", DType::F32, vec![700]),
        SlotInfo::new("c", DType::F8E4M3, vec![3, 333]),
    ])
    .unwrap();
    let cfg = FlushConfig {
        bucket_size,
        chunk_elems: 500,
        codec: CodecChoice::Fixed(PosCodec::Abs32, ValCodec::Raw),
    };
    let mut sender = Sender::new(table.clone(), cfg).unwrap();
    let mut receiver = Receiver::new(table.clone());
    let base = random_buffers(&mut rng, &table);
    let mut frames = Vec::new();
    sender
        .sync(&slices(&base), |f| {
            frames.push(f);
            Ok(())
        })
        .unwrap();
    for f in &frames {
        receiver.receive(f).unwrap();
    }
    let mut next = base.clone();
    for (slot, buf) in table.slots().iter().zip(next.iter_mut()) {
        mutate(&mut rng, buf, slot.dtype.width(), 0.3);
    }
    let mut frames = Vec::new();
    sender
        .sync(&slices(&next), |f| {
            frames.push(f);
            Ok(())
        })
        .unwrap();
    (
        Setup {
            table,
            sender,
            receiver,
            next,
        },
        frames,
    )
}

/// Feeds frames, collecting errors; asserts the receiver never got past version 1 unless `ok`.
fn feed(r: &mut Receiver, frames: &[Vec<u8>]) -> Vec<Error> {
    let mut errors = Vec::new();
    for f in frames {
        if let Err(e) = r.receive(f) {
            errors.push(e);
        }
    }
    errors
}

fn assert_untouched(before: &[Vec<u8>], before_digest: u64, r: &Receiver) {
    assert_eq!(r.version(), Some(1));
    assert_eq!(r.store(), &before.to_vec());
    assert_eq!(r.state_digest(), before_digest);
    assert!(r.recompute_digests().is_empty());
    assert!(!r.is_staging());
}

fn reseal(mut b: Vec<u8>) -> Vec<u8> {
    let end = b.len() - CHECKSUM_LEN;
    let sum = checksum(&b[..end]);
    b[end..].copy_from_slice(&sum.to_le_bytes());
    b
}

#[test]
fn a_flipped_bit_anywhere_rejects_the_whole_sync() {
    for in_place in [false, true] {
        a_flipped_bit_anywhere_rejects_the_whole_sync_with(in_place);
    }
}

fn a_flipped_bit_anywhere_rejects_the_whole_sync_with(in_place: bool) {
    let (mut s, frames) = setup(1, in_place);
    let before = s.receiver.store().clone();
    let digest = s.receiver.state_digest();
    let mut rng = Rng(99);
    for _ in 0..200 {
        let which = rng.below(frames.len() as u64) as usize;
        let mut bad = frames.clone();
        let bit = rng.below(bad[which].len() as u64 * 8) as usize;
        bad[which][bit / 8] ^= 1 << (bit % 8);
        let errors = feed(&mut s.receiver, &bad);
        assert!(
            !errors.is_empty(),
            "flip of bit {bit} in frame {which} went unnoticed"
        );
        let first = errors[0].to_string();
        assert!(!first.is_empty());
        assert_untouched(&before, digest, &s.receiver);
    }
    // The good sync still applies afterwards.
    assert!(feed(&mut s.receiver, &frames).is_empty());
    assert_eq!(s.receiver.store(), &s.next);
}

#[test]
fn truncation_and_missing_or_reordered_frames_are_refused() {
    for in_place in [false, true] {
        truncation_and_missing_or_reordered_frames_are_refused_with(in_place);
    }
}

fn truncation_and_missing_or_reordered_frames_are_refused_with(in_place: bool) {
    let (mut s, frames) = setup(2, in_place);
    let before = s.receiver.store().clone();
    let digest = s.receiver.state_digest();
    for cut in [0, 1, HEADER_LEN - 1, HEADER_LEN, frames[1].len() - 1] {
        let mut bad = frames.clone();
        bad[1].truncate(cut);
        assert!(!feed(&mut s.receiver, &bad).is_empty());
        assert_untouched(&before, digest, &s.receiver);
    }
    // A missing middle frame.
    let mut bad = frames.clone();
    bad.remove(1);
    let errors = feed(&mut s.receiver, &bad);
    assert!(
        matches!(errors[0], Error::FlushOutOfOrder { .. }),
        "{}",
        errors[0]
    );
    assert_untouched(&before, digest, &s.receiver);
    // The final frame never arrives: nothing applied, still staging until aborted.
    for f in &frames[..frames.len() - 1] {
        s.receiver.receive(f).unwrap();
    }
    assert!(s.receiver.is_staging());
    s.receiver.abort_sync();
    assert_untouched(&before, digest, &s.receiver);
    // Swapped frames.
    let mut bad = frames.clone();
    bad.swap(0, 1);
    assert!(!feed(&mut s.receiver, &bad).is_empty());
    assert_untouched(&before, digest, &s.receiver);
}

#[test]
fn wrong_version_and_wrong_slot_table_are_named() {
    for in_place in [false, true] {
        wrong_version_and_wrong_slot_table_are_named_with(in_place);
    }
}

fn wrong_version_and_wrong_slot_table_are_named_with(in_place: bool) {
    let (mut s, frames) = setup(3, in_place);
    let before = s.receiver.store().clone();
    let digest = s.receiver.state_digest();
    // Skip version 2: the delta for version 3 is refused.
    let mut next = s.next.clone();
    next[0][0] ^= 1;
    let mut v3 = Vec::new();
    s.sender
        .sync(&slices(&next), |f| {
            v3.push(f);
            Ok(())
        })
        .unwrap();
    let errors = feed(&mut s.receiver, &v3);
    assert!(
        matches!(
            errors[0],
            Error::VersionMismatch {
                current: Some(1),
                got: 3,
                expected: Some(2)
            }
        ),
        "{}",
        errors[0]
    );
    assert!(errors[0].to_string().contains("version"));
    assert_untouched(&before, digest, &s.receiver);

    // A receiver with another table refuses at the first frame.
    let other = SlotTable::new(vec![SlotInfo::new("a", DType::BF16, vec![50, 64])]).unwrap();
    let mut stranger = Receiver::new(other);
    let err = stranger.receive(&frames[0]).unwrap_err();
    assert!(matches!(err, Error::SlotTableMismatch { .. }));
    assert!(err.to_string().contains("slot table"));
    assert_eq!(s.table.len(), 3);
}

#[test]
fn lies_behind_a_valid_checksum_are_caught_before_anything_is_written() {
    for in_place in [false, true] {
        lies_behind_a_valid_checksum_are_caught_before_anything_is_written_with(in_place);
    }
}

fn lies_behind_a_valid_checksum_are_caught_before_anything_is_written_with(in_place: bool) {
    let (mut s, frames) = setup(4, in_place);
    let before = s.receiver.store().clone();
    let digest = s.receiver.state_digest();
    let last = frames.len() - 1;

    // A tampered sender digest: the sync verifies structurally but the digest proves it wrong.
    let mut bad = frames.clone();
    let f = &mut bad[last];
    let entries = u32::from_le_bytes(f[28..32].try_into().unwrap()) as usize;
    let at = HEADER_LEN + entries * 64 + 16;
    f[at] ^= 1;
    bad[last] = reseal(bad[last].clone());
    let errors = feed(&mut s.receiver, &bad);
    assert!(
        matches!(
            errors[0],
            Error::DigestMismatch { .. } | Error::BaseDigestMismatch { .. }
        ),
        "{}",
        errors[0]
    );
    assert_untouched(&before, digest, &s.receiver);

    // A changed value behind a valid checksum: digest mismatch, nothing applied.
    let mut bad = frames.clone();
    let f = &mut bad[0];
    let val_offset =
        u64::from_le_bytes(f[HEADER_LEN + 48..HEADER_LEN + 56].try_into().unwrap()) as usize;
    f[val_offset] ^= 0x40;
    bad[0] = reseal(bad[0].clone());
    let errors = feed(&mut s.receiver, &bad);
    assert!(
        matches!(errors[0], Error::DigestMismatch { .. }),
        "{}",
        errors[0]
    );
    assert_untouched(&before, digest, &s.receiver);

    // A chunk start moved beyond its slot.
    let mut bad = frames.clone();
    bad[0][HEADER_LEN + 8..HEADER_LEN + 16].copy_from_slice(&(1u64 << 40).to_le_bytes());
    bad[0] = reseal(bad[0].clone());
    let errors = feed(&mut s.receiver, &bad);
    assert!(
        errors[0].to_string().contains("beyond slot"),
        "{}",
        errors[0]
    );
    assert_untouched(&before, digest, &s.receiver);

    // Huge declared counts and lengths: errors, no allocation.
    for (field, value) in [
        (24usize, u64::MAX),
        (40, u64::MAX / 2),
        (56, 1 << 50),
        (16, u64::MAX),
    ] {
        let mut bad = frames.clone();
        bad[0][HEADER_LEN + field..HEADER_LEN + field + 8].copy_from_slice(&value.to_le_bytes());
        bad[0] = reseal(bad[0].clone());
        assert!(!feed(&mut s.receiver, &bad).is_empty());
        assert_untouched(&before, digest, &s.receiver);
    }
    // A receiver whose memory was changed behind its back: the recompute names the slot, and
    // the next delta is refused by digest instead of silently diverging.
    let mut tampered = Receiver::with_state(s.table.clone(), before.clone(), Some(1)).unwrap();
    assert!(tampered.recompute_digests().is_empty());
    assert!(feed(&mut tampered, &frames).is_empty());
    assert_eq!(tampered.store(), &s.next);
}

#[test]
fn random_bytes_and_absurd_stream_lengths_are_errors() {
    for in_place in [false, true] {
        random_bytes_and_absurd_stream_lengths_are_errors_with(in_place);
    }
}

fn random_bytes_and_absurd_stream_lengths_are_errors_with(in_place: bool) {
    let (mut s, _) = setup(5, in_place);
    let before = s.receiver.store().clone();
    let digest = s.receiver.state_digest();
    let mut rng = Rng(7);
    for n in [0usize, 1, 8, 71, 72, 73, 200, 5000] {
        let junk = rng.bytes(n);
        assert!(s.receiver.receive(&junk).is_err());
        let mut with_magic = junk.clone();
        if n >= 8 {
            with_magic[..4].copy_from_slice(b"DCST");
            with_magic[4..6].copy_from_slice(&WIRE_VERSION.to_le_bytes());
            assert!(s.receiver.receive(&with_magic).is_err());
            assert!(split_frames(&with_magic).is_err() || n >= 72);
        }
    }
    assert_untouched(&before, digest, &s.receiver);
    // A stream claiming an exabyte frame: refused by length check, not by allocation.
    let mut header = vec![0u8; 64];
    header[..4].copy_from_slice(b"DCST");
    header[4..6].copy_from_slice(&WIRE_VERSION.to_le_bytes());
    header[32..40].copy_from_slice(&(1u64 << 60).to_le_bytes());
    assert!(matches!(
        split_frames(&header),
        Err(Error::Truncated { .. })
    ));
    header[4] = 7;
    assert!(matches!(
        split_frames(&header),
        Err(Error::UnsupportedWireVersion { found: 7, .. })
    ));
}

/// A receiver at version 1 and the single frame of version 2: the receiver applies such a
/// sync in one pass and must undo it when it does not verify.
fn setup_single(seed: u64) -> (Setup, Vec<u8>) {
    let (s, mut frames) = setup_with(seed, 1 << 20);
    assert_eq!(frames.len(), 1, "want a single-frame sync");
    let frame = frames.pop().unwrap();
    (s, frame)
}

/// Byte offsets in `frame` of the first and the last entry's position and value sections.
fn sections(frame: &[u8]) -> Vec<(usize, usize, usize)> {
    let parsed = deltacast::wire::parse_frame(frame).unwrap();
    parsed
        .entries
        .iter()
        .map(|e| {
            (
                e.pos_offset as usize,
                e.val_offset as usize,
                e.count as usize,
            )
        })
        .collect()
}

#[test]
fn a_single_flush_delta_that_does_not_verify_is_undone() {
    let (mut s, frame) = setup_single(9);
    let before = s.receiver.store().clone();
    let digest = s.receiver.state_digest();
    let entries = sections(&frame);
    assert!(
        entries.len() >= 3,
        "want several chunks, got {}",
        entries.len()
    );

    // A tampered sender digest: every chunk is written before the digests are compared.
    let mut bad = frame.clone();
    let n = u32::from_le_bytes(bad[28..32].try_into().unwrap()) as usize;
    bad[HEADER_LEN + n * 64 + 16] ^= 1;
    let err = s.receiver.receive(&reseal(bad)).unwrap_err();
    assert!(matches!(err, Error::DigestMismatch { .. }), "{err}");
    assert_untouched(&before, digest, &s.receiver);

    // A changed value in the last chunk.
    let (_, val, _) = entries[entries.len() - 1];
    let mut bad = frame.clone();
    bad[val] ^= 0x40;
    let err = s.receiver.receive(&reseal(bad)).unwrap_err();
    assert!(matches!(err, Error::DigestMismatch { .. }), "{err}");
    assert_untouched(&before, digest, &s.receiver);

    // A value set to the bits already held (the first chunk of slot `a`, BF16).
    let (pos, val, _) = entries[0];
    let rel = u32::from_le_bytes(frame[pos..pos + 4].try_into().unwrap()) as usize;
    let parsed = deltacast::wire::parse_frame(&frame).unwrap();
    let e = &parsed.entries[0];
    assert_eq!(e.slot, 0);
    let at = (e.start as usize + rel) * 2;
    let held = before[0][at..at + 2].to_vec();
    let mut bad = frame.clone();
    bad[val..val + 2].copy_from_slice(&held);
    let err = s.receiver.receive(&reseal(bad)).unwrap_err();
    assert!(err.to_string().contains("already holds"), "{err}");
    assert_untouched(&before, digest, &s.receiver);

    // Unsorted positions in the last chunk: a decode error after the other chunks were written.
    let (pos, _, count) = entries[entries.len() - 1];
    assert!(count >= 2);
    let mut bad = frame.clone();
    let (a, b) = (pos, pos + 4);
    let first: [u8; 4] = bad[a..a + 4].try_into().unwrap();
    let second: [u8; 4] = bad[b..b + 4].try_into().unwrap();
    bad[a..a + 4].copy_from_slice(&second);
    bad[b..b + 4].copy_from_slice(&first);
    assert!(s.receiver.receive(&reseal(bad)).is_err());
    assert_untouched(&before, digest, &s.receiver);

    // The frame as sent: applied.
    let outcome = s
        .receiver
        .receive(&frame)
        .unwrap()
        .expect("a complete sync");
    assert_eq!(outcome.version, 2);
    assert_eq!(outcome.flushes, 1);
    assert_eq!(s.receiver.store(), &s.next);
    assert!(s.receiver.recompute_digests().is_empty());
    let _ = (&s.table, &s.sender);
}

#[test]
fn flushes_written_as_they_arrive_are_undone_when_the_sync_does_not_complete() {
    let (mut s, frames) = setup(10, true);
    let before = s.receiver.store().clone();
    let digest = s.receiver.state_digest();
    let last = frames.len() - 1;
    // The first flushes land in the store at once (that is the point of the mode)...
    for f in &frames[..last] {
        assert!(s.receiver.receive(f).unwrap().is_none());
    }
    assert!(s.receiver.is_staging());
    assert_ne!(s.receiver.store(), &before, "nothing was written in place");
    // ...and go back when the sync is abandoned, or when its last flush does not verify.
    s.receiver.abort_sync();
    assert_untouched(&before, digest, &s.receiver);
    let mut bad = frames.clone();
    let n = u32::from_le_bytes(bad[last][28..32].try_into().unwrap()) as usize;
    bad[last][HEADER_LEN + n * 64 + 16] ^= 1;
    bad[last] = reseal(bad[last].clone());
    let errors = feed(&mut s.receiver, &bad);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_untouched(&before, digest, &s.receiver);
    // A new sync that starts while one is half received replaces it from the old bits.
    for f in &frames[..last] {
        s.receiver.receive(f).unwrap();
    }
    let outcome = feed(&mut s.receiver, &frames);
    assert!(outcome.is_empty(), "{outcome:?}");
    assert_eq!(s.receiver.version(), Some(2));
    assert_eq!(s.receiver.store(), &s.next);
    assert!(s.receiver.recompute_digests().is_empty());
}

/// A delta of one BF16 slot whose changes come as two pieces with the same chunk range (as
/// interleaved pieces of two sharded ranks do), in two flushes: even positions, then odd.
/// Returns the receiver's base, the expected new state and the frames.
fn interleaved_two_flush_delta() -> (SlotTable, Vec<u8>, Vec<u8>, Vec<Vec<u8>>) {
    use deltacast::digest::digest_slot;
    use deltacast::flush::SyncEncoder;
    use deltacast::wire::{FrameKind, SlotDigest};

    let n = 1000usize;
    let table = SlotTable::new(vec![SlotInfo::new("w", DType::BF16, vec![n as u64])]).unwrap();
    let mut rng = Rng(77);
    let base: Vec<u8> = (0..2 * n).map(|_| rng.next_u64() as u8).collect();
    let mut next = base.clone();
    let cfg = FlushConfig {
        bucket_size: 4096,
        chunk_elems: n as u64,
        codec: CodecChoice::Fixed(PosCodec::Abs32, ValCodec::Raw),
    };
    let mut frames = Vec::new();
    let mut enc = SyncEncoder::new(FrameKind::Delta, 2, table.hash(), cfg, |f| {
        frames.push(f);
        Ok(())
    })
    .unwrap();
    for parity in [0u64, 1] {
        let positions: Vec<u64> = (0..n as u64).filter(|i| i % 2 == parity).collect();
        let mut old = Vec::new();
        let mut new = Vec::new();
        for &p in &positions {
            let at = p as usize * 2;
            old.extend_from_slice(&base[at..at + 2]);
            next[at] ^= 1; // every changed element differs from what is held
            new.extend_from_slice(&next[at..at + 2]);
        }
        enc.push_delta(0, n as u64, deltacast::DType::BF16, &positions, &old, &new)
            .unwrap();
    }
    enc.finish(&[SlotDigest {
        slot: 0,
        base: digest_slot(0, 2, &base),
        new: digest_slot(0, 2, &next),
    }])
    .unwrap();
    assert!(frames.len() >= 2, "want the pieces in separate flushes");
    (table, base, next, frames)
}

#[test]
fn a_flush_overlapping_one_written_in_place_sends_the_sync_back_to_staging() {
    let (table, base, next, frames) = interleaved_two_flush_delta();
    let fresh = || {
        let mut r = Receiver::with_state(table.clone(), vec![base.clone()], Some(1)).unwrap();
        r.set_apply_as_received(true);
        r
    };
    // The first piece is written in place; the second overlaps its range, so the first is
    // written back and both are staged (each computed from the bits before the sync).
    let mut r = fresh();
    assert!(r.receive(&frames[0]).unwrap().is_none());
    assert_ne!(
        r.store()[0],
        base,
        "the first flush was not written in place"
    );
    let mut outcome = None;
    for f in &frames[1..] {
        outcome = r.receive(f).unwrap();
    }
    assert_eq!(outcome.expect("complete").version, 2);
    assert_eq!(r.store()[0], next);
    assert!(r.recompute_digests().is_empty());
    // The same sync with a lying digest: refused, and the store is the base again (the first
    // piece's in-place write went back when the sync returned to staging).
    let mut bad = frames.clone();
    let last = bad.len() - 1;
    let entries = u32::from_le_bytes(bad[last][28..32].try_into().unwrap()) as usize;
    bad[last][HEADER_LEN + entries * 64 + 16] ^= 1;
    bad[last] = reseal(bad[last].clone());
    let mut r = fresh();
    let errors = feed(&mut r, &bad);
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert_eq!(r.store()[0], base);
    assert_eq!(r.version(), Some(1));
    assert!(!r.is_staging());
}

mod staged;

/// Re-encodes header field bytes `at..at + value.len()` of `frame` and reseals it.
fn patch(frame: &[u8], at: usize, value: &[u8]) -> Vec<u8> {
    let mut f = frame.to_vec();
    f[at..at + value.len()].copy_from_slice(value);
    reseal(f)
}

#[test]
fn flush_count_and_values_start_are_checked() {
    // The GPU's layout of version 2: slot a dense, b delta, c dense; flush_count 3, sections
    // split at values_start.
    let (s, cpu_frames) = setup(24, false);
    let base = s.receiver.store().clone();
    let honest = staged::staged_sync(
        &s.table,
        2,
        &base,
        &s.next,
        &[
            (0..1, staged::Stage::Dense),
            (1..2, staged::Stage::Delta),
            (2..3, staged::Stage::Dense),
        ],
        2000,
        CodecChoice::Fixed(PosCodec::Abs32, ValCodec::Raw),
    );
    let receiver = |in_place: bool| {
        let mut r = Receiver::with_state(s.table.clone(), base.clone(), Some(1)).unwrap();
        r.set_apply_as_received(in_place);
        r
    };
    let with = |i: usize, frame: Vec<u8>| {
        let mut frames = honest.clone();
        frames[i] = frame;
        frames
    };
    let u32b = |v: u32| v.to_le_bytes().to_vec();
    let u64b = |v: u64| v.to_le_bytes().to_vec();
    let parsed = deltacast::wire::parse_frame(&honest[1]).unwrap().header;
    let (start, values_start, body_end) = (
        parsed.sections_start(),
        parsed.values_start,
        parsed.body_end(),
    );
    assert!(values_start > start, "the delta frame has position bytes");

    let cpu_start = deltacast::wire::parse_frame(&cpu_frames[0])
        .unwrap()
        .header
        .sections_start();
    let cases: Vec<(&str, Vec<Vec<u8>>, &str)> = vec![
        (
            "a later frame counts other flushes",
            with(1, patch(&honest[1], 44, &u32b(4))),
            "flush 1 says the sync has 4 flushes, flush 0 said 3",
        ),
        (
            "flush 0 does not know the count, the others do",
            with(0, patch(&honest[0], 44, &u32b(0))),
            "flush 0 said 0",
        ),
        (
            "the FINAL flag before the last flush",
            with(0, patch(&honest[0], 7, &[1])),
            "flush 0 of 3 has the FINAL flag",
        ),
        (
            "the last flush without FINAL",
            with(2, patch(&honest[2], 7, &[0])),
            "flush 2 of 3 lacks the FINAL flag",
        ),
        (
            "an index beyond the count",
            with(2, patch(&honest[2], 44, &u32b(2))),
            "flush 2 of a sync of 2",
        ),
        (
            "values_start inside the digest table",
            with(1, patch(&honest[1], 48, &u64b(start - 1))),
            "values_start",
        ),
        (
            "values_start beyond the sections",
            with(1, patch(&honest[1], 48, &u64b(body_end + 1))),
            "values_start",
        ),
        (
            "positions on the values' side",
            with(1, patch(&honest[1], 48, &u64b(start))),
            "positions section",
        ),
        (
            "values on the positions' side",
            with(1, patch(&honest[1], 48, &u64b(values_start + 1))),
            "values section",
        ),
        (
            "reserved header bytes",
            with(1, patch(&honest[1], 60, &[1])),
            "reserved header bytes",
        ),
        (
            "wire version 1",
            with(0, {
                let mut f = honest[0].clone();
                f[4] = 1;
                f
            }),
            "unsupported wire format version 1 (this build reads version 2)",
        ),
    ];
    for in_place in [false, true] {
        let mut r = receiver(in_place);
        let digest = r.state_digest();
        for (name, frames, needle) in &cases {
            let errors = feed(&mut r, frames);
            assert!(!errors.is_empty(), "{name}: accepted");
            let first = errors[0].to_string();
            assert!(first.contains(needle), "{name}: {first:?} lacks {needle:?}");
            assert_untouched(&base, digest, &r);
        }
        assert!(feed(&mut r, &honest).is_empty());
        assert_eq!(r.store(), &s.next);
    }
    // A streaming writer's frames (flush_count 0): one that claims a count, and interleaved
    // sections split by a values_start, are refused.
    let mut r = s.receiver;
    let before = r.store().clone();
    let digest = r.state_digest();
    for (i, at, value, needle) in [
        (1, 44, u32b(9), "says the sync has 9 flushes"),
        (0, 48, u64b(cpu_start + 8), "section"),
    ] {
        let mut frames = cpu_frames.clone();
        frames[i] = patch(&frames[i], at, &value);
        let errors = feed(&mut r, &frames);
        assert!(
            errors[0].to_string().contains(needle),
            "{} lacks {needle}",
            errors[0]
        );
        assert_untouched(&before, digest, &r);
    }
    assert!(feed(&mut r, &cpu_frames).is_empty());
}

/// Every slot's bits.
type Buffers = Vec<Vec<u8>>;

/// A receiver at version 1 and the single frame of version 2 coded `steps+esc`: a BF16 slot of
/// about 100 elements (its map's last byte part used), a U16 slot of the same size (raw values
/// whatever the choice), an F32 and an F8_E5M2 slot, and an unchanged U16 slot; about half of
/// every other slot changed, most by ±1 in the ordered view. Returns the table, the bits at
/// versions 1 and 2, and the frame.
fn steps_setup() -> (SlotTable, Buffers, Buffers, Vec<u8>) {
    use deltacast::dtype::{from_ordered, load_bits, store_bits, to_ordered};
    let table = SlotTable::new(vec![
        SlotInfo::new("w", DType::BF16, vec![101]),
        SlotInfo::new("u", DType::U16, vec![101]),
        SlotInfo::new("f", DType::F32, vec![37]),
        SlotInfo::new("e", DType::F8E5M2, vec![50]),
        SlotInfo::new("v", DType::U16, vec![101]),
    ])
    .unwrap();
    let mut rng = Rng(66);
    let base = random_buffers(&mut rng, &table);
    let mut next = base.clone();
    for (slot, buf) in table.slots().iter().zip(next.iter_mut()).take(4) {
        let w = slot.dtype.width();
        let mask = if w == 4 { u32::MAX } else { (1 << (8 * w)) - 1 };
        for i in 0..buf.len() / w {
            if !rng.chance(0.5) {
                continue;
            }
            let a = load_bits(buf, w, i);
            let b = match rng.below(8) {
                0..=2 => from_ordered(to_ordered(a, w).wrapping_add(1) & mask, w),
                3..=5 => from_ordered(to_ordered(a, w).wrapping_sub(1) & mask, w),
                _ => a ^ (1 + rng.below(mask as u64) as u32),
            };
            store_bits(buf, w, i, b);
        }
    }
    let cfg = FlushConfig {
        bucket_size: 1 << 20,
        chunk_elems: 1 << 20,
        codec: CodecChoice::Fixed(PosCodec::Steps, ValCodec::Escaped),
    };
    let mut sender = Sender::with_base(table.clone(), cfg, base.clone(), 1).unwrap();
    let mut frames = Vec::new();
    sender
        .delta(&slices(&next), |f| {
            frames.push(f);
            Ok(())
        })
        .unwrap();
    assert_eq!(frames.len(), 1);
    let frame = frames.pop().unwrap();
    (table, base, next, frame)
}

#[test]
fn steps_chunks_that_lie_are_refused_and_nothing_is_written() {
    let (table, base, next, frame) = steps_setup();
    let parsed = deltacast::wire::parse_frame(&frame).unwrap();
    let codecs: Vec<_> = parsed
        .entries
        .iter()
        .map(|e| (e.slot, e.pos_codec, e.val_codec))
        .collect();
    assert!(codecs.contains(&(0, PosCodec::Steps, ValCodec::Escaped)));
    assert!(codecs.contains(&(1, PosCodec::Bitmap, ValCodec::Raw)));
    let k = parsed.entries.iter().position(|e| e.slot == 0).unwrap();
    let e = parsed.entries[k];
    // The chunk spans its first to its last change; its map's last byte is part used.
    let (range, map_len) = (e.range as usize, e.range.div_ceil(4));
    assert_eq!(e.pos_len, map_len);
    assert!(
        range % 4 != 0 && e.val_len >= 2,
        "want a part byte and an escape"
    );
    let entry = HEADER_LEN + 64 * k;
    let (map_at, val_at) = (e.pos_offset as usize, e.val_offset as usize);
    // The first escape's element, read from the map as the docs lay it out.
    let first_escape = (0..range)
        .find(|&i| (frame[map_at + i / 4] >> (2 * (i % 4))) & 3 == 3)
        .unwrap();
    let held_at = (e.start as usize + first_escape) * 2;
    let u64b = |v: u64| v.to_le_bytes().to_vec();
    let last = map_at + range / 4;
    let past = frame[last] | 1 << (2 * (range % 4));
    let past_range = format!("position {range} is out of the chunk range");
    let short = format!("needed {map_len} bytes");
    let cases: Vec<(&str, Vec<u8>, &str)> = vec![
        (
            "a map one byte short",
            patch(&frame, entry + 40, &u64b(map_len - 1)),
            &short,
        ),
        (
            "a map one byte long",
            patch(&frame, entry + 40, &u64b(map_len + 1)),
            "trailing",
        ),
        (
            "a code past the range",
            patch(&frame, last, &[past]),
            &past_range,
        ),
        (
            "a count one above the map's",
            patch(&frame, entry + 24, &u64b(e.count + 1)),
            "changes, expected",
        ),
        (
            "a count one below the map's",
            patch(&frame, entry + 24, &u64b(e.count - 1)),
            "changes, expected",
        ),
        (
            "a value section one escape short",
            patch(&frame, entry + 56, &u64b(e.val_len - 2)),
            "escapes need",
        ),
        (
            "an escape to the bits held",
            patch(&frame, val_at, &base[0][held_at..held_at + 2]),
            "already holds",
        ),
        (
            "steps positions with raw values",
            patch(&frame, entry + 5, &[ValCodec::Raw as u8]),
            "go together",
        ),
        (
            "esc values with bitmap positions",
            patch(&frame, entry + 4, &[PosCodec::Bitmap as u8]),
            "go together",
        ),
        (
            "steps in a seed frame",
            patch(&frame, 6, &[0]),
            "a seed chunk carries raw values",
        ),
        (
            "steps on an integer slot",
            patch(&frame, entry, &4u32.to_le_bytes()),
            "a dtype without a float order",
        ),
    ];
    for in_place in [false, true] {
        let mut r = Receiver::with_state(table.clone(), base.clone(), Some(1)).unwrap();
        r.set_apply_as_received(in_place);
        let digest = r.state_digest();
        for (what, bad, needle) in &cases {
            let err = r.receive(bad).unwrap_err();
            assert!(
                matches!(err, Error::Codec { .. } | Error::Malformed(_)),
                "{what}: {err}"
            );
            assert!(err.to_string().contains(needle), "{what}: {err}");
            assert_untouched(&base, digest, &r);
        }
        // The frame as sent: applied.
        let outcome = r.receive(&frame).unwrap().expect("a complete sync");
        assert_eq!(outcome.version, 2);
        assert_eq!(r.store(), &next);
        assert!(r.recompute_digests().is_empty());
    }
    // The same step as the GPU lays it out (stages, sections split at values_start): staged.
    let frames = staged::staged_sync(
        &table,
        2,
        &base,
        &next,
        &[
            (0..2, staged::Stage::Delta),
            (2..3, staged::Stage::Dense),
            (3..5, staged::Stage::Delta),
        ],
        40,
        CodecChoice::Fixed(PosCodec::Steps, ValCodec::Escaped),
    );
    let mut r = Receiver::with_state(table.clone(), base.clone(), Some(1)).unwrap();
    let errors = feed(&mut r, &frames);
    assert!(errors.is_empty(), "{errors:?}");
    assert_eq!(r.store(), &next);
}
