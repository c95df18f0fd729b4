//! `deltacast demo --processes`: every trainer rank and every receiver is its own OS process,
//! joined over loopback TCP, so the sharded trainer side runs as it would across machines.
//!
//! The parent spawns this same binary with the hidden `worker` subcommands:
//!
//! - `worker trainer --rank 0` (the leader) binds the gather collective and the frame server on
//!   port 0 and prints their addresses; the parent then starts ranks `1..N` and the receivers
//!   with those addresses.
//! - Every rank builds and steps only its FSDP `Shard(0)` block of each tensor, and syncs through
//!   [`RankSender`] (lockstep gather to the leader); the leader broadcasts each frame to the
//!   receivers, collects their acks and checks them against its state digest.
//! - `worker receiver` applies frames with [`deltacast::Receiver`] and acks every sync.
//!
//! Children talk to the parent through tagged lines on stdout (`@deltacast KIND {json}`); their
//! stderr is passed through prefixed with their role. A random shared secret authenticates every
//! connection (`DELTACAST_SECRET`, never on a command line); servers bind 127.0.0.1 only. Each
//! child exits when its stdin closes, so no process outlives the parent even when the parent is
//! killed; the parent kills the remaining children by PID when one fails and the others have not
//! exited within a grace period.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender as ChannelTx};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::{json, Value};

use deltacast::convert::{ParamPlan, ParamSpec, SlotMap};
use deltacast::gather::{GatherLink, RankReport, RankSender, ShardedConfig};
use deltacast::placement::{local_block, DTensorLayout, MeshPlacement};
use deltacast::{FrameKind, Receiver, SlotTable};
use deltacast_net::{
    Ack, Collective, FrameClient, FrameServer, NetConfig, NetError, TcpCollective,
};

use crate::output::{bytes, json_line};
use crate::synthetic::{preset, ModelShape, SyntheticModel, PRESETS};
use crate::WireArgs;

/// Prefix of the lines children write to stdout for the parent.
pub(crate) const TAG: &str = "@deltacast ";
/// Reason the leader gives receivers when the run ended well (they then exit 0).
pub(crate) const DONE: &str = "demo finished";
/// How long the others get to exit on their own after one process failed.
const GRACE: Duration = Duration::from_secs(5);
/// How long the leader may take to report its addresses.
const LISTEN_LIMIT: Duration = Duration::from_secs(60);
/// Test hooks: the trainer rank `DIE_RANK` exits with status 9 in the middle of the sync of
/// step `DIE_AT_STEP`, after diffing, at its `DIE_AFTER_SENDS`-th transfer (default 0: the first).
const DIE_AT_STEP: &str = "DELTACAST_TEST_DIE_AT_STEP";
const DIE_RANK: &str = "DELTACAST_TEST_DIE_RANK";
const DIE_AFTER_SENDS: &str = "DELTACAST_TEST_DIE_AFTER_SENDS";

/// What every process of one run is started with: the model, the steps and the wire settings
/// (which all must agree on), and whether to exit when stdin closes.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Exit when stdin closes: the parent holds it open, so a worker never outlives it.
    #[arg(long)]
    watch_stdin: bool,
    #[arg(long)]
    preset: String,
    #[arg(long)]
    layers: Option<u64>,
    #[arg(long)]
    steps: u64,
    #[arg(long)]
    lr: f32,
    #[arg(long)]
    seed: u64,
    #[command(flatten)]
    wire: WireArgs,
}

impl ModelArgs {
    fn shape(&self) -> Result<ModelShape> {
        let Some(mut shape) = preset(&self.preset) else {
            let names: Vec<_> = PRESETS.iter().map(|p| p.name).collect();
            bail!(
                "unknown preset `{}` (choose one of {})",
                self.preset,
                names.join(", ")
            );
        };
        if let Some(layers) = self.layers {
            shape.layers = layers;
        }
        Ok(shape)
    }

    /// The same settings as command-line arguments (`--key=value`, so negative numbers parse).
    fn to_args(&self) -> Vec<String> {
        let mut a = vec![
            "--watch-stdin".to_string(),
            format!("--preset={}", self.preset),
            format!("--steps={}", self.steps),
            format!("--lr={}", self.lr),
            format!("--seed={}", self.seed),
            format!("--bucket-size={}", self.wire.bucket_size),
            format!("--codec={}", self.wire.codec),
            format!("--chunk-elems={}", self.wire.chunk_elems),
        ];
        if let Some(l) = self.layers {
            a.push(format!("--layers={l}"));
        }
        a
    }
}

