//! Every transition of the receiver's state machine, against expectations written out by hand.

use super::*;
use crate::{DType, SlotInfo};

fn table() -> SlotTable {
    SlotTable::new(vec![
        SlotInfo::new("a", DType::F32, vec![3]),
        SlotInfo::new("b", DType::BF16, vec![2, 2]),
    ])
    .expect("table")
}

fn held_at(version: u64) -> HeldState {
    HeldState::holding(Some(version), vec![11, 22])
}

/// A pending sync with every slot settled to these digests.
fn settled(
    t: &SlotTable,
    held: &HeldState,
    kind: FrameKind,
    version: u64,
    to: [u64; 2],
) -> Pending {
    let mut p = held.begin(kind, version).expect("begin");
    for (slot, d) in to.into_iter().enumerate() {
        p.settle(t, slot as u32, d, d).expect("settle");
    }
    p
}

#[test]
fn the_gate() {
    let none = HeldState::none(&table());
    assert_eq!(none.version(), None);
    assert_eq!(none.digests(), &[0, 0]);
    // Nothing held: a seed at any version, nothing else.
    for v in [0, 1, 7, u64::MAX] {
        let p = none.begin(FrameKind::Seed, v).expect("seed");
        assert_eq!((p.kind(), p.version()), (FrameKind::Seed, v));
        assert_eq!(p.digests(), &[0, 0], "a seed sums its digests afresh");
    }
    for kind in [FrameKind::Delta, FrameKind::Dense, FrameKind::Verify] {
        for v in [0, 1, u64::MAX] {
            let err = none.begin(kind, v).unwrap_err();
            assert!(
                matches!(err, Error::VersionMismatch { current: None, got, expected: None } if got == v),
                "{kind:?} {v}: {err}"
            );
        }
    }
    // At 5: delta and dense need 6 (a sync of dense parts is a delta), verify 5, seed any.
    let held = held_at(5);
    for kind in [FrameKind::Delta, FrameKind::Dense] {
        let p = held.begin(kind, 6).expect("delta");
        assert_eq!(p.kind(), FrameKind::Delta);
        assert_eq!(
            p.digests(),
            &[11, 22],
            "a delta starts from the held digests"
        );
        for v in [0, 4, 5, 7, u64::MAX] {
            let err = held.begin(kind, v).unwrap_err();
            assert!(
                matches!(err, Error::VersionMismatch { current: Some(5), got, expected: Some(6) } if got == v),
                "{kind:?} {v}: {err}"
            );
        }
    }
    assert_eq!(
        held.begin(FrameKind::Verify, 5).expect("verify").kind(),
        FrameKind::Verify
    );
    for v in [4, 6] {
        assert!(matches!(
            held.begin(FrameKind::Verify, v),
            Err(Error::VersionMismatch {
                current: Some(5),
                expected: Some(5),
                ..
            })
        ));
    }
    for v in [0, 5, 6, 99] {
        assert!(held.begin(FrameKind::Seed, v).is_ok());
    }
    // A close starts nothing; it is taken between syncs only.
    assert!(matches!(
        held.begin(FrameKind::Close, 5),
        Err(Error::Malformed(_))
    ));
    assert!(held.check_close(false).is_ok());
    assert!(matches!(
        held.check_close(true),
        Err(Error::IncompleteSync(_))
    ));
}

#[test]
fn no_version_follows_u64_max() {
    let held = held_at(u64::MAX);
    for kind in [FrameKind::Delta, FrameKind::Dense] {
        for v in [0, u64::MAX] {
            let err = held.begin(kind, v).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::VersionMismatch {
                        current: Some(u64::MAX),
                        expected: None,
                        ..
                    }
                ),
                "{err}"
            );
        }
    }
    assert!(held.begin(FrameKind::Verify, u64::MAX).is_ok());
    assert!(held.begin(FrameKind::Seed, 0).is_ok());
    // One below: the last delta there is.
    assert!(held_at(u64::MAX - 1)
        .begin(FrameKind::Delta, u64::MAX)
        .is_ok());
}

#[test]
fn the_base_check() {
    let t = table();
    let held = held_at(5);
    assert!(held.check_base(&t, 0, 11).is_ok());
    assert!(held.check_base(&t, 1, 22).is_ok());
    let err = held.check_base(&t, 1, 11).unwrap_err();
    assert!(
        matches!(&err, Error::BaseDigestMismatch { slot, expected: 11, actual: 22 } if slot == "b"),
        "{err}"
    );
    assert!(err.to_string().contains("`b`"), "{err}");
    assert!(matches!(
        held.check_base(&t, 2, 0),
        Err(Error::UnknownSlot(2))
    ));
}

