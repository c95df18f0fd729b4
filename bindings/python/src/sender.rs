//! `Sender`: the trainer side for one process that holds whole slots.

use std::collections::BTreeMap;
use std::time::Instant;

use deltacast::flush::{DEFAULT_BUCKET_SIZE, DEFAULT_CHUNK_ELEMS};
use deltacast::WeightSender;
use deltacast::{CodecChoice, Error, FlushConfig, SendReport, Source, SyncStats};
use numpy::npyffi::_PyArray_GET_ITEM_DATA;
use numpy::npyffi::flags::NPY_ARRAY_WRITEABLE;
use numpy::{IntoPyArray, PyUntypedArrayMethods};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

use crate::arrays::{resolve_as, Want};
use crate::errors::{invalid, IntoPyResult};
use crate::table::{table_arg, SlotTable};

/// What Python gets a frame as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameType {
    /// `bytes`: immutable and familiar, at the price of one copy.
    Bytes,
    /// A read-only 1-D uint8 numpy array that owns the encoder's buffer: no copy, which
    /// matters for seeds (a whole model). Sockets, files, `torch.from_numpy` and
    /// `Receiver.receive` take it as they take `bytes`.
    Numpy,
}

impl FrameType {
    pub fn parse(name: &str) -> PyResult<Self> {
        match name {
            "bytes" => Ok(FrameType::Bytes),
            "numpy" => Ok(FrameType::Numpy),
            other => Err(invalid(format!(
                "frame_type must be \"bytes\" or \"numpy\", got `{other}`"
            ))),
        }
    }

    fn wrap(self, py: Python<'_>, frame: Vec<u8>) -> Bound<'_, PyAny> {
        match self {
            FrameType::Bytes => PyBytes::new(py, &frame).into_any(),
            FrameType::Numpy => {
                let arr = frame.into_pyarray(py);
                // SAFETY: a fresh array this function owns, with the GIL held; clearing the
                // writeable flag is what `ndarray.setflags(write=False)` does.
                unsafe {
                    (*_PyArray_GET_ITEM_DATA(arr.as_array_ptr())).flags &= !NPY_ARRAY_WRITEABLE;
                }
                arr.into_any()
            }
        }
    }
}

/// Where frames go while the core encodes: kept (returned in the result), or handed to a
/// Python callable as they fill, so a large seed never sits in memory whole.
pub struct FrameSink {
    sink: Option<Py<PyAny>>,
    frame_type: FrameType,
    pub frames: Vec<Vec<u8>>,
    /// The sink's exception, re-raised as is once the core has unwound.
    pub error: Option<PyErr>,
}

impl FrameSink {
    pub fn new(sink: Option<Py<PyAny>>, frame_type: FrameType) -> Self {
        FrameSink {
            sink,
            frame_type,
            frames: Vec::new(),
            error: None,
        }
    }

    /// The core's sink callback. Runs without the GIL; takes it only to call Python.
    pub fn push(&mut self, frame: Vec<u8>) -> deltacast::Result<()> {
        let Some(sink) = &self.sink else {
            self.frames.push(frame);
            return Ok(());
        };
        let ty = self.frame_type;
        let result = Python::attach(|py| sink.call1(py, (ty.wrap(py, frame),)).map(drop));
        result.map_err(|e| {
            self.error = Some(e);
            Error::IncompleteSync("the frame sink raised".into())
        })
    }

    /// The kept frames as Python objects, in order.
    pub fn into_list<'py>(self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for f in self.frames {
            list.append(self.frame_type.wrap(py, f))?;
        }
        Ok(list)
    }
}

/// A flush configuration from the keyword arguments every sender takes.
pub fn flush_config(bucket_size: usize, chunk_elems: u64, codec: &str) -> PyResult<FlushConfig> {
    let codec = CodecChoice::parse(codec).ok_or_else(|| {
        invalid(format!(
            "unknown codec `{codec}`: use \"auto\" or POS+VAL such as \"gaps+ulp\", \"abs32+raw\""
        ))
    })?;
    let config = FlushConfig {
        bucket_size,
        chunk_elems,
        codec,
    };
    config.validate().py()?;
    Ok(config)
}

/// What one sync did on the sender, with the frames to send (unless a sink took them).
#[pyclass(module = "deltacast._native", frozen, get_all)]
pub struct SyncResult {
    /// "seed", "delta" or "verify".
    pub kind: &'static str,
    pub version: u64,
    /// Elements whose bits changed (every element for a seed).
    pub changed: u64,
    /// Elements compared.
    pub elements: u64,
    /// Bytes of all frames.
    pub wire_bytes: u64,
    /// Bytes of a full broadcast of every slot, for comparison.
    pub full_bytes: u64,
    pub flushes: u32,
    pub chunks: u64,
    /// Chunks per codec pair, e.g. {"gaps+ulp": 311}.
    pub codecs: BTreeMap<String, u64>,
    /// The digest of the state the sync starts from (0 for a seed).
    pub base_digest: u64,
    /// The digest receivers must reach (and ack).
    pub state_digest: u64,
    /// Frames, in order (empty when a sink took them).
    pub frames: Py<PyList>,
    /// Wall time of the whole call, as measured inside the extension.
    pub seconds: f64,
    /// Time inside the core sync alone; `seconds - rust_seconds` is the binding's overhead.
    pub rust_seconds: f64,
}

