//! The in-process collective, and the argument checks every collective of this crate shares.
//! The trait is the core's [`Collective`] (the sharded trainer side lives there); errors are
//! [`NetError`]s, carried to the core as [`deltacast::Error::Transport`] (get them back with
//! `NetError::try_from`).

use std::sync::mpsc::{channel, Receiver, RecvTimeoutError, Sender};
use std::time::Duration;

use deltacast::sharded::Collective;

use crate::NetError;

/// Checks the argument of a leader-side receive.
pub(crate) fn check_recv_from(me: usize, world: usize, rank: usize) -> Result<(), NetError> {
    if me != 0 {
        return Err(NetError::InvalidArgument(format!(
            "recv_from is for the leader (rank 0); this is rank {me}"
        )));
    }
    if rank == 0 || rank >= world {
        return Err(NetError::InvalidArgument(format!(
            "recv_from(rank {rank}): the source must be a rank in 1..{world}"
        )));
    }
    Ok(())
}

pub(crate) fn check_send_to_leader(me: usize) -> Result<(), NetError> {
    if me == 0 {
        return Err(NetError::InvalidArgument(
            "send_to_leader called on the leader (rank 0)".into(),
        ));
    }
    Ok(())
}

pub(crate) fn rank_name(rank: usize) -> String {
    if rank == 0 {
        "leader (rank 0)".into()
    } else {
        format!("rank {rank}")
    }
}

enum Msg {
    Row(Vec<u8>),
    Data(Vec<u8>),
    Abort(String),
}

impl Msg {
    fn name(&self) -> &'static str {
        match self {
            Msg::Row(_) => "an all-gather row",
            Msg::Data(_) => "a transfer",
            Msg::Abort(_) => "an abort",
        }
    }
}

/// Ranks as threads of one process, joined by channels: for tests and the one-process demo.
/// Every pair of ranks has its own channel, so messages from one rank arrive in order.
pub struct InProcessCollective {
    rank: usize,
    world: usize,
    /// `to[r]` delivers to rank `r` (`None` for self).
    to: Vec<Option<Sender<Msg>>>,
    /// `from[r]` receives from rank `r` (`None` for self).
    from: Vec<Option<Receiver<Msg>>>,
    timeout: Option<Duration>,
    poisoned: Option<String>,
}

impl InProcessCollective {
    /// `world` connected ranks, in rank order, that wait for each other for up to 600 s.
    pub fn group(world: usize) -> Vec<InProcessCollective> {
        Self::group_with_timeout(world, Some(Duration::from_secs(600)))
    }

    /// Like [`group`](Self::group) with an explicit wait limit (`None`: forever; a dropped
    /// rank still fails its peers at once).
    pub fn group_with_timeout(world: usize, timeout: Option<Duration>) -> Vec<InProcessCollective> {
        let mut to: Vec<Vec<Option<Sender<Msg>>>> = (0..world)
            .map(|_| (0..world).map(|_| None).collect())
            .collect();
        let mut from: Vec<Vec<Option<Receiver<Msg>>>> = (0..world)
            .map(|_| (0..world).map(|_| None).collect())
            .collect();
        for src in 0..world {
            for dst in 0..world {
                if src != dst {
                    let (tx, rx) = channel();
                    to[src][dst] = Some(tx);
                    from[dst][src] = Some(rx);
                }
            }
        }
        to.into_iter()
            .zip(from)
            .enumerate()
            .map(|(rank, (to, from))| InProcessCollective {
                rank,
                world,
                to,
                from,
                timeout,
                poisoned: None,
            })
            .collect()
    }

    fn check(&self) -> Result<(), NetError> {
        match &self.poisoned {
            Some(why) => Err(NetError::Poisoned(why.clone())),
            None => Ok(()),
        }
    }

    /// Poisons and tells every peer, so they fail at once too.
    fn fail(&mut self, e: NetError) -> NetError {
        let reason = format!("rank {} failed: {e}", self.rank);
        for tx in self.to.iter().flatten() {
            let _ = tx.send(Msg::Abort(reason.clone()));
        }
        self.poisoned = Some(e.to_string());
        e
    }

    fn send(&self, dst: usize, m: Msg) -> Result<(), NetError> {
        let tx = self
            .to
            .get(dst)
            .and_then(Option::as_ref)
            .ok_or_else(|| NetError::InvalidArgument(format!("no channel to rank {dst}")))?;
        tx.send(m).map_err(|_| NetError::Disconnected {
            peer: rank_name(dst),
            detail: "(its collective was dropped)".into(),
        })
    }

    fn recv(&self, src: usize, what: &str) -> Result<Msg, NetError> {
        let rx = self
            .from
            .get(src)
            .and_then(Option::as_ref)
            .ok_or_else(|| NetError::InvalidArgument(format!("no channel from rank {src}")))?;
        let peer = rank_name(src);
        let got = match self.timeout {
            Some(t) => rx.recv_timeout(t),
            None => rx.recv().map_err(|_| RecvTimeoutError::Disconnected),
        };
        match got {
            Ok(Msg::Abort(reason)) => Err(NetError::Aborted { peer, reason }),
            Ok(m) => Ok(m),
            Err(RecvTimeoutError::Timeout) => Err(NetError::Timeout {
                peer,
                what: format!("waiting for {what}"),
                after: self.timeout.unwrap_or_default(),
            }),
            Err(RecvTimeoutError::Disconnected) => Err(NetError::Disconnected {
                peer,
                detail: format!("while we waited for {what} (its collective was dropped)"),
            }),
        }
    }

