//! The GPU sync from Python: CUDA tensors borrowed by device pointer (torch's `data_ptr()`),
//! NCCL between the trainer's rank and the receivers. The pure-Python wrapper
//! `deltacast/cuda.py` turns torch tensors into the (name, pointer, dtype, shape) tuples taken
//! here and passes torch's current stream.

use std::time::Duration;

use deltacast::WeightSender;
use deltacast_cuda::frame_link::{FrameLink, FrameQueue};
use deltacast_cuda::ipc_setup::loopback_addresses;
use deltacast_cuda::link::Link;
use deltacast_cuda::sync::{
    EntropyMode, GpuReceiver, GpuSender, GpuSenderConfig, GpuShard, GpuShardedSender,
    GpuSyncReport, GpuTensor, SnapshotPlace, WaitStream,
};
use deltacast_cuda::{ipc, nccl};
use deltacast_cuda::{CudaError, Gpu};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use pyo3::IntoPyObjectExt;

use crate::arrays::{frame_bytes, RawView};
use crate::errors::{invalid, raise, to_py};
use crate::values::table_hash_hex;

/// A CUDA error as its Python exception class.
pub fn cuda_to_py(err: CudaError) -> PyErr {
    // A receiver's refusal is the core's decision: the CPU receiver's exception classes
    // and attributes (slots by name).
    let err = match err {
        CudaError::Sync(e) => return to_py(e),
        other => other,
    };
    let message = err.to_string();
    Python::attach(|py| {
        let a = |v: u64| v.into_py_any(py).unwrap_or_else(|_| py.None());
        // Table hashes in the one spelling of the CLI and of the CPU errors.
        let hex = |v: String| v.into_py_any(py).unwrap_or_else(|_| py.None());
        match &err {
            CudaError::InvalidArgument(_) => invalid(message),
            CudaError::BadChunk { .. } | CudaError::Protocol(_) => {
                raise("MalformedFrameError", message, &[])
            }
            CudaError::DigestMismatch {
                slot,
                expected,
                actual,
            } => raise(
                "DigestMismatchError",
                message,
                &[
                    ("slot", a(*slot as u64)),
                    ("expected", a(*expected)),
                    ("actual", a(*actual)),
                ],
            ),
            CudaError::WrongTable { expected, got } => raise(
                "SlotTableMismatchError",
                message,
                &[
                    ("frame", hex(table_hash_hex(*got))),
                    ("local", hex(table_hash_hex(*expected))),
                ],
            ),
            CudaError::ReceiverRefused(n) => {
                raise("ReceiverRefusedError", message, &[("receivers", a(*n))])
            }
            CudaError::Timeout { .. } => raise("SyncTimeoutError", message, &[]),
            CudaError::NcclNotFound(_) | CudaError::Nccl { .. } => raise("NcclError", message, &[]),
            CudaError::Link { .. } => raise("IpcLinkError", message, &[]),
            CudaError::NotBuilt(_)
            | CudaError::DriverNotFound(_)
            | CudaError::NvrtcNotFound(_)
            | CudaError::NoDevice(_)
            | CudaError::Driver { .. }
            | CudaError::Compile { .. }
            | CudaError::Panicked(_) => raise("CudaError", message, &[]),
            // Taken above.
            CudaError::Sync(_) => raise("DeltacastError", message, &[]),
        }
    })
}

pub(crate) trait CudaResult<T> {
    fn py(self) -> PyResult<T>;
}

impl<T> CudaResult<T> for Result<T, CudaError> {
    fn py(self) -> PyResult<T> {
        self.map_err(cuda_to_py)
    }
}

/// `(True, "…")` when this machine can run the GPU sync (a driver, a device, NCCL), else
/// `(False, why)`.
#[pyfunction]
pub fn cuda_available() -> (bool, String) {
    let devices = match Gpu::device_count() {
        Ok(0) => return (false, "no CUDA device".into()),
        Ok(n) => n,
        Err(e) => return (false, e.to_string()),
    };
    match nccl::nccl_version() {
        Ok(v) => (true, format!("{devices} CUDA device(s), NCCL {v}")),
        Err(e) => (false, e.to_string()),
    }
}

