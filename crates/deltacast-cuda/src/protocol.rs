//! The GPU sync's message layout (host side, no GPU needed, so it is tested everywhere).
//!
//! A GPU sync moves device buffers with NCCL (or the CUDA-IPC link, `ipc::IpcComm`), not the
//! framed byte stream of the core: frames are assembled and checksummed on the host, and
//! copying a whole delta through host memory would cost more than the link. A sync is one or more stages, each a consecutive run of
//! slots (so that the receiver checks and applies one stage while the sender diffs the
//! next); each stage is four broadcasts from the trainer's root rank:
//!
//! 1. the [`Header`], 80 bytes, fixed size: the sync's kind, version and table, which stage
//!    of how many, and its slots (`first_slot .. first_slot + stage_slots`);
//! 2. the manifest: per slot of the stage the digest before and after (16 bytes each), then
//!    per chunk a [`ChunkRecord`] (64 bytes) — `header.manifest_bytes` long;
//! 3. the position sections, packed (`header.position_bytes`);
//! 4. the value sections, packed (`header.value_bytes`).
//!
//! A seed or a dense stage replaces 2–4 with the tensors' own bytes, slot after slot. The
//! stages of a sync cover the slot table in order, each starting where the last ended; a
//! seed or a close is one stage of every slot. A stage is delta or dense on its own (dense
//! where its delta would not be smaller, or did not fit the sender's buffers).
//!
//! Integrity without a checksum: the receiver checks every length against its own slot table
//! before it allocates or receives anything, the GPU check refuses any chunk whose positions
//! are out of range, unsorted or no-ops, and nothing is written until the digests computed
//! from the bits held plus the changes equal the sender's. Corruption in transit therefore
//! fails the digest (a 64-bit check per slot) and applies nothing.

use crate::error::{CudaError, Result};

/// "DCGP": deltacast GPU protocol.
pub const MAGIC: [u8; 4] = *b"DCGP";
/// Version of this layout (2: chunk records carry their value codec and section lengths, for
/// the entropy codecs; 3: syncs in stages).
pub const PROTOCOL_VERSION: u32 = 3;
/// Bytes of a [`Header`].
pub const HEADER_BYTES: usize = 80;
/// Bytes of one [`ChunkRecord`].
pub const CHUNK_RECORD_BYTES: usize = 64;
/// Bytes of one slot's digest pair in the manifest.
pub const SLOT_RECORD_BYTES: usize = 16;
/// The finest chunk grid a sender may use: it bounds the manifest a receiver accepts.
pub const MIN_CHUNK_ELEMS: u64 = 4096;
/// The most trainer ranks a sharded sender may have: each shard border can add a chunk to
/// its slot, which the bound on a manifest a receiver accepts allows for.
pub const MAX_TRAINER_RANKS: u64 = 1024;

/// What a sync carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SyncKind {
    /// Every slot's bytes; the receiver's previous state does not matter.
    Seed = 1,
    /// Changed elements only, as chunks.
    Delta = 2,
    /// Every slot's bytes, from a receiver at the previous version (chosen when a delta would
    /// be larger, or did not fit the sender's buffers).
    Dense = 3,
    /// No sync follows: the sender is closing.
    Close = 4,
}

impl SyncKind {
    fn from_code(code: u32) -> Result<Self> {
        Ok(match code {
            1 => SyncKind::Seed,
            2 => SyncKind::Delta,
            3 => SyncKind::Dense,
            4 => SyncKind::Close,
            _ => return Err(bad(format!("unknown sync kind {code}"))),
        })
    }

    pub fn name(self) -> &'static str {
        match self {
            SyncKind::Seed => "seed",
            SyncKind::Delta => "delta",
            SyncKind::Dense => "dense",
            SyncKind::Close => "close",
        }
    }
}

fn bad(msg: String) -> CudaError {
    CudaError::Protocol(msg)
}

/// The fixed-size first message of a sync.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    pub kind: SyncKind,
    /// The version the receiver holds after applying.
    pub version: u64,
    /// `SlotTable::hash` of the sender's slots; must equal the receiver's.
    pub table_hash: u64,
    pub num_slots: u32,
    pub num_chunks: u64,
    pub manifest_bytes: u64,
    pub position_bytes: u64,
    pub value_bytes: u64,
    /// This stage's index, `0..stages`.
    pub stage: u32,
    /// Stages of this sync (at least 1).
    pub stages: u32,
    /// The stage's slots: `first_slot .. first_slot + stage_slots`.
    pub first_slot: u32,
    pub stage_slots: u32,
}

impl Header {
    /// The header of a one-stage sync of every slot (seeds, closes, unstaged syncs).
    #[allow(clippy::too_many_arguments)]
    pub fn whole(
        kind: SyncKind,
        version: u64,
        table_hash: u64,
        num_slots: u32,
        num_chunks: u64,
        manifest_bytes: u64,
        position_bytes: u64,
        value_bytes: u64,
    ) -> Header {
        Header {
            kind,
            version,
            table_hash,
            num_slots,
            num_chunks,
            manifest_bytes,
            position_bytes,
            value_bytes,
            stage: 0,
            stages: 1,
            first_slot: 0,
            stage_slots: num_slots,
        }
    }

