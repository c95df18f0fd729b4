//! Every position codec (holes included) on arbitrary sections, with count and range from the
//! input: an error, or exactly `count` strictly increasing positions below `range` that
//! re-encode to the same positions (and, for abs32 and bitmap, to the same bytes).
#![no_main]

use deltacast::codec::{decode_positions, encode_positions, PosCodec};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [sel, r0, r1, r2, r3, c0, c1, c2, c3, section @ ..] = data else {
        return;
    };
    let codec = PosCodec::ALL[*sel as usize % PosCodec::ALL.len()];
    let mut range = u32::from_le_bytes([*r0, *r1, *r2, *r3]);
    if matches!(codec, PosCodec::All | PosCodec::Holes) {
        range %= 1 << 18; // these walk the whole range: keep an input fast
    }
    // Up to one past the range, so the count check is hit too.
    let count = (u32::from_le_bytes([*c0, *c1, *c2, *c3]) as u64 % (range as u64 + 2)) as u32;
    let mut out = vec![7];
    if decode_positions(codec, section, count, range, &mut out).is_err() {
        return;
    }
    assert_eq!(out.len() as u64, count as u64);
    assert!(out.windows(2).all(|w| w[0] < w[1]) && out.last().is_none_or(|&p| p < range));
    let mut again = Vec::new();
    encode_positions(codec, &out, range, &mut again);
    if matches!(codec, PosCodec::Abs32 | PosCodec::Bitmap) {
        assert_eq!(again, section);
    }
    let mut back = Vec::new();
    decode_positions(codec, &again, count, range, &mut back).unwrap();
    assert_eq!(back, out);
});
