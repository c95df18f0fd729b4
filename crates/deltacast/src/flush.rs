//! The streaming flush builder: turns per-slot changes (or seed values) into frames of at most
//! `bucket_size` bytes, handing each finished frame to a sink as soon as it is full, so the
//! sender holds about two buckets whatever the model size.

use std::collections::BTreeMap;

use rayon::prelude::*;

use crate::codec::{
    encode_chunk_with_state_into, encode_seed_chunk_into, CodecChoice, EncodedChunk, PosCodec,
    ValCodec,
};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::wire::{
    FrameKind, FrameWriter, SlotDigest, CHECKSUM_LEN, DIGEST_LEN, ENTRY_LEN, HEADER_LEN,
    MAX_CHUNK_RANGE,
};

/// Default bucket: 512 MiB, the usual NCCL broadcast bucket.
pub const DEFAULT_BUCKET_SIZE: usize = 512 << 20;
/// Default chunk range: 1 Mi elements, small enough for parallel decode, large enough that
/// manifest entries cost nothing.
pub const DEFAULT_CHUNK_ELEMS: u64 = 1 << 20;
/// A bucket must hold a header, one entry with an element and the checksum, with room to spare.
pub const MIN_BUCKET_SIZE: usize = 1024;

/// Chunks encoded together in parallel before being placed into frames.
const ENCODE_BATCH: usize = 32;

/// How a sync is cut into frames and coded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushConfig {
    pub bucket_size: usize,
    pub chunk_elems: u64,
    pub codec: CodecChoice,
}

impl Default for FlushConfig {
    fn default() -> Self {
        FlushConfig {
            bucket_size: DEFAULT_BUCKET_SIZE,
            chunk_elems: DEFAULT_CHUNK_ELEMS,
            codec: CodecChoice::Auto,
        }
    }
}

impl FlushConfig {
    pub fn validate(&self) -> Result<()> {
        if self.bucket_size < MIN_BUCKET_SIZE {
            return Err(Error::InvalidArgument(format!(
                "bucket size {} is below the minimum {MIN_BUCKET_SIZE}",
                self.bucket_size
            )));
        }
        if self.chunk_elems == 0 || self.chunk_elems > MAX_CHUNK_RANGE {
            return Err(Error::InvalidArgument(format!(
                "chunk size {} outside 1..={MAX_CHUNK_RANGE}",
                self.chunk_elems
            )));
        }
        Ok(())
    }
}

/// What one sync cost on the wire.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SyncStats {
    pub version: u64,
    pub flushes: u32,
    pub wire_bytes: u64,
    pub chunks: u64,
    /// Changed elements (seed: every element).
    pub changed: u64,
    /// Bytes of position and value sections, without headers, manifests and padding.
    pub section_bytes: u64,
    /// Chunks per codec pair, e.g. `"gaps+ulp" → 311`.
    pub codecs: BTreeMap<String, u64>,
    /// Largest frame emitted.
    pub max_flush_bytes: u64,
}

/// A chunk encoded and small enough for one frame: what ranks ship to the leader and what the
/// leader places into frames without re-encoding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReadyChunk {
    pub slot: u32,
    pub start: u64,
    pub range: u64,
    pub count: u64,
    pub pos_codec: PosCodec,
    pub val_codec: ValCodec,
    pub positions: Vec<u8>,
    pub values: Vec<u8>,
}

impl ReadyChunk {
    /// Bytes this chunk adds to a frame.
    pub fn frame_cost(&self) -> usize {
        FrameWriter::chunk_cost(self.positions.len(), self.values.len())
    }
}

/// A chunk waiting to be encoded: `rel` positions (empty when all elements are set).
struct PendingChunk<'a> {
    start: u64,
    range: u64,
    rel: Vec<u32>,
    all: bool,
    seed: bool,
    old: &'a [u8],
    new: &'a [u8],
    /// The bits of the chunk's whole range after the sync, where the sender knows them (what
    /// `ctx` positions are coded against).
    after: Option<&'a [u8]>,
}

/// Room for chunk bytes in an empty frame.
fn frame_capacity(config: &FlushConfig) -> usize {
    config.bucket_size - HEADER_LEN - CHECKSUM_LEN
}