/// The hidden `deltacast worker …` processes of `demo --processes`.
#[derive(Subcommand, Debug)]
pub enum WorkerRole {
    /// One trainer rank; rank 0 also serves frames to the receivers.
    Trainer {
        #[arg(long)]
        rank: usize,
        #[arg(long)]
        world: usize,
        /// Rank 0: the address to bind (port 0 for any); others: the leader's address.
        #[arg(long)]
        gather: String,
        /// Rank 0: the frame server's address to bind.
        #[arg(long)]
        frames: Option<String>,
        /// Rank 0: receivers to wait for.
        #[arg(long, default_value_t = 0)]
        receivers: usize,
        #[command(flatten)]
        model: ModelArgs,
    },
    /// One receiver.
    Receiver {
        #[arg(long)]
        index: usize,
        /// The leader's frame server.
        #[arg(long)]
        frames: String,
        #[command(flatten)]
        model: ModelArgs,
    },
}

/// Entry point of `deltacast worker …`.
pub fn worker(role: WorkerRole) -> Result<()> {
    let (WorkerRole::Trainer { model, .. } | WorkerRole::Receiver { model, .. }) = &role;
    if model.watch_stdin {
        exit_when_parent_goes();
    }
    match role {
        WorkerRole::Trainer {
            rank,
            world,
            gather,
            frames,
            receivers,
            model,
        } => trainer(rank, world, &gather, frames.as_deref(), receivers, &model),
        WorkerRole::Receiver {
            index,
            frames,
            model,
        } => receiver(index, &frames, &model),
    }
}

// ---------------------------------------------------------------------------------------------
// Shared by every process.

/// Writes one tagged line for the parent.
pub(crate) fn tell_parent(kind: &str, body: &Value) {
    let mut out = std::io::stdout().lock();
    // A parent that went away is noticed by the stdin watch; nothing to do here.
    let _ = writeln!(out, "{TAG}{kind} {body}");
    let _ = out.flush();
}

/// The parent holds our stdin open; when it closes (the parent exited or was killed) we go too,
/// so no worker outlives the run.
pub(crate) fn exit_when_parent_goes() {
    thread::spawn(|| {
        let mut buf = [0u8; 64];
        let mut stdin = std::io::stdin();
        loop {
            match stdin.read(&mut buf) {
                Ok(0) | Err(_) => {
                    // Not eprintln!: with the parent gone stderr may be a broken pipe, and a
                    // panic here would keep the process alive.
                    let _ = writeln!(std::io::stderr(), "the parent process went away; exiting");
                    std::process::exit(3);
                }
                Ok(_) => {}
            }
        }
    });
}

/// Peak resident set size of this process (VmHWM), where /proc says it.
pub(crate) fn peak_rss_bytes() -> Option<u64> {
    proc_status_bytes("VmHWM:")
}

/// A size field (`VmRSS:`, `VmHWM:`, …) of /proc/self/status, in bytes.
pub(crate) fn proc_status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kb: u64 = line
        .trim_start_matches(field)
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// Every tensor as one parameter named like its slot: what the trainer ranks shard and the
/// receivers hold.
pub(crate) fn slot_map(shape: &ModelShape) -> Result<SlotMap> {
    let params = shape
        .slot_table()
        .slots()
        .iter()
        .map(|s| ParamSpec::identity(s.name.clone(), s.shape.clone(), s.dtype))
        .collect();
    Ok(SlotMap::new(params)?)
}

/// Timeouts and limits of every link; the secret comes from `DELTACAST_SECRET`.
fn net_config(wire: &WireArgs) -> Result<NetConfig> {
    Ok(NetConfig::from_env_or_file(None)?.with_bucket_size(wire.bucket_size))
}

fn loopback(addr: &str, what: &str) -> Result<SocketAddr> {
    let a: SocketAddr = addr
        .parse()
        .with_context(|| format!("{what} `{addr}` is not an IP:port address"))?;
    if !a.ip().is_loopback() {
        bail!("{what} {a} is not a loopback address: the demo serves on 127.0.0.1 only");
    }
    Ok(a)
}

