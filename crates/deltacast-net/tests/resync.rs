//! The resync protocol under faults, over real sockets on 127.0.0.1: receivers are threads
//! running [`SyncClient`], faults come from a [`FaultProxy`] between a receiver and the server or
//! from the test itself (restarts, tampering). The oracle is independent of the protocol: at the
//! end every receiver's bytes equal the trainer's, byte for byte, its running digest equals the
//! trainer's and a full recomputation from memory agrees. No sleeps synchronize anything: every
//! wait is a protocol call with a short timeout that fails loudly.

use std::net::SocketAddr;
use std::thread;
use std::time::{Duration, Instant};

use deltacast::{DType, FlushConfig, FrameKind, Receiver, SlotInfo, SlotTable};
use deltacast_net::fault::{Fault, FaultProxy};
use deltacast_net::{
    ClientEvent, NetConfig, Secret, SessionConfig, SyncClient, SyncReport, SyncServer,
};

use common::Rng;
use deltacast_testkit as common;

const KEY: &str = "resync-test-secret-0123456789";

fn table(elems: u64) -> SlotTable {
    SlotTable::new(vec![
        SlotInfo::new("embed", DType::BF16, vec![elems / 64, 48]),
        SlotInfo::new("norm", DType::BF16, vec![64]),
        SlotInfo::new("proj", DType::BF16, vec![elems / 64, 16]),
    ])
    .expect("table")
}

/// Random BF16 bit patterns (any pattern: NaNs and ±0 included).
fn weights(t: &SlotTable, rng: &mut Rng) -> Vec<Vec<u8>> {
    t.slots()
        .iter()
        .map(|s| (0..s.nbytes()).map(|_| rng.next_u64() as u8).collect())
        .collect()
}

/// An optimizer step: about 2% of the elements change bits (low bits of random elements).
fn step(w: &mut [Vec<u8>], rng: &mut Rng) {
    for slot in w.iter_mut() {
        let n = slot.len() / 2;
        for _ in 0..(n / 50).max(1) {
            let i = rng.below(n as u64) as usize;
            slot[2 * i] ^= 1 + (rng.below(3) as u8);
        }
    }
}

fn slices(w: &[Vec<u8>]) -> Vec<&[u8]> {
    w.iter().map(Vec::as_slice).collect()
}

fn net() -> NetConfig {
    let mut c = NetConfig::default()
        .with_secret(Some(Secret::new(KEY).expect("secret")))
        .with_timeouts(Duration::from_secs(5));
    c.max_frame = 8 << 20;
    c
}

/// Small flushes, so every sync has several and a fault can land in the middle of one.
fn flush() -> FlushConfig {
    FlushConfig {
        bucket_size: 2048,
        chunk_elems: 512,
        ..FlushConfig::default()
    }
}

fn session(min: usize) -> SessionConfig {
    SessionConfig {
        min_receivers: min,
        sync_timeout: Duration::from_secs(20),
        ..SessionConfig::default()
    }
}

fn server(t: &SlotTable, min: usize) -> SyncServer {
    let lo: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    SyncServer::bind(lo, net(), t.clone(), flush(), session(min)).expect("bind")
}

/// What a receiver thread saw, with its state at that moment.
#[derive(Debug)]
struct Seen {
    what: String,
    kind: Option<FrameKind>,
    version: Option<u64>,
    digest: u64,
    /// Memory equals the running digests (no half-applied or unproven state).
    consistent: bool,
    staging: bool,
}

type Hook = Box<dyn FnMut(&mut SyncClient, &ClientEvent) -> Option<SyncClient> + Send>;

