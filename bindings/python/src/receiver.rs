//! `Receiver`: applies syncs in place into arrays it was given, all or nothing.

use std::time::Instant;

use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::arrays::{frame_bytes, resolve, NumpyStore, Want};
use crate::errors::IntoPyResult;
use crate::table::{table_arg, SlotTable};
use crate::values::digests_dict;

/// What a completed sync did on the receiver.
#[pyclass(module = "deltacast._native", frozen, get_all)]
pub struct SyncOutcome {
    /// "seed", "delta" or "verify".
    pub kind: &'static str,
    pub version: u64,
    pub flushes: u32,
    /// Elements written.
    pub changed: u64,
    pub wire_bytes: u64,
    /// The combined digest after the sync; equal to the sender's, or the sync was refused.
    pub state_digest: u64,
    /// Time inside the core over every flush of the sync (decode, verify, digest check,
    /// apply), without the binding's own work.
    pub rust_seconds: f64,
}

#[pymethods]
impl SyncOutcome {
    fn __repr__(&self) -> String {
        format!(
            "SyncOutcome(kind='{}', version={}, changed={}, flushes={}, state_digest={:#018x})",
            self.kind, self.version, self.changed, self.flushes, self.state_digest
        )
    }
}

/// Receives syncs into the arrays it was given, in place. A sync is applied only when every
/// flush verified and the state digest it reaches equals the sender's; on any error the arrays
/// are untouched. Holds a reference to every array for its whole life.
#[pyclass(module = "deltacast._native")]
pub struct Receiver {
    inner: deltacast::Receiver<NumpyStore>,
    arrays: Py<PyDict>,
    /// Core time spent on the flushes of the sync being staged.
    staged_seconds: f64,
}

#[pymethods]
impl Receiver {
    /// `slots`: the sender's table. `arrays`: a dict name → writable C-contiguous array (or a
    /// list in table order), bf16 as uint16, fp8 as uint8; CPU torch tensors are viewed
    /// without a copy. `version`: the version the arrays already hold (e.g. a checkpoint at
    /// that version); None accepts only a seed. `apply_as_received`: write each flush of a
    /// multi-flush delta into the arrays as it arrives instead of staging the sync until its
    /// last flush (no pass over the arrays after the last flush; but between flushes they hold
    /// parts of two versions, so do not read them while `is_staging`); a sync that fails, or
    /// `abort_sync`, still puts the arrays back as they were. `commit_on_demand`: stage, then
    /// commit: a sync's last flush verifies it whole but writes nothing (`receive` returns
    /// None, `awaits_commit` is True) until `commit()` writes it in one pass; the arrays keep
    /// the version held meanwhile (readers pause only for the commit); `abort_sync()` drops it.
    #[new]
    #[pyo3(signature = (slots, arrays, *, version = None, apply_as_received = false, commit_on_demand = false))]
    fn new(
        py: Python<'_>,
        slots: &Bound<'_, PyAny>,
        arrays: &Bound<'_, PyAny>,
        version: Option<u64>,
        apply_as_received: bool,
        commit_on_demand: bool,
    ) -> PyResult<Self> {
        let table = table_arg(slots)?;
        let names: Vec<&str> = table.slots().iter().map(|s| s.name.as_str()).collect();
        let wants: Vec<Want<'_>> = table
            .slots()
            .iter()
            .map(|s| Want {
                name: &s.name,
                dtype: s.dtype,
                shape: &s.shape,
            })
            .collect();
        let (held, views) = resolve(arrays, &wants, true)?;
        let dict = PyDict::new(py);
        for (name, arr) in names.iter().zip(&held) {
            dict.set_item(name, arr)?;
        }
        let store = NumpyStore::new(held, views, &names)?;
        let mut inner = py
            .detach(|| deltacast::Receiver::with_state(table, store, version))
            .py()?;
        inner.set_apply_as_received(apply_as_received);
        inner.set_commit_on_demand(commit_on_demand);
        Ok(Receiver {
            inner,
            arrays: dict.unbind(),
            staged_seconds: 0.0,
        })
    }

