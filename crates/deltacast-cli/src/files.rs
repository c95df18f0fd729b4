//! `diff`, `apply` and `inspect`: syncs through files.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::json;

use deltacast::io::{write_atomic, write_checkpoint, Checkpoint};
use deltacast::wire::{parse_frame, split_frames, FrameKind};
use deltacast::{Error, Receiver, Sender, SlotStore};

use crate::output::{bytes, json_line};
use crate::WireArgs;

/// Reads a whole .dcast file (its size is the file's; frame lengths are checked against it).
fn read_sync_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

pub fn diff(
    old: &Path,
    new: &Path,
    output: &Path,
    version: u64,
    wire: &WireArgs,
    json_out: bool,
) -> Result<()> {
    if version == 0 {
        bail!("--version must be at least 1 (the base is version - 1)");
    }
    let config = wire.config()?;
    let started = Instant::now();
    let old_ckpt =
        Checkpoint::open(old).with_context(|| format!("cannot open OLD {}", old.display()))?;
    let new_ckpt =
        Checkpoint::open(new).with_context(|| format!("cannot open NEW {}", new.display()))?;
    if old_ckpt.table() != new_ckpt.table() {
        let describe = |t: &deltacast::SlotTable| {
            t.slots()
                .iter()
                .map(|s| format!("{} {} {:?}", s.name, s.dtype, s.shape))
                .collect::<Vec<_>>()
        };
        let (a, b) = (describe(old_ckpt.table()), describe(new_ckpt.table()));
        let first = a
            .iter()
            .zip(&b)
            .find(|(x, y)| x != y)
            .map(|(x, y)| format!("`{x}` vs `{y}`"))
            .unwrap_or_else(|| format!("{} tensors vs {}", a.len(), b.len()));
        bail!("OLD and NEW hold different tensors: {first}");
    }
    let table = old_ckpt.table().clone();
    let mut sender = Sender::with_base(table.clone(), config, old_ckpt.to_buffers(), version - 1)?;
    drop(old_ckpt);
    let mut out = Vec::new();
    let report = sender.delta(&new_ckpt.slices(), |frame| {
        out.extend_from_slice(&frame);
        Ok(())
    })?;
    write_atomic(output, &out).with_context(|| format!("cannot write {}", output.display()))?;
    let s = &report.stats;
    let elapsed = started.elapsed().as_secs_f64() * 1e3;
    if json_out {
        json_line(&json!({
            "command": "diff", "output": output.display().to_string(), "version": s.version,
            "changed": s.changed, "elements": report.elements, "wire_bytes": s.wire_bytes,
            "full_bytes": table.total_bytes(), "flushes": s.flushes, "chunks": s.chunks, "codecs": s.codecs,
            "base_digest": format!("{:016x}", report.base_digest), "new_digest": format!("{:016x}", report.state_digest),
            "ms": elapsed,
        }));
    } else {
        println!(
            "{}: version {} delta, {} of {} elements changed ({:.3}%), {} on the wire vs {} full ({:.1}x smaller), {} flushes, {:.0} ms",
            output.display(),
            s.version,
            s.changed,
            report.elements,
            100.0 * s.changed as f64 / report.elements.max(1) as f64,
            bytes(s.wire_bytes),
            bytes(table.total_bytes()),
            table.total_bytes() as f64 / s.wire_bytes.max(1) as f64,
            s.flushes,
            elapsed
        );
    }
    Ok(())
}