    /// The stage's slot ids.
    pub fn slots(&self) -> std::ops::Range<usize> {
        self.first_slot as usize..(self.first_slot as usize + self.stage_slots as usize)
    }

    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..8].copy_from_slice(&PROTOCOL_VERSION.to_le_bytes());
        b[8..12].copy_from_slice(&(self.kind as u32).to_le_bytes());
        b[12..16].copy_from_slice(&self.num_slots.to_le_bytes());
        b[16..24].copy_from_slice(&self.version.to_le_bytes());
        b[24..32].copy_from_slice(&self.table_hash.to_le_bytes());
        b[32..40].copy_from_slice(&self.num_chunks.to_le_bytes());
        b[40..48].copy_from_slice(&self.manifest_bytes.to_le_bytes());
        b[48..56].copy_from_slice(&self.position_bytes.to_le_bytes());
        b[56..64].copy_from_slice(&self.value_bytes.to_le_bytes());
        b[64..68].copy_from_slice(&self.stage.to_le_bytes());
        b[68..72].copy_from_slice(&self.stages.to_le_bytes());
        b[72..76].copy_from_slice(&self.first_slot.to_le_bytes());
        b[76..80].copy_from_slice(&self.stage_slots.to_le_bytes());
        b
    }

    /// Parses and checks a header against the receiver's own table: every size it announces
    /// is bounded by that table before anything is allocated for it.
    pub fn decode(b: &[u8], table: &TableLimits) -> Result<Header> {
        if b.len() != HEADER_BYTES {
            return Err(bad(format!("header of {} bytes", b.len())));
        }
        if b[0..4] != MAGIC {
            return Err(bad("not a deltacast GPU sync header".into()));
        }
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let u64_at = |o: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(w)
        };
        let version = u32_at(4);
        if version != PROTOCOL_VERSION {
            return Err(bad(format!(
                "protocol version {version}, this build speaks {PROTOCOL_VERSION}"
            )));
        }
        let h = Header {
            kind: SyncKind::from_code(u32_at(8))?,
            num_slots: u32_at(12),
            version: u64_at(16),
            table_hash: u64_at(24),
            num_chunks: u64_at(32),
            manifest_bytes: u64_at(40),
            position_bytes: u64_at(48),
            value_bytes: u64_at(56),
            stage: u32_at(64),
            stages: u32_at(68),
            first_slot: u32_at(72),
            stage_slots: u32_at(76),
        };
        if h.kind == SyncKind::Close {
            return Ok(h);
        }
        if h.table_hash != table.hash || h.num_slots as usize != table.num_slots {
            return Err(CudaError::WrongTable {
                expected: table.hash,
                got: h.table_hash,
            });
        }
        let end = h.first_slot as u64 + h.stage_slots as u64;
        if h.stages == 0
            || h.stage >= h.stages
            || h.stages as u64 > (h.num_slots as u64).max(1)
            || end > h.num_slots as u64
            || (h.stage_slots == 0 && h.num_slots > 0)
        {
            return Err(bad(format!(
                "stage {} of {} over slots {}..{end} of {}",
                h.stage, h.stages, h.first_slot, h.num_slots
            )));
        }
        if h.kind == SyncKind::Seed && (h.stages != 1 || h.stage_slots != h.num_slots) {
            return Err(bad("a seed is one stage of every slot".into()));
        }
        let slots = h.slots();
        let manifest = (h.stage_slots as u64)
            .checked_mul(SLOT_RECORD_BYTES as u64)
            .and_then(|s| {
                h.num_chunks
                    .checked_mul(CHUNK_RECORD_BYTES as u64)
                    .and_then(|c| c.checked_add(s))
            });
        if manifest != Some(h.manifest_bytes) {
            return Err(bad("manifest length does not match its counts".into()));
        }
        match h.kind {
            SyncKind::Delta => {
                if h.num_chunks > table.max_chunks(slots.clone()) {
                    return Err(bad(format!(
                        "{} chunks: more than this model's slots can have",
                        h.num_chunks
                    )));
                }
                if h.position_bytes > table.max_position_bytes(slots.clone(), h.num_chunks) {
                    return Err(bad(format!(
                        "{} position bytes: more than any delta of this model needs",
                        h.position_bytes
                    )));
                }
                if h.value_bytes > table.max_value_bytes(slots.clone(), h.num_chunks) {
                    return Err(bad(format!(
                        "{} value bytes for slots of {} bytes",
                        h.value_bytes,
                        table.bytes(slots)
                    )));
                }
            }
            _ => {
                let bytes = table.bytes(slots);
                if h.num_chunks != 0 || h.position_bytes != 0 || h.value_bytes != bytes {
                    return Err(bad(format!(
                        "a {} stage must carry exactly its slots' {bytes} bytes",
                        h.kind.name(),
                    )));
                }
            }
        }
        Ok(h)
    }
}

impl Header {
    /// Checks that this header may come next in a sync: after nothing (a new sync: stage 0,
    /// from slot 0), or after `prev` (the next stage of the same sync, starting where `prev`
    /// ended); a last stage must end at the last slot. Headers are checked one by one with
    /// [`Header::decode`] first.
    pub fn follows(&self, prev: Option<&Header>) -> Result<()> {
        let ok = match prev {
            None => self.stage == 0 && self.first_slot == 0,
            Some(p) => {
                self.stage == p.stage + 1
                    && self.stages == p.stages
                    && self.version == p.version
                    && self.first_slot as u64 == p.first_slot as u64 + p.stage_slots as u64
            }
        };
        let last = self.stage + 1 == self.stages;
        if !ok
            || (last && self.first_slot as u64 + self.stage_slots as u64 != self.num_slots as u64)
        {
            return Err(bad(format!(
                "stage {} of {} (slots {}.., version {}) out of sequence",
                self.stage, self.stages, self.first_slot, self.version
            )));
        }
        Ok(())
    }
}

/// Cuts slots of `slot_bytes` each into consecutive stages of whole slots: a last stage of
/// the fewest trailing slots that hold half of `stage_bytes` (the receiver's work on it is
/// what the sync waits for after the sender's last diff, so it is kept small), and before it
/// as few stages of about equal size as keep each near `stage_bytes`: each closed once it
/// holds its share (`ceil(bytes before the last stage / stage_bytes)` shares), a remainder
/// under half a share joining the stage before it. `stage_bytes` 0 gives one stage. Always
/// at least one stage (`0..0` for no slots).
#[allow(clippy::single_range_in_vec_init)] // a list of one stage, not of its slots
pub fn plan_stages(slot_bytes: &[u64], stage_bytes: u64) -> Vec<std::ops::Range<usize>> {
    let n = slot_bytes.len();
    if stage_bytes == 0 || n == 0 {
        return vec![0..n];
    }
    let mut tail = n;
    let mut held = 0u64;
    while tail > 0 && (held < stage_bytes.div_ceil(2) || tail == n) {
        tail -= 1;
        held += slot_bytes[tail];
    }
    let before: u64 = slot_bytes[..tail].iter().sum();
    let share = before.div_ceil(before.div_ceil(stage_bytes).max(1)).max(1);
    let mut stages: Vec<std::ops::Range<usize>> = Vec::new();
    let (mut start, mut held) = (0, 0u64);
    for (i, &b) in slot_bytes[..tail].iter().enumerate() {
        held += b;
        if held >= share {
            stages.push(start..i + 1);
            (start, held) = (i + 1, 0);
        }
    }
    if start < tail {
        match stages.last_mut() {
            Some(last) if held < share.div_ceil(2) => last.end = tail,
            _ => stages.push(start..tail),
        }
    }
    stages.push(tail..n);
    stages
}

