//! The trainer ranks of `demo --processes`: each builds and steps its FSDP `Shard(0)` block,
//! syncs through the lockstep gather, and the leader (rank 0) serves the frames and checks the
//! receivers' acks.

use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use deltacast::placement::{local_block, DTensorLayout, MeshPlacement};
use deltacast::sharded::{Collective, RankReport, RankSender, ShardedConfig};
use deltacast::slot_map::{ParamPlan, SlotMap};
use deltacast::WeightSender;
use deltacast::{FrameKind, SlotTable};
use deltacast_net::{Ack, FrameServer, NetError, TcpCollective};

use crate::output::hex64;
use crate::synthetic::{ModelShape, SyntheticModel};

use super::{
    env_u64, loopback, net_config, peak_rss_bytes, slot_map, tell_parent, ModelArgs, DONE,
};

/// Test hooks: the trainer rank `DIE_RANK` exits with status 9 in the middle of the sync of
/// step `DIE_AT_STEP`, after diffing, at its `DIE_AFTER_SENDS`-th transfer (default 0: the first).
const DIE_AT_STEP: &str = "DELTACAST_TEST_DIE_AT_STEP";
const DIE_RANK: &str = "DELTACAST_TEST_DIE_RANK";
const DIE_AFTER_SENDS: &str = "DELTACAST_TEST_DIE_AFTER_SENDS";

/// The TCP collective with the test hook that kills this rank mid-sync.
pub(crate) struct HookedCollective {
    pub(crate) inner: TcpCollective,
    /// `(sends to skip, sends made)` while the hook is armed for the current sync.
    pub(crate) die: Option<(u64, u64)>,
}

impl HookedCollective {
    /// Exits the process when the armed hook says so (test only).
    fn maybe_die(&mut self, at: &str) {
        if let Some((skip, made)) = &mut self.die {
            if *made >= *skip {
                eprintln!(
                    "test hook: rank {} exits with status 9 in the middle of the sync, at {at}",
                    self.inner.rank()
                );
                std::process::exit(9);
            }
            *made += 1;
        }
    }
}

impl Collective for HookedCollective {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world(&self) -> usize {
        self.inner.world()
    }
    fn all_gather(&mut self, mine: &[u8]) -> deltacast::Result<Vec<Vec<u8>>> {
        self.inner.all_gather(mine)
    }
    fn send_to_leader(&mut self, data: &[u8]) -> deltacast::Result<()> {
        self.maybe_die("its transfer to the leader");
        self.inner.send_to_leader(data)
    }
    fn recv_from(&mut self, rank: usize, len: usize) -> deltacast::Result<Vec<u8>> {
        self.maybe_die("a transfer from a rank");
        self.inner.recv_from(rank, len)
    }
    fn abort(&mut self, reason: &str) {
        self.inner.abort(reason);
    }
}

/// This rank's FSDP `Shard(0)` plan of every parameter over a mesh of `world` ranks.
pub(crate) fn fsdp_plans(map: &SlotMap, rank: usize, world: usize) -> Result<Vec<ParamPlan>> {
    (0..map.len())
        .map(|i| {
            let layout = DTensorLayout {
                mesh_shape: vec![world as u64],
                coords: vec![rank as u64],
                placements: vec![MeshPlacement::Shard { dim: 0 }],
                global_shape: map.param(i)?.shape.clone(),
            };
            Ok(map.plan(i, &local_block(&layout)?)?)
        })
        .collect()
}

/// The leader's end of the frame link.
struct Leader {
    server: FrameServer,
    receivers: usize,
}