/// A fresh NCCL unique id (128 bytes): make it on one rank and share it (e.g. through the
/// torch.distributed store) with every rank of the communicator.
#[pyfunction]
pub fn nccl_unique_id(py: Python<'_>) -> PyResult<Bound<'_, PyBytes>> {
    let id = nccl::unique_id().py()?;
    Ok(PyBytes::new(py, &id))
}

/// How both communicators show themselves.
fn comm_repr(kind: &str, rank: usize, nranks: usize, device: usize, taken: bool) -> String {
    let taken = if taken { ", taken" } else { "" };
    format!("{kind}(rank={rank}, nranks={nranks}, device={device}{taken})")
}

/// One rank of an NCCL communicator on one GPU. Made once, then handed to exactly one
/// `GpuSender` or `GpuReceiver`, which owns it from then on.
#[pyclass(module = "deltacast._native")]
pub struct NcclComm {
    parts: Option<(Gpu, nccl::NcclComm)>,
    rank: usize,
    nranks: usize,
    device: usize,
}

#[pymethods]
impl NcclComm {
    /// Joins the communicator named by `unique_id` as `rank` of `nranks`, on CUDA device
    /// `device`; blocks until every rank has joined (the GIL is released meanwhile).
    #[new]
    fn new(
        py: Python<'_>,
        unique_id: &[u8],
        nranks: usize,
        rank: usize,
        device: usize,
    ) -> PyResult<Self> {
        let id: [u8; nccl::UNIQUE_ID_BYTES] = unique_id.try_into().map_err(|_| {
            invalid(format!(
                "unique_id of {} bytes, NCCL's is {}",
                unique_id.len(),
                nccl::UNIQUE_ID_BYTES
            ))
        })?;
        let parts = py
            .detach(|| -> Result<_, CudaError> {
                let gpu = Gpu::new(device)?;
                gpu.make_current()?;
                let comm = nccl::NcclComm::new(&id, nranks, rank)?;
                Ok((gpu, comm))
            })
            .py()?;
        Ok(NcclComm {
            parts: Some(parts),
            rank,
            nranks,
            device,
        })
    }

    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    #[getter]
    fn nranks(&self) -> usize {
        self.nranks
    }

    #[getter]
    fn device(&self) -> usize {
        self.device
    }

    fn __repr__(&self) -> String {
        comm_repr(
            "NcclComm",
            self.rank,
            self.nranks,
            self.device,
            self.parts.is_none(),
        )
    }
}

impl NcclComm {
    fn take(&mut self) -> PyResult<(Gpu, nccl::NcclComm)> {
        self.parts
            .take()
            .ok_or_else(|| invalid("this NcclComm already belongs to a sender or receiver"))
    }
}

/// One rank of a CUDA-IPC link (processes of one machine, any number of them on one GPU):
/// rank 0 listens at `address` (loopback only) and owns the staging, the others connect. Every
/// rank proves it holds the shared secret before anything else is exchanged. Made once, then
/// handed to exactly one `GpuSender` (rank 0) or `GpuReceiver`.
#[pyclass(module = "deltacast._native")]
pub struct IpcComm {
    parts: Option<(Gpu, ipc::IpcComm)>,
    rank: usize,
    nranks: usize,
    device: usize,
    /// Root: the connections refused during the set-up, as text.
    refused: Vec<String>,
}

/// The link's secret: `secret` (str or bytes) when given, else the file `secret_file`, else
/// `DELTACAST_SECRET`; none of them is an error (the link has no unauthenticated mode).
fn ipc_secret(
    secret: Option<&Bound<'_, PyAny>>,
    secret_file: Option<std::path::PathBuf>,
) -> PyResult<ipc::Secret> {
    fn bad(e: impl std::fmt::Display) -> PyErr {
        invalid(e.to_string())
    }
    if let Some(given) = secret {
        let bytes: Vec<u8> = if let Ok(text) = given.extract::<String>() {
            text.into_bytes()
        } else if let Ok(raw) = given.extract::<Vec<u8>>() {
            raw
        } else {
            return Err(invalid("secret must be str or bytes"));
        };
        return ipc::Secret::new(bytes).map_err(bad);
    }
    ipc::Secret::from_env_or_file(secret_file.as_deref())
        .map_err(bad)?
        .ok_or_else(|| {
            invalid(format!(
                "the IPC link needs a shared secret: pass secret= (e.g. \
                 IpcComm.generate_secret() on rank 0, handed to the others like the NCCL \
                 unique id), secret_file=, or set {}",
                ipc::SECRET_ENV
            ))
        })
}

#[pymethods]
impl IpcComm {
    /// Joins the link at `address` ("127.0.0.1:port") as `rank` of `nranks` on CUDA device
    /// `device`; blocks (GIL released) until every rank has joined, at most `timeout_s`.
    /// The shared secret: `secret`, else `secret_file`, else `DELTACAST_SECRET`.
    #[new]
    #[pyo3(signature = (address, nranks, rank, device, timeout_s=300.0, slots=4, slot_bytes=64 << 20, *, secret=None, secret_file=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        address: &str,
        nranks: usize,
        rank: usize,
        device: usize,
        timeout_s: f64,
        slots: u64,
        slot_bytes: u64,
        secret: Option<&Bound<'_, PyAny>>,
        secret_file: Option<std::path::PathBuf>,
    ) -> PyResult<Self> {
        let options = ipc::IpcOptions {
            slots,
            slot_bytes,
            timeout: timeout(timeout_s)?,
            ..ipc::IpcOptions::default()
        };
        options.check(nranks, rank).py()?;
        let secret = ipc_secret(secret, secret_file)?;
        loopback_addresses(address).py()?;
        let parts = py
            .detach(|| -> Result<_, CudaError> {
                let gpu = Gpu::new(device)?;
                let comm = ipc::IpcComm::new(&gpu, address, nranks, rank, &secret, options)?;
                Ok((gpu, comm))
            })
            .py()?;
        let refused = parts.1.refused().iter().map(|r| r.to_string()).collect();
        Ok(IpcComm {
            parts: Some(parts),
            rank,
            nranks,
            device,
            refused,
        })
    }

    /// A fresh random secret (64 hex digits) for rank 0 to hand to the other ranks.
    #[staticmethod]
    fn generate_secret() -> PyResult<String> {
        ipc::generate_token().map_err(|e| invalid(e.to_string()))
    }

    #[getter]
    fn rank(&self) -> usize {
        self.rank
    }

    #[getter]
    fn nranks(&self) -> usize {
        self.nranks
    }

    #[getter]
    fn device(&self) -> usize {
        self.device
    }

    /// Rank 0: the connections it refused during the set-up because they did not
    /// authenticate (the first 32), each naming its address and why.
    #[getter]
    fn refused(&self) -> Vec<String> {
        self.refused.clone()
    }

    fn __repr__(&self) -> String {
        comm_repr(
            "IpcComm",
            self.rank,
            self.nranks,
            self.device,
            self.parts.is_none(),
        )
    }
}