#[pymethods]
impl SyncResult {
    /// Changed elements over elements compared.
    #[getter]
    fn changed_ratio(&self) -> f64 {
        self.changed as f64 / self.elements.max(1) as f64
    }

    fn __repr__(&self) -> String {
        format!(
            "SyncResult(kind='{}', version={}, changed={}, elements={}, wire_bytes={}, flushes={}, seconds={:.4})",
            self.kind, self.version, self.changed, self.elements, self.wire_bytes, self.flushes, self.seconds
        )
    }
}

pub struct Timing {
    pub started: Instant,
    pub rust_seconds: f64,
}

impl SyncResult {
    fn from_stats(
        py: Python<'_>,
        kind: &'static str,
        stats: SyncStats,
        (elements, full_bytes): (u64, u64),
        digests: (u64, u64),
        out: FrameSink,
        timing: Timing,
    ) -> PyResult<Self> {
        let frames = out.into_list(py)?.unbind();
        Ok(SyncResult {
            kind,
            version: stats.version,
            changed: stats.changed,
            elements,
            wire_bytes: stats.wire_bytes,
            full_bytes,
            flushes: stats.flushes,
            chunks: stats.chunks,
            codecs: stats.codecs,
            base_digest: digests.0,
            state_digest: digests.1,
            frames,
            seconds: timing.started.elapsed().as_secs_f64(),
            rust_seconds: timing.rust_seconds,
        })
    }
}

/// The sources' bytes as slot buffers, refusing a source that would need converting (a seed
/// resent from buffers must hold the slot's own bits).
fn own_dtype_slices<'a>(
    sources: &[Source<'a>],
    table: &deltacast::SlotTable,
) -> Result<Vec<&'a [u8]>, Error> {
    sources
        .iter()
        .zip(table.slots())
        .map(|(s, slot)| {
            if s.dtype == slot.dtype {
                Ok(s.bytes)
            } else {
                Err(Error::InvalidArgument(format!(
                    "`{}`: resend_seed takes the slot's own dtype; without arrays it resends \
                     from the snapshot",
                    slot.name
                )))
            }
        })
        .collect()
}

/// The trainer side for one process holding whole slots: keeps a snapshot of what it last
/// synced and sends a seed (every element) or a delta (only changed bits).
#[pyclass(module = "deltacast._native")]
pub struct Sender {
    inner: deltacast::Sender,
    frame_type: FrameType,
}

#[derive(Clone, Copy)]
enum Mode {
    Auto,
    Seed,
    /// A seed of the version last sent, from its bits (a receiver that restarted).
    Resend,
}

impl Sender {
    fn run(
        &mut self,
        py: Python<'_>,
        arrays: Option<&Bound<'_, PyAny>>,
        sink: Option<Py<PyAny>>,
        mode: Mode,
    ) -> PyResult<SyncResult> {
        let started = Instant::now();
        let arrays_given = arrays.is_some();
        let table = self.inner.table();
        let wants: Vec<Want<'_>> = table
            .slots()
            .iter()
            .map(|s| Want {
                name: &s.name,
                dtype: s.dtype,
                shape: &s.shape,
            })
            .collect();
        let (held, views, dtypes) = match arrays {
            Some(a) => resolve_as(a, &wants, false, true)?,
            None => (Vec::new(), Vec::new(), Vec::new()),
        };
        let full_bytes = table.total_bytes();
        // SAFETY: `held` keeps every array alive until this function returns, after the core
        // is done with the slices; the arrays were checked C-contiguous with their source
        // dtype's size.
        let sources: Vec<Source<'_>> = views
            .iter()
            .zip(&dtypes)
            .map(|(v, &d)| Source::new(d, unsafe { v.bytes() }))
            .collect();
        let mut out = FrameSink::new(sink, self.frame_type);
        let inner = &mut self.inner;
        let (result, rust_seconds) = py.detach(|| {
            let t = Instant::now();
            let r = match mode {
                Mode::Auto => inner.sync_from(&sources, |f| out.push(f)),
                Mode::Seed => inner.seed_from(&sources, |f| out.push(f)),
                Mode::Resend => {
                    let sent = if arrays_given {
                        own_dtype_slices(&sources, inner.table())
                            .and_then(|s| inner.resend_seed(&s, |f| out.push(f)))
                    } else {
                        inner.resend_snapshot(|f| out.push(f))
                    };
                    sent.map(|stats| SendReport {
                        kind: deltacast::FrameKind::Seed,
                        stats,
                        base_digest: 0,
                        state_digest: inner.state_digest(),
                        elements: inner.table().total_elements(),
                    })
                }
            };
            (r, t.elapsed().as_secs_f64())
        });
        drop(held);
        if let Some(e) = out.error.take() {
            return Err(e);
        }
        let report: SendReport = result.py()?;
        SyncResult::from_stats(
            py,
            report.kind.name(),
            report.stats,
            (report.elements, full_bytes),
            (report.base_digest, report.state_digest),
            out,
            Timing {
                started,
                rust_seconds,
            },
        )
    }
}