pub(super) fn trainer(
    rank: usize,
    world: usize,
    gather: &str,
    frames: Option<&str>,
    receivers: usize,
    model_args: &ModelArgs,
) -> Result<()> {
    if world == 0 || rank >= world {
        bail!("rank {rank} of a world of {world}");
    }
    let shape = model_args.shape()?;
    let config = model_args.wire.config()?;
    let cfg = net_config(&model_args.wire)?;
    let gather = loopback(gather, "--gather")?;

    // Rendezvous first, then build: the leader's address must reach the parent quickly.
    let (inner, mut leader) = if rank == 0 {
        let frames = frames.context("the leader (rank 0) needs --frames")?;
        let rendezvous = TcpCollective::bind_leader(gather, world, cfg.clone())?;
        let server = FrameServer::bind(loopback(frames, "--frames")?, cfg.clone())?;
        tell_parent(
            "listen",
            &json!({
                "gather": rendezvous.local_addr().to_string(),
                "frames": server.local_addr().to_string(),
            }),
        );
        let inner = rendezvous
            .accept()
            .context("waiting for the trainer ranks to join")?;
        let mut leader = Leader { server, receivers };
        leader
            .server
            .wait_for_receivers(receivers, cfg.connect_timeout)
            .context("waiting for the receivers to connect")?;
        (inner, Some(leader))
    } else {
        let inner = TcpCollective::join(gather, rank, world, cfg.clone())
            .with_context(|| format!("rank {rank} joining the leader at {gather}"))?;
        (inner, None)
    };
    let mut link = HookedCollective { inner, die: None };

    let result = train_and_sync(
        rank,
        world,
        &shape,
        model_args,
        config,
        &mut link,
        &mut leader,
    );
    if let Err(e) = &result {
        let reason = format!("rank {rank} failed: {e:#}");
        // Tell the other ranks at once (no-op when the collective already failed and told them),
        // and drop the receivers so they discard any half-received sync.
        link.abort(&reason);
        if let Some(l) = &mut leader {
            for r in l.server.receivers() {
                l.server.disconnect(r.id, &reason);
            }
        }
    }
    result
}

fn train_and_sync(
    rank: usize,
    world: usize,
    shape: &ModelShape,
    model_args: &ModelArgs,
    config: deltacast::FlushConfig,
    link: &mut HookedCollective,
    leader: &mut Option<Leader>,
) -> Result<()> {
    let map = slot_map(shape)?;
    let table: SlotTable = map.table().clone();
    if table.hash() != shape.slot_table().hash() {
        bail!("the FSDP slot map and the model disagree on the slot table");
    }
    let plans = fsdp_plans(&map, rank, world)?;
    let runs = plans
        .iter()
        .map(|p| p.block().global_ranges().collect())
        .collect();
    let mut model = SyntheticModel::new_shard(shape, model_args.seed, runs, |_| {})?;
    let sharded = ShardedConfig {
        flush: config,
        round_bytes: config.bucket_size as u64,
    };
    let mut sender = RankSender::new(map, plans, sharded)?;
    let die_step = match (env_u64(DIE_AT_STEP)?, env_u64(DIE_RANK)?) {
        (Some(step), Some(r)) if r == rank as u64 => Some(step),
        _ => None,
    };
    let die_after = env_u64(DIE_AFTER_SENDS)?.unwrap_or(0);
    let full_bytes = table.total_bytes();
    let elements = table.total_elements();
    let mut all_ok = true;

    for step in 0..=model_args.steps {
        let mut train_ms = 0.0;
        if step > 0 {
            let t = Instant::now();
            model.step(model_args.lr, |_| {});
            train_ms = t.elapsed().as_secs_f64() * 1e3;
        }
        // Ranks finish their steps at different times; time the sync from when all are ready.
        link.all_gather(&[])
            .with_context(|| format!("step {step}: waiting for every rank to finish its step"))?;
        link.die = (die_step == Some(step)).then_some((die_after, 0));
        let started = Instant::now();
        let slices = model.slices();
        let next = sender.version() + 1;
        let (report, acks) = match leader {
            Some(l) => {
                let mut sent = 0u32;
                let server = &mut l.server;
                let report = sender
                    .sync(
                        link,
                        &slices,
                        Some(|frame: Vec<u8>| {
                            let r = server.broadcast(&frame)?;
                            if let Some((id, e)) = r.failed.first() {
                                return Err(deltacast::Error::IncompleteSync(format!(
                                    "{id} did not take flush {sent}: {e}"
                                )));
                            }
                            sent += 1;
                            Ok(())
                        }),
                    )
                    .with_context(|| {
                        format!(
                            "sync of version {next} (step {step}) failed after {sent} flush(es) \
                             reached the receivers"
                        )
                    })?;
                let acks = l.server.collect_acks();
                (report, Some(acks))
            }
            None => {
                let report = sender
                    .sync(link, &slices, None::<fn(Vec<u8>) -> deltacast::Result<()>>)
                    .with_context(|| format!("sync of version {next} (step {step}) failed"))?;
                (report, None)
            }
        };
        if link.die.is_some() {
            eprintln!("test hook: rank {rank} made no transfer in step {step}; exiting after it");
            std::process::exit(9);
        }
        let sync_ms = started.elapsed().as_secs_f64() * 1e3;
        let rss = peak_rss_bytes().unwrap_or(0);
        let rows = link
            .all_gather(&rss.to_le_bytes())
            .with_context(|| format!("step {step}: gathering memory figures"))?;
        let peak_rss: Vec<u64> = rows
            .iter()
            .map(|r| r.as_slice().try_into().map_or(0, u64::from_le_bytes))
            .collect();
        if let (Some(l), Some(acks)) = (leader.as_ref(), acks) {
            let (digest_ok, receiver_rss) = check_acks(&report, &acks, l.receivers)
                .with_context(|| format!("after the sync of version {next} (step {step})"))?;
            all_ok &= digest_ok;
            tell_parent(
                "step",
                &step_line(
                    step,
                    &report,
                    elements,
                    full_bytes,
                    sync_ms,
                    train_ms,
                    digest_ok,
                    world,
                    l.receivers,
                    &peak_rss,
                    &receiver_rss,
                )?,
            );
        }
    }
    if let Some(l) = leader {
        let reason = format!("{DONE} at version {}", sender.version());
        for r in l.server.receivers() {
            l.server.disconnect(r.id, &reason);
        }
    }
    if !all_ok {
        bail!("a receiver's digest or version differed from the trainer's (see above)");
    }
    Ok(())
}

