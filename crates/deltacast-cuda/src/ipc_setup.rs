//! The host side of the CUDA-IPC link's set-up, plain TCP and built without the `cuda`
//! feature so that it is tested on every machine: the root listens on loopback, authenticates
//! each connection with the shared-secret handshake of the TCP links
//! ([`deltacast_net::auth::blocking`], link type [`Link::CudaIpc`]) and only then reads its
//! hello and hands it the staging's IPC handle bytes; a rank connects, authenticates the root
//! (it checks the root's proof before it proves anything itself) and receives them.
//!
//! Until a connection has authenticated, the root reads only the handshake's fixed-size
//! messages (an ERROR at most 1 KiB), all within `handshake_timeout`, and sends nothing but
//! its CHALLENGE and an ERROR. A connection that fails the handshake (wrong or no secret,
//! garbage, silence, a huge length) is closed and named in [`Joined::refused`] and the log; the
//! root goes on waiting for its ranks. Connections are taken one at a time: a silent one delays
//! the ranks queued behind it by at most `handshake_timeout`.
//!
//! The IPC handles are bearer tokens (whoever holds the bytes can map the root's buffers), so
//! the link has no unauthenticated mode: every rank needs the secret.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::time::Duration;

use deltacast_net::auth::{blocking, Link};
use deltacast_net::{NetError, Secret};

use crate::deadline::Deadline;
use crate::error::{CudaError, Result};
use crate::ipc_frame::{Frame, FRAME_BYTES, IPC_HANDLE_BYTES, LINK_VERSION};

/// Default bound on one connection's handshake at the root (its whole exchange).
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Refusals kept in [`Joined::refused`] (all of them are logged): a flood of strangers must
/// not grow the root's memory.
pub const MAX_KEPT_REFUSALS: usize = 32;

/// A connection the root turned away before it authenticated: who, and why.
#[derive(Debug)]
pub struct Refusal {
    pub peer: SocketAddr,
    pub error: NetError,
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "refused, unauthenticated: {}", self.error)
    }
}

/// What the root hands each authenticated rank: `slots` buffers of `slot_bytes`, and their
/// handles (`slots` memory handles, then `slots` event handles).
#[derive(Debug, Clone, Copy)]
pub struct Staging<'a> {
    pub slots: u64,
    pub slot_bytes: u64,
    pub handles: &'a [u8],
}

/// What a rank received from the root: the staging and its handle bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Offered {
    pub slots: u64,
    pub slot_bytes: u64,
    pub handles: Vec<u8>,
}

impl Offered {
    /// The `i`-th slot's memory handle and "filled" event handle.
    pub fn slot(&self, i: usize) -> (&[u8], &[u8]) {
        let n = self.slots as usize;
        let at = |k: usize| &self.handles[k * IPC_HANDLE_BYTES..(k + 1) * IPC_HANDLE_BYTES];
        (at(i), at(n + i))
    }
}

/// The root's set-up, done: each rank's connection (index rank - 1) and whom it turned away.
#[derive(Debug)]
pub struct Joined {
    pub peers: Vec<TcpStream>,
    /// The first [`MAX_KEPT_REFUSALS`] refusals, in order.
    pub refused: Vec<Refusal>,
}

pub(crate) fn link(op: &'static str, msg: impl Into<String>) -> CudaError {
    CudaError::Link {
        op,
        msg: msg.into(),
    }
}

/// The addresses `address` names, all of them loopback: the link joins processes of one
/// machine, and a root listening beyond it would offer its handshake to the network.
pub fn loopback_addresses(address: &str) -> Result<Vec<SocketAddr>> {
    let addrs: Vec<SocketAddr> = address
        .to_socket_addrs()
        .map_err(|e| CudaError::InvalidArgument(format!("IPC link address {address}: {e}")))?
        .collect();
    match addrs.iter().find(|a| !a.ip().is_loopback()) {
        _ if addrs.is_empty() => Err(CudaError::InvalidArgument(format!(
            "IPC link address {address} names no address"
        ))),
        Some(a) => Err(CudaError::InvalidArgument(format!(
            "IPC link address {address} ({a}) is not loopback: the link joins processes of \
             one machine and listens and connects on 127.0.0.1 or ::1 only"
        ))),
        None => Ok(addrs),
    }
}

