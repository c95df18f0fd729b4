//! The GPU sync: a trainer rank ([`GpuSender`]) pushes its tensors to receivers
//! ([`GpuReceiver`]) over NCCL or the CUDA-IPC link ([`crate::link::Link`]), sending only the
//! changed elements (message layout in [`crate::protocol`]).
//!
//! A sync runs in stages, each a consecutive run of tensors of about
//! [`GpuSenderConfig::stage_bytes`]. Per stage the sender runs one batched diff over its
//! tensors against their snapshot (which the diff refreshes in place, and whose per-slot
//! digests it updates, fused), forms the core's chunks on the GPU with both abs32 and bitmap
//! sections (and gaps / ulp with the entropy codecs), keeps the smallest per chunk, packs them,
//! and broadcasts header, manifest, positions and values on a stream of its own, so that the
//! broadcast and the receivers' work on one stage overlap the sender's diff of the next. The
//! diffs run back to back from a thread of their own, on a stream of their own (the caller's
//! `Gpu`); the encoding runs on a second handle whose stream has the greatest priority. When
//! a stage's delta would be as large as its tensors, or more elements changed than the delta
//! buffers hold, that stage is sent whole instead (dense). Receivers check everything against
//! their own slot table, check every chunk and compute their new digests on the GPU, and only
//! then scatter, keeping the overwritten bits of each stage until the last stage applied: a
//! stage that fails undoes the ones before it, so a sync applies whole or not at all. An
//! all-reduce of their status is the ack.
//!
//! Tensors are borrowed by device pointer (a torch tensor's `data_ptr()`), never freed; both
//! sides make their own stream wait for the caller's stream (torch's current stream) first,
//! and return only once their work is complete.
//!
//! Sharded trainers use [`GpuShardedSender`] instead, one per trainer rank: each diffs only
//! its own shards and the leader gathers the ranks' encoded changes before sending them on;
//! receivers are the same.
//!
//! Layout: `sender.rs` is the trainer's side ([`GpuSender`]; its diff thread in
//! `diff_worker.rs`), `sharded.rs` a sharded trainer
//! rank's ([`GpuShardedSender`]; its set-up and the ranks' agreements in `sharded_setup.rs`), `chunks.rs` the chunk planning and writing both senders
//! share, `receiver.rs` each rollout process's ([`GpuReceiver`]); this file holds what all
//! use.

use std::ops::Range;
use std::time::Instant;

use deltacast::{Bf16Rule, DType, SlotInfo, SlotTable};

use crate::error::{CudaError, Result};
use deltacast::wire::FrameKind;

use crate::choice::DeltaCodec;
use crate::protocol::TableLimits;
use crate::{DeviceBuffer, DevicePtr, DigestInput, Gpu};

mod chunks;
mod diff_worker;
mod receiver;
mod sender;
mod settings;
mod sharded;
mod sharded_setup;
mod stage_set;

pub use crate::choice::{ChoiceReport, AUTO_PROBE_EVERY, PROBE_WITHIN};
pub use receiver::GpuReceiver;
pub use sender::GpuSender;
pub use settings::{
    EntropyMode, GpuSenderConfig, SnapshotPlace, DEFAULT_CAPACITY, DEFAULT_STAGE_BYTES,
};
pub use sharded::GpuShardedSender;
pub use sharded_setup::GpuShard;

// The Python bindings hold both ends across threads: they must stay Send + Sync.
const _: fn() = || {
    fn shareable<T: Send + Sync>() {}
    shareable::<GpuSender>();
    shareable::<GpuReceiver>();
    shareable::<GpuShardedSender>();
};

/// The stream whose work a sync waits for before it reads the tensors (torch's current
/// stream), as [`deltacast::WeightSender`] takes it for the GPU senders. Made unsafely: the
/// promise that the handle is a live stream of the sender's context travels with it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WaitStream(u64);

impl WaitStream {
    /// The legacy default stream (handle 0).
    pub const DEFAULT: WaitStream = WaitStream(0);

    /// # Safety
    /// `handle` must be a live stream of the sender's GPU context, or 0, for as long as a
    /// sync given it runs.
    pub unsafe fn new(handle: u64) -> WaitStream {
        WaitStream(handle)
    }

    pub fn handle(self) -> u64 {
        self.0
    }
}

/// One tensor of a sync: a slot, by device pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuTensor {
    pub name: String,
    /// The slot's dtype: what goes on the wire and what receivers hold.
    pub dtype: DType,
    pub shape: Vec<u64>,
    /// Device address of its first element (contiguous, aligned to the source's width).
    pub ptr: DevicePtr,
    /// The dtype of the elements at `ptr`: `dtype`, or (on a [`GpuSender`]) F32 for a BF16
    /// slot, rounded by the sender's [`deltacast::Bf16Rule`] as the kernels read it, so that
    /// fp32 master weights sync as bf16 with no converted copy. Any other pair is refused
    /// with the core's [`deltacast::Error::UnsupportedConversion`].
    pub source: DType,
}