/// Cuts one slot's changes on the chunk grid, encodes the chunks (in parallel batches) and hands
/// each, in order, to `emit`; a chunk too large for an empty frame is split in two until it fits.
/// `positions` are sorted, below `numel`, in the slot's final coordinates; `old`/`new` hold their
/// bit patterns. With `seed`, values are sent raw (a seed must not depend on what a receiver held);
/// so are the values of a dtype `ulp` must not carry ([`CodecChoice::for_dtype`]).
#[allow(clippy::too_many_arguments)]
pub fn encode_changes(
    config: &FlushConfig,
    seed: bool,
    slot: u32,
    numel: u64,
    dtype: DType,
    positions: &[u64],
    old: &[u8],
    new: &[u8],
    mut emit: impl FnMut(ReadyChunk) -> Result<()>,
) -> Result<()> {
    let mut pool = Vec::new();
    let emit = |c: &mut ReadyChunk| emit(take_ready(c));
    let config = &for_dtype(config, dtype);
    let width = dtype.width();
    encode_changes_in(
        config, seed, slot, numel, width, positions, old, new, None, &mut pool, emit,
    )
}

/// `config` with the codec choice for the values of `dtype`.
fn for_dtype(config: &FlushConfig, dtype: DType) -> FlushConfig {
    FlushConfig {
        codec: config.codec.for_dtype(dtype),
        ..*config
    }
}

/// The chunk's sections moved out of `c` (left empty), for a sink that keeps them.
fn take_ready(c: &mut ReadyChunk) -> ReadyChunk {
    ReadyChunk {
        positions: std::mem::take(&mut c.positions),
        values: std::mem::take(&mut c.values),
        ..*c
    }
}

/// [`encode_changes`] with the encoded chunks lent to `emit`, their section buffers kept in
/// `pool` for the next batch (and the next call) unless `emit` takes them.
#[allow(clippy::too_many_arguments)]
fn encode_changes_in(
    config: &FlushConfig,
    seed: bool,
    slot: u32,
    numel: u64,
    width: usize,
    positions: &[u64],
    old: &[u8],
    new: &[u8],
    after: Option<&[u8]>,
    pool: &mut Vec<EncodedChunk>,
    mut emit: impl FnMut(&mut ReadyChunk) -> Result<()>,
) -> Result<()> {
    if old.len() != positions.len() * width || new.len() != positions.len() * width {
        return Err(Error::InvalidArgument(
            "positions and values differ in length".into(),
        ));
    }
    if after.is_some_and(|a| a.len() as u64 != numel * width as u64) {
        return Err(Error::InvalidArgument(format!(
            "the state after the sync of slot {slot} is not {numel} elements"
        )));
    }
    if positions.last().is_some_and(|&p| p >= numel) {
        return Err(Error::InvalidArgument(format!(
            "position beyond slot {slot} of {numel} elements"
        )));
    }
    let grid = config.chunk_elems;
    let mut pending = Vec::new();
    let mut i = 0;
    while i < positions.len() {
        // The grid cell holding positions[i] bounds the chunk; its range is then tightened to
        // the changes it holds (never costlier for any codec, and a rank's contiguous piece of a
        // slot becomes an `all` chunk in a seed).
        let cell_end = (positions[i] / grid * grid + grid).min(numel);
        let j = i + positions[i..].partition_point(|&p| p < cell_end);
        let start = positions[i];
        let range = positions[j - 1] - start + 1;
        let rel = positions[i..j]
            .iter()
            .map(|&p| (p - start) as u32)
            .collect();
        pending.push(PendingChunk {
            start,
            range,
            rel,
            all: false,
            seed,
            old: &old[i * width..j * width],
            new: &new[i * width..j * width],
            after: after.map(|a| &a[start as usize * width..(start + range) as usize * width]),
        });
        if pending.len() == ENCODE_BATCH {
            let batch = std::mem::take(&mut pending);
            encode_batch(config, slot, width, batch, pool, &mut emit)?;
        }
        i = j;
    }
    encode_batch(config, slot, width, pending, pool, &mut emit)
}

/// Every element of one slot, values only (a single-process seed): `values` is the whole slot.
pub fn encode_full_slot(
    config: &FlushConfig,
    slot: u32,
    width: usize,
    values: &[u8],
    mut emit: impl FnMut(ReadyChunk) -> Result<()>,
) -> Result<()> {
    encode_full_slot_in(config, slot, width, values, &mut Vec::new(), |c| {
        emit(take_ready(c))
    })
}

