//! What every sender does ([`WeightSender`]), and the sender for one process that holds whole
//! slots (a single trainer rank, the CLI, a file diff): it keeps a snapshot of what it last
//! synced, diffs against it, and streams frames.

use rayon::prelude::*;

use crate::convert::fp8::{self, BlockGrid};
use crate::convert::Bf16Rule;
use crate::diff::{diff_and_refresh, diff_f32_as_bf16, diff_f32_as_fp8, Changes};
use crate::digest::{changes_at, digest_slot};
use crate::error::{Error, Result};
use crate::flush::{FlushConfig, SyncEncoder, SyncStats};
use crate::slot::SlotTable;
use crate::wire::{FrameKind, SlotDigest};
use crate::DType;

/// What every deltacast sender does, whatever one sync reads (host buffers, a trainer rank's
/// shards with its collective, device tensors) and wherever its frames go: the four senders
/// ([`Sender`], [`crate::sharded::RankSender`], and the GPU crate's `GpuSender` and
/// `ShardedGpuSender`) implement it, so code and bindings written against it take any of them.
///
/// The state is the same everywhere: the version of the last sync that went out whole (0
/// before the first seed), the slot digests of that version, and whether the next sync must be
/// a seed (the first one, after any failure, or when asked).
pub trait WeightSender {
    /// What one sync reads (and where its frames go).
    type Input<'a>;
    /// What one sync did.
    type Report;
    type Error: std::error::Error;

    /// The slots the receivers hold.
    fn slot_table(&self) -> &SlotTable;
    /// The version of the last sync that went out whole (0 before the first).
    fn version(&self) -> u64;
    /// Per-slot digests of that version, in table order (a sharded sender: on the leader).
    fn digests(&self) -> &[u64];
    /// The combined digest receivers must ack.
    fn state_digest(&self) -> u64 {
        self.digests().iter().fold(0u64, |a, &d| a.wrapping_add(d))
    }
    /// Makes the next sync a seed (a receiver joined late or asked for one).
    fn request_seed(&mut self);
    /// A seed the first time, after a failure or when asked; a delta otherwise.
    fn sync(&mut self, input: Self::Input<'_>) -> std::result::Result<Self::Report, Self::Error>;
    /// Every element, whatever the receivers hold.
    fn seed(&mut self, input: Self::Input<'_>) -> std::result::Result<Self::Report, Self::Error> {
        self.request_seed();
        self.sync(input)
    }
}

/// Where a host sender's frames go, as they fill.
pub type FrameSink<'a> = &'a mut dyn FnMut(Vec<u8>) -> Result<()>;

/// One sync of a [`Sender`]: the current bits (one buffer per slot, in table order) and the
/// frames' sink.
pub struct HostSync<'a> {
    pub current: &'a [&'a [u8]],
    pub sink: FrameSink<'a>,
}

/// One slot's source bits for [`Sender::sync_from`] and its kin: little-endian elements of
/// `dtype`, which is either the slot's own dtype (synced as is) or a dtype the sender converts
/// from on the fly. Two conversions exist; any other pair is [`Error::UnsupportedConversion`]:
///
/// - fp32 → bf16, rounded by the sender's [`Bf16Rule`];
/// - fp32 → block FP8 ([`crate::convert::fp8`]): an `F8_E4M3` slot `X` of two or more
///   dimensions whose table also holds the fp32 slot `X_scale_inv` of the scale shape (the
///   last two dimensions divided by 128, rounded up), the layout vLLM and SGLang load. The
///   scale slot's bits are computed from `X`'s source: give it [`Source::derived`].
#[derive(Debug, Clone, Copy)]
pub struct Source<'a> {
    pub dtype: DType,
    pub bytes: &'a [u8],
}

impl<'a> Source<'a> {
    pub fn new(dtype: DType, bytes: &'a [u8]) -> Self {
        Source { dtype, bytes }
    }

