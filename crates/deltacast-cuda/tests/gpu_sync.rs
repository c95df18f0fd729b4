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

use deltacast_testkit as common;

use std::sync::{mpsc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use deltacast::wire::FrameKind;
use deltacast::DType;
use deltacast_cuda::ipc::{IpcComm, IpcOptions, Secret};
use deltacast_cuda::link::Link;
use deltacast_cuda::nccl::{unique_id, NcclComm};
use deltacast_cuda::sync::{
    EntropyMode, GpuReceiver, GpuSender, GpuSenderConfig, GpuShard, GpuShardedSender,
    GpuSyncReport, GpuTensor, SnapshotPlace,
};
use deltacast_cuda::{CudaError, DeviceBuffer, Gpu};

/// One test at a time: NCCL collectives of concurrent communicators on the same GPUs may
/// deadlock each other.
fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Fails the test unless two GPUs and NCCL are here.
fn need_two_gpus() {
    let why = match Gpu::device_count() {
        Ok(n) if n >= 2 => match unique_id() {
            Ok(_) => return,
            Err(e) => e.to_string(),
        },
        Ok(n) => format!("{n} GPU(s), two needed"),
        Err(e) => e.to_string(),
    };
    panic!("this test needs two GPUs and NCCL: {why}");
}

/// Fails the test unless a GPU is here.
fn need_one_gpu() {
    let why = match Gpu::device_count() {
        Ok(n) if n >= 1 => return,
        Ok(_) => "no GPU".to_string(),
        Err(e) => e.to_string(),
    };
    panic!("this test needs a GPU: {why}");
}

/// How the sender and the receiver of a script are linked.
#[derive(Debug, Clone)]
enum LinkSpec {
    /// NCCL: sender on GPU 0, receiver on GPU 1 (threads of this process).
    Nccl([u8; deltacast_cuda::nccl::UNIQUE_ID_BYTES]),
    /// CUDA IPC at this loopback address, with these staging slots (count, bytes): both
    /// on GPU 0, the receiver in a process of its own.
    Ipc(String, u64, u64),
}

impl LinkSpec {
    fn receiver_gpu(&self) -> usize {
        match self {
            LinkSpec::Nccl(_) => 1,
            LinkSpec::Ipc(..) => 0,
        }
    }

    /// Joins as `rank` on `gpu` (the current context).
    fn join(&self, gpu: &Gpu, rank: usize) -> Link {
        match self {
            LinkSpec::Nccl(uid) => NcclComm::new(uid, 2, rank).expect("nccl comm").into(),
            LinkSpec::Ipc(address, slots, slot_bytes) => {
                let options = IpcOptions {
                    slots: *slots,
                    slot_bytes: *slot_bytes,
                    timeout: Duration::from_secs(60),
                    ..IpcOptions::default()
                };
                // Both processes of a script use it (the receiver's is a child of this one).
                let secret = Secret::new("gpu-sync-test-secret-0123456789").expect("secret");
                IpcComm::new(gpu, address, 2, rank, &secret, options)
                    .expect("ipc link")
                    .into()
            }
        }
    }
}

fn free_address() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    format!("127.0.0.1:{}", l.local_addr().expect("address").port())
}

use common::{mutate, Rng};

/// What one side sends the comparison after a step: the step, its tensors' bytes, the outcome.
type StepReport = (usize, Vec<Vec<u8>>, String);

/// The test's tensors over device buffers laid out as SHAPES.
fn as_tensors(bufs: &[DeviceBuffer]) -> Vec<GpuTensor> {
    SHAPES
        .iter()
        .zip(bufs)
        .map(|((n, d, s), b)| GpuTensor {
            name: n.to_string(),
            dtype: *d,
            shape: s.to_vec(),
            ptr: b.ptr(),
        })
        .collect()
}

const SHAPES: &[(&str, DType, &[u64])] = &[
    ("empty", DType::BF16, &[0]),
    ("one", DType::BF16, &[1]),
    ("odd", DType::BF16, &[7]),
    ("grid_edge", DType::BF16, &[4097]),
    ("big", DType::BF16, &[3, 100_003]),
    ("f32", DType::F32, &[12_289]),
    ("f8", DType::F8E4M3, &[8_195]),
    ("f16", DType::F16, &[4096, 3]),
];

