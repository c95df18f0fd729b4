//! The GPU sync end to end over real NCCL: a sender on GPU 0 and a receiver on GPU 1 (one
//! thread each), scripted steps at several densities, dense fallbacks, tampers on the receiver
//! and its recovery, in one stage and in many; after every step the receiver's bytes must
//! equal the sender's, byte for byte (the oracle is the host copy the sender's tensors were
//! uploaded from), and after a refusal they must equal the previous version's (plus the
//! tamper): a refused sync applies nothing, in every stage.
//!
//! The same script also runs over the CUDA-IPC link, the receiver in a process of its own
//! (IPC handles cannot be opened in the process that made them), both on GPU 0.
//!
//! Compiled only with the `cuda` feature (without it, tests/gpu.rs lists this suite as
//! ignored). Needs two GPUs and NCCL (the IPC tests: one GPU); a cuda build is made to run
//! it, so a missing GPU fails the test with the reason.
#![cfg(feature = "cuda")]

mod sync_script;

use std::sync::mpsc;
use std::time::Duration;

use deltacast::DType;
use deltacast_cuda::nccl::{unique_id, NcclComm};
use deltacast_cuda::sync::{EntropyMode, GpuSender, GpuSenderConfig, GpuTensor, SnapshotPlace};
use deltacast_cuda::{CudaError, DeviceBuffer, Gpu};
use deltacast_testkit::Rng;
use sync_script::*;

#[test]
fn sender_on_gpu0_receiver_on_gpu1_stay_bit_identical() {
    let _serial = serial();
    need_two_gpus();
    let (kinds, entropy) = run_script(SnapshotPlace::Device, EntropyMode::On, 0, STEPS);
    check_kinds(&kinds);
    // The same steps (same seed) without the entropy codecs: same outcomes, and the entropy
    // sync's deltas were smaller (its gaps and ulp sections were sent and decoded).
    let (plain_kinds, plain) = run_script(SnapshotPlace::Device, EntropyMode::Off, 0, STEPS);
    assert_eq!(kinds, plain_kinds);
    for step in [1, 2, 4, 9] {
        assert!(
            entropy[step] < plain[step],
            "step {step}: entropy {} bytes, abs32/bitmap + raw {}",
            entropy[step],
            plain[step]
        );
    }
}

#[test]
fn sender_with_pinned_host_snapshot_stays_bit_identical() {
    // The same script with the sender's snapshot in pinned host memory: seeds copy the
    // tensors into it device-to-host, every diff reads it over PCIe and refreshes it in place.
    let _serial = serial();
    need_two_gpus();
    check_kinds(&run_script(SnapshotPlace::PinnedHost, EntropyMode::Auto, 0, STEPS).0);
}

#[test]
fn syncs_in_stages_stay_bit_identical_and_undo_refused_stages() {
    // One stage per tensor or two (stage_bytes 1 closes a stage at every non-empty tensor):
    // seven stages, some dense while others are deltas, a tamper caught by verify (the
    // first delta stage refuses) and one caught only by slot 4's digest check (the three
    // stages before it applied, then undone; the three after it received and dropped).
    let _serial = serial();
    need_two_gpus();
    for entropy in [EntropyMode::Off, EntropyMode::On] {
        let (kinds, _) = run_script(SnapshotPlace::Device, entropy, 1, STEPS_STAGED);
        let names: Vec<&str> = kinds.iter().map(|k| k.0.as_str()).collect();
        let delta = |i: usize| names[i].starts_with("delta") && names[i].ends_with("/7");
        assert_eq!(names[0], "seed/1");
        assert!([1, 2, 3, 4, 9, 12].into_iter().all(delta), "{names:?}");
        assert_eq!(
            names[6], "delta+dense/7",
            "30 %: slot 4 over capacity (dense), f32 a bitmap delta"
        );
        assert!(names[7].starts_with("refused"), "{names:?}");
        assert_eq!(names[8], "seed/1");
        assert!(names[10].starts_with("refused"), "{names:?}");
        assert_eq!(names[11], "seed/1");
    }
}

