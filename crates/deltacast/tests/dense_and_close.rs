//! Wire v2's dense and close frames at the receiver: every way to break their rules is refused
//! with a message that says which, and the receiver's weights, digests and version stay exactly
//! as they were (also when it writes flushes as they arrive); the honest syncs apply afterwards.
//! (The new header fields, flush_count and values_start, are in malformed.rs.)

mod common;
mod staged;

use common::*;
use deltacast::codec::{CodecChoice, PosCodec, ValCodec};
use deltacast::digest::digest_slot;
use deltacast::flush::FlushConfig;
use deltacast::wire::{close_frame, FrameKind, FrameWriter, SlotDigest};
use deltacast::{DType, Error, Receiver, SlotInfo, SlotTable};

/// Feeds frames, collecting errors.
fn feed(r: &mut Receiver, frames: &[Vec<u8>]) -> Vec<Error> {
    frames.iter().filter_map(|f| r.receive(f).err()).collect()
}

fn assert_untouched(before: &[Vec<u8>], before_digest: u64, r: &Receiver) {
    assert_eq!(r.version(), Some(1));
    assert_eq!(r.store(), &before.to_vec());
    assert_eq!(r.state_digest(), before_digest);
    assert!(r.recompute_digests().is_empty());
    assert!(!r.is_staging());
}

fn table() -> SlotTable {
    SlotTable::new(vec![
        SlotInfo::new("a", DType::BF16, vec![64, 50]),
        SlotInfo::new("b", DType::F32, vec![700]),
        SlotInfo::new("c", DType::F8E4M3, vec![3, 333]),
    ])
    .unwrap()
}

/// The set-up of the dense refusals: three slots at version 1 and the state of version 2.
struct DenseCase {
    table: SlotTable,
    base: Vec<Vec<u8>>,
    next: Vec<Vec<u8>>,
}

impl DenseCase {
    fn new(seed: u64) -> Self {
        let mut rng = Rng(seed);
        let table = table();
        let base = random_buffers(&mut rng, &table);
        let mut next = base.clone();
        for (slot, buf) in table.slots().iter().zip(next.iter_mut()) {
            mutate(&mut rng, buf, slot.dtype.width(), 0.3);
        }
        DenseCase { table, base, next }
    }

    fn receiver(&self, in_place: bool) -> Receiver {
        let mut r = Receiver::with_state(self.table.clone(), self.base.clone(), Some(1)).unwrap();
        r.set_apply_as_received(in_place);
        r
    }

    fn numel(&self, slot: u32) -> u64 {
        self.table.slots()[slot as usize].numel()
    }

    fn width(&self, slot: u32) -> usize {
        self.table.slots()[slot as usize].dtype.width()
    }

    /// The honest digest record of `slot` (base → next).
    fn digest(&self, slot: u32) -> SlotDigest {
        let w = self.width(slot);
        SlotDigest {
            slot,
            base: digest_slot(slot, w, &self.base[slot as usize]),
            new: digest_slot(slot, w, &self.next[slot as usize]),
        }
    }

    /// One frame of a delta sync of `count` flushes to version 2: dense chunks
    /// `(slot, start, range)` holding `values`' bits, the delta chunks of `delta` slots
    /// (base → next), and `digests`; sections split as the GPU writes them.
    #[allow(clippy::too_many_arguments)]
    fn frame(
        &self,
        kind: FrameKind,
        index: u32,
        count: u32,
        dense: &[(u32, u64, u64)],
        values: &[Vec<u8>],
        delta: &[u32],
        digests: &[SlotDigest],
    ) -> Vec<u8> {
        let mut w = FrameWriter::new(kind, 2, self.table.hash(), index)
            .with_flush_count(count)
            .split_sections(4, 4);
        for &(slot, start, range) in dense {
            let width = self.width(slot);
            let bytes = &values[slot as usize][start as usize * width..][..range as usize * width];
            w.push_chunk(
                slot,
                PosCodec::All,
                ValCodec::Raw,
                start,
                range,
                range,
                &[],
                bytes,
            );
        }
        let config = FlushConfig {
            bucket_size: 1 << 30,
            chunk_elems: 500,
            codec: CodecChoice::Fixed(PosCodec::Abs32, ValCodec::Raw),
        };
        for &slot in delta {
            let width = self.width(slot);
            let (positions, old, new) =
                staged::diff(&self.base[slot as usize], &self.next[slot as usize], width);
            deltacast::flush::encode_changes(
                &config,
                false,
                slot,
                self.numel(slot),
                self.table.slots()[slot as usize].dtype,
                &positions,
                &old,
                &new,
                |c| {
                    w.push_chunk(
                        c.slot,
                        c.pos_codec,
                        c.val_codec,
                        c.start,
                        c.range,
                        c.count,
                        &c.positions,
                        &c.values,
                    );
                    Ok(())
                },
            )
            .unwrap();
        }
        for d in digests {
            w.push_digest(*d);
        }
        w.finish(count != 0 && index + 1 == count)
    }

