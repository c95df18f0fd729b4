//! A trainer rank of the bench: its shard, one sender per delta method, the bare diff timing
//! and, on the leader, the frame servers and the parent's commands.

use std::io::BufRead;
use std::net::{IpAddr, SocketAddr};
use std::sync::mpsc::{channel, sync_channel, Receiver as ChannelRx};
use std::thread;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::{json, Value};

use deltacast::diff::{diff_and_refresh, Changes};
use deltacast::digest::digest_range;
use deltacast::sharded::{Collective, RankReport, RankSender, ShardedConfig};
use deltacast::slot_map::{ParamPlan, SlotMap};
use deltacast::{FrameKind, SlotTable};
use deltacast_net::{FrameServer, NetConfig, TcpCollective};

use super::{bench_addr, BenchModel, Method, FULL_HEADER, FULL_MAGIC};
use crate::output::hex64;
use crate::processes::{
    check_acks, exit_when_parent_goes, fsdp_plans, peak_rss_bytes, slot_map, tell_parent,
    HookedCollective, DONE,
};
use crate::synthetic::{ModelShape, SyntheticModel};

/// Command codes the leader hands the other ranks.
const CMD_SEED: u8 = 1;
const CMD_STEP: u8 = 2;
const CMD_QUIT: u8 = 3;

/// The parent's commands, one per line; the process exits when stdin closes (parent gone).
fn command_lines() -> ChannelRx<String> {
    let (tx, rx) = channel();
    thread::spawn(move || {
        for line in std::io::stdin().lock().lines().map_while(|l| l.ok()) {
            if tx.send(line.trim().to_string()).is_err() {
                return;
            }
        }
        use std::io::Write;
        let _ = writeln!(std::io::stderr(), "the parent process went away; exiting");
        std::process::exit(3);
    });
    rx
}

struct Trainer {
    rank: usize,
    world: usize,
    link: HookedCollective,
    /// Leader only: one frame server per method, in method order.
    servers: Vec<FrameServer>,
    receivers: usize,
    methods: Vec<Method>,
    model: SyntheticModel,
    /// One sender per method (`None` for `full`).
    senders: Vec<Option<RankSender>>,
    /// The previous step's shard, for timing the bare diff.
    diff_snapshot: Vec<Vec<u8>>,
    /// Bytes of every rank's piece of every parameter: `piece_bytes[rank][param]`.
    piece_bytes: Vec<Vec<u64>>,
    /// This rank's first global element of every parameter (its block is one run).
    first_elem: Vec<u64>,
    slot_ids: Vec<u32>,
    table: SlotTable,
    full_bucket: usize,
    lr: f32,
    step: u64,
}

pub(super) fn trainer(
    rank: usize,
    world: usize,
    gather: &str,
    frames: Option<&str>,
    receivers: usize,
    args: &BenchModel,
) -> Result<()> {
    if world == 0 || rank >= world {
        bail!("rank {rank} of a world of {world}");
    }
    let shape = args.shape()?;
    let methods = args.methods()?;
    let gather = bench_addr(gather, "--gather")?;
    let cfg = NetConfig::from_env_or_file(None)?;
    let (inner, servers, commands) = if rank == 0 {
        let ip: IpAddr = frames
            .context("the leader (rank 0) needs --frames")?
            .parse()
            .context("--frames must be an IP address")?;
        bench_addr(&SocketAddr::new(ip, 0).to_string(), "--frames")?;
        let rendezvous = TcpCollective::bind_leader(gather, world, cfg.clone())?;
        let mut servers = Vec::new();
        for m in &methods {
            servers.push(FrameServer::bind(
                SocketAddr::new(ip, 0),
                args.net_config(m)?,
            )?);
        }
        tell_parent(
            "listen",
            &json!({
                "gather": rendezvous.local_addr().to_string(),
                "frames": servers.iter().map(|s| s.local_addr().to_string()).collect::<Vec<_>>(),
            }),
        );
        let commands = command_lines();
        let inner = rendezvous
            .accept()
            .context("waiting for the trainer ranks to join")?;
        for s in &mut servers {
            s.wait_for_receivers(receivers, cfg.connect_timeout)
                .context("waiting for the receivers to connect")?;
        }
        (inner, servers, Some(commands))
    } else {
        exit_when_parent_goes();
        let inner = TcpCollective::join(gather, rank, world, cfg.clone())
            .with_context(|| format!("rank {rank} joining the leader at {gather}"))?;
        (inner, Vec::new(), None)
    };
    let link = HookedCollective { inner, die: None };
    let mut t = Trainer::new(rank, world, link, servers, receivers, methods, &shape, args)?;
    let result = t.serve(commands.as_ref());
    if let Err(e) = &result {
        let reason = format!("rank {rank} failed: {e:#}");
        t.link.abort(&reason);
        for s in &mut t.servers {
            for r in s.receivers() {
                s.disconnect(r.id, &reason);
            }
        }
    }
    result
}