/// A frame pushed from Python and read in place: its object stays referenced until the frame
/// is dropped (after its sync was read, without the GIL: the reference is then released at
/// the next acquisition, as pyo3 does for any `Py` dropped so).
struct HeldFrame {
    _owner: Py<PyAny>,
    view: RawView,
}

// SAFETY: the view is of a `bytes` object's buffer or a read-only array's, which nobody writes
// and which stays valid while `_owner` references it; it is only read, from any thread.
unsafe impl Send for HeldFrame {}

impl AsRef<[u8]> for HeldFrame {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: as for `Send` above: live while `self` is, never written.
        unsafe { self.view.bytes() }
    }
}

/// A link whose other end is the frames you hand it (`push`): a `GpuReceiver` made on it
/// applies syncs that arrived as frames on the host (from a CPU `Sender`, a socket, a sync
/// file) on its GPU, decoding them there. Each `receive()` reads one sync, through its
/// final frame, from what was pushed; with nothing pushed it returns as a close would.
#[pyclass(module = "deltacast._native")]
pub struct FrameFeed {
    /// Whether a receiver holds it.
    taken: bool,
    queue: FrameQueue,
    device: usize,
}

#[pymethods]
impl FrameFeed {
    #[new]
    fn new(device: usize) -> Self {
        FrameFeed {
            taken: false,
            queue: Default::default(),
            device,
        }
    }

