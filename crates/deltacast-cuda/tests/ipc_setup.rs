//! The CUDA-IPC link's set-up on real loopback sockets, no GPU: strangers that connect to the
//! root first (wrong secret, no secret, a forged or reflected proof, garbage, the old
//! unauthenticated hello, silence, half a hello, a huge length) are each refused by name and
//! never receive a byte of the staging's IPC handles; the real ranks still join, and receive
//! exactly the handle bytes the root offers. Non-loopback addresses are refused, and a rank
//! does not talk to an impostor root.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use deltacast_cuda::ipc_frame::{Frame, IPC_HANDLE_BYTES, LINK_VERSION};
use deltacast_cuda::ipc_setup::{
    confirm_joined, join_root, loopback_addresses, Joined, Offered, RootListener, Staging,
    MAX_KEPT_REFUSALS,
};
use deltacast_cuda::CudaError;
use deltacast_net::auth::{blocking, Link};
use deltacast_net::{NetError, Secret};

const SECRET: &str = "ipc-setup-test-secret-0123456789";
const OTHER: &str = "ipc-setup-other-secret-987654321";
/// The root's bound on one handshake in these tests.
const HANDSHAKE: Duration = Duration::from_millis(250);

fn secret(s: &str) -> Secret {
    Secret::new(s).expect("secret")
}

