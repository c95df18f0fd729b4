//! `ChangeReceiver`: a group of members, each holding part of every slot (some elements on two
//! members, counted by the lower one), checks syncs together (digest parts summed) and writes
//! only the changes of what it holds. The oracle is a plain `Receiver` holding everything, and
//! the sender's own bits.

mod common;

use common::*;
use deltacast::apply::changes::{COUNTED, HELD, NOT_HELD};
use deltacast::flush::FlushConfig;
use deltacast::{ChangeReceiver, Error, HeldBits, Progress, Receiver, Sender, SlotTable};

const MEMBERS: usize = 3;

/// Which members hold element `i` of slot `s`: one by a hash, and every fifth element also
/// the next member (a replicated element).
fn holders(s: u32, i: u64) -> Vec<usize> {
    let h = (i.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ (s as u64 * 31)) >> 7;
    let a = (h % MEMBERS as u64) as usize;
    if i.is_multiple_of(5) {
        let mut v = vec![a, (a + 1) % MEMBERS];
        v.sort();
        v
    } else {
        vec![a]
    }
}

/// A member's bits: full-size buffers for the test's convenience, only the held elements
/// meaningful (the others stay zero and must never be written).
struct Member {
    id: usize,
    bufs: Vec<Vec<u8>>,
    widths: Vec<usize>,
    reads: usize,
    /// `read_many` calls: one per frame.
    calls: usize,
}

impl HeldBits for Member {
    fn read(
        &mut self,
        slot: u32,
        positions: &[u64],
        old: &mut Vec<u8>,
        share: &mut Vec<u8>,
    ) -> deltacast::Result<()> {
        let w = self.widths[slot as usize];
        self.reads += positions.len();
        for &i in positions {
            let h = holders(slot, i);
            let at = i as usize * w;
            if h.contains(&self.id) {
                old.extend_from_slice(&self.bufs[slot as usize][at..at + w]);
                share.push(if h[0] == self.id { COUNTED } else { HELD });
            } else {
                old.extend(std::iter::repeat_n(0u8, w));
                share.push(NOT_HELD);
            }
        }
        Ok(())
    }

    fn read_many(
        &mut self,
        requests: &[(u32, &[u64])],
        old: &mut Vec<u8>,
        share: &mut Vec<u8>,
    ) -> deltacast::Result<()> {
        self.calls += 1;
        for &(slot, positions) in requests {
            self.read(slot, positions, old, share)?;
        }
        Ok(())
    }
}

struct Group {
    table: SlotTable,
    rx: Vec<ChangeReceiver>,
    members: Vec<Member>,
}

impl Group {
    fn new(table: &SlotTable) -> Self {
        let widths: Vec<usize> = table.slots().iter().map(|s| s.dtype.width()).collect();
        Group {
            table: table.clone(),
            rx: (0..MEMBERS)
                .map(|_| ChangeReceiver::new(table.clone()))
                .collect(),
            members: (0..MEMBERS)
                .map(|id| Member {
                    id,
                    bufs: table
                        .slots()
                        .iter()
                        .map(|s| vec![0; s.nbytes() as usize])
                        .collect(),
                    widths: widths.clone(),
                    reads: 0,
                    calls: 0,
                })
                .collect(),
        }
    }

