//! GPU figures: the batched diff's bandwidth against a device-to-device copy of the same bytes
//! at several densities, plus digest and encoder throughput.
//!
//! `gpu_bench [GIB] [REPS] [TUNING...]` (densities 0.1–50 %; default 4 GiB of BF16, 10 repetitions, median of
//! device-event times; each TUNING `items,min_blocks,reload[,prefetch[,stash]]` also times the diff
//! built that way).
//! At 1 % every configuration that writes old bits is checked bit for bit (positions, new
//! and old bits, refreshed snapshot) against `deltacast::diff::diff_and_refresh`.
//!
//! `gpu_bench pinned [GIB] [REPS]`: the snapshot in pinned host memory (what
//! `SnapshotPlace::PinnedHost` does): the diff (`diff_batch` with the digest, as the GPU
//! sync runs it) reading the snapshot over PCIe, next to `cuMemcpyHtoDAsync` and
//! `cuMemcpyDtoHAsync` of the same bytes between pinned host memory and the device, in the
//! same run; prints diff time / HtoD copy time.
//!
//! `gpu_bench steps [GIB] [DENSITY...]`: the steps code's kernels (the steps diff, the apply's
//! check and scatter) on one BF16 tensor at each density (80 % of the changes ±1 step, the
//! rest escapes), with chunks of 2^16 and of 2^20 elements, next to a device copy of the same
//! bytes; each kernel's registers and spills. Checked: the applied tensor equals the current.
//!
//! `gpu_bench entropy [MILLION_CHANGES] [DENSITY]`: the entropy codecs on AdamW-like steps
//! (87 % ±1 ULP): sizing, writing and decoding (gaps + ulp, gaps alone, ulp after abs32),
//! wall time per call (each synchronises), checked against the input. With
//! `DELTACAST_ENTROPY_PROFILE=1` each kernel's device time is printed too.

use std::time::Instant;

use deltacast::diff::{diff_and_refresh, Changes};
use deltacast_cuda::{
    DiffInput, DiffOutput, DiffResult, DiffTuning, DigestInput, EncodeInput, Gpu,
};

