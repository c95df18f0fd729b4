//! How a GPU sender's stages go — whole (dense), as a plain delta (abs32 / bitmap
//! positions, raw values), entropy-coded (gaps, ulp steps) or in the steps code (2 bits an
//! element, escapes raw) — chosen per stage by the time each is predicted to take on this link,
//! from costs the sender measures as it runs.
//!
//! The model measures the link's time per byte of a stage sent whole (seeds and dense syncs,
//! the digest and snapshot refresh included), the diff's time per byte of tensor, and per delta
//! codec its bytes per change and a line through its syncs' remaining time against their
//! changes: a fixed part (launches, the ack) and the work per change (encode, decode, apply,
//! the receivers' digest), fitted by least squares over the last few syncs and anchored by
//! priors. A delta of `n` changes over `B` bytes of tensor is predicted to take
//! `diff·B + fixed + link·map + (link·wire + work)·n`, the same stage whole `link·B`, where
//! `map` is the steps code's quarter byte per element (0 for the other codecs). Before a stage's diff the sender predicts `n` from the stage's density at the
//! last sync and sends the stage whole without diffing it when that is cheaper; after the diff
//! it knows `n` and the exact wire bytes, and sends whole if that is cheaper still. A codec
//! not yet measured is predicted from priors (below) and tried when the prediction says it
//! wins, or once where it is predicted within [`PROBE_UNMEASURED_WITHIN`] of the best (priors
//! can be wrong); one measured slower is tried again now and then, only while it is predicted
//! within [`PROBE_WITHIN`] of the best, so that no probe costs more than that. The link's cost
//! per byte comes from the syncs sent whole; each delta sync bounds it from above (its bytes
//! moved in at most its time beyond the diff), so that one slow whole sync cannot set it.

/// How often the codecs not in use are tried again (delta syncs between tries), while
/// predicted within [`PROBE_WITHIN`] of the faster.
pub const AUTO_PROBE_EVERY: u64 = 16;

/// A probe of the slower delta codec is made only while it is predicted at most this many
/// times the faster one's time.
pub const PROBE_WITHIN: f64 = 1.25;

/// A delta codec never measured on this link is tried once, at the first sync where it is
/// predicted within this many times the fastest: its prediction is priors alone, and priors
/// (or a link cost taught by one slow seed) can keep a codec that would win from ever being
/// tried. One sync at most this much slower, once.
pub const PROBE_UNMEASURED_WITHIN: f64 = 2.0;

/// Prior work per change beyond the diff and the link, in ms (plain, entropy, steps): an H200
/// over CUDA IPC at 12–25 % changed spent ~45 ps per change on plain deltas (encode, apply,
/// digest update) and ~120 ps with the entropy codecs (docs/data/gpu-sync/capacity-lr1e-5/);
/// an H100 ~30 ps on the steps code (docs/data/gpu-sync/steps-code-1xh100/). Only a starting
/// point, which the measured syncs soon outweigh.
const PRIOR_WORK_MS: [f64; 3] = [45e-9, 120e-9, 30e-9];

/// Prior fixed cost of a delta sync beyond its diff, in ms (launches, small copies, the ack):
/// 1.2–1.5 ms on the same runs at 1.6–4 % changed (the steps code's work per element apart:
/// [`ELEMENT_WORK_MS`]).
const PRIOR_FIXED_MS: [f64; 3] = [1.2, 2.0, 1.2];

/// Work per element of a delta, in ms (plain, entropy, steps): none for the codecs that
/// touch only the changes; the steps code's apply walks the map of every element: ~3 ps per
/// element on an H100 with the listed apply (check and scatter of 2^29 elements at 2 %
/// changed: 1.5 ms, docs/data/gpu-sync/listed-steps-1xh100/; ~8 ps before it). Kept apart
/// from the fitted fixed part so that a small model, whose syncs teach the model nothing,
/// still weighs the steps code by its own size.
const ELEMENT_WORK_MS: [f64; 3] = [0.0, 0.0, 3e-9];

/// Prior wire bytes per change (plain, entropy, steps) on AdamW steps at 1–25 % changed:
/// 3.1–2.5 with abs32 or bitmap positions and raw BF16 values, 0.75–1.2 with gaps and ulp
/// steps (the same runs); the steps code's escapes, an eighth of the changes at 2 bytes.
const PRIOR_WIRE: [f64; 3] = [3.0, 1.0, 0.25];

/// Prior link time per byte, ms, for choosing a codec before the link is measured (a model
/// smaller than [`MODEL_MIN_BYTES`] never measures it): about a device link's 10 ms per GB,
/// so that the steps code's map is not taken for free.
const PRIOR_LINK_MS_PER_BYTE: f64 = 1e-8;