    /// The source of a slot whose bits the sender derives from another slot's source (the
    /// scales of a block-FP8 slot): no bytes of its own.
    pub fn derived() -> Self {
        Source {
            dtype: DType::F32,
            bytes: &[],
        }
    }
}

/// What a block-FP8 slot's name takes to name its scale slot (vLLM's and SGLang's
/// `weight_scale_inv`).
pub const FP8_SCALE_SUFFIX: &str = "_scale_inv";

/// The name of the scale slot of block-FP8 slot `name`.
pub fn fp8_scale_slot(name: &str) -> String {
    format!("{name}{FP8_SCALE_SUFFIX}")
}

/// How one slot's source becomes its bits, once checked against the table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Feed {
    /// The source is in the slot's dtype.
    Same,
    /// fp32 source, bf16 slot.
    F32ToBf16,
    /// fp32 source, block-FP8 slot; its scales go to slot `scales`.
    F32ToFp8 { grid: BlockGrid, scales: usize },
    /// The scales of block-FP8 slot `of`, from that slot's source.
    Fp8Scales { of: usize },
}

/// The new scales of every block-FP8 slot of a sync (as fp32 bits), by scale slot, and the
/// factors that quantize with them, by FP8 slot.
struct Fp8Scales {
    scales: Vec<Option<Vec<u32>>>,
    inv: Vec<Option<Vec<f32>>>,
}

impl Fp8Scales {
    fn of(sources: &[Source<'_>], feeds: &[Feed]) -> Fp8Scales {
        let mut scales: Vec<Option<Vec<u32>>> = vec![None; feeds.len()];
        let mut inv: Vec<Option<Vec<f32>>> = vec![None; feeds.len()];
        let work: Vec<(usize, usize, BlockGrid)> = feeds
            .iter()
            .enumerate()
            .filter_map(|(id, f)| match *f {
                Feed::F32ToFp8 { grid, scales } => Some((id, scales, grid)),
                _ => None,
            })
            .collect();
        let done: Vec<(usize, usize, Vec<u32>, Vec<f32>)> = work
            .into_par_iter()
            .map(|(id, sid, grid)| {
                let (mut s, mut f) = (vec![], vec![]);
                fp8::block_scales(&grid, sources[id].bytes, &mut s);
                fp8::inverses(&s, &mut f);
                (id, sid, s, f)
            })
            .collect();
        for (id, sid, s, f) in done {
            scales[sid] = Some(s);
            inv[id] = Some(f);
        }
        Fp8Scales { scales, inv }
    }

    fn scale_bytes(&self, sid: usize) -> Vec<u8> {
        self.scales[sid]
            .iter()
            .flatten()
            .flat_map(|s| s.to_le_bytes())
            .collect()
    }

    fn inv(&self, id: usize) -> &[f32] {
        self.inv[id].as_deref().unwrap_or_default()
    }
}

impl WeightSender for Sender {
    type Input<'a> = HostSync<'a>;
    type Report = SendReport;
    type Error = Error;

    fn slot_table(&self) -> &SlotTable {
        &self.table
    }
    fn version(&self) -> u64 {
        self.version
    }
    fn digests(&self) -> &[u64] {
        &self.digests
    }
    fn request_seed(&mut self) {
        self.needs_seed = true;
    }
    fn sync(&mut self, input: HostSync<'_>) -> Result<SendReport> {
        Sender::sync(self, input.current, input.sink)
    }
    fn seed(&mut self, input: HostSync<'_>) -> Result<SendReport> {
        Sender::seed(self, input.current, input.sink)
    }
}

/// Trainer-side state: the snapshot, its digests and the version last synced.
pub struct Sender {
    table: SlotTable,
    config: FlushConfig,
    snapshot: Vec<Vec<u8>>,
    digests: Vec<u64>,
    version: u64,
    /// True until a seed went out whole; a failed sync sets it again, since receivers may not
    /// have the version the snapshot now holds.
    needs_seed: bool,
    changes: Changes,
    /// How fp32 sources round into bf16 slots.
    bf16_rule: Bf16Rule,
}

/// What one sync did on the sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SendReport {
    pub kind: FrameKind,
    pub stats: SyncStats,
    /// The combined digest of the state the sync starts from (0 for a seed).
    pub base_digest: u64,
    /// The combined state digest receivers must ack.
    pub state_digest: u64,
    /// Elements compared.
    pub elements: u64,
}

