//! A receiver of the bench: one connection, one state and one thread per method.

use std::thread;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use serde_json::{json, Value};

use deltacast::digest::digest_slot;
use deltacast::{Receiver, SlotTable};
use deltacast_net::{Ack, FrameClient, NetError};

use super::{bench_addr, BenchModel, Method, FULL_HEADER, FULL_MAGIC};
use crate::processes::{peak_rss_bytes, slot_map, tell_parent, DONE};

pub(super) fn receiver(index: usize, frames: &str, args: &BenchModel) -> Result<()> {
    let shape = args.shape()?;
    let methods = args.methods()?;
    let table = slot_map(&shape)?.table().clone();
    let addrs: Vec<&str> = frames.split(',').collect();
    if addrs.len() != methods.len() {
        bail!(
            "{} frame servers for {} methods",
            addrs.len(),
            methods.len()
        );
    }
    let mut handles = Vec::new();
    for (m, addr) in methods.iter().zip(addrs) {
        let addr = bench_addr(addr, "--frames")?;
        let cfg = args.net_config(m)?;
        let table = table.clone();
        let m = m.clone();
        let in_place = args.apply_as_received;
        handles.push(thread::spawn(move || -> Result<Value> {
            let client = FrameClient::connect(addr, None, 0, cfg).with_context(|| {
                format!("receiver {index} ({}): connecting to {addr}", m.name())
            })?;
            match m {
                Method::Full => full_receiver(client, &table),
                Method::Delta { .. } => delta_receiver(client, table, in_place),
            }
            .with_context(|| format!("receiver {index} ({})", m.name()))
        }));
    }
    let mut lines = Vec::new();
    let mut errors = Vec::new();
    for (m, h) in methods.iter().zip(handles) {
        match h.join() {
            Ok(Ok(v)) => lines.push(json!({ "method": m.name(), "end": v })),
            Ok(Err(e)) => errors.push(format!("{e:#}")),
            Err(_) => errors.push(format!("receiver {index} ({}): thread panicked", m.name())),
        }
    }
    tell_parent(
        "receiver-exit",
        &json!({ "index": index, "methods": lines, "errors": errors, "peak_rss_bytes": peak_rss_bytes() }),
    );
    if !errors.is_empty() {
        bail!("{}", errors.join("; "));
    }
    Ok(())
}

/// Frames until the leader says the run is done.
fn next_frame(client: &mut FrameClient) -> Result<Option<Vec<u8>>> {
    match client.recv_frame() {
        Ok(f) => Ok(Some(f)),
        Err(NetError::Aborted { reason, .. }) if reason.starts_with(DONE) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

fn delta_receiver(mut client: FrameClient, table: SlotTable, in_place: bool) -> Result<Value> {
    let mut receiver = Receiver::new(table);
    receiver.set_apply_as_received(in_place);
    let mut syncs = 0u64;
    // Time spent in `receive` for the current sync, and for its last flush.
    let mut busy = 0.0f64;
    while let Some(frame) = next_frame(&mut client)? {
        let t = Instant::now();
        let got = receiver.receive(&frame);
        let took = t.elapsed().as_secs_f64() * 1e3;
        busy += took;
        let ack = match got {
            Ok(None) => continue,
            Ok(Some(outcome)) => Ack {
                version: outcome.version,
                state_digest: outcome.state_digest,
                ok: true,
                message: json!({ "receive_ms": std::mem::take(&mut busy), "last_flush_ms": took })
                    .to_string(),
            },
            Err(e) => Ack {
                version: receiver.version().unwrap_or(0),
                state_digest: receiver.state_digest(),
                ok: false,
                message: e.to_string(),
            },
        };
        syncs += 1;
        client.send_ack(&ack)?;
        if !ack.ok {
            bail!("sync failed: {}", ack.message);
        }
    }
    let mismatched = receiver.recompute_digests().len();
    if mismatched != 0 {
        bail!("{mismatched} slots differ from their running digest");
    }
    Ok(json!({ "version": receiver.version(), "syncs": syncs, "recomputed_mismatches": 0 }))
}

fn full_receiver(mut client: FrameClient, table: &SlotTable) -> Result<Value> {
    let total = usize::try_from(table.total_bytes())?;
    let mut buf = vec![0u8; total];
    let (mut step, mut next_index, mut cursor) = (0u64, 0u32, 0usize);
    let mut syncs = 0u64;
    while let Some(frame) = next_frame(&mut client)? {
        if frame.len() < FULL_HEADER || &frame[..8] != FULL_MAGIC {
            bail!(
                "a frame of {} bytes that is not a full-broadcast bucket",
                frame.len()
            );
        }
        let u64_at = |at: usize| u64::from_le_bytes(frame[at..at + 8].try_into().unwrap_or([0; 8]));
        let (s, index, last, offset) = (
            u64_at(8),
            u32::from_le_bytes(frame[16..20].try_into().unwrap_or([0; 4])),
            frame[20] == 1,
            u64_at(24) as usize,
        );
        if index == 0 {
            (step, next_index, cursor) = (s, 0, 0);
        }
        let payload = &frame[FULL_HEADER..];
        if s != step || index != next_index || offset != cursor || cursor + payload.len() > total {
            bail!("bucket {index} of step {s} at {offset} out of sequence (expected {next_index} of {step} at {cursor})");
        }
        buf[cursor..cursor + payload.len()].copy_from_slice(payload);
        cursor += payload.len();
        next_index += 1;
        if !last {
            continue;
        }
        if cursor != total {
            bail!("step {step}: the last bucket left {cursor} of {total} bytes");
        }
        syncs += 1;
        client.send_ack(&Ack {
            version: step,
            state_digest: 0,
            ok: true,
            message: "received".into(),
        })?;
        // After the leader's timer stopped: the digest of everything held.
        let mut at = 0usize;
        let mut digest = 0u64;
        for (id, slot) in table.slots().iter().enumerate() {
            let n = slot.nbytes() as usize;
            digest =
                digest.wrapping_add(digest_slot(id as u32, slot.dtype.width(), &buf[at..at + n]));
            at += n;
        }
        client.send_ack(&Ack {
            version: step,
            state_digest: digest,
            ok: true,
            message: "digest".into(),
        })?;
    }
    Ok(json!({ "steps": syncs }))
}
