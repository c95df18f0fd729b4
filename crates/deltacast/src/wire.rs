//! Wire format v2: one flush is one self-contained frame; the CPU and GPU paths speak it alike.
//!
//! ```text
//! header (64 B) | manifest: entry_count × 64 B | digests: digest_count × 24 B | sections | xxh3-64 (8 B)
//! ```
//! All integers are little-endian. docs/wire-format.md specifies each byte. The three records
//! have one encoder and one checked decoder each ([`FrameHeader`], [`ChunkEntry`],
//! [`SlotDigest`]), and [`parse_manifest`] checks a manifest against its header: the GPU
//! receiver, which gets a frame in parts over a device link, uses them as [`parse_frame`] does.
//! Parsing checks the checksum before anything else it trusts and every offset and length
//! against the frame before use.

use crate::codec::{check_pair, PosCodec, ValCodec};
use crate::error::{Error, Result};
use crate::slot::SlotTable;

pub const MAGIC: [u8; 4] = *b"DCST";
pub const WIRE_VERSION: u16 = 2;
pub const HEADER_LEN: usize = 64;
pub const ENTRY_LEN: usize = 64;
pub const DIGEST_LEN: usize = 24;
pub const CHECKSUM_LEN: usize = 8;
/// The smallest possible frame: a header and a checksum.
pub const MIN_FRAME_LEN: usize = HEADER_LEN + CHECKSUM_LEN;
/// Largest chunk range (elements): positions inside a chunk are u32.
pub const MAX_CHUNK_RANGE: u64 = u32::MAX as u64;
/// Header flag: the last frame of its sync.
pub const FLAG_FINAL: u8 = 1;

/// What a frame carries. The discriminant is the wire code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FrameKind {
    /// Every element of every slot, values only.
    Seed = 0,
    /// Changed elements since the previous version.
    Delta = 1,
    /// No elements: digests only, for a receiver to check its state against the sender's.
    Verify = 2,
    /// Every element of the slots it names, from the previous version (a delta sync may mix
    /// delta and dense frames: dense where a delta would not be smaller).
    Dense = 3,
    /// Nothing: the sender is closing, no sync follows.
    Close = 4,
}

impl FrameKind {
    pub const ALL: [FrameKind; 5] = [
        FrameKind::Seed,
        FrameKind::Delta,
        FrameKind::Verify,
        FrameKind::Dense,
        FrameKind::Close,
    ];

    pub fn from_code(code: u8) -> Result<Self> {
        FrameKind::ALL
            .into_iter()
            .find(|k| *k as u8 == code)
            .ok_or_else(|| Error::Malformed(format!("unknown frame kind {code}")))
    }

    pub fn name(self) -> &'static str {
        match self {
            FrameKind::Seed => "seed",
            FrameKind::Delta => "delta",
            FrameKind::Verify => "verify",
            FrameKind::Dense => "dense",
            FrameKind::Close => "close",
        }
    }

    /// The kind of sync a frame of this kind belongs to: delta and dense frames make one
    /// family (a delta sync), every other kind is its own.
    pub fn family(self) -> FrameKind {
        match self {
            FrameKind::Dense => FrameKind::Delta,
            other => other,
        }
    }
}

/// The fixed 64-byte header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FrameHeader {
    pub kind: FrameKind,
    pub is_final: bool,
    /// The version this sync brings the receiver to.
    pub version: u64,
    pub table_hash: u64,
    pub flush_index: u32,
    pub entry_count: u32,
    /// Bytes of the frame, its checksum included (also on a device link, which does not send
    /// the checksum).
    pub frame_len: u64,
    pub digest_count: u32,
    /// Frames of this sync, 0 when the writer does not know in advance (a streaming writer).
    pub flush_count: u32,
    /// 0, or where the value sections begin: position sections then lie in
    /// `[sections_start, values_start)`, value sections in `[values_start, frame_len − 8)`.
    pub values_start: u64,
}