/// [`encode_full_slot`] with the chunks lent to `emit` (see [`encode_changes_in`]).
fn encode_full_slot_in(
    config: &FlushConfig,
    slot: u32,
    width: usize,
    values: &[u8],
    pool: &mut Vec<EncodedChunk>,
    mut emit: impl FnMut(&mut ReadyChunk) -> Result<()>,
) -> Result<()> {
    let numel = (values.len() / width) as u64;
    // Keep each seed chunk within one bucket from the start.
    let per_bucket = ((frame_capacity(config) - ENTRY_LEN) / width) as u64;
    let grid = config.chunk_elems.min(per_bucket).max(1);
    let mut start = 0;
    let mut pending = Vec::new();
    while start < numel {
        let range = grid.min(numel - start);
        let bytes = &values[(start as usize) * width..((start + range) as usize) * width];
        pending.push(PendingChunk {
            start,
            range,
            rel: Vec::new(),
            all: true,
            seed: true,
            old: bytes,
            new: bytes,
            after: None,
        });
        if pending.len() == ENCODE_BATCH {
            let batch = std::mem::take(&mut pending);
            encode_batch(config, slot, width, batch, pool, &mut emit)?;
        }
        start += range;
    }
    encode_batch(config, slot, width, pending, pool, &mut emit)
}

/// Encodes `pending` in parallel into the first buffers of `pool` (grown to fit), then fits
/// and emits each chunk in order.
fn encode_batch(
    config: &FlushConfig,
    slot: u32,
    width: usize,
    pending: Vec<PendingChunk<'_>>,
    pool: &mut Vec<EncodedChunk>,
    emit: &mut impl FnMut(&mut ReadyChunk) -> Result<()>,
) -> Result<()> {
    if pool.len() < pending.len() {
        pool.resize_with(pending.len(), EncodedChunk::default);
    }
    let pool = &mut pool[..pending.len()];
    pending
        .par_iter()
        .zip(pool.par_iter_mut())
        .for_each(|(c, enc)| encode_pending_into(config.codec, width, c, enc));
    for (chunk, enc) in pending.iter().zip(pool) {
        fit(config, slot, width, chunk, enc, emit)?;
    }
    Ok(())
}

/// Emits an encoded chunk, splitting its range in two while it would not fit an empty frame.
fn fit(
    config: &FlushConfig,
    slot: u32,
    width: usize,
    chunk: &PendingChunk<'_>,
    enc: &mut EncodedChunk,
    emit: &mut impl FnMut(&mut ReadyChunk) -> Result<()>,
) -> Result<()> {
    let cost = FrameWriter::chunk_cost(enc.positions.len(), enc.values.len());
    if cost > frame_capacity(config) {
        if chunk.range <= 1 {
            return Err(Error::InvalidArgument(format!(
                "bucket size {} cannot hold one element",
                config.bucket_size
            )));
        }
        for part in split_chunk(chunk, chunk.range / 2, width) {
            encode_pending_into(config.codec, width, &part, enc);
            fit(config, slot, width, &part, enc, emit)?;
        }
        return Ok(());
    }
    let mut ready = ReadyChunk {
        slot,
        start: chunk.start,
        range: chunk.range,
        count: if chunk.all {
            chunk.range
        } else {
            chunk.rel.len() as u64
        },
        pos_codec: enc.pos_codec.unwrap_or(PosCodec::All),
        val_codec: enc.val_codec.unwrap_or(ValCodec::Raw),
        positions: std::mem::take(&mut enc.positions),
        values: std::mem::take(&mut enc.values),
    };
    let done = emit(&mut ready);
    // Back for the next chunk (empty if `emit` kept them).
    enc.positions = ready.positions;
    enc.values = ready.values;
    done
}

/// Builds the frames of one sync and hands each to `sink` when it is full.
pub struct SyncEncoder<F: FnMut(Vec<u8>) -> Result<()>> {
    kind: FrameKind,
    version: u64,
    table_hash: u64,
    config: FlushConfig,
    writer: FrameWriter,
    sink: F,
    stats: SyncStats,
    /// Section buffers of the last batch of chunks, reused by the next (as many as a batch
    /// holds at once anyway): no fresh pages per chunk.
    pool: Vec<EncodedChunk>,
}

impl<F: FnMut(Vec<u8>) -> Result<()>> SyncEncoder<F> {
    pub fn new(
        kind: FrameKind,
        version: u64,
        table_hash: u64,
        config: FlushConfig,
        sink: F,
    ) -> Result<Self> {
        config.validate()?;
        Ok(SyncEncoder {
            kind,
            version,
            table_hash,
            config,
            writer: FrameWriter::new(kind, version, table_hash, 0),
            sink,
            stats: SyncStats {
                version,
                ..Default::default()
            },
            pool: Vec::new(),
        })
    }

    pub fn config(&self) -> &FlushConfig {
        &self.config
    }

    /// Adds the changes of one slot (see [`encode_changes`]).
    pub fn push_delta(
        &mut self,
        slot: u32,
        numel: u64,
        dtype: DType,
        positions: &[u64],
        old: &[u8],
        new: &[u8],
    ) -> Result<()> {
        self.push_delta_with_state(slot, numel, dtype, positions, old, new, None)
    }

