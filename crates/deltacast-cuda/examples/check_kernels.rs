//! Compile-checks every kernel with NVRTC, no GPU needed: `scripts/check-kernels.sh` runs it with
//! the NVRTC wheel from PyPI. Usage: `check_kernels [ARCH...]` (default `compute_90`). Writes
//! nothing unless KERNEL_PTX_DIR is set; prints each file's PTX size, or the compiler log and
//! exits 1.

fn main() {
    let mut archs: Vec<String> = std::env::args().skip(1).collect();
    if archs.is_empty() {
        archs.push("compute_90".into());
    }
    if let Err(e) = deltacast_cuda::nvrtc_present() {
        eprintln!("check_kernels: {e}");
        std::process::exit(2);
    }
    let mut failed = false;
    for arch in &archs {
        for (name, _) in deltacast_cuda::KERNELS {
            match deltacast_cuda::compile_kernel(name, arch) {
                Ok(ptx) => {
                    let entries = ptx.matches(".entry").count();
                    println!(
                        "ok   {name}.cu for {arch}: {} bytes of PTX, {entries} kernels",
                        ptx.len()
                    );
                    // KERNEL_PTX_DIR: also write the PTX (e.g. for `ptxas -v` resource reports).
                    if let Ok(dir) = std::env::var("KERNEL_PTX_DIR") {
                        let path = std::path::Path::new(&dir).join(format!("{name}.{arch}.ptx"));
                        if let Err(e) = std::fs::write(&path, &ptx) {
                            eprintln!("check_kernels: {}: {e}", path.display());
                            std::process::exit(2);
                        }
                    }
                }
                Err(e) => {
                    failed = true;
                    println!("FAIL {name}.cu for {arch}:\n{e}");
                }
            }
        }
    }
    // The diff kernel's tuning knobs must compile in every combination the benches use.
    for arch in &archs {
        for items in [1u32, 2, 3, 4] {
            for (min_blocks, reload, prefetch, stash) in [
                (1u32, false, 0u32, false),
                (4, true, 0, false),
                (8, true, 0, false),
                (4, true, 264, false),
                (2, true, 8192, false),
                (4, true, 264, true),
            ] {
                let tuning = deltacast_cuda::DiffTuning {
                    items,
                    min_blocks,
                    reload,
                    prefetch,
                    stash,
                    direct: false, // both forms are in every build
                };
                if tuning.validate().is_err() {
                    continue;
                }
                if let Err(e) = deltacast_cuda::compile_kernel_tuned("diff", arch, tuning) {
                    failed = true;
                    println!("FAIL diff.cu for {arch} with {tuning:?}:\n{e}");
                }
            }
        }
        println!("ok   diff.cu tuning variants for {arch}");
    }
    if failed {
        std::process::exit(1);
    }
}
