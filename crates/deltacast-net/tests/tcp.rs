//! Real sockets on 127.0.0.1 (ephemeral ports). Misbehaving peers are written here by hand from
//! the documented protocol (HMAC handshake included), which doubles as a check of those docs.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread;
use std::time::{Duration, Instant};

use deltacast::sharded::Collective;
use deltacast_net::{Ack, FrameClient, FrameServer, NetConfig, NetError, Secret, TcpCollective};
use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;

const KEY: &str = "test-secret-0123456789abcdef";
const LINK_COLLECTIVE: u8 = 1;
const LINK_FRAMES: u8 = 2;

fn lo() -> SocketAddr {
    "127.0.0.1:0".parse().expect("addr")
}

/// The transport error a failed collective call carries.
fn net_err<T: std::fmt::Debug>(r: deltacast::Result<T>, what: &str) -> NetError {
    NetError::try_from(r.expect_err(what)).expect("a transport error")
}

fn cfg(secret: Option<&str>) -> NetConfig {
    let mut c = NetConfig::default()
        .with_secret(secret.map(|s| Secret::new(s).expect("secret")))
        .with_timeouts(Duration::from_secs(5));
    c.max_frame = 64 << 20;
    c
}

// ---- the protocol, by hand -------------------------------------------------------------------

fn mac(key: &str, link: u8, role: u8, peer_nonce: &[u8], own_nonce: &[u8]) -> Vec<u8> {
    let mut m = <Hmac<Sha256> as KeyInit>::new_from_slice(key.as_bytes()).expect("key");
    m.update(b"deltacast-net v1 auth");
    m.update(&[link, role]);
    m.update(peer_nonce);
    m.update(own_nonce);
    m.finalize().into_bytes().to_vec()
}

fn send(s: &mut TcpStream, kind: u8, payload: &[u8]) {
    let mut m = vec![kind];
    m.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    m.extend_from_slice(payload);
    s.write_all(&m).expect("raw send");
}

/// Reads one message (payloads up to 64 KiB: enough for the tests' raw peers).
fn recv(s: &mut TcpStream) -> std::io::Result<(u8, Vec<u8>)> {
    let mut h = [0u8; 9];
    s.read_exact(&mut h)?;
    let mut len = [0u8; 8];
    len.copy_from_slice(&h[1..]);
    let len = u64::from_le_bytes(len);
    assert!(len <= 64 << 10, "raw peer got a {len}-byte message");
    let mut p = vec![0u8; len as usize];
    s.read_exact(&mut p)?;
    Ok((h[0], p))
}

fn raw_connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    s
}

fn hello(link: u8, secret: bool, nonce: &[u8; 32]) -> Vec<u8> {
    let mut m = b"DCNT".to_vec();
    m.extend_from_slice(&[1, link, u8::from(secret)]);
    m.extend_from_slice(nonce);
    m
}

/// Client side of the handshake, as documented.
fn raw_client_handshake(s: &mut TcpStream, key: &str, link: u8) {
    let nc = [7u8; 32];
    send(s, 0x01, &hello(link, true, &nc));
    let (t, p) = recv(s).expect("challenge");
    assert_eq!(t, 0x02, "{}", String::from_utf8_lossy(&p));
    assert_eq!(p.len(), 71);
    assert_eq!(&p[..7], &[b'D', b'C', b'N', b'T', 1, link, 1]);
    let ns = &p[7..39];
    assert_eq!(&p[39..], mac(key, link, b'S', &nc, ns).as_slice());
    send(s, 0x03, &mac(key, link, b'C', ns, &nc));
    assert_eq!(recv(s).expect("auth ok"), (0x04, vec![]));
}

/// Server side of the handshake, as documented.
fn raw_server_handshake(s: &mut TcpStream, key: &str, link: u8) {
    let (t, p) = recv(s).expect("hello");
    assert_eq!((t, p.len()), (0x01, 39));
    assert_eq!(&p[..7], &[b'D', b'C', b'N', b'T', 1, link, 1]);
    let nc = p[7..39].to_vec();
    let ns = [9u8; 32];
    let mut c = hello(link, true, &ns);
    c.extend_from_slice(&mac(key, link, b'S', &nc, &ns));
    send(s, 0x02, &c);
    let (t, proof) = recv(s).expect("proof");
    assert_eq!(t, 0x03);
    assert_eq!(proof, mac(key, link, b'C', &ns, &nc));
    send(s, 0x04, &[]);
}

