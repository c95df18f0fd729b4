//! numpy arrays as slot buffers, without copies: dtype names, the checks that make borrowing
//! an array's memory sound, the receiver's [`SlotStore`] over borrowed arrays, and frames
//! borrowed from `bytes` or uint8 arrays.

use deltacast::{DType, SlotStore};
use numpy::npyffi::_PyArray_GET_ITEM_DATA;
use numpy::npyffi::flags::NPY_ARRAY_WRITEABLE;
use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyBytes, PyDict, PyMapping};

use crate::errors::{invalid, raise};

// Frames and slots are little-endian bytes; numpy's native order must match.
#[cfg(target_endian = "big")]
compile_error!("deltacast's Python bindings assume a little-endian machine");

/// Canonical short names, as `Slot.dtype` reports them.
pub fn dtype_name(d: DType) -> &'static str {
    match d {
        DType::BF16 => "bf16",
        DType::F16 => "f16",
        DType::F32 => "f32",
        DType::F8E4M3 => "f8_e4m3",
        DType::F8E5M2 => "f8_e5m2",
        DType::Bool => "bool",
        DType::U8 => "u8",
        DType::I8 => "i8",
        DType::U16 => "u16",
        DType::I16 => "i16",
        DType::U32 => "u32",
        DType::I32 => "i32",
        DType::U64 => "u64",
        DType::I64 => "i64",
        DType::F64 => "f64",
        DType::F8E8M0 => "f8_e8m0",
    }
}

/// The numpy dtype that carries a slot's bits: the float type where numpy has it, else the
/// unsigned integer of the same width (bf16 → uint16, fp8 → uint8).
pub fn numpy_dtype(d: DType) -> &'static str {
    match d {
        DType::F32 => "<f4",
        DType::F16 => "<f2",
        DType::BF16 => "<u2",
        DType::F8E4M3 | DType::F8E5M2 | DType::F8E8M0 | DType::U8 => "u1",
        DType::Bool => "?",
        DType::I8 => "i1",
        DType::U16 => "<u2",
        DType::I16 => "<i2",
        DType::U32 => "<u4",
        DType::I32 => "<i4",
        DType::U64 => "<u8",
        DType::I64 => "<i8",
        DType::F64 => "<f8",
    }
}

/// Parses a dtype name: the short names, safetensors names (`BF16`, `F8_E4M3`) and torch
/// names with or without `torch.` (`torch.bfloat16`, `float8_e4m3fn`), so
/// `str(tensor.dtype)` works as is.
pub fn parse_dtype(name: &str) -> PyResult<DType> {
    let lower = name.trim().to_ascii_lowercase();
    let key = lower.strip_prefix("torch.").unwrap_or(&lower);
    let d = match key {
        "bf16" | "bfloat16" => DType::BF16,
        "f16" | "fp16" | "float16" | "half" => DType::F16,
        "f32" | "fp32" | "float32" | "float" => DType::F32,
        "f8_e4m3" | "f8e4m3" | "fp8_e4m3" | "float8_e4m3fn" | "float8_e4m3" => DType::F8E4M3,
        "f8_e5m2" | "f8e5m2" | "fp8_e5m2" | "float8_e5m2" => DType::F8E5M2,
        _ => {
            return Err(raise(
                "UnsupportedDTypeError",
                format!(
                    "dtype `{name}` is not supported: deltacast syncs bf16, f16, f32, f8_e4m3 \
                     and f8_e5m2"
                ),
                &[],
            ))
        }
    };
    Ok(d)
}

/// A dtype given as a string or as anything whose `str()` names one (a torch dtype).
pub fn dtype_arg(obj: &Bound<'_, PyAny>) -> PyResult<DType> {
    match obj.extract::<String>() {
        Ok(s) => parse_dtype(&s),
        Err(_) => parse_dtype(&obj.str()?.to_cow()?),
    }
}

/// One checked array's memory. It stays valid while the array it came from is referenced
/// (numpy never moves or frees the buffer of a live array; `resize` refuses while other
/// references exist).
#[derive(Debug, Clone, Copy)]
pub struct RawView {
    ptr: *mut u8,
    len: usize,
}

impl RawView {
    /// The view of a byte slice the caller keeps alive (a `bytes` object's buffer).
    pub fn of_bytes(b: &[u8]) -> RawView {
        RawView {
            ptr: b.as_ptr().cast_mut(),
            len: b.len(),
        }
    }

