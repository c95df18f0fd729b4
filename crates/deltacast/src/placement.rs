//! Placements: where one rank's shard of a parameter sits in the full tensor.
//!
//! deltacast ships positions in each slot's final coordinates, so every rank must know exactly
//! which elements of the full tensor its local piece holds. Trainers describe that with torch
//! DTensor placements; [`local_block`] turns them into a [`Block`] (an offset and a shape per
//! dimension) with torch's own arithmetic, so the pieces of all ranks tile the tensor exactly as
//! torch laid them out (matched against torch's `compute_local_shape_and_global_offset` in
//! tests/sharded_oracle.rs).
//!
//! Only block placements are accepted: a layout under which some rank would hold a set of rows
//! that is not one contiguous range is refused, for every rank alike, so that no rank errors
//! while the others wait in a collective.

use crate::error::{Error, Result};

/// One mesh dimension's placement, as plain data (torch's `Shard`, `_StridedShard`,
/// `Replicate`, `Partial`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MeshPlacement {
    /// `Shard(dim)`: torch.chunk of the current local piece along `dim`.
    Shard { dim: usize },
    /// `_StridedShard(dim, split_factor)`: FSDP2 over TP/EP. The current piece is first chunked
    /// into `split_factor` parts, each part into mesh-size chunks, and this rank takes its chunk
    /// of every part.
    StridedShard { dim: usize, split_factor: u64 },
    /// `Replicate()`: every coordinate holds the same data; only coordinate 0 contributes.
    Replicate,
    /// `Partial()`: pending reduction; not a final weight, refused.
    Partial,
}

/// A DTensor's layout seen from one rank: the mesh, this rank's coordinate in it, one placement
/// per mesh dimension and the full (global) shape of the tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DTensorLayout {
    pub mesh_shape: Vec<u64>,
    /// This rank's coordinate per mesh dimension.
    pub coords: Vec<u64>,
    pub placements: Vec<MeshPlacement>,
    pub global_shape: Vec<u64>,
}

/// A rank's role for one parameter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShardPlacement {
    /// The rank contributes the elements of this block.
    Block(Block),
    /// The rank holds a replica (nonzero coordinate on a `Replicate` mesh dimension) of the
    /// given block: it takes part with zero counts and never contributes.
    Replica(Block),
}

impl ShardPlacement {
    /// The block of the full tensor the rank's local tensor holds (also for a replica).
    pub fn block(&self) -> &Block {
        match self {
            ShardPlacement::Block(b) | ShardPlacement::Replica(b) => b,
        }
    }

    /// The block this rank contributes, or `None` for a replica.
    pub fn contributing(&self) -> Option<&Block> {
        match self {
            ShardPlacement::Block(b) => Some(b),
            ShardPlacement::Replica(_) => None,
        }
    }

    pub fn is_replica(&self) -> bool {
        matches!(self, ShardPlacement::Replica(_))
    }

    /// Checks that the rank's actual local tensor has the shape the placement predicts. A
    /// mismatch means the layout given does not describe the data (wrong mesh, wrong
    /// coordinate, or a framework whose data differs from its own DTensor metadata); syncing
    /// would misplace elements, so it is an error.
    pub fn check_local_shape(&self, local_shape: &[u64]) -> Result<()> {
        let block = self.block();
        if block.shape() != local_shape {
            return Err(Error::InvalidArgument(format!(
                "local tensor has shape {local_shape:?}, but the placement predicts {:?} at \
                 offset {:?} of {:?}",
                block.shape(),
                block.offset(),
                block.global_shape()
            )));
        }
        Ok(())
    }
}

/// A box of a row-major tensor: `shape[d]` indices starting at `offset[d]` on every dimension.
///
/// Invariant (checked on construction): `offset[d] + shape[d] <= global_shape[d]`. An empty
/// block (some `shape[d] == 0`) may have any such offset; torch reports `global_shape[d]` for
/// the offset of a dimension sharded down to nothing, and [`local_block`] does the same.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Block {
    global_shape: Vec<u64>,
    offset: Vec<u64>,
    shape: Vec<u64>,
}

impl Block {
    /// A block, after checking that it fits in the global shape.
    pub fn new(global_shape: Vec<u64>, offset: Vec<u64>, shape: Vec<u64>) -> Result<Self> {
        if offset.len() != global_shape.len() || shape.len() != global_shape.len() {
            return Err(Error::InvalidArgument(format!(
                "block rank mismatch: global shape {global_shape:?}, offset {offset:?}, shape \
                 {shape:?}"
            )));
        }
        for d in 0..global_shape.len() {
            let end = offset[d].checked_add(shape[d]);
            if end.is_none_or(|end| end > global_shape[d]) {
                return Err(Error::InvalidArgument(format!(
                    "block does not fit on dim {d}: offset {} + size {} > {} (global shape \
                     {global_shape:?})",
                    offset[d], shape[d], global_shape[d]
                )));
            }
        }
        checked_numel(&global_shape)?;
        Ok(Block {
            global_shape,
            offset,
            shape,
        })
    }