/// One manifest entry: a chunk of one slot and where its two sections sit in the frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkEntry {
    pub slot: u32,
    pub pos_codec: PosCodec,
    pub val_codec: ValCodec,
    /// First element of the chunk range in the slot (flat, row-major).
    pub start: u64,
    /// Elements in the chunk range (≤ [`MAX_CHUNK_RANGE`]).
    pub range: u64,
    /// Changed elements in the range.
    pub count: u64,
    pub pos_offset: u64,
    pub pos_len: u64,
    pub val_offset: u64,
    pub val_len: u64,
}

/// A slot's digest before (`base`) and after (`new`) the sync, as the sender computed them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotDigest {
    pub slot: u32,
    pub base: u64,
    pub new: u64,
}

/// A parsed, checksum-verified frame borrowing its bytes.
#[derive(Debug, Clone)]
pub struct Frame<'a> {
    pub header: FrameHeader,
    pub entries: Vec<ChunkEntry>,
    pub digests: Vec<SlotDigest>,
    bytes: &'a [u8],
}

impl<'a> Frame<'a> {
    pub fn positions(&self, entry: &ChunkEntry) -> &'a [u8] {
        // Bounds were checked in `parse_manifest`.
        &self.bytes[entry.pos_offset as usize..(entry.pos_offset + entry.pos_len) as usize]
    }

    pub fn values(&self, entry: &ChunkEntry) -> &'a [u8] {
        &self.bytes[entry.val_offset as usize..(entry.val_offset + entry.val_len) as usize]
    }

    pub fn bytes(&self) -> &'a [u8] {
        self.bytes
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

pub(crate) fn u32_at(b: &[u8], at: usize) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[at..at + 4]);
    u32::from_le_bytes(a)
}

pub(crate) fn u64_at(b: &[u8], at: usize) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[at..at + 8]);
    u64::from_le_bytes(a)
}

fn truncated(what: &'static str, needed: usize, available: usize) -> Error {
    Error::Truncated {
        what,
        needed: needed as u64,
        available: available as u64,
    }
}

/// The checksum of a frame: xxh3-64 over every byte before the checksum field.
pub fn checksum(body: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(body)
}

impl FrameHeader {
    /// Where the sections begin: after the header, the manifest and the digest table (a
    /// multiple of 8; cannot overflow, both counts are u32).
    pub fn sections_start(&self) -> u64 {
        HEADER_LEN as u64 + self.manifest_len()
    }

    /// Bytes of the manifest and digest table, the second part of a frame on a device link.
    pub fn manifest_len(&self) -> u64 {
        self.entry_count as u64 * ENTRY_LEN as u64 + self.digest_count as u64 * DIGEST_LEN as u64
    }

    /// Where the checksum begins (the end of the sections).
    pub fn body_end(&self) -> u64 {
        self.frame_len - CHECKSUM_LEN as u64
    }

    /// Where position sections may lie: `[sections_start, end)`.
    pub fn positions_end(&self) -> u64 {
        if self.values_start == 0 {
            self.body_end()
        } else {
            self.values_start
        }
    }

    /// Where value sections may lie: `[start, body_end)`.
    pub fn values_begin(&self) -> u64 {
        if self.values_start == 0 {
            self.sections_start()
        } else {
            self.values_start
        }
    }

    pub fn encode(&self) -> [u8; HEADER_LEN] {
        let mut b = [0u8; HEADER_LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4..6].copy_from_slice(&WIRE_VERSION.to_le_bytes());
        b[6] = self.kind as u8;
        b[7] = if self.is_final { FLAG_FINAL } else { 0 };
        b[8..16].copy_from_slice(&self.version.to_le_bytes());
        b[16..24].copy_from_slice(&self.table_hash.to_le_bytes());
        b[24..28].copy_from_slice(&self.flush_index.to_le_bytes());
        b[28..32].copy_from_slice(&self.entry_count.to_le_bytes());
        b[32..40].copy_from_slice(&self.frame_len.to_le_bytes());
        b[40..44].copy_from_slice(&self.digest_count.to_le_bytes());
        b[44..48].copy_from_slice(&self.flush_count.to_le_bytes());
        b[48..56].copy_from_slice(&self.values_start.to_le_bytes());
        b
    }

