//! `deltacast stats`: how many bytes each wire costs for one step (OLD → NEW checkpoints) or
//! for every step of a recorded trace, next to the entropy bound defined in docs/codecs.md.
//!
//! Bound, per step: for every tensor of n elements with k changed, n·H(k/n) bits for the
//! positions (an iid model of the change mask), plus, for every changed element, the empirical
//! entropy of the signed ULP step (ordered-integer distance old → new) over the whole step.
//! Integer, bool and 8-byte values have no ULP step: they count at their raw size, as sent.
//!
//! Context bound: the same two terms conditioned on what the receiver holds (the model of the
//! `ctx` codecs): per tensor and class of the old bits (the 8 bits below the sign of a 2- or
//! 4-byte element) n_c·H(k_c/n_c) for the positions, and per tensor the empirical entropy of
//! the ULP step given the old sign and those 8 bits. 1-byte floats keep their iid terms.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use anyhow::{bail, Context, Result};
use safetensors::SafeTensors;
use serde_json::json;

use deltacast::diff::{diff_serial, Changes};
use deltacast::dtype::{load_bits, to_ordered};
use deltacast::flush::FlushConfig;
use deltacast::{DType, Sender, SlotInfo, SlotTable};

use crate::files::{open_checkpoint, same_tensors};
use crate::output::{bytes, count, json_line};
use crate::WireArgs;

/// One step's figures.
struct StepFigures {
    step: u64,
    changed: u64,
    elements: u64,
    full_bytes: u64,
    abs32_raw_bytes: u64,
    chosen_bytes: u64,
    bound_bytes: f64,
    position_bound_bytes: f64,
    value_bound_bytes: f64,
    context_position_bytes: f64,
    context_value_bytes: f64,
}

/// Σ −c·log2(c / total) over the counts: the empirical entropy times the total, in bits.
fn entropy_bits<'a>(counts: impl Iterator<Item = &'a u64> + Clone) -> f64 {
    let total: u64 = counts.clone().sum();
    counts
        .map(|&c| -(c as f64) * (c as f64 / total.max(1) as f64).log2())
        .sum()
}

fn binary_entropy(p: f64) -> f64 {
    if p <= 0.0 || p >= 1.0 {
        0.0
    } else {
        -(p * p.log2() + (1.0 - p) * (1.0 - p).log2())
    }
}

/// The figures of one step from `old` to `new` (one buffer per slot of `table`).
fn figures(
    step: u64,
    table: &SlotTable,
    old: &[Vec<u8>],
    new: &[&[u8]],
    config: FlushConfig,
) -> Result<StepFigures> {
    let mut changed = 0u64;
    let mut abs32_raw = 0u64;
    let mut position_bits = 0f64;
    let mut ulp_counts: HashMap<i64, u64> = HashMap::new();
    let mut raw_value_bits = 0f64;
    let (mut ctx_position_bits, mut ctx_value_bits) = (0f64, 0f64);
    let mut scratch = Changes::default();
    for (id, slot) in table.slots().iter().enumerate() {
        let width = slot.dtype.width();
        let mut snapshot = old[id].clone();
        scratch.clear();
        diff_serial(&mut snapshot, new[id], width, 0, &mut scratch);
        let (n, k) = (slot.numel() as f64, scratch.len() as f64);
        position_bits += n * binary_entropy(k / n.max(1.0));
        changed += scratch.len() as u64;
        abs32_raw += scratch.len() as u64 * (4 + width as u64);
        let classed = width == 2 || width == 4;
        if classed {
            // Elements and changes per class of the old bits (the 8 bits below the sign).
            let class = |bits: u32| (bits >> (8 * width - 9)) & 0xFF;
            let mut per_class = vec![(0u64, 0u64); 256];
            for i in 0..slot.numel() as usize {
                per_class[class(load_bits(&old[id], width, i)) as usize].0 += 1;
            }
            for j in 0..scratch.len() {
                per_class[class(load_bits(&scratch.old_values, width, j)) as usize].1 += 1;
            }
            ctx_position_bits += per_class
                .iter()
                .filter(|c| c.0 > 0)
                .map(|&(n, k)| n as f64 * binary_entropy(k as f64 / n as f64))
                .sum::<f64>();
        } else {
            ctx_position_bits += n * binary_entropy(k / n.max(1.0));
        }
        if !slot.dtype.ulp_codable() {
            raw_value_bits += (scratch.len() * width * 8) as f64;
            ctx_value_bits += (scratch.len() * width * 8) as f64;
            continue;
        }
        let mut joint: HashMap<(u32, i64), u64> = HashMap::new();
        let mut marginal: HashMap<u32, u64> = HashMap::new();
        for j in 0..scratch.len() {
            let old_bits = load_bits(&scratch.old_values, width, j);
            let a = to_ordered(old_bits, width) as i64;
            let b = to_ordered(load_bits(&scratch.new_values, width, j), width) as i64;
            *ulp_counts.entry(b - a).or_default() += 1;
            let c = if classed {
                (old_bits >> (8 * width - 9)) & 0x1FF
            } else {
                0
            };
            *joint.entry((c, b - a)).or_default() += 1;
            *marginal.entry(c).or_default() += 1;
        }
        ctx_value_bits += entropy_bits(joint.values()) - entropy_bits(marginal.values());
    }
    let stepped: u64 = ulp_counts.values().sum();
    let value_bits: f64 = raw_value_bits
        + ulp_counts
            .values()
            .map(|&c| {
                let p = c as f64 / stepped.max(1) as f64;
                -(c as f64) * p.log2()
            })
            .sum::<f64>();
    let mut sender =
        Sender::with_base(table.clone(), config, old.to_vec(), step.saturating_sub(1))?;
    let mut chosen = 0u64;
    sender.delta(new, |f| {
        chosen += f.len() as u64;
        Ok(())
    })?;
    Ok(StepFigures {
        step,
        changed,
        elements: table.total_elements(),
        full_bytes: table.total_bytes(),
        abs32_raw_bytes: abs32_raw,
        chosen_bytes: chosen,
        bound_bytes: (position_bits + value_bits) / 8.0,
        position_bound_bytes: position_bits / 8.0,
        value_bound_bytes: value_bits / 8.0,
        context_position_bytes: ctx_position_bits / 8.0,
        context_value_bytes: ctx_value_bits / 8.0,
    })
}

