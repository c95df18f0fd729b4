//! `ulp` values: the signed step `d = ord(new) - ord(old)` (wrapping in the element's bits)
//! in the ordered-integer view of the bit patterns, entropy coded in blocks of [`BLOCK`]
//! values that each decode on their own.
//!
//! The ordered view is a bijection, so this is exact for every pattern (NaN payloads, ±0,
//! infinities, subnormals) and the decoder never does float arithmetic. Each step becomes a
//! code number `u = 2·(|d| − 1) + sign` (the sign is the low bit, so +1 → 0, −1 → 1, +2 → 2,
//! …), coded with a per-block parameter `k`:
//!
//! - `u < 2^k`: a one bit, then `u` in `k` bits;
//! - else, with `L` the bit length of `u` and `z = L − k`: `z` zero bits, a one, then the
//!   `L − 1` bits of `u` below its leading one (an Elias-gamma code of `L` above `k`);
//! - `z` of `c` or more (a per-block cap), `d = 0` (unchanged, only for callers that send
//!   it), or `c = 0`: `c` zero bits, then the new bit pattern itself.
//!
//! With `k = 0` this spends 1 bit on +1 and 2 on −1 (the ~87% case on real AdamW traces:
//! crates/deltacast/tests/data/traces/README.md), a few bits on small steps, and grows only
//! logarithmically for the jumps of weights near zero; the raw escape caps the cost of sign
//! crossings and other huge steps. Block bits for every `(k, c)` follow exactly from a
//! histogram of bit lengths, so the encoder picks the exact smallest pair per block in one
//! pass. On the recorded trace it comes a little above the steps' empirical entropy and well
//! below sign + Rice of |d|−1 (docs/codecs.md, "ulp").
//!
//! Speed: the encoder computes a block's code numbers in a vectorized loop (16-bit lanes
//! for narrow elements), takes their length histogram from vectorized counts below each
//! power of two (narrow elements; in a build for AVX2 where the CPU has it, in byte lanes
//! 32 at a time, 2-byte ones by bit planes 64 at a time where it has GFNI; 4-byte elements
//! count small code numbers by value), and writes the code
//! words: in the AVX2 build of narrow elements computed in vector lanes and joined eight to
//! a store (at k = 0 all in registers, sixteen values at a time where the CPU has
//! AVX-512), otherwise
//! those of code numbers below 1024 (~99% of AdamW steps) from a table, three per store. The
//! decoder of narrow elements reads up to eight code words per lookup in a table of the next
//! 12 stream bits, two lookups and then one code word of any kind by arithmetic per step
//! (no branch on the data: long and raw words cost no misprediction on fresh data), two
//! blocks in turn, keeping code numbers (the loop is bound by ALU operations, so lengths
//! come from loads and the steps from the vectorized loop that then applies them to the
//! old bits); 4-byte elements decode one value at a time.
//!
//! The files follow those roles, each importing only those before it: `format.rs` (block,
//! directory entry, code numbers and code words: what a reader of docs/codecs.md needs),
//! `codes.rs` (code numbers as the encoder holds them, and their length histogram), `x86.rs`
//! (the hand-written AVX2 and AVX-512 encoder kernels), `encode.rs` (parameter choice, the
//! portable writers, the builds for AVX2 and AVX-512) and `decode/` (its table lookups in
//! `lookup.rs`, branch-free steps in `fast.rs`).
//!
//! [`BLOCK`]: format::BLOCK

mod codes;
mod decode;
mod encode;
mod format;
#[cfg(test)]
mod reference;
#[cfg(target_arch = "x86_64")]
mod x86;

use crate::error::CodecError;
use decode::{decode_width, FAST};
use encode::encode_width;
pub(crate) use format::min_len;

pub fn encode(width: usize, old: &[u8], new: &[u8], out: &mut Vec<u8>) {
    match width {
        1 => encode_width::<1>(old, new, out),
        2 => encode_width::<2>(old, new, out),
        4 => encode_width::<4>(old, new, out),
        _ => panic!("ulp: element width {width} is not 1, 2 or 4 bytes"),
    }
}

