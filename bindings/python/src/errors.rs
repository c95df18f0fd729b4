//! Core errors as Python exceptions: one class per kind (defined in `deltacast/_errors.py`,
//! so a class can also be a `ValueError` or `OSError`), with the fields a caller acts on
//! (versions, slot, digests) set as attributes.

use deltacast::Error;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::PyModule;
use pyo3::IntoPyObjectExt;

use crate::values::table_hash_hex;

static ERRORS: PyOnceLock<Py<PyModule>> = PyOnceLock::new();

/// The Python exception class `name` of `deltacast._errors`.
pub fn class<'py>(py: Python<'py>, name: &str) -> PyResult<Bound<'py, PyAny>> {
    let module = ERRORS.get_or_try_init(py, || {
        PyModule::import(py, "deltacast._errors").map(Bound::unbind)
    })?;
    module.bind(py).getattr(name)
}

/// An exception of class `name` with `message` and the given attributes.
pub fn raise(name: &str, message: String, attrs: &[(&str, Py<PyAny>)]) -> PyErr {
    Python::attach(|py| {
        let made = class(py, name).and_then(|cls| {
            let exc = cls.call1((message.clone(),))?;
            for (key, value) in attrs {
                exc.setattr(*key, value.bind(py))?;
            }
            Ok(PyErr::from_value(exc))
        });
        // Only reachable if the package's own Python files are broken.
        made.unwrap_or_else(|e| PyRuntimeError::new_err(format!("{message} ({e})")))
    })
}

/// `InvalidArgumentError(message)`.
pub fn invalid(message: impl Into<String>) -> PyErr {
    raise("InvalidArgumentError", message.into(), &[])
}

fn attr<T: for<'py> IntoPyObject<'py>>(py: Python<'_>, value: T) -> Py<PyAny> {
    value.into_py_any(py).unwrap_or_else(|_| py.None())
}

/// Maps a core error to its exception class. The match is exhaustive on purpose: a new core
/// error kind fails this build until it is given a class.
pub fn to_py(err: Error) -> PyErr {
    let message = err.to_string();
    Python::attach(|py| {
        let (name, attrs): (&str, Vec<(&str, Py<PyAny>)>) = match &err {
            Error::BadMagic { .. } | Error::Malformed(_) | Error::UnknownSlot(_) => {
                ("MalformedFrameError", vec![])
            }
            Error::UnknownDType(_) => ("MalformedFrameError", vec![]),
            Error::Codec { slot, start, .. } => (
                "MalformedFrameError",
                vec![
                    ("slot_id", attr(py, *slot)),
                    ("chunk_start", attr(py, *start)),
                ],
            ),
            Error::UnsupportedWireVersion { found, supported } => (
                "UnsupportedWireVersionError",
                vec![
                    ("found", attr(py, *found)),
                    ("supported", attr(py, *supported)),
                ],
            ),
            Error::Truncated {
                needed, available, ..
            } => (
                "TruncatedError",
                vec![
                    ("needed", attr(py, *needed)),
                    ("available", attr(py, *available)),
                ],
            ),
            Error::ChecksumMismatch { expected, computed } => (
                "ChecksumError",
                vec![
                    ("expected", attr(py, *expected)),
                    ("computed", attr(py, *computed)),
                ],
            ),
            Error::SlotTableMismatch { frame, local } => (
                "SlotTableMismatchError",
                vec![
                    ("frame", attr(py, table_hash_hex(*frame))),
                    ("local", attr(py, table_hash_hex(*local))),
                ],
            ),
            Error::VersionMismatch {
                current,
                got,
                expected,
            } => (
                "VersionMismatchError",
                vec![
                    ("current", attr(py, *current)),
                    ("got", attr(py, *got)),
                    ("expected", attr(py, *expected)),
                ],
            ),
            // A transport that failed mid-sync left it incomplete.
            Error::IncompleteSync(_) | Error::Transport(_) => ("IncompleteSyncError", vec![]),
            Error::FlushOutOfOrder {
                version,
                expected,
                got,
            } => (
                "FlushOrderError",
                vec![
                    ("version", attr(py, *version)),
                    ("expected", attr(py, *expected)),
                    ("got", attr(py, *got)),
                ],
            ),
            Error::BaseDigestMismatch {
                slot,
                expected,
                actual,
            } => (
                "BaseDigestMismatchError",
                vec![
                    ("slot", attr(py, slot.as_str())),
                    ("expected", attr(py, *expected)),
                    ("actual", attr(py, *actual)),
                ],
            ),
            Error::DigestMismatch {
                slot,
                expected,
                actual,
            } => (
                "DigestMismatchError",
                vec![
                    ("slot", attr(py, slot.as_str())),
                    ("expected", attr(py, *expected)),
                    ("actual", attr(py, *actual)),
                ],
            ),
            Error::UnknownSlotName(name) => {
                ("UnknownSlotError", vec![("slot", attr(py, name.as_str()))])
            }
            Error::SlotMismatch { slot, .. } => {
                ("SlotMismatchError", vec![("slot", attr(py, slot.as_str()))])
            }
            Error::UnsupportedDType(_) => ("UnsupportedDTypeError", vec![]),
            Error::UnsupportedConversion { slot, .. } => (
                "UnsupportedDTypeError",
                vec![("slot", attr(py, slot.as_str()))],
            ),
            Error::Misaligned { .. } | Error::InvalidArgument(_) => {
                ("InvalidArgumentError", vec![])
            }
            Error::SafeTensors(_) => ("SafetensorsError", vec![]),
            Error::Io { path, source } => {
                // OSError's (errno, strerror, filename) form, so `e.errno` and `e.filename` work.
                let made = class(py, "IoError").and_then(|cls| match source.raw_os_error() {
                    Some(errno) => cls.call1((errno, message.clone(), path.as_str())),
                    None => cls.call1((message.clone(),)),
                });
                return match made {
                    Ok(exc) => PyErr::from_value(exc),
                    Err(e) => PyRuntimeError::new_err(format!("{message} ({e})")),
                };
            }
        };
        raise(name, message, &attrs)
    })
}

/// `.map_err(to_py)` for core results.
pub trait IntoPyResult<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> IntoPyResult<T> for deltacast::Result<T> {
    fn py(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}
