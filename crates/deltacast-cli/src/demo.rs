//! `deltacast demo`: a sender and receivers in one process, on a synthetic Qwen-shaped model.

use std::sync::mpsc::{sync_channel, Receiver as ChannelRx, SyncSender};
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use clap::Args;
use serde_json::json;

use deltacast::WeightSender;
use deltacast::{FrameKind, Receiver, Sender};

use crate::output::{bytes, count, hex64, json_line, phase, progress};
use crate::synthetic::{preset, SyntheticModel, PRESETS};
use crate::WireArgs;

#[derive(Args, Debug)]
pub struct DemoArgs {
    /// Model shape: tiny, qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-7b.
    #[arg(long, default_value = "qwen2.5-0.5b")]
    preset: String,
    /// Override the number of transformer layers (scales the model size).
    #[arg(long)]
    layers: Option<u64>,
    /// Optimizer steps after the seed.
    #[arg(long, default_value_t = 5)]
    steps: u64,
    /// Learning rate of the AdamW-like generator.
    #[arg(long, default_value_t = 1e-6)]
    lr: f32,
    /// Receivers (threads, each with its own copy of the weights; processes with --processes).
    #[arg(long, default_value_t = 2)]
    receivers: usize,
    /// Trainer ranks, each holding an FSDP Shard(0) of every tensor (needs --processes above 1).
    #[arg(long, default_value_t = 1)]
    trainers: usize,
    /// Run every trainer rank and receiver as its own OS process, over loopback TCP.
    #[arg(long)]
    processes: bool,
    /// Seed of the random weights and updates.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[command(flatten)]
    wire: WireArgs,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
}

/// A receiver thread's answer to one sync.
enum Ack {
    Applied {
        receiver: usize,
        version: u64,
        digest: u64,
    },
    Failed {
        receiver: usize,
        error: String,
    },
}

/// Frames in flight per receiver: the sender runs at most this far ahead.
const CHANNEL_DEPTH: usize = 2;

