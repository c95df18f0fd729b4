//! Fan-out of flush frames from the leader to receivers over TCP, with acks.
//!
//! Receivers connect whenever they start (before the first sync or mid-run after a crash),
//! authenticate, and announce the version and state digest they hold, so the leader can decide
//! to seed them. The server never queues frames: each broadcast writes the borrowed frame to
//! every receiver concurrently under `io_timeout`, so memory stays bounded by the kernel socket
//! buffers and a receiver that stops reading is dropped with an error naming it. Acks are read by
//! one small task per receiver into a channel of [`ACK_QUEUE`] entries.

use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::net::SocketAddr;
use std::task::Poll;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::{JoinHandle, JoinSet};

use crate::auth::{client_handshake, server_handshake, Link};
use crate::config::{
    bind, connect_retry, current_thread_runtime, resolve, tune, NetConfig, MAX_PENDING_HANDSHAKES,
};
use crate::wire::{explain, read_msg, send_error, ty, write_msg, Expect};
use crate::NetError;

/// Longest free-text message an ack may carry; longer ones are cut by [`FrameClient::send_ack`].
pub const MAX_ACK_MESSAGE: usize = 4096;
/// Acks (or a final error) buffered per receiver before its reader stops reading.
pub const ACK_QUEUE: usize = 4;
/// Bytes of an ack before its message: version, digest, ok.
const ACK_FIXED: usize = 8 + 8 + 1;
/// Bytes of ANNOUNCE: has_version, version, digest.
const ANNOUNCE_LEN: usize = 1 + 8 + 8;
/// Authenticated connections waiting for the caller to take them.
const INCOMING_QUEUE: usize = 16;

/// A receiver's answer after the final flush of a sync (or a seed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ack {
    /// The version the receiver now holds.
    pub version: u64,
    /// Its state digest after applying.
    pub state_digest: u64,
    /// Whether the sync verified and applied.
    pub ok: bool,
    /// Why not, or anything worth logging (at most [`MAX_ACK_MESSAGE`] bytes).
    pub message: String,
}

impl Ack {
    /// `u64 version, u64 state_digest, u8 ok, UTF-8 message` (LE).
    fn encode(&self) -> Vec<u8> {
        let mut msg = self.message.as_str();
        if msg.len() > MAX_ACK_MESSAGE {
            let mut cut = MAX_ACK_MESSAGE;
            while !msg.is_char_boundary(cut) {
                cut -= 1;
            }
            msg = &msg[..cut];
        }
        let mut out = Vec::with_capacity(ACK_FIXED + msg.len());
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.state_digest.to_le_bytes());
        out.push(u8::from(self.ok));
        out.extend_from_slice(msg.as_bytes());
        out
    }

    fn decode(p: &[u8], peer: &str) -> Result<Ack, NetError> {
        let bad = |detail: String| NetError::Protocol {
            peer: peer.to_string(),
            detail,
        };
        if p.len() < ACK_FIXED {
            return Err(bad(format!(
                "ack of {} bytes, at least {ACK_FIXED} expected",
                p.len()
            )));
        }
        let ok = match p[16] {
            0 => false,
            1 => true,
            b => return Err(bad(format!("ack ok byte is {b}, expected 0 or 1"))),
        };
        let message = std::str::from_utf8(&p[ACK_FIXED..])
            .map_err(|_| bad("ack message is not UTF-8".into()))?
            .to_string();
        Ok(Ack {
            version: u64_at(p, 0),
            state_digest: u64_at(p, 8),
            ok,
            message,
        })
    }
}

/// Reads a little-endian u64 at `at`; the callers checked the length.
fn u64_at(p: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    if let Some(s) = p.get(at..at + 8) {
        b.copy_from_slice(s);
    }
    u64::from_le_bytes(b)
}

/// A connected receiver's handle, unique for the server's lifetime (a reconnect gets a new one).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReceiverId(pub u64);

impl fmt::Display for ReceiverId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "receiver #{}", self.0)
    }
}

/// What a receiver announced when it connected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReceiverInfo {
    /// Handle for [`FrameServer::send_to`] and friends.
    pub id: ReceiverId,
    /// Its address.
    pub addr: SocketAddr,
    /// The version it holds (`None`: nothing yet, it needs a seed).
    pub version: Option<u64>,
    /// Its state digest.
    pub state_digest: u64,
}