/// What the receiver knows of its own slots, against which every announced size is checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableLimits {
    pub hash: u64,
    pub num_slots: usize,
    pub total_elements: u64,
    pub total_bytes: u64,
    /// Per slot: (elements, width).
    pub slots: Vec<(u64, usize)>,
}

impl TableLimits {
    fn range(&self, slots: std::ops::Range<usize>) -> &[(u64, usize)] {
        self.slots.get(slots).unwrap_or(&[])
    }

    /// Elements of the slots `slots`.
    pub fn elements(&self, slots: std::ops::Range<usize>) -> u64 {
        self.range(slots).iter().map(|&(n, _)| n).sum()
    }

    /// Bytes of the slots `slots`.
    pub fn bytes(&self, slots: std::ops::Range<usize>) -> u64 {
        self.range(slots).iter().map(|&(n, w)| n * w as u64).sum()
    }

    /// Chunks of a delta over `slots` never exceed, per slot, one per [`MIN_CHUNK_ELEMS`]
    /// elements (senders use a grid at least that coarse) plus one more per shard border
    /// (a sharded sender's ranks each cut the grid cell their shards meet in), nor the
    /// slot's elements (chunks hold at least one change each, and do not overlap). This
    /// bounds the manifest.
    pub fn max_chunks(&self, slots: std::ops::Range<usize>) -> u64 {
        self.range(slots)
            .iter()
            .map(|&(n, _)| n.min(n.div_ceil(MIN_CHUNK_ELEMS) + MAX_TRAINER_RANKS - 1))
            .sum()
    }

    /// Positions of a delta never exceed one bitmap of every element or one u32 per element,
    /// whichever is larger, plus 4 bytes of padding per chunk (a sender takes gaps only where
    /// they are smaller than abs32).
    pub fn max_position_bytes(&self, slots: std::ops::Range<usize>, chunks: u64) -> u64 {
        let elems = self.elements(slots);
        (elems.saturating_mul(4)).saturating_add(chunks.saturating_mul(4))
    }

    /// Values of a delta never exceed its slots' bytes (ulp only where smaller than raw) plus
    /// 4 bytes of padding per chunk.
    pub fn max_value_bytes(&self, slots: std::ops::Range<usize>, chunks: u64) -> u64 {
        self.bytes(slots).saturating_add(chunks.saturating_mul(4))
    }
}

/// Items per block of the entropy codecs (docs/codecs.md).
const CODE_BLOCK: u64 = 1024;

/// Position codec of a chunk (the core's wire codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkPositions {
    Abs32 = 1,
    Gaps = 2,
    Bitmap = 3,
}

/// Value codec of a chunk (the core's wire codes).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChunkValues {
    Raw = 0,
    Ulp = 1,
}

/// One chunk of a delta: a slot's changes between `start` and `start + range`.
///
/// Record layout (64 bytes, little-endian): slot u32, position codec u16, value codec u16,
/// start, range, count, position offset, position length, value offset, value length (u64).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRecord {
    pub slot: u32,
    pub positions: ChunkPositions,
    pub values: ChunkValues,
    pub start: u64,
    pub range: u64,
    pub count: u64,
    /// Byte offset of its position section in the packed positions (4-byte aligned).
    pub position_offset: u64,
    pub position_len: u64,
    /// Byte offset of its value section in the packed values (aligned to the slot's width;
    /// to 4 bytes for ulp).
    pub value_offset: u64,
    pub value_len: u64,
}

/// The lengths a section may have: (least, most) bytes.
fn section_bounds(positions: ChunkPositions, count: u64, range: u64) -> (u64, u64) {
    let blocks = count.div_ceil(CODE_BLOCK);
    match positions {
        ChunkPositions::Abs32 => (count * 4, count * 4),
        ChunkPositions::Bitmap => (range.div_ceil(8), range.div_ceil(8)),
        // A directory entry per block, then 1 to 48 bits per gap.
        ChunkPositions::Gaps => (
            7 * blocks + (count - blocks).div_ceil(8),
            7 * blocks + (count - blocks) * 6,
        ),
    }
}

fn value_bounds(values: ChunkValues, count: u64, width: u64) -> (u64, u64) {
    let blocks = count.div_ceil(CODE_BLOCK);
    match values {
        ChunkValues::Raw => (count * width, count * width),
        // A directory entry per block, then 1 to (2·nb + 1) bits per value.
        ChunkValues::Ulp => (
            4 * blocks + count.div_ceil(8),
            4 * blocks + (count * (16 * width + 1)).div_ceil(8),
        ),
    }
}

impl ChunkRecord {
    fn encode_into(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.slot.to_le_bytes());
        out.extend_from_slice(&(self.positions as u16).to_le_bytes());
        out.extend_from_slice(&(self.values as u16).to_le_bytes());
        out.extend_from_slice(&self.start.to_le_bytes());
        out.extend_from_slice(&self.range.to_le_bytes());
        out.extend_from_slice(&self.count.to_le_bytes());
        out.extend_from_slice(&self.position_offset.to_le_bytes());
        out.extend_from_slice(&self.position_len.to_le_bytes());
        out.extend_from_slice(&self.value_offset.to_le_bytes());
        out.extend_from_slice(&self.value_len.to_le_bytes());
    }
}

/// The manifest of a stage: digests before and after per slot of the stage, and the chunks
/// of a delta.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Manifest {
    /// Per slot of the stage, in order: (digest the receiver must hold before, digest it
    /// holds after).
    pub digests: Vec<(u64, u64)>,
    pub chunks: Vec<ChunkRecord>,
}