    /// The honest sync: slot 0 dense in two chunks, slot 1 delta, slot 2 dense.
    fn honest(&self) -> Vec<Vec<u8>> {
        let a = self.numel(0);
        vec![
            self.first(&[(0, 0, 2000), (0, 2000, a - 2000)]),
            self.frame(FrameKind::Delta, 1, 3, &[], &[], &[1], &[self.digest(1)]),
            self.frame(
                FrameKind::Dense,
                2,
                3,
                &[(2, 0, self.numel(2))],
                &self.next,
                &[],
                &[self.digest(2)],
            ),
        ]
    }

    /// The honest first frame with other dense chunks of slot 0.
    fn first(&self, chunks: &[(u32, u64, u64)]) -> Vec<u8> {
        self.frame(
            FrameKind::Dense,
            0,
            3,
            chunks,
            &self.next,
            &[],
            &[self.digest(0)],
        )
    }
}

/// Every way a dense frame can break the rules of docs/wire-format.md is refused, with a
/// message that says which, and the receiver stays at version 1 byte for byte (also when it
/// writes flushes as they arrive, and when the sync is one dense frame applied in one pass).
#[test]
fn dense_frames_that_break_the_rules_are_refused_and_nothing_changes() {
    let c = DenseCase::new(21);
    let (a, b, cc) = (c.numel(0), c.numel(1), c.numel(2));
    let honest = c.honest();
    let with = |i: usize, frame: Vec<u8>| {
        let mut frames = honest.clone();
        frames[i] = frame;
        frames
    };
    let lie = |slot: u32, base: u64, new: u64| SlotDigest {
        base: c.digest(slot).base ^ base,
        new: c.digest(slot).new ^ new,
        slot,
    };
    let mut tweaked = c.next.clone();
    tweaked[0][7] ^= 0x10;
    let seed0 = {
        let mut w = FrameWriter::new(FrameKind::Seed, 2, c.table.hash(), 0).with_flush_count(2);
        w.push_chunk(0, PosCodec::All, ValCodec::Raw, 0, a, a, &[], &c.next[0]);
        w.finish(false)
    };
    let abs32_dense = {
        let mut w = FrameWriter::new(FrameKind::Dense, 2, c.table.hash(), 0).with_flush_count(3);
        let rel: Vec<u8> = (0..cc as u32).flat_map(|i| i.to_le_bytes()).collect();
        w.push_chunk(
            2,
            PosCodec::Abs32,
            ValCodec::Raw,
            0,
            cc,
            cc,
            &rel,
            &c.next[2],
        );
        w.push_digest(c.digest(2));
        w.finish(false)
    };
    let all3 = [(0, 0, a), (1, 0, b), (2, 0, cc)];
    let cases: Vec<(&str, Vec<Vec<u8>>, &str)> = vec![
        (
            "partial cover",
            with(0, c.first(&[(0, 0, 2000), (0, 2000, a - 2100)])),
            "covers [0, 3100)",
        ),
        (
            "a hole in the cover",
            with(0, c.first(&[(0, 0, 2000), (0, 2001, a - 2001)])),
            "are missing",
        ),
        (
            "overlapping dense chunks",
            with(0, c.first(&[(0, 0, 2000), (0, 1999, a - 1999)])),
            "sent twice",
        ),
        (
            "the same dense chunk twice",
            with(0, c.first(&[(0, 0, a), (0, 0, a)])),
            "sent twice",
        ),
        (
            "a delta chunk of a dense slot in another frame",
            with(
                1,
                c.frame(FrameKind::Delta, 1, 3, &[], &[], &[1, 0], &[c.digest(1)]),
            ),
            "sent dense by flush 0",
        ),
        (
            "a slot dense after a delta frame carried it",
            vec![
                c.frame(FrameKind::Delta, 0, 3, &[], &[], &[0, 1], &[c.digest(1)]),
                c.frame(
                    FrameKind::Dense,
                    1,
                    3,
                    &[(0, 0, a)],
                    &c.next,
                    &[],
                    &[c.digest(0)],
                ),
                honest[2].clone(),
            ],
            "earlier flush of the sync carried delta chunks",
        ),
        (
            "a dense frame without its slot's digest record",
            with(
                1,
                c.frame(
                    FrameKind::Dense,
                    1,
                    3,
                    &[(0, 0, a)],
                    &c.next,
                    &[],
                    &[c.digest(1)],
                ),
            ),
            "no digest record in its frame",
        ),
        (
            "a slot dense in two frames, digests complete",
            with(
                1,
                c.frame(
                    FrameKind::Dense,
                    1,
                    3,
                    &[(0, 0, a), (1, 0, b)],
                    &c.next,
                    &[],
                    &[c.digest(0), c.digest(1)],
                ),
            ),
            "sent dense by flushes 0 and 1",
        ),
        (
            "a wrong base digest of a dense slot",
            with(
                0,
                c.frame(
                    FrameKind::Dense,
                    0,
                    3,
                    &[(0, 0, a)],
                    &c.next,
                    &[],
                    &[lie(0, 1, 0)],
                ),
            ),
            "base digest mismatch",
        ),
        (
            "a wrong new digest of a dense slot",
            with(
                2,
                c.frame(
                    FrameKind::Dense,
                    2,
                    3,
                    &[(2, 0, cc)],
                    &c.next,
                    &[],
                    &[lie(2, 0, 1)],
                ),
            ),
            "digest mismatch after apply",
        ),
        (
            "a dense value that is not the sender's",
            with(
                0,
                c.frame(
                    FrameKind::Dense,
                    0,
                    3,
                    &[(0, 0, a)],
                    &tweaked,
                    &[],
                    &[c.digest(0)],
                ),
            ),
            "digest mismatch after apply",
        ),
        (
            "a dense slot's digest record in another frame",
            vec![
                c.frame(FrameKind::Dense, 0, 3, &[(0, 0, a)], &c.next, &[], &[]),
                c.frame(
                    FrameKind::Delta,
                    1,
                    3,
                    &[],
                    &[],
                    &[1],
                    &[c.digest(1), c.digest(0)],
                ),
                honest[2].clone(),
            ],
            "slot 0 has no digest record in its frame",
        ),
        (
            "no digest record for a delta slot",
            with(1, c.frame(FrameKind::Delta, 1, 3, &[], &[], &[1], &[])),
            "no digest for slot `b`",
        ),
        (
            "a dense chunk with coded positions",
            with(2, abs32_dense),
            "`all` positions and `raw` values",
        ),
        (
            "a dense frame in a seed sync",
            vec![
                seed0,
                c.frame(
                    FrameKind::Dense,
                    1,
                    2,
                    &[(1, 0, b)],
                    &c.next,
                    &[],
                    &[c.digest(1)],
                ),
            ],
            "a dense frame in a seed sync",
        ),
        (
            "a seed frame in a delta sync",
            with(
                1,
                c.frame(FrameKind::Seed, 1, 3, &[(1, 0, b)], &c.next, &[], &[]),
            ),
            "a seed frame in a delta sync",
        ),
        (
            "a one-frame dense sync that does not verify (applied in one pass, undone)",
            vec![c.frame(
                FrameKind::Dense,
                0,
                1,
                &all3,
                &c.next,
                &[],
                &[c.digest(0), c.digest(1), lie(2, 0, 1)],
            )],
            "digest mismatch after apply on slot `c`",
        ),
        (
            "a one-frame dense sync with a wrong base",
            vec![c.frame(
                FrameKind::Dense,
                0,
                1,
                &all3,
                &c.next,
                &[],
                &[lie(0, 4, 0), c.digest(1), c.digest(2)],
            )],
            "base digest mismatch",
        ),
        (
            "a close in the middle of the sync",
            with(2, close_frame(1, c.table.hash())),
            "closed in the middle of a sync",
        ),
    ];
    for in_place in [false, true] {
        let mut r = c.receiver(in_place);
        let digest = r.state_digest();
        for (name, frames, needle) in &cases {
            let errors = feed(&mut r, frames);
            assert!(!errors.is_empty(), "{name}: accepted");
            let first = errors[0].to_string();
            assert!(first.contains(needle), "{name}: {first:?} lacks {needle:?}");
            assert_untouched(&c.base, digest, &r);
        }
        // The honest sync applies on the same receiver; so does the one-frame dense sync.
        assert!(feed(&mut r, &honest).is_empty());
        assert_eq!(r.store(), &c.next);
        assert!(r.recompute_digests().is_empty());
        let mut r = c.receiver(in_place);
        let one = c.frame(
            FrameKind::Dense,
            0,
            1,
            &all3,
            &c.next,
            &[],
            &[c.digest(0), c.digest(1), c.digest(2)],
        );
        let outcome = r.receive(&one).unwrap().expect("complete");
        assert_eq!(
            (outcome.kind, outcome.changed),
            (FrameKind::Dense, a + b + cc)
        );
        assert_eq!(r.store(), &c.next);
    }
}