/// Runs a client until the server closes the session; `hook` may act after each event (tamper,
/// restart by returning a replacement client). Returns the log and the final receiver.
fn run_client(mut c: SyncClient, mut hook: Hook) -> (Vec<Seen>, Receiver) {
    let mut log = Vec::new();
    loop {
        let ev = c.next_event().expect("client");
        let r = c.receiver();
        let (what, kind) = match &ev {
            ClientEvent::Connected { diverged, .. } => {
                (format!("connected diverged={diverged}"), None)
            }
            ClientEvent::Applied { outcome, diverged } => {
                (format!("applied diverged={diverged}"), Some(outcome.kind))
            }
            ClientEvent::Rejected { error, .. } => (format!("rejected: {error}"), None),
            ClientEvent::Disconnected { error, .. } => (format!("disconnected: {error}"), None),
            ClientEvent::Closed { .. } => ("closed".to_string(), None),
        };
        log.push(Seen {
            what,
            kind,
            version: r.version(),
            digest: r.state_digest(),
            consistent: r.recompute_digests().is_empty(),
            staging: r.is_staging(),
        });
        if matches!(ev, ClientEvent::Closed { .. }) {
            return (log, c.into_receiver());
        }
        if let Some(next) = hook(&mut c, &ev) {
            c = next;
            log.push(Seen {
                what: "restarted".into(),
                kind: None,
                version: c.receiver().version(),
                digest: c.receiver().state_digest(),
                consistent: true,
                staging: false,
            });
        }
    }
}

fn no_hook() -> Hook {
    Box::new(|_, _| None)
}

fn spawn(c: SyncClient, hook: Hook) -> thread::JoinHandle<(Vec<Seen>, Receiver)> {
    thread::spawn(move || run_client(c, hook))
}

fn client(t: &SlotTable, addr: SocketAddr, verify_every: u32) -> SyncClient {
    client_applying(t, addr, verify_every, false)
}

/// A client whose receiver writes each flush as it arrives when `in_place`.
fn client_applying(
    t: &SlotTable,
    addr: SocketAddr,
    verify_every: u32,
    in_place: bool,
) -> SyncClient {
    let mut r = Receiver::new(t.clone());
    r.set_apply_as_received(in_place);
    SyncClient::new(addr, net(), r, verify_every)
}

/// The oracle: bytes, running digest, recomputed digest and version equal the trainer's.
fn assert_same(r: &Receiver, w: &[Vec<u8>], version: u64, digest: u64, who: &str) {
    assert_eq!(r.version(), Some(version), "{who}: version");
    assert_eq!(r.state_digest(), digest, "{who}: running digest");
    assert!(r.recompute_digests().is_empty(), "{who}: memory vs digest");
    for (i, (a, b)) in r.store().iter().zip(w).enumerate() {
        assert!(a == b, "{who}: slot {i} differs from the trainer's bytes");
    }
}

fn sync_ok(s: &mut SyncServer, w: &[Vec<u8>]) -> SyncReport {
    let rep = s.sync(&slices(w)).expect("sync");
    assert!(rep.complete(), "sync incomplete: {rep:#?}");
    rep
}

fn applied(log: &[Seen]) -> Vec<(u64, FrameKind)> {
    log.iter()
        .filter_map(|s| Some((s.version?, s.kind?)))
        .collect()
}

#[test]
fn dropped_connection_mid_sync_keeps_the_version_and_gets_the_sync_again() {
    // Also with a receiver that wrote the delta's first flush before the cut: the drop
    // must put it back.
    for in_place in [false, true] {
        dropped_connection_mid_sync(in_place);
    }
}