/// The root's listener, bound on loopback.
pub struct RootListener {
    listener: TcpListener,
    addr: SocketAddr,
}

impl RootListener {
    /// Listens at `address` (loopback only; port 0 for any).
    pub fn bind(address: &str) -> Result<RootListener> {
        let addrs = loopback_addresses(address)?;
        let listener =
            TcpListener::bind(&addrs[..]).map_err(|e| link("bind", format!("{address}: {e}")))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| link("listen", e.to_string()))?;
        let addr = listener
            .local_addr()
            .map_err(|e| link("listen", e.to_string()))?;
        Ok(RootListener { listener, addr })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Takes connections until ranks 1..`nranks` have each authenticated, said hello and
    /// mapped `staging`, within `timeout`; each handshake gets at most `handshake_timeout`.
    /// A connection that fails the handshake is refused and the wait goes on; an
    /// authenticated one that then breaks the set-up (another link version or rank count, a
    /// rank out of range or twice) fails it: it holds the secret, so it is a rank
    /// misconfigured, not a stranger.
    pub fn accept_ranks(
        &self,
        nranks: usize,
        secret: &Secret,
        staging: Staging<'_>,
        timeout: Duration,
        handshake_timeout: Duration,
    ) -> Result<Joined> {
        let deadline = Deadline::after(timeout);
        let mut joined: Vec<Option<TcpStream>> = (1..nranks).map(|_| None).collect();
        let mut refused = Vec::new();
        while joined.iter().any(Option::is_none) {
            let (mut s, from) = match self.listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if deadline.passed() {
                        return Err(deadline.expired("the IPC link's ranks joining"));
                    }
                    std::thread::sleep(Duration::from_millis(2));
                    continue;
                }
                Err(e) => return Err(link("accept", e.to_string())),
            };
            s.set_nonblocking(false)
                .and_then(|()| s.set_nodelay(true))
                .map_err(|e| link("accept", e.to_string()))?;
            let limit = handshake_timeout.min(deadline.left());
            let peer = format!("the peer at {from}");
            if let Err(error) =
                blocking::server_handshake(&mut s, Some(secret), Link::CudaIpc, &peer, limit)
            {
                let r = Refusal { peer: from, error };
                log::warn!("deltacast IPC link root: {r}");
                if refused.len() < MAX_KEPT_REFUSALS {
                    refused.push(r);
                }
                let _ = s.shutdown(Shutdown::Both);
                continue;
            }
            let (index, rank) = read_hello(&mut s, nranks, from, deadline)?;
            if joined[index].is_some() {
                return Err(link("set-up", format!("rank {rank} joined twice")));
            }
            write_frame(
                &mut s,
                Frame::Setup {
                    slots: staging.slots,
                    slot_bytes: staging.slot_bytes,
                },
                staging.handles,
            )?;
            let (reply, _) = read_frame(&mut s, deadline, "a rank mapping the slots")?;
            if reply
                != (Frame::Joined {
                    slots: staging.slots,
                })
            {
                return Err(unexpected(reply, "its mapping of the slots"));
            }
            joined[index] = Some(s);
        }
        Ok(Joined {
            peers: joined.into_iter().flatten().collect(),
            refused,
        })
    }
}

/// Reads an authenticated rank's hello: returns its index (rank - 1) and rank.
fn read_hello(
    s: &mut TcpStream,
    nranks: usize,
    from: SocketAddr,
    deadline: Deadline,
) -> Result<(usize, u64)> {
    let (hello, _) = read_frame(s, deadline, "a rank's hello")?;
    let Frame::Hello {
        rank,
        nranks: theirs,
        version,
    } = hello
    else {
        return Err(unexpected(hello, "a rank's hello"));
    };
    if version != LINK_VERSION || theirs != nranks as u64 {
        return Err(link(
            "set-up",
            format!(
                "the rank at {from} speaks link version {version} with {theirs} ranks, this \
                 root version {LINK_VERSION} with {nranks}"
            ),
        ));
    }
    let index = rank
        .checked_sub(1)
        .filter(|&i| i < nranks as u64 - 1)
        .ok_or_else(|| {
            link(
                "set-up",
                format!("the rank at {from} says it is rank {rank}"),
            )
        })?;
    Ok((index as usize, rank))
}

