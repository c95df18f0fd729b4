//! Slot conversion on the sender: a trainer parameter becomes K ≥ 1 receiver slots.
//!
//! Trainers often fuse what the receiver keeps apart (q/k/v rows in one matrix, gate and up
//! projections of every expert in one `[E, 2I, H]` stack). Each rank converts the changes of
//! its own shard into the slots' final coordinates before anything is gathered, with no
//! communication, so the leader only concatenates (coordinates leave the sender final: the
//! wire carries positions in each slot's own coordinates, docs/wire-format.md). Every conversion here is "split one dimension into named pieces, optionally per
//! expert of a leading stack dimension": a row-major index map that is increasing within each
//! slot, so sorted input gives sorted per-slot output and blocks of different ranks stay
//! disjoint.

use std::collections::HashMap;
use std::ops::Range;

use crate::diff::Changes;
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::placement::{local_block, Block, DTensorLayout, ShardPlacement};
use crate::slot::{SlotInfo, SlotTable};

/// The placeholder for the expert index in slot name templates of stacked parameters.
pub const EXPERT_PLACEHOLDER: &str = "{e}";

/// How one trainer parameter maps to receiver slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Converter {
    /// One slot, same shape, named `slot`.
    Identity { slot: String },
    /// A `[q + k + v, ...]` parameter whose rows are q, then k, then v (concatenated, not
    /// interleaved per head group): slots `q`, `k`, `v` of `sizes[0]`, `sizes[1]`, `sizes[2]`
    /// rows.
    FusedQkv {
        q: String,
        k: String,
        v: String,
        sizes: [u64; 3],
    },
    /// A `[E, 2I, ...]` stack of fused gate/up projections: for every expert `e`, slots
    /// `gate` and `up` (templates where `{e}` becomes the expert index) of shape `[I, ...]`:
    /// rows `0..I` and `I..2I` of expert `e`.
    FusedExperts { gate: String, up: String },
    /// The general form the others lower to.
    Split(SplitSpec),
}

/// Split dimension `dim` of a parameter into consecutive named pieces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SplitSpec {
    /// Whether dimension 0 is a stack of experts. Each expert then yields its own pieces,
    /// named from templates containing `{e}`, and the slots lose dimension 0.
    pub stacked: bool,
    /// The parameter dimension that is split (counting the stack dimension; ≥ 1 if stacked).
    pub dim: usize,
    /// Slot name (template if stacked) and size along `dim`; sizes sum to the dimension.
    pub pieces: Vec<(String, u64)>,
}

impl Converter {
    /// The general form of this converter for a parameter of `shape`.
    pub fn to_split(&self, shape: &[u64]) -> Result<SplitSpec> {
        Ok(match self {
            Converter::Identity { slot } => SplitSpec {
                stacked: false,
                dim: 0,
                pieces: vec![(slot.clone(), shape.first().copied().unwrap_or(1))],
            },
            Converter::FusedQkv { q, k, v, sizes } => SplitSpec {
                stacked: false,
                dim: 0,
                pieces: vec![
                    (q.clone(), sizes[0]),
                    (k.clone(), sizes[1]),
                    (v.clone(), sizes[2]),
                ],
            },
            Converter::FusedExperts { gate, up } => {
                let Some(&fused) = shape.get(1) else {
                    return Err(Error::InvalidArgument(format!(
                        "FusedExperts needs an [E, 2I, ...] parameter, got shape {shape:?}"
                    )));
                };
                if !fused.is_multiple_of(2) {
                    return Err(Error::InvalidArgument(format!(
                        "FusedExperts: dim 1 of shape {shape:?} is odd, cannot halve it into \
                         gate and up"
                    )));
                }
                SplitSpec {
                    stacked: true,
                    dim: 1,
                    pieces: vec![(gate.clone(), fused / 2), (up.clone(), fused / 2)],
                }
            }
            Converter::Split(spec) => spec.clone(),
        })
    }
}