impl Trainer {
    #[allow(clippy::too_many_arguments)]
    fn new(
        rank: usize,
        world: usize,
        link: HookedCollective,
        servers: Vec<FrameServer>,
        receivers: usize,
        methods: Vec<Method>,
        shape: &ModelShape,
        args: &BenchModel,
    ) -> Result<Self> {
        let map: SlotMap = slot_map(shape)?;
        let table = map.table().clone();
        let all_plans: Vec<Vec<ParamPlan>> = (0..world)
            .map(|r| fsdp_plans(&map, r, world))
            .collect::<Result<_>>()?;
        // The full broadcast concatenates rank pieces: each must be one run, in rank order.
        let mut first_elem = Vec::new();
        let mut slot_ids = Vec::new();
        for p in 0..map.len() {
            let slot = all_plans[0][p].slot_ids();
            if slot.len() != 1 {
                bail!(
                    "parameter {p} maps to {} slots; the bench needs one",
                    slot.len()
                );
            }
            slot_ids.push(slot.start);
            let mut next = 0u64;
            for (r, plans) in all_plans.iter().enumerate() {
                let runs: Vec<(u64, u64)> = plans[p].block().global_ranges().collect();
                let start = match runs.as_slice() {
                    [] => next,
                    [(s, _)] => *s,
                    _ => bail!("rank {r}'s piece of parameter {p} is not one contiguous run"),
                };
                if start != next {
                    bail!(
                        "rank {r}'s piece of parameter {p} does not follow rank {}'s",
                        r.max(1) - 1
                    );
                }
                if r == rank {
                    first_elem.push(start);
                }
                next = start + runs.first().map_or(0, |r| r.1);
            }
            if next != table.slots()[slot.start as usize].numel() {
                bail!("the ranks' pieces of parameter {p} do not cover it");
            }
        }
        let piece_bytes = all_plans
            .iter()
            .map(|plans| {
                plans
                    .iter()
                    .map(|pl| {
                        pl.block().numel()
                            * table.slots()[pl.slot_ids().start as usize].dtype.width() as u64
                    })
                    .collect()
            })
            .collect();
        let runs = all_plans[rank]
            .iter()
            .map(|p| p.block().global_ranges().collect())
            .collect();
        let model = SyntheticModel::new_shard(shape, args.seed, runs, |_| {})?;
        let mut senders = Vec::new();
        for m in &methods {
            senders.push(match m {
                Method::Full => None,
                Method::Delta { config, .. } => Some(RankSender::new(
                    map.clone(),
                    all_plans[rank].clone(),
                    ShardedConfig {
                        flush: *config,
                        round_bytes: config.bucket_size as u64,
                    },
                )?),
            });
        }
        Ok(Trainer {
            rank,
            world,
            link,
            servers,
            receivers,
            methods,
            model,
            senders,
            diff_snapshot: Vec::new(),
            piece_bytes,
            first_elem,
            slot_ids,
            table,
            full_bucket: usize::try_from(args.full_bucket_size.bytes())?,
            lr: args.lr,
            step: 0,
        })
    }

    fn leader(&self) -> bool {
        self.rank == 0
    }

    fn barrier(&mut self, what: &str) -> Result<()> {
        self.link
            .all_gather(&[])
            .with_context(|| format!("waiting for every rank: {what}"))?;
        Ok(())
    }

    fn serve(&mut self, commands: Option<&ChannelRx<String>>) -> Result<()> {
        if self.leader() {
            tell_parent("built", &json!({ "peak_rss_bytes": peak_rss_bytes() }));
        }
        loop {
            let mine = match commands {
                Some(rx) => match rx
                    .recv()
                    .map_err(|_| anyhow!("the command reader stopped"))?
                    .as_str()
                {
                    "seed" => CMD_SEED,
                    "step" => CMD_STEP,
                    "quit" => CMD_QUIT,
                    other => bail!("unknown command `{other}`"),
                },
                None => 0,
            };
            let rows = self
                .link
                .all_gather(&[mine])
                .context("waiting for the next command")?;
            match rows.first().and_then(|r| r.first()).copied() {
                Some(CMD_SEED) => self.seed()?,
                Some(CMD_STEP) => self.take_step()?,
                Some(CMD_QUIT) => break,
                other => bail!("bad command {other:?} from the leader"),
            }
        }
        for s in &mut self.servers {
            let reason = format!("{DONE} (bench)");
            for r in s.receivers() {
                s.disconnect(r.id, &reason);
            }
        }
        Ok(())
    }

