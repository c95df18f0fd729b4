//! `ctx` and `ctxgaps` positions on arbitrary sections, against held bits of 2 or 4 bytes (and unsupported
//! widths) keyed by the input: an error, or exactly `count` strictly increasing positions
//! below `range` that re-encode (against the same held bits) and decode to the same positions.
#![no_main]

use deltacast::codec::{decode_positions_held, encode_context_positions, PosCodec};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [sel, r0, r1, c0, c1, seed, section @ ..] = data else {
        return;
    };
    let width = [2usize, 4, 1, 8][*sel as usize % 4];
    let codec = if sel & 4 == 0 {
        PosCodec::Context
    } else {
        PosCodec::ContextGaps
    };
    let range = u16::from_le_bytes([*r0, *r1]) as u32 % 20_000;
    let count = (u16::from_le_bytes([*c0, *c1]) as u32) % (range + 2);
    // Few exponent classes, as weights have, keyed by the seed.
    let held: Vec<u8> = (0..range as usize * width)
        .map(|i| {
            let x = (i as u8).wrapping_mul(0x9d).wrapping_add(*seed) ^ (i >> 7) as u8;
            if i % width == width - 1 {
                0x3C | (x & 0x03)
            } else {
                x
            }
        })
        .collect();
    let mut out = vec![7];
    let decoded = decode_positions_held(
        codec,
        section,
        count,
        range,
        width,
        &held,
        &mut out,
    );
    if decoded.is_err() {
        return;
    }
    assert_eq!(out.len() as u64, count as u64);
    assert!(out.windows(2).all(|w| w[0] < w[1]) && out.last().is_none_or(|&p| p < range));
    let old: Vec<u8> = out
        .iter()
        .flat_map(|&p| held[p as usize * width..(p as usize + 1) * width].to_vec())
        .collect();
    let mut again = Vec::new();
    encode_context_positions(codec, width, &out, &held, &old, &mut again);
    let mut back = Vec::new();
    decode_positions_held(
        codec,
        &again,
        count,
        range,
        width,
        &held,
        &mut back,
    )
    .unwrap();
    assert_eq!(back, out);
});