/// A hand-made rank that joined the leader and got READY.
fn raw_rank(addr: SocketAddr, rank: u32, world: u32) -> TcpStream {
    let mut s = raw_connect(addr);
    raw_client_handshake(&mut s, KEY, LINK_COLLECTIVE);
    let mut j = rank.to_le_bytes().to_vec();
    j.extend_from_slice(&world.to_le_bytes());
    send(&mut s, 0x10, &j);
    assert_eq!(recv(&mut s).expect("ready"), (0x11, vec![]));
    s
}

fn spawn_rank(
    addr: SocketAddr,
    rank: usize,
    world: usize,
    c: NetConfig,
) -> thread::JoinHandle<Result<TcpCollective, NetError>> {
    thread::spawn(move || TcpCollective::join(addr, rank, world, c))
}

// ---- collective -----------------------------------------------------------------------------

fn row(rank: usize, round: usize) -> Vec<u8> {
    (0..(rank * 3 + round) % 7)
        .map(|i| (rank * 31 + round * 7 + i) as u8)
        .collect()
}

fn transfer_len(rank: usize, round: usize) -> usize {
    // Includes empty transfers and one larger than a socket buffer.
    match (rank + round) % 4 {
        0 => 0,
        1 => 5,
        2 => 3 << 20,
        _ => 1000 + rank,
    }
}

fn transfer(rank: usize, round: usize) -> Vec<u8> {
    (0..transfer_len(rank, round))
        .map(|i| (i * 13 + rank + round) as u8)
        .collect()
}

fn run_rank(mut c: impl Collective, rounds: usize) -> usize {
    let (rank, world) = (c.rank(), c.world());
    let mut checked = 0;
    for round in 0..rounds {
        let rows = c.all_gather(&row(rank, round)).expect("all_gather");
        let want: Vec<Vec<u8>> = (0..world).map(|r| row(r, round)).collect();
        assert_eq!(rows, want, "rank {rank} round {round}");
        if c.is_leader() {
            for src in 1..world {
                let got = c
                    .recv_from(src, transfer_len(src, round))
                    .expect("recv_from");
                assert_eq!(got, transfer(src, round), "from rank {src} round {round}");
                checked += 1;
            }
        } else {
            c.send_to_leader(&transfer(rank, round))
                .expect("send_to_leader");
        }
    }
    checked
}

#[test]
fn tcp_all_gather_and_exact_receives_world_1_to_5() {
    for world in 1..=5 {
        // Odd worlds authenticated, even ones on unauthenticated loopback: both paths run.
        let secret = (world % 2 == 1).then_some(KEY);
        let rv = TcpCollective::bind_leader(lo(), world, cfg(secret)).expect("bind");
        assert_eq!(rv.is_authenticated(), secret.is_some());
        let addr = rv.local_addr();
        let ranks: Vec<_> = (1..world)
            .map(|r| {
                let c = cfg(secret);
                thread::spawn(move || {
                    run_rank(TcpCollective::join(addr, r, world, c).expect("join"), 3)
                })
            })
            .collect();
        let leader = rv.accept().expect("rendezvous");
        assert_eq!(run_rank(leader, 3), 3 * (world - 1));
        for h in ranks {
            h.join().expect("rank thread");
        }
    }
}