/// The scale of changes at which the slope's prior weighs as much as the fixed part's.
const PRIOR_CHANGES: f64 = 1e8;

/// Weight of the priors, against 1 for each sync measured.
const PRIOR_WEIGHT: f64 = 0.1;

/// Forgetting: each sync measured before the last counts this much less (an effective
/// memory of about five syncs, so the model follows a link or a model that changes).
const KEEP: f64 = 0.8;

/// Syncs of fewer bytes (diffed or sent whole) teach the model nothing, and stages of fewer
/// bytes are decided by their wire bytes alone: below this size a sync's fixed costs and the
/// clock's noise outweigh everything that scales.
pub const MODEL_MIN_BYTES: u64 = 64 << 20;

/// The delta codecs, as indices into the model's per-codec rates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeltaCodec {
    Plain = 0,
    Entropy = 1,
    Steps = 2,
}

impl DeltaCodec {
    pub const ALL: [DeltaCodec; 3] = [DeltaCodec::Plain, DeltaCodec::Entropy, DeltaCodec::Steps];

    pub fn entropy(self) -> bool {
        self == DeltaCodec::Entropy
    }

    pub fn name(self) -> &'static str {
        match self {
            DeltaCodec::Plain => "plain",
            DeltaCodec::Entropy => "entropy",
            DeltaCodec::Steps => "steps",
        }
    }

    /// Wire bytes a delta of `elements` elements costs whatever its changes: the steps
    /// code's map, a quarter byte an element.
    pub fn map_bytes(self, elements: u64) -> u64 {
        match self {
            DeltaCodec::Steps => elements.div_ceil(4),
            _ => 0,
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
    /// Of those wire bytes, the ones every element costs ([`DeltaCodec::map_bytes`]).
    pub delta_map_bytes: u64,
}

/// The rates learned so far, as each sync's metrics report them.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ChoiceReport {
    /// ms per GB sent whole (None before the seed).
    pub dense_ms_per_gb: Option<f64>,
    /// ms per GB of tensor diffed.
    pub diff_ms_per_gb: Option<f64>,
    /// Per codec (plain, entropy, steps): predicted ms per million changes (link and work)
    /// and fixed ms per sync, and how many syncs it was measured on (0: the priors alone).
    pub delta_ms_per_mchange: [f64; 3],
    pub delta_fixed_ms: [f64; 3],
    pub measured: [u64; 3],
    /// The changed fraction of a 1 GB BF16 stage, once diffed, above which sending it whole
    /// is predicted cheaper than its delta, per codec.
    pub dense_above: [Option<f64>; 3],
}

/// A weighted least-squares line `y = fixed + slope·n` over the syncs measured, older ones
/// forgotten by [`KEEP`].
#[derive(Debug, Clone, Copy, Default)]
struct Line {
    s0: f64,
    sn: f64,
    sy: f64,
    snn: f64,
    sny: f64,
    count: u64,
}

impl Line {
    fn add(&mut self, n: f64, y: f64) {
        for s in [
            &mut self.s0,
            &mut self.sn,
            &mut self.sy,
            &mut self.snn,
            &mut self.sny,
        ] {
            *s *= KEEP;
        }
        self.s0 += 1.0;
        self.sn += n;
        self.sy += y;
        self.snn += n * n;
        self.sny += n * y;
        self.count += 1;
    }

    /// (fixed, slope), both ≥ 0: least squares with a ridge pulling each toward its prior
    /// (`fixed0`, `slope0`), so that syncs of one size fix the time at that size and the
    /// priors only split it between the two.
    fn fit(&self, fixed0: f64, slope0: f64) -> (f64, f64) {
        let lf = PRIOR_WEIGHT;
        let lb = PRIOR_WEIGHT * PRIOR_CHANGES * PRIOR_CHANGES;
        let (a, b, d) = (self.s0 + lf, self.sn, self.snn + lb);
        let (r1, r2) = (self.sy + lf * fixed0, self.sny + lb * slope0);
        let det = a * d - b * b;
        if det.is_nan() || det <= 0.0 {
            return (fixed0, slope0);
        }
        let fixed = (r1 * d - b * r2) / det;
        let slope = (a * r2 - b * r1) / det;
        if fixed < 0.0 {
            // Through the origin instead.
            return (0.0, ((self.sny + lb * slope0) / d).max(0.0));
        }
        if slope < 0.0 {
            return ((self.sy + lf * fixed0) / a, 0.0);
        }
        (fixed, slope)
    }
}

