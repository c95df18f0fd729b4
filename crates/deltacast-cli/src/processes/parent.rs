//! The parent of `demo --processes`: starts the trainer ranks and receivers, prints the
//! leader's per-step report, and stops every child when one fails.

use std::io::{BufRead, BufReader};
use std::process::{Child, ChildStdin, Command, ExitStatus, Stdio};
use std::sync::mpsc::{channel, RecvTimeoutError, Sender as ChannelTx};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use serde_json::Value;

use crate::output::{bytes, count, hex64, json_line};
use crate::WireArgs;

use super::{random_secret, ModelArgs, TAG};

/// How long the others get to exit on their own after one process failed.
const GRACE: Duration = Duration::from_secs(5);
/// How long the leader may take to report its addresses.
const LISTEN_LIMIT: Duration = Duration::from_secs(60);

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
            "deltacast demo: {} ({}, {:.1} M BF16 parameters, full copy {}), {} (FSDP \
             Shard(0)), {}, loopback TCP, lr {:e}, codec {}, bucket {}",
            shape.name,
            count(table.len() as u64, "tensor", "tensors"),
            table.total_elements() as f64 / 1e6,
            bytes(table.total_bytes()),
            count(opts.trainers as u64, "trainer process", "trainer processes"),
            count(
                opts.receivers as u64,
                "receiver process",
                "receiver processes"
            ),
            opts.lr,
            config.codec.name(),
            opts.wire.bucket_size(),
        );
        // Nothing else is printed until the seed (step 0) is synced, seconds on a large model.
        eprintln!("starting the processes, building the model and seeding the receivers…");
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
                Some(n) => format!(
                    "full digest recomputation: {}",
                    count(n, "slot differs", "slots differ")
                ),
                None => String::new(),
            };
            let dropped = if r["dropped_staged_sync"].as_bool() == Some(true) {
                ", dropped a half-received sync"
            } else {
                ""
            };
            lines.push(format!(
                "receiver {}: {at} (state digest {}){dropped}; {check}",
                r["index"],
                hex64(r["state_digest"].as_u64().unwrap_or(0))
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