    /// [`push_delta`](Self::push_delta) from a sender that holds the slot's bits after the
    /// sync (`after`, the whole slot): with [`CodecChoice::AutoContext`] its chunks may then
    /// take `ctx` positions.
    #[allow(clippy::too_many_arguments)]
    pub fn push_delta_with_state(
        &mut self,
        slot: u32,
        numel: u64,
        dtype: DType,
        positions: &[u64],
        old: &[u8],
        new: &[u8],
        after: Option<&[u8]>,
    ) -> Result<()> {
        let config = for_dtype(&self.config, dtype);
        let width = dtype.width();
        let seed = self.kind == FrameKind::Seed;
        let mut pool = std::mem::take(&mut self.pool);
        let push = |c: &mut ReadyChunk| self.push_ready(c);
        let done = encode_changes_in(
            &config, seed, slot, numel, width, positions, old, new, after, &mut pool, push,
        );
        self.pool = pool;
        done
    }

    /// Adds every element of one slot (a seed): `values` holds the whole slot.
    pub fn push_seed(&mut self, slot: u32, width: usize, values: &[u8]) -> Result<()> {
        let config = self.config;
        let mut pool = std::mem::take(&mut self.pool);
        let push = |c: &mut ReadyChunk| self.push_ready(c);
        let done = encode_full_slot_in(&config, slot, width, values, &mut pool, push);
        self.pool = pool;
        done
    }

    /// Puts an encoded chunk into the current frame, starting a new frame when it does not fit.
    pub fn push_ready(&mut self, c: &ReadyChunk) -> Result<()> {
        let cost = c.frame_cost();
        if cost > frame_capacity(&self.config) {
            return Err(Error::InvalidArgument(format!(
                "a chunk of {cost} bytes does not fit bucket size {}",
                self.config.bucket_size
            )));
        }
        if self.writer.len() + cost > self.config.bucket_size {
            self.emit(false)?;
        }
        self.writer.push_chunk(
            c.slot,
            c.pos_codec,
            c.val_codec,
            c.start,
            c.range,
            c.count,
            &c.positions,
            &c.values,
        );
        self.stats.chunks += 1;
        self.stats.changed += c.count;
        self.stats.section_bytes += (c.positions.len() + c.values.len()) as u64;
        *self
            .stats
            .codecs
            .entry(format!("{}+{}", c.pos_codec.name(), c.val_codec.name()))
            .or_default() += 1;
        Ok(())
    }

    fn emit(&mut self, is_final: bool) -> Result<()> {
        let next_index = self.stats.flushes + 1;
        let writer = std::mem::replace(
            &mut self.writer,
            FrameWriter::new(self.kind, self.version, self.table_hash, next_index),
        );
        let frame = writer.finish(is_final);
        self.stats.flushes += 1;
        self.stats.wire_bytes += frame.len() as u64;
        self.stats.max_flush_bytes = self.stats.max_flush_bytes.max(frame.len() as u64);
        (self.sink)(frame)
    }

    /// Appends the digest records and emits the final frame.
    pub fn finish(mut self, digests: &[SlotDigest]) -> Result<SyncStats> {
        for d in digests {
            if self.writer.len() + DIGEST_LEN > self.config.bucket_size {
                self.emit(false)?;
            }
            self.writer.push_digest(*d);
        }
        self.emit(true)?;
        Ok(self.stats)
    }
}

/// Encodes `chunk` into `enc` (its buffers reused).
fn encode_pending_into(
    choice: CodecChoice,
    width: usize,
    chunk: &PendingChunk<'_>,
    enc: &mut EncodedChunk,
) {
    if chunk.all {
        enc.pos_codec = Some(PosCodec::All);
        enc.val_codec = Some(ValCodec::Raw);
        enc.positions.clear();
        enc.values.clear();
        enc.values.extend_from_slice(chunk.new);
        return;
    }
    if chunk.seed {
        return encode_seed_chunk_into(&chunk.rel, chunk.range as u32, chunk.new, enc);
    }
    encode_chunk_with_state_into(
        choice,
        width,
        &chunk.rel,
        chunk.range as u32,
        chunk.old,
        chunk.new,
        chunk.after,
        enc,
    )
}