/// What [`FrameServer::next_event`] saw.
#[derive(Debug)]
pub enum ServerEvent {
    /// A receiver connected, authenticated and announced its state; it is now admitted.
    Joined(ReceiverInfo),
    /// A receiver acked, or its link failed (then it was dropped).
    Ack(ReceiverId, Result<Ack, NetError>),
}

enum Polled {
    Joined(Option<Conn>),
    Ack(ReceiverId, Option<Result<Ack, NetError>>),
}

/// Outcome of a broadcast: receivers that failed were dropped (they reconnect and announce).
#[derive(Debug, Default)]
pub struct BroadcastReport {
    /// Receivers that took the whole frame.
    pub delivered: Vec<ReceiverId>,
    /// Receivers dropped, with why (disconnect, or a write that timed out: a slow peer).
    pub failed: Vec<(ReceiverId, NetError)>,
}

struct Conn {
    info: ReceiverInfo,
    name: String,
    writer: OwnedWriteHalf,
    acks: mpsc::Receiver<Result<Ack, NetError>>,
    /// Acks already pulled off the channel while looking for a disconnect.
    early: VecDeque<Ack>,
    reader: JoinHandle<()>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.reader.abort();
    }
}

impl Conn {
    /// Pulls whatever the reader task queued; returns the error that ended the connection.
    fn drain(&mut self) -> Option<NetError> {
        loop {
            match self.acks.try_recv() {
                Ok(Ok(a)) if self.early.len() < ACK_QUEUE => self.early.push_back(a),
                Ok(Ok(_)) => {
                    return Some(NetError::Protocol {
                        peer: self.name.clone(),
                        detail: "sent more acks than it was asked for".into(),
                    })
                }
                Ok(Err(e)) => return Some(e),
                Err(mpsc::error::TryRecvError::Empty) => return None,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    return Some(NetError::Disconnected {
                        peer: self.name.clone(),
                        detail: "(its reader stopped)".into(),
                    })
                }
            }
        }
    }

    async fn next_ack(&mut self, limit: Duration) -> Result<Ack, NetError> {
        if let Some(a) = self.early.pop_front() {
            return Ok(a);
        }
        match tokio::time::timeout(limit, self.acks.recv()).await {
            Ok(Some(r)) => r,
            Ok(None) => Err(NetError::Disconnected {
                peer: self.name.clone(),
                detail: "before it acked".into(),
            }),
            Err(_) => Err(NetError::Timeout {
                peer: self.name.clone(),
                what: "its ack".into(),
                after: limit,
            }),
        }
    }
}

/// Leader side of the frame link. Sync API over a one-worker tokio runtime that keeps
/// accepting and authenticating receivers in the background.
pub struct FrameServer {
    // Sockets and tasks first: they must drop before the runtime.
    conns: BTreeMap<ReceiverId, Conn>,
    incoming: mpsc::Receiver<Conn>,
    acceptor: JoinHandle<()>,
    addr: SocketAddr,
    cfg: NetConfig,
    rt: tokio::runtime::Runtime,
}

impl Drop for FrameServer {
    fn drop(&mut self) {
        self.acceptor.abort();
    }
}

impl FrameServer {
    /// Listens on `addr` (port 0 for any). Without a secret only loopback addresses are allowed.
    pub fn bind(addr: SocketAddr, cfg: NetConfig) -> Result<Self, NetError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("deltacast-frames")
            .enable_all()
            .build()
            .map_err(|e| NetError::Setup {
                what: "cannot start the tokio runtime".into(),
                source: e,
            })?;
        let listener = rt.block_on(bind(addr, cfg.secret.as_ref()))?;
        let addr = listener.local_addr().map_err(|e| NetError::Setup {
            what: "cannot read the bound address".into(),
            source: e,
        })?;
        let (tx, incoming) = mpsc::channel(INCOMING_QUEUE);
        let acceptor = rt.spawn(accept_loop(listener, cfg.clone(), tx));
        Ok(FrameServer {
            conns: BTreeMap::new(),
            incoming,
            acceptor,
            addr,
            cfg,
            rt,
        })
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether receivers must prove the shared secret.
    pub fn is_authenticated(&self) -> bool {
        self.cfg.secret.is_some()
    }

    fn admit(&mut self, c: Conn) -> ReceiverInfo {
        let info = c.info.clone();
        self.conns.insert(info.id, c);
        info
    }

