//! Loading the CUDA libraries and the kernels' PTX: every driver call guarded so that a
//! missing library is an error and never a panic, NVRTC compiling each kernel file once per
//! process for the device's architecture and the diff's tuning.

use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};

use cudarc::driver::{result as cu, sys};
use cudarc::nvrtc;

use crate::error::{CudaError, Result};
use crate::{DiffTuning, KERNELS};

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
pub(super) fn driver_present() -> Result<()> {
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
pub(super) fn ptx_for(arch: &str, tuning: DiffTuning) -> Result<Arc<Vec<(&'static str, String)>>> {
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
