//! fp32 sources for bf16 slots on the GPU: the kernels that read a sender's tensors (the diff
//! in every form, the digest, the digest refresh of a stage sent whole) round fp32 to bf16 as
//! the core's `deltacast::Bf16Rule` does, for every one of the 2^32 fp32 patterns; and a
//! `GpuSender` over fp32 tensors syncs, through seeds, deltas and whole stages, exactly the
//! bf16 the CPU rounding gives (a CPU `Receiver` applies the captured frames).
//!
//! Compiled only with the `cuda` feature (without it, tests/gpu.rs lists the GPU suites as
//! ignored); a cuda build is made to run on a GPU, so a missing one fails with the reason.
#![cfg(feature = "cuda")]

mod kernel_cases;

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};

use deltacast::diff::{diff_and_refresh, Changes};
use deltacast::digest::{change, digest_range, slot_salt};
use deltacast::dtype::load_bits;
use deltacast::wire::split_frames;
use deltacast::{Bf16Rule, DType, Receiver, SlotInfo, SlotTable};
use deltacast_cuda::frame_link::FrameLink;
use deltacast_cuda::sync::{GpuSender, GpuSenderConfig, GpuTensor, SnapshotPlace};
use deltacast_cuda::{
    CudaError, DeviceBuffer, DiffInput, DiffOutput, DiffTuning, DigestInput, Gpu,
};
use deltacast_testkit::Rng;
use kernel_cases::{dl, gpu, u64s};

/// fp32 patterns where rounding is easy to get wrong: NaN payloads of both signs (quiet,
/// signalling, all ones), ±Inf, ±0, subnormals (smallest, rounding up, the largest), ties to
/// even both ways, the largest finite (rounds to Inf) and the largest that stays finite.
const EDGES: &[u32] = &[
    0x7FC0_0000,
    0x7FC0_0001,
    0x7F80_0001,
    0x7FFF_FFFF,
    0xFFC0_0000,
    0xFF80_0001,
    0xFFFF_FFFF,
    0x7F80_0000,
    0xFF80_0000,
    0x0000_0000,
    0x8000_0000,
    0x0000_0001,
    0x0000_8001,
    0x8000_8000,
    0x007F_FFFF,
    0x807F_FFFF,
    0x3F80_8000,
    0x3F81_8000,
    0xBF80_8000,
    0x7F7F_FFFF,
    0xFF7F_FFFF,
    0x7F7F_7FFF,
];

fn f32_bytes(bits: &[u32]) -> Vec<u8> {
    bits.iter().flat_map(|b| b.to_le_bytes()).collect()
}

/// `rule`'s bf16 of every fp32 in `src` (little-endian bytes), as the CPU sender rounds.
fn cpu_round(rule: Bf16Rule, src: &[u8]) -> Vec<u8> {
    let mut out = vec![0u8; src.len() / 2];
    rule.convert_slice(src, &mut out);
    out
}

/// A random fp32 pattern: an edge, a float near 1, or any bits.
fn random_f32(rng: &mut Rng) -> u32 {
    match rng.below(3) {
        0 => EDGES[rng.below(EDGES.len() as u64) as usize],
        1 => 0x3F00_0000 | (rng.next_u64() as u32 & 0x00FF_FFFF),
        _ => rng.next_u64() as u32,
    }
}

/// `old` with about `density` of its elements changed: half below bf16's resolution (the low
/// 16 bits only: the rounding may not change), half to other patterns.
fn step_f32(rng: &mut Rng, old: &[u32], density: f64) -> Vec<u32> {
    old.iter()
        .map(|&b| {
            if !rng.chance(density) {
                b
            } else if rng.chance(0.5) {
                b ^ (rng.next_u64() as u32 & 0xFFFF)
            } else {
                random_f32(rng)
            }
        })
        .collect()
}

/// The plain digest (no conversion) of `numel` bf16 at `ptr`: the kernel tests/gpu.rs checks
/// against the core, used here as the independent side.
fn plain_digest(gpu: &Gpu, ptr: u64, numel: u64, first_index: u64, slot: u32) -> u64 {
    let input = DigestInput {
        ptr,
        numel,
        width: 2,
        first_index,
        slot,
        f32_source: None,
    };
    // SAFETY: the caller's buffer of `numel` bf16.
    unsafe { gpu.digest(&[input]) }.expect("digest")[0]
}

