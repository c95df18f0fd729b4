//! The tests' independent reference encoder of `gaps` sections (one bool per bit, every `k`
//! tried by encoding), and the data the tests share.

use super::format::{BLOCK, ESC, MAX_K};
use super::{decode, encode};
use proptest::prelude::*;

/// Independent reference encoder: one bool per bit, every k tried by actually encoding.
pub(super) fn reference_encode(rel: &[u32], range: u32) -> Vec<u8> {
    fn push_bits(bits: &mut Vec<bool>, value: u64, len: u32) {
        for i in 0..len {
            bits.push((value >> i) & 1 == 1);
        }
    }
    fn block_bits(block: &[u32], k: u32, w: u32) -> Vec<bool> {
        let mut bits = Vec::new();
        for pair in block.windows(2) {
            let g = (pair[1] - pair[0] - 1) as u64;
            let q = g >> k;
            if q < ESC as u64 {
                bits.extend(std::iter::repeat_n(false, q as usize));
                bits.push(true);
                push_bits(&mut bits, g, k);
            } else {
                bits.extend(std::iter::repeat_n(false, ESC as usize));
                push_bits(&mut bits, g, w);
            }
        }
        bits
    }
    if rel.is_empty() {
        return Vec::new();
    }
    let w = if range <= 2 {
        1
    } else {
        32 - (range - 1).leading_zeros()
    };
    let mut dir = Vec::new();
    let mut stream = Vec::new();
    for block in rel.chunks(BLOCK) {
        let best = (0..=MAX_K)
            .map(|k| (block_bits(block, k, w), k))
            .min_by_key(|(b, k)| (b.len(), *k))
            .unwrap();
        dir.extend_from_slice(&block[0].to_le_bytes());
        dir.extend_from_slice(&(best.0.len() as u16).to_le_bytes());
        dir.push(best.1 as u8);
        stream.extend(best.0);
    }
    let mut bytes = vec![0u8; stream.len().div_ceil(8)];
    for (i, &bit) in stream.iter().enumerate() {
        if bit {
            bytes[i / 8] |= 1 << (i % 8);
        }
    }
    dir.extend(bytes);
    dir
}

pub(super) fn round_trip(rel: &[u32], range: u32) -> Vec<u8> {
    let mut enc = Vec::new();
    encode(rel, range, &mut enc);
    let mut dec = vec![7];
    decode(&enc, rel.len() as u32, range, &mut dec).unwrap();
    assert_eq!(dec, rel, "range {range}, {} positions", rel.len());
    enc
}

pub(super) fn bitmap_of(rel: &[u32], range: u32) -> Vec<u8> {
    let mut map = Vec::new();
    crate::codec::bitmap::encode(rel, range, &mut map);
    map
}

pub(super) fn sorted_positions() -> impl Strategy<Value = (Vec<u32>, u32)> {
    (
        1u32..200_000,
        prop::collection::vec(any::<u32>(), 0..3000),
        any::<bool>(),
    )
        .prop_map(|(range, raw, clustered)| {
            let mut rel: Vec<u32> = if clustered {
                // Runs of neighbours around a few centres, to exercise small and large k.
                raw.iter()
                    .map(|&r| ((r >> 16) % 8) * (range / 8) + (r & 0xff))
                    .filter(|&p| p < range)
                    .collect()
            } else {
                raw.iter().map(|&r| r % range).collect()
            };
            rel.sort_unstable();
            rel.dedup();
            (rel, range)
        })
}
