//! `bitmap` positions: one bit per element of the range, `ceil(range / 8)` bytes, bit `i`
//! (least significant bit first within each byte) set when element `i` changed.
//!
//! Costs a fixed `range / 8` bytes whatever the count, so it wins once changes are dense
//! (around a third of the range and up) where even ideal gap codes approach 1 bit per element.

use crate::error::CodecError;

pub fn encode(rel: &[u32], range: u32, out: &mut Vec<u8>) {
    let start = out.len();
    out.resize(start + range.div_ceil(8) as usize, 0);
    let map = &mut out[start..];
    for &p in rel {
        map[(p / 8) as usize] |= 1 << (p % 8);
    }
}

pub fn decode(input: &[u8], count: u32, range: u32, out: &mut Vec<u32>) -> Result<(), CodecError> {
    out.clear();
    let needed = range.div_ceil(8) as u64;
    if (input.len() as u64) < needed {
        return Err(CodecError::Truncated {
            needed,
            available: input.len() as u64,
        });
    }
    if input.len() as u64 > needed {
        return Err(CodecError::TrailingBytes {
            count: count as u64,
            extra: input.len() as u64 - needed,
        });
    }
    let used = range % 8;
    if let (true, Some(&last)) = (used != 0, input.last()) {
        let stray = last >> used;
        if stray != 0 {
            let position = (needed - 1) * 8 + (used + stray.trailing_zeros()) as u64;
            return Err(CodecError::PositionOutOfRange {
                position,
                range: range as u64,
            });
        }
    }
    // Count first, so a wrong count fails before anything is allocated.
    let words = input.chunks_exact(8);
    let rest = words.remainder();
    let found: u64 = words.map(|w| word(w).count_ones() as u64).sum::<u64>()
        + rest.iter().map(|b| b.count_ones() as u64).sum::<u64>();
    if found != count as u64 {
        return Err(CodecError::BitmapCount {
            found,
            expected: count as u64,
        });
    }
    out.reserve(count as usize);
    for (i, chunk) in input.chunks(8).enumerate() {
        let mut bits = word(chunk);
        let base = (i * 64) as u32;
        while bits != 0 {
            out.push(base + bits.trailing_zeros());
            bits &= bits - 1;
        }
    }
    Ok(())
}

/// Up to 8 bytes as a little-endian word (missing high bytes read as zero).
#[inline(always)]
fn word(bytes: &[u8]) -> u64 {
    match bytes.first_chunk::<8>() {
        Some(full) => u64::from_le_bytes(*full),
        None => {
            let mut padded = [0u8; 8];
            padded[..bytes.len()].copy_from_slice(bytes);
            u64::from_le_bytes(padded)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::bits::testutil::{bernoulli_positions, Rng};
    use proptest::prelude::*;

    /// Independent oracle: the bitmap written bit by bit from the definition.
    fn reference(rel: &[u32], range: u32) -> Vec<u8> {
        (0..range.div_ceil(8))
            .map(|byte| {
                (0..8)
                    .filter(|bit| rel.contains(&(byte * 8 + bit)))
                    .fold(0u8, |acc, bit| acc | 1 << bit)
            })
            .collect()
    }

    fn round_trip(rel: &[u32], range: u32) -> Vec<u8> {
        let mut enc = vec![];
        encode(rel, range, &mut enc);
        assert_eq!(enc.len(), range.div_ceil(8) as usize);
        let mut dec = vec![3];
        decode(&enc, rel.len() as u32, range, &mut dec).unwrap();
        assert_eq!(dec, rel);
        enc
    }

    #[test]
    fn round_trips_at_every_density() {
        let mut rng = Rng(11);
        for range in [1u32, 2, 7, 8, 9, 63, 64, 65, 1000, 4097] {
            for density in [0.0, 0.001, 0.01, 0.1, 0.5, 1.0] {
                let rel = bernoulli_positions(&mut rng, range, density);
                assert_eq!(round_trip(&rel, range), reference(&rel, range));
            }
            round_trip(&[0], range);
            round_trip(&[range - 1], range);
        }
        let rel = bernoulli_positions(&mut rng, 1 << 20, 0.3);
        round_trip(&rel, 1 << 20);
    }

    #[test]
    fn rejects_bad_sections() {
        let rel = [0u32, 5, 9, 12];
        let mut enc = vec![];
        encode(&rel, 13, &mut enc);
        let mut out = vec![];
        assert!(decode(&enc[..1], 4, 13, &mut out).is_err());
        assert!(decode(&[enc.clone(), vec![0]].concat(), 4, 13, &mut out).is_err());
        assert_eq!(
            decode(&enc, 3, 13, &mut out),
            Err(CodecError::BitmapCount {
                found: 4,
                expected: 3
            })
        );
        let mut stray = enc.clone();
        stray[1] |= 1 << 6;
        assert_eq!(
            decode(&stray, 5, 13, &mut out),
            Err(CodecError::PositionOutOfRange {
                position: 14,
                range: 13
            })
        );
        assert!(decode(&[], 0, 0, &mut out).is_ok());
        assert!(matches!(
            decode(&[0xff; 8], u32::MAX, u32::MAX, &mut out),
            Err(CodecError::Truncated { .. })
        ));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn prop_round_trip(range in 1u32..5000, raw in prop::collection::vec(any::<u32>(), 0..2000)) {
            let mut rel: Vec<u32> = raw.iter().map(|r| r % range).collect();
            rel.sort_unstable();
            rel.dedup();
            let mut enc = vec![];
            encode(&rel, range, &mut enc);
            prop_assert_eq!(&enc, &reference(&rel, range));
            let mut dec = vec![];
            decode(&enc, rel.len() as u32, range, &mut dec).unwrap();
            prop_assert_eq!(dec, rel);
        }

        #[test]
        fn prop_decoder_never_panics(input in prop::collection::vec(any::<u8>(), 0..300), range in 0u32..3000, count in any::<u32>()) {
            let count = count % (range + 1);
            let mut out = vec![];
            if decode(&input, count, range, &mut out).is_ok() {
                prop_assert_eq!(out.len(), count as usize);
                prop_assert!(out.windows(2).all(|w| w[0] < w[1]) && out.iter().all(|&p| p < range));
            }
        }

        #[test]
        fn prop_truncated_or_flipped(range in 1u32..3000, raw in prop::collection::vec(any::<u32>(), 1..500), at in any::<usize>(), bit in 0u8..8) {
            let mut rel: Vec<u32> = raw.iter().map(|r| r % range).collect();
            rel.sort_unstable();
            rel.dedup();
            let mut enc = vec![];
            encode(&rel, range, &mut enc);
            let mut out = vec![];
            prop_assert!(decode(&enc[..at % enc.len()], rel.len() as u32, range, &mut out).is_err());
            let i = at % enc.len();
            enc[i] ^= 1 << bit;
            // One flipped bit changes the popcount or sets a bit beyond the range.
            prop_assert!(decode(&enc, rel.len() as u32, range, &mut out).is_err());
        }
    }
}