#[test]
fn every_f32_pattern_rounds_as_the_core_in_the_diff_and_the_refresh() {
    // All 2^32 patterns in batches; each snapshot starts as the complement of the expected
    // bits, so every element changes and the diff must write every rounded value.
    let gpu = gpu();
    let rule = Bf16Rule::default();
    const BATCH: u64 = 1 << 26;
    let n = BATCH as usize;
    let first_index = 5;
    let src = gpu.alloc(4 * n).expect("alloc");
    let snap = gpu.alloc(2 * n).expect("alloc");
    let pos = gpu.alloc(8 * n).expect("alloc");
    let newv = gpu.alloc(2 * n).expect("alloc");
    let oldv = gpu.alloc(2 * n).expect("alloc");
    let word = gpu.alloc_zeroed(8).expect("alloc");
    let mut nan_seen = 0u64;
    for batch in 0..(1u64 << 32) / BATCH {
        let bits: Vec<u32> = (0..BATCH).map(|k| (batch * BATCH + k) as u32).collect();
        let host = f32_bytes(&bits);
        let want = cpu_round(rule, &host);
        let old: Vec<u8> = want.iter().map(|b| !b).collect();
        nan_seen += bits
            .iter()
            .filter(|&&b| b & 0x7FFF_FFFF > 0x7F80_0000)
            .count() as u64;
        // SAFETY: our buffers, of these sizes.
        unsafe {
            gpu.copy_to_device(src.ptr(), &host).expect("upload");
            gpu.copy_to_device(snap.ptr(), &old).expect("upload");
            gpu.memset(word.ptr(), 0, 8).expect("memset");
        }
        let before = plain_digest(&gpu, snap.ptr(), BATCH, first_index, 3);
        let input = DiffInput {
            snapshot: snap.ptr(),
            current: src.ptr(),
            numel: BATCH,
            width: 2,
            first_index,
            digest: Some((word.ptr(), 3)),
            f32_source: Some(rule),
        };
        let out = DiffOutput {
            positions: pos.ptr(),
            new_values: newv.ptr(),
            old_values: Some(oldv.ptr()),
            capacity: BATCH,
            expected: None,
        };
        // SAFETY: the buffers above, sized for the batch.
        let res = unsafe { gpu.diff_batch(&[input], &out) }.expect("diff");
        let what = format!("batch {batch:#x}");
        assert_eq!((res.found, res.written), (BATCH, BATCH), "{what}");
        let got_snap = dl(&gpu, snap.ptr(), 2 * n);
        if got_snap != want {
            let at = (0..n)
                .find(|&k| got_snap[2 * k..2 * k + 2] != want[2 * k..2 * k + 2])
                .unwrap_or(0);
            panic!(
                "{what}: fp32 {:#010x} rounds to {:#06x} on the GPU, {:#06x} on the CPU",
                bits[at],
                u16::from_le_bytes([got_snap[2 * at], got_snap[2 * at + 1]]),
                u16::from_le_bytes([want[2 * at], want[2 * at + 1]]),
            );
        }
        assert!(dl(&gpu, newv.ptr(), 2 * n) == want, "{what}: new bits");
        assert!(dl(&gpu, oldv.ptr(), 2 * n) == old, "{what}: old bits");
        let positions = u64s(&dl(&gpu, pos.ptr(), 8 * n));
        assert!(
            positions
                .iter()
                .enumerate()
                .all(|(k, &p)| p == first_index + k as u64),
            "{what}: positions"
        );
        let after = plain_digest(&gpu, snap.ptr(), BATCH, first_index, 3);
        let fused = u64s(&dl(&gpu, word.ptr(), 8))[0];
        assert_eq!(fused, after.wrapping_sub(before), "{what}: fused digest");

        // The whole path: the refresh reads the same source into the old snapshot again.
        // SAFETY: our buffer.
        unsafe { gpu.copy_to_device(snap.ptr(), &old) }.expect("upload");
        let dinput = DigestInput {
            ptr: src.ptr(),
            numel: BATCH,
            width: 2,
            first_index,
            slot: 3,
            f32_source: Some(rule),
        };
        // SAFETY: the buffers above.
        let (digests, counts) = unsafe { gpu.digest_refresh(&[dinput], &[snap.ptr()]) }.unwrap();
        assert_eq!(counts, vec![BATCH], "{what}: refresh count");
        assert_eq!(digests, vec![after], "{what}: refresh digest");
        assert!(dl(&gpu, snap.ptr(), 2 * n) == want, "{what}: refreshed");
        // SAFETY: as above.
        let plain = unsafe { gpu.digest(&[dinput]) }.unwrap();
        assert_eq!(plain, vec![after], "{what}: digest of the fp32 source");
    }
    assert_eq!(
        nan_seen,
        2 * ((1 << 23) - 1),
        "every NaN pattern was in a batch"
    );
}