    /// Seeds every delta method's receivers state (not timed against the link).
    fn seed(&mut self) -> Result<()> {
        let mut lines = Vec::new();
        for i in 0..self.methods.len() {
            if matches!(self.methods[i], Method::Full) {
                continue;
            }
            self.barrier("before a seed")?;
            let started = Instant::now();
            let (report, ok, _) = self.delta_sync(i, started)?;
            if report.kind != FrameKind::Seed {
                bail!(
                    "the first sync of {} was not a seed",
                    self.methods[i].name()
                );
            }
            lines.push(json!({
                "method": self.methods[i].name(),
                "sync_ms": started.elapsed().as_secs_f64() * 1e3,
                "wire_bytes": report.sync.as_ref().map(|s| s.wire_bytes),
                "digest_ok": ok,
            }));
            if !ok {
                bail!(
                    "a receiver's digest differed after the seed of {}",
                    self.methods[i].name()
                );
            }
        }
        self.diff_snapshot = self.model.weights.clone();
        if self.leader() {
            tell_parent(
                "seeded",
                &json!({ "methods": lines, "peak_rss_bytes": peak_rss_bytes() }),
            );
        }
        Ok(())
    }

    /// One deltacast sync of method `i`, acked by every receiver; `(report, digests ok,
    /// timings)`: on the leader, when the last flush was ready and when it was written, counted
    /// from `started`, and the slowest receiver's time in `receive` (all flushes / the last).
    fn delta_sync(&mut self, i: usize, started: Instant) -> Result<(RankReport, bool, Value)> {
        let name = self.methods[i].name();
        let sender = self.senders[i]
            .as_mut()
            .ok_or_else(|| anyhow!("{name} has no sender"))?;
        let slices = self.model.slices();
        let link = &mut self.link;
        if self.rank == 0 {
            let server = &mut self.servers[i];
            let mut sent = 0u32;
            let (mut ready_ms, mut written_ms) = (0.0, 0.0);
            let ms = |t: Instant| t.duration_since(started).as_secs_f64() * 1e3;
            let report = sender
                .sync(
                    link,
                    &slices,
                    Some(|frame: Vec<u8>| {
                        ready_ms = ms(Instant::now());
                        let r = server.broadcast(&frame)?;
                        written_ms = ms(Instant::now());
                        if let Some((id, e)) = r.failed.first() {
                            return Err(deltacast::Error::IncompleteSync(format!(
                                "{id} did not take flush {sent}: {e}"
                            )));
                        }
                        sent += 1;
                        Ok(())
                    }),
                )
                .with_context(|| format!("{name}: sync failed after {sent} flush(es)"))?;
            let acks = server.collect_acks();
            let acked_ms = ms(Instant::now());
            let (ok, _) = check_acks(&report, &acks, self.receivers)
                .with_context(|| format!("{name}: after the sync of version {}", report.version))?;
            let slowest = |k: &str| {
                acks.iter()
                    .filter_map(|(_, a)| a.as_ref().ok())
                    .filter_map(|a| serde_json::from_str::<Value>(&a.message).ok()?[k].as_f64())
                    .fold(0.0, f64::max)
            };
            let timing = json!({
                "last_flush_ready_ms": ready_ms, "last_flush_written_ms": written_ms,
                "acked_ms": acked_ms, "receiver_receive_ms": slowest("receive_ms"),
                "receiver_last_flush_ms": slowest("last_flush_ms"),
            });
            Ok((report, ok, timing))
        } else {
            let report = sender
                .sync(link, &slices, None::<fn(Vec<u8>) -> deltacast::Result<()>>)
                .with_context(|| format!("{name}: sync failed"))?;
            Ok((report, true, Value::Null))
        }
    }