/// A dense frame resends unchanged elements: no no-op rule applies to it (a delta frame
/// that resent a held value is refused).
#[test]
fn a_dense_frame_may_resend_held_values() {
    let c = DenseCase::new(22);
    let mut same = c.next.clone();
    same[2] = c.base[2].clone(); // slot c does not change at all
    let cc = c.numel(2);
    let mut r = c.receiver(false);
    let w = c.width(2);
    let unchanged = SlotDigest {
        slot: 2,
        base: digest_slot(2, w, &c.base[2]),
        new: digest_slot(2, w, &c.base[2]),
    };
    let frames = vec![
        c.honest()[0].clone(),
        c.honest()[1].clone(),
        c.frame(
            FrameKind::Dense,
            2,
            3,
            &[(2, 0, cc)],
            &same,
            &[],
            &[unchanged],
        ),
    ];
    assert!(feed(&mut r, &frames).is_empty());
    assert_eq!(r.store(), &same);
}

#[test]
fn a_close_frame_is_reported_and_changes_nothing() {
    let c = DenseCase::new(25);
    let mut r = c.receiver(false);
    let digest = r.state_digest();
    let outcome = r
        .receive(&close_frame(7, c.table.hash()))
        .unwrap()
        .expect("an outcome");
    assert_eq!(outcome.kind, FrameKind::Close);
    assert_eq!(
        (outcome.version, outcome.changed, outcome.flushes),
        (1, 0, 1)
    );
    assert_eq!(outcome.state_digest, digest);
    assert_untouched(&c.base, digest, &r);
    // An unseeded receiver holds no version.
    let mut fresh = Receiver::new(c.table.clone());
    let outcome = fresh.receive(&close_frame(0, c.table.hash())).unwrap();
    assert_eq!(
        outcome.map(|o| (o.kind, o.version)),
        Some((FrameKind::Close, 0))
    );
    // Another table's close, and a close that carries something, are refused.
    let other = close_frame(1, c.table.hash() ^ 1);
    assert!(matches!(
        r.receive(&other),
        Err(Error::SlotTableMismatch { .. })
    ));
    let mut w = FrameWriter::new(FrameKind::Close, 1, c.table.hash(), 0);
    w.push_digest(c.digest(0));
    let err = r.receive(&w.finish(true)).unwrap_err();
    assert!(err.to_string().contains("close frame"), "{err}");
    assert_untouched(&c.base, digest, &r);
    // After a close, the next sync still applies.
    assert!(feed(&mut r, &c.honest()).is_empty());
    assert_eq!(r.store(), &c.next);
}
