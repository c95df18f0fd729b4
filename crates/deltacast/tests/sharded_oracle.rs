//! Acceptance test for placements and slot conversion: a sharded diff (every rank diffs only
//! its local piece, converts to slots, the leader concatenates) must equal, bit for bit, a
//! naive diff of the full tensors converted to slots by plain index arithmetic.
//!
//! Cases: random shapes (1–3 dims, odd sizes, sizes below the world so shards are empty),
//! element widths 1/2/4, world sizes 1–8, and the placement mixes trainers use: FSDP, FSDP×TP
//! (strided and Shard(0)×Shard(1)), several mesh dims on one tensor dim, HSDP×TP, FSDP×EP
//! (DTensor and manual), DDP, and random mixes.

use deltacast::diff::{diff_and_refresh, Changes};
use deltacast::placement::{local_block, Block, DTensorLayout, MeshPlacement, ShardPlacement};
use deltacast::slot_map::{Converter, ParamSpec, SlotMap, SplitSpec};
use deltacast::DType;
use proptest::prelude::*;

mod common;
use common::Rng;
use MeshPlacement::{Replicate, Shard, StridedShard};

/// A random divisor of `n`.
fn divisor(rng: &mut Rng, n: u64) -> u64 {
    let divs: Vec<u64> = (1..=n).filter(|&d| n.is_multiple_of(d)).collect();
    divs[rng.below(divs.len() as u64) as usize]
}

/// `n` split into `parts` random non-negative sizes.
fn parts(rng: &mut Rng, n: u64, parts: usize) -> Vec<u64> {
    let mut cuts: Vec<u64> = (0..parts - 1).map(|_| rng.below(n + 1)).collect();
    cuts.sort();
    let mut out = Vec::new();
    let mut prev = 0;
    for c in cuts {
        out.push(c - prev);
        prev = c;
    }
    out.push(n - prev);
    out
}

const KINDS: usize = 10;

/// How every rank of a world places the parameter: either a DTensor layout (the mesh and
/// placements; coordinates are the rank in row-major order), or manual EP × FSDP.
enum Scheme {
    DTensor {
        mesh: Vec<u64>,
        placements: Vec<MeshPlacement>,
    },
    /// `ep` expert-parallel groups (rank = ep_index * dp + dp_index), FSDP Shard(0) over `dp`
    /// on each group's local experts.
    ManualEp { ep: u64, dp: u64 },
}

fn scheme(kind: usize, world: u64, ndim: usize, rng: &mut Rng) -> Scheme {
    let dt = |mesh: Vec<u64>, placements: Vec<MeshPlacement>| Scheme::DTensor { mesh, placements };
    let dim1 = if ndim >= 2 { 1 } else { 0 };
    match kind {
        // FSDP.
        0 => dt(vec![world], vec![Shard { dim: 0 }]),
        // FSDP2 over TP (or over DTensor EP): [_StridedShard(0, tp), Shard(0)] on (dp, tp).
        1 => {
            let tp = divisor(rng, world);
            dt(
                vec![world / tp, tp],
                vec![
                    StridedShard {
                        dim: 0,
                        split_factor: tp,
                    },
                    Shard { dim: 0 },
                ],
            )
        }
        // FSDP × TP on another dim.
        2 => {
            let tp = divisor(rng, world);
            dt(
                vec![world / tp, tp],
                vec![Shard { dim: 0 }, Shard { dim: dim1 }],
            )
        }
        // Several mesh dims on one tensor dim, left to right.
        3 => {
            let a = divisor(rng, world);
            let b = divisor(rng, world / a);
            let c = world / a / b;
            let d = rng.below(ndim as u64) as usize;
            dt(
                vec![a, b, c],
                vec![Shard { dim: d }, Shard { dim: d }, Shard { dim: 0 }],
            )
        }
        // HSDP × TP.
        4 => {
            let rep = divisor(rng, world);
            let tp = divisor(rng, world / rep);
            dt(
                vec![rep, world / rep / tp, tp],
                vec![Replicate, Shard { dim: 0 }, Shard { dim: dim1 }],
            )
        }
        // HSDP × TP with FSDP2's strided shard.
        5 => {
            let rep = divisor(rng, world);
            let tp = divisor(rng, world / rep);
            dt(
                vec![rep, world / rep / tp, tp],
                vec![
                    Replicate,
                    StridedShard {
                        dim: 0,
                        split_factor: tp,
                    },
                    Shard { dim: 0 },
                ],
            )
        }
        // Manual EP × FSDP.
        6 => {
            let ep = divisor(rng, world);
            Scheme::ManualEp { ep, dp: world / ep }
        }
        // DDP: everyone holds everything, rank 0 contributes.
        7 => dt(vec![world], vec![Replicate]),
        // TP with a trailing replicate dim.
        8 => {
            let tp = divisor(rng, world);
            dt(
                vec![tp, world / tp],
                vec![Shard { dim: ndim - 1 }, Replicate],
            )
        }
        // A random mix on a random factorization.
        _ => {
            let mut mesh = Vec::new();
            let mut left = world;
            for _ in 0..rng.below(3) {
                let f = divisor(rng, left);
                mesh.push(f);
                left /= f;
            }
            mesh.push(left);
            let placements = mesh
                .iter()
                .map(|_| {
                    let dim = rng.below(ndim as u64) as usize;
                    match rng.below(5) {
                        0 => Replicate,
                        1 => StridedShard {
                            dim,
                            split_factor: 1 + rng.below(4),
                        },
                        _ => Shard { dim },
                    }
                })
                .collect();
            dt(mesh, placements)
        }
    }
}

