//! Commit on demand: a [`GpuReceiver`] that receives, checks and acks a sync whole while the
//! tensors keep the version held (an engine keeps generating from them), and writes it only
//! at [`GpuReceiver::commit`], the one part that needs generation paused, or drops it at
//! [`GpuReceiver::abort_sync`].

use std::ops::Range;
use std::time::Instant;

use deltacast::Pending;

use super::{Applied, GpuReceiver};
use crate::error::{CudaError, Result};
use crate::sync::{ms, GpuSyncReport};
use crate::{journal_layout, ApplyInput, DevicePtr};

/// A stage checked and kept for the commit.
pub(super) enum Later {
    /// A delta's chunks, their sections in stage `index`'s receive buffers.
    Delta {
        index: usize,
        inputs: Vec<ApplyInput>,
    },
    /// A seed or dense stage: the new bytes of each tensor of `slots`, at `staged`.
    Whole {
        index: usize,
        slots: Range<usize>,
        staged: Vec<DevicePtr>,
    },
}

/// A sync received whole and verified, waiting for its commit.
pub(super) struct Verified {
    pending: Pending,
    writes: Vec<Later>,
    /// What the receive reported (set once the ack went out).
    pub(super) report: Option<GpuSyncReport>,
}

impl GpuReceiver {
    /// Splits each sync into *stage* and *commit*: with this on, [`receive`](Self::receive)
    /// receives, checks and acks a sync whole (every digest settled against the sender's,
    /// from the bits held) but writes nothing; the tensors keep serving the version held
    /// until [`commit`](Self::commit) writes the sync, or [`abort_sync`](Self::abort_sync)
    /// drops it. Seeds and dense stages then land in staging the size of their tensors
    /// first ([`staging_bytes`](Self::staging_bytes)). Off by default.
    pub fn set_commit_on_demand(&mut self, on: bool) {
        self.commit_on_demand = on;
    }

    pub fn commits_on_demand(&self) -> bool {
        self.commit_on_demand
    }

    /// Whether a verified sync waits for [`commit`](Self::commit).
    pub fn awaits_commit(&self) -> bool {
        self.verified.is_some()
    }

    /// Keeps a sync whose every stage was checked for the commit (before its ack).
    pub(super) fn await_commit(&mut self, pending: Pending, writes: Vec<Later>) -> Result<()> {
        if !pending.is_complete() {
            self.held.fail(pending);
            return Err(deltacast::Error::IncompleteSync(
                "a slot's digest was never settled".into(),
            )
            .into());
        }
        self.verified = Some(Verified {
            pending,
            writes,
            report: None,
        });
        Ok(())
    }

    /// Writes the verified sync that waits into the tensors (after `wait_stream`'s work) and
    /// takes its version; returns the receive's report with the commit's own time. Every
    /// stage but the last keeps the bits it overwrites, so a device error part way puts
    /// them back and the version held stays; when nothing can be put back, none is held
    /// (a seed must follow). Either way the sync is gone.
    ///
    /// # Safety
    /// `wait_stream` must be a live stream of the GPU's context, or 0.
    pub unsafe fn commit(&mut self, wait_stream: u64) -> Result<GpuSyncReport> {
        let Some(Verified {
            mut pending,
            writes,
            report,
        }) = self.verified.take()
        else {
            return Err(CudaError::InvalidArgument(
                "no verified sync waits for a commit".into(),
            ));
        };
        let started = Instant::now();
        // SAFETY: per this function's contract.
        let written = unsafe { self.gpu.wait_for_stream(wait_stream) }
            .and_then(|()| self.write(&writes, &mut pending));
        if let Err(e) = written {
            self.held.fail(pending);
            return Err(e);
        }
        self.held.commit(&self.table, pending)?;
        let mut report = report.ok_or_else(|| {
            CudaError::Protocol("a verified sync without the report of its receive".into())
        })?;
        report.time_ms = ms(started);
        report.phases = vec![("commit", report.time_ms)];
        Ok(report)
    }

    /// Drops the verified sync that waits; nothing was written, the version held stays. (Its
    /// sender had the ack: its next delta starts from a version not held and is refused,
    /// and the sender reseeds.)
    pub fn abort_sync(&mut self) {
        if let Some(v) = self.verified.take() {
            self.held.fail(v.pending);
        }
    }

    /// Writes `writes` in order, every one but the last journaled; a failure undoes them.
    fn write(&mut self, writes: &[Later], pending: &mut Pending) -> Result<()> {
        // The journals first: a commit refused for want of memory has written nothing.
        let last = writes.len().saturating_sub(1);
        let mut journals = Vec::with_capacity(last);
        for w in &writes[..last] {
            let (index, bytes) = match w {
                Later::Delta { index, inputs } => (*index, journal_layout(inputs).1),
                Later::Whole { index, slots, .. } => (
                    *index,
                    self.tensors[slots.clone()].iter().map(|t| t.nbytes()).sum(),
                ),
            };
            journals.push(self.stages[index].journal.at_least(&self.gpu, bytes)?);
        }
        let mut applied = Vec::with_capacity(last);
        for (k, w) in writes.iter().enumerate() {
            let journal = journals.get(k).copied();
            if journal.is_none() {
                // Written with nothing to undo it from.
                pending.clobber();
            }
            // SAFETY: the chunks were checked clean at the receive, their sections are in
            // buffers kept until the next sync; staged bytes and journals are sized for
            // their tensors; the tensors are ours (constructor contract).
            match unsafe { self.write_one(w, journal) } {
                Ok(Some(a)) => applied.push(a),
                Ok(None) => {}
                Err(e) => {
                    // Part of this stage may be written.
                    pending.clobber();
                    self.undo_applied(&mut applied);
                    return Err(e);
                }
            }
        }
        self.gpu.synchronize().inspect_err(|_| pending.clobber())
    }

    /// One stage's writes, saving what they overwrite into `journal` when given.
    ///
    /// # Safety
    /// As for [`write`](Self::write).
    unsafe fn write_one(&self, w: &Later, journal: Option<DevicePtr>) -> Result<Option<Applied>> {
        match (w, journal) {
            (Later::Delta { inputs, .. }, Some(journal)) => {
                // SAFETY: per this function's contract.
                unsafe { self.gpu.apply_scatter_journaled(inputs, journal)? };
                Ok(Some(Applied::Delta {
                    inputs: inputs.clone(),
                    journal,
                }))
            }
            // SAFETY: per this function's contract.
            (Later::Delta { inputs, .. }, None) => {
                unsafe { self.gpu.apply_scatter(inputs) }.map(|()| None)
            }
            (Later::Whole { slots, staged, .. }, journal) => {
                let mut saved = Vec::new();
                let mut at = 0u64;
                for (t, &from) in self.tensors[slots.clone()].iter().zip(staged) {
                    let len = t.nbytes() as usize;
                    // SAFETY: per this function's contract; the journal holds the stage's
                    // tensors end to end, the staging each at its place.
                    unsafe {
                        if let Some(j) = journal {
                            self.gpu.copy_device(j + at, t.ptr, len)?;
                            saved.push((t.ptr, j + at, t.nbytes()));
                        }
                        self.gpu.copy_device(t.ptr, from, len)?;
                    }
                    at += t.nbytes();
                }
                Ok(journal.map(|_| Applied::Whole { saved }))
            }
        }
    }
}
