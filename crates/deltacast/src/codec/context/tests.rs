//! `ctx` round trips against the input itself (the codec is lossless), on random masks and
//! steps of both widths, the patterns floats make hard (NaN, ±0, ±inf, subnormals, sign
//! crossings, the largest step), and hostile sections (never a panic).

use super::*;
use crate::dtype::from_ordered;
use crate::testutil::{adamw_bf16, bernoulli_positions, Rng};

/// Old bits of a whole range: a few exponent classes, like a weight tensor, with specials.
pub(super) fn held_range(rng: &mut Rng, width: usize, range: u32) -> Vec<u8> {
    let nb = 8 * width as u32;
    let mut out = Vec::with_capacity(range as usize * width);
    for _ in 0..range {
        let bits = match rng.below(20) {
            0 => 0,                    // +0
            1 => 1 << (nb - 1),        // −0
            2 => (1 << (nb - 1)) - 1,  // +NaN, all ones
            3 => rng.below(16) as u32, // subnormal
            _ => {
                // Exponent near the middle, random sign and mantissa.
                let exp_bits = 8; // BF16 and FP32 layouts
                let mant = nb - 1 - exp_bits;
                let e = (1u32 << (exp_bits - 1)) - 4 - rng.below(6) as u32;
                let sign = (rng.below(2) as u32) << (nb - 1);
                sign | (e << mant) | (rng.next_u64() as u32 & ((1 << mant) - 1))
            }
        };
        out.extend_from_slice(&bits.to_le_bytes()[..width]);
    }
    out
}

/// New bits: mostly small ULP steps, some extreme ones and raw patterns.
fn step_from(rng: &mut Rng, width: usize, old: u32) -> u32 {
    let nb = 8 * width as u32;
    let mask = if nb == 32 { u32::MAX } else { (1 << nb) - 1 };
    let d: u32 = match rng.below(40) {
        0 => 0,
        1 => 1 << (nb - 1),                // the largest step, −2^(nb−1)
        2 => (1 << (nb - 1)) - 1,          // +2^(nb−1) − 1
        3 => rng.next_u64() as u32 & mask, // anything
        4..=8 => (rng.below(1000) as u32 + 2).wrapping_neg() & mask,
        9..=12 => rng.below(300) as u32 + 2,
        k if k % 2 == 0 => 1,
        _ => mask, // −1
    };
    from_ordered(to_ordered(old, width).wrapping_add(d) & mask, width)
}

fn round_trip(width: usize, rel: &[u32], held: &[u8], rng: &mut Rng) -> (usize, usize) {
    let range = (held.len() / width) as u32;
    let old: Vec<u8> = rel
        .iter()
        .flat_map(|&p| held[p as usize * width..(p as usize + 1) * width].to_vec())
        .collect();
    let mut new = Vec::with_capacity(old.len());
    let mut after = held.to_vec();
    for (k, &p) in rel.iter().enumerate() {
        let b = step_from(rng, width, load_bits(&old, width, k));
        new.extend_from_slice(&b.to_le_bytes()[..width]);
        after[p as usize * width..(p as usize + 1) * width]
            .copy_from_slice(&b.to_le_bytes()[..width]);
    }
    let (mut pos, mut val) = (Vec::new(), Vec::new());
    encode_positions(width, rel, &after, &old, &mut pos);
    encode_values(width, &old, &new, &mut val);
    let mut back = vec![7u32];
    decode_positions(width, &pos, rel.len() as u32, range, held, &mut back).unwrap();
    assert_eq!(back, rel, "width {width} range {range}");
    let mut vals = vec![1u8];
    decode_values(width, &val, &old, &mut vals).unwrap();
    assert_eq!(vals, new, "width {width} range {range}");
    // Every byte is needed: one less is an error, one more too.
    if !pos.is_empty() {
        let cut = &pos[..pos.len() - 1];
        assert!(decode_positions(width, cut, rel.len() as u32, range, held, &mut back).is_err());
        let mut more = pos.clone();
        more.push(0);
        assert!(decode_positions(width, &more, rel.len() as u32, range, held, &mut back).is_err());
    }
    if !val.is_empty() {
        assert!(decode_values(width, &val[..val.len() - 1], &old, &mut vals).is_err());
        let mut more = val.clone();
        more.push(0);
        assert!(decode_values(width, &more, &old, &mut vals).is_err());
    }
    (pos.len(), val.len())
}

#[test]
fn random_chunks_round_trip() {
    let mut rng = Rng(28);
    for width in [2usize, 4] {
        for range in [1u32, 2, 3, 17, 1000, 4097, 70_001] {
            for density in [0.0, 0.001, 0.05, 0.5, 0.97, 1.0] {
                let held = held_range(&mut rng, width, range);
                let rel = bernoulli_positions(&mut rng, range, density);
                round_trip(width, &rel, &held, &mut rng);
            }
        }
    }
}

