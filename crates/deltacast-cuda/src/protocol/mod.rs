//! The GPU sync on a device link (host side, no GPU needed, so it is tested everywhere).
//!
//! A GPU sync is made of frames of the core's format (`deltacast::wire`, docs/wire-format.md):
//! one frame per **stage**, a consecutive run of slots, so that the receiver checks and
//! applies one stage while the sender diffs the next. On a device link (NCCL or the CUDA-IPC
//! link) a frame travels in parts, each a broadcast from the trainer's root rank, and without
//! its checksum:
//!
//! 1. the header, 64 bytes;
//! 2. the manifest and digest table (`entry_count × 64 + digest_count × 24` bytes): one
//!    digest record per slot of the stage, in slot order;
//! 3. a delta: the position region `[sections_start, values_start)`, then the value region
//!    `[values_start, frame_len − 8)`, each one broadcast; a seed or dense frame: each
//!    entry's value section straight into its tensor (`all` + `raw` entries that tile
//!    each slot), no padding sent.
//!
//! The header's bytes are the file's: a captured stage becomes a file frame once its sections
//! are laid at their offsets and the checksum appended ([`Stage::to_frame`]).
//!
//! Integrity without a checksum: the receiver checks every length against its own slot table
//! before it allocates or receives anything, the GPU check refuses any chunk whose positions
//! are out of range, unsorted or no-ops, and nothing is written until the digests computed
//! from the bits held plus the changes equal the sender's. Corruption in transit therefore
//! fails the digest (a 64-bit check per slot) and applies nothing.

use std::ops::Range;

use deltacast::codec::{PosCodec, ValCodec};
use deltacast::wire::{
    self, ChunkEntry, FrameHeader, FrameKind, SlotDigest, CHECKSUM_LEN, DIGEST_LEN, ENTRY_LEN,
    HEADER_LEN, MAX_CHUNK_RANGE,
};

use crate::error::{CudaError, Result};

mod limits;
mod relay;
#[cfg(test)]
mod tests;

#[cfg(feature = "cuda")]
pub(crate) use limits::check_gather;
pub use limits::{check_shard_runs, choose_sections, ChunkChoice, TableLimits};
use limits::{section_bounds, value_bounds};
pub use relay::{device_parts, device_parts_reusing, FrameAssembler};

/// Bytes of a stage's header: the core's frame header.
pub const HEADER_BYTES: usize = HEADER_LEN;
/// Bytes of one chunk record: the core's manifest entry.
pub const CHUNK_RECORD_BYTES: usize = ENTRY_LEN;
/// Bytes of one slot's digest record.
pub const SLOT_RECORD_BYTES: usize = DIGEST_LEN;
/// The finest chunk grid a sender may use: it bounds the manifest a receiver accepts.
pub const MIN_CHUNK_ELEMS: u64 = 4096;
/// The most trainer ranks a sharded sender may have: each shard border can add a chunk to
/// its slot, which the bound on a manifest a receiver accepts allows for.
pub const MAX_TRAINER_RANKS: u64 = 1024;

fn bad(msg: String) -> CudaError {
    CudaError::Protocol(msg)
}

fn core(e: deltacast::Error) -> CudaError {
    CudaError::Protocol(e.to_string())
}

/// Offset of the first section of a frame with `entries` chunks and `digests` records.
fn sections_start(entries: u64, digests: u64) -> u64 {
    HEADER_LEN as u64 + entries * ENTRY_LEN as u64 + digests * DIGEST_LEN as u64
}

/// One stage of a GPU sync: a frame of the core's format whose digest records name
/// consecutive slots (the stage's) and whose chunks lie in those slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    pub header: FrameHeader,
    pub entries: Vec<ChunkEntry>,
    pub digests: Vec<SlotDigest>,
}