    /// Appends one frame (bytes, a uint8 numpy array or buffer) after those pushed before.
    /// `bytes` and read-only arrays are read in place when received (kept referenced until
    /// then); anything else is copied now.
    fn push(&self, frame: &Bound<'_, PyAny>) -> PyResult<()> {
        let (held, view) = frame_bytes(frame)?;
        let fixed = held.is_instance_of::<PyBytes>()
            || !held
                .getattr("flags")
                .and_then(|f| f.getattr("writeable"))
                .and_then(|w| w.extract::<bool>())
                .unwrap_or(true);
        if fixed {
            self.queue.push(HeldFrame {
                _owner: held.unbind(),
                view,
            });
        } else {
            // SAFETY: `held` keeps the frame alive while it is copied; it is only read.
            self.queue.push(unsafe { view.bytes() }.to_vec());
        }
        Ok(())
    }

    /// Bytes pushed and not yet read.
    #[getter]
    fn pending_bytes(&self) -> u64 {
        self.queue.pending_bytes()
    }

    /// Drops every frame not yet read.
    fn clear(&self) {
        self.queue.clear();
    }

    #[getter]
    fn device(&self) -> usize {
        self.device
    }
}

/// Either communicator, as a sender or receiver takes it.
#[derive(FromPyObject)]
pub enum AnyComm<'py> {
    Nccl(PyRefMut<'py, NcclComm>),
    Ipc(PyRefMut<'py, IpcComm>),
    Frames(PyRefMut<'py, FrameFeed>),
}

impl AnyComm<'_> {
    fn device(&self) -> usize {
        match self {
            AnyComm::Nccl(c) => c.device,
            AnyComm::Ipc(c) => c.device,
            AnyComm::Frames(c) => c.device,
        }
    }

    /// Whether a sender or receiver already holds it.
    fn is_taken(&self) -> bool {
        match self {
            AnyComm::Nccl(c) => c.parts.is_none(),
            AnyComm::Ipc(c) => c.parts.is_none(),
            AnyComm::Frames(c) => c.taken,
        }
    }

    fn take(self) -> PyResult<(Gpu, Link)> {
        match self {
            AnyComm::Nccl(mut c) => c.take().map(|(g, c)| (g, c.into())),
            AnyComm::Ipc(mut c) => c
                .parts
                .take()
                .map(|(g, c)| (g, c.into()))
                .ok_or_else(|| invalid("this IpcComm already belongs to a sender or receiver")),
            AnyComm::Frames(mut c) => {
                if c.taken {
                    return Err(invalid("this FrameFeed already belongs to a receiver"));
                }
                let device = c.device;
                let (gpu, link_gpu) = Python::attach(|py| {
                    py.detach(|| Ok::<_, CudaError>((Gpu::new(device)?, Gpu::new(device)?)))
                })
                .map_err(cuda_to_py)?;
                c.taken = true;
                Ok((
                    gpu,
                    FrameLink::replay_queue(link_gpu, c.queue.clone()).into(),
                ))
            }
        }
    }
}

/// `(name, data_ptr, dtype, shape)` tuples into tensors.
fn tensors(specs: Vec<(String, u64, String, Vec<u64>)>) -> PyResult<Vec<GpuTensor>> {
    specs
        .into_iter()
        .map(|(name, ptr, dtype, shape)| {
            let dtype = deltacast::DType::from_name(&dtype).map_err(|e| invalid(e.to_string()))?;
            Ok(GpuTensor::new(name, dtype, shape, ptr))
        })
        .collect()
}

fn report_dict<'py>(py: Python<'py>, r: &GpuSyncReport) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("kind", r.kind.name())?;
    d.set_item("version", r.version)?;
    d.set_item("changed", r.changed)?;
    d.set_item("numel", r.numel)?;
    d.set_item(
        "changed_ratio",
        if r.numel == 0 {
            0.0
        } else {
            r.changed as f64 / r.numel as f64
        },
    )?;
    d.set_item("payload_bytes", r.payload_bytes)?;
    d.set_item("chunks", r.chunks)?;
    d.set_item("time_ms", r.time_ms)?;
    d.set_item("diff_ms", r.diff_ms)?;
    d.set_item("entropy", r.entropy)?;
    d.set_item("steps", r.steps)?;
    d.set_item("stages", r.stages)?;
    d.set_item("dense_stages", r.dense_stages)?;
    d.set_item("bitmap_stages", r.bitmap_stages)?;
    let phases = PyDict::new(py);
    for (name, ms) in &r.phases {
        phases.set_item(*name, *ms)?;
    }
    d.set_item("phases_ms", phases)?;
    if let Some(c) = &r.choice {
        // The sender's cost model: rates learned on this link, and the changed fraction of a
        // BF16 stage above which it sends the stage whole (per codec: plain, entropy).
        let m = PyDict::new(py);
        m.set_item("dense_ms_per_gb", c.dense_ms_per_gb)?;
        m.set_item("diff_ms_per_gb", c.diff_ms_per_gb)?;
        m.set_item("plain_ms_per_mchange", c.delta_ms_per_mchange[0])?;
        m.set_item("entropy_ms_per_mchange", c.delta_ms_per_mchange[1])?;
        m.set_item("plain_fixed_ms", c.delta_fixed_ms[0])?;
        m.set_item("entropy_fixed_ms", c.delta_fixed_ms[1])?;
        m.set_item("plain_syncs_measured", c.measured[0])?;
        m.set_item("entropy_syncs_measured", c.measured[1])?;
        m.set_item("plain_dense_above", c.dense_above[0])?;
        m.set_item("entropy_dense_above", c.dense_above[1])?;
        m.set_item("steps_ms_per_mchange", c.delta_ms_per_mchange[2])?;
        m.set_item("steps_fixed_ms", c.delta_fixed_ms[2])?;
        m.set_item("steps_syncs_measured", c.measured[2])?;
        m.set_item("steps_dense_above", c.dense_above[2])?;
        d.set_item("choice", m)?;
    }
    Ok(d)
}

