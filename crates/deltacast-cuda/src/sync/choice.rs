//! How a [`super::GpuSender`]'s stages go — whole (dense), as a plain delta (abs32 / bitmap
//! positions, raw values) or entropy-coded (gaps, ulp steps) — chosen per stage by the time each
//! is predicted to take on this link, from costs the sender measures as it runs.
//!
//! The model has three measured rates: the link's time per byte of a stage sent whole
//! (seeds and dense syncs, the digest and snapshot refresh included), the diff's time per byte
//! of tensor, and per delta codec the time per changed element beyond the diff and the bytes
//! it sent (encode, decode, apply, the receivers' digest). A delta of `n` changes over `B`
//! bytes of tensor is predicted to take `diff·B + (link·wire + work)·n`, the same stage whole
//! `link·B`. Before a stage's diff the sender predicts `n` from the stage's density at the
//! last sync and sends the stage whole without diffing it when that is cheaper; after the diff
//! it knows `n` and the exact wire bytes, and sends whole if that is cheaper still. A codec
//! not yet measured is predicted from priors (below) and tried only when the prediction says
//! it wins; one measured slower is tried again now and then, only while it is predicted
//! within [`PROBE_WITHIN`] of the best, so that no probe costs more than that.

use super::settings::AUTO_PROBE_EVERY;

/// A probe of the slower delta codec is made only while it is predicted at most this many
/// times the faster one's time.
pub const PROBE_WITHIN: f64 = 1.25;

/// Prior work per change beyond the diff and the link, in ms (plain, entropy): an H200 over
/// CUDA IPC at 12–25 % changed spent ~45 ps per change on plain deltas (encode, apply, digest
/// update) and ~120 ps with the entropy codecs (docs/data/gpu-sync/capacity-lr1e-5/). Only a
/// starting point: each is replaced by the measured figure after one sync that used it.
const PRIOR_WORK_MS: [f64; 2] = [45e-9, 120e-9];

/// Prior wire bytes per change (plain, entropy) on AdamW steps at 1–25 % changed: 3.1–2.5
/// with abs32 or bitmap positions and raw BF16 values, 0.75–1.2 with gaps and ulp steps (the
/// same runs).
const PRIOR_WIRE: [f64; 2] = [3.0, 1.0];

/// Exponential smoothing of every rate: half the old figure, half the new.
const KEEP: f64 = 0.5;

/// The delta codecs, as indices into the model's per-codec rates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaCodec {
    Plain = 0,
    Entropy = 1,
}

impl DeltaCodec {
    pub fn entropy(self) -> bool {
        self == DeltaCodec::Entropy
    }

    fn of(entropy: bool) -> DeltaCodec {
        if entropy {
            DeltaCodec::Entropy
        } else {
            DeltaCodec::Plain
        }
    }
}

/// What one sync took, for [`CostModel::record`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct SyncCosts {
    /// Wall time until every receiver acked, ms.
    pub time_ms: f64,
    /// Device time of the diffs, ms, and the bytes of tensor they read.
    pub diff_ms: f64,
    pub diffed_bytes: u64,
    /// Bytes sent whole (seed or dense stages, header and manifest included).
    pub dense_bytes: u64,
    /// Delta stages: their codec (None when there were none), changes and wire bytes (None
    /// where the caller does not know them: the per-change figure then takes in the link).
    pub delta: Option<DeltaCodec>,
    pub delta_changes: u64,
    pub delta_bytes: Option<u64>,
}

/// The rates learned so far, as each sync's metrics report them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ChoiceReport {
    /// ms per GB sent whole (None before the seed).
    pub dense_ms_per_gb: Option<f64>,
    /// ms per GB of tensor diffed.
    pub diff_ms_per_gb: Option<f64>,
    /// Per codec (plain, entropy): predicted ms per million changes, link and work included,
    /// and whether it was measured (false: from the priors).
    pub delta_ms_per_mchange: [f64; 2],
    pub measured: [bool; 2],
    /// The changed fraction of a BF16 stage above which sending it whole is predicted
    /// cheaper than its delta, per codec (once the diff has run; before it, the diff's time
    /// counts against the delta too).
    pub dense_above: [Option<f64>; 2],
}

/// A sender's measured costs on its link; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct CostModel {
    link_ms_per_byte: Option<f64>,
    diff_ms_per_byte: Option<f64>,
    work_ms: [Option<f64>; 2],
    wire: [Option<f64>; 2],
    /// Delta syncs since the slower codec was last tried.
    since_probe: u64,
}

fn smooth(slot: &mut Option<f64>, x: f64) {
    if x.is_finite() && x >= 0.0 {
        *slot = Some(slot.map_or(x, |old| KEEP * old + (1.0 - KEEP) * x));
    }
}