pub fn run(args: DemoArgs) -> Result<()> {
    if args.processes {
        return crate::processes::run(crate::processes::ProcessDemo {
            preset: args.preset,
            layers: args.layers,
            steps: args.steps,
            lr: args.lr,
            seed: args.seed,
            wire: args.wire,
            trainers: args.trainers,
            receivers: args.receivers,
            json: args.json,
        });
    }
    if args.trainers != 1 {
        bail!(
            "--trainers {} needs --processes (the one-process demo has one sender)",
            args.trainers
        );
    }
    let Some(mut shape) = preset(&args.preset) else {
        let names: Vec<_> = PRESETS.iter().map(|p| p.name).collect();
        bail!(
            "unknown preset `{}` (choose one of {})",
            args.preset,
            names.join(", ")
        );
    };
    if let Some(layers) = args.layers {
        shape.layers = layers;
    }
    if args.receivers == 0 {
        bail!("--receivers must be at least 1");
    }
    let config = args.wire.config()?;
    let hide = args.json;

    let total = shape.slot_table().total_elements();
    let bar = progress(total, "building model", hide);
    let mut model = SyntheticModel::new(&shape, args.seed, |n| bar.inc(n));
    bar.finish_and_clear();
    let table = model.table.clone();
    let full_bytes = table.total_bytes();
    if !args.json {
        println!(
            "deltacast demo: {} ({}, {:.1} M BF16 parameters, full copy {}), {}, lr {:e}, codec {}, bucket {}",
            shape.name,
            count(table.len() as u64, "tensor", "tensors"),
            total as f64 / 1e6,
            bytes(full_bytes),
            count(args.receivers as u64, "receiver", "receivers"),
            args.lr,
            config.codec.name(),
            args.wire.bucket_size(),
        );
    }

    // Receiver threads: each owns a Receiver and answers every completed sync with an ack.
    let (ack_tx, ack_rx) = sync_channel::<Ack>(args.receivers * 4);
    let mut frame_txs: Vec<SyncSender<Arc<Vec<u8>>>> = Vec::new();
    let mut handles = Vec::new();
    for index in 0..args.receivers {
        let (tx, rx) = sync_channel::<Arc<Vec<u8>>>(CHANNEL_DEPTH);
        frame_txs.push(tx);
        let table = table.clone();
        let acks = ack_tx.clone();
        handles.push(thread::spawn(move || {
            receiver_loop(index, Receiver::new(table), rx, acks)
        }));
    }
    drop(ack_tx);

    let mut sender = Sender::new(table.clone(), config)?;
    let mut all_ok = true;
    if !args.json {
        println!(
            "{:>4}  {:>6}  {:>9}  {:>11}  {:>11}  {:>7}  {:>9}  {:>7}  digest",
            "step", "kind", "changed", "wire", "full", "ratio", "sync ms", "flushes"
        );
    }
    for step in 0..=args.steps {
        let mut train_ms = 0.0;
        if step > 0 {
            let bar = progress(total, "optimizer step", hide);
            let t = Instant::now();
            model.step(args.lr, |n| bar.inc(n));
            train_ms = t.elapsed().as_secs_f64() * 1e3;
            bar.finish_and_clear();
        }
        // The seed carries the whole model (seconds on a large one): show how far it got.
        let seed_bar = (step == 0).then(|| {
            phase(
                full_bytes,
                &format!(
                    "seeding {}",
                    count(args.receivers as u64, "receiver", "receivers")
                ),
                args.json,
            )
        });
        let started = Instant::now();
        let report = sender.sync(&model.slices(), |frame| {
            if let Some(bar) = &seed_bar {
                bar.inc(frame.len() as u64);
            }
            let frame = Arc::new(frame);
            for tx in &frame_txs {
                tx.send(Arc::clone(&frame)).map_err(|_| {
                    deltacast::Error::IncompleteSync("a receiver thread stopped".into())
                })?;
            }
            Ok(())
        })?;
        if let Some(bar) = &seed_bar {
            bar.set_message("receivers applying");
        }
        let mut digest_ok = true;
        for _ in 0..args.receivers {
            match ack_rx.recv().context("receiver threads ended early")? {
                Ack::Applied {
                    receiver,
                    version,
                    digest,
                } => {
                    if version != sender.version() || digest != report.state_digest {
                        digest_ok = false;
                        eprintln!(
                            "receiver {receiver}: acked version {version} digest {}, sender has {} {}",
                            hex64(digest),
                            sender.version(),
                            hex64(report.state_digest)
                        );
                    }
                }
                Ack::Failed { receiver, error } => {
                    digest_ok = false;
                    eprintln!("receiver {receiver}: sync failed: {error}");
                }
            }
        }
        let sync_ms = started.elapsed().as_secs_f64() * 1e3;
        if let Some(bar) = seed_bar {
            bar.finish_and_clear();
        }
        all_ok &= digest_ok;
        let s = &report.stats;
        let kind = if report.kind == FrameKind::Seed {
            "seed"
        } else {
            "delta"
        };
        if args.json {
            json_line(&json!({
                "step": step, "kind": kind, "version": s.version, "changed": s.changed, "elements": report.elements,
                "changed_fraction": s.changed as f64 / report.elements.max(1) as f64,
                "wire_bytes": s.wire_bytes, "full_bytes": full_bytes, "section_bytes": s.section_bytes,
                "flushes": s.flushes, "max_flush_bytes": s.max_flush_bytes, "chunks": s.chunks, "codecs": s.codecs,
                "sync_ms": sync_ms, "train_ms": train_ms, "digest_ok": digest_ok, "receivers": args.receivers,
            }));
        } else {
            println!(
                "{:>4}  {:>6}  {:>8.3}%  {:>11}  {:>11}  {:>6.1}x  {:>9.1}  {:>7}  {}",
                step,
                kind,
                100.0 * s.changed as f64 / report.elements.max(1) as f64,
                bytes(s.wire_bytes),
                bytes(full_bytes),
                full_bytes as f64 / s.wire_bytes.max(1) as f64,
                sync_ms,
                s.flushes,
                if digest_ok { "ok" } else { "MISMATCH" },
            );
        }
    }
    // Closing the channels makes every receiver recompute all its digests from memory.
    drop(frame_txs);
    let bar = phase(
        args.receivers as u64,
        "recomputing every receiver's digests",
        args.json,
    );
    let mut mismatched = 0usize;
    for h in handles {
        let bad = h
            .join()
            .map_err(|_| anyhow!("a receiver thread panicked"))?;
        mismatched += bad;
        bar.inc(1);
    }
    bar.finish_and_clear();
    if !args.json {
        println!(
            "full recomputation of every receiver's digest: {}",
            if mismatched == 0 {
                "all slots match".to_string()
            } else {
                count(mismatched as u64, "slot differs", "slots differ")
            }
        );
    }
    if !all_ok || mismatched > 0 {
        bail!("digest check failed");
    }
    Ok(())
}

/// Applies frames until the channel closes; then recomputes every digest from memory and returns
/// how many slots disagree with the running digest.
fn receiver_loop(
    index: usize,
    mut receiver: Receiver,
    frames: ChannelRx<Arc<Vec<u8>>>,
    acks: SyncSender<Ack>,
) -> usize {
    // After a failed frame the rest of that sync is refused too; report each failed sync once.
    let mut reported = false;
    for frame in frames {
        if deltacast::wire::peek_header(&frame).is_ok_and(|h| h.flush_index == 0) {
            reported = false;
        }
        let ack = match receiver.receive(&frame) {
            Ok(None) => continue,
            Ok(Some(outcome)) => Ack::Applied {
                receiver: index,
                version: outcome.version,
                digest: outcome.state_digest,
            },
            Err(_) if reported => continue,
            Err(e) => {
                reported = true;
                Ack::Failed {
                    receiver: index,
                    error: e.to_string(),
                }
            }
        };
        if acks.send(ack).is_err() {
            break;
        }
    }
    receiver.recompute_digests().len()
}