/// Random bytes standing for the staging's handles (a fresh seed per run, printed).
fn random_handles(slots: u64) -> Vec<u8> {
    let seed = RandomState::new().build_hasher().finish() | 1;
    eprintln!("handle bytes seed {seed:#x}");
    let mut x = seed;
    (0..2 * slots as usize * IPC_HANDLE_BYTES)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

struct Root {
    addr: SocketAddr,
    slots: u64,
    slot_bytes: u64,
    handles: Vec<u8>,
    thread: Option<JoinHandle<Result<Joined, CudaError>>>,
}

impl Root {
    /// The root's outcome (once).
    fn wait(&mut self) -> Result<Joined, CudaError> {
        let t = self.thread.take().expect("waited once");
        t.join().expect("root thread")
    }
}

/// A root of `nranks` on 127.0.0.1 (any port), in a thread, waiting at most `timeout`.
fn start_root(nranks: usize, slots: u64, timeout: Duration) -> Root {
    let listener = RootListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr();
    let handles = random_handles(slots);
    let slot_bytes = 4096 + slots;
    let offered = handles.clone();
    let thread = std::thread::spawn(move || {
        let staging = Staging {
            slots,
            slot_bytes,
            handles: &offered,
        };
        listener.accept_ranks(nranks, &secret(SECRET), staging, timeout, HANDSHAKE)
    });
    Root {
        addr,
        slots,
        slot_bytes,
        handles,
        thread: Some(thread),
    }
}

/// A real rank: joins, checks it got exactly the root's staging, confirms.
fn real_rank(root: &Root, rank: usize, nranks: usize) -> JoinHandle<Offered> {
    let address = root.addr.to_string();
    std::thread::spawn(move || {
        let (mut s, offered) = join_root(
            &address,
            rank,
            nranks,
            &secret(SECRET),
            Duration::from_secs(20),
        )
        .expect("a real rank joins");
        confirm_joined(&mut s, offered.slots).expect("confirm");
        // Held open until the root is done (its connections are what it returns).
        std::thread::sleep(Duration::from_millis(50));
        offered
    })
}

fn check_offered(root: &Root, got: &Offered) {
    assert_eq!(
        got,
        &Offered {
            slots: root.slots,
            slot_bytes: root.slot_bytes,
            handles: root.handles.clone(),
        }
    );
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stranger {
    /// The real handshake with another secret (it sees the root's proof fail and gives up).
    WrongSecret,
    /// A well-formed HELLO, then a forged proof without checking the root's.
    ForgedProof,
    /// Sends the root's own proof back as its answer.
    ReflectedProof,
    /// The real handshake, saying it has no secret.
    NoSecret,
    /// 4 KiB of noise.
    Garbage,
    /// What a rank sent before the handshake existed: an IPC hello frame at once.
    OldHello,
    /// Connects and says nothing.
    Silent,
    /// Half a HELLO, then nothing.
    Partial,
    /// A HELLO header announcing 2^62 bytes.
    HugeLength,
}

const STRANGERS: [Stranger; 9] = [
    Stranger::WrongSecret,
    Stranger::ForgedProof,
    Stranger::ReflectedProof,
    Stranger::NoSecret,
    Stranger::Garbage,
    Stranger::OldHello,
    Stranger::Silent,
    Stranger::Partial,
    Stranger::HugeLength,
];

/// A HELLO message of the CUDA-IPC link (`flag` 1: "I have a secret").
fn hello(flag: u8) -> [u8; 48] {
    let mut m = [0u8; 48];
    m[0] = 0x01;
    m[1..9].copy_from_slice(&39u64.to_le_bytes());
    m[9..13].copy_from_slice(b"DCNT");
    m[13] = 1; // handshake version
    m[14] = Link::CudaIpc as u8;
    m[15] = flag;
    for (i, b) in m[16..].iter_mut().enumerate() {
        *b = (i as u8).wrapping_mul(151).wrapping_add(7);
    }
    m
}

fn proof_msg(tag: &[u8]) -> Vec<u8> {
    let mut m = vec![0x03];
    m.extend_from_slice(&32u64.to_le_bytes());
    m.extend_from_slice(tag);
    m
}

/// Runs one stranger against the root at `addr` until the root closes on it; returns its
/// own address (the name the root must give it), what its handshake call said (when it made
/// one) and every byte the root sent it.
fn run_stranger(addr: SocketAddr, kind: Stranger) -> (SocketAddr, Option<NetError>, Vec<u8>) {
    let mut s = TcpStream::connect(addr).expect("connect");
    let me = s.local_addr().expect("own address");
    let t = Duration::from_secs(5);
    let mut got = Vec::new();
    let mut said = None;
    match kind {
        Stranger::WrongSecret => {
            said =
                blocking::client_handshake(&mut s, Some(&secret(OTHER)), Link::CudaIpc, "root", t)
                    .err();
        }
        Stranger::NoSecret => {
            said = blocking::client_handshake(&mut s, None, Link::CudaIpc, "root", t).err();
        }
        Stranger::ForgedProof | Stranger::ReflectedProof => {
            s.write_all(&hello(1)).expect("hello");
            let mut challenge = [0u8; 80];
            s.read_exact(&mut challenge).expect("challenge");
            assert_eq!(challenge[0], 0x02, "a CHALLENGE");
            got.extend_from_slice(&challenge);
            let tag = if kind == Stranger::ForgedProof {
                vec![0xA5; 32]
            } else {
                challenge[48..80].to_vec()
            };
            s.write_all(&proof_msg(&tag)).expect("proof");
        }
        Stranger::Garbage => {
            let noise: Vec<u8> = (0..4096u32).map(|i| (i * 31 + 3) as u8).collect();
            let _ = s.write_all(&noise);
        }
        Stranger::OldHello => {
            let old = Frame::Hello {
                rank: 1,
                nranks: 2,
                version: 2,
            };
            s.write_all(&old.encode()).expect("old hello");
        }
        Stranger::Silent => {}
        Stranger::Partial => s.write_all(&hello(1)[..20]).expect("half a hello"),
        Stranger::HugeLength => {
            let mut h = [0u8; 9];
            h[0] = 0x01;
            h[1..].copy_from_slice(&(1u64 << 62).to_le_bytes());
            s.write_all(&h).expect("header");
        }
    }
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("timeout");
    let started = Instant::now();
    let mut buf = [0u8; 512];
    loop {
        match s.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
        }
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "root kept {kind:?}"
        );
    }
    (me, said, got)
}

/// None of the staging's handles, nor any IPC frame, is in what a stranger received.
fn assert_no_handles(root: &Root, kind: Stranger, got: &[u8]) {
    for h in root.handles.chunks_exact(IPC_HANDLE_BYTES) {
        assert!(
            !got.windows(IPC_HANDLE_BYTES).any(|w| w == h),
            "{kind:?} received a handle"
        );
    }
    assert!(
        !got.windows(4).any(|w| w == b"DCIP"),
        "{kind:?} received an IPC frame"
    );
    // At most a CHALLENGE and one ERROR message.
    assert!(got.len() <= 80 + 9 + 1024, "{kind:?}: {} bytes", got.len());
}