fn dropped_connection_mid_sync(in_place: bool) {
    let t = table(1 << 17);
    let mut rng = Rng(1);
    let mut w = weights(&t, &mut rng);
    let mut s = server(&t, 2);
    let proxy = FaultProxy::start(s.local_addr(), 8 << 20).expect("proxy");
    let a = spawn(client_applying(&t, proxy.addr(), 0, in_place), no_hook());
    let b = spawn(client(&t, s.local_addr(), 0), no_hook());
    let r1 = sync_ok(&mut s, &w);
    assert!(r1.seed);

    step(&mut w, &mut rng);
    // Frame 0 of the delta arrives whole, frame 1 half: then the connection dies.
    proxy.inject(Fault::DropMidFrame { after: 1 });
    let r2 = sync_ok(&mut s, &w);
    let done: Vec<&str> = proxy.done().iter().map(Fault::kind).collect();
    assert_eq!(done, ["drop"], "the cut came in the delta's second flush");
    assert!(
        !r2.seed && r2.delta_bytes > 2048,
        "a delta of several flushes: {r2:?}"
    );
    assert_eq!(r2.dropped.len(), 1, "{r2:?}");
    assert_eq!(r2.delta_sends, 3, "two receivers, one re-send: {r2:?}");
    assert_eq!(r2.seed_sends, 0, "it held the base: no seed needed: {r2:?}");

    step(&mut w, &mut rng);
    let r3 = sync_ok(&mut s, &w);
    let (v, d) = (s.version(), s.state_digest());
    s.close("test over");
    let (log, ra) = a.join().expect("a");
    let (_, rb) = b.join().expect("b");
    assert_same(&ra, &w, v, d, "a");
    assert_same(&rb, &w, v, d, "b");
    assert_eq!(r3.version, 3);

    let cut = log
        .iter()
        .position(|e| e.what.starts_with("disconnected"))
        .expect("a saw the drop");
    let at_cut = &log[cut];
    assert_eq!(at_cut.version, Some(1), "{log:#?}");
    assert_eq!(at_cut.digest, r1.state_digest);
    assert!(at_cut.consistent && !at_cut.staging, "{log:#?}");
    assert_eq!(
        applied(&log[cut..]),
        vec![(2, FrameKind::Delta), (3, FrameKind::Delta)],
        "{log:#?}"
    );
}

#[test]
fn corrupted_flush_rejects_the_whole_sync_and_it_is_sent_again() {
    for in_place in [false, true] {
        corrupted_flush(in_place);
    }
}

fn corrupted_flush(in_place: bool) {
    let t = table(1 << 17);
    let mut rng = Rng(2);
    let mut w = weights(&t, &mut rng);
    let mut s = server(&t, 1);
    let proxy = FaultProxy::start(s.local_addr(), 8 << 20).expect("proxy");
    let a = spawn(client_applying(&t, proxy.addr(), 0, in_place), no_hook());
    let r1 = sync_ok(&mut s, &w);

    step(&mut w, &mut rng);
    // The second flush is corrupted: the first one verified and was staged, yet nothing may be
    // applied.
    let offset = rng.next_u64();
    proxy.inject(Fault::Corrupt { after: 1, offset });
    let r2 = sync_ok(&mut s, &w);
    assert_eq!(proxy.done().len(), 1);
    assert_eq!(
        (r2.nacks, r2.delta_sends, r2.seed_sends),
        (1, 2, 0),
        "{r2:?}"
    );

    // A corrupted first flush: rejected at once, the rest of the sync skipped, sent again.
    step(&mut w, &mut rng);
    proxy.inject(Fault::Corrupt {
        after: 0,
        offset: rng.next_u64(),
    });
    let r3 = sync_ok(&mut s, &w);
    assert_eq!(r3.nacks, 1, "{r3:?}");
    let (v, d) = (s.version(), s.state_digest());
    s.close("test over");
    let (log, ra) = a.join().expect("a");
    assert_same(&ra, &w, v, d, "a");

    let rejected: Vec<&Seen> = log
        .iter()
        .filter(|e| e.what.starts_with("rejected"))
        .collect();
    assert_eq!(rejected.len(), 2, "{log:#?}");
    assert!(rejected[0].what.contains("checksum"), "{log:#?}");
    // Nothing of the rejected sync was applied: still version 1 with its digest, memory proven.
    assert_eq!(rejected[0].version, Some(1));
    assert_eq!(rejected[0].digest, r1.state_digest);
    assert!(rejected[0].consistent && !rejected[0].staging);
    assert_eq!(rejected[1].version, Some(2));
    assert_eq!(
        applied(&log),
        vec![
            (1, FrameKind::Seed),
            (2, FrameKind::Delta),
            (3, FrameKind::Delta)
        ],
        "{log:#?}"
    );
}