    /// # Safety
    /// The array the view came from must stay referenced, and nobody may write to it, for `'a`.
    pub unsafe fn bytes<'a>(self) -> &'a [u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `ptr..ptr + len` is the C-contiguous buffer of a live array (checked in
        // `check_array`), per the caller's contract.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }

    fn range(self) -> (usize, usize) {
        (self.ptr as usize, self.ptr as usize + self.len)
    }
}

static AS_ARRAY: PyOnceLock<Py<PyAny>> = PyOnceLock::new();

/// `obj` as a numpy array: arrays pass as they are, torch CPU tensors become zero-copy views
/// (`deltacast._arrays.as_array`); anything else is refused rather than copied, since a copy
/// would silently take a receiver's writes.
pub fn as_ndarray<'py>(obj: &Bound<'py, PyAny>) -> PyResult<Bound<'py, PyUntypedArray>> {
    if let Ok(arr) = obj.cast::<PyUntypedArray>() {
        return Ok(arr.clone());
    }
    let py = obj.py();
    let convert = AS_ARRAY.get_or_try_init(py, || {
        py.import("deltacast._arrays")?
            .getattr("as_array")
            .map(Bound::unbind)
    })?;
    let converted = convert.bind(py).call1((obj,))?;
    converted.cast_into::<PyUntypedArray>().map_err(|e| {
        invalid(format!(
            "deltacast._arrays.as_array returned a non-array: {e}"
        ))
    })
}

/// Whether an array of dtype `descr` may carry the bits of `dtype`: same width, native byte
/// order, and either the float type itself or an integer (or ml_dtypes) view of the bits.
/// A float16 array for a bf16 slot is refused: its values would be reinterpreted.
fn dtype_fits(arr: &Bound<'_, PyUntypedArray>, dtype: DType) -> Result<(), String> {
    let descr = arr.dtype();
    // `str(dtype)` costs a Python call: only for ml_dtypes types and messages.
    let shown = || descr.str().map(|s| s.to_string()).unwrap_or_default();
    if descr.itemsize() != dtype.element_size() {
        return Err(format!(
            "array of dtype {} ({} bytes) for a {} slot ({} bytes per element)",
            shown(),
            descr.itemsize(),
            dtype_name(dtype),
            dtype.element_size()
        ));
    }
    if descr.is_native_byteorder() == Some(false) {
        return Err(format!("array of dtype {} is byte-swapped", shown()));
    }
    let ok = match descr.kind() {
        b'u' | b'i' => true,
        b'f' => matches!(dtype, DType::F32 | DType::F16 | DType::F64),
        b'b' => dtype == DType::Bool,
        // ml_dtypes' bfloat16 / float8 types.
        b'V' => {
            let expected = match dtype {
                DType::BF16 => "bfloat16",
                DType::F8E4M3 => "float8_e4m3fn",
                DType::F8E5M2 => "float8_e5m2",
                DType::F8E8M0 => "float8_e8m0fnu",
                _ => "",
            };
            shown() == expected
        }
        _ => false,
    };
    if !ok {
        let hint = match dtype {
            DType::BF16 => " (pass bf16 bits as uint16: `t.view(torch.uint16).numpy()`)",
            DType::F8E4M3 | DType::F8E5M2 => " (pass fp8 bits as uint8)",
            _ => "",
        };
        return Err(format!(
            "array of dtype {} for a {} slot{hint}",
            shown(),
            dtype_name(dtype)
        ));
    }
    Ok(())
}

/// Checks that `arr` can stand for a buffer of `dtype` and `shape` and returns its memory.
pub fn check_array(
    arr: &Bound<'_, PyUntypedArray>,
    name: &str,
    dtype: DType,
    shape: &[u64],
    writable: bool,
) -> PyResult<RawView> {
    let bad = |why: String| slot_error(arr.py(), name, why);
    dtype_fits(arr, dtype).map_err(bad)?;
    if arr.shape().len() != shape.len()
        || arr.shape().iter().zip(shape).any(|(&a, &s)| a as u64 != s)
    {
        return Err(bad(format!(
            "array has shape {:?}, expected {shape:?}",
            arr.shape()
        )));
    }
    if !arr.is_c_contiguous() {
        return Err(bad(
            "array is not C-contiguous (deltacast reads and writes it in place; pass \
             np.ascontiguousarray(a) to a sender, never to a receiver)"
                .into(),
        ));
    }
    // SAFETY: `arr` is a live numpy array (type-checked by the cast) and we hold the GIL;
    // reading its `data` and `flags` fields is what numpy's own C macros do.
    let (data, flags) = unsafe {
        let fields = _PyArray_GET_ITEM_DATA(arr.as_array_ptr());
        ((*fields).data.cast::<u8>(), (*fields).flags)
    };
    if writable && flags & NPY_ARRAY_WRITEABLE == 0 {
        return Err(bad("array is read-only; a receiver writes into it".into()));
    }
    let len = arr.len() * dtype.element_size();
    Ok(RawView { ptr: data, len })
}

/// What a slot buffer must be: its name (for lookups and errors), dtype and shape.
pub struct Want<'a> {
    pub name: &'a str,
    pub dtype: DType,
    pub shape: &'a [u64],
}