fn env_u64(name: &str) -> Result<Option<u64>> {
    match std::env::var(name) {
        Err(_) => Ok(None),
        Ok(v) => v
            .trim()
            .parse()
            .map(Some)
            .with_context(|| format!("{name}=`{v}` is not a number")),
    }
}

// ---------------------------------------------------------------------------------------------
// Trainer ranks.

/// A [`GatherLink`] over the TCP collective, with the test hook that kills this rank mid-sync.
pub(crate) struct NetLink {
    pub(crate) inner: TcpCollective,
    /// `(sends to skip, sends made)` while the hook is armed for the current sync.
    pub(crate) die: Option<(u64, u64)>,
}

pub(crate) fn net(e: NetError) -> deltacast::Error {
    // NetError messages name the peer (rank, receiver or leader, with its address).
    deltacast::Error::IncompleteSync(e.to_string())
}

impl NetLink {
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

impl GatherLink for NetLink {
    fn rank(&self) -> usize {
        self.inner.rank()
    }
    fn world(&self) -> usize {
        self.inner.world()
    }
    fn all_gather(&mut self, mine: &[u8]) -> deltacast::Result<Vec<Vec<u8>>> {
        self.inner.all_gather(mine).map_err(net)
    }
    fn send_to_leader(&mut self, data: &[u8]) -> deltacast::Result<()> {
        self.maybe_die("its transfer to the leader");
        self.inner.send_to_leader(data).map_err(net)
    }
    fn recv_from(&mut self, rank: usize, len: usize) -> deltacast::Result<Vec<u8>> {
        self.maybe_die("a transfer from a rank");
        self.inner.recv_from(rank, len).map_err(net)
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

fn trainer(
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
    let mut link = NetLink { inner, die: None };

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
        link.inner.abort(&reason);
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
    link: &mut NetLink,
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
                            let r = server.broadcast(&frame).map_err(net)?;
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
                "{id}: acked version {} digest {:016x}, the trainer has {} {:016x}",
                a.version, a.state_digest, report.version, report.state_digest
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

// ---------------------------------------------------------------------------------------------
// Receivers.

fn receiver(index: usize, frames: &str, model_args: &ModelArgs) -> Result<()> {
    let shape = model_args.shape()?;
    let table = slot_map(&shape)?.table().clone();
    let cfg = net_config(&model_args.wire)?;
    let frames = loopback(frames, "--frames")?;
    let mut client = FrameClient::connect(frames, None, 0, cfg)
        .with_context(|| format!("receiver {index}: connecting to the leader at {frames}"))?;
    let mut receiver = Receiver::new(table);
    // After a failed flush the rest of that sync is refused too; ack each failed sync once.
    let mut reported = false;
    let end: std::result::Result<String, String> = loop {
        let frame = match client.recv_frame() {
            Ok(f) => f,
            Err(NetError::Aborted { reason, .. }) if reason.starts_with(DONE) => break Ok(reason),
            Err(e) => break Err(e.to_string()),
        };
        if deltacast::wire::peek_header(&frame).is_ok_and(|h| h.flush_index == 0) {
            reported = false;
        }
        let ack = match receiver.receive(&frame) {
            Ok(None) => continue,
            Ok(Some(outcome)) => Ack {
                version: outcome.version,
                state_digest: outcome.state_digest,
                ok: true,
                message: json!({ "peak_rss_bytes": peak_rss_bytes() }).to_string(),
            },
            Err(_) if reported => continue,
            Err(e) => {
                reported = true;
                Ack {
                    version: receiver.version().unwrap_or(0),
                    state_digest: receiver.state_digest(),
                    ok: false,
                    message: e.to_string(),
                }
            }
        };
        if let Err(e) = client.send_ack(&ack) {
            break Err(e.to_string());
        }
    };
    // Whatever happened, a half-received sync is dropped: the state stays at the last version.
    let dropped = receiver.is_staging();
    receiver.abort_sync();
    let mismatched = receiver.recompute_digests().len();
    let version = receiver.version();
    tell_parent(
        "receiver-exit",
        &json!({
            "index": index, "version": version, "state_digest": receiver.state_digest(),
            "dropped_staged_sync": dropped, "recomputed_mismatches": mismatched,
            "error": end.as_ref().err(), "peak_rss_bytes": peak_rss_bytes(),
        }),
    );
    let at = match version {
        Some(v) => format!("version {v}"),
        None => "no version (never seeded)".into(),
    };
    match end {
        Ok(_) if mismatched == 0 => Ok(()),
        Ok(_) => bail!("receiver {index}: {mismatched} slots differ from their running digest"),
        Err(e) => bail!(
            "receiver {index}: {e}; stays at {at}{}",
            if dropped {
                " (dropped the half-received next sync)"
            } else {
                ""
            }
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// The parent.

/// What `demo --processes` needs from the demo's options.
pub struct ProcessDemo {
    pub preset: String,
    pub layers: Option<u64>,
    pub steps: u64,
    pub lr: f32,
    pub seed: u64,
    pub wire: WireArgs,
    pub trainers: usize,
    pub receivers: usize,
    pub json: bool,
}

/// A line a child tagged for the parent.
struct Event {
    role: String,
    kind: String,
    body: Value,
}

struct Member {
    role: String,
    child: Child,
    /// Held open: the child exits when it closes.
    _stdin: Option<ChildStdin>,
    status: Option<ExitStatus>,
}

/// The children of one run; dropping it kills and reaps every child still running.
struct Fleet {
    exe: std::path::PathBuf,
    secret: String,
    members: Vec<Member>,
    readers: Vec<JoinHandle<()>>,
    events: ChannelTx<Event>,
}

impl Fleet {
    fn spawn(&mut self, role: &str, args: Vec<String>) -> Result<()> {
        let mut child = Command::new(&self.exe)
            .args(&args)
            .env(deltacast_net::SECRET_ENV, &self.secret)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {role} ({})", self.exe.display()))?;
        let stdin = child.stdin.take();
        if let Some(out) = child.stdout.take() {
            let (role, tx) = (role.to_string(), self.events.clone());
            self.readers.push(thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                    let parsed = line.strip_prefix(TAG).and_then(|rest| {
                        let (kind, body) = rest.split_once(' ')?;
                        Some((kind.to_string(), serde_json::from_str(body).ok()?))
                    });
                    match parsed {
                        Some((kind, body)) => {
                            let _ = tx.send(Event {
                                role: role.clone(),
                                kind,
                                body,
                            });
                        }
                        None => eprintln!("[{role}] {line}"),
                    }
                }
            }));
        }
        if let Some(err) = child.stderr.take() {
            let role = role.to_string();
            self.readers.push(thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(|l| l.ok()) {
                    eprintln!("[{role}] {line}");
                }
            }));
        }
        self.members.push(Member {
            role: role.to_string(),
            child,
            _stdin: stdin,
            status: None,
        });
        Ok(())
    }

    /// Reaps children that exited; returns the failures among them, each with whether it is
    /// only a consequence (status 1: the worker reported an error, usually a peer's failure).
    fn poll(&mut self) -> Vec<(bool, String)> {
        let mut failed = Vec::new();
        for m in self.members.iter_mut().filter(|m| m.status.is_none()) {
            match m.child.try_wait() {
                Ok(Some(status)) => {
                    if !status.success() {
                        let consequence = status.code() == Some(1);
                        failed.push((consequence, format!("{} exited with {status}", m.role)));
                    }
                    m.status = Some(status);
                }
                Ok(None) => {}
                Err(e) => failed.push((false, format!("cannot wait for {}: {e}", m.role))),
            }
        }
        failed
    }

    fn all_exited(&self) -> bool {
        self.members.iter().all(|m| m.status.is_some())
    }

    /// Kills (by PID) and reaps every child still running; returns their roles.
    fn kill_remaining(&mut self) -> Vec<String> {
        let mut killed = Vec::new();
        for m in self.members.iter_mut().filter(|m| m.status.is_none()) {
            let _ = m.child.kill();
            m.status = m.child.wait().ok();
            killed.push(m.role.clone());
        }
        killed
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.kill_remaining();
    }
}

/// A random per-run secret: 32 bytes, hex.
pub(crate) fn random_secret() -> Result<String> {
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(|e| anyhow!("no system randomness for the secret: {e}"))?;
    Ok(key.iter().map(|b| format!("{b:02x}")).collect())
}

/// Runs the demo as `trainers + receivers` processes and prints the leader's per-step report.
pub fn run(opts: ProcessDemo) -> Result<()> {
    if opts.trainers == 0 || opts.receivers == 0 {
        bail!("--trainers and --receivers must be at least 1");
    }
    let model = ModelArgs {
        watch_stdin: true,
        preset: opts.preset.clone(),
        layers: opts.layers,
        steps: opts.steps,
        lr: opts.lr,
        seed: opts.seed,
        wire: opts.wire.clone(),
    };
    let shape = model.shape()?;
    let config = model.wire.config()?;
    let table = shape.slot_table();
    if !opts.json {
        println!(
            "deltacast demo: {} ({} tensors, {:.1} M BF16 parameters, full copy {}), {} trainer \
             processes (FSDP Shard(0)), {} receiver processes, loopback TCP, lr {:e}, codec {}, \
             bucket {}",
            shape.name,
            table.len(),
            table.total_elements() as f64 / 1e6,
            bytes(table.total_bytes()),
            opts.trainers,
            opts.receivers,
            opts.lr,
            config.codec.name(),
            bytes(config.bucket_size as u64),
        );
    }
    let (tx, rx) = channel::<Event>();
    let mut fleet = Fleet {
        exe: std::env::current_exe().context("cannot find this executable to start workers")?,
        secret: random_secret()?,
        members: Vec::new(),
        readers: Vec::new(),
        events: tx,
    };
    let world = opts.trainers.to_string();
    let trainer_args = |rank: usize, gather: &str| {
        let mut a: Vec<String> = ["worker", "trainer", "--rank", &rank.to_string()]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.extend([format!("--world={world}"), format!("--gather={gather}")]);
        a.extend(model.to_args());
        a
    };
    let mut leader = trainer_args(0, "127.0.0.1:0");
    leader.extend([
        "--frames=127.0.0.1:0".to_string(),
        format!("--receivers={}", opts.receivers),
    ]);
    fleet.spawn("rank 0", leader)?;

    let mut printer = Printer::new(opts.json);
    let mut failures: Vec<(bool, String)> = Vec::new();
    let mut kill_at: Option<Instant> = None;
    let mut killed = Vec::new();
    let mut listening = false;
    let listen_deadline = Instant::now() + LISTEN_LIMIT;
    loop {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(ev) if ev.kind == "listen" && ev.role == "rank 0" && !listening => {
                listening = true;
                let addr = |k: &str| {
                    ev.body[k]
                        .as_str()
                        .map(str::to_string)
                        .with_context(|| format!("the leader's listen line lacks `{k}`"))
                };
                let (gather, frames) = (addr("gather")?, addr("frames")?);
                for rank in 1..opts.trainers {
                    fleet.spawn(&format!("rank {rank}"), trainer_args(rank, &gather))?;
                }
                for index in 0..opts.receivers {
                    let mut a: Vec<String> = vec![
                        "worker".into(),
                        "receiver".into(),
                        format!("--index={index}"),
                        format!("--frames={frames}"),
                    ];
                    a.extend(model.to_args());
                    fleet.spawn(&format!("receiver {index}"), a)?;
                }
            }
            Ok(ev) => printer.event(ev),
            Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => {}
        }
        let failed = fleet.poll();
        if !failed.is_empty() && kill_at.is_none() {
            kill_at = Some(Instant::now() + GRACE);
        }
        failures.extend(failed);
        if fleet.all_exited() {
            break;
        }
        if !listening && Instant::now() > listen_deadline {
            failures.push((
                false,
                format!("the leader did not report its addresses within {LISTEN_LIMIT:?}"),
            ));
            killed = fleet.kill_remaining();
            break;
        }
        if kill_at.is_some_and(|t| Instant::now() > t) {
            killed = fleet.kill_remaining();
            break;
        }
    }
    // Children have exited: their pipes close, the readers end; then take the last lines.
    for r in std::mem::take(&mut fleet.readers) {
        let _ = r.join();
    }
    drop(fleet);
    while let Ok(ev) = rx.try_recv() {
        printer.event(ev);
    }
    printer.finish(failures.is_empty());
    // The processes that failed first (killed, or exited other than with a reported error)
    // lead the message; the others usually only report their loss.
    failures.sort_by_key(|f| f.0);
    let mut failures: Vec<String> = failures.into_iter().map(|f| f.1).collect();
    if !killed.is_empty() {
        failures.push(format!(
            "killed {} after they did not exit within {GRACE:?} of the failure",
            killed.join(", ")
        ));
    }
    if failures.is_empty() && printer.steps != opts.steps + 1 {
        failures.push(format!(
            "the leader reported {} of {} syncs",
            printer.steps,
            opts.steps + 1
        ));
    }
    if failures.is_empty() && !printer.all_ok {
        failures.push("digest check failed".into());
    }
    if !failures.is_empty() {
        bail!("{}", failures.join("; "));
    }
    Ok(())
}

/// Prints the leader's step lines (table or JSON) and remembers what the summary needs.
struct Printer {
    json: bool,
    steps: u64,
    all_ok: bool,
    last_step: Option<Value>,
    receivers: Vec<Value>,
}

impl Printer {
    fn new(json: bool) -> Self {
        if !json {
            println!(
                "{:>4}  {:>6}  {:>9}  {:>11}  {:>11}  {:>7}  {:>9}  {:>10}  {:>11}  {:>8}  digest",
                "step",
                "kind",
                "changed",
                "wire",
                "full",
                "ratio",
                "sync ms",
                "gather r/s",
                "gathered",
                "g/payld",
            );
        }
        Printer {
            json,
            steps: 0,
            all_ok: true,
            last_step: None,
            receivers: Vec::new(),
        }
    }