impl Stage {
    /// A delta stage of slots `first_slot ..`, one (before, after) digest pair per slot;
    /// `records` have offsets relative to the packed position region (`position_bytes`) and
    /// the packed value region (`value_bytes`), as the GPU writes them.
    #[allow(clippy::too_many_arguments)]
    pub fn delta(
        version: u64,
        table_hash: u64,
        stage: u32,
        stages: u32,
        first_slot: u32,
        digests: &[(u64, u64)],
        records: Vec<ChunkEntry>,
        position_bytes: u64,
        value_bytes: u64,
    ) -> Result<Stage> {
        Stage::packed(
            FrameKind::Delta,
            version,
            table_hash,
            (stage, stages),
            first_slot,
            digests,
            records,
            (position_bytes, value_bytes),
        )
    }

    /// A stage of any kind whose `records` have offsets relative to its position region
    /// and value region (of `regions` bytes each).
    #[allow(clippy::too_many_arguments)]
    pub fn packed(
        kind: FrameKind,
        version: u64,
        table_hash: u64,
        (stage, stages): (u32, u32),
        first_slot: u32,
        digests: &[(u64, u64)],
        mut records: Vec<ChunkEntry>,
        (position_bytes, value_bytes): (u64, u64),
    ) -> Result<Stage> {
        let start = sections_start(records.len() as u64, digests.len() as u64);
        let values_start = start + position_bytes;
        for r in &mut records {
            r.pos_offset = r
                .pos_offset
                .checked_add(start)
                .ok_or_else(|| bad("position offset overflows".into()))?;
            r.val_offset = r
                .val_offset
                .checked_add(values_start)
                .ok_or_else(|| bad("value offset overflows".into()))?;
        }
        Ok(Stage::assemble(
            kind,
            version,
            table_hash,
            (stage, stages),
            first_slot,
            digests,
            records,
            values_start,
            values_start + value_bytes,
        ))
    }

    /// A seed or dense stage of the slots `first_slot ..` of `slots` (elements, width): per
    /// slot `all` + `raw` entries of at most `MAX_CHUNK_RANGE` elements whose value sections
    /// follow each other, each slot's starting at a multiple of its width.
    pub fn whole(
        kind: FrameKind,
        version: u64,
        table_hash: u64,
        (stage, stages): (u32, u32),
        first_slot: u32,
        slots: &[(u64, usize)],
        digests: &[(u64, u64)],
    ) -> Stage {
        let start = sections_start(
            slots
                .iter()
                .map(|&(n, _)| n.div_ceil(MAX_CHUNK_RANGE))
                .sum(),
            digests.len() as u64,
        );
        let mut entries = Vec::new();
        let mut end = start;
        for (i, &(numel, width)) in slots.iter().enumerate() {
            let w = width as u64;
            end = end.next_multiple_of(w);
            let mut at = 0;
            while at < numel {
                let range = (numel - at).min(MAX_CHUNK_RANGE);
                entries.push(ChunkEntry {
                    slot: first_slot + i as u32,
                    pos_codec: PosCodec::All,
                    val_codec: ValCodec::Raw,
                    start: at,
                    range,
                    count: range,
                    pos_offset: start,
                    pos_len: 0,
                    val_offset: end,
                    val_len: range * w,
                });
                end += range * w;
                at += range;
            }
        }
        Stage::assemble(
            kind,
            version,
            table_hash,
            (stage, stages),
            first_slot,
            digests,
            entries,
            start,
            end,
        )
    }

    /// The frame that tells receivers no sync follows.
    pub fn close(version: u64, table_hash: u64) -> Stage {
        Stage::assemble(
            FrameKind::Close,
            version,
            table_hash,
            (0, 1),
            0,
            &[],
            Vec::new(),
            sections_start(0, 0),
            sections_start(0, 0),
        )
    }

    #[allow(clippy::too_many_arguments)]
    fn assemble(
        kind: FrameKind,
        version: u64,
        table_hash: u64,
        (stage, stages): (u32, u32),
        first_slot: u32,
        digests: &[(u64, u64)],
        entries: Vec<ChunkEntry>,
        values_start: u64,
        sections_end: u64,
    ) -> Stage {
        let digests: Vec<SlotDigest> = digests
            .iter()
            .enumerate()
            .map(|(i, &(base, new))| SlotDigest {
                slot: first_slot + i as u32,
                base,
                new,
            })
            .collect();
        let header = FrameHeader {
            kind,
            is_final: stage + 1 == stages,
            version,
            table_hash,
            flush_index: stage,
            flush_count: stages,
            entry_count: entries.len() as u32,
            digest_count: digests.len() as u32,
            frame_len: sections_end + CHECKSUM_LEN as u64,
            values_start,
        };
        Stage {
            header,
            entries,
            digests,
        }
    }

