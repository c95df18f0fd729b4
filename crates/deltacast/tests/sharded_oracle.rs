//! Acceptance test for placements and slot conversion: a sharded diff (every rank diffs only
//! its local piece, converts to slots, the leader concatenates) must equal, bit for bit, a
//! naive diff of the full tensors converted to slots by plain index arithmetic.
//!
//! Cases: random shapes (1–3 dims, odd sizes, sizes below the world so shards are empty),
//! element widths 1/2/4, world sizes 1–8, and the placement mixes trainers use: FSDP, FSDP×TP
//! (strided and Shard(0)×Shard(1)), several mesh dims on one tensor dim, HSDP×TP, FSDP×EP
//! (DTensor and manual), DDP, and random mixes.

use deltacast::convert::{Converter, ParamSpec, SlotMap, SplitSpec};
use deltacast::diff::{diff_and_refresh, Changes};
use deltacast::placement::{local_block, Block, DTensorLayout, MeshPlacement, ShardPlacement};
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

/// Golden layouts from torch 2.11 itself (generator below): for every rank, torch's
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

// Generator of TORCH_GOLDEN (run where torch is installed: `python3 gen.py 1 out.txt`).
// # Golden placements from torch itself: for each layout, every rank's (local_shape, global_offset)
// # from torch's _compute_local_shape_and_global_offset, and the indices each rank really holds per
// # dim, from the placements' own _split_tensor on an arange (what distribute_tensor does).
// import random, sys, inspect, torch
// from torch.distributed.tensor.placement_types import Shard, Replicate, _StridedShard
// from torch.distributed.tensor import _utils as U
//
// def enc_p(p):
//     if isinstance(p, _StridedShard): return f"T{p.dim}/{p.split_factor}"
//     if isinstance(p, Shard): return f"S{p.dim}"
//     return "R"
//
// def held(shape, mesh, coord, pls, t):
//     idx = torch.arange(shape[t])
//     for m, p in enumerate(pls):
//         if isinstance(p, Shard) and p.dim == t:   # _StridedShard is matched too where it subclasses
//             v = idx.view([1] * t + [idx.numel()] + [1] * (len(shape) - t - 1))
//             parts, _ = p._split_tensor(v, mesh[m], with_padding=False, contiguous=True)
//             idx = parts[coord[m]].reshape(-1)
//         elif isinstance(p, _StridedShard) and p.dim == t:
//             v = idx.view([1] * t + [idx.numel()] + [1] * (len(shape) - t - 1))
//             parts, _ = p._split_tensor(v, mesh[m], with_padding=False, contiguous=True)
//             idx = parts[coord[m]].reshape(-1)
//     return idx.tolist()
//
// def coords(mesh):
//     out = [[]]
//     for s in mesh:
//         out = [c + [i] for c in out for i in range(s)]
//     return out
//
// def divisors(n): return [d for d in range(1, n + 1) if n % d == 0]
//
// rng = random.Random(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
// cases = set()
// for world in range(1, 9):
//     for tp in divisors(world):
//         for n in list(range(0, 14)) + [25, 31]:
//             cases.add(((n, 3), (world // tp, tp), (_StridedShard(0, split_factor=tp), Shard(0))))
//             cases.add(((n, 3), (world // tp, tp), (Shard(0), Shard(0))))
//         for n in range(0, 10):
//             cases.add(((n,), (world,), (Shard(0),)))
// while len(cases) < 900:
//     world = rng.randint(1, 8)
//     mesh = []
//     left = world
//     for _ in range(rng.randint(0, 2)):
//         f = rng.choice(divisors(left)); mesh.append(f); left //= f
//     mesh.append(left)
//     nd = rng.randint(1, 3)
//     shape = tuple(rng.randint(0, 13) for _ in range(nd))
//     pls = []
//     for m in mesh:
//         k = rng.random(); d = rng.randrange(nd)
//         if k < 0.15: pls.append(Replicate())
//         elif k < 0.45: pls.append(_StridedShard(d, split_factor=rng.randint(1, 4)))
//         else: pls.append(Shard(d))
//     cases.add((shape, tuple(mesh), tuple(pls)))
//
// sig = inspect.signature(U._compute_local_shape_and_global_offset)
// print("# torch", torch.__version__, "sig", sig, file=sys.stderr)
// lines = []
// for shape, mesh, pls in sorted(cases, key=repr):
//     ranks = []
//     for c in coords(mesh):
//         ls, off = U._compute_local_shape_and_global_offset(list(shape), list(mesh), list(c), list(pls))
//         cont = True
//         for t in range(len(shape)):
//             h = held(shape, mesh, c, pls, t)
//             if h != list(range(h[0], h[0] + len(h))) if h else False: cont = False
//             if len(h) != ls[t]: cont = False; print("SIZE MISMATCH", shape, mesh, pls, c, t, h, ls, file=sys.stderr)
//             if h and h[0] != off[t]: print("OFFSET MISMATCH", shape, mesh, pls, c, t, h, off, file=sys.stderr)
//         ranks.append("x".join(map(str, ls)) + "@" + "x".join(map(str, off)) + ("" if cont else "!"))
//     lines.append(";".join(["x".join(map(str, shape)), "x".join(map(str, mesh)), ",".join(enc_p(p) for p in pls), " ".join(ranks)]))
// open(sys.argv[2], "w").write("\n".join(lines) + "\n")
// print(len(lines), "cases", file=sys.stderr)

