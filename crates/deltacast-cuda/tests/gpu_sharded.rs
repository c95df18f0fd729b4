//! Sharded trainers end to end: two trainer ranks each hold an uneven shard of every tensor
//! and sync them to a receiver through the leader, over real NCCL (two GPUs) or the CUDA-IPC
//! link (every process on GPU 0), with the scripted steps of tests/gpu_sync.rs; the
//! receiver's bytes must equal the whole tensors after every step, every rank's count of
//! changes a naive diff's. Also the ranks' refusals of bad layouts.
//!
//! Compiled only with the `cuda` feature; needs two GPUs and NCCL (the IPC tests: one GPU).
#![cfg(feature = "cuda")]

mod sync_script;

use std::sync::mpsc;
use std::time::Duration;

use deltacast::wire::FrameKind;
use deltacast::DType;
use deltacast_cuda::link::Link;
use deltacast_cuda::nccl::{unique_id, NcclComm};
use deltacast_cuda::sync::{
    EntropyMode, GpuSenderConfig, GpuShard, GpuShardedSender, SnapshotPlace,
};
use deltacast_cuda::{CudaError, DeviceBuffer, Gpu};
use deltacast_testkit::Rng;
use sync_script::*;

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

/// The sharded run on one GPU: both trainer ranks and the receiver on GPU 0, in three
/// processes, the ranks' gathers and the leader's sync over CUDA IPC; small staging slots
/// (many pieces per broadcast) and one stage, then the default slots and seven stages with
/// a refusal found by a stage's digest check.
#[test]
fn sharded_senders_over_ipc_on_one_gpu_stay_bit_identical() {
    let _serial = serial();
    need_one_gpu();
    let small = ShardedLinks {
        trainers: LinkSpec::Ipc(free_address(), 3, 4096),
        receivers: LinkSpec::Ipc(free_address(), 3, 4096),
    };
    let plain = ShardedSettings {
        entropy: EntropyMode::Off,
        place: SnapshotPlace::Device,
        stage_bytes: 0,
    };
    check_kinds(&run_sharded_over(small, plain, STEPS));
    let default = ShardedLinks {
        trainers: LinkSpec::Ipc(free_address(), 4, 64 << 20),
        receivers: LinkSpec::Ipc(free_address(), 4, 64 << 20),
    };
    let staged = ShardedSettings {
        entropy: EntropyMode::On,
        place: SnapshotPlace::PinnedHost,
        stage_bytes: 1,
    };
    let kinds = run_sharded_over(default, staged, STEPS_STAGED);
    let names: Vec<&str> = kinds.iter().map(|k| k.0.as_str()).collect();
    assert!(names[10].starts_with("refused"), "{names:?}");
    assert_eq!(names[11], "seed/1");
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
    receive_steps(LinkSpec::Nccl(uid), script_named(script), got_tx, false);
    write_steps(&dir, got_rx);
}

/// Where rank 0's shard of a slot of `numel` elements ends (rank 1 holds the rest): uneven
/// shards, a slot of one element wholly on rank 1, an empty one on neither.
fn shard_cut(numel: u64) -> u64 {
    numel * 3 / 7
}

/// How [`run_sharded`]'s trainer ranks are set up.
#[derive(Debug, Clone, Copy)]
struct ShardedSettings {
    entropy: EntropyMode,
    place: SnapshotPlace,
    stage_bytes: u64,
}

impl ShardedSettings {
    /// `entropy:place:stage_bytes`, for a rank's process.
    fn encode(&self) -> String {
        let entropy = match self.entropy {
            EntropyMode::On => "on",
            EntropyMode::Off => "off",
            EntropyMode::Auto => "auto",
        };
        let place = match self.place {
            SnapshotPlace::Device => "device",
            SnapshotPlace::PinnedHost => "pinned",
        };
        format!("{entropy}:{place}:{}", self.stage_bytes)
    }