/// Whether every receiver acked this sync with the leader's version and digest (a mismatch is
/// reported, and the run goes on as the one-process demo does), and their peak RSS. A receiver
/// that is gone is an error: the demo needs all of them.
pub(crate) fn check_acks(
    report: &RankReport,
    acks: &[(
        deltacast_net::ReceiverId,
        std::result::Result<Ack, NetError>,
    )],
    expected: usize,
) -> Result<(bool, Vec<u64>)> {
    let lost: Vec<String> = acks
        .iter()
        .filter_map(|(_, a)| a.as_ref().err().map(|e| e.to_string()))
        .collect();
    if !lost.is_empty() {
        bail!("lost a receiver: {}", lost.join("; "));
    }
    if acks.len() != expected {
        bail!("{} of {expected} receivers are still connected", acks.len());
    }
    let mut ok = true;
    let mut rss = Vec::new();
    for (id, a) in acks
        .iter()
        .filter_map(|(id, a)| Some((id, a.as_ref().ok()?)))
    {
        if a.ok && a.version == report.version && a.state_digest == report.state_digest {
            let r = serde_json::from_str::<Value>(&a.message)
                .ok()
                .and_then(|v| v["peak_rss_bytes"].as_u64());
            rss.push(r.unwrap_or(0));
        } else if a.ok {
            ok = false;
            eprintln!(
                "{id}: acked version {} digest {}, the trainer has {} {}",
                a.version,
                hex64(a.state_digest),
                report.version,
                hex64(report.state_digest)
            );
        } else {
            ok = false;
            eprintln!("{id}: sync failed at version {}: {}", a.version, a.message);
        }
    }
    Ok((ok, rss))
}

#[allow(clippy::too_many_arguments)]
fn step_line(
    step: u64,
    report: &RankReport,
    elements: u64,
    full_bytes: u64,
    sync_ms: f64,
    train_ms: f64,
    digest_ok: bool,
    trainers: usize,
    receivers: usize,
    peak_rss: &[u64],
    receiver_rss: &[u64],
) -> Result<Value> {
    let s = report
        .sync
        .as_ref()
        .context("the leader's report has no frame statistics")?;
    let g = &report.gather;
    let kind = if report.kind == FrameKind::Seed {
        "seed"
    } else {
        "delta"
    };
    Ok(json!({
        "step": step, "kind": kind, "version": report.version, "changed": g.changed,
        "elements": elements, "changed_fraction": g.changed as f64 / elements.max(1) as f64,
        "wire_bytes": s.wire_bytes, "full_bytes": full_bytes, "section_bytes": s.section_bytes,
        "flushes": s.flushes, "max_flush_bytes": s.max_flush_bytes, "chunks": s.chunks,
        "codecs": s.codecs, "sync_ms": sync_ms, "train_ms": train_ms, "digest_ok": digest_ok,
        "gather_rounds": g.rounds, "gather_sub_rounds": g.sub_rounds,
        "gathered_bytes": g.gathered_bytes, "gathered_payload": g.gathered_payload,
        "gather_ratio": (g.gathered_payload > 0)
            .then(|| g.gathered_bytes as f64 / g.gathered_payload as f64),
        "matrix_bytes": g.matrix_bytes, "trainers": trainers, "receivers": receivers,
        "peak_rss_bytes": peak_rss, "receiver_peak_rss_bytes": receiver_rss,
    }))
}