#[test]
fn ipc_link_two_processes_on_one_gpu_stay_bit_identical() {
    // The NCCL scripts again, over the CUDA-IPC link, sender and receiver on GPU 0: with
    // slots far smaller than the tensors (many pieces per broadcast, every slot reused, the
    // root waiting for the receiver to drain them), in one stage and in seven.
    let _serial = serial();
    need_one_gpu();
    let small = || LinkSpec::Ipc(free_address(), 3, 4096);
    let (kinds, _) = run_script_over(small(), SnapshotPlace::Device, EntropyMode::Auto, 0, STEPS);
    check_kinds_with(&kinds, true);
    let (staged, _) = run_script_over(
        small(),
        SnapshotPlace::Device,
        EntropyMode::On,
        1,
        STEPS_STAGED,
    );
    let names: Vec<&str> = staged.iter().map(|k| k.0.as_str()).collect();
    assert!(names[10].starts_with("refused"), "{names:?}");
    assert_eq!(names[11], "seed/1");
    // The same in seven stages, the receiver committing on demand: each sync checked and
    // acked with its tensors untouched, then written by the commit (dense stages and seeds
    // from staging); the same outcomes.
    let (committed, _) = run_script_landing(
        small(),
        SnapshotPlace::Device,
        EntropyMode::On,
        1,
        STEPS_STAGED,
        true,
    );
    assert_eq!(committed, staged);
    // The default staging (four 64 MiB slots): each broadcast is one piece.
    let (kinds, _) = run_script_over(
        LinkSpec::Ipc(free_address(), 4, 64 << 20),
        SnapshotPlace::PinnedHost,
        EntropyMode::Off,
        0,
        STEPS,
    );
    check_kinds(&kinds);
}

#[test]
fn ipc_link_dense_plain_steps_stay_bit_identical() {
    // Plain deltas only, 10-22 % changed: after the first, each step is diffed straight into
    // bitmap + raw (every width: the f8, f16, bf16 and f32 slots, the empty and odd-sized
    // ones), a sparse step among them; a tamper refused, the reseed. Then the same with the
    // receiver committing on demand.
    let _serial = serial();
    need_one_gpu();
    let link = || LinkSpec::Ipc(free_address(), 3, 4096);
    let (kinds, _, bitmap) = run_script_counted(
        link(),
        SnapshotPlace::Device,
        EntropyMode::Off,
        0,
        STEPS_DENSE,
        false,
    );
    // After a step of 10-20 %: a bitmap diff (the 1 % one too); after a 1 % step: listed.
    for step in [2, 3, 4] {
        assert_eq!(bitmap[step], 1, "step {step}: {bitmap:?}");
    }
    for step in [5, 6] {
        assert_eq!(bitmap[step], 0, "step {step}: {bitmap:?}");
    }
    let names: Vec<&str> = kinds.iter().map(|k| k.0.as_str()).collect();
    assert_eq!(names[0], "seed/1");
    for step in [1, 2, 3, 4, 5, 6, 9] {
        assert_eq!(names[step], "delta/1", "step {step}: {names:?}");
    }
    assert!(names[7].starts_with("refused"), "{names:?}");
    assert_eq!(names[8], "seed/1", "{names:?}");
    let (committed, _) = run_script_landing(
        link(),
        SnapshotPlace::Device,
        EntropyMode::Off,
        0,
        STEPS_DENSE,
        true,
    );
    assert_eq!(committed, kinds);
}

#[test]
fn pinned_host_snapshot_refuses_lent_snapshots() {
    let _serial = serial();
    need_two_gpus();
    let gpu = Gpu::new(0).expect("gpu 0");
    gpu.make_current().expect("current");
    let comm = NcclComm::new(&unique_id().expect("unique id"), 1, 0).expect("comm of one");
    let buf = gpu.alloc(16).expect("alloc");
    let tensors = vec![GpuTensor {
        name: "t".into(),
        dtype: DType::BF16,
        shape: vec![8],
        ptr: buf.ptr(),
        source: DType::BF16,
    }];
    let config = GpuSenderConfig {
        snapshot: SnapshotPlace::PinnedHost,
        ..GpuSenderConfig::default()
    };
    let lent = Some(vec![buf.ptr()]);
    // SAFETY: `buf` outlives the call; the constructor refuses before using any pointer.
    let e = unsafe { GpuSender::new(gpu, comm, tensors, lent, config) }
        .err()
        .expect("lent snapshots with PinnedHost must be refused");
    assert!(matches!(e, CudaError::InvalidArgument(_)), "{e:?}");
    drop(buf);
}

/// The bytes rank `rank` sends in gather round `round`: random, of the round's length.
fn gather_bytes(rank: usize, round: usize, len: u64) -> Vec<u8> {
    Rng(1 + 1000 * round as u64 + rank as u64).bytes(len as usize)
}