/// One tensor of a mixed diff batch: fp32 rounded into bf16, or plain bits of a width.
struct Case {
    numel: usize,
    /// None: fp32 source for a bf16 snapshot; Some(w): plain bits of width w.
    plain: Option<usize>,
    density: f64,
    /// Shifted off 16-byte alignment (the byte path).
    misalign: bool,
}

fn mixed_cases(rng: &mut Rng) -> Vec<Case> {
    let sizes = [
        0usize, 1, 2, 7, 8, 9, 15, 16, 17, 4095, 4096, 4097, 8191, 8193, 16383, 16385, 65537,
    ];
    let densities = [0.0, 0.001, 0.05, 0.5, 1.0];
    let mut cases = Vec::new();
    for (k, &numel) in sizes.iter().enumerate() {
        for plain in [None, Some(1), Some(2), Some(4)] {
            cases.push(Case {
                numel,
                plain,
                density: densities[(k + plain.unwrap_or(3)) % densities.len()],
                misalign: rng.chance(0.25),
            });
        }
    }
    cases.push(Case {
        numel: (1 << 21) + 3,
        plain: None,
        density: 0.02,
        misalign: false,
    });
    cases
}

/// Where [`run_mixed_diff`] keeps the snapshot.
#[derive(Clone, Copy, PartialEq, Debug)]
enum Place {
    Device,
    Pinned,
}