    /// The whole tensor (an unsharded parameter).
    pub fn full(global_shape: Vec<u64>) -> Result<Self> {
        let offset = vec![0; global_shape.len()];
        let shape = global_shape.clone();
        Block::new(global_shape, offset, shape)
    }

    /// Expert parallelism: this rank's `local_experts` experts, starting at global expert
    /// `first_local_expert`, placed in a virtual `[num_experts_global, *per_expert_shape]`
    /// tensor of all experts (a `Shard(0)` that the framework did not describe as a DTensor).
    pub fn experts(
        num_experts_global: u64,
        first_local_expert: u64,
        local_experts: u64,
        per_expert_shape: &[u64],
    ) -> Result<Self> {
        let mut global_shape = vec![num_experts_global];
        global_shape.extend_from_slice(per_expert_shape);
        let mut offset = vec![first_local_expert];
        offset.resize(global_shape.len(), 0);
        let mut shape = vec![local_experts];
        shape.extend_from_slice(per_expert_shape);
        Block::new(global_shape, offset, shape).map_err(|e| {
            Error::InvalidArgument(format!(
                "experts {first_local_expert}..+{local_experts} of {num_experts_global}: {e}"
            ))
        })
    }

    /// The block `inner` of this block's local tensor, in this block's global coordinates: for
    /// a framework that shards an already sharded tensor (FSDP on the local experts of EP).
    pub fn compose(&self, inner: &Block) -> Result<Block> {
        if inner.global_shape != self.shape {
            return Err(Error::InvalidArgument(format!(
                "cannot compose blocks: inner block is of a {:?} tensor, outer block holds {:?}",
                inner.global_shape, self.shape
            )));
        }
        let offset = self
            .offset
            .iter()
            .zip(&inner.offset)
            .map(|(a, b)| a + b)
            .collect();
        Block::new(self.global_shape.clone(), offset, inner.shape.clone())
    }

    pub fn global_shape(&self) -> &[u64] {
        &self.global_shape
    }

    pub fn offset(&self) -> &[u64] {
        &self.offset
    }

    pub fn shape(&self) -> &[u64] {
        &self.shape
    }

    /// Elements in the block (1 for a scalar).
    pub fn numel(&self) -> u64 {
        self.shape.iter().product()
    }

    pub fn is_empty(&self) -> bool {
        self.numel() == 0
    }

    /// Elements of the full tensor.
    pub fn global_numel(&self) -> u64 {
        self.global_shape.iter().product()
    }

    /// Whether the block is the whole tensor.
    pub fn is_full(&self) -> bool {
        self.shape == self.global_shape
    }

    /// Maps sorted row-major local flat indices to row-major global flat indices, appending to
    /// `out`. The map is increasing, so `out`'s new tail is sorted too. Runs along the
    /// contiguous trailing dimensions cost an add each; only a new run costs divisions.
    ///
    /// Positions must be below [`Block::numel`] (they come from diffing the local piece).
    pub fn to_global_positions(&self, local_sorted: &[u64], out: &mut Vec<u64>) {
        debug_assert!(local_sorted.windows(2).all(|w| w[0] < w[1]));
        debug_assert!(local_sorted.last().is_none_or(|&l| l < self.numel()));
        let map = RunMap::new(self);
        out.reserve(local_sorted.len());
        if map.outer.is_empty() {
            out.extend(local_sorted.iter().map(|&l| map.base + l));
            return;
        }
        let run = map.run;
        let (mut run_start, mut run_end, mut run_global) = (0u64, 0u64, 0u64);
        for &l in local_sorted {
            if l >= run_end {
                let row = l / run;
                run_start = row * run;
                run_end = run_start + run;
                run_global = map.row_start(row);
            }
            out.push(run_global + (l - run_start));
        }
    }

    /// The block's contiguous runs in global flat coordinates, as `(global_start, len)`, in
    /// increasing order; the k-th run holds local elements `k*len .. (k+1)*len`. Nothing for an
    /// empty block.
    pub fn global_ranges(&self) -> GlobalRanges {
        let map = RunMap::new(self);
        let rows = self.numel().checked_div(map.run).unwrap_or(0);
        GlobalRanges {
            index: vec![0; map.outer.len()],
            next: map.base,
            remaining: rows,
            map,
        }
    }
}

