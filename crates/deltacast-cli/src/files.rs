//! `diff`, `apply` and `inspect`: syncs through files.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Instant;

use anyhow::{anyhow, bail, Context, Result};
use serde_json::json;

use deltacast::io::{write_atomic, write_checkpoint, Checkpoint};
use deltacast::wire::{parse_frame, split_frames, Frame, FrameKind};
use deltacast::{Error, Receiver, Sender, SlotInfo, SlotStore, SlotTable};

use crate::output::{bytes, count, hex64, json_line};
use crate::WireArgs;

/// Reads a whole .dcast file (its size is the file's; frame lengths are checked against it).
fn read_sync_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).with_context(|| format!("cannot read {}", path.display()))
}

/// Opens the checkpoint the user gave as `role` (OLD, NEW, BASE): a failure says the role and
/// the path once, then why.
pub fn open_checkpoint(path: &Path, role: &str) -> Result<Checkpoint> {
    Checkpoint::open(path).map_err(|e| {
        let why = match e {
            // The context names the path already.
            Error::Io { source, .. } => anyhow::Error::new(source),
            Error::SafeTensors(e) => anyhow!("not a valid safetensors file: {e}"),
            other => anyhow::Error::new(other),
        };
        why.context(format!("cannot open {role} {}", path.display()))
    })
}

/// A tensor as the difference lines show it: `BF16 [300, 7]`.
fn describe(s: &SlotInfo) -> String {
    format!("{} {:?}", s.dtype, s.shape)
}

/// Longest list of differences an error prints before it counts the rest.
const MAX_DIFFERENCES: usize = 20;

/// Refuses two checkpoints that do not hold the same tensors, naming every difference: a
/// tensor only one of them has, or one whose dtype or shape differs.
pub fn same_tensors(old: &SlotTable, new: &SlotTable, roles: (&str, &str)) -> Result<()> {
    if old == new {
        return Ok(());
    }
    let (a, b) = roles;
    let by_name = |t: &SlotTable| -> BTreeMap<String, SlotInfo> {
        t.slots()
            .iter()
            .map(|s| (s.name.clone(), s.clone()))
            .collect()
    };
    let (olds, news) = (by_name(old), by_name(new));
    let mut lines = Vec::new();
    let mut names: Vec<&String> = olds.keys().chain(news.keys()).collect();
    names.sort();
    names.dedup();
    for name in names {
        match (olds.get(name), news.get(name)) {
            (Some(o), Some(n)) if o != n => lines.push(format!(
                "`{name}` is {} in {a}, {} in {b}",
                describe(o),
                describe(n)
            )),
            (Some(o), None) => {
                lines.push(format!("{a} has `{name}` ({}), {b} does not", describe(o)))
            }
            (None, Some(n)) => {
                lines.push(format!("{b} has `{name}` ({}), {a} does not", describe(n)))
            }
            _ => {}
        }
    }
    let more = lines.len().saturating_sub(MAX_DIFFERENCES);
    lines.truncate(MAX_DIFFERENCES);
    if more > 0 {
        lines.push(format!(
            "and {}",
            count(more as u64, "more difference", "more differences")
        ));
    }
    bail!(
        "{a} and {b} hold different tensors (a sync needs the same names, dtypes and shapes):\n  {}",
        lines.join("\n  ")
    )
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
    let old_ckpt = open_checkpoint(old, "OLD")?;
    let new_ckpt = open_checkpoint(new, "NEW")?;
    same_tensors(old_ckpt.table(), new_ckpt.table(), ("OLD", "NEW"))?;
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
            "base_digest": hex64(report.base_digest), "new_digest": hex64(report.state_digest),
            "slot_table": hex64(table.hash()), "ms": elapsed,
        }));
    } else {
        println!(
            "{}: version {} delta, {} of {} changed ({:.3}%), {} on the wire vs {} full ({}), {}, {:.0} ms",
            output.display(),
            s.version,
            s.changed,
            count(report.elements, "element", "elements"),
            100.0 * s.changed as f64 / report.elements.max(1) as f64,
            bytes(s.wire_bytes),
            bytes(table.total_bytes()),
            ratio(table.total_bytes(), s.wire_bytes),
            count(s.flushes.into(), "flush", "flushes"),
            elapsed
        );
    }
    Ok(())
}

