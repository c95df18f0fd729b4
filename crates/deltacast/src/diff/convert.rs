//! The diff of an fp32 source against a bf16 snapshot (each source element rounded to bf16 by
//! a [`Bf16Rule`]) or an FP8 one (each element quantized with its block's scale, see
//! [`crate::convert::fp8`]): the converted bits are compared with the snapshot's, so the
//! changes and the refreshed snapshot are exactly those of [`diff_and_refresh`] on the
//! converted tensor, and everything downstream (codecs, frames, digests) is unchanged.
//!
//! No converted copy of the tensor is made: the source is converted in windows of
//! [`STAGE_ELEMS`] elements into a buffer on the stack (it stays in L1), and each window is
//! diffed by the same kernel [`diff_and_refresh`] picks. The conversion loop itself is plain
//! scalar code that the compiler may vectorise; no hand-written SIMD yet. Large tensors are
//! split across the rayon pool by the same in-order driver as the plain diff.

use super::{best_impl, chunked, run_kernel, Changes, DiffImpl, PAR_CHUNK_ELEMS};
use crate::convert::fp8::{quantize_range, BlockGrid};
use crate::convert::Bf16Rule;

/// Elements converted per staging window: at most 8 KiB of output, 16 KiB of source.
const STAGE_ELEMS: usize = 4096;

/// Diffs fp32 `source` (little-endian, twice the bytes of `snapshot`) rounded to bf16 by
/// `rule` against the bf16 `snapshot`: appends every element whose bf16 bits changed to `out`
/// (positions offset by `first_index`, old and new bf16 bits) and refreshes those elements of
/// `snapshot`.
///
/// # Panics
/// If `snapshot` is not whole bf16 elements or `source` is not twice its length (a caller bug:
/// the sender checks lengths against the slot table first).
pub fn diff_f32_as_bf16(
    snapshot: &mut [u8],
    source: &[u8],
    rule: Bf16Rule,
    first_index: u64,
    out: &mut Changes,
) {
    diff_f32_as_bf16_with(best_impl(), snapshot, source, rule, first_index, out);
}

/// [`diff_f32_as_bf16`] with a forced compare kernel, for tests and benches.
///
/// # Panics
/// As [`diff_f32_as_bf16`], and if `kind` is not available on this CPU.
pub fn diff_f32_as_bf16_with(
    kind: DiffImpl,
    snapshot: &mut [u8],
    source: &[u8],
    rule: Bf16Rule,
    first_index: u64,
    out: &mut Changes,
) {
    chunked_convert(
        kind,
        snapshot,
        source,
        rule,
        first_index,
        out,
        PAR_CHUNK_ELEMS,
    );
}

/// The parallel driver with the chunk size as a parameter, so tests cross chunk boundaries.
fn chunked_convert(
    kind: DiffImpl,
    snapshot: &mut [u8],
    source: &[u8],
    rule: Bf16Rule,
    first_index: u64,
    out: &mut Changes,
    chunk_elems: usize,
) {
    assert_eq!(snapshot.len() % 2, 0, "bf16 snapshot is not whole elements");
    assert_eq!(
        source.len(),
        2 * snapshot.len(),
        "fp32 source is not twice the bf16 snapshot's size"
    );
    let convert = |at: usize, staged: &mut [u8]| {
        rule.convert_slice(&source[4 * at..4 * at + 2 * staged.len()], staged)
    };
    chunked_windows(kind, snapshot, 2, first_index, out, chunk_elems, convert);
}

/// The driver of every converting diff: the snapshot's chunks across the rayon pool (as the
/// plain diff), each converted window by window into a buffer on the stack by
/// `convert(first element, window)` and diffed by the kernel `kind` at `width`.
fn chunked_windows<C>(
    kind: DiffImpl,
    snapshot: &mut [u8],
    width: usize,
    first_index: u64,
    out: &mut Changes,
    chunk_elems: usize,
    convert: C,
) where
    C: Fn(usize, &mut [u8]) + Sync,
{
    debug_assert!(
        width <= 2,
        "the stage holds windows of 1- and 2-byte elements"
    );
    assert!(
        kind.is_available(),
        "diff kernel {kind} is not available on this CPU"
    );
    chunked(
        snapshot,
        width,
        first_index,
        out,
        chunk_elems,
        |snap, first_elem, first, part| {
            let mut stage = [0u8; 2 * STAGE_ELEMS];
            for (w, window) in snap.chunks_mut(width * STAGE_ELEMS).enumerate() {
                let staged = &mut stage[..window.len()];
                convert(first_elem + w * STAGE_ELEMS, staged);
                let at = first + (w * STAGE_ELEMS) as u64;
                run_kernel(kind, window, staged, width, at, part);
            }
        },
    );
}

