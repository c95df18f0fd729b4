//! `Slot`: one final tensor as the receiver names it.

use deltacast::SlotInfo;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::arrays::{dtype_arg, dtype_name};
use crate::values::{py_repr, shape_repr};

/// One final tensor as the receiver names it: name, dtype and full shape.
#[pyclass(module = "deltacast._native", frozen, eq)]
#[derive(Clone, PartialEq)]
pub struct Slot {
    pub info: SlotInfo,
}

#[pymethods]
impl Slot {
    #[new]
    fn new(name: String, dtype: &Bound<'_, PyAny>, shape: Vec<u64>) -> PyResult<Self> {
        Ok(Slot {
            info: SlotInfo::new(name, dtype_arg(dtype)?, shape),
        })
    }

    #[getter]
    fn name(&self) -> &str {
        &self.info.name
    }

    /// The canonical dtype name: "bf16", "f16", "f32", "f8_e4m3" or "f8_e5m2".
    #[getter]
    fn dtype(&self) -> &'static str {
        dtype_name(self.info.dtype)
    }

    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.info.shape)
    }

    #[getter]
    fn numel(&self) -> u64 {
        self.info.numel()
    }

    #[getter]
    fn nbytes(&self) -> u64 {
        self.info.nbytes()
    }

    fn __repr__(&self) -> String {
        format!(
            "Slot({}, '{}', {})",
            py_repr(&self.info.name),
            dtype_name(self.info.dtype),
            shape_repr(&self.info.shape)
        )
    }
}
