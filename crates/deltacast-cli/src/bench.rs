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
//!
//! The processes and signals are [`fleet`], the figures and the report [`results`].

mod fleet;
pub mod netns;
pub(crate) mod plot;
mod results;
pub mod worker;

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::mpsc::channel;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::Value;

use deltacast::flush::DEFAULT_CHUNK_ELEMS;

use crate::output::{bytes, count, json_line, progress, ByteSize};
use crate::processes::random_secret;
use fleet::{check_interrupt, install_signal_handlers, wait_for, Fleet, Msg};
use netns::{LinkSpec, Topology};
use results::{report, Sample};
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
    #[arg(long, default_value = "512M", value_parser = ByteSize::parse)]
    bucket_size: ByteSize,
    /// Bucket of the full broadcast (gathered and sent in a pipeline).
    #[arg(long, default_value = "64M", value_parser = ByteSize::parse)]
    full_bucket_size: ByteSize,
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
            "deltacast bench: {} ({:.1} M BF16 parameters, full copy {}), {} on one host, {}; \
             methods {}; {} per link, lr {:e}, flushes of up to {}",
            shape.name,
            table.total_elements() as f64 / 1e6,
            bytes(table.total_bytes()),
            count(args.trainers as u64, "trainer rank", "trainer ranks"),
            count(args.receivers as u64, "receiver host", "receiver hosts"),
            methods.join(", "),
            count(args.steps, "step", "steps"),
            args.lr,
            args.bucket_size,
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