/// Diffs fp32 `source` (the whole tensor of `grid`, little-endian) quantized to block FP8 with
/// the per-block factors `inv` ([`crate::convert::fp8::inverses`] of the new scales) against
/// the FP8 `snapshot`: appends every element whose FP8 bits changed to `out` (positions offset
/// by `first_index`) and refreshes those elements of `snapshot`.
///
/// # Panics
/// If `snapshot` is not `grid.elements()` bytes, `source` not four times that, or `inv` not one
/// factor per block (a caller bug: the sender checks lengths against the slot table first).
pub fn diff_f32_as_fp8(
    snapshot: &mut [u8],
    source: &[u8],
    grid: &BlockGrid,
    inv: &[f32],
    first_index: u64,
    out: &mut Changes,
) {
    let (kind, chunk) = (best_impl(), PAR_CHUNK_ELEMS);
    chunked_fp8(kind, snapshot, source, grid, inv, first_index, out, chunk);
}

/// [`diff_f32_as_fp8`] with the kernel and chunk size as parameters, for tests.
#[allow(clippy::too_many_arguments)]
fn chunked_fp8(
    kind: DiffImpl,
    snapshot: &mut [u8],
    source: &[u8],
    grid: &BlockGrid,
    inv: &[f32],
    first_index: u64,
    out: &mut Changes,
    chunk_elems: usize,
) {
    assert_eq!(
        snapshot.len(),
        grid.elements(),
        "FP8 snapshot does not match its grid"
    );
    assert_eq!(
        source.len(),
        4 * snapshot.len(),
        "fp32 source is not four times the FP8 snapshot's size"
    );
    assert_eq!(inv.len(), grid.scales(), "one factor per block");
    let convert = |at: usize, staged: &mut [u8]| quantize_range(grid, inv, source, at, staged);
    chunked_windows(kind, snapshot, 1, first_index, out, chunk_elems, convert);
}

#[cfg(test)]
mod tests {
    use super::super::{available_impls, diff_serial_with};
    use super::*;
    use crate::testutil::Rng;

    /// Interesting fp32 patterns: NaNs of both signs and several payloads, ±Inf, ±0,
    /// subnormal extremes, exact ties, max finite.
    const EDGES: [u32; 16] = [
        0x7FC0_0000,
        0xFFC0_0000,
        0x7F80_0001,
        0xFFFF_FFFF,
        0x7F80_0000,
        0xFF80_0000,
        0x0000_0000,
        0x8000_0000,
        0x0000_0001,
        0x807F_FFFF,
        0x3F80_8000,
        0x3F81_8000,
        0x0000_8000,
        0x7F7F_FFFF,
        0xFF7F_8000,
        0x3F80_7FFF,
    ];

    fn random_f32(rng: &mut Rng, n: usize) -> Vec<u32> {
        (0..n)
            .map(|_| match rng.below(4) {
                0 => EDGES[rng.below(EDGES.len() as u64) as usize],
                1 => rng.next_u64() as u32,
                _ => (rng.unit() as f32 * 2.0 - 1.0).to_bits(),
            })
            .collect()
    }

    fn le(words: &[u32]) -> Vec<u8> {
        words.iter().flat_map(|w| w.to_le_bytes()).collect()
    }

    /// The naive reference: convert the whole tensor, then the plain bf16 diff.
    fn reference(snapshot: &[u8], source: &[u8], rule: Bf16Rule, first: u64) -> (Vec<u8>, Changes) {
        let mut converted = vec![0u8; snapshot.len()];
        rule.convert_slice(source, &mut converted);
        let mut snap = snapshot.to_vec();
        let mut out = Changes::default();
        diff_serial_with(DiffImpl::Scalar, &mut snap, &converted, 2, first, &mut out);
        assert_eq!(snap, converted);
        (snap, out)
    }

    #[test]
    fn matches_convert_then_diff() {
        let mut rng = Rng(26);
        let sizes = [
            0usize, 1, 2, 3, 31, 32, 33, 63, 65, 4095, 4096, 4097, 9973, 20_011,
        ];
        for &n in &sizes {
            for rule in [Bf16Rule::TORCH_CPU, Bf16Rule::TORCH_SCALAR] {
                let old = random_f32(&mut rng, n);
                let mut snapshot = vec![0u8; 2 * n];
                rule.convert_slice(&le(&old), &mut snapshot);
                // A new source: most elements kept, some changed below bf16 precision (no
                // change on the wire), some changed for real, some NaN payloads swapped.
                let new: Vec<u32> = old
                    .iter()
                    .map(|&b| match rng.below(10) {
                        0 => b ^ 1,
                        1 => b ^ (1 << (16 + rng.below(16))),
                        2 => EDGES[rng.below(EDGES.len() as u64) as usize],
                        _ => b,
                    })
                    .collect();
                let source = le(&new);
                let (want_snap, want) = reference(&snapshot, &source, rule, 5);
                for kind in available_impls() {
                    for chunk in [1usize, 7, 33, 4096, 5000, PAR_CHUNK_ELEMS] {
                        let mut snap = snapshot.clone();
                        let mut out = Changes {
                            positions: vec![u64::MAX],
                            old_values: vec![1, 2],
                            new_values: vec![3, 4],
                        };
                        chunked_convert(kind, &mut snap, &source, rule, 5, &mut out, chunk);
                        let ctx = format!("{kind} n {n} chunk {chunk} {rule:?}");
                        assert_eq!(out.positions[0], u64::MAX, "{ctx}: prefix lost");
                        assert_eq!(&out.positions[1..], &want.positions[..], "{ctx}");
                        assert_eq!(&out.old_values[..2], &[1, 2], "{ctx}: prefix lost");
                        assert_eq!(&out.old_values[2..], &want.old_values[..], "{ctx}");
                        assert_eq!(&out.new_values[2..], &want.new_values[..], "{ctx}");
                        assert!(snap == want_snap, "{ctx}: snapshot");
                    }
                }
                // The sub-precision changes must really be invisible and the others visible:
                // the test would pass vacuously on an all-equal or all-changed draw otherwise.
                if n > 1000 {
                    assert!(
                        !want.is_empty() && want.len() < n / 2,
                        "n {n}: {}",
                        want.len()
                    );
                }
            }
        }
    }