    /// Delivers `frames` to every member (`corrupt`: member m's copy of frame f gets one byte
    /// flipped), then the group rule: any refusal, every member aborts; else the parts are
    /// summed, settled everywhere, and committed only if every member settled.
    fn sync(&mut self, frames: &[Vec<u8>], corrupt: Option<(usize, usize)>) -> Result<(), Error> {
        let mut first_err = None;
        let mut complete = [false; MEMBERS];
        for (m, done) in complete.iter_mut().enumerate() {
            for (f, frame) in frames.iter().enumerate() {
                let mut frame = frame.clone();
                if corrupt == Some((m, f)) {
                    let at = frame.len() / 2;
                    frame[at] ^= 0x10;
                }
                match self.rx[m].receive(&frame, &mut self.members[m]) {
                    Ok(Progress::Complete) => *done = true,
                    Ok(_) => {}
                    Err(e) => {
                        first_err.get_or_insert(e);
                        break;
                    }
                }
            }
        }
        if let Some(e) = first_err {
            self.rx.iter_mut().for_each(ChangeReceiver::abort_sync);
            return Err(e);
        }
        assert!(
            complete.iter().all(|&c| c),
            "every member completes the same frames"
        );
        let mut sums = vec![0u64; self.table.len()];
        for r in &self.rx {
            for (s, p) in sums.iter_mut().zip(r.part().expect("a part")) {
                *s = s.wrapping_add(*p);
            }
        }
        let settled: Vec<_> = self.rx.iter_mut().map(|r| r.settle(&sums)).collect();
        if let Some(e) = settled.into_iter().find_map(Result::err) {
            self.rx.iter_mut().for_each(ChangeReceiver::abort_sync);
            return Err(e);
        }
        for (r, m) in self.rx.iter_mut().zip(&mut self.members) {
            for c in r.changes() {
                let w = m.widths[c.slot as usize];
                for (k, p) in c.positions(w).into_iter().enumerate() {
                    let at = p as usize * w;
                    let dst = &mut m.bufs[c.slot as usize][at..at + w];
                    assert_eq!(dst, &c.old[k * w..(k + 1) * w], "old bits as held");
                    dst.copy_from_slice(&c.values[k * w..(k + 1) * w]);
                }
            }
            r.commit().expect("commit");
        }
        Ok(())
    }

    /// Every member holds exactly the oracle's bits where it holds anything, zero elsewhere.
    fn check(&self, oracle: &[Vec<u8>], what: &str) {
        for m in &self.members {
            for (s, slot) in self.table.slots().iter().enumerate() {
                let w = slot.dtype.width();
                for i in 0..slot.numel() {
                    let at = i as usize * w;
                    let got = &m.bufs[s][at..at + w];
                    if holders(s as u32, i).contains(&m.id) {
                        assert_eq!(
                            got,
                            &oracle[s][at..at + w],
                            "{what}: member {} slot {s} element {i}",
                            m.id
                        );
                    } else {
                        assert!(
                            got.iter().all(|&b| b == 0),
                            "{what}: member {} wrote element {i} it does not hold",
                            m.id
                        );
                    }
                }
            }
        }
    }
}

fn frames(sender: &mut Sender, current: &[Vec<u8>]) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    sender
        .sync(&slices(current), |f| {
            out.push(f);
            Ok(())
        })
        .expect("sync");
    out
}

#[test]
fn a_group_of_part_holders_tracks_a_full_receiver_bit_for_bit() {
    for (seed, bucket, codec) in [
        (11u64, 1 << 22, "auto"),
        (12, 3000, "auto"),
        (13, 5000, "abs32+raw"),
        (14, 4000, "steps+esc"),
    ] {
        let mut rng = Rng(seed);
        let table = random_table(&mut rng, 8, 4000);
        let config = FlushConfig {
            bucket_size: bucket,
            chunk_elems: 300,
            codec: deltacast::CodecChoice::parse(codec).expect("codec"),
        };
        let mut sender = Sender::new(table.clone(), config).expect("sender");
        let mut oracle = Receiver::new(table.clone());
        let mut group = Group::new(&table);
        let mut current = random_buffers(&mut rng, &table);
        for (step, density) in [1.0, 0.01, 0.2, 0.0, 0.9, 0.003].into_iter().enumerate() {
            if step > 0 {
                for (slot, buf) in table.slots().iter().zip(current.iter_mut()) {
                    mutate(&mut rng, buf, slot.dtype.width(), density);
                }
            }
            let f = frames(&mut sender, &current);
            for x in &f {
                oracle.receive(x).expect("oracle");
            }
            let reads_before: usize = group.members.iter().map(|m| m.reads).sum();
            let calls_before: Vec<usize> = group.members.iter().map(|m| m.calls).collect();
            group.sync(&f, None).expect("group sync");
            let what = format!("seed {seed} step {step}");
            assert_eq!(oracle.store(), &current, "{what}");
            group.check(&current, &what);
            for r in &group.rx {
                assert_eq!(r.version(), oracle.version(), "{what}");
                assert_eq!(r.digests(), oracle.digests(), "{what}");
            }
            for (m, before) in group.members.iter().zip(calls_before) {
                // One read per frame, whatever its slots (ctx chunks read on their own).
                assert!(
                    m.calls - before <= f.len(),
                    "{what}: {} reads",
                    m.calls - before
                );
                assert!(m.calls > before, "{what}: no read");
            }
            if step > 0 {
                // O(changed): each member reads the sync's changed elements, not the slots.
                let reads: usize =
                    group.members.iter().map(|m| m.reads).sum::<usize>() - reads_before;
                let total: u64 = table.total_elements();
                if density < 0.05 {
                    assert!(
                        (reads as u64) < total * MEMBERS as u64 / 4,
                        "{what}: {reads} reads for {total} elements"
                    );
                }
            }
        }
        // A verify: parts of every held element, summed, equal the sender's.
        let mut v = Vec::new();
        sender
            .verify(|f| {
                v.push(f);
                Ok(())
            })
            .expect("verify");
        group.sync(&v, None).expect("verify passes");
    }
}

