//! The map diffs (`Gpu::diff_map`: steps + esc, and bitmap + raw) against their codes written
//! out from the spec here (docs/codecs.md).
//!
//! Built without the `cuda` feature, every test is `ignored` with its reason; built with
//! it, a missing GPU fails the test (`scripts/gpu-tests.sh`).

mod kernel_cases;

use deltacast::digest::{change, slot_salt};
use deltacast::dtype::{load_bits, to_ordered};
use deltacast::Bf16Rule;
use deltacast_cuda::{map_layout, DiffInput, Gpu, MapCode, MapOutput};
use deltacast_testkit::Rng;
use kernel_cases::*;

/// The code of one element from its spec: 0 unchanged, 1 one step up, 2 one step down in
/// the ordered-integer view modulo 2^nb, 3 any other change (escaped); in a bitmap, every
/// change is 3 (its map bit set, its bits among the raw values).
fn code(map: MapCode, old: u32, new: u32, width: usize) -> u8 {
    if old == new {
        return 0;
    }
    if map == MapCode::Bitmap {
        return 3;
    }
    let d = to_ordered(new, width).wrapping_sub(to_ordered(old, width)) & mask(width);
    if d == 1 {
        1
    } else if d == mask(width) {
        2
    } else {
        3
    }
}

struct Case {
    numel: usize,
    width: usize,
    density: f64,
    /// Not 16-byte aligned (the byte path).
    misalign: bool,
    /// An fp32 source for a bf16 snapshot.
    f32_source: bool,
}