    /// Decodes the first 64 bytes of `b` and checks everything a header alone can be checked
    /// for: magic, wire version, kind, flags, reserved bytes, frame length against the
    /// manifest it announces, flush count against index and `FINAL`, `values_start` inside the
    /// sections, and what each kind allows (verify: no chunks; close: nothing at all).
    pub fn decode(b: &[u8]) -> Result<FrameHeader> {
        if b.len() < HEADER_LEN {
            return Err(truncated("frame header", HEADER_LEN, b.len()));
        }
        let frame_len = peek_frame_len(b)?;
        let kind = FrameKind::from_code(b[6])?;
        let flags = b[7];
        if flags & !FLAG_FINAL != 0 {
            return Err(Error::Malformed(format!("unknown flag bits {flags:#04x}")));
        }
        if u64_at(b, 56) != 0 {
            return Err(Error::Malformed(
                "reserved header bytes are not zero".into(),
            ));
        }
        let h = FrameHeader {
            kind,
            is_final: flags & FLAG_FINAL != 0,
            version: u64_at(b, 8),
            table_hash: u64_at(b, 16),
            flush_index: u32_at(b, 24),
            entry_count: u32_at(b, 28),
            frame_len,
            digest_count: u32_at(b, 40),
            flush_count: u32_at(b, 44),
            values_start: u64_at(b, 48),
        };
        let (sections_start, body_end) = (h.sections_start(), h.body_end());
        if sections_start > body_end {
            return Err(Error::Truncated {
                what: "manifest and digest table",
                needed: sections_start,
                available: body_end,
            });
        }
        if h.flush_count != 0 {
            if h.flush_index >= h.flush_count {
                return Err(Error::Malformed(format!(
                    "flush {} of a sync of {} flushes",
                    h.flush_index, h.flush_count
                )));
            }
            if h.is_final != (h.flush_index + 1 == h.flush_count) {
                return Err(Error::Malformed(format!(
                    "flush {} of {} {} the FINAL flag",
                    h.flush_index,
                    h.flush_count,
                    if h.is_final { "has" } else { "lacks" }
                )));
            }
        }
        if h.values_start != 0 && !(sections_start..=body_end).contains(&h.values_start) {
            return Err(Error::Malformed(format!(
                "values_start {} lies outside the sections [{sections_start}, {body_end}]",
                h.values_start
            )));
        }
        match kind {
            FrameKind::Verify if h.entry_count != 0 => {
                return Err(Error::Malformed("a verify frame carries no chunks".into()));
            }
            FrameKind::Close
                if h.entry_count != 0
                    || h.digest_count != 0
                    || frame_len != MIN_FRAME_LEN as u64 =>
            {
                return Err(Error::Malformed(
                    "a close frame carries no chunks, digests or sections".into(),
                ));
            }
            FrameKind::Close if h.flush_index != 0 || !h.is_final => {
                return Err(Error::Malformed(
                    "a close frame is flush 0 and FINAL: a sync of its own".into(),
                ));
            }
            _ => {}
        }
        Ok(h)
    }
}

impl ChunkEntry {
    /// Writes the entry's 64 bytes (offsets as they are: absolute in a frame, relative to the
    /// record in a gathered piece).
    pub fn encode_into(&self, out: &mut [u8; ENTRY_LEN]) {
        out[0..4].copy_from_slice(&self.slot.to_le_bytes());
        out[4] = self.pos_codec as u8;
        out[5] = self.val_codec as u8;
        out[6..8].fill(0);
        for (i, v) in [
            self.start,
            self.range,
            self.count,
            self.pos_offset,
            self.pos_len,
            self.val_offset,
            self.val_len,
        ]
        .into_iter()
        .enumerate()
        {
            out[8 + 8 * i..16 + 8 * i].copy_from_slice(&v.to_le_bytes());
        }
    }

