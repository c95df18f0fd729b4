//! The resync protocol: keeps every receiver at the trainer's version through dropped
//! connections, corrupted flushes, restarts on either side, slow readers and weights changed
//! behind a receiver's back.
//!
//! It runs over the frame link ([`FrameServer`] / [`FrameClient`]) and its three messages:
//!
//! - **hello** (ANNOUNCE, on every (re)connect): the receiver's `(version, state digest)`, the
//!   digest recomputed from memory, so a receiver whose bits were changed is not believed.
//! - **frames** of one sync, server → receiver.
//! - **ack / nack** (ACK with `ok` = 1 / 0) after the final frame of a sync or at the first frame
//!   it rejected: the receiver's `(version, digest)` after it (a nack carries the digest
//!   recomputed from memory).
//!
//! The server ([`SyncServer`]) answers each receiver from what it said, within the sync it is
//! running (from version `v0`, digest `D0`, to `v1`, `D1`):
//!
//! | receiver says | server sends |
//! | --- | --- |
//! | hello / ack `(v1, D1)` | nothing: it is current |
//! | hello `(v0, D0)`, or a nack `(v0, D0)` of a delta | the delta (again; the last attempt is a seed) |
//! | anything else: empty, older, other digest, a nack of a seed, an ack with a wrong digest | a seed of `v1` |
//!
//! Each receiver gets at most [`SessionConfig::max_attempts`] sends per sync; then, or when its
//! ack does not come within `ack_timeout`, or when it does not take a frame within `io_timeout`
//! (a slow reader), it is dropped with an error that names it, and it reconnects. The server
//! keeps only the current delta's frames (at most [`SessionConfig::max_retained`] bytes; a
//! larger delta goes out as a seed) and never queues frames per receiver: seeds are re-encoded
//! from the caller's buffers, streamed, and dropped.
//!
//! The client ([`SyncClient`]) never leaves its receiver between versions (the core stages a
//! whole sync and applies it only after every check); on a lost link it drops the half-received
//! sync and reconnects, saying hello with what it holds. A restarted trainer resumes by seeding
//! a version above every version its receivers announce, so versions only grow.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use deltacast::wire::{parse_frame, peek_header};
use deltacast::{FlushConfig, Receiver, Sender, SlotStore, SlotTable, SyncOutcome, WeightSender};

use crate::frames::ServerEvent;
use crate::{Ack, FrameClient, FrameServer, NetConfig, NetError, ReceiverId, ReceiverInfo};

/// What an ERROR from a server that closes its session on purpose starts with; a client stops
/// on it instead of reconnecting.
pub const CLOSED: &str = "deltacast session closed";