impl CostModel {
    /// Predicted ms per change of `codec`, link bytes and work.
    fn per_change(&self, codec: DeltaCodec) -> f64 {
        let c = codec as usize;
        let link = self.link_ms_per_byte.unwrap_or(0.0);
        link * self.wire[c].unwrap_or(PRIOR_WIRE[c]) + self.work_ms[c].unwrap_or(PRIOR_WORK_MS[c])
    }

    /// The delta codec for the next sync's diffs (whether they keep old bits), among those
    /// `allowed` (plain only, entropy only, or both for `Auto`).
    pub fn codec(&mut self, allowed: &[DeltaCodec]) -> DeltaCodec {
        if let [only] = allowed {
            return *only;
        }
        let (p, e) = (
            self.per_change(DeltaCodec::Plain),
            self.per_change(DeltaCodec::Entropy),
        );
        let best = if e < p {
            DeltaCodec::Entropy
        } else {
            DeltaCodec::Plain
        };
        let other = DeltaCodec::of(!best.entropy());
        let ratio = p.max(e) / p.min(e).max(f64::MIN_POSITIVE);
        self.since_probe += 1;
        let untried = self.work_ms[other as usize].is_none();
        if !untried && ratio <= PROBE_WITHIN && self.since_probe >= AUTO_PROBE_EVERY {
            self.since_probe = 0;
            return other;
        }
        best
    }

    /// Whether a stage of `bytes` bytes whose last sync changed `expected` elements is
    /// predicted to go faster whole than diffed and sent as a `codec` delta.
    pub fn dense_before_diff(&self, bytes: u64, expected: u64, codec: DeltaCodec) -> bool {
        let (Some(link), Some(diff)) = (self.link_ms_per_byte, self.diff_ms_per_byte) else {
            return false;
        };
        link * bytes as f64 <= diff * bytes as f64 + self.per_change(codec) * expected as f64
    }

    /// Whether a diffed stage of `bytes` bytes with `changes` changes is predicted to go
    /// faster whole than as its `wire`-byte `codec` delta.
    pub fn dense_after_diff(&self, bytes: u64, changes: u64, wire: u64, codec: DeltaCodec) -> bool {
        let Some(link) = self.link_ms_per_byte else {
            return wire >= bytes;
        };
        let work = self.work_ms[codec as usize].unwrap_or(PRIOR_WORK_MS[codec as usize]);
        link * bytes as f64 <= link * wire as f64 + work * changes as f64
    }

    /// Learns from a sync that went through.
    pub fn record(&mut self, c: &SyncCosts) {
        if !(c.time_ms.is_finite() && c.diff_ms.is_finite()) {
            return;
        }
        if c.diffed_bytes > 0 {
            smooth(
                &mut self.diff_ms_per_byte,
                c.diff_ms / c.diffed_bytes as f64,
            );
        }
        match c.delta {
            None if c.dense_bytes > 0 => {
                // Only stages sent whole (the diffs, if any ran, took their own time).
                smooth(
                    &mut self.link_ms_per_byte,
                    (c.time_ms - c.diff_ms).max(0.0) / c.dense_bytes as f64,
                );
            }
            Some(codec) if c.delta_changes > 0 => {
                let i = codec as usize;
                let link = self.link_ms_per_byte.unwrap_or(0.0);
                let wire = c.delta_bytes.unwrap_or(0);
                let rest = c.time_ms - c.diff_ms - link * (c.dense_bytes + wire) as f64;
                smooth(&mut self.work_ms[i], rest.max(0.0) / c.delta_changes as f64);
                smooth(&mut self.wire[i], wire as f64 / c.delta_changes as f64);
            }
            _ => {}
        }
    }