    /// Decodes the first 64 bytes of `raw` and checks what an entry alone can be checked for:
    /// known codecs that go together ([`check_pair`]: `steps` only with `esc`), reserved bytes
    /// zero, `1 ≤ count ≤ range ≤ 2^32 − 1`, no overflow of the chunk's end or of either
    /// section's end. Where the sections lie is checked against a frame by [`parse_manifest`].
    pub fn decode(raw: &[u8]) -> Result<ChunkEntry> {
        if raw.len() < ENTRY_LEN {
            return Err(truncated("chunk entry", ENTRY_LEN, raw.len()));
        }
        decode_entry(raw).map_err(|reason| {
            Error::Malformed(format!("entry (slot {}): {reason}", u32_at(raw, 0)))
        })
    }

    /// One past the end of the position section (no overflow: checked by `decode`).
    pub fn pos_end(&self) -> u64 {
        self.pos_offset + self.pos_len
    }

    /// One past the end of the value section.
    pub fn val_end(&self) -> u64 {
        self.val_offset + self.val_len
    }
}

/// [`ChunkEntry::decode`] on 64 bytes, the reason of a refusal as text.
fn decode_entry(raw: &[u8]) -> std::result::Result<ChunkEntry, String> {
    let pos_codec =
        PosCodec::from_code(raw[4]).ok_or_else(|| format!("unknown position codec {}", raw[4]))?;
    let val_codec =
        ValCodec::from_code(raw[5]).ok_or_else(|| format!("unknown value codec {}", raw[5]))?;
    if u16_at(raw, 6) != 0 {
        return Err("reserved bytes are not zero".into());
    }
    // Which codecs go together (the slot's dtype is checked where the table is known).
    check_pair(pos_codec, val_codec, None).map_err(|e| e.to_string())?;
    let entry = ChunkEntry {
        slot: u32_at(raw, 0),
        pos_codec,
        val_codec,
        start: u64_at(raw, 8),
        range: u64_at(raw, 16),
        count: u64_at(raw, 24),
        pos_offset: u64_at(raw, 32),
        pos_len: u64_at(raw, 40),
        val_offset: u64_at(raw, 48),
        val_len: u64_at(raw, 56),
    };
    if entry.range == 0 || entry.range > MAX_CHUNK_RANGE {
        return Err(format!(
            "chunk range {} outside 1..={MAX_CHUNK_RANGE}",
            entry.range
        ));
    }
    if entry.start.checked_add(entry.range).is_none() {
        return Err("chunk end overflows".into());
    }
    if entry.count > entry.range {
        return Err(format!(
            "count {} exceeds range {}",
            entry.count, entry.range
        ));
    }
    if entry.count == 0 {
        return Err("empty chunk".into());
    }
    if entry.pos_offset.checked_add(entry.pos_len).is_none()
        || entry.val_offset.checked_add(entry.val_len).is_none()
    {
        return Err("section end overflows".into());
    }
    Ok(entry)
}

impl SlotDigest {
    pub fn encode_into(&self, out: &mut [u8; DIGEST_LEN]) {
        out[0..4].copy_from_slice(&self.slot.to_le_bytes());
        out[4..8].fill(0);
        out[8..16].copy_from_slice(&self.base.to_le_bytes());
        out[16..24].copy_from_slice(&self.new.to_le_bytes());
    }

    /// Decodes the first 24 bytes of `raw` (reserved bytes must be zero).
    pub fn decode(raw: &[u8]) -> Result<SlotDigest> {
        if raw.len() < DIGEST_LEN {
            return Err(truncated("digest record", DIGEST_LEN, raw.len()));
        }
        if u32_at(raw, 4) != 0 {
            return Err(Error::Malformed(format!(
                "digest record (slot {}): reserved bytes are not zero",
                u32_at(raw, 0)
            )));
        }
        Ok(SlotDigest {
            slot: u32_at(raw, 0),
            base: u64_at(raw, 8),
            new: u64_at(raw, 16),
        })
    }
}