/// A checked split, with the sizes the index map needs.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Lowered {
    stacked: bool,
    /// Experts in the stack (1 if not stacked).
    experts: u64,
    dim: usize,
    names: Vec<String>,
    sizes: Vec<u64>,
    /// Start of each piece along `dim`.
    starts: Vec<u64>,
    /// Product of the dimensions between the stack (or the start) and `dim`.
    outer: u64,
    /// Size of `dim`.
    dim_len: u64,
    /// Product of the dimensions after `dim`.
    inner: u64,
    /// Shape of each piece's slot.
    slot_shapes: Vec<Vec<u64>>,
}

impl Lowered {
    fn new(param: &str, shape: &[u64], converter: &Converter) -> Result<Self> {
        let bad = |why: String| Error::InvalidArgument(format!("parameter `{param}`: {why}"));
        let spec = converter.to_split(shape).map_err(|e| bad(e.to_string()))?;
        if shape.is_empty() {
            // A scalar: only the identity makes sense.
            return match converter {
                Converter::Identity { slot } => Ok(Lowered {
                    stacked: false,
                    experts: 1,
                    dim: 0,
                    names: vec![slot.clone()],
                    sizes: vec![1],
                    starts: vec![0],
                    outer: 1,
                    dim_len: 1,
                    inner: 1,
                    slot_shapes: vec![Vec::new()],
                }),
                _ => Err(bad("a scalar parameter only converts with Identity".into())),
            };
        }
        let SplitSpec {
            stacked,
            dim,
            pieces,
        } = spec;
        if dim >= shape.len() {
            return Err(bad(format!(
                "split dim {dim} is outside the {}-dim shape {shape:?}",
                shape.len()
            )));
        }
        if stacked && dim == 0 {
            return Err(bad(
                "a stacked split cannot split dim 0, which is the expert stack".into(),
            ));
        }
        if pieces.is_empty() {
            return Err(bad("a split needs at least one piece".into()));
        }
        let total = pieces
            .iter()
            .try_fold(0u64, |acc, (_, s)| acc.checked_add(*s));
        if total != Some(shape[dim]) {
            let sizes: Vec<u64> = pieces.iter().map(|p| p.1).collect();
            return Err(bad(format!(
                "piece sizes {sizes:?} do not add up to dim {dim} of shape {shape:?}"
            )));
        }
        for (name, _) in &pieces {
            if name.contains(EXPERT_PLACEHOLDER) != stacked {
                return Err(bad(if stacked {
                    format!("slot template `{name}` of a stacked parameter lacks `{{e}}`")
                } else {
                    format!("slot name `{name}` has `{{e}}` but the parameter is not stacked")
                }));
            }
        }
        let first = usize::from(stacked);
        let product = |dims: &[u64]| dims.iter().product::<u64>();
        let mut starts = Vec::with_capacity(pieces.len());
        let mut slot_shapes = Vec::with_capacity(pieces.len());
        let mut at = 0;
        for (_, size) in &pieces {
            starts.push(at);
            at += size;
            let mut s = shape[first..].to_vec();
            s[dim - first] = *size;
            slot_shapes.push(s);
        }
        Ok(Lowered {
            stacked,
            experts: if stacked { shape[0] } else { 1 },
            dim,
            names: pieces.iter().map(|p| p.0.clone()).collect(),
            sizes: pieces.iter().map(|p| p.1).collect(),
            starts,
            outer: product(&shape[first..dim]),
            dim_len: shape[dim],
            inner: product(&shape[dim + 1..]),
            slot_shapes,
        })
    }

    fn slot_count(&self) -> u64 {
        self.experts * self.sizes.len() as u64
    }

    /// The slots, expert-major then piece order.
    fn slots(&self, dtype: DType) -> Vec<SlotInfo> {
        let mut out = Vec::with_capacity(self.slot_count() as usize);
        for e in 0..self.experts {
            for (name, shape) in self.names.iter().zip(&self.slot_shapes) {
                let name = if self.stacked {
                    name.replace(EXPERT_PLACEHOLDER, &e.to_string())
                } else {
                    name.clone()
                };
                out.push(SlotInfo::new(name, dtype, shape.clone()));
            }
        }
        out
    }

    /// Whether slot coordinates equal parameter coordinates (one slot, same shape).
    fn is_identity(&self) -> bool {
        !self.stacked && self.sizes.len() == 1
    }
}

