//! `deltacast soak`: one trainer and N receivers over authenticated loopback TCP for many syncs,
//! with random faults (seeded), checking after every sync that every receiver holds the
//! trainer's version and digest, and at the end that its bytes equal the trainer's.
//!
//! Each receiver is a thread running a [`SyncClient`] behind its own [`FaultProxy`]. Faults:
//! `drop` (connection cut in the middle of a frame), `corrupt` (a byte of a frame flipped),
//! `slow` (the receiver stops reading briefly, within the timeouts), `stall` (it stops reading
//! past them and is dropped), `restart-empty` / `restart-old` (the receiver restarts with nothing
//! or from an older checkpoint), `tamper` (a byte of its weights changes behind its back) and
//! `trainer-restart` (the server goes away without a word and a new one resumes). A fault counts
//! as injected once it took effect, and as recovered once its receiver (all of them, for a
//! trainer restart) acked a later sync and its memory proved equal to the trainer's digest.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::mpsc::{channel, Receiver as ChannelRx, Sender as ChannelTx};
use std::sync::{Arc, Condvar, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde_json::json;

use deltacast::{Receiver, SlotTable};
use deltacast_net::fault::{Fault, FaultProxy};
use deltacast_net::{ClientEvent, NetConfig, Secret, SessionConfig, SyncClient, SyncServer};

use crate::output::{bytes, count, hex64, json_line, progress, ByteSize};
use crate::processes::{peak_rss_bytes, proc_status_bytes, random_secret};
use crate::synthetic::{preset, SyntheticModel};

#[derive(Args, Debug)]
pub struct SoakArgs {
    /// Model shape (see `demo`); `tiny` keeps a 200-sync soak to about a minute on 2 cores.
    #[arg(long, default_value = "tiny")]
    preset: String,
    /// Override the number of transformer layers.
    #[arg(long)]
    layers: Option<u64>,
    /// Syncs to run (the first is a seed).
    #[arg(long, default_value_t = 200)]
    syncs: u64,
    /// Receivers, each a thread behind its own fault-injecting relay.
    #[arg(long, default_value_t = 8)]
    receivers: usize,
    /// Chance that a sync gets a fault injected.
    #[arg(long, default_value_t = 0.35)]
    fault_rate: f64,
    /// Seed of the weights, the updates and the fault schedule.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Learning rate of the synthetic optimizer (higher: larger deltas).
    #[arg(long, default_value_t = 1e-5)]
    lr: f32,
    /// Largest flush (small, so syncs span several flushes and faults land inside them).
    #[arg(long, default_value = "16K", value_parser = ByteSize::parse)]
    bucket_size: ByteSize,
    /// Server: how long a receiver may take to accept a frame, in ms.
    #[arg(long, default_value_t = 500)]
    io_timeout_ms: u64,
    /// Server: how long a receiver may take to ack a sync, in ms.
    #[arg(long, default_value_t = 2000)]
    ack_timeout_ms: u64,
    /// One JSON object at the end instead of a text report.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Drop,
    Corrupt,
    Slow,
    Stall,
    RestartEmpty,
    RestartOld,
    Tamper,
    TrainerRestart,
}

impl Kind {
    const ALL: [Kind; 8] = [
        Kind::Drop,
        Kind::Corrupt,
        Kind::Slow,
        Kind::Stall,
        Kind::RestartEmpty,
        Kind::RestartOld,
        Kind::Tamper,
        Kind::TrainerRestart,
    ];

    fn name(self) -> &'static str {
        match self {
            Kind::Drop => "drop",
            Kind::Corrupt => "corrupt",
            Kind::Slow => "slow",
            Kind::Stall => "stall",
            Kind::RestartEmpty => "restart-empty",
            Kind::RestartOld => "restart-old",
            Kind::Tamper => "tamper",
            Kind::TrainerRestart => "trainer-restart",
        }
    }
}

/// A command a receiver thread runs after its next event.
#[derive(Clone, Copy, Debug)]
enum Command {
    RestartEmpty,
    RestartOld,
    Tamper { pick: u64 },
}

/// What a receiver thread publishes for the trainer.
#[derive(Clone, Debug, Default)]
struct Published {
    /// Bumped on every event the thread handles.
    seq: u64,
    version: Option<u64>,
    digest: u64,
    /// Memory equals the running digests (recomputed after every applied sync).
    consistent: bool,
    /// `seq` of the last applied sync, and of the last command run.
    applied_seq: u64,
    commands_run: u64,
    command_seq: u64,
    rejected: u64,
    disconnects: u64,
    diverged: u64,
}