/// The dtype a sender reads from `arr` for a slot of `slot`: the slot's own, except a
/// float32 array for a bf16 or FP8 (E4M3) slot, which is an fp32 source the sender rounds or
/// quantizes on the fly.
pub fn source_dtype(arr: &Bound<'_, PyUntypedArray>, slot: DType) -> DType {
    let d = arr.dtype();
    if matches!(slot, DType::BF16 | DType::F8E4M3) && d.kind() == b'f' && d.itemsize() == 4 {
        DType::F32
    } else {
        slot
    }
}

/// Resolves `arrays` (a mapping name → array, or a sequence in order) against `wants`, checks
/// every array and returns them with their memory. Every name must be present, and no other.
pub fn resolve<'py>(
    arrays: &Bound<'py, PyAny>,
    wants: &[Want<'_>],
    writable: bool,
) -> PyResult<(Vec<Bound<'py, PyUntypedArray>>, Vec<RawView>)> {
    let (arrs, views, _) = resolve_as(arrays, wants, writable, false)?;
    Ok((arrs, views))
}

/// [`resolve`] for a sender's sources: also the dtype each array is read as
/// ([`source_dtype`]) when `sources`, else each slot's own.
pub fn resolve_as<'py>(
    arrays: &Bound<'py, PyAny>,
    wants: &[Want<'_>],
    writable: bool,
    sources: bool,
) -> PyResult<(Vec<Bound<'py, PyUntypedArray>>, Vec<RawView>, Vec<DType>)> {
    let py = arrays.py();
    let mut objects = Vec::with_capacity(wants.len());
    // A sender's mapping may leave out a block-FP8 scale slot: the sender derives its bits.
    let derivable = |w: &Want<'_>| {
        sources && w.dtype == DType::F32 && w.name.ends_with(deltacast::FP8_SCALE_SUFFIX)
    };
    let mut left_out = 0;
    if let Ok(dict) = arrays.cast::<PyDict>() {
        for w in wants {
            match dict.get_item(w.name)? {
                Some(obj) => objects.push(obj),
                None if derivable(w) => {
                    objects.push(py.None().into_bound(py));
                    left_out += 1;
                }
                None => return Err(missing(w.name)),
            }
        }
        if dict.len() + left_out != wants.len() {
            return Err(extra(arrays, wants));
        }
    } else if let Ok(map) = arrays.cast::<PyMapping>() {
        for w in wants {
            match map.get_item(w.name) {
                Ok(obj) => objects.push(obj),
                Err(_) if derivable(w) => {
                    objects.push(py.None().into_bound(py));
                    left_out += 1;
                }
                Err(_) => return Err(missing(w.name)),
            }
        }
        if map.len()? + left_out != wants.len() {
            return Err(extra(arrays, wants));
        }
    } else {
        for obj in arrays.try_iter()? {
            objects.push(obj?);
        }
        if objects.len() != wants.len() {
            return Err(invalid(format!(
                "{} arrays given for {} slots",
                objects.len(),
                wants.len()
            )));
        }
    }
    let mut arrs = Vec::with_capacity(wants.len());
    let mut views = Vec::with_capacity(wants.len());
    let mut dtypes = Vec::with_capacity(wants.len());
    for (obj, w) in objects.iter().zip(wants) {
        if sources && obj.is_none() {
            // No bits of its own (the scales of a block-FP8 slot): the core checks that the
            // slot is one whose bits it derives.
            let empty = numpy::PyArray1::<f32>::zeros(py, 0, false);
            arrs.push(empty.into_any().cast_into::<PyUntypedArray>()?);
            views.push(RawView::of_bytes(&[]));
            dtypes.push(DType::F32);
            continue;
        }
        let arr = as_ndarray(obj).map_err(|e| {
            let py = obj.py();
            let err = invalid(format!("`{}`: {e}", w.name));
            err.set_cause(py, Some(e));
            err
        })?;
        let dtype = if sources {
            source_dtype(&arr, w.dtype)
        } else {
            w.dtype
        };
        views.push(check_array(&arr, w.name, dtype, w.shape, writable)?);
        dtypes.push(dtype);
        arrs.push(arr);
    }
    Ok((arrs, views, dtypes))
}

/// `SlotMismatchError` naming the slot.
pub fn slot_error(py: Python<'_>, name: &str, why: String) -> PyErr {
    let slot = pyo3::types::PyString::new(py, name).into_any().unbind();
    raise(
        "SlotMismatchError",
        format!("`{name}`: {why}"),
        &[("slot", slot)],
    )
}

fn missing(name: &str) -> PyErr {
    raise(
        "UnknownSlotError",
        format!("no array for slot `{name}`"),
        &[],
    )
}

