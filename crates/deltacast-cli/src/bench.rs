//! `deltacast bench`: sync time of a full BF16 broadcast, abs32+raw deltas and deltacast's
//! default codec, over real shaped links between hosts.
//!
//! Each host is a network namespace (see [`netns`]): the trainer host runs every trainer rank,
//! each receiver host one receiver, and every receiver host reaches the trainer host through its
//! own veth link shaped with tc (tbf rate + netem delay, both directions). All methods run in
//! the same processes over the same links, alternating within every step (see [`worker`]), and
//! the links are re-shaped between link settings without restarting anything. The run always
//! tears everything down: on success, on failure, on Ctrl-C (SIGINT/SIGTERM/SIGHUP set a flag the
//! main loop checks), through drop guards; and it removes leftovers of killed runs at start.
//!
//! Without root or iproute2 it says so; `--loopback` runs the same processes on 127.0.0.1
//! without shaping.

pub mod netns;
pub(crate) mod plot;
pub mod worker;

use std::io::{BufRead, BufReader, IsTerminal, Write};
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver as ChannelRx, RecvTimeoutError, Sender as ChannelTx};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use indicatif::ProgressBar;
use serde_json::{json, Value};

use deltacast::flush::DEFAULT_CHUNK_ELEMS;

use crate::output::{bytes, json_line, progress};
use crate::processes::{random_secret, TAG};
use netns::{LinkSpec, Topology};
use worker::BenchModel;

/// How long the leader may take to report its addresses.
const LISTEN_LIMIT: Duration = Duration::from_secs(60);
/// How long the processes get to exit after `quit` before they are killed.
const EXIT_LIMIT: Duration = Duration::from_secs(30);

#[derive(Args, Debug)]
pub struct BenchArgs {
    /// Model shape: tiny, qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-7b.
    #[arg(long, default_value = "qwen2.5-0.5b")]
    preset: String,
    /// Override the number of transformer layers (scales the model size).
    #[arg(long)]
    layers: Option<u64>,
    /// Scale the preset's parameter count by this factor (e.g. 0.5, 3), through its number of
    /// layers (the embedding stays): the nearest layer count, at least one.
    #[arg(long, conflicts_with = "layers")]
    scale: Option<f64>,
    /// Links to sweep, comma-separated: wan (1 Gbit/s, 10 ms), 10g (10 Gbit/s, 1 ms),
    /// 25g (25 Gbit/s, 0.5 ms), or RATE/DELAY such as 2gbit/5ms (delays are one way).
    #[arg(long, default_value = "wan")]
    links: String,
    /// A custom link rate (with --delay): added to the sweep.
    #[arg(long)]
    rate: Option<String>,
    /// One-way delay of the custom link (default 0).
    #[arg(long, requires = "rate")]
    delay: Option<String>,
    /// Measured steps per link (after one seed per delta method, which is not measured).
    #[arg(long, default_value_t = 3)]
    steps: u64,
    /// Trainer ranks (FSDP Shard(0)), all on the trainer host.
    #[arg(long, default_value_t = 2)]
    trainers: usize,
    /// Receivers, each on its own host with its own link.
    #[arg(long, default_value_t = 1)]
    receivers: usize,
    /// Methods, in their first step's order: `full` (a plain BF16 broadcast) and any codecs.
    #[arg(long, default_value = "full,abs32+raw,auto")]
    methods: String,
    /// Learning rate of the AdamW-like generator.
    #[arg(long, default_value_t = 1e-6)]
    lr: f32,
    /// Seed of the random weights and updates.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Largest deltacast flush (suffixes K, M, G).
    #[arg(long, default_value = "512M", value_parser = crate::parse_size)]
    bucket_size: u64,
    /// Bucket of the full broadcast (gathered and sent in a pipeline).
    #[arg(long, default_value = "64M", value_parser = crate::parse_size)]
    full_bucket_size: u64,
    /// Elements per chunk.
    #[arg(long, default_value_t = DEFAULT_CHUNK_ELEMS)]
    chunk_elems: u64,
    /// Receivers write each flush of a delta into their state as it arrives instead of
    /// staging the sync until its last flush (their state holds parts of two versions
    /// between flushes; a failed sync is still written back whole). Matters with several
    /// flushes per sync (a small --bucket-size).
    #[arg(long)]
    apply_as_received: bool,
    /// Everything on 127.0.0.1 without namespaces or shaping (no root needed).
    #[arg(long)]
    loopback: bool,
    /// Folder for the results (results.jsonl, summary.md, bench.png).
    #[arg(long)]
    out: Option<PathBuf>,
    /// One JSON object per line (per step and method, then one summary per link and method).
    #[arg(long)]
    json: bool,
}