struct Board {
    state: Mutex<Vec<Published>>,
    changed: Condvar,
}

impl Board {
    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Published>> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn update(&self, i: usize, f: impl FnOnce(&mut Published)) {
        let mut g = self.lock();
        g[i].seq += 1;
        f(&mut g[i]);
        drop(g);
        self.changed.notify_all();
    }

    /// Waits until `done` holds for the board, up to `limit`.
    fn wait(&self, limit: Duration, done: impl Fn(&[Published]) -> bool) -> bool {
        let deadline = Instant::now() + limit;
        let mut g = self.lock();
        loop {
            if done(&g) {
                return true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            g = self
                .changed
                .wait_timeout(g, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}

/// A fault that awaits recovery.
struct Open {
    kind: Kind,
    /// Receiver, or `None` for the trainer (all receivers must recover).
    target: Option<usize>,
    /// A receiver command: it took effect once the receiver ran this many commands.
    needs_commands: Option<u64>,
    /// Board `seq` of the target after which an applied sync counts as recovery.
    after_seq: u64,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn receiver_thread(
    i: usize,
    addr: SocketAddr,
    net: NetConfig,
    table: SlotTable,
    board: Arc<Board>,
    commands: ChannelRx<Command>,
) -> Result<Receiver> {
    let mut client = SyncClient::new(addr, net.clone(), Receiver::new(table.clone()), 1);
    // An older state to restart from: refreshed every 10 applied versions.
    let mut checkpoint: Option<(Vec<Vec<u8>>, u64)> = None;
    loop {
        let ev = client
            .next_event()
            .with_context(|| format!("receiver {i}: cannot reach the trainer"))?;
        match ev {
            ClientEvent::Closed { .. } => return Ok(client.into_receiver()),
            // Applied over weights changed behind its back: the ack said so and a seed follows;
            // not a state the receiver stands behind, so not published.
            ClientEvent::Applied { diverged: true, .. } => board.update(i, |p| p.diverged += 1),
            ClientEvent::Applied { outcome, .. } => {
                let r = client.receiver();
                let consistent = r.recompute_digests().is_empty();
                if outcome.version % 10 == 0 {
                    checkpoint = Some((r.store().clone(), outcome.version));
                }
                board.update(i, |p| {
                    p.version = r.version();
                    p.digest = r.state_digest();
                    p.consistent = consistent;
                    p.applied_seq = p.seq;
                });
            }
            ClientEvent::Rejected { .. } => board.update(i, |p| p.rejected += 1),
            ClientEvent::Disconnected { .. } => board.update(i, |p| p.disconnects += 1),
            ClientEvent::Connected { .. } => board.update(i, |_| {}),
        }
        while let Ok(cmd) = commands.try_recv() {
            match cmd {
                Command::RestartEmpty => {
                    client = SyncClient::new(addr, net.clone(), Receiver::new(table.clone()), 1);
                }
                Command::RestartOld => {
                    let r = match &checkpoint {
                        Some((store, v)) => {
                            Receiver::with_state(table.clone(), store.clone(), Some(*v))?
                        }
                        None => Receiver::new(table.clone()),
                    };
                    client = SyncClient::new(addr, net.clone(), r, 1);
                }
                Command::Tamper { pick } => {
                    let store = client.receiver_mut().store_mut();
                    let slot = (pick % store.len() as u64) as usize;
                    let len = store[slot].len().max(1) as u64;
                    if let Some(b) = store[slot].get_mut(((pick >> 20) % len) as usize) {
                        *b ^= 0x01;
                    }
                }
            }
            board.update(i, |p| {
                p.commands_run += 1;
                p.command_seq = p.seq;
            });
        }
    }
}

fn vm_rss_bytes() -> Option<u64> {
    proc_status_bytes("VmRSS:")
}

pub fn run(args: SoakArgs) -> Result<()> {
    let mut shape =
        preset(&args.preset).ok_or_else(|| anyhow!("unknown preset `{}`", args.preset))?;
    if let Some(l) = args.layers {
        shape.layers = l;
    }
    if args.receivers == 0 || args.syncs == 0 {
        bail!("--receivers and --syncs must be at least 1");
    }
    let started = Instant::now();
    let mut rng = Rng(args.seed ^ 0x736f_616b);
    let mut model = SyntheticModel::new(&shape, args.seed, |_| {});
    let table = model.table.clone();
    let secret = Secret::new(random_secret()?)?;
    let mut net = NetConfig::default()
        .with_secret(Some(secret))
        .with_timeouts(Duration::from_secs(10));
    net.io_timeout = Duration::from_millis(args.io_timeout_ms);
    net.ack_timeout = Duration::from_millis(args.ack_timeout_ms);
    // Bound what the kernel holds for a receiver that stops reading.
    net.send_buffer = Some(64 << 10);
    let flush = deltacast::FlushConfig {
        bucket_size: usize::try_from(args.bucket_size.bytes())?,
        ..deltacast::FlushConfig::default()
    };
    flush.validate()?;
    let session = SessionConfig {
        min_receivers: args.receivers,
        sync_timeout: Duration::from_secs(60),
        ..SessionConfig::default()
    };
    let lo: SocketAddr = "127.0.0.1:0".parse()?;
    let mut server = SyncServer::bind(lo, net.clone(), table.clone(), flush, session.clone())?;
    let server_addr = server.local_addr();
    let max_message = args.bucket_size.bytes() + (1 << 20);

    let board = Arc::new(Board {
        state: Mutex::new(vec![Published::default(); args.receivers]),
        changed: Condvar::new(),
    });
    let mut proxies = Vec::new();
    let mut commands: Vec<ChannelTx<Command>> = Vec::new();
    let mut threads = Vec::new();
    for i in 0..args.receivers {
        let proxy = FaultProxy::start(server_addr, max_message)?;
        let (tx, rx) = channel();
        let (addr, net, table, board) = (proxy.addr(), net.clone(), table.clone(), board.clone());
        threads.push(
            thread::Builder::new()
                .name(format!("receiver-{i}"))
                .spawn(move || receiver_thread(i, addr, net, table, board, rx))?,
        );
        proxies.push(proxy);
        commands.push(tx);
    }

    let bar = progress(args.syncs, "soak", args.json);
    let mut injected: BTreeMap<Kind, u64> = BTreeMap::new();
    let mut recovered: BTreeMap<Kind, u64> = BTreeMap::new();
    let mut open: Vec<Open> = Vec::new();
    let mut proxy_done: Vec<usize> = vec![0; args.receivers];
    let mut commands_sent: Vec<u64> = vec![0; args.receivers];
    let (mut completed, mut incomplete, mut mismatches, mut laggards) = (0u64, 0u64, 0u64, 0u64);
    let (mut nacks, mut delta_sends, mut seeds, mut drops) = (0u64, 0u64, 0u64, 0u64);
    let mut rss_after_warmup = None;
    let mut errors: Vec<String> = Vec::new();
    let settle = Duration::from_secs(20);

    for k in 1..=args.syncs {
        if k > 1 {
            model.step(args.lr, |_| {});
        }
        // Faults for this sync: none on the first (it seeds everyone) nor the last (a receiver
        // command runs after its sync, so it needs one more to recover).
        if k > 1 && k < args.syncs && rng.unit() < args.fault_rate {
            let kind = Kind::ALL[rng.below(Kind::ALL.len() as u64) as usize];
            let i = rng.below(args.receivers as u64) as usize;
            let stall = Duration::from_millis(args.ack_timeout_ms.max(args.io_timeout_ms) + 500);
            match kind {
                Kind::Drop => proxies[i].inject(Fault::DropMidFrame {
                    after: rng.below(3) as u32,
                }),
                Kind::Corrupt => proxies[i].inject(Fault::Corrupt {
                    after: rng.below(3) as u32,
                    offset: rng.next(),
                }),
                Kind::Slow => proxies[i].inject(Fault::Stall(Duration::from_millis(50))),
                Kind::Stall => proxies[i].inject(Fault::Stall(stall)),
                Kind::RestartEmpty => commands[i].send(Command::RestartEmpty)?,
                Kind::RestartOld => commands[i].send(Command::RestartOld)?,
                Kind::Tamper => commands[i].send(Command::Tamper { pick: rng.next() })?,
                Kind::TrainerRestart => {
                    // Gone without a word; a new trainer comes back on the same address.
                    drop(server);
                    server = SyncServer::bind(
                        server_addr,
                        net.clone(),
                        table.clone(),
                        flush,
                        session.clone(),
                    )?;
                    *injected.entry(kind).or_default() += 1;
                    open.push(Open {
                        kind,
                        target: None,
                        needs_commands: None,
                        after_seq: 0,
                    });
                }
            }
            if matches!(kind, Kind::RestartEmpty | Kind::RestartOld | Kind::Tamper) {
                commands_sent[i] += 1;
                open.push(Open {
                    kind,
                    target: Some(i),
                    needs_commands: Some(commands_sent[i]),
                    after_seq: 0,
                });
            }
        }

        let report = server.sync(&model.slices())?;
        if report.complete() {
            completed += 1;
        } else {
            incomplete += 1;
            errors.push(format!("sync {k}: {report:?}"));
        }
        nacks += u64::from(report.nacks + report.diverged);
        delta_sends += u64::from(report.delta_sends);
        seeds += u64::from(report.seed_sends);
        drops += report.dropped.len() as u64;
        let (v, d) = (report.version, report.state_digest);

        // Every receiver publishes the sync it acked; wait for all of them (loudly bounded).
        let all_there = board.wait(settle, |b| b.iter().all(|p| p.version == Some(v)));
        let snapshot = board.lock().clone();
        for (i, p) in snapshot.iter().enumerate() {
            if p.version != Some(v) {
                laggards += 1;
                errors.push(format!(
                    "sync {k}: receiver {i} at {:?}, trainer at {v}{}",
                    p.version,
                    if all_there { "" } else { " (waited 20 s)" }
                ));
            } else if p.digest != d || !p.consistent {
                mismatches += 1;
                errors.push(format!(
                    "sync {k}: receiver {i} digest {} (memory consistent: {}), trainer {}",
                    hex64(p.digest),
                    p.consistent,
                    hex64(d)
                ));
            }
        }

        // Proxy faults that took effect during this sync.
        for (i, proxy) in proxies.iter().enumerate() {
            let done = proxy.done();
            for f in &done[proxy_done[i]..] {
                let kind = match f {
                    Fault::DropMidFrame { .. } => Kind::Drop,
                    Fault::Corrupt { .. } => Kind::Corrupt,
                    Fault::Stall(d) if *d <= Duration::from_millis(50) => Kind::Slow,
                    Fault::Stall(_) => Kind::Stall,
                };
                *injected.entry(kind).or_default() += 1;
                open.push(Open {
                    kind,
                    target: Some(i),
                    needs_commands: None,
                    after_seq: 0,
                });
            }
            proxy_done[i] = done.len();
        }
        // Receiver commands that ran: recovery counts from the event after them.
        for o in open.iter_mut() {
            if let (Some(i), Some(needed)) = (o.target, o.needs_commands) {
                let p = &snapshot[i];
                if p.commands_run >= needed {
                    o.needs_commands = None;
                    o.after_seq = p.command_seq;
                    *injected.entry(o.kind).or_default() += 1;
                }
            }
        }
        // Recovered: the target is current, proven, and acked after the fault.
        open.retain(|o| {
            if o.needs_commands.is_some() {
                return true;
            }
            let ok = |p: &Published| {
                p.version == Some(v) && p.digest == d && p.consistent && p.applied_seq > o.after_seq
            };
            let done = match o.target {
                Some(i) => ok(&snapshot[i]),
                None => snapshot.iter().all(ok),
            };
            if done {
                *recovered.entry(o.kind).or_default() += 1;
            }
            !done
        });
        if k == (args.syncs / 10).max(1) {
            rss_after_warmup = vm_rss_bytes();
        }
        bar.inc(1);
    }
    bar.finish_and_clear();

    // Faults queued in a relay that never took effect (too few frames left) are not counted.
    for p in &proxies {
        p.clear();
    }
    let final_version = server.version();
    let final_digest = server.state_digest();
    server.close("soak over");
    let mut between = 0u64;
    let mut byte_mismatch = 0u64;
    for (i, t) in threads.into_iter().enumerate() {
        match t.join() {
            Ok(Ok(r)) => {
                if r.version() != Some(final_version)
                    || r.is_staging()
                    || !r.recompute_digests().is_empty()
                    || r.state_digest() != final_digest
                {
                    between += 1;
                    errors.push(format!("receiver {i} ended at {:?}", r.version()));
                } else if r.store() != &model.weights {
                    byte_mismatch += 1;
                    errors.push(format!("receiver {i}: bytes differ from the trainer's"));
                }
            }
            Ok(Err(e)) => {
                between += 1;
                errors.push(format!("receiver {i}: {e:#}"));
            }
            Err(_) => {
                between += 1;
                errors.push(format!("receiver {i} panicked"));
            }
        }
    }
    let rss_end = vm_rss_bytes();
    let peak = peak_rss_bytes();
    let total_injected: u64 = injected.values().sum();
    let total_recovered: u64 = recovered.values().sum();
    let secs = started.elapsed().as_secs_f64();
    let board_totals = board.lock().clone();
    let rejected: u64 = board_totals.iter().map(|p| p.rejected).sum();
    let disconnects: u64 = board_totals.iter().map(|p| p.disconnects).sum();
    let ok = incomplete == 0
        && mismatches == 0
        && laggards == 0
        && between == 0
        && byte_mismatch == 0
        && total_recovered == total_injected;

    let by_kind = |m: &BTreeMap<Kind, u64>| {
        Kind::ALL
            .iter()
            .map(|k| (k.name().to_string(), json!(m.get(k).copied().unwrap_or(0))))
            .collect::<serde_json::Map<_, _>>()
    };
    if args.json {
        json_line(&json!({
            "ok": ok, "preset": shape.name, "layers": shape.layers,
            "elements": table.total_elements(), "receivers": args.receivers,
            "syncs": args.syncs, "syncs_completed": completed, "syncs_incomplete": incomplete,
            "faults_injected": total_injected, "faults_recovered": total_recovered,
            "injected_by_kind": by_kind(&injected), "recovered_by_kind": by_kind(&recovered),
            "digest_mismatches": mismatches + byte_mismatch, "receivers_behind_after_sync": laggards,
            "receivers_between_versions": between, "final_version": final_version,
            "nacks": nacks, "delta_sends": delta_sends, "seed_sends": seeds, "drops": drops,
            "receiver_rejections": rejected, "receiver_disconnects": disconnects,
            "max_rss_bytes": peak, "rss_after_warmup_bytes": rss_after_warmup,
            "rss_end_bytes": rss_end, "seconds": secs, "seed": args.seed,
            "errors": errors.iter().take(20).collect::<Vec<_>>(),
        }));
    } else {
        println!(
            "soak: {}, {}, preset {} ({}, {}), bucket {}, seed {}, {:.1} s",
            count(args.syncs, "sync", "syncs"),
            count(args.receivers as u64, "receiver", "receivers"),
            shape.name,
            count(table.total_elements(), "element", "elements"),
            bytes(table.total_bytes()),
            args.bucket_size,
            args.seed,
            secs
        );
        println!("  syncs completed            {completed} of {}", args.syncs);
        println!("  faults injected            {total_injected}");
        for k in Kind::ALL {
            println!(
                "    {:<24} {:>4} injected, {:>4} recovered",
                k.name(),
                injected.get(&k).copied().unwrap_or(0),
                recovered.get(&k).copied().unwrap_or(0)
            );
        }
        println!("  faults recovered           {total_recovered}");
        println!(
            "  digest mismatches          {}",
            mismatches + byte_mismatch
        );
        println!("  receivers behind a sync    {laggards}");
        println!("  receivers between versions {between} (final version {final_version})");
        println!(
            "  traffic                    {}, {}, {}, {} dropped",
            count(delta_sends, "delta send", "delta sends"),
            count(seeds, "seed send", "seed sends"),
            count(nacks, "nack", "nacks"),
            count(drops, "receiver", "receivers"),
        );
        println!(
            "  memory                     max RSS {}, RSS after 10% of syncs {}, at the end {}",
            peak.map_or("?".into(), bytes),
            rss_after_warmup.map_or("?".into(), bytes),
            rss_end.map_or("?".into(), bytes)
        );
        for e in errors.iter().take(20) {
            println!("  ! {e}");
        }
        println!(
            "  result                     {}",
            if ok { "OK" } else { "FAILED" }
        );
    }
    if !ok {
        bail!("soak failed: see the report");
    }
    Ok(())
}