    fn event(&mut self, ev: Event) {
        match ev.kind.as_str() {
            "step" => {
                let v = &ev.body;
                let digest_ok = v["digest_ok"].as_bool().unwrap_or(false);
                self.all_ok &= digest_ok;
                self.steps += 1;
                if self.json {
                    json_line(v);
                } else {
                    let u = |k: &str| v[k].as_u64().unwrap_or(0);
                    let f = |k: &str| v[k].as_f64().unwrap_or(0.0);
                    println!(
                        "{:>4}  {:>6}  {:>8.3}%  {:>11}  {:>11}  {:>6.1}x  {:>9.1}  {:>10}  {:>11}  {:>8}  {}",
                        u("step"),
                        v["kind"].as_str().unwrap_or("?"),
                        100.0 * f("changed_fraction"),
                        bytes(u("wire_bytes")),
                        bytes(u("full_bytes")),
                        u("full_bytes") as f64 / u("wire_bytes").max(1) as f64,
                        f("sync_ms"),
                        format!("{}/{}", u("gather_rounds"), u("gather_sub_rounds")),
                        bytes(u("gathered_bytes")),
                        v["gather_ratio"]
                            .as_f64()
                            .map_or_else(|| "-".to_string(), |r| format!("{r:.4}")),
                        if digest_ok { "ok" } else { "MISMATCH" },
                    );
                }
                self.last_step = Some(ev.body);
            }
            "receiver-exit" => self.receivers.push(ev.body),
            other => eprintln!("[{}] unexpected report `{other}`", ev.role),
        }
    }