#[test]
fn every_step_of_a_few_patterns_round_trips() {
    // Every new pattern of BF16 from a handful of old ones (±0, NaN, subnormal, normal, inf).
    for old in [
        0x0000u32, 0x8000, 0x7FC1, 0xFFFF, 0x0001, 0x3F80, 0xBF80, 0x7F80,
    ] {
        let olds: Vec<u8> = (0..65536)
            .flat_map(|_| (old as u16).to_le_bytes())
            .collect();
        let news: Vec<u8> = (0..65536u32)
            .flat_map(|b| (b as u16).to_le_bytes())
            .collect();
        let mut val = Vec::new();
        encode_values(2, &olds, &news, &mut val);
        let mut back = Vec::new();
        decode_values(2, &val, &olds, &mut back).unwrap();
        assert_eq!(back, news, "old {old:#06x}");
    }
    // FP32 extremes.
    let pairs: [(u32, u32); 6] = [
        (0, 0x8000_0000),
        (0x7FFF_FFFF, 0xFFFF_FFFF),
        (0x0000_0001, 0x8000_0001),
        (0x3F80_0000, 0x3F80_0000),
        (0xFF80_0000, 0x7F80_0000),
        (0x8000_0000, 0x7FFF_FFFF),
    ];
    let olds: Vec<u8> = pairs.iter().flat_map(|p| p.0.to_le_bytes()).collect();
    let news: Vec<u8> = pairs.iter().flat_map(|p| p.1.to_le_bytes()).collect();
    let mut val = Vec::new();
    encode_values(4, &olds, &news, &mut val);
    let mut back = Vec::new();
    decode_values(4, &val, &olds, &mut back).unwrap();
    assert_eq!(back, news);
}

#[test]
fn adamw_steps_cost_less_than_ulp() {
    // The exponent context pays on AdamW-like steps: at most what `ulp` spends.
    let mut rng = Rng(3);
    let (old, new) = adamw_bf16(&mut rng, 50_000);
    let (mut ctx, mut ulp) = (Vec::new(), Vec::new());
    encode_values(2, &old, &new, &mut ctx);
    crate::codec::ulp::encode(2, &old, &new, &mut ulp);
    assert!(
        ctx.len() <= ulp.len(),
        "ctx {} ulp {}",
        ctx.len(),
        ulp.len()
    );
    let mut back = Vec::new();
    decode_values(2, &ctx, &old, &mut back).unwrap();
    assert_eq!(back, new);
}

#[test]
fn empty_and_unsupported() {
    let mut out = vec![1u32];
    decode_positions(2, &[], 0, 5, &[0; 10], &mut out).unwrap();
    assert!(out.is_empty());
    assert!(decode_positions(2, &[0], 0, 5, &[0; 10], &mut out).is_err());
    let mut pos = Vec::new();
    encode_positions(2, &[], &[0; 10], &[], &mut pos);
    assert!(pos.is_empty());
    // Held bytes must match the range.
    assert!(decode_positions(2, &[0; 8], 1, 5, &[0; 9], &mut out).is_err());
    for w in [1usize, 8] {
        assert!(matches!(
            decode_positions(w, &[0; 8], 1, 5, &vec![0; 5 * w], &mut out),
            Err(CodecError::Unsupported { .. })
        ));
        let mut vals = Vec::new();
        assert!(matches!(
            decode_values(w, &[0; 8], &vec![0; w], &mut vals),
            Err(CodecError::Unsupported { .. })
        ));
    }
    let mut vals = vec![3u8];
    decode_values(2, &[], &[], &mut vals).unwrap();
    assert!(vals.is_empty());
    assert!(decode_values(2, &[0], &[], &mut vals).is_err());
}

#[test]
fn hostile_sections_never_panic() {
    let mut rng = Rng(99);
    let held = held_range(&mut rng, 2, 3000);
    let old = held_range(&mut rng, 4, 500);
    let (mut out, mut vals) = (Vec::new(), Vec::new());
    for len in [0usize, 1, 3, 4, 5, 9, 64, 700] {
        for _ in 0..40 {
            let bytes = rng.bytes(len);
            for count in [0u32, 1, 10, 2999, 3000, 3001] {
                if let Ok(()) = decode_positions(2, &bytes, count, 3000, &held, &mut out) {
                    assert_eq!(out.len(), count as usize);
                    assert!(out.windows(2).all(|w| w[0] < w[1]));
                    assert!(out.iter().all(|&p| p < 3000));
                }
            }
            for n in [0usize, 1, 499, 500] {
                if let Ok(()) = decode_values(4, &bytes, &old[..n * 4], &mut vals) {
                    assert_eq!(vals.len(), n * 4);
                }
            }
        }
    }
}

/// Golden vectors of docs/codecs.md ("ctx"): the bytes are part of the format.
#[test]
fn golden_vectors() {
    // BF16 range of 8: old bits 1.0 (0x3F80) ×4 then 2^-20 (0x3580) ×4; elements 1 and 5
    // changed (+1 ULP, −1 ULP), 6 changed by +3.
    let held: Vec<u8> = [
        0x3F80u16, 0x3F80, 0x3F80, 0x3F80, 0x3580, 0x3580, 0x3580, 0x3580,
    ]
    .iter()
    .flat_map(|b| b.to_le_bytes())
    .collect();
    let rel = [1u32, 5, 6];
    let old: Vec<u8> = [0x3F80u16, 0x3580, 0x3580]
        .iter()
        .flat_map(|b| b.to_le_bytes())
        .collect();
    let new: Vec<u8> = [0x3F81u16, 0x357F, 0x3583]
        .iter()
        .flat_map(|b| b.to_le_bytes())
        .collect();
    let mut after = held.clone();
    for (k, &p) in rel.iter().enumerate() {
        after[2 * p as usize..2 * p as usize + 2].copy_from_slice(&new[2 * k..2 * k + 2]);
    }
    let (mut pos, mut val) = (Vec::new(), Vec::new());
    encode_positions(2, &rel, &after, &old, &mut pos);
    encode_values(2, &old, &new, &mut val);
    println!("golden positions {pos:02x?} values {val:02x?}");
    assert_eq!(pos, GOLDEN_POSITIONS);
    assert_eq!(val, GOLDEN_VALUES);
}

const GOLDEN_POSITIONS: &[u8] = &[0x64, 0x5f, 0xa0, 0x00, 0x00];
const GOLDEN_VALUES: &[u8] = &[0x1e, 0xff, 0xc0, 0x00, 0x00];