impl StepFigures {
    fn context_bytes(&self) -> f64 {
        self.context_position_bytes + self.context_value_bytes
    }
}

fn print(f: &StepFigures, codec: &str, json_out: bool) {
    if json_out {
        json_line(&json!({
            "step": f.step, "changed": f.changed, "elements": f.elements,
            "changed_fraction": f.changed as f64 / f.elements.max(1) as f64,
            "full_bytes": f.full_bytes, "abs32_raw_bytes": f.abs32_raw_bytes, "chosen_bytes": f.chosen_bytes,
            "codec": codec, "bound_bytes": f.bound_bytes, "position_bound_bytes": f.position_bound_bytes,
            "value_bound_bytes": f.value_bound_bytes, "chosen_over_bound": f.chosen_bytes as f64 / f.bound_bytes.max(1.0),
            "context_bound_bytes": f.context_bytes(), "context_position_bytes": f.context_position_bytes,
            "context_value_bytes": f.context_value_bytes,
            "chosen_over_context_bound": f.chosen_bytes as f64 / f.context_bytes().max(1.0),
            "chosen_over_abs32_raw": f.chosen_bytes as f64 / f.abs32_raw_bytes.max(1) as f64,
        }));
    } else {
        println!(
            "{:>4}  {:>8.3}%  {:>11}  {:>11}  {:>11}  {:>11}  {:>11}  {:>6.3}  {:>6.3}  {:>6.3}",
            f.step,
            100.0 * f.changed as f64 / f.elements.max(1) as f64,
            bytes(f.full_bytes),
            bytes(f.abs32_raw_bytes),
            bytes(f.chosen_bytes),
            bytes(f.bound_bytes as u64),
            bytes(f.context_bytes() as u64),
            f.chosen_bytes as f64 / f.bound_bytes.max(1.0),
            f.chosen_bytes as f64 / f.context_bytes().max(1.0),
            f.chosen_bytes as f64 / f.abs32_raw_bytes.max(1) as f64,
        );
    }
}

fn header(codec: &str) {
    println!("codec {codec}; bound = Σ n·H(k/n) + k·H(ULP step) (iid), context = the same given the old exponent class, as defined in docs/codecs.md");
    println!(
        "{:>4}  {:>9}  {:>11}  {:>11}  {:>11}  {:>11}  {:>11}  {:>6}  {:>6}  {:>6}",
        "step",
        "changed",
        "full",
        "abs32+raw",
        "chosen",
        "bound",
        "context",
        "/bound",
        "/ctx",
        "/abs32"
    );
}

/// `deltacast stats OLD NEW`.
pub fn stats_files(old: &Path, new: &Path, wire: &WireArgs, json_out: bool) -> Result<()> {
    let config = wire.config()?;
    let a = open_checkpoint(old, "OLD")?;
    let b = open_checkpoint(new, "NEW")?;
    same_tensors(a.table(), b.table(), ("OLD", "NEW"))?;
    if !json_out {
        header(&config.codec.name());
    }
    let f = figures(1, a.table(), &a.to_buffers(), &b.slices(), config)?;
    print(&f, &config.codec.name(), json_out);
    Ok(())
}