impl Manifest {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            self.digests.len() * SLOT_RECORD_BYTES + self.chunks.len() * CHUNK_RECORD_BYTES,
        );
        for (before, after) in &self.digests {
            out.extend_from_slice(&before.to_le_bytes());
            out.extend_from_slice(&after.to_le_bytes());
        }
        for c in &self.chunks {
            c.encode_into(&mut out);
        }
        out
    }

    /// Parses a manifest and checks every chunk against the header and the receiver's slots:
    /// slot ids, ranges inside their slot, counts, section offsets inside the announced
    /// sections, chunks of a slot in order and not overlapping.
    pub fn decode(b: &[u8], header: &Header, table: &TableLimits) -> Result<Manifest> {
        if b.len() as u64 != header.manifest_bytes {
            return Err(bad(format!(
                "manifest of {} bytes, the header says {}",
                b.len(),
                header.manifest_bytes
            )));
        }
        let u64_at = |o: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[o..o + 8]);
            u64::from_le_bytes(w)
        };
        let u32_at = |o: usize| u32::from_le_bytes([b[o], b[o + 1], b[o + 2], b[o + 3]]);
        let n = header.stage_slots as usize;
        let first = header.first_slot as usize;
        let digests: Vec<(u64, u64)> = (0..n)
            .map(|s| (u64_at(s * 16), u64_at(s * 16 + 8)))
            .collect();
        let base = n * SLOT_RECORD_BYTES;
        let mut chunks = Vec::with_capacity(header.num_chunks as usize);
        let mut last_end: Vec<u64> = vec![0; n];
        for k in 0..header.num_chunks as usize {
            let o = base + k * CHUNK_RECORD_BYTES;
            let fail = |why: &str| bad(format!("chunk {k}: {why}"));
            let u16_at = |o: usize| u16::from_le_bytes([b[o], b[o + 1]]);
            let positions = match u16_at(o + 4) {
                1 => ChunkPositions::Abs32,
                2 => ChunkPositions::Gaps,
                3 => ChunkPositions::Bitmap,
                c => {
                    return Err(fail(&format!(
                        "position codec {c} is not decoded on the GPU"
                    )))
                }
            };
            let values = match u16_at(o + 6) {
                0 => ChunkValues::Raw,
                1 => ChunkValues::Ulp,
                c => return Err(fail(&format!("value codec {c} is not decoded on the GPU"))),
            };
            let c = ChunkRecord {
                slot: u32_at(o),
                positions,
                values,
                start: u64_at(o + 8),
                range: u64_at(o + 16),
                count: u64_at(o + 24),
                position_offset: u64_at(o + 32),
                position_len: u64_at(o + 40),
                value_offset: u64_at(o + 48),
                value_len: u64_at(o + 56),
            };
            let Some(&(numel, width)) = (c.slot as usize)
                .checked_sub(first)
                .filter(|&i| i < n)
                .and_then(|_| table.slots.get(c.slot as usize))
            else {
                return Err(fail("slot id outside the stage's slots"));
            };
            if c.range == 0 || c.range > u32::MAX as u64 || c.count == 0 || c.count > c.range {
                return Err(fail("needs 1 <= count <= range <= 2^32 - 1"));
            }
            if c.values == ChunkValues::Ulp && c.positions == ChunkPositions::Bitmap {
                return Err(fail("ulp values need listed positions (abs32 or gaps)"));
            }
            let end = c.start.checked_add(c.range).filter(|&e| e <= numel);
            let Some(end) = end else {
                return Err(fail("lies beyond its slot"));
            };
            let last = &mut last_end[c.slot as usize - first];
            if c.start < *last {
                return Err(fail("overlaps or precedes an earlier chunk of its slot"));
            }
            *last = end;
            let in_section =
                |off: u64, len: u64, total: u64| off.checked_add(len).is_some_and(|e| e <= total);
            let w = width as u64;
            let (pmin, pmax) = section_bounds(c.positions, c.count, c.range);
            if c.position_len < pmin || c.position_len > pmax {
                return Err(fail("position section length impossible for its codec"));
            }
            if !c.position_offset.is_multiple_of(4)
                || !in_section(c.position_offset, c.position_len, header.position_bytes)
            {
                return Err(fail("position section outside the packed positions"));
            }
            let (vmin, vmax) = value_bounds(c.values, c.count, w);
            if c.value_len < vmin || c.value_len > vmax {
                return Err(fail("value section length impossible for its codec"));
            }
            let align = if c.values == ChunkValues::Ulp { 4 } else { w };
            if !c.value_offset.is_multiple_of(align)
                || !in_section(c.value_offset, c.value_len, header.value_bytes)
            {
                return Err(fail("value section outside the packed values"));
            }
            chunks.push(c);
        }
        Ok(Manifest { digests, chunks })
    }
}

/// Moves chunk records (as [`Manifest::encode`] writes them after the digests) from one
/// trainer rank's own sections to where its sections land in the gathered ones: adds
/// `position_base` to every position offset and `value_base` to every value offset. A sharded
/// sender's leader does this to each rank's records before it sends them on.
pub fn rebase_chunk_records(records: &mut [u8], position_base: u64, value_base: u64) -> Result<()> {
    if !records.len().is_multiple_of(CHUNK_RECORD_BYTES) {
        return Err(bad(format!(
            "{} bytes of chunk records are not whole records",
            records.len()
        )));
    }
    for (k, rec) in records.chunks_exact_mut(CHUNK_RECORD_BYTES).enumerate() {
        for (at, base) in [(32, position_base), (48, value_base)] {
            let mut w = [0u8; 8];
            w.copy_from_slice(&rec[at..at + 8]);
            let moved = u64::from_le_bytes(w)
                .checked_add(base)
                .ok_or_else(|| bad(format!("chunk record {k}: offset overflows when rebased")))?;
            rec[at..at + 8].copy_from_slice(&moved.to_le_bytes());
        }
    }
    Ok(())
}