/// Reads only magic, version and length so a stream reader knows how many bytes the frame
/// has. Does not verify the checksum.
pub fn peek_frame_len(header: &[u8]) -> Result<u64> {
    if header.len() < HEADER_LEN {
        return Err(truncated("frame header", HEADER_LEN, header.len()));
    }
    let magic = [header[0], header[1], header[2], header[3]];
    if magic != MAGIC {
        return Err(Error::BadMagic { found: magic });
    }
    let version = u16_at(header, 4);
    if version != WIRE_VERSION {
        return Err(Error::UnsupportedWireVersion {
            found: version,
            supported: WIRE_VERSION,
        });
    }
    let frame_len = u64_at(header, 32);
    if frame_len < MIN_FRAME_LEN as u64 {
        return Err(Error::Malformed(format!(
            "declared frame length {frame_len} is below the minimum {MIN_FRAME_LEN}"
        )));
    }
    Ok(frame_len)
}

/// The header, decoded and checked ([`FrameHeader::decode`]) but without the checksum: for
/// routing and progress only (which sync a frame belongs to); nothing read here may be trusted
/// before [`parse_frame`].
pub fn peek_header(bytes: &[u8]) -> Result<FrameHeader> {
    FrameHeader::decode(bytes)
}

/// Decodes the manifest and digest table of a frame with header `header`: `bytes` is exactly
/// those `entry_count × 64 + digest_count × 24` bytes (frame bytes `[64, sections_start)`, or
/// the second part of a frame on a device link). Checks every entry ([`ChunkEntry::decode`])
/// and that its sections lie inside the frame's sections, positions before `values_start`
/// and values after it when it is set; the codecs each kind allows (seed: raw values; dense:
/// `all` + `raw`); and the digest records: reserved bytes, no slot twice, and in a dense frame
/// one for every slot its chunks name. Chunk ranges against slot sizes, and a dense frame's
/// cover ([`check_dense_cover`]), need the slot table: the receiver checks them.
pub fn parse_manifest(
    header: &FrameHeader,
    bytes: &[u8],
) -> Result<(Vec<ChunkEntry>, Vec<SlotDigest>)> {
    let needed = header.manifest_len();
    if bytes.len() as u64 != needed {
        return Err(Error::Truncated {
            what: "manifest and digest table",
            needed,
            available: bytes.len() as u64,
        });
    }
    let (entry_bytes, digest_bytes) = bytes.split_at(header.entry_count as usize * ENTRY_LEN);
    let (pos_lo, pos_hi) = (header.sections_start(), header.positions_end());
    let (val_lo, val_hi) = (header.values_begin(), header.body_end());
    // Sized by the bytes present (checked above), not by a declared count alone.
    let mut entries = Vec::with_capacity(header.entry_count as usize);
    for (e, raw) in entry_bytes.chunks_exact(ENTRY_LEN).enumerate() {
        let bad = |reason: String| {
            Error::Malformed(format!("entry {e} (slot {}): {reason}", u32_at(raw, 0)))
        };
        let entry = decode_entry(raw).map_err(bad)?;
        match header.kind {
            FrameKind::Seed if entry.val_codec != ValCodec::Raw => {
                return Err(bad("a seed chunk carries raw values".into()));
            }
            FrameKind::Dense
                if entry.pos_codec != PosCodec::All || entry.val_codec != ValCodec::Raw =>
            {
                return Err(bad(
                    "a dense chunk is `all` positions and `raw` values".into()
                ));
            }
            _ => {}
        }
        for (what, offset, end, lo, hi) in [
            (
                "positions",
                entry.pos_offset,
                entry.pos_end(),
                pos_lo,
                pos_hi,
            ),
            ("values", entry.val_offset, entry.val_end(), val_lo, val_hi),
        ] {
            if offset < lo || end > hi {
                return Err(bad(format!(
                    "{what} section [{offset}, {end}) lies outside [{lo}, {hi})"
                )));
            }
        }
        entries.push(entry);
    }
    let mut digests = Vec::with_capacity(header.digest_count as usize);
    for raw in digest_bytes.chunks_exact(DIGEST_LEN) {
        digests.push(SlotDigest::decode(raw)?);
    }
    let mut slots: Vec<u32> = digests.iter().map(|d| d.slot).collect();
    slots.sort_unstable();
    if let Some(w) = slots.windows(2).find(|w| w[0] == w[1]) {
        return Err(Error::Malformed(format!(
            "two digest records for slot {}",
            w[0]
        )));
    }
    if header.kind == FrameKind::Dense {
        if let Some(e) = entries
            .iter()
            .find(|e| slots.binary_search(&e.slot).is_err())
        {
            return Err(Error::Malformed(format!(
                "dense frame: slot {} has no digest record in its frame",
                e.slot
            )));
        }
    }
    Ok((entries, digests))
}