/// The receiver-side slots of one parameter, in the deterministic order the table uses:
/// expert by expert (if stacked), pieces in the converter's order.
pub fn slots_of(
    param_name: &str,
    param_shape: &[u64],
    dtype: DType,
    converter: &Converter,
) -> Result<Vec<SlotInfo>> {
    Ok(Lowered::new(param_name, param_shape, converter)?.slots(dtype))
}

/// A trainer parameter: its name, full shape, dtype and how it maps to slots.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParamSpec {
    pub name: String,
    pub shape: Vec<u64>,
    pub dtype: DType,
    pub converter: Converter,
}

impl ParamSpec {
    pub fn new(
        name: impl Into<String>,
        shape: Vec<u64>,
        dtype: DType,
        converter: Converter,
    ) -> Self {
        ParamSpec {
            name: name.into(),
            shape,
            dtype,
            converter,
        }
    }

    /// A parameter the receiver names the same, with the same shape.
    pub fn identity(name: impl Into<String>, shape: Vec<u64>, dtype: DType) -> Self {
        let name = name.into();
        let converter = Converter::Identity { slot: name.clone() };
        ParamSpec::new(name, shape, dtype, converter)
    }
}

/// The slot table of a parameter list: each parameter's slots in turn. It depends only on the
/// list, so every rank that enumerates the same parameters in the same order builds the same
/// table (same hash).
pub fn build_table(params: &[ParamSpec]) -> Result<SlotTable> {
    Ok(SlotMap::new(params.to_vec())?.table)
}

#[derive(Debug, Clone)]
struct ParamEntry {
    spec: ParamSpec,
    lowered: Lowered,
    first_slot: u32,
}

/// Parameters, their slots and the table, shared by every shard plan of a rank.
#[derive(Debug, Clone)]
pub struct SlotMap {
    table: SlotTable,
    params: Vec<ParamEntry>,
    by_name: HashMap<String, usize>,
}

impl SlotMap {
    /// Checks every converter against its parameter and builds the table. Parameter names
    /// must be unique; slot names must be unique across all parameters.
    pub fn new(params: Vec<ParamSpec>) -> Result<Self> {
        let mut slots = Vec::new();
        let mut entries = Vec::with_capacity(params.len());
        let mut by_name = HashMap::with_capacity(params.len());
        for (index, spec) in params.into_iter().enumerate() {
            if by_name.insert(spec.name.clone(), index).is_some() {
                return Err(Error::InvalidArgument(format!(
                    "duplicate parameter name `{}`",
                    spec.name
                )));
            }
            let lowered = Lowered::new(&spec.name, &spec.shape, &spec.converter)?;
            let first_slot = u32::try_from(slots.len())
                .map_err(|_| Error::InvalidArgument("too many slots".into()))?;
            slots.extend(lowered.slots(spec.dtype));
            entries.push(ParamEntry {
                spec,
                lowered,
                first_slot,
            });
        }
        Ok(SlotMap {
            table: SlotTable::new(slots)?,
            params: entries,
            by_name,
        })
    }

    pub fn table(&self) -> &SlotTable {
        &self.table
    }

    pub fn len(&self) -> usize {
        self.params.len()
    }

    pub fn is_empty(&self) -> bool {
        self.params.is_empty()
    }

    pub fn param(&self, index: usize) -> Result<&ParamSpec> {
        self.entry(index).map(|e| &e.spec)
    }

    pub fn param_index(&self, name: &str) -> Result<usize> {
        self.by_name
            .get(name)
            .copied()
            .ok_or_else(|| Error::InvalidArgument(format!("unknown parameter `{name}`")))
    }

    /// The ids of a parameter's slots in the table (consecutive).
    pub fn slot_ids(&self, index: usize) -> Result<Range<u32>> {
        let e = self.entry(index)?;
        Ok(e.first_slot..e.first_slot + e.lowered.slot_count() as u32)
    }

