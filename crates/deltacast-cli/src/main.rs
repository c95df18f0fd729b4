//! The `deltacast` command line.

mod bench;
mod demo;
mod files;
mod gpu_report;
mod output;
mod processes;
mod soak;
mod stats;
mod synthetic;

use std::path::PathBuf;

use anyhow::{bail, Result};
use clap::{Args, Parser, Subcommand};
use deltacast::flush::{FlushConfig, DEFAULT_BUCKET_SIZE, DEFAULT_CHUNK_ELEMS};
use deltacast::{CodecChoice, PosCodec, ValCodec};

use output::ByteSize;

/// Lossless delta sync of model weights: send only the elements whose bits changed, and prove
/// the receivers' bits equal the sender's.
#[derive(Parser)]
#[command(name = "deltacast", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Sender and receivers in one process on a built-in synthetic model: seed, then N AdamW-like steps.
    Demo(demo::DemoArgs),
    /// Write the sync that turns OLD into NEW to a .dcast file (carries OLD's digest).
    Diff {
        /// The checkpoint the receivers hold (safetensors).
        old: PathBuf,
        /// The checkpoint to bring them to: the same tensor names, dtypes and shapes.
        new: PathBuf,
        /// The sync file to write (atomically: all of it or nothing).
        #[arg(short, long)]
        output: PathBuf,
        /// Version the delta brings a receiver to (the base is this minus one).
        #[arg(long, default_value_t = 1)]
        version: u64,
        #[command(flatten)]
        wire: WireArgs,
        /// One JSON object instead of a line of text.
        #[arg(long)]
        json: bool,
    },
    /// Apply a .dcast file to BASE and write the result to OUT (never a partial OUT).
    Apply {
        /// The checkpoint the delta was made from (its digests are checked first).
        base: PathBuf,
        /// The sync file `diff` wrote.
        delta: PathBuf,
        /// The checkpoint to write (atomically: all of it or nothing).
        #[arg(short, long)]
        output: PathBuf,
        /// One JSON object instead of a line of text.
        #[arg(long)]
        json: bool,
    },
    /// Wire bytes of one step (OLD NEW) or of every step of a trace (--trace T --base B), against the entropy bound of docs/codecs.md.
    Stats {
        /// The checkpoint before the step (safetensors).
        old: Option<PathBuf>,
        /// The checkpoint after the step.
        new: Option<PathBuf>,
        /// A recorded trace: `step{k}::{param}::idx` (I32 positions) and `::val` (new values)
        /// tensors, as in crates/deltacast/tests/data/traces/trace_dense_lr1e-06.safetensors.
        #[arg(long, requires = "base", conflicts_with_all = ["old", "new"])]
        trace: Option<PathBuf>,
        /// The trace's base checkpoint (`base::{param}` tensors, e.g.
        /// crates/deltacast/tests/data/traces/trace_dense_lr1e-06_base.safetensors).
        #[arg(long, requires = "trace")]
        base: Option<PathBuf>,
        #[command(flatten)]
        wire: WireArgs,
        /// One JSON object per step (and a total) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Sync time of a full broadcast, abs32+raw and deltacast across hosts on shaped links (network namespaces + tc; needs root, or --loopback).
    Bench(bench::BenchArgs),
    /// Internal: one process of `bench` (a trainer rank or a receiver).
    #[command(hide = true)]
    BenchWorker {
        #[command(subcommand)]
        role: bench::worker::BenchWorker,
    },
    /// Internal: one process of `demo --processes` (a trainer rank or a receiver).
    #[command(hide = true)]
    Worker {
        #[command(subcommand)]
        role: processes::WorkerRole,
    },
    /// One trainer and N receivers over loopback for many syncs with random faults (drops, corruption, restarts, tampering, slow readers); reports recovery and memory.
    Soak(soak::SoakArgs),
    /// The GPU sync benchmarks' results (the JSON files of scripts/gpu-bench.sh, or of bench/gpu_sharded.py) as a table and, with --out, a bar chart (PNG).
    GpuReport {
        /// Result files of one bench (all of scripts/gpu-bench.sh, or all of gpu_sharded.py).
        files: Vec<PathBuf>,
        /// Also draw the medians as a bar chart into this PNG file.
        #[arg(short, long)]
        out: Option<PathBuf>,
        /// The chart's title.
        #[arg(long, default_value = "GPU sync on 2 H200s: median per step")]
        title: String,
    },
    /// Show a .dcast file: frame headers, manifest summary, codecs, sizes.
    Inspect {
        /// The sync file to read.
        file: PathBuf,
        /// One line per chunk: its slot (and tensor, with --names), the elements it spans as
        /// START..END (END excluded; an 8-byte element counts as two), its changes, codecs and
        /// section bytes.
        #[arg(long)]
        chunks: bool,
        /// A checkpoint holding the sync's tensors (its OLD, NEW or BASE), to name the slots.
        #[arg(long, value_name = "CHECKPOINT")]
        names: Option<PathBuf>,
        /// One JSON object per frame (and chunk), then a summary, instead of text.
        #[arg(long)]
        json: bool,
    },
}