/// Parses and verifies one frame. Checks, in order: minimum length, magic, wire version,
/// declared length = actual length, checksum, then the header ([`FrameHeader::decode`]) and
/// the manifest and digest table against the frame ([`parse_manifest`]).
pub fn parse_frame(bytes: &[u8]) -> Result<Frame<'_>> {
    if bytes.len() < MIN_FRAME_LEN {
        return Err(truncated("frame", MIN_FRAME_LEN, bytes.len()));
    }
    let frame_len = peek_frame_len(bytes)?;
    if frame_len != bytes.len() as u64 {
        return Err(Error::Truncated {
            what: "frame body",
            needed: frame_len,
            available: bytes.len() as u64,
        });
    }
    let body_end = bytes.len() - CHECKSUM_LEN;
    let expected = u64_at(bytes, body_end);
    let computed = checksum(&bytes[..body_end]);
    if expected != computed {
        return Err(Error::ChecksumMismatch { expected, computed });
    }
    let header = FrameHeader::decode(bytes)?;
    // sections_start ≤ body_end: checked by the header's decode.
    let manifest = &bytes[HEADER_LEN..header.sections_start() as usize];
    let (entries, digests) = parse_manifest(&header, manifest)?;
    Ok(Frame {
        header,
        entries,
        digests,
        bytes,
    })
}

/// Checks that the chunks of a dense frame cover each slot they name exactly once (each
/// element of the slot in one chunk, no element twice, none beyond the slot) and returns
/// those slots, ascending. Needs the slot table; [`parse_manifest`] checked the rest.
pub fn check_dense_cover(table: &SlotTable, entries: &[ChunkEntry]) -> Result<Vec<u32>> {
    let mut spans: Vec<(u32, u64, u64)> =
        entries.iter().map(|e| (e.slot, e.start, e.range)).collect();
    spans.sort_unstable();
    let mut slots = Vec::new();
    let mut i = 0;
    while i < spans.len() {
        let slot = spans[i].0;
        let info = table.get(slot)?;
        let mut covered = 0u64;
        while i < spans.len() && spans[i].0 == slot {
            let (_, start, range) = spans[i];
            if start != covered {
                let what = if start < covered {
                    "sent twice"
                } else {
                    "missing"
                };
                let (a, b) = (start.min(covered), start.max(covered));
                return Err(Error::Malformed(format!(
                    "dense frame: elements [{a}, {b}) of slot `{}` are {what}",
                    info.name
                )));
            }
            covered = start + range; // no overflow: checked by ChunkEntry::decode
            i += 1;
        }
        if covered != info.numel() {
            return Err(Error::Malformed(format!(
                "dense frame covers [0, {covered}) of slot `{}` of {} elements",
                info.name,
                info.numel()
            )));
        }
        slots.push(slot);
    }
    Ok(slots)
}

