//! The collective over TCP: a star through the leader, because every operation the trainer
//! needs is a gather at rank 0 (plus handing the small plan back), so peer-to-peer links would
//! only add connections.
//!
//! Rendezvous: rank 0 listens; ranks 1..N connect, authenticate, send `JOIN(rank, world)`; once all
//! have joined the leader sends `READY` to each. All-gather: every rank sends `ROW` to the
//! leader, the leader sends `ROWS` (all rows) back. Transfers: `DATA` with the exact planned size.
//! The struct owns a current-thread tokio runtime and blocks on it, so callers stay plain threads
//! (do not call it from inside an async runtime).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use futures_util::future::{join_all, try_join_all};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

use crate::auth::{client_handshake, server_handshake, Link};
use deltacast::sharded::Collective;

use crate::collective::{check_recv_from, check_send_to_leader};
use crate::config::{
    bind, connect_retry, current_thread_runtime, resolve, tune, NetConfig, MAX_PENDING_HANDSHAKES,
};
use crate::wire::{explain, read_msg, send_error, ty, write_msg, Expect};
use crate::NetError;

struct Peer {
    stream: TcpStream,
    name: String,
}

enum Role {
    /// `peers[i]` is rank `i + 1`.
    Leader {
        peers: Vec<Peer>,
    },
    Member {
        leader: Option<Peer>,
    },
}

/// A rank of a TCP collective (see the module docs for the protocol).
pub struct TcpCollective {
    // Sockets first: they must drop before the runtime that drives them.
    role: Role,
    rank: usize,
    world: usize,
    cfg: NetConfig,
    poisoned: Option<String>,
    rt: tokio::runtime::Runtime,
}

/// The leader between binding and the moment every rank has joined; lets the caller learn the
/// bound port (e.g. after binding port 0) before blocking in [`accept`](Self::accept).
pub struct LeaderRendezvous {
    listener: TcpListener,
    addr: SocketAddr,
    world: usize,
    cfg: NetConfig,
    rt: tokio::runtime::Runtime,
}

fn check_world(rank: usize, world: usize) -> Result<(), NetError> {
    if world == 0 || rank >= world || world > u32::MAX as usize {
        return Err(NetError::InvalidArgument(format!(
            "rank {rank} of world {world}: need 0 <= rank < world"
        )));
    }
    Ok(())
}

impl TcpCollective {
    /// Binds the leader's listener (rank 0). Without a secret only loopback addresses are allowed.
    pub fn bind_leader(
        addr: SocketAddr,
        world: usize,
        cfg: NetConfig,
    ) -> Result<LeaderRendezvous, NetError> {
        check_world(0, world)?;
        let rt = current_thread_runtime()?;
        let listener = rt.block_on(bind(addr, cfg.secret.as_ref()))?;
        let addr = listener.local_addr().map_err(|e| NetError::Setup {
            what: "cannot read the bound address".into(),
            source: e,
        })?;
        Ok(LeaderRendezvous {
            listener,
            addr,
            world,
            cfg,
            rt,
        })
    }

    /// Binds and waits until every rank has joined.
    pub fn leader(addr: SocketAddr, world: usize, cfg: NetConfig) -> Result<Self, NetError> {
        Self::bind_leader(addr, world, cfg)?.accept()
    }