/// Exact-size gather over real NCCL: each round the two ranks learn each other's lengths by an
/// all-gather, then the root (rank 0, or rank 1 in odd rounds) receives exactly their bytes,
/// in rank order; empty parts, odd sizes and megabytes. The root also refuses a destination
/// too small for the lengths before anything moves.
#[test]
fn exact_size_gather_from_every_rank() {
    let _serial = serial();
    need_two_gpus();
    const ROUNDS: &[[u64; 2]] = &[
        [0, 5],
        [1, 0],
        [7, 4097],
        [3_000_001, 1_234_567],
        [0, 0],
        [65_536, 65_536],
    ];
    let uid = unique_id().expect("unique id");
    let ranks: Vec<_> = (0..2usize)
        .map(|rank| {
            std::thread::spawn(move || {
                let gpu = Gpu::new(rank).expect("gpu");
                gpu.make_current().expect("current");
                let mut comm = NcclComm::new(&uid, 2, rank).expect("comm");
                let stream = gpu.stream_handle();
                let timeout = Duration::from_secs(60);
                for (round, lens) in ROUNDS.iter().enumerate() {
                    let root = round % 2;
                    let mine = gather_bytes(rank, round, lens[rank]);
                    let src = gpu.upload(&mine).expect("upload");
                    let my_len = gpu.upload(&lens[rank].to_le_bytes()).expect("upload");
                    let all_lens = gpu.alloc_zeroed(16).expect("alloc");
                    // SAFETY: both buffers live until the wait below.
                    unsafe { comm.all_gather_u64(my_len.ptr(), all_lens.ptr(), 1, stream) }
                        .expect("all-gather");
                    let done = gpu.record_done().expect("record");
                    comm.wait(done, timeout, "the lengths").expect("lengths");
                    // SAFETY: 16 bytes, written by the all-gather that completed.
                    let got = unsafe { gpu.download(all_lens.ptr(), 16) }.expect("download");
                    let learnt: Vec<u64> = got
                        .chunks_exact(8)
                        .map(|c| u64::from_le_bytes(c.try_into().expect("8 bytes")))
                        .collect();
                    assert_eq!(learnt, lens.to_vec(), "rank {rank} round {round}");
                    let total: u64 = learnt.iter().sum();
                    let dst = gpu.alloc_zeroed(total.max(1) as usize).expect("alloc");
                    if rank == root && total > 0 {
                        // Too small by one byte: refused before any transfer.
                        // SAFETY: refused before any pointer is used.
                        let e = unsafe {
                            comm.gather_exact(
                                src.ptr(),
                                &learnt,
                                dst.ptr(),
                                total - 1,
                                root,
                                stream,
                            )
                        }
                        .expect_err("a destination too small must be refused");
                        assert!(matches!(e, CudaError::InvalidArgument(_)), "{e:?}");
                    }
                    // SAFETY: `src` holds this rank's bytes, `dst` the total; both live until
                    // the wait below.
                    unsafe {
                        comm.gather_exact(src.ptr(), &learnt, dst.ptr(), total, root, stream)
                    }
                    .expect("gather");
                    let done = gpu.record_done().expect("record");
                    comm.wait(done, timeout, "the gather").expect("gather done");
                    if rank == root && total > 0 {
                        // SAFETY: `total` bytes, written by the gather that completed.
                        let got =
                            unsafe { gpu.download(dst.ptr(), total as usize) }.expect("download");
                        let mut want = gather_bytes(0, round, lens[0]);
                        want.extend(gather_bytes(1, round, lens[1]));
                        assert!(got == want, "round {round}: gathered bytes differ");
                    }
                }
            })
        })
        .collect();
    for rank in ranks {
        rank.join().expect("rank thread");
    }
}

/// Runs the scripted steps with the sender's snapshot at `place` (and the entropy codecs or
/// not); asserts the receiver's bytes after every step; returns (sender outcome, receiver
/// outcome) and the payload bytes per step.
fn run_script(
    place: SnapshotPlace,
    entropy: EntropyMode,
    stage_bytes: u64,
    steps: &'static [(f64, Before)],
) -> (Vec<(String, String)>, Vec<u64>) {
    let link = LinkSpec::Nccl(unique_id().expect("unique id"));
    run_script_over(link, place, entropy, stage_bytes, steps)
}

/// [`run_script`] over `link`.
fn run_script_over(
    link: LinkSpec,
    place: SnapshotPlace,
    entropy: EntropyMode,
    stage_bytes: u64,
    steps: &'static [(f64, Before)],
) -> (Vec<(String, String)>, Vec<u64>) {
    run_script_landing(link, place, entropy, stage_bytes, steps, false)
}