/// Checks the shards of one slot of `numel` elements as the trainer ranks hold them, in rank
/// order (`runs[r]` = (first element, elements) of rank r's shard): the non-empty ones must
/// follow each other with no gap or overlap, from element 0, and cover the slot exactly.
/// (Where an empty shard says it starts does not matter.)
pub fn check_shard_runs(name: &str, numel: u64, runs: &[(u64, u64)]) -> Result<()> {
    let bad = |why: String| Err(CudaError::InvalidArgument(why));
    let mut next = 0u64;
    for &(first, count) in runs {
        if count > 0 && first != next {
            return bad(format!(
                "the shards of `{name}` do not follow each other in rank order: {runs:?}"
            ));
        }
        next = next.saturating_add(count);
    }
    if next != numel {
        return bad(format!(
            "the shards of `{name}` hold {next} of its {numel} elements: {runs:?}"
        ));
    }
    Ok(())
}

/// The sections chosen for one chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkChoice {
    pub positions: ChunkPositions,
    pub values: ChunkValues,
    pub position_len: u64,
    pub value_len: u64,
}

/// The smallest sections for a chunk of `count` changes over `range` elements of `width`
/// bytes: positions abs32, bitmap or (when sized, `entropy = Some((gaps, ulp))`) gaps; values
/// raw or ulp, ulp only with listed positions. Ties keep the simpler codec. Never larger than
/// abs32 + raw or bitmap + raw.
pub fn choose_sections(
    count: u64,
    range: u64,
    width: u64,
    entropy: Option<(u64, u64)>,
) -> ChunkChoice {
    let abs32 = count * 4;
    let bitmap = range.div_ceil(8);
    let raw = count * width;
    let (list, list_len) = match entropy {
        Some((gaps, _)) if gaps < abs32 => (ChunkPositions::Gaps, gaps),
        _ => (ChunkPositions::Abs32, abs32),
    };
    let (values, value_len) = match entropy {
        Some((_, ulp)) if ulp < raw => (ChunkValues::Ulp, ulp),
        _ => (ChunkValues::Raw, raw),
    };
    if bitmap + raw <= list_len + value_len {
        ChunkChoice {
            positions: ChunkPositions::Bitmap,
            values: ChunkValues::Raw,
            position_len: bitmap,
            value_len: raw,
        }
    } else {
        ChunkChoice {
            positions: list,
            values,
            position_len: list_len,
            value_len,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> TableLimits {
        TableLimits {
            hash: 0xabc,
            num_slots: 2,
            total_elements: 10_000 + 77,
            total_bytes: 20_000 + 308,
            slots: vec![(10_000, 2), (77, 4)],
        }
    }

    fn delta() -> (Header, Manifest) {
        let chunks = vec![
            ChunkRecord {
                slot: 0,
                positions: ChunkPositions::Abs32,
                values: ChunkValues::Raw,
                start: 10,
                range: 500,
                count: 3,
                position_offset: 0,
                position_len: 12,
                value_offset: 0,
                value_len: 6,
            },
            ChunkRecord {
                slot: 0,
                positions: ChunkPositions::Bitmap,
                values: ChunkValues::Raw,
                start: 600,
                range: 400,
                count: 300,
                position_offset: 12,
                position_len: 50,
                value_offset: 6,
                value_len: 600,
            },
            ChunkRecord {
                slot: 0,
                positions: ChunkPositions::Gaps,
                values: ChunkValues::Ulp,
                start: 1000,
                range: 3000,
                count: 2000,
                position_offset: 64,
                position_len: 400,
                value_offset: 608,
                value_len: 700,
            },
            ChunkRecord {
                slot: 1,
                positions: ChunkPositions::Abs32,
                values: ChunkValues::Ulp,
                start: 0,
                range: 77,
                count: 1,
                position_offset: 464,
                position_len: 4,
                value_offset: 1308,
                value_len: 5,
            },
        ];
        let m = Manifest {
            digests: vec![(1, 2), (3, 4)],
            chunks,
        };
        let h = Header::whole(
            SyncKind::Delta,
            7,
            0xabc,
            2,
            4,
            (2 * SLOT_RECORD_BYTES + 4 * CHUNK_RECORD_BYTES) as u64,
            468,
            1313,
        );
        (h, m)
    }

    /// The same delta in two stages: slot 0 (three chunks), then slot 1 (one chunk).
    fn staged() -> [(Header, Manifest); 2] {
        let (h, m) = delta();
        let first = Manifest {
            digests: vec![m.digests[0]],
            chunks: m.chunks[..3].to_vec(),
        };
        let mut last_chunk = m.chunks[3];
        last_chunk.position_offset = 0;
        last_chunk.value_offset = 0;
        let second = Manifest {
            digests: vec![m.digests[1]],
            chunks: vec![last_chunk],
        };
        let h0 = Header {
            num_chunks: 3,
            manifest_bytes: (SLOT_RECORD_BYTES + 3 * CHUNK_RECORD_BYTES) as u64,
            position_bytes: 464,
            value_bytes: 1308,
            stage: 0,
            stages: 2,
            first_slot: 0,
            stage_slots: 1,
            ..h
        };
        let h1 = Header {
            num_chunks: 1,
            manifest_bytes: (SLOT_RECORD_BYTES + CHUNK_RECORD_BYTES) as u64,
            position_bytes: 4,
            value_bytes: 5,
            stage: 1,
            first_slot: 1,
            ..h0
        };
        [(h0, first), (h1, second)]
    }

    #[test]
    #[allow(clippy::single_range_in_vec_init)]
    fn stages_are_planned_whole_and_in_order() {
        assert_eq!(plan_stages(&[], 10), vec![0..0]);
        assert_eq!(plan_stages(&[5, 5, 5], 0), vec![0..3]);
        assert_eq!(plan_stages(&[100], 10), vec![0..1]);
        // The last stage: the fewest trailing slots with half a stage; before it, equal
        // shares (25 bytes in 3 shares of 9; 17 in 2 of 9; 30 in 3 of 10), a remainder of
        // half a share or more a stage of its own.
        assert_eq!(
            plan_stages(&[5, 5, 5, 5, 5, 5], 10),
            vec![0..2, 2..4, 4..5, 5..6]
        );
        assert_eq!(
            plan_stages(&[4, 4, 4, 4, 1, 1, 4], 10),
            vec![0..3, 3..5, 5..7]
        );
        assert_eq!(plan_stages(&[3; 12], 10), vec![0..4, 4..8, 8..10, 10..12]);
        // A remainder under half a share joins the stage before it.
        assert_eq!(plan_stages(&[6, 6, 1, 6], 10), vec![0..3, 3..4]);
        assert_eq!(plan_stages(&[1, 100, 1, 7], 10), vec![0..3, 3..4]);
        assert_eq!(plan_stages(&[100, 1, 1], 10), vec![0..3]);
        let mut state = 3u64;
        for _ in 0..2000 {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let n = (state >> 40) as usize % 40;
            let bytes: Vec<u64> = (0..n as u64).map(|i| (state >> (i % 30)) % 1000).collect();
            let target = (state >> 20) % 3000;
            let stages = plan_stages(&bytes, target);
            // Consecutive, covering every slot, none empty unless there are no slots.
            assert_eq!(stages[0].start, 0);
            assert_eq!(stages.last().map(|r| r.end), Some(n));
            for w in stages.windows(2) {
                assert_eq!(w[0].end, w[1].start);
            }
            assert!(stages.iter().all(|r| !r.is_empty()) || n == 0);
            assert!(stages.len() <= n.max(1));
            if target == 0 {
                assert_eq!(stages.len(), 1);
                continue;
            }
            let sum = |r: &std::ops::Range<usize>| bytes[r.clone()].iter().sum::<u64>();
            // The last stage holds half a stage (unless it is everything), and without its
            // first slot it would not.
            let (last, rest) = stages.split_last().expect("a stage");
            assert!(sum(last) >= target.div_ceil(2) || last.start == 0);
            if last.len() > 1 {
                let without_first = sum(&(last.start + 1..n));
                assert!(
                    without_first < target.div_ceil(2),
                    "{bytes:?} {target} {stages:?}"
                );
            }
            // No more stages before it than shares, plus one for a remainder; none of them
            // fuller than a stage and a half plus one slot.
            let before: u64 = rest.iter().map(sum).sum();
            assert!(
                rest.len() as u64 <= before.div_ceil(target) + 1,
                "{bytes:?} {target}"
            );
            let biggest = bytes.iter().copied().max().unwrap_or(0);
            assert!(rest.iter().all(|r| sum(r) <= target + target / 2 + biggest));
        }
    }

    #[test]
    fn stages_must_come_in_sequence() {
        let [(h0, _), (h1, _)] = staged();
        assert!(h0.follows(None).is_ok());
        assert!(h1.follows(Some(&h0)).is_ok());
        assert!(h1.follows(None).is_err(), "a sync starting at stage 1");
        assert!(h0.follows(Some(&h0)).is_err(), "stage 0 twice");
        let other_version = Header { version: 8, ..h1 };
        assert!(other_version.follows(Some(&h0)).is_err());
        let other_count = Header { stages: 3, ..h1 };
        assert!(other_count.follows(Some(&h0)).is_err());
        let gap = Header {
            first_slot: 2,
            stage_slots: 0,
            ..h1
        };
        assert!(gap.follows(Some(&h0)).is_err());
        // A last stage that stops short of the last slot.
        let short = Header {
            stages: 1,
            stage_slots: 1,
            ..h0
        };
        assert!(short.follows(None).is_err());
        let (whole, _) = delta();
        assert!(whole.follows(None).is_ok());
    }

    #[test]
    fn stages_round_trip_and_keep_to_their_slots() {
        let t = limits();
        for (h, m) in staged() {
            assert_eq!(Header::decode(&h.encode(), &t).expect("valid"), h);
            assert_eq!(
                Manifest::decode(&m.encode(), &h, &t).expect("valid"),
                m,
                "stage {}",
                h.stage
            );
        }
        let [(h0, m0), (h1, m1)] = staged();
        // A chunk of a slot outside the stage is refused, either way round.
        let mut wrong = m1.clone();
        wrong.chunks[0].slot = 0;
        assert!(Manifest::decode(&wrong.encode(), &h1, &t).is_err());
        let mut wrong = m0.clone();
        wrong.chunks[0].slot = 1;
        assert!(Manifest::decode(&wrong.encode(), &h0, &t).is_err());
        // A manifest sized for the other stage's slot count is refused.
        assert!(Manifest::decode(&m0.encode(), &h1, &t).is_err());
        // Stage fields that cannot be.
        type Mutation = Box<dyn Fn(&mut Header)>;
        let cases: Vec<(&str, Mutation)> = vec![
            ("no stages", Box::new(|h| h.stages = 0)),
            ("stage past the count", Box::new(|h| h.stage = 2)),
            ("more stages than slots", Box::new(|h| h.stages = 3)),
            ("slots past the table", Box::new(|h| h.stage_slots = 2)),
            ("empty stage", Box::new(|h| h.stage_slots = 0)),
            (
                "first slot past the table",
                Box::new(|h| h.first_slot = u32::MAX),
            ),
            ("staged seed", Box::new(|h| h.kind = SyncKind::Seed)),
        ];
        for (what, mutate) in cases {
            let mut bad = h1;
            mutate(&mut bad);
            assert!(
                Header::decode(&bad.encode(), &t).is_err(),
                "{what} accepted"
            );
        }
        // A dense stage carries exactly its slots' bytes (slot 1: 77 × 4).
        let dense = Header {
            kind: SyncKind::Dense,
            num_chunks: 0,
            manifest_bytes: SLOT_RECORD_BYTES as u64,
            position_bytes: 0,
            value_bytes: 308,
            ..h1
        };
        assert_eq!(Header::decode(&dense.encode(), &t).expect("dense"), dense);
        let whole = Header {
            value_bytes: t.total_bytes,
            ..dense
        };
        assert!(Header::decode(&whole.encode(), &t).is_err());
    }

    #[test]
    fn header_and_manifest_round_trip() {
        let (h, m) = delta();
        let hb = h.encode();
        assert_eq!(Header::decode(&hb, &limits()).expect("valid"), h);
        let mb = m.encode();
        assert_eq!(mb.len() as u64, h.manifest_bytes);
        assert_eq!(Manifest::decode(&mb, &h, &limits()).expect("valid"), m);
    }

    #[test]
    fn headers_that_lie_are_refused_before_allocation() {
        let (h, _) = delta();
        let t = limits();
        let mut wrong_table = h;
        wrong_table.table_hash ^= 1;
        assert!(matches!(
            Header::decode(&wrong_table.encode(), &t),
            Err(CudaError::WrongTable { .. })
        ));
        let mut huge = h;
        huge.value_bytes = u64::MAX;
        assert!(Header::decode(&huge.encode(), &t).is_err());
        let mut huge = h;
        huge.position_bytes = t.total_elements * 8;
        assert!(Header::decode(&huge.encode(), &t).is_err());
        let mut many = h;
        many.num_chunks = u64::MAX / 2;
        assert!(Header::decode(&many.encode(), &t).is_err());
        let mut seed = h;
        seed.kind = SyncKind::Seed;
        assert!(
            Header::decode(&seed.encode(), &t).is_err(),
            "seed with chunks"
        );
        seed.num_chunks = 0;
        seed.position_bytes = 0;
        seed.value_bytes = t.total_bytes;
        seed.manifest_bytes = 2 * SLOT_RECORD_BYTES as u64;
        assert_eq!(
            Header::decode(&seed.encode(), &t).expect("seed").kind,
            SyncKind::Seed
        );
        let mut b = h.encode();
        b[4] = 9;
        assert!(Header::decode(&b, &t).is_err(), "version");
        b = h.encode();
        b[0] = b'X';
        assert!(Header::decode(&b, &t).is_err(), "magic");
        assert!(Header::decode(&b[..10], &t).is_err(), "short");
        b = h.encode();
        b[8] = 99;
        assert!(Header::decode(&b, &t).is_err(), "kind");
    }

    #[test]
    fn every_single_byte_change_of_a_manifest_is_caught_or_harmless() {
        // Mutating any byte either fails the decode or yields a manifest whose chunks still
        // satisfy every bound (the GPU check and the digest catch the rest): the whole delta's
        // manifest, and each stage's (whose chunks must also stay in the stage's slots).
        let t = limits();
        let [first, second] = staged();
        let mut state = 0x1234_5678u64;
        for (h, m) in [delta(), first, second] {
            let good = m.encode();
            for i in 0..good.len() {
                for _ in 0..8 {
                    state = state
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    let mut b = good.clone();
                    b[i] ^= ((state >> 33) as u8) | 1;
                    let Ok(d) = Manifest::decode(&b, &h, &t) else {
                        continue;
                    };
                    assert_eq!(d.digests.len(), h.stage_slots as usize);
                    for c in &d.chunks {
                        assert!(h.slots().contains(&(c.slot as usize)), "{c:?} {h:?}");
                        let (numel, w) = t.slots[c.slot as usize];
                        assert!(c.start + c.range <= numel);
                        assert!(c.count >= 1 && c.count <= c.range);
                        let (pmin, pmax) = section_bounds(c.positions, c.count, c.range);
                        assert!(c.position_len >= pmin && c.position_len <= pmax);
                        assert!(c.position_offset + c.position_len <= h.position_bytes);
                        let (vmin, vmax) = value_bounds(c.values, c.count, w as u64);
                        assert!(c.value_len >= vmin && c.value_len <= vmax);
                        assert!(c.value_offset + c.value_len <= h.value_bytes);
                        assert!(
                            !(c.values == ChunkValues::Ulp
                                && c.positions == ChunkPositions::Bitmap)
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn manifests_out_of_bounds_are_refused() {
        let (h, m) = delta();
        let t = limits();
        type Mutation = Box<dyn Fn(&mut Manifest)>;
        let cases: Vec<(&str, Mutation)> = vec![
            ("slot", Box::new(|m| m.chunks[3].slot = 2)),
            ("beyond slot", Box::new(|m| m.chunks[3].range = 78)),
            ("count > range", Box::new(|m| m.chunks[0].count = 501)),
            ("zero count", Box::new(|m| m.chunks[0].count = 0)),
            ("overlap", Box::new(|m| m.chunks[1].start = 500)),
            (
                "pos section",
                Box::new(|m| m.chunks[3].position_offset = 468),
            ),
            ("pos align", Box::new(|m| m.chunks[3].position_offset = 2)),
            ("val section", Box::new(|m| m.chunks[3].value_offset = 1312)),
            ("val align", Box::new(|m| m.chunks[3].value_offset = 1306)),
            ("raw align", Box::new(|m| m.chunks[1].value_offset = 7)),
            ("abs32 length", Box::new(|m| m.chunks[0].position_len = 13)),
            ("bitmap length", Box::new(|m| m.chunks[1].position_len = 49)),
            ("raw length", Box::new(|m| m.chunks[1].value_len = 601)),
            ("gaps too short", Box::new(|m| m.chunks[2].position_len = 7)),
            ("ulp too short", Box::new(|m| m.chunks[2].value_len = 3)),
            (
                "ulp on a bitmap",
                Box::new(|m| m.chunks[1].values = ChunkValues::Ulp),
            ),
        ];
        for (what, mutate) in cases {
            let mut bad = m.clone();
            mutate(&mut bad);
            assert!(
                Manifest::decode(&bad.encode(), &h, &t).is_err(),
                "{what} accepted"
            );
        }
        let good = m.encode();
        assert!(Manifest::decode(&good[..good.len() - 1], &h, &t).is_err());
    }

    #[test]
    fn the_chooser_takes_the_smallest_allowed_pair() {
        let mut state = 7u64;
        let mut next = |n: u64| {
            state = state
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            (state >> 33) % n.max(1)
        };
        for _ in 0..20_000 {
            let range = 1 + next(1 << 20);
            let count = 1 + next(range);
            let width = [1, 2, 4][next(3) as usize];
            let entropy = (next(4) != 0).then(|| (1 + next(count * 7), 1 + next(count * 5)));
            let c = choose_sections(count, range, width, entropy);
            let total = c.position_len + c.value_len;
            let (abs32, bitmap, raw) = (count * 4, range.div_ceil(8), count * width);
            assert!(total <= abs32 + raw && total <= bitmap + raw);
            assert!(!(c.positions == ChunkPositions::Bitmap && c.values == ChunkValues::Ulp));
            // Every allowed pair is at least as large.
            let mut pairs = vec![(abs32, raw), (bitmap, raw)];
            if let Some((g, u)) = entropy {
                pairs.extend([(g, raw), (abs32, u), (g, u)]);
            }
            assert!(
                pairs.iter().all(|(p, v)| p + v >= total),
                "{c:?} {entropy:?}"
            );
            let (pmin, pmax) = section_bounds(c.positions, count, range);
            if entropy.is_none() || c.positions != ChunkPositions::Gaps {
                assert!(c.position_len >= pmin && c.position_len <= pmax);
            }
        }
        // Ties keep abs32 + raw over gaps + ulp, and bitmap over a list.
        let c = choose_sections(10, 1000, 2, Some((40, 20)));
        assert_eq!(
            (c.positions, c.values),
            (ChunkPositions::Abs32, ChunkValues::Raw)
        );
        let c = choose_sections(100, 800, 2, None);
        assert_eq!(c.positions, ChunkPositions::Bitmap);
    }

    /// Two ranks' chunk records, each with offsets into its own sections, rebased by the
    /// first rank's (8-padded) section lengths and put after each other: the manifest decodes
    /// to the records with the second rank's offsets moved, and passes every check.
    #[test]
    fn rebased_records_of_two_ranks_decode_as_one_manifest() {
        let (h, m) = delta();
        // Rank 0 holds elements 0..1000 of slot 0, rank 1 the rest of slot 0 and slot 1.
        let rank0 = m.chunks[..2].to_vec();
        let rank1: Vec<ChunkRecord> = m.chunks[2..]
            .iter()
            .map(|c| ChunkRecord {
                position_offset: c.position_offset - 64,
                value_offset: c.value_offset - 608,
                ..*c
            })
            .collect();
        let records = |chunks: &[ChunkRecord]| {
            Manifest {
                digests: Vec::new(),
                chunks: chunks.to_vec(),
            }
            .encode()
        };
        let (pos0, val0) = (64u64, 608u64); // rank 0's sections, padded to 8
        let mut bytes = Vec::new();
        for (d0, d1) in &m.digests {
            bytes.extend_from_slice(&d0.to_le_bytes());
            bytes.extend_from_slice(&d1.to_le_bytes());
        }
        let mut r0 = records(&rank0);
        rebase_chunk_records(&mut r0, 0, 0).expect("rebase");
        let mut r1 = records(&rank1);
        rebase_chunk_records(&mut r1, pos0, val0).expect("rebase");
        bytes.extend_from_slice(&r0);
        bytes.extend_from_slice(&r1);
        assert_eq!(Manifest::decode(&bytes, &h, &limits()).expect("decode"), m);
        // Not whole records, or an offset pushed past 2^64: refused, nothing panics.
        assert!(rebase_chunk_records(&mut r1[..63], 0, 0).is_err());
        assert!(rebase_chunk_records(&mut r1, u64::MAX, 0).is_err());
        assert!(rebase_chunk_records(&mut [], 5, 5).is_ok());
    }

    /// The chunk bound allows one more chunk per slot for every shard border (up to
    /// MAX_TRAINER_RANKS ranks), never more chunks than a slot has elements.
    #[test]
    fn chunk_bound_allows_shard_borders_not_more_chunks_than_elements() {
        let t = limits(); // slots of 10_000 and 77 elements
        let grid = 10_000u64.div_ceil(MIN_CHUNK_ELEMS) + 77u64.div_ceil(MIN_CHUNK_ELEMS);
        assert_eq!(t.max_chunks(0..2), (3 + MAX_TRAINER_RANKS - 1) + 77);
        assert!(
            t.max_chunks(0..2) > grid + 1,
            "a split grid cell must be allowed"
        );
        let (h, _) = delta();
        for (chunks, ok) in [(t.max_chunks(0..2), true), (t.max_chunks(0..2) + 1, false)] {
            let head = Header {
                num_chunks: chunks,
                manifest_bytes: 2 * SLOT_RECORD_BYTES as u64 + chunks * CHUNK_RECORD_BYTES as u64,
                ..h
            };
            assert_eq!(
                Header::decode(&head.encode(), &t).is_ok(),
                ok,
                "{chunks} chunks"
            );
        }
    }

    /// The shard layout check against an oracle that marks every element each shard claims:
    /// valid exactly when every element is claimed once and the shards run in rank order.
    #[test]
    fn shard_runs_are_valid_exactly_when_they_tile_the_slot_in_rank_order() {
        let mut state = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = |below: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % below
        };
        let (mut valid, mut invalid) = (0, 0);
        for _ in 0..20_000 {
            let numel = next(40);
            let world = 1 + next(5) as usize;
            // Mostly a correct cut (as torch.chunk makes), then a random disturbance.
            let per = numel.div_ceil(world as u64).max(1);
            let mut runs: Vec<(u64, u64)> = (0..world as u64)
                .map(|r| {
                    let first = (r * per).min(numel);
                    (first, per.min(numel - first))
                })
                .collect();
            match next(4) {
                0 => {}
                1 => {
                    let r = next(world as u64) as usize;
                    runs[r].0 = next(numel + 2);
                }
                2 => {
                    let r = next(world as u64) as usize;
                    runs[r].1 = next(numel + 2);
                }
                _ => runs.reverse(),
            }
            // The oracle: claims per element, and the claimed starts in rank order.
            let mut claims = vec![0u32; numel as usize];
            let mut beyond = false;
            for &(first, count) in &runs {
                for e in first..first + count {
                    match claims.get_mut(e as usize) {
                        Some(c) => *c += 1,
                        None => beyond = true,
                    }
                }
            }
            let starts: Vec<u64> = runs.iter().filter(|r| r.1 > 0).map(|r| r.0).collect();
            let ordered = starts.windows(2).all(|w| w[0] < w[1]);
            let tiles = !beyond && claims.iter().all(|&c| c == 1) && ordered;
            let got = check_shard_runs("w", numel, &runs);
            assert_eq!(
                got.is_ok(),
                tiles,
                "{numel} elements, runs {runs:?}: {got:?}"
            );
            if tiles {
                valid += 1;
            } else {
                invalid += 1;
            }
        }
        assert!(
            valid > 1000 && invalid > 1000,
            "{valid} valid, {invalid} invalid"
        );
    }
}