#[test]
fn one_member_that_refuses_makes_the_group_write_nothing() {
    let mut rng = Rng(21);
    let table = random_table(&mut rng, 6, 3000);
    let config = FlushConfig {
        bucket_size: 1200,
        chunk_elems: 200,
        ..FlushConfig::default()
    };
    let mut sender = Sender::new(table.clone(), config).expect("sender");
    let mut group = Group::new(&table);
    let mut current = random_buffers(&mut rng, &table);
    group
        .sync(&frames(&mut sender, &current), None)
        .expect("seed");
    let mutate_all = |rng: &mut Rng, cur: &mut Vec<Vec<u8>>| {
        for (slot, buf) in table.slots().iter().zip(cur.iter_mut()) {
            mutate(rng, buf, slot.dtype.width(), 0.3);
        }
    };

    // A corrupted frame on one member only.
    let held = current.clone();
    mutate_all(&mut rng, &mut current);
    let f = frames(&mut sender, &current);
    assert!(f.len() > 1, "several frames");
    let err = group
        .sync(&f, Some((1, f.len() - 1)))
        .expect_err("corrupt frame");
    assert!(
        matches!(err, Error::ChecksumMismatch { .. } | Error::Malformed(_)),
        "{err:?}"
    );
    group.check(&held, "after a corrupted frame");
    assert!(group
        .rx
        .iter()
        .all(|r| r.version() == Some(1) && !r.awaits_commit()));
    // The genuine frames again: accepted.
    group.sync(&f, None).expect("genuine");
    group.check(&current, "after the genuine sync");

    // A member whose bits diverged (written behind its back) at an element the next delta
    // changes: its part of the digest change is wrong, so the group's sum is, every member
    // refuses at settle, and nobody writes.
    let prev = current.clone();
    mutate_all(&mut rng, &mut current);
    let (s, i, w) = table
        .slots()
        .iter()
        .enumerate()
        .find_map(|(s, slot)| {
            let w = slot.dtype.width();
            (0..slot.numel())
                .find(|&i| {
                    let at = i as usize * w;
                    holders(s as u32, i)[0] == 2 && prev[s][at..at + w] != current[s][at..at + w]
                })
                .map(|i| (s, i, w))
        })
        .expect("a changed element counted by member 2");
    group.members[2].bufs[s][i as usize * w] ^= 1;
    let mut tampered = prev.clone();
    tampered[s][i as usize * w] ^= 1;
    let f = frames(&mut sender, &current);
    let err = group.sync(&f, None).expect_err("diverged member");
    assert!(
        matches!(err, Error::DigestMismatch { .. } | Error::Malformed(_)),
        "{err:?}"
    );
    group.check(&tampered, "after the refused sync");
    assert!(group.rx.iter().all(|r| r.version() == Some(2)));

    // Repaired, the same sync lands. Then the group restarts (holds nothing): a delta is
    // refused, a seed of the version the sender holds (resend_seed, the sender does not move
    // on) lands, and the next delta too; a replay of an old sync is refused.
    group.members[2].bufs[s][i as usize * w] ^= 1;
    group.sync(&f, None).expect("the sync again, once repaired");
    group.check(&current, "after the repaired sync");
    let mut seed = Vec::new();
    sender
        .resend_seed(&slices(&current), |x| {
            seed.push(x);
            Ok(())
        })
        .expect("resend");
    group = Group::new(&table);
    let err = group
        .sync(&f, None)
        .expect_err("a fresh group needs a seed");
    assert!(matches!(err, Error::VersionMismatch { .. }), "{err:?}");
    group.sync(&seed, None).expect("seed");
    group.check(&current, "after the re-seed");
    mutate_all(&mut rng, &mut current);
    let g = frames(&mut sender, &current);
    group.sync(&g, None).expect("next delta");
    group.check(&current, "after the next delta");
    let err = group.sync(&f, None).expect_err("replay");
    assert!(matches!(err, Error::VersionMismatch { .. }), "{err:?}");
}