fn unravel(mut rank: u64, mesh: &[u64]) -> Vec<u64> {
    let mut c = vec![0; mesh.len()];
    for d in (0..mesh.len()).rev() {
        c[d] = rank % mesh[d];
        rank /= mesh[d];
    }
    c
}

/// Every rank's placement, or the error all of them gave.
fn placements(scheme: &Scheme, world: u64, shape: &[u64]) -> Result<Vec<ShardPlacement>, String> {
    match scheme {
        Scheme::DTensor { mesh, placements } => {
            let results: Vec<_> = (0..world)
                .map(|r| {
                    local_block(&DTensorLayout {
                        mesh_shape: mesh.clone(),
                        coords: unravel(r, mesh),
                        placements: placements.clone(),
                        global_shape: shape.to_vec(),
                    })
                    .map_err(|e| e.to_string())
                })
                .collect();
            if let Some(Err(first)) = results.iter().find(|r| r.is_err()) {
                // A refused layout is refused identically on every rank.
                for r in &results {
                    assert_eq!(r.as_ref().err(), Some(first), "{mesh:?} {placements:?}");
                }
                return Err(first.clone());
            }
            Ok(results.into_iter().map(|r| r.unwrap()).collect())
        }
        Scheme::ManualEp { ep, dp } => Ok((0..world)
            .map(|r| {
                let (e, d) = (r / dp, r % dp);
                let experts = local_block(&DTensorLayout {
                    mesh_shape: vec![*ep],
                    coords: vec![e],
                    placements: vec![Shard { dim: 0 }],
                    global_shape: vec![shape[0]],
                })
                .unwrap();
                let (first, local) = (
                    experts.block().offset()[0].min(shape[0]),
                    experts.block().shape()[0],
                );
                let outer = Block::experts(shape[0], first, local, &shape[1..]).unwrap();
                let inner = local_block(&DTensorLayout {
                    mesh_shape: vec![*dp],
                    coords: vec![d],
                    placements: vec![Shard { dim: 0 }],
                    global_shape: outer.shape().to_vec(),
                })
                .unwrap();
                ShardPlacement::Block(outer.compose(inner.block()).unwrap())
            })
            .collect()),
    }
}

/// A converter for `shape` and, independently, what it means: (stacked, dim, piece sizes).
fn converter(kind: u64, shape: &[u64], rng: &mut Rng) -> (Converter, bool, usize, Vec<u64>) {
    match kind {
        1 => {
            let s = parts(rng, shape[0], 3);
            (
                Converter::FusedQkv {
                    q: "q".into(),
                    k: "k".into(),
                    v: "v".into(),
                    sizes: [s[0], s[1], s[2]],
                },
                false,
                0,
                s,
            )
        }
        2 if shape.len() >= 2 && shape[1].is_multiple_of(2) => (
            Converter::FusedExperts {
                gate: "experts.{e}.gate".into(),
                up: "experts.{e}.up".into(),
            },
            true,
            1,
            vec![shape[1] / 2; 2],
        ),
        3 => {
            let stacked = shape.len() >= 2 && rng.below(2) == 0;
            let lo = usize::from(stacked);
            let dim = lo + rng.below((shape.len() - lo) as u64) as usize;
            let n = 1 + rng.below(4) as usize;
            let sizes = parts(rng, shape[dim], n);
            let pieces = sizes
                .iter()
                .enumerate()
                .map(|(i, &s)| {
                    let name = if stacked {
                        format!("e{{e}}.p{i}")
                    } else {
                        format!("p{i}")
                    };
                    (name, s)
                })
                .collect();
            (
                Converter::Split(SplitSpec {
                    stacked,
                    dim,
                    pieces,
                }),
                stacked,
                dim,
                sizes,
            )
        }
        _ => (
            Converter::Identity {
                slot: "whole".into(),
            },
            false,
            0,
            vec![shape[0]],
        ),
    }
}

