//! Every kernel, serial and chunked, against a naive oracle.
//!
//! "Writes only changed elements" cannot be observed from safe code (storing an equal value is
//! invisible), so it is guaranteed by construction instead: every kernel stores into the
//! snapshot only inside its changed branch (the scalar loops) or through a masked store whose
//! mask is exactly the changed lanes (AVX-512). The tests check the observable half: the
//! snapshot equals `current` afterwards and the reported changes are exactly the differing
//! elements, in order, with their old and new bits.

use proptest::prelude::*;

use super::*;
use crate::testutil::Rng;

/// The oracle: zip the elements, compare bits as integers.
fn oracle(snapshot: &[u8], current: &[u8], width: usize, first_index: u64) -> Changes {
    let mut out = Changes::default();
    for (i, (s, c)) in snapshot
        .chunks_exact(width)
        .zip(current.chunks_exact(width))
        .enumerate()
    {
        if s != c {
            out.positions.push(first_index + i as u64);
            out.old_values.extend_from_slice(s);
            out.new_values.extend_from_slice(c);
        }
    }
    out
}

/// Sets element `i` of `buf` to `bits`.
fn set(buf: &mut [u8], width: usize, i: usize, bits: u32) {
    buf[i * width..(i + 1) * width].copy_from_slice(&bits.to_le_bytes()[..width]);
}

/// Flips at least one bit of element `i`, so it is a real change.
fn mutate(buf: &mut [u8], width: usize, i: usize, rng: &mut Rng) {
    let at = i * width;
    let flip = (rng.next_u64() as u32 | 1) << (rng.next_u64() % (8 * width as u64));
    let flip = if flip.to_le_bytes()[..width].iter().all(|&b| b == 0) {
        1
    } else {
        flip
    };
    for (b, f) in buf[at..at + width].iter_mut().zip(flip.to_le_bytes()) {
        *b ^= f;
    }
}

/// Runs every kernel, serially and through the chunked driver with several chunk sizes, on a
/// copy of `snapshot`, and compares each result (changes and refreshed snapshot) with the oracle.
fn check_all(snapshot: &[u8], current: &[u8], width: usize, first_index: u64) {
    let want = oracle(snapshot, current, width, first_index);
    let n = current.len() / width;
    for kind in available_impls() {
        let mut runs: Vec<(String, Option<usize>)> = vec![("serial".into(), None)];
        // Chunk sizes that are not multiples of a block, one that is, and the real one.
        for chunk in [1usize, 7, 33, 64 / width + 1, 4096 / width, PAR_CHUNK_ELEMS] {
            if chunk < n || chunk == PAR_CHUNK_ELEMS {
                runs.push((format!("chunk {chunk}"), Some(chunk)));
            }
        }
        for (label, chunk) in runs {
            let mut snap = snapshot.to_vec();
            // Pre-existing entries must be kept: the API appends.
            let mut out = Changes {
                positions: vec![u64::MAX],
                old_values: vec![7; width],
                new_values: vec![9; width],
            };
            match chunk {
                None => diff_serial_with(kind, &mut snap, current, width, first_index, &mut out),
                Some(c) => diff_chunked(kind, &mut snap, current, width, first_index, &mut out, c),
            }
            let ctx = format!("{kind} {label} width {width} len {n} first {first_index}");
            assert_eq!(out.positions[0], u64::MAX, "{ctx}: prefix lost");
            assert_eq!(
                &out.old_values[..width],
                &vec![7; width][..],
                "{ctx}: prefix lost"
            );
            assert_eq!(
                &out.new_values[..width],
                &vec![9; width][..],
                "{ctx}: prefix lost"
            );
            assert_eq!(&out.positions[1..], &want.positions[..], "{ctx}: positions");
            assert_eq!(
                &out.old_values[width..],
                &want.old_values[..],
                "{ctx}: old values"
            );
            assert_eq!(
                &out.new_values[width..],
                &want.new_values[..],
                "{ctx}: new values"
            );
            assert!(snap == current, "{ctx}: snapshot not refreshed");
        }
    }
}

const SIZES: [usize; 19] = [
    0, 1, 2, 3, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 128, 129, 1000, 4097, 9973,
];
const DENSITIES: [f64; 5] = [0.0, 0.001, 0.01, 0.1, 1.0];