/// Iterator returned by [`Block::global_ranges`].
#[derive(Debug, Clone)]
pub struct GlobalRanges {
    map: RunMap,
    /// Odometer over the outer dimensions, so no division per run.
    index: Vec<u64>,
    next: u64,
    remaining: u64,
}

impl Iterator for GlobalRanges {
    type Item = (u64, u64);

    fn next(&mut self) -> Option<(u64, u64)> {
        if self.remaining == 0 {
            return None;
        }
        self.remaining -= 1;
        let item = (self.next, self.map.run);
        // Advance the odometer (last outer dimension fastest).
        for d in (0..self.index.len()).rev() {
            let (extent, stride) = self.map.outer[d];
            self.index[d] += 1;
            self.next += stride;
            if self.index[d] < extent {
                break;
            }
            self.index[d] = 0;
            self.next -= stride * extent;
        }
        Some(item)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let n = usize::try_from(self.remaining).unwrap_or(usize::MAX);
        (n, Some(n))
    }
}

/// A block seen as rows of one contiguous global run each: the trailing dimensions the block
/// covers whole merge into the run, so an FSDP `Shard(0)` block is a single run.
#[derive(Debug, Clone)]
struct RunMap {
    /// Local elements per run.
    run: u64,
    /// `(local extent, global stride)` of the dimensions outside the run, outermost first;
    /// extents of 1 are dropped (they only shift `base`).
    outer: Vec<(u64, u64)>,
    /// Global flat index of the block's first element.
    base: u64,
}

impl RunMap {
    fn new(block: &Block) -> Self {
        let n = block.shape.len();
        let mut gstride = vec![1u64; n];
        for d in (0..n.saturating_sub(1)).rev() {
            gstride[d] = gstride[d + 1] * block.global_shape[d + 1];
        }
        if block.is_empty() {
            return RunMap {
                run: 0,
                outer: Vec::new(),
                base: 0,
            };
        }
        let base = (0..n).map(|d| block.offset[d] * gstride[d]).sum();
        // k = the outermost dimension of the run: every dimension after k is covered whole.
        let mut k = n;
        let mut run = 1u64;
        while k > 0 {
            k -= 1;
            run *= block.shape[k];
            if block.shape[k] != block.global_shape[k] {
                break;
            }
        }
        let outer = (0..k)
            .filter(|&d| block.shape[d] != 1)
            .map(|d| (block.shape[d], gstride[d]))
            .collect();
        RunMap { run, outer, base }
    }

    /// Global flat index of the first element of local run `row`.
    #[inline]
    fn row_start(&self, mut row: u64) -> u64 {
        let mut g = self.base;
        for &(extent, stride) in self.outer.iter().rev() {
            g += (row % extent) * stride;
            row /= extent;
        }
        g
    }
}

fn checked_numel(shape: &[u64]) -> Result<u64> {
    shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| Error::InvalidArgument(format!("shape {shape:?} overflows 64 bits")))
}

/// torch.chunk of `n` indices into `k` chunks, chunk `r`: `(size, start)`. Chunks are
/// `ceil(n/k)` long, trailing ones short or empty; an empty chunk past the end starts at `n`.
///
/// Mirrors `Shard.local_shard_size_and_offset` (torch/distributed/tensor/placement_types.py).
fn chunk(n: u64, k: u64, r: u64) -> (u64, u64) {
    if n.is_multiple_of(k) {
        let size = n / k;
        return (size, size * r);
    }
    let full = n.div_ceil(k);
    let start = full.saturating_mul(r);
    if start > n {
        (0, n)
    } else {
        ((start + full).min(n) - start, start)
    }
}

/// The positions (within the current piece of `n` indices) a `_StridedShard` rank `r` keeps:
/// the piece is chunked into `split_factor` parts, each part into `k` chunks, and the rank
/// keeps chunk `r` of every part, in order.
///
/// Mirrors `_StridedShard._split_tensor` / `local_shard_size_and_offset`
/// (torch/distributed/tensor/placement_types.py), computed on ranges instead of an arange.
fn strided_positions(n: u64, k: u64, r: u64, split_factor: u64) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for j in 0..split_factor {
        let (part_len, part_start) = chunk(n, split_factor, j);
        let (len, start) = chunk(part_len, k, r);
        if len > 0 {
            push_range(&mut out, part_start + start, len);
        }
    }
    out
}

/// Appends `(start, len)` to increasing disjoint ranges, merging with the last when adjacent.
fn push_range(ranges: &mut Vec<(u64, u64)>, start: u64, len: u64) {
    if let Some(last) = ranges.last_mut() {
        if last.0 + last.1 == start {
            last.1 += len;
            return;
        }
    }
    ranges.push((start, len));
}

