//! Measures what an unauthenticated or wrong-secret client costs the frame server in heap: a
//! counting global allocator ([`cap::Cap`]) wraps the system one, and every hostile client
//! below is written with fixed stack buffers, so (nearly) every byte counted between its connect
//! and the server's close is the server's. The bound of the issue: at most 64 KiB per client.
//!
//! Its own test binary with one test: the counter is process-wide, so nothing else may run.

use std::alloc::System;
use std::io::Read;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use cap::Cap;
use deltacast_net::{FrameServer, NetConfig, Secret};
use deltacast_testkit::hostile::{self, Hostile, LinkCode};

#[global_allocator]
static ALLOC: Cap<System> = Cap::new(System, usize::MAX);

const LIMIT: usize = 64 << 10;

/// The link byte of this server's HELLO.
const LINK: LinkCode = 2;

fn settled_total() -> usize {
    hostile::settled_total(|| ALLOC.total_allocated())
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
    hostile::warm_up(addr, LINK);
    let live_before = ALLOC.allocated();
    let worst = hostile::worst_costs(addr, LINK, LIMIT, || ALLOC.total_allocated());
    let kinds = Hostile::ALL;
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
