//! The tests' independent reference encoder of `ulp` sections (from the format description,
//! not from the encoder's code), and the data the tests share.

use super::format::BLOCK;
use super::{decode, encode};
use crate::codec::bits::mask;
use crate::dtype::{from_ordered, to_ordered};
use proptest::prelude::*;

/// Independent reference encoder from the format description: i64 arithmetic, one bool
/// per bit, and every `(k, c)` tried by actually encoding the block.
pub(super) fn reference_encode(width: usize, old: &[u8], new: &[u8]) -> Vec<u8> {
    let nb = 8 * width as u32;
    let modulus = 1i64 << nb;
    let read = |bytes: &[u8], i: usize| {
        let mut v = 0u32;
        for j in 0..width {
            v |= (bytes[i * width + j] as u32) << (8 * j);
        }
        v
    };
    let ord = |bits: u32| -> i64 {
        let sign = 1i64 << (nb - 1);
        let b = bits as i64;
        if b & sign != 0 {
            modulus - 1 - b
        } else {
            b + sign
        }
    };
    let push = |bits: &mut Vec<bool>, v: u64, len: u32| {
        for i in 0..len {
            bits.push((v >> i) & 1 == 1);
        }
    };
    let n = new.len() / width;
    let mut dir = Vec::new();
    let mut stream: Vec<bool> = Vec::new();
    for start in (0..n).step_by(BLOCK) {
        let mut best: Option<(Vec<bool>, u32, u32)> = None;
        for c in 0..=nb + 1 {
            for k in 0..nb {
                let mut bits = Vec::new();
                for i in start..n.min(start + BLOCK) {
                    let mut d = (ord(read(new, i)) - ord(read(old, i))).rem_euclid(modulus);
                    if d >= modulus / 2 {
                        d -= modulus;
                    }
                    let raw = |bits: &mut Vec<bool>| {
                        bits.extend(std::iter::repeat_n(false, c as usize));
                        push(bits, read(new, i) as u64, nb);
                    };
                    if d == 0 || c == 0 {
                        raw(&mut bits);
                        continue;
                    }
                    let u = (2 * (d.abs() - 1) + (d < 0) as i64) as u64;
                    let l = 64 - u.leading_zeros();
                    if l <= k {
                        bits.push(true);
                        push(&mut bits, u, k);
                    } else if l - k < c {
                        bits.extend(std::iter::repeat_n(false, (l - k) as usize));
                        bits.push(true);
                        push(&mut bits, u, l - 1);
                    } else {
                        raw(&mut bits);
                    }
                }
                // Order of preference on ties: all-raw, then smaller k, then smaller c.
                let key = |b: &Vec<bool>, k: u32, c: u32| (b.len(), c != 0, k, c);
                if best
                    .as_ref()
                    .is_none_or(|(b, bk, bc)| key(&bits, k, c) < key(b, *bk, *bc))
                {
                    best = Some((bits, k, c));
                }
                if c == 0 {
                    break; // k does not matter when everything is raw
                }
            }
        }
        let (bits, k, c) = best.unwrap();
        dir.extend_from_slice(&(bits.len() as u16).to_le_bytes());
        dir.push(k as u8);
        dir.push(c as u8);
        stream.extend(bits);
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

pub(super) fn round_trip(width: usize, old: &[u8], new: &[u8]) -> Vec<u8> {
    let mut enc = Vec::new();
    encode(width, old, new, &mut enc);
    let mut dec = vec![1, 2, 3];
    decode(width, &enc, old, &mut dec).unwrap();
    assert_eq!(dec, new, "width {width}");
    enc
}

pub(super) fn patterns(width: usize, values: &[u32]) -> Vec<u8> {
    values
        .iter()
        .flat_map(|v| v.to_le_bytes()[..width].to_vec())
        .collect()
}

/// Bit patterns that matter per width: ±0, ±smallest subnormal, ±1.0, ±largest finite,
/// ±inf, quiet and signalling NaNs with payloads, and the extremes of the ordered view.
pub(super) fn specials(width: usize) -> Vec<u32> {
    match width {
        1 => vec![
            0x00, 0x80, 0x01, 0x81, 0x38, 0xb8, 0x7e, 0xfe, 0x7f, 0xff, 0x7c, 0xfc, 0x7d, 0x40,
        ],
        2 => vec![
            0x0000, 0x8000, 0x0001, 0x8001, 0x3f80, 0xbf80, 0x7f7f, 0xff7f, 0x7f80, 0xff80, 0x7fc0,
            0xffc0, 0x7f81, 0xff81, 0x7fff, 0xffff, 0x007f, 0x0080,
        ],
        _ => vec![
            0x0000_0000,
            0x8000_0000,
            0x0000_0001,
            0x8000_0001,
            0x3f80_0000,
            0xbf80_0000,
            0x7f7f_ffff,
            0xff7f_ffff,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0000,
            0xffc0_0000,
            0x7f80_0001,
            0xffc0_1234,
            0x7fff_ffff,
            0xffff_ffff,
            0x007f_ffff,
            0x0080_0000,
        ],
    }
}

pub(super) fn value_pairs() -> impl Strategy<Value = (usize, Vec<u8>, Vec<u8>)> {
    (
        prop::sample::select(vec![1usize, 2, 4]),
        prop::collection::vec((any::<u32>(), any::<i32>(), 0u8..4), 0..1500),
    )
        .prop_map(|(width, items)| {
            let nb = 8 * width as u32;
            let (mut old, mut new) = (Vec::new(), Vec::new());
            for (a, s, kind) in items {
                let a = a & mask(nb) as u32;
                let step = match kind {
                    0 => (s % 3) as i64,
                    1 => (s >> (s as u32 & 31)) as i64,
                    2 => (s % 300) as i64,
                    _ => s as i64,
                };
                let b = from_ordered(
                    (to_ordered(a, width) as i64 + step).rem_euclid(1 << nb) as u32,
                    width,
                );
                old.extend_from_slice(&a.to_le_bytes()[..width]);
                new.extend_from_slice(&b.to_le_bytes()[..width]);
            }
            (width, old, new)
        })
}
