//! What a receiver holds and what it decides about each sync, written once for every
//! receiver (the CPU [`Receiver`](crate::apply::Receiver) and the GPU one): the version held
//! and the per-slot digests that prove it, which syncs may start at that version, the base
//! digest a delta or dense part starts from, the sender's new digests against the computed
//! ones, and what a sync that fails leaves held. The mechanics (staging, decoding, writing,
//! journals, undo) stay with each receiver; they report here what they did.
//!
//! A sync runs as [`HeldState::begin`] → a [`Pending`] that settles each slot's digest →
//! [`HeldState::commit`] (the new version and digests) or [`HeldState::fail`] (the version
//! held stays, unless something was overwritten that the receiver cannot put back).

use crate::error::{Error, Result};
use crate::slot::SlotTable;
use crate::wire::FrameKind;

/// The version a receiver holds (none before its first seed, or after it lost its state)
/// and the digest of each slot as held.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeldState {
    version: Option<u64>,
    digests: Vec<u64>,
}

/// A sync under way: its family and version, and the digests computed so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    /// Seed, delta (delta and dense parts) or verify.
    kind: FrameKind,
    version: u64,
    /// Per slot: the held digest until the slot is settled, then the computed one.
    digests: Vec<u64>,
    /// Per slot: its computed digest was found equal to the sender's.
    settled: Vec<bool>,
    /// Something was written without a copy of what it replaced: a failure cannot be undone.
    clobbered: bool,
}

impl HeldState {
    /// Nothing held: only a seed may start. Digests become meaningful at the first seed.
    pub fn none(table: &SlotTable) -> Self {
        HeldState {
            version: None,
            digests: vec![0; table.len()],
        }
    }

    /// Holds `version` (or nothing) with these per-slot digests (e.g. computed from a
    /// checkpoint).
    pub fn holding(version: Option<u64>, digests: Vec<u64>) -> Self {
        HeldState { version, digests }
    }

    /// The version held, `None` before the first seed or after the state was lost.
    pub fn version(&self) -> Option<u64> {
        self.version
    }

    /// The digest of each slot as held.
    pub fn digests(&self) -> &[u64] {
        &self.digests
    }

    /// The combined digest acked to the sender: the sum of the slot digests.
    pub fn state_digest(&self) -> u64 {
        self.digests.iter().fold(0u64, |a, &d| a.wrapping_add(d))
    }

    /// A close is taken between syncs only (`mid_sync`: a sync is half received).
    pub fn check_close(&self, mid_sync: bool) -> Result<()> {
        if mid_sync {
            return Err(Error::IncompleteSync(
                "the sender closed in the middle of a sync".into(),
            ));
        }
        Ok(())
    }

    /// Whether a sync whose first frame is of `kind` at `version` may start here: a seed at
    /// any version; a delta or dense at the version after the one held (none follows
    /// `u64::MAX`); a verify at the version held. A close starts no sync.
    pub fn begin(&self, kind: FrameKind, version: u64) -> Result<Pending> {
        let family = kind.family();
        let expected = match family {
            FrameKind::Seed => Some(version),
            FrameKind::Delta => self.version.and_then(|v| v.checked_add(1)),
            FrameKind::Verify => self.version,
            _ => {
                return Err(Error::Malformed(format!(
                    "a {} frame starts no sync",
                    kind.name()
                )))
            }
        };
        if expected != Some(version) {
            return Err(Error::VersionMismatch {
                current: self.version,
                got: version,
                expected,
            });
        }
        let digests = match family {
            FrameKind::Seed => vec![0; self.digests.len()],
            _ => self.digests.clone(),
        };
        Ok(Pending {
            kind: family,
            version,
            settled: vec![false; digests.len()],
            digests,
            clobbered: false,
        })
    }

    /// The base check of a delta or dense part: the sender's digest of `slot` before the
    /// sync must be the one held.
    pub fn check_base(&self, table: &SlotTable, slot: u32, base: u64) -> Result<()> {
        let actual = self.digest_of(table, slot)?;
        if base != actual {
            return Err(Error::BaseDigestMismatch {
                slot: table.get(slot)?.name.clone(),
                expected: base,
                actual,
            });
        }
        Ok(())
    }