    fn take_step(&mut self) -> Result<()> {
        if self.diff_snapshot.is_empty() {
            bail!("`step` before `seed`");
        }
        self.step += 1;
        let t = Instant::now();
        let local_changed = self.model.step(self.lr, |_| {});
        let train_ms = t.elapsed().as_secs_f64() * 1e3;

        // The bare diff of this rank's shard against the previous step, all ranks at once.
        self.barrier("before the diff timing")?;
        let t = Instant::now();
        let mut changes = Changes::default();
        let mut diffed = 0u64;
        for (snap, cur) in self.diff_snapshot.iter_mut().zip(&self.model.weights) {
            changes.clear();
            diff_and_refresh(snap, cur, 2, 0, &mut changes);
            diffed += changes.len() as u64;
        }
        let diff_ms = t.elapsed().as_secs_f64() * 1e3;
        if diffed != local_changed {
            bail!("the timing diff found {diffed} changes, the step made {local_changed}");
        }
        let mut row = diff_ms.to_le_bytes().to_vec();
        row.extend_from_slice(&diffed.to_le_bytes());
        let rows = self
            .link
            .all_gather(&row)
            .context("gathering the diff times")?;
        let f = |r: &Vec<u8>, at: usize| -> [u8; 8] { r[at..at + 8].try_into().unwrap_or([0; 8]) };
        let diff_ms_ranks: Vec<f64> = rows.iter().map(|r| f64::from_le_bytes(f(r, 0))).collect();
        let changed: u64 = rows.iter().map(|r| u64::from_le_bytes(f(r, 8))).sum();

        let n = self.methods.len();
        let order: Vec<usize> = (0..n).map(|k| (k + self.step as usize) % n).collect();
        let mut results = Vec::new();
        for i in order {
            self.barrier("before a timed sync")?;
            let started = Instant::now();
            let line = match self.methods[i] {
                Method::Full => {
                    let (wire, flushes) = self.full_sync(i)?;
                    let sync_ms = started.elapsed().as_secs_f64() * 1e3;
                    let ok = self.check_full(i)?;
                    json!({ "method": "full", "sync_ms": sync_ms, "wire_bytes": wire,
                            "flushes": flushes, "digest_ok": ok })
                }
                Method::Delta { .. } => {
                    let (report, ok, timing) = self.delta_sync(i, started)?;
                    let sync_ms = started.elapsed().as_secs_f64() * 1e3;
                    let s = report.sync.as_ref();
                    json!({ "method": self.methods[i].name(), "sync_ms": sync_ms,
                            "kind": if report.kind == FrameKind::Seed { "seed" } else { "delta" },
                            "wire_bytes": s.map(|s| s.wire_bytes), "flushes": s.map(|s| s.flushes),
                            "changed": report.gather.changed, "codecs": s.map(|s| &s.codecs),
                            "gathered_bytes": report.gather.gathered_bytes, "digest_ok": ok,
                            "timing": timing })
                }
            };
            results.push(line);
        }
        let rss = peak_rss_bytes().unwrap_or(0);
        let rows = self
            .link
            .all_gather(&rss.to_le_bytes())
            .context("gathering memory figures")?;
        if self.leader() {
            let peak: Vec<u64> = rows.iter().map(|r| u64::from_le_bytes(f(r, 0))).collect();
            let elements = self.table.total_elements();
            tell_parent(
                "step",
                &json!({
                    "step": self.step, "changed": changed, "elements": elements,
                    "changed_fraction": changed as f64 / elements.max(1) as f64,
                    "full_bytes": self.table.total_bytes(),
                    "diff_ms": diff_ms_ranks.iter().copied().fold(0.0, f64::max),
                    "diff_ms_ranks": diff_ms_ranks, "train_ms": train_ms,
                    "methods": results, "peak_rss_bytes": peak,
                }),
            );
        }
        Ok(())
    }