    fn gather(&mut self, mine: &[u8]) -> Result<Vec<Vec<u8>>, NetError> {
        for dst in (0..self.world).filter(|&d| d != self.rank) {
            self.send(dst, Msg::Row(mine.to_vec()))?;
        }
        let mut rows = Vec::with_capacity(self.world);
        for src in 0..self.world {
            if src == self.rank {
                rows.push(mine.to_vec());
                continue;
            }
            match self.recv(src, "its all-gather row")? {
                Msg::Row(r) => rows.push(r),
                other => {
                    return Err(NetError::Protocol {
                        peer: rank_name(src),
                        detail: format!(
                            "sent {} where an all-gather row was expected (calls out of step)",
                            other.name()
                        ),
                    })
                }
            }
        }
        Ok(rows)
    }
}

impl Collective for InProcessCollective {
    fn rank(&self) -> usize {
        self.rank
    }

    fn world(&self) -> usize {
        self.world
    }

    fn all_gather(&mut self, mine: &[u8]) -> deltacast::Result<Vec<Vec<u8>>> {
        self.check()?;
        Ok(self.gather(mine).map_err(|e| self.fail(e))?)
    }

    fn send_to_leader(&mut self, data: &[u8]) -> deltacast::Result<()> {
        self.check()?;
        check_send_to_leader(self.rank)?;
        Ok(self
            .send(0, Msg::Data(data.to_vec()))
            .map_err(|e| self.fail(e))?)
    }

    fn recv_from(&mut self, rank: usize, len: usize) -> deltacast::Result<Vec<u8>> {
        self.check()?;
        check_recv_from(self.rank, self.world, rank)?;
        let got = match self.recv(rank, "its transfer") {
            Ok(Msg::Data(d)) if d.len() == len => Ok(d),
            Ok(Msg::Data(d)) => Err(NetError::SizeMismatch {
                peer: rank_name(rank),
                expected: len as u64,
                got: d.len() as u64,
            }),
            Ok(other) => Err(NetError::Protocol {
                peer: rank_name(rank),
                detail: format!(
                    "sent {} where a transfer was expected (calls out of step)",
                    other.name()
                ),
            }),
            Err(e) => Err(e),
        };
        Ok(got.map_err(|e| self.fail(e))?)
    }

    fn abort(&mut self, reason: &str) {
        if self.poisoned.is_none() {
            let _ = self.fail(NetError::Aborted {
                peer: rank_name(self.rank),
                reason: reason.to_string(),
            });
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transport error a failed call carries.
    fn net_err<T: std::fmt::Debug>(r: deltacast::Result<T>) -> NetError {
        NetError::try_from(r.expect_err("the call must fail")).expect("a transport error")
    }

    fn run_group<T: Send + 'static>(
        group: Vec<InProcessCollective>,
        f: impl Fn(InProcessCollective) -> T + Send + Sync + Copy + 'static,
    ) -> Vec<T> {
        let handles: Vec<_> = group
            .into_iter()
            .map(|c| std::thread::spawn(move || f(c)))
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("thread"))
            .collect()
    }

    #[test]
    fn gather_and_exact_receives() {
        for world in 1..=5 {
            let out = run_group(InProcessCollective::group(world), |mut c| {
                let r = c.rank();
                let rows = c.all_gather(&vec![r as u8; r]).expect("gather");
                assert_eq!(
                    rows,
                    (0..c.world()).map(|i| vec![i as u8; i]).collect::<Vec<_>>()
                );
                if c.is_leader() {
                    (1..c.world())
                        .map(|src| c.recv_from(src, src * 10).expect("recv"))
                        .collect::<Vec<_>>()
                        .concat()
                        .len()
                        + rows.len()
                } else {
                    c.send_to_leader(&vec![r as u8; r * 10]).expect("send");
                    rows.len()
                }
            });
            let total: usize = (1..world).map(|r| r * 10).sum();
            assert_eq!(out[0], total + world);
            assert!(out[1..].iter().all(|&n| n == world));
        }
    }

    #[test]
    fn wrong_size_and_dropped_rank_fail_fast() {
        let mut g = InProcessCollective::group_with_timeout(3, Some(Duration::from_secs(5)));
        let mut r2 = g.pop().expect("r2");
        let mut r1 = g.pop().expect("r1");
        let mut r0 = g.pop().expect("r0");
        r1.send_to_leader(b"abc").expect("send");
        let e = net_err(r0.recv_from(1, 4));
        assert!(
            matches!(
                e,
                NetError::SizeMismatch {
                    expected: 4,
                    got: 3,
                    ..
                }
            ),
            "{e}"
        );
        // The leader told everyone it failed.
        let e = r2.all_gather(b"x").expect_err("aborted");
        assert!(e.to_string().contains("rank 1"), "{e}");
        assert!(matches!(net_err(r0.all_gather(b"")), NetError::Poisoned(_)));

        let mut g = InProcessCollective::group_with_timeout(2, Some(Duration::from_secs(5)));
        let r1 = g.pop().expect("r1");
        drop(r1);
        let t = std::time::Instant::now();
        let e = g[0].all_gather(b"x").expect_err("gone");
        assert!(e.to_string().contains("rank 1"), "{e}");
        assert!(t.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn timeout_names_the_rank() {
        let mut g = InProcessCollective::group_with_timeout(2, Some(Duration::from_millis(50)));
        let e = net_err(g[0].all_gather(b"x"));
        assert!(
            matches!(&e, NetError::Timeout { peer, .. } if peer == "rank 1"),
            "{e}"
        );
        assert!(matches!(
            net_err(g[0].recv_from(0, 1)),
            NetError::Poisoned(_)
        ));
    }
}
