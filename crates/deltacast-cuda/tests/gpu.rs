//! Every GPU kernel against its CPU twin in `deltacast`, bit for bit.
//!
//! Built without the `cuda` feature (a plain `cargo test`), every test that needs a GPU is
//! `ignored` with its reason in cargo's output. Built with it, a missing GPU fails the test:
//! a cuda build is made to run them (`scripts/gpu-tests.sh`).

mod kernel_cases;

use deltacast::codec::{encode_positions, PosCodec};
use deltacast::diff::{diff_and_refresh, Changes};
use deltacast::digest::{change, digest_range, slot_salt};
use deltacast::dtype::load_bits;
use deltacast_cuda::{
    CudaError, DeviceBuffer, DiffInput, DiffOutput, DiffTuning, DigestInput, EncodeInput, Gpu,
    HostBuffer, UpdateInput,
};
use deltacast_testkit::Rng;
use kernel_cases::*;

/// tests/gpu_sync.rs is compiled only with the `cuda` feature; without it, this test stands
/// for that suite in cargo's output, as ignored.
#[cfg(not(feature = "cuda"))]
#[test]
#[ignore = "tests/gpu_sync.rs, gpu_sharded.rs, gpu_frames.rs, gpu_convert.rs and ipc_auth.rs (the GPU sync over NCCL, CUDA IPC and frames; sharded trainers; fp32 sources for bf16 slots; the IPC link's stranger process) need the cuda feature and a GPU (their NCCL tests: 2)"]
fn gpu_sync_suite_needs_the_cuda_feature() {
    panic!("these suites are built only with --features cuda (scripts/gpu-tests.sh)");
}

#[test]
fn gpu_new_never_panics() {
    // Feature off: NotBuilt. Feature on without a GPU: a clear error. With one: a device.
    match Gpu::new(0) {
        Ok(g) => {
            assert!(!g.name().is_empty());
            assert!(g.arch().starts_with("compute_"));
        }
        Err(e) => {
            let msg = e.to_string();
            assert!(!msg.is_empty());
            if deltacast_cuda::is_built() {
                assert!(
                    matches!(
                        e,
                        CudaError::DriverNotFound(_)
                            | CudaError::NoDevice(_)
                            | CudaError::NvrtcNotFound(_)
                            | CudaError::Driver { .. }
                    ),
                    "{e:?}"
                );
            } else {
                assert!(
                    matches!(e, CudaError::NotBuilt(m) if m == deltacast_cuda::NOT_BUILT),
                    "{e:?}"
                );
                assert!(msg.contains("without the `cuda` feature"));
            }
            eprintln!("Gpu::new(0) here: {msg}");
        }
    }
    assert!(Gpu::new(1 << 20).is_err());
}

struct DiffCase {
    numel: usize,
    width: usize,
    density: f64,
    misalign: bool,
    first_index: u64,
    slot: u32,
}

/// Places every case at its own offset in one snapshot and one current buffer, runs one batched
/// diff, and compares each tensor with `deltacast::diff::diff_and_refresh`.
fn run_diff_batch(gpu: &Gpu, rng: &mut Rng, cases: &[DiffCase], capacity_frac: f64) {
    run_diff_batch_at(gpu, rng, cases, capacity_frac, false, None);
}

/// Where a test's snapshot lives.
enum Snap {
    Device(DeviceBuffer),
    /// Page-locked host memory the kernels read and write over PCIe.
    Pinned(HostBuffer),
}

impl Snap {
    fn new(gpu: &Gpu, bytes: &[u8], pinned: bool) -> Snap {
        if pinned {
            let mut h = gpu.alloc_pinned(bytes.len()).unwrap();
            assert_eq!(h.len(), bytes.len());
            h.as_mut_slice().copy_from_slice(bytes);
            Snap::Pinned(h)
        } else {
            Snap::Device(gpu.upload(bytes).unwrap())
        }
    }

    fn ptr(&self) -> u64 {
        match self {
            Snap::Device(b) => b.ptr(),
            Snap::Pinned(h) => h.ptr(),
        }
    }

