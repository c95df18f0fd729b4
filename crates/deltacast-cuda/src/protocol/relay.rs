//! A GPU sync as file frames and back, on the host: the parts a device link carries for a
//! stage assembled into a frame of the core's format ([`FrameAssembler`]), and the frames of
//! a sync, from any sender, cut into the parts a GPU receiver takes ([`device_parts`]). So a
//! GPU-made sync can be saved, relayed over TCP, inspected and applied on a CPU, and a
//! CPU-made one applied on a GPU.

use deltacast::wire::{self, ChunkEntry, FrameHeader, FrameKind};

use super::{bad, check_split, core, Stage};
use crate::error::Result;

/// What the assembler waits for next.
#[derive(Debug)]
enum Expect {
    Header,
    Manifest(FrameHeader),
    Positions(Stage),
    Values(Stage, Vec<u8>),
    /// A whole stage's sections, one per entry, from entry `next`.
    Sections {
        stage: Stage,
        next: usize,
        values: Vec<u8>,
    },
}

/// Turns the parts of a device link's broadcasts, in order, back into frames.
#[derive(Debug)]
pub struct FrameAssembler {
    expect: Expect,
}

impl Default for FrameAssembler {
    fn default() -> Self {
        FrameAssembler::new()
    }
}

impl FrameAssembler {
    pub fn new() -> FrameAssembler {
        FrameAssembler {
            expect: Expect::Header,
        }
    }

    /// Whether it is between stages (no part of one is pending).
    pub fn is_idle(&self) -> bool {
        matches!(self.expect, Expect::Header)
    }

    /// Takes the next part; returns the stage's frame (checksum included) once it is whole.
    /// A part that does not fit what the stage announced is an error, and the assembler
    /// starts over at the next header.
    pub fn push(&mut self, part: &[u8]) -> Result<Option<Vec<u8>>> {
        let expect = std::mem::replace(&mut self.expect, Expect::Header);
        let (next, frame) = match expect {
            Expect::Header => {
                let header = FrameHeader::decode(part).map_err(core)?;
                if part.len() != wire::HEADER_LEN {
                    return Err(bad(format!("a header part of {} bytes", part.len())));
                }
                check_split(&header)?;
                if header.kind == FrameKind::Close {
                    (Expect::Header, Some(close_frame(header)?))
                } else {
                    (Expect::Manifest(header), None)
                }
            }
            Expect::Manifest(header) => {
                let (entries, digests) = wire::parse_manifest(&header, part).map_err(core)?;
                let stage = Stage {
                    header,
                    entries,
                    digests,
                };
                match stage.kind() {
                    FrameKind::Delta => (Expect::Positions(stage), None),
                    _ if stage.entries.is_empty() => {
                        let frame = stage.to_frame(&[], &[])?;
                        (Expect::Header, Some(frame))
                    }
                    _ => (
                        Expect::Sections {
                            stage,
                            next: 0,
                            values: Vec::new(),
                        },
                        None,
                    ),
                }
            }
            Expect::Positions(stage) => {
                expect_len(part, stage.position_bytes(), "position region")?;
                (Expect::Values(stage, part.to_vec()), None)
            }
            Expect::Values(stage, positions) => {
                expect_len(part, stage.value_bytes(), "value region")?;
                let frame = stage.to_frame(&positions, part)?;
                (Expect::Header, Some(frame))
            }
            Expect::Sections {
                stage,
                next,
                mut values,
            } => {
                expect_len(part, stage.entries[next].val_len, "section")?;
                values.extend_from_slice(part);
                if next + 1 == stage.entries.len() {
                    let frame = stage.to_frame(&[], &values)?;
                    (Expect::Header, Some(frame))
                } else {
                    (
                        Expect::Sections {
                            stage,
                            next: next + 1,
                            values,
                        },
                        None,
                    )
                }
            }
        };
        self.expect = next;
        Ok(frame)
    }
}

fn expect_len(part: &[u8], len: u64, what: &str) -> Result<()> {
    if part.len() as u64 != len {
        return Err(bad(format!(
            "a {what} of {} bytes where the stage announced {len}",
            part.len()
        )));
    }
    Ok(())
}

fn close_frame(header: FrameHeader) -> Result<Vec<u8>> {
    Stage {
        header,
        entries: Vec::new(),
        digests: Vec::new(),
    }
    .to_frame(&[], &[])
}

/// The parts a device link carries for the frames of one sync (each checksum-verified
/// here), in order. Frames of one kind are restaged into one stage of every slot they name
/// (position sections packed after each other, then value sections, each 8-aligned; chunks
/// by slot and start); a sync mixing delta and dense frames must already be in stages, as
/// a GPU sender made it, and goes frame by frame. A GPU receiver checks the rest (its table,
/// the codecs it decodes).
pub fn device_parts(frames: &[&[u8]]) -> Result<Vec<Vec<u8>>> {
    device_parts_reusing(frames, &mut Vec::new())
}

