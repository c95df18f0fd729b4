//! A built-in synthetic model and an AdamW-like update generator, so the demo and the
//! benchmarks need no download.
//!
//! Weights have the tensor names and shapes of Qwen2.5 checkpoints, seeded random values (an
//! fp32 master, N(0, 0.02) for matrices, 1.0 for norms) and a BF16 copy rounded from it. Each
//! step moves every master weight by about `lr` (a persistent per-weight direction plus fresh
//! noise, shrinking over the first steps as Adam's normalised update does), applies decoupled
//! weight decay, and re-rounds to BF16: as in real runs, only the weights whose master crossed
//! a BF16 rounding boundary change, 1–4% of them at lr 1e-6, most by one ULP.

use half::bf16;
use rayon::prelude::*;

use deltacast::{DType, SlotInfo, SlotTable};

/// Shape parameters of a Qwen2-architecture model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ModelShape {
    pub name: &'static str,
    pub vocab: u64,
    pub hidden: u64,
    pub intermediate: u64,
    pub layers: u64,
    pub heads: u64,
    pub kv_heads: u64,
    pub head_dim: u64,
    pub tied_embeddings: bool,
}

pub const PRESETS: [ModelShape; 4] = [
    ModelShape {
        name: "tiny",
        vocab: 1000,
        hidden: 64,
        intermediate: 176,
        layers: 2,
        heads: 4,
        kv_heads: 2,
        head_dim: 16,
        tied_embeddings: true,
    },
    ModelShape {
        name: "qwen2.5-0.5b",
        vocab: 151_936,
        hidden: 896,
        intermediate: 4864,
        layers: 24,
        heads: 14,
        kv_heads: 2,
        head_dim: 64,
        tied_embeddings: true,
    },
    ModelShape {
        name: "qwen2.5-1.5b",
        vocab: 151_936,
        hidden: 1536,
        intermediate: 8960,
        layers: 28,
        heads: 12,
        kv_heads: 2,
        head_dim: 128,
        tied_embeddings: true,
    },
    ModelShape {
        name: "qwen2.5-7b",
        vocab: 152_064,
        hidden: 3584,
        intermediate: 18_944,
        layers: 28,
        heads: 28,
        kv_heads: 4,
        head_dim: 128,
        tied_embeddings: false,
    },
];

pub fn preset(name: &str) -> Option<ModelShape> {
    let name = name.to_ascii_lowercase();
    PRESETS
        .iter()
        .copied()
        .find(|p| p.name == name || p.name.trim_start_matches("qwen2.5-") == name)
}

impl ModelShape {
    /// The slot table in Hugging Face naming.
    pub fn slot_table(&self) -> SlotTable {
        let (h, q, kv) = (
            self.hidden,
            self.heads * self.head_dim,
            self.kv_heads * self.head_dim,
        );
        let mut slots = vec![SlotInfo::new(
            "model.embed_tokens.weight",
            DType::BF16,
            vec![self.vocab, h],
        )];
        for i in 0..self.layers {
            let p = format!("model.layers.{i}");
            let mut add = |name: &str, shape: Vec<u64>| {
                slots.push(SlotInfo::new(format!("{p}.{name}"), DType::BF16, shape))
            };
            add("input_layernorm.weight", vec![h]);
            add("self_attn.q_proj.weight", vec![q, h]);
            add("self_attn.q_proj.bias", vec![q]);
            add("self_attn.k_proj.weight", vec![kv, h]);
            add("self_attn.k_proj.bias", vec![kv]);
            add("self_attn.v_proj.weight", vec![kv, h]);
            add("self_attn.v_proj.bias", vec![kv]);
            add("self_attn.o_proj.weight", vec![h, q]);
            add("post_attention_layernorm.weight", vec![h]);
            add("mlp.gate_proj.weight", vec![self.intermediate, h]);
            add("mlp.up_proj.weight", vec![self.intermediate, h]);
            add("mlp.down_proj.weight", vec![h, self.intermediate]);
        }
        slots.push(SlotInfo::new("model.norm.weight", DType::BF16, vec![h]));
        if !self.tied_embeddings {
            slots.push(SlotInfo::new(
                "lm_head.weight",
                DType::BF16,
                vec![self.vocab, h],
            ));
        }
        SlotTable::new(slots).expect("preset names are unique")
    }
}

/// A strong 64-bit mixer used as a counter-based random generator (reproducible, parallel).
#[inline(always)]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Uniform in [-1, 1).
#[inline(always)]
fn uniform(key: u64) -> f32 {
    ((mix(key) >> 40) as f32) * (2.0 / (1u64 << 24) as f32) - 1.0
}

/// Approximately N(0, 1): the sum of four uniforms, rescaled (Irwin–Hall).
#[inline(always)]
fn normal(key: u64) -> f32 {
    let k = mix(key);
    let s = (k & 0xffff) + ((k >> 16) & 0xffff) + ((k >> 32) & 0xffff) + (k >> 48);
    (s as f32 / 65536.0 - 2.0) * 1.732_050_8
}

