//! The processes of `deltacast bench` (hidden `deltacast bench-worker …`).
//!
//! - `trainer --rank 0` (the leader) binds the gather collective and one frame server per
//!   method on the address it is given (its namespace's service address, or 127.0.0.1), prints
//!   them, then takes commands from the parent on stdin: `seed`, `step`, `quit`. It forwards
//!   each command to the other ranks through the collective, so every rank makes the same calls.
//! - Every rank holds an FSDP `Shard(0)` block of every tensor of the synthetic model, one
//!   [`RankSender`](deltacast::sharded::RankSender) per delta method (each with its own snapshot
//!   and codec), and one more snapshot used only to time the diff alone.
//! - Per `step`: every rank takes an AdamW-like step; the ranks time a bare diff of their shard
//!   against the previous step (the floor's diff term, the slowest rank counts); then every
//!   method syncs the same step in turn, in an order that rotates each step so drift hits all
//!   methods alike. Each sync is timed on the leader from the moment every rank is ready until
//!   every receiver acked.
//! - `full` is a plain full BF16 broadcast through the same transport: ranks send their raw
//!   shards to the leader, which cuts the whole model into buckets and broadcasts them
//!   (gathering bucket k+1 while bucket k is on the wire); receivers copy them into place and
//!   ack on the last one. After the timer stops, each receiver hashes what it holds into the
//!   same state digest deltacast uses and the leader checks it against the ranks' digest.
//! - `worker receiver` keeps one state per method and a thread per method's connection.
//!
//! The ranks are [`trainer`], the receivers [`receiver`]; this module holds their command
//! lines.

use std::net::{IpAddr, SocketAddr};

use anyhow::{bail, Context, Result};
use clap::{Args, Subcommand};

use deltacast_net::NetConfig;

use crate::output::ByteSize;
use crate::processes::exit_when_parent_goes;
use crate::synthetic::{preset, ModelShape, PRESETS};
use crate::WireArgs;

mod receiver;
mod trainer;

/// Magic of a full-broadcast bucket frame.
const FULL_MAGIC: &[u8; 8] = b"DCBFULL1";
/// Header of a full-broadcast bucket: magic, step, index, final, pad, offset.
const FULL_HEADER: usize = 32;

/// What every process of a bench run is started with (all must agree).
#[derive(Args, Debug, Clone)]
pub struct BenchModel {
    /// Model shape (as `bench --preset`).
    #[arg(long)]
    pub preset: String,
    /// Transformer layers, overriding the preset's.
    #[arg(long)]
    pub layers: Option<u64>,
    /// Learning rate of the AdamW-like generator.
    #[arg(long)]
    pub lr: f32,
    /// Seed of the random weights and updates (every process must use the same).
    #[arg(long)]
    pub seed: u64,
    /// Comma-separated: `full` and codec names (`abs32+raw`, `auto`, …).
    #[arg(long)]
    pub methods: String,
    /// Largest deltacast flush (4096, 64K, 512M, 1G).
    #[arg(long, value_parser = ByteSize::parse)]
    pub bucket_size: ByteSize,
    /// Bucket of the full broadcast.
    #[arg(long, value_parser = ByteSize::parse)]
    pub full_bucket_size: ByteSize,
    /// Elements per chunk.
    #[arg(long)]
    pub chunk_elems: u64,
    /// Receivers write each flush of a delta as it arrives (`Receiver::set_apply_as_received`).
    #[arg(long)]
    pub apply_as_received: bool,
}

