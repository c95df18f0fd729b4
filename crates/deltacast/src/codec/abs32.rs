//! `abs32`: each position as a little-endian u32 relative to the chunk start.

use crate::error::CodecError;

pub fn encode(rel: &[u32], out: &mut Vec<u8>) {
    out.reserve(rel.len() * 4);
    for &p in rel {
        out.extend_from_slice(&p.to_le_bytes());
    }
}

pub fn decode(input: &[u8], count: u32, range: u32, out: &mut Vec<u32>) -> Result<(), CodecError> {
    let needed = count as u64 * 4;
    crate::codec::exact_len(input, needed, count as u64)?;
    out.reserve(count as usize);
    let mut previous: Option<u32> = None;
    for (index, bytes) in input.chunks_exact(4).enumerate() {
        let p = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        if p >= range {
            return Err(CodecError::PositionOutOfRange {
                position: p as u64,
                range: range as u64,
            });
        }
        if previous.is_some_and(|q| p <= q) {
            return Err(CodecError::NotSorted {
                index: index as u64,
            });
        }
        previous = Some(p);
        out.push(p);
    }
    Ok(())
}