#[test]
fn every_kernel_matches_the_oracle_on_random_buffers() {
    let mut rng = Rng(1);
    for width in [1usize, 2, 4] {
        for n in SIZES {
            for density in DENSITIES {
                let snapshot = rng.bytes(n * width);
                let mut current = snapshot.clone();
                for i in 0..n {
                    if rng.chance(density) {
                        mutate(&mut current, width, i, &mut rng);
                    }
                }
                check_all(&snapshot, &current, width, 0);
                check_all(&snapshot, &current, width, 1 << 40);
            }
        }
    }
}

#[test]
fn changes_at_edges_and_block_boundaries() {
    let mut rng = Rng(2);
    for width in [1usize, 2, 4] {
        for n in [1usize, 2, 63, 64, 65, 200, 1031] {
            let per_block = 64 / width;
            let mut spots: Vec<usize> = vec![0, n - 1];
            for b in (0..n).step_by(per_block) {
                spots.extend([b, b.saturating_sub(1), (b + per_block - 1).min(n - 1)]);
            }
            for &spot in &spots {
                let snapshot = rng.bytes(n * width);
                let mut current = snapshot.clone();
                mutate(&mut current, width, spot, &mut rng);
                check_all(&snapshot, &current, width, 5);
            }
            // All of them at once, and every element changed.
            let snapshot = rng.bytes(n * width);
            let mut current = snapshot.clone();
            for &spot in &spots {
                set(
                    &mut current,
                    width,
                    spot,
                    !load_elem(&snapshot, width, spot),
                );
            }
            check_all(&snapshot, &current, width, 0);
            let all: Vec<u8> = snapshot.iter().map(|b| !b).collect();
            check_all(&snapshot, &all, width, 0);
        }
    }
}

fn load_elem(buf: &[u8], width: usize, i: usize) -> u32 {
    let mut b = [0u8; 4];
    b[..width].copy_from_slice(&buf[i * width..(i + 1) * width]);
    u32::from_le_bytes(b)
}

/// Patterns a float compare would get wrong: NaN payloads (NaN ≠ NaN as floats, so every NaN
/// would look changed; different payloads must be seen as different), ±0 (equal as floats),
/// subnormals (flushed to zero under some float modes).
#[test]
fn float_edge_patterns_are_compared_as_bits() {
    let cases: &[(usize, u32, u32)] = &[
        (2, 0x7fc1, 0x7fc2), // BF16 quiet NaN, payload change
        (2, 0x0000, 0x8000), // +0 → −0
        (2, 0x8000, 0x0000), // −0 → +0
        (2, 0x0001, 0x0002), // subnormals
        (2, 0x7fc1, 0x7fc1), // identical NaN: no change
        (4, 0x7fc0_0001, 0x7fc0_0002),
        (4, 0x0000_0000, 0x8000_0000),
        (4, 0x0000_0001, 0x8000_0001),
        (4, 0x7f80_0001, 0x7f80_0001),
        (1, 0x7f, 0xff), // FP8 E4M3 NaN with either sign
        (1, 0x00, 0x80),
        (1, 0x01, 0x02),
    ];
    for &(width, old, new) in cases {
        for n in [1usize, 64 / width, 3 * 64 / width + 5] {
            for spot in [0, n / 2, n - 1] {
                let mut snapshot = vec![0u8; n * width];
                let mut current = vec![0u8; n * width];
                for i in 0..n {
                    set(&mut snapshot, width, i, old);
                    set(&mut current, width, i, old);
                }
                set(&mut current, width, spot, new);
                check_all(&snapshot, &current, width, 0);
                let want = usize::from(old != new);
                let mut snap = snapshot.clone();
                let mut out = Changes::default();
                diff_serial(&mut snap, &current, width, 0, &mut out);
                assert_eq!(out.len(), want, "width {width} {old:#x}→{new:#x}");
            }
        }
    }
}

#[test]
fn buffers_over_the_real_parallel_threshold() {
    let mut rng = Rng(3);
    for width in [1usize, 2, 4] {
        let n = PAR_CHUNK_ELEMS * 2 + 77;
        let snapshot = rng.bytes(n * width);
        let mut current = snapshot.clone();
        // Changes on both sides of each chunk boundary, plus a sprinkle.
        for b in [
            0,
            PAR_CHUNK_ELEMS - 1,
            PAR_CHUNK_ELEMS,
            2 * PAR_CHUNK_ELEMS - 1,
            2 * PAR_CHUNK_ELEMS,
            n - 1,
        ] {
            mutate(&mut current, width, b, &mut rng);
        }
        for _ in 0..5000 {
            let i = (rng.next_u64() % n as u64) as usize;
            mutate(&mut current, width, i, &mut rng);
        }
        let want = oracle(&snapshot, &current, width, 3);
        for kind in available_impls() {
            let mut snap = snapshot.clone();
            let mut out = Changes::default();
            diff_and_refresh_with(kind, &mut snap, &current, width, 3, &mut out);
            assert!(out == want, "{kind} width {width}");
            assert!(snap == current, "{kind} width {width}: snapshot");
        }
        let mut snap = snapshot.clone();
        let mut out = Changes::default();
        diff_and_refresh(&mut snap, &current, width, 3, &mut out);
        assert!(
            out == want && snap == current,
            "default kernel width {width}"
        );
    }
}