/// A rank's set-up: connects to the root at `address` (loopback only; retrying until it
/// listens), authenticates, says hello as `rank` of `nranks` and reads the staging, all
/// within `timeout`. The caller maps the handles and answers with [`confirm_joined`].
pub fn join_root(
    address: &str,
    rank: usize,
    nranks: usize,
    secret: &Secret,
    timeout: Duration,
) -> Result<(TcpStream, Offered)> {
    let addrs = loopback_addresses(address)?;
    let deadline = Deadline::after(timeout);
    let mut s = loop {
        match addrs.iter().find_map(|a| TcpStream::connect(a).ok()) {
            Some(s) => break s,
            None if deadline.passed() => {
                return Err(deadline.expired("connecting to the IPC link's root"))
            }
            None => std::thread::sleep(Duration::from_millis(20)),
        }
    };
    s.set_nodelay(true)
        .map_err(|e| link("connect", e.to_string()))?;
    let peer = format!("the IPC link's root ({address})");
    // The root may be busy with strangers first: the whole set-up's time, not one handshake's.
    blocking::client_handshake(&mut s, Some(secret), Link::CudaIpc, &peer, deadline.left())
        .map_err(|e| link("authenticate", e.to_string()))?;
    write_frame(
        &mut s,
        Frame::Hello {
            rank: rank as u64,
            nranks: nranks as u64,
            version: LINK_VERSION,
        },
        &[],
    )?;
    let (setup, handles) = read_frame(&mut s, deadline, "the root's staging")?;
    let Frame::Setup { slots, slot_bytes } = setup else {
        return Err(unexpected(setup, "the staging"));
    };
    Ok((
        s,
        Offered {
            slots,
            slot_bytes,
            handles,
        },
    ))
}

/// A rank's last set-up step: tells the root it has mapped the `slots` slots.
pub fn confirm_joined(s: &mut TcpStream, slots: u64) -> Result<()> {
    write_frame(s, Frame::Joined { slots }, &[])
}

/// Sets the read timeout (`None`: wait as long as it takes, for very long ones).
fn set_timeout(s: &TcpStream, timeout: Duration) -> Result<()> {
    let t =
        (timeout < Duration::from_secs(1 << 32)).then_some(timeout.max(Duration::from_millis(1)));
    s.set_read_timeout(t)
        .map_err(|e| link("set_read_timeout", e.to_string()))
}

pub(crate) fn read_exact(
    s: &mut TcpStream,
    buf: &mut [u8],
    deadline: Deadline,
    what: &'static str,
) -> Result<()> {
    set_timeout(s, deadline.left())?;
    s.read_exact(buf).map_err(|e| match e.kind() {
        ErrorKind::WouldBlock | ErrorKind::TimedOut => deadline.expired(what),
        ErrorKind::UnexpectedEof => link("read", format!("the peer closed the link ({what})")),
        _ => link("read", format!("{e} ({what})")),
    })
}

/// Reads one frame and its trailer (bounded by `Frame::decode`) by `deadline`.
pub(crate) fn read_frame(
    s: &mut TcpStream,
    deadline: Deadline,
    what: &'static str,
) -> Result<(Frame, Vec<u8>)> {
    let mut head = [0u8; FRAME_BYTES];
    read_exact(s, &mut head, deadline, what)?;
    let frame = Frame::decode(&head)?;
    let mut trailer = vec![0u8; frame.trailer_bytes()];
    read_exact(s, &mut trailer, deadline, what)?;
    Ok((frame, trailer))
}

pub(crate) fn write_frame(s: &mut TcpStream, frame: Frame, trailer: &[u8]) -> Result<()> {
    let mut msg = Vec::with_capacity(FRAME_BYTES + trailer.len());
    msg.extend_from_slice(&frame.encode());
    msg.extend_from_slice(trailer);
    s.write_all(&msg)
        .map_err(|e| link("write", format!("{e} (the peer is gone)")))
}

/// Reads frames until a `Bye` or the end of the connection, at most until `deadline`.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn await_bye(s: &mut TcpStream, deadline: Deadline) {
    while !deadline.passed() {
        match read_frame(s, deadline, "a farewell") {
            Ok((Frame::Bye, _)) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

pub(crate) fn unexpected(got: Frame, wanted: &str) -> CudaError {
    CudaError::Protocol(format!("IPC link: {got:?} where {wanted} was due"))
}