/// One batched diff over `cases` (fp32 sources mixed with plain tensors) against the CPU: the
/// sources rounded by `rule` then `diff_and_refresh` of the bf16, the plain ones as they are.
fn run_mixed_diff(gpu: &Gpu, rng: &mut Rng, cases: &[Case], rule: Bf16Rule, place: Place) {
    let (mut snap_host, mut cur_host) = (Vec::new(), Vec::new());
    // Per case: snapshot offset, current offset, width, old bits, new bits (wire dtype).
    let mut laid = Vec::new();
    for c in cases {
        let w = c.plain.unwrap_or(2);
        // (The fp32 source of the new bits, and the old and new bits in the wire dtype.)
        let (new_src, old, new) = match c.plain {
            None => {
                let prev: Vec<u32> = (0..c.numel).map(|_| random_f32(rng)).collect();
                let next = step_f32(rng, &prev, c.density);
                let q = f32_bytes(&next);
                let (old, new) = (cpu_round(rule, &f32_bytes(&prev)), cpu_round(rule, &q));
                (q, old, new)
            }
            Some(w) => {
                let old = kernel_cases::fill_old(rng, c.numel, w);
                let new = kernel_cases::mutate(rng, &old, w, c.density);
                (new.clone(), old, new)
            }
        };
        // Off 16-byte alignment by one source element.
        let shift = if c.misalign { c.plain.unwrap_or(4) } else { 0 };
        let s_at = snap_host.len().next_multiple_of(256) + if c.misalign { w } else { 0 };
        let c_at = cur_host.len().next_multiple_of(256) + shift;
        snap_host.resize(s_at, 0);
        snap_host.extend_from_slice(&old);
        cur_host.resize(c_at, 0);
        cur_host.extend_from_slice(&new_src);
        laid.push((s_at, c_at, w, old, new));
    }
    snap_host.resize(snap_host.len().max(1), 0);
    cur_host.resize(cur_host.len().max(1), 0);
    let (snap_dev, snap_pinned) = match place {
        Place::Device => (Some(gpu.upload(&snap_host).expect("upload")), None),
        Place::Pinned => {
            let mut h = gpu.alloc_pinned(snap_host.len()).expect("pinned");
            h.as_mut_slice().copy_from_slice(&snap_host);
            (None, Some(h))
        }
    };
    let snap_ptr = match (&snap_dev, &snap_pinned) {
        (Some(d), _) => d.ptr(),
        (_, Some(h)) => h.ptr(),
        _ => unreachable!("one of the two"),
    };
    let cur = gpu.upload(&cur_host).expect("upload");
    let words = gpu.alloc_zeroed(8 * cases.len()).expect("alloc");
    let mut expect = Vec::new();
    for (i, (_, _, w, old, new)) in laid.iter().enumerate() {
        let mut s = old.clone();
        let mut ch = Changes::default();
        diff_and_refresh(&mut s, new, *w, 0, &mut ch);
        let salt = slot_salt(i as u32);
        let d = (0..ch.len()).fold(0u64, |acc, k| {
            acc.wrapping_add(change(
                salt,
                ch.positions[k],
                load_bits(&ch.old_values, *w, k),
                load_bits(&ch.new_values, *w, k),
            ))
        });
        expect.push((ch, d));
    }
    let capacity = expect.iter().map(|e| e.0.len()).sum::<usize>().max(1);
    let pos = gpu.alloc(8 * capacity).expect("alloc");
    let newv = gpu.alloc(4 * capacity).expect("alloc");
    let oldv = gpu.alloc(4 * capacity).expect("alloc");
    let inputs: Vec<DiffInput> = cases
        .iter()
        .zip(&laid)
        .enumerate()
        .map(|(i, (c, (s_at, c_at, w, _, _)))| DiffInput {
            snapshot: snap_ptr + *s_at as u64,
            current: cur.ptr() + *c_at as u64,
            numel: c.numel as u64,
            width: *w,
            first_index: 0,
            digest: Some((words.ptr() + 8 * i as u64, i as u32)),
            f32_source: c.plain.is_none().then_some(rule),
        })
        .collect();
    let out = DiffOutput {
        positions: pos.ptr(),
        new_values: newv.ptr(),
        old_values: Some(oldv.ptr()),
        capacity: capacity as u64,
        expected: None,
    };
    // SAFETY: every pointer lies inside the buffers above.
    let res = unsafe {
        match place {
            Place::Device => gpu.diff_batch(&inputs, &out),
            Place::Pinned => gpu.diff_batch_host_snapshot(&inputs, &out),
        }
    }
    .expect("diff");
    assert!(res.is_complete());
    let g_pos = u64s(&dl(gpu, pos.ptr(), 8 * capacity));
    let g_new = dl(gpu, newv.ptr(), 4 * capacity);
    let g_old = dl(gpu, oldv.ptr(), 4 * capacity);
    let g_words = u64s(&dl(gpu, words.ptr(), 8 * cases.len()));
    // (A pinned snapshot is read in place: the diff synchronised.)
    let g_snap = match &snap_pinned {
        Some(h) => h.as_slice()[..snap_host.len()].to_vec(),
        None => dl(gpu, snap_ptr, snap_host.len()),
    };
    for (i, (c, (s_at, _, w, _, new))) in cases.iter().zip(&laid).enumerate() {
        let (ch, d) = &expect[i];
        let r = res.tensors[i];
        let what = format!(
            "tensor {i} (numel {}, {}, density {}, misaligned {}, {place:?}, rule {rule:?})",
            c.numel,
            c.plain
                .map_or("fp32 → bf16".into(), |w| format!("width {w}")),
            c.density,
            c.misalign
        );
        assert_eq!(r.found as usize, ch.len(), "{what}: changes");
        let (o, n) = (r.offset as usize, ch.len());
        assert_eq!(&g_pos[o..o + n], &ch.positions[..], "{what}: positions");
        let vo = r.value_offset as usize;
        assert_eq!(&g_new[vo..vo + n * w], &ch.new_values[..], "{what}: new");
        assert_eq!(&g_old[vo..vo + n * w], &ch.old_values[..], "{what}: old");
        assert_eq!(g_words[i], *d, "{what}: fused digest");
        assert_eq!(
            &g_snap[*s_at..*s_at + new.len()],
            &new[..],
            "{what}: snapshot"
        );
    }
}