/// (density, what the receiver does before this step)
#[derive(Clone, Copy, PartialEq)]
enum Before {
    Nothing,
    /// Flip one element behind the receiver's back and check `verify` notices.
    Tamper,
    /// Flip element 0 of slot 4 behind the receiver's back without telling it, while the
    /// sender changes that element too: the receiver's digest check of slot 4's changes
    /// fails, after the stages before it applied (which it must then undo).
    TamperUnseen,
}

/// The tensor the tampers touch ("big") and the byte flipped.
const TAMPERED_SLOT: usize = 4;

const STEPS: &[(f64, Before)] = &[
    (0.001, Before::Nothing),
    (0.01, Before::Nothing),
    (0.0, Before::Nothing),
    (0.2, Before::Nothing),
    (0.9, Before::Nothing),
    (0.3, Before::Nothing), // fits neither: more than the 25 % capacity → dense
    (0.02, Before::Tamper), // refused by the receiver, acked as such
    (0.01, Before::Nothing), // the sender reseeds
    (0.005, Before::Nothing),
];

/// STEPS, then a tamper found only by a stage's digest check.
const STEPS_STAGED: &[(f64, Before)] = &[
    (0.001, Before::Nothing),
    (0.01, Before::Nothing),
    (0.0, Before::Nothing),
    (0.2, Before::Nothing),
    (0.9, Before::Nothing),
    (0.3, Before::Nothing),
    (0.02, Before::Tamper),
    (0.01, Before::Nothing),
    (0.005, Before::Nothing),
    (0.01, Before::TamperUnseen), // refused at slot 4's stage; the 3 before it undone
    (0.01, Before::Nothing),      // the sender reseeds
    (0.003, Before::Nothing),
];

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
    check_kinds(&kinds);
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

/// Two trainer ranks (GPU 0, the leader, and GPU 1) each hold an uneven shard of every
/// tensor and sync it to a receiver on GPU 1 (in a communicator of its own with the leader):
/// the same scripted steps as the single sender, with and without the entropy codecs, the
/// snapshots on the device or in pinned host memory, in one stage and in seven. The receiver's bytes must equal the whole tensors after every step;
/// every rank's count of changes must equal a naive diff of the whole tensors; both ranks
/// must see the same outcome (refusals included).
#[test]
fn sharded_senders_on_two_gpus_stay_bit_identical() {
    let _serial = serial();
    need_two_gpus();
    // Entropy off with the snapshots on the device, on with them in pinned host memory.
    for (entropy, place) in [
        (EntropyMode::Off, SnapshotPlace::Device),
        (EntropyMode::On, SnapshotPlace::PinnedHost),
    ] {
        let kinds = run_sharded(
            ShardedSettings {
                entropy,
                place,
                stage_bytes: 0,
            },
            STEPS,
        );
        check_kinds(&kinds);
    }
    let staged = ShardedSettings {
        entropy: EntropyMode::Auto,
        place: SnapshotPlace::Device,
        stage_bytes: 1,
    };
    let kinds = run_sharded(staged, STEPS_STAGED);
    let names: Vec<&str> = kinds.iter().map(|k| k.0.as_str()).collect();
    assert!(names[10].starts_with("refused"), "{names:?}");
    assert_eq!(names[11], "seed/1");
    assert!(
        names[12].starts_with("delta") && names[12].ends_with("/7"),
        "{names:?}"
    );
}