#[test]
fn wrong_or_missing_secret_refused() {
    let mut lc = cfg(Some(KEY));
    lc.connect_timeout = Duration::from_millis(1500);
    let rv = TcpCollective::bind_leader(lo(), 2, lc).expect("bind");
    let addr = rv.local_addr();
    let leader = thread::spawn(move || rv.accept());
    let e = TcpCollective::join(addr, 1, 2, cfg(Some("another-secret-0123456789")))
        .err()
        .expect("wrong secret must fail");
    assert!(matches!(e, NetError::Auth { .. }), "{e}");
    assert!(e.to_string().contains("wrong shared secret"), "{e}");
    let e = TcpCollective::join(addr, 1, 2, cfg(None))
        .err()
        .expect("no secret must fail");
    assert!(
        matches!(&e, NetError::Refused { reason, .. } if reason.contains("requires the shared secret")),
        "{e}"
    );
    // The leader refused both and is still missing rank 1.
    let e = leader
        .join()
        .expect("thread")
        .err()
        .expect("rendezvous times out");
    assert!(
        matches!(&e, NetError::Timeout { peer, .. } if peer.contains('1')),
        "{e}"
    );

    // Frame link: same story.
    let mut server = FrameServer::bind(lo(), cfg(Some(KEY))).expect("bind");
    let e = FrameClient::connect(
        server.local_addr(),
        None,
        0,
        cfg(Some("another-secret-0123456789")),
    )
    .err()
    .expect("wrong secret");
    assert!(e.to_string().contains("wrong shared secret"), "{e}");
    let e = FrameClient::connect(server.local_addr(), None, 0, cfg(None))
        .err()
        .expect("no secret");
    assert!(matches!(e, NetError::Refused { .. }), "{e}");
    // A client with a secret refuses a server without one (no silent downgrade).
    let mut open = FrameServer::bind(lo(), cfg(None)).expect("bind");
    let e = FrameClient::connect(open.local_addr(), None, 0, cfg(Some(KEY)))
        .err()
        .expect("downgrade");
    assert!(e.to_string().contains("secret"), "{e}");
    thread::sleep(Duration::from_millis(100));
    assert!(server.accept_new().is_empty());
    assert!(open.accept_new().is_empty());
}

#[test]
fn no_secret_refuses_non_loopback_bind() {
    let any: SocketAddr = "0.0.0.0:0".parse().expect("addr");
    let e = TcpCollective::bind_leader(any, 2, cfg(None))
        .err()
        .expect("refused");
    assert!(
        matches!(e, NetError::UnauthenticatedNonLoopback { .. }),
        "{e}"
    );
    assert!(e.to_string().contains("without a shared secret"), "{e}");
    let e = FrameServer::bind(any, cfg(None)).err().expect("refused");
    assert!(
        matches!(e, NetError::UnauthenticatedNonLoopback { .. }),
        "{e}"
    );
}

#[test]
fn oversize_length_prefixes_refused_without_allocation() {
    // Each length here would abort the test process if it were allocated.
    // 1. A rank announcing a transfer larger than the plan says.
    let rv = TcpCollective::bind_leader(lo(), 2, cfg(Some(KEY))).expect("bind");
    let addr = rv.local_addr();
    let fake = thread::spawn(move || {
        let mut s = raw_rank(addr, 1, 2);
        let mut h = vec![0x14u8];
        h.extend_from_slice(&(1u64 << 50).to_le_bytes());
        s.write_all(&h).expect("header");
        let _ = recv(&mut s); // the leader's ERROR, then EOF
    });
    let mut leader = rv.accept().expect("rendezvous");
    let t = Instant::now();
    let e = net_err(leader.recv_from(1, 100), "refused");
    assert!(
        matches!(e, NetError::SizeMismatch { expected: 100, got, .. } if got == 1 << 50),
        "{e}"
    );
    assert!(e.to_string().contains("rank 1"), "{e}");
    assert!(t.elapsed() < Duration::from_secs(2));
    fake.join().expect("fake");

    // 2. A rank announcing a huge all-gather row.
    let rv = TcpCollective::bind_leader(lo(), 2, cfg(Some(KEY))).expect("bind");
    let addr = rv.local_addr();
    let fake = thread::spawn(move || {
        let mut s = raw_rank(addr, 1, 2);
        let mut h = vec![0x12u8];
        h.extend_from_slice(&(u64::MAX - 8).to_le_bytes());
        s.write_all(&h).expect("header");
        let _ = recv(&mut s);
    });
    let mut leader = rv.accept().expect("rendezvous");
    let e = net_err(leader.all_gather(b"row"), "refused");
    assert!(matches!(e, NetError::TooLarge { .. }), "{e}");
    fake.join().expect("fake");

    // 3. A server announcing a frame above max_frame.
    let l = TcpListener::bind(lo()).expect("bind");
    let addr = l.local_addr().expect("addr");
    let fake = thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        raw_server_handshake(&mut s, KEY, LINK_FRAMES);
        let (t, p) = recv(&mut s).expect("announce");
        assert_eq!((t, p.len()), (0x20, 17));
        let mut h = vec![0x21u8];
        h.extend_from_slice(&(1u64 << 62).to_le_bytes());
        s.write_all(&h).expect("header");
        let (t, reason) = recv(&mut s).expect("client's error");
        assert_eq!(t, 0x0F);
        String::from_utf8(reason).expect("utf8")
    });
    let mut client = FrameClient::connect(addr, Some(3), 99, cfg(Some(KEY))).expect("connect");
    let e = client.recv_frame().expect_err("refused");
    assert!(
        matches!(e, NetError::TooLarge { len, .. } if len == 1 << 62),
        "{e}"
    );
    assert!(fake.join().expect("fake").contains("above the limit"));

    // 4. Before authentication: a HELLO claiming 1 TiB is refused and the socket closed.
    let server = FrameServer::bind(lo(), cfg(Some(KEY))).expect("bind");
    let mut s = raw_connect(server.local_addr());
    let mut h = vec![0x01u8];
    h.extend_from_slice(&(1u64 << 40).to_le_bytes());
    s.write_all(&h).expect("header");
    assert_closed_after_error(&mut s);
}

