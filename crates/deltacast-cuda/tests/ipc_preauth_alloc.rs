//! Measures what an unauthenticated or wrong-secret client costs the CUDA-IPC link's root in
//! heap, as `deltacast-net/tests/preauth_alloc.rs` does for the TCP links: a counting global
//! allocator ([`cap::Cap`]) wraps the system one, and every hostile client is written with
//! fixed stack buffers, so (nearly) every byte counted between its connect and the root's
//! close is the root's. The bound: at most 64 KiB per client. No GPU: the root's set-up runs
//! on host handle bytes (`ipc_setup`).
//!
//! Its own test binary with one test: the counter is process-wide, so nothing else may run.

use std::alloc::System;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use cap::Cap;
use deltacast_cuda::ipc_setup::{confirm_joined, join_root, RootListener, Staging};
use deltacast_net::Secret;

#[global_allocator]
static ALLOC: Cap<System> = Cap::new(System, usize::MAX);

const LIMIT: usize = 64 << 10;
const SECRET: &str = "ipc-preauth-secret-0123456789";

#[derive(Clone, Copy, Debug)]
enum Hostile {
    /// A well-formed handshake with a proof made without the secret.
    WrongSecret,
    /// A HELLO that says it has no secret.
    NoSecret,
    /// A HELLO header announcing 2^62 bytes.
    HugeLength,
    /// 4 KiB of noise.
    Garbage,
    /// Connects and says nothing (held until the handshake timeout).
    Silent,
    /// Half a HELLO, then nothing.
    Partial,
}

fn hello(flag: u8) -> [u8; 48] {
    let mut m = [0u8; 48];
    m[0] = 0x01; // HELLO
    m[1..9].copy_from_slice(&39u64.to_le_bytes());
    m[9..13].copy_from_slice(b"DCNT");
    m[13] = 1; // handshake version
    m[14] = 3; // the CUDA-IPC link
    m[15] = flag;
    for (i, b) in m[16..].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(151).wrapping_add(7);
    }
    m
}

/// Runs one hostile client to the end: until the root closes the connection.
fn run(addr: SocketAddr, kind: Hostile) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut buf = [0u8; 512];
    match kind {
        Hostile::WrongSecret => {
            s.write_all(&hello(1)).expect("hello");
            // CHALLENGE: 9 + 71 bytes.
            s.read_exact(&mut buf[..80]).expect("challenge");
            assert_eq!(buf[0], 0x02, "expected CHALLENGE");
            let mut proof = [0u8; 41];
            proof[0] = 0x03;
            proof[1..9].copy_from_slice(&32u64.to_le_bytes());
            proof[9..].fill(0xA5);
            s.write_all(&proof).expect("proof");
        }
        Hostile::NoSecret => s.write_all(&hello(0)).expect("hello"),
        Hostile::HugeLength => {
            let mut h = [0u8; 9];
            h[0] = 0x01;
            h[1..].copy_from_slice(&(1u64 << 62).to_le_bytes());
            s.write_all(&h).expect("header");
        }
        Hostile::Garbage => {
            let mut noise = [0u8; 4096];
            for (i, b) in noise.iter_mut().enumerate() {
                *b = (i as u8).wrapping_mul(31).wrapping_add(3);
            }
            // The root may close before reading it all.
            let _ = s.write_all(&noise);
        }
        Hostile::Silent => {}
        Hostile::Partial => {
            let _ = s.write_all(&hello(1)[..20]);
        }
    }
    let started = Instant::now();
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "root kept {kind:?}"
        );
    }
}

/// Bytes allocated process-wide (cumulative, frees not subtracted) once the count settles.
fn settled_total() -> usize {
    let mut last = ALLOC.total_allocated();
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let now = ALLOC.total_allocated();
        if now == last {
            return now;
        }
        last = now;
    }
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
    let kinds = [
        Hostile::WrongSecret,
        Hostile::NoSecret,
        Hostile::HugeLength,
        Hostile::Garbage,
        Hostile::Silent,
        Hostile::Partial,
    ];
    // Warm-up: one of each, so one-time costs are not charged to a client.
    for k in kinds {
        run(addr, k);
    }
    let live_before = ALLOC.allocated();
    let mut worst = [0usize; 6];
    for _round in 0..5 {
        for (i, k) in kinds.iter().enumerate() {
            let before = settled_total();
            run(addr, *k);
            let cost = settled_total() - before;
            worst[i] = worst[i].max(cost);
            assert!(
                cost <= LIMIT,
                "{k:?} made the process allocate {cost} bytes (limit {LIMIT})"
            );
        }
    }
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
