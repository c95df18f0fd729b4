//! What [`GpuSender`] decides per stage before and after its diff: sent whole or as a delta
//! (by the cost model), and, for the first delta after a seed, the density those choices go
//! by.

use std::ops::Range;

use super::super::digest_inputs;
use super::super::settings::Snapshot;
use super::super::EntropyMode;
use super::GpuSender;
use crate::choice::{DeltaCodec, StageOutlook};
use crate::error::Result;
use crate::protocol::{CHUNK_RECORD_BYTES, HEADER_BYTES, SLOT_RECORD_BYTES};

/// The first delta after a seed samples one block in this many to estimate each stage's
/// density (1/16 of the bytes read: ~0.03 ms for the 0.5B model on an H200).
const DENSITY_SAMPLE_EVERY: u64 = 16;

impl GpuSender {
    /// Per stage whether it goes whole, and the delta codec of the stages diffed
    /// ([`crate::choice::CostModel::plan`]), from each stage's changes at the last sync. A
    /// stage with a snapshot in host memory is always diffed (the one-pass refresh writes
    /// element by element, which PCIe does not do well).
    pub(super) fn plan_sync(&mut self) -> Result<(Vec<bool>, DeltaCodec)> {
        let mut allowed = match self.config.entropy {
            EntropyMode::Off => vec![DeltaCodec::Plain],
            EntropyMode::On => vec![DeltaCodec::Entropy],
            EntropyMode::Auto => vec![DeltaCodec::Plain, DeltaCodec::Entropy],
        };
        if self.steps_ok && self.config.entropy == EntropyMode::Auto {
            allowed.push(DeltaCodec::Steps);
        }
        self.estimate_unknown_densities()?;
        let expected = self.last_changed.iter().flatten().sum::<u64>();
        let outlook: Vec<StageOutlook> = (0..self.stages.len())
            .map(|s| {
                let changed = self.last_changed[s]?;
                (!self.any_pinned(self.stages[s].clone()))
                    .then(|| ((self.stage_bytes(s), self.stage_elements(s)), changed))
            })
            .collect();
        let elements = self.table.total_elements();
        Ok(self.costs.plan(&allowed, expected, elements, &outlook))
    }

    /// Stages with no count yet (the first delta after a seed) get an estimate from a sample
    /// of their blocks, so that the choice between whole and delta, and the diff's form, go
    /// by the density they have rather than a guess: a dense first delta would otherwise be
    /// diffed for nothing (its output overflows and it goes whole after all). Stages with a
    /// snapshot in host memory are left alone (sampling them would read across PCIe).
    pub(super) fn estimate_unknown_densities(&mut self) -> Result<()> {
        let unknown: Vec<usize> = (0..self.stages.len())
            .filter(|&s| self.last_changed[s].is_none() && !self.any_pinned(self.stages[s].clone()))
            .collect();
        if unknown.is_empty() {
            return Ok(());
        }
        let mut inputs = Vec::new();
        let mut snaps = Vec::new();
        for &s in &unknown {
            let range = self.stages[s].clone();
            inputs.extend(digest_inputs(&self.tensors, range.clone(), self.bf16_rule));
            snaps.extend(self.snapshots[range].iter().map(|snap| snap.ptr()));
        }
        // SAFETY: tensors and snapshots valid for their bytes (constructor contract); the
        // call only reads them, on the stream that waited for the trainer's.
        let counts = unsafe {
            self.gpu
                .count_changed_sampled(&inputs, &snaps, DENSITY_SAMPLE_EVERY)?
        };
        let mut next = counts.into_iter();
        for s in unknown {
            // The stage's sampled share scaled to all its elements (a stage too small to
            // have a block sampled keeps no estimate).
            let range = self.stages[s].clone();
            let (seen, changed) = next
                .by_ref()
                .take(range.len())
                .fold((0u64, 0u64), |(a, b), (x, y)| (a + x, b + y));
            let numel = self.stage_elements(s);
            if seen > 0 {
                self.last_changed[s] =
                    Some((changed as u128 * numel as u128 / seen as u128) as u64);
            }
        }
        Ok(())
    }

    /// Whether any of `slots` keeps its snapshot in host memory.
    pub(super) fn any_pinned(&self, slots: Range<usize>) -> bool {
        self.snapshots[slots]
            .iter()
            .any(|snap| matches!(snap, Snapshot::Pinned(_)))
    }

    /// Wire bytes of stage `s` as a delta of `chunks` chunks and `sections` section bytes.
    pub(super) fn delta_wire(&self, s: usize, chunks: usize, sections: u64) -> u64 {
        let slots = self.stages[s].len();
        (HEADER_BYTES + slots * SLOT_RECORD_BYTES + chunks * CHUNK_RECORD_BYTES) as u64 + sections
    }

    /// Whether diffed stage `s`, `found` changes and `wire` bytes as a `codec` delta, is
    /// predicted faster whole.
    pub(super) fn whole_after_diff(
        &self,
        s: usize,
        found: u64,
        wire: u64,
        codec: DeltaCodec,
    ) -> bool {
        let slots = self.stages[s].len();
        let whole = (HEADER_BYTES + slots * (SLOT_RECORD_BYTES + CHUNK_RECORD_BYTES)) as u64
            + self.stage_bytes(s);
        self.costs.dense_after_diff(
            (whole, self.stage_elements(s)),
            self.stages.len(),
            found,
            wire,
            codec,
        )
    }
}