    pub fn kind(&self) -> FrameKind {
        self.header.kind
    }

    /// This stage's index in its sync.
    pub fn index(&self) -> u32 {
        self.header.flush_index
    }

    /// Stages of its sync.
    pub fn count(&self) -> u32 {
        self.header.flush_count
    }

    pub fn is_last(&self) -> bool {
        self.header.is_final
    }

    /// The stage's slot ids.
    pub fn slots(&self) -> Range<usize> {
        let first = self.digests.first().map_or(0, |d| d.slot as usize);
        first..first + self.digests.len()
    }

    pub fn sections_start(&self) -> u64 {
        sections_start(self.entries.len() as u64, self.digests.len() as u64)
    }

    /// Bytes of the position region (a delta's packed position sections).
    pub fn position_bytes(&self) -> u64 {
        self.header.values_start - self.sections_start()
    }

    /// Bytes of the value region (a delta's packed value sections; a whole stage's slots,
    /// with the padding that aligns each).
    pub fn value_bytes(&self) -> u64 {
        self.header.frame_len - CHECKSUM_LEN as u64 - self.header.values_start
    }

    /// Bytes of the manifest and digest table, the second broadcast.
    pub fn manifest_bytes(&self) -> u64 {
        self.sections_start() - HEADER_LEN as u64
    }

    /// Where entry `e`'s position section lies in the position region.
    pub fn position_offset(&self, e: &ChunkEntry) -> u64 {
        e.pos_offset - self.sections_start()
    }

    /// Where entry `e`'s value section lies in the value region.
    pub fn value_offset(&self, e: &ChunkEntry) -> u64 {
        e.val_offset - self.header.values_start
    }

    /// Bytes a device link carries for this stage (header, manifest, sections; no padding
    /// of whole stages, no checksum).
    pub fn wire_bytes(&self) -> u64 {
        let sections = match self.kind() {
            FrameKind::Delta => self.position_bytes() + self.value_bytes(),
            _ => self.entries.iter().map(|e| e.val_len).sum(),
        };
        HEADER_LEN as u64 + self.manifest_bytes() + sections
    }

    pub fn encode_header(&self) -> [u8; HEADER_BYTES] {
        self.header.encode()
    }

    /// The manifest and digest table, as the second broadcast carries them.
    pub fn encode_manifest(&self) -> Vec<u8> {
        let mut out = vec![0u8; self.manifest_bytes() as usize];
        let (entries, digests) = out.split_at_mut(self.entries.len() * ENTRY_LEN);
        for (e, rec) in self
            .entries
            .iter()
            .zip(entries.as_chunks_mut::<ENTRY_LEN>().0)
        {
            e.encode_into(rec);
        }
        for (d, rec) in self
            .digests
            .iter()
            .zip(digests.as_chunks_mut::<DIGEST_LEN>().0)
        {
            d.encode_into(rec);
        }
        out
    }