/// The server answered with at most an ERROR message and then closed.
fn assert_closed_after_error(s: &mut TcpStream) {
    let t = Instant::now();
    let mut buf = [0u8; 4096];
    let mut total = 0;
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => total += n,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("server did not close the connection: {e}"),
        }
        assert!(
            total <= 9 + 1024,
            "server sent {total} bytes to an unauthenticated peer"
        );
    }
    assert!(t.elapsed() < Duration::from_secs(3));
}

#[test]
fn peer_killed_mid_message_fails_everyone_fast() {
    let mut c = cfg(Some(KEY));
    c.op_timeout = Some(Duration::from_secs(30)); // far away: only the disconnect may end the wait
    c.io_timeout = Duration::from_secs(30);

    // A rank dies halfway through its all-gather row.
    let rv = TcpCollective::bind_leader(lo(), 3, c.clone()).expect("bind");
    let addr = rv.local_addr();
    let r1 = spawn_rank(addr, 1, 3, c.clone());
    let fake = thread::spawn(move || {
        let mut s = raw_rank(addr, 2, 3);
        let mut m = vec![0x12u8];
        m.extend_from_slice(&1000u64.to_le_bytes());
        m.extend_from_slice(&[1u8; 10]);
        s.write_all(&m).expect("partial row");
        thread::sleep(Duration::from_millis(100));
        drop(s);
    });
    let mut leader = rv.accept().expect("rendezvous");
    let mut r1 = r1.join().expect("thread").expect("join");
    let t = Instant::now();
    let h1 = thread::spawn(move || net_err(r1.all_gather(b"one"), "rank 1 must fail"));
    let e0 = net_err(leader.all_gather(b"zero"), "leader must fail");
    let e1 = h1.join().expect("thread");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t.elapsed()
    );
    assert!(matches!(e0, NetError::Disconnected { .. }), "{e0}");
    assert!(
        e0.to_string().contains("rank 2") && e0.to_string().contains("mid-message"),
        "{e0}"
    );
    assert!(
        e1.to_string().contains("rank 2"),
        "rank 1 must learn who failed: {e1}"
    );
    assert!(matches!(
        net_err(leader.all_gather(b""), "poisoned"),
        NetError::Poisoned(_)
    ));
    fake.join().expect("fake");

    // The leader dies halfway through the gathered rows.
    let l = TcpListener::bind(lo()).expect("bind");
    let addr = l.local_addr().expect("addr");
    let ranks: Vec<_> = (1..3)
        .map(|r| {
            let c = c.clone();
            thread::spawn(move || {
                let mut col = TcpCollective::join(addr, r, 3, c).expect("join");
                let t = Instant::now();
                let e = net_err(col.all_gather(b"x"), "must fail");
                (e, t.elapsed())
            })
        })
        .collect();
    let mut socks = Vec::new();
    for _ in 1..3 {
        let (mut s, _) = l.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        raw_server_handshake(&mut s, KEY, LINK_COLLECTIVE);
        let (t, _) = recv(&mut s).expect("join");
        assert_eq!(t, 0x10);
        socks.push(s);
    }
    for s in &mut socks {
        send(s, 0x11, &[]);
    }
    for s in &mut socks {
        assert_eq!(recv(s).expect("row").0, 0x12);
        let mut m = vec![0x13u8];
        m.extend_from_slice(&1000u64.to_le_bytes());
        m.extend_from_slice(&[0u8; 5]);
        s.write_all(&m).expect("partial rows");
    }
    drop(socks);
    for h in ranks {
        let (e, took) = h.join().expect("thread");
        assert!(took < Duration::from_secs(3), "took {took:?}");
        assert!(
            e.to_string().contains("leader") && e.to_string().contains("mid-message"),
            "{e}"
        );
    }

    // The frame server dies halfway through a frame; a receiver dies halfway through its ack.
    let l = TcpListener::bind(lo()).expect("bind");
    let addr = l.local_addr().expect("addr");
    let fake = thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        s.set_read_timeout(Some(Duration::from_secs(5)))
            .expect("timeout");
        raw_server_handshake(&mut s, KEY, LINK_FRAMES);
        recv(&mut s).expect("announce");
        let mut m = vec![0x21u8];
        m.extend_from_slice(&1000u64.to_le_bytes());
        m.extend_from_slice(&[0u8; 10]);
        s.write_all(&m).expect("partial frame");
    });
    let mut client = FrameClient::connect(addr, None, 0, c.clone()).expect("connect");
    let t = Instant::now();
    let e = client.recv_frame().expect_err("must fail");
    assert!(t.elapsed() < Duration::from_secs(3));
    assert!(e.to_string().contains("mid-message: 10 of 1000"), "{e}");
    fake.join().expect("fake");

    let mut server = FrameServer::bind(lo(), c.clone()).expect("bind");
    let mut s = raw_connect(server.local_addr());
    raw_client_handshake(&mut s, KEY, LINK_FRAMES);
    let mut a = vec![1u8];
    a.extend_from_slice(&5u64.to_le_bytes());
    a.extend_from_slice(&6u64.to_le_bytes());
    send(&mut s, 0x20, &a);
    let infos = server
        .wait_for_receivers(1, Duration::from_secs(5))
        .expect("wait");
    assert_eq!((infos[0].version, infos[0].state_digest), (Some(5), 6));
    let mut m = vec![0x22u8];
    m.extend_from_slice(&100u64.to_le_bytes());
    m.extend_from_slice(&[0u8; 5]);
    s.write_all(&m).expect("partial ack");
    drop(s);
    let t = Instant::now();
    let acks = server.collect_acks();
    assert!(t.elapsed() < Duration::from_secs(3));
    let (id, r) = &acks[0];
    let e = r.as_ref().expect_err("must fail");
    assert!(
        e.to_string().contains(&id.to_string()) && e.to_string().contains("mid-message"),
        "{e}"
    );
    assert!(server.receivers().is_empty());
}