fn timeout(seconds: f64) -> PyResult<Duration> {
    if !(seconds > 0.0 && seconds.is_finite()) {
        return Err(invalid(format!("timeout of {seconds} s")));
    }
    Ok(Duration::from_secs_f64(seconds))
}

/// The trainer side of the GPU sync (use `deltacast.cuda.GpuSender`, which takes torch
/// tensors). Tensors are borrowed by pointer: the caller keeps them alive and unmoved.
#[pyclass(module = "deltacast._native")]
pub struct NativeGpuSender {
    inner: GpuSender,
}

#[pymethods]
impl NativeGpuSender {
    #[new]
    #[pyo3(signature = (comm, tensors, snapshots=None, root=0, chunk_elems=deltacast::flush::DEFAULT_CHUNK_ELEMS, capacity=deltacast_cuda::sync::DEFAULT_CAPACITY, timeout_s=300.0, snapshot="device", entropy="auto", stage_bytes=deltacast_cuda::sync::DEFAULT_STAGE_BYTES, sources=None, bf16_nan=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        comm: AnyComm<'_>,
        tensors: Vec<(String, u64, String, Vec<u64>)>,
        snapshots: Option<Vec<u64>>,
        root: usize,
        chunk_elems: u64,
        capacity: f64,
        timeout_s: f64,
        snapshot: &str,
        entropy: &str,
        stage_bytes: u64,
        sources: Option<Vec<String>>,
        bf16_nan: Option<u16>,
    ) -> PyResult<Self> {
        // `tensors` name each slot's (wire) dtype; `sources`, when given, the dtype of the
        // elements at each pointer (F32 for a BF16 slot converts on the fly).
        let mut tensors = self::tensors(tensors)?;
        if let Some(sources) = sources {
            if sources.len() != tensors.len() {
                return Err(invalid(format!(
                    "{} source dtypes for {} tensors",
                    sources.len(),
                    tensors.len()
                )));
            }
            for (t, s) in tensors.iter_mut().zip(sources) {
                t.source = deltacast::DType::from_name(&s).map_err(|e| invalid(e.to_string()))?;
            }
        }
        let snapshot = snapshot_place(snapshot)?;
        let entropy = entropy_mode(entropy)?;
        let config = GpuSenderConfig {
            root,
            chunk_elems,
            capacity,
            timeout: timeout(timeout_s)?,
            snapshot,
            entropy,
            stage_bytes,
        };
        let (gpu, link) = comm.take()?;
        // SAFETY: the Python wrapper passes live CUDA tensors of this device (checked there:
        // device, contiguity, dtype) and keeps references to them for the sender's life.
        let mut inner = unsafe { GpuSender::new(gpu, link, tensors, snapshots, config) }.py()?;
        if let Some(nan) = bf16_nan {
            inner.set_bf16_rule(deltacast::Bf16Rule { nan });
        }
        Ok(NativeGpuSender { inner })
    }

    /// Sends every tensor whole (after `stream`'s work), waits for every receiver's ack.
    fn seed<'py>(&mut self, py: Python<'py>, stream: u64) -> PyResult<Bound<'py, PyDict>> {
        let inner = &mut self.inner;
        // SAFETY: `stream` is torch's current stream of this device (the wrapper's promise).
        let stream = unsafe { WaitStream::new(stream) };
        let r = py.detach(|| WeightSender::seed(inner, stream)).py()?;
        report_dict(py, &r)
    }

    /// Sends what changed since the last sync (a seed when one is due).
    fn sync<'py>(&mut self, py: Python<'py>, stream: u64) -> PyResult<Bound<'py, PyDict>> {
        let inner = &mut self.inner;
        // SAFETY: as in `seed`.
        let stream = unsafe { WaitStream::new(stream) };
        let r = py.detach(|| WeightSender::sync(inner, stream)).py()?;
        report_dict(py, &r)
    }

    /// Tells the receivers that no sync follows.
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        let inner = &mut self.inner;
        py.detach(|| inner.close()).py()
    }

    /// Device bytes held besides the tensors (snapshot when owned on the device, delta
    /// buffers).
    #[getter]
    fn staging_bytes(&self) -> u64 {
        self.inner.staging_bytes()
    }

    /// Pinned host bytes held (the snapshot with `snapshot="pinned"`, else 0).
    #[getter]
    fn host_bytes(&self) -> u64 {
        self.inner.host_bytes()
    }

    /// The bf16 bits every fp32 NaN of a converting source becomes.
    #[getter]
    fn bf16_nan(&self) -> u16 {
        self.inner.bf16_rule().nan
    }
}