    /// Joins the leader at `leader` as `rank` of `world` (rank ≥ 1); retries while the leader is
    /// not up yet, for up to `connect_timeout`, and returns once every rank has joined.
    pub fn join(
        leader: impl std::net::ToSocketAddrs,
        rank: usize,
        world: usize,
        cfg: NetConfig,
    ) -> Result<Self, NetError> {
        check_world(rank, world)?;
        check_send_to_leader(rank)?;
        let addrs = resolve(leader)?;
        let rt = current_thread_runtime()?;
        let peer = rt.block_on(async {
            let deadline = Instant::now() + cfg.connect_timeout;
            let first = format!("leader (rank 0, {})", addrs[0]);
            let (mut stream, addr) = connect_retry(&addrs, &first, cfg.connect_timeout).await?;
            let name = format!("leader (rank 0, {addr})");
            let secret = cfg.secret.as_ref();
            client_handshake(
                &mut stream,
                secret,
                Link::Collective,
                &name,
                cfg.handshake_timeout,
            )
            .await?;
            let mut join = Vec::with_capacity(8);
            join.extend_from_slice(&(rank as u32).to_le_bytes());
            join.extend_from_slice(&(world as u32).to_le_bytes());
            write_msg(
                &mut stream,
                ty::JOIN,
                &join,
                &name,
                "JOIN",
                Some(cfg.io_timeout),
            )
            .await?;
            let left = deadline.saturating_duration_since(Instant::now());
            let ready = Expect {
                allowed: &[(ty::READY, 0)],
                what: "READY (every rank joined)",
            };
            read_msg(
                &mut stream,
                &name,
                ready,
                Some(left.max(cfg.handshake_timeout)),
                None,
            )
            .await
            .map_err(|e| match e {
                NetError::Aborted { peer, reason } => NetError::Refused { peer, reason },
                other => other,
            })?;
            Ok::<_, NetError>(Peer { stream, name })
        })?;
        Ok(TcpCollective {
            role: Role::Member { leader: Some(peer) },
            rank,
            world,
            cfg,
            poisoned: None,
            rt,
        })
    }

    fn check(&self) -> Result<(), NetError> {
        match &self.poisoned {
            Some(why) => Err(NetError::Poisoned(why.clone())),
            None => Ok(()),
        }
    }

    /// Poisons, tells every connected peer why (so they fail at once) and closes the sockets.
    fn fail(&mut self, e: NetError) -> NetError {
        let reason = format!("rank {} gave up: {e}", self.rank);
        let peers: Vec<Peer> = match &mut self.role {
            Role::Leader { peers } => std::mem::take(peers),
            Role::Member { leader } => leader.take().into_iter().collect(),
        };
        self.rt.block_on(async {
            join_all(peers.into_iter().map(|mut p| {
                let reason = reason.clone();
                async move { send_error(&mut p.stream, &reason).await }
            }))
            .await;
        });
        self.poisoned = Some(e.to_string());
        e
    }

    fn rows_max(&self) -> u64 {
        (self.world as u64)
            .saturating_mul(self.cfg.max_row.saturating_add(8))
            .saturating_add(4)
    }
}

impl LeaderRendezvous {
    /// The address the leader listens on (the real port when bound to port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Whether connections must prove the shared secret.
    pub fn is_authenticated(&self) -> bool {
        self.cfg.secret.is_some()
    }

    /// Accepts and authenticates connections until every rank 1..world has joined (within
    /// `connect_timeout`), then sends READY to all. Connections that fail the handshake, claim a
    /// taken or impossible rank, or disagree on the world size are told why and dropped; they do
    /// not stop the rendezvous.
    pub fn accept(self) -> Result<TcpCollective, NetError> {
        let LeaderRendezvous {
            listener,
            addr: _,
            world,
            cfg,
            rt,
        } = self;
        let peers = rt.block_on(rendezvous(listener, world, &cfg))?;
        Ok(TcpCollective {
            role: Role::Leader { peers },
            rank: 0,
            world,
            cfg,
            poisoned: None,
            rt,
        })
    }
}

type Joined = (TcpStream, SocketAddr, Result<(u32, u32), NetError>);