/// One map diff in `map_code` over `cases` with room for `capacity_frac` of the escapes;
/// checks every map byte, escape, cell count, the refreshed snapshot and the digest words.
fn run(
    gpu: &Gpu,
    rng: &mut Rng,
    map_code: MapCode,
    cases: &[Case],
    cell_elems: u64,
    capacity_frac: f64,
) {
    let rule = Bf16Rule::default();
    let (mut olds, mut srcs, mut news, mut offsets) = (vec![], vec![], vec![], vec![]);
    let (mut snap_total, mut cur_total) = (0usize, 0usize);
    for c in cases {
        let width = if c.f32_source { 2 } else { c.width };
        let old = fill_old(rng, c.numel, width);
        let (src, new) = if c.f32_source {
            // fp32 near the old bf16 values (a bf16 widened, then nudged in its low half).
            let src: Vec<u8> = (0..c.numel)
                .flat_map(|i| {
                    let o = load_bits(&old, 2, i) << 16;
                    let bits = if rng.chance(c.density) {
                        o.wrapping_add(rng.below(0x3_0000) as u32)
                    } else {
                        o | (rng.below(0x7fff) as u32)
                    };
                    bits.to_le_bytes()
                })
                .collect();
            let mut new = vec![0u8; 2 * c.numel];
            rule.convert_slice(&src, &mut new);
            (src, new)
        } else {
            let new = mutate(rng, &old, width, c.density);
            (new.clone(), new)
        };
        let shift = if c.misalign { width } else { 0 };
        snap_total = snap_total.next_multiple_of(256) + shift;
        cur_total = cur_total.next_multiple_of(256) + if c.f32_source { 0 } else { shift };
        offsets.push((snap_total, cur_total));
        snap_total += old.len();
        cur_total += src.len();
        olds.push(old);
        srcs.push(src);
        news.push(new);
    }
    let mut snap_host = vec![0u8; snap_total];
    let mut cur_host = vec![0u8; cur_total];
    for (k, &(so, co)) in offsets.iter().enumerate() {
        snap_host[so..so + olds[k].len()].copy_from_slice(&olds[k]);
        cur_host[co..co + srcs[k].len()].copy_from_slice(&srcs[k]);
    }
    let snap = gpu.upload(&snap_host).unwrap();
    let cur = gpu.upload(&cur_host).unwrap();
    let digests = gpu.alloc_zeroed(8 * cases.len().max(1)).unwrap();
    let inputs: Vec<DiffInput> = cases
        .iter()
        .enumerate()
        .map(|(i, c)| DiffInput {
            snapshot: snap.ptr() + offsets[i].0 as u64,
            current: cur.ptr() + offsets[i].1 as u64,
            numel: c.numel as u64,
            width: if c.f32_source { 2 } else { c.width },
            first_index: 0,
            digest: Some((digests.ptr() + 8 * i as u64, i as u32)),
            f32_source: c.f32_source.then_some(rule),
        })
        .collect();
    // The reference: codes, escapes, digest changes.
    let mut want_codes: Vec<Vec<u8>> = Vec::new();
    let mut want_escapes: Vec<Vec<u8>> = Vec::new();
    let mut want_digest = Vec::new();
    for (k, inp) in inputs.iter().enumerate() {
        let w = inp.width;
        let salt = slot_salt(k as u32);
        let (mut codes, mut esc, mut d) = (vec![], vec![], 0u64);
        for i in 0..inp.numel as usize {
            let (o, n) = (load_bits(&olds[k], w, i), load_bits(&news[k], w, i));
            let c = code(map_code, o, n, w);
            codes.push(c);
            if c == 3 {
                esc.extend_from_slice(&n.to_le_bytes()[..w]);
            }
            if c != 0 {
                d = d.wrapping_add(change(salt, i as u64, o, n));
            }
        }
        want_codes.push(codes);
        want_escapes.push(esc);
        want_digest.push(d);
    }
    let total_escapes: usize = want_escapes
        .iter()
        .zip(&inputs)
        .map(|(e, i)| e.len() / i.width)
        .sum();
    let capacity = ((total_escapes as f64 * capacity_frac) as u64).max(1);
    let (map_offsets, map_len) = map_layout(&inputs, map_code);
    let map = gpu.alloc(map_len.max(4) as usize).unwrap();
    let escapes = gpu.alloc((capacity * 4) as usize).unwrap();
    let out = MapOutput {
        code: map_code,
        map: map.ptr(),
        escapes: escapes.ptr(),
        capacity,
        cell_elems,
    };
    // SAFETY: every pointer is inside the buffers above.
    let res = unsafe { gpu.diff_map(&inputs, &out) }.unwrap();
    assert_eq!(res.code, map_code);
    assert_eq!(res.escapes as usize, total_escapes);
    let g_map = dl(gpu, map.ptr(), map_len as usize);
    let g_esc = dl(gpu, escapes.ptr(), (capacity * 4) as usize);
    let g_snap = dl(gpu, snap.ptr(), snap_total);
    let g_dig = u64s(&dl(gpu, digests.ptr(), 8 * cases.len().max(1)));
    for (k, inp) in inputs.iter().enumerate() {
        let w = inp.width;
        let what = format!(
            "{map_code:?} tensor {k} (numel {}, width {w}, density {}, misaligned {}, fp32 {})",
            inp.numel, cases[k].density, cases[k].misalign, cases[k].f32_source
        );
        // The snapshot is current, whatever the capacity.
        let so = offsets[k].0;
        assert_eq!(
            &g_snap[so..so + news[k].len()],
            &news[k][..],
            "{what}: snapshot"
        );
        let r = &res.tensors[k];
        assert_eq!(r.map_offset, map_offsets[k], "{what}");
        let changes = want_codes[k].iter().filter(|&&c| c != 0).count();
        assert_eq!(r.changes as usize, changes, "{what}: changes");
        let bits = map_code.bits() as usize;
        for (i, &c) in want_codes[k].iter().enumerate() {
            let byte = g_map[r.map_offset as usize + i * bits / 8];
            let got = (byte >> (bits * i % 8)) & ((1 << bits) - 1);
            let want = if map_code == MapCode::Bitmap {
                u8::from(c != 0)
            } else {
                c
            };
            assert_eq!(got, want, "{what}: code of element {i}");
        }
        // Past the last element, up to the end of its map byte: zero (a bitmap section's
        // last byte has no bit set past its range).
        let end = inp.numel as usize * bits;
        if !end.is_multiple_of(8) {
            let byte = g_map[r.map_offset as usize + end / 8];
            assert_eq!(byte >> (end % 8), 0, "{what}: bits past the end");
        }
        // Per cell: its changes and escapes.
        assert_eq!(
            r.cells.len() as u64,
            inp.numel.div_ceil(res.cell_elems),
            "{what}"
        );
        for (ci, cell) in r.cells.iter().enumerate() {
            let lo = ci * res.cell_elems as usize;
            let hi = (lo + res.cell_elems as usize).min(inp.numel as usize);
            let codes = &want_codes[k][lo..hi];
            assert_eq!(
                cell.changes as usize,
                codes.iter().filter(|&&c| c != 0).count()
            );
            assert_eq!(
                cell.escapes as usize,
                codes.iter().filter(|&&c| c == 3).count()
            );
        }
        if res.is_complete(capacity) {
            let at = (r.escape0 as usize) * w;
            let e = &want_escapes[k];
            assert_eq!(&g_esc[at..at + e.len()], &e[..], "{what}: escapes");
            assert_eq!(g_dig[k], want_digest[k], "{what}: digest change");
        }
    }
}