/// `snapshot=` of the senders.
fn snapshot_place(name: &str) -> PyResult<SnapshotPlace> {
    match name {
        "device" => Ok(SnapshotPlace::Device),
        "pinned" => Ok(SnapshotPlace::PinnedHost),
        other => Err(invalid(format!(
            "snapshot={other:?}: \"device\" or \"pinned\" (pinned host memory)"
        ))),
    }
}

/// `entropy=` of the senders.
fn entropy_mode(name: &str) -> PyResult<EntropyMode> {
    match name {
        "on" => Ok(EntropyMode::On),
        "off" => Ok(EntropyMode::Off),
        "auto" => Ok(EntropyMode::Auto),
        other => Err(invalid(format!(
            "entropy={other:?}: \"on\", \"off\" or \"auto\""
        ))),
    }
}

/// The trainer side of the GPU sync: one trainer rank of a sharded model (use
/// `deltacast.cuda.GpuShardedSender`). Shards are borrowed by pointer.
#[pyclass(module = "deltacast._native")]
pub struct NativeGpuShardedSender {
    inner: GpuShardedSender,
}

#[pymethods]
impl NativeGpuShardedSender {
    /// `shards`: `(name, data_ptr, dtype, full shape, first element, elements)` per slot, in
    /// the slot order every rank shares. `receivers`: the leader's (trainer rank 0's)
    /// communicator with the receivers, `None` on the other ranks. Collective over the
    /// trainer ranks.
    #[new]
    #[pyo3(signature = (trainers, receivers, shards, root=0, chunk_elems=deltacast::flush::DEFAULT_CHUNK_ELEMS, capacity=deltacast_cuda::sync::DEFAULT_CAPACITY, timeout_s=300.0, snapshot="device", entropy="auto", stage_bytes=deltacast_cuda::sync::DEFAULT_STAGE_BYTES))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        trainers: AnyComm<'_>,
        receivers: Option<AnyComm<'_>>,
        shards: Vec<(String, u64, String, Vec<u64>, u64, u64)>,
        root: usize,
        chunk_elems: u64,
        capacity: f64,
        timeout_s: f64,
        snapshot: &str,
        entropy: &str,
        stage_bytes: u64,
    ) -> PyResult<Self> {
        // Arguments are checked before the collective constructor; a rank that finds its own
        // wrong still takes part in it, as a refusal, so that the other ranks fail at once.
        let prepared = (|| -> PyResult<(Vec<GpuShard>, GpuSenderConfig)> {
            let shards = shards
                .into_iter()
                .map(|(name, ptr, dtype, shape, first_index, numel)| {
                    let dtype =
                        deltacast::DType::from_name(&dtype).map_err(|e| invalid(e.to_string()))?;
                    Ok(GpuShard {
                        name,
                        dtype,
                        shape,
                        first_index,
                        numel,
                        ptr,
                    })
                })
                .collect::<PyResult<Vec<_>>>()?;
            if let Some(r) = &receivers {
                if r.is_taken() {
                    return Err(invalid(
                        "the receivers' communicator already belongs to a sender or receiver",
                    ));
                }
                if r.device() != trainers.device() {
                    return Err(invalid(format!(
                        "the receivers' communicator is on cuda:{}, the trainers' on cuda:{}",
                        r.device(),
                        trainers.device()
                    )));
                }
            }
            let config = GpuSenderConfig {
                root,
                chunk_elems,
                capacity,
                timeout: timeout(timeout_s)?,
                snapshot: snapshot_place(snapshot)?,
                entropy: entropy_mode(entropy)?,
                stage_bytes,
            };
            Ok((shards, config))
        })();
        let (shards, config) = match prepared {
            Ok(p) => p,
            Err(e) => {
                decline(py, trainers, timeout_s, e.to_string())?;
                return Err(e);
            }
        };
        let receivers = receivers
            .map(|r| r.take().map(|(_, link)| link))
            .transpose()?;
        let (gpu, trainers) = trainers.take()?;
        // SAFETY: the Python wrapper passes live CUDA tensors of this device (checked there:
        // device, contiguity, dtype, sizes) and keeps references to them for the sender's life.
        let inner = py
            .detach(|| unsafe { GpuShardedSender::new(gpu, trainers, receivers, shards, config) })
            .py()?;
        Ok(NativeGpuShardedSender { inner })
    }

    /// Sends every slot whole (collective), once every receiver acked.
    fn seed<'py>(&mut self, py: Python<'py>, stream: u64) -> PyResult<Bound<'py, PyDict>> {
        let inner = &mut self.inner;
        // SAFETY: `stream` is torch's current stream of this device (the wrapper's promise).
        let stream = unsafe { WaitStream::new(stream) };
        let r = py.detach(|| WeightSender::seed(inner, stream)).py()?;
        report_dict(py, &r)
    }

    /// Sends what changed since the last sync (collective; a seed when one is due).
    fn sync<'py>(&mut self, py: Python<'py>, stream: u64) -> PyResult<Bound<'py, PyDict>> {
        let inner = &mut self.inner;
        // SAFETY: as in `seed`.
        let stream = unsafe { WaitStream::new(stream) };
        let r = py.detach(|| WeightSender::sync(inner, stream)).py()?;
        report_dict(py, &r)
    }

    /// Tells the receivers that no sync follows (the leader; nothing elsewhere).
    fn close(&mut self, py: Python<'_>) -> PyResult<()> {
        let inner = &mut self.inner;
        py.detach(|| inner.close()).py()
    }
}