    #[test]
    fn public_entry_uses_the_same_result() {
        let mut rng = Rng(7);
        let n = PAR_CHUNK_ELEMS + 12_345;
        let source = le(&random_f32(&mut rng, n));
        let snapshot = vec![0u8; 2 * n];
        let (want_snap, want) = reference(&snapshot, &source, Bf16Rule::TORCH_CPU, 0);
        let mut snap = snapshot;
        let mut out = Changes::default();
        diff_f32_as_bf16(&mut snap, &source, Bf16Rule::TORCH_CPU, 0, &mut out);
        assert_eq!(out, want);
        assert!(snap == want_snap);
    }

    /// FP8: quantize the whole tensor, then the plain 1-byte diff, against the windowed and
    /// chunked diff, across chunk and window boundaries and block edges.
    #[test]
    fn fp8_matches_quantize_then_diff() {
        use crate::convert::fp8::{block_scales, inverses};
        let mut rng = Rng(88);
        for shape in [
            vec![0u64, 5],
            vec![1, 1],
            vec![3, 200],
            vec![130, 129],
            vec![2, 70, 300],
        ] {
            let grid = BlockGrid::of(&shape).unwrap();
            let n = grid.elements();
            // Mostly ordinary weights (random bit patterns would put a NaN in every block),
            // a few edges.
            let old: Vec<u32> = (0..n)
                .map(|_| match rng.below(3000) {
                    0 => EDGES[rng.below(EDGES.len() as u64) as usize],
                    _ => ((rng.unit() as f32 - 0.5) * 0.02).to_bits(),
                })
                .collect();
            let mut scales = vec![];
            let mut inv = vec![];
            block_scales(&grid, &le(&old), &mut scales);
            inverses(&scales, &mut inv);
            let mut snapshot = vec![0u8; n];
            quantize_range(&grid, &inv, &le(&old), 0, &mut snapshot);
            let new: Vec<u32> = old
                .iter()
                .map(|&b| match rng.below(5000) {
                    0 => EDGES[rng.below(EDGES.len() as u64) as usize],
                    1..=2000 => b ^ (1 << rng.below(23)),
                    _ => b,
                })
                .collect();
            let source = le(&new);
            block_scales(&grid, &source, &mut scales);
            inverses(&scales, &mut inv);
            let mut converted = vec![0u8; n];
            quantize_range(&grid, &inv, &source, 0, &mut converted);
            let mut want_snap = snapshot.clone();
            let mut want = Changes::default();
            diff_serial_with(
                DiffImpl::Scalar,
                &mut want_snap,
                &converted,
                1,
                9,
                &mut want,
            );
            for kind in available_impls() {
                for chunk in [1usize, 13, 4096, 5000, PAR_CHUNK_ELEMS] {
                    let mut snap = snapshot.clone();
                    let mut out = Changes::default();
                    chunked_fp8(kind, &mut snap, &source, &grid, &inv, 9, &mut out, chunk);
                    assert_eq!(out, want, "{kind} {shape:?} chunk {chunk}");
                    assert!(
                        snap == converted,
                        "{kind} {shape:?} chunk {chunk}: snapshot"
                    );
                }
            }
            if n > 1000 {
                assert!(
                    !want.is_empty() && want.len() < n,
                    "{shape:?}: {}",
                    want.len()
                );
            }
        }
    }

    #[test]
    #[should_panic(expected = "twice")]
    fn wrong_source_length_panics() {
        let mut snap = vec![0u8; 8];
        diff_f32_as_bf16(
            &mut snap,
            &[0u8; 12],
            Bf16Rule::TORCH_CPU,
            0,
            &mut Changes::default(),
        );
    }
}