/// One element per parallel task batch.
const PAR: usize = 1 << 16;

/// The trainer's view of the model: fp32 master and the BF16 copy that gets synced, either whole
/// or only some runs of each tensor (one trainer rank's FSDP shard).
pub struct SyntheticModel {
    pub table: SlotTable,
    seed: u64,
    /// Per slot: the global flat runs `(start, len)` held, in local order.
    runs: Vec<Vec<(u64, u64)>>,
    master: Vec<Vec<f32>>,
    pub weights: Vec<Vec<u8>>,
    step: u64,
}

/// Runs `kernel(first_global_index, master, bf16)` over the held elements of one slot in
/// parallel batches and sums what it returns. Every element's value depends only on its global
/// index, so a shard computes exactly the bits the whole model holds there.
fn par_runs(
    runs: &[(u64, u64)],
    master: &mut [f32],
    weights: &mut [u8],
    kernel: impl Fn(u64, &mut [f32], &mut [u8]) -> u64 + Sync,
) -> u64 {
    let mut total = 0;
    let (mut m_rest, mut w_rest) = (master, weights);
    for &(first, len) in runs {
        let (m, m_tail) = std::mem::take(&mut m_rest).split_at_mut(len as usize);
        let (w, w_tail) = std::mem::take(&mut w_rest).split_at_mut(2 * len as usize);
        (m_rest, w_rest) = (m_tail, w_tail);
        total += m
            .par_chunks_mut(PAR)
            .zip(w.par_chunks_mut(PAR * 2))
            .enumerate()
            .map(|(c, (m, w))| kernel(first + (c * PAR) as u64, m, w))
            .sum::<u64>();
    }
    total
}

impl SyntheticModel {
    /// Builds the model; `progress` is called after each slot with its element count.
    pub fn new(shape: &ModelShape, seed: u64, progress: impl Fn(u64) + Sync) -> Self {
        let table = shape.slot_table();
        let runs = table.slots().iter().map(|s| vec![(0, s.numel())]).collect();
        Self::build(table, seed, runs, progress)
    }

    /// Builds only the given global flat runs `(start, len)` of every slot, in that local order
    /// (e.g. `Block::global_ranges()` of a rank's FSDP block): the same bits as the whole model
    /// there, before and after every [`step`](Self::step).
    pub fn new_shard(
        shape: &ModelShape,
        seed: u64,
        runs: Vec<Vec<(u64, u64)>>,
        progress: impl Fn(u64) + Sync,
    ) -> anyhow::Result<Self> {
        let table = shape.slot_table();
        if runs.len() != table.len() {
            anyhow::bail!("{} run lists for {} tensors", runs.len(), table.len());
        }
        for (slot, r) in table.slots().iter().zip(&runs) {
            if let Some(&(start, len)) = r
                .iter()
                .find(|&&(start, len)| start.checked_add(len).is_none_or(|e| e > slot.numel()))
            {
                anyhow::bail!(
                    "run {start}..+{len} is outside `{}` ({} elements)",
                    slot.name,
                    slot.numel()
                );
            }
        }
        Ok(Self::build(table, seed, runs, progress))
    }

