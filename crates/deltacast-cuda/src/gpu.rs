//! The GPU path (feature `cuda`): cudarc's thin `result` layer over the driver API, NVRTC for the
//! kernels, every call guarded so that a missing library is an error and never a panic.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::driver::{result as cu, sys};
use cudarc::nvrtc;

use deltacast::digest::slot_salt;

use crate::error::{CudaError, Result};
use crate::DiffTuning;
use crate::{
    apply_error_reason, journal_layout, ApplyCheck, ApplyInput, ApplyPositions, ChunkError,
    DevicePtr, DiffInput, DiffOutput, DiffResult, DiffTensorResult, DigestInput, EncodeInput,
    GridChunk, UpdateInput, KERNELS,
};

mod entropy;
pub use entropy::{CodeScratch, DECODE_SLACK};

const DIFF_THREADS: u32 = 256;
/// Tiles per group of the diff's first scan level (kernels/diff.cu).
const DIFF_GROUP: u64 = 2048;
/// Elements per digest block (kernels/digest.cu).
const DIGEST_BLOCK_ELEMS: u64 = 256 * 32;
const THREADS: u32 = 256;
/// Largest download that goes through the pinned staging buffer (larger ones, rare and
/// never on a sync's path, go straight to pageable memory).
const STAGED_DOWNLOAD_MAX: usize = 4 << 20;
/// Most blocks a grid-stride kernel is launched with.
const MAX_GRID: u64 = 1 << 16;