fn extra(arrays: &Bound<'_, PyAny>, wants: &[Want<'_>]) -> PyErr {
    let known: std::collections::HashSet<&str> = wants.iter().map(|w| w.name).collect();
    let mut unknown = Vec::new();
    if let Ok(keys) = arrays.try_iter() {
        for key in keys.flatten() {
            if let Ok(k) = key.extract::<String>() {
                if !known.contains(k.as_str()) {
                    unknown.push(k);
                }
            }
        }
    }
    unknown.truncate(5);
    invalid(format!(
        "arrays for names the table does not hold: {unknown:?}{}",
        if unknown.len() == 5 { " …" } else { "" }
    ))
}

/// A receiver's slots: borrowed numpy arrays, written in place.
pub struct NumpyStore {
    views: Vec<RawView>,
    /// Strong references that keep every array (and what it views, e.g. a torch tensor)
    /// alive as long as the store.
    _keep: Vec<Py<PyUntypedArray>>,
}

impl NumpyStore {
    /// Takes checked arrays; refuses two arrays that share memory (tied weights), since the
    /// receiver would then hold two views of one slot and write it twice.
    pub fn new(
        arrays: Vec<Bound<'_, PyUntypedArray>>,
        views: Vec<RawView>,
        names: &[&str],
    ) -> PyResult<Self> {
        let mut ranges: Vec<(usize, usize, usize)> = views
            .iter()
            .enumerate()
            .filter(|(_, v)| v.len > 0)
            .map(|(i, v)| {
                let (a, b) = v.range();
                (a, b, i)
            })
            .collect();
        ranges.sort_unstable();
        for pair in ranges.windows(2) {
            if pair[1].0 < pair[0].1 {
                return Err(invalid(format!(
                    "arrays `{}` and `{}` share memory (tied weights?): give each slot its own \
                     buffer and leave tied names out of the slot table",
                    names[pair[0].2], names[pair[1].2]
                )));
            }
        }
        Ok(NumpyStore {
            views,
            _keep: arrays.into_iter().map(Bound::unbind).collect(),
        })
    }
}

// SAFETY: the store holds only addresses of numpy buffers plus strong references that keep
// those buffers alive, and touching a `Py` needs the GIL by construction. Moving it to another
// thread (the receiver releases the GIL around its work) changes neither.
unsafe impl Send for NumpyStore {}
// SAFETY: shared access only reads the buffers (`slot`); writes go through `slot_mut`, which
// needs `&mut self`, and the Python object that owns the store hands out `&mut` to one caller
// at a time (pyo3's borrow flag; a second thread gets "Already borrowed").
unsafe impl Sync for NumpyStore {}

impl SlotStore for NumpyStore {
    fn slot(&self, id: u32) -> &[u8] {
        // SAFETY: the arrays are kept alive by `_keep` for the store's life; the user
        // contract (docs/python.md) is that no other code writes them while a receive runs.
        unsafe { self.views[id as usize].bytes() }
    }

    fn slot_mut(&mut self, id: u32) -> &mut [u8] {
        let v = self.views[id as usize];
        if v.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `slot`, plus: the array was checked writable and C-contiguous, no two
        // slots overlap (`new`), and `&mut self` makes this the only live reference into it.
        unsafe { std::slice::from_raw_parts_mut(v.ptr, v.len) }
    }

    /// Every slot at once, so the core applies a sync to all slots in parallel.
    fn slots_mut(&mut self) -> Option<Vec<&mut [u8]>> {
        Some(
            self.views
                .iter()
                .map(|v| {
                    if v.len == 0 {
                        return &mut [][..];
                    }
                    // SAFETY: as in `slot_mut`; the slices are live together, which is sound
                    // because no two slots' arrays overlap (checked in `new`).
                    unsafe { std::slice::from_raw_parts_mut(v.ptr, v.len) }
                })
                .collect(),
        )
    }
}

/// A frame's bytes without a copy where the object allows it: `bytes` (immutable) and
/// contiguous uint8/int8 numpy arrays are borrowed; anything else goes through `bytes(obj)`.
pub fn frame_bytes<'py>(obj: &Bound<'py, PyAny>) -> PyResult<(Bound<'py, PyAny>, RawView)> {
    let py = obj.py();
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok((obj.clone(), RawView::of_bytes(b.as_bytes())));
    }
    if let Ok(arr) = obj.cast::<PyUntypedArray>() {
        let descr = arr.dtype();
        if descr.itemsize() == 1
            && matches!(descr.kind(), b'u' | b'i')
            && arr.ndim() == 1
            && arr.is_c_contiguous()
        {
            let n = arr.len() as u64;
            let view = check_array(arr, "frame", deltacast::DType::F8E4M3, &[n], false)?;
            return Ok((obj.clone(), view));
        }
    }
    let copy = py.get_type::<PyBytes>().call1((obj,))?;
    let view = RawView::of_bytes(copy.cast::<PyBytes>()?.as_bytes());
    Ok((copy, view))
}
