//! Every GPU kernel against its CPU twin in `deltacast`, bit for bit.
//!
//! Built without the `cuda` feature (a plain `cargo test`), every test that needs a GPU is
//! `ignored` with its reason in cargo's output. Built with it, a missing GPU fails the test:
//! a cuda build is made to run them (`scripts/gpu-tests.sh`).

use deltacast_testkit as common;

use deltacast::codec::{encode_positions, PosCodec, ValCodec};
use deltacast::diff::{diff_and_refresh, Changes};
use deltacast::digest::{change, digest_range, slot_salt};
use deltacast::dtype::load_bits;
use deltacast::wire::parse_frame;
use deltacast::{CodecChoice, DType, FlushConfig, Receiver, Sender, SlotInfo, SlotTable};
use deltacast_cuda::{
    ApplyInput, ApplyPositions, CudaError, DeviceBuffer, DiffInput, DiffOutput, DiffTuning,
    DigestInput, EncodeInput, Gpu, HostBuffer, UpdateInput,
};

/// The GPU; without one the test fails, saying why.
fn gpu() -> Gpu {
    Gpu::new(0).unwrap_or_else(|e| panic!("this test needs a GPU (GPU 0): {e}"))
}

/// tests/gpu_sync.rs is compiled only with the `cuda` feature; without it, this test stands
/// for that suite in cargo's output, as ignored.
#[cfg(not(feature = "cuda"))]
#[test]
#[ignore = "tests/gpu_sync.rs, gpu_frames.rs and ipc_auth.rs (the GPU sync over NCCL, CUDA IPC and frames; the IPC link's stranger process) need the cuda feature and a GPU (gpu_sync's NCCL tests: 2)"]
fn gpu_sync_suite_needs_the_cuda_feature() {
    panic!("these suites are built only with --features cuda (scripts/gpu-tests.sh)");
}

use common::Rng;

fn mask(width: usize) -> u32 {
    if width == 4 {
        u32::MAX
    } else {
        (1u32 << (8 * width)) - 1
    }
}

/// A bit pattern: random, or one of the floats that compare wrongly as floats.
fn special(rng: &mut Rng, width: usize) -> u32 {
    let pats: &[u32] = match width {
        1 => &[0x00, 0x80, 0x7f, 0xff, 0x01, 0x81, 0x78, 0xf8],
        2 => &[
            0x0000, 0x8000, 0x7fc0, 0x7fc1, 0xffff, 0x7f81, 0x0001, 0x8001, 0x7f80, 0xff80,
        ],
        _ => &[
            0,
            0x8000_0000,
            0x7fc0_0000,
            0x7fc0_0001,
            0xffff_ffff,
            0x7f80_0001,
            1,
            0x8000_0001,
            0x7f80_0000,
        ],
    };
    if rng.chance(0.3) {
        pats[rng.below(pats.len() as u64) as usize]
    } else {
        rng.next_u64() as u32 & mask(width)
    }
}

fn fill_old(rng: &mut Rng, numel: usize, width: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(numel * width);
    for _ in 0..numel {
        out.extend_from_slice(&special(rng, width).to_le_bytes()[..width]);
    }
    out
}

/// `old` with about `density` of its elements changed to other bits (±1 ULP mostly, specials).
fn mutate(rng: &mut Rng, old: &[u8], width: usize, density: f64) -> Vec<u8> {
    let mut new = old.to_vec();
    for i in 0..old.len() / width {
        if !rng.chance(density) {
            continue;
        }
        let o = load_bits(old, width, i);
        let mut n = match rng.below(4) {
            0 => o.wrapping_add(1) & mask(width),
            1 => o.wrapping_sub(1) & mask(width),
            2 => o ^ (1 << (8 * width - 1)), // sign flip: +0 <-> -0
            _ => special(rng, width),
        };
        if n == o {
            n ^= 1;
        }
        new[i * width..(i + 1) * width].copy_from_slice(&n.to_le_bytes()[..width]);
    }
    new
}

fn dl(gpu: &Gpu, ptr: u64, len: usize) -> Vec<u8> {
    // SAFETY: the tests only download what they allocated.
    unsafe { gpu.download(ptr, len) }.expect("download")
}