/// Splits a chunk at `at` elements from its start into two chunks (dropping an empty side of a delta).
fn split_chunk<'a>(chunk: &PendingChunk<'a>, at: u64, width: usize) -> Vec<PendingChunk<'a>> {
    if chunk.all {
        let cut = at as usize * width;
        return vec![
            PendingChunk {
                start: chunk.start,
                range: at,
                rel: Vec::new(),
                all: true,
                seed: chunk.seed,
                old: &chunk.old[..cut],
                new: &chunk.new[..cut],
                after: None,
            },
            PendingChunk {
                start: chunk.start + at,
                range: chunk.range - at,
                rel: Vec::new(),
                all: true,
                seed: chunk.seed,
                old: &chunk.old[cut..],
                new: &chunk.new[cut..],
                after: None,
            },
        ];
    }
    let k = chunk.rel.partition_point(|&p| (p as u64) < at);
    let cut = at as usize * width;
    let mut parts = Vec::with_capacity(2);
    if k > 0 {
        parts.push(PendingChunk {
            start: chunk.start,
            range: at,
            rel: chunk.rel[..k].to_vec(),
            all: false,
            seed: chunk.seed,
            old: &chunk.old[..k * width],
            new: &chunk.new[..k * width],
            after: chunk.after.map(|a| &a[..cut]),
        });
    }
    if k < chunk.rel.len() {
        parts.push(PendingChunk {
            start: chunk.start + at,
            range: chunk.range - at,
            rel: chunk.rel[k..].iter().map(|&p| p - at as u32).collect(),
            all: false,
            seed: chunk.seed,
            old: &chunk.old[k * width..],
            new: &chunk.new[k * width..],
            after: chunk.after.map(|a| &a[cut..]),
        });
    }
    parts
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{adamw_step, bernoulli_positions, Rng};

    /// The sync encoder, whose chunk buffers are reused from batch to batch and slot to slot,
    /// builds the same frames as chunks encoded into fresh buffers (`encode_changes`, whose
    /// sink keeps them), also when chunks are split to fit a frame.
    #[test]
    fn reused_buffers_build_the_same_frames() {
        for bucket_size in [MIN_BUCKET_SIZE, 1 << 14, DEFAULT_BUCKET_SIZE] {
            let config = FlushConfig {
                bucket_size,
                chunk_elems: 3000,
                codec: CodecChoice::Auto,
            };
            let mut rng = Rng(5);
            let mut reused_frames = Vec::new();
            let mut fresh_frames = Vec::new();
            let mut reused = SyncEncoder::new(FrameKind::Delta, 3, 9, config, |f| {
                reused_frames.push(f);
                Ok(())
            })
            .unwrap();
            let mut fresh = SyncEncoder::new(FrameKind::Delta, 3, 9, config, |f| {
                fresh_frames.push(f);
                Ok(())
            })
            .unwrap();
            for (slot, density) in [0.5, 0.01, 1.0, 0.0, 0.9, 0.3, 0.5].into_iter().enumerate() {
                let numel = 150_001u32;
                let positions: Vec<u64> = if density >= 1.0 {
                    (0..numel as u64).collect()
                } else {
                    bernoulli_positions(&mut rng, numel, density)
                        .into_iter()
                        .map(u64::from)
                        .collect()
                };
                let old: Vec<u8> = (0..positions.len() * 2)
                    .map(|_| rng.next_u64() as u8)
                    .collect();
                let new: Vec<u8> = old
                    .chunks(2)
                    .flat_map(|e| {
                        let bits = u16::from_le_bytes([e[0], e[1]]);
                        (bits.wrapping_add(adamw_step(&mut rng) as u16)).to_le_bytes()
                    })
                    .collect();
                let slot = slot as u32;
                reused
                    .push_delta(slot, numel as u64, DType::BF16, &positions, &old, &new)
                    .unwrap();
                let mut kept = Vec::new();
                encode_changes(
                    &config,
                    false,
                    slot,
                    numel as u64,
                    DType::BF16,
                    &positions,
                    &old,
                    &new,
                    |c| {
                        kept.push(c);
                        Ok(())
                    },
                )
                .unwrap();
                for c in &kept {
                    fresh.push_ready(c).unwrap();
                }
            }
            let values: Vec<u8> = (0..20_001).map(|_| rng.next_u64() as u8).collect();
            reused.push_seed(99, 1, &values).unwrap();
            let mut kept = Vec::new();
            encode_full_slot(&config, 99, 1, &values, |c| {
                kept.push(c);
                Ok(())
            })
            .unwrap();
            for c in &kept {
                fresh.push_ready(c).unwrap();
            }
            let stats = reused.finish(&[]).unwrap();
            assert_eq!(stats, fresh.finish(&[]).unwrap());
            assert_eq!(reused_frames, fresh_frames, "bucket {bucket_size}");
        }
    }
}