fn splitmix(s: &mut u64) -> u64 {
    *s = s.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *s;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fills `out` in parallel: `f(seed, chunk_index, chunk)`.
fn par_fill(out: &mut [u8], f: impl Fn(u64, usize, &mut [u8]) + Sync) {
    let threads = std::thread::available_parallelism().map_or(4, |n| n.get());
    let per = out.len().div_ceil(threads).next_multiple_of(64);
    std::thread::scope(|s| {
        for (i, chunk) in out.chunks_mut(per).enumerate() {
            let f = &f;
            s.spawn(move || f(0x1234 + i as u64, i * per, chunk));
        }
    });
}

/// One BF16 buffer pair of `numel` elements as `pieces` diff inputs (16-byte aligned pieces,
/// the last takes the rest), all adding their digest change to the word at `digest`.
fn bf16_pieces(
    snapshot: u64,
    current: u64,
    numel: usize,
    pieces: usize,
    digest: Option<u64>,
) -> Vec<DiffInput> {
    let per = (numel / pieces / 8 * 8).max(8);
    (0..pieces)
        .map(|p| {
            let first = p * per;
            let n = if p + 1 == pieces { numel - first } else { per };
            DiffInput {
                snapshot: snapshot + 2 * first as u64,
                current: current + 2 * first as u64,
                numel: n as u64,
                width: 2,
                first_index: first as u64,
                digest: digest.map(|d| (d, 0)),
                f32_source: None,
            }
        })
        .collect()
}

fn median(mut v: Vec<f32>) -> f32 {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    v[v.len() / 2]
}

/// `out` = `old` (BF16) with about `density` of the elements moved by ±1 ULP.
/// The CPU diff of BF16 `old` → `cur`, and its positions as the GPU writes them (u64 LE).
fn cpu_reference(old: &[u8], cur: &[u8]) -> (Changes, Vec<u8>) {
    let mut snap = old.to_vec();
    let mut ch = Changes::default();
    diff_and_refresh(&mut snap, cur, 2, 0, &mut ch);
    let pos = ch.positions.iter().flat_map(|p| p.to_le_bytes()).collect();
    (ch, pos)
}

/// Runs `run` (restore the snapshot, then one diff) `reps + 2` times: the median device time of
/// the last `reps` and the changes found. Every run must find room for all its changes.
fn timed_diff(
    reps: usize,
    mut run: impl FnMut() -> Result<DiffResult, Box<dyn std::error::Error>>,
) -> Result<(f32, u64), Box<dyn std::error::Error>> {
    let mut times = Vec::new();
    let mut found = 0;
    for r in 0..reps + 2 {
        let res = run()?;
        assert!(res.is_complete());
        found = res.found;
        if r >= 2 {
            times.push(res.kernel_ms);
        }
    }
    Ok((median(times), found))
}

fn fill_changed(out: &mut [u8], old: &[u8], density: f64) {
    let thresh = (density * (1u64 << 32) as f64) as u64;
    par_fill(out, |seed, at, c| {
        let mut s = seed ^ 0xabcdef;
        let src = &old[at..at + c.len()];
        for (k, e) in c.chunks_mut(2).enumerate() {
            let o = u16::from_le_bytes([src[2 * k], src[2 * k + 1]]);
            let r = splitmix(&mut s);
            let n = if (r & 0xffff_ffff) < thresh {
                if r >> 63 == 1 {
                    o.wrapping_add(1)
                } else {
                    o.wrapping_sub(1)
                }
            } else {
                o
            };
            e.copy_from_slice(&n.to_le_bytes());
        }
    });
}

fn random_bytes(bytes: usize) -> Vec<u8> {
    let mut old = vec![0u8; bytes];
    par_fill(&mut old, |seed, _, c| {
        let mut s = seed;
        for w in c.chunks_mut(8) {
            let r = splitmix(&mut s).to_le_bytes();
            w.copy_from_slice(&r[..w.len()]);
        }
    });
    old
}

/// `gpu_bench pinned [GIB] [REPS]`: the diff with its snapshot in pinned host memory against
/// the PCIe copies of the same bytes.
fn pinned_bench(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    let gib: f64 = args.first().map_or(Ok(4.0), |s| s.parse())?;
    let reps: usize = args.get(1).map_or(Ok(10), |s| s.parse())?;
    let gpu = Gpu::new(0)?;
    println!(
        "device: {} ({}, {} SMs), diff tuning {:?}; snapshot in pinned host memory",
        gpu.name(),
        gpu.arch(),
        gpu.sm_count(),
        gpu.tuning()
    );
    let bytes = ((gib * (1u64 << 30) as f64) as usize) / 64 * 64;
    let numel = bytes / 2;
    let t = Instant::now();
    let old = random_bytes(bytes);
    println!("host data: {:.1} s", t.elapsed().as_secs_f64());
    let old_d = gpu.upload(&old)?;
    let cur_d = gpu.alloc(bytes)?;
    // HtoD target, and the device snapshot of the reference rows.
    let dev_d = gpu.alloc(bytes)?;
    let t = Instant::now();
    let snap_h = gpu.alloc_pinned(bytes)?;
    println!(
        "cuMemHostAlloc of {:.2} GB (pinned, mapped, zeroed): {:.2} s",
        bytes as f64 / 1e9,
        t.elapsed().as_secs_f64()
    );
    let cap = numel * 11 / 20; // room for 55 % changes
    let pos_d = gpu.alloc(cap * 8)?;
    let new_d = gpu.alloc(cap * 2)?;
    let dig_d = gpu.alloc_zeroed(8)?;
    let gbs = |ms: f32| bytes as f64 / (ms as f64 * 1e-3) / 1e9;

    // The PCIe copies of the shard: pinned → device, device → pinned (the latter also
    // restores the snapshot to `old`).
    let mut h2d = Vec::new();
    let mut d2h = Vec::new();
    for _ in 0..reps + 2 {
        // SAFETY: all three are `bytes` long; the host does not touch `snap_h` meanwhile.
        d2h.push(gpu.time_ms(|| unsafe { gpu.copy_to_pinned(&snap_h, 0, old_d.ptr(), bytes) })?);
        h2d.push(gpu.time_ms(|| unsafe { gpu.copy_from_pinned(dev_d.ptr(), &snap_h, 0, bytes) })?);
    }
    let h2d_ms = median(h2d[2..].to_vec());
    let d2h_ms = median(d2h[2..].to_vec());
    println!(
        "copy HtoD (cuMemcpyHtoDAsync, pinned -> device) of {:.2} GB: {h2d_ms:.3} ms = {:.1} GB/s",
        bytes as f64 / 1e9,
        gbs(h2d_ms)
    );
    println!(
        "copy DtoH (cuMemcpyDtoHAsync, device -> pinned) of {:.2} GB: {d2h_ms:.3} ms = {:.1} GB/s",
        bytes as f64 / 1e9,
        gbs(d2h_ms)
    );

    let mut rows = Vec::new();
    let mut host_cur = vec![0u8; bytes];
    for density in [0.001f64, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5] {
        fill_changed(&mut host_cur, &old, density);
        // SAFETY: `cur_d` is `bytes` long.
        unsafe { gpu.copy_to_device(cur_d.ptr(), &host_cur)? };
        // (label, snapshot in pinned host memory, pieces); the last pinned one is checked.
        let configs: [(&str, bool, usize); 3] = [
            ("device snapshot, 1 tensor (reference)", false, 1),
            ("pinned snapshot, 339 tensors", true, 339),
            ("pinned snapshot, 1 tensor", true, 1),
        ];
        for (label, pinned, pieces) in configs {
            let snap = if pinned { snap_h.ptr() } else { dev_d.ptr() };
            let (ms, found) = timed_diff(reps, || {
                // Restore the snapshot (not timed).
                // SAFETY: all `bytes` long; the host does not touch `snap_h` meanwhile.
                unsafe {
                    if pinned {
                        gpu.copy_to_pinned(&snap_h, 0, old_d.ptr(), bytes)?
                    } else {
                        gpu.copy_device(dev_d.ptr(), old_d.ptr(), bytes)?
                    }
                };
                let inputs = bf16_pieces(snap, cur_d.ptr(), numel, pieces, Some(dig_d.ptr()));
                let out = DiffOutput {
                    positions: pos_d.ptr(),
                    new_values: new_d.ptr(),
                    old_values: None,
                    capacity: cap as u64,
                    expected: None,
                };
                // SAFETY: all inside the buffers above (the pinned one through its mapping).
                Ok(unsafe {
                    if pinned {
                        gpu.diff_batch_host_snapshot(&inputs, &out)?
                    } else {
                        gpu.diff_batch(&inputs, &out)?
                    }
                })
            })?;
            println!(
                "diff {:5.1}% {label:40}: {ms:8.3} ms = {:6.1} GB/s of tensor = {:.2}x HtoD copy ({} changes)",
                density * 100.0,
                gbs(ms),
                ms / h2d_ms,
                found
            );
            rows.push((density, label, ms, found));
        }
        if density == 0.01 {
            // Bit-exact check of the last (pinned) run against the CPU diff; the host
            // snapshot is read in place.
            let t = Instant::now();
            let (ch, cpu_pos) = cpu_reference(&old, &host_cur);
            let n = ch.len();
            // SAFETY: the output buffers hold `found` changes.
            let g_pos = unsafe { gpu.download(pos_d.ptr(), 8 * n)? };
            let g_new = unsafe { gpu.download(new_d.ptr(), 2 * n)? };
            let ok = g_pos == cpu_pos && g_new == ch.new_values;
            let refreshed = snap_h.as_slice() == &host_cur[..];
            println!(
                "check vs CPU diff_and_refresh at 1%: {} ({} changes, pinned snapshot {}; {:.1} s)",
                if ok { "identical" } else { "MISMATCH" },
                n,
                if refreshed { "refreshed" } else { "WRONG" },
                t.elapsed().as_secs_f64()
            );
            if !ok || !refreshed {
                return Err("GPU diff with a pinned snapshot differs from the CPU".into());
            }
        }
    }
    println!(
        "\nsummary (median of {reps}, device events), {:.2} GB of BF16:",
        bytes as f64 / 1e9
    );
    println!(
        "HtoD {h2d_ms:.3} ms ({:.1} GB/s), DtoH {d2h_ms:.3} ms ({:.1} GB/s)",
        gbs(h2d_ms),
        gbs(d2h_ms)
    );
    for (density, label, ms, found) in rows {
        println!(
            "{:>6.1}%  {label:40} {ms:8.3} ms {:6.1} GB/s {:5.2}x HtoD  {found} changes",
            density * 100.0,
            gbs(ms),
            ms / h2d_ms
        );
    }
    Ok(())
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.get(1).map(String::as_str) == Some("pinned") {
        return pinned_bench(&args[2..]);
    }
    if args.get(1).map(String::as_str) == Some("entropy") {
        return entropy_bench(&args[2..]);
    }
    if args.get(1).map(String::as_str) == Some("steps") {
        return steps_bench(&args[2..]);
    }
    let gib: f64 = args.get(1).map_or(Ok(4.0), |s| s.parse())?;
    let reps: usize = args.get(2).map_or(Ok(10), |s| s.parse())?;
    let gpu = Gpu::new(0)?;
    println!(
        "device: {} ({}, {} SMs), diff tuning {:?}",
        gpu.name(),
        gpu.arch(),
        gpu.sm_count(),
        gpu.tuning()
    );
    // Variants share the primary context (and so the buffers) with `gpu`, kept alive throughout.
    // TUNING as DELTACAST_DIFF_TUNING.
    let mut variants = Vec::new();
    for t in args.iter().skip(3) {
        variants.push(Gpu::with_tuning(0, DiffTuning::parse(t)?)?);
    }
    for g in std::iter::once(&gpu).chain(&variants) {
        for kernel in ["dc_diff", "dc_diff_direct"] {
            let (regs, local, shared) = g.kernel_resources(kernel)?;
            println!(
                "{kernel} {:?}: {regs} registers, {local} bytes local (spills), {shared} bytes shared",
                g.tuning()
            );
        }
    }
    let bytes = ((gib * (1u64 << 30) as f64) as usize) / 64 * 64;
    let numel = bytes / 2;
    let t = Instant::now();
    let old = random_bytes(bytes);
    println!("host data: {:.1} s", t.elapsed().as_secs_f64());
    let old_d = gpu.upload(&old)?;
    let cur_d = gpu.alloc(bytes)?;
    let snap_d = gpu.alloc(bytes)?;
    let cap = numel * 11 / 20; // room for 55 % changes
    let pos_d = gpu.alloc(cap * 8)?;
    let new_d = gpu.alloc(cap * 2)?;
    let oldv_d = gpu.alloc(cap * 2)?;
    let dig_d = gpu.alloc_zeroed(8)?;

    // Ceiling: cuMemcpyDtoD of the same bytes.
    let mut copy = Vec::new();
    for _ in 0..reps + 2 {
        // SAFETY: both buffers are `bytes` long.
        copy.push(gpu.time_ms(|| unsafe { gpu.copy_device(snap_d.ptr(), old_d.ptr(), bytes) })?);
    }
    let copy_ms = median(copy[2..].to_vec());
    let gbs = |ms: f32| bytes as f64 / (ms as f64 * 1e-3) / 1e9;
    println!(
        "copy (cuMemcpyDtoD) of {:.2} GB: {copy_ms:.3} ms = {:.0} GB/s of tensor ({:.0} GB/s read+write)",
        bytes as f64 / 1e9,
        gbs(copy_ms),
        2.0 * gbs(copy_ms)
    );

    let mut rows = Vec::new();
    let mut host_cur = vec![0u8; bytes];
    for density in [0.001f64, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1, 0.25, 0.5] {
        fill_changed(&mut host_cur, &old, density);
        // SAFETY: `cur_d` is `bytes` long.
        unsafe { gpu.copy_to_device(cur_d.ptr(), &host_cur)? };
        // (gpu, label, old bits, digest, pieces); the last one writes old bits, for the
        // check below. The sync diffs with the digest, and old bits when it entropy-codes.
        let mut configs: Vec<(&Gpu, String, bool, bool, usize)> = vec![
            (&gpu, "1 tensor, new bits".into(), false, false, 1),
            (&gpu, "1 tensor, new bits, digest".into(), false, true, 1),
            (
                &gpu,
                "339 tensors, new bits, digest".into(),
                false,
                true,
                339,
            ),
            (&gpu, "1 tensor, new+old bits, digest".into(), true, true, 1),
            (&gpu, "339 tensors, new+old, digest".into(), true, true, 339),
        ];
        for v in &variants {
            let t = v.tuning();
            let name = format!(
                "{},{},{},{},{},{}",
                t.items, t.min_blocks, t.reload as u32, t.prefetch, t.stash as u32, t.direct as u32
            );
            configs.push((v, format!("[{name}] 1 tensor, new bits"), false, false, 1));
            configs.push((
                v,
                format!("[{name}] 1 tensor, new+old, digest"),
                true,
                true,
                1,
            ));
        }
        // The CPU's diff at 1 %: every configuration writing old bits is checked against it.
        let reference = (density == 0.01).then(|| cpu_reference(&old, &host_cur));
        let mut checked = 0;
        for (g, label, with_old, with_digest, pieces) in configs {
            let label = label.as_str();
            let (ms, found) = timed_diff(reps, || {
                // Restore the snapshot (not timed).
                // SAFETY: both `bytes` long.
                unsafe { g.copy_device(snap_d.ptr(), old_d.ptr(), bytes)? };
                let digest = with_digest.then_some(dig_d.ptr());
                let inputs = bf16_pieces(snap_d.ptr(), cur_d.ptr(), numel, pieces, digest);
                let out = DiffOutput {
                    positions: pos_d.ptr(),
                    new_values: new_d.ptr(),
                    old_values: with_old.then_some(oldv_d.ptr()),
                    capacity: cap as u64,
                    expected: None,
                };
                // SAFETY: all inside the buffers above.
                Ok(unsafe { g.diff_batch(&inputs, &out)? })
            })?;
            println!(
                "diff {:5.1}% {label:40}: {ms:.3} ms = {:.0} GB/s of tensor = {:.0}% of copy ({} changes)",
                density * 100.0,
                gbs(ms),
                100.0 * copy_ms / ms,
                found
            );
            rows.push((density, label.to_string(), ms, found));
            if let (Some((ch, cpu_pos)), true) = (&reference, with_old) {
                // Bit-exact check against the CPU diff (the last repetition left its output).
                let n = ch.len();
                // SAFETY: the output buffers hold `found` changes.
                let g_pos = unsafe { gpu.download(pos_d.ptr(), 8 * n)? };
                let g_new = unsafe { gpu.download(new_d.ptr(), 2 * n)? };
                let g_old = unsafe { gpu.download(oldv_d.ptr(), 2 * n)? };
                let ok = found as usize == n
                    && g_pos == *cpu_pos
                    && g_new == ch.new_values
                    && g_old == ch.old_values;
                let g_snap = unsafe { gpu.download(snap_d.ptr(), bytes)? };
                println!(
                    "  check vs CPU diff_and_refresh: {} ({n} changes, snapshot {})",
                    if ok { "identical" } else { "MISMATCH" },
                    if g_snap == host_cur {
                        "refreshed"
                    } else {
                        "WRONG"
                    },
                );
                if !ok || g_snap != host_cur {
                    return Err(format!("GPU diff [{label}] differs from the CPU").into());
                }
                checked += 1;
            }
        }
        if let Some((ch, _)) = &reference {
            println!("{checked} configurations checked against the CPU diff at 1%");
            let n = ch.len();
            // Encoders on the 1 % output, 1 Mi-element grid.
            let inputs = [EncodeInput {
                change_offset: 0,
                change_count: n as u64,
                first_index: 0,
                numel: numel as u64,
            }];
            let bm_len = Gpu::bitmap_bytes(&inputs, 1 << 20) as usize;
            let bm = gpu.alloc(bm_len)?;
            let abs = gpu.alloc(4 * n)?;
            let mut times = Vec::new();
            for _ in 0..reps {
                times.push(gpu.time_ms(|| {
                    // SAFETY: buffers sized as documented.
                    unsafe {
                        gpu.encode_positions(
                            pos_d.ptr(),
                            &inputs,
                            1 << 20,
                            Some(abs.ptr()),
                            Some(bm.ptr()),
                        )
                    }
                    .map(|_| ())
                })?);
            }
            let ms = median(times);
            println!(
                "encode abs32+bitmap of {n} changes (1 Mi grid, {} chunks): {ms:.3} ms incl. host sync",
                numel.div_ceil(1 << 20)
            );
        }
    }
    // Full digest of the whole buffer.
    let mut times = Vec::new();
    let mut d = 0;
    for _ in 0..reps {
        times.push(gpu.time_ms(|| {
            // SAFETY: `old_d` holds `numel` BF16.
            d = unsafe {
                gpu.digest(&[DigestInput {
                    ptr: old_d.ptr(),
                    numel: numel as u64,
                    width: 2,
                    first_index: 0,
                    slot: 0,
                    f32_source: None,
                }])
            }?[0];
            Ok(())
        })?);
    }
    let ms = median(times);
    let t = Instant::now();
    let cpu = deltacast::digest::digest_range(0, 2, &old, 0);
    println!(
        "digest of {:.2} GB: {ms:.3} ms = {:.0} GB/s ({}; CPU {:.2} s)",
        bytes as f64 / 1e9,
        gbs(ms),
        if cpu == d {
            "equals CPU"
        } else {
            "DIFFERS from CPU"
        },
        t.elapsed().as_secs_f64()
    );
    println!("\nsummary (median of {reps}, device events):");
    println!("copy {copy_ms:.3} ms, {:.0} GB/s of tensor", gbs(copy_ms));
    for (density, label, ms, found) in rows {
        println!(
            "{:>6.1}%  {label:40} {ms:7.3} ms {:6.0} GB/s {:5.0}% of copy  {found} changes",
            density * 100.0,
            gbs(ms),
            100.0 * copy_ms / ms
        );
    }
    Ok(())
}

/// The entropy codecs on one synthetic step (see the module doc).
fn entropy_bench(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    use deltacast_cuda::{
        CodeChunk, CodePlace, CodeScratch, CodeValues, DecodeInput, DecodePositions, DECODE_SLACK,
    };
    let millions: f64 = args.first().map_or(Ok(20.0), |s| s.parse())?;
    let density: f64 = args.get(1).map_or(Ok(0.02), |s| s.parse())?;
    let n = (millions * 1e6) as usize;
    let numel = ((n as f64 / density) as u64).max(n as u64);
    let grid = 1u64 << 20;
    let gpu = Gpu::new(0)?;
    println!(
        "device: {}; {n} changes at {:.2}% of {numel} BF16 elements",
        gpu.name(),
        density * 100.0
    );
    // Positions: geometric gaps; old bits random, new ±1 ULP (87 %) or a few to 1000 ULP.
    let mut seed = 7u64;
    let mut pos = Vec::with_capacity(n);
    let mut p = 0u64;
    while pos.len() < n {
        let r = (splitmix(&mut seed) >> 11) as f64 / (1u64 << 53) as f64;
        let gap = ((1.0 - r).ln() / (1.0 - density).ln()).floor() as u64;
        p += gap;
        if p >= numel {
            break;
        }
        pos.push(p);
        p += 1;
    }
    let n = pos.len();
    let mut held = vec![0u8; numel as usize * 2];
    par_fill(&mut held, |seed, _, c| {
        let mut s = seed;
        for b in c.chunks_mut(8) {
            let v = splitmix(&mut s).to_le_bytes();
            b.copy_from_slice(&v[..b.len()]);
        }
    });
    let mut old = vec![0u8; n * 2];
    let mut new = vec![0u8; n * 2];
    for (k, &q) in pos.iter().enumerate() {
        let o = u16::from_le_bytes([held[2 * q as usize], held[2 * q as usize + 1]]);
        let ord = deltacast::dtype::to_ordered(o as u32, 2);
        let r = splitmix(&mut seed);
        let step = if r % 100 < 87 {
            1
        } else {
            2 + (r >> 8) as u32 % 999
        };
        let up = (r >> 40) & 1 == 1;
        let no = if up {
            ord.wrapping_add(step)
        } else {
            ord.wrapping_sub(step)
        } & 0xffff;
        let nw = deltacast::dtype::from_ordered(no, 2) as u16;
        old[2 * k..2 * k + 2].copy_from_slice(&o.to_le_bytes());
        new[2 * k..2 * k + 2].copy_from_slice(&nw.to_le_bytes());
    }
    // Chunks: grid cells tightened to their changes, as the sync forms them.
    let mut chunks_idx = Vec::new();
    let mut lo = 0usize;
    while lo < n {
        let cell = pos[lo] / grid;
        let mut hi = lo;
        while hi < n && pos[hi] / grid == cell {
            hi += 1;
        }
        chunks_idx.push((lo, hi));
        lo = hi;
    }
    // Inputs are read 16 bytes at a time: DECODE_SLACK bytes past their ends.
    let slack = |mut v: Vec<u8>| {
        v.resize(v.len() + DECODE_SLACK as usize, 0);
        v
    };
    let pos_bytes: Vec<u8> = pos.iter().flat_map(|p| p.to_le_bytes()).collect();
    let pos_d = gpu.upload(&slack(pos_bytes))?;
    let old_d = gpu.upload(&slack(old.clone()))?;
    let new_d = gpu.upload(&slack(new.clone()))?;
    let held_d = gpu.upload(&held)?;
    let chunks: Vec<CodeChunk> = chunks_idx
        .iter()
        .map(|&(lo, hi)| CodeChunk {
            positions: pos_d.ptr() + lo as u64 * 8,
            new_bits: new_d.ptr() + lo as u64 * 2,
            old_bits: old_d.ptr() + lo as u64 * 2,
            count: (hi - lo) as u64,
            start: pos[lo],
            range: pos[hi - 1] - pos[lo] + 1,
            width: 2,
        })
        .collect();
    println!(
        "{} chunks, {} coding blocks",
        chunks.len(),
        n.div_ceil(1024)
    );
    let mut scratch = CodeScratch::new();
    let time = |f: &mut dyn FnMut() -> Result<(), Box<dyn std::error::Error>>| -> Result<f64, Box<dyn std::error::Error>> {
        let mut t = Vec::new();
        for _ in 0..5 {
            let s = Instant::now();
            f()?;
            t.push(s.elapsed().as_secs_f32() * 1e3);
        }
        Ok(median(t) as f64)
    };
    let mut sizes = Vec::new();
    let size_ms = time(&mut || {
        // SAFETY: the buffers hold every chunk's items.
        sizes = unsafe { gpu.entropy_size(&mut scratch, &chunks)? };
        Ok(())
    })?;
    let gaps_total: u64 = sizes.iter().map(|s| s.gaps.next_multiple_of(4)).sum();
    let ulp_total: u64 = sizes.iter().map(|s| s.ulp.next_multiple_of(4)).sum();
    let gbuf = gpu.alloc((gaps_total + DECODE_SLACK) as usize)?;
    let vbuf = gpu.alloc((ulp_total + DECODE_SLACK) as usize)?;
    let mut places = Vec::new();
    let (mut go, mut vo) = (0u64, 0u64);
    let mut offs = Vec::new();
    for s in &sizes {
        places.push(CodePlace {
            gaps: Some(gbuf.ptr() + go),
            values: Some((CodeValues::Ulp, vbuf.ptr() + vo)),
        });
        offs.push((go, vo));
        go += s.gaps.next_multiple_of(4);
        vo += s.ulp.next_multiple_of(4);
    }
    let write_ms = time(&mut || {
        // SAFETY: sized above; zeroed first, as entropy_write wants.
        unsafe {
            gpu.memset(gbuf.ptr(), 0, gbuf.len())?;
            gpu.memset(vbuf.ptr(), 0, vbuf.len())?;
            gpu.entropy_size(&mut scratch, &chunks)?;
            gpu.entropy_write(&mut scratch, &chunks, &places)?;
        }
        Ok(())
    })? - size_ms;
    println!(
        "sections: gaps {:.1} MB + ulp {:.1} MB = {:.3} bytes per change",
        gaps_total as f64 / 1e6,
        ulp_total as f64 / 1e6,
        (gaps_total + ulp_total) as f64 / n as f64
    );
    // Decoded outputs at 16-aligned offsets per chunk, as the sync stages them.
    let mut stage = Vec::new();
    let (mut ps, mut vs) = (0u64, 0u64);
    for c in &chunks {
        stage.push((ps, vs));
        ps += (c.count * 4).next_multiple_of(16);
        vs += (c.count * 2).next_multiple_of(16);
    }
    let pout = gpu.alloc((ps + DECODE_SLACK) as usize)?;
    let vout = gpu.alloc(vs as usize + 16)?;
    let abs32: Vec<u8> = chunks_idx
        .iter()
        .flat_map(|&(lo, hi)| {
            let first = pos[lo];
            pos[lo..hi].iter().map(move |&p| (p - first) as u32)
        })
        .flat_map(|r| r.to_le_bytes())
        .collect();
    let abs_d = gpu.upload(&slack(abs32))?;
    let inputs = |gaps: bool, ulp: bool| -> Vec<DecodeInput> {
        chunks_idx
            .iter()
            .zip(&chunks)
            .zip(&sizes)
            .zip(offs.iter().zip(&stage))
            .map(|(((&(lo, _), c), s), (&(go, vo), &(ps, vs)))| DecodeInput {
                held: held_d.ptr(),
                slot_numel: numel,
                width: 2,
                start: c.start,
                range: c.range,
                count: c.count,
                positions: if gaps {
                    DecodePositions::Gaps {
                        section: gbuf.ptr() + go,
                        len: s.gaps,
                        out: pout.ptr() + ps,
                    }
                } else {
                    DecodePositions::Abs32 {
                        section: abs_d.ptr() + lo as u64 * 4,
                        len: c.count * 4,
                    }
                },
                values: ulp.then_some((vbuf.ptr() + vo, s.ulp, vout.ptr() + vs)),
            })
            .collect()
    };
    let mut report = Vec::new();
    for (label, g, u) in [
        ("gaps + ulp", true, true),
        ("gaps alone", true, false),
        ("ulp after abs32", false, true),
    ] {
        let list = inputs(g, u);
        let ms = time(&mut || {
            // SAFETY: sections with slack, outputs sized for every change.
            let bad = unsafe { gpu.entropy_decode(&mut scratch, &list)? };
            if !bad.is_empty() {
                return Err(format!("decode refused: {:?}", bad[0]).into());
            }
            Ok(())
        })?;
        report.push((label, ms));
    }
    // The decoded positions and values equal the input.
    // SAFETY: our buffers.
    let got_new = unsafe { gpu.download(vout.ptr(), vs as usize)? };
    let got_pos = unsafe { gpu.download(pout.ptr(), ps as usize)? };
    let mut pos_ok = true;
    let mut val_ok = true;
    for (&(lo, hi), &(ps, vs)) in chunks_idx.iter().zip(&stage) {
        for k in lo..hi {
            let at = ps as usize + 4 * (k - lo);
            let rel = u32::from_le_bytes(got_pos[at..at + 4].try_into().unwrap()) as u64;
            pos_ok &= rel == pos[k] - pos[lo];
            let at = vs as usize + 2 * (k - lo);
            val_ok &= got_new[at..at + 2] == new[2 * k..2 * k + 2];
        }
    }
    println!("decoded = input: positions {pos_ok}, values {val_ok}");
    let rate = |ms: f64| n as f64 / (ms * 1e-3) / 1e6;
    println!("size  {size_ms:8.3} ms  {:8.0} M changes/s", rate(size_ms));
    println!(
        "write {write_ms:8.3} ms  {:8.0} M changes/s",
        rate(write_ms)
    );
    for (label, ms) in report {
        println!(
            "decode {label:<16} {ms:8.3} ms  {:8.0} M changes/s",
            rate(ms)
        );
    }
    Ok(())
}

/// `gpu_bench steps [GIB] [DENSITY...]`: see the module docs.
fn steps_bench(args: &[String]) -> Result<(), Box<dyn std::error::Error>> {
    use deltacast_cuda::{
        map_layout, ApplyInput, ApplyPositions, ApplyValues, DiffOutput, MapCode, MapOutput,
    };
    let gib: f64 = args.first().map_or(Ok(1.0), |s| s.parse())?;
    let densities: Vec<f64> = if args.len() > 1 {
        args[1..]
            .iter()
            .map(|s| s.parse())
            .collect::<Result<_, _>>()?
    } else {
        vec![0.02, 0.12, 0.25, 0.5]
    };
    let gpu = Gpu::new(0)?;
    println!("device: {} ({} SMs)", gpu.name(), gpu.sm_count());
    for kernel in [
        "dc_diff_steps",
        "dc_diff_bitmap",
        "dc_diff_direct",
        "dc_apply_check",
        "dc_apply_scatter",
    ] {
        let (regs, local, shared) = gpu.kernel_resources(kernel)?;
        println!("{kernel}: {regs} registers, {local} bytes local (spills), {shared} bytes shared");
    }
    let bytes = ((gib * (1u64 << 30) as f64) as usize) / 64 * 64;
    let numel = (bytes / 2) as u64;
    let old = random_bytes(bytes);
    let old_d = gpu.upload(&old)?;
    let snap_d = gpu.alloc(bytes)?;
    let cur_d = gpu.alloc(bytes)?;
    let held_d = gpu.alloc(bytes)?;
    let digest_d = gpu.alloc_zeroed(8)?;
    let input = DiffInput {
        snapshot: snap_d.ptr(),
        current: cur_d.ptr(),
        numel,
        width: 2,
        first_index: 0,
        digest: Some((digest_d.ptr(), 0)),
        f32_source: None,
    };
    let map_d = gpu.alloc(map_layout(&[input], MapCode::Steps).1 as usize)?;
    let esc_d = gpu.alloc(bytes)?;
    // The listing diff's output, for the bitmap rows' comparison.
    let pos_d = gpu.alloc(8 * numel as usize)?;
    let wall = |f: &mut dyn FnMut() -> Result<(), Box<dyn std::error::Error>>| {
        let t = Instant::now();
        f()?;
        gpu.synchronize()?;
        Ok::<f32, Box<dyn std::error::Error>>(t.elapsed().as_secs_f32() * 1e3)
    };
    let copy_ms = median(
        (0..5)
            .map(|_| {
                wall(&mut || {
                    // SAFETY: both buffers hold `bytes`.
                    unsafe { gpu.copy_device(snap_d.ptr(), old_d.ptr(), bytes)? };
                    Ok(())
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
    );
    println!("device copy of {bytes} bytes: {copy_ms:.3} ms (wall, median of 5)");
    println!(
        "code    density  cell  chunks  changes  escapes  diff_kernel_ms  check_ms  scatter_ms  \
         (copy {copy_ms:.3} ms; bitmap rows: + listing diff and its bitmap encoding, ms)"
    );
    for &density in &densities {
        let mut cur = vec![0u8; bytes];
        let thresh = (density * (1u64 << 32) as f64) as u64;
        par_fill(&mut cur, |seed, at, c| {
            let mut s = seed ^ 0x5eed;
            let src = &old[at..at + c.len()];
            for (k, e) in c.chunks_mut(2).enumerate() {
                let o = u16::from_le_bytes([src[2 * k], src[2 * k + 1]]) as u32;
                let r = splitmix(&mut s);
                let ord = deltacast::dtype::to_ordered(o, 2);
                let n = if (r & 0xffff_ffff) >= thresh {
                    o
                } else {
                    let step = match (r >> 32) % 10 {
                        0..=3 => 1u32,
                        4..=7 => 0xffff,
                        _ => 3,
                    };
                    deltacast::dtype::from_ordered(ord.wrapping_add(step) & 0xffff, 2)
                };
                e.copy_from_slice(&(n as u16).to_le_bytes());
            }
        });
        // SAFETY: `cur_d` holds `bytes`.
        unsafe { gpu.copy_to_device(cur_d.ptr(), &cur)? };
        for (code, cell) in [
            (MapCode::Steps, 1u64 << 16),
            (MapCode::Steps, 1 << 20),
            (MapCode::Bitmap, 1 << 20),
        ] {
            let bits = code.bits();
            let (mut diffs, mut checks, mut scatters) = (vec![], vec![], vec![]);
            let (mut chunks, mut changes, mut escapes) = (0, 0, 0);
            for rep in 0..4 {
                // SAFETY: every buffer holds `bytes` (the digest word 8).
                unsafe {
                    gpu.copy_device(snap_d.ptr(), old_d.ptr(), bytes)?;
                    gpu.copy_device(held_d.ptr(), old_d.ptr(), bytes)?;
                    gpu.memset(digest_d.ptr(), 0, 8)?;
                }
                gpu.synchronize()?;
                let out = MapOutput {
                    code,
                    map: map_d.ptr(),
                    escapes: esc_d.ptr(),
                    capacity: numel,
                    cell_elems: cell,
                };
                // SAFETY: the buffers above, sized for the tensor.
                let res = unsafe { gpu.diff_map(&[input], &out)? };
                let r = &res.tensors[0];
                let mut inputs = Vec::new();
                let mut g = r.escape0;
                for (c, cl) in r.cells.iter().enumerate() {
                    let start = c as u64 * res.cell_elems;
                    let range = res.cell_elems.min(numel - start);
                    if cl.changes > 0 {
                        let (positions, values) = match code {
                            MapCode::Steps => (ApplyPositions::Steps, ApplyValues::Escaped),
                            MapCode::Bitmap => (ApplyPositions::Bitmap, ApplyValues::Raw),
                        };
                        inputs.push(ApplyInput {
                            dst: held_d.ptr(),
                            slot_numel: numel,
                            width: 2,
                            slot: 0,
                            start,
                            range,
                            count: cl.changes as u64,
                            positions,
                            pos_section: map_d.ptr() + r.map_offset + start * bits / 8,
                            pos_len: (range * bits).div_ceil(8),
                            val_section: esc_d.ptr() + 2 * g,
                            val_len: 2 * cl.escapes as u64,
                            values,
                        });
                    }
                    g += cl.escapes as u64;
                }
                let t = Instant::now();
                // SAFETY: the chunks lie in the buffers above.
                let check = unsafe { gpu.apply_check(&inputs, false, 1)? };
                let check_ms = t.elapsed().as_secs_f32() * 1e3;
                if let Some(e) = check.errors.first() {
                    return Err(format!("chunk {}: {}", e.chunk, e.reason).into());
                }
                let t = Instant::now();
                // SAFETY: as the check.
                unsafe { gpu.apply_scatter(&inputs)? };
                let scatter_ms = t.elapsed().as_secs_f32() * 1e3;
                if rep > 0 {
                    diffs.push(res.kernel_ms);
                    checks.push(check_ms);
                    scatters.push(scatter_ms);
                }
                (chunks, changes, escapes) = (inputs.len(), res.found, res.escapes);
            }
            // SAFETY: `held_d` holds `bytes`.
            let held = unsafe { gpu.download(held_d.ptr(), bytes)? };
            if held != cur {
                return Err(format!("density {density}, cell {cell}: applied bits differ").into());
            }
            // What a dense plain delta cost before the bitmap diff: the listing diff (its
            // one-pass form) and the bitmap encoding of its positions.
            let listing = if code == MapCode::Bitmap {
                let (mut lists, mut encodes) = (vec![], vec![]);
                for _ in 0..3 {
                    // SAFETY: every buffer holds `bytes` (the digest word 8).
                    unsafe {
                        gpu.copy_device(snap_d.ptr(), old_d.ptr(), bytes)?;
                        gpu.memset(digest_d.ptr(), 0, 8)?;
                    }
                    let out = DiffOutput {
                        positions: pos_d.ptr(),
                        new_values: esc_d.ptr(),
                        old_values: None,
                        capacity: numel,
                        expected: Some(changes),
                    };
                    // SAFETY: the buffers above, sized for the tensor.
                    let res = unsafe { gpu.diff_batch(&[input], &out)? };
                    let inputs = [EncodeInput {
                        change_offset: 0,
                        change_count: res.found,
                        first_index: 0,
                        numel,
                    }];
                    let encode_ms = wall(&mut || {
                        // SAFETY: `map_d` holds a bitmap of every element, positions all
                        // the changes.
                        unsafe {
                            gpu.encode_positions(
                                pos_d.ptr(),
                                &inputs,
                                cell,
                                None,
                                Some(map_d.ptr()),
                            )?
                        };
                        Ok(())
                    })?;
                    lists.push(res.kernel_ms);
                    encodes.push(encode_ms);
                }
                format!("  {:.3}  {:.3}", median(lists), median(encodes))
            } else {
                String::new()
            };
            println!(
                "{:6}  {density:.3}  {cell}  {chunks}  {changes}  {escapes}  {:.3}  {:.3}  {:.3}{listing}",
                format!("{code:?}").to_lowercase(),
                median(diffs),
                median(checks),
                median(scatters)
            );
        }
    }
    Ok(())
}