pub fn decode(width: usize, input: &[u8], old: &[u8], out: &mut Vec<u8>) -> Result<(), CodecError> {
    match width {
        1 => decode_width::<1, FAST>(input, old, out),
        2 => decode_width::<2, FAST>(input, old, out),
        4 => decode_width::<4, FAST>(input, old, out),
        _ => Err(CodecError::Unsupported {
            codec: "ulp",
            what: "elements of this width",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::reference::{patterns, reference_encode, round_trip, specials, value_pairs};
    use super::*;
    use crate::codec::bits::mask;
    use crate::dtype::{from_ordered, to_ordered};
    use crate::testutil::{adamw_bf16, adamw_step, Rng};
    use proptest::prelude::*;

    #[test]
    fn every_pair_of_fp8_patterns() {
        let (old, new): (Vec<u32>, Vec<u32>) = (0..256u32)
            .flat_map(|a| (0..256u32).map(move |b| (a, b)))
            .unzip();
        let (old, new) = (patterns(1, &old), patterns(1, &new));
        round_trip(1, &old, &new);
        let sample = 3000;
        assert_eq!(
            round_trip(1, &old[..sample], &new[..sample]),
            reference_encode(1, &old[..sample], &new[..sample])
        );
    }

    #[test]
    fn special_patterns_of_every_width() {
        for width in [1usize, 2, 4] {
            let nb = 8 * width as u32;
            let sp = specials(width);
            let (mut old, mut new) = (Vec::new(), Vec::new());
            for &a in &sp {
                for &b in &sp {
                    old.push(a);
                    new.push(b);
                }
            }
            // Maximal wrap-around distances: ord 0 ↔ ord 2^(nb-1) and ord 0 → ord 2^(nb-1) - 1.
            let half = 1u32 << (nb - 1);
            for (a, b) in [
                (0, half),
                (half, 0),
                (0, half - 1),
                (half - 1, 0),
                (half + 1, 0),
                (0, half + 1),
            ] {
                old.push(from_ordered(a, width));
                new.push(from_ordered(b, width));
            }
            let (old, new) = (patterns(width, &old), patterns(width, &new));
            assert_eq!(
                round_trip(width, &old, &new),
                reference_encode(width, &old, &new),
                "width {width}"
            );
            // All unchanged (d = 0 everywhere) and a single value.
            assert_eq!(
                round_trip(width, &old, &old),
                reference_encode(width, &old, &old)
            );
            round_trip(width, &old[..width], &new[..width]);
        }
    }

    #[test]
    fn random_steps_of_every_width() {
        let mut rng = Rng(21);
        for width in [1usize, 2, 4] {
            let nb = 8 * width as u32;
            for n in [0usize, 1, 2, 1023, 1024, 1025, 2100] {
                let (mut old, mut new) = (Vec::new(), Vec::new());
                for i in 0..n {
                    let a = rng.next_u64() as u32 & mask(nb) as u32;
                    let step = match i % 4 {
                        0 => adamw_step(&mut rng),
                        1 => (rng.next_u64() as i64) >> (64 - nb + rng.below(nb as u64) as u32),
                        2 => rng.below(5) as i64 - 2,
                        _ => (rng.next_u64() as i64) >> (64 - nb),
                    };
                    let b = (to_ordered(a, width) as i64 + step).rem_euclid(1 << nb) as u32;
                    old.push(a);
                    new.push(from_ordered(b, width));
                }
                let (old, new) = (patterns(width, &old), patterns(width, &new));
                let enc = round_trip(width, &old, &new);
                if width < 4 || n <= 1025 {
                    assert_eq!(
                        enc,
                        reference_encode(width, &old, &new),
                        "width {width}, {n} values"
                    );
                }
            }
        }
    }

    #[test]
    fn adamw_like_steps_cost_about_two_bits() {
        let mut rng = Rng(22);
        let (old, new) = adamw_bf16(&mut rng, 1 << 16);
        let enc = round_trip(2, &old, &new);
        let bits = enc.len() as f64 * 8.0 / (1 << 16) as f64;
        assert!(bits < 3.0, "{bits:.3} bits per value");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]

        #[test]
        fn prop_round_trip((width, old, new) in value_pairs()) {
            let mut enc = Vec::new();
            encode(width, &old, &new, &mut enc);
            let mut dec = Vec::new();
            decode(width, &enc, &old, &mut dec).unwrap();
            prop_assert_eq!(&dec, &new);
            if width < 4 || old.len() <= 400 * width {
                prop_assert_eq!(enc, reference_encode(width, &old, &new));
            }
        }

        #[test]
        fn prop_decoder_never_panics(width in prop::sample::select(vec![1usize, 2, 3, 4]), input in prop::collection::vec(any::<u8>(), 0..400), old in prop::collection::vec(any::<u8>(), 0..2000)) {
            let mut out = Vec::new();
            if decode(width, &input, &old, &mut out).is_ok() {
                prop_assert_eq!(out.len(), old.len() / width * width);
            }
        }

        #[test]
        fn prop_decoder_survives_damaged_sections((width, old, new) in value_pairs(), at in any::<usize>(), byte in any::<u8>()) {
            let mut enc = Vec::new();
            encode(width, &old, &new, &mut enc);
            if !enc.is_empty() {
                let i = at % enc.len();
                enc[i] ^= byte | 1;
                let mut out = Vec::new();
                if decode(width, &enc, &old, &mut out).is_ok() {
                    prop_assert_eq!(out.len(), new.len());
                }
            }
        }
    }
}
