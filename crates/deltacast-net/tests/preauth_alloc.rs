//! Measures what an unauthenticated or wrong-secret client costs the frame server in heap: a
//! counting global allocator ([`cap::Cap`]) wraps the system one, and every hostile client
//! below is written with fixed stack buffers, so (nearly) every byte counted between its connect
//! and the server's close is the server's. The bound of the issue: at most 64 KiB per client.
//!
//! Its own test binary with one test: the counter is process-wide, so nothing else may run.

use std::alloc::System;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use cap::Cap;
use deltacast_net::{FrameServer, NetConfig, Secret};

#[global_allocator]
static ALLOC: Cap<System> = Cap::new(System, usize::MAX);

const LIMIT: usize = 64 << 10;

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
    m[14] = 2; // frame link
    m[15] = flag;
    for (i, b) in m[16..].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(151).wrapping_add(7);
    }
    m
}

/// Runs one hostile client to the end: until the server closes the connection.
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
            // The server may close before reading it all.
            let _ = s.write_all(&noise);
        }
        Hostile::Silent => {}
        Hostile::Partial => {
            let _ = s.write_all(&hello(1)[..20]);
        }
    }
    // Until EOF or reset: the server is done with us.
    let started = Instant::now();
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(_) => {}
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "server kept {kind:?}"
        );
    }
}

/// Bytes allocated process-wide (cumulative, frees not subtracted) once the count settles:
/// the server's task may still be unwinding for a few microseconds after closing the socket.
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
fn hostile_clients_cost_the_server_at_most_64_kib_each() {
    let mut cfg = NetConfig::default()
        .with_secret(Some(
            Secret::new("prealloc-secret-0123456789").expect("secret"),
        ))
        .with_timeouts(Duration::from_secs(5));
    cfg.handshake_timeout = Duration::from_millis(300);
    let lo: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let server = FrameServer::bind(lo, cfg).expect("bind");
    let addr = server.local_addr();
    let kinds = [
        Hostile::WrongSecret,
        Hostile::NoSecret,
        Hostile::HugeLength,
        Hostile::Garbage,
        Hostile::Silent,
        Hostile::Partial,
    ];
    // Warm-up: one of each, so one-time costs (the runtime's first socket, lazy statics) are
    // not charged to a client; then measured rounds.
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
        eprintln!("preauth: {k:?}: at most {w} bytes allocated per client");
    }
    // Nothing stays behind for them either.
    let leaked = ALLOC.allocated().saturating_sub(live_before);
    assert!(
        leaked <= LIMIT,
        "{leaked} bytes still held after 30 hostile clients"
    );
    assert!(server.receivers().is_empty());

    // 64 silent clients at once (the cap on handshakes in flight), all held until the
    // handshake timeout: everything allocated meanwhile, freed or not, stays within 64 KiB each.
    let before = settled_total();
    let mut held: Vec<TcpStream> = (0..64)
        .map(|_| TcpStream::connect(addr).expect("connect"))
        .collect();
    for s in &mut held {
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        let mut b = [0u8; 64];
        while matches!(s.read(&mut b), Ok(n) if n > 0) {}
    }
    let cost = settled_total() - before;
    eprintln!("preauth: 64 silent clients at once: {cost} bytes allocated in all");
    assert!(
        cost <= 64 * LIMIT,
        "64 concurrent silent clients: {cost} bytes"
    );
}