#[test]
fn converting_diff_matches_the_core_in_every_form() {
    // Edge patterns, odd sizes, misaligned sources, fp32 changes that round to the same bf16,
    // fp32 and plain tensors of every width in one batch: three passes (default), one pass,
    // without the stash, smaller tiles, no reload; the snapshot in pinned host memory; both
    // NaN rules.
    let plain = gpu();
    let mut rng = Rng(0xbf16);
    for text in [
        None,
        Some("4,4,1,264,1,1"),
        Some("4,4,1,264,0"),
        Some("2,2,1,3"),
        Some("1,8,0,0"),
    ] {
        let g = match text {
            None => Gpu::new(plain.ordinal()).expect("gpu"),
            Some(t) => Gpu::with_tuning(plain.ordinal(), DiffTuning::parse(t).unwrap()).unwrap(),
        };
        let cases = mixed_cases(&mut rng);
        run_mixed_diff(&g, &mut rng, &cases, Bf16Rule::TORCH_CPU, Place::Device);
        run_mixed_diff(&g, &mut rng, &cases, Bf16Rule::TORCH_SCALAR, Place::Device);
    }
    let cases = mixed_cases(&mut rng);
    run_mixed_diff(&plain, &mut rng, &cases, Bf16Rule::TORCH_CPU, Place::Pinned);
}

#[test]
fn digest_and_refresh_of_fp32_sources_match_the_core() {
    let gpu = gpu();
    let mut rng = Rng(77);
    for rule in [Bf16Rule::TORCH_CPU, Bf16Rule::TORCH_SCALAR] {
        let (mut inputs, mut snaps, mut keep, mut expect) = (vec![], vec![], vec![], vec![]);
        for (t, &numel) in [0usize, 1, 3, 8191, 8192, 8193, 100_003].iter().enumerate() {
            let prev: Vec<u32> = (0..numel).map(|_| random_f32(&mut rng)).collect();
            let next = step_f32(&mut rng, &prev, [0.0, 0.01, 0.5, 1.0][t % 4]);
            let old = cpu_round(rule, &f32_bytes(&prev));
            let new = cpu_round(rule, &f32_bytes(&next));
            let changed = old
                .chunks(2)
                .zip(new.chunks(2))
                .filter(|(a, b)| a != b)
                .count();
            let first_index = rng.below(1 << 35);
            let src = gpu.upload(&f32_bytes(&next)).expect("upload");
            let snap = gpu.upload(&old).expect("upload");
            inputs.push(DigestInput {
                ptr: src.ptr(),
                numel: numel as u64,
                width: 2,
                first_index,
                slot: t as u32,
                f32_source: Some(rule),
            });
            snaps.push(snap.ptr());
            expect.push((
                digest_range(t as u32, 2, &new, first_index),
                changed as u64,
                new,
            ));
            keep.push((src, snap));
        }
        // SAFETY: the uploads above.
        let digests = unsafe { gpu.digest(&inputs) }.expect("digest");
        // SAFETY: as above; distinct buffers.
        let (refreshed, counts) = unsafe { gpu.digest_refresh(&inputs, &snaps) }.unwrap();
        for (i, (d, changed, new)) in expect.iter().enumerate() {
            assert_eq!(digests[i], *d, "digest {i} ({rule:?})");
            assert_eq!(refreshed[i], *d, "refresh digest {i} ({rule:?})");
            assert_eq!(counts[i], *changed, "refresh count {i} ({rule:?})");
            assert_eq!(
                &dl(&gpu, snaps[i], new.len()),
                new,
                "snapshot {i} ({rule:?})"
            );
        }
    }
    // A conversion into anything but a width-2 snapshot is refused before any launch.
    let buf = gpu.alloc(64).expect("alloc");
    let bad = DigestInput {
        ptr: buf.ptr(),
        numel: 4,
        width: 4,
        first_index: 0,
        slot: 0,
        f32_source: Some(Bf16Rule::default()),
    };
    // SAFETY: refused before any launch.
    assert!(matches!(
        unsafe { gpu.digest(&[bad]) },
        Err(CudaError::InvalidArgument(_))
    ));
}

