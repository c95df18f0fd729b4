//! Core values as Python shows them: string reprs, table hashes as the CLI prints them, and
//! digests by slot name. A leaf: it uses no other module of the bindings.

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// A Python string literal for `s` (single quotes, as `repr(str)` writes it).
pub fn py_repr(s: &str) -> String {
    format!("'{}'", s.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// A shape as Python prints a tuple: `()`, `(7,)`, `(2, 3)`.
pub fn shape_repr(shape: &[u64]) -> String {
    match shape {
        [one] => format!("({one},)"),
        _ => format!(
            "({})",
            shape
                .iter()
                .map(u64::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// A slot table hash in its one spelling, the CLI's: 16 lowercase hex digits.
pub fn table_hash_hex(hash: u64) -> String {
    format!("{hash:016x}")
}

/// `{slot name: digest}` in table order.
pub fn digests_dict<'py>(
    py: Python<'py>,
    table: &deltacast::SlotTable,
    digests: &[u64],
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    for (s, v) in table.slots().iter().zip(digests) {
        d.set_item(&s.name, v)?;
    }
    Ok(d)
}