/// Shards that leave a gap, a leader without the receivers' communicator, ranks with other
/// stage sizes, a rank that declines: every trainer rank refuses alike, at once (none is left
/// waiting in a collective).
#[test]
fn sharded_senders_refuse_bad_layouts_on_every_rank() {
    let _serial = serial();
    need_two_gpus();
    for case in ["gap", "no receivers", "stage sizes", "declined"] {
        let started = std::time::Instant::now();
        let uid = unique_id().expect("unique id");
        let ranks: Vec<_> = (0..2usize)
            .map(|rank| {
                std::thread::spawn(move || {
                    let gpu = Gpu::new(rank).expect("gpu");
                    gpu.make_current().expect("current");
                    let trainers = NcclComm::new(&uid, 2, rank).expect("comm");
                    // The leader's communicator with the receivers: one of the leader alone.
                    let receivers = (rank == 0 && case != "no receivers").then(|| {
                        Link::from(
                            NcclComm::new(&unique_id().expect("id"), 1, 0).expect("comm of one"),
                        )
                    });
                    let buf = gpu.alloc_zeroed(2000).expect("alloc");
                    let (first, numel) = match (rank, case) {
                        (0, _) => (0, 400),
                        (_, "gap") => (401, 599),
                        _ => (400, 600),
                    };
                    let shards = vec![GpuShard {
                        name: "w".into(),
                        dtype: DType::BF16,
                        shape: vec![1000],
                        first_index: first,
                        numel,
                        ptr: buf.ptr(),
                    }];
                    let config = GpuSenderConfig {
                        timeout: Duration::from_secs(60),
                        // Ranks whose stages would differ must not get as far as syncing.
                        stage_bytes: if case == "stage sizes" && rank == 1 {
                            1
                        } else {
                            0
                        },
                        ..GpuSenderConfig::default()
                    };
                    if case == "declined" && rank == 1 {
                        // A rank that found its own arguments wrong (say, in a binding).
                        let why = "rank 1's arguments".to_string();
                        let e = GpuShardedSender::decline(&gpu, trainers, config.timeout, why);
                        assert!(matches!(e, CudaError::InvalidArgument(_)), "{e:?}");
                        return e.to_string();
                    }
                    // SAFETY: `buf` outlives the call and holds every shard's bytes.
                    let got =
                        unsafe { GpuShardedSender::new(gpu, trainers, receivers, shards, config) };
                    let e = got.err().expect("a bad layout must be refused");
                    assert!(matches!(e, CudaError::InvalidArgument(_)), "{case}: {e:?}");
                    drop(buf);
                    e.to_string()
                })
            })
            .collect();
        for rank in ranks {
            let why = rank.join().expect("rank thread");
            eprintln!("{case}: {why}");
        }
        // Every rank failed at the exchange, none waited out its timeout.
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{case}: took {:?}",
            started.elapsed()
        );
    }
}

