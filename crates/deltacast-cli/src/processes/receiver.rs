//! A receiver process of `demo --processes`: applies the leader's frames and acks every sync.

use anyhow::{bail, Context, Result};
use serde_json::json;

use deltacast::Receiver;
use deltacast_net::{Ack, FrameClient, NetError};

use super::{loopback, net_config, peak_rss_bytes, slot_map, tell_parent, ModelArgs, DONE};
use crate::output::count;

pub(super) fn receiver(index: usize, frames: &str, model_args: &ModelArgs) -> Result<()> {
    let shape = model_args.shape()?;
    let table = slot_map(&shape)?.table().clone();
    let cfg = net_config(&model_args.wire)?;
    let frames = loopback(frames, "--frames")?;
    let mut client = FrameClient::connect(frames, None, 0, cfg)
        .with_context(|| format!("receiver {index}: connecting to the leader at {frames}"))?;
    let mut receiver = Receiver::new(table);
    // After a failed flush the rest of that sync is refused too; ack each failed sync once.
    let mut reported = false;
    let end: std::result::Result<String, String> = loop {
        let frame = match client.recv_frame() {
            Ok(f) => f,
            Err(NetError::Aborted { reason, .. }) if reason.starts_with(DONE) => break Ok(reason),
            Err(e) => break Err(e.to_string()),
        };
        if deltacast::wire::peek_header(&frame).is_ok_and(|h| h.flush_index == 0) {
            reported = false;
        }
        let ack = match receiver.receive(&frame) {
            Ok(None) => continue,
            Ok(Some(outcome)) => Ack {
                version: outcome.version,
                state_digest: outcome.state_digest,
                ok: true,
                message: json!({ "peak_rss_bytes": peak_rss_bytes() }).to_string(),
            },
            Err(_) if reported => continue,
            Err(e) => {
                reported = true;
                Ack {
                    version: receiver.version().unwrap_or(0),
                    state_digest: receiver.state_digest(),
                    ok: false,
                    message: e.to_string(),
                }
            }
        };
        if let Err(e) = client.send_ack(&ack) {
            break Err(e.to_string());
        }
    };
    // Whatever happened, a half-received sync is dropped: the state stays at the last version.
    let dropped = receiver.is_staging();
    receiver.abort_sync();
    let mismatched = receiver.recompute_digests().len();
    let version = receiver.version();
    tell_parent(
        "receiver-exit",
        &json!({
            "index": index, "version": version, "state_digest": receiver.state_digest(),
            "dropped_staged_sync": dropped, "recomputed_mismatches": mismatched,
            "error": end.as_ref().err(), "peak_rss_bytes": peak_rss_bytes(),
        }),
    );
    let at = match version {
        Some(v) => format!("version {v}"),
        None => "no version (never seeded)".into(),
    };
    match end {
        Ok(_) if mismatched == 0 => Ok(()),
        Ok(_) => bail!(
            "receiver {index}: {} from their running digest",
            count(mismatched as u64, "slot differs", "slots differ")
        ),
        Err(e) => bail!(
            "receiver {index}: {e}; stays at {at}{}",
            if dropped {
                " (dropped the half-received next sync)"
            } else {
                ""
            }
        ),
    }
}
