//! One GPU's context: the device, its retained primary context and stream, the kernels
//! loaded from their PTX, and the launch of a kernel with its arguments.

use std::collections::HashMap;
use std::ffi::{c_void, CString};
use std::sync::{Mutex, PoisonError};

use cudarc::driver::{result as cu, sys};

use super::buffer::HostBuffer;
use super::buffer::Scratch;
use super::driver::{driver_present, drv, guarded, ptx_for};
use crate::error::{CudaError, Result};
use crate::DiffTuning;

pub(super) const THREADS: u32 = 256;

/// Most blocks a grid-stride kernel is launched with.
pub(super) const MAX_GRID: u64 = 1 << 16;

/// Kernel arguments: every value lives in a u64 slot (a u32 argument reads the low half, as
/// the host is little-endian), so the pointers handed to the driver stay put.
pub(super) struct Args {
    slots: [u64; 16],
    len: usize,
}

impl Args {
    pub(super) fn new() -> Self {
        Args {
            slots: [0; 16],
            len: 0,
        }
    }

    pub(super) fn push(mut self, v: u64) -> Self {
        self.slots[self.len] = v;
        self.len += 1;
        self
    }

    fn ptrs(&mut self) -> Vec<*mut c_void> {
        let base = self.slots.as_mut_ptr();
        // SAFETY: every index is below `len` <= 16.
        (0..self.len)
            .map(|i| unsafe { base.add(i) } as *mut c_void)
            .collect()
    }
}

/// One GPU: its primary context, a stream, the loaded kernels and some scratch memory.
pub struct Gpu {
    ordinal: usize,
    device: sys::CUdevice,
    pub(super) ctx: sys::CUcontext,
    pub(super) stream: sys::CUstream,
    modules: Vec<sys::CUmodule>,
    funcs: HashMap<&'static str, sys::CUfunction>,
    pub(super) events: (sys::CUevent, sys::CUevent),
    /// Recorded on a foreign stream (torch's) for ours to wait on.
    pub(super) wait_event: sys::CUevent,
    /// Recorded on our stream after collectives, polled by `NcclComm::wait`.
    pub(super) done_event: sys::CUevent,
    arch: String,
    name: String,
    pub(super) tuning: DiffTuning,
    sm_count: u32,
    pub(super) scratch: Mutex<Scratch>,
    /// The diff's per-tile slots (1/8 of the bytes diffed).
    pub(super) slots: Mutex<Scratch>,
    /// Page-locked memory that small downloads land in (see `download_staged`).
    pub(super) download_staging: Mutex<Option<HostBuffer>>,
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
            "dc_diff_steps",
            "dc_diff_bitmap",
        ],
    ),
    ("encode", &["dc_encode_cells", "dc_encode_place"]),
    ("apply", &["dc_apply_check", "dc_apply_scatter"]),
    (
        "digest",
        &[
            "dc_digest",
            "dc_digest_update",
            "dc_digest_refresh",
            "dc_count_sampled",
        ],
    ),
    (
        "entropy",
        &[
            "dc_code_block_chunk",
            "dc_code_size",
            "dc_code_totals",
            "dc_code_write",
            "dc_code_dirs",
            "dc_gaps_decode",
            "dc_holes_complement",
            "dc_bitmap_list",
            "dc_ulp_decode",
        ],
    ),
    ("quant", &["dc_fp8_quantize"]),
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

    /// Makes this GPU's context current on the calling thread (NCCL's communicator setup
    /// needs it).
    pub fn make_current(&self) -> Result<()> {
        guarded(|| self.bind())
    }

    pub(super) fn bind(&self) -> Result<()> {
        // SAFETY: `ctx` is a retained primary context.
        unsafe { cu::ctx::set_current(self.ctx) }.map_err(drv("cuCtxSetCurrent"))
    }

    fn func(&self, name: &'static str) -> Result<sys::CUfunction> {
        self.funcs.get(name).copied().ok_or_else(|| {
            CudaError::InvalidArgument(format!("kernel {name} is not in the loaded table"))
        })
    }

    pub(super) fn launch(
        &self,
        name: &'static str,
        grid: u64,
        block: u32,
        mut args: Args,
    ) -> Result<()> {
        if grid == 0 {
            return Ok(());
        }
        let grid = u32::try_from(grid)
            .ok()
            .filter(|&g| g < (1 << 31))
            .ok_or_else(|| CudaError::InvalidArgument(format!("grid of {grid} blocks")))?;
        let func = self.func(name)?;
        let mut ptrs = args.ptrs();
        // SAFETY: the kernel's parameters match `args` in number and size (each launch site
        // follows its kernel's signature); the pointers in them are the caller's promise.
        unsafe { cu::launch_kernel(func, (grid, 1, 1), (block, 1, 1), 0, self.stream, &mut ptrs) }
            .map_err(drv(name))
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

#[cfg(test)]
mod tests {
    use super::KERNEL_NAMES;

    #[test]
    fn every_kernel_of_every_file_is_loaded() {
        for (file, src) in crate::KERNELS {
            let defined: Vec<&str> = src
                .split("extern \"C\"")
                .skip(1)
                .filter_map(|rest| {
                    // The first `dc_` word after the qualifiers and any __launch_bounds__(..).
                    rest.split(|c: char| c.is_whitespace() || c == '(')
                        .find(|w| w.starts_with("dc_"))
                })
                .collect();
            let listed = KERNEL_NAMES
                .iter()
                .find(|(f, _)| f == file)
                .map_or(&[][..], |(_, names)| *names);
            let mut a = defined.clone();
            let mut b = listed.to_vec();
            a.sort_unstable();
            b.sort_unstable();
            assert_eq!(a, b, "kernels of {file}.cu");
        }
    }
}