impl GpuTensor {
    /// A tensor whose elements are in the slot's dtype.
    pub fn new(name: impl Into<String>, dtype: DType, shape: Vec<u64>, ptr: DevicePtr) -> Self {
        GpuTensor {
            name: name.into(),
            dtype,
            shape,
            ptr,
            source: dtype,
        }
    }

    /// The same slot read from elements of `source` at `ptr` (see [`GpuTensor::source`]).
    pub fn with_source(self, source: DType) -> Self {
        GpuTensor { source, ..self }
    }

    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    /// Bytes of the slot (the snapshot's, the wire's).
    fn nbytes(&self) -> u64 {
        self.numel() * self.dtype.width() as u64
    }

    /// Whether the kernels round this tensor's fp32 elements into its bf16 slot.
    fn converts(&self) -> bool {
        self.source != self.dtype
    }

    /// The kernels' conversion of this tensor under `rule` (None: read as it is).
    fn f32_source(&self, rule: Bf16Rule) -> Option<Bf16Rule> {
        self.converts().then_some(rule)
    }
}

/// What one sync did, for metrics.
#[derive(Debug, Clone, PartialEq)]
pub struct GpuSyncReport {
    pub kind: FrameKind,
    pub version: u64,
    /// Elements that differ from the previous version (every element for a seed).
    pub changed: u64,
    pub numel: u64,
    /// Bytes broadcast: header, manifest, positions and values (or the tensors).
    pub payload_bytes: u64,
    pub chunks: u64,
    /// Wall time of the whole call, until every receiver acked.
    pub time_ms: f64,
    /// Device time of the diff kernels (senders; 0 for receivers and seeds).
    pub diff_ms: f64,
    /// Whether the delta was sized in the entropy codecs (senders; receivers: whether it
    /// carried gaps or ulp sections).
    pub entropy: bool,
    /// Whether the delta went in the steps code (senders; receivers: whether it carried
    /// steps chunks).
    pub steps: bool,
    /// Stages of the sync, and how many of them were sent whole.
    pub stages: u32,
    pub dense_stages: u32,
    /// Delta stages diffed straight into bitmap + raw (senders; 0 for receivers).
    pub bitmap_stages: u32,
    /// Wall time of each phase summed over the stages, in order of first appearance (sender:
    /// diff, encode, send, ack; receiver: wait, manifest, payload, decode, apply, ack), in
    /// milliseconds. On the sender the broadcasts overlap the next stage's diff, so the
    /// phases add up to the call's time while the work they name overlaps.
    pub phases: Vec<(&'static str, f64)>,
    /// The sender's cost model after the sync: the rates it learned on this link and the
    /// densities above which it sends stages whole (senders; None for receivers).
    pub choice: Option<ChoiceReport>,
}

impl GpuSyncReport {
    /// The report of a seed: every element, one stage sent whole.
    fn seed(version: u64, numel: u64, payload_bytes: u64, started: Instant) -> GpuSyncReport {
        GpuSyncReport {
            kind: FrameKind::Seed,
            version,
            changed: numel,
            numel,
            payload_bytes,
            chunks: 0,
            time_ms: ms(started),
            diff_ms: 0.0,
            entropy: false,
            steps: false,
            stages: 1,
            dense_stages: 1,
            bitmap_stages: 0,
            phases: Vec::new(),
            choice: None,
        }
    }
}

/// What the stages of one delta sync add up to (senders).
#[derive(Debug, Default)]
struct SendTotals {
    changed: u64,
    payload_bytes: u64,
    chunks: u64,
    diff_ms: f64,
    dense_stages: u32,
    bitmap_stages: u32,
    /// Bytes of tensor diffed, bytes sent whole, and the delta stages' wire bytes and changes
    /// (for the cost model).
    diffed_bytes: u64,
    dense_bytes: u64,
    delta_bytes: u64,
    delta_changes: u64,
    /// Of the delta bytes, the steps maps' (a quarter byte per element, whatever changed).
    delta_map_bytes: u64,
}

impl SendTotals {
    /// Counts a stage sent whole, of `bytes` on the wire.
    fn add_dense(&mut self, bytes: u64) {
        self.payload_bytes += bytes;
        self.dense_bytes += bytes;
        self.dense_stages += 1;
    }

    /// Whether any of `stages` stages went as a delta.
    fn any_delta(&self, stages: u32) -> bool {
        self.dense_stages < stages
    }