pub fn apply(base: &Path, delta: &Path, output: &Path, json_out: bool) -> Result<()> {
    let started = Instant::now();
    let bytes_in = read_sync_file(delta)?;
    let frames = split_frames(&bytes_in)
        .with_context(|| format!("{} is not a valid sync file", delta.display()))?;
    let Some(first) = frames.first() else {
        bail!("{} holds no frames", delta.display());
    };
    let header = parse_frame(first)
        .with_context(|| format!("first frame of {}", delta.display()))?
        .header;
    let ckpt =
        Checkpoint::open(base).with_context(|| format!("cannot open BASE {}", base.display()))?;
    let table = ckpt.table().clone();
    if header.table_hash != table.hash() {
        bail!(
            "{} was made for another set of tensors (slot table {:016x}) than BASE {} holds ({:016x})",
            delta.display(),
            header.table_hash,
            base.display(),
            table.hash()
        );
    }
    let base_version = match header.kind {
        FrameKind::Delta | FrameKind::Dense => header.version.checked_sub(1),
        _ => None,
    };
    let mut receiver = Receiver::with_state(table.clone(), ckpt.to_buffers(), base_version)?;
    drop(ckpt);
    let mut outcome = None;
    for (i, frame) in frames.iter().enumerate() {
        match receiver.receive(frame) {
            // A close (a captured GPU sync may end with one) reports nothing applied.
            Ok(done) => outcome = done.filter(|o| o.kind != FrameKind::Close).or(outcome),
            Err(Error::BaseDigestMismatch {
                slot,
                expected,
                actual,
            }) => {
                bail!("BASE {} is not the checkpoint this delta was made from: tensor `{slot}` has digest {actual:016x}, the delta expects {expected:016x}; nothing written", base.display())
            }
            Err(e) => {
                return Err(e)
                    .with_context(|| format!("frame {i} of {}; nothing written", delta.display()))
            }
        }
    }
    let Some(outcome) = outcome else {
        bail!(
            "{} ends before the sync's final frame; nothing written",
            delta.display()
        );
    };
    let store = receiver.store();
    let slices: Vec<&[u8]> = (0..table.len() as u32).map(|id| store.slot(id)).collect();
    write_checkpoint(output, &table, &slices)
        .with_context(|| format!("cannot write {}", output.display()))?;
    let elapsed = started.elapsed().as_secs_f64() * 1e3;
    if json_out {
        json_line(&json!({
            "command": "apply", "output": output.display().to_string(), "version": outcome.version,
            "kind": outcome.kind.name(), "changed": outcome.changed, "flushes": outcome.flushes,
            "wire_bytes": outcome.wire_bytes, "state_digest": format!("{:016x}", outcome.state_digest), "digest_ok": true, "ms": elapsed,
        }));
    } else {
        println!(
            "{}: applied {} version {} ({} elements changed, {} flushes), digest {:016x} verified, {:.0} ms",
            output.display(),
            outcome.kind.name(),
            outcome.version,
            outcome.changed,
            outcome.flushes,
            outcome.state_digest,
            elapsed
        );
    }
    Ok(())
}

pub fn inspect(path: &Path, chunks: bool, json_out: bool) -> Result<()> {
    let bytes_in = read_sync_file(path)?;
    let frames = split_frames(&bytes_in)
        .with_context(|| format!("{} is not a valid sync file", path.display()))?;
    let mut codecs: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    let (mut changed, mut pos_bytes, mut val_bytes, mut entries, mut digests) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    for (i, raw) in frames.iter().enumerate() {
        let frame = parse_frame(raw).with_context(|| format!("frame {i}"))?;
        let h = frame.header;
        if json_out {
            json_line(&json!({
                "frame": i, "kind": h.kind.name(), "final": h.is_final, "version": h.version,
                "slot_table": format!("{:016x}", h.table_hash), "flush_index": h.flush_index,
                "entries": h.entry_count, "digests": h.digest_count, "bytes": h.frame_len,
            }));
        } else {
            println!(
                "frame {i}: {} version {} flush {}{} — {} chunks, {} digests, {}, slot table {:016x}",
                h.kind.name(),
                h.version,
                h.flush_index,
                if h.is_final { " (final)" } else { "" },
                h.entry_count,
                h.digest_count,
                bytes(h.frame_len),
                h.table_hash
            );
        }
        for e in &frame.entries {
            let name = format!("{}+{}", e.pos_codec.name(), e.val_codec.name());
            let c = codecs.entry(name.clone()).or_default();
            c.0 += 1;
            c.1 += e.count;
            c.2 += e.pos_len + e.val_len;
            changed += e.count;
            pos_bytes += e.pos_len;
            val_bytes += e.val_len;
            entries += 1;
            if chunks {
                if json_out {
                    json_line(
                        &json!({"frame": i, "slot": e.slot, "start": e.start, "range": e.range, "count": e.count, "codec": name, "pos_bytes": e.pos_len, "val_bytes": e.val_len}),
                    );
                } else {
                    println!(
                        "  slot {:>5} [{}, +{}) {:>9} changes  {:<12} pos {:>9} B  val {:>9} B",
                        e.slot, e.start, e.range, e.count, name, e.pos_len, e.val_len
                    );
                }
            }
        }
        digests += frame.digests.len() as u64;
    }
    let total = bytes_in.len() as u64;
    if json_out {
        let per_codec: BTreeMap<_, _> = codecs
            .iter()
            .map(|(k, v)| {
                (
                    k.clone(),
                    json!({"chunks": v.0, "changes": v.1, "bytes": v.2}),
                )
            })
            .collect();
        json_line(&json!({
            "summary": true, "frames": frames.len(), "chunks": entries, "changed": changed, "digests": digests,
            "position_bytes": pos_bytes, "value_bytes": val_bytes, "total_bytes": total, "codecs": per_codec,
        }));
    } else {
        println!(
            "total: {} frames, {} chunks, {} changes, positions {}, values {}, overhead {}, file {}",
            frames.len(),
            entries,
            changed,
            bytes(pos_bytes),
            bytes(val_bytes),
            bytes(total - pos_bytes - val_bytes),
            bytes(total)
        );
        for (name, (n, k, b)) in &codecs {
            println!(
                "  {name:<14} {n:>7} chunks {k:>11} changes {:>11}  {:.2} bits/change",
                bytes(*b),
                *b as f64 * 8.0 / (*k).max(1) as f64
            );
        }
    }
    Ok(())
}
