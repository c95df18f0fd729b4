//! `ChangeReceiver`: checks syncs for bits that Python holds (an engine's parameters), reading
//! the old bits of each chunk through a Python callable, and hands out the changes.

use numpy::IntoPyArray;
use pyo3::prelude::*;
use pyo3::types::PyList;

use crate::arrays::frame_bytes;
use crate::errors::IntoPyResult;
use crate::receiver::SyncOutcome;
use crate::table::{table_arg, SlotTable};
use crate::values::digests_dict;

/// The core's owner: `read(requests)`, a list of `(slot_name, positions)`, → `(old, share)`,
/// uint8 arrays (or bytes) of every request in order: `Σ len(positions) * width` and
/// `Σ len(positions)` bytes. A Python error is kept to be raised as it is.
struct PyOwner<'py> {
    py: Python<'py>,
    read: &'py Bound<'py, PyAny>,
    names: Vec<String>,
    error: Option<PyErr>,
}

impl deltacast::HeldBits for PyOwner<'_> {
    fn read(
        &mut self,
        slot: u32,
        positions: &[u64],
        old: &mut Vec<u8>,
        share: &mut Vec<u8>,
    ) -> deltacast::Result<()> {
        self.read_many(&[(slot, positions)], old, share)
    }

    fn read_many(
        &mut self,
        requests: &[(u32, &[u64])],
        old: &mut Vec<u8>,
        share: &mut Vec<u8>,
    ) -> deltacast::Result<()> {
        let result = (|| -> PyResult<()> {
            let list = PyList::empty(self.py);
            for &(slot, positions) in requests {
                // Slot positions fit i64: a slot's elements are bounded by its bytes in memory.
                let positions: Vec<i64> = positions.iter().map(|&p| p as i64).collect();
                let name = self.names.get(slot as usize).cloned().unwrap_or_default();
                list.append((name, positions.into_pyarray(self.py)))?;
            }
            let out = self.read.call1((list,))?;
            let (a, b): (Bound<'_, PyAny>, Bound<'_, PyAny>) = out.extract()?;
            let (_ka, va) = frame_bytes(&a)?;
            let (_kb, vb) = frame_bytes(&b)?;
            // SAFETY: `_ka`, `_kb` keep the objects alive while their bytes are copied.
            unsafe {
                old.extend_from_slice(va.bytes());
                share.extend_from_slice(vb.bytes());
            }
            Ok(())
        })();
        result.map_err(|e| {
            self.error = Some(e);
            deltacast::Error::InvalidArgument("the owner's read failed".into())
        })
    }
}

/// Checks syncs of `slots` for bits it does not hold (one member of a group that holds parts
/// of every slot, e.g. a tensor-parallel rank), all or nothing, and hands out the changes of
/// the positions the member holds. Per sync: `receive(frame, read)` for every frame (True at
/// the last), `part` summed over the group, `settle(sums)`, write `changes()`, `commit()`;
/// `abort_sync()` at any point. The first sync must be a seed.
///
/// `read(requests)`: a list of `(slot_name, positions)` (int64 HF flat positions; every slot
/// of a frame in one call) → `(old, share)` over the requests in order: the bits held there as
/// uint8 (zeros where none is held) and per position 0 (not held), 1 (held, counted by another
/// member) or 2 (held and counted here).
#[pyclass(module = "deltacast._native", unsendable)]
pub struct ChangeReceiver {
    inner: deltacast::ChangeReceiver,
}

#[pymethods]
impl ChangeReceiver {
    #[new]
    fn new(slots: &Bound<'_, PyAny>) -> PyResult<Self> {
        Ok(ChangeReceiver {
            inner: deltacast::ChangeReceiver::new(table_arg(slots)?),
        })
    }

    /// Takes one frame; True when it was the sync's last (then `part` waits for the group),
    /// False otherwise (a close frame too). Any error drops the sync.
    fn receive(
        &mut self,
        py: Python<'_>,
        frame: &Bound<'_, PyAny>,
        read: &Bound<'_, PyAny>,
    ) -> PyResult<bool> {
        let (_held, view) = frame_bytes(frame)?;
        // SAFETY: `_held` keeps the frame alive until we return; it is only read.
        let data = unsafe { view.bytes() };
        let names = self
            .inner
            .table()
            .slots()
            .iter()
            .map(|s| s.name.clone())
            .collect();
        let mut owner = PyOwner {
            py,
            read,
            names,
            error: None,
        };
        let result = self.inner.receive(data, &mut owner);
        if let Some(e) = owner.error.take() {
            return Err(e);
        }
        Ok(result.py()? == deltacast::Progress::Complete)
    }

    /// This member's part of each slot's digest (list of u64, table order), or None unless
    /// a received sync waits for the group.
    #[getter]
    fn part(&self) -> Option<Vec<u64>> {
        self.inner.part().map(<[u64]>::to_vec)
    }

    /// Settles the sync with the group's sums of `part` (wrapping, mod 2^64).
    fn settle(&mut self, sums: Vec<u64>) -> PyResult<()> {
        self.inner.settle(&sums).py()
    }

    /// The settled sync's changes at the positions held, one entry per slot it changed (its
    /// chunks joined, in order): a list of `(slot_name, positions, values, old)`, positions
    /// int64, values and old uint8 (the slot's width per element).
    fn changes<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let table = self.inner.table();
        let mut by_slot: Vec<(Vec<i64>, Vec<u8>, Vec<u8>)> = vec![Default::default(); table.len()];
        for c in self.inner.changes() {
            let width = table.get(c.slot).py()?.dtype.width();
            let (pos, values, old) = &mut by_slot[c.slot as usize];
            pos.extend(c.positions(width).into_iter().map(|p| p as i64));
            values.extend_from_slice(&c.values);
            old.extend_from_slice(&c.old);
        }
        let out = PyList::empty(py);
        for (slot, (pos, values, old)) in table.slots().iter().zip(by_slot) {
            if pos.is_empty() {
                continue;
            }
            out.append((
                slot.name.as_str(),
                pos.into_pyarray(py),
                values.into_pyarray(py),
                old.into_pyarray(py),
            ))?;
        }
        Ok(out)
    }

    /// The changes were written: takes the sync's version.
    fn commit(&mut self) -> PyResult<SyncOutcome> {
        let o = self.inner.commit().py()?;
        Ok(SyncOutcome {
            kind: o.kind.name(),
            version: o.version,
            flushes: o.flushes,
            changed: o.changed,
            wire_bytes: o.wire_bytes,
            state_digest: o.state_digest,
            rust_seconds: 0.0,
        })
    }

    fn abort_sync(&mut self) {
        self.inner.abort_sync();
    }

    /// The bits held are no longer trusted (a write failed half way): holds nothing.
    fn lose(&mut self) {
        self.inner.lose();
    }

    #[getter]
    fn version(&self) -> Option<u64> {
        self.inner.version()
    }

    #[getter]
    fn is_staging(&self) -> bool {
        self.inner.is_staging()
    }

    #[getter]
    fn awaits_group(&self) -> bool {
        self.inner.awaits_group()
    }

    #[getter]
    fn awaits_commit(&self) -> bool {
        self.inner.awaits_commit()
    }

    #[getter]
    fn state_digest(&self) -> u64 {
        self.inner.state_digest()
    }

    /// Digests over the whole group, by slot name.
    #[getter]
    fn digests<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, pyo3::types::PyDict>> {
        digests_dict(py, self.inner.table(), self.inner.digests())
    }

    #[getter]
    fn table(&self) -> SlotTable {
        SlotTable {
            table: self.inner.table().clone(),
        }
    }
}
