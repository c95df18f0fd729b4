//! One protocol across devices, on one GPU: a GPU sync captured as frames of the core's
//! format applies bit for bit on a CPU `Receiver`, and a CPU `Sender`'s frames apply bit for
//! bit on a `GpuReceiver`. The oracle is the host copy the tensors were made from.
//!
//! With `DELTACAST_GOLDEN_OUT=DIR` the captured GPU sync is also written there (the golden
//! files that CI applies without a GPU: crates/deltacast/tests/data/gpu-sync/).
#![cfg(feature = "cuda")]

use deltacast_testkit as common;

use std::io::Write;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use common::{mutate, Rng};
use deltacast::wire::{split_frames, FrameKind};
use deltacast::{CodecChoice, DType, FlushConfig, Receiver, Sender, SlotInfo, SlotTable};
use deltacast_cuda::frame_link::FrameLink;
use deltacast_cuda::sync::{GpuReceiver, GpuSender, GpuSenderConfig, GpuTensor};
use deltacast_cuda::{DeviceBuffer, Gpu};

/// The GPU: a cuda build is for a machine with one, so none is a failure, with its reason.
fn gpu() -> Option<Gpu> {
    match Gpu::new(0) {
        Ok(g) => Some(g),
        Err(e) => panic!("no usable GPU for the GPU frames tests: {e}"),
    }
}

/// In name order, as a safetensors checkpoint's table has them (so that `deltacast apply`
/// takes the captured sync onto one).
const SHAPES: &[(&str, DType, &[u64])] = &[
    ("big", DType::BF16, &[3, 100_003]),
    ("empty", DType::BF16, &[0]),
    ("f16", DType::F16, &[4096, 3]),
    ("f32", DType::F32, &[12_289]),
    ("f8", DType::F8E4M3, &[8_195]),
    ("grid_edge", DType::BF16, &[4097]),
    ("odd", DType::BF16, &[7]),
    ("one", DType::BF16, &[1]),
];

/// Densities of the scripted steps: tiny, none, dense enough to go whole (capacity 0.25),
/// and back.
const STEPS: &[f64] = &[0.001, 0.01, 0.0, 0.2, 0.6, 0.3, 0.005];

fn table() -> SlotTable {
    SlotTable::new(
        SHAPES
            .iter()
            .map(|(n, d, s)| SlotInfo::new(n.to_string(), *d, s.to_vec()))
            .collect(),
    )
    .expect("table")
}

fn initial(rng: &mut Rng) -> Vec<Vec<u8>> {
    SHAPES
        .iter()
        .map(|(_, d, s)| {
            let n = s.iter().product::<u64>() as usize * d.width();
            (0..n).map(|_| rng.next_u64() as u8).collect()
        })
        .collect()
}

fn step(rng: &mut Rng, host: &mut [Vec<u8>], density: f64) {
    for ((_, d, _), h) in SHAPES.iter().zip(host.iter_mut()) {
        mutate(rng, h, d.width(), density);
    }
}

fn upload(gpu: &Gpu, host: &[Vec<u8>]) -> Vec<DeviceBuffer> {
    host.iter()
        .map(|h| {
            let b = gpu.alloc(h.len().max(1)).expect("alloc");
            // SAFETY: our buffer, at least this long.
            unsafe { gpu.copy_to_device(b.ptr(), h).expect("upload") };
            b
        })
        .collect()
}

fn refill(gpu: &Gpu, bufs: &[DeviceBuffer], host: &[Vec<u8>]) {
    for (b, h) in bufs.iter().zip(host) {
        // SAFETY: our buffers, sized for these bytes.
        unsafe { gpu.copy_to_device(b.ptr(), h).expect("upload") };
    }
}

fn download(gpu: &Gpu, bufs: &[DeviceBuffer], host: &[Vec<u8>]) -> Vec<Vec<u8>> {
    bufs.iter()
        .zip(host)
        // SAFETY: our buffers, sized for these bytes.
        .map(|(b, h)| unsafe { gpu.download(b.ptr(), h.len()).expect("download") })
        .collect()
}