// ---------------------------------------------------------------------------------------------
// Signals.

static INTERRUPTED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_signal(_: libc::c_int) {
    INTERRUPTED.store(true, Ordering::SeqCst);
}

fn install_signal_handlers() {
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as *const () as libc::sighandler_t;
            libc::sigemptyset(&mut sa.sa_mask);
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

fn check_interrupt() -> Result<()> {
    if INTERRUPTED.load(Ordering::SeqCst) {
        bail!("interrupted; stopped every process and removed the namespaces");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// The processes.

enum Msg {
    Event {
        role: String,
        kind: String,
        body: Value,
    },
    Log {
        role: String,
        line: String,
    },
}

struct Proc {
    role: String,
    child: Child,
    /// Held open: the child exits when it closes. The leader reads its commands from it.
    stdin: Option<ChildStdin>,
    status: Option<ExitStatus>,
}

/// The children of one run; dropping it kills and reaps every child still running.
struct Fleet {
    exe: PathBuf,
    secret: String,
    procs: Vec<Proc>,
    readers: Vec<JoinHandle<()>>,
    tx: ChannelTx<Msg>,
}

impl Fleet {
    /// Starts `deltacast ARGS`, inside `ns` when given.
    fn spawn(&mut self, role: &str, ns: Option<&str>, args: Vec<String>) -> Result<()> {
        let mut cmd = match ns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(&self.exe);
                c
            }
            None => Command::new(&self.exe),
        };
        let mut child = cmd
            .args(&args)
            .env(deltacast_net::SECRET_ENV, &self.secret)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("cannot start {role}"))?;
        let stdin = child.stdin.take();
        if let Some(out) = child.stdout.take() {
            let (role, tx) = (role.to_string(), self.tx.clone());
            self.readers.push(thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
                    let parsed = line.strip_prefix(TAG).and_then(|rest| {
                        let (kind, body) = rest.split_once(' ')?;
                        Some((kind.to_string(), serde_json::from_str(body).ok()?))
                    });
                    let msg = match parsed {
                        Some((kind, body)) => Msg::Event {
                            role: role.clone(),
                            kind,
                            body,
                        },
                        None => Msg::Log {
                            role: role.clone(),
                            line,
                        },
                    };
                    if tx.send(msg).is_err() {
                        return;
                    }
                }
            }));
        }
        if let Some(err) = child.stderr.take() {
            let (role, tx) = (role.to_string(), self.tx.clone());
            self.readers.push(thread::spawn(move || {
                for line in BufReader::new(err).lines().map_while(|l| l.ok()) {
                    if tx
                        .send(Msg::Log {
                            role: role.clone(),
                            line,
                        })
                        .is_err()
                    {
                        return;
                    }
                }
            }));
        }
        self.procs.push(Proc {
            role: role.to_string(),
            child,
            stdin,
            status: None,
        });
        Ok(())
    }

    /// Children that exited since the last call, with their status.
    fn poll(&mut self) -> Vec<String> {
        let mut exited = Vec::new();
        for p in self.procs.iter_mut().filter(|p| p.status.is_none()) {
            if let Ok(Some(status)) = p.child.try_wait() {
                p.status = Some(status);
                exited.push(format!("{} exited with {status}", p.role));
            }
        }
        exited
    }

    fn all_exited(&self) -> bool {
        self.procs.iter().all(|p| p.status.is_some())
    }

    /// One line to the leader's stdin.
    fn command(&mut self, line: &str) -> Result<()> {
        let leader = self
            .procs
            .first_mut()
            .and_then(|p| p.stdin.as_mut())
            .ok_or_else(|| anyhow!("the leader is not running"))?;
        writeln!(leader, "{line}")
            .and_then(|_| leader.flush())
            .context("the leader stopped taking commands")
    }

    fn kill_remaining(&mut self) {
        for p in self.procs.iter_mut().filter(|p| p.status.is_none()) {
            let _ = p.child.kill();
            p.status = p.child.wait().ok();
        }
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        for p in &mut self.procs {
            p.stdin = None;
        }
        self.kill_remaining();
    }
}

