//! `ulp` values: not implemented yet (the codec issue).

use crate::error::CodecError;

pub fn encode(_width: usize, _old: &[u8], new: &[u8], out: &mut Vec<u8>) {
    // Placeholder so Auto never prefers it: larger than raw.
    out.resize(out.len() + new.len() + 1, 0xff);
}

pub fn decode(_width: usize, _input: &[u8], _old: &[u8], _out: &mut Vec<u8>) -> Result<(), CodecError> {
    Err(CodecError::Unsupported { codec: "ulp", what: "decoding in this build" })
}