/// A sender's measured costs on its link; see the module docs.
#[derive(Debug, Clone, Default)]
pub struct CostModel {
    link_ms_per_byte: Option<f64>,
    diff_ms_per_byte: Option<f64>,
    /// Per codec: time beyond the diff and the link against changes.
    work: [Line; 3],
    wire: [Option<f64>; 3],
    /// Delta syncs since the slower codec was last tried.
    since_probe: u64,
    /// Per codec, whether its one probe before any measurement was made
    /// ([`PROBE_UNMEASURED_WITHIN`]).
    probed_unmeasured: [bool; 3],
}

fn smooth(slot: &mut Option<f64>, x: f64) {
    if x.is_finite() && x >= 0.0 {
        *slot = Some(slot.map_or(x, |old| 0.5 * old + 0.5 * x));
    }
}

/// What the plan of a sync knows of one stage: its (bytes, elements) and the elements its
/// last sync changed; None for a stage diffed whatever the model says (no count yet, or a
/// snapshot in host memory).
pub type StageOutlook = Option<((u64, u64), u64)>;

impl CostModel {
    fn link(&self) -> f64 {
        self.link_ms_per_byte.unwrap_or(0.0)
    }

    /// `codec`'s (fixed ms per sync, ms per change: link bytes and work).
    fn delta_rates(&self, codec: DeltaCodec) -> (f64, f64) {
        let c = codec as usize;
        let (fixed, work) = self.work[c].fit(PRIOR_FIXED_MS[c], PRIOR_WORK_MS[c]);
        (
            fixed,
            self.link() * self.wire[c].unwrap_or(PRIOR_WIRE[c]) + work,
        )
    }

    /// Predicted ms of a `codec` delta of `changes` changes over `elements` elements,
    /// beyond the diff.
    fn delta_ms(&self, codec: DeltaCodec, changes: f64, elements: u64) -> f64 {
        let c = codec as usize;
        let (fixed, work) = self.work[c].fit(PRIOR_FIXED_MS[c], PRIOR_WORK_MS[c]);
        let link = self.link_ms_per_byte.unwrap_or(PRIOR_LINK_MS_PER_BYTE);
        let wire =
            codec.map_bytes(elements) as f64 + self.wire[c].unwrap_or(PRIOR_WIRE[c]) * changes;
        fixed + link * wire + work * changes + ELEMENT_WORK_MS[c] * elements as f64
    }

    /// The delta codec predicted fastest among those `allowed` (in order of preference on
    /// ties) for a sync of `elements` elements expected to change about `expected` of them:
    /// what the choice between whole and delta weighs, before any stage is diffed.
    pub fn best(&self, allowed: &[DeltaCodec], expected: u64, elements: u64) -> DeltaCodec {
        let Some(&first) = allowed.first() else {
            return DeltaCodec::Plain;
        };
        let n = expected as f64;
        let time = |c: DeltaCodec| self.delta_ms(c, n, elements);
        allowed
            .iter()
            .copied()
            .fold(first, |b, c| if time(c) < time(b) { c } else { b })
    }

    /// The delta codec for the diffs of a sync that diffs at least one stage (which form they
    /// take, whether they keep old bits): [`CostModel::best`], or a probe — once, a codec
    /// never measured predicted within [`PROBE_UNMEASURED_WITHIN`]; now and then, a measured
    /// one predicted within [`PROBE_WITHIN`]. Called only for syncs that diff, so that a probe
    /// is not spent on one sent whole.
    pub fn codec(&mut self, allowed: &[DeltaCodec], expected: u64, elements: u64) -> DeltaCodec {
        let best = self.best(allowed, expected, elements);
        if allowed.len() <= 1 {
            return best;
        }
        let n = expected as f64;
        let time = |c: DeltaCodec| self.delta_ms(c, n, elements);
        let floor = time(best).max(f64::MIN_POSITIVE);
        let untried = allowed
            .iter()
            .copied()
            .filter(|&c| c != best && self.work[c as usize].count == 0)
            .filter(|&c| !self.probed_unmeasured[c as usize])
            .filter(|&c| time(c) / floor <= PROBE_UNMEASURED_WITHIN)
            .min_by(|&a, &b| time(a).total_cmp(&time(b)));
        // Once the fastest has a measurement of its own to be compared with.
        if let Some(other) = untried.filter(|_| self.work[best as usize].count > 0) {
            self.probed_unmeasured[other as usize] = true;
            return other;
        }
        let probe = allowed
            .iter()
            .copied()
            .filter(|&c| c != best && self.work[c as usize].count > 0)
            .filter(|&c| time(c) / floor <= PROBE_WITHIN)
            .min_by(|&a, &b| time(a).total_cmp(&time(b)));
        self.since_probe += 1;
        if let Some(other) = probe.filter(|_| self.since_probe >= AUTO_PROBE_EVERY) {
            self.since_probe = 0;
            return other;
        }
        best
    }