    /// The bytes: downloaded, or read straight from host memory (the diff synchronised).
    fn read(&self, gpu: &Gpu, len: usize) -> Vec<u8> {
        match self {
            Snap::Device(b) => dl(gpu, b.ptr(), len),
            Snap::Pinned(h) => h.as_slice()[..len].to_vec(),
        }
    }
}

/// [`run_diff_batch`] with the snapshot in device memory or (`pinned`) in pinned host memory,
/// telling the diff to expect `expect_share` of the elements changed (`DiffOutput::expected`).
fn run_diff_batch_at(
    gpu: &Gpu,
    rng: &mut Rng,
    cases: &[DiffCase],
    capacity_frac: f64,
    pinned: bool,
    expect_share: Option<f64>,
) {
    let mut olds = Vec::new();
    let mut news = Vec::new();
    let mut offsets = Vec::new();
    let mut total = 0usize;
    for c in cases {
        let old = fill_old(rng, c.numel, c.width);
        let new = mutate(rng, &old, c.width, c.density);
        // 256-aligned, or shifted by one element (not 16-byte aligned: the byte path).
        total = total.next_multiple_of(256) + if c.misalign { c.width } else { 0 };
        offsets.push(total);
        total += old.len();
        olds.push(old);
        news.push(new);
    }
    let mut snap_host = vec![0u8; total];
    let mut cur_host = vec![0u8; total];
    for ((o, n), &at) in olds.iter().zip(&news).zip(&offsets) {
        snap_host[at..at + o.len()].copy_from_slice(o);
        cur_host[at..at + n.len()].copy_from_slice(n);
    }
    let snap = Snap::new(gpu, &snap_host, pinned);
    let cur = gpu.upload(&cur_host).unwrap();
    let digests = gpu.alloc_zeroed(8 * cases.len()).unwrap();

    // CPU reference.
    let mut expect = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let mut s = olds[i].clone();
        let mut ch = Changes::default();
        diff_and_refresh(&mut s, &news[i], c.width, c.first_index, &mut ch);
        assert_eq!(s, news[i]);
        let salt = slot_salt(c.slot);
        let d = (0..ch.len()).fold(0u64, |acc, k| {
            acc.wrapping_add(change(
                salt,
                ch.positions[k],
                load_bits(&ch.old_values, c.width, k),
                load_bits(&ch.new_values, c.width, k),
            ))
        });
        expect.push((ch, d));
    }
    let found_total: usize = expect.iter().map(|e| e.0.len()).sum();
    let capacity = ((found_total as f64 * capacity_frac) as usize).max(1);
    let pos = gpu.alloc(8 * capacity).unwrap();
    let newv = gpu.alloc(4 * capacity).unwrap();
    let oldv = gpu.alloc(4 * capacity).unwrap();
    let inputs: Vec<DiffInput> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| DiffInput {
            snapshot: snap.ptr() + offsets[i] as u64,
            current: cur.ptr() + offsets[i] as u64,
            numel: c.numel as u64,
            width: c.width,
            first_index: c.first_index,
            digest: Some((digests.ptr() + 8 * i as u64, c.slot)),
            f32_source: None,
        })
        .collect();
    let out = DiffOutput {
        positions: pos.ptr(),
        new_values: newv.ptr(),
        old_values: Some(oldv.ptr()),
        capacity: capacity as u64,
        expected: expect_share
            .map(|share| (share * inputs.iter().map(|i| i.numel).sum::<u64>() as f64) as u64),
    };
    // SAFETY: every pointer is inside the buffers above.
    let res = if pinned {
        unsafe { gpu.diff_batch_host_snapshot(&inputs, &out) }.unwrap()
    } else {
        unsafe { gpu.diff_batch(&inputs, &out) }.unwrap()
    };
    assert_eq!(res.found as usize, found_total);
    let g_pos = u64s(&dl(gpu, pos.ptr(), 8 * capacity));
    let g_new = dl(gpu, newv.ptr(), 4 * capacity);
    let g_old = dl(gpu, oldv.ptr(), 4 * capacity);
    let g_dig = u64s(&dl(gpu, digests.ptr(), 8 * cases.len()));
    let g_snap = snap.read(gpu, total);

    if res.is_complete() {
        // Every change in order; snapshot equals current; digests updated.
        for (i, c) in cases.iter().enumerate() {
            let r = res.tensors[i];
            let (ch, d) = &expect[i];
            let what = format!(
                "tensor {i} (numel {}, width {}, density {}, misaligned {})",
                c.numel, c.width, c.density, c.misalign
            );
            assert_eq!(r.found as usize, ch.len(), "{what}");
            assert_eq!(r.written, r.found, "{what}");
            let (o, n) = (r.offset as usize, ch.len());
            assert_eq!(&g_pos[o..o + n], &ch.positions[..], "{what}: positions");
            let vo = r.value_offset as usize;
            assert_eq!(vo, o * c.width);
            assert_eq!(
                &g_new[vo..vo + n * c.width],
                &ch.new_values[..],
                "{what}: new bits"
            );
            assert_eq!(
                &g_old[vo..vo + n * c.width],
                &ch.old_values[..],
                "{what}: old bits"
            );
            assert_eq!(g_dig[i], *d, "{what}: fused digest update");
            let at = offsets[i];
            assert_eq!(
                &g_snap[at..at + c.numel * c.width],
                &news[i][..],
                "{what}: snapshot"
            );
        }
        // The separate O(changed) update kernel gives the same digests.
        let ups: Vec<UpdateInput> = cases
            .iter()
            .enumerate()
            .map(|(i, c)| UpdateInput {
                change_offset: res.tensors[i].offset,
                change_count: res.tensors[i].found,
                width: c.width,
                slot: c.slot,
            })
            .collect();
        // SAFETY: the diff outputs above.
        let upd = unsafe { gpu.digest_update(pos.ptr(), newv.ptr(), oldv.ptr(), &ups) }.unwrap();
        let want: Vec<u64> = expect.iter().map(|e| e.1).collect();
        assert_eq!(upd, want, "digest_update");
    } else {
        // A prefix of the changes (whole tiles, in order) was written and refreshed; the rest
        // of the snapshot is untouched, so the diff can be run again for the rest.
        assert!(res.written < res.found);
        assert!(res.written <= capacity as u64);
        let all_pos: Vec<u64> = expect.iter().flat_map(|e| e.0.positions.clone()).collect();
        assert_eq!(
            &g_pos[..res.written as usize],
            &all_pos[..res.written as usize]
        );
        // The written changes (a prefix of each tensor's) are refreshed in the snapshot, and
        // maybe more whole tiles: every element holds its old or its new bits. (The digest
        // words are then partial: the caller recomputes them.)
        for (i, c) in cases.iter().enumerate() {
            let (ch, _) = &expect[i];
            let written = res.tensors[i].written as usize;
            assert!(written <= ch.len());
            let at = offsets[i];
            let got = &g_snap[at..at + c.numel * c.width];
            for (e, ((g, o), n)) in got
                .chunks(c.width)
                .zip(olds[i].chunks(c.width))
                .zip(news[i].chunks(c.width))
                .enumerate()
            {
                assert!(g == o || g == n, "snapshot {i} element {e}");
            }
            for k in 0..written {
                let e = (ch.positions[k] - c.first_index) as usize * c.width;
                assert_eq!(&got[e..e + c.width], &news[i][e..e + c.width]);
            }
        }
    }
}