fn tensors(bufs: &[DeviceBuffer]) -> Vec<GpuTensor> {
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

/// A writer whose bytes the test reads back.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend_from_slice(buf);
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

#[test]
fn gpu_sync_captured_as_frames_applies_on_a_cpu_receiver() {
    let Some(gpu) = gpu() else { return };
    let mut rng = Rng(0x6a09_e667);
    let mut host = initial(&mut rng);
    let bufs = upload(&gpu, &host);
    let sink = Captured::default();
    let link = FrameLink::capture(Gpu::new(0).expect("gpu"), sink.clone());
    let config = GpuSenderConfig {
        capacity: 0.25,
        // Several stages, so that a sync is frames of consecutive slots.
        stage_bytes: 200_000,
        ..GpuSenderConfig::default()
    };
    // SAFETY: the buffers outlive the sender and hold each tensor's bytes.
    let mut sender = unsafe {
        GpuSender::new(
            Gpu::new(0).expect("gpu"),
            link,
            tensors(&bufs),
            None,
            config,
        )
    }
    .expect("sender");
    let mut cpu = Receiver::new(table());
    let golden = std::env::var_os("DELTACAST_GOLDEN_OUT").map(std::path::PathBuf::from);
    let mut kinds = Vec::new();
    for (k, &density) in std::iter::once(&0.0).chain(STEPS).enumerate() {
        if k > 0 {
            step(&mut rng, &mut host, density);
            refill(&gpu, &bufs, &host);
        }
        // SAFETY: the default stream; the uploads above are complete.
        let report = unsafe { sender.sync(0) }.expect("gpu sync");
        let bytes = sink.take();
        let frames = split_frames(&bytes).expect("whole frames");
        assert_eq!(frames.len() as u32, report.stages, "one frame per stage");
        let mut outcome = None;
        for f in &frames {
            outcome = cpu
                .receive(f)
                .expect("the CPU receiver applies the GPU's frame");
        }
        assert!(outcome.is_some(), "the last frame completes the sync");
        assert_eq!(cpu.version(), Some(report.version));
        for (i, h) in host.iter().enumerate() {
            assert_eq!(&cpu.store()[i], h, "step {k}, slot {i}");
        }
        kinds.push(format!("{:?}/{}", report.kind, report.dense_stages));
        if let Some(dir) = &golden {
            std::fs::create_dir_all(dir).expect("golden dir");
            std::fs::write(dir.join(format!("sync-{k}.dcast")), &bytes).expect("golden file");
            if k == STEPS.len() {
                let final_bytes: Vec<u8> = host.concat();
                std::fs::write(dir.join("final.bin"), final_bytes).expect("golden state");
            }
        }
    }
    // The script went through a seed, deltas and dense stages.
    assert!(kinds[0].starts_with("Seed"), "{kinds:?}");
    assert!(kinds.iter().any(|k| k.starts_with("Delta")), "{kinds:?}");
    assert!(
        kinds
            .iter()
            .any(|k| !k.ends_with("/0") && !k.starts_with("Seed")),
        "no dense stage: {kinds:?}"
    );
    sender.close().expect("close");
    let close = sink.take();
    let frames = split_frames(&close).expect("close frame");
    assert_eq!(frames.len(), 1);
    assert_eq!(
        deltacast::wire::parse_frame(frames[0])
            .expect("close")
            .header
            .kind,
        FrameKind::Close
    );
}

/// CPU-made syncs (several frames each, every codec the GPU decodes: the CPU sender's own
/// default `auto` among them) through a replay link into a GPU receiver; a corrupted frame is
/// refused and leaves the version held. The scripted densities fill whole chunks (`all`:
/// the tiny slots at 60 %) and leave few holes (`holes` from 60 %).
/// A CPU `Sender`'s syncs, back to back in one stream.
struct CpuSyncs {
    stream: Vec<u8>,
    /// The host bytes after each sync.
    truth: Vec<Vec<Vec<u8>>>,
    /// The sender and the host bytes, to go on.
    sender: Sender,
    host: Vec<Vec<u8>>,
}

/// The syncs of `densities` (a seed first) in 64 KiB frames of `codec`.
fn cpu_syncs(rng: &mut Rng, codec: &str, densities: &[f64]) -> CpuSyncs {
    let mut host = initial(rng);
    let config = FlushConfig {
        bucket_size: 64 << 10,
        codec: CodecChoice::parse(codec).expect("codec"),
        ..FlushConfig::default()
    };
    let mut sender = Sender::new(table(), config).expect("cpu sender");
    let mut stream = Vec::new();
    let mut truth = Vec::new();
    for (k, &density) in std::iter::once(&0.0).chain(densities).enumerate() {
        if k > 0 {
            step(rng, &mut host, density);
        }
        let views: Vec<&[u8]> = host.iter().map(Vec::as_slice).collect();
        sender
            .sync(&views, |f| {
                stream.extend_from_slice(&f);
                Ok(())
            })
            .expect("cpu sync");
        truth.push(host.clone());
    }
    CpuSyncs {
        stream,
        truth,
        sender,
        host,
    }
}

/// A `GpuReceiver` into `bufs` that reads its syncs from `stream`.
fn replay_receiver(bufs: &[DeviceBuffer], stream: Vec<u8>) -> GpuReceiver {
    let link = FrameLink::replay(Gpu::new(0).expect("gpu"), std::io::Cursor::new(stream));
    // SAFETY: the buffers outlive the receiver (the callers drop it first) and hold each
    // tensor's bytes.
    unsafe {
        GpuReceiver::new(
            Gpu::new(0).expect("gpu"),
            link,
            tensors(bufs),
            0,
            Duration::from_secs(60),
        )
    }
    .expect("receiver")
}

#[test]
fn cpu_made_syncs_apply_on_a_gpu_receiver() {
    let Some(gpu) = gpu() else { return };
    for codec in [
        "auto",
        "gaps+ulp",
        "abs32+raw",
        "bitmap+raw",
        "abs32+ulp",
        "bitmap+ulp",
        "all+raw",
        "all+ulp",
        "holes+raw",
        "holes+ulp",
    ] {
        let mut rng = Rng(0xbb67_ae85);
        let CpuSyncs {
            mut stream,
            truth,
            mut sender,
            mut host,
        } = cpu_syncs(&mut rng, codec, STEPS);
        let syncs = truth.len();
        // A last sync whose one frame is corrupted in transit.
        step(&mut rng, &mut host, 0.01);
        let views: Vec<&[u8]> = host.iter().map(Vec::as_slice).collect();
        let mut last = Vec::new();
        sender
            .sync(&views, |f| {
                last.push(f);
                Ok(())
            })
            .expect("cpu sync");
        let n = last[0].len();
        last[0][n / 2] ^= 0x10;
        for f in &last {
            stream.extend_from_slice(f);
        }
        let zeros: Vec<Vec<u8>> = host.iter().map(|h| vec![0u8; h.len()]).collect();
        let bufs = upload(&gpu, &zeros);
        let mut rx = replay_receiver(&bufs, stream);
        for (k, want) in truth.iter().enumerate().take(syncs) {
            // SAFETY: the default stream.
            let r = unsafe { rx.receive(0, None) }
                .unwrap_or_else(|e| panic!("{codec}, sync {k}: {e}"))
                .expect("a sync, not the end");
            assert_eq!(r.version, k as u64 + 1);
            assert_eq!(&download(&gpu, &bufs, want), want, "{codec}, sync {k}");
        }
        // SAFETY: the default stream.
        let refused = unsafe { rx.receive(0, None) };
        assert!(refused.is_err(), "{codec}: a corrupted frame was applied");
        assert_eq!(rx.version(), Some(syncs as u64), "{codec}: version kept");
        let held = truth.last().expect("a sync");
        assert_eq!(&download(&gpu, &bufs, held), held, "{codec}: bits kept");
        // The stream's end is the sender's close.
        // SAFETY: the default stream.
        assert!(matches!(unsafe { rx.receive(0, None) }, Ok(None)));
    }
    // A codec the GPU does not decode is refused by name, before anything is written.
    let mut rng = Rng(3);
    let CpuSyncs {
        stream,
        truth,
        host,
        ..
    } = cpu_syncs(&mut rng, "ctxgaps+raw", &[0.5]);
    let seeded = &truth[0];
    let zeros: Vec<Vec<u8>> = host.iter().map(|h| vec![0u8; h.len()]).collect();
    let bufs = upload(&gpu, &zeros);
    let mut rx = replay_receiver(&bufs, stream);
    // SAFETY: the default stream.
    unsafe { rx.receive(0, None) }
        .expect("the seed")
        .expect("a sync");
    // SAFETY: the default stream.
    let err = unsafe { rx.receive(0, None) }.expect_err("ctxgaps is not decoded on the GPU");
    assert!(err.to_string().contains("not decoded on the GPU"), "{err}");
    assert_eq!(&download(&gpu, &bufs, seeded), seeded, "nothing written");
}

/// Commit on demand: each CPU-made sync is received, checked and acked with the tensors
/// untouched; the commit writes it, bit for bit; an aborted sync leaves the version held and
/// the sync after it is refused (its base was never held). Frames of 64 KiB and a seed make
/// stages of every kind (delta, dense and whole, several per sync).
#[test]
fn cpu_made_syncs_stage_then_commit_on_a_gpu_receiver() {
    let Some(gpu) = gpu() else { return };
    for codec in ["auto", "bitmap+raw"] {
        let mut rng = Rng(0x3c6e_f372);
        // Every scripted step, then one more to abort and one after it.
        let densities: Vec<f64> = STEPS.iter().copied().chain([0.02, 0.02]).collect();
        let CpuSyncs {
            stream,
            truth,
            host,
            ..
        } = cpu_syncs(&mut rng, codec, &densities);
        let zeros: Vec<Vec<u8>> = host.iter().map(|h| vec![0u8; h.len()]).collect();
        let bufs = upload(&gpu, &zeros);
        let mut rx = replay_receiver(&bufs, stream);
        rx.set_commit_on_demand(true);
        // SAFETY: the default stream.
        let nothing = unsafe { rx.commit(0) };
        assert!(nothing.is_err(), "{codec}: a commit with no sync waiting");
        let committed = truth.len() - 2;
        let mut held = zeros.clone();
        for (k, want) in truth.iter().enumerate().take(committed) {
            // SAFETY: the default stream.
            let r = unsafe { rx.receive(0, None) }
                .unwrap_or_else(|e| panic!("{codec}, sync {k}: {e}"))
                .expect("a sync, not the end");
            assert_eq!(r.version, k as u64 + 1);
            assert!(rx.awaits_commit(), "{codec}, sync {k}");
            assert_eq!(
                &download(&gpu, &bufs, &held),
                &held,
                "{codec}, sync {k}: staged only"
            );
            let was = (k > 0).then_some(k as u64);
            assert_eq!(
                rx.version(),
                was,
                "{codec}, sync {k}: the version held until the commit"
            );
            rx.verify()
                .unwrap_or_else(|e| panic!("{codec}, sync {k}: {e}"));
            // No second sync while one waits (the link is not read).
            // SAFETY: the default stream.
            assert!(unsafe { rx.receive(0, None) }.is_err(), "{codec}, sync {k}");
            // SAFETY: the default stream.
            let c = unsafe { rx.commit(0) }.unwrap_or_else(|e| panic!("{codec}, sync {k}: {e}"));
            assert_eq!((c.version, c.changed), (r.version, r.changed));
            assert!(!rx.awaits_commit());
            assert_eq!(rx.version(), Some(k as u64 + 1));
            assert_eq!(&download(&gpu, &bufs, want), want, "{codec}, sync {k}");
            rx.verify()
                .unwrap_or_else(|e| panic!("{codec}, sync {k}: {e}"));
            held = want.clone();
        }
        // Staged, then dropped: nothing written, the version held stays.
        // SAFETY: the default stream.
        unsafe { rx.receive(0, None) }
            .expect("the sync to drop")
            .expect("a sync");
        rx.abort_sync();
        assert!(!rx.awaits_commit());
        assert_eq!(rx.version(), Some(committed as u64), "{codec}");
        assert_eq!(
            &download(&gpu, &bufs, &held),
            &held,
            "{codec}: nothing written"
        );
        rx.verify().expect("the bits held");
        // The next delta starts from the dropped version: refused, nothing written.
        // SAFETY: the default stream.
        let refused = unsafe { rx.receive(0, None) };
        assert!(refused.is_err(), "{codec}: a delta from a version not held");
        assert!(!rx.awaits_commit());
        assert_eq!(
            &download(&gpu, &bufs, &held),
            &held,
            "{codec}: nothing written"
        );
        // SAFETY: the default stream.
        assert!(matches!(unsafe { rx.receive(0, None) }, Ok(None)));
    }
}
