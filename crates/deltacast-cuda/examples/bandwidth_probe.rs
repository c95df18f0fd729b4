//! What a plain stream over one or two arrays reaches on this GPU, next to the batched diff on
//! the same bytes: tells the diff kernel's own costs from the memory system's.
//!
//! `bandwidth_probe [GIB] [REPS]` (default 2 GiB per array, 5 repetitions, median of
//! device-event times). Probes (examples/bandwidth_probe.cu): one array read (the read
//! roofline), two arrays compared grid-stride with 2/4/8 vectors in flight per thread, one
//! block per 16 KiB tile (the diff's launch shape), the same after a dependent load and a
//! barrier, a kernel copy; then `diff_batch` (new bits; new and old bits) at 0.1 % and 1 %.

use std::ffi::{c_void, CString};

use cudarc::driver::{result as cu, sys};
use cudarc::nvrtc;
use deltacast_cuda::{DiffInput, DiffOutput, Gpu};

const SRC: &str = include_str!("bandwidth_probe.cu");

fn median(mut v: Vec<f32>) -> f32 {
    v.sort_by(f32::total_cmp);
    v[v.len() / 2]
}

fn compile(arch: &str) -> Result<String, Box<dyn std::error::Error>> {
    let ptx = nvrtc::compile_ptx_with_opts(
        SRC,
        nvrtc::CompileOptions {
            options: vec![format!("--gpu-architecture={arch}"), "--std=c++17".into()],
            ..Default::default()
        },
    )
    .map_err(|e| format!("probe compile: {e:?}"))?;
    Ok(ptx.to_src())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("--compile-only") {
        compile("compute_90")?;
        println!("probe kernels compile for compute_90");
        return Ok(());
    }
    let gib: f64 = args.get(1).map_or(Ok(2.0), |s| s.parse())?;
    let reps: usize = args.get(2).map_or(Ok(5), |s| s.parse())?;
    let gpu = Gpu::new(0)?;
    gpu.make_current()?;
    let sms = gpu.sm_count() as u64;
    println!("device: {} ({}, {sms} SMs)", gpu.name(), gpu.arch());
    let image = CString::new(compile(gpu.arch())?)?;
    // SAFETY: a NUL-terminated PTX image, alive for the call; the context is current.
    let module = unsafe { cu::module::load_data(image.as_ptr() as *const c_void) }?;
    let func = |name: &str| -> Result<sys::CUfunction, Box<dyn std::error::Error>> {
        // SAFETY: `module` is loaded.
        Ok(unsafe { cu::module::get_function(module, CString::new(name)?) }?)
    };
    let stream = gpu.stream_handle() as sys::CUstream;
    let ev0 = cu::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)?;
    let ev1 = cu::event::create(sys::CUevent_flags::CU_EVENT_DEFAULT)?;
    // Runs `launch` reps + 1 times (the first a warm-up), the median device time in ms.
    let timed = |launch: &dyn Fn() -> Result<(), Box<dyn std::error::Error>>| -> Result<f32, Box<dyn std::error::Error>> {
        let mut t = Vec::new();
        for _ in 0..reps + 1 {
            // SAFETY: our events, the Gpu's stream.
            unsafe { cu::event::record(ev0, stream) }?;
            launch()?;
            unsafe { cu::event::record(ev1, stream) }?;
            unsafe { cu::event::synchronize(ev1) }?;
            t.push(unsafe { cu::event::elapsed(ev0, ev1) }?);
        }
        Ok(median(t[1..].to_vec()))
    };
    let launch = |name: &str, grid: u64, args: &[u64]| -> Result<(), Box<dyn std::error::Error>> {
        let f = func(name)?;
        let mut slots = args.to_vec();
        let mut ptrs: Vec<*mut c_void> = slots
            .iter_mut()
            .map(|s| s as *mut u64 as *mut c_void)
            .collect();
        // SAFETY: every probe kernel takes u64-sized parameters matching `args`.
        unsafe { cu::launch_kernel(f, (grid as u32, 1, 1), (256, 1, 1), 0, stream, &mut ptrs) }?;
        Ok(())
    };

    let bytes = ((gib * (1u64 << 30) as f64) as u64) / 4096 * 4096;
    let nvec = bytes / 16;
    let a = gpu.alloc(bytes as usize)?;
    let b = gpu.alloc(bytes as usize)?;
    let both = gpu.alloc(2 * bytes as usize)?;
    let out = gpu.alloc_zeroed(64)?;
    let table = gpu.alloc_zeroed(4096)?;
    // SAFETY: our buffers.
    unsafe {
        gpu.memset(a.ptr(), 0x3c, bytes as usize)?;
        gpu.memset(both.ptr(), 0x3c, 2 * bytes as usize)?;
        gpu.copy_device(b.ptr(), a.ptr(), bytes as usize)?;
    }
    let copy_ms = timed(&|| {
        // SAFETY: both buffers hold `bytes`.
        unsafe { gpu.copy_device(b.ptr(), a.ptr(), bytes as usize) }?;
        Ok(())
    })?;
    let line = |label: &str, ms: f32, read: u64, written: u64| {
        println!(
            "{label:44} {ms:8.3} ms  read {:6.0} GB/s  traffic {:6.0} GB/s  {:5.1}% of copy time",
            read as f64 / (ms as f64 * 1e6),
            (read + written) as f64 / (ms as f64 * 1e6),
            100.0 * copy_ms / ms
        )
    };
    println!("{:.2} GB per array", bytes as f64 / 1e9);
    line("cuMemcpyDtoD", copy_ms, bytes, bytes);
    let t = timed(&|| launch("p_copy", sms * 8, &[a.ptr(), b.ptr(), nvec]))?;
    line("kernel copy, grid-stride, 8 blocks/SM", t, bytes, bytes);
    for (name, per) in [("p_read1_4", 4u64), ("p_read1_8", 8)] {
        for k in [4u64, 8, 16] {
            let t = timed(&|| launch(name, sms * k, &[both.ptr(), 2 * nvec, out.ptr()]))?;
            line(
                &format!("read one array of 2x, {per} vec/thread, {k} blocks/SM"),
                t,
                2 * bytes,
                0,
            );
        }
    }
    for (label, x, y) in [
        ("separate allocations", a.ptr(), b.ptr()),
        ("one allocation, halves", both.ptr(), both.ptr() + bytes),
        (
            "one allocation, halves + 4 KiB",
            both.ptr(),
            both.ptr() + bytes - 4096,
        ),
    ] {
        let n = if label.ends_with("KiB") {
            nvec - 256
        } else {
            nvec
        };
        for (name, per) in [("p_cmp_gs2", 2u64), ("p_cmp_gs4", 4), ("p_cmp_gs8", 8)] {
            for k in [4u64, 8, 16] {
                let t = timed(&|| launch(name, sms * k, &[x, y, n, out.ptr()]))?;
                line(
                    &format!("cmp {label}, {per} vec, {k} blk/SM"),
                    t,
                    2 * n * 16,
                    0,
                );
            }
        }
        let tiles = n.div_ceil(1024);
        let t = timed(&|| launch("p_cmp_tile", tiles, &[x, y, n, out.ptr()]))?;
        line(&format!("cmp {label}, block per tile"), t, 2 * n * 16, 0);
        let t = timed(&|| launch("p_cmp_tile_dep", tiles, &[x, y, n, out.ptr(), table.ptr()]))?;
        line(
            &format!("cmp {label}, tile + dep load + barrier"),
            t,
            2 * n * 16,
            0,
        );
    }

    // The real diffs on separate allocations, at 0.1 % and 1 % (every 1000th / 100th element).
    let numel = bytes / 2;
    let cap = numel / 16;
    let pos = gpu.alloc((cap * 8) as usize)?;
    let newv = gpu.alloc((cap * 2) as usize)?;
    let oldv = gpu.alloc((cap * 2) as usize)?;
    for every in [1000u64, 100] {
        for (label, old_bits) in [("new bits", false), ("new + old bits", true)] {
            let mut t = Vec::new();
            let mut found = 0;
            for _ in 0..reps + 1 {
                // SAFETY: our buffers; the snapshot b is reset to a, then a is touched.
                unsafe { gpu.copy_device(b.ptr(), a.ptr(), bytes as usize)? };
                launch("p_touch", sms * 8, &[a.ptr(), numel, every])?;
                let inputs = [DiffInput {
                    snapshot: b.ptr(),
                    current: a.ptr(),
                    numel,
                    width: 2,
                    first_index: 0,
                    digest: None,
                    f32_source: None,
                }];
                let o = DiffOutput {
                    positions: pos.ptr(),
                    new_values: newv.ptr(),
                    old_values: old_bits.then(|| oldv.ptr()),
                    capacity: cap,
                    expected: None,
                };
                // SAFETY: inputs and outputs are ours and sized.
                let r = unsafe { gpu.diff_batch(&inputs, &o)? };
                found = r.found;
                t.push(r.kernel_ms);
            }
            let ms = median(t[1..].to_vec());
            let written = found * 12;
            line(
                &format!("diff {label}, {found} changes"),
                ms,
                2 * bytes,
                written,
            );
        }
    }
    Ok(())
}