    /// The plan that converts this rank's shard of parameter `index`, placed as `placement`.
    pub fn plan(&self, index: usize, placement: &ShardPlacement) -> Result<ParamPlan> {
        let e = self.entry(index)?;
        let block = placement.block();
        if block.global_shape() != e.spec.shape.as_slice() {
            return Err(Error::InvalidArgument(format!(
                "parameter `{}` has shape {:?}, but its placement is a block of a {:?} tensor",
                e.spec.name,
                e.spec.shape,
                block.global_shape()
            )));
        }
        Ok(ParamPlan {
            first_slot: e.first_slot,
            lowered: e.lowered.clone(),
            block: block.clone(),
            replica: placement.is_replica(),
            width: e.spec.dtype.width(),
        })
    }

    /// [`SlotMap::plan`] from a DTensor layout, naming the parameter in any error.
    pub fn plan_layout(&self, index: usize, layout: &DTensorLayout) -> Result<ParamPlan> {
        let name = &self.entry(index)?.spec.name;
        let placement = local_block(layout)
            .map_err(|e| Error::InvalidArgument(format!("parameter `{name}`: {e}")))?;
        self.plan(index, &placement)
    }

    fn entry(&self, index: usize) -> Result<&ParamEntry> {
        self.params.get(index).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "parameter index {index} out of range ({} parameters)",
                self.params.len()
            ))
        })
    }
}

/// One rank's shard of one parameter, ready to turn its changes into per-slot changes.
#[derive(Debug, Clone)]
pub struct ParamPlan {
    first_slot: u32,
    lowered: Lowered,
    block: Block,
    replica: bool,
    width: usize,
}

impl ParamPlan {
    /// Slot ids this parameter covers, in the order [`ParamPlan::convert`] fills its output.
    pub fn slot_ids(&self) -> Range<u32> {
        self.first_slot..self.first_slot + self.lowered.slot_count() as u32
    }

    pub fn slot_count(&self) -> usize {
        self.lowered.slot_count() as usize
    }

    pub fn block(&self) -> &Block {
        &self.block
    }

    pub fn is_replica(&self) -> bool {
        self.replica
    }

    /// Converts the changes of the local piece (positions are sorted row-major flat indices
    /// of the block, values `width` bytes each, as `diff` produces them) into one `Changes` per
    /// slot of [`ParamPlan::slot_ids`]: positions sorted, in the slot's final flat coordinates,
    /// with their old and new values. `out` is resized to the slot count and cleared first (its
    /// buffers are reused). A replica produces only empty entries: it takes part with zero
    /// counts.
    pub fn convert(&self, local: &Changes, out: &mut Vec<Changes>) -> Result<()> {
        out.resize_with(self.slot_count(), Changes::default);
        out.iter_mut().for_each(Changes::clear);
        if self.replica || local.is_empty() {
            return Ok(());
        }
        let (n, w) = (local.positions.len(), self.width);
        if local.old_values.len() != n * w || local.new_values.len() != n * w {
            return Err(Error::InvalidArgument(format!(
                "changes hold {n} positions but {} old and {} new value bytes ({w} per element)",
                local.old_values.len(),
                local.new_values.len()
            )));
        }
        if let Some(&last) = local.positions.last() {
            if last >= self.block.numel() {
                return Err(Error::InvalidArgument(format!(
                    "change position {last} is outside the local piece of {} elements",
                    self.block.numel()
                )));
            }
        }
        if self.lowered.is_identity() {
            let slot = &mut out[0];
            self.block
                .to_global_positions(&local.positions, &mut slot.positions);
            slot.old_values.extend_from_slice(&local.old_values);
            slot.new_values.extend_from_slice(&local.new_values);
            return Ok(());
        }
        let mut global = Vec::with_capacity(n);
        self.block
            .to_global_positions(&local.positions, &mut global);
        self.split(&global, local, out);
        Ok(())
    }