impl Sender {
    pub fn new(table: SlotTable, config: FlushConfig) -> Result<Self> {
        config.validate()?;
        let snapshot = table
            .slots()
            .iter()
            .map(|s| vec![0u8; s.nbytes() as usize])
            .collect();
        let digests = vec![0; table.len()];
        Ok(Sender {
            table,
            config,
            snapshot,
            digests,
            version: 0,
            needs_seed: true,
            changes: Changes::default(),
            bf16_rule: Bf16Rule::default(),
        })
    }

    /// A sender whose snapshot is `base` at `version`, as if it had synced it (file diffs).
    pub fn with_base(
        table: SlotTable,
        config: FlushConfig,
        base: Vec<Vec<u8>>,
        version: u64,
    ) -> Result<Self> {
        let mut sender = Sender::new(table, config)?;
        sender.check_buffers(&base.iter().map(Vec::as_slice).collect::<Vec<_>>())?;
        sender.digests = sender.compute_digests(&base);
        sender.snapshot = base;
        sender.version = version;
        sender.needs_seed = false;
        Ok(sender)
    }

    pub fn table(&self) -> &SlotTable {
        &self.table
    }

    pub fn config(&self) -> &FlushConfig {
        &self.config
    }

    pub fn set_config(&mut self, config: FlushConfig) -> Result<()> {
        config.validate()?;
        self.config = config;
        Ok(())
    }

    /// How fp32 sources round into bf16 slots; [`Bf16Rule::TORCH_CPU`] unless set.
    pub fn bf16_rule(&self) -> Bf16Rule {
        self.bf16_rule
    }

    /// Sets the NaN result of fp32 → bf16 conversion, to match what the trainer's own
    /// `.to(torch.bfloat16)` would give (see [`crate::convert`]). Takes effect from the next
    /// sync; changing it between syncs is allowed (NaNs then show up as changes).
    pub fn set_bf16_rule(&mut self, rule: Bf16Rule) {
        self.bf16_rule = rule;
    }

    fn compute_digests(&self, bufs: &[Vec<u8>]) -> Vec<u64> {
        bufs.par_iter()
            .enumerate()
            .map(|(id, b)| digest_slot(id as u32, self.table.slots()[id].dtype.width(), b))
            .collect()
    }

    fn check_buffers(&self, current: &[&[u8]]) -> Result<()> {
        if current.len() != self.table.len() {
            return Err(Error::InvalidArgument(format!(
                "{} buffers given for {} slots",
                current.len(),
                self.table.len()
            )));
        }
        for (slot, buf) in self.table.slots().iter().zip(current) {
            if buf.len() as u64 != slot.nbytes() {
                return Err(Error::SlotMismatch {
                    slot: slot.name.clone(),
                    reason: format!(
                        "buffer has {} bytes, slot needs {}",
                        buf.len(),
                        slot.nbytes()
                    ),
                });
            }
        }
        Ok(())
    }