/// A writer whose bytes the test reads back (the capture link's frames).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let mut v = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        v.extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn take(&self) -> Vec<u8> {
        std::mem::take(&mut *self.0.lock().unwrap_or_else(PoisonError::into_inner))
    }
}

/// The sync's slots: (name, wire dtype, shape, fp32 source). fp32 masters of odd sizes for
/// bf16 slots, next to slots whose tensors are in their own dtype.
const SLOTS: &[(&str, DType, &[u64], bool)] = &[
    ("m_empty", DType::BF16, &[0], true),
    ("m_one", DType::BF16, &[1], true),
    ("m_odd", DType::BF16, &[7], true),
    ("plain_bf16", DType::BF16, &[4097], false),
    ("m_big", DType::BF16, &[3, 100_003], true),
    ("plain_f32", DType::F32, &[12_289], false),
    ("m_edge", DType::BF16, &[4097], true),
];

/// Densities of the steps after the seed: a small delta, nothing, a few (half of the fp32
/// changes below bf16's resolution, as in every step), most (over the 25 % capacity: the diff
/// does not fit, the stage is refreshed and sent whole), dense twice more (the cost model may
/// send a stage whole without a diff), back to small; the last under the other NaN rule.
const STEPS: &[f64] = &[0.01, 0.0, 0.002, 0.9, 0.6, 0.9, 0.9, 0.005, 0.02];