/// How the wire compares with a full copy: `9.6x smaller`, or `10.2x larger` for tensors so
/// small that the framing outweighs them.
fn ratio(full: u64, wire: u64) -> String {
    if wire <= full {
        format!("{:.1}x smaller", full as f64 / wire.max(1) as f64)
    } else {
        format!("{:.1}x larger", wire as f64 / full.max(1) as f64)
    }
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
    let ckpt = open_checkpoint(base, "BASE")?;
    let table = ckpt.table().clone();
    if header.table_hash != table.hash() {
        bail!(
            "{} was made for another set of tensors (slot table {}) than BASE {} holds ({})",
            delta.display(),
            hex64(header.table_hash),
            base.display(),
            hex64(table.hash())
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
                bail!(
                    "BASE {} is not the checkpoint this delta was made from: tensor `{slot}` has \
                     digest {}, the delta expects {}; nothing written",
                    base.display(),
                    hex64(actual),
                    hex64(expected)
                )
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
            "wire_bytes": outcome.wire_bytes, "state_digest": hex64(outcome.state_digest),
            "slot_table": hex64(table.hash()), "digest_ok": true, "ms": elapsed,
        }));
    } else {
        println!(
            "{}: applied {} version {} ({} changed, {}), digest {} verified, {:.0} ms",
            output.display(),
            outcome.kind.name(),
            outcome.version,
            count(outcome.changed, "element", "elements"),
            count(outcome.flushes.into(), "flush", "flushes"),
            hex64(outcome.state_digest),
            elapsed
        );
    }
    Ok(())
}