#[test]
fn repeated_rejections_fall_back_to_a_seed_then_drop_the_receiver_by_name() {
    let t = table(1 << 17);
    let mut rng = Rng(8);
    let mut w = weights(&t, &mut rng);
    // Deltas of one flush here, so each corruption hits a different attempt.
    let flush = FlushConfig {
        bucket_size: 64 << 10,
        ..FlushConfig::default()
    };
    let lo: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let mut s = SyncServer::bind(lo, net(), t.clone(), flush, session(1)).expect("bind");
    let proxy = FaultProxy::start(s.local_addr(), 8 << 20).expect("proxy");
    let a = spawn(client(&t, proxy.addr(), 0), no_hook());
    sync_ok(&mut s, &w);

    // Two corrupted sends of the delta: the third attempt (of 3) is a seed, and it arrives.
    step(&mut w, &mut rng);
    for _ in 0..2 {
        proxy.inject(Fault::Corrupt {
            after: 0,
            offset: rng.next_u64(),
        });
    }
    let r2 = sync_ok(&mut s, &w);
    assert_eq!(
        (r2.nacks, r2.delta_sends, r2.seed_sends),
        (2, 2, 1),
        "{r2:?}"
    );
    assert!(r2.dropped.is_empty(), "{r2:?}");

    // Three: all attempts spent, the receiver is dropped with a reason naming it; it reconnects
    // within the sync (hello at the base: the delta again, which gets through).
    step(&mut w, &mut rng);
    for _ in 0..3 {
        proxy.inject(Fault::Corrupt {
            after: 0,
            offset: rng.next_u64(),
        });
    }
    let r3 = sync_ok(&mut s, &w);
    assert_eq!(r3.nacks, 3, "{r3:?}");
    assert_eq!(r3.dropped.len(), 1, "{r3:?}");
    let (who, why) = &r3.dropped[0];
    assert!(who.starts_with("receiver #"), "{who}");
    assert!(why.contains("gave up on it after 3 sends"), "{why}");
    assert_eq!((r3.delta_sends, r3.seed_sends), (3, 1), "{r3:?}");
    assert_eq!(proxy.pending(), 0);

    let (v, d) = (s.version(), s.state_digest());
    s.close("test over");
    let (_, r) = a.join().expect("a");
    assert_same(&r, &w, v, d, "a");
}

#[test]
fn receivers_restarting_empty_or_at_an_old_version_get_a_seed() {
    let t = table(1 << 17);
    let mut rng = Rng(3);
    let mut w = weights(&t, &mut rng);
    let mut s = server(&t, 2);
    let addr = s.local_addr();
    let (ta, tb) = (t.clone(), t.clone());
    // a: keeps a checkpoint of version 1; after version 3 it restarts from it (an old version).
    let mut checkpoint = None;
    let a = spawn(
        client(&t, addr, 0),
        Box::new(move |c, ev| {
            if let ClientEvent::Applied { outcome, .. } = ev {
                if outcome.version == 1 && checkpoint.is_none() {
                    checkpoint = Some(c.receiver().store().clone());
                }
                if outcome.version == 3 {
                    let old = checkpoint.take()?;
                    let r = Receiver::with_state(ta.clone(), old, Some(1)).expect("restore");
                    return Some(SyncClient::new(addr, net(), r, 0));
                }
            }
            None
        }),
    );
    // b: restarts empty after version 3.
    let mut done = false;
    let b = spawn(
        client(&t, addr, 0),
        Box::new(move |_, ev| match ev {
            ClientEvent::Applied { outcome, .. } if outcome.version == 3 && !done => {
                done = true;
                Some(SyncClient::new(addr, net(), Receiver::new(tb.clone()), 0))
            }
            _ => None,
        }),
    );
    let mut reports = Vec::new();
    for k in 0..5 {
        if k > 0 {
            step(&mut w, &mut rng);
        }
        reports.push(sync_ok(&mut s, &w));
    }
    // Whether a restart lands in sync 3 (still waiting for the other receiver) or 4, both are
    // back on deltas by 5.
    assert_eq!(reports[4].delta_sends, 2, "{:?}", reports[4]);
    let seeds: u32 = reports[2..4].iter().map(|r| r.seed_sends).sum();
    assert_eq!(seeds, 2, "{reports:?}");
    let (v, d) = (s.version(), s.state_digest());
    s.close("test over");
    for (h, who) in [(a, "a"), (b, "b")] {
        let (log, r) = h.join().expect(who);
        assert_same(&r, &w, v, d, who);
        let restart = log
            .iter()
            .position(|e| e.what == "restarted")
            .expect("restarted");
        assert_eq!(
            applied(&log[..restart]),
            vec![
                (1, FrameKind::Seed),
                (2, FrameKind::Delta),
                (3, FrameKind::Delta)
            ],
            "{who}: {log:#?}"
        );
        let after = applied(&log[restart..]);
        assert_eq!(after[0].1, FrameKind::Seed, "{who}: {log:#?}");
        assert_eq!(
            after.last(),
            Some(&(5, FrameKind::Delta)),
            "{who}: {log:#?}"
        );
    }
}