/// Every width at sizes around vector, tile and word boundaries; the density cycles with the
/// size (`density_step` per width) and one case in `misalign_every` is not 16-byte aligned.
fn edge_cases(rng: &mut Rng, density_step: usize, misalign_every: usize) -> Vec<DiffCase> {
    let sizes = [
        0usize, 1, 2, 3, 7, 8, 15, 16, 17, 31, 33, 1000, 4095, 4096, 4097, 8191, 8192, 8193, 16383,
        16384, 16385, 65537, 300_001,
    ];
    let densities = [0.0, 0.0005, 0.01, 0.1, 0.5, 1.0];
    let mut cases = Vec::new();
    for (k, &numel) in sizes.iter().enumerate() {
        for width in [1usize, 2, 4] {
            cases.push(DiffCase {
                numel,
                width,
                density: densities[(k + density_step * width) % densities.len()],
                misalign: (k + width) % misalign_every == 0,
                first_index: rng.below(1 << 40),
                slot: rng.below(1000) as u32,
            });
        }
    }
    cases
}

/// `n` small tensors (up to `max_numel` elements) of every width and a few densities; one in
/// `misalign_every` not 16-byte aligned.
fn many_cases(rng: &mut Rng, n: usize, max_numel: u64, misalign_every: usize) -> Vec<DiffCase> {
    (0..n)
        .map(|i| DiffCase {
            numel: rng.below(max_numel) as usize,
            width: [1, 2, 4][i % 3],
            density: [0.0, 0.01, 0.3][i % 7 % 3],
            misalign: i % misalign_every == 0,
            first_index: rng.below(1 << 33),
            slot: i as u32,
        })
        .collect()
}

