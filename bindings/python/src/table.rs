//! `SlotTable`: the static list of final tensors every rank and receiver agrees on.

use deltacast::io::Checkpoint;
use deltacast::slot_map::build_table;
use deltacast::SlotInfo;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::arrays::{dtype_arg, numpy_dtype};
use crate::errors::{invalid, IntoPyResult};
use crate::params::Param;
use crate::slot::Slot;
use crate::values::table_hash_hex;

/// The ordered slot table. Its hash travels in every frame: a receiver built from another
/// table refuses the sync before touching its arrays.
#[pyclass(module = "deltacast._native", frozen)]
#[derive(Clone)]
pub struct SlotTable {
    pub table: deltacast::SlotTable,
}

#[pymethods]
impl SlotTable {
    /// `slots`: `Slot`s or `(name, dtype, shape)` tuples, in the order every side uses.
    #[new]
    fn new(slots: &Bound<'_, PyAny>) -> PyResult<Self> {
        let mut infos = Vec::new();
        for item in slots.try_iter()? {
            let item = item?;
            if let Ok(slot) = item.cast::<Slot>() {
                infos.push(slot.get().info.clone());
            } else if let Ok((name, dtype, shape)) =
                item.extract::<(String, Bound<'_, PyAny>, Vec<u64>)>()
            {
                infos.push(SlotInfo::new(name, dtype_arg(&dtype)?, shape));
            } else {
                return Err(invalid(format!(
                    "a slot table takes Slot objects or (name, dtype, shape) tuples, got {}",
                    item.get_type().name()?
                )));
            }
        }
        Ok(SlotTable {
            table: deltacast::SlotTable::new(infos).py()?,
        })
    }

    /// The table of a safetensors file: its tensors sorted by name, as the CLI reads it.
    #[staticmethod]
    fn from_safetensors(py: Python<'_>, path: std::path::PathBuf) -> PyResult<Self> {
        let table = py.detach(|| Checkpoint::open(&path).map(|c| c.table().clone()));
        Ok(SlotTable { table: table.py()? })
    }

    /// The receiver-side table of trainer parameters: each `Param`'s slots in turn (what a
    /// `RankSender` built from the same list sends).
    #[staticmethod]
    fn from_params(params: Vec<Py<Param>>) -> PyResult<Self> {
        let specs: Vec<_> = params.iter().map(|p| p.get().spec.clone()).collect();
        Ok(SlotTable {
            table: build_table(&specs).py()?,
        })
    }

    /// A stable 64-bit hash of names, dtypes and shapes, in order, as 16 hex digits (the
    /// CLI's spelling, and the one in `SlotTableMismatchError` and `frame_header`).
    #[getter]
    fn hash(&self) -> String {
        table_hash_hex(self.table.hash())
    }

    #[getter]
    fn names(&self) -> Vec<String> {
        self.table.slots().iter().map(|s| s.name.clone()).collect()
    }

    #[getter]
    fn total_elements(&self) -> u64 {
        self.table.total_elements()
    }

    /// Bytes of a full broadcast of every slot.
    #[getter]
    fn total_bytes(&self) -> u64 {
        self.table.total_bytes()
    }

    /// The position of slot `name`.
    fn index(&self, name: &str) -> PyResult<u32> {
        self.table.id_of(name).py()
    }

    fn __len__(&self) -> usize {
        self.table.len()
    }

    fn __contains__(&self, name: &str) -> bool {
        self.table.id_of(name).is_ok()
    }

    /// A slot by position (negative counts from the end) or by name.
    fn __getitem__(&self, key: &Bound<'_, PyAny>) -> PyResult<Slot> {
        let id = if let Ok(i) = key.extract::<i64>() {
            let n = self.table.len() as i64;
            let i = if i < 0 { i + n } else { i };
            if !(0..n).contains(&i) {
                return Err(pyo3::exceptions::PyIndexError::new_err(format!(
                    "slot index {i} out of range ({n} slots)"
                )));
            }
            i as u32
        } else {
            self.table.id_of(&key.extract::<String>()?).py()?
        };
        Ok(Slot {
            info: self.table.slots()[id as usize].clone(),
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyResult<Bound<'_, PyAny>> {
        let py = slf.py();
        let slots: Vec<Slot> = slf
            .table
            .slots()
            .iter()
            .map(|info| Slot { info: info.clone() })
            .collect();
        slots
            .into_pyobject(py)?
            .into_any()
            .try_iter()
            .map(Bound::into_any)
    }

    fn __eq__(&self, other: &Bound<'_, PyAny>) -> bool {
        other
            .cast::<SlotTable>()
            .is_ok_and(|o| o.get().table == self.table)
    }

    fn __hash__(&self) -> u64 {
        self.table.hash()
    }

    /// Zeroed numpy arrays for every slot (bf16 as uint16, fp8 as uint8): a receiver's
    /// buffers when it does not hold a model.
    fn zeros<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let np = py.import("numpy")?;
        let out = PyDict::new(py);
        for s in self.table.slots() {
            let arr =
                np.call_method1("zeros", (PyTuple::new(py, &s.shape)?, numpy_dtype(s.dtype)))?;
            out.set_item(&s.name, arr)?;
        }
        Ok(out)
    }

    fn __repr__(&self) -> String {
        format!(
            "SlotTable({} slots, {} elements, hash {})",
            self.table.len(),
            self.table.total_elements(),
            table_hash_hex(self.table.hash())
        )
    }
}

/// A table argument: a `SlotTable`, or anything `SlotTable(...)` takes.
pub fn table_arg(obj: &Bound<'_, PyAny>) -> PyResult<deltacast::SlotTable> {
    if let Ok(t) = obj.cast::<SlotTable>() {
        return Ok(t.get().table.clone());
    }
    Ok(SlotTable::new(obj)?.table)
}