    /// The full broadcast of the current weights; returns (wire bytes, frames).
    fn full_sync(&mut self, i: usize) -> Result<(u64, u32)> {
        let world = self.world;
        if self.rank != 0 {
            for (p, w) in self.model.weights.iter().enumerate() {
                if self.piece_bytes[self.rank][p] > 0 {
                    self.link
                        .send_to_leader(w)
                        .with_context(|| format!("full broadcast: sending parameter {p}"))?;
                }
            }
            return Ok((0, 0));
        }
        let total = self.table.total_bytes();
        let cap = self.full_bucket;
        let step = self.step;
        let frame = |index: u32, offset: u64| {
            let mut f = Vec::with_capacity(FULL_HEADER + cap);
            f.extend_from_slice(FULL_MAGIC);
            f.extend_from_slice(&step.to_le_bytes());
            f.extend_from_slice(&index.to_le_bytes());
            f.extend_from_slice(&[0u8; 4]);
            f.extend_from_slice(&offset.to_le_bytes());
            f
        };
        let server = &mut self.servers[i];
        let link = &mut self.link;
        let weights = &self.model.weights;
        let piece_bytes = &self.piece_bytes;
        let (tx, rx) = sync_channel::<Vec<u8>>(1);
        let (wire, frames, produced) = thread::scope(|s| {
            let sender = s.spawn(move || -> Result<(u64, u32)> {
                let (mut wire, mut frames) = (0u64, 0u32);
                for f in rx {
                    let r = server.broadcast(&f)?;
                    if let Some((id, e)) = r.failed.first() {
                        bail!("full broadcast: {id} did not take bucket {frames}: {e}");
                    }
                    wire += f.len() as u64;
                    frames += 1;
                }
                Ok((wire, frames))
            });
            let produce = || -> Result<()> {
                let (mut index, mut offset) = (0u32, 0u64);
                let mut cur = frame(0, 0);
                for p in 0..weights.len() {
                    for (r, lens) in piece_bytes.iter().enumerate().take(world) {
                        let len = lens[p] as usize;
                        if len == 0 {
                            continue;
                        }
                        let got;
                        let piece: &[u8] = if r == 0 {
                            &weights[p]
                        } else {
                            got = link.recv_from(r, len).with_context(|| {
                                format!("full broadcast: parameter {p} from rank {r}")
                            })?;
                            &got
                        };
                        let mut rest = piece;
                        while !rest.is_empty() {
                            let room = cap - (cur.len() - FULL_HEADER);
                            let take = room.min(rest.len());
                            cur.extend_from_slice(&rest[..take]);
                            rest = &rest[take..];
                            offset += take as u64;
                            if cur.len() - FULL_HEADER == cap {
                                if offset == total {
                                    cur[20] = 1;
                                }
                                tx.send(std::mem::replace(&mut cur, frame(index + 1, offset)))
                                    .map_err(|_| anyhow!("the broadcast thread stopped"))?;
                                index += 1;
                            }
                        }
                    }
                }
                if offset != total {
                    bail!("full broadcast: gathered {offset} of {total} bytes");
                }
                if cur.len() > FULL_HEADER {
                    cur[20] = 1;
                    tx.send(cur)
                        .map_err(|_| anyhow!("the broadcast thread stopped"))?;
                }
                drop(tx);
                Ok(())
            };
            let produced = produce();
            let sent = sender
                .join()
                .map_err(|_| anyhow!("the broadcast thread panicked"))?;
            let (wire, frames) = sent?;
            Ok::<_, anyhow::Error>((wire, frames, produced))
        })?;
        produced?;
        // Every receiver acks the last bucket once it holds the whole model.
        let acks = self.servers[i].collect_acks();
        for (id, a) in &acks {
            match a {
                Ok(a) if a.ok && a.version == step => {}
                Ok(a) => bail!(
                    "full broadcast: {id} answered {:?} for step {step}: {}",
                    a.version,
                    a.message
                ),
                Err(e) => bail!("full broadcast: lost {id}: {e}"),
            }
        }
        if acks.len() != self.receivers {
            bail!(
                "full broadcast: {} of {} receivers acked",
                acks.len(),
                self.receivers
            );
        }
        Ok((wire, frames))
    }

    /// After the timed full broadcast: every receiver's digest of what it holds against the
    /// ranks' digest of their shards.
    fn check_full(&mut self, i: usize) -> Result<bool> {
        let mut mine = 0u64;
        for (p, w) in self.model.weights.iter().enumerate() {
            mine = mine.wrapping_add(digest_range(self.slot_ids[p], 2, w, self.first_elem[p]));
        }
        let rows = self
            .link
            .all_gather(&mine.to_le_bytes())
            .context("gathering digests")?;
        if self.rank != 0 {
            return Ok(true);
        }
        let expect = rows.iter().fold(0u64, |a, r| {
            a.wrapping_add(u64::from_le_bytes(r[..8].try_into().unwrap_or([0; 8])))
        });
        let mut ok = true;
        for (id, a) in self.servers[i].collect_acks() {
            match a {
                Ok(a) if a.ok && a.version == self.step && a.state_digest == expect => {}
                Ok(a) => {
                    ok = false;
                    eprintln!(
                        "full broadcast: {id} holds digest {} at step {}, the trainer {} at {}",
                        hex64(a.state_digest),
                        a.version,
                        hex64(expect),
                        self.step
                    );
                }
                Err(e) => bail!("full broadcast: lost {id} before its digest: {e}"),
            }
        }
        Ok(ok)
    }
}