/// [`run_script_over`], the receiver committing on demand when `commit_on_demand`.
fn run_script_landing(
    link: LinkSpec,
    place: SnapshotPlace,
    entropy: EntropyMode,
    stage_bytes: u64,
    steps: &'static [(f64, Before)],
    commit_on_demand: bool,
) -> (Vec<(String, String)>, Vec<u64>) {
    let (kinds, payloads, _) =
        run_script_counted(link, place, entropy, stage_bytes, steps, commit_on_demand);
    (kinds, payloads)
}

/// [`run_script_landing`], also returning each step's stages diffed into bitmap + raw (the
/// sender's report; 0 for a refused step).
fn run_script_counted(
    link: LinkSpec,
    place: SnapshotPlace,
    entropy: EntropyMode,
    stage_bytes: u64,
    steps: &'static [(f64, Before)],
    commit_on_demand: bool,
) -> (Vec<(String, String)>, Vec<u64>, Vec<u32>) {
    let (truth_tx, truth_rx) = mpsc::channel::<StepReport>();
    let (got_tx, got_rx) = mpsc::channel::<StepReport>();

    let sender_link = link.clone();
    let sender = std::thread::spawn(move || {
        let gpu = Gpu::new(0).expect("gpu 0");
        gpu.make_current().expect("current");
        let comm = sender_link.join(&gpu, 0);
        let mut rng = Rng(42);
        let mut host = initial_tensors(&mut rng);
        let bufs: Vec<DeviceBuffer> = host
            .iter()
            .map(|h| gpu.upload(h).expect("upload"))
            .collect();
        let tensors = as_tensors(&bufs);
        let config = GpuSenderConfig {
            chunk_elems: 4096,
            capacity: 0.25,
            timeout: Duration::from_secs(60),
            snapshot: place,
            entropy,
            stage_bytes,
            root: 0,
        };
        let total: u64 = host.iter().map(|h| h.len() as u64).sum();
        // SAFETY: the buffers outlive the sender (dropped after it, at the end of scope).
        let mut s = unsafe { GpuSender::new(gpu, comm, tensors, None, config) }.expect("sender");
        match place {
            SnapshotPlace::Device => {
                assert_eq!(s.host_bytes(), 0);
                assert!(s.staging_bytes() >= total);
            }
            SnapshotPlace::PinnedHost => {
                // (staging_bytes, the device's, then counts only the delta buffers.)
                assert_eq!(s.host_bytes(), total, "the snapshot, in pinned host memory");
            }
        }
        let report = unsafe { s.seed(0) }.expect("seed");
        let mut payloads = vec![report.payload_bytes];
        let mut bitmap_stages = vec![report.bitmap_stages];
        truth_tx.send((0, host.clone(), outcome(&report))).unwrap();
        for (step, &(density, before)) in steps.iter().enumerate() {
            next_step(&mut rng, &mut host, density, before);
            for (h, b) in host.iter().zip(&bufs) {
                // SAFETY: the buffer holds exactly h.len() bytes.
                unsafe { s.gpu().copy_to_device(b.ptr(), h) }.expect("upload");
            }
            // SAFETY: stream 0 is the legacy default stream.
            let outcome = match unsafe { s.sync(0) } {
                Ok(r) => {
                    payloads.push(r.payload_bytes);
                    bitmap_stages.push(r.bitmap_stages);
                    outcome(&r)
                }
                Err(CudaError::ReceiverRefused(n)) => {
                    payloads.push(0);
                    bitmap_stages.push(0);
                    format!("refused by {n}")
                }
                Err(e) => panic!("step {}: {e}", step + 1),
            };
            truth_tx.send((step + 1, host.clone(), outcome)).unwrap();
        }
        s.close().expect("close");
        drop(s);
        drop(bufs);
        (payloads, bitmap_stages)
    });

    let receiver = match &link {
        LinkSpec::Nccl(_) => {
            let link = link.clone();
            std::thread::spawn(move || receive_steps(link, steps, got_tx, commit_on_demand))
        }
        LinkSpec::Ipc(address, slots, slot_bytes) => {
            let spec = format!("{address}:{slots}:{slot_bytes}");
            std::thread::spawn(move || {
                receiver_process(
                    "sync_script::ipc_receiver_process",
                    IPC_RECEIVER_ENV,
                    &spec,
                    steps,
                    commit_on_demand,
                    got_tx,
                )
            })
        }
    };

    let kinds = compare_steps(steps, &truth_rx, &got_rx);
    let (payloads, bitmap_stages) = sender.join().expect("sender thread");
    receiver.join().expect("receiver thread");
    eprintln!("kinds per step ({link:?}, {place:?} snapshot, entropy {entropy:?}): {kinds:?}, payload bytes {payloads:?}, bitmap stages {bitmap_stages:?}");
    (kinds, payloads, bitmap_stages)
}