    /// After the run: peak memory per process and where every receiver stopped (on stderr when
    /// the run failed or the output is JSON, so JSON stdout stays one object per step).
    fn finish(&mut self, ok: bool) {
        let mut lines = Vec::new();
        if let Some(v) = &self.last_step {
            let list = |k: &str| -> String {
                v[k].as_array()
                    .map(|a| {
                        a.iter()
                            .enumerate()
                            .map(|(i, b)| format!("{i}: {}", bytes(b.as_u64().unwrap_or(0))))
                            .collect::<Vec<_>>()
                            .join(", ")
                    })
                    .unwrap_or_default()
            };
            lines.push(format!(
                "peak RSS per trainer rank: {}",
                list("peak_rss_bytes")
            ));
            lines.push(format!(
                "peak RSS per receiver: {}",
                list("receiver_peak_rss_bytes")
            ));
        }
        self.receivers
            .sort_by_key(|r| r["index"].as_u64().unwrap_or(u64::MAX));
        for r in &self.receivers {
            let at = match r["version"].as_u64() {
                Some(v) => format!("at version {v}"),
                None => "at no version (never seeded)".into(),
            };
            let check = match r["recomputed_mismatches"].as_u64() {
                Some(0) => "full digest recomputation: all slots match".to_string(),
                Some(n) => format!("full digest recomputation: {n} slots differ"),
                None => String::new(),
            };
            let dropped = if r["dropped_staged_sync"].as_bool() == Some(true) {
                ", dropped a half-received sync"
            } else {
                ""
            };
            lines.push(format!(
                "receiver {}: {at} (state digest {:016x}){dropped}; {check}",
                r["index"],
                r["state_digest"].as_u64().unwrap_or(0)
            ));
        }
        for l in lines {
            if ok && !self.json {
                println!("{l}");
            } else {
                eprintln!("{l}");
            }
        }
    }
}