    fn build(
        table: SlotTable,
        seed: u64,
        runs: Vec<Vec<(u64, u64)>>,
        progress: impl Fn(u64) + Sync,
    ) -> Self {
        let mut master = Vec::with_capacity(table.len());
        let mut weights = Vec::with_capacity(table.len());
        for (id, (slot, runs)) in table.slots().iter().zip(&runs).enumerate() {
            let n: u64 = runs.iter().map(|r| r.1).sum();
            let is_norm = slot.name.ends_with("norm.weight");
            let salt = mix(seed ^ mix(id as u64 + 1));
            let mut m = vec![0f32; n as usize];
            let mut w = vec![0u8; n as usize * 2];
            par_runs(runs, &mut m, &mut w, |first, m, w| {
                for (k, (x, out)) in m.iter_mut().zip(w.chunks_exact_mut(2)).enumerate() {
                    let i = first + k as u64;
                    *x = if is_norm {
                        1.0
                    } else {
                        0.02 * normal(salt ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
                    };
                    out.copy_from_slice(&bf16::from_f32(*x).to_bits().to_le_bytes());
                }
                0
            });
            progress(n);
            master.push(m);
            weights.push(w);
        }
        SyntheticModel {
            table,
            seed,
            runs,
            master,
            weights,
            step: 0,
        }
    }

    /// One AdamW-like step at learning rate `lr`; returns the number of held BF16 elements that
    /// changed.
    pub fn step(&mut self, lr: f32, progress: impl Fn(u64) + Sync) -> u64 {
        self.step += 1;
        let t = self.step;
        // Adam's normalised update is ±1 at step 1 and shrinks as the moments average noise.
        let scale = lr * (0.5 + 0.5 / (t as f32).sqrt());
        let decay = 1.0 - lr * 0.01;
        let mut changed = 0u64;
        for (id, ((m, w), runs)) in self
            .master
            .iter_mut()
            .zip(self.weights.iter_mut())
            .zip(&self.runs)
            .enumerate()
        {
            let dir_salt = mix(self.seed ^ 0xd1 ^ mix(id as u64 + 1));
            let noise_salt = mix(dir_salt ^ mix(t));
            changed += par_runs(runs, m, w, |first, m, w| {
                let mut moved = 0u64;
                for (k, (x, out)) in m.iter_mut().zip(w.chunks_exact_mut(2)).enumerate() {
                    let i = first + k as u64;
                    let direction = uniform(dir_salt ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
                    let noise = uniform(noise_salt ^ i.wrapping_mul(0xc2b2_ae3d_27d4_eb4f));
                    *x = *x * decay - scale * (0.7 * direction + 0.6 * noise);
                    let bits = bf16::from_f32(*x).to_bits().to_le_bytes();
                    if out != bits {
                        out.copy_from_slice(&bits);
                        moved += 1;
                    }
                }
                moved
            });
            progress(m.len() as u64);
        }
        changed
    }

    pub fn slices(&self) -> Vec<&[u8]> {
        self.weights.iter().map(Vec::as_slice).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn preset_0_5b_has_the_qwen_parameter_count() {
        let t = preset("qwen2.5-0.5b").unwrap().slot_table();
        let n = t.total_elements();
        assert!((490_000_000..500_000_000).contains(&n), "{n}");
        assert!(t.id_of("model.layers.23.mlp.down_proj.weight").is_ok());
        assert!(preset("0.5b").is_some());
    }

    #[test]
    fn steps_change_a_few_percent_at_lr_1e6() {
        let mut m = SyntheticModel::new(&preset("tiny").unwrap(), 1, |_| {});
        let total = m.table.total_elements() as f64;
        let before = m.weights.clone();
        let changed = m.step(1e-6, |_| {});
        let counted: u64 = before
            .iter()
            .zip(&m.weights)
            .map(|(a, b)| a.chunks(2).zip(b.chunks(2)).filter(|(x, y)| x != y).count() as u64)
            .sum();
        assert_eq!(changed, counted);
        let frac = changed as f64 / total;
        assert!((0.005..0.08).contains(&frac), "changed fraction {frac}");
    }

    #[test]
    fn fsdp_shards_concatenate_to_the_full_model() {
        use deltacast::placement::{local_block, DTensorLayout, MeshPlacement};
        let shape = preset("tiny").unwrap();
        let mut full = SyntheticModel::new(&shape, 3, |_| {});
        let world = 3u64;
        let mut shards: Vec<SyntheticModel> = (0..world)
            .map(|rank| {
                let runs = full
                    .table
                    .slots()
                    .iter()
                    .map(|s| {
                        let layout = DTensorLayout {
                            mesh_shape: vec![world],
                            coords: vec![rank],
                            placements: vec![MeshPlacement::Shard { dim: 0 }],
                            global_shape: s.shape.clone(),
                        };
                        local_block(&layout)
                            .unwrap()
                            .block()
                            .global_ranges()
                            .collect()
                    })
                    .collect();
                SyntheticModel::new_shard(&shape, 3, runs, |_| {}).unwrap()
            })
            .collect();
        for step in 0..=2 {
            if step > 0 {
                let changed = full.step(1e-6, |_| {});
                let sum: u64 = shards.iter_mut().map(|m| m.step(1e-6, |_| {})).sum();
                assert_eq!(changed, sum, "step {step}");
            }
            for id in 0..full.table.len() {
                let joined: Vec<u8> = shards.iter().flat_map(|m| m.weights[id].clone()).collect();
                assert_eq!(joined, full.weights[id], "step {step}, slot {id}");
            }
        }
        // Odd runs too: a shard of two separate runs.
        let runs = full
            .table
            .slots()
            .iter()
            .map(|s| vec![(s.numel() / 2, s.numel() - s.numel() / 2), (0, 1)])
            .collect();
        let mut part = SyntheticModel::new_shard(&shape, 3, runs, |_| {}).unwrap();
        for _ in 0..2 {
            part.step(1e-6, |_| {});
        }
        let n = full.table.slots()[2].numel() as usize;
        let expect = [&full.weights[2][(n / 2) * 2..], &full.weights[2][..2]].concat();
        assert_eq!(part.weights[2], expect);
        let bad = vec![vec![(0, u64::MAX)]; full.table.len()];
        assert!(SyntheticModel::new_shard(&shape, 3, bad, |_| {}).is_err());
    }
}
