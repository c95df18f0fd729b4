//! `bitmap` positions: not implemented yet (the codec issue).

use crate::error::CodecError;

pub fn encode(rel: &[u32], _range: u32, out: &mut Vec<u8>) {
    // Placeholder so Auto never prefers it: larger than abs32.
    out.resize(out.len() + rel.len() * 4 + 1, 0xff);
}

pub fn decode(_input: &[u8], _count: u32, _range: u32, _out: &mut Vec<u32>) -> Result<(), CodecError> {
    Err(CodecError::Unsupported { codec: "bitmap", what: "decoding in this build" })
}