    /// The report of a sync of `stages` stages that these totals add up.
    fn report(
        self,
        version: u64,
        numel: u64,
        codec: DeltaCodec,
        stages: u32,
        time_ms: f64,
        phases: Vec<(&'static str, f64)>,
    ) -> GpuSyncReport {
        let any_delta = self.any_delta(stages);
        GpuSyncReport {
            kind: if any_delta {
                FrameKind::Delta
            } else {
                FrameKind::Dense
            },
            version,
            changed: self.changed,
            numel,
            payload_bytes: self.payload_bytes,
            chunks: self.chunks,
            time_ms,
            diff_ms: self.diff_ms,
            entropy: codec == DeltaCodec::Entropy && any_delta,
            // (Only where steps chunks went: a stage of no changes sends none.)
            steps: codec == DeltaCodec::Steps && self.delta_map_bytes > 0,
            stages,
            dense_stages: self.dense_stages,
            bitmap_stages: self.bitmap_stages,
            phases,
            choice: None,
        }
    }
}

/// Phase times, summed by name over the stages of a sync; with `DELTACAST_STAGE_TRACE=1`
/// also every phase's end on the wall clock, printed to stderr when the sync ends (the
/// sender's and receivers' lines line up across processes, to see where stages wait).
#[derive(Debug, Default)]
struct Phases {
    sums: Vec<(&'static str, f64)>,
    trace: Option<Vec<(&'static str, f64)>>,
}

/// Milliseconds on the wall clock (within the last 1000 s, to stay readable).
fn wall_ms() -> f64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    (t.as_secs() % 1000) as f64 * 1e3 + t.subsec_nanos() as f64 / 1e6
}

impl Phases {
    fn new() -> Self {
        let traced = std::env::var("DELTACAST_STAGE_TRACE").is_ok_and(|v| v == "1");
        Phases {
            sums: Vec::new(),
            trace: traced.then(Vec::new),
        }
    }

    /// Adds the time since `*mark` to phase `name` and moves the mark to now.
    fn lap(&mut self, name: &'static str, mark: &mut Instant) {
        let now = Instant::now();
        let span = (now - *mark).as_secs_f64() * 1e3;
        *mark = now;
        match self.sums.iter_mut().find(|(n, _)| *n == name) {
            Some((_, t)) => *t += span,
            None => self.sums.push((name, span)),
        }
        self.mark_now(name);
    }

    /// Records an event now (traced syncs only; the clock is not read otherwise).
    fn mark_now(&mut self, name: &'static str) {
        if let Some(t) = &mut self.trace {
            t.push((name, wall_ms()));
        }
    }

    /// Records an event at wall-clock time `at` (traced syncs only).
    fn mark(&mut self, name: &'static str, at: f64) {
        if let Some(t) = &mut self.trace {
            t.push((name, at));
        }
    }

    /// The summed phases; prints the trace first, when there is one.
    fn finish(self, who: &str) -> Vec<(&'static str, f64)> {
        if let Some(t) = &self.trace {
            let line: Vec<String> = t.iter().map(|(n, at)| format!("{n}@{at:.3}")).collect();
            eprintln!("deltacast trace {who}: {}", line.join(" "));
        }
        self.sums
    }
}

/// A buffer that grows on demand (never past what the caller checked).
#[derive(Default)]
struct Growable {
    buf: Option<DeviceBuffer>,
}

impl Growable {
    fn new() -> Self {
        Growable { buf: None }
    }

    fn len(&self) -> u64 {
        self.buf.as_ref().map_or(0, |b| b.len() as u64)
    }

