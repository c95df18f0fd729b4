//! Wire format v1: one flush is one self-contained, checksummed frame.
//!
//! ```text
//! header (64 B) | manifest: entry_count × 64 B | digests: digest_count × 24 B | sections | xxh3-64 (8 B)
//! ```
//! All integers are little-endian. Every section starts on an 8-byte boundary (zero padding).
//! docs/wire-format.md specifies each byte. Parsing checks the checksum before anything else
//! it trusts and checks every offset and length against the frame before use.

use crate::codec::{PosCodec, ValCodec};
use crate::error::{Error, Result};

pub const MAGIC: [u8; 4] = *b"DCST";
pub const WIRE_VERSION: u16 = 1;
pub const HEADER_LEN: usize = 64;
pub const ENTRY_LEN: usize = 64;
pub const DIGEST_LEN: usize = 24;
pub const CHECKSUM_LEN: usize = 8;
/// The smallest possible frame: a header and a checksum.
pub const MIN_FRAME_LEN: usize = HEADER_LEN + CHECKSUM_LEN;
/// Largest chunk range (elements): positions inside a chunk are u32.
pub const MAX_CHUNK_RANGE: u64 = u32::MAX as u64;

const FLAG_FINAL: u8 = 1;

/// What a sync carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FrameKind {
    /// Every element of every slot, values only.
    Seed = 0,
    /// Changed elements since the previous version.
    Delta = 1,
    /// No elements: digests only, for a receiver to check its state against the sender's.
    Verify = 2,
}