/// How a [`FrameWriter`] lays out the sections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Layout {
    /// Each chunk's positions then its values, every section 8-aligned; `values_start` 0.
    Interleaved,
    /// All position sections, then all value sections from `values_start` (the GPU's two
    /// packed regions), each section aligned to its region's alignment.
    Split { pos_align: usize, val_align: usize },
}

/// Builds one frame. Sections are appended as they come; `finish` lays out the header,
/// manifest and digest table in front of them and appends the checksum.
#[derive(Debug)]
pub struct FrameWriter {
    kind: FrameKind,
    version: u64,
    table_hash: u64,
    flush_index: u32,
    flush_count: u32,
    layout: Layout,
    entries: Vec<ChunkEntry>,
    digests: Vec<SlotDigest>,
    /// Section bytes (split: the position sections); offsets in `entries` are relative to the
    /// start of their buffer until `finish`.
    sections: Vec<u8>,
    /// Split layout only: the value sections.
    values: Vec<u8>,
}

impl FrameWriter {
    /// A writer of one frame in the CPU writer's layout: sections 8-aligned, `values_start`
    /// 0, `flush_count` 0 (not known in advance).
    pub fn new(kind: FrameKind, version: u64, table_hash: u64, flush_index: u32) -> Self {
        FrameWriter {
            kind,
            version,
            table_hash,
            flush_index,
            flush_count: 0,
            layout: Layout::Interleaved,
            entries: Vec::new(),
            digests: Vec::new(),
            sections: Vec::new(),
            values: Vec::new(),
        }
    }

    /// Declares the number of frames of the sync (the header's `flush_count`).
    pub fn with_flush_count(mut self, flush_count: u32) -> Self {
        self.flush_count = flush_count;
        self
    }

    /// Lays the sections out as the GPU writes them: position sections packed first, each
    /// aligned to `pos_align`, then the value sections from `values_start`, each aligned to
    /// `val_align` (1, 2, 4 or 8). Call before the first chunk.
    pub fn split_sections(mut self, pos_align: usize, val_align: usize) -> Self {
        debug_assert!(self.entries.is_empty());
        debug_assert!([pos_align, val_align]
            .iter()
            .all(|a| [1, 2, 4, 8].contains(a)));
        self.layout = Layout::Split {
            pos_align,
            val_align,
        };
        self
    }

    /// Bytes of the position region of a split layout (padded so that values start aligned).
    fn position_region(&self) -> usize {
        match self.layout {
            Layout::Interleaved => self.sections.len(),
            Layout::Split { val_align, .. } => self.sections.len().next_multiple_of(val_align),
        }
    }

    /// The frame's size if finished now.
    pub fn len(&self) -> usize {
        HEADER_LEN
            + self.entries.len() * ENTRY_LEN
            + self.digests.len() * DIGEST_LEN
            + self.position_region()
            + self.values.len()
            + CHECKSUM_LEN
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.digests.is_empty()
    }

    pub fn entry_count(&self) -> usize {
        self.entries.len()
    }

    /// Bytes a chunk with these section sizes adds to a frame of the CPU writer's layout.
    pub fn chunk_cost(pos_len: usize, val_len: usize) -> usize {
        ENTRY_LEN + pad8(pos_len) + pad8(val_len)
    }