    /// Receivers that connected since the last call, now part of the broadcast set. Call it
    /// between syncs (not between the flushes of one) and seed those that need it.
    pub fn accept_new(&mut self) -> Vec<ReceiverInfo> {
        let mut out = Vec::new();
        while let Ok(c) = self.incoming.try_recv() {
            out.push(self.admit(c));
        }
        out
    }

    /// Blocks until at least `n` receivers are connected (or `limit` passes); returns the ones
    /// newly admitted, as [`accept_new`](Self::accept_new) does.
    pub fn wait_for_receivers(
        &mut self,
        n: usize,
        limit: Duration,
    ) -> Result<Vec<ReceiverInfo>, NetError> {
        let deadline = Instant::now() + limit;
        let mut out = self.accept_new();
        while self.conns.len() < n {
            let left = deadline.saturating_duration_since(Instant::now());
            let incoming = &mut self.incoming;
            // The timer must be created inside the runtime, hence the async block.
            let got = self
                .rt
                .block_on(async { tokio::time::timeout(left, incoming.recv()).await });
            match got {
                Ok(Some(c)) => out.push(self.admit(c)),
                Ok(None) => {
                    return Err(NetError::Poisoned("the accept loop stopped".into()));
                }
                Err(_) => {
                    return Err(NetError::Timeout {
                        peer: format!("{} more receiver(s)", n - self.conns.len()),
                        what: format!("{n} receivers to connect"),
                        after: limit,
                    })
                }
            }
        }
        Ok(out)
    }

    /// The receivers in the broadcast set.
    pub fn receivers(&self) -> Vec<ReceiverInfo> {
        self.conns.values().map(|c| c.info.clone()).collect()
    }

    fn check_frame(&self, frame: &[u8]) -> Result<(), NetError> {
        if frame.len() as u64 > self.cfg.max_frame {
            return Err(NetError::InvalidArgument(format!(
                "frame of {} bytes exceeds max_frame {} (bucket size + 64 KiB)",
                frame.len(),
                self.cfg.max_frame
            )));
        }
        Ok(())
    }

    /// Sends `frame` to every receiver at once. Receivers that are gone or do not take the frame
    /// within `io_timeout` are dropped and listed in `failed`; `Err` only for a frame above
    /// `max_frame`.
    pub fn broadcast(&mut self, frame: &[u8]) -> Result<BroadcastReport, NetError> {
        let all: Vec<ReceiverId> = self.conns.keys().copied().collect();
        self.send_many(&all, frame)
    }

    /// Sends `frame` to the receivers `ids` at once (those not connected are listed in
    /// `failed`), as [`broadcast`](Self::broadcast) does for all of them: the resync session
    /// sends a delta to some receivers and a seed to others within one sync.
    pub fn send_many(
        &mut self,
        ids: &[ReceiverId],
        frame: &[u8],
    ) -> Result<BroadcastReport, NetError> {
        self.check_frame(frame)?;
        let mut report = BroadcastReport::default();
        let mut live = Vec::with_capacity(ids.len());
        for &id in ids {
            let Some(c) = self.conns.get_mut(&id) else {
                report.failed.push((id, unknown(id)));
                continue;
            };
            match c.drain() {
                Some(e) => {
                    self.conns.remove(&id);
                    report.failed.push((id, e));
                }
                None => live.push(id),
            }
        }
        let io = Some(self.cfg.io_timeout);
        let results = self.rt.block_on(join_all(
            self.conns
                .iter_mut()
                .filter(|(id, _)| live.contains(id))
                .map(|(id, c)| async move {
                    let r =
                        write_msg(&mut c.writer, ty::FRAME, frame, &c.name, "a frame", io).await;
                    (*id, r)
                }),
        ));
        for (id, r) in results {
            match r {
                Ok(()) => report.delivered.push(id),
                Err(e) => {
                    self.conns.remove(&id);
                    report.failed.push((id, e));
                }
            }
        }
        Ok(report)
    }

