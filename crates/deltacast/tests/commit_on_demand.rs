//! Stage, then commit: with `set_commit_on_demand`, a receiver verifies each sync whole at its
//! last flush but writes nothing until `commit`; `abort_sync` drops it. The oracle is the
//! sender's own bits (and, before the commit, the receiver's previous ones).

mod common;

use common::*;
use deltacast::flush::FlushConfig;
use deltacast::{Error, FrameKind, Receiver, Sender, WeightSender};

fn frames_of(sender: &mut Sender, current: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut frames = Vec::new();
    sender
        .sync(&slices(current), |f| {
            frames.push(f);
            Ok(())
        })
        .expect("sync");
    frames
}

fn setup(seed: u64, bucket: usize) -> (Rng, Sender, Receiver, Vec<Vec<u8>>) {
    let mut rng = Rng(seed);
    let table = random_table(&mut rng, 7, 5000);
    let config = FlushConfig {
        bucket_size: bucket,
        chunk_elems: 256,
        ..FlushConfig::default()
    };
    let sender = Sender::new(table.clone(), config).expect("sender");
    let mut receiver = Receiver::new(table.clone());
    receiver.set_commit_on_demand(true);
    let current = random_buffers(&mut rng, &table);
    (rng, sender, receiver, current)
}

fn step(rng: &mut Rng, receiver: &Receiver, current: &mut [Vec<u8>], density: f64) {
    for (slot, buf) in receiver.table().slots().iter().zip(current.iter_mut()) {
        mutate(rng, buf, slot.dtype.width(), density);
    }
}

#[test]
fn nothing_is_written_before_the_commit_and_everything_after() {
    // One frame per sync (a big bucket) and many (a small one); seeds, deltas and a dense step.
    for (seed, bucket) in [(1, 1 << 24), (2, 4096)] {
        let (mut rng, mut sender, mut receiver, mut current) = setup(seed, bucket);
        for (i, density) in [1.0, 0.01, 0.3, 0.0, 0.9, 0.002].into_iter().enumerate() {
            if i > 0 {
                step(&mut rng, &receiver, &mut current, density);
            }
            let before = receiver.store().clone();
            let held = receiver.version();
            let frames = frames_of(&mut sender, &current);
            for f in &frames {
                assert!(receiver.receive(f).expect("receive").is_none());
            }
            assert!(receiver.awaits_commit(), "bucket {bucket} step {i}");
            assert_eq!(receiver.store(), &before, "written before the commit");
            assert_eq!(receiver.version(), held, "version taken before the commit");
            let outcome = receiver.commit().expect("commit");
            assert_eq!(outcome.version, sender.version());
            assert_eq!(outcome.state_digest, sender.state_digest());
            assert_eq!(receiver.store(), &current, "bucket {bucket} step {i}");
            assert!(receiver.recompute_digests().is_empty());
            assert!(!receiver.awaits_commit());
            if i == 0 {
                assert_eq!(outcome.kind, FrameKind::Seed);
            }
        }
    }
}

#[test]
fn an_aborted_sync_leaves_the_version_held_and_the_next_one_follows_it() {
    let (mut rng, mut sender, mut receiver, mut current) = setup(3, 4096);
    receiver.receive_all(&frames_of(&mut sender, &current));
    receiver.commit().expect("seed");
    let seeded = current.clone();
    step(&mut rng, &receiver, &mut current, 0.05);
    let frames = frames_of(&mut sender, &current);
    receiver.receive_all(&frames);
    assert!(receiver.awaits_commit());
    // A frame of another sync while one waits: refused, the waiting sync kept.
    let refused = receiver.receive(&frames[0]);
    assert!(
        matches!(refused, Err(Error::InvalidArgument(_))),
        "{refused:?}"
    );
    assert!(receiver.awaits_commit());
    receiver.abort_sync();
    assert!(!receiver.awaits_commit());
    assert_eq!(receiver.store(), &seeded);
    assert_eq!(receiver.version(), Some(1));
    assert!(matches!(receiver.commit(), Err(Error::InvalidArgument(_))));
    // The aborted version 2 never landed: the sender (told so) reseeds, and that applies.
    sender.request_seed();
    receiver.receive_all(&frames_of(&mut sender, &current));
    let outcome = receiver.commit().expect("reseed");
    assert_eq!(outcome.kind, FrameKind::Seed);
    assert_eq!(receiver.store(), &current);
}

#[test]
fn a_sync_that_fails_its_checks_is_refused_at_its_last_flush_and_writes_nothing() {
    let (mut rng, mut sender, mut receiver, mut current) = setup(4, 1 << 24);
    receiver.receive_all(&frames_of(&mut sender, &current));
    receiver.commit().expect("seed");
    let seeded = current.clone();
    // The receiver's weights change behind its back: the delta's digests no longer add up.
    let slot = (0..receiver.table().len())
        .find(|&i| !seeded[i].is_empty())
        .expect("a non-empty slot");
    receiver.store_mut()[slot][0] ^= 1;
    let tampered = receiver.store().clone();
    // The sender changes that element too (and a few others): the receiver's change of it
    // starts from other bits than the sender's.
    current[slot][0] ^= 2;
    step(&mut rng, &receiver, &mut current, 0.01);
    let frames = frames_of(&mut sender, &current);
    let got = frames
        .iter()
        .map(|f| receiver.receive(f))
        .find(|r| r.is_err())
        .expect("a refusal");
    assert!(matches!(got, Err(Error::DigestMismatch { .. })), "{got:?}");
    assert!(!receiver.awaits_commit());
    assert_eq!(
        receiver.store(),
        &tampered,
        "a refused sync wrote something"
    );
}

trait ReceiveAll {
    fn receive_all(&mut self, frames: &[Vec<u8>]);
}

impl ReceiveAll for Receiver {
    fn receive_all(&mut self, frames: &[Vec<u8>]) {
        for f in frames {
            assert!(self.receive(f).expect("receive").is_none());
        }
    }
}