    /// Checks one source per slot, in table order: its dtype converts to the slot's, and it
    /// holds exactly the slot's elements (a derived slot: none).
    fn check_sources(&self, sources: &[Source<'_>]) -> Result<Vec<Feed>> {
        if sources.len() != self.table.len() {
            return Err(Error::InvalidArgument(format!(
                "{} sources given for {} slots",
                sources.len(),
                self.table.len()
            )));
        }
        let mut feeds = Vec::with_capacity(sources.len());
        for (slot, src) in self.table.slots().iter().zip(sources) {
            feeds.push(match (src.dtype, slot.dtype) {
                (from, to) if from == to => Feed::Same,
                (DType::F32, DType::BF16) => Feed::F32ToBf16,
                (DType::F32, DType::F8E4M3) => self.fp8_feed(&slot.name, &slot.shape)?,
                (from, to) => {
                    return Err(Error::UnsupportedConversion {
                        slot: slot.name.clone(),
                        from,
                        to,
                    })
                }
            });
        }
        for id in 0..feeds.len() {
            if let Feed::F32ToFp8 { scales, .. } = feeds[id] {
                let name = &self.table.slots()[scales].name;
                if feeds[scales] != Feed::Same || !sources[scales].bytes.is_empty() {
                    return Err(Error::SlotMismatch {
                        slot: name.clone(),
                        reason: format!(
                            "holds the block scales of `{}`, quantized from its fp32 source: \
                             it takes no source of its own",
                            self.table.slots()[id].name
                        ),
                    });
                }
                feeds[scales] = Feed::Fp8Scales { of: id };
            }
        }
        for ((slot, src), feed) in self.table.slots().iter().zip(sources).zip(&feeds) {
            if matches!(feed, Feed::Fp8Scales { .. }) {
                continue;
            }
            // (`numel` counts sync words: two per 8-byte element; a source is whole elements.)
            let need = slot.elements() * src.dtype.element_size() as u64;
            if src.bytes.len() as u64 != need {
                return Err(Error::SlotMismatch {
                    slot: slot.name.clone(),
                    reason: format!(
                        "{:?} source has {} bytes, {} elements need {need}",
                        src.dtype,
                        src.bytes.len(),
                        slot.elements()
                    ),
                });
            }
        }
        Ok(feeds)
    }

    /// The feed of FP8 slot `name` of `shape` from an fp32 source: its block grid and its
    /// scale slot, both checked against the table.
    fn fp8_feed(&self, name: &str, shape: &[u64]) -> Result<Feed> {
        let mismatch = |reason: String| Error::SlotMismatch {
            slot: name.to_string(),
            reason,
        };
        let grid = BlockGrid::of(shape).ok_or_else(|| {
            mismatch(format!(
                "block FP8 quantizes tensors of two or more dimensions, not {shape:?}"
            ))
        })?;
        let scale_name = fp8_scale_slot(name);
        let scales = self.table.id_of(&scale_name).map_err(|_| {
            mismatch(format!(
                "an fp32 source quantizes to block FP8 with its scales in slot `{scale_name}`, \
                 which the table lacks"
            ))
        })? as usize;
        let info = &self.table.slots()[scales];
        let want = BlockGrid::scale_shape(shape);
        if info.dtype != DType::F32 || info.shape != want {
            return Err(mismatch(format!(
                "its scale slot `{scale_name}` is {:?} {:?}, block FP8 needs F32 {want:?}",
                info.dtype, info.shape
            )));
        }
        Ok(Feed::F32ToFp8 { grid, scales })
    }

    /// Sources in each slot's own dtype, after the plain length check.
    fn same_sources<'a>(&self, current: &[&'a [u8]]) -> Result<Vec<Source<'a>>> {
        self.check_buffers(current)?;
        Ok(self
            .table
            .slots()
            .iter()
            .zip(current)
            .map(|(slot, &bytes)| Source::new(slot.dtype, bytes))
            .collect())
    }

    /// [`Sender::sync`] from per-slot sources that may need converting ([`Source`]).
    pub fn sync_from<F: FnMut(Vec<u8>) -> Result<()>>(
        &mut self,
        sources: &[Source<'_>],
        sink: F,
    ) -> Result<SendReport> {
        if self.needs_seed {
            self.seed_from(sources, sink)
        } else {
            self.delta_from(sources, sink)
        }
    }

    /// Sends `current` (one buffer per slot, in table order): a seed the first time or after
    /// a failure, a delta otherwise. Frames go to `sink` as they fill.
    pub fn sync<F: FnMut(Vec<u8>) -> Result<()>>(
        &mut self,
        current: &[&[u8]],
        sink: F,
    ) -> Result<SendReport> {
        if self.needs_seed {
            self.seed(current, sink)
        } else {
            self.delta(current, sink)
        }
    }

    /// Sends every element.
    pub fn seed<F: FnMut(Vec<u8>) -> Result<()>>(
        &mut self,
        current: &[&[u8]],
        sink: F,
    ) -> Result<SendReport> {
        let sources = self.same_sources(current)?;
        self.seed_from(&sources, sink)
    }

    /// [`Sender::seed`] from per-slot sources that may need converting.
    pub fn seed_from<F: FnMut(Vec<u8>) -> Result<()>>(
        &mut self,
        sources: &[Source<'_>],
        sink: F,
    ) -> Result<SendReport> {
        let feeds = self.check_sources(sources)?;
        self.needs_seed = true;
        let version = self.version + 1;
        let rule = self.bf16_rule;
        let fp8 = Fp8Scales::of(sources, &feeds);
        self.snapshot
            .par_iter_mut()
            .enumerate()
            .zip(sources.par_iter().zip(&feeds))
            .for_each(|((id, snap), (src, feed))| match *feed {
                Feed::Same => snap.copy_from_slice(src.bytes),
                Feed::F32ToBf16 => rule.convert_slice(src.bytes, snap),
                Feed::F32ToFp8 { grid, .. } => {
                    fp8::quantize_range(&grid, fp8.inv(id), src.bytes, 0, snap)
                }
                Feed::Fp8Scales { .. } => snap.copy_from_slice(&fp8.scale_bytes(id)),
            });
        let digests = self.compute_digests(&self.snapshot);
        // The snapshot now holds exactly the bits this seed carries.
        let current: Vec<&[u8]> = self.snapshot.iter().map(Vec::as_slice).collect();
        let stats = self.encode_seed(version, &digests, &current, sink)?;
        self.digests = digests;
        self.version = version;
        self.needs_seed = false;
        Ok(SendReport {
            kind: FrameKind::Seed,
            stats,
            base_digest: 0,
            state_digest: self.state_digest(),
            elements: self.table.total_elements(),
        })
    }

    /// Encodes again a seed of the version last sent, from `current` (which must hold that
    /// version's bits), changing nothing: for a receiver repaired between two syncs.
    pub fn resend_seed<F: FnMut(Vec<u8>) -> Result<()>>(
        &self,
        current: &[&[u8]],
        sink: F,
    ) -> Result<SyncStats> {
        self.check_buffers(current)?;
        self.encode_seed(self.version, &self.digests, current, sink)
    }

    /// [`Sender::resend_seed`] from the snapshot, which holds exactly the last version's bits
    /// (converted ones included), so the caller needs no copy of them.
    pub fn resend_snapshot<F: FnMut(Vec<u8>) -> Result<()>>(&self, sink: F) -> Result<SyncStats> {
        if self.needs_seed {
            return Err(Error::InvalidArgument(
                "no complete sync to resend: the next sync is a seed".into(),
            ));
        }
        let current: Vec<&[u8]> = self.snapshot.iter().map(Vec::as_slice).collect();
        self.encode_seed(self.version, &self.digests, &current, sink)
    }

    /// The frames of a seed of `version` whose slots have `digests`.
    fn encode_seed<F: FnMut(Vec<u8>) -> Result<()>>(
        &self,
        version: u64,
        digests: &[u64],
        current: &[&[u8]],
        sink: F,
    ) -> Result<SyncStats> {
        let mut enc = SyncEncoder::new(
            FrameKind::Seed,
            version,
            self.table.hash(),
            self.config,
            sink,
        )?;
        for (id, slot) in self.table.slots().iter().enumerate() {
            enc.push_seed(id as u32, slot.dtype.width(), current[id])?;
        }
        let records: Vec<SlotDigest> = digests
            .iter()
            .enumerate()
            .map(|(id, &d)| SlotDigest {
                slot: id as u32,
                base: 0,
                new: d,
            })
            .collect();
        enc.finish(&records)
    }

    /// Sends the elements whose bits changed since the last sync.
    pub fn delta<F: FnMut(Vec<u8>) -> Result<()>>(
        &mut self,
        current: &[&[u8]],
        sink: F,
    ) -> Result<SendReport> {
        let sources = self.same_sources(current)?;
        self.delta_from(&sources, sink)
    }

    /// [`Sender::delta`] from per-slot sources that may need converting; a converted slot's
    /// changes are those of its converted bits.
    pub fn delta_from<F: FnMut(Vec<u8>) -> Result<()>>(
        &mut self,
        sources: &[Source<'_>],
        sink: F,
    ) -> Result<SendReport> {
        let feeds = self.check_sources(sources)?;
        if self.needs_seed {
            return Err(Error::InvalidArgument(
                "no seed went out yet: send a seed first".into(),
            ));
        }
        // From here the snapshot moves ahead of the receivers; only a complete sync clears this.
        self.needs_seed = true;
        let version = self.version + 1;
        let base_digest = self.state_digest();
        let fp8 = Fp8Scales::of(sources, &feeds);
        let mut enc = SyncEncoder::new(
            FrameKind::Delta,
            version,
            self.table.hash(),
            self.config,
            sink,
        )?;
        let mut records = Vec::with_capacity(self.table.len());
        for (id, slot) in self.table.slots().iter().enumerate() {
            let width = slot.dtype.width();
            let changes = &mut self.changes;
            changes.clear();
            let snap = &mut self.snapshot[id];
            match feeds[id] {
                Feed::Same => diff_and_refresh(snap, sources[id].bytes, width, 0, changes),
                Feed::F32ToBf16 => {
                    diff_f32_as_bf16(snap, sources[id].bytes, self.bf16_rule, 0, changes)
                }
                Feed::F32ToFp8 { grid, .. } => {
                    diff_f32_as_fp8(snap, sources[id].bytes, &grid, fp8.inv(id), 0, changes)
                }
                Feed::Fp8Scales { .. } => {
                    diff_and_refresh(snap, &fp8.scale_bytes(id), width, 0, changes)
                }
            }
            // In pieces of 2^16 changes (the hash loop is vectorized per piece).
            const PIECE: usize = 1 << 16;
            let moved = changes
                .positions
                .par_chunks(PIECE)
                .zip(changes.old_values.par_chunks(PIECE * width))
                .zip(changes.new_values.par_chunks(PIECE * width))
                .map(|((pos, old), new)| changes_at(id as u32, width, pos, old, new))
                .reduce(|| 0u64, u64::wrapping_add);
            let base = self.digests[id];
            let new = base.wrapping_add(moved);
            self.digests[id] = new;
            records.push(SlotDigest {
                slot: id as u32,
                base,
                new,
            });
            // The refreshed snapshot is the slot after the sync: what `ctx` positions need.
            enc.push_delta_with_state(
                id as u32,
                slot.numel(),
                slot.dtype,
                &changes.positions,
                &changes.old_values,
                &changes.new_values,
                Some(&self.snapshot[id]),
            )?;
        }
        let stats = enc.finish(&records)?;
        self.version = version;
        self.needs_seed = false;
        Ok(SendReport {
            kind: FrameKind::Delta,
            stats,
            base_digest,
            state_digest: self.state_digest(),
            elements: self.table.total_elements(),
        })
    }

    /// Frames carrying only digests, so receivers can cross-check memory against them.
    pub fn verify<F: FnMut(Vec<u8>) -> Result<()>>(&self, sink: F) -> Result<SyncStats> {
        let enc = SyncEncoder::new(
            FrameKind::Verify,
            self.version,
            self.table.hash(),
            self.config,
            sink,
        )?;
        let records: Vec<SlotDigest> = self
            .digests
            .iter()
            .enumerate()
            .map(|(id, &d)| SlotDigest {
                slot: id as u32,
                base: d,
                new: d,
            })
            .collect();
        enc.finish(&records)
    }
}