impl BenchModel {
    pub fn shape(&self) -> Result<ModelShape> {
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

    pub fn methods(&self) -> Result<Vec<Method>> {
        let mut out: Vec<Method> = Vec::new();
        for m in self
            .methods
            .split(',')
            .map(str::trim)
            .filter(|m| !m.is_empty())
        {
            let method = if m == "full" {
                Method::Full
            } else {
                let wire = self.wire(m);
                let config = wire.config()?;
                Method::Delta {
                    codec: m.to_string(),
                    config,
                }
            };
            if out.iter().any(|o| o.name() == method.name()) {
                bail!("method `{m}` is listed twice");
            }
            out.push(method);
        }
        if out.is_empty() {
            bail!("no methods given");
        }
        Ok(out)
    }

    fn wire(&self, codec: &str) -> WireArgs {
        WireArgs {
            bucket_size: self.bucket_size,
            codec: codec.to_string(),
            chunk_elems: self.chunk_elems,
        }
    }

    pub fn to_args(&self) -> Vec<String> {
        let mut a = vec![
            format!("--preset={}", self.preset),
            format!("--lr={}", self.lr),
            format!("--seed={}", self.seed),
            format!("--methods={}", self.methods),
            format!("--bucket-size={}", self.bucket_size.arg()),
            format!("--full-bucket-size={}", self.full_bucket_size.arg()),
            format!("--chunk-elems={}", self.chunk_elems),
        ];
        if let Some(l) = self.layers {
            a.push(format!("--layers={l}"));
        }
        if self.apply_as_received {
            a.push("--apply-as-received".into());
        }
        a
    }

    /// Link settings for one method's frame connection (frames up to its bucket size).
    fn net_config(&self, method: &Method) -> Result<NetConfig> {
        let bucket = match method {
            Method::Full => self.full_bucket_size.bytes() + FULL_HEADER as u64,
            Method::Delta { .. } => self.bucket_size.bytes(),
        };
        Ok(NetConfig::from_env_or_file(None)?.with_bucket_size(bucket))
    }
}

/// One way of syncing a step.
#[derive(Debug, Clone)]
pub enum Method {
    /// The whole model in BF16, every step.
    Full,
    /// deltacast with this codec.
    Delta {
        codec: String,
        config: deltacast::FlushConfig,
    },
}

impl Method {
    pub fn name(&self) -> String {
        match self {
            Method::Full => "full".into(),
            Method::Delta { codec, .. } => codec.clone(),
        }
    }
}

/// The hidden `deltacast bench-worker …` processes.
#[derive(Subcommand, Debug)]
pub enum BenchWorker {
    /// One trainer rank; rank 0 also serves frames and takes the parent's commands.
    Trainer {
        /// This rank (0 is the leader).
        #[arg(long)]
        rank: usize,
        /// Trainer ranks in all.
        #[arg(long)]
        world: usize,
        /// Rank 0: the address to bind (port 0); others: the leader's address.
        #[arg(long)]
        gather: String,
        /// Rank 0: the IP the frame servers bind (one port per method).
        #[arg(long)]
        frames: Option<String>,
        /// Rank 0: receivers to wait for.
        #[arg(long, default_value_t = 0)]
        receivers: usize,
        #[command(flatten)]
        model: BenchModel,
    },
    /// One receiver: one connection and one state per method.
    Receiver {
        /// This receiver's number (its host, for messages).
        #[arg(long)]
        index: usize,
        /// The leader's frame servers, comma-separated, in method order.
        #[arg(long)]
        frames: String,
        #[command(flatten)]
        model: BenchModel,
    },
}

pub fn run(role: BenchWorker) -> Result<()> {
    match role {
        BenchWorker::Trainer {
            rank,
            world,
            gather,
            frames,
            receivers,
            model,
        } => trainer::trainer(rank, world, &gather, frames.as_deref(), receivers, &model),
        BenchWorker::Receiver {
            index,
            frames,
            model,
        } => {
            exit_when_parent_goes();
            receiver::receiver(index, &frames, &model)
        }
    }
}

/// Only loopback or the bench's own namespace addresses (10.77.0.0/16).
fn allowed_ip(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_loopback() || (v4.octets()[0] == 10 && v4.octets()[1] == 77),
        IpAddr::V6(v6) => v6.is_loopback(),
    }
}

fn bench_addr(text: &str, what: &str) -> Result<SocketAddr> {
    let a: SocketAddr = text
        .parse()
        .with_context(|| format!("{what} `{text}` is not an IP:port address"))?;
    if !allowed_ip(a.ip()) {
        bail!("{what} {a}: the bench uses 127.0.0.1 or its own 10.77.x.y namespace addresses only");
    }
    Ok(a)
}