#[test]
fn collective_timeout_names_the_slow_rank() {
    let mut c = cfg(None);
    c.op_timeout = Some(Duration::from_millis(300));
    let rv = TcpCollective::bind_leader(lo(), 2, c.clone()).expect("bind");
    let addr = rv.local_addr();
    let r1 = spawn_rank(addr, 1, 2, c);
    let mut leader = rv.accept().expect("rendezvous");
    let mut r1 = r1.join().expect("thread").expect("join");
    let t = Instant::now();
    let e = net_err(leader.all_gather(b"x"), "timeout");
    assert!(t.elapsed() < Duration::from_secs(2));
    assert!(
        matches!(&e, NetError::Timeout { peer, .. } if peer.contains("rank 1")),
        "{e}"
    );
    // The late rank learns at once that the leader gave up, and why.
    let e = net_err(r1.all_gather(b"late"), "aborted");
    assert!(matches!(e, NetError::Aborted { .. }), "{e}");
    assert!(e.to_string().contains("timed out"), "{e}");
}

#[test]
fn rendezvous_refuses_bad_joins_and_garbage_then_completes() {
    let rv = TcpCollective::bind_leader(lo(), 3, cfg(Some(KEY))).expect("bind");
    let addr = rv.local_addr();
    let leader = thread::spawn(move || rv.accept());
    // Garbage before authentication: dropped, the rendezvous goes on.
    let mut g = raw_connect(addr);
    g.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("garbage");
    assert_closed_after_error(&mut g);
    let r1 = spawn_rank(addr, 1, 3, cfg(Some(KEY)));
    thread::sleep(Duration::from_millis(300)); // let rank 1 take its slot first
    let e = TcpCollective::join(addr, 2, 4, cfg(Some(KEY)))
        .err()
        .expect("world mismatch");
    assert!(e.to_string().contains("world size mismatch"), "{e}");
    let e = TcpCollective::join(addr, 5, 3, cfg(Some(KEY)))
        .err()
        .expect("bad rank");
    assert!(matches!(e, NetError::InvalidArgument(_)), "{e}");
    let e = TcpCollective::join(addr, 1, 3, cfg(Some(KEY)))
        .err()
        .expect("duplicate");
    assert!(e.to_string().contains("already joined"), "{e}");
    let r2 = TcpCollective::join(addr, 2, 3, cfg(Some(KEY))).expect("rank 2");
    let leader = leader.join().expect("thread").expect("rendezvous");
    let r1 = r1.join().expect("thread").expect("rank 1");
    let hs: Vec<_> = [r1, r2]
        .into_iter()
        .map(|c| thread::spawn(move || run_rank(c, 1)))
        .collect();
    run_rank(leader, 1);
    for h in hs {
        h.join().expect("rank");
    }
}