impl FrameKind {
    pub fn from_code(code: u8) -> Result<Self> {
        match code {
            0 => Ok(FrameKind::Seed),
            1 => Ok(FrameKind::Delta),
            2 => Ok(FrameKind::Verify),
            other => Err(Error::Malformed(format!("unknown frame kind {other}"))),
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            FrameKind::Seed => "seed",
            FrameKind::Delta => "delta",
            FrameKind::Verify => "verify",
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
    pub digest_count: u32,
    pub frame_len: u64,
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
        // Bounds were checked in `parse_frame`.
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

/// The checksum of a frame: xxh3-64 over every byte before the checksum field.
pub fn checksum(body: &[u8]) -> u64 {
    xxhash_rust::xxh3::xxh3_64(body)
}

/// Reads only the fixed header (magic, version, length) so a stream reader knows how many bytes
/// the frame has. Does not verify the checksum.
pub fn peek_frame_len(header: &[u8]) -> Result<u64> {
    if header.len() < HEADER_LEN {
        return Err(Error::Truncated {
            what: "frame header",
            needed: HEADER_LEN as u64,
            available: header.len() as u64,
        });
    }
    check_magic_and_version(header)?;
    let frame_len = u64_at(header, 32);
    if frame_len < MIN_FRAME_LEN as u64 {
        return Err(Error::Malformed(format!(
            "declared frame length {frame_len} is below the minimum {MIN_FRAME_LEN}"
        )));
    }
    Ok(frame_len)
}

fn check_magic_and_version(b: &[u8]) -> Result<()> {
    let magic = [b[0], b[1], b[2], b[3]];
    if magic != MAGIC {
        return Err(Error::BadMagic { found: magic });
    }
    let version = u16_at(b, 4);
    if version != WIRE_VERSION {
        return Err(Error::UnsupportedWireVersion {
            found: version,
            supported: WIRE_VERSION,
        });
    }
    Ok(())
}

/// Reads the header fields without verifying the checksum: for routing and progress only
/// (which sync a frame belongs to); nothing read here may be trusted before [`parse_frame`].
pub fn peek_header(bytes: &[u8]) -> Result<FrameHeader> {
    let frame_len = peek_frame_len(bytes)?;
    Ok(FrameHeader {
        kind: FrameKind::from_code(bytes[6])?,
        is_final: bytes[7] & FLAG_FINAL != 0,
        version: u64_at(bytes, 8),
        table_hash: u64_at(bytes, 16),
        flush_index: u32_at(bytes, 24),
        entry_count: u32_at(bytes, 28),
        digest_count: u32_at(bytes, 40),
        frame_len,
    })
}

/// Parses and verifies one frame. Checks, in order: minimum length, magic, wire version,
/// declared length = actual length, checksum, then every header field, manifest entry and
/// digest record against the frame bounds.
pub fn parse_frame(bytes: &[u8]) -> Result<Frame<'_>> {
    if bytes.len() < MIN_FRAME_LEN {
        return Err(Error::Truncated {
            what: "frame",
            needed: MIN_FRAME_LEN as u64,
            available: bytes.len() as u64,
        });
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

    let kind = FrameKind::from_code(bytes[6])?;
    let flags = bytes[7];
    if flags & !FLAG_FINAL != 0 {
        return Err(Error::Malformed(format!("unknown flag bits {flags:#04x}")));
    }
    if u32_at(bytes, 44) != 0 || u64_at(bytes, 48) != 0 || u64_at(bytes, 56) != 0 {
        return Err(Error::Malformed(
            "reserved header bytes are not zero".into(),
        ));
    }
    let header = FrameHeader {
        kind,
        is_final: flags & FLAG_FINAL != 0,
        version: u64_at(bytes, 8),
        table_hash: u64_at(bytes, 16),
        flush_index: u32_at(bytes, 24),
        entry_count: u32_at(bytes, 28),
        digest_count: u32_at(bytes, 40),
        frame_len,
    };

    let sections_start = HEADER_LEN as u64
        + header.entry_count as u64 * ENTRY_LEN as u64
        + header.digest_count as u64 * DIGEST_LEN as u64;
    if sections_start > body_end as u64 {
        return Err(Error::Truncated {
            what: "manifest and digest table",
            needed: sections_start,
            available: body_end as u64,
        });
    }
    if kind == FrameKind::Verify && header.entry_count != 0 {
        return Err(Error::Malformed("a verify frame carries no chunks".into()));
    }

    let mut entries = Vec::with_capacity(header.entry_count as usize);
    for e in 0..header.entry_count as usize {
        let at = HEADER_LEN + e * ENTRY_LEN;
        let raw = &bytes[at..at + ENTRY_LEN];
        let pos_codec = PosCodec::from_code(raw[4]).ok_or_else(|| {
            Error::Malformed(format!("entry {e}: unknown position codec {}", raw[4]))
        })?;
        let val_codec = ValCodec::from_code(raw[5]).ok_or_else(|| {
            Error::Malformed(format!("entry {e}: unknown value codec {}", raw[5]))
        })?;
        if u16_at(raw, 6) != 0 {
            return Err(Error::Malformed(format!(
                "entry {e}: reserved bytes are not zero"
            )));
        }
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
        check_entry(e, &entry, kind, sections_start, body_end as u64)?;
        entries.push(entry);
    }

    let mut digests = Vec::with_capacity(header.digest_count as usize);
    let digests_start = HEADER_LEN + header.entry_count as usize * ENTRY_LEN;
    for d in 0..header.digest_count as usize {
        let at = digests_start + d * DIGEST_LEN;
        if u32_at(bytes, at + 4) != 0 {
            return Err(Error::Malformed(format!(
                "digest record {d}: reserved bytes are not zero"
            )));
        }
        digests.push(SlotDigest {
            slot: u32_at(bytes, at),
            base: u64_at(bytes, at + 8),
            new: u64_at(bytes, at + 16),
        });
    }
    Ok(Frame {
        header,
        entries,
        digests,
        bytes,
    })
}

fn check_entry(
    e: usize,
    entry: &ChunkEntry,
    kind: FrameKind,
    sections_start: u64,
    body_end: u64,
) -> Result<()> {
    let bad = |reason: String| {
        Err(Error::Malformed(format!(
            "entry {e} (slot {}): {reason}",
            entry.slot
        )))
    };
    if entry.range == 0 || entry.range > MAX_CHUNK_RANGE {
        return bad(format!(
            "chunk range {} outside 1..={MAX_CHUNK_RANGE}",
            entry.range
        ));
    }
    if entry.start.checked_add(entry.range).is_none() {
        return bad("chunk end overflows".into());
    }
    if entry.count > entry.range {
        return bad(format!(
            "count {} exceeds range {}",
            entry.count, entry.range
        ));
    }
    if entry.count == 0 {
        return bad("empty chunk".into());
    }
    if kind == FrameKind::Seed && entry.val_codec != ValCodec::Raw {
        return bad("a seed chunk carries raw values".into());
    }
    for (what, offset, len) in [
        ("positions", entry.pos_offset, entry.pos_len),
        ("values", entry.val_offset, entry.val_len),
    ] {
        let end = offset.checked_add(len);
        if offset < sections_start || end.is_none_or(|end| end > body_end) {
            return bad(format!(
                "{what} section [{offset}, +{len}) lies outside the frame's sections"
            ));
        }
        if offset % 8 != 0 {
            return bad(format!(
                "{what} section offset {offset} is not 8-byte aligned"
            ));
        }
    }
    Ok(())
}

/// Builds one frame. Sections are appended as they come; `finish` lays out the header,
/// manifest and digest table in front of them and appends the checksum.
#[derive(Debug)]
pub struct FrameWriter {
    kind: FrameKind,
    version: u64,
    table_hash: u64,
    flush_index: u32,
    entries: Vec<ChunkEntry>,
    digests: Vec<SlotDigest>,
    /// Section bytes, offsets in `entries` are relative to the start of this buffer until `finish`.
    sections: Vec<u8>,
}

impl FrameWriter {
    pub fn new(kind: FrameKind, version: u64, table_hash: u64, flush_index: u32) -> Self {
        FrameWriter {
            kind,
            version,
            table_hash,
            flush_index,
            entries: Vec::new(),
            digests: Vec::new(),
            sections: Vec::new(),
        }
    }

    /// The frame's size if finished now.
    pub fn len(&self) -> usize {
        HEADER_LEN
            + self.entries.len() * ENTRY_LEN
            + self.digests.len() * DIGEST_LEN
            + self.sections.len()
            + CHECKSUM_LEN
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.digests.is_empty()
    }

    pub fn entry_count(&self) -> usize {
        self.entries.len()
    }

    /// Bytes a chunk with these section sizes adds to the frame.
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
        let pos_offset = self.sections.len() as u64;
        self.sections.extend_from_slice(positions);
        self.sections.resize(pad8(self.sections.len()), 0);
        let val_offset = self.sections.len() as u64;
        self.sections.extend_from_slice(values);
        self.sections.resize(pad8(self.sections.len()), 0);
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
        let mut out = Vec::with_capacity(total);
        out.extend_from_slice(&MAGIC);
        out.extend_from_slice(&WIRE_VERSION.to_le_bytes());
        out.push(self.kind as u8);
        out.push(if is_final { FLAG_FINAL } else { 0 });
        out.extend_from_slice(&self.version.to_le_bytes());
        out.extend_from_slice(&self.table_hash.to_le_bytes());
        out.extend_from_slice(&self.flush_index.to_le_bytes());
        out.extend_from_slice(&(self.entries.len() as u32).to_le_bytes());
        out.extend_from_slice(&(total as u64).to_le_bytes());
        out.extend_from_slice(&(self.digests.len() as u32).to_le_bytes());
        out.resize(HEADER_LEN, 0);
        for e in &self.entries {
            out.extend_from_slice(&e.slot.to_le_bytes());
            out.push(e.pos_codec as u8);
            out.push(e.val_codec as u8);
            out.extend_from_slice(&[0, 0]);
            for v in [
                e.start,
                e.range,
                e.count,
                e.pos_offset + sections_start,
                e.pos_len,
                e.val_offset + sections_start,
                e.val_len,
            ] {
                out.extend_from_slice(&v.to_le_bytes());
            }
        }
        for d in &self.digests {
            out.extend_from_slice(&d.slot.to_le_bytes());
            out.extend_from_slice(&[0; 4]);
            out.extend_from_slice(&d.base.to_le_bytes());
            out.extend_from_slice(&d.new.to_le_bytes());
        }
        out.extend_from_slice(&self.sections);
        let sum = checksum(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        debug_assert_eq!(out.len(), total);
        out
    }
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
mod tests {
    use super::*;

    fn sample() -> Vec<u8> {
        let mut w = FrameWriter::new(FrameKind::Delta, 7, 0xabcd, 2);
        w.push_chunk(
            3,
            PosCodec::Abs32,
            ValCodec::Raw,
            1 << 20,
            1000,
            2,
            &[1, 0, 0, 0, 9, 0, 0, 0],
            &[0x80, 0x3f, 0x00, 0x40],
        );
        w.push_digest(SlotDigest {
            slot: 3,
            base: 11,
            new: 12,
        });
        w.finish(true)
    }

    #[test]
    fn round_trip() {
        let bytes = sample();
        let f = parse_frame(&bytes).unwrap();
        assert_eq!(f.header.kind, FrameKind::Delta);
        assert!(f.header.is_final);
        assert_eq!(
            (f.header.version, f.header.table_hash, f.header.flush_index),
            (7, 0xabcd, 2)
        );
        assert_eq!(f.entries.len(), 1);
        let e = f.entries[0];
        assert_eq!((e.slot, e.start, e.range, e.count), (3, 1 << 20, 1000, 2));
        assert_eq!(f.positions(&e), &[1, 0, 0, 0, 9, 0, 0, 0]);
        assert_eq!(f.values(&e), &[0x80, 0x3f, 0x00, 0x40]);
        assert_eq!(
            f.digests,
            vec![SlotDigest {
                slot: 3,
                base: 11,
                new: 12
            }]
        );
    }

    #[test]
    fn every_flipped_bit_and_truncation_is_an_error() {
        let bytes = sample();
        for i in 0..bytes.len() * 8 {
            let mut b = bytes.clone();
            b[i / 8] ^= 1 << (i % 8);
            assert!(parse_frame(&b).is_err(), "flip of bit {i} accepted");
        }
        for n in 0..bytes.len() {
            assert!(parse_frame(&bytes[..n]).is_err());
        }
    }

    /// Re-checksums a tampered frame so the structural checks behind the checksum are reached.
    fn reseal(mut b: Vec<u8>) -> Vec<u8> {
        let end = b.len() - CHECKSUM_LEN;
        let sum = checksum(&b[..end]);
        b[end..].copy_from_slice(&sum.to_le_bytes());
        b
    }

    #[test]
    fn structural_lies_behind_a_valid_checksum_are_errors() {
        let bytes = sample();
        // Huge entry count: must not allocate, must report truncation.
        let mut b = bytes.clone();
        b[28..32].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            parse_frame(&reseal(b)),
            Err(Error::Truncated { .. })
        ));
        // Section offset pointing past the end.
        let mut b = bytes.clone();
        b[HEADER_LEN + 48..HEADER_LEN + 56].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(matches!(parse_frame(&reseal(b)), Err(Error::Malformed(_))));
        // Count above range.
        let mut b = bytes.clone();
        b[HEADER_LEN + 24..HEADER_LEN + 32].copy_from_slice(&5000u64.to_le_bytes());
        assert!(matches!(parse_frame(&reseal(b)), Err(Error::Malformed(_))));
        // Wrong wire version names itself.
        let mut b = bytes.clone();
        b[4] = 2;
        assert!(matches!(
            parse_frame(&b),
            Err(Error::UnsupportedWireVersion { found: 2, .. })
        ));
        // Unknown codec.
        let mut b = bytes;
        b[HEADER_LEN + 4] = 9;
        assert!(parse_frame(&reseal(b))
            .unwrap_err()
            .to_string()
            .contains("position codec"));
    }
}