    /// A stage's predicted time as a `codec` delta, its diff included, over its time sent
    /// whole, for a stage of `bytes` bytes and `elements` elements, one of `stages`, whose last
    /// sync changed `expected` elements: at 1 or more it goes whole. None while the link or
    /// the diff is unmeasured, or for a stage too small for the model: it is diffed.
    pub fn delta_over_whole(
        &self,
        (bytes, elements): (u64, u64),
        stages: usize,
        expected: u64,
        codec: DeltaCodec,
    ) -> Option<f64> {
        let (Some(link), Some(diff)) = (self.link_ms_per_byte, self.diff_ms_per_byte) else {
            return None;
        };
        if bytes < MODEL_MIN_BYTES {
            return None;
        }
        let (fixed, per) = self.delta_rates(codec);
        let b = bytes as f64;
        let map = link * codec.map_bytes(elements) as f64
            + ELEMENT_WORK_MS[codec as usize] * elements as f64;
        let delta = diff * b + fixed / stages.max(1) as f64 + map + per * expected as f64;
        let whole = link * b;
        Some(if whole > 0.0 {
            delta / whole
        } else {
            f64::INFINITY
        })
    }

    /// Whether such a stage is predicted to go faster whole than diffed and sent as a
    /// `codec` delta.
    pub fn dense_before_diff(
        &self,
        sizes: (u64, u64),
        stages: usize,
        expected: u64,
        codec: DeltaCodec,
    ) -> bool {
        self.delta_over_whole(sizes, stages, expected, codec)
            .is_some_and(|r| r >= 1.0)
    }

    /// The plan of a sync expected to change `expected` of its `elements` elements: per stage
    /// whether it goes whole, and the delta codec of the stages diffed. Whole or delta by the
    /// fastest `allowed` codec, a probe of another only where a stage is diffed
    /// ([`CostModel::codec`]: a sync sent whole would spend it for nothing). When every stage
    /// is predicted whole, a codec never measured nor probed on this link and predicted within
    /// [`PROBE_UNMEASURED_WITHIN`] of whole on some stage is tried, once, by the stages so
    /// predicted: its prediction is priors alone, and priors can keep a codec that beats
    /// whole from ever being tried (steps of ~50 % changed went whole at 0.7x the full copy
    /// while the steps code was never measured).
    pub fn plan(
        &mut self,
        allowed: &[DeltaCodec],
        expected: u64,
        elements: u64,
        stages: &[StageOutlook],
    ) -> (Vec<bool>, DeltaCodec) {
        let n = stages.len();
        let ratio = |m: &Self, c: DeltaCodec, s: &StageOutlook| {
            s.and_then(|(sizes, changed)| m.delta_over_whole(sizes, n, changed, c))
        };
        let best = self.best(allowed, expected, elements);
        let whole: Vec<bool> = stages
            .iter()
            .map(|s| {
                s.is_some_and(|(sizes, changed)| self.dense_before_diff(sizes, n, changed, best))
            })
            .collect();
        if !whole.iter().all(|&w| w) {
            return (whole, self.codec(allowed, expected, elements));
        }
        let untried = allowed
            .iter()
            .copied()
            .filter(|&c| self.work[c as usize].count == 0 && !self.probed_unmeasured[c as usize])
            .filter_map(|c| {
                stages
                    .iter()
                    .filter_map(|s| ratio(self, c, s))
                    .min_by(f64::total_cmp)
                    .filter(|&r| r <= PROBE_UNMEASURED_WITHIN)
                    .map(|r| (c, r))
            })
            .min_by(|a, b| a.1.total_cmp(&b.1));
        let Some((probe, _)) = untried else {
            return (whole, best);
        };
        self.probed_unmeasured[probe as usize] = true;
        let whole = stages
            .iter()
            .map(|s| ratio(self, probe, s).is_none_or(|r| r > PROBE_UNMEASURED_WITHIN))
            .collect();
        (whole, probe)
    }

    /// Whether a diffed stage of `bytes` bytes and `elements` elements, one of `stages`, with
    /// `changes` changes is predicted to go faster whole than as its `wire`-byte `codec` delta.
    pub fn dense_after_diff(
        &self,
        (bytes, elements): (u64, u64),
        stages: usize,
        changes: u64,
        wire: u64,
        codec: DeltaCodec,
    ) -> bool {
        let Some(link) = self.link_ms_per_byte.filter(|_| bytes >= MODEL_MIN_BYTES) else {
            return wire >= bytes;
        };
        let c = codec as usize;
        let (fixed, work) = self.work[c].fit(PRIOR_FIXED_MS[c], PRIOR_WORK_MS[c]);
        let delta = fixed / stages.max(1) as f64
            + link * wire as f64
            + work * changes as f64
            + ELEMENT_WORK_MS[c] * elements as f64;
        link * bytes as f64 <= delta
    }