/// Picks positions `sel` (increasing ranges of positions into `set`) out of the index set
/// `set` (increasing ranges of global indices): torch's `previous_offsets[i] for i in offsets`.
fn select(set: &[(u64, u64)], sel: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    let mut i = 0; // current range of `set`
    let mut before = 0; // positions in set[..i]
    for &(mut pos, mut len) in sel {
        while len > 0 {
            while i < set.len() && pos >= before + set[i].1 {
                before += set[i].1;
                i += 1;
            }
            let Some(&(start, range_len)) = set.get(i) else {
                return out; // positions beyond the set cannot happen: sizes come from `set`
            };
            let within = pos - before;
            let take = len.min(range_len - within);
            push_range(&mut out, start + within, take);
            pos += take;
            len -= take;
        }
    }
    out
}

/// What a sequence of shardings of one tensor dimension leaves to a rank.
#[derive(Debug, Clone, PartialEq, Eq)]
enum DimSelection {
    /// The dimension is not sharded.
    Full,
    /// Sharded down to nothing.
    Empty,
    /// The global indices held, as increasing, coalesced ranges.
    Ranges(Vec<(u64, u64)>),
}

/// One sharding step of a tensor dimension: the placement, the mesh dimension's size and the
/// rank's coordinate on it.
#[derive(Debug, Clone, Copy)]
struct Step {
    split_factor: Option<u64>,
    mesh_size: u64,
    coord: u64,
}

/// Applies the shardings of one tensor dimension of size `global` in mesh-dimension order,
/// each one cutting the current local piece: the per-dimension core of torch's
/// `_compute_local_shape_and_global_offset`.
fn select_dim(global: u64, steps: &[Step]) -> DimSelection {
    let mut current = DimSelection::Full;
    let mut size = global;
    for step in steps {
        let positions = match step.split_factor {
            None => {
                let (len, start) = chunk(size, step.mesh_size, step.coord);
                if len == 0 {
                    Vec::new()
                } else {
                    vec![(start, len)]
                }
            }
            Some(sf) => strided_positions(size, step.mesh_size, step.coord, sf),
        };
        size = positions.iter().map(|r| r.1).sum();
        current = if size == 0 {
            DimSelection::Empty
        } else {
            match &current {
                DimSelection::Full => DimSelection::Ranges(positions),
                DimSelection::Ranges(set) => DimSelection::Ranges(select(set, &positions)),
                DimSelection::Empty => DimSelection::Empty,
            }
        };
    }
    current
}