#[test]
fn weights_changed_behind_the_receivers_back_are_reseeded() {
    let t = table(1 << 17);
    let mut rng = Rng(4);
    let mut w = weights(&t, &mut rng);
    let mut s = server(&t, 1);
    let addr = s.local_addr();
    let mut flip = Rng(44);
    // After version 2: one element changes in memory, the receiver running on. After version 4:
    // one changes and the receiver reconnects (its hello carries the recomputed digest).
    let a = spawn(
        client(&t, addr, 1),
        Box::new(move |c, ev| {
            if let ClientEvent::Applied { outcome, .. } = ev {
                if matches!(outcome.version, 2 | 4) {
                    let store = c.receiver_mut().store_mut();
                    let slot = flip.below(store.len() as u64) as usize;
                    let at = flip.below(store[slot].len() as u64) as usize;
                    store[slot][at] ^= 0x10;
                    if outcome.version == 4 {
                        c.disconnect();
                    }
                }
            }
            None
        }),
    );
    let mut reports = Vec::new();
    for k in 0..6 {
        if k > 0 {
            step(&mut w, &mut rng);
        }
        reports.push(sync_ok(&mut s, &w));
    }
    let (v, d) = (s.version(), s.state_digest());
    s.close("test over");
    let (log, r) = a.join().expect("a");
    assert_same(&r, &w, v, d, "a");
    let kinds = applied(&log);
    assert!(
        kinds.contains(&(3, FrameKind::Seed)) && kinds.contains(&(5, FrameKind::Seed)),
        "reseeded after each tampering: {log:#?}"
    );
    assert_eq!(kinds.last(), Some(&(6, FrameKind::Delta)));
    let r3 = &reports[2];
    assert_eq!(
        r3.diverged + r3.nacks,
        1,
        "the mismatch was reported: {r3:?}"
    );
    assert_eq!(r3.seed_sends, 1, "{r3:?}");
    assert!(
        log.iter()
            .any(|e| e.what == "connected diverged=true" && e.version == Some(4)),
        "the hello after the second tampering said so: {log:#?}"
    );
}

#[test]
fn trainer_restart_resumes_by_seeding_and_receivers_converge() {
    let t = table(1 << 17);
    let mut rng = Rng(5);
    let mut w = weights(&t, &mut rng);
    let mut s = server(&t, 2);
    let addr = s.local_addr();
    let a = spawn(client(&t, addr, 0), no_hook());
    let b = spawn(client(&t, addr, 0), no_hook());
    sync_ok(&mut s, &w);
    step(&mut w, &mut rng);
    let r2 = sync_ok(&mut s, &w);
    // The trainer dies (no goodbye) and comes back on the same address, from a checkpoint that
    // is one step further than what the receivers hold.
    drop(s);
    step(&mut w, &mut rng);
    let mut s = SyncServer::bind(addr, net(), t.clone(), flush(), session(2)).expect("rebind");
    let r3 = sync_ok(&mut s, &w);
    assert!(r3.seed, "{r3:?}");
    assert_eq!(
        r3.version,
        r2.version + 1,
        "resumed above the receivers' version"
    );
    step(&mut w, &mut rng);
    let r4 = sync_ok(&mut s, &w);
    assert!(!r4.seed && r4.delta_sends == 2, "{r4:?}");
    let (v, d) = (s.version(), s.state_digest());
    s.close("test over");
    for (h, who) in [(a, "a"), (b, "b")] {
        let (log, r) = h.join().expect(who);
        assert_same(&r, &w, v, d, who);
        assert_eq!(
            applied(&log),
            vec![
                (1, FrameKind::Seed),
                (2, FrameKind::Delta),
                (3, FrameKind::Seed),
                (4, FrameKind::Delta)
            ],
            "{who}: {log:#?}"
        );
    }
}

