//! `raw`: the new bit patterns themselves.

use crate::error::CodecError;

pub fn encode(new: &[u8], out: &mut Vec<u8>) {
    out.extend_from_slice(new);
}

pub fn decode(
    width: usize,
    input: &[u8],
    count: usize,
    out: &mut Vec<u8>,
) -> Result<(), CodecError> {
    let needed = (count * width) as u64;
    crate::codec::exact_len(input, needed, count as u64)?;
    out.extend_from_slice(input);
    Ok(())
}