fn numel(shape: &[u64]) -> u64 {
    shape.iter().product()
}

fn ravel(idx: &[u64], shape: &[u64]) -> u64 {
    idx.iter().zip(shape).fold(0, |acc, (&i, &s)| acc * s + i)
}

/// The naive oracle: each slot's full old and new tensors by index arithmetic, compared
/// element by element.
fn oracle(
    old: &[u8],
    new: &[u8],
    w: usize,
    shape: &[u64],
    (stacked, dim, sizes): (bool, usize, &[u64]),
) -> Vec<Changes> {
    let experts = if stacked { shape[0] } else { 1 };
    let mut out = Vec::new();
    for e in 0..experts {
        let mut start = 0;
        for &size in sizes {
            let mut slot_shape = shape.to_vec();
            slot_shape[dim] = size;
            if stacked {
                slot_shape.remove(0);
            }
            let mut c = Changes::default();
            for s in 0..numel(&slot_shape) {
                let mut idx = vec![0; slot_shape.len()];
                let mut rest = s;
                for d in (0..slot_shape.len()).rev() {
                    idx[d] = rest % slot_shape[d];
                    rest /= slot_shape[d];
                }
                if stacked {
                    idx.insert(0, e);
                }
                idx[dim] += start;
                let g = ravel(&idx, shape) as usize * w;
                if old[g..g + w] != new[g..g + w] {
                    c.positions.push(s);
                    c.old_values.extend_from_slice(&old[g..g + w]);
                    c.new_values.extend_from_slice(&new[g..g + w]);
                }
            }
            out.push(c);
            start += size;
        }
    }
    out
}

/// Sorts one slot's concatenated pieces by position, keeping each value with its position.
fn sorted(c: &Changes, w: usize) -> Changes {
    let mut order: Vec<usize> = (0..c.positions.len()).collect();
    order.sort_by_key(|&i| c.positions[i]);
    let mut out = Changes::default();
    for i in order {
        out.positions.push(c.positions[i]);
        out.old_values
            .extend_from_slice(&c.old_values[i * w..(i + 1) * w]);
        out.new_values
            .extend_from_slice(&c.new_values[i * w..(i + 1) * w]);
    }
    out
}

struct Case {
    world: u64,
    kind: usize,
    shape: Vec<u64>,
    conv: u64,
    dtype: DType,
    density: u64,
    seed: u64,
}