#[test]
fn settling_digests() {
    let t = table();
    let held = held_at(5);
    let mut p = held.begin(FrameKind::Delta, 6).expect("begin");
    let err = p.settle(&t, 0, 12, 13).unwrap_err();
    assert!(
        matches!(&err, Error::DigestMismatch { slot, expected: 13, actual: 12 } if slot == "a"),
        "{err}"
    );
    assert_eq!(p.digests(), &[11, 22], "a mismatch settles nothing");
    p.settle(&t, 0, 12, 12).expect("equal");
    assert_eq!(p.digests(), &[12, 22]);
    assert!(
        matches!(p.settle(&t, 0, 12, 12), Err(Error::Malformed(_))),
        "settled twice"
    );
    assert!(matches!(p.settle(&t, 7, 0, 0), Err(Error::UnknownSlot(7))));
}

#[test]
fn commit_holds_the_new_version() {
    let t = table();
    let mut held = HeldState::none(&t);
    let seed = settled(&t, &held, FrameKind::Seed, 3, [5, 6]);
    assert_eq!(held.commit(&t, seed).expect("commit"), 3);
    assert_eq!((held.version(), held.digests()), (Some(3), &[5u64, 6][..]));
    assert_eq!(held.state_digest(), 11);
    let delta = settled(&t, &held, FrameKind::Delta, 4, [5, u64::MAX]);
    assert_eq!(held.commit(&t, delta).expect("commit"), 4);
    assert_eq!(held.digests(), &[5, u64::MAX]);
    assert_eq!(held.state_digest(), 4, "the sum wraps");
    let verify = settled(&t, &held, FrameKind::Verify, 4, [5, u64::MAX]);
    assert_eq!(held.commit(&t, verify).expect("commit"), 4);
    assert_eq!(held.version(), Some(4));
}

#[test]
fn commit_needs_every_slot_settled() {
    let t = table();
    for clobber in [false, true] {
        let mut held = held_at(5);
        let mut p = held.begin(FrameKind::Delta, 6).expect("begin");
        p.settle(&t, 0, 12, 12).expect("settle");
        if clobber {
            p.clobber();
        }
        let err = held.commit(&t, p).unwrap_err();
        assert!(
            matches!(&err, Error::IncompleteSync(m) if m.contains("`b`")),
            "{err}"
        );
        // Refused as a failure: the version stays unless the sync clobbered.
        let want = (!clobber).then_some(5);
        assert_eq!(held.version(), want);
        assert_eq!(held.digests(), &[11, 22], "digests unchanged");
    }
}

#[test]
fn fail_keeps_the_version_unless_clobbered() {
    let t = table();
    let mut held = held_at(5);
    let mut p = held.begin(FrameKind::Delta, 6).expect("begin");
    p.settle(&t, 0, 12, 12).expect("settle");
    assert!(!p.is_clobbered());
    held.fail(p);
    assert_eq!(
        (held.version(), held.digests()),
        (Some(5), &[11u64, 22][..])
    );

    let mut p = held.begin(FrameKind::Seed, 9).expect("begin");
    p.clobber();
    assert!(p.is_clobbered());
    held.fail(p);
    assert_eq!(held.version(), None, "clobbered: nothing held");
    assert!(held.begin(FrameKind::Delta, 6).is_err(), "only a seed now");
    assert!(held.begin(FrameKind::Seed, 6).is_ok());
}

#[test]
fn verify_loses_the_state_on_a_mismatch() {
    let t = table();
    let mut held = held_at(5);
    held.verify(&t, &[11, 22]).expect("same digests");
    assert_eq!(held.version(), Some(5));
    assert!(matches!(
        held.verify(&t, &[11]),
        Err(Error::InvalidArgument(_))
    ));
    assert_eq!(held.version(), Some(5), "a wrong call loses nothing");
    let err = held.verify(&t, &[11, 23]).unwrap_err();
    assert!(
        matches!(&err, Error::DigestMismatch { slot, expected: 22, actual: 23 } if slot == "b"),
        "{err}"
    );
    assert_eq!(held.version(), None);
    // Nothing held: nothing to check.
    held.verify(&t, &[0, 0]).expect("nothing held");
    held.verify(&t, &[1, 2]).expect("nothing held");

    let mut held = held_at(5);
    held.lose();
    assert_eq!(held.version(), None);
    assert_eq!(
        held.digests(),
        &[11, 22],
        "lose drops the version, not the record"
    );
}

#[test]
fn a_sync_is_complete_once_every_slot_settled() {
    let t = table();
    let held = held_at(5);
    let mut p = held.begin(FrameKind::Delta, 6).expect("begin");
    assert!(!p.is_complete());
    p.settle(&t, 1, 9, 9).expect("settle b");
    assert!(!p.is_complete(), "slot a is not settled");
    // What commit refuses, is_complete says beforehand.
    let mut early = held.clone();
    assert!(early.commit(&t, p.clone()).is_err());
    p.settle(&t, 0, 8, 8).expect("settle a");
    assert!(p.is_complete());
    let mut h = held.clone();
    assert_eq!(h.commit(&t, p).expect("commit"), 6);
    assert_eq!(h.digests(), &[8, 9]);
}