async fn rendezvous(
    listener: TcpListener,
    world: usize,
    cfg: &NetConfig,
) -> Result<Vec<Peer>, NetError> {
    let deadline = tokio::time::Instant::now() + cfg.connect_timeout;
    let mut slots: Vec<Option<Peer>> = (1..world).map(|_| None).collect();
    let mut missing = world - 1;
    let mut pending: JoinSet<Joined> = JoinSet::new();
    while missing > 0 {
        tokio::select! {
            acc = listener.accept(), if pending.len() < MAX_PENDING_HANDSHAKES => match acc {
                Ok((stream, addr)) => {
                    tune(&stream);
                    let secret = cfg.secret.clone();
                    let limit = cfg.handshake_timeout;
                    pending.spawn(async move {
                        let mut stream = stream;
                        let name = format!("connection from {addr}");
                        let r = handshake_and_join(&mut stream, secret, &name, limit).await;
                        (stream, addr, r)
                    });
                }
                Err(e) => {
                    log::warn!("deltacast-net: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(done) = pending.join_next() => {
                let Ok((mut stream, addr, joined)) = done else { continue };
                let (rank, claimed_world) = match joined {
                    Ok(v) => v,
                    Err(e) => {
                        log::warn!("deltacast-net: refused a rank connection: {e}");
                        continue;
                    }
                };
                let (rank, claimed_world) = (rank as usize, claimed_world as usize);
                let refusal = if claimed_world != world {
                    Some(format!("world size mismatch: the leader has {world} ranks, rank {rank} says {claimed_world}"))
                } else if rank == 0 || rank >= world {
                    Some(format!("rank {rank} is not a joining rank of a world of {world} (1..{world})"))
                } else {
                    slots[rank - 1].as_ref().map(|p| format!("rank {rank} already joined as {}", p.name))
                };
                match refusal {
                    Some(reason) => {
                        log::warn!("deltacast-net: refused {addr}: {reason}");
                        send_error(&mut stream, &reason).await;
                    }
                    None => {
                        slots[rank - 1] = Some(Peer { stream, name: format!("rank {rank} ({addr})") });
                        missing -= 1;
                    }
                }
            },
            _ = tokio::time::sleep_until(deadline) => {
                let absent: Vec<String> = slots
                    .iter()
                    .enumerate()
                    .filter(|(_, s)| s.is_none())
                    .map(|(i, _)| (i + 1).to_string())
                    .collect();
                let reason = format!("rendezvous timed out; ranks {} never joined", absent.join(", "));
                for p in slots.iter_mut().flatten() {
                    send_error(&mut p.stream, &reason).await;
                }
                return Err(NetError::Timeout {
                    peer: format!("rank(s) {}", absent.join(", ")),
                    what: "the rendezvous (joining the leader)".into(),
                    after: cfg.connect_timeout,
                });
            }
        }
    }
    let mut peers: Vec<Peer> = slots.into_iter().flatten().collect();
    let io = Some(cfg.io_timeout);
    try_join_all(
        peers
            .iter_mut()
            .map(|p| write_msg(&mut p.stream, ty::READY, &[], &p.name, "READY", io)),
    )
    .await?;
    Ok(peers)
}

async fn handshake_and_join(
    stream: &mut TcpStream,
    secret: Option<crate::Secret>,
    name: &str,
    limit: Duration,
) -> Result<(u32, u32), NetError> {
    server_handshake(stream, secret.as_ref(), Link::Collective, name, limit).await?;
    let join = Expect {
        allowed: &[(ty::JOIN, 8)],
        what: "JOIN (rank, world)",
    };
    let (_, p) = read_msg(stream, name, join, Some(limit), Some(limit)).await?;
    let mut rank = [0u8; 4];
    let mut world = [0u8; 4];
    match (p.get(..4), p.get(4..8)) {
        (Some(r), Some(w)) => {
            rank.copy_from_slice(r);
            world.copy_from_slice(w);
        }
        _ => {
            return Err(NetError::Protocol {
                peer: name.into(),
                detail: format!("JOIN of {} bytes, expected 8", p.len()),
            })
        }
    }
    Ok((u32::from_le_bytes(rank), u32::from_le_bytes(world)))
}

/// Parses ROWS: `u32 count`, then per row `u64 len, bytes`.
fn decode_rows(p: &[u8], world: usize, max_row: u64, peer: &str) -> Result<Vec<Vec<u8>>, NetError> {
    let bad = |detail: String| NetError::Protocol {
        peer: peer.to_string(),
        detail,
    };
    let mut count = [0u8; 4];
    count.copy_from_slice(
        p.get(..4)
            .ok_or_else(|| bad("ROWS shorter than its count".into()))?,
    );
    let count = u32::from_le_bytes(count) as usize;
    if count != world {
        return Err(bad(format!("ROWS has {count} rows for a world of {world}")));
    }
    let mut rows = Vec::with_capacity(world);
    let mut at = 4usize;
    for r in 0..count {
        let mut len = [0u8; 8];
        len.copy_from_slice(
            p.get(at..at + 8)
                .ok_or_else(|| bad(format!("ROWS cut before the length of row {r}")))?,
        );
        let len = u64::from_le_bytes(len);
        if len > max_row {
            return Err(bad(format!(
                "row {r} is {len} bytes, above the limit {max_row}"
            )));
        }
        at += 8;
        let end = at
            .checked_add(len as usize)
            .filter(|&e| e <= p.len())
            .ok_or_else(|| bad(format!("ROWS cut inside row {r}")))?;
        rows.push(p[at..end].to_vec());
        at = end;
    }
    if at != p.len() {
        return Err(bad(format!(
            "{} trailing bytes after the rows",
            p.len() - at
        )));
    }
    Ok(rows)
}

fn encode_rows(rows: &[Vec<u8>]) -> Vec<u8> {
    let total: usize = rows.iter().map(|r| r.len() + 8).sum::<usize>() + 4;
    let mut out = Vec::with_capacity(total);
    out.extend_from_slice(&(rows.len() as u32).to_le_bytes());
    for r in rows {
        out.extend_from_slice(&(r.len() as u64).to_le_bytes());
        out.extend_from_slice(r);
    }
    out
}

impl Collective for TcpCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_gather(&mut self, mine: &[u8]) -> deltacast::Result<Vec<Vec<u8>>> {
        self.check()?;
        let max_row = self.cfg.max_row;
        if mine.len() as u64 > max_row {
            return Err(NetError::InvalidArgument(format!(
                "all_gather row of {} bytes exceeds max_row {max_row}",
                mine.len()
            ))
            .into());
        }
        let (wait, io) = (self.cfg.op_timeout, Some(self.cfg.io_timeout));
        let (world, rank, rows_max) = (self.world, self.rank, self.rows_max());
        let result = match &mut self.role {
            Role::Leader { peers } => self.rt.block_on(async {
                let expect = Expect {
                    allowed: &[(ty::ROW, max_row)],
                    what: "its all-gather row",
                };
                // Concurrent reads: the first disconnect or timeout fails the call at once.
                let theirs = try_join_all(peers.iter_mut().map(|p| async move {
                    read_msg(&mut p.stream, &p.name, expect, wait, io)
                        .await
                        .map(|(_, r)| r)
                }))
                .await?;
                let mut rows = Vec::with_capacity(world);
                rows.push(mine.to_vec());
                rows.extend(theirs);
                let payload = encode_rows(&rows);
                try_join_all(peers.iter_mut().map(|p| {
                    write_msg(
                        &mut p.stream,
                        ty::ROWS,
                        &payload,
                        &p.name,
                        "the gathered rows",
                        io,
                    )
                }))
                .await?;
                Ok(rows)
            }),
            Role::Member { leader } => match leader {
                None => Err(NetError::Poisoned("the leader connection is closed".into())),
                Some(p) => self.rt.block_on(async {
                    if let Err(e) = write_msg(
                        &mut p.stream,
                        ty::ROW,
                        mine,
                        &p.name,
                        "our all-gather row",
                        io,
                    )
                    .await
                    {
                        return Err(explain(&mut p.stream, &p.name, e).await);
                    }
                    let expect = Expect {
                        allowed: &[(ty::ROWS, rows_max)],
                        what: "the gathered rows",
                    };
                    let (_, payload) = read_msg(&mut p.stream, &p.name, expect, wait, io).await?;
                    let rows = decode_rows(&payload, world, max_row, &p.name)?;
                    if rows.get(rank).map(Vec::as_slice) != Some(mine) {
                        return Err(NetError::Protocol {
                            peer: p.name.clone(),
                            detail: format!("the gathered rows do not hold our row at {rank}"),
                        });
                    }
                    Ok(rows)
                }),
            },
        };
        Ok(result.map_err(|e| self.fail(e))?)
    }

    fn send_to_leader(&mut self, data: &[u8]) -> deltacast::Result<()> {
        self.check()?;
        check_send_to_leader(self.rank)?;
        let io = self.cfg.op_timeout.map(|t| t.max(self.cfg.io_timeout));
        let result = match &mut self.role {
            Role::Member { leader: Some(p) } => self.rt.block_on(async {
                match write_msg(&mut p.stream, ty::DATA, data, &p.name, "our transfer", io).await {
                    Ok(()) => Ok(()),
                    Err(e) => Err(explain(&mut p.stream, &p.name, e).await),
                }
            }),
            _ => Err(NetError::Poisoned("the leader connection is closed".into())),
        };
        Ok(result.map_err(|e| self.fail(e))?)
    }

    fn recv_from(&mut self, rank: usize, len: usize) -> deltacast::Result<Vec<u8>> {
        self.check()?;
        check_recv_from(self.rank, self.world, rank)?;
        let (wait, io, max) = (
            self.cfg.op_timeout,
            Some(self.cfg.io_timeout),
            self.cfg.max_transfer,
        );
        let result = match &mut self.role {
            Role::Leader { peers } => match peers.get_mut(rank - 1) {
                None => Err(NetError::Poisoned("the rank connections are closed".into())),
                Some(p) if len as u64 > max => Err(NetError::TooLarge {
                    peer: p.name.clone(),
                    what: "a planned transfer".into(),
                    len: len as u64,
                    max,
                }),
                Some(p) => self.rt.block_on(async {
                    let expect = Expect {
                        allowed: &[(ty::DATA, len as u64)],
                        what: "its transfer",
                    };
                    read_exact_data(&mut p.stream, &p.name, expect, len, wait, io).await
                }),
            },
            Role::Member { .. } => Err(NetError::InvalidArgument(
                "recv_from on a non-leader".into(),
            )),
        };
        Ok(result.map_err(|e| self.fail(e))?)
    }

    fn abort(&mut self, reason: &str) {
        if self.poisoned.is_none() {
            let _ = self.fail(NetError::Aborted {
                peer: format!("rank {}", self.rank),
                reason: reason.to_string(),
            });
        }
    }
}

/// Reads a DATA message whose length must be exactly `len` (checked on the header, before the
/// payload is read or allocated).
async fn read_exact_data(
    stream: &mut TcpStream,
    name: &str,
    expect: Expect<'_>,
    len: usize,
    wait: Option<Duration>,
    io: Option<Duration>,
) -> Result<Vec<u8>, NetError> {
    match read_msg(stream, name, expect, wait, io).await {
        Ok((_, d)) if d.len() == len => Ok(d),
        Ok((_, d)) => Err(NetError::SizeMismatch {
            peer: name.into(),
            expected: len as u64,
            got: d.len() as u64,
        }),
        Err(NetError::TooLarge { peer, len: got, .. }) => Err(NetError::SizeMismatch {
            peer,
            expected: len as u64,
            got,
        }),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_round_trip_and_reject_bad() {
        let rows = vec![b"a".to_vec(), vec![], b"ccc".to_vec()];
        let p = encode_rows(&rows);
        assert_eq!(decode_rows(&p, 3, 10, "l").expect("ok"), rows);
        assert!(decode_rows(&p, 2, 10, "l").is_err());
        assert!(decode_rows(&p, 3, 2, "l").is_err());
        assert!(decode_rows(&p[..p.len() - 1], 3, 10, "l").is_err());
        let mut q = p.clone();
        q.push(0);
        assert!(decode_rows(&q, 3, 10, "l").is_err());
        let mut huge = p.clone();
        huge[4..12].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(decode_rows(&huge, 3, u64::MAX, "l").is_err());
    }
}
