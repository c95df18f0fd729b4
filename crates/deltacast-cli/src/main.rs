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
use deltacast::CodecChoice;

/// Lossless delta sync of model weights: send only the elements whose bits changed.
#[derive(Parser)]
#[command(name = "deltacast", version, about)]
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
        old: PathBuf,
        new: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
        /// Version the delta brings a receiver to (the base is this minus one).
        #[arg(long, default_value_t = 1)]
        version: u64,
        #[command(flatten)]
        wire: WireArgs,
        #[arg(long)]
        json: bool,
    },
    /// Apply a .dcast file to BASE and write the result to OUT (never a partial OUT).
    Apply {
        base: PathBuf,
        delta: PathBuf,
        #[arg(short, long)]
        output: PathBuf,
        #[arg(long)]
        json: bool,
    },
    /// Wire bytes of one step (OLD NEW) or of every step of a trace (--trace T --base B), against the entropy bound.
    Stats {
        old: Option<PathBuf>,
        new: Option<PathBuf>,
        /// A recorded trace (step{k}::{param}::idx / ::val tensors).
        #[arg(long, requires = "base", conflicts_with_all = ["old", "new"])]
        trace: Option<PathBuf>,
        /// The trace's base checkpoint (base::{param} tensors).
        #[arg(long, requires = "trace")]
        base: Option<PathBuf>,
        #[command(flatten)]
        wire: WireArgs,
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
        files: Vec<PathBuf>,
        #[arg(short, long)]
        out: Option<PathBuf>,
        #[arg(long, default_value = "GPU sync on 2 H200s: median per step")]
        title: String,
    },
    /// Show a .dcast file: frame headers, manifest summary, codecs, sizes.
    Inspect {
        file: PathBuf,
        /// One line per chunk.
        #[arg(long)]
        chunks: bool,
        #[arg(long)]
        json: bool,
    },
}

/// How syncs are cut and coded.
#[derive(Args, Clone, Debug)]
pub struct WireArgs {
    /// Largest flush in bytes (suffixes K, M, G accepted).
    #[arg(long, default_value = "512M", value_parser = parse_size)]
    bucket_size: u64,
    /// Codec: `auto` (cheapest per chunk) or POS+VAL, e.g. `abs32+raw`, `gaps+ulp`, `bitmap+raw`.
    #[arg(long, default_value = "auto")]
    codec: String,
    /// Elements per chunk.
    #[arg(long, default_value_t = DEFAULT_CHUNK_ELEMS)]
    chunk_elems: u64,
}

impl WireArgs {
    pub fn config(&self) -> Result<FlushConfig> {
        let Some(codec) = CodecChoice::parse(&self.codec) else {
            bail!("unknown codec `{}`: use auto or POS+VAL with POS in all/abs32/gaps/bitmap and VAL in raw/ulp", self.codec);
        };
        let bucket_size = usize::try_from(self.bucket_size)?;
        let config = FlushConfig {
            bucket_size,
            chunk_elems: self.chunk_elems,
            codec,
        };
        config.validate()?;
        Ok(config)
    }
}

impl Default for WireArgs {
    fn default() -> Self {
        WireArgs {
            bucket_size: DEFAULT_BUCKET_SIZE as u64,
            codec: "auto".into(),
            chunk_elems: DEFAULT_CHUNK_ELEMS,
        }
    }
}

/// Parses `4096`, `64K`, `512M`, `1G` (binary multiples).
pub fn parse_size(text: &str) -> Result<u64, String> {
    let t = text.trim();
    let (digits, shift) = match t.chars().last().map(|c| c.to_ascii_uppercase()) {
        Some('K') => (&t[..t.len() - 1], 10),
        Some('M') => (&t[..t.len() - 1], 20),
        Some('G') => (&t[..t.len() - 1], 30),
        _ => (t, 0),
    };
    let n: u64 = digits
        .trim()
        .parse()
        .map_err(|_| format!("`{text}` is not a size (e.g. 4096, 64K, 512M, 1G)"))?;
    n.checked_mul(1 << shift)
        .ok_or_else(|| format!("`{text}` is too large"))
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
        Command::Inspect { file, chunks, json } => files::inspect(&file, chunks, json),
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
        eprintln!("deltacast: error: {e:#}");
        std::process::exit(1);
    }
}