/// `deltacast stats --trace TRACE --base BASE`: the base holds `base::{param}` tensors; the
/// trace `step{k}::{param}::idx` (I32 sorted flat positions) and `::val` (new values).
pub fn stats_trace(trace: &Path, base: &Path, wire: &WireArgs, json_out: bool) -> Result<()> {
    let config = wire.config()?;
    let base_bytes =
        std::fs::read(base).with_context(|| format!("cannot read {}", base.display()))?;
    let base_st = SafeTensors::deserialize(&base_bytes)
        .with_context(|| format!("{} is not a safetensors file", base.display()))?;
    let mut params: BTreeMap<String, (DType, Vec<u64>, Vec<u8>)> = BTreeMap::new();
    for (name, view) in base_st.tensors() {
        let Some(param) = name.strip_prefix("base::") else {
            continue;
        };
        let dtype = DType::from_name(&format!("{:?}", view.dtype()))
            .with_context(|| format!("tensor {name}"))?;
        params.insert(
            param.to_string(),
            (
                dtype,
                view.shape().iter().map(|&d| d as u64).collect(),
                view.data().to_vec(),
            ),
        );
    }
    if params.is_empty() {
        bail!("{} holds no base::… tensors", base.display());
    }
    let trace_bytes =
        std::fs::read(trace).with_context(|| format!("cannot read {}", trace.display()))?;
    let st = SafeTensors::deserialize(&trace_bytes)
        .with_context(|| format!("{} is not a safetensors file", trace.display()))?;
    let mut steps: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for name in st.names() {
        let Some(rest) = name.strip_prefix("step") else {
            continue;
        };
        let Some((k, tail)) = rest.split_once("::") else {
            continue;
        };
        if let (Ok(k), Some(param)) = (k.parse::<u64>(), tail.strip_suffix("::idx")) {
            steps.entry(k).or_default().push(param.to_string());
        }
    }
    let table = SlotTable::new(
        params
            .iter()
            .map(|(n, (d, s, _))| SlotInfo::new(n.clone(), *d, s.clone()))
            .collect(),
    )?;
    let mut state: Vec<Vec<u8>> = params.values().map(|p| p.2.clone()).collect();
    let names: Vec<String> = params.keys().cloned().collect();
    if !json_out {
        header(&config.codec.name());
    }
    let mut totals = (0u64, 0u64, 0f64, 0f64);
    for (k, touched) in &steps {
        let mut next = state.clone();
        for param in touched {
            let id = names
                .binary_search(param)
                .map_err(|_| anyhow::anyhow!("step {k} changes `{param}`, which the base lacks"))?;
            let width = params[param].0.width();
            let idx = st.tensor(&format!("step{k}::{param}::idx"))?;
            let val = st.tensor(&format!("step{k}::{param}::val"))?;
            if idx.data().len() / 4 * width != val.data().len() {
                bail!(
                    "step {k} `{param}`: {} positions but {} value bytes",
                    idx.data().len() / 4,
                    val.data().len()
                );
            }
            for (i, chunk) in idx.data().chunks_exact(4).enumerate() {
                let p = i32::from_le_bytes([chunk[0], chunk[1], chunk[2], chunk[3]]);
                let at = usize::try_from(p)
                    .ok()
                    .map(|p| p * width)
                    .filter(|&at| at + width <= next[id].len());
                let Some(at) = at else {
                    bail!("step {k} `{param}`: position {p} out of range")
                };
                next[id][at..at + width].copy_from_slice(&val.data()[i * width..(i + 1) * width]);
            }
        }
        let slices: Vec<&[u8]> = next.iter().map(Vec::as_slice).collect();
        let f = figures(*k, &table, &state, &slices, config)?;
        totals.0 += f.abs32_raw_bytes;
        totals.1 += f.chosen_bytes;
        totals.2 += f.bound_bytes;
        totals.3 += f.context_bytes();
        print(&f, &config.codec.name(), json_out);
        state = next;
    }
    if json_out {
        json_line(
            &json!({"total": true, "steps": steps.len(), "abs32_raw_bytes": totals.0, "chosen_bytes": totals.1, "bound_bytes": totals.2,
            "context_bound_bytes": totals.3, "chosen_over_context_bound": totals.1 as f64 / totals.3.max(1.0),
            "chosen_over_bound": totals.1 as f64 / totals.2.max(1.0), "chosen_over_abs32_raw": totals.1 as f64 / totals.0.max(1) as f64}),
        );
    } else {
        println!(
            "total over {}: abs32+raw {}, chosen {}, bound {}, context bound {}: chosen/bound {:.3}, chosen/context {:.3}, chosen/abs32+raw {:.3}",
            count(steps.len() as u64, "step", "steps"),
            bytes(totals.0),
            bytes(totals.1),
            bytes(totals.2 as u64),
            bytes(totals.3 as u64),
            totals.1 as f64 / totals.2.max(1.0),
            totals.1 as f64 / totals.3.max(1.0),
            totals.1 as f64 / totals.0.max(1) as f64
        );
    }
    Ok(())
}
