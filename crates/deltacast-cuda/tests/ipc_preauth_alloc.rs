//! Measures what an unauthenticated or wrong-secret client costs the CUDA-IPC link's root in
//! heap, as `deltacast-net/tests/preauth_alloc.rs` does for the TCP links: a counting global
//! allocator ([`cap::Cap`]) wraps the system one, and every hostile client is written with
//! fixed stack buffers, so (nearly) every byte counted between its connect and the root's
//! close is the root's. The bound: at most 64 KiB per client. No GPU: the root's set-up runs
//! on host handle bytes (`ipc_setup`).
//!
//! Its own test binary with one test: the counter is process-wide, so nothing else may run.

use std::alloc::System;
use std::io::Read;
use std::net::TcpStream;
use std::time::Duration;

use cap::Cap;
use deltacast_cuda::ipc_setup::{confirm_joined, join_root, RootListener, Staging};
use deltacast_net::Secret;
use deltacast_testkit::hostile::{self, Hostile, LinkCode};

#[global_allocator]
static ALLOC: Cap<System> = Cap::new(System, usize::MAX);

const LIMIT: usize = 64 << 10;
const SECRET: &str = "ipc-preauth-secret-0123456789";

/// The link byte of this server's HELLO.
const LINK: LinkCode = 3;

fn settled_total() -> usize {
    hostile::settled_total(|| ALLOC.total_allocated())
}

#[test]
fn hostile_clients_cost_the_ipc_root_at_most_64_kib_each() {
    let listener = RootListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr();
    let root = std::thread::spawn(move || {
        // Two slots' worth of handle bytes: what a rank would get, never a stranger.
        let handles = vec![0x5Au8; 4 * 64];
        let staging = Staging {
            slots: 2,
            slot_bytes: 4096,
            handles: &handles,
        };
        let secret = Secret::new(SECRET).expect("secret");
        listener.accept_ranks(
            2,
            &secret,
            staging,
            Duration::from_secs(120),
            Duration::from_millis(150),
        )
    });
    hostile::warm_up(addr, LINK);
    let live_before = ALLOC.allocated();
    let worst = hostile::worst_costs(addr, LINK, LIMIT, || ALLOC.total_allocated());
    let kinds = Hostile::ALL;
    for (k, w) in kinds.iter().zip(worst) {
        eprintln!("ipc preauth: {k:?}: at most {w} bytes allocated per client");
    }
    // What stays behind is the record of the refusals (a bounded number of them).
    let held = ALLOC.allocated().saturating_sub(live_before);
    eprintln!("ipc preauth: {held} bytes still held after 30 hostile clients");
    assert!(
        held <= LIMIT,
        "{held} bytes still held after 30 hostile clients"
    );

    // 16 silent clients at once: the root takes them one at a time, each until the handshake
    // timeout; everything allocated meanwhile stays within 64 KiB each.
    let before = settled_total();
    let mut held: Vec<TcpStream> = (0..16)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    for s in &mut held {
        s.set_read_timeout(Some(Duration::from_secs(20)))
            .expect("timeout");
        let mut b = [0u8; 64];
        while matches!(s.read(&mut b), Ok(n) if n > 0) {}
    }
    let cost = settled_total() - before;
    eprintln!("ipc preauth: 16 silent clients at once: {cost} bytes allocated in all");
    assert!(cost <= 16 * LIMIT, "16 silent clients: {cost} bytes");
    drop(held);

    // The real rank still joins, and the root names every stranger it refused (the first 32).
    let secret = Secret::new(SECRET).expect("secret");
    let (mut s, offered) = join_root(&addr.to_string(), 1, 2, &secret, Duration::from_secs(30))
        .expect("the rank joins");
    assert_eq!(offered.handles, vec![0x5Au8; 4 * 64]);
    confirm_joined(&mut s, offered.slots).expect("confirm");
    let joined = root.join().expect("root thread").expect("set-up");
    assert_eq!(joined.peers.len(), 1);
    assert_eq!(joined.refused.len(), 32);
}