// Host twins of the kernel structs; field order and sizes must match the .cu files.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KDiffTensor {
    snap: u64,
    cur: u64,
    nbytes: u64,
    first_index: u64,
    tile_begin: u64,
    digest_out: u64,
    salt: u64,
    width: u32,
    aligned16: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KEncodeCell {
    begin: u64,
    end: u64,
    chg_off: u64,
    chg_cnt: u64,
    bitmap_off: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct KEncodedCell {
    lo: u64,
    count: u64,
    start: u64,
    range: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KApplyChunk {
    dst: u64,
    pos: u64,
    val: u64,
    start: u64,
    range: u64,
    count: u64,
    salt: u64,
    width: u32,
    pos_codec: u32,
    slot: u32,
    seed: u32,
    k_begin: u64,
    k_end: u64,
    journal: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KDigestTensor {
    ptr: u64,
    numel: u64,
    first_index: u64,
    salt: u64,
    block_begin: u64,
    out: u64,
    width: u32,
    pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KUpdateSeg {
    chg_off: u64,
    chg_cnt: u64,
    salt: u64,
    block_begin: u64,
    out: u64,
    width: u32,
    pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KPlaceCell {
    lo: u64,
    count: u64,
    start: u64,
    range: u64,
    dst: u64,
    codec: u32,
    pad: u32,
}

/// Runs `f`, turning a panic inside cudarc (missing library or symbol) into an error.
pub(crate) fn guarded<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let msg = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "unknown panic".into());
            Err(CudaError::Panicked(msg))
        }
    }
}

pub(crate) fn drv(op: &'static str) -> impl Fn(cu::DriverError) -> CudaError {
    move |e| {
        let msg = match (e.error_name(), e.error_string()) {
            (Ok(n), Ok(s)) => format!("{} ({})", n.to_string_lossy(), s.to_string_lossy()),
            _ => format!("{:?}", e.0),
        };
        CudaError::Driver { op, msg }
    }
}

/// Loads the library named by `var` (a file path) once, so that cudarc's later `dlopen` by
/// soname finds it already in the process.
fn preload(var: &str) -> std::result::Result<(), String> {
    static LOADED: OnceLock<Mutex<HashMap<String, std::result::Result<(), String>>>> =
        OnceLock::new();
    let Ok(path) = std::env::var(var) else {
        return Ok(());
    };
    let map = LOADED.get_or_init(Default::default);
    let mut map = map.lock().unwrap_or_else(PoisonError::into_inner);
    map.entry(var.to_string())
        .or_insert_with(|| {
            // SAFETY: loading a shared library runs its initialisers; the CUDA libraries'
            // are sound. The handle is leaked so it stays loaded for the process.
            match unsafe { libloading::Library::new(&path) } {
                Ok(lib) => {
                    std::mem::forget(lib);
                    Ok(())
                }
                Err(e) => Err(format!("{var}={path}: {e}")),
            }
        })
        .clone()
}

/// Probes `libcuda` without letting cudarc panic.
fn driver_present() -> Result<()> {
    preload("DELTACAST_CUDA_PATH").map_err(CudaError::DriverNotFound)?;
    // SAFETY: only tries to dlopen the candidate names.
    let present = catch_unwind(|| unsafe { sys::is_culib_present() }).unwrap_or(false);
    if present {
        Ok(())
    } else {
        Err(CudaError::DriverNotFound(
            "no libcuda.so in the library search path (is an NVIDIA driver installed? \
             DELTACAST_CUDA_PATH may name the file)"
                .into(),
        ))
    }
}

/// Probes `libnvrtc` without letting cudarc panic.
pub fn nvrtc_present() -> Result<()> {
    preload("DELTACAST_NVRTC_PATH").map_err(CudaError::NvrtcNotFound)?;
    // SAFETY: only tries to dlopen the candidate names.
    let present = catch_unwind(|| unsafe { nvrtc::sys::is_culib_present() }).unwrap_or(false);
    if present {
        Ok(())
    } else {
        Err(CudaError::NvrtcNotFound(
            "no libnvrtc.so in the library search path (install the CUDA toolkit or the \
             nvidia-cuda-nvrtc wheel; DELTACAST_NVRTC_PATH may name the file)"
                .into(),
        ))
    }
}

/// Compiles kernel file `name` to PTX for `arch` (e.g. `compute_90`), without a device.
pub fn compile_kernel(name: &str, arch: &str) -> Result<String> {
    compile_kernel_with(name, arch, &[])
}

/// [`compile_kernel`] with the diff kernel's knobs set to `tuning`.
pub fn compile_kernel_tuned(name: &str, arch: &str, tuning: DiffTuning) -> Result<String> {
    compile_kernel_with(name, arch, &tuning_defines(name, tuning))
}

/// The NVRTC options a kernel file takes from the tuning.
fn tuning_defines(name: &str, tuning: DiffTuning) -> Vec<String> {
    match name {
        "diff" => tuning.defines(),
        _ => Vec::new(),
    }
}

/// [`compile_kernel`] with extra NVRTC options (e.g. `-DDIFF_ITEMS=8`).
fn compile_kernel_with(name: &str, arch: &str, extra: &[String]) -> Result<String> {
    guarded(|| {
        nvrtc_present()?;
        let program = crate::kernel_program(name)
            .ok_or_else(|| CudaError::InvalidArgument(format!("no kernel file `{name}`")))?;
        let opts = nvrtc::CompileOptions {
            options: vec![
                format!("--gpu-architecture={arch}"),
                "--std=c++17".into(),
                "-default-device".into(),
            ]
            .into_iter()
            .chain(extra.iter().cloned())
            .collect(),
            name: Some(format!("{name}.cu")),
            ..Default::default()
        };
        match nvrtc::compile_ptx_with_opts(program, opts) {
            Ok(ptx) => Ok(ptx.to_src()),
            Err(nvrtc::CompileError::CompileError { log, .. }) => Err(CudaError::Compile {
                name: name.into(),
                arch: arch.into(),
                log: log.to_string_lossy().into_owned(),
            }),
            Err(e) => Err(CudaError::Compile {
                name: name.into(),
                arch: arch.into(),
                log: format!("{e:?}"),
            }),
        }
    })
}

/// PTX of every kernel file for `arch` and tuning, compiled once per process.
fn ptx_for(arch: &str, tuning: DiffTuning) -> Result<Arc<Vec<(&'static str, String)>>> {
    type Cache = Mutex<HashMap<(String, DiffTuning), Arc<Vec<(&'static str, String)>>>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let key = (arch.to_string(), tuning);
    if let Some(hit) = cache
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .get(&key)
    {
        return Ok(hit.clone());
    }
    let mut all = Vec::new();
    for (name, _) in KERNELS {
        all.push((
            *name,
            compile_kernel_with(name, arch, &tuning_defines(name, tuning))?,
        ));
    }
    let all = Arc::new(all);
    cache
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .insert(key, all.clone());
    Ok(all)
}

/// Kernel arguments: every value lives in a u64 slot (a u32 argument reads the low half, as
/// the host is little-endian), so the pointers handed to the driver stay put.
struct Args {
    slots: [u64; 16],
    len: usize,
}

impl Args {
    fn new() -> Self {
        Args {
            slots: [0; 16],
            len: 0,
        }
    }

    fn push(mut self, v: u64) -> Self {
        self.slots[self.len] = v;
        self.len += 1;
        self
    }

    /// The diff's output, as its writing kernels take it: capacity, positions, new bits, old
    /// bits (0: none).
    fn push_output(self, out: &DiffOutput) -> Self {
        self.push(out.capacity)
            .push(out.positions)
            .push(out.new_values)
            .push(out.old_values.unwrap_or(0))
    }

    fn ptrs(&mut self) -> Vec<*mut c_void> {
        let base = self.slots.as_mut_ptr();
        // SAFETY: every index is below `len` <= 16.
        (0..self.len)
            .map(|i| unsafe { base.add(i) } as *mut c_void)
            .collect()
    }
}

/// A device allocation owned by this crate, freed on drop.
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    len: usize,
    ctx: sys::CUcontext,
}

// SAFETY: a device address and a context handle; the driver API is thread-safe.
unsafe impl Send for DeviceBuffer {}
unsafe impl Sync for DeviceBuffer {}

impl DeviceBuffer {
    /// Its device address.
    pub fn ptr(&self) -> DevicePtr {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

/// Runs `release` (a driver call freeing a handle created in `ctx`) with `ctx` current, from
/// a `Drop`: its errors (a context torn down) cannot be reported there, and a panic must not
/// escape.
pub(crate) fn release_in(ctx: sys::CUcontext, release: impl FnOnce()) {
    let _ = guarded(|| {
        // SAFETY: `ctx` is the context the handle was created in (each caller's own field).
        let _ = unsafe { cu::ctx::set_current(ctx) };
        release();
        Ok(())
    });
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.ptr != 0 {
            let ptr = self.ptr;
            release_in(self.ctx, || {
                // SAFETY: `ptr` came from `malloc_sync` in this context and is freed once.
                let _ = unsafe { cu::free_sync(ptr) };
            });
        }
    }
}

/// Page-locked host memory mapped into the device's address space (`cuMemHostAlloc` with
/// `CU_MEMHOSTALLOC_DEVICEMAP | CU_MEMHOSTALLOC_PORTABLE`), zeroed, freed on drop
/// (`cuMemFreeHost`). Kernels read and write it in place over PCIe through [`HostBuffer::ptr`]
/// (zero-copy); the host reads it through [`HostBuffer::as_slice`] once the GPU's work on it
/// is complete (every method of [`Gpu`] that returns host data synchronises its stream).
pub struct HostBuffer {
    /// Host address (null when `len == 0`).
    host: *mut u8,
    /// The same memory's device address (`cuMemHostGetDevicePointer`).
    dev: sys::CUdeviceptr,
    len: usize,
    ctx: sys::CUcontext,
}

// SAFETY: page-locked memory owned by this value, a device address and a context handle; the
// driver API is thread-safe, and host access goes through `&self` / `&mut self`.
unsafe impl Send for HostBuffer {}
unsafe impl Sync for HostBuffer {}

impl HostBuffer {
    /// Its device address (what the kernels are given; under UVA it equals the host address).
    pub fn ptr(&self) -> DevicePtr {
        self.dev
    }

    /// Its host address (null when empty).
    pub fn host_ptr(&self) -> *mut u8 {
        self.host
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes, as the host sees them. Work the GPU has enqueued on this buffer must be
    /// complete (the `unsafe` calls that hand its address to the GPU say so).
    pub fn as_slice(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: `host` is a live allocation of `len` bytes, zeroed at allocation, owned by
        // `self`.
        unsafe { std::slice::from_raw_parts(self.host, self.len) }
    }

    /// The bytes, writable from the host (same condition as [`HostBuffer::as_slice`]).
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        if self.len == 0 {
            return &mut [];
        }
        // SAFETY: as in `as_slice`; `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.host, self.len) }
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        if !self.host.is_null() {
            let host = self.host;
            release_in(self.ctx, || {
                // SAFETY: `host` came from `cuMemHostAlloc` in this context, freed once.
                let _ = unsafe { cu::free_host(host as *mut c_void) };
            });
        }
    }
}

/// A second stream on a GPU's context (the sync's collectives run on one, so that they
/// overlap the kernels of the next stage on the GPU's own stream). Destroyed on drop.
pub struct GpuStream {
    stream: sys::CUstream,
    ctx: sys::CUcontext,
}

// SAFETY: handles of the driver API, which is thread-safe; nothing here is mutated after
// creation.
unsafe impl Send for GpuStream {}
unsafe impl Sync for GpuStream {}

impl GpuStream {
    /// The raw `CUstream`.
    pub fn handle(&self) -> u64 {
        self.stream as u64
    }
}

impl Drop for GpuStream {
    fn drop(&mut self) {
        let stream = self.stream;
        release_in(self.ctx, || {
            // SAFETY: our stream, created in this context, synchronised and destroyed once.
            unsafe {
                let _ = cu::stream::synchronize(stream);
                let _ = cu::stream::destroy(stream);
            }
        });
    }
}

/// A CUDA event without timing: recorded on one stream, waited on by another, or polled
/// (`NcclComm::wait`). Destroyed on drop.
pub struct GpuEvent {
    event: sys::CUevent,
    ctx: sys::CUcontext,
}

// SAFETY: as for GpuStream.
unsafe impl Send for GpuEvent {}
unsafe impl Sync for GpuEvent {}

impl GpuEvent {
    /// The raw `CUevent`.
    pub fn handle(&self) -> u64 {
        self.event as u64
    }
}

impl Drop for GpuEvent {
    fn drop(&mut self) {
        let event = self.event;
        release_in(self.ctx, || {
            // SAFETY: our event, created in this context, destroyed once.
            let _ = unsafe { cu::event::destroy(event) };
        });
    }
}

struct Scratch {
    buf: Option<DeviceBuffer>,
}

/// One GPU: its primary context, a stream, the loaded kernels and some scratch memory.
pub struct Gpu {
    ordinal: usize,
    device: sys::CUdevice,
    ctx: sys::CUcontext,
    stream: sys::CUstream,
    modules: Vec<sys::CUmodule>,
    funcs: HashMap<&'static str, sys::CUfunction>,
    events: (sys::CUevent, sys::CUevent),
    /// Recorded on a foreign stream (torch's) for ours to wait on.
    wait_event: sys::CUevent,
    /// Recorded on our stream after collectives, polled by `NcclComm::wait`.
    done_event: sys::CUevent,
    arch: String,
    name: String,
    tuning: DiffTuning,
    sm_count: u32,
    scratch: Mutex<Scratch>,
    /// The diff's per-tile slots (1/8 of the bytes diffed).
    slots: Mutex<Scratch>,
    /// Page-locked memory that small downloads land in (see `download_staged`).
    download_staging: Mutex<Option<HostBuffer>>,
}

// SAFETY: handles of the driver API, which is thread-safe; the mutable scratch is behind a
// mutex held for the whole of every call that uses it, including the final synchronisation.
unsafe impl Send for Gpu {}
unsafe impl Sync for Gpu {}

/// The kernels of each file.
const KERNEL_NAMES: &[(&str, &[&str])] = &[
    (
        "diff",
        &[
            "dc_diff_tile_tensor",
            "dc_diff",
            "dc_diff_resident",
            "dc_diff_scan_tiles",
            "dc_diff_scan_groups",
            "dc_diff_place",
            "dc_diff_finish",
            "dc_diff_direct",
            "dc_diff_resident_direct",
            "dc_diff_finish_direct",
        ],
    ),
    ("encode", &["dc_encode_cells", "dc_encode_place"]),
    ("apply", &["dc_apply_check", "dc_apply_scatter"]),
    ("digest", &["dc_digest", "dc_digest_update"]),
    (
        "entropy",
        &[
            "dc_code_block_chunk",
            "dc_code_size",
            "dc_code_totals",
            "dc_code_write",
            "dc_code_dirs",
            "dc_gaps_decode",
            "dc_ulp_decode",
        ],
    ),
];

impl Gpu {
    /// Opens device `ordinal`: loads the driver, retains its primary context (the one torch
    /// uses), creates a stream, and compiles (once per process) and loads the kernels.
    /// A machine without the driver, NVRTC or the device gets an error, never a panic.
    pub fn new(ordinal: usize) -> Result<Gpu> {
        Gpu::with_tuning(ordinal, DiffTuning::from_env()?)
    }

    /// [`Gpu::new`] with the diff kernel built with `tuning`.
    pub fn with_tuning(ordinal: usize, tuning: DiffTuning) -> Result<Gpu> {
        Gpu::with_options(ordinal, tuning, false)
    }

    /// [`Gpu::with_tuning`] whose stream has the device's greatest priority when
    /// `high_priority` (its kernels are scheduled ahead of those of other streams, e.g. a
    /// sync's encoding ahead of the next stage's diff).
    pub fn with_options(ordinal: usize, tuning: DiffTuning, high_priority: bool) -> Result<Gpu> {
        tuning.validate()?;
        guarded(|| {
            driver_present()?;
            cu::init().map_err(drv("cuInit"))?;
            let count = cu::device::get_count().map_err(drv("cuDeviceGetCount"))?;
            if ordinal >= count.max(0) as usize {
                return Err(CudaError::NoDevice(format!(
                    "device {ordinal} asked for, {count} present"
                )));
            }
            let device = cu::device::get(ordinal as i32).map_err(drv("cuDeviceGet"))?;
            let name = cu::device::get_name(device).unwrap_or_default();
            let attr = |a| {
                // SAFETY: `device` is a valid device handle.
                unsafe { cu::device::get_attribute(device, a) }.map_err(drv("cuDeviceGetAttribute"))
            };
            use sys::CUdevice_attribute as A;
            let major = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?;
            let minor = attr(A::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?;
            let sm_count = attr(A::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as u32;
            let arch = format!("compute_{major}{minor}");
            // SAFETY: retained here, released in drop.
            let ctx = unsafe { cu::primary_ctx::retain(device) }
                .map_err(drv("cuDevicePrimaryCtxRetain"))?;
            let mut gpu = Gpu {
                ordinal,
                device,
                ctx,
                stream: std::ptr::null_mut(),
                modules: Vec::new(),
                funcs: HashMap::new(),
                events: (std::ptr::null_mut(), std::ptr::null_mut()),
                wait_event: std::ptr::null_mut(),
                done_event: std::ptr::null_mut(),
                arch,
                name,
                tuning,
                sm_count,
                scratch: Mutex::new(Scratch { buf: None }),
                slots: Mutex::new(Scratch { buf: None }),
                download_staging: Mutex::new(None),
            };
            gpu.bind()?;
            let priority = if high_priority {
                cu::stream::get_priority_range()
                    .map_err(drv("cuCtxGetStreamPriorityRange"))?
                    .1
            } else {
                0
            };
            gpu.stream =
                cu::stream::create_with_priority(cu::stream::StreamKind::NonBlocking, priority)
                    .map_err(drv("cuStreamCreateWithPriority"))?;
            let ev = || {
                cu::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)
                    .map_err(drv("cuEventCreate"))
            };
            gpu.events = (ev()?, ev()?);
            let quiet = || {
                cu::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                    .map_err(drv("cuEventCreate"))
            };
            gpu.wait_event = quiet()?;
            gpu.done_event = quiet()?;
            let ptx = ptx_for(&gpu.arch, tuning)?;
            for (file, src) in ptx.iter() {
                let image = CString::new(src.as_bytes()).map_err(|_| CudaError::Compile {
                    name: file.to_string(),
                    arch: gpu.arch.clone(),
                    log: "PTX holds a NUL byte".into(),
                })?;
                // SAFETY: a NUL-terminated PTX image, alive for the call.
                let module = unsafe { cu::module::load_data(image.as_ptr() as *const c_void) }
                    .map_err(drv("cuModuleLoadData"))?;
                gpu.modules.push(module);
                let names = KERNEL_NAMES
                    .iter()
                    .find(|(f, _)| f == file)
                    .map_or(&[][..], |(_, k)| *k);
                for &k in names {
                    let cname = CString::new(k).expect("no NUL");
                    // SAFETY: `module` was just loaded.
                    let f = unsafe { cu::module::get_function(module, cname) }
                        .map_err(drv("cuModuleGetFunction"))?;
                    gpu.funcs.insert(k, f);
                }
            }
            Ok(gpu)
        })
    }

    /// Number of devices (0 when there is no driver).
    pub fn device_count() -> Result<usize> {
        guarded(|| {
            driver_present()?;
            cu::init().map_err(drv("cuInit"))?;
            Ok(cu::device::get_count()
                .map_err(drv("cuDeviceGetCount"))?
                .max(0) as usize)
        })
    }

    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The device's name, e.g. "NVIDIA H200".
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The virtual architecture the kernels were compiled for, e.g. `compute_90`.
    pub fn arch(&self) -> &str {
        &self.arch
    }

    pub fn sm_count(&self) -> u32 {
        self.sm_count
    }

    /// What the driver gave kernel `name` when it loaded it: (registers per thread, local
    /// memory bytes per thread (spills), static shared memory bytes per block). For benches.
    pub fn kernel_resources(&self, name: &str) -> Result<(i32, i32, i32)> {
        let f = *self
            .funcs
            .get(name)
            .ok_or_else(|| CudaError::InvalidArgument(format!("no kernel `{name}`")))?;
        use sys::CUfunction_attribute as A;
        let attr = |a| {
            // SAFETY: `f` is a function of a module this handle loaded and still holds.
            unsafe { cu::function::get_function_attribute(f, a) }.map_err(drv("cuFuncGetAttribute"))
        };
        guarded(|| {
            self.bind()?;
            Ok((
                attr(A::CU_FUNC_ATTRIBUTE_NUM_REGS)?,
                attr(A::CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES)?,
                attr(A::CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES)?,
            ))
        })
    }

    /// How the diff kernel was built.
    pub fn tuning(&self) -> DiffTuning {
        self.tuning
    }

    /// The raw `CUstream` every method enqueues on.
    pub fn stream_handle(&self) -> u64 {
        self.stream as u64
    }

    /// Makes this GPU's context current on the calling thread (NCCL's communicator setup
    /// needs it).
    pub fn make_current(&self) -> Result<()> {
        guarded(|| self.bind())
    }

    /// Makes our stream wait (on the device, no host sync) for everything enqueued so far on
    /// `other`, a stream of the same context (e.g. torch's current stream; 0 is the legacy
    /// default stream).
    ///
    /// # Safety
    /// `other` must be a live stream handle of this GPU's context, or 0.
    pub unsafe fn wait_for_stream(&self, other: u64) -> Result<()> {
        guarded(|| {
            self.bind()?;
            // SAFETY: per this function's contract; our event and stream.
            unsafe {
                cu::event::record(self.wait_event, other as sys::CUstream)
                    .map_err(drv("cuEventRecord"))?;
                cu::stream::wait_event(
                    self.stream,
                    self.wait_event,
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
                .map_err(drv("cuStreamWaitEvent"))
            }
        })
    }

    /// Records an event after everything enqueued so far and returns its handle, to poll
    /// (`NcclComm::wait`) instead of blocking in a stream synchronisation.
    pub fn record_done(&self) -> Result<u64> {
        guarded(|| {
            self.bind()?;
            // SAFETY: our event and stream.
            unsafe { cu::event::record(self.done_event, self.stream) }
                .map_err(drv("cuEventRecord"))?;
            Ok(self.done_event as u64)
        })
    }

    /// A new stream on this GPU's context; `high_priority` gives it the device's greatest
    /// priority, so that its small kernels (NCCL's) are scheduled ahead of a long diff.
    pub fn new_stream(&self, high_priority: bool) -> Result<GpuStream> {
        guarded(|| {
            self.bind()?;
            let priority = if high_priority {
                cu::stream::get_priority_range()
                    .map_err(drv("cuCtxGetStreamPriorityRange"))?
                    .1
            } else {
                0
            };
            let stream =
                cu::stream::create_with_priority(cu::stream::StreamKind::NonBlocking, priority)
                    .map_err(drv("cuStreamCreateWithPriority"))?;
            Ok(GpuStream {
                stream,
                ctx: self.ctx,
            })
        })
    }

    /// A new event (no timing) on this GPU's context.
    pub fn new_event(&self) -> Result<GpuEvent> {
        guarded(|| {
            self.bind()?;
            let event = cu::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map_err(drv("cuEventCreate"))?;
            Ok(GpuEvent {
                event,
                ctx: self.ctx,
            })
        })
    }

    /// Records `event` after everything enqueued so far on `stream` (0: this GPU's own).
    ///
    /// # Safety
    /// `stream` must be a live stream of this GPU's context, or 0.
    pub unsafe fn record_event(&self, event: &GpuEvent, stream: u64) -> Result<()> {
        guarded(|| {
            self.bind()?;
            let stream = if stream == 0 {
                self.stream
            } else {
                stream as sys::CUstream
            };
            // SAFETY: per this function's contract; the event is alive (borrowed).
            unsafe { cu::event::record(event.event, stream) }.map_err(drv("cuEventRecord"))
        })
    }

    /// Makes `stream` (0: this GPU's own) wait, on the device, for the last record of
    /// `event`.
    ///
    /// # Safety
    /// As [`Gpu::record_event`].
    pub unsafe fn stream_wait_event(&self, stream: u64, event: &GpuEvent) -> Result<()> {
        guarded(|| {
            self.bind()?;
            let stream = if stream == 0 {
                self.stream
            } else {
                stream as sys::CUstream
            };
            // SAFETY: per this function's contract; the event is alive (borrowed).
            unsafe {
                cu::stream::wait_event(
                    stream,
                    event.event,
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
            }
            .map_err(drv("cuStreamWaitEvent"))
        })
    }

    fn bind(&self) -> Result<()> {
        // SAFETY: `ctx` is a retained primary context.
        unsafe { cu::ctx::set_current(self.ctx) }.map_err(drv("cuCtxSetCurrent"))
    }

    fn func(&self, name: &'static str) -> sys::CUfunction {
        self.funcs[name]
    }

    fn launch(&self, name: &'static str, grid: u64, block: u32, mut args: Args) -> Result<()> {
        if grid == 0 {
            return Ok(());
        }
        let grid = u32::try_from(grid)
            .ok()
            .filter(|&g| g < (1 << 31))
            .ok_or_else(|| CudaError::InvalidArgument(format!("grid of {grid} blocks")))?;
        let mut ptrs = args.ptrs();
        // SAFETY: the kernel's parameters match `args` in number and size (each launch site
        // follows its kernel's signature); the pointers in them are the caller's promise.
        unsafe {
            cu::launch_kernel(
                self.func(name),
                (grid, 1, 1),
                (block, 1, 1),
                0,
                self.stream,
                &mut ptrs,
            )
        }
        .map_err(drv(name))
    }

    fn sync(&self) -> Result<()> {
        // SAFETY: our stream.
        unsafe { cu::stream::synchronize(self.stream) }.map_err(drv("cuStreamSynchronize"))
    }

    /// Waits for everything enqueued so far.
    pub fn synchronize(&self) -> Result<()> {
        guarded(|| {
            self.bind()?;
            self.sync()
        })
    }

    /// A new device allocation of `len` bytes (contents undefined).
    pub fn alloc(&self, len: usize) -> Result<DeviceBuffer> {
        guarded(|| {
            self.bind()?;
            let ptr = if len == 0 {
                0
            } else {
                // SAFETY: plain allocation in the bound context.
                unsafe { cu::malloc_sync(len) }.map_err(drv("cuMemAlloc"))?
            };
            Ok(DeviceBuffer {
                ptr,
                len,
                ctx: self.ctx,
            })
        })
    }

    /// `len` bytes of page-locked host memory mapped into this device (zeroed): see
    /// [`HostBuffer`]. Pinning is slow (about a second per few GB) and takes host RAM that
    /// cannot be swapped; allocate once.
    pub fn alloc_pinned(&self, len: usize) -> Result<HostBuffer> {
        guarded(|| {
            self.bind()?;
            let mut buf = HostBuffer {
                host: std::ptr::null_mut(),
                dev: 0,
                len,
                ctx: self.ctx,
            };
            if len == 0 {
                return Ok(buf);
            }
            let flags = sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE;
            // SAFETY: plain allocation in the bound context; `buf` frees it (drop) from here on.
            buf.host =
                unsafe { cu::malloc_host(len, flags) }.map_err(drv("cuMemHostAlloc"))? as *mut u8;
            let mut dev: sys::CUdeviceptr = 0;
            // SAFETY: `buf.host` was just allocated with DEVICEMAP in the bound context; the
            // flags argument must be 0.
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, buf.host as *mut c_void, 0) }
                .result()
                .map_err(drv("cuMemHostGetDevicePointer"))?;
            buf.dev = dev;
            // The contents of a new allocation are undefined: zero them, so that the host
            // never reads uninitialised bytes.
            buf.as_mut_slice().fill(0);
            Ok(buf)
        })
    }

    /// A new zeroed allocation.
    pub fn alloc_zeroed(&self, len: usize) -> Result<DeviceBuffer> {
        let buf = self.alloc(len)?;
        // SAFETY: the whole new allocation.
        unsafe { self.memset(buf.ptr(), 0, len)? };
        Ok(buf)
    }

    /// A new allocation holding `data`.
    pub fn upload(&self, data: &[u8]) -> Result<DeviceBuffer> {
        let buf = self.alloc(data.len())?;
        // SAFETY: the new allocation is `data.len()` bytes.
        unsafe { self.copy_to_device(buf.ptr(), data)? };
        Ok(buf)
    }

    /// Copies `data` to `dst` (synchronous with respect to the host).
    ///
    /// # Safety
    /// `dst` must be valid for `data.len()` bytes.
    pub unsafe fn copy_to_device(&self, dst: DevicePtr, data: &[u8]) -> Result<()> {
        guarded(|| {
            self.bind()?;
            if data.is_empty() {
                return Ok(());
            }
            // SAFETY: per this function's contract; a copy from pageable memory is staged
            // before the call returns, and the stream is synchronised anyway.
            unsafe { cu::memcpy_htod_async(dst, data, self.stream) }
                .map_err(drv("cuMemcpyHtoD"))?;
            self.sync()
        })
    }

    /// Copies `len` bytes at `src` back to the host (after everything enqueued before).
    ///
    /// # Safety
    /// `src` must be valid for `len` bytes.
    pub unsafe fn download(&self, src: DevicePtr, len: usize) -> Result<Vec<u8>> {
        let mut out = vec![0u8; len];
        // SAFETY: per this function's contract.
        unsafe { self.download_into(src, &mut out)? };
        Ok(out)
    }

    /// Copies `out.len()` bytes at `src` into `out`.
    ///
    /// # Safety
    /// `src` must be valid for `out.len()` bytes.
    pub unsafe fn download_into(&self, src: DevicePtr, out: &mut [u8]) -> Result<()> {
        guarded(|| {
            self.bind()?;
            if out.is_empty() {
                return self.sync();
            }
            if out.len() <= STAGED_DOWNLOAD_MAX {
                // SAFETY: per this function's contract.
                return unsafe { self.download_staged(src, out) };
            }
            // SAFETY: per this function's contract; synchronised before `out` is used.
            unsafe { cu::memcpy_dtoh_async(out, src, self.stream) }.map_err(drv("cuMemcpyDtoH"))?;
            self.sync()
        })
    }

    /// Copies `out.len()` bytes at `src` into `out` through this GPU's pinned staging
    /// buffer. A copy into pageable memory that waits for a long kernel holds up the pageable
    /// copies of every other stream of the context until it completes (measured: the staged
    /// sync's encoding waited for the next stage's whole diff); one into pinned memory does
    /// not.
    ///
    /// # Safety
    /// `src` must be valid for `out.len()` bytes.
    unsafe fn download_staged(&self, src: DevicePtr, out: &mut [u8]) -> Result<()> {
        let len = out.len();
        let mut staging = self
            .download_staging
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if staging.as_ref().is_none_or(|h| h.len() < len) {
            *staging = None;
            *staging = Some(self.alloc_pinned(len.next_power_of_two().max(4096))?);
        }
        let Some(host) = staging.as_ref() else {
            return Err(CudaError::InvalidArgument("no staging buffer".into()));
        };
        // SAFETY: `host` holds at least `len` bytes of page-locked memory; `src` per this
        // function's contract; the stream is synchronised before the host reads it.
        unsafe { sys::cuMemcpyDtoHAsync_v2(host.host_ptr() as *mut c_void, src, len, self.stream) }
            .result()
            .map_err(drv("cuMemcpyDtoH"))?;
        self.sync()?;
        out.copy_from_slice(&host.as_slice()[..len]);
        Ok(())
    }

    fn download_typed<T: Copy + Default>(&self, src: DevicePtr, n: usize) -> Result<Vec<T>> {
        let mut out = vec![T::default(); n];
        if n == 0 {
            return Ok(out);
        }
        let bytes = n * std::mem::size_of::<T>();
        if bytes <= STAGED_DOWNLOAD_MAX {
            let mut raw = vec![0u8; bytes];
            // SAFETY: callers pass buffers of `n` values of T that they allocated themselves.
            unsafe { self.download_staged(src, &mut raw)? };
            // SAFETY: T is plain old data (repr(C) structs of integers, or integers: every
            // bit pattern is a value), and `raw` holds exactly `n` of them.
            unsafe {
                std::ptr::copy_nonoverlapping(raw.as_ptr(), out.as_mut_ptr() as *mut u8, bytes)
            };
            return Ok(out);
        }
        // SAFETY: callers pass buffers of `n` values of T (plain-old-data repr(C) structs or
        // integers) that they allocated themselves.
        unsafe { cu::memcpy_dtoh_async(&mut out, src, self.stream) }
            .map_err(drv("cuMemcpyDtoH"))?;
        self.sync()?;
        Ok(out)
    }

    fn upload_typed<T: Copy>(&self, dst: DevicePtr, data: &[T]) -> Result<()> {
        if data.is_empty() {
            return Ok(());
        }
        // SAFETY: callers pass a scratch region sized for `data`; pageable memory is staged
        // before the call returns.
        unsafe { cu::memcpy_htod_async(dst, data, self.stream) }.map_err(drv("cuMemcpyHtoD"))
    }

    /// Sets `len` bytes at `dst` to `value` (enqueued).
    ///
    /// # Safety
    /// `dst` must be valid for `len` bytes.
    pub unsafe fn memset(&self, dst: DevicePtr, value: u8, len: usize) -> Result<()> {
        guarded(|| {
            self.bind()?;
            if len == 0 {
                return Ok(());
            }
            // SAFETY: per this function's contract.
            unsafe { cu::memset_d8_async(dst, value, len, self.stream) }.map_err(drv("cuMemsetD8"))
        })
    }

    /// Device-to-device copy of `len` bytes (enqueued): `cuMemcpyDtoDAsync`.
    ///
    /// # Safety
    /// Both pointers must be valid for `len` bytes.
    pub unsafe fn copy_device(&self, dst: DevicePtr, src: DevicePtr, len: usize) -> Result<()> {
        guarded(|| {
            self.bind()?;
            if len == 0 {
                return Ok(());
            }
            // SAFETY: per this function's contract.
            unsafe { cu::memcpy_dtod_async(dst, src, len, self.stream) }
                .map_err(drv("cuMemcpyDtoD"))
        })
    }

    /// Enqueues a copy of `len` bytes of device memory at `src` into `dst` at `offset`
    /// (`cuMemcpyDtoHAsync`, at PCIe speed: `dst` is page-locked).
    ///
    /// # Safety
    /// `src` must be valid for `len` bytes; `dst` must not be read or written by the host
    /// until this GPU's stream is synchronised.
    pub unsafe fn copy_to_pinned(
        &self,
        dst: &HostBuffer,
        offset: usize,
        src: DevicePtr,
        len: usize,
    ) -> Result<()> {
        guarded(|| {
            self.bind()?;
            if offset.checked_add(len).is_none_or(|end| end > dst.len()) {
                return Err(CudaError::InvalidArgument(format!(
                    "copy of {len} bytes at {offset} into a pinned buffer of {}",
                    dst.len()
                )));
            }
            if len == 0 {
                return Ok(());
            }
            // SAFETY: inside `dst` (checked above); `src` per this function's contract; the
            // host keeps off `dst` until the stream is synchronised (contract).
            unsafe {
                sys::cuMemcpyDtoHAsync_v2(
                    dst.host_ptr().add(offset) as *mut c_void,
                    src,
                    len,
                    self.stream,
                )
            }
            .result()
            .map_err(drv("cuMemcpyDtoH"))
        })
    }

    /// Enqueues a copy of `len` bytes of `src` at `offset` to device memory at `dst`
    /// (`cuMemcpyHtoDAsync`, at PCIe speed: `src` is page-locked).
    ///
    /// # Safety
    /// `dst` must be valid for `len` bytes; the host must not write `src` until this GPU's
    /// stream is synchronised.
    pub unsafe fn copy_from_pinned(
        &self,
        dst: DevicePtr,
        src: &HostBuffer,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        guarded(|| {
            self.bind()?;
            if offset.checked_add(len).is_none_or(|end| end > src.len()) {
                return Err(CudaError::InvalidArgument(format!(
                    "copy of {len} bytes at {offset} out of a pinned buffer of {}",
                    src.len()
                )));
            }
            if len == 0 {
                return Ok(());
            }
            // SAFETY: inside `src` (checked above); `dst` per this function's contract.
            unsafe {
                sys::cuMemcpyHtoDAsync_v2(
                    dst,
                    src.host_ptr().add(offset) as *const c_void,
                    len,
                    self.stream,
                )
            }
            .result()
            .map_err(drv("cuMemcpyHtoD"))
        })
    }

    /// Device time of whatever `f` enqueues on this GPU's stream, in milliseconds (events).
    pub fn time_ms(&self, f: impl FnOnce() -> Result<()>) -> Result<f32> {
        guarded(|| {
            self.bind()?;
            // SAFETY: our events and stream.
            unsafe { cu::event::record(self.events.0, self.stream) }
                .map_err(drv("cuEventRecord"))?;
            f()?;
            self.bind()?;
            // SAFETY: as above.
            unsafe {
                cu::event::record(self.events.1, self.stream).map_err(drv("cuEventRecord"))?;
                cu::event::synchronize(self.events.1).map_err(drv("cuEventSynchronize"))?;
                cu::event::elapsed(self.events.0, self.events.1).map_err(drv("cuEventElapsedTime"))
            }
        })
    }

    /// A scratch region of at least `len` bytes, 256-aligned, valid until the guard drops.
    fn scratch(&self, len: usize) -> Result<(std::sync::MutexGuard<'_, Scratch>, DevicePtr)> {
        let mut s = self.scratch.lock().unwrap_or_else(PoisonError::into_inner);
        let len = len.max(256);
        if s.buf.as_ref().is_none_or(|b| b.len() < len) {
            // Whatever used the old buffer was synchronised before its guard dropped.
            s.buf = None;
            s.buf = Some(self.alloc(len.next_power_of_two())?);
        }
        let ptr = s.buf.as_ref().map(|b| b.ptr()).unwrap_or(0);
        Ok((s, ptr))
    }

    /// Diffs many tensors in one launch sequence (see kernels/diff.cu): compares each
    /// `current` with its `snapshot` as unsigned integers, writes the changes in order to `out`
    /// (old bits too when `out.old_values` is set), refreshes the changed snapshot elements,
    /// and adds the fused digest updates. Synchronises once, at the end, to return the
    /// per-tensor counts. When the output is too small (`!is_complete()`), only a prefix of
    /// whole tiles is written, and the snapshot and digest words are updated only in part:
    /// copy `current` over the snapshot and recompute the digests.
    ///
    /// # Safety
    /// Every pointer must be valid for its size (`numel * width` bytes for the tensors;
    /// `out` as documented on [`DiffOutput`]), snapshots must not overlap anything else, and
    /// the digest words must be valid u64.
    pub unsafe fn diff_batch(&self, inputs: &[DiffInput], out: &DiffOutput) -> Result<DiffResult> {
        // SAFETY: per this function's contract.
        unsafe { self.diff_batch_with(false, inputs, out) }
    }

    /// [`Gpu::diff_batch`] for snapshots in pinned host memory: keeps the changed vectors in
    /// registers instead of reading them a second time (which would cross PCIe).
    ///
    /// # Safety
    /// As [`Gpu::diff_batch`].
    pub unsafe fn diff_batch_host_snapshot(
        &self,
        inputs: &[DiffInput],
        out: &DiffOutput,
    ) -> Result<DiffResult> {
        // SAFETY: per this function's contract.
        unsafe { self.diff_batch_with(true, inputs, out) }
    }

    /// The batched diff's kernels: passes 1-3 (kernels/diff.cu), or the one-pass form when the
    /// tuning asks for it; `host_snapshot` picks the pass 1 that keeps vectors in registers.
    unsafe fn diff_batch_with(
        &self,
        host_snapshot: bool,
        inputs: &[DiffInput],
        out: &DiffOutput,
    ) -> Result<DiffResult> {
        guarded(|| {
            self.bind()?;
            let n = inputs.len();
            if n == 0 {
                return Ok(DiffResult::default());
            }
            let direct = self.tuning.direct;
            let tile_bytes = self.tuning.tile_bytes();
            let (order, table, tiles) = diff_table(inputs, tile_bytes)?;
            let groups = tiles.div_ceil(DIFF_GROUP);
            // Scratch: [table n*64][tile tensors tiles*4][tile counts tiles*4]
            //          [tile offsets tiles*4][group sums (groups+1)*8][result (3n+2)*8],
            //          each 8-aligned; the tiles' slots (an eighth of each tile) apart. The
            //          one-pass form: [table][tile tensors][status tiles*8][result].
            let table_len = (n * std::mem::size_of::<KDiffTensor>()) as u64;
            let tensor_of_off = table_len;
            let counts_off = tensor_of_off + (tiles * 4).next_multiple_of(8);
            let (offsets_off, groups_off, status_off, result_off) = if direct {
                let status_off = counts_off;
                (0, 0, status_off, status_off + tiles * 8)
            } else {
                let offsets_off = counts_off + (tiles * 4).next_multiple_of(8);
                let groups_off = offsets_off + (tiles * 4).next_multiple_of(8);
                (offsets_off, groups_off, 0, groups_off + (groups + 1) * 8)
            };
            let len = result_off + (3 * n as u64 + 2) * 8;
            let (_guard, base) = self.scratch(len as usize)?;
            let slots = if direct {
                None
            } else {
                Some(self.slots(tiles * (tile_bytes / 8))?)
            };
            self.upload_typed(base, &table)?;
            let start = self.events.0;
            // SAFETY: our event and stream.
            unsafe { cu::event::record(start, self.stream) }.map_err(drv("cuEventRecord"))?;
            self.launch(
                "dc_diff_tile_tensor",
                tiles.div_ceil(THREADS as u64).min(MAX_GRID),
                THREADS,
                Args::new()
                    .push(base)
                    .push(n as u64)
                    .push(tiles)
                    .push(base + tensor_of_off)
                    .push(if direct { base + status_off } else { 0 }),
            )?;
            if let Some((_, slots)) = &slots {
                self.launch(
                    if host_snapshot {
                        "dc_diff_resident"
                    } else {
                        "dc_diff"
                    },
                    tiles,
                    DIFF_THREADS,
                    Args::new()
                        .push(base)
                        .push(base + tensor_of_off)
                        .push(base + counts_off)
                        .push(*slots)
                        .push(out.old_values.is_some() as u64),
                )?;
                self.launch(
                    "dc_diff_scan_tiles",
                    groups,
                    DIFF_THREADS,
                    Args::new()
                        .push(base + counts_off)
                        .push(tiles)
                        .push(base + offsets_off)
                        .push(base + groups_off),
                )?;
                self.launch(
                    "dc_diff_scan_groups",
                    1,
                    1024,
                    Args::new().push(base + groups_off).push(groups),
                )?;
                // A warp per tile.
                self.launch(
                    "dc_diff_place",
                    tiles.div_ceil((DIFF_THREADS / 32) as u64),
                    DIFF_THREADS,
                    Args::new()
                        .push(base)
                        .push(base + tensor_of_off)
                        .push(tiles)
                        .push(base + counts_off)
                        .push(*slots)
                        .push(base + offsets_off)
                        .push(base + groups_off)
                        .push_output(out),
                )?;
                self.launch(
                    "dc_diff_finish",
                    (n as u64).div_ceil(THREADS as u64).min(MAX_GRID),
                    THREADS,
                    Args::new()
                        .push(base)
                        .push(n as u64)
                        .push(base + offsets_off)
                        .push(base + groups_off)
                        .push(tiles)
                        .push(out.capacity)
                        .push(base + result_off),
                )?;
            } else {
                self.launch(
                    if host_snapshot {
                        "dc_diff_resident_direct"
                    } else {
                        "dc_diff_direct"
                    },
                    tiles,
                    DIFF_THREADS,
                    Args::new()
                        .push(base)
                        .push(base + tensor_of_off)
                        .push(base + status_off)
                        .push_output(out),
                )?;
                self.launch(
                    "dc_diff_finish_direct",
                    (n as u64).div_ceil(THREADS as u64).min(MAX_GRID),
                    THREADS,
                    Args::new()
                        .push(base)
                        .push(n as u64)
                        .push(base + status_off)
                        .push(tiles)
                        .push(out.capacity)
                        .push(base + result_off),
                )?;
            }
            // SAFETY: our event and stream.
            unsafe { cu::event::record(self.events.1, self.stream) }
                .map_err(drv("cuEventRecord"))?;
            let raw: Vec<u64> = self.download_typed(base + result_off, 3 * n + 2)?;
            drop(slots);
            // SAFETY: both events were recorded and the stream synchronised.
            let kernel_ms = unsafe { cu::event::elapsed(start, self.events.1) }
                .map_err(drv("cuEventElapsedTime"))?;
            Ok(diff_results(inputs, &order, &raw, kernel_ms))
        })
    }

    /// Bytes held by the diff's per-tile slots (0 before the first diff).
    pub fn large_scratch_bytes(&self) -> u64 {
        let m = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        m.buf.as_ref().map_or(0, |b| b.len() as u64)
    }

    /// The diff's per-tile slots, at least `len` bytes, valid until the guard drops (sized to
    /// what is asked, not a power of two: it is large).
    fn slots(&self, len: u64) -> Result<(std::sync::MutexGuard<'_, Scratch>, DevicePtr)> {
        let mut m = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let len = (len.max(256) as usize).next_multiple_of(1 << 20);
        if m.buf.as_ref().is_none_or(|b| b.len() < len) {
            m.buf = None;
            m.buf = Some(self.alloc(len)?);
        }
        let ptr = m.buf.as_ref().map(|b| b.ptr()).unwrap_or(0);
        Ok((m, ptr))
    }

    /// Bytes the bitmap buffer of [`Gpu::encode_positions`] needs for these inputs.
    pub fn bitmap_bytes(inputs: &[EncodeInput], chunk_elems: u64) -> u64 {
        cells(inputs, chunk_elems)
            .map(|c| c.1.end - c.1.begin)
            .map(|len| len.div_ceil(8).next_multiple_of(8))
            .sum()
    }

    /// Forms the core's chunks (grid cells of `chunk_elems`, tightened to their changes) over
    /// sorted change lists and writes their position sections: abs32 (`u32` per change, at the
    /// change's index) into `abs32_out`, and/or bitmaps into `bitmap_out` (zeroed here first;
    /// [`Gpu::bitmap_bytes`] long). Returns the non-empty chunks in order.
    ///
    /// # Safety
    /// `positions` must hold every listed change (u64); `abs32_out` one u32 per change index
    /// used; `bitmap_out` `bitmap_bytes(inputs, chunk_elems)` bytes, 8-byte aligned.
    pub unsafe fn encode_positions(
        &self,
        positions: DevicePtr,
        inputs: &[EncodeInput],
        chunk_elems: u64,
        abs32_out: Option<DevicePtr>,
        bitmap_out: Option<DevicePtr>,
    ) -> Result<Vec<GridChunk>> {
        guarded(|| {
            self.bind()?;
            if chunk_elems == 0 || chunk_elems > u32::MAX as u64 {
                return Err(CudaError::InvalidArgument(format!(
                    "chunk size {chunk_elems} outside 1..=2^32-1"
                )));
            }
            if bitmap_out.is_some_and(|p| p % 8 != 0) || abs32_out.is_some_and(|p| p % 4 != 0) {
                return Err(CudaError::InvalidArgument("misaligned output".into()));
            }
            let list: Vec<(usize, KEncodeCell)> = cells(inputs, chunk_elems).collect();
            let nc = list.len();
            if nc == 0 {
                return Ok(Vec::new());
            }
            let table: Vec<KEncodeCell> = list.iter().map(|c| c.1).collect();
            let table_len = (nc * std::mem::size_of::<KEncodeCell>()) as u64;
            let out_len = (nc * std::mem::size_of::<KEncodedCell>()) as u64;
            let (_guard, base) = self.scratch((table_len + out_len) as usize)?;
            self.upload_typed(base, &table)?;
            if let Some(bm) = bitmap_out {
                let bytes = Self::bitmap_bytes(inputs, chunk_elems);
                // SAFETY: per this function's contract.
                unsafe { cu::memset_d8_async(bm, 0, bytes as usize, self.stream) }
                    .map_err(drv("cuMemsetD8"))?;
            }
            self.launch(
                "dc_encode_cells",
                (nc as u64).min(MAX_GRID),
                THREADS,
                Args::new()
                    .push(base)
                    .push(nc as u64)
                    .push(positions)
                    .push(base + table_len)
                    .push(abs32_out.unwrap_or(0))
                    .push(bitmap_out.unwrap_or(0)),
            )?;
            let got: Vec<KEncodedCell> = self.download_typed(base + table_len, nc)?;
            let mut seen = vec![0u64; inputs.len()];
            let mut chunks = Vec::new();
            for ((input, cell), r) in list.iter().zip(&got) {
                seen[*input] += r.count;
                if r.count > 0 {
                    chunks.push(GridChunk {
                        input: *input,
                        lo: r.lo,
                        count: r.count,
                        start: r.start,
                        range: r.range,
                        bitmap_offset: cell.bitmap_off,
                    });
                }
            }
            for (i, (s, t)) in seen.iter().zip(inputs).enumerate() {
                if *s != t.change_count {
                    return Err(CudaError::InvalidArgument(format!(
                        "input {i}: {} of {} changes lie in its range (unsorted or out of range)",
                        s, t.change_count
                    )));
                }
            }
            Ok(chunks)
        })
    }

    /// Writes each chunk's position section, in the codec chosen for it, at `dst` (abs32:
    /// `count` u32; bitmap: `ceil(range / 32)` u32 words, zeroed here first), from the sorted
    /// positions at `positions` (u64). The chunks are what [`Gpu::encode_positions`] returned
    /// (run with no outputs, it only counts). Synchronises once.
    ///
    /// # Safety
    /// `positions` must hold every chunk's changes; each `dst` must be 4-byte aligned device
    /// memory with room for its section rounded up to whole words, disjoint from the others.
    pub unsafe fn encode_place(
        &self,
        positions: DevicePtr,
        chunks: &[(GridChunk, ApplyPositions, DevicePtr)],
    ) -> Result<()> {
        guarded(|| {
            self.bind()?;
            let mut table = Vec::with_capacity(chunks.len());
            for (c, codec, dst) in chunks {
                if dst % 4 != 0 || c.count == 0 || c.range == 0 || c.range > u32::MAX as u64 {
                    return Err(CudaError::InvalidArgument(
                        "encode_place: unaligned output or empty chunk".into(),
                    ));
                }
                let codec = match codec {
                    ApplyPositions::Abs32 => 1,
                    ApplyPositions::Bitmap => 3,
                    ApplyPositions::All => {
                        return Err(CudaError::InvalidArgument(
                            "encode_place: `all` has no position section".into(),
                        ))
                    }
                };
                table.push(KPlaceCell {
                    lo: c.lo,
                    count: c.count,
                    start: c.start,
                    range: c.range,
                    dst: *dst,
                    codec,
                    pad: 0,
                });
            }
            if table.is_empty() {
                return Ok(());
            }
            let len = table.len() * std::mem::size_of::<KPlaceCell>();
            let (_guard, base) = self.scratch(len)?;
            self.upload_typed(base, &table)?;
            self.launch(
                "dc_encode_place",
                (table.len() as u64).min(MAX_GRID),
                THREADS,
                Args::new()
                    .push(base)
                    .push(table.len() as u64)
                    .push(positions),
            )?;
            self.sync()
        })
    }

    /// Checks a batch of chunks on the GPU without writing anything: section lengths and
    /// alignment (host), then contents and digest changes (kernel). `seed` selects the seed
    /// digest (Σ h(new)) over the delta one (Σ h(new) − h(old), and new ≠ held).
    /// `num_slots` sizes [`ApplyCheck::digest_change`]. Synchronises once.
    ///
    /// # Safety
    /// Every pointer must be valid for the lengths given (slots: `slot_numel * width`).
    pub unsafe fn apply_check(
        &self,
        chunks: &[ApplyInput],
        seed: bool,
        num_slots: usize,
    ) -> Result<ApplyCheck> {
        guarded(|| {
            self.bind()?;
            let (table, owner) = apply_table(chunks, seed, num_slots)?;
            let n = table.len();
            let t_len = (n * std::mem::size_of::<KApplyChunk>()) as u64;
            let e_off = t_len.next_multiple_of(8);
            let d_off = e_off + (n as u64 * 4).next_multiple_of(8);
            let len = d_off + num_slots as u64 * 8;
            let (_guard, base) = self.scratch(len as usize)?;
            self.upload_typed(base, &table)?;
            // SAFETY: inside the scratch region.
            unsafe { cu::memset_d8_async(base + e_off, 0, (len - e_off) as usize, self.stream) }
                .map_err(drv("cuMemsetD8"))?;
            self.launch(
                "dc_apply_check",
                (n as u64).min(MAX_GRID),
                THREADS,
                Args::new()
                    .push(base)
                    .push(n as u64)
                    .push(base + e_off)
                    .push(base + d_off),
            )?;
            let codes: Vec<u32> = self.download_typed(base + e_off, n)?;
            let digest_change: Vec<u64> = self.download_typed(base + d_off, num_slots)?;
            let mut errors: Vec<ChunkError> = codes
                .iter()
                .zip(&owner)
                .filter(|(&c, _)| c != 0)
                .map(|(&c, &chunk)| ChunkError {
                    chunk,
                    reason: apply_error_reason(c),
                })
                .collect();
            // One error per chunk (a chunk's entries may each have found one).
            errors.dedup_by_key(|e| e.chunk);
            Ok(ApplyCheck {
                digest_change,
                errors,
            })
        })
    }

    /// Writes the chunks' new bits into their slots (no digest, no content checks beyond
    /// staying inside each chunk): call it only after [`Gpu::apply_check`] passed.
    /// Synchronises once.
    ///
    /// # Safety
    /// As [`Gpu::apply_check`]; the slots are written.
    pub unsafe fn apply_scatter(&self, chunks: &[ApplyInput]) -> Result<()> {
        // SAFETY: per this function's contract.
        unsafe { self.scatter(chunks, None) }
    }

    /// [`Gpu::apply_scatter`], saving first the bits each change overwrites into `journal`
    /// (laid out by [`journal_layout`]), so that [`Gpu::apply_undo`] can put them back.
    ///
    /// # Safety
    /// As [`Gpu::apply_scatter`]; `journal` must be valid for `journal_layout(chunks).1`
    /// bytes, 4-aligned.
    pub unsafe fn apply_scatter_journaled(
        &self,
        chunks: &[ApplyInput],
        journal: DevicePtr,
    ) -> Result<()> {
        // SAFETY: per this function's contract.
        unsafe { self.scatter(chunks, Some(journal)) }
    }

    /// Undoes [`Gpu::apply_scatter_journaled`] of the same chunks: writes the journal's old
    /// bits back. Undo stages in the reverse order of their scatters.
    ///
    /// # Safety
    /// As [`Gpu::apply_scatter_journaled`], with the journal that scatter filled.
    pub unsafe fn apply_undo(&self, chunks: &[ApplyInput], journal: DevicePtr) -> Result<()> {
        let (offsets, _) = journal_layout(chunks);
        let back: Vec<ApplyInput> = chunks
            .iter()
            .zip(offsets)
            .map(|(c, off)| ApplyInput {
                val_section: journal + off,
                val_len: c.count * c.width as u64,
                ..*c
            })
            .collect();
        // SAFETY: per this function's contract (each chunk's old bits at its offset).
        unsafe { self.scatter(&back, None) }
    }

    unsafe fn scatter(&self, chunks: &[ApplyInput], journal: Option<DevicePtr>) -> Result<()> {
        guarded(|| {
            self.bind()?;
            let (mut table, owner) = apply_table(chunks, false, usize::MAX)?;
            if let Some(base) = journal {
                if base % 4 != 0 {
                    return Err(CudaError::InvalidArgument(
                        "journal not 4-byte aligned".into(),
                    ));
                }
                let (offsets, _) = journal_layout(chunks);
                for (entry, &i) in table.iter_mut().zip(&owner) {
                    entry.journal = base + offsets[i];
                }
            }
            let n = table.len();
            let t_len = (n * std::mem::size_of::<KApplyChunk>()) as u64;
            let e_off = t_len.next_multiple_of(8);
            let len = e_off + n as u64 * 4;
            let (_guard, base) = self.scratch(len as usize)?;
            self.upload_typed(base, &table)?;
            // SAFETY: inside the scratch region.
            unsafe { cu::memset_d8_async(base + e_off, 0, n * 4, self.stream) }
                .map_err(drv("cuMemsetD8"))?;
            self.launch(
                "dc_apply_scatter",
                (n as u64).min(MAX_GRID),
                THREADS,
                Args::new().push(base).push(n as u64).push(base + e_off),
            )?;
            self.sync()
        })
    }

    /// The receiver's whole step for one staged sync: check every chunk, compute the new
    /// digests from the bits held (`held[slot]` plus the changes; a seed's from the values
    /// alone), compare them with the sender's `expected`, and only then scatter. On any
    /// failure nothing is written. Returns the new digests.
    ///
    /// # Safety
    /// As [`Gpu::apply_check`].
    pub unsafe fn apply_verified(
        &self,
        chunks: &[ApplyInput],
        seed: bool,
        held: &[u64],
        expected: &[u64],
    ) -> Result<Vec<u64>> {
        // SAFETY: per this function's contract.
        unsafe { self.verified(chunks, seed, held, expected, None) }
    }

    /// [`Gpu::apply_verified`] of a delta whose scatter saves the overwritten bits into
    /// `journal` (see [`Gpu::apply_scatter_journaled`]), for a staged sync that may have to
    /// undo it when a later stage fails.
    ///
    /// # Safety
    /// As [`Gpu::apply_scatter_journaled`].
    pub unsafe fn apply_verified_journaled(
        &self,
        chunks: &[ApplyInput],
        held: &[u64],
        expected: &[u64],
        journal: DevicePtr,
    ) -> Result<Vec<u64>> {
        // SAFETY: per this function's contract.
        unsafe { self.verified(chunks, false, held, expected, Some(journal)) }
    }

    unsafe fn verified(
        &self,
        chunks: &[ApplyInput],
        seed: bool,
        held: &[u64],
        expected: &[u64],
        journal: Option<DevicePtr>,
    ) -> Result<Vec<u64>> {
        if held.len() != expected.len() {
            return Err(CudaError::InvalidArgument(
                "held and expected digests differ in length".into(),
            ));
        }
        // SAFETY: per this function's contract.
        let check = unsafe { self.apply_check(chunks, seed, expected.len())? };
        if let Some(e) = check.errors.first() {
            return Err(CudaError::BadChunk {
                chunk: e.chunk,
                reason: e.reason,
            });
        }
        let new: Vec<u64> = check
            .digest_change
            .iter()
            .zip(held)
            .map(|(&d, &h)| if seed { d } else { h.wrapping_add(d) })
            .collect();
        for (slot, (&a, &e)) in new.iter().zip(expected).enumerate() {
            if a != e {
                return Err(CudaError::DigestMismatch {
                    slot: slot as u32,
                    expected: e,
                    actual: a,
                });
            }
        }
        // SAFETY: per this function's contract; every chunk checked clean.
        unsafe { self.scatter(chunks, journal)? };
        Ok(new)
    }

    /// The digest of each input (`Σ h(slot, first_index + k, bits_k)`), all in one launch.
    ///
    /// # Safety
    /// Every `ptr` must be valid for `numel * width` bytes, aligned to the width.
    pub unsafe fn digest(&self, inputs: &[DigestInput]) -> Result<Vec<u64>> {
        guarded(|| {
            self.bind()?;
            let n = inputs.len();
            if n == 0 {
                return Ok(Vec::new());
            }
            let t_len = (n * std::mem::size_of::<KDigestTensor>()) as u64;
            let (_guard, base) = self.scratch((t_len + n as u64 * 8) as usize)?;
            let out = base + t_len;
            let mut table = Vec::with_capacity(n);
            let mut blocks = 0u64;
            for (i, t) in inputs.iter().enumerate() {
                if !matches!(t.width, 1 | 2 | 4) || (t.numel > 0 && t.ptr % t.width as u64 != 0) {
                    return Err(CudaError::InvalidArgument(format!(
                        "input {i}: width {} or alignment",
                        t.width
                    )));
                }
                table.push(KDigestTensor {
                    ptr: t.ptr,
                    numel: t.numel,
                    first_index: t.first_index,
                    salt: slot_salt(t.slot),
                    block_begin: blocks,
                    out: out + i as u64 * 8,
                    width: t.width as u32,
                    pad: 0,
                });
                blocks += t.numel.div_ceil(DIGEST_BLOCK_ELEMS);
            }
            self.upload_typed(base, &table)?;
            // SAFETY: inside the scratch region.
            unsafe { cu::memset_d8_async(out, 0, n * 8, self.stream) }
                .map_err(drv("cuMemsetD8"))?;
            self.launch(
                "dc_digest",
                blocks.min(MAX_GRID * 4),
                THREADS,
                Args::new().push(base).push(n as u64).push(blocks),
            )?;
            self.download_typed(out, n)
        })
    }

    /// The O(changed) digest update of each run of changes laid out as [`Gpu::diff_batch`]
    /// writes them: `Σ h(new) − h(old)` (wrapping).
    ///
    /// # Safety
    /// `positions`, `new_values` and `old_values` must hold every listed change.
    pub unsafe fn digest_update(
        &self,
        positions: DevicePtr,
        new_values: DevicePtr,
        old_values: DevicePtr,
        inputs: &[UpdateInput],
    ) -> Result<Vec<u64>> {
        guarded(|| {
            self.bind()?;
            let n = inputs.len();
            if n == 0 {
                return Ok(Vec::new());
            }
            let t_len = (n * std::mem::size_of::<KUpdateSeg>()) as u64;
            let (_guard, base) = self.scratch((t_len + n as u64 * 8) as usize)?;
            let out = base + t_len;
            let mut table = Vec::with_capacity(n);
            let mut blocks = 0u64;
            for (i, s) in inputs.iter().enumerate() {
                if !matches!(s.width, 1 | 2 | 4) {
                    return Err(CudaError::InvalidArgument(format!(
                        "input {i}: width {}",
                        s.width
                    )));
                }
                table.push(KUpdateSeg {
                    chg_off: s.change_offset,
                    chg_cnt: s.change_count,
                    salt: slot_salt(s.slot),
                    block_begin: blocks,
                    out: out + i as u64 * 8,
                    width: s.width as u32,
                    pad: 0,
                });
                blocks += s.change_count.div_ceil(DIGEST_BLOCK_ELEMS);
            }
            self.upload_typed(base, &table)?;
            // SAFETY: inside the scratch region.
            unsafe { cu::memset_d8_async(out, 0, n * 8, self.stream) }
                .map_err(drv("cuMemsetD8"))?;
            self.launch(
                "dc_digest_update",
                blocks.min(MAX_GRID * 4),
                THREADS,
                Args::new()
                    .push(base)
                    .push(n as u64)
                    .push(blocks)
                    .push(positions)
                    .push(new_values)
                    .push(old_values),
            )?;
            self.download_typed(out, n)
        })
    }
}

impl Drop for Gpu {
    fn drop(&mut self) {
        let _ = guarded(|| {
            self.bind()?;
            // SAFETY: our own handles, released once.
            unsafe {
                let _ = cu::stream::synchronize(self.stream);
                self.scratch
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .buf = None;
                self.slots
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .buf = None;
                *self
                    .download_staging
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = None;
                for &m in &self.modules {
                    let _ = cu::module::unload(m);
                }
                if !self.events.0.is_null() {
                    let _ = cu::event::destroy(self.events.0);
                }
                for e in [self.events.1, self.wait_event, self.done_event] {
                    if !e.is_null() {
                        let _ = cu::event::destroy(e);
                    }
                }
                if !self.stream.is_null() {
                    let _ = cu::stream::destroy(self.stream);
                }
                let _ = cu::primary_ctx::release(self.device);
            }
            Ok(())
        });
    }
}

/// Checks a diff batch and builds the kernel table: tensors ordered by non-decreasing width
/// (so value ranges at `g * width` never overlap), tiles numbered globally. Returns (order,
/// table, number of tiles).
fn diff_table(
    inputs: &[DiffInput],
    tile_bytes: u64,
) -> Result<(Vec<usize>, Vec<KDiffTensor>, u64)> {
    let n = inputs.len();
    if n >= u32::MAX as usize {
        return Err(CudaError::InvalidArgument("too many tensors".into()));
    }
    for (i, t) in inputs.iter().enumerate() {
        if !matches!(t.width, 1 | 2 | 4) {
            return Err(CudaError::InvalidArgument(format!(
                "tensor {i}: width {} (1, 2 or 4)",
                t.width
            )));
        }
        let w = t.width as u64;
        if t.numel.checked_mul(w).is_none() || t.first_index.checked_add(t.numel).is_none() {
            return Err(CudaError::InvalidArgument(format!(
                "tensor {i}: size overflows"
            )));
        }
        if t.numel > 0 && (t.snapshot % w != 0 || t.current % w != 0) {
            return Err(CudaError::InvalidArgument(format!(
                "tensor {i}: pointers not aligned to the element width {w}"
            )));
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| inputs[i].width);
    let mut table = Vec::with_capacity(n);
    let mut tiles = 0u64;
    for &i in &order {
        let t = &inputs[i];
        let nbytes = t.numel * t.width as u64;
        let (digest_out, salt) = match t.digest {
            Some((ptr, slot)) => (ptr, slot_salt(slot)),
            None => (0, 0),
        };
        table.push(KDiffTensor {
            snap: t.snapshot,
            cur: t.current,
            nbytes,
            first_index: t.first_index,
            tile_begin: tiles,
            digest_out,
            salt,
            width: t.width as u32,
            aligned16: (t.snapshot | t.current).is_multiple_of(16) as u32,
        });
        tiles += nbytes.div_ceil(tile_bytes);
    }
    if tiles >= (1 << 31) {
        return Err(CudaError::InvalidArgument(format!(
            "batch of {tiles} tiles; split it (at most 2^31 tiles of {tile_bytes} B)"
        )));
    }
    Ok((order, table, tiles))
}

/// The per-tensor results of a diff, from the finishing kernel's words, in input order.
fn diff_results(inputs: &[DiffInput], order: &[usize], raw: &[u64], kernel_ms: f32) -> DiffResult {
    let n = inputs.len();
    let mut tensors = vec![DiffTensorResult::default(); n];
    for (k, &i) in order.iter().enumerate() {
        let offset = raw[3 * k];
        tensors[i] = DiffTensorResult {
            offset,
            written: raw[3 * k + 1],
            found: raw[3 * k + 2],
            value_offset: offset * inputs[i].width as u64,
        };
    }
    DiffResult {
        tensors,
        found: raw[3 * n],
        written: raw[3 * n + 1],
        kernel_ms,
    }
}

/// The grid cells of every input that holds changes: (input index, cell).
fn cells(inputs: &[EncodeInput], grid: u64) -> impl Iterator<Item = (usize, KEncodeCell)> + '_ {
    let mut bitmap_off = 0u64;
    inputs
        .iter()
        .enumerate()
        .filter(move |(_, t)| t.change_count > 0 && t.numel > 0 && grid > 0)
        .flat_map(move |(i, t)| {
            let end = t.first_index + t.numel;
            let first = t.first_index / grid;
            let last = (end - 1) / grid;
            (first..=last).map(move |c| {
                (
                    i,
                    KEncodeCell {
                        begin: (c * grid).max(t.first_index),
                        end: (c * grid + grid).min(end),
                        chg_off: t.change_offset,
                        chg_cnt: t.change_count,
                        bitmap_off: 0,
                    },
                )
            })
        })
        .map(move |(i, mut c)| {
            c.bitmap_off = bitmap_off;
            bitmap_off += (c.end - c.begin).div_ceil(8).next_multiple_of(8);
            (i, c)
        })
}

/// Most changes per apply table entry of an all/abs32 chunk (a default grid cell's worth).
const APPLY_SEGMENT: u64 = 1 << 20;

/// Host-side checks of apply chunks (what `parse_frame` and the receiver check on the
/// manifest), then the kernel table: (entries, the chunk of each entry).
fn apply_table(
    chunks: &[ApplyInput],
    seed: bool,
    num_slots: usize,
) -> Result<(Vec<KApplyChunk>, Vec<usize>)> {
    let bad = |chunk: usize, reason: &'static str| CudaError::BadChunk { chunk, reason };
    let mut table = Vec::with_capacity(chunks.len());
    let mut owner = Vec::with_capacity(chunks.len());
    for (i, c) in chunks.iter().enumerate() {
        if !matches!(c.width, 1 | 2 | 4) {
            return Err(bad(i, "element width is not 1, 2 or 4"));
        }
        let w = c.width as u64;
        if (c.slot as usize) >= num_slots {
            return Err(bad(i, "slot id beyond the digest table"));
        }
        if c.range == 0 || c.range > u32::MAX as u64 || c.count == 0 || c.count > c.range {
            return Err(bad(i, "needs 1 <= count <= range <= 2^32 - 1"));
        }
        if c.start
            .checked_add(c.range)
            .is_none_or(|end| end > c.slot_numel)
        {
            return Err(bad(i, "chunk lies beyond its slot"));
        }
        if c.val_len != c.count * w {
            return Err(bad(
                i,
                "raw value section length differs from count * width",
            ));
        }
        let pos_ok = match c.positions {
            ApplyPositions::All => c.count == c.range && c.pos_len == 0,
            ApplyPositions::Abs32 => c.pos_len == c.count * 4,
            ApplyPositions::Bitmap => c.pos_len == c.range.div_ceil(8),
        };
        if !pos_ok {
            return Err(bad(i, "position section length does not fit its codec"));
        }
        if c.dst % w != 0 || c.val_section % w != 0 {
            return Err(bad(
                i,
                "slot or value section not aligned to the element width",
            ));
        }
        if c.positions != ApplyPositions::All && c.pos_section % 4 != 0 {
            return Err(bad(i, "position section not 4-byte aligned"));
        }
        let entry = KApplyChunk {
            dst: c.dst,
            pos: c.pos_section,
            val: c.val_section,
            start: c.start,
            range: c.range,
            count: c.count,
            salt: slot_salt(c.slot),
            width: c.width as u32,
            pos_codec: c.positions as u32,
            slot: c.slot,
            seed: seed as u32,
            k_begin: 0,
            k_end: c.count,
            journal: 0,
        };
        // A bitmap is decoded by one block scanning it. The changes of all/abs32 chunks are
        // independent and could be shared out between blocks, but measured slower on an H200
        // (7B delta: 9–10 ms apply with 2048 changes per block, 6.7 ms with a block per
        // chunk): APPLY_SEGMENT is kept at a whole grid cell.
        let step = if c.positions == ApplyPositions::Bitmap {
            c.count
        } else {
            APPLY_SEGMENT
        };
        let mut k = 0;
        while k < c.count {
            let end = (k + step).min(c.count);
            table.push(KApplyChunk {
                k_begin: k,
                k_end: end,
                ..entry
            });
            owner.push(i);
            k = end;
        }
    }
    Ok((table, owner))
}
