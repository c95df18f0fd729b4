//! Every position codec (holes included) on arbitrary sections, with count and range from the
//! input: an error, or exactly `count` strictly increasing positions below `range` that
//! re-encode to the same positions (and, for abs32 and bitmap, to the same bytes). `steps`
//! positions go with their `esc` values: the section is the map then the escapes, decoded
//! against old bits keyed by the input, re-encoded (canonically) and decoded to the same.
#![no_main]

use deltacast::codec::{
    decode_positions, decode_steps_values, encode_positions, encode_steps, PosCodec,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [sel, r0, r1, r2, r3, c0, c1, c2, c3, section @ ..] = data else {
        return;
    };
    let codec = PosCodec::ALL[*sel as usize % PosCodec::ALL.len()];
    let mut range = u32::from_le_bytes([*r0, *r1, *r2, *r3]);
    if matches!(codec, PosCodec::All | PosCodec::Holes | PosCodec::Steps) {
        range %= 1 << 18; // these walk the whole range: keep an input fast
    }
    // Up to one past the range, so the count check is hit too.
    let count = (u32::from_le_bytes([*c0, *c1, *c2, *c3]) as u64 % (range as u64 + 2)) as u32;
    if codec == PosCodec::Steps {
        let width = [1usize, 2, 4][*sel as usize / PosCodec::ALL.len() % 3];
        return steps(section, width, count, range, *c1);
    }
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

fn steps(section: &[u8], width: usize, count: u32, range: u32, seed: u8) {
    let (map, escaped) = section.split_at((range as usize).div_ceil(4).min(section.len()));
    let mut rel = vec![7];
    if decode_positions(PosCodec::Steps, map, count, range, &mut rel).is_err() {
        return;
    }
    assert_eq!(rel.len() as u64, count as u64);
    assert!(rel.windows(2).all(|w| w[0] < w[1]) && rel.last().is_none_or(|&p| p < range));
    let old: Vec<u8> = (0..rel.len() * width)
        .map(|i| (i as u8).wrapping_mul(0x9d).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect();
    let mut new = vec![7];
    if decode_steps_values(width, map, range, escaped, &old, &mut new).is_err() {
        return;
    }
    assert_eq!(new.len(), old.len());
    let (mut m, mut e) = (Vec::new(), Vec::new());
    encode_steps(width, &rel, range, &old, &new, &mut m, &mut e);
    if m == map {
        // A canonical input (no escape that is a ±1 step) comes back byte for byte.
        assert_eq!(e, escaped);
    }
    let (mut back, mut vals) = (Vec::new(), Vec::new());
    decode_positions(PosCodec::Steps, &m, count, range, &mut back).unwrap();
    assert_eq!(back, rel);
    decode_steps_values(width, &m, range, &e, &old, &mut vals).unwrap();
    assert_eq!(vals, new);
}