/// Output of the generator above with torch 2.11.0: shape;mesh;placements;per rank
/// `local_shape@global_offset`, with `!` where the rank's indices are not contiguous.
const TORCH_GOLDEN: &str = "\
0x0x5;1x1;T0/1,S2;0x0x5@0x0x0
0x1x2;2x1x4;T2/2,T1/3,T1/1;0x1x2@0x0x0 0x0x2@0x1x0 0x0x2@0x1x0 0x0x2@0x1x0 0x1x0@0x0x2 0x0x0@0x1x2 0x0x0@0x1x2 0x0x0@0x1x2
0x13;6;S0;0x13@0x0 0x13@0x0 0x13@0x0 0x13@0x0 0x13@0x0 0x13@0x0
0x2;4x1x2;S1,S1,S1;0x1@0x0 0x0@0x2 0x1@0x1 0x0@0x2 0x0@0x2 0x0@0x2 0x0@0x2 0x0@0x2
0x3;1x1;S0,S0;0x3@0x0
0x3;1x1;T0/1,S0;0x3@0x0
0x3;1x2;S0,S0;0x3@0x0 0x3@0x0
0x3;1x2;T0/2,S0;0x3@0x0 0x3@0x0
0x3;1x3;S0,S0;0x3@0x0 0x3@0x0 0x3@0x0
0x3;1x3;T0/3,S0;0x3@0x0 0x3@0x0 0x3@0x0
0x3;1x4;S0,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;1x4;T0/4,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;1x5;S0,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;1x5;T0/5,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;1x6;S0,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;1x6;T0/6,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;1x7;S0,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;1x7;T0/7,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;1x8;S0,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;1x8;T0/8,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;2x1;S0,S0;0x3@0x0 0x3@0x0
0x3;2x1;T0/1,S0;0x3@0x0 0x3@0x0
0x3;2x2;S0,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;2x2;T0/2,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;2x3;S0,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;2x3;T0/3,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;2x4;S0,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;2x4;T0/4,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;3x1;S0,S0;0x3@0x0 0x3@0x0 0x3@0x0
0x3;3x1;T0/1,S0;0x3@0x0 0x3@0x0 0x3@0x0
0x3;3x2;S0,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;3x2;T0/2,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;4x1;S0,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;4x1;T0/1,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;4x2;S0,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;4x2;T0/2,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;5x1;S0,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;5x1;T0/1,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;6x1;S0,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;6x1;T0/1,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;7x1;S0,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;7x1;T0/1,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;8x1;S0,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x3;8x1;T0/1,S0;0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0 0x3@0x0
0x4;1x6;S1,S0;0x4@0x0 0x4@0x0 0x4@0x0 0x4@0x0 0x4@0x0 0x4@0x0
0x4x10;1x7;S2,S2;0x4x2@0x0x0 0x4x2@0x0x2 0x4x2@0x0x4 0x4x2@0x0x6 0x4x2@0x0x8 0x4x0@0x0x10 0x4x0@0x0x10
0x6;1x2x2;S0,T1/1,S1;0x2@0x0 0x1@0x2 0x2@0x3 0x1@0x5
0x6x11;1x3x1;S0,T1/3,S2;0x3x11@0x0x0! 0x3x11@0x1x0! 0x0x11@0x6x0
0x6x11;4x1x1;S2,S1,S0;0x6x3@0x0x0 0x6x3@0x0x3 0x6x3@0x0x6 0x6x2@0x0x9
0x9;2;S0;0x9@0x0 0x9@0x0
0;1;S0;0@0
0;2;S0;0@0 0@0
0;3;S0;0@0 0@0 0@0
0;4;S0;0@0 0@0 0@0 0@0
0;5;S0;0@0 0@0 0@0 0@0 0@0
0;6x1;S0,S0;0@0 0@0 0@0 0@0 0@0 0@0
0;6;S0;0@0 0@0 0@0 0@0 0@0 0@0
0;7;S0;0@0 0@0 0@0 0@0 0@0 0@0 0@0
0;8;S0;0@0 0@0 0@0 0@0 0@0 0@0 0@0 0@0
1x1;4x2;S1,R;1x1@0x0 1x1@0x0 1x0@0x1 1x0@0x1 1x0@0x1 1x0@0x1 1x0@0x1 1x0@0x1
1x10;2x3x1;S1,S1,T0/3;1x2@0x0 1x2@0x2 1x1@0x4 1x2@0x5 1x2@0x7 1x1@0x9
1x11x4;1x7x1;S2,S0,T0/2;1x11x4@0x0x0 0x11x4@1x0x0 0x11x4@1x0x0 0x11x4@1x0x0 0x11x4@1x0x0 0x11x4@1x0x0 0x11x4@1x0x0
1x3;1x1;R,S0;1x3@0x0
1x3;1x1;S0,S0;1x3@0x0
1x3;1x1;T0/1,S0;1x3@0x0
1x3;1x2;S0,S0;1x3@0x0 0x3@1x0
1x3;1x2;T0/2,S0;1x3@0x0 0x3@1x0
1x3;1x3;S0,S0;1x3@0x0 0x3@1x0 0x3@1x0
1x3;1x3;T0/3,S0;1x3@0x0 0x3@1x0 0x3@1x0
1x3;1x4;S0,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;1x4;T0/4,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;1x5;S0,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;1x5;T0/5,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;1x6;S0,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;1x6;T0/6,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;1x7;S0,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;1x7;T0/7,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;1x8;S0,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;1x8;T0/8,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;2x1;S0,S0;1x3@0x0 0x3@1x0
1x3;2x1;T0/1,S0;1x3@0x0 0x3@1x0
1x3;2x2;S0,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;2x2;T0/2,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;2x3;S0,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;2x3;T0/3,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;2x4;S0,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;2x4;T0/4,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;3x1;S0,S0;1x3@0x0 0x3@1x0 0x3@1x0
1x3;3x1;T0/1,S0;1x3@0x0 0x3@1x0 0x3@1x0
1x3;3x2;S0,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;3x2;T0/2,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;4x1;S0,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;4x1;T0/1,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;4x2;S0,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;4x2;T0/2,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;5x1;S0,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;5x1;T0/1,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;5x1x1;S0,R,S1;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;6x1;S0,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;6x1;T0/1,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;7x1;S0,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;7x1;T0/1,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;8x1;S0,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3;8x1;T0/1,S0;1x3@0x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0 0x3@1x0
1x3x9;1x1x2;T2/3,T0/1,S2;1x3x5@0x0x0 1x3x4@0x0x5
1x5x13;1x7;S0,T2/1;1x5x2@0x0x0 1x5x2@0x0x2 1x5x2@0x0x4 1x5x2@0x0x6 1x5x2@0x0x8 1x5x2@0x0x10 1x5x1@0x0x12
1x6;1x2;S0,S1;1x3@0x0 1x3@0x3
1x7x3;6;S2;1x7x1@0x0x0 1x7x1@0x0x1 1x7x1@0x0x2 1x7x0@0x0x3 1x7x0@0x0x3 1x7x0@0x0x3
1x7x4;3x2x1;S1,S1,S0;1x2x4@0x0x0 1x1x4@0x2x0 1x2x4@0x3x0 1x1x4@0x5x0 1x1x4@0x6x0 1x0x4@0x7x0
1x8x5;5;T1/2;1x2x5@0x0x0! 1x2x5@0x1x0! 1x2x5@0x2x0! 1x2x5@0x3x0! 1x0x5@0x8x0
1x9;3x1;R,S0;1x9@0x0 1x9@0x0 1x9@0x0
1x9x0;3x1x1;S0,T0/4,S0;1x9x0@0x0x0 0x9x0@1x0x0 0x9x0@1x0x0
1x9x7;7x1;S0,R;1x9x7@0x0x0 0x9x7@1x0x0 0x9x7@1x0x0 0x9x7@1x0x0 0x9x7@1x0x0 0x9x7@1x0x0 0x9x7@1x0x0
1;1x1x1;S0,S0,S0;1@0
1;1x7;S0,R;1@0 1@0 1@0 1@0 1@0 1@0 1@0
1;1;S0;1@0
1;2;S0;1@0 0@1
1;3;S0;1@0 0@1 0@1
1;4;S0;1@0 0@1 0@1 0@1
1;5;S0;1@0 0@1 0@1 0@1 0@1
1;6;S0;1@0 0@1 0@1 0@1 0@1 0@1
1;7;S0;1@0 0@1 0@1 0@1 0@1 0@1 0@1
1;8;S0;1@0 0@1 0@1 0@1 0@1 0@1 0@1 0@1
10x1;7;S1;10x1@0x0 10x0@0x1 10x0@0x1 10x0@0x1 10x0@0x1 10x0@0x1 10x0@0x1
10x10;3x2;S0,S1;4x5@0x0 4x5@0x5 4x5@4x0 4x5@4x5 2x5@8x0 2x5@8x5
10x13;1x1;T0/1,T0/4;10x13@0x0
10x2;1x3x2;T0/2,S1,T1/2;10x1@0x0 10x0@0x2 10x1@0x1 10x0@0x2 10x0@0x2 10x0@0x2
10x3;1x1;S0,S0;10x3@0x0
10x3;1x1;T0/1,S0;10x3@0x0
10x3;1x2;S0,S0;5x3@0x0 5x3@5x0
10x3;1x2;T0/2,S0;5x3@0x0 5x3@5x0
10x3;1x3;S0,S0;4x3@0x0 4x3@4x0 2x3@8x0
10x3;1x3;T0/3,S0;4x3@0x0 4x3@4x0 2x3@8x0
10x3;1x4;S0,S0;3x3@0x0 3x3@3x0 3x3@6x0 1x3@9x0
10x3;1x4;T0/4,S0;3x3@0x0 3x3@3x0 3x3@6x0 1x3@9x0
10x3;1x5;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0
10x3;1x5;T0/5,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0
10x3;1x6;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 0x3@10x0
10x3;1x6;T0/6,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 0x3@10x0
10x3;1x7;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 0x3@10x0 0x3@10x0
10x3;1x7;T0/7,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 0x3@10x0 0x3@10x0
10x3;1x8;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 0x3@10x0 0x3@10x0 0x3@10x0
10x3;1x8;T0/8,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 0x3@10x0 0x3@10x0 0x3@10x0
10x3;1;S0;10x3@0x0
10x3;2x1;S0,S0;5x3@0x0 5x3@5x0
10x3;2x1;T0/1,S0;5x3@0x0 5x3@5x0
10x3;2x2;S0,S0;3x3@0x0 2x3@3x0 3x3@5x0 2x3@8x0
10x3;2x2;T0/2,S0;3x3@0x0 3x3@5x0 2x3@3x0 2x3@8x0
10x3;2x3;S0,S0;2x3@0x0 2x3@2x0 1x3@4x0 2x3@5x0 2x3@7x0 1x3@9x0
10x3;2x3;T0/3,S0;2x3@0x0 2x3@4x0 1x3@8x0 2x3@2x0 2x3@6x0 1x3@9x0
10x3;2x4;S0,S0;2x3@0x0 2x3@2x0 1x3@4x0 0x3@10x0 2x3@5x0 2x3@7x0 1x3@9x0 0x3@10x0
10x3;2x4;T0/4,S0;2x3@0x0 2x3@3x0 2x3@6x0 1x3@9x0 1x3@2x0 1x3@5x0 1x3@8x0 0x3@10x0
10x3;3x1;S0,S0;4x3@0x0 4x3@4x0 2x3@8x0
10x3;3x1;T0/1,S0;4x3@0x0 4x3@4x0 2x3@8x0
10x3;3x2;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 1x3@8x0 1x3@9x0
10x3;3x2;T0/2,S0;2x3@0x0 2x3@5x0 2x3@2x0 2x3@7x0 1x3@4x0 1x3@9x0
10x3;4x1;S0,S0;3x3@0x0 3x3@3x0 3x3@6x0 1x3@9x0
10x3;4x1;T0/1,S0;3x3@0x0 3x3@3x0 3x3@6x0 1x3@9x0
10x3;4x2;S0,S0;2x3@0x0 1x3@2x0 2x3@3x0 1x3@5x0 2x3@6x0 1x3@8x0 1x3@9x0 0x3@10x0
10x3;4x2;T0/2,S0;2x3@0x0 2x3@5x0 2x3@2x0 2x3@7x0 1x3@4x0 1x3@9x0 0x3@10x0 0x3@10x0
10x3;5x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0
10x3;5x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0
10x3;6x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 0x3@10x0
10x3;6x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 0x3@10x0
10x3;7x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 0x3@10x0 0x3@10x0
10x3;7x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 0x3@10x0 0x3@10x0
10x3;8x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 0x3@10x0 0x3@10x0 0x3@10x0
10x3;8x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 0x3@10x0 0x3@10x0 0x3@10x0
10x5x2;1;S0;10x5x2@0x0x0
10;1x1;S0,S0;10@0
10;1x1x1;S0,S0,S0;10@0
10;1x4x1;T0/4,T0/3,S0;3@0! 3@1! 2@2! 2@3!
10;1x7;T0/3,S0;2@0 2@2 2@4 2@6 2@8 0@10 0@10
10;1;S0;10@0
10;2;R;10@0 10@0
10;4x1;T0/4,T0/4;4@0! 3@1! 3@2! 0@10
10;5;S0;2@0 2@2 2@4 2@6 2@8
10;7;R;10@0 10@0 10@0 10@0 10@0 10@0 10@0
11x13x7;4x2;S1,S0;6x4x7@0x0x0 5x4x7@6x0x0 6x4x7@0x4x0 5x4x7@6x4x0 6x4x7@0x8x0 5x4x7@6x8x0 6x1x7@0x12x0 5x1x7@6x12x0
11x3;1x1;S0,S0;11x3@0x0
11x3;1x1;T0/1,S0;11x3@0x0
11x3;1x2;S0,S0;6x3@0x0 5x3@6x0
11x3;1x2;T0/2,S0;6x3@0x0 5x3@6x0
11x3;1x3;S0,S0;4x3@0x0 4x3@4x0 3x3@8x0
11x3;1x3;T0/3,S0;4x3@0x0 4x3@4x0 3x3@8x0
11x3;1x4;S0,S0;3x3@0x0 3x3@3x0 3x3@6x0 2x3@9x0
11x3;1x4;T0/4,S0;3x3@0x0 3x3@3x0 3x3@6x0 2x3@9x0
11x3;1x5;S0,S0;3x3@0x0 3x3@3x0 3x3@6x0 2x3@9x0 0x3@11x0
11x3;1x5;T0/5,S0;3x3@0x0 3x3@3x0 3x3@6x0 2x3@9x0 0x3@11x0
11x3;1x6;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 1x3@10x0
11x3;1x6;T0/6,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 1x3@10x0
11x3;1x7;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 1x3@10x0 0x3@11x0
11x3;1x7;T0/7,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 1x3@10x0 0x3@11x0
11x3;1x8;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 1x3@10x0 0x3@11x0 0x3@11x0
11x3;1x8;T0/8,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 1x3@10x0 0x3@11x0 0x3@11x0
11x3;2x1;S0,S0;6x3@0x0 5x3@6x0
11x3;2x1;T0/1,S0;6x3@0x0 5x3@6x0
11x3;2x2;S0,S0;3x3@0x0 3x3@3x0 3x3@6x0 2x3@9x0
11x3;2x2;T0/2,S0;3x3@0x0 3x3@6x0 3x3@3x0 2x3@9x0
11x3;2x3;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 1x3@10x0
11x3;2x3;T0/3,S0;2x3@0x0 2x3@4x0 2x3@8x0 2x3@2x0 2x3@6x0 1x3@10x0
11x3;2x4;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 0x3@11x0 2x3@6x0 2x3@8x0 1x3@10x0 0x3@11x0
11x3;2x4;T0/4,S0;2x3@0x0 2x3@3x0 2x3@6x0 1x3@9x0 1x3@2x0 1x3@5x0 1x3@8x0 1x3@10x0
11x3;3x1;S0,S0;4x3@0x0 4x3@4x0 3x3@8x0
11x3;3x1;T0/1,S0;4x3@0x0 4x3@4x0 3x3@8x0
11x3;3x2;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 1x3@10x0
11x3;3x2;T0/2,S0;2x3@0x0 2x3@6x0 2x3@2x0 2x3@8x0 2x3@4x0 1x3@10x0
11x3;4x1;S0,S0;3x3@0x0 3x3@3x0 3x3@6x0 2x3@9x0
11x3;4x1;T0/1,S0;3x3@0x0 3x3@3x0 3x3@6x0 2x3@9x0
11x3;4x2;S0,S0;2x3@0x0 1x3@2x0 2x3@3x0 1x3@5x0 2x3@6x0 1x3@8x0 1x3@9x0 1x3@10x0
11x3;4x2;T0/2,S0;2x3@0x0 2x3@6x0 2x3@2x0 2x3@8x0 2x3@4x0 1x3@10x0 0x3@11x0 0x3@11x0
11x3;5x1;S0,S0;3x3@0x0 3x3@3x0 3x3@6x0 2x3@9x0 0x3@11x0
11x3;5x1;T0/1,S0;3x3@0x0 3x3@3x0 3x3@6x0 2x3@9x0 0x3@11x0
11x3;6x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 1x3@10x0
11x3;6x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 1x3@10x0
11x3;7x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 1x3@10x0 0x3@11x0
11x3;7x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 1x3@10x0 0x3@11x0
11x3;8x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 1x3@10x0 0x3@11x0 0x3@11x0
11x3;8x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 1x3@10x0 0x3@11x0 0x3@11x0
11x4x9;1x3x1;T2/2,T1/3,R;11x2x9@0x0x0! 11x2x9@0x1x0! 11x0x9@0x4x0
11x6x0;2x4;S0,S0;2x6x0@0x0x0 2x6x0@2x0x0 2x6x0@4x0x0 0x6x0@11x0x0 2x6x0@6x0x0 2x6x0@8x0x0 1x6x0@10x0x0 0x6x0@11x0x0
11x6x5;1x3;S0,T2/2;11x6x2@0x0x0! 11x6x2@0x0x1! 11x6x1@0x0x2
11x8x10;3x1;S0,S2;4x8x10@0x0x0 4x8x10@4x0x0 3x8x10@8x0x0
11;6;S0;2@0 2@2 2@4 2@6 2@8 1@10
11;7x1x1;T0/4,R,S0;4@0! 4@1! 3@2! 0@11 0@11 0@11 0@11
12x0x9;6x1;S0,S0;2x0x9@0x0x0 2x0x9@2x0x0 2x0x9@4x0x0 2x0x9@6x0x0 2x0x9@8x0x0 2x0x9@10x0x0
12x1;1x5;S0,S1;12x1@0x0 12x0@0x1 12x0@0x1 12x0@0x1 12x0@0x1
12x1;4;R;12x1@0x0 12x1@0x0 12x1@0x0 12x1@0x0
12x10;4x1x1;T1/4,S1,S0;12x4@0x0! 12x3@0x1! 12x3@0x2! 12x0@0x10
12x11;1x2x1;T1/2,S1,S1;12x6@0x0 12x5@0x6
12x11x7;5;R;12x11x7@0x0x0 12x11x7@0x0x0 12x11x7@0x0x0 12x11x7@0x0x0 12x11x7@0x0x0
12x11x8;8x1x1;S2,S1,S1;12x11x1@0x0x0 12x11x1@0x0x1 12x11x1@0x0x2 12x11x1@0x0x3 12x11x1@0x0x4 12x11x1@0x0x5 12x11x1@0x0x6 12x11x1@0x0x7
12x12x3;1x1x1;T1/4,T0/2,S0;12x12x3@0x0x0
12x13x13;3;S0;4x13x13@0x0x0 4x13x13@4x0x0 4x13x13@8x0x0
12x2x11;1x4;S2,S0;3x2x11@0x0x0 3x2x11@3x0x0 3x2x11@6x0x0 3x2x11@9x0x0
12x3;1x1;S0,S0;12x3@0x0
12x3;1x1;T0/1,S0;12x3@0x0
12x3;1x2;S0,S0;6x3@0x0 6x3@6x0
12x3;1x2;T0/2,S0;6x3@0x0 6x3@6x0
12x3;1x3;S0,S0;4x3@0x0 4x3@4x0 4x3@8x0
12x3;1x3;T0/3,S0;4x3@0x0 4x3@4x0 4x3@8x0
12x3;1x4;S0,S0;3x3@0x0 3x3@3x0 3x3@6x0 3x3@9x0
12x3;1x4;T0/4,S0;3x3@0x0 3x3@3x0 3x3@6x0 3x3@9x0
12x3;1x5;S0,S0;3x3@0x0 3x3@3x0 3x3@6x0 3x3@9x0 0x3@12x0
12x3;1x5;T0/5,S0;3x3@0x0 3x3@3x0 3x3@6x0 3x3@9x0 0x3@12x0
12x3;1x6;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0
12x3;1x6;T0/6,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0
12x3;1x7;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0 0x3@12x0
12x3;1x7;T0/7,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0 0x3@12x0
12x3;1x8;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0 0x3@12x0 0x3@12x0
12x3;1x8;T0/8,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0 0x3@12x0 0x3@12x0
12x3;2x1;S0,S0;6x3@0x0 6x3@6x0
12x3;2x1;T0/1,S0;6x3@0x0 6x3@6x0
12x3;2x2;S0,S0;3x3@0x0 3x3@3x0 3x3@6x0 3x3@9x0
12x3;2x2;T0/2,S0;3x3@0x0 3x3@6x0 3x3@3x0 3x3@9x0
12x3;2x3;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0
12x3;2x3;T0/3,S0;2x3@0x0 2x3@4x0 2x3@8x0 2x3@2x0 2x3@6x0 2x3@10x0
12x3;2x4;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 0x3@12x0 2x3@6x0 2x3@8x0 2x3@10x0 0x3@12x0
12x3;2x4;T0/4,S0;2x3@0x0 2x3@3x0 2x3@6x0 2x3@9x0 1x3@2x0 1x3@5x0 1x3@8x0 1x3@11x0
12x3;3x1;S0,S0;4x3@0x0 4x3@4x0 4x3@8x0
12x3;3x1;T0/1,S0;4x3@0x0 4x3@4x0 4x3@8x0
12x3;3x2;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0
12x3;3x2;T0/2,S0;2x3@0x0 2x3@6x0 2x3@2x0 2x3@8x0 2x3@4x0 2x3@10x0
12x3;4x1;S0,S0;3x3@0x0 3x3@3x0 3x3@6x0 3x3@9x0
12x3;4x1;T0/1,S0;3x3@0x0 3x3@3x0 3x3@6x0 3x3@9x0
12x3;4x2;S0,S0;2x3@0x0 1x3@2x0 2x3@3x0 1x3@5x0 2x3@6x0 1x3@8x0 2x3@9x0 1x3@11x0
12x3;4x2;T0/2,S0;2x3@0x0 2x3@6x0 2x3@2x0 2x3@8x0 2x3@4x0 2x3@10x0 0x3@12x0 0x3@12x0
12x3;5x1;S0,S0;3x3@0x0 3x3@3x0 3x3@6x0 3x3@9x0 0x3@12x0
12x3;5x1;T0/1,S0;3x3@0x0 3x3@3x0 3x3@6x0 3x3@9x0 0x3@12x0
12x3;6x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0
12x3;6x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0
12x3;7x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0 0x3@12x0
12x3;7x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0 0x3@12x0
12x3;8x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0 0x3@12x0 0x3@12x0
12x3;8x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0 0x3@12x0 0x3@12x0
12x4;7;S1;12x1@0x0 12x1@0x1 12x1@0x2 12x1@0x3 12x0@0x4 12x0@0x4 12x0@0x4
12x5;1x1x1;R,S0,S1;12x5@0x0
12x8;2x1;R,S1;12x8@0x0 12x8@0x0
12x8x0;2x1x1;S1,T0/2,S1;12x4x0@0x0x0 12x4x0@0x4x0
12;1x2;S0,T0/4;8@0! 4@2!
12;1x3;S0,T0/2;4@0! 4@2! 4@4!
12;2x1x1;R,T0/2,S0;12@0 12@0
12;3;S0;4@0 4@4 4@8
13x0;1;R;13x0@0x0
13x1;3x1x1;S1,T0/1,R;13x1@0x0 13x0@0x1 13x0@0x1
13x2x8;2;S0;7x2x8@0x0x0 6x2x8@7x0x0
13x2x8;7x1x1;S0,S0,S2;2x2x8@0x0x0 2x2x8@2x0x0 2x2x8@4x0x0 2x2x8@6x0x0 2x2x8@8x0x0 2x2x8@10x0x0 1x2x8@12x0x0
13x3;1x1;S0,S0;13x3@0x0
13x3;1x1;T0/1,S0;13x3@0x0
13x3;1x2;S0,S0;7x3@0x0 6x3@7x0
13x3;1x2;T0/2,S0;7x3@0x0 6x3@7x0
13x3;1x3;S0,S0;5x3@0x0 5x3@5x0 3x3@10x0
13x3;1x3;T0/3,S0;5x3@0x0 5x3@5x0 3x3@10x0
13x3;1x4;S0,S0;4x3@0x0 4x3@4x0 4x3@8x0 1x3@12x0
13x3;1x4;T0/4,S0;4x3@0x0 4x3@4x0 4x3@8x0 1x3@12x0
13x3;1x5;S0,S0;3x3@0x0 3x3@3x0 3x3@6x0 3x3@9x0 1x3@12x0
13x3;1x5;T0/5,S0;3x3@0x0 3x3@3x0 3x3@6x0 3x3@9x0 1x3@12x0
13x3;1x6;S0,S0;3x3@0x0 3x3@3x0 3x3@6x0 3x3@9x0 1x3@12x0 0x3@13x0
13x3;1x6;T0/6,S0;3x3@0x0 3x3@3x0 3x3@6x0 3x3@9x0 1x3@12x0 0x3@13x0
13x3;1x7;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0 1x3@12x0
13x3;1x7;T0/7,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0 1x3@12x0
13x3;1x8;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0 1x3@12x0 0x3@13x0
13x3;1x8;T0/8,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0 1x3@12x0 0x3@13x0
13x3;2x1;S0,S0;7x3@0x0 6x3@7x0
13x3;2x1;T0/1,S0;7x3@0x0 6x3@7x0
13x3;2x2;S0,S0;4x3@0x0 3x3@4x0 3x3@7x0 3x3@10x0
13x3;2x2;T0/2,S0;4x3@0x0 3x3@7x0 3x3@4x0 3x3@10x0
13x3;2x3;S0,S0;3x3@0x0 3x3@3x0 1x3@6x0 2x3@7x0 2x3@9x0 2x3@11x0
13x3;2x3;T0/3,S0;3x3@0x0 3x3@5x0 2x3@10x0 2x3@3x0 2x3@8x0 1x3@12x0
13x3;2x4;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 1x3@6x0 2x3@7x0 2x3@9x0 2x3@11x0 0x3@13x0
13x3;2x4;T0/4,S0;2x3@0x0 2x3@4x0 2x3@8x0 1x3@12x0 2x3@2x0 2x3@6x0 2x3@10x0 0x3@13x0
13x3;3x1;S0,S0;5x3@0x0 5x3@5x0 3x3@10x0
13x3;3x1;T0/1,S0;5x3@0x0 5x3@5x0 3x3@10x0
13x3;3x2;S0,S0;3x3@0x0 2x3@3x0 3x3@5x0 2x3@8x0 2x3@10x0 1x3@12x0
13x3;3x2;T0/2,S0;3x3@0x0 2x3@7x0 3x3@3x0 2x3@9x0 2x3@6x0! 1x3@12x0
13x3;4x1;S0,S0;4x3@0x0 4x3@4x0 4x3@8x0 1x3@12x0
13x3;4x1;T0/1,S0;4x3@0x0 4x3@4x0 4x3@8x0 1x3@12x0
13x3;4x2;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0 1x3@12x0 0x3@13x0
13x3;4x2;T0/2,S0;2x3@0x0 2x3@7x0 2x3@2x0 2x3@9x0 2x3@4x0 2x3@11x0 1x3@6x0 0x3@13x0
13x3;5x1;S0,S0;3x3@0x0 3x3@3x0 3x3@6x0 3x3@9x0 1x3@12x0
13x3;5x1;T0/1,S0;3x3@0x0 3x3@3x0 3x3@6x0 3x3@9x0 1x3@12x0
13x3;6x1;S0,S0;3x3@0x0 3x3@3x0 3x3@6x0 3x3@9x0 1x3@12x0 0x3@13x0
13x3;6x1;T0/1,S0;3x3@0x0 3x3@3x0 3x3@6x0 3x3@9x0 1x3@12x0 0x3@13x0
13x3;7x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0 1x3@12x0
13x3;7x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0 1x3@12x0
13x3;8x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0 1x3@12x0 0x3@13x0
13x3;8x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 2x3@8x0 2x3@10x0 1x3@12x0 0x3@13x0
13x4;6x1x1;S0,S0,S1;3x4@0x0 3x4@3x0 3x4@6x0 3x4@9x0 1x4@12x0 0x4@13x0
13x5;2x3x1;T0/3,S0,S0;3x5@0x0 3x5@5x0 2x5@10x0 2x5@3x0 2x5@8x0 1x5@12x0
13x5x3;4x1;R,S1;13x5x3@0x0x0 13x5x3@0x0x0 13x5x3@0x0x0 13x5x3@0x0x0
13x7;2x4x1;R,S1,R;13x2@0x0 13x2@0x2 13x2@0x4 13x1@0x6 13x2@0x0 13x2@0x2 13x2@0x4 13x1@0x6
13x8x6;3x2x1;S2,T1/2,S2;13x4x2@0x0x0! 13x4x2@0x2x0! 13x4x2@0x0x2! 13x4x2@0x2x2! 13x4x2@0x0x4! 13x4x2@0x2x4!
13;1;R;13@0
13;1;T0/3;13@0
13;3x1;S0,T0/2;5@0 5@5 3@10
13;3;S0;5@0 5@5 3@10
13;8x1x1;T0/4,S0,T0/1;4@0! 3@1! 3@2! 3@3! 0@13 0@13 0@13 0@13
2x0;2x4;S1,T0/3;2x0@0x0 0x0@2x0 0x0@2x0 0x0@2x0 2x0@0x0 0x0@2x0 0x0@2x0 0x0@2x0
2x10;1x1x1;R,T1/4,T0/3;2x10@0x0
2x12x0;1x4;R,S2;2x12x0@0x0x0 2x12x0@0x0x0 2x12x0@0x0x0 2x12x0@0x0x0
2x2x12;3x1x1;R,T1/4,T2/2;2x2x12@0x0x0 2x2x12@0x0x0 2x2x12@0x0x0
2x2x4;1x1x1;S1,T1/2,S0;2x2x4@0x0x0
2x3;1x1;S0,S0;2x3@0x0
2x3;1x1;T0/1,S0;2x3@0x0
2x3;1x2;S0,S0;1x3@0x0 1x3@1x0
2x3;1x2;T0/2,S0;1x3@0x0 1x3@1x0
2x3;1x3;S0,S0;1x3@0x0 1x3@1x0 0x3@2x0
2x3;1x3;T0/3,S0;1x3@0x0 1x3@1x0 0x3@2x0
2x3;1x4;S0,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0
2x3;1x4;T0/4,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0
2x3;1x5;S0,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;1x5;T0/5,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;1x6;S0,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;1x6;T0/6,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;1x7;S0,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;1x7;T0/7,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;1x8;S0,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;1x8;T0/8,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;2x1;S0,S0;1x3@0x0 1x3@1x0
2x3;2x1;T0/1,S0;1x3@0x0 1x3@1x0
2x3;2x2;S0,S0;1x3@0x0 0x3@2x0 1x3@1x0 0x3@2x0
2x3;2x2;T0/2,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0
2x3;2x3;S0,S0;1x3@0x0 0x3@2x0 0x3@2x0 1x3@1x0 0x3@2x0 0x3@2x0
2x3;2x3;T0/3,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;2x4;S0,S0;1x3@0x0 0x3@2x0 0x3@2x0 0x3@2x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;2x4;T0/4,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;3x1;S0,S0;1x3@0x0 1x3@1x0 0x3@2x0
2x3;3x1;T0/1,S0;1x3@0x0 1x3@1x0 0x3@2x0
2x3;3x2;S0,S0;1x3@0x0 0x3@2x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;3x2;T0/2,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;3;R;2x3@0x0 2x3@0x0 2x3@0x0
2x3;4x1;S0,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0
2x3;4x1;T0/1,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0
2x3;4x2;S0,S0;1x3@0x0 0x3@2x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;4x2;T0/2,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;5x1;S0,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;5x1;T0/1,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;6x1;S0,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;6x1;T0/1,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;7x1;S0,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;7x1;T0/1,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;8x1;S0,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0
2x3;8x1;T0/1,S0;1x3@0x0 1x3@1x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0 0x3@2x0
2x5x4;1x4;R,T0/3;2x5x4@0x0x0 0x5x4@2x0x0 0x5x4@2x0x0 0x5x4@2x0x0
2;1;S0;2@0
2;2x1x1;S0,S0,T0/2;1@0 1@1
2;2;S0;1@0 1@1
2;3;S0;1@0 1@1 0@2
2;4x2;S0,S0;1@0 0@2 1@1 0@2 0@2 0@2 0@2 0@2
2;4;S0;1@0 1@1 0@2 0@2
2;5;S0;1@0 1@1 0@2 0@2 0@2
2;6;S0;1@0 1@1 0@2 0@2 0@2 0@2
2;7x1x1;T0/2,S0,T0/1;2@0 0@2 0@2 0@2 0@2 0@2 0@2
2;7;S0;1@0 1@1 0@2 0@2 0@2 0@2 0@2
2;8;S0;1@0 1@1 0@2 0@2 0@2 0@2 0@2 0@2
25x3;1x1;S0,S0;25x3@0x0
25x3;1x1;T0/1,S0;25x3@0x0
25x3;1x2;S0,S0;13x3@0x0 12x3@13x0
25x3;1x2;T0/2,S0;13x3@0x0 12x3@13x0
25x3;1x3;S0,S0;9x3@0x0 9x3@9x0 7x3@18x0
25x3;1x3;T0/3,S0;9x3@0x0 9x3@9x0 7x3@18x0
25x3;1x4;S0,S0;7x3@0x0 7x3@7x0 7x3@14x0 4x3@21x0
25x3;1x4;T0/4,S0;7x3@0x0 7x3@7x0 7x3@14x0 4x3@21x0
25x3;1x5;S0,S0;5x3@0x0 5x3@5x0 5x3@10x0 5x3@15x0 5x3@20x0
25x3;1x5;T0/5,S0;5x3@0x0 5x3@5x0 5x3@10x0 5x3@15x0 5x3@20x0
25x3;1x6;S0,S0;5x3@0x0 5x3@5x0 5x3@10x0 5x3@15x0 5x3@20x0 0x3@25x0
25x3;1x6;T0/6,S0;5x3@0x0 5x3@5x0 5x3@10x0 5x3@15x0 5x3@20x0 0x3@25x0
25x3;1x7;S0,S0;4x3@0x0 4x3@4x0 4x3@8x0 4x3@12x0 4x3@16x0 4x3@20x0 1x3@24x0
25x3;1x7;T0/7,S0;4x3@0x0 4x3@4x0 4x3@8x0 4x3@12x0 4x3@16x0 4x3@20x0 1x3@24x0
25x3;1x8;S0,S0;4x3@0x0 4x3@4x0 4x3@8x0 4x3@12x0 4x3@16x0 4x3@20x0 1x3@24x0 0x3@25x0
25x3;1x8;T0/8,S0;4x3@0x0 4x3@4x0 4x3@8x0 4x3@12x0 4x3@16x0 4x3@20x0 1x3@24x0 0x3@25x0
25x3;2x1;S0,S0;13x3@0x0 12x3@13x0
25x3;2x1;T0/1,S0;13x3@0x0 12x3@13x0
25x3;2x2;S0,S0;7x3@0x0 6x3@7x0 6x3@13x0 6x3@19x0
25x3;2x2;T0/2,S0;7x3@0x0 6x3@13x0 6x3@7x0 6x3@19x0
25x3;2x3;S0,S0;5x3@0x0 5x3@5x0 3x3@10x0 4x3@13x0 4x3@17x0 4x3@21x0
25x3;2x3;T0/3,S0;5x3@0x0 5x3@9x0 4x3@18x0 4x3@5x0 4x3@14x0 3x3@22x0
25x3;2x4;S0,S0;4x3@0x0 4x3@4x0 4x3@8x0 1x3@12x0 3x3@13x0 3x3@16x0 3x3@19x0 3x3@22x0
25x3;2x4;T0/4,S0;4x3@0x0 4x3@7x0 4x3@14x0 2x3@21x0 3x3@4x0 3x3@11x0 3x3@18x0 2x3@23x0
25x3;3x1;S0,S0;9x3@0x0 9x3@9x0 7x3@18x0
25x3;3x1;T0/1,S0;9x3@0x0 9x3@9x0 7x3@18x0
25x3;3x2;S0,S0;5x3@0x0 4x3@5x0 5x3@9x0 4x3@14x0 4x3@18x0 3x3@22x0
25x3;3x2;T0/2,S0;5x3@0x0 4x3@13x0 5x3@5x0 4x3@17x0 4x3@10x0! 3x3@22x0
25x3;4x1;S0,S0;7x3@0x0 7x3@7x0 7x3@14x0 4x3@21x0
25x3;4x1;T0/1,S0;7x3@0x0 7x3@7x0 7x3@14x0 4x3@21x0
25x3;4x2;S0,S0;4x3@0x0 3x3@4x0 4x3@7x0 3x3@11x0 4x3@14x0 3x3@18x0 2x3@21x0 2x3@23x0
25x3;4x2;T0/2,S0;4x3@0x0 3x3@13x0 4x3@4x0 3x3@16x0 4x3@8x0 3x3@19x0 2x3@12x0! 2x3@23x0
25x3;5x1;S0,S0;5x3@0x0 5x3@5x0 5x3@10x0 5x3@15x0 5x3@20x0
25x3;5x1;T0/1,S0;5x3@0x0 5x3@5x0 5x3@10x0 5x3@15x0 5x3@20x0
25x3;6x1;S0,S0;5x3@0x0 5x3@5x0 5x3@10x0 5x3@15x0 5x3@20x0 0x3@25x0
25x3;6x1;T0/1,S0;5x3@0x0 5x3@5x0 5x3@10x0 5x3@15x0 5x3@20x0 0x3@25x0
25x3;7x1;S0,S0;4x3@0x0 4x3@4x0 4x3@8x0 4x3@12x0 4x3@16x0 4x3@20x0 1x3@24x0
25x3;7x1;T0/1,S0;4x3@0x0 4x3@4x0 4x3@8x0 4x3@12x0 4x3@16x0 4x3@20x0 1x3@24x0
25x3;8x1;S0,S0;4x3@0x0 4x3@4x0 4x3@8x0 4x3@12x0 4x3@16x0 4x3@20x0 1x3@24x0 0x3@25x0
25x3;8x1;T0/1,S0;4x3@0x0 4x3@4x0 4x3@8x0 4x3@12x0 4x3@16x0 4x3@20x0 1x3@24x0 0x3@25x0
3x0;1x4x2;S1,S1,R;3x0@0x0 3x0@0x0 3x0@0x0 3x0@0x0 3x0@0x0 3x0@0x0 3x0@0x0 3x0@0x0
3x12x0;8;R;3x12x0@0x0x0 3x12x0@0x0x0 3x12x0@0x0x0 3x12x0@0x0x0 3x12x0@0x0x0 3x12x0@0x0x0 3x12x0@0x0x0 3x12x0@0x0x0
3x12x10;2x2;S1,T2/2;3x6x6@0x0x0! 3x6x4@0x0x3! 3x6x6@0x6x0! 3x6x4@0x6x3!
3x12x9;5x1x1;T2/3,S0,S2;3x12x3@0x0x0! 3x12x3@0x0x1! 3x12x3@0x0x2! 3x12x0@0x0x9 3x12x0@0x0x9
3x13x10;4x1;R,T1/2;3x13x10@0x0x0 3x13x10@0x0x0 3x13x10@0x0x0 3x13x10@0x0x0
3x2x11;1x2;S1,S1;3x1x11@0x0x0 3x1x11@0x1x0
3x3;1x1;S0,S0;3x3@0x0
3x3;1x1;T0/1,S0;3x3@0x0
3x3;1x2;S0,S0;2x3@0x0 1x3@2x0
3x3;1x2;T0/2,S0;2x3@0x0 1x3@2x0
3x3;1x3;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0
3x3;1x3;T0/3,S0;1x3@0x0 1x3@1x0 1x3@2x0
3x3;1x4;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0
3x3;1x4;T0/4,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0
3x3;1x5;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0 0x3@3x0
3x3;1x5;T0/5,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0 0x3@3x0
3x3;1x6;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0 0x3@3x0 0x3@3x0
3x3;1x6;T0/6,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0 0x3@3x0 0x3@3x0
3x3;1x7;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0 0x3@3x0 0x3@3x0 0x3@3x0
3x3;1x7;T0/7,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0 0x3@3x0 0x3@3x0 0x3@3x0
3x3;1x8;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0 0x3@3x0 0x3@3x0 0x3@3x0 0x3@3x0
3x3;1x8;T0/8,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0 0x3@3x0 0x3@3x0 0x3@3x0 0x3@3x0
3x3;2x1;S0,S0;2x3@0x0 1x3@2x0
3x3;2x1;T0/1,S0;2x3@0x0 1x3@2x0
3x3;2x2;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0
3x3;2x2;T0/2,S0;1x3@0x0 1x3@2x0 1x3@1x0 0x3@3x0
3x3;2x3;S0,S0;1x3@0x0 1x3@1x0 0x3@3x0 1x3@2x0 0x3@3x0 0x3@3x0
3x3;2x3;T0/3,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0 0x3@3x0 0x3@3x0
3x3;2x4;S0,S0;1x3@0x0 1x3@1x0 0x3@3x0 0x3@3x0 1x3@2x0 0x3@3x0 0x3@3x0 0x3@3x0
3x3;2x4;T0/4,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0 0x3@3x0 0x3@3x0 0x3@3x0 0x3@3x0
3x3;3x1;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0
3x3;3x1;T0/1,S0;1x3@0x0 1x3@1x0 1x3@2x0
3x3;3x2;S0,S0;1x3@0x0 0x3@3x0 1x3@1x0 0x3@3x0 1x3@2x0 0x3@3x0
3x3;3x2;T0/2,S0;1x3@0x0 1x3@2x0 1x3@1x0 0x3@3x0 0x3@3x0 0x3@3x0
3x3;4x1;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0
3x3;4x1;T0/1,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0
3x3;4x2;S0,S0;1x3@0x0 0x3@3x0 1x3@1x0 0x3@3x0 1x3@2x0 0x3@3x0 0x3@3x0 0x3@3x0
3x3;4x2;T0/2,S0;1x3@0x0 1x3@2x0 1x3@1x0 0x3@3x0 0x3@3x0 0x3@3x0 0x3@3x0 0x3@3x0
3x3;5x1;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0 0x3@3x0
3x3;5x1;T0/1,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0 0x3@3x0
3x3;6x1;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0 0x3@3x0 0x3@3x0
3x3;6x1;T0/1,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0 0x3@3x0 0x3@3x0
3x3;7x1;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0 0x3@3x0 0x3@3x0 0x3@3x0
3x3;7x1;T0/1,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0 0x3@3x0 0x3@3x0 0x3@3x0
3x3;8x1;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0 0x3@3x0 0x3@3x0 0x3@3x0 0x3@3x0
3x3;8x1;T0/1,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@3x0 0x3@3x0 0x3@3x0 0x3@3x0 0x3@3x0
3x3x7;3;T1/3;3x3x7@0x0x0 3x0x7@0x3x0 3x0x7@0x3x0
3x4;1x1x1;T1/2,T1/1,T1/1;3x4@0x0
3x4x10;4;S1;3x1x10@0x0x0 3x1x10@0x1x0 3x1x10@0x2x0 3x1x10@0x3x0
3x6;3;S0;1x6@0x0 1x6@1x0 1x6@2x0
3x7x1;4x1x1;S1,T1/1,T1/3;3x2x1@0x0x0 3x2x1@0x2x0 3x2x1@0x4x0 3x1x1@0x6x0
3;1x1;S0,S0;3@0
3;1;S0;3@0
3;2x4;S0,S0;1@0 1@1 0@3 0@3 1@2 0@3 0@3 0@3
3;2;S0;2@0 1@2
3;3x2;S0,T0/2;1@0 0@3 1@1 0@3 1@2 0@3
3;3;S0;1@0 1@1 1@2
3;4;S0;1@0 1@1 1@2 0@3
3;5;S0;1@0 1@1 1@2 0@3 0@3
3;5;T0/1;1@0 1@1 1@2 0@3 0@3
3;6;S0;1@0 1@1 1@2 0@3 0@3 0@3
3;7;R;3@0 3@0 3@0 3@0 3@0 3@0 3@0
3;7;S0;1@0 1@1 1@2 0@3 0@3 0@3 0@3
3;7;T0/2;2@0! 1@1 0@3 0@3 0@3 0@3 0@3
3;8;S0;1@0 1@1 1@2 0@3 0@3 0@3 0@3 0@3
31x3;1x1;S0,S0;31x3@0x0
31x3;1x1;T0/1,S0;31x3@0x0
31x3;1x2;S0,S0;16x3@0x0 15x3@16x0
31x3;1x2;T0/2,S0;16x3@0x0 15x3@16x0
31x3;1x3;S0,S0;11x3@0x0 11x3@11x0 9x3@22x0
31x3;1x3;T0/3,S0;11x3@0x0 11x3@11x0 9x3@22x0
31x3;1x4;S0,S0;8x3@0x0 8x3@8x0 8x3@16x0 7x3@24x0
31x3;1x4;T0/4,S0;8x3@0x0 8x3@8x0 8x3@16x0 7x3@24x0
31x3;1x5;S0,S0;7x3@0x0 7x3@7x0 7x3@14x0 7x3@21x0 3x3@28x0
31x3;1x5;T0/5,S0;7x3@0x0 7x3@7x0 7x3@14x0 7x3@21x0 3x3@28x0
31x3;1x6;S0,S0;6x3@0x0 6x3@6x0 6x3@12x0 6x3@18x0 6x3@24x0 1x3@30x0
31x3;1x6;T0/6,S0;6x3@0x0 6x3@6x0 6x3@12x0 6x3@18x0 6x3@24x0 1x3@30x0
31x3;1x7;S0,S0;5x3@0x0 5x3@5x0 5x3@10x0 5x3@15x0 5x3@20x0 5x3@25x0 1x3@30x0
31x3;1x7;T0/7,S0;5x3@0x0 5x3@5x0 5x3@10x0 5x3@15x0 5x3@20x0 5x3@25x0 1x3@30x0
31x3;1x8;S0,S0;4x3@0x0 4x3@4x0 4x3@8x0 4x3@12x0 4x3@16x0 4x3@20x0 4x3@24x0 3x3@28x0
31x3;1x8;T0/8,S0;4x3@0x0 4x3@4x0 4x3@8x0 4x3@12x0 4x3@16x0 4x3@20x0 4x3@24x0 3x3@28x0
31x3;2x1;S0,S0;16x3@0x0 15x3@16x0
31x3;2x1;T0/1,S0;16x3@0x0 15x3@16x0
31x3;2x2;S0,S0;8x3@0x0 8x3@8x0 8x3@16x0 7x3@24x0
31x3;2x2;T0/2,S0;8x3@0x0 8x3@16x0 8x3@8x0 7x3@24x0
31x3;2x3;S0,S0;6x3@0x0 6x3@6x0 4x3@12x0 5x3@16x0 5x3@21x0 5x3@26x0
31x3;2x3;T0/3,S0;6x3@0x0 6x3@11x0 5x3@22x0 5x3@6x0 5x3@17x0 4x3@27x0
31x3;2x4;S0,S0;4x3@0x0 4x3@4x0 4x3@8x0 4x3@12x0 4x3@16x0 4x3@20x0 4x3@24x0 3x3@28x0
31x3;2x4;T0/4,S0;4x3@0x0 4x3@8x0 4x3@16x0 4x3@24x0 4x3@4x0 4x3@12x0 4x3@20x0 3x3@28x0
31x3;3x1;S0,S0;11x3@0x0 11x3@11x0 9x3@22x0
31x3;3x1;T0/1,S0;11x3@0x0 11x3@11x0 9x3@22x0
31x3;3x2;S0,S0;6x3@0x0 5x3@6x0 6x3@11x0 5x3@17x0 5x3@22x0 4x3@27x0
31x3;3x2;T0/2,S0;6x3@0x0 5x3@16x0 6x3@6x0 5x3@21x0 5x3@12x0! 4x3@27x0
31x3;4x1;S0,S0;8x3@0x0 8x3@8x0 8x3@16x0 7x3@24x0
31x3;4x1;T0/1,S0;8x3@0x0 8x3@8x0 8x3@16x0 7x3@24x0
31x3;4x2;S0,S0;4x3@0x0 4x3@4x0 4x3@8x0 4x3@12x0 4x3@16x0 4x3@20x0 4x3@24x0 3x3@28x0
31x3;4x2;T0/2,S0;4x3@0x0 4x3@16x0 4x3@4x0 4x3@20x0 4x3@8x0 4x3@24x0 4x3@12x0 3x3@28x0
31x3;5x1;S0,S0;7x3@0x0 7x3@7x0 7x3@14x0 7x3@21x0 3x3@28x0
31x3;5x1;T0/1,S0;7x3@0x0 7x3@7x0 7x3@14x0 7x3@21x0 3x3@28x0
31x3;6x1;S0,S0;6x3@0x0 6x3@6x0 6x3@12x0 6x3@18x0 6x3@24x0 1x3@30x0
31x3;6x1;T0/1,S0;6x3@0x0 6x3@6x0 6x3@12x0 6x3@18x0 6x3@24x0 1x3@30x0
31x3;7x1;S0,S0;5x3@0x0 5x3@5x0 5x3@10x0 5x3@15x0 5x3@20x0 5x3@25x0 1x3@30x0
31x3;7x1;T0/1,S0;5x3@0x0 5x3@5x0 5x3@10x0 5x3@15x0 5x3@20x0 5x3@25x0 1x3@30x0
31x3;8x1;S0,S0;4x3@0x0 4x3@4x0 4x3@8x0 4x3@12x0 4x3@16x0 4x3@20x0 4x3@24x0 3x3@28x0
31x3;8x1;T0/1,S0;4x3@0x0 4x3@4x0 4x3@8x0 4x3@12x0 4x3@16x0 4x3@20x0 4x3@24x0 3x3@28x0
4x0;2x1x1;T1/3,T0/1,T0/2;4x0@0x0 4x0@0x0
4x10;7x1x1;S0,T0/2,T0/4;1x10@0x0 1x10@1x0 1x10@2x0 1x10@3x0 0x10@4x0 0x10@4x0 0x10@4x0
4x11;2;T1/2;4x6@0x0! 4x5@0x3!
4x2x3;7;S1;4x1x3@0x0x0 4x1x3@0x1x0 4x0x3@0x2x0 4x0x3@0x2x0 4x0x3@0x2x0 4x0x3@0x2x0 4x0x3@0x2x0
4x3;1x1;S0,S0;4x3@0x0
4x3;1x1;T0/1,S0;4x3@0x0
4x3;1x2;S0,S0;2x3@0x0 2x3@2x0
4x3;1x2;T0/2,S0;2x3@0x0 2x3@2x0
4x3;1x3;S0,S0;2x3@0x0 2x3@2x0 0x3@4x0
4x3;1x3;T0/3,S0;2x3@0x0 2x3@2x0 0x3@4x0
4x3;1x4;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0
4x3;1x4;T0/4,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0
4x3;1x5;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 0x3@4x0
4x3;1x5;T0/5,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 0x3@4x0
4x3;1x6;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 0x3@4x0 0x3@4x0
4x3;1x6;T0/6,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 0x3@4x0 0x3@4x0
4x3;1x7;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 0x3@4x0 0x3@4x0 0x3@4x0
4x3;1x7;T0/7,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 0x3@4x0 0x3@4x0 0x3@4x0
4x3;1x8;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 0x3@4x0 0x3@4x0 0x3@4x0 0x3@4x0
4x3;1x8;T0/8,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 0x3@4x0 0x3@4x0 0x3@4x0 0x3@4x0
4x3;2x1;S0,S0;2x3@0x0 2x3@2x0
4x3;2x1;T0/1,S0;2x3@0x0 2x3@2x0
4x3;2x2;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0
4x3;2x2;T0/2,S0;1x3@0x0 1x3@2x0 1x3@1x0 1x3@3x0
4x3;2x3;S0,S0;1x3@0x0 1x3@1x0 0x3@4x0 1x3@2x0 1x3@3x0 0x3@4x0
4x3;2x3;T0/3,S0;1x3@0x0 1x3@2x0 0x3@4x0 1x3@1x0 1x3@3x0 0x3@4x0
4x3;2x4;S0,S0;1x3@0x0 1x3@1x0 0x3@4x0 0x3@4x0 1x3@2x0 1x3@3x0 0x3@4x0 0x3@4x0
4x3;2x4;T0/4,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 0x3@4x0 0x3@4x0 0x3@4x0 0x3@4x0
4x3;3x1;S0,S0;2x3@0x0 2x3@2x0 0x3@4x0
4x3;3x1;T0/1,S0;2x3@0x0 2x3@2x0 0x3@4x0
4x3;3x2;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 0x3@4x0 0x3@4x0
4x3;3x2;T0/2,S0;1x3@0x0 1x3@2x0 1x3@1x0 1x3@3x0 0x3@4x0 0x3@4x0
4x3;4x1;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0
4x3;4x1;T0/1,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0
4x3;4x2;S0,S0;1x3@0x0 0x3@4x0 1x3@1x0 0x3@4x0 1x3@2x0 0x3@4x0 1x3@3x0 0x3@4x0
4x3;4x2;T0/2,S0;1x3@0x0 1x3@2x0 1x3@1x0 1x3@3x0 0x3@4x0 0x3@4x0 0x3@4x0 0x3@4x0
4x3;5x1;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 0x3@4x0
4x3;5x1;T0/1,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 0x3@4x0
4x3;6x1;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 0x3@4x0 0x3@4x0
4x3;6x1;T0/1,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 0x3@4x0 0x3@4x0
4x3;7x1;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 0x3@4x0 0x3@4x0 0x3@4x0
4x3;7x1;T0/1,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 0x3@4x0 0x3@4x0 0x3@4x0
4x3;8x1;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 0x3@4x0 0x3@4x0 0x3@4x0 0x3@4x0
4x3;8x1;T0/1,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 0x3@4x0 0x3@4x0 0x3@4x0 0x3@4x0
4x4x10;4x2;S0,R;1x4x10@0x0x0 1x4x10@0x0x0 1x4x10@1x0x0 1x4x10@1x0x0 1x4x10@2x0x0 1x4x10@2x0x0 1x4x10@3x0x0 1x4x10@3x0x0
4x4x3;7x1x1;T2/1,S2,T0/1;4x4x1@0x0x0 4x4x1@0x0x1 4x4x1@0x0x2 4x4x0@0x0x3 4x4x0@0x0x3 4x4x0@0x0x3 4x4x0@0x0x3
4x5;1x1;T1/1,S0;4x5@0x0
4x6x9;1x1x2;T0/2,S2,S2;4x6x5@0x0x0 4x6x4@0x0x5
4x7x2;1x1;T0/3,R;4x7x2@0x0x0
4x9;1x5x1;R,T0/1,R;1x9@0x0 1x9@1x0 1x9@2x0 1x9@3x0 0x9@4x0
4;1x1;S0,R;4@0
4;1x1;S0,S0;4@0
4;1x4;R,T0/4;4@0 0@4 0@4 0@4
4;1x6;S0,T0/4;4@0 0@4 0@4 0@4 0@4 0@4
4;1;S0;4@0
4;2x1x1;T0/4,T0/1,R;4@0 0@4
4;2;S0;2@0 2@2
4;3;S0;2@0 2@2 0@4
4;4;S0;1@0 1@1 1@2 1@3
4;5;S0;1@0 1@1 1@2 1@3 0@4
4;6;S0;1@0 1@1 1@2 1@3 0@4 0@4
4;7;S0;1@0 1@1 1@2 1@3 0@4 0@4 0@4
4;7;T0/4;4@0 0@4 0@4 0@4 0@4 0@4 0@4
4;8;S0;1@0 1@1 1@2 1@3 0@4 0@4 0@4 0@4
5x2x11;5x1;S1,S0;5x1x11@0x0x0 5x1x11@0x1x0 5x0x11@0x2x0 5x0x11@0x2x0 5x0x11@0x2x0
5x3;1x1;S0,S0;5x3@0x0
5x3;1x1;T0/1,S0;5x3@0x0
5x3;1x2;S0,S0;3x3@0x0 2x3@3x0
5x3;1x2;T0/2,S0;3x3@0x0 2x3@3x0
5x3;1x3;S0,S0;2x3@0x0 2x3@2x0 1x3@4x0
5x3;1x3;T0/3,S0;2x3@0x0 2x3@2x0 1x3@4x0
5x3;1x4;S0,S0;2x3@0x0 2x3@2x0 1x3@4x0 0x3@5x0
5x3;1x4;T0/4,S0;2x3@0x0 2x3@2x0 1x3@4x0 0x3@5x0
5x3;1x5;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0
5x3;1x5;T0/5,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0
5x3;1x6;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 0x3@5x0
5x3;1x6;T0/6,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 0x3@5x0
5x3;1x7;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 0x3@5x0 0x3@5x0
5x3;1x7;T0/7,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 0x3@5x0 0x3@5x0
5x3;1x8;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 0x3@5x0 0x3@5x0 0x3@5x0
5x3;1x8;T0/8,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 0x3@5x0 0x3@5x0 0x3@5x0
5x3;2x1;S0,S0;3x3@0x0 2x3@3x0
5x3;2x1;T0/1,S0;3x3@0x0 2x3@3x0
5x3;2x2;S0,S0;2x3@0x0 1x3@2x0 1x3@3x0 1x3@4x0
5x3;2x2;T0/2,S0;2x3@0x0 1x3@3x0 1x3@2x0 1x3@4x0
5x3;2x3;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 0x3@5x0
5x3;2x3;T0/3,S0;1x3@0x0 1x3@2x0 1x3@4x0 1x3@1x0 1x3@3x0 0x3@5x0
5x3;2x4;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@5x0 1x3@3x0 1x3@4x0 0x3@5x0 0x3@5x0
5x3;2x4;T0/4,S0;1x3@0x0 1x3@2x0 1x3@4x0 0x3@5x0 1x3@1x0 1x3@3x0 0x3@5x0 0x3@5x0
5x3;3x1;S0,S0;2x3@0x0 2x3@2x0 1x3@4x0
5x3;3x1;T0/1,S0;2x3@0x0 2x3@2x0 1x3@4x0
5x3;3x2;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 0x3@5x0
5x3;3x2;T0/2,S0;1x3@0x0 1x3@3x0 1x3@1x0 1x3@4x0 1x3@2x0 0x3@5x0
5x3;4x1;S0,S0;2x3@0x0 2x3@2x0 1x3@4x0 0x3@5x0
5x3;4x1;T0/1,S0;2x3@0x0 2x3@2x0 1x3@4x0 0x3@5x0
5x3;4x2;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 0x3@5x0 0x3@5x0 0x3@5x0
5x3;4x2;T0/2,S0;1x3@0x0 1x3@3x0 1x3@1x0 1x3@4x0 1x3@2x0 0x3@5x0 0x3@5x0 0x3@5x0
5x3;5x1;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0
5x3;5x1;T0/1,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0
5x3;6x1;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 0x3@5x0
5x3;6x1;T0/1,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 0x3@5x0
5x3;7x1;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 0x3@5x0 0x3@5x0
5x3;7x1;T0/1,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 0x3@5x0 0x3@5x0
5x3;8x1;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 0x3@5x0 0x3@5x0 0x3@5x0
5x3;8x1;T0/1,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 0x3@5x0 0x3@5x0 0x3@5x0
5x4;1x5;S0,T0/3;3x4@0x0! 2x4@1x0! 0x4@5x0 0x4@5x0 0x4@5x0
5x6;1;S1;5x6@0x0
5x7;4x1;S0,S0;2x7@0x0 2x7@2x0 1x7@4x0 0x7@5x0
5x9x12;1x1x5;T2/3,S1,R;5x9x12@0x0x0 5x9x12@0x0x0 5x9x12@0x0x0 5x9x12@0x0x0 5x9x12@0x0x0
5;1x1;T0/1,T0/1;5@0
5;1;S0;5@0
5;2;S0;3@0 2@3
5;3;S0;2@0 2@2 1@4
5;4;S0;2@0 2@2 1@4 0@5
5;5x1x1;T0/3,S0,S0;3@0! 2@1! 0@5 0@5 0@5
5;5;S0;1@0 1@1 1@2 1@3 1@4
5;6;S0;1@0 1@1 1@2 1@3 1@4 0@5
5;7;S0;1@0 1@1 1@2 1@3 1@4 0@5 0@5
5;8;S0;1@0 1@1 1@2 1@3 1@4 0@5 0@5 0@5
6x1x11;1x4x1;T1/2,S2,T0/1;6x1x3@0x0x0 6x1x3@0x0x3 6x1x3@0x0x6 6x1x2@0x0x9
6x11x11;4x1;S1,S1;6x3x11@0x0x0 6x3x11@0x3x0 6x3x11@0x6x0 6x2x11@0x9x0
6x11x4;7x1;T1/2,S1;6x2x4@0x0x0! 6x2x4@0x1x0! 6x2x4@0x2x0! 6x2x4@0x3x0! 6x2x4@0x4x0! 6x1x4@0x5x0 6x0x4@0x11x0
6x12x3;1x7x1;S1,T0/3,S0;3x12x3@0x0x0! 3x12x3@1x0x0! 0x12x3@6x0x0 0x12x3@6x0x0 0x12x3@6x0x0 0x12x3@6x0x0 0x12x3@6x0x0
6x13x0;1x2;T1/2,R;6x13x0@0x0x0 6x13x0@0x0x0
6x3;1x1;S0,S0;6x3@0x0
6x3;1x1;T0/1,S0;6x3@0x0
6x3;1x2;S0,S0;3x3@0x0 3x3@3x0
6x3;1x2;T0/2,S0;3x3@0x0 3x3@3x0
6x3;1x3;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0
6x3;1x3;T0/3,S0;2x3@0x0 2x3@2x0 2x3@4x0
6x3;1x4;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 0x3@6x0
6x3;1x4;T0/4,S0;2x3@0x0 2x3@2x0 2x3@4x0 0x3@6x0
6x3;1x5;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 0x3@6x0 0x3@6x0
6x3;1x5;T0/5,S0;2x3@0x0 2x3@2x0 2x3@4x0 0x3@6x0 0x3@6x0
6x3;1x6;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0
6x3;1x6;T0/6,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0
6x3;1x7;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 0x3@6x0
6x3;1x7;T0/7,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 0x3@6x0
6x3;1x8;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 0x3@6x0 0x3@6x0
6x3;1x8;T0/8,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 0x3@6x0 0x3@6x0
6x3;2x1;S0,S0;3x3@0x0 3x3@3x0
6x3;2x1;T0/1,S0;3x3@0x0 3x3@3x0
6x3;2x2;S0,S0;2x3@0x0 1x3@2x0 2x3@3x0 1x3@5x0
6x3;2x2;T0/2,S0;2x3@0x0 2x3@3x0 1x3@2x0 1x3@5x0
6x3;2x3;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0
6x3;2x3;T0/3,S0;1x3@0x0 1x3@2x0 1x3@4x0 1x3@1x0 1x3@3x0 1x3@5x0
6x3;2x4;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 0x3@6x0 1x3@3x0 1x3@4x0 1x3@5x0 0x3@6x0
6x3;2x4;T0/4,S0;1x3@0x0 1x3@2x0 1x3@4x0 0x3@6x0 1x3@1x0 1x3@3x0 1x3@5x0 0x3@6x0
6x3;3x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0
6x3;3x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0
6x3;3x2;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0
6x3;3x2;T0/2,S0;1x3@0x0 1x3@3x0 1x3@1x0 1x3@4x0 1x3@2x0 1x3@5x0
6x3;4x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 0x3@6x0
6x3;4x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 0x3@6x0
6x3;4x2;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 0x3@6x0 0x3@6x0
6x3;4x2;T0/2,S0;1x3@0x0 1x3@3x0 1x3@1x0 1x3@4x0 1x3@2x0 1x3@5x0 0x3@6x0 0x3@6x0
6x3;5x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 0x3@6x0 0x3@6x0
6x3;5x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 0x3@6x0 0x3@6x0
6x3;6x1;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0
6x3;6x1;T0/1,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0
6x3;7x1;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 0x3@6x0
6x3;7x1;T0/1,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 0x3@6x0
6x3;8x1;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 0x3@6x0 0x3@6x0
6x3;8x1;T0/1,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 0x3@6x0 0x3@6x0
6x3x11;6;S1;6x1x11@0x0x0 6x1x11@0x1x0 6x1x11@0x2x0 6x0x11@0x3x0 6x0x11@0x3x0 6x0x11@0x3x0
6x5x12;4x2;S2,S2;6x5x2@0x0x0 6x5x1@0x0x2 6x5x2@0x0x3 6x5x1@0x0x5 6x5x2@0x0x6 6x5x1@0x0x8 6x5x2@0x0x9 6x5x1@0x0x11
6x8;3x2;S0,S1;2x4@0x0 2x4@0x4 2x4@2x0 2x4@2x4 2x4@4x0 2x4@4x4
6;1x1x7;S0,S0,T0/4;3@0! 3@1! 0@6 0@6 0@6 0@6 0@6
6;1;S0;6@0
6;2x1x1;S0,T0/4,S0;3@0 3@3
6;2;S0;3@0 3@3
6;3;S0;2@0 2@2 2@4
6;4;S0;2@0 2@2 2@4 0@6
6;5;S0;2@0 2@2 2@4 0@6 0@6
6;6;S0;1@0 1@1 1@2 1@3 1@4 1@5
6;7;S0;1@0 1@1 1@2 1@3 1@4 1@5 0@6
6;8;S0;1@0 1@1 1@2 1@3 1@4 1@5 0@6 0@6
7x0;5x1;S1,R;7x0@0x0 7x0@0x0 7x0@0x0 7x0@0x0 7x0@0x0
7x1;5x1;R,T0/3;7x1@0x0 7x1@0x0 7x1@0x0 7x1@0x0 7x1@0x0
7x1;5x1x1;S0,T0/4,S1;2x1@0x0 2x1@2x0 2x1@4x0 1x1@6x0 0x1@7x0
7x1x2;6x1;S1,S2;7x1x2@0x0x0 7x0x2@0x1x0 7x0x2@0x1x0 7x0x2@0x1x0 7x0x2@0x1x0 7x0x2@0x1x0
7x11;3x1;T1/2,S1;7x4@0x0! 7x4@0x2! 7x3@0x4!
7x12;7x1;S0,R;1x12@0x0 1x12@1x0 1x12@2x0 1x12@3x0 1x12@4x0 1x12@5x0 1x12@6x0
7x13x8;2x2;T0/4,T1/4;4x7x8@0x0x0! 4x6x8@0x2x0! 3x7x8@1x0x0! 3x6x8@1x2x0!
7x2;1x7;S1,S0;1x2@0x0 1x2@1x0 1x2@2x0 1x2@3x0 1x2@4x0 1x2@5x0 1x2@6x0
7x2x13;1x1x1;S2,S0,T1/1;7x2x13@0x0x0
7x3;1x1;S0,S0;7x3@0x0
7x3;1x1;T0/1,S0;7x3@0x0
7x3;1x2;S0,S0;4x3@0x0 3x3@4x0
7x3;1x2;T0/2,S0;4x3@0x0 3x3@4x0
7x3;1x3;S0,S0;3x3@0x0 3x3@3x0 1x3@6x0
7x3;1x3;T0/3,S0;3x3@0x0 3x3@3x0 1x3@6x0
7x3;1x4;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 1x3@6x0
7x3;1x4;T0/4,S0;2x3@0x0 2x3@2x0 2x3@4x0 1x3@6x0
7x3;1x5;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 1x3@6x0 0x3@7x0
7x3;1x5;T0/5,S0;2x3@0x0 2x3@2x0 2x3@4x0 1x3@6x0 0x3@7x0
7x3;1x6;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 1x3@6x0 0x3@7x0 0x3@7x0
7x3;1x6;T0/6,S0;2x3@0x0 2x3@2x0 2x3@4x0 1x3@6x0 0x3@7x0 0x3@7x0
7x3;1x7;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 1x3@6x0
7x3;1x7;T0/7,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 1x3@6x0
7x3;1x8;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 1x3@6x0 0x3@7x0
7x3;1x8;T0/8,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 1x3@6x0 0x3@7x0
7x3;2x1;S0,S0;4x3@0x0 3x3@4x0
7x3;2x1;T0/1,S0;4x3@0x0 3x3@4x0
7x3;2x2;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 1x3@6x0
7x3;2x2;T0/2,S0;2x3@0x0 2x3@4x0 2x3@2x0 1x3@6x0
7x3;2x3;S0,S0;2x3@0x0 2x3@2x0 0x3@7x0 1x3@4x0 1x3@5x0 1x3@6x0
7x3;2x3;T0/3,S0;2x3@0x0 2x3@3x0 1x3@6x0 1x3@2x0 1x3@5x0 0x3@7x0
7x3;2x4;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 1x3@6x0 0x3@7x0
7x3;2x4;T0/4,S0;1x3@0x0 1x3@2x0 1x3@4x0 1x3@6x0 1x3@1x0 1x3@3x0 1x3@5x0 0x3@7x0
7x3;3x1;S0,S0;3x3@0x0 3x3@3x0 1x3@6x0
7x3;3x1;T0/1,S0;3x3@0x0 3x3@3x0 1x3@6x0
7x3;3x2;S0,S0;2x3@0x0 1x3@2x0 2x3@3x0 1x3@5x0 1x3@6x0 0x3@7x0
7x3;3x2;T0/2,S0;2x3@0x0 1x3@4x0 2x3@2x0 1x3@5x0 1x3@6x0 0x3@7x0
7x3;4x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 1x3@6x0
7x3;4x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 1x3@6x0
7x3;4x2;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 1x3@6x0 0x3@7x0
7x3;4x2;T0/2,S0;1x3@0x0 1x3@4x0 1x3@1x0 1x3@5x0 1x3@2x0 1x3@6x0 1x3@3x0 0x3@7x0
7x3;5x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 1x3@6x0 0x3@7x0
7x3;5x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 1x3@6x0 0x3@7x0
7x3;6x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 1x3@6x0 0x3@7x0 0x3@7x0
7x3;6x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 1x3@6x0 0x3@7x0 0x3@7x0
7x3;7x1;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 1x3@6x0
7x3;7x1;T0/1,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 1x3@6x0
7x3;8x1;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 1x3@6x0 0x3@7x0
7x3;8x1;T0/1,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 1x3@6x0 0x3@7x0
7x3x11;2x2;T2/3,S0;4x3x6@0x0x0! 3x3x6@4x0x0! 4x3x5@0x0x2! 3x3x5@4x0x2!
7x4x10;7;S1;7x1x10@0x0x0 7x1x10@0x1x0 7x1x10@0x2x0 7x1x10@0x3x0 7x0x10@0x4x0 7x0x10@0x4x0 7x0x10@0x4x0
7x4x11;1x7;S2,S1;7x1x11@0x0x0 7x1x11@0x1x0 7x1x11@0x2x0 7x1x11@0x3x0 7x0x11@0x4x0 7x0x11@0x4x0 7x0x11@0x4x0
7x6x11;1x1x7;T2/1,T2/1,R;7x6x11@0x0x0 7x6x11@0x0x0 7x6x11@0x0x0 7x6x11@0x0x0 7x6x11@0x0x0 7x6x11@0x0x0 7x6x11@0x0x0
7x7;1x1x1;S0,R,R;7x7@0x0
7;1x3x1;S0,S0,R;3@0 3@3 1@6
7;1;S0;7@0
7;2x1;S0,S0;4@0 3@4
7;2;R;7@0 7@0
7;2;S0;4@0 3@4
7;3x1;S0,S0;3@0 3@3 1@6
7;3;S0;3@0 3@3 1@6
7;4;S0;2@0 2@2 2@4 1@6
7;5;S0;2@0 2@2 2@4 1@6 0@7
7;6;S0;2@0 2@2 2@4 1@6 0@7 0@7
7;7x1x1;S0,S0,S0;1@0 1@1 1@2 1@3 1@4 1@5 1@6
7;7;S0;1@0 1@1 1@2 1@3 1@4 1@5 1@6
7;8;S0;1@0 1@1 1@2 1@3 1@4 1@5 1@6 0@7
8x0;6;T0/2;2x0@0x0! 2x0@1x0! 2x0@2x0! 2x0@3x0! 0x0@8x0 0x0@8x0
8x1x13;1x5;S1,R;8x1x13@0x0x0 8x1x13@0x0x0 8x1x13@0x0x0 8x1x13@0x0x0 8x1x13@0x0x0
8x1x2;3;T1/3;8x1x2@0x0x0 8x0x2@0x1x0 8x0x2@0x1x0
8x1x7;1x1x1;R,S1,T1/4;8x1x7@0x0x0
8x13;7;R;8x13@0x0 8x13@0x0 8x13@0x0 8x13@0x0 8x13@0x0 8x13@0x0 8x13@0x0
8x3;1x1;S0,S0;8x3@0x0
8x3;1x1;T0/1,S0;8x3@0x0
8x3;1x2;S0,S0;4x3@0x0 4x3@4x0
8x3;1x2;T0/2,S0;4x3@0x0 4x3@4x0
8x3;1x3;S0,S0;3x3@0x0 3x3@3x0 2x3@6x0
8x3;1x3;T0/3,S0;3x3@0x0 3x3@3x0 2x3@6x0
8x3;1x4;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0
8x3;1x4;T0/4,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0
8x3;1x5;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 0x3@8x0
8x3;1x5;T0/5,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 0x3@8x0
8x3;1x6;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 0x3@8x0 0x3@8x0
8x3;1x6;T0/6,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 0x3@8x0 0x3@8x0
8x3;1x7;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 0x3@8x0 0x3@8x0 0x3@8x0
8x3;1x7;T0/7,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 0x3@8x0 0x3@8x0 0x3@8x0
8x3;1x8;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 1x3@6x0 1x3@7x0
8x3;1x8;T0/8,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 1x3@6x0 1x3@7x0
8x3;2x1;S0,S0;4x3@0x0 4x3@4x0
8x3;2x1;T0/1,S0;4x3@0x0 4x3@4x0
8x3;2x2;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0
8x3;2x2;T0/2,S0;2x3@0x0 2x3@4x0 2x3@2x0 2x3@6x0
8x3;2x3;S0,S0;2x3@0x0 2x3@2x0 0x3@8x0 2x3@4x0 2x3@6x0 0x3@8x0
8x3;2x3;T0/3,S0;2x3@0x0 2x3@3x0 1x3@6x0 1x3@2x0 1x3@5x0 1x3@7x0
8x3;2x4;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 1x3@6x0 1x3@7x0
8x3;2x4;T0/4,S0;1x3@0x0 1x3@2x0 1x3@4x0 1x3@6x0 1x3@1x0 1x3@3x0 1x3@5x0 1x3@7x0
8x3;3x1;S0,S0;3x3@0x0 3x3@3x0 2x3@6x0
8x3;3x1;T0/1,S0;3x3@0x0 3x3@3x0 2x3@6x0
8x3;3x2;S0,S0;2x3@0x0 1x3@2x0 2x3@3x0 1x3@5x0 1x3@6x0 1x3@7x0
8x3;3x2;T0/2,S0;2x3@0x0 2x3@4x0 2x3@2x0 2x3@6x0 0x3@8x0 0x3@8x0
8x3;4x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0
8x3;4x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0
8x3;4x2;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 1x3@6x0 1x3@7x0
8x3;4x2;T0/2,S0;1x3@0x0 1x3@4x0 1x3@1x0 1x3@5x0 1x3@2x0 1x3@6x0 1x3@3x0 1x3@7x0
8x3;5x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 0x3@8x0
8x3;5x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 0x3@8x0
8x3;6x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 0x3@8x0 0x3@8x0
8x3;6x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 0x3@8x0 0x3@8x0
8x3;7x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 0x3@8x0 0x3@8x0 0x3@8x0
8x3;7x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 0x3@8x0 0x3@8x0 0x3@8x0
8x3;8x1;S0,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 1x3@6x0 1x3@7x0
8x3;8x1;T0/1,S0;1x3@0x0 1x3@1x0 1x3@2x0 1x3@3x0 1x3@4x0 1x3@5x0 1x3@6x0 1x3@7x0
8x3x9;2x1x1;R,T1/1,S1;8x3x9@0x0x0 8x3x9@0x0x0
8;1x3;S0,T0/1;3@0 3@3 2@6
8;1;S0;8@0
8;2;S0;4@0 4@4
8;3x2;S0,S0;2@0 1@2 2@3 1@5 1@6 1@7
8;3;S0;3@0 3@3 2@6
8;4x1;T0/4,S0;4@0! 4@1! 0@8 0@8
8;4x2;T0/3,S0;2@0! 1@6 2@1! 1@7 1@2 1@5 0@8 0@8
8;4x2x1;T0/2,T0/1,S0;1@0 1@4 1@1 1@5 1@2 1@6 1@3 1@7
8;4;S0;2@0 2@2 2@4 2@6
8;5;S0;2@0 2@2 2@4 2@6 0@8
8;5;T0/4;4@0! 4@1! 0@8 0@8 0@8
8;6;S0;2@0 2@2 2@4 2@6 0@8 0@8
8;7;S0;2@0 2@2 2@4 2@6 0@8 0@8 0@8
8;8;S0;1@0 1@1 1@2 1@3 1@4 1@5 1@6 1@7
8;8;T0/2;2@0! 2@1! 2@2! 2@3! 0@8 0@8 0@8 0@8
9x2x10;1x7;S0,S1;9x1x10@0x0x0 9x1x10@0x1x0 9x0x10@0x2x0 9x0x10@0x2x0 9x0x10@0x2x0 9x0x10@0x2x0 9x0x10@0x2x0
9x3;1x1;S0,S0;9x3@0x0
9x3;1x1;T0/1,S0;9x3@0x0
9x3;1x2;S0,S0;5x3@0x0 4x3@5x0
9x3;1x2;T0/2,S0;5x3@0x0 4x3@5x0
9x3;1x3;S0,S0;3x3@0x0 3x3@3x0 3x3@6x0
9x3;1x3;T0/3,S0;3x3@0x0 3x3@3x0 3x3@6x0
9x3;1x4;S0,S0;3x3@0x0 3x3@3x0 3x3@6x0 0x3@9x0
9x3;1x4;T0/4,S0;3x3@0x0 3x3@3x0 3x3@6x0 0x3@9x0
9x3;1x5;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 1x3@8x0
9x3;1x5;T0/5,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 1x3@8x0
9x3;1x6;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 1x3@8x0 0x3@9x0
9x3;1x6;T0/6,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 1x3@8x0 0x3@9x0
9x3;1x7;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 1x3@8x0 0x3@9x0 0x3@9x0
9x3;1x7;T0/7,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 1x3@8x0 0x3@9x0 0x3@9x0
9x3;1x8;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 1x3@8x0 0x3@9x0 0x3@9x0 0x3@9x0
9x3;1x8;T0/8,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 1x3@8x0 0x3@9x0 0x3@9x0 0x3@9x0
9x3;2x1;S0,S0;5x3@0x0 4x3@5x0
9x3;2x1;T0/1,S0;5x3@0x0 4x3@5x0
9x3;2x2;S0,S0;3x3@0x0 2x3@3x0 2x3@5x0 2x3@7x0
9x3;2x2;T0/2,S0;3x3@0x0 2x3@5x0 2x3@3x0 2x3@7x0
9x3;2x3;S0,S0;2x3@0x0 2x3@2x0 1x3@4x0 2x3@5x0 2x3@7x0 0x3@9x0
9x3;2x3;T0/3,S0;2x3@0x0 2x3@3x0 2x3@6x0 1x3@2x0 1x3@5x0 1x3@8x0
9x3;2x4;S0,S0;2x3@0x0 2x3@2x0 1x3@4x0 0x3@9x0 1x3@5x0 1x3@6x0 1x3@7x0 1x3@8x0
9x3;2x4;T0/4,S0;2x3@0x0 2x3@3x0 2x3@6x0 0x3@9x0 1x3@2x0 1x3@5x0 1x3@8x0 0x3@9x0
9x3;3x1;S0,S0;3x3@0x0 3x3@3x0 3x3@6x0
9x3;3x1;T0/1,S0;3x3@0x0 3x3@3x0 3x3@6x0
9x3;3x2;S0,S0;2x3@0x0 1x3@2x0 2x3@3x0 1x3@5x0 2x3@6x0 1x3@8x0
9x3;3x2;T0/2,S0;2x3@0x0 2x3@5x0 2x3@2x0 2x3@7x0 1x3@4x0 0x3@9x0
9x3;4x1;S0,S0;3x3@0x0 3x3@3x0 3x3@6x0 0x3@9x0
9x3;4x1;T0/1,S0;3x3@0x0 3x3@3x0 3x3@6x0 0x3@9x0
9x3;4x2;S0,S0;2x3@0x0 1x3@2x0 2x3@3x0 1x3@5x0 2x3@6x0 1x3@8x0 0x3@9x0 0x3@9x0
9x3;4x2;T0/2,S0;2x3@0x0 1x3@5x0 2x3@2x0 1x3@6x0 1x3@4x0 1x3@7x0 1x3@8x0 0x3@9x0
9x3;5x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 1x3@8x0
9x3;5x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 1x3@8x0
9x3;6x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 1x3@8x0 0x3@9x0
9x3;6x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 1x3@8x0 0x3@9x0
9x3;7x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 1x3@8x0 0x3@9x0 0x3@9x0
9x3;7x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 1x3@8x0 0x3@9x0 0x3@9x0
9x3;8x1;S0,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 1x3@8x0 0x3@9x0 0x3@9x0 0x3@9x0
9x3;8x1;T0/1,S0;2x3@0x0 2x3@2x0 2x3@4x0 2x3@6x0 1x3@8x0 0x3@9x0 0x3@9x0 0x3@9x0
9x3x4;2x2x1;R,S2,S1;9x3x2@0x0x0 9x3x2@0x0x2 9x3x2@0x0x0 9x3x2@0x0x2
9x6x1;1x1;T2/4,R;9x6x1@0x0x0
9x8x13;6;S0;2x8x13@0x0x0 2x8x13@2x0x0 2x8x13@4x0x0 2x8x13@6x0x0 1x8x13@8x0x0 0x8x13@9x0x0
9;1x6;T0/4,S0;2@0 2@2 2@4 2@6 1@8 0@9
9;1;S0;9@0
9;2x2;S0,R;5@0 5@0 4@5 4@5
9;2;S0;5@0 4@5
9;3;S0;3@0 3@3 3@6
9;4;S0;3@0 3@3 3@6 0@9
9;5;S0;2@0 2@2 2@4 2@6 1@8
9;6;S0;2@0 2@2 2@4 2@6 1@8 0@9
9;7;S0;2@0 2@2 2@4 2@6 1@8 0@9 0@9
9;8x1;R,S0;9@0 9@0 9@0 9@0 9@0 9@0 9@0 9@0
9;8;S0;2@0 2@2 2@4 2@6 1@8 0@9 0@9 0@9
";