/// More workers than cores, tiny chunks and uneven work per chunk: chunks finish out of order,
/// so the parallel driver's parking path (a chunk done before an earlier one) runs too.
#[test]
fn chunks_finishing_out_of_order_are_committed_in_order() {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(8)
        .build()
        .expect("thread pool");
    let mut rng = Rng(5);
    for width in [1usize, 2, 4] {
        let n = 50_000;
        let snapshot = rng.bytes(n * width);
        let mut current = snapshot.clone();
        for i in 0..n {
            // Bands of dense and empty regions, so chunk run times differ.
            let density = if (i / 3000) % 3 == 0 { 0.5 } else { 0.001 };
            if rng.chance(density) {
                mutate(&mut current, width, i, &mut rng);
            }
        }
        let want = oracle(&snapshot, &current, width, 11);
        pool.install(|| {
            for kind in available_impls() {
                for chunk in [5usize, 64, 1000] {
                    for _ in 0..4 {
                        let mut snap = snapshot.clone();
                        let mut out = Changes::default();
                        diff_chunked(kind, &mut snap, &current, width, 11, &mut out, chunk);
                        assert!(out == want, "{kind} width {width} chunk {chunk}");
                        assert!(
                            snap == current,
                            "{kind} width {width} chunk {chunk}: snapshot"
                        );
                    }
                }
            }
        });
    }
}

#[test]
fn second_diff_after_refresh_is_empty() {
    let mut rng = Rng(4);
    let snapshot = rng.bytes(10_000);
    let mut current = snapshot.clone();
    for i in (0..5000).step_by(13) {
        mutate(&mut current, 2, i, &mut rng);
    }
    for kind in available_impls() {
        let mut snap = snapshot.clone();
        let mut out = Changes::default();
        diff_serial_with(kind, &mut snap, &current, 2, 0, &mut out);
        assert!(!out.is_empty());
        out.clear();
        diff_serial_with(kind, &mut snap, &current, 2, 0, &mut out);
        assert!(out.is_empty(), "{kind}");
    }
}

#[test]
fn detection_is_consistent() {
    let impls = available_impls();
    assert_eq!(impls[0], DiffImpl::Scalar);
    assert!(impls.contains(&best_impl()));
    for kind in DiffImpl::ALL {
        assert_eq!(kind.is_available(), impls.contains(&kind));
    }
}

#[test]
#[should_panic(expected = "differ in length")]
fn length_mismatch_panics() {
    diff_serial(&mut [0u8; 4], &[0u8; 6], 2, 0, &mut Changes::default());
}

#[test]
#[should_panic(expected = "whole elements")]
fn partial_element_panics() {
    diff_serial(&mut [0u8; 3], &[0u8; 3], 2, 0, &mut Changes::default());
}

#[test]
#[should_panic(expected = "unsupported element width")]
fn bad_width_panics() {
    diff_serial(&mut [0u8; 6], &[0u8; 6], 3, 0, &mut Changes::default());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

    #[test]
    fn kernels_agree_with_the_oracle(
        width in prop::sample::select(vec![1usize, 2, 4]),
        snapshot in prop::collection::vec(any::<u8>(), 0..1200),
        edits in prop::collection::vec((any::<prop::sample::Index>(), 1u32..), 0..200),
        first_index in 0u64..(1 << 50),
    ) {
        let n = snapshot.len() / width;
        let snapshot = snapshot[..n * width].to_vec();
        let mut current = snapshot.clone();
        if n > 0 {
            for (i, flip) in edits {
                let i = i.index(n);
                let at = i * width;
                for (b, f) in current[at..at + width].iter_mut().zip(flip.to_le_bytes()) {
                    *b ^= f;
                }
            }
        }
        check_all(&snapshot, &current, width, first_index);
    }
}
