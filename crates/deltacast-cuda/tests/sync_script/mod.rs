//! What the GPU sync suites share (tests/gpu_sync.rs, tests/gpu_sharded.rs): the scripted
//! tensors and steps, the links they run over, the receiver's side of a script (in a thread,
//! or a process of its own for the CUDA-IPC link, whose handles cannot be opened in the
//! process that made them), and the comparison of every step's bytes with the sender's.
#![allow(dead_code)]

use std::sync::{mpsc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use deltacast::wire::FrameKind;
use deltacast::DType;
use deltacast_cuda::ipc::{IpcComm, IpcOptions, Secret};
use deltacast_cuda::link::Link;
use deltacast_cuda::nccl::{unique_id, NcclComm};
use deltacast_cuda::sync::{GpuReceiver, GpuSyncReport, GpuTensor};
use deltacast_cuda::{CudaError, DeviceBuffer, Gpu};
use deltacast_testkit::{mutate, Rng};

/// One test at a time: NCCL collectives of concurrent communicators on the same GPUs may
/// deadlock each other.
pub fn serial() -> MutexGuard<'static, ()> {
    static SERIAL: Mutex<()> = Mutex::new(());
    SERIAL.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Fails the test unless two GPUs and NCCL are here.
pub fn need_two_gpus() {
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
pub fn need_one_gpu() {
    let why = match Gpu::device_count() {
        Ok(n) if n >= 1 => return,
        Ok(_) => "no GPU".to_string(),
        Err(e) => e.to_string(),
    };
    panic!("this test needs a GPU: {why}");
}

/// How the sender and the receiver of a script are linked.
#[derive(Debug, Clone)]
pub enum LinkSpec {
    /// NCCL: sender on GPU 0, receiver on GPU 1 (threads of this process).
    Nccl([u8; deltacast_cuda::nccl::UNIQUE_ID_BYTES]),
    /// CUDA IPC at this loopback address, with these staging slots (count, bytes): both
    /// on GPU 0, the receiver in a process of its own.
    Ipc(String, u64, u64),
}

impl LinkSpec {
    pub fn receiver_gpu(&self) -> usize {
        match self {
            LinkSpec::Nccl(_) => 1,
            LinkSpec::Ipc(..) => 0,
        }
    }

    /// Joins as `rank` on `gpu` (the current context).
    pub fn join(&self, gpu: &Gpu, rank: usize) -> Link {
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

pub fn free_address() -> String {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("a free port");
    format!("127.0.0.1:{}", l.local_addr().expect("address").port())
}

/// What one side sends the comparison after a step: the step, its tensors' bytes, the outcome.
pub type StepReport = (usize, Vec<Vec<u8>>, String);

/// The test's tensors over device buffers laid out as SHAPES.
pub fn as_tensors(bufs: &[DeviceBuffer]) -> Vec<GpuTensor> {
    SHAPES
        .iter()
        .zip(bufs)
        .map(|((n, d, s), b)| GpuTensor {
            name: n.to_string(),
            dtype: *d,
            shape: s.to_vec(),
            ptr: b.ptr(),
            source: *d,
        })
        .collect()
}

pub const SHAPES: &[(&str, DType, &[u64])] = &[
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
pub enum Before {
    Nothing,
    /// Flip one element behind the receiver's back and check `verify` notices.
    Tamper,
    /// Flip element 0 of slot 4 behind the receiver's back without telling it, while the
    /// sender changes that element too: the receiver's digest check of slot 4's changes
    /// fails, after the stages before it applied (which it must then undo).
    TamperUnseen,
}

/// The tensor the tampers touch ("big") and the byte flipped.
pub const TAMPERED_SLOT: usize = 4;

pub const STEPS: &[(f64, Before)] = &[
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
pub const STEPS_STAGED: &[(f64, Before)] = &[
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
/// Dense steps for a plain-only sender: after a step past the sender's bitmap threshold (4 %)
/// the next is diffed straight into bitmap + raw, whatever it holds (a sparse one too), a
/// tampered one among them; the first, and the one after the sparse step, list positions.
pub const STEPS_DENSE: &[(f64, Before)] = &[
    (0.1, Before::Nothing),
    (0.15, Before::Nothing),
    (0.2, Before::Nothing),
    (0.01, Before::Nothing),
    (0.01, Before::Nothing),
    (0.12, Before::Nothing),
    (0.22, Before::Tamper), // refused by the receiver
    (0.1, Before::Nothing), // the sender reseeds
    (0.15, Before::Nothing),
];

pub fn initial_tensors(rng: &mut Rng) -> Vec<Vec<u8>> {
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
pub fn next_step(rng: &mut Rng, host: &mut [Vec<u8>], density: f64, before: Before) {
    let held = host[TAMPERED_SLOT][0];
    for ((_, d, _), h) in SHAPES.iter().zip(host.iter_mut()) {
        mutate(rng, h, d.width(), density);
    }
    if before == Before::TamperUnseen {
        host[TAMPERED_SLOT][0] = held ^ 2;
    }
}

/// Set in the environment of [`ipc_receiver_process`]'s process: `host:port:slots:bytes`
/// (then `:dir`, added by [`receiver_process`]).
pub const IPC_RECEIVER_ENV: &str = "DELTACAST_TEST_IPC_RECEIVER";

/// The receiver of an IPC script, run by [`run_script_over`] as a process of its own (does
/// nothing when the test binary runs it otherwise).
#[test]
pub fn ipc_receiver_process() {
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
    receive_steps(link, steps, got_tx, commits_on_demand(script));
    write_steps(std::path::Path::new(dir), got_rx);
}

/// A script's name, with `+commit` when its receiver commits on demand.
pub fn script_named(name: &str) -> &'static [(f64, Before)] {
    match name.trim_end_matches(COMMIT) {
        "staged" => STEPS_STAGED,
        "dense" => STEPS_DENSE,
        _ => STEPS,
    }
}

/// The suffix of a script's name whose receiver commits on demand.
const COMMIT: &str = "+commit";

pub fn commits_on_demand(name: &str) -> bool {
    name.ends_with(COMMIT)
}

pub fn script_name(steps: &'static [(f64, Before)]) -> &'static str {
    if steps == STEPS_STAGED {
        "staged"
    } else if steps == STEPS_DENSE {
        "dense"
    } else {
        "plain"
    }
}

/// What a receiver process leaves for its parent: per step its outcome and every tensor's
/// bytes, as files in `dir`.
pub fn write_steps(dir: &std::path::Path, got_rx: mpsc::Receiver<StepReport>) {
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
pub fn receiver_process(
    test: &str,
    env: &str,
    spec: &str,
    steps: &'static [(f64, Before)],
    commit_on_demand: bool,
    got_tx: mpsc::Sender<StepReport>,
) {
    let script = format!(
        "{}{}",
        script_name(steps),
        if commit_on_demand { COMMIT } else { "" }
    );
    let dir = std::env::temp_dir().join(format!(
        "deltacast-{test}-{}-{}",
        std::process::id(),
        free_address().replace([':', '.'], "_")
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let child = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", test, "--nocapture", "--test-threads", "1"])
        .env(env, format!("{spec}:{script}:{}", dir.display()))
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
/// and outcome to `got_tx`; returns when the sender closes. Committing on demand, it checks
/// that each received sync left the tensors as they were until its commit.
pub fn receive_steps(
    link: LinkSpec,
    steps: &'static [(f64, Before)],
    got_tx: mpsc::Sender<StepReport>,
    commit_on_demand: bool,
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
    r.set_commit_on_demand(commit_on_demand);
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
            let tampered = SHAPES[TAMPERED_SLOT].0;
            assert!(
                matches!(r.verify(), Err(CudaError::Sync(deltacast::Error::DigestMismatch { slot, .. })) if slot == tampered),
                "verify must notice the tampered slot"
            );
            assert_eq!(r.version(), None, "a tampered receiver holds no version");
        }
        let held = commit_on_demand.then(|| read(&r));
        let outcome = match unsafe { r.receive(0, Some(Duration::from_secs(60))) } {
            Ok(Some(rep)) if commit_on_demand => {
                assert!(r.awaits_commit(), "step {step}");
                assert!(
                    held == Some(read(&r)),
                    "step {step}: written before the commit"
                );
                let done = unsafe { r.commit(0) }.expect("commit");
                assert_eq!((done.version, done.changed), (rep.version, rep.changed));
                outcome(&rep)
            }
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
pub fn compare_steps(
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
/// while others were deltas, `+steps` when chunks went in the steps code, and the number of
/// stages.
pub fn outcome(r: &GpuSyncReport) -> String {
    let mixed = if r.kind == FrameKind::Delta && r.dense_stages > 0 {
        "+dense"
    } else {
        ""
    };
    let steps = if r.steps { "+steps" } else { "" };
    format!("{}{mixed}{steps}/{}", r.kind.name(), r.stages)
}

/// The outcomes of [`STEPS`] for a sender that may not use the steps code (its snapshot in
/// host memory, or `EntropyMode` off or on).
pub fn check_kinds(kinds: &[(String, String)]) {
    check_kinds_with(kinds, false)
}

/// The outcomes of [`STEPS`]; with the steps code allowed, the 30 % step goes in it (its map
/// and escapes are smaller than the tensors, and the escapes, half its changes, fit the 25 %
/// capacity) where it would otherwise go whole; the 90 % step still goes whole (its escapes
/// do not fit).
pub fn check_kinds_with(kinds: &[(String, String)], steps: bool) {
    let names: Vec<&str> = kinds.iter().map(|k| k.0.as_str()).collect();
    assert_eq!(names[0], "seed/1");
    assert_eq!(names[1], "delta/1");
    if steps {
        assert_eq!(names[5], "dense/1", "90 %: its escapes pass the capacity");
        assert_eq!(
            names[6], "delta+steps/1",
            "30 %: its escapes fit the capacity"
        );
    } else {
        assert_eq!(names[5], "dense/1", "90 % changed must go dense");
        assert_eq!(names[6], "dense/1", "over capacity must go dense");
    }
    assert!(names[7].starts_with("refused"), "{names:?}");
    assert_eq!(names[8], "seed/1", "after a refusal the sender reseeds");
    assert_eq!(names[9], "delta/1");
}

pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