    /// The stage as a frame of the core's format, checksum included: `positions` and
    /// `values` are the regions as a delta broadcasts them; for a whole stage, `values`
    /// holds each entry's section back to back, as they are broadcast.
    pub fn to_frame(&self, positions: &[u8], values: &[u8]) -> Result<Vec<u8>> {
        // Sized by what was received, never by what the header claims.
        let mut out = Vec::with_capacity(
            HEADER_LEN + self.manifest_bytes() as usize + positions.len() + values.len() + 64,
        );
        out.extend_from_slice(&self.encode_header());
        out.extend_from_slice(&self.encode_manifest());
        match self.kind() {
            FrameKind::Delta => {
                if positions.len() as u64 != self.position_bytes()
                    || values.len() as u64 != self.value_bytes()
                {
                    return Err(bad("captured regions do not match the stage".into()));
                }
                out.extend_from_slice(positions);
                out.extend_from_slice(values);
            }
            _ => {
                // Each section follows the last, with less than 8 bytes of padding between.
                let pad_to = |out: &mut Vec<u8>, at: u64| {
                    let here = out.len() as u64;
                    if at < here || at - here >= 8 {
                        return Err(bad(
                            "a whole stage's sections are not laid back to back".into()
                        ));
                    }
                    out.resize(at as usize, 0);
                    Ok(())
                };
                let mut rest = values;
                for e in &self.entries {
                    pad_to(&mut out, e.val_offset)?;
                    let Some((section, tail)) = rest.split_at_checked(e.val_len as usize) else {
                        return Err(bad("captured sections shorter than the stage".into()));
                    };
                    out.extend_from_slice(section);
                    rest = tail;
                }
                if !rest.is_empty() {
                    return Err(bad("captured sections longer than the stage".into()));
                }
                pad_to(&mut out, self.header.body_end())?;
            }
        }
        let sum = wire::checksum(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        Ok(out)
    }

    /// Checks that this stage may come next in a sync: after nothing (a new sync: stage 0,
    /// from slot 0), or after `prev` (the next stage of the same sync, starting where `prev`
    /// ended); a last stage must end at the last slot.
    pub fn follows(&self, prev: Option<&Stage>, num_slots: usize) -> Result<()> {
        let ok = match prev {
            None => self.index() == 0 && self.slots().start == 0,
            Some(p) => {
                self.index() == p.index() + 1
                    && self.count() == p.count()
                    && self.header.version == p.header.version
                    && self.slots().start == p.slots().end
                    && (self.kind() == FrameKind::Seed) == (p.kind() == FrameKind::Seed)
            }
        };
        if !ok || (self.is_last() && self.slots().end != num_slots) {
            return Err(bad(format!(
                "stage {} of {} (slots {:?}, version {}) out of sequence",
                self.index(),
                self.count(),
                self.slots(),
                self.header.version
            )));
        }
        Ok(())
    }
}

/// A stage on a device link has its sections split into a position and a value region
/// (`values_start` set); a file frame may leave it 0, a stage may not.
pub(crate) fn check_split(h: &FrameHeader) -> Result<()> {
    if h.kind != FrameKind::Close && h.values_start == 0 {
        return Err(bad(
            "a stage on a device link splits its sections (values_start is 0)".into(),
        ));
    }
    Ok(())
}

/// Parses and checks a stage's header against the receiver's own table: every size it
/// announces is bounded by that table before anything is allocated for it.
pub fn decode_header(b: &[u8], table: &TableLimits) -> Result<FrameHeader> {
    if b.len() != HEADER_BYTES {
        return Err(bad(format!("header of {} bytes", b.len())));
    }
    let h = FrameHeader::decode(b).map_err(core)?;
    if h.kind == FrameKind::Close {
        if h.entry_count != 0 || h.digest_count != 0 {
            return Err(bad("a close carries nothing".into()));
        }
        return Ok(h);
    }
    if h.kind == FrameKind::Verify {
        return Err(bad("verify frames do not travel on a device link".into()));
    }
    if h.table_hash != table.hash {
        return Err(CudaError::WrongTable {
            expected: table.hash,
            got: h.table_hash,
        });
    }
    let all = 0..table.num_slots;
    let slots = table.num_slots as u64;
    if h.flush_count == 0 || h.flush_count as u64 > slots.max(1) {
        return Err(bad(format!(
            "a sync of {} stages for {slots} slots",
            h.flush_count
        )));
    }
    if h.digest_count as u64 > slots || (h.digest_count == 0 && slots > 0) {
        return Err(bad(format!(
            "{} digest records for {slots} slots",
            h.digest_count
        )));
    }
    check_split(&h)?;
    let entries = h.entry_count as u64;
    let start = sections_start(entries, h.digest_count as u64);
    // FrameHeader::decode checked values_start and frame_len against sections_start.
    let positions = h.values_start - start;
    let values = h.frame_len - CHECKSUM_LEN as u64 - h.values_start;
    match h.kind {
        FrameKind::Delta => {
            if entries > table.max_chunks(all.clone()) {
                return Err(bad(format!(
                    "{entries} chunks: more than this model's slots can have"
                )));
            }
            if positions > table.max_position_bytes(all.clone(), entries) {
                return Err(bad(format!(
                    "{positions} position bytes: more than any delta of this model needs"
                )));
            }
            if values > table.max_value_bytes(all.clone(), entries) {
                return Err(bad(format!(
                    "{values} value bytes for slots of {} bytes",
                    table.bytes(all)
                )));
            }
        }
        _ => {
            // One entry per grid cell at most (a CPU seed's chunks), or per 2^32 - 1 elements.
            let whole_entries: u64 = table
                .slots
                .iter()
                .map(|&(n, _)| n.div_ceil(MAX_CHUNK_RANGE))
                .sum();
            let most_entries = table.max_chunks(all.clone()).max(whole_entries);
            // Each slot's bytes, plus what aligns each section (to 8 at most).
            let most_bytes = table.bytes(all).saturating_add(entries.saturating_mul(8));
            if entries > most_entries || positions != 0 || values > most_bytes {
                return Err(bad(format!(
                    "a {} stage of {entries} chunks and {values} bytes for slots of {} bytes",
                    h.kind.name(),
                    table.total_bytes
                )));
            }
        }
    }
    Ok(h)
}

/// Parses a stage's manifest (bounded by its checked header) and checks every record
/// against the receiver's slots: digest records of consecutive slots, chunks only of those,
/// ranges inside their slot, in order and not overlapping, codecs the GPU decodes, section
/// lengths their codec allows, sections aligned for the GPU's kernels and inside their
/// region; a seed or dense stage's entries tile each of its slots.
pub fn decode_stage(header: FrameHeader, b: &[u8], table: &TableLimits) -> Result<Stage> {
    let (entries, digests) = wire::parse_manifest(&header, b).map_err(core)?;
    let stage = Stage {
        header,
        entries,
        digests,
    };
    let slots = stage.slots();
    for (i, d) in stage.digests.iter().enumerate() {
        if d.slot as usize != slots.start + i || slots.end > table.num_slots {
            return Err(bad(format!(
                "digest record {i} names slot {}: a stage's records name consecutive slots of the table",
                d.slot
            )));
        }
    }
    if stage.kind() == FrameKind::Seed && (stage.count() != 1 || slots != (0..table.num_slots)) {
        return Err(bad("a seed is one stage of every slot".into()));
    }
    match stage.kind() {
        FrameKind::Delta => check_delta_entries(&stage, table)?,
        FrameKind::Close => {}
        _ => check_whole_entries(&stage, table)?,
    }
    Ok(stage)
}

fn check_delta_entries(stage: &Stage, table: &TableLimits) -> Result<()> {
    let slots = stage.slots();
    let mut last_end: Vec<u64> = vec![0; slots.len()];
    for (k, c) in stage.entries.iter().enumerate() {
        let fail = |why: &str| bad(format!("chunk {k}: {why}"));
        let Some(&(numel, width)) = (c.slot as usize)
            .checked_sub(slots.start)
            .filter(|&i| i < slots.len())
            .and_then(|_| table.slots.get(c.slot as usize))
        else {
            return Err(fail("slot id outside the stage's slots"));
        };
        if !matches!(
            c.pos_codec,
            PosCodec::All
                | PosCodec::Abs32
                | PosCodec::Gaps
                | PosCodec::Bitmap
                | PosCodec::Holes
                | PosCodec::Steps
        ) {
            return Err(fail(&format!(
                "position codec {} is not decoded on the GPU",
                c.pos_codec.name()
            )));
        }
        if c.val_codec == ValCodec::Context {
            return Err(fail("value codec ctx is not decoded on the GPU"));
        }
        if c.pos_codec == PosCodec::All && c.count != c.range {
            return Err(fail("all positions with fewer changes than elements"));
        }
        // (`steps` comes only with `esc` values: ChunkEntry::decode checked the pair.)
        let steppable = table.steppable.get(c.slot as usize).copied();
        if c.pos_codec == PosCodec::Steps && steppable != Some(true) {
            return Err(fail("steps chunks need a floating-point slot"));
        }
        let Some(end) = c.start.checked_add(c.range).filter(|&e| e <= numel) else {
            return Err(fail("lies beyond its slot"));
        };
        let last = &mut last_end[c.slot as usize - slots.start];
        if c.start < *last {
            return Err(fail("overlaps or precedes an earlier chunk of its slot"));
        }
        *last = end;
        let w = width as u64;
        let (pmin, pmax) = section_bounds(c.pos_codec, c.count, c.range);
        if c.pos_len < pmin || c.pos_len > pmax {
            return Err(fail("position section length impossible for its codec"));
        }
        let (vmin, vmax) = value_bounds(c.val_codec, c.count, w);
        if c.val_len < vmin || c.val_len > vmax {
            return Err(fail("value section length impossible for its codec"));
        }
        // parse_manifest put each section in its region; the kernels read them aligned.
        if !stage.position_offset(c).is_multiple_of(4) {
            return Err(fail("position section not 4-byte aligned in its region"));
        }
        let align = if c.val_codec == ValCodec::Ulp { 4 } else { w };
        if !stage.value_offset(c).is_multiple_of(align) {
            return Err(fail(
                "value section not aligned for its codec in its region",
            ));
        }
    }
    Ok(())
}

fn check_whole_entries(stage: &Stage, table: &TableLimits) -> Result<()> {
    let slots = stage.slots();
    let mut entries = stage.entries.iter().enumerate().peekable();
    for slot in slots {
        let (numel, width) = table.slots[slot];
        let w = width as u64;
        let mut next = 0u64;
        while let Some((k, e)) = entries.next_if(|(_, e)| e.slot as usize == slot) {
            let fail = |why: &str| bad(format!("chunk {k}: {why}"));
            if e.pos_codec != PosCodec::All || e.val_codec != ValCodec::Raw {
                return Err(fail("a whole stage carries all + raw chunks"));
            }
            if e.start != next || e.count != e.range || e.start + e.range > numel {
                return Err(fail("whole chunks must tile their slot in order"));
            }
            if e.val_len != e.range * w || !stage.value_offset(e).is_multiple_of(w) {
                return Err(fail("value section not its elements' bytes, aligned"));
            }
            next += e.range;
        }
        if next != numel {
            return Err(bad(format!(
                "slot {slot}: a whole stage carries {next} of its {numel} elements"
            )));
        }
    }
    if let Some((k, e)) = entries.next() {
        return Err(bad(format!(
            "chunk {k}: slot {} outside the stage's slots, or out of order",
            e.slot
        )));
    }
    Ok(())
}

/// Moves chunk records (as [`Stage::encode_manifest`] writes them) from one trainer rank's
/// own sections to where its sections land in the gathered ones: adds `position_base` to
/// every position offset and `value_base` to every value offset. A sharded sender's leader
/// does this to each rank's records before it sends them on.
pub fn rebase_chunk_records(records: &mut [u8], position_base: u64, value_base: u64) -> Result<()> {
    if !records.len().is_multiple_of(CHUNK_RECORD_BYTES) {
        return Err(bad(format!(
            "{} bytes of chunk records are not whole records",
            records.len()
        )));
    }
    for (k, rec) in records
        .as_chunks_mut::<CHUNK_RECORD_BYTES>()
        .0
        .iter_mut()
        .enumerate()
    {
        let mut e = ChunkEntry::decode(rec).map_err(core)?;
        let moved = |off: u64, base: u64| {
            off.checked_add(base)
                .ok_or_else(|| bad(format!("chunk record {k}: offset overflows when rebased")))
        };
        e.pos_offset = moved(e.pos_offset, position_base)?;
        e.val_offset = moved(e.val_offset, value_base)?;
        e.encode_into(rec);
    }
    Ok(())
}

/// Decodes chunk records (relative offsets, as one trainer rank wrote them).
pub fn decode_chunk_records(records: &[u8]) -> Result<Vec<ChunkEntry>> {
    if !records.len().is_multiple_of(CHUNK_RECORD_BYTES) {
        return Err(bad(format!(
            "{} bytes of chunk records are not whole records",
            records.len()
        )));
    }
    records
        .chunks_exact(CHUNK_RECORD_BYTES)
        .map(|rec| ChunkEntry::decode(rec).map_err(core))
        .collect()
}