/// This rank's shard of a DTensor as a [`Block`] of the full tensor, or a replica.
///
/// Mirrors torch's `compute_local_shape_and_global_offset` /
/// `_compute_local_shape_and_global_offset` (torch/distributed/tensor/_utils.py, the version
/// that tracks explicit index lists per sharded dimension): placements are applied left to
/// right in mesh-dimension order; a `Shard(d)` takes torch.chunk piece `coord` of the current
/// local piece of dimension `d` (`ceil(n/k)` per piece, trailing pieces short or empty); a
/// `_StridedShard(d, sf)` takes piece `coord` of each of the `sf` torch.chunk parts; several
/// mesh dimensions on one tensor dimension compose (each splits what the previous left); the
/// offset of a dimension is the first global index held, or `global_shape[d]` when the rank's
/// piece of it is empty. `Replicate` does not cut; a rank with a nonzero coordinate on a
/// `Replicate` dimension is a [`ShardPlacement::Replica`] of the block coordinate 0 holds.
///
/// Refused (for every rank alike): `Partial` (a pending reduction, not a weight); layouts whose
/// lengths disagree (a rank outside the mesh, as with pipeline stages that do not hold the
/// parameter, has no coordinate); coordinates outside the mesh; sharding dimensions outside
/// the tensor; a zero mesh size or split factor; and `_StridedShard` layouts under which any
/// coordinate would hold indices that are not one contiguous range (torch then reports only
/// the first index, which is not a block).
pub fn local_block(layout: &DTensorLayout) -> Result<ShardPlacement> {
    let DTensorLayout {
        mesh_shape,
        coords,
        placements,
        global_shape,
    } = layout;
    if coords.len() != mesh_shape.len() || placements.len() != mesh_shape.len() {
        return Err(Error::InvalidArgument(format!(
            "layout has {} mesh dims, {} coordinates and {} placements; they must agree (a \
             rank outside the mesh, e.g. another pipeline stage, is not supported)",
            mesh_shape.len(),
            coords.len(),
            placements.len()
        )));
    }
    checked_numel(global_shape)?;
    for (m, (&size, &coord)) in mesh_shape.iter().zip(coords).enumerate() {
        if size == 0 {
            return Err(Error::InvalidArgument(format!("mesh dim {m} has size 0")));
        }
        if coord >= size {
            return Err(Error::InvalidArgument(format!(
                "coordinate {coord} on mesh dim {m} is outside the mesh (size {size})"
            )));
        }
    }
    let mut replica = false;
    for (m, p) in placements.iter().enumerate() {
        match *p {
            MeshPlacement::Partial => {
                return Err(Error::InvalidArgument(format!(
                    "placement Partial on mesh dim {m}: a partial (unreduced) tensor is not a \
                     final weight"
                )));
            }
            MeshPlacement::Replicate => replica |= coords[m] != 0,
            MeshPlacement::Shard { dim } | MeshPlacement::StridedShard { dim, .. } => {
                if dim >= global_shape.len() {
                    return Err(Error::InvalidArgument(format!(
                        "placement {p:?} on mesh dim {m} shards dim {dim} of a {}-dim tensor",
                        global_shape.len()
                    )));
                }
                if let MeshPlacement::StridedShard {
                    split_factor: 0, ..
                } = p
                {
                    return Err(Error::InvalidArgument(format!(
                        "placement {p:?} on mesh dim {m} has split_factor 0"
                    )));
                }
            }
        }
    }

    let mut offset = vec![0u64; global_shape.len()];
    let mut shape = global_shape.clone();
    for (t, &global) in global_shape.iter().enumerate() {
        let mesh_dims: Vec<(usize, Option<u64>)> = placements
            .iter()
            .enumerate()
            .filter_map(|(m, p)| match *p {
                MeshPlacement::Shard { dim } if dim == t => Some((m, None)),
                MeshPlacement::StridedShard { dim, split_factor } if dim == t => {
                    Some((m, Some(split_factor)))
                }
                _ => None,
            })
            .collect();
        if mesh_dims.iter().any(|&(_, sf)| sf.is_some()) {
            check_all_blocks(global, t, &mesh_dims, mesh_shape)?;
        }
        let steps: Vec<Step> = mesh_dims
            .iter()
            .map(|&(m, split_factor)| Step {
                split_factor,
                mesh_size: mesh_shape[m],
                coord: coords[m],
            })
            .collect();
        match select_dim(global, &steps) {
            DimSelection::Full => {}
            DimSelection::Empty => {
                offset[t] = global;
                shape[t] = 0;
            }
            DimSelection::Ranges(ranges) => match ranges.as_slice() {
                [(start, len)] => {
                    offset[t] = *start;
                    shape[t] = *len;
                }
                _ => unreachable_noncontiguous(t)?,
            },
        }
    }
    let block = Block::new(global_shape.clone(), offset, shape)?;
    Ok(if replica {
        ShardPlacement::Replica(block)
    } else {
        ShardPlacement::Block(block)
    })
}

/// [`check_all_blocks`] already proved contiguity for every coordinate; kept as an error
/// rather than a panic so a logic slip cannot take a trainer down.
fn unreachable_noncontiguous(dim: usize) -> Result<()> {
    Err(Error::InvalidArgument(format!(
        "dim {dim}: this rank's indices are not one contiguous block"
    )))
}