/// Runs one case; returns false when the layout was (correctly) refused as not a block.
fn run(case: &Case) -> bool {
    let mut rng = Rng(case.seed);
    let shape = &case.shape;
    let w = case.dtype.width();
    let scheme = scheme(case.kind, case.world, shape.len(), &mut rng);
    let placements = match placements(&scheme, case.world, shape) {
        Ok(p) => p,
        Err(msg) => {
            assert!(
                msg.contains("not a block placement"),
                "only non-block strided layouts may be refused: {msg}"
            );
            return false;
        }
    };
    let (conv, stacked, dim, sizes) = converter(case.conv, shape, &mut rng);
    let map = SlotMap::new(vec![
        ParamSpec::identity("before", vec![3], DType::F32),
        ParamSpec::new("param", shape.clone(), case.dtype, conv),
    ])
    .unwrap();

    // Full old and new tensors.
    let n = numel(shape) as usize;
    let old: Vec<u8> = (0..n * w).map(|_| rng.next_u64() as u8).collect();
    let mut new = old.clone();
    for i in 0..n {
        if rng.below(100) < case.density {
            let mask = (rng.next_u64() | 1).to_le_bytes();
            for b in 0..w {
                new[i * w + b] ^= mask[b];
            }
        }
    }

    // Tiling: contributing blocks cover every element exactly once; replicas duplicate one.
    let mut cover = vec![0u32; n];
    for p in &placements {
        let b = p.block();
        assert_eq!(b.global_shape(), shape.as_slice());
        let mut all = Vec::new();
        b.to_global_positions(&(0..b.numel()).collect::<Vec<_>>(), &mut all);
        let from_ranges: Vec<u64> = b.global_ranges().flat_map(|(s, l)| s..s + l).collect();
        assert_eq!(all, from_ranges);
        if p.contributing().is_some() {
            for g in all {
                cover[g as usize] += 1;
            }
        } else {
            assert!(
                placements
                    .iter()
                    .any(|q| q.contributing() == Some(p.block())),
                "replica {:?} duplicates no contributing block",
                p.block()
            );
        }
    }
    assert!(cover.iter().all(|&c| c == 1), "cover {cover:?}");

    // Sharded diff: each rank diffs its local piece, converts, the leader concatenates.
    let slots = map.slot_ids(1).unwrap();
    assert_eq!(slots.start, 1);
    let mut gathered = vec![Changes::default(); slots.len()];
    let mut out = Vec::new();
    for p in &placements {
        let b = p.block();
        let mut local_old = Vec::new();
        let mut local_new = Vec::new();
        for (s, l) in b.global_ranges() {
            let r = s as usize * w..(s + l) as usize * w;
            local_old.extend_from_slice(&old[r.clone()]);
            local_new.extend_from_slice(&new[r]);
        }
        let mut snapshot = local_old;
        let mut changes = Changes::default();
        diff_and_refresh(&mut snapshot, &local_new, w, 0, &mut changes);
        assert_eq!(snapshot, local_new);
        let plan = map.plan(1, p).unwrap();
        assert_eq!(plan.slot_ids(), slots);
        plan.convert(&changes, &mut out).unwrap();
        assert_eq!(out.len(), slots.len());
        for (piece, all) in out.iter().zip(&mut gathered) {
            assert!(piece.positions.windows(2).all(|x| x[0] < x[1]));
            assert_eq!(piece.old_values.len(), piece.positions.len() * w);
            if p.is_replica() {
                assert!(piece.is_empty());
            }
            all.positions.extend_from_slice(&piece.positions);
            all.old_values.extend_from_slice(&piece.old_values);
            all.new_values.extend_from_slice(&piece.new_values);
        }
    }
    let want = oracle(&old, &new, w, shape, (stacked, dim, &sizes));
    assert_eq!(want.len(), gathered.len());
    for (i, (g, o)) in gathered.iter().zip(&want).enumerate() {
        let info = map.table().get(slots.start + i as u32).unwrap();
        assert!(g.positions.iter().all(|&p| p < info.numel()));
        assert_eq!(&sorted(g, w), o, "slot {} ({})", i, info.name);
    }
    true
}

fn dtype(i: u64) -> DType {
    [DType::F8E4M3, DType::BF16, DType::F32][i as usize % 3]
}

fn density(i: u64) -> u64 {
    [0, 3, 30, 100][i as usize % 4]
}

#[test]
fn sweep_worlds_and_placement_mixes() {
    let mut rng = Rng(0x5eed);
    let (mut ran, mut refused) = (0, 0);
    for world in 1..=8u64 {
        for kind in 0..KINDS {
            for _ in 0..40 {
                let ndim = 1 + rng.below(3) as usize;
                let mut shape: Vec<u64> = (0..ndim).map(|_| rng.below(10)).collect();
                if kind == 6 || rng.below(4) == 0 {
                    // Experts: a stack of odd count, with an even fused dim when there is one.
                    shape[0] = 1 + 2 * rng.below(4);
                }
                if ndim >= 2 && rng.below(2) == 0 {
                    shape[1] = 2 * rng.below(4);
                }
                let case = Case {
                    world,
                    kind,
                    shape,
                    conv: rng.below(4),
                    dtype: dtype(rng.next_u64()),
                    density: density(rng.next_u64()),
                    seed: rng.next_u64(),
                };
                if run(&case) {
                    ran += 1;
                } else {
                    refused += 1;
                }
            }
        }
    }
    // Most layouts are blocks; the refused ones are uneven strided shards.
    assert!(ran > 10 * refused, "ran {ran}, refused {refused}");
}