/// [`device_parts`], the joined position and value parts written into buffers taken from
/// `spare` (parts given back there after use keep their memory: a sync of a few hundred MB
/// then costs a copy, not fresh pages to fault in).
pub fn device_parts_reusing(frames: &[&[u8]], spare: &mut Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>> {
    let parsed: Vec<wire::Frame> = frames
        .iter()
        .map(|f| wire::parse_frame(f).map_err(core))
        .collect::<Result<_>>()?;
    let Some(first) = parsed.first() else {
        return Err(bad("a sync of no frames".into()));
    };
    if parsed.iter().all(|f| f.header.kind == first.header.kind) {
        return restage(&parsed, spare);
    }
    let mut parts = Vec::new();
    for f in &parsed {
        check_split(&f.header)?;
        let stage = Stage {
            header: f.header,
            entries: f.entries.clone(),
            digests: f.digests.clone(),
        };
        parts.push(stage.encode_header().to_vec());
        parts.push(stage.encode_manifest());
        let region = |from: u64, len: u64| f.bytes()[from as usize..(from + len) as usize].to_vec();
        match stage.kind() {
            FrameKind::Delta => {
                parts.push(region(stage.sections_start(), stage.position_bytes()));
                parts.push(region(stage.header.values_start, stage.value_bytes()));
            }
            _ => parts.extend(f.entries.iter().map(|e| f.values(e).to_vec())),
        }
    }
    Ok(parts)
}

/// An empty buffer from `spare` with room for `len` bytes: the smallest there that holds
/// them (so a sync's small part does not take the buffer its large part needs), else the
/// largest, grown; else a new one.
fn buffer(spare: &mut Vec<Vec<u8>>, len: usize) -> Vec<u8> {
    let fits = (0..spare.len())
        .filter(|&i| spare[i].capacity() >= len)
        .min_by_key(|&i| spare[i].capacity());
    let pick = fits.or_else(|| (0..spare.len()).max_by_key(|&i| spare[i].capacity()));
    let mut b = pick.map(|i| spare.swap_remove(i)).unwrap_or_default();
    b.clear();
    b.reserve(len);
    b
}

/// Frames of one kind as the parts of one stage of every slot they name.
fn restage(frames: &[wire::Frame], spare: &mut Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>> {
    let h0 = frames[0].header;
    if h0.kind == FrameKind::Close {
        return Ok(vec![h0.encode().to_vec()]);
    }
    let mut digests = Vec::new();
    let mut chunks: Vec<(ChunkEntry, &[u8], &[u8])> = Vec::new();
    for f in frames {
        if f.header.version != h0.version || f.header.table_hash != h0.table_hash {
            return Err(bad(
                "the frames of one sync disagree on version or table".into()
            ));
        }
        digests.extend_from_slice(&f.digests);
        chunks.extend(f.entries.iter().map(|e| (*e, f.positions(e), f.values(e))));
    }
    digests.sort_by_key(|d| d.slot);
    chunks.sort_by_key(|(e, _, _)| (e.slot, e.start));
    // A delta's sections are joined into one positions and one values part; a whole
    // stage's parts are its chunks' values, one each (its records' offsets as a delta's).
    let delta = h0.kind == FrameKind::Delta;
    let (pos_len, val_len) = chunks.iter().fold((0usize, 0usize), |(p, v), (_, ps, vs)| {
        (
            p.next_multiple_of(8) + ps.len(),
            v.next_multiple_of(8) + vs.len(),
        )
    });
    let mut positions = buffer(spare, pos_len);
    let mut values = if delta {
        buffer(spare, val_len)
    } else {
        Vec::new()
    };
    let mut sections = Vec::with_capacity(if delta { 0 } else { chunks.len() });
    let mut records = Vec::with_capacity(chunks.len());
    let mut val_at = 0usize;
    for (mut e, p, v) in chunks {
        positions.resize(positions.len().next_multiple_of(8), 0);
        val_at = val_at.next_multiple_of(8);
        e.pos_offset = positions.len() as u64;
        e.val_offset = val_at as u64;
        positions.extend_from_slice(p);
        if delta {
            values.resize(val_at, 0);
            values.extend_from_slice(v);
        } else {
            sections.push(v.to_vec());
        }
        val_at += v.len();
        records.push(e);
    }
    let first_slot = digests.first().map_or(0, |d| d.slot);
    let pairs: Vec<(u64, u64)> = digests.iter().map(|d| (d.base, d.new)).collect();
    let stage = Stage::packed(
        h0.kind,
        h0.version,
        h0.table_hash,
        (0, 1),
        first_slot,
        &pairs,
        records,
        (positions.len() as u64, val_at as u64),
    )?;
    let mut parts = vec![stage.encode_header().to_vec(), stage.encode_manifest()];
    match stage.kind() {
        FrameKind::Delta => parts.extend([positions, values]),
        _ => parts.extend(sections),
    }
    Ok(parts)
}

#[cfg(test)]
mod tests {
    use super::buffer;

    #[test]
    fn a_part_takes_the_smallest_spare_buffer_that_holds_it() {
        let mut spare = vec![Vec::with_capacity(10_000), vec![7u8; 100]];
        let small = buffer(&mut spare, 50);
        assert!(small.is_empty() && small.capacity() >= 50 && small.capacity() < 10_000);
        assert_eq!(spare.len(), 1, "the large buffer stays for the large part");
        let large = buffer(&mut spare, 20_000);
        assert!(large.is_empty() && large.capacity() >= 20_000);
        assert!(spare.is_empty());
        assert!(
            buffer(&mut spare, 3).capacity() >= 3,
            "none spare: a new one"
        );
    }
}