    /// Waits up to `limit` for the next thing a receiver does: connect (it is admitted, as
    /// [`accept_new`](Self::accept_new) does) or ack. A receiver whose link failed is dropped and
    /// reported as an `Ack` event carrying the error. `None` when `limit` passed quietly.
    pub fn next_event(&mut self, limit: Duration) -> Option<ServerEvent> {
        // Acks pulled off early by `drain` come first, in receiver order.
        let early = self
            .conns
            .iter_mut()
            .find_map(|(id, c)| c.early.pop_front().map(|a| (*id, a)));
        if let Some((id, a)) = early {
            return Some(ServerEvent::Ack(id, Ok(a)));
        }
        let incoming = &mut self.incoming;
        let conns = &mut self.conns;
        let got = self.rt.block_on(async {
            tokio::time::timeout(
                limit,
                std::future::poll_fn(|cx| {
                    if let Poll::Ready(c) = incoming.poll_recv(cx) {
                        return Poll::Ready(Polled::Joined(c));
                    }
                    for (id, c) in conns.iter_mut() {
                        if let Poll::Ready(r) = c.acks.poll_recv(cx) {
                            return Poll::Ready(Polled::Ack(*id, r));
                        }
                    }
                    Poll::Pending
                }),
            )
            .await
        });
        match got.ok()? {
            Polled::Joined(Some(c)) => Some(ServerEvent::Joined(self.admit(c))),
            // The accept loop is gone (it only stops when the server drops): nothing will come.
            Polled::Joined(None) => None,
            Polled::Ack(id, r) => {
                let r = match r {
                    Some(r) => r,
                    None => Err(NetError::Disconnected {
                        peer: self
                            .conns
                            .get(&id)
                            .map_or_else(|| id.to_string(), |c| c.name.clone()),
                        detail: "(its reader stopped)".into(),
                    }),
                };
                if r.is_err() {
                    self.conns.remove(&id);
                }
                Some(ServerEvent::Ack(id, r))
            }
        }
    }

    /// How a receiver is named in errors: `receiver #3 (127.0.0.1:50123)`.
    pub fn peer_name(info: &ReceiverInfo) -> String {
        format!("{} ({})", info.id, info.addr)
    }

    /// Sends `frame` to one receiver (a seed for a newcomer); on failure it is dropped.
    pub fn send_to(&mut self, id: ReceiverId, frame: &[u8]) -> Result<(), NetError> {
        self.check_frame(frame)?;
        let io = Some(self.cfg.io_timeout);
        let c = self.conns.get_mut(&id).ok_or_else(|| unknown(id))?;
        let r = match c.drain() {
            Some(e) => Err(e),
            None => self.rt.block_on(write_msg(
                &mut c.writer,
                ty::FRAME,
                frame,
                &c.name,
                "a frame",
                io,
            )),
        };
        if r.is_err() {
            self.conns.remove(&id);
        }
        r
    }

    /// One ack from every receiver, waiting up to `ack_timeout` for each (concurrently).
    /// Receivers that fail (disconnect, timeout, malformed ack) are dropped: a late ack would
    /// otherwise be taken for the next sync's.
    pub fn collect_acks(&mut self) -> Vec<(ReceiverId, Result<Ack, NetError>)> {
        let t = self.cfg.ack_timeout;
        let results = self.rt.block_on(join_all(
            self.conns
                .iter_mut()
                .map(|(id, c)| async move { (*id, c.next_ack(t).await) }),
        ));
        for (id, r) in &results {
            if r.is_err() {
                self.conns.remove(id);
            }
        }
        results
    }

    /// The next ack of one receiver (after [`send_to`](Self::send_to)); dropped on failure.
    pub fn recv_ack(&mut self, id: ReceiverId) -> Result<Ack, NetError> {
        let t = self.cfg.ack_timeout;
        let c = self.conns.get_mut(&id).ok_or_else(|| unknown(id))?;
        let r = self.rt.block_on(c.next_ack(t));
        if r.is_err() {
            self.conns.remove(&id);
        }
        r
    }

    /// Tells a receiver why and drops it (e.g. its announced table does not match).
    pub fn disconnect(&mut self, id: ReceiverId, reason: &str) {
        if let Some(mut c) = self.conns.remove(&id) {
            self.rt.block_on(send_error(&mut c.writer, reason));
        }
    }
}

fn unknown(id: ReceiverId) -> NetError {
    NetError::InvalidArgument(format!("{id} is not connected (dropped after an error?)"))
}

type Handshaken = Result<(TcpStream, SocketAddr, Option<u64>, u64), NetError>;