// ---- frame link -----------------------------------------------------------------------------

fn frame(i: usize) -> Vec<u8> {
    let n = [0, 17, 1 << 20][i % 3];
    (0..n).map(|j| (j * 7 + i) as u8).collect()
}

#[test]
fn frame_broadcast_to_three_clients_with_acks_and_a_late_joiner() {
    let mut server = FrameServer::bind(lo(), cfg(Some(KEY))).expect("bind");
    assert!(server.is_authenticated());
    let addr = server.local_addr();
    let announced = [None, Some(4), Some(5)];
    let clients: Vec<_> = announced
        .iter()
        .enumerate()
        .map(|(k, &v)| {
            thread::spawn(move || {
                let mut c =
                    FrameClient::connect(addr, v, k as u64, cfg(Some(KEY))).expect("connect");
                for i in 0..3 {
                    assert_eq!(c.recv_frame().expect("frame"), frame(i));
                }
                c.send_ack(&Ack {
                    version: 6,
                    state_digest: 100 + k as u64,
                    ok: true,
                    message: format!("client {k}"),
                })
                .expect("ack");
                // Stay connected until the server is done.
                c.recv_frame().expect_err("server closes")
            })
        })
        .collect();
    let mut infos = server
        .wait_for_receivers(3, Duration::from_secs(5))
        .expect("receivers");
    infos.sort_by_key(|i| i.state_digest);
    let got: Vec<_> = infos.iter().map(|i| (i.version, i.state_digest)).collect();
    assert_eq!(got, vec![(None, 0), (Some(4), 1), (Some(5), 2)]);
    for i in 0..3 {
        let rep = server.broadcast(&frame(i)).expect("broadcast");
        assert_eq!(rep.delivered.len(), 3);
        assert!(rep.failed.is_empty(), "{:?}", rep.failed);
    }
    let acks = server.collect_acks();
    assert_eq!(acks.len(), 3);
    for (id, a) in &acks {
        let a = a.as_ref().expect("ack");
        let info = infos.iter().find(|i| i.id == *id).expect("known id");
        assert_eq!(
            (a.version, a.state_digest, a.ok),
            (6, 100 + info.state_digest, true)
        );
        assert_eq!(a.message, format!("client {}", info.state_digest));
    }

    // A receiver that connects later is reported, seeded on its own, and acks.
    let late = thread::spawn(move || {
        let mut c = FrameClient::connect(addr, None, 0, cfg(Some(KEY))).expect("connect");
        let seed = c.recv_frame().expect("seed");
        c.send_ack(&Ack {
            version: 6,
            state_digest: seed.len() as u64,
            ok: true,
            message: String::new(),
        })
        .expect("ack");
        c.recv_frame().expect_err("server closes")
    });
    let new = server
        .wait_for_receivers(4, Duration::from_secs(5))
        .expect("late");
    assert_eq!(new.len(), 1);
    assert_eq!(new[0].version, None);
    server.send_to(new[0].id, &frame(2)).expect("seed");
    let a = server.recv_ack(new[0].id).expect("seed ack");
    assert_eq!(a.state_digest, 1 << 20);
    assert_eq!(server.receivers().len(), 4);
    drop(server);
    for h in clients.into_iter().chain([late]) {
        let e = h.join().expect("client");
        assert!(e.is_disconnect(), "{e}");
    }
}