    fn decode(entropy: &str, place: &str, stage_bytes: &str) -> ShardedSettings {
        ShardedSettings {
            entropy: match entropy {
                "on" => EntropyMode::On,
                "off" => EntropyMode::Off,
                _ => EntropyMode::Auto,
            },
            place: match place {
                "pinned" => SnapshotPlace::PinnedHost,
                _ => SnapshotPlace::Device,
            },
            stage_bytes: stage_bytes.parse().expect("stage bytes"),
        }
    }
}

/// Runs the scripted steps through two sharded trainer ranks and a receiver over real
/// NCCL; see [`run_sharded_over`].
fn run_sharded(
    settings: ShardedSettings,
    steps: &'static [(f64, Before)],
) -> Vec<(String, String)> {
    let links = ShardedLinks {
        trainers: LinkSpec::Nccl(unique_id().expect("unique id")),
        receivers: LinkSpec::Nccl(unique_id().expect("unique id")),
    };
    run_sharded_over(links, settings, steps)
}

/// The two links of a sharded run: between the trainer ranks, and the leader's with the
/// receiver.
#[derive(Debug, Clone)]
struct ShardedLinks {
    trainers: LinkSpec,
    receivers: LinkSpec,
}

/// Runs the scripted steps through two sharded trainer ranks and a receiver; asserts the
/// receiver's bytes after every step and that both ranks saw the same outcomes; returns
/// the outcomes. Over NCCL the ranks are threads (GPU 0 and 1) and the receiver a process
/// on GPU 1; over CUDA IPC, on GPU 0, rank 1 and the receiver are processes of their own
/// (IPC handles cannot be opened in the process that made them).
fn run_sharded_over(
    links: ShardedLinks,
    settings: ShardedSettings,
    steps: &'static [(f64, Before)],
) -> Vec<(String, String)> {
    let (truth_tx, truth_rx) = mpsc::channel::<StepReport>();
    let (got_tx, got_rx) = mpsc::channel::<StepReport>();
    let lead_links = links.clone();
    let leader =
        std::thread::spawn(move || sharded_rank(0, lead_links, settings, steps, Some(truth_tx)));
    let (other, receiver) = match (&links.trainers, &links.receivers) {
        (LinkSpec::Nccl(_), LinkSpec::Nccl(receivers_uid)) => {
            let other_links = links.clone();
            let other =
                std::thread::spawn(move || sharded_rank(1, other_links, settings, steps, None));
            // The receiver shares GPU 1 with trainer rank 1, so it runs in a process of its
            // own: two communicators' kernels in one CUDA context can deadlock (any
            // device-synchronising call of one thread waits for the other's blocked NCCL
            // kernel); in two processes they do not.
            let spec = hex(receivers_uid);
            let receiver = std::thread::spawn(move || {
                receiver_process(
                    "sharded_receiver_process",
                    RECEIVER_ENV,
                    &spec,
                    steps,
                    false,
                    got_tx,
                )
            });
            (other, receiver)
        }
        (LinkSpec::Ipc(t_addr, t_slots, t_bytes), LinkSpec::Ipc(r_addr, r_slots, r_bytes)) => {
            let rank_spec = format!("{t_addr}:{t_slots}:{t_bytes}:{}", settings.encode());
            let other = std::thread::spawn(move || rank_process(&rank_spec, steps));
            let spec = format!("{r_addr}:{r_slots}:{r_bytes}");
            let receiver = std::thread::spawn(move || {
                receiver_process(
                    "sync_script::ipc_receiver_process",
                    IPC_RECEIVER_ENV,
                    &spec,
                    steps,
                    false,
                    got_tx,
                )
            });
            (other, receiver)
        }
        _ => panic!("both links NCCL or both IPC: {links:?}"),
    };
    let kinds = compare_steps(steps, &truth_rx, &got_rx);
    let outcomes = [
        leader.join().expect("leader thread"),
        other.join().expect("trainer rank 1"),
    ];
    receiver.join().expect("receiver");
    // The other rank returns before the ack: a refusal is the leader's to report, and both
    // ranks seed next. Every other outcome is the same on both.
    assert_eq!(outcomes[0].len(), outcomes[1].len(), "{outcomes:?}");
    for (step, (lead, other)) in outcomes[0].iter().zip(&outcomes[1]).enumerate() {
        if !lead.starts_with("refused") {
            assert_eq!(
                lead, other,
                "step {step}: the trainer ranks saw different outcomes"
            );
        }
    }
    eprintln!("sharded kinds per step ({links:?}, {settings:?}): {kinds:?}");
    kinds
}