    /// Takes one flush (`bytes`, or a uint8 array). Returns a `SyncOutcome` when it completed
    /// a sync that was verified and applied, None while a sync is still arriving. Any error
    /// drops the staged sync and leaves the arrays as they were. Releases the GIL.
    fn receive(
        &mut self,
        py: Python<'_>,
        frame: &Bound<'_, PyAny>,
    ) -> PyResult<Option<SyncOutcome>> {
        let (_held, view) = frame_bytes(frame)?;
        // SAFETY: `_held` keeps the frame object alive until we return; `bytes` never change,
        // and a frame array is only read (the user contract: not written meanwhile).
        let data = unsafe { view.bytes() };
        if !self.inner.is_staging() {
            self.staged_seconds = 0.0;
        }
        let inner = &mut self.inner;
        let (result, seconds) = py.detach(|| {
            let t = Instant::now();
            let r = inner.receive(data);
            (r, t.elapsed().as_secs_f64())
        });
        self.staged_seconds += seconds;
        let rust_seconds = self.staged_seconds;
        Ok(result.py()?.map(|o| SyncOutcome {
            kind: o.kind.name(),
            version: o.version,
            flushes: o.flushes,
            changed: o.changed,
            wire_bytes: o.wire_bytes,
            state_digest: o.state_digest,
            rust_seconds,
        }))
    }

    /// Recomputes every slot's digest from the arrays and returns the names of the slots
    /// whose bits no longer match what the receiver applied (changed behind its back).
    fn recompute_digests(&self, py: Python<'_>) -> Vec<String> {
        let inner = &self.inner;
        let bad = py.detach(|| inner.recompute_digests());
        let slots = self.inner.table().slots();
        bad.into_iter()
            .map(|id| slots[id as usize].name.clone())
            .collect()
    }

    /// Drops a half-received sync (e.g. the connection to the sender broke), or a verified
    /// one that awaits its commit; flushes written as they arrived are put back.
    fn abort_sync(&mut self) {
        self.inner.abort_sync();
    }

    /// Whether a verified sync waits for `commit()` (with `commit_on_demand`).
    #[getter]
    fn awaits_commit(&self) -> bool {
        self.inner.awaits_commit()
    }

    /// Writes the verified sync that waits into the arrays and returns its `SyncOutcome`.
    /// Releases the GIL.
    fn commit(&mut self, py: Python<'_>) -> PyResult<SyncOutcome> {
        let inner = &mut self.inner;
        let (result, seconds) = py.detach(|| {
            let t = Instant::now();
            let r = inner.commit();
            (r, t.elapsed().as_secs_f64())
        });
        let o = result.py()?;
        Ok(SyncOutcome {
            kind: o.kind.name(),
            version: o.version,
            flushes: o.flushes,
            changed: o.changed,
            wire_bytes: o.wire_bytes,
            state_digest: o.state_digest,
            rust_seconds: self.staged_seconds + seconds,
        })
    }

    /// The version the arrays hold (None before the first seed).
    #[getter]
    fn version(&self) -> Option<u64> {
        self.inner.version()
    }

    /// The combined digest to ack to the sender.
    #[getter]
    fn state_digest(&self) -> u64 {
        self.inner.state_digest()
    }

    /// Per-slot running digests, by name.
    #[getter]
    fn digests<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        digests_dict(py, self.inner.table(), self.inner.digests())
    }

    /// Whether a sync is half received.
    #[getter]
    fn is_staging(&self) -> bool {
        self.inner.is_staging()
    }

    /// Whether flushes are written into the arrays as they arrive.
    #[getter]
    fn apply_as_received(&self) -> bool {
        self.inner.applies_as_received()
    }

    #[getter]
    fn table(&self) -> SlotTable {
        SlotTable {
            table: self.inner.table().clone(),
        }
    }

    /// The numpy arrays the receiver writes, by name (views of the tensors if it was given
    /// tensors).
    #[getter]
    fn arrays<'py>(&self, py: Python<'py>) -> Bound<'py, PyDict> {
        self.arrays.bind(py).clone()
    }
}
