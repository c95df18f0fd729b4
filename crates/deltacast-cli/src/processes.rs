//! `deltacast demo --processes`: every trainer rank and every receiver is its own OS process,
//! joined over loopback TCP, so the sharded trainer side runs as it would across machines.
//!
//! The parent spawns this same binary with the hidden `worker` subcommands:
//!
//! - `worker trainer --rank 0` (the leader) binds the gather collective and the frame server on
//!   port 0 and prints their addresses; the parent then starts ranks `1..N` and the receivers
//!   with those addresses.
//! - Every rank builds and steps only its FSDP `Shard(0)` block of each tensor, and syncs through
//!   [`RankSender`](deltacast::sharded::RankSender) (lockstep gather to the leader); the leader
//!   broadcasts each frame to the receivers, collects their acks and checks them against its
//!   state digest.
//! - `worker receiver` applies frames with [`deltacast::Receiver`] and acks every sync.
//!
//! Children talk to the parent through tagged lines on stdout (`@deltacast KIND {json}`); their
//! stderr is passed through prefixed with their role. A random shared secret authenticates every
//! connection (`DELTACAST_SECRET`, never on a command line); servers bind 127.0.0.1 only. Each
//! child exits when its stdin closes, so no process outlives the parent even when the parent is
//! killed; the parent kills the remaining children by PID when one fails and the others have not
//! exited within a grace period.
//!
//! The parent is [`parent`], the workers [`trainer`] and [`receiver`]; this module holds their
//! command lines and what they share.

use std::io::{Read, Write};
use std::net::SocketAddr;
use std::thread;

use anyhow::{anyhow, bail, Context, Result};
use clap::{Args, Subcommand};
use serde_json::Value;

use deltacast::slot_map::{ParamSpec, SlotMap};
use deltacast_net::NetConfig;

use crate::synthetic::{preset, ModelShape, PRESETS};
use crate::WireArgs;

mod parent;
mod receiver;
mod trainer;

pub use parent::{run, ProcessDemo};
pub(crate) use trainer::{check_acks, fsdp_plans, HookedCollective};

/// Prefix of the lines children write to stdout for the parent.
pub(crate) const TAG: &str = "@deltacast ";
/// Reason the leader gives receivers when the run ended well (they then exit 0).
pub(crate) const DONE: &str = "demo finished";

/// What every process of one run is started with: the model, the steps and the wire settings
/// (which all must agree on), and whether to exit when stdin closes.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// Exit when stdin closes: the parent holds it open, so a worker never outlives it.
    #[arg(long)]
    watch_stdin: bool,
    /// Model shape (as `demo --preset`).
    #[arg(long)]
    preset: String,
    /// Transformer layers, overriding the preset's.
    #[arg(long)]
    layers: Option<u64>,
    /// Optimizer steps after the seed.
    #[arg(long)]
    steps: u64,
    /// Learning rate of the AdamW-like generator.
    #[arg(long)]
    lr: f32,
    /// Seed of the random weights and updates (every process must use the same).
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
            format!("--bucket-size={}", self.wire.bucket_size.arg()),
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
        /// This rank (0 is the leader).
        #[arg(long)]
        rank: usize,
        /// Trainer ranks in all.
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
        /// This receiver's number (for messages).
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
        } => trainer::trainer(rank, world, &gather, frames.as_deref(), receivers, &model),
        WorkerRole::Receiver {
            index,
            frames,
            model,
        } => receiver::receiver(index, &frames, &model),
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
    Ok(NetConfig::from_env_or_file(None)?.with_bucket_size(wire.bucket_size.bytes()))
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

/// A random per-run secret: 32 bytes, hex.
pub(crate) fn random_secret() -> Result<String> {
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).map_err(|e| anyhow!("no system randomness for the secret: {e}"))?;
    Ok(key.iter().map(|b| format!("{b:02x}")).collect())
}