/// Set in the environment of [`sharded_receiver_process`]'s process: `uid-hex:script:dir`.
const RECEIVER_ENV: &str = "DELTACAST_TEST_SHARDED_RECEIVER";

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The receiver of [`run_sharded`], run by it as a process of its own (does nothing when
/// the test binary runs it otherwise): receives the script's steps and writes, per step,
/// its outcome and every tensor's bytes into the directory it was given.
#[test]
fn sharded_receiver_process() {
    let Ok(spec) = std::env::var(RECEIVER_ENV) else {
        return;
    };
    let mut parts = spec.splitn(3, ':');
    let (uid_hex, script, dir) = (
        parts.next().expect("uid"),
        parts.next().expect("script"),
        std::path::PathBuf::from(parts.next().expect("dir")),
    );
    let mut uid = [0u8; deltacast_cuda::nccl::UNIQUE_ID_BYTES];
    for (i, b) in uid.iter_mut().enumerate() {
        *b = u8::from_str_radix(&uid_hex[2 * i..2 * i + 2], 16).expect("uid hex");
    }
    let (got_tx, got_rx) = mpsc::channel::<StepReport>();
    receive_steps(LinkSpec::Nccl(uid), script_named(script), got_tx);
    write_steps(&dir, got_rx);
}

/// Where rank 0's shard of a slot of `numel` elements ends (rank 1 holds the rest): uneven
/// shards, a slot of one element wholly on rank 1, an empty one on neither.
fn shard_cut(numel: u64) -> u64 {
    numel * 3 / 7
}

/// Runs the scripted steps through two sharded trainer ranks and a receiver; asserts the
/// receiver's bytes after every step; returns the outcomes.
/// How [`run_sharded`]'s trainer ranks are set up.
#[derive(Debug, Clone, Copy)]
struct ShardedSettings {
    entropy: EntropyMode,
    place: SnapshotPlace,
    stage_bytes: u64,
}

fn run_sharded(
    settings: ShardedSettings,
    steps: &'static [(f64, Before)],
) -> Vec<(String, String)> {
    let trainers_uid = unique_id().expect("unique id");
    let receivers_uid = unique_id().expect("unique id");
    let (truth_tx, truth_rx) = mpsc::channel::<StepReport>();
    let ranks: Vec<_> = (0..2usize)
        .map(|rank| {
            let truth_tx = (rank == 0).then(|| truth_tx.clone());
            std::thread::spawn(move || {
                sharded_rank(rank, trainers_uid, receivers_uid, settings, steps, truth_tx)
            })
        })
        .collect();
    drop(truth_tx);
    // The receiver shares GPU 1 with trainer rank 1, so it runs in a process of its own: two
    // communicators' kernels in one CUDA context can deadlock (any device-synchronising call
    // of one thread waits for the other's blocked NCCL kernel); in two processes they do not.
    let (got_tx, got_rx) = mpsc::channel::<StepReport>();
    receiver_process(
        "sharded_receiver_process",
        RECEIVER_ENV,
        &hex(&receivers_uid),
        steps,
        got_tx,
    );
    let kinds = compare_steps(steps, &truth_rx, &got_rx);
    let outcomes: Vec<Vec<String>> = ranks
        .into_iter()
        .map(|r| r.join().expect("trainer rank thread"))
        .collect();
    // The other rank returns before the ack: a refusal is the leader's to report, and both
    // ranks seed next. Every other outcome is the same on both.
    for (step, (lead, other)) in outcomes[0].iter().zip(&outcomes[1]).enumerate() {
        if !lead.starts_with("refused") {
            assert_eq!(
                lead, other,
                "step {step}: the trainer ranks saw different outcomes"
            );
        }
    }
    eprintln!("sharded kinds per step ({settings:?}): {kinds:?}");
    kinds
}

/// One trainer rank of [`run_sharded`]: the whole tensors are made from the same seed on
/// every rank (so each knows the truth), and each uploads only its shard. Returns its
/// outcome per step.
fn sharded_rank(
    rank: usize,
    trainers_uid: [u8; deltacast_cuda::nccl::UNIQUE_ID_BYTES],
    receivers_uid: [u8; deltacast_cuda::nccl::UNIQUE_ID_BYTES],
    settings: ShardedSettings,
    steps: &'static [(f64, Before)],
    truth_tx: Option<mpsc::Sender<StepReport>>,
) -> Vec<String> {
    let gpu = Gpu::new(rank).expect("gpu");
    gpu.make_current().expect("current");
    let trainers = NcclComm::new(&trainers_uid, 2, rank).expect("trainers comm");
    let receivers = (rank == 0)
        .then(|| Link::from(NcclComm::new(&receivers_uid, 2, 0).expect("receivers comm")));
    let mut rng = Rng(42);
    let mut host = initial_tensors(&mut rng);
    // (first element, elements, element width) of this rank's shard of each slot.
    let runs: Vec<(usize, usize, usize)> = SHAPES
        .iter()
        .map(|(_, d, s)| {
            let n = s.iter().product::<u64>();
            let cut = shard_cut(n);
            let (first, len) = if rank == 0 { (0, cut) } else { (cut, n - cut) };
            (first as usize, len as usize, d.width())
        })
        .collect();
    let part = |h: &[u8], &(first, len, w): &(usize, usize, usize)| {
        h[first * w..(first + len) * w].to_vec()
    };
    let bufs: Vec<DeviceBuffer> = host
        .iter()
        .zip(&runs)
        .map(|(h, run)| gpu.upload(&part(h, run)).expect("upload"))
        .collect();
    let shards: Vec<GpuShard> = SHAPES
        .iter()
        .zip(&runs)
        .zip(&bufs)
        .map(|(((name, d, shape), &(first, len, _)), b)| GpuShard {
            name: name.to_string(),
            dtype: *d,
            shape: shape.to_vec(),
            first_index: first as u64,
            numel: len as u64,
            ptr: b.ptr(),
        })
        .collect();
    let config = GpuSenderConfig {
        chunk_elems: 4096,
        capacity: 0.25,
        timeout: Duration::from_secs(60),
        snapshot: settings.place,
        entropy: settings.entropy,
        stage_bytes: settings.stage_bytes,
        root: 0,
    };
    // SAFETY: the buffers outlive the sender (dropped after it).
    let mut s = unsafe { GpuShardedSender::new(gpu, trainers, receivers, shards, config) }
        .expect("sharded sender");
    let report = unsafe { s.seed(0) }.expect("seed");
    let mut outcomes = vec![outcome(&report)];
    if let Some(tx) = &truth_tx {
        tx.send((0, host.clone(), outcome(&report))).unwrap();
    }
    for (step, &(density, before)) in steps.iter().enumerate() {
        let previous = host.clone();
        next_step(&mut rng, &mut host, density, before);
        for ((h, b), run) in host.iter().zip(&bufs).zip(&runs) {
            // SAFETY: the buffer holds exactly this rank's part.
            unsafe { s.gpu().copy_to_device(b.ptr(), &part(h, run)) }.expect("upload");
        }
        // The oracle: a naive diff of the whole tensors, element by element.
        let naive: u64 = SHAPES
            .iter()
            .zip(previous.iter().zip(&host))
            .map(|((_, d, _), (a, b))| {
                a.chunks(d.width())
                    .zip(b.chunks(d.width()))
                    .filter(|(x, y)| x != y)
                    .count() as u64
            })
            .sum();
        // SAFETY: stream 0 is the legacy default stream.
        let got = match unsafe { s.sync(0) } {
            Ok(r) => {
                if r.kind != FrameKind::Seed {
                    assert_eq!(r.changed, naive, "rank {rank} step {}: changes", step + 1);
                }
                outcome(&r)
            }
            Err(CudaError::ReceiverRefused(n)) => format!("refused by {n}"),
            Err(e) => panic!("rank {rank} step {}: {e}", step + 1),
        };
        if let Some(tx) = &truth_tx {
            tx.send((step + 1, host.clone(), got.clone())).unwrap();
        }
        outcomes.push(got);
    }
    s.close().expect("close");
    drop(s);
    drop(bufs);
    outcomes
}

/// The test's tensors before the first step: random bytes laid out as SHAPES.
fn initial_tensors(rng: &mut Rng) -> Vec<Vec<u8>> {
    SHAPES
        .iter()
        .map(|(_, d, s)| {
            let n = s.iter().product::<u64>() as usize * d.width();
            (0..n).map(|_| rng.next_u64() as u8).collect()
        })
        .collect()
}

/// One scripted step of the tensors: `density` of the elements changed; before a
/// `TamperUnseen` step the tampered element also changes, to bits that differ from the
/// receiver's and from its tampered ones.
fn next_step(rng: &mut Rng, host: &mut [Vec<u8>], density: f64, before: Before) {
    let held = host[TAMPERED_SLOT][0];
    for ((_, d, _), h) in SHAPES.iter().zip(host.iter_mut()) {
        mutate(rng, h, d.width(), density);
    }
    if before == Before::TamperUnseen {
        host[TAMPERED_SLOT][0] = held ^ 2;
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
                    outcome(&r)
                }
                Err(CudaError::ReceiverRefused(n)) => {
                    payloads.push(0);
                    format!("refused by {n}")
                }
                Err(e) => panic!("step {}: {e}", step + 1),
            };
            truth_tx.send((step + 1, host.clone(), outcome)).unwrap();
        }
        s.close().expect("close");
        drop(s);
        drop(bufs);
        payloads
    });

    let receiver = match &link {
        LinkSpec::Nccl(_) => {
            let link = link.clone();
            std::thread::spawn(move || receive_steps(link, steps, got_tx))
        }
        LinkSpec::Ipc(address, slots, slot_bytes) => {
            let spec = format!("{address}:{slots}:{slot_bytes}");
            std::thread::spawn(move || {
                receiver_process(
                    "ipc_receiver_process",
                    IPC_RECEIVER_ENV,
                    &spec,
                    steps,
                    got_tx,
                )
            })
        }
    };

    let kinds = compare_steps(steps, &truth_rx, &got_rx);
    let payloads = sender.join().expect("sender thread");
    receiver.join().expect("receiver thread");
    eprintln!("kinds per step ({link:?}, {place:?} snapshot, entropy {entropy:?}): {kinds:?}, payload bytes {payloads:?}");
    (kinds, payloads)
}