    /// Ends a sync whose every part was applied: the new version and digests are held.
    /// Refused (as [`fail`](Self::fail)) when a slot's digest was never settled.
    pub fn commit(&mut self, table: &SlotTable, pending: Pending) -> Result<u64> {
        if let Some(id) = pending.settled.iter().position(|&s| !s) {
            let slot = table
                .slots()
                .get(id)
                .map_or_else(|| format!("#{id}"), |s| s.name.clone());
            self.fail(pending);
            return Err(Error::IncompleteSync(format!(
                "no digest for slot `{slot}`"
            )));
        }
        self.version = Some(pending.version);
        self.digests = pending.digests;
        Ok(pending.version)
    }

    /// Ends a sync that failed, its writes undone by the receiver: the version held stays,
    /// unless something was overwritten without a copy, then nothing is held.
    pub fn fail(&mut self, pending: Pending) {
        if pending.clobbered {
            self.lose();
        }
    }

    /// The bits held no longer match the digests (a failed verify, an undo that failed):
    /// nothing is held, only a seed may follow.
    pub fn lose(&mut self) {
        self.version = None;
    }

    /// Compares digests recomputed from the bits held with the ones recorded; on the first
    /// mismatch the state is lost. Nothing held: nothing to check.
    pub fn verify(&mut self, table: &SlotTable, actual: &[u64]) -> Result<()> {
        if self.version.is_none() {
            return Ok(());
        }
        if actual.len() != self.digests.len() {
            return Err(Error::InvalidArgument(format!(
                "{} digests for {} slots",
                actual.len(),
                self.digests.len()
            )));
        }
        let differs = self.digests.iter().zip(actual).position(|(a, b)| a != b);
        if let Some(id) = differs {
            self.lose();
            return Err(Error::DigestMismatch {
                slot: table.get(id as u32)?.name.clone(),
                expected: self.digests[id],
                actual: actual[id],
            });
        }
        Ok(())
    }

    fn digest_of(&self, table: &SlotTable, slot: u32) -> Result<u64> {
        table.get(slot)?;
        self.digests
            .get(slot as usize)
            .copied()
            .ok_or(Error::UnknownSlot(slot))
    }
}

impl Pending {
    /// Seed, delta or verify (a sync of dense parts is a delta).
    pub fn kind(&self) -> FrameKind {
        self.kind
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    /// Per slot: the held digest, or the computed one once settled.
    pub fn digests(&self) -> &[u64] {
        &self.digests
    }

    /// Records `computed`, the digest `slot` reaches by this sync, and compares it with
    /// the sender's `sender` digest of it. A slot is settled once.
    pub fn settle(
        &mut self,
        table: &SlotTable,
        slot: u32,
        computed: u64,
        sender: u64,
    ) -> Result<()> {
        let name = &table.get(slot)?.name;
        let id = slot as usize;
        match self.settled.get(id) {
            None => return Err(Error::UnknownSlot(slot)),
            Some(true) => {
                return Err(Error::Malformed(format!(
                    "the digest of slot `{name}` is settled twice in one sync"
                )))
            }
            Some(false) => {}
        }
        if computed != sender {
            return Err(Error::DigestMismatch {
                slot: name.clone(),
                expected: sender,
                actual: computed,
            });
        }
        self.digests[id] = computed;
        self.settled[id] = true;
        Ok(())
    }

    /// Something of this sync was written without a copy of what it replaced: if the sync
    /// fails, the bits held are no longer the version held.
    pub fn clobber(&mut self) {
        self.clobbered = true;
    }

    pub fn is_clobbered(&self) -> bool {
        self.clobbered
    }

    /// Whether every slot's digest was settled (what [`HeldState::commit`] requires).
    pub fn is_complete(&self) -> bool {
        self.settled.iter().all(|&s| s)
    }
}

#[cfg(test)]
mod tests;
