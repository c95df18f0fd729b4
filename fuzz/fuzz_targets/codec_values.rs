//! Every value codec and element width (and an unsupported one) on arbitrary sections: an
//! error, or exactly `n` values that re-encode and decode to the same values. (`esc` values
//! decode only with their `steps` map: an error here, fuzzed by `codec_positions`.)
#![no_main]

use deltacast::codec::{decode_values, encode_values, ValCodec};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [sel, n0, n1, seed, section @ ..] = data else {
        return;
    };
    let codec = ValCodec::ALL[*sel as usize % ValCodec::ALL.len()];
    let width = [1usize, 2, 4, 3][(*sel as usize >> 2) % 4];
    let n = u16::from_le_bytes([*n0, *n1]) as usize % 8193;
    // The held bits only shift decoded values; a cheap pattern keyed by the input will do.
    let old: Vec<u8> = (0..n * width)
        .map(|i| (i as u8).wrapping_mul(0x9d).wrapping_add(*seed) ^ (i >> 8) as u8)
        .collect();
    let mut out = vec![7];
    if decode_values(codec, width, section, &old, &mut out).is_err() {
        return;
    }
    assert_eq!(out.len(), n * width);
    if codec == ValCodec::Raw {
        assert_eq!(out, section);
    }
    if width == 3 {
        return; // no encoder for it
    }
    let mut again = Vec::new();
    encode_values(codec, width, &old, &out, &mut again);
    let mut back = Vec::new();
    decode_values(codec, width, &again, &old, &mut back).unwrap();
    assert_eq!(back, out);
});