#[test]
fn fp32_sources_sync_as_the_cpu_rounding_of_every_path() {
    let gpu = gpu();
    let mut rng = Rng(0x5eed);
    // Host truth: fp32 bits for the converting slots, raw bytes for the others.
    let mut host: Vec<Vec<u8>> = SLOTS
        .iter()
        .map(|(_, d, s, conv)| {
            let n = s.iter().product::<u64>() as usize;
            if *conv {
                let mut bits: Vec<u32> = (0..n).map(|_| random_f32(&mut rng)).collect();
                // Every edge pattern somewhere in the larger ones.
                if n >= EDGES.len() {
                    bits[n - EDGES.len()..].copy_from_slice(EDGES);
                }
                f32_bytes(&bits)
            } else {
                rng.bytes(n * d.width())
            }
        })
        .collect();
    let bufs: Vec<DeviceBuffer> = host
        .iter()
        .map(|h| {
            gpu.upload(&h[..])
                .or_else(|_| gpu.alloc(1))
                .expect("upload")
        })
        .collect();
    let tensors: Vec<GpuTensor> = SLOTS
        .iter()
        .zip(&bufs)
        .map(|((n, d, s, conv), b)| {
            let t = GpuTensor::new(*n, *d, s.to_vec(), b.ptr());
            if *conv {
                t.with_source(DType::F32)
            } else {
                t
            }
        })
        .collect();
    let table = SlotTable::new(
        SLOTS
            .iter()
            .map(|(n, d, s, _)| SlotInfo::new(n.to_string(), *d, s.to_vec()))
            .collect(),
    )
    .expect("table");
    let sink = Captured::default();
    let link = FrameLink::capture(Gpu::new(0).expect("gpu"), sink.clone());
    let config = GpuSenderConfig {
        capacity: 0.25,
        // Several stages: a stage of fp32 sources next to plain ones.
        stage_bytes: 150_000,
        ..GpuSenderConfig::default()
    };
    // SAFETY: the buffers outlive the sender and hold each tensor's source bytes.
    let mut sender =
        unsafe { GpuSender::new(Gpu::new(0).expect("gpu"), link, tensors, None, config) }
            .expect("sender");
    assert_eq!(
        sender.bf16_rule(),
        Bf16Rule::TORCH_CPU,
        "the CPU Sender's default"
    );
    let mut cpu = Receiver::new(table);
    let mut kinds = Vec::new();
    for (k, &density) in std::iter::once(&0.0).chain(STEPS).enumerate() {
        if k == STEPS.len() {
            // The last step under the other NaN rule: NaNs already sent change bits.
            sender.set_bf16_rule(Bf16Rule::TORCH_SCALAR);
        }
        if k > 0 {
            for ((_, d, _, conv), (h, b)) in SLOTS.iter().zip(host.iter_mut().zip(&bufs)) {
                if *conv {
                    let bits: Vec<u32> = h
                        .chunks_exact(4)
                        .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                        .collect();
                    *h = f32_bytes(&step_f32(&mut rng, &bits, density));
                } else {
                    deltacast_testkit::mutate(&mut rng, h, d.width(), density);
                }
                // SAFETY: our buffer, of this many bytes.
                unsafe { gpu.copy_to_device(b.ptr(), h) }.expect("upload");
            }
        }
        // SAFETY: the default stream; the uploads above are complete.
        let report = unsafe { sender.sync(0) }.expect("gpu sync");
        let bytes = sink.take();
        let frames = split_frames(&bytes).expect("whole frames");
        for f in &frames {
            cpu.receive(f)
                .expect("the CPU receiver applies the GPU's frame");
        }
        assert_eq!(cpu.version(), Some(report.version), "step {k}");
        let rule = sender.bf16_rule();
        for (i, ((name, _, _, conv), h)) in SLOTS.iter().zip(&host).enumerate() {
            let want = if *conv { cpu_round(rule, h) } else { h.clone() };
            assert!(
                cpu.store()[i] == want,
                "step {k} ({density}): slot {name} differs"
            );
        }
        let phases: Vec<&str> = report.phases.iter().map(|p| p.0).collect();
        kinds.push(format!(
            "{:?}/{} dense of {} stages, {} changed, phases {phases:?}",
            report.kind, report.dense_stages, report.stages, report.changed
        ));
    }
    eprintln!("fp32-source sync steps: {kinds:#?}");
    assert!(kinds[0].starts_with("Seed"), "{kinds:?}");
    assert!(kinds[1].starts_with("Delta"), "{kinds:?}");
    assert!(
        kinds[2].contains(" 0 changed"),
        "nothing changed: {kinds:?}"
    );
    // The over-capacity steps sent stages whole after a partial diff.
    for k in [4, 5] {
        assert!(!kinds[k].contains("/0 dense"), "step {k}: {kinds:?}");
    }
    sender.close().expect("close");
}

#[test]
fn unsupported_sources_are_refused() {
    let gpu = gpu();
    let buf = gpu.alloc(64).expect("alloc");
    let make = |dtype, source, place| {
        let t = GpuTensor::new("w", dtype, vec![8], buf.ptr()).with_source(source);
        let link = FrameLink::capture(Gpu::new(0).expect("gpu"), Captured::default());
        let config = GpuSenderConfig {
            snapshot: place,
            ..GpuSenderConfig::default()
        };
        // SAFETY: `buf` outlives the sender and holds 8 elements of any of these dtypes.
        unsafe { GpuSender::new(Gpu::new(0).expect("gpu"), link, vec![t], None, config) }
    };
    for (dtype, source) in [
        (DType::BF16, DType::F16),
        (DType::F16, DType::F32),
        (DType::F32, DType::BF16),
        (DType::F8E4M3, DType::F32),
    ] {
        let e = make(dtype, source, SnapshotPlace::Device)
            .err()
            .expect("refused");
        assert!(
            matches!(
                &e,
                CudaError::Sync(deltacast::Error::UnsupportedConversion { slot, from, to })
                    if slot == "w" && *from == source && *to == dtype
            ),
            "{source} into {dtype}: {e:?}"
        );
    }
    // A converting source needs the snapshot on the device (whole sends read it there).
    let e = make(DType::BF16, DType::F32, SnapshotPlace::PinnedHost)
        .err()
        .expect("refused");
    assert!(matches!(e, CudaError::InvalidArgument(_)), "{e:?}");
    assert!(make(DType::BF16, DType::F32, SnapshotPlace::Device).is_ok());
}