    /// Routes sorted global positions to slots. A segment is a run of global indices with one
    /// (expert, outer index, piece): it maps to consecutive slot positions, so only a new
    /// segment costs divisions, and values move in batches per segment.
    fn split(&self, global: &[u64], local: &Changes, out: &mut [Changes]) {
        let l = &self.lowered;
        let w = self.width;
        let pieces = l.sizes.len() as u64;
        let (mut seg_start, mut seg_end, mut slot_base) = (0u64, 0u64, 0u64);
        let mut slot = 0usize;
        let mut batch_from = 0usize;
        for (i, &g) in global.iter().enumerate() {
            if g >= seg_end {
                if i > batch_from {
                    copy_values(local, w, batch_from..i, &mut out[slot]);
                }
                batch_from = i;
                let q = g / l.inner;
                let d = q % l.dim_len;
                let rest = q / l.dim_len;
                let (e, o) = if l.stacked {
                    (rest / l.outer, rest % l.outer)
                } else {
                    (0, rest)
                };
                // The last piece starting at or before d is the non-empty piece holding d.
                let p = l.starts.partition_point(|&s| s <= d) - 1;
                seg_start = (rest * l.dim_len + l.starts[p]) * l.inner;
                seg_end = seg_start + l.sizes[p] * l.inner;
                slot_base = o * l.sizes[p] * l.inner;
                slot = (e * pieces) as usize + p;
            }
            out[slot].positions.push(slot_base + (g - seg_start));
        }
        if global.len() > batch_from {
            copy_values(local, w, batch_from..global.len(), &mut out[slot]);
        }
    }
}