/// What the root must say about each stranger.
fn refused_as_expected(kind: Stranger, e: &NetError) -> bool {
    match kind {
        Stranger::WrongSecret => {
            matches!(e, NetError::Auth { detail, .. } if detail.contains("rejected us"))
        }
        Stranger::ForgedProof | Stranger::ReflectedProof => {
            matches!(e, NetError::Auth { detail, .. } if detail.contains("wrong shared secret"))
        }
        Stranger::NoSecret => {
            matches!(e, NetError::Auth { detail, .. } if detail.contains("requires"))
        }
        Stranger::Garbage | Stranger::OldHello => matches!(e, NetError::Protocol { .. }),
        Stranger::Silent | Stranger::Partial => matches!(e, NetError::Timeout { .. }),
        Stranger::HugeLength => {
            matches!(e, NetError::TooLarge { len, .. } if *len == 1 << 62)
        }
    }
}

#[test]
fn strangers_first_are_refused_by_name_and_the_real_ranks_still_join() {
    let mut root = start_root(3, 3, Duration::from_secs(30));
    let mut seen = Vec::new();
    for kind in STRANGERS {
        let (me, said, got) = run_stranger(root.addr, kind);
        assert_no_handles(&root, kind, &got);
        match kind {
            Stranger::WrongSecret => assert!(
                matches!(&said, Some(NetError::Auth { detail, .. })
                    if detail.contains("server's proof did not verify")),
                "{said:?}"
            ),
            Stranger::NoSecret => assert!(
                matches!(&said, Some(NetError::Refused { reason, .. }) if reason.contains("requires")),
                "{said:?}"
            ),
            _ => {}
        }
        seen.push((kind, me));
    }
    let ranks = [real_rank(&root, 2, 3), real_rank(&root, 1, 3)];
    let offered: Vec<Offered> = ranks.map(|r| r.join().expect("rank thread")).into();
    let joined = root.wait().expect("the root's set-up");
    for o in &offered {
        check_offered(&root, o);
    }
    assert_eq!(joined.peers.len(), 2);
    assert_eq!(
        joined.refused.len(),
        STRANGERS.len(),
        "{:?}",
        joined.refused
    );
    for ((kind, me), r) in seen.iter().zip(&joined.refused) {
        assert_eq!(r.peer, *me, "{kind:?} named by its address");
        assert!(
            refused_as_expected(*kind, &r.error),
            "{kind:?}: {}",
            r.error
        );
        let shown = r.to_string();
        assert!(
            shown.contains(&me.to_string()) && shown.contains("unauthenticated"),
            "{shown}"
        );
    }
}

#[test]
fn ranks_queued_behind_silent_strangers_still_join() {
    let mut root = start_root(2, 2, Duration::from_secs(30));
    // Three silent strangers and one noisy one hold connections ahead of the rank's.
    let silent: Vec<TcpStream> = (0..3)
        .map(|_| TcpStream::connect(root.addr).expect("connect"))
        .collect();
    let mut noisy = TcpStream::connect(root.addr).expect("connect");
    noisy.write_all(&[0xFF; 64]).expect("noise");
    std::thread::sleep(Duration::from_millis(20));
    let started = Instant::now();
    let rank = real_rank(&root, 1, 2);
    check_offered(&root, &rank.join().expect("rank"));
    let joined = root.wait().expect("set-up");
    // Each silent one cost the root one handshake timeout, no more.
    let took = started.elapsed();
    assert!(took >= 2 * HANDSHAKE, "{took:?}");
    assert!(took < 3 * HANDSHAKE + Duration::from_secs(3), "{took:?}");
    assert_eq!(joined.peers.len(), 1);
    assert_eq!(joined.refused.len(), 4, "{:?}", joined.refused);
    let timeouts = joined
        .refused
        .iter()
        .filter(|r| matches!(r.error, NetError::Timeout { .. }))
        .count();
    assert_eq!(timeouts, 3);
    drop(silent);
}

#[test]
fn a_rank_with_the_wrong_secret_is_refused_and_told_and_the_right_one_joins() {
    let mut root = start_root(2, 1, Duration::from_secs(30));
    let e = join_root(
        &root.addr.to_string(),
        1,
        2,
        &secret(OTHER),
        Duration::from_secs(5),
    )
    .expect_err("the wrong secret");
    assert!(
        matches!(&e, CudaError::Link { op: "authenticate", msg } if msg.contains("wrong shared secret")),
        "{e}"
    );
    let rank = real_rank(&root, 1, 2);
    check_offered(&root, &rank.join().expect("rank"));
    let joined = root.wait().expect("set-up");
    assert_eq!(joined.refused.len(), 1);
    assert!(matches!(joined.refused[0].error, NetError::Auth { .. }));
}