/// The tensor names of the slots of a sync, from a checkpoint that holds its tensors.
fn slot_names(names: Option<&Path>, frames: &[Frame<'_>]) -> Result<Option<Vec<String>>> {
    let Some(path) = names else {
        return Ok(None);
    };
    let ckpt = open_checkpoint(path, "--names")?;
    let table = ckpt.table();
    if let Some(f) = frames.first() {
        if f.header.table_hash != table.hash() {
            bail!(
                "--names {} holds other tensors (slot table {}) than the sync was made for ({})",
                path.display(),
                hex64(table.hash()),
                hex64(f.header.table_hash)
            );
        }
    }
    Ok(Some(table.slots().iter().map(|s| s.name.clone()).collect()))
}

/// A chunk's elements in the slot as `inspect` prints them: `START..END`, END excluded.
fn span(start: u64, range: u64) -> String {
    format!("{start}..{}", start + range)
}

pub fn inspect(path: &Path, chunks: bool, names: Option<&Path>, json_out: bool) -> Result<()> {
    let bytes_in = read_sync_file(path)?;
    let raw_frames = split_frames(&bytes_in)
        .with_context(|| format!("{} is not a valid sync file", path.display()))?;
    let frames = raw_frames
        .iter()
        .enumerate()
        .map(|(i, raw)| parse_frame(raw).with_context(|| format!("frame {i}")))
        .collect::<Result<Vec<_>>>()?;
    let names = slot_names(names, &frames)?;
    let name_of = |slot: u32| -> Option<&str> {
        names
            .as_ref()
            .map(|n| n.get(slot as usize).map_or("?", String::as_str))
    };
    // Column widths over every chunk, so the rows line up across frames.
    let entries = || frames.iter().flat_map(|f| &f.entries);
    let name_width = entries()
        .filter_map(|e| name_of(e.slot))
        .map(str::len)
        .chain(["tensor".len()])
        .max()
        .unwrap_or(0);
    let span_width = entries()
        .map(|e| span(e.start, e.range).len())
        .chain(["elements".len()])
        .max()
        .unwrap_or(0);
    let mut codecs: BTreeMap<String, (u64, u64, u64)> = BTreeMap::new();
    let (mut changed, mut pos_bytes, mut val_bytes, mut chunk_count, mut digests) =
        (0u64, 0u64, 0u64, 0u64, 0u64);
    for (i, frame) in frames.iter().enumerate() {
        let h = frame.header;
        if json_out {
            json_line(&json!({
                "frame": i, "kind": h.kind.name(), "final": h.is_final, "version": h.version,
                "slot_table": hex64(h.table_hash), "flush_index": h.flush_index,
                "entries": h.entry_count, "digests": h.digest_count, "bytes": h.frame_len,
            }));
        } else {
            println!(
                "frame {i}: {} version {} flush {}{} — {}, {}, {}, slot table {}",
                h.kind.name(),
                h.version,
                h.flush_index,
                if h.is_final { " (final)" } else { "" },
                count(h.entry_count.into(), "chunk", "chunks"),
                count(h.digest_count.into(), "digest", "digests"),
                bytes(h.frame_len),
                hex64(h.table_hash)
            );
            if chunks && !frame.entries.is_empty() {
                let tensor = if names.is_some() {
                    format!("  {:<name_width$}", "tensor")
                } else {
                    String::new()
                };
                println!(
                    "  {:>5}{tensor}  {:<span_width$}  {:>9}  {:<12}  {:>10}  {:>10}",
                    "slot", "elements", "changes", "codecs", "pos bytes", "val bytes"
                );
            }
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
            chunk_count += 1;
            if chunks {
                if json_out {
                    json_line(&json!({
                        "frame": i, "slot": e.slot, "tensor": name_of(e.slot), "start": e.start,
                        "range": e.range, "count": e.count, "codec": name,
                        "pos_bytes": e.pos_len, "val_bytes": e.val_len,
                    }));
                } else {
                    let tensor = name_of(e.slot)
                        .map(|n| format!("  {n:<name_width$}"))
                        .unwrap_or_default();
                    println!(
                        "  {:>5}{tensor}  {:<span_width$}  {:>9}  {:<12}  {:>10}  {:>10}",
                        e.slot,
                        span(e.start, e.range),
                        e.count,
                        name,
                        e.pos_len,
                        e.val_len
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
            "summary": true, "frames": frames.len(), "chunks": chunk_count, "changed": changed, "digests": digests,
            "position_bytes": pos_bytes, "value_bytes": val_bytes, "total_bytes": total, "codecs": per_codec,
        }));
    } else {
        if chunks && names.is_none() && chunk_count > 0 {
            println!("(slots by id; --names CHECKPOINT names their tensors)");
        }
        println!(
            "total: {}, {}, {}, positions {}, values {}, overhead {}, file {}",
            count(frames.len() as u64, "frame", "frames"),
            count(chunk_count, "chunk", "chunks"),
            count(changed, "change", "changes"),
            bytes(pos_bytes),
            bytes(val_bytes),
            bytes(total - pos_bytes - val_bytes),
            bytes(total)
        );
        for (name, (n, k, b)) in &codecs {
            println!(
                "  {name:<14} {:>13} {:>17} {:>11}  {:.2} bits/change",
                count(*n, "chunk", "chunks"),
                count(*k, "change", "changes"),
                bytes(*b),
                *b as f64 * 8.0 / (*k).max(1) as f64
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use deltacast::DType;

    #[test]
    fn long_lists_of_differences_are_cut_and_counted() {
        let table = |names: std::ops::Range<u32>| {
            SlotTable::new(
                names
                    .map(|i| SlotInfo::new(format!("t{i:03}"), DType::F32, vec![1]))
                    .collect(),
            )
            .unwrap()
        };
        let err = same_tensors(&table(0..5), &table(0..30), ("OLD", "NEW")).unwrap_err();
        let text = err.to_string();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1 + MAX_DIFFERENCES + 1, "{text}");
        assert_eq!(lines[1], "  NEW has `t005` (F32 [1]), OLD does not");
        assert_eq!(lines[lines.len() - 1], "  and 5 more differences");
        let err = same_tensors(&table(0..1), &table(0..22), ("OLD", "NEW")).unwrap_err();
        assert!(
            err.to_string().ends_with("\n  and 1 more difference"),
            "{err}"
        );
        assert!(same_tensors(&table(0..3), &table(0..3), ("OLD", "NEW")).is_ok());
    }
}