#[pymethods]
impl Sender {
    /// `slots`: a `SlotTable` or a list of `Slot`s. `bucket_size` caps a frame's bytes,
    /// `chunk_elems` the elements per independently decodable chunk; `codec` is "auto"
    /// (cheapest per chunk) or a fixed "POS+VAL" pair. `frame_type` is "bytes" or "numpy"
    /// (read-only uint8 arrays that own the encoder's buffers: no copy).
    #[new]
    #[pyo3(signature = (slots, *, bucket_size = DEFAULT_BUCKET_SIZE, chunk_elems = DEFAULT_CHUNK_ELEMS, codec = "auto", frame_type = "bytes"))]
    fn new(
        slots: &Bound<'_, PyAny>,
        bucket_size: usize,
        chunk_elems: u64,
        codec: &str,
        frame_type: &str,
    ) -> PyResult<Self> {
        let table = table_arg(slots)?;
        let config = flush_config(bucket_size, chunk_elems, codec)?;
        Ok(Sender {
            inner: deltacast::Sender::new(table, config).py()?,
            frame_type: FrameType::parse(frame_type)?,
        })
    }

    /// Syncs `arrays` (a dict name → array, or a list in table order): a seed the first time
    /// or after a failed sync, a delta otherwise. A bf16 slot also takes a float32 array (an
    /// fp32 master): the sender rounds it to bf16 as torch's CPU `.to(torch.bfloat16)` does,
    /// during the diff, with no converted copy. Frames go to `sink(frame)` as they fill if
    /// given, else into the result. The GIL is released while the core works.
    #[pyo3(signature = (arrays, *, sink = None))]
    fn sync(
        &mut self,
        py: Python<'_>,
        arrays: &Bound<'_, PyAny>,
        sink: Option<Py<PyAny>>,
    ) -> PyResult<SyncResult> {
        self.run(py, Some(arrays), sink, Mode::Auto)
    }

    /// Sends every element, whatever the receivers hold (a new receiver joined, or one asked).
    #[pyo3(signature = (arrays, *, sink = None))]
    fn seed(
        &mut self,
        py: Python<'_>,
        arrays: &Bound<'_, PyAny>,
        sink: Option<Py<PyAny>>,
    ) -> PyResult<SyncResult> {
        self.run(py, Some(arrays), sink, Mode::Seed)
    }

    /// A seed of the version last sent, for one receiver that restarted or joined late,
    /// changing nothing. Without `arrays` it comes from the sender's snapshot (which holds
    /// exactly that version's bits, converted ones included); with them they must hold those
    /// bits, in the slots' own dtypes. The other receivers keep taking deltas; the restarted
    /// one takes this seed on its own link, then the same deltas as the others.
    #[pyo3(signature = (arrays = None, *, sink = None))]
    fn resend_seed(
        &mut self,
        py: Python<'_>,
        arrays: Option<&Bound<'_, PyAny>>,
        sink: Option<Py<PyAny>>,
    ) -> PyResult<SyncResult> {
        self.run(py, arrays, sink, Mode::Resend)
    }

    /// Frames that carry only the digests of the current version: a receiver recomputes its
    /// digests from memory and checks them (catches weights changed behind its back).
    #[pyo3(signature = (*, sink = None))]
    fn verify(&self, py: Python<'_>, sink: Option<Py<PyAny>>) -> PyResult<SyncResult> {
        let started = Instant::now();
        let mut out = FrameSink::new(sink, self.frame_type);
        let inner = &self.inner;
        let (result, rust_seconds) = py.detach(|| {
            let t = Instant::now();
            let r = inner.verify(|f| out.push(f));
            (r, t.elapsed().as_secs_f64())
        });
        if let Some(e) = out.error.take() {
            return Err(e);
        }
        let stats = result.py()?;
        let digest = self.inner.state_digest();
        SyncResult::from_stats(
            py,
            "verify",
            stats,
            (0, self.inner.table().total_bytes()),
            (digest, digest),
            out,
            Timing {
                started,
                rust_seconds,
            },
        )
    }

    #[getter]
    fn table(&self) -> SlotTable {
        SlotTable {
            table: self.inner.table().clone(),
        }
    }
}

crate::weight_sender::weight_sender_methods!(Sender);