fn copy_values(local: &Changes, w: usize, items: Range<usize>, to: &mut Changes) {
    let bytes = items.start * w..items.end * w;
    to.old_values
        .extend_from_slice(&local.old_values[bytes.clone()]);
    to.new_values.extend_from_slice(&local.new_values[bytes]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::placement::MeshPlacement;

    fn changes(positions: &[u64], width: usize) -> Changes {
        let mut c = Changes::default();
        for &p in positions {
            c.positions.push(p);
            c.old_values
                .extend_from_slice(&(p as u32).to_le_bytes()[..width]);
            c.new_values
                .extend_from_slice(&(p as u32 + 1).to_le_bytes()[..width]);
        }
        c
    }

    fn qkv() -> ParamSpec {
        ParamSpec::new(
            "attn.qkv",
            vec![6, 2],
            DType::BF16,
            Converter::FusedQkv {
                q: "q_proj".into(),
                k: "k_proj".into(),
                v: "v_proj".into(),
                sizes: [2, 3, 1],
            },
        )
    }

    #[test]
    fn slots_and_table() {
        let experts = ParamSpec::new(
            "moe.gate_up",
            vec![3, 4, 5],
            DType::F32,
            Converter::FusedExperts {
                gate: "experts.{e}.gate_proj.weight".into(),
                up: "experts.{e}.up_proj.weight".into(),
            },
        );
        let s = slots_of("moe.gate_up", &[3, 4, 5], DType::F32, &experts.converter).unwrap();
        let names: Vec<&str> = s.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "experts.0.gate_proj.weight",
                "experts.0.up_proj.weight",
                "experts.1.gate_proj.weight",
                "experts.1.up_proj.weight",
                "experts.2.gate_proj.weight",
                "experts.2.up_proj.weight",
            ]
        );
        assert!(s.iter().all(|s| s.shape == [2, 5] && s.dtype == DType::F32));
        let params = vec![
            ParamSpec::identity("emb", vec![7], DType::BF16),
            qkv(),
            experts,
        ];
        let t = build_table(&params).unwrap();
        assert_eq!(t.len(), 1 + 3 + 6);
        assert_eq!(t.hash(), build_table(&params).unwrap().hash());
        let map = SlotMap::new(params).unwrap();
        assert_eq!(map.slot_ids(1).unwrap(), 1..4);
        assert_eq!(map.slot_ids(2).unwrap(), 4..10);
        assert_eq!(map.table().get(2).unwrap().shape, [3, 2]);
    }

    #[test]
    fn bad_converters_are_refused() {
        let cases = [
            (
                ParamSpec::new(
                    "x",
                    vec![5, 2],
                    DType::F32,
                    Converter::FusedQkv {
                        q: "q".into(),
                        k: "k".into(),
                        v: "v".into(),
                        sizes: [2, 2, 2],
                    },
                ),
                "do not add up",
            ),
            (
                ParamSpec::new(
                    "x",
                    vec![2, 3, 2],
                    DType::F32,
                    Converter::FusedExperts {
                        gate: "g{e}".into(),
                        up: "u{e}".into(),
                    },
                ),
                "odd",
            ),
            (
                ParamSpec::new(
                    "x",
                    vec![2, 4],
                    DType::F32,
                    Converter::FusedExperts {
                        gate: "g".into(),
                        up: "u{e}".into(),
                    },
                ),
                "lacks `{e}`",
            ),
            (
                ParamSpec::new(
                    "x",
                    vec![2, 4],
                    DType::F32,
                    Converter::Split(SplitSpec {
                        stacked: false,
                        dim: 2,
                        pieces: vec![("a".into(), 4)],
                    }),
                ),
                "outside",
            ),
            (
                ParamSpec::new(
                    "x",
                    vec![],
                    DType::F32,
                    Converter::FusedExperts {
                        gate: "g{e}".into(),
                        up: "u{e}".into(),
                    },
                ),
                "parameter `x`",
            ),
        ];
        for (p, needle) in cases {
            let msg = build_table(&[p]).unwrap_err().to_string();
            assert!(msg.contains(needle), "{msg} lacks {needle}");
        }
        let dup = vec![
            ParamSpec::identity("a", vec![1], DType::F32),
            ParamSpec::identity("a", vec![1], DType::F32),
        ];
        assert!(build_table(&dup)
            .unwrap_err()
            .to_string()
            .contains("duplicate parameter"));
        let clash = vec![
            ParamSpec::identity("a", vec![1], DType::F32),
            ParamSpec::new(
                "b",
                vec![1],
                DType::F32,
                Converter::Identity { slot: "a".into() },
            ),
        ];
        assert!(build_table(&clash)
            .unwrap_err()
            .to_string()
            .contains("duplicate slot"));
    }

    #[test]
    fn qkv_rows_go_to_their_slots() {
        let map = SlotMap::new(vec![qkv()]).unwrap();
        // Rank 1 of 2 under Shard(0): rows 3..6 = k rows 1..3 and v row 0.
        let layout = DTensorLayout {
            mesh_shape: vec![2],
            coords: vec![1],
            placements: vec![MeshPlacement::Shard { dim: 0 }],
            global_shape: vec![6, 2],
        };
        let plan = map.plan_layout(0, &layout).unwrap();
        let mut out = Vec::new();
        plan.convert(&changes(&[0, 1, 3, 4, 5], 2), &mut out)
            .unwrap();
        assert_eq!(out.len(), 3);
        assert!(out[0].is_empty());
        // Local 0,1,3 = global 6,7,9 = k positions 2,3,5.
        assert_eq!(out[1].positions, [2, 3, 5]);
        assert_eq!(out[1].old_values, [0, 0, 1, 0, 3, 0]);
        assert_eq!(out[1].new_values, [1, 0, 2, 0, 4, 0]);
        // Local 4,5 = global 10,11 = v positions 0,1.
        assert_eq!(out[2].positions, [0, 1]);
        assert_eq!(out[2].old_values, [4, 0, 5, 0]);
    }

    #[test]
    fn replicas_and_bad_changes() {
        let map = SlotMap::new(vec![qkv()]).unwrap();
        let replica = ShardPlacement::Replica(Block::full(vec![6, 2]).unwrap());
        let plan = map.plan(0, &replica).unwrap();
        let mut out = vec![changes(&[1], 2)];
        plan.convert(&changes(&[0, 1], 2), &mut out).unwrap();
        assert_eq!(out.len(), 3);
        assert!(out.iter().all(Changes::is_empty));

        let full = ShardPlacement::Block(Block::full(vec![6, 2]).unwrap());
        let plan = map.plan(0, &full).unwrap();
        let err = plan.convert(&changes(&[12], 2), &mut out).unwrap_err();
        assert!(err.to_string().contains("outside the local piece"), "{err}");
        let mut short = changes(&[1], 2);
        short.new_values.pop();
        assert!(plan.convert(&short, &mut out).is_err());
        let wrong = ShardPlacement::Block(Block::full(vec![6, 3]).unwrap());
        assert!(map.plan(0, &wrong).is_err());
        assert!(map.plan(1, &full).is_err());
    }
}
