//! Hostile clients of a server's authentication, for the tests that measure what they cost the
//! server in heap before authentication (the TCP links' frame server, the CUDA-IPC link's root).
//! Each is written with fixed stack buffers, so (nearly) every byte a counting allocator sees
//! between its connect and the server's close is the server's.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// The link byte of a HELLO: `2` the TCP frame link, `3` the CUDA-IPC link.
pub type LinkCode = u8;

#[derive(Clone, Copy, Debug)]
pub enum Hostile {
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

impl Hostile {
    pub const ALL: [Hostile; 6] = [
        Hostile::WrongSecret,
        Hostile::NoSecret,
        Hostile::HugeLength,
        Hostile::Garbage,
        Hostile::Silent,
        Hostile::Partial,
    ];
}

/// A HELLO of the handshake for `link`; `flag` 1: the client has a secret.
pub fn hello(flag: u8, link: LinkCode) -> [u8; 48] {
    let mut m = [0u8; 48];
    m[0] = 0x01; // HELLO
    m[1..9].copy_from_slice(&39u64.to_le_bytes());
    m[9..13].copy_from_slice(b"DCNT");
    m[13] = 1; // handshake version
    m[14] = link;
    m[15] = flag;
    for (i, b) in m[16..].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(151).wrapping_add(7);
    }
    m
}

/// Runs one hostile client of a `link` server to the end: until the server closes the
/// connection.
pub fn run(addr: SocketAddr, kind: Hostile, link: LinkCode) {
    let mut s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut buf = [0u8; 512];
    match kind {
        Hostile::WrongSecret => {
            s.write_all(&hello(1, link)).expect("hello");
            // CHALLENGE: 9 + 71 bytes.
            s.read_exact(&mut buf[..80]).expect("challenge");
            assert_eq!(buf[0], 0x02, "expected CHALLENGE");
            let mut proof = [0u8; 41];
            proof[0] = 0x03;
            proof[1..9].copy_from_slice(&32u64.to_le_bytes());
            proof[9..].fill(0xA5);
            s.write_all(&proof).expect("proof");
        }
        Hostile::NoSecret => s.write_all(&hello(0, link)).expect("hello"),
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
            let _ = s.write_all(&hello(1, link)[..20]);
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
pub fn settled_total(total: impl Fn() -> usize) -> usize {
    let mut last = total();
    loop {
        std::thread::sleep(Duration::from_millis(20));
        let now = total();
        if now == last {
            return now;
        }
        last = now;
    }
}

/// One hostile client of each kind, so that one-time costs (the runtime's first socket, lazy
/// statics) are not charged to the measured ones.
pub fn warm_up(addr: SocketAddr, link: LinkCode) {
    for k in Hostile::ALL {
        run(addr, k, link);
    }
}

/// Five rounds of every kind of hostile client against the `link` server at `addr`, each
/// client's cost the growth of `total` (bytes allocated process-wide) across it; fails when one
/// costs more than `limit`. Returns the worst cost of each kind, in [`Hostile::ALL`]'s order.
pub fn worst_costs(
    addr: SocketAddr,
    link: LinkCode,
    limit: usize,
    total: impl Fn() -> usize,
) -> [usize; 6] {
    let mut worst = [0usize; 6];
    for _round in 0..5 {
        for (i, k) in Hostile::ALL.iter().enumerate() {
            let before = settled_total(&total);
            run(addr, *k, link);
            let cost = settled_total(&total) - before;
            worst[i] = worst[i].max(cost);
            assert!(
                cost <= limit,
                "{k:?} made the process allocate {cost} bytes (limit {limit})"
            );
        }
    }
    worst
}