crate::weight_sender::weight_sender_methods!(NativeGpuSender);
crate::weight_sender::weight_sender_methods!(NativeGpuShardedSender);

/// Takes this trainer rank's part in the collective constructor of `GpuShardedSender` as a
/// refusal (`why`), so that the other ranks fail at once instead of waiting out their
/// timeout; consumes `trainers`. Errors of its own (a communicator already taken) are
/// returned; otherwise `Ok`.
fn decline(py: Python<'_>, trainers: AnyComm<'_>, timeout_s: f64, why: String) -> PyResult<()> {
    let wait = timeout(timeout_s).unwrap_or(Duration::from_secs(300));
    let (gpu, trainers) = trainers.take()?;
    py.detach(|| GpuShardedSender::decline(&gpu, trainers, wait, why));
    Ok(())
}

/// For the Python wrapper: a trainer rank whose arguments failed its own checks declines
/// the collective construction (see `decline`), then raises its own error.
#[pyfunction]
#[pyo3(signature = (trainers, why, timeout_s=300.0))]
pub fn decline_sharded(
    py: Python<'_>,
    trainers: AnyComm<'_>,
    why: String,
    timeout_s: f64,
) -> PyResult<()> {
    decline(py, trainers, timeout_s, why)
}

/// The receiving side of the GPU sync (use `deltacast.cuda.GpuReceiver`).
#[pyclass(module = "deltacast._native")]
pub struct NativeGpuReceiver {
    inner: GpuReceiver,
}