#[test]
fn slow_receiver_is_dropped_by_name_and_the_server_holds_one_sync() {
    // 4 MiB of weights; the kernel may queue only 16 KiB per receiver on the server side.
    let t = table(1 << 21);
    let mut rng = Rng(6);
    let mut w = weights(&t, &mut rng);
    let mut n = net();
    n.io_timeout = Duration::from_millis(300);
    n.ack_timeout = Duration::from_secs(3);
    n.send_buffer = Some(16 << 10);
    let lo: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let flush = FlushConfig {
        bucket_size: 256 << 10,
        ..FlushConfig::default()
    };
    let mut s = SyncServer::bind(lo, n, t.clone(), flush, session(2)).expect("bind");
    let proxy = FaultProxy::start(s.local_addr(), 8 << 20).expect("proxy");
    let a = spawn(client(&t, s.local_addr(), 0), no_hook());
    let b = spawn(client(&t, proxy.addr(), 0), no_hook());
    // The slow one stops reading for 1 s at the seed: the server's write to it times out.
    proxy.inject(Fault::Stall(Duration::from_secs(1)));
    let started = Instant::now();
    let r1 = sync_ok(&mut s, &w);
    assert_eq!(r1.dropped.len(), 1, "{r1:?}");
    let (who, why) = &r1.dropped[0];
    assert!(
        who.starts_with("receiver #") && who.contains("127.0.0.1:"),
        "{who}"
    );
    assert!(
        why.contains("timed out") && why.contains(who.as_str()),
        "{why}"
    );
    assert!(started.elapsed() < Duration::from_secs(15));

    let mut retained = Vec::new();
    for k in 0..4 {
        step(&mut w, &mut rng);
        if k == 1 {
            // Slow at a delta: small enough for the socket buffers, so its ack is what is late.
            proxy.inject(Fault::Stall(Duration::from_secs(4)));
        }
        let rep = sync_ok(&mut s, &w);
        assert!(!rep.seed);
        if k == 1 {
            assert_eq!(rep.dropped.len(), 1, "{rep:?}");
            assert!(rep.dropped[0].1.contains("timed out"), "{rep:?}");
        }
        // What the server holds between syncs is exactly this sync's delta, never more.
        assert_eq!(s.retained_bytes(), rep.delta_bytes);
        retained.push(rep.delta_bytes);
    }
    let max = *retained.iter().max().expect("syncs");
    assert!(max < 1 << 20, "a 2% delta of 4 MiB: {retained:?}");
    let (v, d) = (s.version(), s.state_digest());
    s.close("test over");
    for (h, who) in [(a, "a"), (b, "b")] {
        let (_, r) = h.join().expect(who);
        assert_same(&r, &w, v, d, who);
    }
}

#[test]
fn a_delta_above_the_retain_limit_goes_out_as_a_seed_and_nothing_is_kept() {
    let t = table(1 << 17);
    let mut rng = Rng(7);
    let mut w = weights(&t, &mut rng);
    let lo: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let opts = SessionConfig {
        max_retained: 2048,
        ..session(1)
    };
    let mut s = SyncServer::bind(lo, net(), t.clone(), flush(), opts).expect("bind");
    let a = spawn(client(&t, s.local_addr(), 0), no_hook());
    sync_ok(&mut s, &w);
    step(&mut w, &mut rng);
    let r2 = sync_ok(&mut s, &w);
    assert!(
        r2.seed && r2.retained_bytes == 0 && s.retained_bytes() == 0,
        "{r2:?}"
    );
    let (v, d) = (s.version(), s.state_digest());
    s.close("test over");
    let (_, r) = a.join().expect("a");
    assert_same(&r, &w, v, d, "a");
}