    /// Appends a chunk with its two sections.
    #[allow(clippy::too_many_arguments)]
    pub fn push_chunk(
        &mut self,
        slot: u32,
        pos_codec: PosCodec,
        val_codec: ValCodec,
        start: u64,
        range: u64,
        count: u64,
        positions: &[u8],
        values: &[u8],
    ) {
        let (pos_offset, val_offset) = match self.layout {
            Layout::Interleaved => {
                let pos_offset = self.sections.len() as u64;
                self.sections.extend_from_slice(positions);
                self.sections.resize(pad8(self.sections.len()), 0);
                let val_offset = self.sections.len() as u64;
                self.sections.extend_from_slice(values);
                self.sections.resize(pad8(self.sections.len()), 0);
                (pos_offset, val_offset)
            }
            Layout::Split {
                pos_align,
                val_align,
            } => {
                let pos_offset = self.sections.len().next_multiple_of(pos_align);
                self.sections.resize(pos_offset, 0);
                self.sections.extend_from_slice(positions);
                let val_offset = self.values.len().next_multiple_of(val_align);
                self.values.resize(val_offset, 0);
                self.values.extend_from_slice(values);
                (pos_offset as u64, val_offset as u64)
            }
        };
        self.entries.push(ChunkEntry {
            slot,
            pos_codec,
            val_codec,
            start,
            range,
            count,
            pos_offset,
            pos_len: positions.len() as u64,
            val_offset,
            val_len: values.len() as u64,
        });
    }

    pub fn push_digest(&mut self, digest: SlotDigest) {
        self.digests.push(digest);
    }

    /// Lays out and checksums the frame.
    pub fn finish(self, is_final: bool) -> Vec<u8> {
        let sections_start =
            (HEADER_LEN + self.entries.len() * ENTRY_LEN + self.digests.len() * DIGEST_LEN) as u64;
        let total = self.len();
        let (values_start, values_base) = match self.layout {
            Layout::Interleaved => (0, sections_start),
            Layout::Split { .. } => {
                let at = sections_start + self.position_region() as u64;
                (at, at)
            }
        };
        let header = FrameHeader {
            kind: self.kind,
            is_final,
            version: self.version,
            table_hash: self.table_hash,
            flush_index: self.flush_index,
            entry_count: self.entries.len() as u32,
            frame_len: total as u64,
            digest_count: self.digests.len() as u32,
            flush_count: self.flush_count,
            values_start,
        };
        let mut out = Vec::with_capacity(total);
        out.extend_from_slice(&header.encode());
        let mut record = [0u8; ENTRY_LEN];
        for e in &self.entries {
            let placed = ChunkEntry {
                pos_offset: e.pos_offset + sections_start,
                val_offset: e.val_offset + values_base,
                ..*e
            };
            placed.encode_into(&mut record);
            out.extend_from_slice(&record);
        }
        let mut record = [0u8; DIGEST_LEN];
        for d in &self.digests {
            d.encode_into(&mut record);
            out.extend_from_slice(&record);
        }
        out.extend_from_slice(&self.sections);
        if let Layout::Split { .. } = self.layout {
            // Pad the position region so that the value region starts aligned.
            out.resize(values_base as usize, 0);
            out.extend_from_slice(&self.values);
        }
        let sum = checksum(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        debug_assert_eq!(out.len(), total);
        out
    }
}

/// The close frame of a sender at `version` of table `table_hash`: no sync follows.
pub fn close_frame(version: u64, table_hash: u64) -> Vec<u8> {
    FrameWriter::new(FrameKind::Close, version, table_hash, 0).finish(true)
}

/// Splits a byte stream holding whole frames back to back (a `.dcast` file) into frames,
/// reading each declared length and checking it against what remains before slicing.
/// Frames are not verified here; [`parse_frame`] does that.
pub fn split_frames(mut bytes: &[u8]) -> Result<Vec<&[u8]>> {
    let mut frames = Vec::new();
    while !bytes.is_empty() {
        let len = peek_frame_len(bytes)?;
        if len > bytes.len() as u64 {
            return Err(Error::Truncated {
                what: "frame in stream",
                needed: len,
                available: bytes.len() as u64,
            });
        }
        let (frame, rest) = bytes.split_at(len as usize);
        frames.push(frame);
        bytes = rest;
    }
    Ok(frames)
}

/// Rounds up to a multiple of 8.
pub fn pad8(n: usize) -> usize {
    (n + 7) & !7
}

#[cfg(test)]
mod tests;