fn u64s(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
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
                assert_eq!(e, CudaError::NotBuilt(deltacast_cuda::NOT_BUILT));
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
    run_diff_batch_at(gpu, rng, cases, capacity_frac, false);
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

/// [`run_diff_batch`] with the snapshot in device memory or (`pinned`) in pinned host memory.
fn run_diff_batch_at(
    gpu: &Gpu,
    rng: &mut Rng,
    cases: &[DiffCase],
    capacity_frac: f64,
    pinned: bool,
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
        })
        .collect();
    let out = DiffOutput {
        positions: pos.ptr(),
        new_values: newv.ptr(),
        old_values: Some(oldv.ptr()),
        capacity: capacity as u64,
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
        "8,2,1,3",
        "2,8,1,528",
        "1,8,0,0",
        "4,4,1,264,0",
        "2,8,1,3,1",
        "4,4,1,264,1,0",
        "4,4,1,264,1,1",
        "2,8,1,3,1,1",
        "8,2,1,3,0,1",
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
        run_diff_batch_at(gpu, &mut rng, &cases, 1.0, true);
        let many = many_cases(&mut rng, 1500, 5000, 13);
        run_diff_batch_at(gpu, &mut rng, &many, 1.0, true);
        // Output too small (and tiles past their slots): a prefix written.
        let small = small_output_cases(Some(3));
        run_diff_batch_at(gpu, &mut rng, &small, 0.4, true);
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

fn table() -> SlotTable {
    SlotTable::new(vec![
        SlotInfo::new("a.bf16", DType::BF16, vec![300, 517]),
        SlotInfo::new("b.f32", DType::F32, vec![12_345]),
        SlotInfo::new("c.f8", DType::F8E4M3, vec![3, 7, 11]),
        SlotInfo::new("d.f16", DType::F16, vec![1]),
        SlotInfo::new("e.bf16", DType::BF16, vec![1 << 18]),
    ])
    .unwrap()
}

/// One sync's frames on the GPU: the frames copied to the device (kept alive by the
/// returned buffers), their chunks, the digests they announce, and whether it is a seed.
struct DeviceSync {
    _frames: Vec<DeviceBuffer>,
    chunks: Vec<ApplyInput>,
    expected: Vec<u64>,
    seed: bool,
}

fn device_sync(
    gpu: &Gpu,
    table: &SlotTable,
    slots: &[DeviceBuffer],
    frames: &[Vec<u8>],
) -> DeviceSync {
    let mut dev_frames = Vec::new();
    let mut chunks = Vec::new();
    let mut expected = vec![None; table.len()];
    let mut seed = false;
    for f in frames {
        let frame = parse_frame(f).expect("a valid frame");
        seed = frame.header.kind == deltacast::wire::FrameKind::Seed;
        let dev = gpu.upload(f).unwrap();
        for e in &frame.entries {
            assert_eq!(e.val_codec, ValCodec::Raw);
            let s = &table.slots()[e.slot as usize];
            chunks.push(ApplyInput {
                dst: slots[e.slot as usize].ptr(),
                slot_numel: s.numel(),
                width: s.dtype.width(),
                slot: e.slot,
                start: e.start,
                range: e.range,
                count: e.count,
                positions: ApplyPositions::from_pos_codec(e.pos_codec).expect("GPU codec"),
                pos_section: dev.ptr() + e.pos_offset,
                pos_len: e.pos_len,
                val_section: dev.ptr() + e.val_offset,
                val_len: e.val_len,
            });
        }
        for d in &frame.digests {
            expected[d.slot as usize] = Some(d.new);
        }
        dev_frames.push(dev);
    }
    DeviceSync {
        _frames: dev_frames,
        chunks,
        expected: expected.into_iter().map(|d| d.expect("digest")).collect(),
        seed,
    }
}

/// Applies one sync's frames on the GPU (frames copied to the device, chunks decoded there).
fn gpu_apply(
    gpu: &Gpu,
    table: &SlotTable,
    slots: &[DeviceBuffer],
    frames: &[Vec<u8>],
    held: &[u64],
) -> deltacast_cuda::Result<Vec<u64>> {
    let sync = device_sync(gpu, table, slots, frames);
    // SAFETY: chunk pointers are inside the uploaded frames and slots.
    unsafe { gpu.apply_verified(&sync.chunks, sync.seed, held, &sync.expected) }
}

/// The CPU side of the apply tests: a core sender and receiver over `table()` with random
/// contents, and zeroed device slots for the GPU's copy of the receiver's state.
struct ApplyRig {
    table: SlotTable,
    sender: Sender,
    receiver: Receiver,
    current: Vec<Vec<u8>>,
    slots: Vec<DeviceBuffer>,
    digests: Vec<u64>,
    rng: Rng,
}

impl ApplyRig {
    fn new(gpu: &Gpu, pos: PosCodec, chunk_elems: u64, seed: u64) -> ApplyRig {
        let mut rng = Rng(seed);
        let table = table();
        let config = FlushConfig {
            bucket_size: 64 << 10,
            chunk_elems,
            codec: CodecChoice::Fixed(pos, ValCodec::Raw),
        };
        let current = table
            .slots()
            .iter()
            .map(|s| fill_old(&mut rng, s.numel() as usize, s.dtype.width()))
            .collect();
        let slots = table
            .slots()
            .iter()
            .map(|s| gpu.alloc_zeroed(s.nbytes() as usize).unwrap())
            .collect();
        ApplyRig {
            sender: Sender::new(table.clone(), config).unwrap(),
            receiver: Receiver::new(table.clone()),
            digests: vec![0; table.len()],
            table,
            current,
            slots,
            rng,
        }
    }

    /// The next sync's frames, applied by the CPU receiver too.
    fn frames(&mut self) -> Vec<Vec<u8>> {
        let mut frames = Vec::new();
        let refs: Vec<&[u8]> = self.current.iter().map(Vec::as_slice).collect();
        self.sender
            .sync(&refs, |f| {
                frames.push(f);
                Ok(())
            })
            .unwrap();
        for f in &frames {
            self.receiver.receive(f).unwrap();
        }
        frames
    }

    /// Asserts the GPU slots hold `want` (one byte vector per slot).
    fn assert_slots(&self, gpu: &Gpu, want: &[Vec<u8>], what: &str) {
        for (id, s) in self.slots.iter().enumerate() {
            assert_eq!(dl(gpu, s.ptr(), s.len()), want[id], "{what} slot {id}");
        }
    }

    /// Changes `density` of every slot's elements.
    fn mutate(&mut self, density: f64) {
        for (c, s) in self.current.iter_mut().zip(self.table.slots()) {
            *c = mutate(&mut self.rng, c, s.dtype.width(), density);
        }
    }
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn journaled_apply_matches_the_receiver_and_undoes_to_the_previous_bytes() {
    // Each delta applied with a journal, then undone (the bytes must be the previous
    // version's again, byte for byte), then applied again (the receiver's bytes).
    let gpu = gpu();
    for (pos, chunk_elems) in [(PosCodec::Abs32, 1000u64), (PosCodec::Bitmap, 777)] {
        let mut rig = ApplyRig::new(&gpu, pos, chunk_elems, 60 + chunk_elems);
        for step in 0..6 {
            let before: Vec<Vec<u8>> = rig.receiver.store().to_vec();
            let frames = rig.frames();
            let sync = device_sync(&gpu, &rig.table, &rig.slots, &frames);
            let what = format!("{pos:?} step {step}");
            if sync.seed {
                // SAFETY: chunk pointers are inside the uploaded frames and slots.
                rig.digests =
                    unsafe { gpu.apply_verified(&sync.chunks, true, &rig.digests, &sync.expected) }
                        .unwrap();
            } else {
                let (_, len) = deltacast_cuda::journal_layout(&sync.chunks);
                let journal = gpu.alloc(len.max(4) as usize).unwrap();
                for round in 0..2 {
                    // SAFETY: as above; the journal is sized by its layout.
                    let got = unsafe {
                        gpu.apply_verified_journaled(
                            &sync.chunks,
                            &rig.digests,
                            &sync.expected,
                            journal.ptr(),
                        )
                    }
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(got, rig.receiver.digests(), "{what}");
                    if round == 0 {
                        // SAFETY: the same chunks and the journal their scatter filled.
                        unsafe { gpu.apply_undo(&sync.chunks, journal.ptr()) }.unwrap();
                        rig.assert_slots(&gpu, &before, &format!("{what}: undo"));
                    } else {
                        rig.digests = got;
                    }
                }
            }
            rig.assert_slots(&gpu, rig.receiver.store(), &what);
            rig.mutate([0.01, 0.3, 0.0005, 1.0, 0.05, 0.0][step % 6]);
        }
    }
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn apply_matches_the_receiver() {
    let gpu = gpu();
    for (pos, chunk_elems) in [
        (PosCodec::Abs32, 1000u64),
        (PosCodec::Bitmap, 777),
        (PosCodec::Abs32, 1 << 20),
        (PosCodec::Bitmap, 1 << 16),
    ] {
        let mut rig = ApplyRig::new(&gpu, pos, chunk_elems, 6 + chunk_elems);
        for step in 0..5 {
            let frames = rig.frames();
            let what = format!("{pos:?} step {step}");
            rig.digests = gpu_apply(&gpu, &rig.table, &rig.slots, &frames, &rig.digests)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(rig.digests, rig.receiver.digests(), "{what}");
            rig.assert_slots(&gpu, rig.receiver.store(), &what);
            rig.mutate([0.01, 0.3, 0.0005, 1.0][step % 4]);
        }
    }
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn apply_refuses_bad_chunks_and_writes_nothing() {
    let gpu = gpu();
    let table = SlotTable::new(vec![SlotInfo::new("w", DType::BF16, vec![10_000])]).unwrap();
    let slot = gpu.upload(&vec![0u8; 20_000]).unwrap();
    let held = {
        let zeros = vec![0u8; 20_000];
        digest_range(0, 2, &zeros, 0)
    };
    let mk = |pos: ApplyPositions,
              sec: &DeviceBuffer,
              pos_len: u64,
              vals: &DeviceBuffer,
              count: u64,
              range: u64| ApplyInput {
        dst: slot.ptr(),
        slot_numel: 10_000,
        width: 2,
        slot: 0,
        start: 100,
        range,
        count,
        positions: pos,
        pos_section: sec.ptr(),
        pos_len,
        val_section: vals.ptr(),
        val_len: count * 2,
    };
    let vals = gpu.upload(&[1, 0, 2, 0, 3, 0]).unwrap();
    let abs = |p: [u32; 3]| {
        gpu.upload(&p.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
            .unwrap()
    };
    let cases: Vec<(DeviceBuffer, ApplyPositions, u64, &str)> = vec![
        (abs([1, 5, 50]), ApplyPositions::Abs32, 12, "position lies"),
        (
            abs([5, 5, 9]),
            ApplyPositions::Abs32,
            12,
            "strictly increasing",
        ),
        (
            abs([9, 5, 20]),
            ApplyPositions::Abs32,
            12,
            "strictly increasing",
        ),
        // bitmap of range 50 with 4 bits set for a count of 3
        (
            gpu.upload(&[0b1011, 0, 0, 0, 0, 0, 0b10, 0]).unwrap(),
            ApplyPositions::Bitmap,
            7,
            "count",
        ),
        // a stray bit past the range (bit 50 = byte 6, bit 2)
        (
            gpu.upload(&[0b11, 0, 0, 0, 0, 0, 0b100, 0]).unwrap(),
            ApplyPositions::Bitmap,
            7,
            "at or past",
        ),
    ];
    for (sec, codec, pos_len, why) in &cases {
        let chunk = mk(*codec, sec, *pos_len, &vals, 3, 50);
        // SAFETY: inside the buffers above.
        let err = unsafe { gpu.apply_verified(&[chunk], false, &[held], &[0]) }.unwrap_err();
        match err {
            CudaError::BadChunk { chunk: 0, reason } => {
                assert!(reason.contains(why), "{reason} / {why}")
            }
            e => panic!("{why}: {e}"),
        }
        assert_eq!(
            dl(&gpu, slot.ptr(), 20_000),
            vec![0u8; 20_000],
            "{why}: nothing written"
        );
    }
    // Unchanged element (value 0 onto 0), alone and between two real changes: refused, and
    // the real changes are not written either.
    let zeros = gpu.upload(&[0u8; 6]).unwrap();
    let good = abs([1, 5, 9]);
    let chunk = mk(ApplyPositions::Abs32, &good, 12, &zeros, 3, 50);
    // SAFETY: as above.
    let err = unsafe { gpu.apply_verified(&[chunk], false, &[held], &[0]) }.unwrap_err();
    assert!(matches!(err, CudaError::BadChunk { .. }), "{err}");
    let one_noop = gpu.upload(&[7, 0, 0, 0, 9, 0]).unwrap();
    let chunk = mk(ApplyPositions::Abs32, &good, 12, &one_noop, 3, 50);
    // SAFETY: as above.
    let err = unsafe { gpu.apply_verified(&[chunk], false, &[held], &[0]) }.unwrap_err();
    match err {
        CudaError::BadChunk { chunk: 0, reason } => assert!(reason.contains("already"), "{reason}"),
        e => panic!("no-op change: {e}"),
    }
    assert_eq!(
        dl(&gpu, slot.ptr(), 20_000),
        vec![0u8; 20_000],
        "no-op change: nothing written"
    );
    // Header-level refusals, before any launch.
    let chunk = mk(ApplyPositions::Abs32, &good, 8, &vals, 3, 50);
    // SAFETY: as above.
    assert!(unsafe { gpu.apply_check(&[chunk], false, 1) }.is_err());
    let mut far = mk(ApplyPositions::Abs32, &good, 12, &vals, 3, 50);
    far.start = 9_990;
    // SAFETY: as above.
    assert!(unsafe { gpu.apply_check(&[far], false, 1) }.is_err());
    // A good chunk with the wrong expected digest: refused, nothing written.
    let chunk = mk(ApplyPositions::Abs32, &good, 12, &vals, 3, 50);
    // SAFETY: as above.
    let err = unsafe { gpu.apply_verified(&[chunk], false, &[held], &[12345]) }.unwrap_err();
    assert!(matches!(err, CudaError::DigestMismatch { .. }), "{err}");
    assert_eq!(dl(&gpu, slot.ptr(), 20_000), vec![0u8; 20_000]);
    // And with the right one: applied.
    let salt = slot_salt(0);
    let want = [(101u64, 1u32), (105, 2), (109, 3)]
        .iter()
        .fold(held, |d, &(i, v)| d.wrapping_add(change(salt, i, 0, v)));
    // SAFETY: as above.
    let got = unsafe { gpu.apply_verified(&[chunk], false, &[held], &[want]) }.unwrap();
    assert_eq!(got, vec![want]);
    let after = dl(&gpu, slot.ptr(), 20_000);
    assert_eq!(load_bits(&after, 2, 101), 1);
    assert_eq!(load_bits(&after, 2, 109), 3);
    let _ = table;
}

// ---------------------------------------------------------------------------------------------
// Entropy codecs (kernels/entropy.cu) against the core's gaps and ulp, byte for byte.

/// One chunk for the entropy coder: positions relative to `start`, old and new bits.
struct CodeCase {
    width: usize,
    start: u64,
    range: u32,
    rel: Vec<u32>,
    old: Vec<u8>,
    new: Vec<u8>,
}

fn put_bits(buf: &mut [u8], i: usize, width: usize, bits: u32) {
    buf[i * width..(i + 1) * width].copy_from_slice(&bits.to_le_bytes()[..width]);
}

/// `count` sorted distinct positions below `range`: iid, clustered with far jumps (escape
/// codes in otherwise dense blocks), or every element.
fn code_positions(rng: &mut Rng, count: u32, range: u32) -> Vec<u32> {
    if count == range {
        return (0..range).collect();
    }
    let mut rel: Vec<u32> = if rng.chance(0.5) && range as u64 > 4 * count as u64 {
        // Runs of near neighbours separated by long jumps.
        let mut out = Vec::with_capacity(count as usize);
        let mut p = rng.below(16.min(range as u64));
        while out.len() < count as usize && p < range as u64 {
            out.push(p as u32);
            p += if rng.chance(0.01) {
                1 + rng.below((range as u64 / 8).max(1))
            } else {
                1 + rng.below(4)
            };
        }
        out
    } else {
        let mut set = std::collections::BTreeSet::new();
        while set.len() < count as usize {
            set.insert(rng.below(range as u64) as u32);
        }
        set.into_iter().collect()
    };
    rel.dedup();
    if rel.is_empty() {
        rel.push(0);
    }
    rel
}

/// Old and new bits of `n` changes: mostly ±1 ULP, some larger steps, sign crossings, NaN,
/// ±0, subnormals, random patterns, and (`unchanged`) a few equal pairs.
fn code_values(rng: &mut Rng, n: usize, width: usize, unchanged: bool) -> (Vec<u8>, Vec<u8>) {
    use deltacast::dtype::{from_ordered, to_ordered};
    let m = mask(width);
    let mut old = vec![0u8; n * width];
    let mut new = vec![0u8; n * width];
    for i in 0..n {
        let o = if rng.chance(0.1) {
            special(rng, width)
        } else {
            rng.next_u64() as u32 & m
        };
        let ord = to_ordered(o, width);
        let step: u32 = match rng.below(100) {
            0..=79 => 1,
            80..=89 => 1 + rng.below(8) as u32,
            90..=95 => 1 + rng.below(5000) as u32,
            _ => rng.next_u64() as u32,
        };
        let mut nw = if rng.chance(0.5) {
            from_ordered(ord.wrapping_add(step) & m, width)
        } else {
            from_ordered(ord.wrapping_sub(step) & m, width)
        };
        if rng.chance(0.02) {
            nw = special(rng, width);
        }
        if nw == o && !unchanged {
            nw = from_ordered(ord.wrapping_add(1) & m, width);
        }
        if unchanged && rng.chance(0.01) {
            nw = o;
        }
        put_bits(&mut old, i, width, o);
        put_bits(&mut new, i, width, nw);
    }
    (old, new)
}

fn code_cases(rng: &mut Rng) -> Vec<CodeCase> {
    let shapes: &[(u32, u32)] = &[
        (1, 1),
        (1, 7),
        (2, 2),
        (5, 9),
        (1023, 5000),
        (1024, 1024),
        (1025, 200_000),
        (3000, 3000),
        (2049, 2100),
        (4000, 40_000_000),
        (1500, u32::MAX),
        (700, 1 << 20),
    ];
    let mut out = Vec::new();
    for width in [1usize, 2, 4] {
        for (i, &(count, range)) in shapes.iter().enumerate() {
            let rel = code_positions(rng, count, range);
            let (old, new) = code_values(rng, rel.len(), width, i % 4 == 3);
            out.push(CodeCase {
                width,
                start: rng.below(100_000),
                range,
                rel,
                old,
                new,
            });
        }
    }
    out
}

fn cpu_gaps(c: &CodeCase) -> Vec<u8> {
    let mut out = Vec::new();
    encode_positions(PosCodec::Gaps, &c.rel, c.range, &mut out);
    out
}

fn cpu_ulp(c: &CodeCase) -> Vec<u8> {
    let mut out = Vec::new();
    deltacast::codec::encode_values(ValCodec::Ulp, c.width, &c.old, &c.new, &mut out);
    out
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn entropy_encoders_match_the_core() {
    let gpu = gpu();
    let mut rng = Rng(0xe17);
    for round in 0..3 {
        let cases = code_cases(&mut rng);
        // Every case's inputs, uploaded one after the other (positions as u64 slot indices).
        let mut pos_bytes = Vec::new();
        let mut old_bytes = Vec::new();
        let mut new_bytes = Vec::new();
        let mut offsets = Vec::new();
        for c in &cases {
            offsets.push((pos_bytes.len(), old_bytes.len()));
            for &r in &c.rel {
                pos_bytes.extend_from_slice(&(c.start + r as u64).to_le_bytes());
            }
            old_bytes.extend_from_slice(&c.old);
            new_bytes.extend_from_slice(&c.new);
            while old_bytes.len() % 4 != 0 {
                old_bytes.push(0);
                new_bytes.push(0);
            }
        }
        // The coder reads DECODE_SLACK bytes past its inputs.
        let slack = deltacast_cuda::DECODE_SLACK as usize;
        for v in [&mut pos_bytes, &mut old_bytes, &mut new_bytes] {
            v.resize(v.len() + slack, 0);
        }
        let pos = gpu.upload(&pos_bytes).expect("upload");
        let old = gpu.upload(&old_bytes).expect("upload");
        let new = gpu.upload(&new_bytes).expect("upload");
        let chunks: Vec<deltacast_cuda::CodeChunk> = cases
            .iter()
            .zip(&offsets)
            .map(|(c, &(p, v))| deltacast_cuda::CodeChunk {
                positions: pos.ptr() + p as u64,
                new_bits: new.ptr() + v as u64,
                old_bits: old.ptr() + v as u64,
                count: c.rel.len() as u64,
                start: c.start + c.rel[0] as u64,
                range: c.range as u64 - c.rel[0] as u64,
                width: c.width,
            })
            .collect();
        let mut scratch = deltacast_cuda::CodeScratch::new();
        // SAFETY: the buffers hold every chunk's items.
        let sizes = unsafe { gpu.entropy_size(&mut scratch, &chunks) }.expect("size");
        // The core codes positions relative to the chunk's first change, as the sync does.
        let rebased: Vec<CodeCase> = cases
            .iter()
            .map(|c| CodeCase {
                width: c.width,
                start: c.start + c.rel[0] as u64,
                range: c.range - c.rel[0],
                rel: c.rel.iter().map(|&r| r - c.rel[0]).collect(),
                old: c.old.clone(),
                new: c.new.clone(),
            })
            .collect();
        let want_gaps: Vec<Vec<u8>> = rebased.iter().map(cpu_gaps).collect();
        let want_ulp: Vec<Vec<u8>> = rebased.iter().map(cpu_ulp).collect();
        for (i, s) in sizes.iter().enumerate() {
            assert_eq!(
                s.gaps,
                want_gaps[i].len() as u64,
                "round {round} case {i} gaps size"
            );
            assert_eq!(
                s.ulp,
                want_ulp[i].len() as u64,
                "round {round} case {i} ulp size"
            );
        }
        // Place: gaps sections packed, values alternately ulp and raw, 4-aligned each.
        let mut places = Vec::new();
        let (mut goff, mut voff) = (0u64, 0u64);
        let mut layout = Vec::new();
        for (i, s) in sizes.iter().enumerate() {
            let raw = i % 5 == 2;
            let vlen = if raw {
                (cases[i].rel.len() * cases[i].width) as u64
            } else {
                s.ulp
            };
            layout.push((goff, voff, vlen, raw));
            goff += s.gaps.next_multiple_of(4);
            voff += vlen.next_multiple_of(4);
        }
        let gbuf = gpu.alloc_zeroed(goff.max(8) as usize).expect("alloc");
        let vbuf = gpu.alloc_zeroed(voff.max(8) as usize).expect("alloc");
        for &(g, v, _, raw) in &layout {
            let codec = if raw {
                deltacast_cuda::CodeValues::Raw
            } else {
                deltacast_cuda::CodeValues::Ulp
            };
            places.push(deltacast_cuda::CodePlace {
                gaps: Some(gbuf.ptr() + g),
                values: Some((codec, vbuf.ptr() + v)),
            });
        }
        // SAFETY: destinations zeroed and sized above.
        unsafe { gpu.entropy_write(&mut scratch, &chunks, &places) }.expect("write");
        let gots = dl(&gpu, gbuf.ptr(), goff.max(8) as usize);
        let gotv = dl(&gpu, vbuf.ptr(), voff.max(8) as usize);
        for (i, &(g, v, vlen, raw)) in layout.iter().enumerate() {
            let g = g as usize;
            assert_eq!(
                &gots[g..g + want_gaps[i].len()],
                &want_gaps[i][..],
                "round {round} case {i} (width {}, count {}, range {}): gaps bytes",
                cases[i].width,
                cases[i].rel.len(),
                cases[i].range
            );
            let want_v = if raw { &rebased[i].new } else { &want_ulp[i] };
            let v = v as usize;
            assert_eq!(vlen as usize, want_v.len());
            assert_eq!(
                &gotv[v..v + want_v.len()],
                &want_v[..],
                "round {round} case {i} (width {}, count {}): value bytes (raw {raw})",
                cases[i].width,
                cases[i].rel.len()
            );
        }
        // Writing other chunks than those sized is refused.
        assert!(unsafe { gpu.entropy_write(&mut scratch, &chunks[1..], &places[1..]) }.is_err());
    }
}

/// Sections of `cases` (core-encoded) decoded on the GPU; per chunk the outcome and, when
/// it decoded, the positions and new bits.
type Decoded = Vec<Result<(Vec<u32>, Vec<u8>), String>>;

fn gpu_decode(
    gpu: &Gpu,
    cases: &[CodeCase],
    gaps: &[Vec<u8>],
    ulp: &[Vec<u8>],
    abs32: bool,
) -> Decoded {
    use deltacast_cuda::{DecodeInput, DecodePositions, DECODE_SLACK};
    // Sections packed 4-aligned, with slack at the end; slots hold the old bits at the
    // positions (and noise elsewhere).
    let mut psec = Vec::new();
    let mut vsec = Vec::new();
    let mut places = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let p = if abs32 {
            c.rel.iter().flat_map(|r| r.to_le_bytes()).collect()
        } else {
            gaps[i].clone()
        };
        let (po, vo) = (psec.len(), vsec.len());
        psec.extend_from_slice(&p);
        vsec.extend_from_slice(&ulp[i]);
        places.push((po, p.len(), vo, ulp[i].len()));
        while psec.len() % 4 != 0 {
            psec.push(0);
        }
        while vsec.len() % 4 != 0 {
            vsec.push(0);
        }
    }
    psec.resize(psec.len() + DECODE_SLACK as usize, 0);
    vsec.resize(vsec.len() + DECODE_SLACK as usize, 0);
    let pbuf = gpu.upload(&psec).expect("upload");
    let vbuf = gpu.upload(&vsec).expect("upload");
    let mut slots = Vec::new();
    let mut outs = Vec::new();
    let mut inputs = Vec::new();
    let mut rng = Rng(cases.len() as u64);
    for (c, &(po, plen, vo, vlen)) in cases.iter().zip(&places) {
        let numel = c.start as usize + c.range as usize;
        let mut held = rng.bytes(numel.min(1 << 24) * c.width);
        if numel > 1 << 24 {
            held.resize(numel * c.width, 0);
        }
        for (k, &r) in c.rel.iter().enumerate() {
            let at = (c.start as usize + r as usize) * c.width;
            held[at..at + c.width].copy_from_slice(&c.old[k * c.width..(k + 1) * c.width]);
        }
        let slot = gpu.upload(&held).expect("upload");
        let pout = gpu
            .alloc_zeroed(c.rel.len() * 4 + DECODE_SLACK as usize)
            .expect("alloc");
        let vout = gpu.alloc_zeroed(c.rel.len() * c.width + 8).expect("alloc");
        let positions = if abs32 {
            DecodePositions::Abs32 {
                section: pbuf.ptr() + po as u64,
                len: plen as u64,
            }
        } else {
            DecodePositions::Gaps {
                section: pbuf.ptr() + po as u64,
                len: plen as u64,
                out: pout.ptr(),
            }
        };
        inputs.push(DecodeInput {
            held: slot.ptr(),
            slot_numel: numel as u64,
            width: c.width,
            start: c.start,
            range: c.range as u64,
            count: c.rel.len() as u64,
            positions,
            values: Some((vbuf.ptr() + vo as u64, vlen as u64, vout.ptr())),
        });
        slots.push(slot);
        outs.push((pout, vout));
    }
    let mut scratch = deltacast_cuda::CodeScratch::new();
    // SAFETY: sections with slack, outputs and slots sized above.
    let errors = unsafe { gpu.entropy_decode(&mut scratch, &inputs) }.expect("decode");
    cases
        .iter()
        .enumerate()
        .map(|(i, c)| {
            if let Some(e) = errors.iter().find(|e| e.chunk == i) {
                return Err(e.reason.to_string());
            }
            let pos = if abs32 {
                c.rel.clone()
            } else {
                dl(gpu, outs[i].0.ptr(), c.rel.len() * 4)
                    .chunks_exact(4)
                    .map(|b| u32::from_le_bytes(b.try_into().unwrap()))
                    .collect()
            };
            Ok((pos, dl(gpu, outs[i].1.ptr(), c.rel.len() * c.width)))
        })
        .collect()
}

/// The core's decode of the same sections: positions, then values from the old bits at them.
fn cpu_decode(
    c: &CodeCase,
    gaps: &[u8],
    ulp: &[u8],
    abs32: bool,
) -> Result<(Vec<u32>, Vec<u8>), String> {
    use deltacast::codec::decode_positions;
    let n = c.rel.len() as u32;
    let mut pos = Vec::new();
    if abs32 {
        pos = c.rel.clone();
    } else {
        decode_positions(PosCodec::Gaps, gaps, n, c.range, &mut pos).map_err(|e| e.to_string())?;
    }
    // The old bits the receiver holds at the decoded positions (the case's old bits where
    // they are the case's positions; the test's slots hold exactly those there).
    let mut old = Vec::new();
    for &p in &pos {
        match c.rel.binary_search(&p) {
            Ok(k) => old.extend_from_slice(&c.old[k * c.width..(k + 1) * c.width]),
            Err(_) => return Err("positions moved: compared by the caller".into()),
        }
    }
    let mut new = Vec::new();
    deltacast::codec::decode_values(ValCodec::Ulp, c.width, ulp, &old, &mut new)
        .map_err(|e| e.to_string())?;
    Ok((pos, new))
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn entropy_decoders_match_the_core() {
    let gpu = gpu();
    let mut rng = Rng(0xdec);
    let cases: Vec<CodeCase> = code_cases(&mut rng)
        .into_iter()
        .filter(|c| c.range < 50_000_000) // slots of the test stay small
        .map(|c| CodeCase {
            start: c.start + c.rel[0] as u64,
            range: c.range - c.rel[0],
            rel: c.rel.iter().map(|&r| r - c.rel[0]).collect(),
            ..c
        })
        .collect();
    let gaps: Vec<Vec<u8>> = cases.iter().map(cpu_gaps).collect();
    let ulp: Vec<Vec<u8>> = cases.iter().map(cpu_ulp).collect();
    for abs32 in [false, true] {
        let got = gpu_decode(&gpu, &cases, &gaps, &ulp, abs32);
        for (i, c) in cases.iter().enumerate() {
            let (pos, new) = got[i].clone().unwrap_or_else(|e| panic!("case {i}: {e}"));
            assert_eq!(pos, c.rel, "case {i} positions (abs32 {abs32})");
            assert_eq!(new, c.new, "case {i} values (abs32 {abs32})");
        }
    }
    // Damaged sections: the GPU accepts exactly what the core accepts, with the same result.
    let small: Vec<usize> = (0..cases.len())
        .filter(|&i| cases[i].rel.len() <= 3000)
        .collect();
    let mut checked = (0, 0);
    for trial in 0..300 {
        let i = small[rng.below(small.len() as u64) as usize];
        let (mut g, mut u) = (gaps[i].clone(), ulp[i].clone());
        let target = if trial % 2 == 0 { &mut g } else { &mut u };
        if target.is_empty() {
            continue;
        }
        match rng.below(4) {
            0 => {
                let at = rng.below(target.len() as u64) as usize;
                target[at] ^= 1 << rng.below(8);
            }
            1 => {
                let at = rng.below(target.len() as u64) as usize;
                target[at] = rng.next_u64() as u8;
            }
            2 => {
                target.pop();
            }
            _ => target.push(rng.next_u64() as u8),
        }
        let case = [CodeCase {
            width: cases[i].width,
            start: cases[i].start,
            range: cases[i].range,
            rel: cases[i].rel.clone(),
            old: cases[i].old.clone(),
            new: cases[i].new.clone(),
        }];
        let got = gpu_decode(&gpu, &case, &[g.clone()], &[u.clone()], false).remove(0);
        let want = cpu_decode(&case[0], &g, &u, false);
        let moved = matches!(&want, Err(e) if e.starts_with("positions moved"));
        match (&got, &want) {
            (Ok((pos, _)), Err(_)) if moved => {
                // The positions decoded to others: the GPU's ulp read the slot's other bits
                // there; the positions themselves must be what the core decodes.
                let mut cpu_pos = Vec::new();
                deltacast::codec::decode_positions(
                    PosCodec::Gaps,
                    &g,
                    case[0].rel.len() as u32,
                    case[0].range,
                    &mut cpu_pos,
                )
                .expect("the core accepted these positions");
                assert_eq!(pos, &cpu_pos, "trial {trial}");
                checked.0 += 1;
            }
            (Ok(a), Ok(b)) => {
                assert_eq!(a, b, "trial {trial}: both accepted, different results");
                checked.0 += 1;
            }
            (Err(_), Err(_)) if !moved => checked.1 += 1,
            _ => panic!("trial {trial} case {i}: GPU {got:?} vs core {want:?}"),
        }
    }
    assert!(checked.0 > 0 && checked.1 > 50, "{checked:?}");
}