#[pymethods]
impl NativeGpuReceiver {
    #[new]
    #[pyo3(signature = (comm, tensors, root=0, timeout_s=300.0))]
    fn new(
        comm: AnyComm<'_>,
        tensors: Vec<(String, u64, String, Vec<u64>)>,
        root: usize,
        timeout_s: f64,
    ) -> PyResult<Self> {
        let tensors = self::tensors(tensors)?;
        let timeout = timeout(timeout_s)?;
        let (gpu, link) = comm.take()?;
        // SAFETY: as for the sender; the tensors are written in place.
        let inner = unsafe { GpuReceiver::new(gpu, link, tensors, root, timeout) }.py()?;
        Ok(NativeGpuReceiver { inner })
    }

    /// Receives and applies the next sync (after `stream`'s work); `None` when the sender
    /// closed.
    #[pyo3(signature = (stream, idle_timeout_s=None))]
    fn receive<'py>(
        &mut self,
        py: Python<'py>,
        stream: u64,
        idle_timeout_s: Option<f64>,
    ) -> PyResult<Option<Bound<'py, PyDict>>> {
        let idle = idle_timeout_s.map(timeout).transpose()?;
        let inner = &mut self.inner;
        // SAFETY: `stream` is torch's current stream of this device (the wrapper's promise).
        let r = py.detach(|| unsafe { inner.receive(stream, idle) }).py()?;
        r.map(|r| report_dict(py, &r)).transpose()
    }

    /// Device bytes held besides the tensors (receive buffers of the largest delta so far).
    #[getter]
    fn staging_bytes(&self) -> u64 {
        self.inner.staging_bytes()
    }

    /// Stage, then commit: `receive` checks and acks a sync whole, writing nothing, until
    /// `commit` (see `deltacast.cuda.GpuReceiver`).
    fn set_commit_on_demand(&mut self, on: bool) {
        self.inner.set_commit_on_demand(on);
    }

    #[getter]
    fn commits_on_demand(&self) -> bool {
        self.inner.commits_on_demand()
    }

    /// Whether a verified sync waits for `commit`.
    #[getter]
    fn awaits_commit(&self) -> bool {
        self.inner.awaits_commit()
    }

    /// Writes the verified sync that waits (after `stream`'s work); its report, with the
    /// commit's time.
    fn commit<'py>(&mut self, py: Python<'py>, stream: u64) -> PyResult<Bound<'py, PyDict>> {
        let inner = &mut self.inner;
        // SAFETY: `stream` is torch's current stream of this device (the wrapper's promise).
        let r = py.detach(|| unsafe { inner.commit(stream) }).py()?;
        report_dict(py, &r)
    }

    /// Drops the verified sync that waits; the version held stays.
    fn abort_sync(&mut self) {
        self.inner.abort_sync();
    }

    /// Recomputes the digests of the weights held; raises `DigestMismatchError` when they were
    /// changed behind the receiver's back (it then needs a seed).
    fn verify(&mut self, py: Python<'_>) -> PyResult<()> {
        let inner = &mut self.inner;
        py.detach(|| inner.verify()).py()
    }

    /// The version held; `None` before the first seed, or once a sync failed with a stage it
    /// could not undo or `verify` found the weights changed (it then needs a seed).
    #[getter]
    fn version(&self) -> Option<u64> {
        self.inner.version()
    }

    #[getter]
    fn digests(&self) -> Vec<u64> {
        self.inner.digests().to_vec()
    }
}
