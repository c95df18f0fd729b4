//! `gaps` positions: Golomb–Rice coded gaps between sorted positions, in blocks of
//! [`BLOCK`] positions that each decode on their own.
//!
//! Layout (docs/codecs.md has it byte by byte): a directory of one 7-byte entry per block
//! (`first: u32`, `bits: u16`, `k: u8`, little-endian), then one bit stream holding each
//! block's gaps in order. A block's bit offset is the sum of the `bits` of the blocks before
//! it, so threads (or a GPU) can decode all blocks at once after a prefix sum. The Rice
//! parameter is the exact best for each block's own gaps, which follows changes in density
//! along the tensor; quotients of [`ESC`] or more are escaped to the gap's plain binary, so
//! a code word never exceeds 48 bits whatever the input.
//!
//! Speed: the encoder's passes over a block's gaps run in a build for AVX2 where the CPU has
//! it (8 lanes; the length histogram then comes from counts below each power of two, with no
//! counter in memory); dense blocks (`k <= 6`) take their code words from a table of small gaps, four
//! per store; the decoder keeps the next bits in a register and refills only when fewer
//! remain than a plain code word needs.
//!
//! The files follow those roles, each importing only those before it: `format.rs` (block,
//! directory entry, code words: what a reader of docs/codecs.md needs), `x86.rs` (the
//! hand-written AVX2, BMI2 and AVX-512 kernels), `encode.rs` (the best `k` per block, exact
//! sizes, the writers), `bounds.rs` (the chooser's lower bounds, from the positions or a
//! bitmap's words) and `decode.rs`; the latter three carry their own builds for AVX2.
//!
//! [`BLOCK`]: format::BLOCK
//! [`ESC`]: format::ESC

mod bounds;
mod decode;
mod encode;
mod format;
#[cfg(test)]
mod reference;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::error::CodecError;
pub(crate) use bounds::{holes_lower_bound, lower_bound, map_bounds};
pub(crate) use encode::{directory, encode_with, holes_directory};
pub(crate) use format::min_len;

pub fn encode(rel: &[u32], range: u32, out: &mut Vec<u8>) {
    #[cfg(target_arch = "x86_64")]
    if crate::codec::bits::x86_wide() {
        // SAFETY: the function's only requirement is its target features, all of which
        // `x86_wide` detected just above on this CPU.
        return unsafe { encode::avx2::encode(rel, range, out) };
    }
    encode::encode_impl::<false>(rel, range, out)
}

pub fn decode(input: &[u8], count: u32, range: u32, out: &mut Vec<u32>) -> Result<(), CodecError> {
    decode::decode_impl::<true, true>(input, count, range, out)
}

#[cfg(test)]
mod tests {
    use super::reference::{reference_encode, round_trip, sorted_positions};
    use super::*;
    use crate::testutil::{bernoulli_positions, Rng};
    use proptest::prelude::*;

    #[test]
    fn round_trips_at_every_density() {
        let mut rng = Rng(1);
        for range in [1u32, 2, 3, 7, 8, 9, 1000, 4097, 65_537, 1 << 20] {
            for density in [0.0, 0.001, 0.01, 0.1, 0.5, 0.9, 1.0] {
                let rel = bernoulli_positions(&mut rng, range, density);
                let enc = round_trip(&rel, range);
                assert_eq!(
                    enc,
                    reference_encode(&rel, range),
                    "range {range} density {density}"
                );
            }
            round_trip(&[0], range);
            round_trip(&[range - 1], range);
            if range > 1 {
                round_trip(&[0, range - 1], range);
            }
        }
    }

    #[test]
    fn block_boundaries_and_huge_gaps() {
        let mut rng = Rng(2);
        for n in [1023usize, 1024, 1025, 2047, 2048, 2049, 3 * 1024 + 5] {
            let rel = bernoulli_positions(&mut rng, 1 << 22, n as f64 / (1 << 22) as f64);
            let enc = round_trip(&rel, 1 << 22);
            assert_eq!(enc, reference_encode(&rel, 1 << 22));
            let dense: Vec<u32> = (0..n as u32).collect();
            round_trip(&dense, n as u32 + 1);
        }
        // Largest range, escapes of 32-bit gaps, positions at both ends.
        let rel = [0, 1, 5, 1 << 31, u32::MAX - 3, u32::MAX - 1];
        assert_eq!(round_trip(&rel, u32::MAX), reference_encode(&rel, u32::MAX));
        // Dense runs separated by huge gaps in one block: the escape keeps a small k.
        let mut rel: Vec<u32> = Vec::new();
        for run in 0..8u32 {
            rel.extend((0..100).map(|i| run * 50_000_000 + i));
        }
        let enc = round_trip(&rel, u32::MAX);
        assert_eq!(enc, reference_encode(&rel, u32::MAX));
        assert_eq!(enc[6], 0, "k stays 0 with escaped jumps");
    }

    #[test]
    fn size_tracks_the_entropy_of_iid_positions() {
        let mut rng = Rng(3);
        let range = 1u32 << 20;
        for density in [0.001, 0.01, 0.05, 0.2, 0.5] {
            let rel = bernoulli_positions(&mut rng, range, density);
            let mut enc = Vec::new();
            encode(&rel, range, &mut enc);
            let p = rel.len() as f64 / range as f64;
            let bound = range as f64 * -(p * p.log2() + (1.0 - p) * (1.0 - p).log2()) / 8.0;
            let ratio = enc.len() as f64 / bound;
            println!(
                "density {density}: {} bytes, iid bound {bound:.0}, ratio {ratio:.4}",
                enc.len()
            );
            assert!(
                ratio < 1.06,
                "density {density}: {} bytes, bound {bound:.0}, ratio {ratio:.3}",
                enc.len()
            );
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn prop_round_trip((rel, range) in sorted_positions()) {
            let mut enc = Vec::new();
            encode(&rel, range, &mut enc);
            let mut dec = Vec::new();
            decode(&enc, rel.len() as u32, range, &mut dec).unwrap();
            prop_assert_eq!(&dec, &rel);
            prop_assert_eq!(enc, reference_encode(&rel, range));
        }

        #[test]
        fn prop_decoder_never_panics(input in prop::collection::vec(any::<u8>(), 0..400), range in 1u32..u32::MAX, count in any::<u32>()) {
            let count = count % (range.min(5000) + 1);
            let mut out = Vec::new();
            if decode(&input, count, range, &mut out).is_ok() {
                prop_assert_eq!(out.len(), count as usize);
                prop_assert!(out.windows(2).all(|w| w[0] < w[1]) && out.iter().all(|&p| p < range));
            }
        }

        #[test]
        fn prop_decoder_survives_damaged_sections((rel, range) in sorted_positions(), at in any::<usize>(), byte in any::<u8>()) {
            let mut enc = Vec::new();
            encode(&rel, range, &mut enc);
            if !enc.is_empty() {
                let i = at % enc.len();
                enc[i] ^= byte | 1;
            }
            let mut out = Vec::new();
            if decode(&enc, rel.len() as u32, range, &mut out).is_ok() {
                prop_assert!(out.windows(2).all(|w| w[0] < w[1]) && out.iter().all(|&p| p < range));
            }
        }
    }
}