#[test]
fn fsdp_over_tp_even_sizes_are_always_blocks() {
    // FSDP2 over TP with sizes divisible by dp * tp never needs refusing.
    for world in 1..=8u64 {
        for tp in (1..=world).filter(|t| world % t == 0) {
            for rows in [0, world, 2 * world, 3 * world] {
                let scheme = Scheme::DTensor {
                    mesh: vec![world / tp, tp],
                    placements: vec![
                        StridedShard {
                            dim: 0,
                            split_factor: tp,
                        },
                        Shard { dim: 0 },
                    ],
                };
                let p = placements(&scheme, world, &[rows, 3]).unwrap();
                // And they hold TP-chunk-then-DP-chunk rows, as FSDP2's data does.
                for (r, p) in p.iter().enumerate() {
                    let (d, t) = (r as u64 / tp, r as u64 % tp);
                    let per = rows / world;
                    assert_eq!(p.block().shape()[0], per);
                    if per > 0 {
                        assert_eq!(p.block().offset()[0], t * (rows / tp) + d * per);
                    }
                }
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn sharded_diff_equals_naive_diff(
        world in 1u64..=8,
        kind in 0usize..KINDS,
        shape in prop::collection::vec(0u64..10, 1..=3),
        conv in 0u64..4,
        dt in 0u64..3,
        dens in 0u64..4,
        seed in any::<u64>(),
    ) {
        let mut shape = shape;
        if kind == 6 && shape[0] == 0 {
            shape[0] = 1;
        }
        run(&Case { world, kind, shape, conv, dtype: dtype(dt), density: density(dens), seed });
    }
}

/// Parses `AxBxC` (an empty string is a 0-dim shape).
fn dims(s: &str) -> Vec<u64> {
    if s.is_empty() {
        return Vec::new();
    }
    s.split('x').map(|d| d.parse().unwrap()).collect()
}

fn placement(s: &str) -> MeshPlacement {
    match s.as_bytes()[0] {
        b'R' => Replicate,
        b'S' => Shard {
            dim: s[1..].parse().unwrap(),
        },
        _ => {
            let (dim, sf) = s[1..].split_once('/').unwrap();
            StridedShard {
                dim: dim.parse().unwrap(),
                split_factor: sf.parse().unwrap(),
            }
        }
    }
}

/// Golden layouts from torch 2.11 itself ([`TORCH_GOLDEN`]): for every rank, torch's
/// `_compute_local_shape_and_global_offset`, and whether the indices the placements'
/// `_split_tensor` really gives that rank are one contiguous range per dim. Where all are,
/// `local_block` must give torch's shape and offset; where any rank's are not, every rank must
/// refuse the layout.
#[test]
fn matches_torch_compute_local_shape_and_global_offset() {
    let (mut blocks, mut refused) = (0, 0);
    for line in TORCH_GOLDEN.lines() {
        let f: Vec<&str> = line.split(';').collect();
        let (shape, mesh) = (dims(f[0]), dims(f[1]));
        let placements: Vec<MeshPlacement> = f[2].split(',').map(placement).collect();
        let ranks: Vec<&str> = f[3].split(' ').collect();
        let all_blocks = !f[3].contains('!');
        for (r, want) in ranks.iter().enumerate() {
            let got = local_block(&DTensorLayout {
                mesh_shape: mesh.clone(),
                coords: unravel(r as u64, &mesh),
                placements: placements.clone(),
                global_shape: shape.clone(),
            });
            if all_blocks {
                let got = got.unwrap_or_else(|e| panic!("{line}: rank {r}: {e}"));
                let (ls, off) = want.split_once('@').unwrap();
                assert_eq!(got.block().shape(), dims(ls).as_slice(), "{line}: rank {r}");
                assert_eq!(
                    got.block().offset(),
                    dims(off).as_slice(),
                    "{line}: rank {r}"
                );
                blocks += 1;
            } else {
                let e = got.expect_err(line).to_string();
                assert!(e.contains("not a block placement"), "{line}: {e}");
                refused += 1;
            }
        }
    }
    assert!(blocks > 3000 && refused > 0, "{blocks} {refused}");
}

/// Golden layouts from torch 2.11.0, made by scripts/torch-placements.py (which says how to
/// rerun it): shape;mesh;placements;per rank `local_shape@global_offset`, with `!` where the
/// rank's indices are not contiguous.
const TORCH_GOLDEN: &str = include_str!("data/torch_placements.txt");