#[test]
fn slow_receiver_and_missing_ack_are_named_and_dropped() {
    let mut c = cfg(None);
    c.io_timeout = Duration::from_millis(500);
    c.ack_timeout = Duration::from_millis(300);
    let mut server = FrameServer::bind(lo(), c.clone()).expect("bind");
    let addr = server.local_addr();
    let fast_cfg = c.clone();
    let fast = FrameClient::connect(addr, Some(1), 1, fast_cfg).expect("fast");
    let first = server
        .wait_for_receivers(1, Duration::from_secs(5))
        .expect("fast");
    let slow = FrameClient::connect(addr, Some(1), 2, c.clone()).expect("slow");
    let second = server
        .wait_for_receivers(2, Duration::from_secs(5))
        .expect("slow");
    let (fast_id, slow_id) = (first[0].id, second[0].id);
    let reader = thread::spawn(move || {
        let mut fast = fast;
        let f = fast.recv_frame().expect("big frame");
        (fast, f.len())
    });
    // Far more than the loopback socket buffers hold: the slow receiver never reads it.
    let big = vec![0xA5u8; 32 << 20];
    let t = Instant::now();
    let rep = server.broadcast(&big).expect("broadcast");
    assert!(
        t.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(rep.delivered, vec![fast_id]);
    assert_eq!(rep.failed.len(), 1);
    let (id, e) = &rep.failed[0];
    assert_eq!(*id, slow_id);
    assert!(matches!(e, NetError::Timeout { .. }), "{e}");
    assert!(e.to_string().contains(&slow_id.to_string()), "{e}");
    let (_fast, n) = reader.join().expect("reader");
    assert_eq!(n, 32 << 20);
    drop(slow);

    // The fast receiver never acks: the timeout names it.
    let t = Instant::now();
    let acks = server.collect_acks();
    assert!(t.elapsed() < Duration::from_secs(2));
    let (id, r) = &acks[0];
    assert_eq!(*id, fast_id);
    let e = r.as_ref().expect_err("timeout");
    assert!(
        e.to_string().contains(&fast_id.to_string()) && e.to_string().contains("ack"),
        "{e}"
    );
    assert!(server.receivers().is_empty());
}

#[test]
fn unauthenticated_garbage_and_idle_clients_are_dropped() {
    let mut c = cfg(Some(KEY));
    c.handshake_timeout = Duration::from_millis(400);
    let mut server = FrameServer::bind(lo(), c.clone()).expect("bind");
    let addr = server.local_addr();
    // Garbage: wrong type byte.
    let mut g = raw_connect(addr);
    g.write_all(&[0xEE; 100]).expect("garbage");
    assert_closed_after_error(&mut g);
    // A well-formed HELLO with a bad magic.
    let mut g = raw_connect(addr);
    let mut h = hello(LINK_FRAMES, true, &[0; 32]);
    h[0] = b'X';
    send(&mut g, 0x01, &h);
    assert_closed_after_error(&mut g);
    // A HELLO for the wrong link type.
    let mut g = raw_connect(addr);
    send(&mut g, 0x01, &hello(LINK_COLLECTIVE, true, &[0; 32]));
    assert_closed_after_error(&mut g);
    // Says nothing at all: dropped after the handshake timeout.
    let mut idle = raw_connect(addr);
    assert_closed_after_error(&mut idle);
    // A proper receiver still gets in.
    let _ok = FrameClient::connect(addr, Some(1), 1, c).expect("connect");
    let infos = server
        .wait_for_receivers(1, Duration::from_secs(5))
        .expect("wait");
    assert_eq!(infos.len(), 1);
    assert_eq!(server.receivers().len(), 1);
}

#[test]
fn secret_file_configures_both_sides() {
    let dir = tempfile::tempdir().expect("tempdir");
    let p = dir.path().join("secret");
    std::fs::write(&p, format!("{KEY}\n")).expect("write");
    let c = NetConfig::from_env_or_file(Some(&p)).expect("config");
    assert!(c.secret.is_some());
    let mut server = FrameServer::bind(lo(), c.clone()).expect("bind");
    // The raw client uses the key without the newline: the file's newline was stripped.
    let mut s = raw_connect(server.local_addr());
    raw_client_handshake(&mut s, KEY, LINK_FRAMES);
    send(&mut s, 0x20, &[0u8; 17]);
    let infos = server
        .wait_for_receivers(1, Duration::from_secs(5))
        .expect("wait");
    assert_eq!(infos[0].version, None);
}