/// Refuses a layout if any coordinate of the mesh dimensions sharding tensor dimension `dim`
/// would hold a non-contiguous set of its indices. Checking every coordinate (not just this
/// rank's) makes the verdict identical on all ranks. Cost: the product of those mesh sizes.
fn check_all_blocks(
    global: u64,
    dim: usize,
    mesh_dims: &[(usize, Option<u64>)],
    mesh_shape: &[u64],
) -> Result<()> {
    let sizes: Vec<u64> = mesh_dims.iter().map(|&(m, _)| mesh_shape[m]).collect();
    let mut coord = vec![0u64; sizes.len()];
    loop {
        let steps: Vec<Step> = mesh_dims
            .iter()
            .zip(&coord)
            .map(|(&(m, split_factor), &c)| Step {
                split_factor,
                mesh_size: mesh_shape[m],
                coord: c,
            })
            .collect();
        if let DimSelection::Ranges(ranges) = select_dim(global, &steps) {
            if ranges.len() > 1 {
                let shown: Vec<String> = ranges
                    .iter()
                    .take(4)
                    .map(|&(s, l)| format!("{s}..{}", s + l))
                    .collect();
                let mesh: Vec<usize> = mesh_dims.iter().map(|&(m, _)| m).collect();
                return Err(Error::InvalidArgument(format!(
                    "_StridedShard layout is not a block placement: on tensor dim {dim} (size \
                     {global}) the rank at coordinate {coord:?} of mesh dims {mesh:?} would hold \
                     indices {}{}, not one contiguous range",
                    shown.join(", "),
                    if ranges.len() > 4 { ", …" } else { "" }
                )));
            }
        }
        // Next coordinate (odometer, last fastest).
        let mut d = sizes.len();
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            coord[d] += 1;
            if coord[d] < sizes[d] {
                break;
            }
            coord[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use MeshPlacement::*;

    fn layout(
        mesh: &[u64],
        coords: &[u64],
        placements: &[MeshPlacement],
        shape: &[u64],
    ) -> DTensorLayout {
        DTensorLayout {
            mesh_shape: mesh.to_vec(),
            coords: coords.to_vec(),
            placements: placements.to_vec(),
            global_shape: shape.to_vec(),
        }
    }

    /// (shape, offset) per rank of a 1-D mesh.
    fn one_d(n: u64, world: u64) -> Vec<(u64, u64)> {
        (0..world)
            .map(|r| {
                let b = local_block(&layout(&[world], &[r], &[Shard { dim: 0 }], &[n])).unwrap();
                (b.block().shape()[0], b.block().offset()[0])
            })
            .collect()
    }

    #[test]
    fn torch_chunk_sizes_with_short_and_empty_tails() {
        // Sizes: torch.chunk; offsets of empty shards: global_shape[dim] (torch's
        // zero_global_offset).
        assert_eq!(one_d(10, 4), vec![(3, 0), (3, 3), (3, 6), (1, 9)]);
        assert_eq!(one_d(5, 4), vec![(2, 0), (2, 2), (1, 4), (0, 5)]);
        assert_eq!(one_d(2, 4), vec![(1, 0), (1, 1), (0, 2), (0, 2)]);
        assert_eq!(one_d(8, 4), vec![(2, 0), (2, 2), (2, 4), (2, 6)]);
        assert_eq!(one_d(0, 3), vec![(0, 0), (0, 0), (0, 0)]);
        // 6 over 4: torch.chunk gives only 3 chunks of 2; the 4th rank is empty.
        assert_eq!(one_d(6, 4), vec![(2, 0), (2, 2), (2, 4), (0, 6)]);
    }

    #[test]
    fn torch_docstring_example_shard1_shard1() {
        // compute_local_shape_and_global_offset docstring: [[0..5],[10..15]] on mesh (2, 2)
        // with (Shard(1), Shard(1)) gives shapes (2,2),(2,1),(2,1),(2,1), offsets (0,0),(0,2),
        // (0,3),(0,4).
        let want = [
            ([2, 2], [0, 0]),
            ([2, 1], [0, 2]),
            ([2, 1], [0, 3]),
            ([2, 1], [0, 4]),
        ];
        for (rank, (shape, offset)) in want.iter().enumerate() {
            let c = [rank as u64 / 2, rank as u64 % 2];
            let p = local_block(&layout(
                &[2, 2],
                &c,
                &[Shard { dim: 1 }, Shard { dim: 1 }],
                &[2, 5],
            ))
            .unwrap();
            assert_eq!(p.block().shape(), shape, "rank {rank}");
            assert_eq!(p.block().offset(), offset, "rank {rank}");
        }
    }

    #[test]
    fn strided_shard_fsdp_over_tp_offsets() {
        // _StridedShard docstring: [8, 8] on mesh (dp=2, tp=2) with [_StridedShard(0, 2),
        // Shard(0)]: (0,0) rows 0-1, (0,1) rows 4-5, (1,0) rows 2-3, (1,1) rows 6-7, i.e. the
        // TP-first (right-to-left) order FSDP2 produces.
        let pl = [
            StridedShard {
                dim: 0,
                split_factor: 2,
            },
            Shard { dim: 0 },
        ];
        let rows = |c: [u64; 2]| {
            let b = local_block(&layout(&[2, 2], &c, &pl, &[8, 8])).unwrap();
            (b.block().offset().to_vec(), b.block().shape().to_vec())
        };
        assert_eq!(rows([0, 0]), (vec![0, 0], vec![2, 8]));
        assert_eq!(rows([0, 1]), (vec![4, 0], vec![2, 8]));
        assert_eq!(rows([1, 0]), (vec![2, 0], vec![2, 8]));
        assert_eq!(rows([1, 1]), (vec![6, 0], vec![2, 8]));
        // The plain [Shard(0), Shard(0)] goes left to right instead.
        let b = local_block(&layout(
            &[2, 2],
            &[0, 1],
            &[Shard { dim: 0 }, Shard { dim: 0 }],
            &[8, 8],
        ))
        .unwrap();
        assert_eq!(b.block().offset(), &[2, 0]);
    }

    #[test]
    fn strided_shard_uneven_follows_torch_index_lists() {
        // 10 rows, tp=4 then dp=2: tp chunks [0,3) [3,6) [6,9) [9,10); dp halves of each; dp0
        // keeps rows 0,1,3,4,6,7,9, then Shard(0) over tp cuts that list into 2,2,2,1.
        let pl = [
            StridedShard {
                dim: 0,
                split_factor: 4,
            },
            Shard { dim: 0 },
        ];
        let want = [
            ((0, 0), (0, 2)),
            ((0, 1), (3, 2)),
            ((0, 2), (6, 2)),
            ((0, 3), (9, 1)),
            ((1, 0), (2, 1)),
            ((1, 1), (5, 1)),
            ((1, 2), (8, 1)),
            ((1, 3), (10, 0)),
        ];
        for ((dp, tp), (off, len)) in want {
            let b = local_block(&layout(&[2, 4], &[dp, tp], &pl, &[10])).unwrap();
            assert_eq!(
                (b.block().offset()[0], b.block().shape()[0]),
                (off, len),
                "{dp},{tp}"
            );
        }
    }

    #[test]
    fn strided_shard_that_is_not_a_block_is_refused_on_every_rank() {
        // 25 rows, tp=2 then dp=4: dp3 keeps rows 12 and 22..25, and Shard(0) over tp gives
        // (3,0) rows {12, 22}: not a block. Every rank must refuse, not only (3,0).
        let pl = [
            StridedShard {
                dim: 0,
                split_factor: 2,
            },
            Shard { dim: 0 },
        ];
        for dp in 0..4 {
            for tp in 0..2 {
                let err = local_block(&layout(&[4, 2], &[dp, tp], &pl, &[25, 3])).unwrap_err();
                let msg = err.to_string();
                assert!(msg.contains("not a block placement"), "{msg}");
                assert!(msg.contains("12..13, 22..23"), "{msg}");
            }
        }
        // A lone _StridedShard splits rows into parts: rank 0 of 2 holds {0,1} and {4,5}.
        let err = local_block(&layout(
            &[2],
            &[1],
            &[StridedShard {
                dim: 0,
                split_factor: 2,
            }],
            &[8],
        ))
        .unwrap_err();
        assert!(err.to_string().contains("0..2, 4..6"), "{err}");
    }

    #[test]
    fn strided_shard_where_fsdp2_data_differs_still_follows_torch() {
        // 7 rows, mesh (dp=3, tp=2), [_StridedShard(0, 2), Shard(0)]. torch's metadata puts row
        // 6 on (2,0); FSDP2's data (chunk 2 of TP chunk) puts it on (2,1). We follow torch's
        // metadata; `check_local_shape` catches the disagreement on the rank that has the data.
        let pl = [
            StridedShard {
                dim: 0,
                split_factor: 2,
            },
            Shard { dim: 0 },
        ];
        let b20 = local_block(&layout(&[3, 2], &[2, 0], &pl, &[7, 4])).unwrap();
        assert_eq!(
            (b20.block().offset(), b20.block().shape()),
            (&[6, 0][..], &[1, 4][..])
        );
        let b21 = local_block(&layout(&[3, 2], &[2, 1], &pl, &[7, 4])).unwrap();
        assert_eq!(b21.block().shape(), &[0, 4]);
        assert!(b20.check_local_shape(&[0, 4]).is_err());
        assert!(b21.check_local_shape(&[1, 4]).is_err());
        assert!(b21.check_local_shape(&[0, 4]).is_ok());
    }

    #[test]
    fn replicate_contributes_only_at_coordinate_zero() {
        let pl = [Replicate, Shard { dim: 0 }, Shard { dim: 1 }];
        let p0 = local_block(&layout(&[2, 2, 2], &[0, 1, 1], &pl, &[5, 3])).unwrap();
        let p1 = local_block(&layout(&[2, 2, 2], &[1, 1, 1], &pl, &[5, 3])).unwrap();
        assert!(!p0.is_replica());
        assert!(p1.is_replica());
        assert_eq!(p0.block(), p1.block());
        assert_eq!(p0.block().offset(), &[3, 2]);
        assert_eq!(p0.block().shape(), &[2, 1]);
        assert!(p1.contributing().is_none());
    }

    #[test]
    fn bad_layouts_are_refused() {
        let s0 = Shard { dim: 0 };
        let cases = [
            (layout(&[2], &[0], &[Partial], &[4]), "Partial"),
            (layout(&[2], &[2], &[s0], &[4]), "outside the mesh"),
            (layout(&[2, 2], &[0], &[s0, s0], &[4]), "must agree"),
            (layout(&[2], &[0], &[], &[4]), "must agree"),
            (
                layout(&[2], &[0], &[Shard { dim: 1 }], &[4]),
                "1-dim tensor",
            ),
            (layout(&[0], &[0], &[s0], &[4]), "size 0"),
            (
                layout(
                    &[2],
                    &[0],
                    &[StridedShard {
                        dim: 0,
                        split_factor: 0,
                    }],
                    &[4],
                ),
                "split_factor 0",
            ),
            (layout(&[], &[], &[], &[u64::MAX, 3]), "overflows"),
        ];
        for (l, needle) in cases {
            let msg = local_block(&l).unwrap_err().to_string();
            assert!(msg.contains(needle), "{msg} lacks {needle}");
        }
    }

    #[test]
    fn scalars_and_empty_meshes() {
        let p = local_block(&layout(&[], &[], &[], &[])).unwrap();
        assert_eq!(p.block().numel(), 1);
        let mut out = Vec::new();
        p.block().to_global_positions(&[0], &mut out);
        assert_eq!(out, [0]);
        assert_eq!(p.block().global_ranges().collect::<Vec<_>>(), [(0, 1)]);
        let p = local_block(&layout(&[3], &[2], &[Replicate], &[])).unwrap();
        assert!(p.is_replica());
    }

    #[test]
    fn experts_and_compose() {
        let b = Block::experts(8, 2, 3, &[4, 5]).unwrap();
        assert_eq!(b.global_shape(), &[8, 4, 5]);
        assert_eq!(b.offset(), &[2, 0, 0]);
        assert_eq!(b.global_ranges().collect::<Vec<_>>(), [(40, 60)]);
        assert!(Block::experts(8, 6, 3, &[4]).is_err());
        // FSDP over the 3 local experts, rank 1 of 2: expert 2 of the local ones = global 4.
        let inner = local_block(&layout(&[2], &[1], &[Shard { dim: 0 }], &[3, 4, 5])).unwrap();
        let c = b.compose(inner.block()).unwrap();
        assert_eq!(c.offset(), &[4, 0, 0]);
        assert_eq!(c.shape(), &[1, 4, 5]);
        assert!(b.compose(&Block::full(vec![3, 4]).unwrap()).is_err());
    }

    /// Reference: global flat index of every local element by full index arithmetic.
    fn naive_globals(b: &Block) -> Vec<u64> {
        let n = b.shape().len();
        let mut out = Vec::new();
        for l in 0..b.numel() {
            let (mut rest, mut g, mut gs) = (l, 0u64, 1u64);
            for d in (0..n).rev() {
                let i = rest % b.shape()[d];
                rest /= b.shape()[d];
                g += (b.offset()[d] + i) * gs;
                gs *= b.global_shape()[d];
            }
            out.push(g);
        }
        out
    }

    #[test]
    fn positions_and_ranges_match_index_arithmetic() {
        let mut state = 7u64;
        let mut next = |m: u64| {
            state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = state;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            (z ^ (z >> 31)) % m
        };
        for _ in 0..2000 {
            let ndim = next(5) as usize;
            let global: Vec<u64> = (0..ndim).map(|_| next(6)).collect();
            let shape: Vec<u64> = global.iter().map(|&g| next(g + 1)).collect();
            let offset: Vec<u64> = global
                .iter()
                .zip(&shape)
                .map(|(&g, &s)| next(g - s + 1))
                .collect();
            let b = Block::new(global, offset, shape).unwrap();
            let want = naive_globals(&b);
            let all: Vec<u64> = (0..b.numel()).collect();
            let mut got = Vec::new();
            b.to_global_positions(&all, &mut got);
            assert_eq!(got, want, "{b:?}");
            let from_ranges: Vec<u64> = b.global_ranges().flat_map(|(s, l)| s..s + l).collect();
            assert_eq!(from_ranges, want, "{b:?}");
            // A sparse subset.
            let some: Vec<u64> = all.iter().copied().filter(|_| next(3) == 0).collect();
            let mut got = vec![99];
            b.to_global_positions(&some, &mut got);
            let want_some: Vec<u64> = some.iter().map(|&l| want[l as usize]).collect();
            assert_eq!(got[1..], want_some[..]);
        }
    }

    #[test]
    fn select_composes_index_lists() {
        assert_eq!(select(&[(0, 2), (4, 2)], &[(1, 2)]), vec![(1, 1), (4, 1)]);
        assert_eq!(
            select(&[(0, 2), (4, 2)], &[(0, 1), (3, 1)]),
            vec![(0, 1), (5, 1)]
        );
        assert_eq!(select(&[(10, 5)], &[(1, 3)]), vec![(11, 3)]);
        assert_eq!(strided_positions(8, 2, 0, 2), vec![(0, 2), (4, 2)]);
        assert_eq!(strided_positions(7, 3, 2, 2), vec![(6, 1)]);
    }
}