/// Set in the environment of [`ipc_receiver_process`]'s process: `host:port:slots:bytes`
/// (then `:dir`, added by [`receiver_process`]).
const IPC_RECEIVER_ENV: &str = "DELTACAST_TEST_IPC_RECEIVER";

/// The receiver of an IPC script, run by [`run_script_over`] as a process of its own (does
/// nothing when the test binary runs it otherwise).
#[test]
fn ipc_receiver_process() {
    let Ok(spec) = std::env::var(IPC_RECEIVER_ENV) else {
        return;
    };
    let parts: Vec<&str> = spec.splitn(6, ':').collect();
    let [host, port, slots, bytes, script, dir] = parts[..] else {
        panic!("bad {IPC_RECEIVER_ENV}: {spec}");
    };
    let link = LinkSpec::Ipc(
        format!("{host}:{port}"),
        slots.parse().expect("slots"),
        bytes.parse().expect("slot bytes"),
    );
    let steps = script_named(script);
    let (got_tx, got_rx) = mpsc::channel::<StepReport>();
    receive_steps(link, steps, got_tx);
    write_steps(std::path::Path::new(dir), got_rx);
}

fn script_named(name: &str) -> &'static [(f64, Before)] {
    if name == "staged" {
        STEPS_STAGED
    } else {
        STEPS
    }
}