fn edge_cases() -> Vec<Case> {
    let sizes = [
        0usize, 1, 2, 3, 5, 7, 8, 15, 16, 17, 33, 1000, 4095, 4096, 4097, 8191, 8193, 16384, 16385,
        65537, 300_001,
    ];
    let densities = [0.0, 0.01, 0.1, 0.5, 1.0];
    let mut cases = Vec::new();
    for (k, &numel) in sizes.iter().enumerate() {
        for width in [1usize, 2, 4] {
            cases.push(Case {
                numel,
                width,
                density: densities[(k + width) % densities.len()],
                misalign: (k + width) % 4 == 0,
                f32_source: false,
            });
        }
        cases.push(Case {
            numel,
            width: 2,
            density: densities[k % densities.len()],
            misalign: false,
            f32_source: true,
        });
    }
    cases
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn map_diffs_match_the_spec() {
    for map_code in [MapCode::Steps, MapCode::Bitmap] {
        map_diff_matches_the_spec(map_code);
    }
}

fn map_diff_matches_the_spec(map_code: MapCode) {
    let gpu = gpu();
    let mut rng = Rng(0x5_7e95);
    // Cells of one tile and of several (rounded up to whole tiles by the diff).
    for cell_elems in [1u64, 40_000, 1 << 20] {
        run(&gpu, &mut rng, map_code, &edge_cases(), cell_elems, 1.0);
    }
    // A large tensor at half changed, with smaller ones around it.
    let big = vec![
        Case {
            numel: 3_000_017,
            width: 2,
            density: 0.5,
            misalign: false,
            f32_source: false,
        },
        Case {
            numel: 70_001,
            width: 4,
            density: 0.2,
            misalign: true,
            f32_source: false,
        },
        Case {
            numel: 1_000_003,
            width: 2,
            density: 0.3,
            misalign: false,
            f32_source: true,
        },
    ];
    run(&gpu, &mut rng, map_code, &big, 1 << 20, 1.0);
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn map_diffs_past_their_capacity_refresh_and_say_so() {
    let gpu = gpu();
    let mut rng = Rng(77);
    let cases: Vec<Case> = (0..4)
        .map(|i| Case {
            numel: 200_000 + i,
            width: 2,
            density: 0.4,
            misalign: i == 2,
            f32_source: false,
        })
        .collect();
    // Room for half the escapes: the result says incomplete; the codes, counts and the
    // snapshot are still whole (checked in `run`).
    for map_code in [MapCode::Steps, MapCode::Bitmap] {
        run(&gpu, &mut rng, map_code, &cases, 1 << 16, 0.5);
    }
}