/// Waits for the tagged event `kind` from `role`, passing logs through and failing when a
/// process exits, the run is interrupted, or `limit` passes.
fn wait_for(
    fleet: &mut Fleet,
    rx: &ChannelRx<Msg>,
    bar: &ProgressBar,
    role: &str,
    kind: &str,
    limit: Option<Duration>,
    also: &mut Vec<(String, Value)>,
) -> Result<Value> {
    let deadline = limit.map(|l| Instant::now() + l);
    loop {
        check_interrupt()?;
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(Msg::Event {
                role: r,
                kind: k,
                body,
            }) if r == role && k == kind => return Ok(body),
            Ok(Msg::Event {
                role: r,
                kind: k,
                body,
            }) => also.push((format!("{r}:{k}"), body)),
            Ok(Msg::Log { role: r, line }) => bar.suspend(|| eprintln!("[{r}] {line}")),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => bail!("every process output closed"),
        }
        let exited = fleet.poll();
        if !exited.is_empty() {
            // Let the last lines (the error) through before failing.
            let until = Instant::now() + Duration::from_millis(500);
            while let Ok(m) = rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
                if let Msg::Log { role: r, line } = m {
                    bar.suspend(|| eprintln!("[{r}] {line}"));
                }
            }
            check_interrupt()?;
            bail!("{} (while waiting for {role} `{kind}`)", exited.join("; "));
        }
        if deadline.is_some_and(|d| Instant::now() > d) {
            bail!(
                "{role} did not report `{kind}` within {:?}",
                limit.unwrap_or_default()
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Results.

/// One method's sync of one step on one link.
#[derive(Debug, Clone)]
struct Sample {
    link: String,
    rate_bps: Option<u64>,
    delay_us: Option<u64>,
    delay_emulated: bool,
    step: u64,
    method: String,
    sync_ms: f64,
    wire_bytes: u64,
    diff_ms: f64,
    changed_fraction: f64,
    digest_ok: bool,
    /// Deltas: when the leader had its last flush ready / written, the receivers' decode time.
    timing: Value,
    /// Deltas: chunks per codec the encoder chose.
    codecs: Value,
}

impl Sample {
    /// diff time (deltas only) + wire bytes ÷ link rate.
    fn floor_ms(&self) -> Option<f64> {
        let rate = self.rate_bps? as f64;
        let wire = self.wire_bytes as f64 * 8.0 / rate * 1e3;
        Some(if self.method == "full" {
            wire
        } else {
            self.diff_ms + wire
        })
    }

    fn json(&self) -> Value {
        json!({
            "type": "step", "link": self.link, "rate_bps": self.rate_bps,
            "delay_ms": self.delay_us.map(|d| d as f64 / 1e3),
            "delay_emulated": self.delay_emulated, "step": self.step,
            "method": self.method, "sync_ms": self.sync_ms, "wire_bytes": self.wire_bytes,
            "diff_ms": self.diff_ms, "floor_ms": self.floor_ms(),
            "changed_fraction": self.changed_fraction, "digest_ok": self.digest_ok,
            "timing": self.timing, "codecs": self.codecs,
        })
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Medians over the steps of one link and method; ratios are medians of per-step ratios
/// (paired within a step, so slow drift cancels).
#[derive(Debug, Clone)]
struct Summary {
    link: String,
    rate_bps: Option<u64>,
    delay_us: Option<u64>,
    delay_emulated: bool,
    method: String,
    steps: usize,
    sync_ms: f64,
    sync_ms_min: f64,
    sync_ms_max: f64,
    wire_bytes: f64,
    diff_ms: f64,
    floor_ms: Option<f64>,
    over_floor: Option<f64>,
    vs_full: Option<f64>,
    vs_abs32: Option<f64>,
    all_ok: bool,
}

impl Summary {
    fn json(&self) -> Value {
        json!({
            "type": "summary", "link": self.link, "rate_bps": self.rate_bps,
            "delay_ms": self.delay_us.map(|d| d as f64 / 1e3),
            "delay_emulated": self.delay_emulated, "method": self.method,
            "steps": self.steps, "sync_ms": self.sync_ms, "sync_ms_min": self.sync_ms_min,
            "sync_ms_max": self.sync_ms_max, "wire_bytes": self.wire_bytes,
            "diff_ms": self.diff_ms, "floor_ms": self.floor_ms, "sync_over_floor": self.over_floor,
            "speedup_vs_full": self.vs_full, "speedup_vs_abs32_raw": self.vs_abs32,
            "effective_gbit_s": self.wire_bytes * 8.0 / (self.sync_ms * 1e6),
            "digest_ok": self.all_ok,
        })
    }
}

fn summarize(samples: &[Sample], links: &[String], methods: &[String]) -> Vec<Summary> {
    let mut out = Vec::new();
    for link in links {
        let of = |m: &str| -> Vec<&Sample> {
            samples
                .iter()
                .filter(|s| &s.link == link && s.method == m)
                .collect()
        };
        for m in methods {
            let mine = of(m);
            if mine.is_empty() {
                continue;
            }
            let paired = |other: &str| -> Option<f64> {
                if other == m {
                    return None;
                }
                let theirs = of(other);
                let r: Vec<f64> = mine
                    .iter()
                    .filter_map(|s| {
                        let t = theirs.iter().find(|t| t.step == s.step)?;
                        Some(t.sync_ms / s.sync_ms)
                    })
                    .collect();
                (!r.is_empty()).then(|| median(r))
            };
            let floors: Vec<f64> = mine.iter().filter_map(|s| s.floor_ms()).collect();
            let over: Vec<f64> = mine
                .iter()
                .filter_map(|s| Some(s.sync_ms / s.floor_ms()?))
                .collect();
            let times: Vec<f64> = mine.iter().map(|s| s.sync_ms).collect();
            out.push(Summary {
                link: link.clone(),
                rate_bps: mine[0].rate_bps,
                delay_us: mine[0].delay_us,
                delay_emulated: mine[0].delay_emulated,
                method: m.clone(),
                steps: mine.len(),
                sync_ms: median(times.clone()),
                sync_ms_min: times.iter().copied().fold(f64::INFINITY, f64::min),
                sync_ms_max: times.iter().copied().fold(0.0, f64::max),
                wire_bytes: median(mine.iter().map(|s| s.wire_bytes as f64).collect()),
                diff_ms: median(mine.iter().map(|s| s.diff_ms).collect()),
                floor_ms: (!floors.is_empty()).then(|| median(floors)),
                over_floor: (!over.is_empty()).then(|| median(over)),
                vs_full: paired("full"),
                vs_abs32: paired("abs32+raw"),
                all_ok: mine.iter().all(|s| s.digest_ok),
            });
        }
    }
    out
}

fn opt(v: Option<f64>, f: impl Fn(f64) -> String) -> String {
    v.map_or_else(|| "-".to_string(), f)
}

/// The summary as a Markdown table (printed, and written to summary.md).
fn markdown(summaries: &[Summary]) -> String {
    let mut s = String::from(
        "| link | method | sync ms (median) | min–max | wire | diff ms | floor ms | sync / floor | vs full | vs abs32+raw | Gbit/s on the wire | digests |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    for m in summaries {
        s.push_str(&format!(
            "| {} | {} | {:.1} | {:.1}–{:.1} | {} | {} | {} | {} | {} | {} | {:.2} | {} |\n",
            m.link,
            m.method,
            m.sync_ms,
            m.sync_ms_min,
            m.sync_ms_max,
            bytes(m.wire_bytes as u64),
            if m.method == "full" {
                "-".into()
            } else {
                format!("{:.1}", m.diff_ms)
            },
            opt(m.floor_ms, |f| format!("{f:.1}")),
            opt(m.over_floor, |r| format!("{r:.2}×")),
            opt(m.vs_full, |r| format!("{r:.1}×")),
            opt(m.vs_abs32, |r| format!("{r:.1}×")),
            m.wire_bytes * 8.0 / (m.sync_ms * 1e6),
            if m.all_ok { "all ok" } else { "MISMATCH" },
        ));
    }
    s
}

// ---------------------------------------------------------------------------------------------
// The run.

pub fn run(mut args: BenchArgs) -> Result<()> {
    let mut links: Vec<LinkSpec> = Vec::new();
    for l in args
        .links
        .split(',')
        .map(str::trim)
        .filter(|l| !l.is_empty())
    {
        links.push(netns::parse_link(l)?);
    }
    if let Some(rate) = &args.rate {
        let delay = args.delay.as_deref().unwrap_or("0");
        links.push(LinkSpec {
            name: format!("{rate}/{delay}"),
            rate_bps: netns::parse_rate(rate)?,
            delay_us: netns::parse_delay(delay)?,
        });
    }
    if args.steps == 0 {
        bail!("--steps must be at least 1");
    }
    if args.trainers == 0 || args.receivers == 0 {
        bail!("--trainers and --receivers must be at least 1");
    }
    if let Some(scale) = args.scale {
        args.layers = Some(layers_for_scale(&args.preset, scale)?);
    }
    let model = BenchModel {
        preset: args.preset.clone(),
        layers: args.layers,
        lr: args.lr,
        seed: args.seed,
        methods: args.methods.clone(),
        bucket_size: args.bucket_size,
        full_bucket_size: args.full_bucket_size,
        chunk_elems: args.chunk_elems,
        apply_as_received: args.apply_as_received,
    };
    let shape = model.shape()?;
    let methods: Vec<String> = model.methods()?.iter().map(|m| m.name()).collect();
    if args.loopback {
        links = vec![LinkSpec {
            name: "loopback".into(),
            rate_bps: 0,
            delay_us: 0,
        }];
    } else {
        if links.is_empty() {
            bail!("no links given (--links or --rate)");
        }
        if let Some(why) = netns::unavailable() {
            bail!(
                "{why}.\nRun as root with iproute2 for shaped links, or pass --loopback for a \
                 loopback-only run without shaping (all processes on 127.0.0.1)."
            );
        }
    }
    if let Some(dir) = &args.out {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("cannot create the output folder {}", dir.display()))?;
    }
    install_signal_handlers();

    let table = shape.slot_table();
    let hide = args.json || !std::io::stderr().is_terminal();
    if !args.json {
        println!(
            "deltacast bench: {} ({:.1} M BF16 parameters, full copy {}), {} trainer rank(s) on one \
             host, {} receiver host(s); methods {}; {} step(s) per link, lr {:e}",
            shape.name,
            table.total_elements() as f64 / 1e6,
            bytes(table.total_bytes()),
            args.trainers,
            args.receivers,
            methods.join(", "),
            args.steps,
            args.lr,
        );
        if args.loopback {
            println!("links: loopback only (127.0.0.1, no namespaces, no shaping)");
        }
    }

    // Guards: the topology is declared first so the processes (fleet) drop before it.
    let mut topology = None;
    if !args.loopback {
        for ns in netns::clean_leftovers()? {
            eprintln!("deltacast bench: removed leftover namespace {ns} of a run that is gone");
        }
        check_interrupt()?;
        topology = Some(Topology::create(args.receivers).context("setting up the namespaces")?);
    }
    let delay_emulated = topology.as_ref().is_some_and(|t| t.netem);
    if let Some(t) = &topology {
        let l: Vec<String> = links.iter().map(LinkSpec::describe).collect();
        if !args.json {
            println!(
                "links: {} — a veth pair per receiver host between network namespaces, both \
                 ends shaped with tc {}",
                l.join("; "),
                if t.netem {
                    "tbf (rate) + netem (delay)"
                } else {
                    "tbf (rate)"
                }
            );
        }
        if !t.netem {
            let msg = "this kernel has no netem qdisc: links are rate-shaped (tbf) only, their \
                       delays are NOT emulated";
            if args.json {
                eprintln!("deltacast bench: {msg}");
            } else {
                println!("note: {msg}");
            }
        }
    }
    let result = run_fleet(
        &args,
        &model,
        &links,
        topology.as_ref(),
        delay_emulated,
        hide,
    );
    if let Some(t) = topology.as_mut() {
        let failed = t.teardown();
        if !failed.is_empty() {
            eprintln!("deltacast bench: could not remove: {}", failed.join("; "));
        }
    }
    let (samples, seeded) = result?;
    report(&args, &methods, &links, &samples, &seeded)
}

/// Starts the processes, seeds, then runs every link's steps; returns the samples.
fn run_fleet(
    args: &BenchArgs,
    model: &BenchModel,
    links: &[LinkSpec],
    topo: Option<&Topology>,
    delay_emulated: bool,
    hide: bool,
) -> Result<(Vec<Sample>, Value)> {
    let (tx, rx) = channel::<Msg>();
    let mut fleet = Fleet {
        exe: std::env::current_exe().context("cannot find this executable to start workers")?,
        secret: random_secret()?,
        procs: Vec::new(),
        readers: Vec::new(),
        tx,
    };
    let bind_ip = match topo {
        Some(_) => netns::SERVICE_IP.to_string(),
        None => "127.0.0.1".to_string(),
    };
    let trainer_ns = topo.map(|t| t.trainer_ns.as_str());
    let base = |role: &str| -> Vec<String> {
        let mut a = vec!["bench-worker".to_string(), role.to_string()];
        a.extend(model.to_args());
        a
    };
    let mut leader = base("trainer");
    leader.extend([
        "--rank=0".to_string(),
        format!("--world={}", args.trainers),
        format!("--gather={bind_ip}:0"),
        format!("--frames={bind_ip}"),
        format!("--receivers={}", args.receivers),
    ]);
    let bar = progress(links.len() as u64 * args.steps, "starting", hide);
    let mut other = Vec::new();
    fleet.spawn("rank 0", trainer_ns, leader)?;
    let listen = wait_for(
        &mut fleet,
        &rx,
        &bar,
        "rank 0",
        "listen",
        Some(LISTEN_LIMIT),
        &mut other,
    )?;
    let gather = listen["gather"]
        .as_str()
        .context("the listen line lacks `gather`")?;
    let frames: Vec<&str> = listen["frames"]
        .as_array()
        .context("the listen line lacks `frames`")?
        .iter()
        .filter_map(Value::as_str)
        .collect();
    for rank in 1..args.trainers {
        let mut a = base("trainer");
        a.extend([
            format!("--rank={rank}"),
            format!("--world={}", args.trainers),
            format!("--gather={gather}"),
        ]);
        fleet.spawn(&format!("rank {rank}"), trainer_ns, a)?;
    }
    for i in 0..args.receivers {
        let mut a = base("receiver");
        a.extend([
            format!("--index={i}"),
            format!("--frames={}", frames.join(",")),
        ]);
        let ns = topo.map(|t| t.receiver_ns[i].as_str());
        fleet.spawn(&format!("receiver {i}"), ns, a)?;
    }
    bar.set_message("building model");
    wait_for(&mut fleet, &rx, &bar, "rank 0", "built", None, &mut other)?;
    // Seeds go over unshaped links: they are not what is measured.
    bar.set_message("seeding");
    if let Some(t) = topo {
        t.shape(None)?;
    }
    fleet.command("seed")?;
    let seeded = wait_for(&mut fleet, &rx, &bar, "rank 0", "seeded", None, &mut other)?;

    let mut samples = Vec::new();
    for link in links {
        check_interrupt()?;
        if let Some(t) = topo {
            t.shape(Some(link))
                .with_context(|| format!("shaping the links as {}", link.name))?;
            if !hide {
                bar.suspend(|| eprint!("{}", t.describe_qdiscs()));
            }
        }
        for k in 0..args.steps {
            bar.set_message(format!("{} step {}/{}", link.name, k + 1, args.steps));
            fleet.command("step")?;
            let v = wait_for(&mut fleet, &rx, &bar, "rank 0", "step", None, &mut other)?;
            let diff_ms = v["diff_ms"].as_f64().unwrap_or(f64::NAN);
            for m in v["methods"].as_array().into_iter().flatten() {
                let s = Sample {
                    link: link.name.clone(),
                    rate_bps: (link.rate_bps > 0).then_some(link.rate_bps),
                    delay_us: (link.rate_bps > 0).then_some(link.delay_us),
                    delay_emulated,
                    step: v["step"].as_u64().unwrap_or(0),
                    method: m["method"].as_str().unwrap_or("?").to_string(),
                    sync_ms: m["sync_ms"].as_f64().unwrap_or(f64::NAN),
                    wire_bytes: m["wire_bytes"].as_u64().unwrap_or(0),
                    diff_ms,
                    changed_fraction: v["changed_fraction"].as_f64().unwrap_or(0.0),
                    digest_ok: m["digest_ok"].as_bool().unwrap_or(false),
                    timing: m["timing"].clone(),
                    codecs: m["codecs"].clone(),
                };
                if args.json {
                    bar.suspend(|| json_line(&s.json()));
                }
                samples.push(s);
            }
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    fleet.command("quit")?;
    let deadline = Instant::now() + EXIT_LIMIT;
    let mut failures = Vec::new();
    while !fleet.all_exited() {
        check_interrupt()?;
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(Msg::Log { role, line }) => eprintln!("[{role}] {line}"),
            Ok(Msg::Event { role, kind, body }) => other.push((format!("{role}:{kind}"), body)),
            Err(_) => {}
        }
        fleet.poll();
        if Instant::now() > deadline {
            failures.push(format!(
                "processes did not exit within {EXIT_LIMIT:?} of the end"
            ));
            break;
        }
    }
    for p in &fleet.procs {
        if let Some(s) = p.status.filter(|s| !s.success()) {
            failures.push(format!("{} exited with {s}", p.role));
        }
    }
    drop(fleet);
    if !failures.is_empty() {
        bail!("{}", failures.join("; "));
    }
    if samples.iter().any(|s| !s.digest_ok) {
        bail!("a receiver's digest differed from the trainer's (see above)");
    }
    Ok((samples, seeded))
}

fn report(
    args: &BenchArgs,
    methods: &[String],
    links: &[LinkSpec],
    samples: &[Sample],
    seeded: &Value,
) -> Result<()> {
    let names: Vec<String> = links.iter().map(|l| l.name.clone()).collect();
    let summaries = summarize(samples, &names, methods);
    let table = markdown(&summaries);
    if args.json {
        for s in &summaries {
            json_line(&s.json());
        }
    } else {
        let seeds: Vec<String> = seeded["methods"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|m| {
                format!(
                    "{} {:.0} ms",
                    m["method"].as_str().unwrap_or("?"),
                    m["sync_ms"].as_f64().unwrap_or(0.0)
                )
            })
            .collect();
        println!("seeds (unshaped, not measured): {}", seeds.join(", "));
        println!(
            "{:>8} {:>4} {:>10} {:>10} {:>10}",
            "link", "step", "method", "sync ms", "wire"
        );
        for s in samples {
            let t = &s.timing;
            let timing = match t["last_flush_ready_ms"].as_f64() {
                Some(ready) => format!(
                    "; last flush ready {ready:.0} ms, written {:.0} ms; receiver decode+apply \
                     {:.0} ms (last flush {:.0} ms)",
                    t["last_flush_written_ms"].as_f64().unwrap_or(0.0),
                    t["receiver_receive_ms"].as_f64().unwrap_or(0.0),
                    t["receiver_last_flush_ms"].as_f64().unwrap_or(0.0),
                ),
                None => String::new(),
            };
            println!(
                "{:>8} {:>4} {:>10} {:>10.1} {:>10}  diff {:.1} ms, floor {}{timing}{}",
                s.link,
                s.step,
                s.method,
                s.sync_ms,
                bytes(s.wire_bytes),
                s.diff_ms,
                opt(s.floor_ms(), |f| format!("{f:.1} ms")),
                if s.digest_ok { "" } else { ", DIGEST MISMATCH" }
            );
        }
        println!();
        print!("{table}");
        println!(
            "floor = diff time alone (slowest rank; deltas only) + wire bytes ÷ link rate; \
             ratios are medians of per-step ratios"
        );
    }
    if let Some(dir) = &args.out {
        // First, how the run was made, so that the file can be read on its own later.
        let mut lines = format!(
            "{}\n",
            json!({
                "type": "run", "preset": args.preset, "layers": args.layers,
                "steps": args.steps, "trainers": args.trainers, "receivers": args.receivers,
                "methods": args.methods, "lr": args.lr, "seed": args.seed,
                "bucket_size": args.bucket_size, "full_bucket_size": args.full_bucket_size,
                "chunk_elems": args.chunk_elems, "apply_as_received": args.apply_as_received,
                "loopback": args.loopback,
            })
        );
        for s in samples {
            lines.push_str(&format!("{}\n", s.json()));
        }
        for s in &summaries {
            lines.push_str(&format!("{}\n", s.json()));
        }
        std::fs::write(dir.join("results.jsonl"), lines)?;
        let made = format!(
            "\nRun: preset {}{}, {} steps, {} trainer ranks, {} receiver(s), methods {}, flushes \
             of up to {} bytes, chunks of {} elements, receivers {}{}.\n",
            args.preset,
            args.layers
                .map(|l| format!(" ({l} layers)"))
                .unwrap_or_default(),
            args.steps,
            args.trainers,
            args.receivers,
            args.methods,
            args.bucket_size,
            args.chunk_elems,
            if args.apply_as_received {
                "applying flushes as they arrive"
            } else {
                "staging each sync"
            },
            if args.loopback { ", loopback" } else { "" },
        );
        std::fs::write(dir.join("summary.md"), format!("{table}{made}"))?;
        let png = dir.join("bench.png");
        let shape = format!(
            "{}{}",
            args.preset,
            args.layers
                .map(|l| format!(" ({l} layers)"))
                .unwrap_or_default()
        );
        let points: Vec<plot::Point> = summaries
            .iter()
            .filter_map(|s| {
                Some(plot::Point {
                    method: s.method.clone(),
                    rate_gbit: s.rate_bps? as f64 / 1e9,
                    sync_s: s.sync_ms / 1e3,
                    floor_s: s.floor_ms.map(|f| f / 1e3),
                })
            })
            .collect();
        if points.is_empty() {
            eprintln!("no plot: a loopback run has no link rate to plot against");
        } else {
            let title = format!(
                "{shape}: sync time per step, {} trainer rank(s) to {} receiver(s){}",
                args.trainers,
                args.receivers,
                if samples.iter().any(|s| !s.delay_emulated) {
                    ", rate-shaped links"
                } else {
                    ""
                }
            );
            plot::draw(&png, &title, methods, &points)?;
            if !args.json {
                println!("wrote {}", png.display());
            }
        }
        if !args.json {
            println!(
                "wrote {} and {}",
                dir.join("results.jsonl").display(),
                dir.join("summary.md").display()
            );
        }
    }
    Ok(())
}

/// The layer count that brings `preset` nearest to `scale` times its parameters.
fn layers_for_scale(preset: &str, scale: f64) -> Result<u64> {
    if !(scale.is_finite() && scale > 0.0) {
        bail!("--scale must be a positive number, got {scale}");
    }
    let Some(shape) = crate::synthetic::preset(preset) else {
        bail!("unknown preset `{preset}`");
    };
    let params = |layers: u64| {
        crate::synthetic::ModelShape { layers, ..shape }
            .slot_table()
            .total_elements() as f64
    };
    let (fixed, per_layer) = (params(0), params(1) - params(0));
    let target = scale * params(shape.layers);
    let layers = ((target - fixed) / per_layer).round().max(1.0);
    if layers > 100_000.0 {
        bail!("--scale {scale} asks for {layers} layers");
    }
    Ok(layers as u64)
}

#[cfg(test)]
mod scale_tests {
    use super::layers_for_scale;

    #[test]
    fn scale_picks_the_nearest_layer_count() {
        assert_eq!(layers_for_scale("qwen2.5-0.5b", 1.0).unwrap(), 24);
        let half = layers_for_scale("qwen2.5-0.5b", 0.5).unwrap();
        // 0.5B: ~136 M embedding + 24 × ~14.9 M per layer; half the parameters is ~7 layers.
        assert!((6..=8).contains(&half), "{half}");
        assert_eq!(layers_for_scale("tiny", 0.001).unwrap(), 1);
        assert!(layers_for_scale("qwen2.5-0.5b", 3.0).unwrap() > 72);
        assert!(layers_for_scale("qwen2.5-0.5b", 0.0).is_err());
        assert!(layers_for_scale("qwen2.5-0.5b", f64::NAN).is_err());
        assert!(layers_for_scale("nope", 1.0).is_err());
    }
}