/// How syncs are cut and coded.
#[derive(Args, Clone, Debug)]
pub struct WireArgs {
    /// Largest flush (frame), in bytes or with a binary suffix: 4096, 64K, 512M, 1G.
    #[arg(long, default_value = "512M", value_parser = ByteSize::parse)]
    bucket_size: ByteSize,
    /// Codec: `auto` (cheapest per chunk), `auto+ctx` (also the context codecs, `ctxgaps`
    /// positions and `ctx` values, for receivers that hold every element of a chunk; no GPU
    /// decoder yet) or POS+VAL, e.g. `abs32+raw`, `gaps+ulp`, `ctx+ctx`, `steps+esc` (a pair:
    /// fixed-width codes for GPU kernels); integer, bool and 8-byte tensors always get raw
    /// values.
    #[arg(long, default_value = "auto")]
    codec: String,
    /// Elements per chunk (the unit of parallel decoding).
    #[arg(long, default_value_t = DEFAULT_CHUNK_ELEMS)]
    chunk_elems: u64,
}

impl WireArgs {
    pub fn config(&self) -> Result<FlushConfig> {
        let Some(codec) = CodecChoice::parse(&self.codec) else {
            let names = |n: &mut dyn Iterator<Item = &str>| n.collect::<Vec<_>>().join("/");
            bail!(
                "unknown codec `{}`: use auto, auto+raw, auto+ctx or POS+VAL with POS in {} and VAL in {} (`steps` goes only with `esc`)",
                self.codec,
                names(&mut PosCodec::ALL.iter().map(|c| c.name())),
                names(&mut ValCodec::ALL.iter().map(|c| c.name())),
            );
        };
        let bucket_size = usize::try_from(self.bucket_size.bytes())?;
        let config = FlushConfig {
            bucket_size,
            chunk_elems: self.chunk_elems,
            codec,
        };
        config.validate()?;
        Ok(config)
    }

    /// The largest flush as the user gave it.
    pub fn bucket_size(&self) -> ByteSize {
        self.bucket_size
    }
}

impl Default for WireArgs {
    fn default() -> Self {
        WireArgs {
            bucket_size: ByteSize::from_bytes(DEFAULT_BUCKET_SIZE as u64),
            codec: "auto".into(),
            chunk_elems: DEFAULT_CHUNK_ELEMS,
        }
    }
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Demo(args) => demo::run(args),
        Command::Diff {
            old,
            new,
            output,
            version,
            wire,
            json,
        } => files::diff(&old, &new, &output, version, &wire, json),
        Command::Apply {
            base,
            delta,
            output,
            json,
        } => files::apply(&base, &delta, &output, json),
        Command::Inspect {
            file,
            chunks,
            names,
            json,
        } => files::inspect(&file, chunks, names.as_deref(), json),
        Command::GpuReport { files, out, title } => gpu_report::run(&files, out.as_deref(), &title),
        Command::Worker { role } => processes::worker(role),
        Command::Bench(args) => bench::run(args),
        Command::Soak(args) => soak::run(args),
        Command::BenchWorker { role } => bench::worker::run(role),
        Command::Stats {
            old,
            new,
            trace,
            base,
            wire,
            json,
        } => match (old, new, trace, base) {
            (Some(old), Some(new), None, None) => stats::stats_files(&old, &new, &wire, json),
            (None, None, Some(trace), Some(base)) => stats::stats_trace(&trace, &base, &wire, json),
            _ => Err(anyhow::anyhow!(
                "give OLD NEW, or --trace TRACE --base BASE"
            )),
        },
    };
    if let Err(e) = result {
        eprintln!("deltacast: error: {}", output::error_chain(&e));
        std::process::exit(1);
    }
}