fn script_name(steps: &'static [(f64, Before)]) -> &'static str {
    if std::ptr::eq(steps, STEPS_STAGED) {
        "staged"
    } else {
        "plain"
    }
}

/// What a receiver process leaves for its parent: per step its outcome and every tensor's
/// bytes, as files in `dir`.
fn write_steps(dir: &std::path::Path, got_rx: mpsc::Receiver<StepReport>) {
    for (step, tensors, outcome) in got_rx {
        eprintln!("receiver process, step {step}: {outcome}");
        std::fs::write(dir.join(format!("{step}.outcome")), outcome).expect("write");
        for (i, t) in tensors.iter().enumerate() {
            std::fs::write(dir.join(format!("{step}.{i}")), t).expect("write");
        }
    }
}

/// Runs test `test` of this binary as a receiver process (`env` = `spec:script:dir`), waits
/// for it, and sends what it left, step by step, to `got_tx`.
fn receiver_process(
    test: &str,
    env: &str,
    spec: &str,
    steps: &'static [(f64, Before)],
    got_tx: mpsc::Sender<StepReport>,
) {
    let dir = std::env::temp_dir().join(format!(
        "deltacast-{test}-{}-{}",
        std::process::id(),
        free_address().replace([':', '.'], "_")
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let child = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(
            env,
            format!("{spec}:{}:{}", script_name(steps), dir.display()),
        )
        .status()
        .expect("receiver process");
    assert!(child.success(), "the receiver process failed: {child}");
    for step in 0..=steps.len() {
        let outcome = std::fs::read_to_string(dir.join(format!("{step}.outcome")))
            .expect("the receiver's outcome");
        let tensors = (0..SHAPES.len())
            .map(|i| std::fs::read(dir.join(format!("{step}.{i}"))).expect("received bytes"))
            .collect();
        got_tx
            .send((step, tensors, outcome))
            .expect("the comparison");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The receiver's side of a script: rank 1 of `uid` on GPU 1, root 0; before each step it
/// does what the step says (tampers), then receives, and sends the step, its tensors' bytes
/// and outcome to `got_tx`; returns when the sender closes.
fn receive_steps(
    link: LinkSpec,
    steps: &'static [(f64, Before)],
    got_tx: mpsc::Sender<StepReport>,
) {
    let gpu = Gpu::new(link.receiver_gpu()).expect("receiver's gpu");
    gpu.make_current().expect("current");
    let comm = link.join(&gpu, 1);
    let bufs: Vec<DeviceBuffer> = SHAPES
        .iter()
        .map(|(_, d, s)| {
            gpu.alloc_zeroed(s.iter().product::<u64>() as usize * d.width())
                .expect("alloc")
        })
        .collect();
    let tensors = as_tensors(&bufs);
    let mut r = unsafe { GpuReceiver::new(gpu, comm, tensors, 0, Duration::from_secs(60)) }
        .expect("receiver");
    let read = |r: &GpuReceiver| -> Vec<Vec<u8>> {
        bufs.iter()
            .map(|b| unsafe { r.gpu().download(b.ptr(), b.len()) }.expect("download"))
            .collect()
    };
    let mut step = 0;
    // (A sender that failed leaves the receiver erring at once: stop past the script.)
    while step <= steps.len() + 1 {
        let before = match step {
            0 => Before::Nothing,
            k => steps.get(k - 1).map_or(Before::Nothing, |s| s.1),
        };
        if before != Before::Nothing {
            let big = &bufs[TAMPERED_SLOT];
            let mut one = unsafe { r.gpu().download(big.ptr(), 2) }.expect("read");
            one[0] ^= 1;
            unsafe { r.gpu().copy_to_device(big.ptr(), &one) }.expect("tamper");
        }
        if before == Before::Tamper {
            assert!(
                matches!(r.verify(), Err(CudaError::DigestMismatch { slot: 4, .. })),
                "verify must notice the tampered slot"
            );
            assert_eq!(r.version(), 0, "a tampered receiver holds no version");
        }
        let outcome = match unsafe { r.receive(0, Some(Duration::from_secs(60))) } {
            Ok(Some(rep)) => outcome(&rep),
            Ok(None) => break,
            Err(e) => format!("error: {e}"),
        };
        got_tx.send((step, read(&r), outcome)).unwrap();
        step += 1;
    }
    drop(r);
    drop(bufs);
}

/// Pairs the sender's truth with the receiver's bytes step by step and asserts they agree
/// (after a refusal: the previous version's bytes plus the tamper); returns the outcomes.
fn compare_steps(
    steps: &[(f64, Before)],
    truth_rx: &mpsc::Receiver<StepReport>,
    got_rx: &mpsc::Receiver<StepReport>,
) -> Vec<(String, String)> {
    let mut kinds = Vec::new();
    let mut last_truth: Vec<Vec<u8>> = Vec::new();
    for _ in 0..=steps.len() {
        let (step, truth, sent) = truth_rx.recv().expect("sender step");
        let (rstep, got, applied) = got_rx.recv().expect("receiver step");
        assert_eq!(step, rstep);
        kinds.push((sent.clone(), applied.clone()));
        if sent.starts_with("refused") {
            assert!(applied.starts_with("error"), "step {step}: {applied}");
            // Nothing of the refused sync stays: the previous version, plus the tamper.
            let mut expected = last_truth.clone();
            expected[TAMPERED_SLOT][0] ^= 1;
            for (i, (t, g)) in expected.iter().zip(&got).enumerate() {
                assert!(
                    t == g,
                    "step {step} (refused: {applied}): tensor {} is not the previous version's",
                    SHAPES[i].0
                );
            }
            continue;
        }
        assert_eq!(
            sent, applied,
            "step {step}: sender and receiver differ in what happened"
        );
        last_truth = truth.clone();
        for (i, (t, g)) in truth.iter().zip(&got).enumerate() {
            assert!(
                t == g,
                "step {step} ({sent}/{applied}): tensor {} differs",
                SHAPES[i].0
            );
        }
    }
    kinds
}

/// A sync's outcome as the tests compare it: kind, `+dense` when some stages went whole
/// while others were deltas, and the number of stages.
fn outcome(r: &GpuSyncReport) -> String {
    let mixed = if r.kind == FrameKind::Delta && r.dense_stages > 0 {
        "+dense"
    } else {
        ""
    };
    format!("{}{mixed}/{}", r.kind.name(), r.stages)
}

fn check_kinds(kinds: &[(String, String)]) {
    let names: Vec<&str> = kinds.iter().map(|k| k.0.as_str()).collect();
    assert_eq!(names[0], "seed/1");
    assert_eq!(names[1], "delta/1");
    assert_eq!(names[5], "dense/1", "90 % changed must go dense");
    assert_eq!(names[6], "dense/1", "over capacity must go dense");
    assert!(names[7].starts_with("refused"), "{names:?}");
    assert_eq!(names[8], "seed/1", "after a refusal the sender reseeds");
    assert_eq!(names[9], "delta/1");
}