/// Five BF16 tensors at 5 % changed: more than the output (sized below) and than the diff's
/// per-tile slots hold. `misaligned`: the one that is not 16-byte aligned.
fn small_output_cases(misaligned: Option<usize>) -> Vec<DiffCase> {
    (0..5)
        .map(|i| DiffCase {
            numel: 200_000 + i,
            width: 2,
            density: 0.05,
            misalign: misaligned == Some(i),
            first_index: 0,
            slot: 0,
        })
        .collect()
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn diff_batch_matches_cpu() {
    let gpu = gpu();
    let mut rng = Rng(1);
    let mut cases = edge_cases(&mut rng, 1, 5);
    // Interleave widths and add a larger one: the batch sorts internally, output per input.
    cases.push(DiffCase {
        numel: (1 << 21) + 5,
        width: 2,
        density: 0.02,
        misalign: false,
        first_index: 7,
        slot: 3,
    });
    run_diff_batch(&gpu, &mut rng, &cases, 1.0);
    // Many small tensors in one batch.
    let many = many_cases(&mut rng, 2000, 3000, 11);
    run_diff_batch(&gpu, &mut rng, &many, 1.0);
    // Repeat the first batch with new data: the same kernels, fresh scratch state.
    run_diff_batch(&gpu, &mut rng, &cases[..10], 1.0);
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn diff_matches_cpu_on_a_large_tensor_and_many_small_ones() {
    let gpu = gpu();
    let mut rng = Rng(11);
    let mut cases = edge_cases(&mut rng, 2, 4);
    cases.push(DiffCase {
        numel: (1 << 23) + 5,
        width: 2,
        density: 0.015,
        misalign: false,
        first_index: 0,
        slot: 5,
    });
    run_diff_batch(&gpu, &mut rng, &cases, 1.0);
    let many = many_cases(&mut rng, 3000, 5000, 13);
    run_diff_batch(&gpu, &mut rng, &many, 1.0);
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn diff_matches_cpu_at_other_tunings() {
    // Other tile sizes, occupancies, prefetch distances (1 and 3 tiles ahead reach tiles of
    // other tensors in these small launches; 0 turns the prefetch off), with and without the
    // stash, in three passes or in one (the look-back): same output.
    let plain = gpu();
    for text in [
        "4,4,1,0",
        "4,4,1,1",
        "3,2,1,3",
        "2,8,1,528",
        "1,8,0,0",
        "4,4,1,264,0",
        "2,8,1,3,1",
        "4,4,1,264,1,0",
        "4,4,1,264,1,1",
        "2,8,1,3,1,1",
        "3,2,1,3,0,1",
        "1,8,0,0,0,1",
    ] {
        let tuning = DiffTuning::parse(text).unwrap();
        let gpu = Gpu::with_tuning(plain.ordinal(), tuning).unwrap();
        let mut rng = Rng(51 + tuning.items as u64 + tuning.prefetch as u64);
        let mut cases = edge_cases(&mut rng, tuning.items as usize, 3);
        cases.push(DiffCase {
            numel: (1 << 22) + 5,
            width: 2,
            density: 0.015,
            misalign: false,
            first_index: 9,
            slot: 7,
        });
        run_diff_batch(&gpu, &mut rng, &cases, 1.0);
        let many = many_cases(&mut rng, 2000, 5000, 7);
        run_diff_batch(&gpu, &mut rng, &many, 1.0);
        run_diff_batch(&gpu, &mut rng, &small_output_cases(Some(1)), 0.4);
    }
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn diff_expecting_a_dense_step_runs_in_one_pass() {
    // `DiffOutput::expected` above ONE_PASS_ABOVE picks the one-pass form on the default
    // tuning (it allocates no scratch slots); the outputs, digests and snapshots are the CPU's
    // bit for bit, at densities where the three passes' slots would overflow, and when the
    // output is too small. Expecting a sparse step keeps the three passes (slots allocated).
    let plain = gpu();
    let dense = Gpu::with_tuning(plain.ordinal(), DiffTuning::default()).unwrap();
    assert!(!dense.tuning().direct);
    let mut rng = Rng(97);
    let mut cases = edge_cases(&mut rng, 2, 3);
    for (i, density) in [0.05, 0.1, 0.25, 0.5, 0.9].into_iter().enumerate() {
        cases.push(DiffCase {
            numel: (1 << 20) + 7 * i,
            width: [2, 4, 1, 2, 2][i],
            density,
            misalign: i == 3,
            first_index: 1000 * i as u64,
            slot: i as u32,
        });
    }
    run_diff_batch_at(&dense, &mut rng, &cases, 1.0, false, Some(0.5));
    run_diff_batch_at(
        &dense,
        &mut rng,
        &small_output_cases(Some(1)),
        0.4,
        false,
        Some(0.3),
    );
    assert_eq!(
        dense.large_scratch_bytes(),
        0,
        "the one-pass form uses no slots"
    );
    let sparse = Gpu::with_tuning(plain.ordinal(), DiffTuning::default()).unwrap();
    run_diff_batch_at(&sparse, &mut rng, &cases, 1.0, false, Some(0.01));
    assert!(
        sparse.large_scratch_bytes() > 0,
        "a sparse step runs the three passes"
    );
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn pinned_buffer_round_trips() {
    let gpu = gpu();
    let empty = gpu.alloc_pinned(0).unwrap();
    assert!(empty.is_empty() && empty.as_slice().is_empty());
    let mut rng = Rng(21);
    let data = rng.bytes(1_000_003);
    let mut h = gpu.alloc_pinned(data.len()).unwrap();
    assert!(
        h.as_slice().iter().all(|&b| b == 0),
        "a new pinned buffer is zeroed"
    );
    assert_ne!(h.ptr(), 0);
    let d = gpu.upload(&data).unwrap();
    // Device → pinned at an offset, then back to a fresh device buffer.
    // SAFETY: inside both buffers; the host reads `h` only after synchronising.
    unsafe { gpu.copy_to_pinned(&h, 5, d.ptr(), data.len() - 5) }.unwrap();
    gpu.synchronize().unwrap();
    assert_eq!(&h.as_slice()[5..], &data[..data.len() - 5]);
    assert!(h.as_slice()[..5].iter().all(|&b| b == 0));
    h.as_mut_slice().copy_from_slice(&data);
    let back = gpu.alloc(data.len()).unwrap();
    // SAFETY: as above.
    unsafe { gpu.copy_from_pinned(back.ptr(), &h, 0, data.len()) }.unwrap();
    assert_eq!(dl(&gpu, back.ptr(), data.len()), data);
    // The kernels reach it through its device address: a device copy into the mapping.
    // SAFETY: `h` is mapped into the device for its whole length.
    unsafe { gpu.copy_device(h.ptr(), d.ptr() + 1, 64) }.unwrap();
    gpu.synchronize().unwrap();
    assert_eq!(&h.as_slice()[..64], &data[1..65]);
    // Out of bounds is refused, not copied.
    // SAFETY: refused before any copy.
    let e = unsafe { gpu.copy_to_pinned(&h, data.len() - 3, d.ptr(), 4) }.unwrap_err();
    assert!(matches!(e, CudaError::InvalidArgument(_)), "{e:?}");
    let e = unsafe { gpu.copy_from_pinned(back.ptr(), &h, usize::MAX, 2) }.unwrap_err();
    assert!(matches!(e, CudaError::InvalidArgument(_)), "{e:?}");
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn diff_with_pinned_snapshot_matches_cpu() {
    // The snapshot in page-locked host memory: the kernels read it over PCIe and refresh it
    // in place; outputs, digests and the host bytes must be the CPU's, bit for bit.
    let plain = gpu();
    // The default form and the other one (three passes or one).
    let mut other = plain.tuning();
    other.direct = !other.direct;
    let other = Gpu::with_tuning(plain.ordinal(), other).unwrap();
    for gpu in [&plain, &other] {
        let mut rng = Rng(31);
        let mut cases = edge_cases(&mut rng, 3, 4);
        cases.push(DiffCase {
            numel: (1 << 22) + 3,
            width: 2,
            density: 0.01,
            misalign: false,
            first_index: 0,
            slot: 2,
        });
        run_diff_batch_at(gpu, &mut rng, &cases, 1.0, true, None);
        let many = many_cases(&mut rng, 1500, 5000, 13);
        run_diff_batch_at(gpu, &mut rng, &many, 1.0, true, None);
        // Output too small (and tiles past their slots): a prefix written.
        let small = small_output_cases(Some(3));
        run_diff_batch_at(gpu, &mut rng, &small, 0.4, true, None);
    }
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn diff_batch_with_small_output_writes_a_prefix() {
    let gpu = gpu();
    let mut rng = Rng(2);
    let cases = small_output_cases(None);
    run_diff_batch(&gpu, &mut rng, &cases, 0.4);
}

/// The core's chunking of one slot's sorted positions (flush::encode_changes).
fn core_chunks(positions: &[u64], grid: u64) -> Vec<(u64, u64, Vec<u32>)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < positions.len() {
        let cell_end = positions[i] / grid * grid + grid;
        let j = i + positions[i..].partition_point(|&p| p < cell_end);
        let start = positions[i];
        let range = positions[j - 1] - start + 1;
        let rel = positions[i..j]
            .iter()
            .map(|&p| (p - start) as u32)
            .collect();
        out.push((start, range, rel));
        i = j;
    }
    out
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn encoders_match_the_core() {
    let gpu = gpu();
    let mut rng = Rng(4);
    for grid in [1u64, 7, 1000, 4096, 1 << 20] {
        let mut inputs = Vec::new();
        let mut all_pos = Vec::new();
        let mut lists = Vec::new();
        for t in 0..40 {
            let numel = [0u64, 1, 5, 999, 4097, 100_000, 2_500_001][t % 7];
            let first_index = if t % 2 == 0 { 0 } else { rng.below(1 << 36) };
            let density: f64 = [0.0, 0.001, 0.05, 0.6, 1.0][t % 5];
            let dense = if grid == 1 {
                density.min(0.01)
            } else {
                density
            };
            let pos: Vec<u64> = (0..numel)
                .filter(|_| rng.chance(dense))
                .map(|k| first_index + k)
                .collect();
            inputs.push(EncodeInput {
                change_offset: all_pos.len() as u64,
                change_count: pos.len() as u64,
                first_index,
                numel,
            });
            all_pos.extend_from_slice(&pos);
            lists.push(pos);
        }
        let bytes: Vec<u8> = all_pos.iter().flat_map(|p| p.to_le_bytes()).collect();
        let dpos = gpu.upload(&bytes).unwrap();
        let abs = gpu.alloc(4 * all_pos.len().max(1)).unwrap();
        let bm_len = Gpu::bitmap_bytes(&inputs, grid) as usize;
        let bm = gpu.alloc(bm_len.max(8)).unwrap();
        // SAFETY: buffers sized as documented.
        let chunks = unsafe {
            gpu.encode_positions(dpos.ptr(), &inputs, grid, Some(abs.ptr()), Some(bm.ptr()))
        }
        .unwrap();
        let g_abs = dl(&gpu, abs.ptr(), 4 * all_pos.len());
        let g_bm = dl(&gpu, bm.ptr(), bm_len);
        let mut want = Vec::new();
        for (i, list) in lists.iter().enumerate() {
            for c in core_chunks(list, grid) {
                want.push((i, c));
            }
        }
        assert_eq!(chunks.len(), want.len(), "grid {grid}");
        for (c, (i, (start, range, rel))) in chunks.iter().zip(&want) {
            assert_eq!(
                (c.input, c.start, c.range, c.count),
                (*i, *start, *range, rel.len() as u64)
            );
            let mut a = Vec::new();
            encode_positions(PosCodec::Abs32, rel, *range as u32, &mut a);
            let lo = c.lo as usize;
            assert_eq!(
                &g_abs[4 * lo..4 * lo + a.len()],
                &a[..],
                "abs32, grid {grid}"
            );
            let mut b = Vec::new();
            encode_positions(PosCodec::Bitmap, rel, *range as u32, &mut b);
            let at = c.bitmap_offset as usize;
            assert_eq!(&g_bm[at..at + b.len()], &b[..], "bitmap, grid {grid}");
        }
    }
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn digest_matches_the_core() {
    let gpu = gpu();
    let mut rng = Rng(5);
    let mut bufs = Vec::new();
    let mut inputs = Vec::new();
    let mut keep: Vec<DeviceBuffer> = Vec::new();
    for t in 0..30usize {
        let numel = [0usize, 1, 3, 8191, 8192, 8193, 100_003, 1 << 20][t % 8];
        let width = [1usize, 2, 4][t % 3];
        let data = fill_old(&mut rng, numel, width);
        let first_index = rng.below(1 << 35);
        let buf = gpu.upload(&data).unwrap();
        inputs.push(DigestInput {
            ptr: buf.ptr(),
            numel: numel as u64,
            width,
            first_index,
            slot: t as u32 * 7,
            f32_source: None,
        });
        keep.push(buf);
        bufs.push(data);
    }
    // SAFETY: the uploads above.
    let got = unsafe { gpu.digest(&inputs) }.unwrap();
    for (i, inp) in inputs.iter().enumerate() {
        assert_eq!(
            got[i],
            digest_range(inp.slot, inp.width, &bufs[i], inp.first_index),
            "input {i}"
        );
    }
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn digest_refresh_digests_counts_and_refreshes() {
    // What a stage sent whole without a diff relies on: the digests of the tensors, the
    // snapshot equal to them afterwards, and the count of elements whose bits differed
    // (NaN payloads, ±0 and subnormals compared as bits), against the core.
    let gpu = gpu();
    let mut rng = Rng(11);
    let (mut inputs, mut snaps, mut keep) = (Vec::new(), Vec::new(), Vec::new());
    let mut expect = Vec::new();
    for t in 0..24usize {
        let numel = [0usize, 1, 3, 8191, 8192, 8193, 100_003, 1 << 20][t % 8];
        let width = [1usize, 2, 4][t % 3];
        let density = [0.0, 0.01, 0.5, 1.0][t % 4];
        let old = fill_old(&mut rng, numel, width);
        let new = mutate(&mut rng, &old, width, density);
        let changed = (0..numel)
            .filter(|&i| load_bits(&old, width, i) != load_bits(&new, width, i))
            .count() as u64;
        let first_index = rng.below(1 << 35);
        let cur = gpu.upload(&new).unwrap();
        let snap = gpu.upload(&old).unwrap();
        inputs.push(DigestInput {
            ptr: cur.ptr(),
            numel: numel as u64,
            width,
            first_index,
            slot: t as u32 * 3,
            f32_source: None,
        });
        snaps.push(snap.ptr());
        expect.push((
            digest_range(t as u32 * 3, width, &new, first_index),
            changed,
            new,
        ));
        keep.push((cur, snap));
    }
    // SAFETY: the uploads above, distinct buffers of the inputs' sizes.
    let (digests, counts) = unsafe { gpu.digest_refresh(&inputs, &snaps) }.unwrap();
    for (i, (digest, changed, new)) in expect.iter().enumerate() {
        assert_eq!(digests[i], *digest, "digest {i}");
        assert_eq!(counts[i], *changed, "count {i}");
        // SAFETY: the snapshot buffer, of that size.
        let snap = unsafe { gpu.download(snaps[i], new.len()) }.unwrap();
        assert_eq!(&snap, new, "snapshot {i} refreshed");
    }
    // Mismatched lists are refused, not read past.
    // SAFETY: nothing is launched for a refused call.
    assert!(unsafe { gpu.digest_refresh(&inputs, &snaps[1..]) }.is_err());
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn count_changed_sampled_is_exact_in_full_and_close_when_sampled() {
    // The first delta's density estimate: sampling every block it is the exact count of
    // differing bit patterns (NaN payloads, ±0 compared as bits), against the host's count;
    // sampling one block in 16 of a large tensor it lands near the truth; nothing is written.
    let gpu = gpu();
    let mut rng = Rng(23);
    let (mut inputs, mut snaps, mut keep, mut expect) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for t in 0..16usize {
        let numel = [0usize, 1, 8191, 8193, 100_003, 1 << 22][t % 6];
        let width = [1usize, 2, 4][t % 3];
        let density = [0.0, 0.02, 0.3, 0.7][t % 4];
        let old = fill_old(&mut rng, numel, width);
        let new = mutate(&mut rng, &old, width, density);
        let changed = (0..numel)
            .filter(|&i| load_bits(&old, width, i) != load_bits(&new, width, i))
            .count() as u64;
        let cur = gpu.upload(&new).unwrap();
        let snap = gpu.upload(&old).unwrap();
        inputs.push(DigestInput {
            ptr: cur.ptr(),
            numel: numel as u64,
            width,
            first_index: 0,
            slot: t as u32,
            f32_source: None,
        });
        snaps.push(snap.ptr());
        expect.push((changed, old));
        keep.push((cur, snap));
    }
    // SAFETY: the uploads above, distinct buffers of the inputs' sizes.
    let exact = unsafe { gpu.count_changed_sampled(&inputs, &snaps, 1) }.unwrap();
    // SAFETY: as above.
    let sampled = unsafe { gpu.count_changed_sampled(&inputs, &snaps, 16) }.unwrap();
    for (i, (changed, old)) in expect.iter().enumerate() {
        let numel = inputs[i].numel;
        assert_eq!(exact[i], (numel, *changed), "exact count {i}");
        if numel >= 1 << 22 {
            let (seen, found) = sampled[i];
            assert!(seen > 0, "a large tensor is sampled");
            let got = found as f64 * numel as f64 / seen as f64;
            let truth = *changed as f64;
            assert!(
                (got - truth).abs() <= 0.02 * numel as f64,
                "estimate {i}: {got} against {truth} of {numel}"
            );
        }
        // SAFETY: the snapshot buffer, of that size.
        let snap = unsafe { gpu.download(snaps[i], old.len()) }.unwrap();
        assert_eq!(&snap, old, "snapshot {i} untouched");
    }
    // SAFETY: nothing is launched for a refused call.
    assert!(unsafe { gpu.count_changed_sampled(&inputs, &snaps, 0) }.is_err());
    assert!(unsafe { gpu.count_changed_sampled(&inputs, &snaps[1..], 16) }.is_err());
}
