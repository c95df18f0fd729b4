//! `Converter` and `Param`: a trainer parameter with its full shape, and how it maps to the
//! receivers' slots.

use deltacast::slot_map::{slots_of, Converter as CoreConverter, ParamSpec, SplitSpec};
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use crate::arrays::{dtype_arg, dtype_name};
use crate::errors::{invalid, IntoPyResult};
use crate::slot::Slot;
use crate::values::{py_repr, shape_repr};

/// How one trainer parameter maps to receiver slots (fused q/k/v, fused expert stacks, …).
#[pyclass(module = "deltacast._native", frozen)]
#[derive(Clone)]
pub struct Converter {
    inner: CoreConverter,
}

#[pymethods]
impl Converter {
    /// One slot with the parameter's shape, named `slot`.
    #[staticmethod]
    fn identity(slot: String) -> Self {
        Converter {
            inner: CoreConverter::Identity { slot },
        }
    }

    /// A `[q + k + v, ...]` parameter (q rows, then k, then v) split into three slots.
    #[staticmethod]
    fn fused_qkv(q: String, k: String, v: String, sizes: [u64; 3]) -> Self {
        Converter {
            inner: CoreConverter::FusedQkv { q, k, v, sizes },
        }
    }

    /// A `[E, 2I, ...]` stack of fused gate/up projections; `gate` and `up` are name
    /// templates where `{e}` becomes the expert index.
    #[staticmethod]
    fn fused_experts(gate: String, up: String) -> Self {
        Converter {
            inner: CoreConverter::FusedExperts { gate, up },
        }
    }

    /// Splits dimension `dim` into consecutive named pieces `[(name, size), ...]`; with
    /// `stacked`, dimension 0 is an expert stack and names are templates with `{e}`.
    #[staticmethod]
    #[pyo3(signature = (dim, pieces, *, stacked = false))]
    fn split(dim: usize, pieces: Vec<(String, u64)>, stacked: bool) -> Self {
        Converter {
            inner: CoreConverter::Split(SplitSpec {
                stacked,
                dim,
                pieces,
            }),
        }
    }

    fn __repr__(&self) -> String {
        format!("Converter.{:?}", self.inner)
    }
}

/// A trainer parameter: name, dtype, full (global) shape and how it maps to slots (None: one
/// slot of the same name; a string: one slot of that name; or a `Converter`).
#[pyclass(module = "deltacast._native", frozen)]
#[derive(Clone)]
pub struct Param {
    pub spec: ParamSpec,
}

#[pymethods]
impl Param {
    #[new]
    #[pyo3(signature = (name, dtype, shape, convert = None))]
    fn new(
        name: String,
        dtype: &Bound<'_, PyAny>,
        shape: Vec<u64>,
        convert: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let converter = match convert {
            None => CoreConverter::Identity { slot: name.clone() },
            Some(c) => {
                if let Ok(c) = c.cast::<Converter>() {
                    c.get().inner.clone()
                } else if let Ok(slot) = c.extract::<String>() {
                    CoreConverter::Identity { slot }
                } else {
                    return Err(invalid(
                        "convert must be None, a slot name or a deltacast.Converter",
                    ));
                }
            }
        };
        let spec = ParamSpec::new(name, shape, dtype_arg(dtype)?, converter);
        // Check the converter against the shape now, not at the first sync.
        slots_of(&spec.name, &spec.shape, spec.dtype, &spec.converter).py()?;
        Ok(Param { spec })
    }

    #[getter]
    fn name(&self) -> &str {
        &self.spec.name
    }

    #[getter]
    fn dtype(&self) -> &'static str {
        dtype_name(self.spec.dtype)
    }

    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.spec.shape)
    }

    /// The receiver slots this parameter becomes.
    #[getter]
    fn slots(&self) -> PyResult<Vec<Slot>> {
        let infos = slots_of(
            &self.spec.name,
            &self.spec.shape,
            self.spec.dtype,
            &self.spec.converter,
        )
        .py()?;
        Ok(infos.into_iter().map(|info| Slot { info }).collect())
    }

    fn __repr__(&self) -> String {
        format!(
            "Param({}, '{}', {})",
            py_repr(&self.spec.name),
            dtype_name(self.spec.dtype),
            shape_repr(&self.spec.shape)
        )
    }
}
