//! Files: safetensors checkpoints as dicts of numpy arrays, and sync files (frames back to back).

use deltacast::io::{write_atomic, write_checkpoint, Checkpoint};
use deltacast::wire::{peek_header, split_frames};
use deltacast::{DType, SlotInfo};
use numpy::{PyArray1, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList, PyTuple};
use std::path::PathBuf;

use crate::arrays::{as_ndarray, frame_bytes, numpy_dtype, resolve, Want};
use crate::errors::{invalid, IntoPyResult};
use crate::table::table_arg;
use crate::values::table_hash_hex;

/// Reads a safetensors file into a dict name → numpy array (a copy, so the file may change
/// afterwards). bf16 comes as uint16 bits and fp8 as uint8; `SlotTable.from_safetensors`
/// gives the dtypes.
#[pyfunction]
pub fn load_safetensors<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyDict>> {
    let ckpt = py.detach(|| Checkpoint::open(&path)).py()?;
    let out = PyDict::new(py);
    let mut targets = Vec::with_capacity(ckpt.table().len());
    for s in ckpt.table().slots() {
        let n = s.nbytes() as usize;
        // SAFETY: the array is filled completely below, before Python can see its contents.
        let bytes = unsafe { PyArray1::<u8>::new(py, [n], false) };
        targets.push(bytes.data() as usize);
        let arr = bytes
            .call_method1("view", (numpy_dtype(s.dtype),))?
            .call_method1("reshape", (PyTuple::new(py, &s.shape)?,))?;
        out.set_item(&s.name, arr)?;
    }
    py.detach(|| {
        for (id, &target) in targets.iter().enumerate() {
            let src = ckpt.slot_bytes(id as u32);
            if src.is_empty() {
                continue;
            }
            // SAFETY: `target` is the start of a fresh array of exactly `src.len()` bytes,
            // kept alive by `out`; nothing else has seen it yet.
            unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), target as *mut u8, src.len()) };
        }
    });
    Ok(out)
}

/// The slot dtype a numpy array's dtype names without doubt (float16/32, ml_dtypes types).
fn infer_dtype(arr: &Bound<'_, numpy::PyUntypedArray>, name: &str) -> PyResult<DType> {
    let descr = arr.dtype();
    let shown = descr.str()?.to_string();
    Ok(match shown.as_str() {
        "float32" => DType::F32,
        "float16" => DType::F16,
        "bfloat16" => DType::BF16,
        "float8_e4m3fn" => DType::F8E4M3,
        "float8_e5m2" => DType::F8E5M2,
        _ => {
            return Err(invalid(format!(
                "cannot tell the dtype of `{name}` from numpy dtype {shown}: pass slots= \
                 (e.g. Slot(\"{name}\", \"bf16\", shape)) to say what its bits are"
            )))
        }
    })
}

/// Writes arrays as a safetensors file, atomically (temp file, fsync, rename). `slots` gives
/// each tensor's dtype; without it, dtypes are inferred where numpy's dtype is unambiguous.
#[pyfunction]
#[pyo3(signature = (path, arrays, slots = None))]
pub fn save_safetensors(
    py: Python<'_>,
    path: PathBuf,
    arrays: &Bound<'_, PyAny>,
    slots: Option<&Bound<'_, PyAny>>,
) -> PyResult<()> {
    let table = match slots {
        Some(s) => table_arg(s)?,
        None => {
            let dict = arrays
                .cast::<PyDict>()
                .map_err(|_| invalid("without slots=, arrays must be a dict name → array"))?;
            let mut infos = Vec::with_capacity(dict.len());
            for (k, v) in dict.iter() {
                let name: String = k.extract()?;
                let arr = as_ndarray(&v)?;
                let dtype = infer_dtype(&arr, &name)?;
                let shape = arr.shape().iter().map(|&d| d as u64).collect();
                infos.push(SlotInfo::new(name, dtype, shape));
            }
            deltacast::SlotTable::new(infos).py()?
        }
    };
    let wants: Vec<Want<'_>> = table
        .slots()
        .iter()
        .map(|s| Want {
            name: &s.name,
            dtype: s.dtype,
            shape: &s.shape,
        })
        .collect();
    let (held, views) = resolve(arrays, &wants, false)?;
    // SAFETY: `held` keeps the arrays alive until we return; they are only read.
    let slices: Vec<&[u8]> = views.iter().map(|v| unsafe { v.bytes() }).collect();
    let result = py.detach(|| write_checkpoint(&path, &table, &slices));
    drop(held);
    result.py()
}

/// Reads a sync file (frames back to back, as `write_sync_file` and `deltacast diff` write
/// it) into a list of frames. Lengths are checked; frames are verified when received.
#[pyfunction]
pub fn read_sync_file<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyList>> {
    let bytes = py.detach(|| std::fs::read(&path)).map_err(|e| {
        crate::errors::to_py(deltacast::Error::Io {
            path: path.display().to_string(),
            source: e,
        })
    })?;
    let frames = split_frames(&bytes).py()?;
    let list = PyList::empty(py);
    for f in frames {
        list.append(PyBytes::new(py, f))?;
    }
    Ok(list)
}

/// Writes frames back to back into `path`, atomically. Each frame's declared length must
/// equal its size (a cut or glued frame is refused before anything is written).
#[pyfunction]
pub fn write_sync_file(py: Python<'_>, path: PathBuf, frames: &Bound<'_, PyAny>) -> PyResult<()> {
    let mut all = Vec::new();
    for (i, f) in frames.try_iter()?.enumerate() {
        let f = f?;
        let (_held, view) = frame_bytes(&f)?;
        // SAFETY: `_held` keeps the frame object alive for this iteration; it is only read.
        let data = unsafe { view.bytes() };
        let header = peek_header(data).py()?;
        if header.frame_len != data.len() as u64 {
            return Err(invalid(format!(
                "frame {i} declares {} bytes but has {}",
                header.frame_len,
                data.len()
            )));
        }
        all.extend_from_slice(data);
    }
    py.detach(|| write_atomic(&path, &all)).py()
}

/// The header of a frame without verifying it: kind, version, flush index, final flag,
/// table hash and length (to route frames, e.g. spot a seed).
#[pyfunction]
pub fn frame_header<'py>(
    py: Python<'py>,
    frame: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDict>> {
    let (_held, view) = frame_bytes(frame)?;
    // SAFETY: `_held` keeps the frame object alive until we return; it is only read.
    let data = unsafe { view.bytes() };
    let h = peek_header(data).py()?;
    let d = PyDict::new(py);
    d.set_item("kind", h.kind.name())?;
    d.set_item("version", h.version)?;
    d.set_item("flush_index", h.flush_index)?;
    d.set_item("is_final", h.is_final)?;
    d.set_item("table_hash", table_hash_hex(h.table_hash))?;
    d.set_item("frame_len", h.frame_len)?;
    Ok(d)
}