/// An owner that holds and counts every element (a TP-1 engine): the receiver's fast path.
struct Whole {
    bufs: Vec<Vec<u8>>,
    widths: Vec<usize>,
}

impl HeldBits for Whole {
    fn read(
        &mut self,
        slot: u32,
        positions: &[u64],
        old: &mut Vec<u8>,
        share: &mut Vec<u8>,
    ) -> deltacast::Result<()> {
        let w = self.widths[slot as usize];
        for &i in positions {
            let at = i as usize * w;
            old.extend_from_slice(&self.bufs[slot as usize][at..at + w]);
            share.push(COUNTED);
        }
        Ok(())
    }
}

/// A delta element whose new bits the owner already holds (its bits changed behind the
/// receiver's back to exactly the new value) is refused by name, whether every element of the
/// chunk is counted here (the vectorized sums) or the shares are mixed (a group member).
#[test]
fn a_delta_to_bits_already_held_is_refused_on_both_paths() {
    let mut rng = Rng(77);
    let table = random_table(&mut rng, 6, 3000);
    let config = FlushConfig {
        bucket_size: 1200,
        chunk_elems: 200,
        ..FlushConfig::default()
    };
    let mut sender = Sender::new(table.clone(), config).expect("sender");
    let widths: Vec<usize> = table.slots().iter().map(|s| s.dtype.width()).collect();
    let mut whole = Whole {
        bufs: table
            .slots()
            .iter()
            .map(|s| vec![0; s.nbytes() as usize])
            .collect(),
        widths: widths.clone(),
    };
    let mut rx = ChangeReceiver::new(table.clone());
    let mut group = Group::new(&table);
    let mut current = random_buffers(&mut rng, &table);
    let seed = frames(&mut sender, &current);
    group.sync(&seed, None).expect("group seed");
    for f in &seed {
        rx.receive(f, &mut whole).expect("seed");
    }
    let part: Vec<u64> = rx.part().expect("part").into();
    rx.settle(&part).expect("settle");
    whole.bufs = current.clone();
    rx.commit().expect("commit");
    assert_eq!(rx.digests(), group.rx[0].digests());

    let prev = current.clone();
    for (slot, buf) in table.slots().iter().zip(current.iter_mut()) {
        mutate(&mut rng, buf, slot.dtype.width(), 0.3);
    }
    let (s, i) = (0..table.len())
        .find_map(|s| {
            let w = widths[s];
            (0..table.slots()[s].numel())
                .find(|&i| {
                    let at = i as usize * w;
                    prev[s][at..at + w] != current[s][at..at + w]
                })
                .map(|i| (s, i))
        })
        .expect("a changed element");
    let (w, at) = (widths[s], i as usize * widths[s]);
    let f = frames(&mut sender, &current);

    whole.bufs[s][at..at + w].copy_from_slice(&current[s][at..at + w]);
    let err = f
        .iter()
        .find_map(|x| rx.receive(x, &mut whole).err())
        .expect("refused");
    let text = err.to_string();
    assert!(
        text.contains("already holds") && text.contains(&format!("element {i}")),
        "{text}"
    );

    for m in &mut group.members {
        if holders(s as u32, i).contains(&m.id) {
            m.bufs[s][at..at + w].copy_from_slice(&current[s][at..at + w]);
        }
    }
    let err = group.sync(&f, None).expect_err("group refuses");
    let text = err.to_string();
    assert!(
        text.contains("already holds") && text.contains(&format!("element {i}")),
        "{text}"
    );
}