    pub fn report(&self) -> ChoiceReport {
        let codecs = [DeltaCodec::Plain, DeltaCodec::Entropy];
        let dense_above = codecs.map(|codec| {
            let link = self.link_ms_per_byte?;
            // Per BF16 element: whole 2·link; delta x·per_change.
            Some((2.0 * link / self.per_change(codec)).min(1.0))
        });
        ChoiceReport {
            dense_ms_per_gb: self.link_ms_per_byte.map(|r| r * 1e9),
            diff_ms_per_gb: self.diff_ms_per_byte.map(|r| r * 1e9),
            delta_ms_per_mchange: codecs.map(|codec| self.per_change(codec) * 1e6),
            measured: codecs.map(|codec| self.work_ms[codec as usize].is_some()),
            dense_above,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;
    const BOTH: [DeltaCodec; 2] = [DeltaCodec::Plain, DeltaCodec::Entropy];

    /// A fast link (an H200 over CUDA IPC): 13 ms per GB whole, diff 2.6 ms per GB.
    fn fast() -> CostModel {
        let mut m = CostModel::default();
        m.record(&SyncCosts {
            time_ms: 13.0,
            dense_bytes: GB,
            ..Default::default()
        });
        m
    }

    fn delta(m: &mut CostModel, codec: DeltaCodec, time_ms: f64, changes: u64, wire: u64) {
        m.record(&SyncCosts {
            time_ms,
            diff_ms: 2.6,
            diffed_bytes: GB,
            delta: Some(codec),
            delta_changes: changes,
            delta_bytes: Some(wire),
            ..Default::default()
        });
    }

    #[test]
    fn nothing_known_means_diff_and_compare_bytes() {
        let m = CostModel::default();
        assert!(!m.dense_before_diff(GB, GB / 2, DeltaCodec::Plain));
        assert!(m.dense_after_diff(100, 10, 100, DeltaCodec::Plain));
        assert!(!m.dense_after_diff(100, 10, 99, DeltaCodec::Plain));
        assert_eq!(m.report().dense_ms_per_gb, None);
    }

    #[test]
    fn a_fast_link_keeps_plain_deltas_and_sends_dense_steps_whole() {
        let mut m = fast();
        // Priors: plain 13e-12·3 + 45e-9 ≈ 84 ps/change, entropy 13e-12 + 120e-9 ≈ 133.
        assert_eq!(m.codec(&BOTH), DeltaCodec::Plain);
        delta(&mut m, DeltaCodec::Plain, 7.4, 58_000_000, 177_000_000);
        let r = m.report();
        assert!(r.measured[0] && !r.measured[1]);
        let above = r.dense_above[0].expect("link known");
        assert!((0.2..0.4).contains(&above), "{r:?}");
        // 12 % of a 0.5 GB-element stage: delta; 60 %: whole, without a diff.
        let elems = GB / 2;
        assert!(!m.dense_before_diff(GB, elems / 8, DeltaCodec::Plain));
        assert!(m.dense_before_diff(GB, elems * 6 / 10, DeltaCodec::Plain));
        // After the diff, the diff is spent: a little above the threshold still goes whole.
        assert!(m.dense_after_diff(GB, elems * 4 / 10, 600_000_000, DeltaCodec::Plain));
        assert!(!m.dense_after_diff(GB, elems / 5, 300_000_000, DeltaCodec::Plain));
        // The entropy codecs are predicted 1.6× slower: never tried.
        for _ in 0..100 {
            assert_eq!(m.codec(&BOTH), DeltaCodec::Plain);
        }
    }

    #[test]
    fn a_slow_link_takes_the_entropy_codecs_at_once() {
        // A socket: 1 s per GB whole.
        let mut m = CostModel::default();
        m.record(&SyncCosts {
            time_ms: 1000.0,
            dense_bytes: GB,
            ..Default::default()
        });
        assert_eq!(m.codec(&BOTH), DeltaCodec::Entropy);
        delta(&mut m, DeltaCodec::Entropy, 60.0, 50_000_000, 55_000_000);
        assert_eq!(m.codec(&BOTH), DeltaCodec::Entropy);
        // Plain would be ~3× the bytes: never probed.
        for _ in 0..100 {
            assert_eq!(m.codec(&BOTH), DeltaCodec::Entropy);
        }
        // Dense only past ~all elements changed.
        let above = m.report().dense_above[1].expect("known");
        assert!(above > 0.9, "{above}");
    }

    #[test]
    fn near_ties_are_probed_now_and_then_and_the_model_follows_the_link() {
        let mut m = fast();
        delta(&mut m, DeltaCodec::Plain, 7.0, 50_000_000, 150_000_000);
        // Entropy measured once, a little slower.
        delta(&mut m, DeltaCodec::Entropy, 7.5, 50_000_000, 50_000_000);
        let picks: Vec<DeltaCodec> = (0..4 * AUTO_PROBE_EVERY).map(|_| m.codec(&BOTH)).collect();
        let probes = picks.iter().filter(|&&c| c == DeltaCodec::Entropy).count();
        assert_eq!(probes, 4, "{picks:?}");
        // The entropy path gets cheaper (a faster decoder, a slower link): it takes over.
        for _ in 0..4 {
            delta(&mut m, DeltaCodec::Entropy, 5.0, 50_000_000, 50_000_000);
        }
        assert_eq!(m.codec(&BOTH), DeltaCodec::Entropy);
        // A forced codec is always what is asked.
        assert_eq!(m.codec(&[DeltaCodec::Plain]), DeltaCodec::Plain);
    }

    #[test]
    fn nonsense_times_are_ignored() {
        let mut m = fast();
        let before = m.report();
        m.record(&SyncCosts {
            time_ms: f64::NAN,
            dense_bytes: GB,
            ..Default::default()
        });
        m.record(&SyncCosts::default());
        assert_eq!(m.report(), before);
    }
}