async fn accept_loop(listener: TcpListener, cfg: NetConfig, tx: mpsc::Sender<Conn>) {
    let mut pending: JoinSet<Handshaken> = JoinSet::new();
    let mut next_id = 1u64;
    loop {
        tokio::select! {
            acc = listener.accept(), if pending.len() < MAX_PENDING_HANDSHAKES => match acc {
                Ok((stream, addr)) => {
                    tune(&stream);
                    if let Some(n) = cfg.send_buffer {
                        // Bounds what the kernel queues for a receiver that stops reading.
                        let _ = socket2::SockRef::from(&stream).set_send_buffer_size(n);
                    }
                    let secret = cfg.secret.clone();
                    let limit = cfg.handshake_timeout;
                    pending.spawn(async move {
                        let mut stream = stream;
                        let name = format!("receiver at {addr}");
                        let (v, d) = handshake_and_announce(&mut stream, secret, &name, limit).await?;
                        Ok((stream, addr, v, d))
                    });
                }
                Err(e) => {
                    log::warn!("deltacast-net: frame server accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(done) = pending.join_next() => match done {
                Ok(Ok((stream, addr, version, state_digest))) => {
                    let id = ReceiverId(next_id);
                    next_id += 1;
                    let info = ReceiverInfo { id, addr, version, state_digest };
                    if tx.send(start_conn(stream, info, cfg.io_timeout)).await.is_err() {
                        return;
                    }
                }
                Ok(Err(e)) => log::warn!("deltacast-net: refused a receiver: {e}"),
                Err(e) => log::warn!("deltacast-net: receiver handshake task failed: {e}"),
            },
        }
    }
}

async fn handshake_and_announce(
    stream: &mut TcpStream,
    secret: Option<crate::Secret>,
    name: &str,
    limit: Duration,
) -> Result<(Option<u64>, u64), NetError> {
    server_handshake(stream, secret.as_ref(), Link::Frames, name, limit).await?;
    let expect = Expect {
        allowed: &[(ty::ANNOUNCE, ANNOUNCE_LEN as u64)],
        what: "ANNOUNCE (version, digest)",
    };
    let (_, p) = read_msg(stream, name, expect, Some(limit), Some(limit)).await?;
    if p.len() != ANNOUNCE_LEN || p[0] > 1 {
        let detail = format!("malformed ANNOUNCE ({} bytes)", p.len());
        send_error(stream, &detail).await;
        return Err(NetError::Protocol {
            peer: name.into(),
            detail,
        });
    }
    let version = (p[0] == 1).then(|| u64_at(&p, 1));
    Ok((version, u64_at(&p, 9)))
}

fn start_conn(stream: TcpStream, info: ReceiverInfo, io: Duration) -> Conn {
    let name = FrameServer::peer_name(&info);
    let (r, writer) = stream.into_split();
    let (tx, acks) = mpsc::channel(ACK_QUEUE);
    let reader = tokio::spawn(read_acks(r, name.clone(), tx, io));
    Conn {
        info,
        name,
        writer,
        acks,
        early: VecDeque::new(),
        reader,
    }
}

/// Forwards acks into the bounded channel; stops reading when it is full (TCP backpressure), and
/// ends with the error that closed the connection.
async fn read_acks(
    mut r: OwnedReadHalf,
    name: String,
    tx: mpsc::Sender<Result<Ack, NetError>>,
    io: Duration,
) {
    let expect = Expect {
        allowed: &[(ty::ACK, (ACK_FIXED + MAX_ACK_MESSAGE) as u64)],
        what: "an ack",
    };
    loop {
        let res = read_msg(&mut r, &name, expect, None, Some(io))
            .await
            .and_then(|(_, p)| Ack::decode(&p, &name));
        let stop = res.is_err();
        if tx.send(res).await.is_err() || stop {
            return;
        }
    }
}

/// Receiver side of the frame link. Plain blocking calls over a current-thread runtime.
pub struct FrameClient {
    stream: Option<TcpStream>,
    name: String,
    cfg: NetConfig,
    poisoned: Option<String>,
    rt: tokio::runtime::Runtime,
}

impl FrameClient {
    /// Connects (retrying for up to `connect_timeout` while the server is not up), authenticates
    /// and announces the version (`None`: nothing yet) and state digest this receiver holds.
    pub fn connect(
        server: impl std::net::ToSocketAddrs,
        version: Option<u64>,
        state_digest: u64,
        cfg: NetConfig,
    ) -> Result<Self, NetError> {
        let addrs = resolve(server)?;
        let rt = current_thread_runtime()?;
        let (stream, name) = rt.block_on(async {
            let first = format!("frame server {}", addrs[0]);
            let (mut s, addr) = connect_retry(&addrs, &first, cfg.connect_timeout).await?;
            let name = format!("frame server {addr}");
            client_handshake(
                &mut s,
                cfg.secret.as_ref(),
                Link::Frames,
                &name,
                cfg.handshake_timeout,
            )
            .await?;
            let mut a = Vec::with_capacity(ANNOUNCE_LEN);
            a.push(u8::from(version.is_some()));
            a.extend_from_slice(&version.unwrap_or(0).to_le_bytes());
            a.extend_from_slice(&state_digest.to_le_bytes());
            write_msg(
                &mut s,
                ty::ANNOUNCE,
                &a,
                &name,
                "ANNOUNCE",
                Some(cfg.io_timeout),
            )
            .await?;
            Ok::<_, NetError>((s, name))
        })?;
        Ok(FrameClient {
            stream: Some(stream),
            name,
            cfg,
            poisoned: None,
            rt,
        })
    }

    /// The server, as named in errors.
    pub fn server(&self) -> &str {
        &self.name
    }

    fn check(&self) -> Result<(), NetError> {
        match (&self.poisoned, &self.stream) {
            (Some(why), _) => Err(NetError::Poisoned(why.clone())),
            (None, None) => Err(NetError::Poisoned("the connection is closed".into())),
            (None, Some(_)) => Ok(()),
        }
    }

    /// Tells the server why (unless it is the one that went away) and closes.
    fn fail(&mut self, e: NetError) -> NetError {
        if let Some(mut s) = self.stream.take() {
            if !e.is_disconnect() {
                let reason = format!("receiver gave up: {e}");
                self.rt.block_on(send_error(&mut s, &reason));
            }
        }
        self.poisoned = Some(e.to_string());
        e
    }

    /// The next frame. Waits up to `idle_timeout` for it to start (forever if `None`), then up
    /// to `io_timeout` for its bytes; a length above `max_frame` is refused unread.
    pub fn recv_frame(&mut self) -> Result<Vec<u8>, NetError> {
        let (max, wait, io) = (
            self.cfg.max_frame,
            self.cfg.idle_timeout,
            Some(self.cfg.io_timeout),
        );
        self.check()?;
        let expect = Expect {
            allowed: &[(ty::FRAME, max)],
            what: "a frame",
        };
        let r = match self.stream.as_mut() {
            Some(s) => self.rt.block_on(read_msg(s, &self.name, expect, wait, io)),
            None => return Err(NetError::Poisoned("the connection is closed".into())),
        };
        r.map(|(_, f)| f).map_err(|e| self.fail(e))
    }

    /// Acknowledges a sync (message cut to [`MAX_ACK_MESSAGE`] bytes).
    pub fn send_ack(&mut self, ack: &Ack) -> Result<(), NetError> {
        let io = Some(self.cfg.io_timeout);
        self.check()?;
        let r = match self.stream.as_mut() {
            Some(s) => self.rt.block_on(async {
                match write_msg(s, ty::ACK, &ack.encode(), &self.name, "an ack", io).await {
                    Ok(()) => Ok(()),
                    Err(e) => Err(explain(s, &self.name, e).await),
                }
            }),
            None => return Err(NetError::Poisoned("the connection is closed".into())),
        };
        r.map_err(|e| self.fail(e))
    }

    /// Says goodbye with a reason the server reports for this receiver, and closes.
    pub fn close(mut self, reason: &str) {
        if let Some(mut s) = self.stream.take() {
            self.rt.block_on(send_error(&mut s, reason));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ack_round_trip_and_limits() {
        let a = Ack {
            version: 7,
            state_digest: 0xdead_beef,
            ok: false,
            message: "é".repeat(3000),
        };
        let p = a.encode();
        assert!(p.len() <= ACK_FIXED + MAX_ACK_MESSAGE);
        let b = Ack::decode(&p, "r").expect("decode");
        assert_eq!((b.version, b.state_digest, b.ok), (7, 0xdead_beef, false));
        assert_eq!(b.message.len(), MAX_ACK_MESSAGE);
        assert!(Ack::decode(&p[..10], "r").is_err());
        let mut bad = p.clone();
        bad[16] = 2;
        assert!(Ack::decode(&bad, "r").is_err());
    }
}