/// Errors of the resync session. Peer failures are not errors of a sync (they are reported and
/// repaired); these are the failures of this side.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    /// The transport failed in a way the session cannot repair (binding, a client's reconnect
    /// that found no server within `connect_timeout`).
    #[error(transparent)]
    Net(#[from] NetError),
    /// The sync engine refused the buffers or could not encode.
    #[error("sync engine: {0}")]
    Core(#[from] deltacast::Error),
    /// The caller used the API wrongly.
    #[error("invalid use: {0}")]
    InvalidArgument(String),
}

/// How a [`SyncServer`] runs its syncs.
#[derive(Clone, Debug)]
pub struct SessionConfig {
    /// A sync waits until at least this many receivers are current (every connected one always
    /// is waited for), up to `sync_timeout`.
    pub min_receivers: usize,
    /// Longest one sync waits for its receivers, reconnects and re-sends included.
    pub sync_timeout: Duration,
    /// Sends of a sync (first send and re-sends, delta or seed) per receiver before it is
    /// dropped.
    pub max_attempts: u32,
    /// Largest delta kept for re-sends, in bytes; a larger one goes out as a seed to everyone,
    /// so what the server holds stays bounded whatever the step changed.
    pub max_retained: u64,
    /// A restarted trainer's first sync is a seed of a version above this and above every
    /// version announced by the receivers connected at that time.
    pub resume_after: u64,
}

impl Default for SessionConfig {
    fn default() -> Self {
        SessionConfig {
            min_receivers: 0,
            sync_timeout: Duration::from_secs(300),
            max_attempts: 3,
            max_retained: 1 << 30,
            resume_after: 0,
        }
    }
}

/// What one [`SyncServer::sync`] did.
#[derive(Clone, Debug, Default)]
pub struct SyncReport {
    /// The version every current receiver now holds.
    pub version: u64,
    /// Whether the sender's sync was a seed (for everyone) or a delta.
    pub seed: bool,
    /// The combined state digest of `version`.
    pub state_digest: u64,
    /// Receivers that acked `(version, state_digest)`.
    pub current: Vec<String>,
    /// Receivers connected but not current when the sync ended, with why; they were dropped
    /// and get a seed or the next delta when they reconnect.
    pub behind: Vec<(String, String)>,
    /// Receivers dropped during the sync (disconnects, timeouts, too many rejections), with why.
    pub dropped: Vec<(String, String)>,
    /// Receivers that joined (first connect or reconnect) during the sync or just before it.
    pub joined: u32,
    /// Delta sends (first sends and re-sends) and seed sends, per receiver.
    pub delta_sends: u32,
    pub seed_sends: u32,
    /// Nacks received (a receiver rejected a sync: checksum, version, digest).
    pub nacks: u32,
    /// Acks that claimed success with another version or digest (memory diverged).
    pub diverged: u32,
    /// Bytes of the delta (0 when the sync was a seed).
    pub delta_bytes: u64,
    /// Bytes the server held for re-sends during this sync (the delta's frames).
    pub retained_bytes: u64,
    /// Whether `min_receivers` were current when it ended.
    pub enough: bool,
}

impl SyncReport {
    /// Every connected receiver is current and there were enough of them.
    pub fn complete(&self) -> bool {
        self.enough && self.behind.is_empty()
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Sent {
    Delta,
    Seed,
}

struct Pending {
    sent: Sent,
    attempts: u32,
    deadline: Instant,
}

/// The sync being run.
struct Round {
    v0: Option<(u64, u64)>,
    v1: (u64, u64),
    delta: bool,
}

/// Trainer side: a [`Sender`] behind a [`FrameServer`], repairing every receiver each sync.
pub struct SyncServer {
    frames: FrameServer,
    table: SlotTable,
    flush: FlushConfig,
    opts: SessionConfig,
    ack_timeout: Duration,
    /// Built at the first sync, from its buffers (so a restarted trainer needs no old state).
    sender: Option<Sender>,
    /// The next sync must be a seed for everyone (first sync, or the last one failed here).
    must_seed: bool,
    /// The current delta's frames: the only frames the server keeps.
    retained: Vec<Vec<u8>>,
    /// Last state each connected receiver told us (hello or ack): `(version, digest)`.
    known: BTreeMap<ReceiverId, (ReceiverInfo, Option<(u64, u64)>)>,
}

impl SyncServer {
    /// Listens on `addr` for receivers of `table`'s slots.
    pub fn bind(
        addr: SocketAddr,
        net: NetConfig,
        table: SlotTable,
        flush: FlushConfig,
        opts: SessionConfig,
    ) -> Result<Self, SessionError> {
        flush.validate()?;
        if opts.max_attempts == 0 {
            return Err(SessionError::InvalidArgument(
                "max_attempts must be at least 1".into(),
            ));
        }
        if opts.resume_after >= u64::MAX / 2 {
            return Err(SessionError::InvalidArgument(format!(
                "resume_after {} leaves no room for versions",
                opts.resume_after
            )));
        }
        let ack_timeout = net.ack_timeout;
        let frames = FrameServer::bind(addr, net.with_bucket_size(flush.bucket_size as u64))?;
        Ok(SyncServer {
            frames,
            table,
            flush,
            opts,
            ack_timeout,
            sender: None,
            must_seed: true,
            retained: Vec::new(),
            known: BTreeMap::new(),
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.frames.local_addr()
    }

    /// The version of the last sync (0 before the first).
    pub fn version(&self) -> u64 {
        self.sender.as_ref().map_or(0, Sender::version)
    }

    /// The combined state digest of that version.
    pub fn state_digest(&self) -> u64 {
        self.sender.as_ref().map_or(0, Sender::state_digest)
    }

    /// Bytes held for re-sends right now (the last delta's frames).
    pub fn retained_bytes(&self) -> u64 {
        self.retained.iter().map(|f| f.len() as u64).sum()
    }

    /// Receivers connected now.
    pub fn receivers(&self) -> Vec<ReceiverInfo> {
        self.frames.receivers()
    }

    /// Tells every receiver the session is over (they stop instead of reconnecting).
    pub fn close(mut self, reason: &str) {
        for r in self.frames.receivers() {
            self.frames.disconnect(r.id, &format!("{CLOSED}: {reason}"));
        }
    }

    fn name(&self, id: ReceiverId) -> String {
        self.known
            .get(&id)
            .map_or_else(|| id.to_string(), |(i, _)| FrameServer::peer_name(i))
    }

    fn forget(&mut self, id: ReceiverId, why: String, rep: &mut SyncReport) {
        rep.dropped.push((self.name(id), why));
        self.known.remove(&id);
    }

    /// Takes in receivers that connected and acks that came between syncs.
    fn absorb(&mut self, rep: &mut SyncReport) {
        while let Some(ev) = self.frames.next_event(Duration::ZERO) {
            match ev {
                ServerEvent::Joined(info) => {
                    rep.joined += 1;
                    let state = info.version.map(|v| (v, info.state_digest));
                    self.known.insert(info.id, (info, state));
                }
                ServerEvent::Ack(id, Ok(a)) => {
                    if let Some(k) = self.known.get_mut(&id) {
                        k.1 = Some((a.version, a.state_digest));
                    }
                }
                ServerEvent::Ack(id, Err(e)) => self.forget(id, e.to_string(), rep),
            }
        }
        let live: BTreeSet<ReceiverId> = self.frames.receivers().iter().map(|i| i.id).collect();
        self.known.retain(|id, _| live.contains(id));
    }

    /// Sends one sync of `current` (one buffer per slot, in table order) and brings every
    /// connected receiver to it: a delta to those at the previous version, a seed to the others,
    /// re-sends on nacks, seeds to receivers that (re)connect meanwhile. Returns when every
    /// connected receiver is current and at least `min_receivers` are, or after `sync_timeout`
    /// (receivers still behind are dropped and listed). `Err` only for this side's failures.
    pub fn sync(&mut self, current: &[&[u8]]) -> Result<SyncReport, SessionError> {
        let mut rep = SyncReport::default();
        self.absorb(&mut rep);
        self.retained.clear();
        let mut sender = match self.sender.take() {
            Some(s) => s,
            None => {
                // A (re)started trainer first waits for its receivers, to learn their versions.
                let deadline = Instant::now() + self.opts.sync_timeout;
                while self.known.len() < self.opts.min_receivers {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        break;
                    }
                    match self.frames.next_event(left) {
                        Some(ServerEvent::Joined(info)) => {
                            rep.joined += 1;
                            let state = info.version.map(|v| (v, info.state_digest));
                            self.known.insert(info.id, (info, state));
                        }
                        Some(ServerEvent::Ack(id, Err(e))) => {
                            self.forget(id, e.to_string(), &mut rep)
                        }
                        Some(ServerEvent::Ack(..)) | None => {}
                    }
                }
                // Resume above every version a receiver holds, so versions only grow.
                let announced = self
                    .known
                    .values()
                    .filter_map(|(_, s)| s.map(|(v, _)| v))
                    .filter(|&v| v < u64::MAX / 2)
                    .max()
                    .unwrap_or(0);
                let base = current.iter().map(|b| b.to_vec()).collect();
                let resume = announced.max(self.opts.resume_after);
                self.must_seed = true;
                Sender::with_base(self.table.clone(), self.flush, base, resume)?
            }
        };
        let result = self.run(&mut sender, current, &mut rep);
        self.sender = Some(sender);
        result.map(|()| rep)
    }

    fn run(
        &mut self,
        sender: &mut Sender,
        current: &[&[u8]],
        rep: &mut SyncReport,
    ) -> Result<(), SessionError> {
        let ids: Vec<ReceiverId> = self.known.keys().copied().collect();
        let before = (sender.version(), sender.state_digest());
        // A delta, kept for re-sends, unless the sender must seed or it is too large.
        let mut delta_ok = false;
        if !self.must_seed {
            let (retained, cap) = (&mut self.retained, self.opts.max_retained);
            let mut bytes = 0u64;
            let mut over = false;
            let r = sender.delta(current, |f| {
                bytes += f.len() as u64;
                if bytes > cap {
                    over = true;
                    return Err(deltacast::Error::InvalidArgument(format!(
                        "delta above max_retained ({cap} bytes)"
                    )));
                }
                retained.push(f);
                Ok(())
            });
            match r {
                Ok(_) => delta_ok = true,
                Err(_) if over => {}
                Err(e) => {
                    self.must_seed = true;
                    return Err(e.into());
                }
            }
        }
        if !delta_ok {
            self.retained.clear();
            self.must_seed = true;
            // Everyone gets this seed, streamed to them as it is encoded.
            let mut live = ids.clone();
            let mut failed = Vec::new();
            let frames = &mut self.frames;
            sender.seed(current, |f| stream(frames, &mut live, &mut failed, &f))?;
            for (id, e) in failed {
                self.forget(id, e, rep);
            }
            rep.seed_sends += ids.len() as u32;
        }
        self.must_seed = false;
        let round = Round {
            v0: delta_ok.then_some(before),
            v1: (sender.version(), sender.state_digest()),
            delta: delta_ok,
        };
        rep.version = round.v1.0;
        rep.state_digest = round.v1.1;
        rep.seed = !delta_ok;
        rep.delta_bytes = if delta_ok { self.retained_bytes() } else { 0 };
        rep.retained_bytes = self.retained_bytes();

        let mut pending: BTreeMap<ReceiverId, Pending> = BTreeMap::new();
        let mut current_set: BTreeSet<ReceiverId> = BTreeSet::new();
        if delta_ok {
            let (mut to_delta, mut to_seed) = (Vec::new(), Vec::new());
            for id in ids {
                let Some((_, state)) = self.known.get(&id) else {
                    continue;
                };
                if *state == round.v0 {
                    to_delta.push(id);
                } else if *state == Some(round.v1) {
                    current_set.insert(id);
                } else {
                    to_seed.push(id);
                }
            }
            self.send_delta(&to_delta, rep);
            self.send_seed(sender, current, &to_seed, rep)?;
            for id in to_delta {
                self.expect(&mut pending, id, Sent::Delta, 1);
            }
            for id in to_seed {
                self.expect(&mut pending, id, Sent::Seed, 1);
            }
        } else {
            for id in ids {
                self.expect(&mut pending, id, Sent::Seed, 1);
            }
        }

        let deadline = Instant::now() + self.opts.sync_timeout;
        loop {
            // Receivers whose link failed while we sent are gone.
            pending.retain(|id, _| self.known.contains_key(id));
            current_set.retain(|id| self.known.contains_key(id));
            if pending.is_empty() && current_set.len() >= self.opts.min_receivers {
                break;
            }
            // What already arrived first: an ack that waited while we sent to others is on time.
            let ev = match self.frames.next_event(Duration::ZERO) {
                Some(ev) => ev,
                None => {
                    let now = Instant::now();
                    if now >= deadline {
                        break;
                    }
                    // Ack deadlines: a receiver that stays silent is dropped, named.
                    let late: Vec<ReceiverId> = pending
                        .iter()
                        .filter(|(_, p)| p.deadline <= now)
                        .map(|(id, _)| *id)
                        .collect();
                    for id in late {
                        pending.remove(&id);
                        let e = NetError::Timeout {
                            peer: self.name(id),
                            what: format!("its ack of version {}", round.v1.0),
                            after: self.ack_timeout,
                        };
                        self.frames.disconnect(id, &format!("dropped: {e}"));
                        self.forget(id, e.to_string(), rep);
                    }
                    let wake = pending
                        .values()
                        .map(|p| p.deadline)
                        .fold(deadline, Instant::min);
                    match self
                        .frames
                        .next_event(wake.saturating_duration_since(Instant::now()))
                    {
                        Some(ev) => ev,
                        None => continue,
                    }
                }
            };
            match ev {
                ServerEvent::Joined(info) => {
                    rep.joined += 1;
                    let id = info.id;
                    let state = info.version.map(|v| (v, info.state_digest));
                    self.known.insert(id, (info, state));
                    if state == Some(round.v1) {
                        current_set.insert(id);
                    } else if round.delta && state == round.v0 {
                        self.send_delta(&[id], rep);
                        self.expect(&mut pending, id, Sent::Delta, 1);
                    } else {
                        self.send_seed(sender, current, &[id], rep)?;
                        self.expect(&mut pending, id, Sent::Seed, 1);
                    }
                }
                ServerEvent::Ack(id, Err(e)) => {
                    pending.remove(&id);
                    current_set.remove(&id);
                    self.forget(id, e.to_string(), rep);
                }
                ServerEvent::Ack(id, Ok(a)) => {
                    let said = Some((a.version, a.state_digest));
                    if let Some(k) = self.known.get_mut(&id) {
                        k.1 = said;
                    }
                    if a.ok && said == Some(round.v1) {
                        pending.remove(&id);
                        current_set.insert(id);
                        continue;
                    }
                    current_set.remove(&id);
                    if a.ok {
                        rep.diverged += 1;
                    } else {
                        rep.nacks += 1;
                    }
                    let (sent, attempts) = pending
                        .get(&id)
                        .map_or((Sent::Seed, 0), |p| (p.sent, p.attempts));
                    if attempts >= self.opts.max_attempts {
                        pending.remove(&id);
                        let why = format!(
                            "gave up on it after {attempts} sends of version {}: {}",
                            round.v1.0,
                            if a.message.is_empty() {
                                "wrong digest"
                            } else {
                                a.message.as_str()
                            }
                        );
                        self.frames.disconnect(id, &why);
                        self.forget(id, why, rep);
                    } else if !a.ok
                        && sent == Sent::Delta
                        && round.delta
                        && said == round.v0
                        && attempts + 1 < self.opts.max_attempts
                    {
                        // It still holds the base: the delta again (the last attempt is a seed,
                        // in case the delta itself is what fails there).
                        self.send_delta(&[id], rep);
                        self.expect(&mut pending, id, Sent::Delta, attempts + 1);
                    } else {
                        self.send_seed(sender, current, &[id], rep)?;
                        self.expect(&mut pending, id, Sent::Seed, attempts + 1);
                    }
                }
            }
        }
        for (id, _) in pending {
            let why = format!(
                "not current at the end of the sync of version {}",
                round.v1.0
            );
            self.frames.disconnect(id, &why);
            rep.behind.push((self.name(id), why));
            self.known.remove(&id);
        }
        rep.enough = current_set.len() >= self.opts.min_receivers;
        rep.current = current_set.iter().map(|id| self.name(*id)).collect();
        Ok(())
    }

    /// Marks `id` as awaited, unless sending to it already failed (it is gone).
    fn expect(
        &self,
        pending: &mut BTreeMap<ReceiverId, Pending>,
        id: ReceiverId,
        sent: Sent,
        attempts: u32,
    ) {
        if self.known.contains_key(&id) {
            pending.insert(
                id,
                Pending {
                    sent,
                    attempts,
                    deadline: Instant::now() + self.ack_timeout,
                },
            );
        }
    }

    fn send_delta(&mut self, ids: &[ReceiverId], rep: &mut SyncReport) {
        if ids.is_empty() {
            return;
        }
        let mut live = ids.to_vec();
        let mut failed = Vec::new();
        for f in &self.retained {
            // Only an oversize frame errors, and these came from our own encoder within bucket
            // size; treat it as every target failing rather than panicking.
            if let Err(e) = stream(&mut self.frames, &mut live, &mut failed, f) {
                let why = e.to_string();
                failed.extend(live.drain(..).map(|id| (id, why.clone())));
            }
        }
        rep.delta_sends += ids.len() as u32;
        for (id, e) in failed {
            self.forget(id, e, rep);
        }
    }

    /// Encodes a seed of the sender's current version from `current` and streams it to `ids`;
    /// nothing of it is kept.
    fn send_seed(
        &mut self,
        sender: &Sender,
        current: &[&[u8]],
        ids: &[ReceiverId],
        rep: &mut SyncReport,
    ) -> Result<(), SessionError> {
        if ids.is_empty() {
            return Ok(());
        }
        let mut live = ids.to_vec();
        let mut failed = Vec::new();
        {
            let frames = &mut self.frames;
            sender.resend_seed(current, |f: Vec<u8>| {
                stream(frames, &mut live, &mut failed, &f)
            })?;
        }
        rep.seed_sends += ids.len() as u32;
        for (id, e) in failed {
            self.forget(id, e, rep);
        }
        Ok(())
    }
}

/// Writes one frame to `live` receivers; those that fail move to `failed`.
fn stream(
    frames: &mut FrameServer,
    live: &mut Vec<ReceiverId>,
    failed: &mut Vec<(ReceiverId, String)>,
    frame: &[u8],
) -> deltacast::Result<()> {
    if live.is_empty() {
        return Ok(());
    }
    let r = frames
        .send_many(live, frame)
        .map_err(|e| deltacast::Error::InvalidArgument(e.to_string()))?;
    for (id, e) in r.failed {
        live.retain(|x| *x != id);
        failed.push((id, e.to_string()));
    }
    Ok(())
}

/// What [`SyncClient::next_event`] saw.
#[derive(Debug)]
pub enum ClientEvent {
    /// Connected (or reconnected) and said hello with this state. `diverged`: memory no
    /// longer matched the running digests, so it asked for a seed.
    Connected {
        version: Option<u64>,
        diverged: bool,
    },
    /// A sync verified and was applied. `diverged`: the memory check after it failed (the
    /// ack said so and a seed follows).
    Applied {
        outcome: SyncOutcome,
        diverged: bool,
    },
    /// A sync was rejected (nothing applied) and nacked; the server re-sends or seeds.
    Rejected {
        version: Option<u64>,
        error: deltacast::Error,
    },
    /// The link failed; a half-received sync was dropped, the state is untouched. The next
    /// call reconnects.
    Disconnected {
        version: Option<u64>,
        error: NetError,
    },
    /// The server closed the session on purpose.
    Closed { reason: String },
}

/// Receiver side: a [`Receiver`] fed from a [`FrameClient`] that reconnects by itself.
pub struct SyncClient<S: SlotStore = Vec<Vec<u8>>> {
    server: Vec<SocketAddr>,
    net: NetConfig,
    /// Check memory against the running digests every this many applied syncs (0: only on
    /// connect and on rejections).
    verify_every: u32,
    applied: u64,
    link: Option<FrameClient>,
    receiver: Receiver<S>,
    /// A sync was rejected: its later frames are skipped until the next flush 0.
    skipping: bool,
}

impl<S: SlotStore> SyncClient<S> {
    /// A client of the server at `server`; it connects on the first [`next_event`](Self::next_event).
    pub fn new(
        server: SocketAddr,
        net: NetConfig,
        receiver: Receiver<S>,
        verify_every: u32,
    ) -> Self {
        SyncClient {
            server: vec![server],
            net,
            verify_every,
            applied: 0,
            link: None,
            receiver,
            skipping: false,
        }
    }

    pub fn receiver(&self) -> &Receiver<S> {
        &self.receiver
    }

    /// For tests and fault injection: writes here bypass the running digests.
    pub fn receiver_mut(&mut self) -> &mut Receiver<S> {
        &mut self.receiver
    }

    pub fn into_receiver(self) -> Receiver<S> {
        self.receiver
    }

    pub fn is_connected(&self) -> bool {
        self.link.is_some()
    }

    /// Drops the link (as a crash of the connection would); the next call reconnects.
    pub fn disconnect(&mut self) {
        self.link = None;
        self.receiver.abort_sync();
        self.skipping = false;
    }

    /// The combined digest of what memory holds, and whether it differs from the running one.
    fn memory_digest(&self) -> (u64, bool) {
        let bad = self.receiver.recompute_digests();
        if bad.is_empty() {
            return (self.receiver.state_digest(), false);
        }
        let table = self.receiver.table();
        let store = self.receiver.store();
        let running = self.receiver.digests();
        let mut d = self.receiver.state_digest();
        for id in bad {
            let width = table.slots()[id as usize].dtype.width();
            let actual = deltacast::digest::digest_slot(id, width, store.slot(id));
            d = d.wrapping_sub(running[id as usize]).wrapping_add(actual);
        }
        (d, true)
    }

    fn connect(&mut self) -> Result<ClientEvent, SessionError> {
        let (digest, diverged) = self.memory_digest();
        // A diverged receiver says it holds nothing: it needs a seed whatever its version.
        let version = if diverged {
            None
        } else {
            self.receiver.version()
        };
        // A server (or relay) that accepts and then closes is restarting: retry until
        // `connect_timeout`, as for a server that is not listening yet.
        let deadline = Instant::now() + self.net.connect_timeout;
        let mut delay = Duration::from_millis(20);
        let link = loop {
            match FrameClient::connect(&self.server[..], version, digest, self.net.clone()) {
                Ok(l) => break l,
                Err(e) if e.is_disconnect() && Instant::now() + delay < deadline => {
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_millis(500));
                }
                Err(e) => return Err(e.into()),
            }
        };
        self.link = Some(link);
        self.skipping = false;
        Ok(ClientEvent::Connected {
            version: self.receiver.version(),
            diverged,
        })
    }

    fn lost(&mut self, error: NetError) -> ClientEvent {
        self.disconnect();
        ClientEvent::Disconnected {
            version: self.receiver.version(),
            error,
        }
    }

    /// Runs until something happens: connects if needed (retrying up to `connect_timeout`),
    /// then takes frames until a sync is applied or rejected, or the link fails.
    pub fn next_event(&mut self) -> Result<ClientEvent, SessionError> {
        loop {
            let Some(link) = self.link.as_mut() else {
                return self.connect();
            };
            let frame = match link.recv_frame() {
                Ok(f) => f,
                Err(NetError::Aborted { reason, .. }) if reason.starts_with(CLOSED) => {
                    self.disconnect();
                    return Ok(ClientEvent::Closed { reason });
                }
                Err(e) => return Ok(self.lost(e)),
            };
            if self.skipping {
                // The rest of a rejected sync; a verified flush 0 starts the next attempt.
                match parse_frame(&frame) {
                    Ok(f) if f.header.flush_index == 0 => self.skipping = false,
                    _ => continue,
                }
            }
            match self.receiver.receive(&frame) {
                Ok(None) => continue,
                Ok(Some(outcome)) => return Ok(self.applied(outcome)),
                Err(error) => {
                    let is_final = peek_header(&frame).is_ok_and(|h| h.is_final);
                    self.skipping = !is_final;
                    let (digest, _) = self.memory_digest();
                    let nack = Ack {
                        version: self.receiver.version().unwrap_or(0),
                        state_digest: digest,
                        ok: false,
                        message: error.to_string(),
                    };
                    if let Err(e) = self.send(&nack) {
                        return Ok(self.lost(e));
                    }
                    return Ok(ClientEvent::Rejected {
                        version: self.receiver.version(),
                        error,
                    });
                }
            }
        }
    }

    /// Acks an applied sync, with the digest of memory when this one is checked.
    fn applied(&mut self, outcome: SyncOutcome) -> ClientEvent {
        self.applied += 1;
        let check =
            self.verify_every > 0 && self.applied.is_multiple_of(u64::from(self.verify_every));
        let (digest, diverged) = if check {
            self.memory_digest()
        } else {
            (outcome.state_digest, false)
        };
        let ack = Ack {
            version: outcome.version,
            state_digest: digest,
            ok: true,
            message: String::new(),
        };
        if let Err(e) = self.send(&ack) {
            return self.lost(e);
        }
        ClientEvent::Applied { outcome, diverged }
    }

    fn send(&mut self, ack: &Ack) -> Result<(), NetError> {
        match self.link.as_mut() {
            Some(l) => l.send_ack(ack),
            None => Err(NetError::Poisoned("the connection is closed".into())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltacast::{DType, SlotInfo};

    #[test]
    fn bind_refuses_options_that_cannot_work() {
        let table = SlotTable::new(vec![SlotInfo::new("w", DType::BF16, vec![8])]).expect("table");
        let lo: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let bind = |opts: SessionConfig| {
            SyncServer::bind(
                lo,
                NetConfig::default(),
                table.clone(),
                FlushConfig::default(),
                opts,
            )
        };
        let e = bind(SessionConfig {
            max_attempts: 0,
            ..SessionConfig::default()
        });
        assert!(matches!(e, Err(SessionError::InvalidArgument(_))));
        let e = bind(SessionConfig {
            resume_after: u64::MAX,
            ..SessionConfig::default()
        });
        assert!(matches!(e, Err(SessionError::InvalidArgument(_))));
        let s = bind(SessionConfig::default()).expect("defaults bind");
        assert_eq!((s.version(), s.retained_bytes()), (0, 0));
    }
}