    fn at_least(&mut self, gpu: &Gpu, len: u64) -> Result<DevicePtr> {
        let len = (len.max(256) as usize).next_multiple_of(256);
        if self.buf.as_ref().is_none_or(|b| b.len() < len) {
            self.buf = None;
            // An eighth more than asked: deltas grow a little from step to step, and each
            // reallocation would cost a free (a device synchronisation) and an allocation.
            self.buf = Some(gpu.alloc((len + len / 8).next_multiple_of(256))?);
        }
        Ok(self.buf.as_ref().map_or(0, |b| b.ptr()))
    }
}

fn slot_table(tensors: &[GpuTensor]) -> Result<SlotTable> {
    SlotTable::new(
        tensors
            .iter()
            .map(|t| SlotInfo::new(t.name.clone(), t.dtype, t.shape.clone()))
            .collect(),
    )
    .map_err(|e| CudaError::InvalidArgument(e.to_string()))
}

fn limits(table: &SlotTable) -> TableLimits {
    TableLimits {
        hash: table.hash(),
        num_slots: table.len(),
        total_elements: table.total_elements(),
        total_bytes: table.total_bytes(),
        slots: table
            .slots()
            .iter()
            .map(|s| (s.numel(), s.dtype.width()))
            .collect(),
        steppable: table
            .slots()
            .iter()
            .map(|s| s.dtype.ulp_codable())
            .collect(),
    }
}

/// Checks the tensors' dtypes and alignment; `convert`: whether a source may be fp32 for a
/// bf16 slot (a sender's) or must be the slot's dtype (a receiver's, which writes its bits).
fn check_tensors(tensors: &[GpuTensor], convert: bool) -> Result<()> {
    for t in tensors {
        refuse_non_float(&t.name, t.dtype)?;
        let allowed = t.source == t.dtype || (convert && (t.source, t.dtype) == CONVERTIBLE);
        if !allowed {
            return Err(CudaError::Sync(deltacast::Error::UnsupportedConversion {
                slot: t.name.clone(),
                from: t.source,
                to: t.dtype,
            }));
        }
        let w = t.source.width() as u64;
        if t.numel() > 0 && t.ptr % w != 0 {
            return Err(CudaError::InvalidArgument(format!(
                "tensor `{}` is not aligned to its element width",
                t.name
            )));
        }
    }
    Ok(())
}

/// The one (source, slot) dtype pair a sender converts: fp32 rounded to bf16.
const CONVERTIBLE: (DType, DType) = (DType::F32, DType::BF16);

/// The GPU sync codes values as ULP steps and counts a tensor's elements as its words, so it
/// takes the one-word float dtypes only; integer, bool and 8-byte tensors sync on the CPU.
pub(crate) fn refuse_non_float(name: &str, dtype: DType) -> Result<()> {
    if dtype.ulp_codable() {
        return Ok(());
    }
    Err(CudaError::InvalidArgument(format!(
        "tensor `{name}` is {dtype}: the GPU sync carries BF16, F16, F32, F8_E4M3 and F8_E5M2 \
         tensors only (sync the others with the CPU Sender)"
    )))
}

/// The digest inputs of the tensors of slots `slots` (fp32 sources rounded by `rule`).
fn digest_inputs(tensors: &[GpuTensor], slots: Range<usize>, rule: Bf16Rule) -> Vec<DigestInput> {
    slots
        .map(|i| {
            let t = &tensors[i];
            DigestInput {
                ptr: t.ptr,
                numel: t.numel(),
                width: t.dtype.width(),
                first_index: 0,
                slot: i as u32,
                f32_source: t.f32_source(rule),
            }
        })
        .collect()
}

/// Little-endian u64 words of `bytes` (a trailing partial word is dropped).
pub(crate) fn u64s(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks_exact(8)
        .map(|c| {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            u64::from_le_bytes(w)
        })
        .collect()
}

pub(crate) fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

#[cfg(test)]
mod dtype_tests {
    use super::*;

    #[test]
    fn only_one_word_floats_reach_the_gpu() {
        for d in DType::ALL {
            let r = refuse_non_float("t", d);
            assert_eq!(r.is_ok(), d.ulp_codable(), "{d}");
        }
        let err = refuse_non_float("step", DType::I64)
            .unwrap_err()
            .to_string();
        assert!(err.contains("tensor `step` is I64"), "{err}");
    }

    #[test]
    fn senders_convert_fp32_into_bf16_only_and_receivers_never() {
        let t = |dtype, source| GpuTensor::new("w", dtype, vec![3], 64).with_source(source);
        assert!(check_tensors(&[t(DType::BF16, DType::F32)], true).is_ok());
        assert!(t(DType::BF16, DType::F32).converts());
        assert!(!t(DType::F32, DType::F32).converts());
        for d in DType::ALL.into_iter().filter(|d| d.ulp_codable()) {
            assert!(check_tensors(&[t(d, d)], false).is_ok(), "{d}");
            for s in DType::ALL {
                let ok = s == d || (s, d) == CONVERTIBLE;
                assert_eq!(check_tensors(&[t(d, s)], true).is_ok(), ok, "{s} into {d}");
                if s != d {
                    let e = check_tensors(&[t(d, s)], false).unwrap_err();
                    assert!(
                        matches!(
                            &e,
                            CudaError::Sync(deltacast::Error::UnsupportedConversion { from, to, .. })
                                if *from == s && *to == d
                        ),
                        "a receiver's {s} tensor for a {d} slot: {e:?}"
                    );
                }
            }
        }
        // The source's width sets the alignment: 2-aligned is not enough for fp32.
        let odd = GpuTensor::new("w", DType::BF16, vec![3], 66).with_source(DType::F32);
        assert!(matches!(
            check_tensors(&[odd], true),
            Err(CudaError::InvalidArgument(_))
        ));
    }
}