    /// Learns from a sync that went through.
    pub fn record(&mut self, c: &SyncCosts) {
        let wire = c.delta_bytes.unwrap_or(0);
        let total = c.diffed_bytes.max(c.dense_bytes + wire);
        if !(c.time_ms.is_finite() && c.diff_ms.is_finite()) || total < MODEL_MIN_BYTES {
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
                // Whatever else a delta costs is ≥ 0, so its bytes moved in at most its time
                // beyond the diff: a bound on the link that no prior enters, which corrects a
                // link cost taught by one slow whole sync (a first seed's warm-up).
                let moved = c.dense_bytes + wire;
                if let Some(link) = self.link_ms_per_byte.as_mut().filter(|_| moved > 0) {
                    *link = link.min((c.time_ms - c.diff_ms).max(0.0) / moved as f64);
                }
                // (The steps maps are a quarter byte per element they cover.)
                let walked = ELEMENT_WORK_MS[i] * (4 * c.delta_map_bytes) as f64;
                let rest =
                    c.time_ms - c.diff_ms - self.link() * (c.dense_bytes + wire) as f64 - walked;
                self.work[i].add(c.delta_changes as f64, rest.max(0.0));
                let per_change = wire.saturating_sub(c.delta_map_bytes);
                smooth(
                    &mut self.wire[i],
                    per_change as f64 / c.delta_changes as f64,
                );
            }
            _ => {}
        }
    }

    pub fn report(&self) -> ChoiceReport {
        let codecs = DeltaCodec::ALL;
        let elems = 5e8; // a 1 GB BF16 stage
        let dense_above = codecs.map(|codec| {
            let link = self.link_ms_per_byte?;
            let (fixed, per) = self.delta_rates(codec);
            let map = link * codec.map_bytes(elems as u64) as f64
                + ELEMENT_WORK_MS[codec as usize] * elems;
            // Whole: 2·link per element; delta: fixed + map + x·elems·per.
            Some(((2.0 * link * elems - fixed - map) / (per * elems)).clamp(0.0, 1.0))
        });
        ChoiceReport {
            dense_ms_per_gb: self.link_ms_per_byte.map(|r| r * 1e9),
            diff_ms_per_gb: self.diff_ms_per_byte.map(|r| r * 1e9),
            delta_ms_per_mchange: codecs.map(|codec| self.delta_rates(codec).1 * 1e6),
            delta_fixed_ms: codecs.map(|codec| self.delta_rates(codec).0),
            measured: codecs.map(|codec| self.work[codec as usize].count),
            dense_above,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GB: u64 = 1_000_000_000;
    const BOTH: [DeltaCodec; 2] = [DeltaCodec::Plain, DeltaCodec::Entropy];

    fn seed(ms_per_gb: f64) -> CostModel {
        let mut m = CostModel::default();
        m.record(&SyncCosts {
            time_ms: ms_per_gb,
            dense_bytes: GB,
            ..Default::default()
        });
        m
    }

    /// A delta sync over 1 GB whose time is `fixed + diff + link·wire + work·n`.
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
        assert!(!m.dense_before_diff((GB, GB / 2), 1, GB / 2, DeltaCodec::Plain));
        assert!(m.dense_after_diff((GB, GB / 2), 1, 10, GB, DeltaCodec::Plain));
        assert!(!m.dense_after_diff((GB, GB / 2), 1, 10, GB - 1, DeltaCodec::Plain));
        assert_eq!(m.report().dense_ms_per_gb, None);
    }

    #[test]
    fn the_fit_separates_fixed_costs_from_per_change_work() {
        // An H200 over CUDA IPC: 13 ms per GB whole; plain deltas cost 1.3 ms fixed + 3 bytes
        // and 43 ps of work per change.
        let mut m = seed(13.0);
        let link = 13.0 / GB as f64;
        for n in [20e6, 80e6, 40e6, 60e6, 10e6, 70e6] {
            let wire = 3.0 * n;
            delta(
                &mut m,
                DeltaCodec::Plain,
                1.3 + 2.6 + link * wire + 43e-9 * n,
                n as u64,
                wire as u64,
            );
        }
        let r = m.report();
        assert!((r.delta_fixed_ms[0] - 1.3).abs() < 0.2, "{r:?}");
        let per = r.delta_ms_per_mchange[0];
        assert!((per - (link * 3.0 + 43e-9) * 1e6).abs() < 0.01, "{r:?}");
        // Whole above ~27 % of a 1 GB stage, once diffed.
        let above = r.dense_above[0].expect("link known");
        assert!((0.2..0.35).contains(&above), "{r:?}");
        // Before the diff its time counts too: 12 % → delta, 60 % → whole without a diff.
        let elems = GB / 2;
        assert!(!m.dense_before_diff((GB, GB / 2), 1, elems / 8, DeltaCodec::Plain));
        assert!(m.dense_before_diff((GB, GB / 2), 1, elems * 6 / 10, DeltaCodec::Plain));
        assert!(m.dense_after_diff(
            (GB, GB / 2),
            1,
            elems * 4 / 10,
            600_000_000,
            DeltaCodec::Plain
        ));
        assert!(!m.dense_after_diff((GB, GB / 2), 1, elems / 5, 300_000_000, DeltaCodec::Plain));
        // The entropy codecs' priors predict them slower here (1.6x): tried once, as a codec
        // never measured within 2x, then not again while nothing says otherwise.
        let picks: Vec<DeltaCodec> = (0..100)
            .map(|_| m.codec(&BOTH, 50_000_000, GB / 2))
            .collect();
        assert_eq!(picks[0], DeltaCodec::Entropy);
        assert!(
            picks[1..].iter().all(|&c| c == DeltaCodec::Plain),
            "{picks:?}"
        );
    }

    #[test]
    fn one_small_delta_does_not_make_every_change_look_dear() {
        // A 2 % step: most of its time is fixed. The prior keeps the per-change figure sane,
        // so a 12 % step is still predicted cheaper as a delta.
        let mut m = seed(11.0);
        let link = 11.0 / GB as f64;
        let n = 10e6;
        delta(
            &mut m,
            DeltaCodec::Plain,
            1.3 + 2.6 + link * 3.0 * n + 43e-9 * n,
            n as u64,
            (3.0 * n) as u64,
        );
        assert!(
            !m.dense_before_diff((GB, GB / 2), 1, 60_000_000, DeltaCodec::Plain),
            "{:?}",
            m.report()
        );
        m.probed_unmeasured[DeltaCodec::Entropy as usize] = true; // (its probe: another test)
        assert_eq!(m.codec(&BOTH, 10_000_000, GB / 2), DeltaCodec::Plain);
    }

    #[test]
    fn one_slow_seed_does_not_keep_plain_deltas_from_being_tried() {
        // 1xH100 over CUDA IPC, 0.5B at lr 1e-5 (docs/data/gpu-sync/listed-steps-1xh100/): the
        // first seed took 28.8 ms for 988 MB (the others ~10), so the link looked 3x slower
        // than it is and plain deltas (3 bytes a change) were predicted 2x slower than the
        // steps code, never tried, for the whole run. Those steps syncs, as measured:
        let elems = 494_032_768u64;
        let mut m = CostModel::default();
        m.record(&SyncCosts {
            time_ms: 28.78,
            dense_bytes: 988_091_120,
            ..Default::default()
        });
        let steps = |m: &mut CostModel, time_ms: f64, diff_ms: f64, n: u64, wire: u64| {
            m.record(&SyncCosts {
                time_ms,
                diff_ms,
                diffed_bytes: 2 * elems,
                delta: Some(DeltaCodec::Steps),
                delta_changes: n,
                delta_bytes: Some(wire),
                delta_map_bytes: elems.div_ceil(4),
                ..Default::default()
            })
        };
        let all = DeltaCodec::ALL;
        assert_eq!(m.codec(&all, 122_000_000, elems), DeltaCodec::Steps);
        steps(&mut m, 10.42, 3.06, 122_000_000, 174_000_000);
        // Plain is predicted within 2x of the steps code, never measured: tried once.
        assert_eq!(m.codec(&all, 87_700_000, elems), DeltaCodec::Plain);
        // As the build before measured plain deltas there (12.9 % changed: 6.59 ms, diff
        // 2.01 ms, 189 MB): a bound on the link (4.58 ms for 189 MB at most), and plain wins.
        m.record(&SyncCosts {
            time_ms: 6.59,
            diff_ms: 2.01,
            diffed_bytes: 2 * elems,
            delta: Some(DeltaCodec::Plain),
            delta_changes: 63_700_000,
            delta_bytes: Some(189_000_000),
            ..Default::default()
        });
        let link = m.report().dense_ms_per_gb.expect("known");
        assert!(link < 25.0, "{link}");
        for n in [63_700_000, 58_300_000, 53_900_000] {
            assert_eq!(
                m.codec(&all, n, elems),
                DeltaCodec::Plain,
                "{:?}",
                m.report()
            );
        }
        // The bound never raises the link, nor moves it when the deltas are slow enough.
        let before = m.report().dense_ms_per_gb;
        steps(&mut m, 40.0, 2.0, 60_000_000, 140_000_000);
        assert_eq!(m.report().dense_ms_per_gb, before);
    }

    #[test]
    fn a_sync_predicted_whole_tries_an_unmeasured_codec_once() {
        // 1xH100 over CUDA IPC, 0.5B at lr 1e-5, 2026-12-07 16:20 UTC (the cost model of
        // 39cd04c; docs/data/gpu-sync/whole-spends-probe-1xh100/): seed 10.4 ms; the first
        // delta (24.7 %) in the steps code, 11.05 ms; then two syncs went whole, and plain
        // deltas, never measured, were never tried. At lr 6e-5 (2026-12-08, ~50 % changed)
        // every step after the first went whole the same way, the steps code never measured.
        let elems = 494_032_768u64;
        let mut m = CostModel::default();
        m.record(&SyncCosts {
            time_ms: 10.23,
            dense_bytes: 988_091_120,
            ..Default::default()
        });
        m.record(&SyncCosts {
            time_ms: 11.05,
            diff_ms: 2.45,
            diffed_bytes: 2 * elems,
            delta: Some(DeltaCodec::Steps),
            delta_changes: 122_000_000,
            delta_bytes: Some(173_530_000),
            delta_map_bytes: elems.div_ceil(4),
            ..Default::default()
        });
        let all = DeltaCodec::ALL;
        // The sender's plan of a one-stage sync: the codec when it diffs.
        let sync = |m: &mut CostModel, expected: u64| -> Option<DeltaCodec> {
            let (whole, codec) = m.plan(
                &all,
                expected,
                elems,
                &[Some(((2 * elems, elems), expected))],
            );
            (!whole[0]).then_some(codec)
        };
        // At 24.7 % expected the model says whole, but plain was never measured: tried.
        let first = sync(&mut m, 122_000_000);
        assert_eq!(first, Some(DeltaCodec::Plain));
        // Once each: the next such sync tries the entropy codecs, never measured either;
        // then, nothing left untried, the syncs go whole.
        assert_eq!(sync(&mut m, 122_000_000), Some(DeltaCodec::Entropy));
        assert_eq!(sync(&mut m, 122_000_000), None);
        // `best` and the whole choice never spend a probe of their own.
        for _ in 0..3 {
            let _ = m.best(&all, 72_400_000, elems);
        }
        assert_eq!(m.report().measured, [0, 0, 1]);
        // The try's measurement (a bitmap delta: 6.6 ms, 237 MB for 88 M changes) teaches
        // the model that plain beats whole there.
        m.record(&SyncCosts {
            time_ms: 6.6,
            diff_ms: 1.74,
            diffed_bytes: 2 * elems,
            delta: Some(DeltaCodec::Plain),
            delta_changes: 87_700_000,
            delta_bytes: Some(237_200_000),
            ..Default::default()
        });
        assert_eq!(m.report().measured, [1, 0, 1]);
        assert!(sync(&mut m, 87_700_000).is_some());
    }

    #[test]
    fn an_unmeasured_codec_predicted_far_from_whole_is_not_tried() {
        // A fast link (the seed at 2 ms a GB) and everything changed: every delta codec is
        // predicted more than twice whole, so nothing is tried and the probes stay.
        let mut m = seed(2.0);
        m.record(&SyncCosts {
            time_ms: 4.0,
            diff_ms: 1.0,
            diffed_bytes: GB,
            delta: Some(DeltaCodec::Plain),
            delta_changes: 1_000_000,
            delta_bytes: Some(3_000_000),
            ..Default::default()
        });
        let sizes = (GB, GB / 2);
        let candidates: Vec<(DeltaCodec, f64)> = DeltaCodec::ALL
            .iter()
            .filter_map(|&c| m.delta_over_whole(sizes, 1, GB / 2, c).map(|r| (c, r)))
            .collect();
        assert!(candidates
            .iter()
            .all(|&(c, r)| r > PROBE_UNMEASURED_WITHIN || c == DeltaCodec::Plain));
        let (whole, _) = m.plan(&DeltaCodec::ALL, GB / 2, GB / 2, &[Some((sizes, GB / 2))]);
        assert_eq!(whole, [true]);
        assert_eq!(m.probed_unmeasured, [false; 3]);
    }

    #[test]
    fn a_slow_link_takes_the_entropy_codecs_at_once() {
        // A socket: 1 s per GB whole.
        let mut m = seed(1000.0);
        assert_eq!(m.codec(&BOTH, 20_000_000, GB / 2), DeltaCodec::Entropy);
        delta(&mut m, DeltaCodec::Entropy, 60.0, 50_000_000, 55_000_000);
        for _ in 0..100 {
            assert_eq!(m.codec(&BOTH, 50_000_000, GB / 2), DeltaCodec::Entropy);
        }
        let above = m.report().dense_above[1].expect("known");
        assert!(above > 0.9, "{above}");
    }

    #[test]
    fn near_ties_are_probed_now_and_then_and_the_model_follows_the_link() {
        let mut m = seed(13.0);
        delta(&mut m, DeltaCodec::Plain, 7.0, 50_000_000, 150_000_000);
        delta(&mut m, DeltaCodec::Entropy, 7.6, 50_000_000, 50_000_000);
        let picks: Vec<DeltaCodec> = (0..4 * AUTO_PROBE_EVERY)
            .map(|_| m.codec(&BOTH, 50_000_000, GB / 2))
            .collect();
        let probes = picks.iter().filter(|&&c| c == DeltaCodec::Entropy).count();
        assert_eq!(probes, 4, "{picks:?}");
        // The entropy path gets cheaper (a faster decoder): it takes over.
        for _ in 0..6 {
            delta(&mut m, DeltaCodec::Entropy, 4.5, 50_000_000, 50_000_000);
        }
        assert_eq!(m.codec(&BOTH, 50_000_000, GB / 2), DeltaCodec::Entropy);
        assert_eq!(m.codec(&[DeltaCodec::Plain], 1, GB / 2), DeltaCodec::Plain);
    }

    #[test]
    fn the_steps_code_takes_dense_steps_and_leaves_sparse_ones() {
        let all = DeltaCodec::ALL;
        let elems = GB / 2;
        for mut m in [CostModel::default(), seed(13.0)] {
            assert_eq!(m.codec(&all, elems / 50, elems), DeltaCodec::Plain);
            assert_eq!(m.codec(&all, elems / 2, elems), DeltaCodec::Steps);
            assert_eq!(m.codec(&all[..2], elems / 2, elems), DeltaCodec::Plain);
        }
        // A device link at 2-4 %: plain, without a probe of the steps code (its walk over
        // the map alone, ~4 ms for 5e8 elements, is more than the plain delta's whole time).
        let mut m = seed(11.0);
        assert_eq!(m.codec(&all, elems / 25, elems), DeltaCodec::Plain);
        // A model of 345 000 elements, nothing measured: its walk is negligible, its map is
        // smaller than the plain delta at 90 %.
        let mut m = CostModel::default();
        assert_eq!(m.codec(&all, 310_000, 345_000), DeltaCodec::Steps);
        // A slow link (a socket, 100 ms per GB): the entropy codecs at 10 %, steps at half.
        let mut m = seed(100.0);
        assert_eq!(m.codec(&all, elems / 10, elems), DeltaCodec::Entropy);
        assert_eq!(m.codec(&all, elems / 2, elems), DeltaCodec::Steps);
        // Once measured (13 ms per GB, steps at 1.5 ms fixed + 10 ps a change beyond its map
        // and escapes), a half-changed stage is predicted cheaper as steps than whole.
        let mut m = seed(13.0);
        let link = 13.0 / GB as f64;
        for n in [100e6, 250e6, 180e6] {
            let wire = elems as f64 / 4.0 + 0.3 * n;
            m.record(&SyncCosts {
                time_ms: 1.5 + 2.0 + link * wire + 10e-9 * n,
                diff_ms: 2.0,
                diffed_bytes: GB,
                delta: Some(DeltaCodec::Steps),
                delta_changes: n as u64,
                delta_bytes: Some(wire as u64),
                delta_map_bytes: elems / 4,
                ..Default::default()
            });
        }
        let r = m.report();
        assert!(r.measured[2] == 3, "{r:?}");
        let above = r.dense_above[2].expect("link known");
        assert!(above > 0.9, "{r:?}");
        assert!(!m.dense_after_diff(
            (GB, GB / 2),
            1,
            elems / 2,
            elems / 4 + elems * 3 / 20,
            DeltaCodec::Steps
        ));
    }

    #[test]
    fn small_syncs_and_nonsense_teach_nothing() {
        let mut m = seed(13.0);
        let before = m.report();
        m.record(&SyncCosts {
            time_ms: f64::NAN,
            dense_bytes: GB,
            ..Default::default()
        });
        m.record(&SyncCosts::default());
        m.record(&SyncCosts {
            time_ms: 2.0,
            dense_bytes: MODEL_MIN_BYTES - 1,
            ..Default::default()
        });
        assert_eq!(m.report(), before);
        // A small stage is decided by its bytes.
        let small = MODEL_MIN_BYTES / 2;
        assert!(!m.dense_before_diff((small, small / 2), 1, small, DeltaCodec::Plain));
        assert!(!m.dense_after_diff((small, small / 2), 1, small, small - 1, DeltaCodec::Plain));
        assert!(m.dense_after_diff((small, small / 2), 1, 1, small, DeltaCodec::Plain));
    }
}