#[test]
fn a_rank_does_not_join_an_impostor_root() {
    // Someone else listens where the rank expects its root, with another secret.
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = l.local_addr().expect("addr");
    let impostor = std::thread::spawn(move || {
        let (mut s, _) = l.accept().expect("accept");
        let t = Duration::from_secs(5);
        let r = blocking::server_handshake(&mut s, Some(&secret(OTHER)), Link::CudaIpc, "rank", t);
        // Whatever the rank sends after its refusal: nothing.
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest);
        (r, rest)
    });
    let e = join_root(
        &addr.to_string(),
        1,
        2,
        &secret(SECRET),
        Duration::from_secs(5),
    )
    .expect_err("an impostor");
    assert!(
        matches!(&e, CudaError::Link { op: "authenticate", msg } if msg.contains("server's proof did not verify")),
        "{e}"
    );
    let (r, rest) = impostor.join().expect("impostor");
    assert!(matches!(r, Err(NetError::Auth { .. })), "{r:?}");
    assert!(rest.is_empty(), "the rank sent {} more bytes", rest.len());
}

#[test]
fn only_loopback_addresses_are_accepted() {
    for bad in [
        "0.0.0.0:0",
        "[::]:0",
        "192.0.2.1:29500",
        "[2001:db8::1]:29500",
    ] {
        let e = RootListener::bind(bad).err().expect("refused");
        assert!(
            matches!(&e, CudaError::InvalidArgument(m) if m.contains("not loopback")),
            "{bad}: {e}"
        );
        let started = Instant::now();
        let e = join_root(bad, 1, 2, &secret(SECRET), Duration::from_secs(30)).expect_err(bad);
        assert!(
            matches!(&e, CudaError::InvalidArgument(m) if m.contains("not loopback")),
            "{bad}: {e}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{bad}: tried to connect"
        );
    }
    for bad in ["no port", "127.0.0.1"] {
        assert!(matches!(
            loopback_addresses(bad),
            Err(CudaError::InvalidArgument(_))
        ));
    }
    for good in ["127.0.0.1:0", "[::1]:0", "127.3.2.1:0"] {
        let got = loopback_addresses(good).expect(good);
        assert!(got.iter().all(|a| a.ip().is_loopback()), "{good}: {got:?}");
    }
}

#[test]
fn a_root_nobody_joins_times_out() {
    let mut root = start_root(2, 1, Duration::from_millis(300));
    let e = root.wait().expect_err("nobody came");
    assert!(matches!(e, CudaError::Timeout { .. }), "{e}");
}

#[test]
fn an_authenticated_rank_that_disagrees_fails_the_set_up() {
    // Another rank count.
    let mut root = start_root(2, 1, Duration::from_secs(10));
    let address = root.addr.to_string();
    let e =
        join_root(&address, 1, 3, &secret(SECRET), Duration::from_secs(5)).expect_err("3 ranks");
    assert!(matches!(e, CudaError::Link { .. }), "{e}");
    let e = root.wait().expect_err("disagreement");
    assert!(
        matches!(&e, CudaError::Link { op: "set-up", msg } if msg.contains(&format!("version {LINK_VERSION} with 3 ranks"))),
        "{e}"
    );
    // A rank out of range.
    let mut root = start_root(2, 1, Duration::from_secs(10));
    let _ = join_root(
        &root.addr.to_string(),
        2,
        2,
        &secret(SECRET),
        Duration::from_secs(5),
    );
    let e = root.wait().expect_err("rank 2 of 2");
    assert!(
        matches!(&e, CudaError::Link { op: "set-up", msg } if msg.contains("rank 2")),
        "{e}"
    );
}

#[test]
fn refusals_kept_are_capped_and_the_rank_still_joins() {
    let mut root = start_root(2, 1, Duration::from_secs(30));
    for _ in 0..MAX_KEPT_REFUSALS + 8 {
        let (_, _, got) = run_stranger(root.addr, Stranger::Garbage);
        assert_no_handles(&root, Stranger::Garbage, &got);
    }
    let rank = real_rank(&root, 1, 2);
    check_offered(&root, &rank.join().expect("rank"));
    let joined = root.wait().expect("set-up");
    assert_eq!(joined.refused.len(), MAX_KEPT_REFUSALS);
}