/// Set in the environment of [`sharded_rank_process`]'s process:
/// `host:port:slots:bytes:settings:script:dir`.
const RANK_ENV: &str = "DELTACAST_TEST_SHARDED_RANK";

/// Trainer rank 1 of an IPC run as a process of its own: runs [`sharded_rank_process`] and
/// returns the outcomes it wrote.
fn rank_process(spec: &str, steps: &'static [(f64, Before)]) -> Vec<String> {
    let dir = std::env::temp_dir().join(format!(
        "deltacast-sharded-rank-{}-{}",
        std::process::id(),
        free_address().replace([':', '.'], "_")
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    let status = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "sharded_rank_process",
            "--nocapture",
            "--test-threads",
            "1",
        ])
        .env(
            RANK_ENV,
            format!("{spec}:{}:{}", script_name(steps), dir.display()),
        )
        .status()
        .expect("trainer rank process");
    assert!(
        status.success(),
        "trainer rank 1's process failed: {status}"
    );
    let text = std::fs::read_to_string(dir.join("outcomes")).expect("rank 1's outcomes");
    let _ = std::fs::remove_dir_all(&dir);
    text.lines().map(str::to_string).collect()
}

/// Trainer rank 1 of an IPC run (does nothing when the test binary runs it otherwise):
/// runs its side of the script and writes its outcomes, one per line.
#[test]
fn sharded_rank_process() {
    let Ok(spec) = std::env::var(RANK_ENV) else {
        return;
    };
    let parts: Vec<&str> = spec.splitn(9, ':').collect();
    let [host, port, slots, bytes, entropy, place, stage_bytes, script, dir] = parts[..] else {
        panic!("bad {RANK_ENV}: {spec}");
    };
    let trainers = LinkSpec::Ipc(
        format!("{host}:{port}"),
        slots.parse().expect("slots"),
        bytes.parse().expect("slot bytes"),
    );
    let settings = ShardedSettings::decode(entropy, place, stage_bytes);
    // Rank 1 has no link with the receivers; its spec is never joined.
    let links = ShardedLinks {
        receivers: trainers.clone(),
        trainers,
    };
    let outcomes = sharded_rank(1, links, settings, script_named(script), None);
    std::fs::write(
        std::path::Path::new(dir).join("outcomes"),
        outcomes.join("\n"),
    )
    .expect("write outcomes");
}

/// One trainer rank of [`run_sharded`]: the whole tensors are made from the same seed on
/// every rank (so each knows the truth), and each uploads only its shard. Returns its
/// outcome per step.
fn sharded_rank(
    rank: usize,
    links: ShardedLinks,
    settings: ShardedSettings,
    steps: &'static [(f64, Before)],
    truth_tx: Option<mpsc::Sender<StepReport>>,
) -> Vec<String> {
    let device = match links.trainers {
        LinkSpec::Nccl(_) => rank,
        LinkSpec::Ipc(..) => 0,
    };
    let gpu = Gpu::new(device).expect("gpu");
    gpu.make_current().expect("current");
    let trainers = links.trainers.join(&gpu, rank);
    let receivers = (rank == 0).then(|| links.receivers.join(&gpu, 0));
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
