//! Cross-codec checks: what the chooser picks at high densities, and the sizes on the
//! recorded AdamW trace against the entropy bound and against int32 positions + raw values.

use crate::codec::{
    decode_positions, decode_values, encode_chunk, encode_positions, encode_values, CodecChoice,
    PosCodec, ValCodec,
};
use crate::dtype::{from_ordered, load_bits, to_ordered};
use crate::testutil::{adamw_bf16, adamw_step, bernoulli_positions, Rng};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// Binary entropy in bits.
pub(super) fn h2(p: f64) -> f64 {
    if p <= 0.0 || p >= 1.0 {
        0.0
    } else {
        -(p * p.log2() + (1.0 - p) * (1.0 - p).log2())
    }
}

/// Empirical entropy in bits per symbol of a histogram.
pub(super) fn entropy<K>(hist: &HashMap<K, u64>) -> f64 {
    let n: u64 = hist.values().sum();
    hist.values()
        .map(|&c| c as f64 / n as f64)
        .map(|p| -p * p.log2())
        .sum()
}

#[test]
fn chooser_picks_the_smallest_at_high_density() {
    let mut rng = Rng(31);
    let range = 1u32 << 20;
    for density in [0.3, 0.6] {
        let rel = bernoulli_positions(&mut rng, range, density);
        let (old, new) = adamw_bf16(&mut rng, rel.len());
        let chunk = encode_chunk(CodecChoice::Auto, 2, &rel, range, &old, &new);

        let pos_sizes: Vec<(PosCodec, usize)> = [PosCodec::Abs32, PosCodec::Gaps, PosCodec::Bitmap]
            .into_iter()
            .map(|c| {
                let mut out = Vec::new();
                encode_positions(c, &rel, range, &mut out);
                (c, out.len())
            })
            .collect();
        // `Auto` chooses among raw and ulp (`ctx` only with `AutoContext`).
        let val_sizes: Vec<(ValCodec, usize)> = [ValCodec::Raw, ValCodec::Ulp]
            .into_iter()
            .map(|c| {
                let mut out = Vec::new();
                encode_values(c, 2, &old, &new, &mut out);
                (c, out.len())
            })
            .collect();
        let best_pos = pos_sizes.iter().map(|s| s.1).min().unwrap();
        let best_val = val_sizes.iter().map(|s| s.1).min().unwrap();
        assert_eq!(
            chunk.positions.len(),
            best_pos,
            "density {density}: {pos_sizes:?}"
        );
        assert_eq!(
            chunk.values.len(),
            best_val,
            "density {density}: {val_sizes:?}"
        );
        assert!(
            chunk.positions.len() <= range as usize / 8,
            "never above the bitmap"
        );
        assert_eq!(chunk.val_codec, Some(ValCodec::Ulp));

        let total = chunk.positions.len() + chunk.values.len();
        let dense_raw = 2 * range as usize;
        assert!(
            total <= rel.len() * 2 + range as usize / 8,
            "never above bitmap + raw values"
        );
        assert!(
            total as f64 <= dense_raw as f64 * 1.01,
            "density {density}: {total} bytes vs dense {dense_raw}"
        );
        println!(
            "density {density}: {pos_sizes:?} {val_sizes:?} -> {} + {} bytes ({:.3} of dense raw)",
            chunk.positions.len(),
            chunk.values.len(),
            total as f64 / dense_raw as f64
        );

        let mut pos = Vec::new();
        decode_positions(
            chunk.pos_codec.unwrap(),
            &chunk.positions,
            rel.len() as u32,
            range,
            &mut pos,
        )
        .unwrap();
        assert_eq!(pos, rel);
        let mut vals = Vec::new();
        decode_values(chunk.val_codec.unwrap(), 2, &chunk.values, &old, &mut vals).unwrap();
        assert_eq!(vals, new);
    }
}

/// The recorded AdamW traces (tests/data/traces/README.md): the first is committed with the
/// crate; the others (another seed, a higher lr, a Qwen3-MoE) are too large for the repository
/// and are read from `$DELTACAST_EXTRA_TRACES` when it names a folder holding them.
pub(super) const TRACES: [&str; 4] = [
    "dense_lr1e-06",
    "dense_lr1e-06_seed99",
    "dense_lr3e-06",
    "moe_lr1e-06",
];

/// The folder of trace `name`: the crate's own for the first of [`TRACES`], else
/// `$DELTACAST_EXTRA_TRACES` (None when unset).
pub(super) fn trace_dir(name: &str) -> Option<String> {
    if name == TRACES[0] {
        return Some(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/traces").to_string());
    }
    std::env::var("DELTACAST_EXTRA_TRACES").ok()
}
/// Chunk range used for the trace figures.
pub(super) const CHUNK: usize = 1 << 20;

/// A trace file's bytes; a missing file fails the test (the trace is part of the repository).
fn read_trace_file(path: &str) -> Vec<u8> {
    std::fs::read(path).unwrap_or_else(|e| panic!("cannot read the recorded trace {path}: {e}"))
}

/// One tensor's changes at one step of the trace: sorted flat positions and new BF16 bits.
pub(super) type TraceChanges = (String, Vec<u32>, Vec<u8>);

/// The reference trace ([`recorded_trace_named`] of the first of [`TRACES`]).
#[allow(clippy::type_complexity)]
pub(super) fn recorded_trace() -> (HashMap<String, Vec<u8>>, BTreeMap<u32, Vec<TraceChanges>>) {
    recorded_trace_named(TRACES[0])
}

/// A recorded trace, checked as it is read: the base state (BF16 bits per parameter) and, per
/// step in order, the changes of every parameter that changed.
#[allow(clippy::type_complexity)]
pub(super) fn recorded_trace_named(
    name: &str,
) -> (HashMap<String, Vec<u8>>, BTreeMap<u32, Vec<TraceChanges>>) {
    let dir = trace_dir(name).expect("the trace's folder (trace_dir)");
    let steps_file = read_trace_file(&format!("{dir}/trace_{name}.safetensors"));
    let base_file = read_trace_file(&format!("{dir}/trace_{name}_base.safetensors"));
    let base = safetensors::SafeTensors::deserialize(&base_file).expect("base trace parses");
    let steps = safetensors::SafeTensors::deserialize(&steps_file).expect("step trace parses");

    let mut state: HashMap<String, Vec<u8>> = HashMap::new();
    for (name, view) in base.iter() {
        let param = name
            .strip_prefix("base::")
            .expect("base tensors are named base::{param}");
        assert_eq!(view.dtype(), safetensors::Dtype::BF16);
        state.insert(param.to_string(), view.data().to_vec());
    }
    let mut plan: BTreeMap<u32, BTreeSet<String>> = BTreeMap::new();
    for name in steps.names() {
        if let Some(rest) = name.strip_prefix("step") {
            if let Some((step, rest)) = rest.split_once("::") {
                if let Some(param) = rest.strip_suffix("::idx") {
                    plan.entry(step.parse().expect("step number"))
                        .or_default()
                        .insert(param.to_string());
                }
            }
        }
    }
    assert!(!plan.is_empty(), "no steps in the trace");
    let mut out: BTreeMap<u32, Vec<TraceChanges>> = BTreeMap::new();
    for (step, params) in &plan {
        for param in params {
            let idx = steps
                .tensor(&format!("step{step}::{param}::idx"))
                .expect("idx tensor");
            let val = steps
                .tensor(&format!("step{step}::{param}::val"))
                .expect("val tensor");
            assert_eq!(idx.dtype(), safetensors::Dtype::I32);
            assert_eq!(val.dtype(), safetensors::Dtype::BF16);
            let positions: Vec<u32> = idx
                .data()
                .chunks_exact(4)
                .map(|b| {
                    u32::try_from(i32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                        .expect("non-negative index")
                })
                .collect();
            let values = val.data();
            let n = state.get(param).expect("step names a base tensor").len() / 2;
            assert_eq!(values.len(), 2 * positions.len());
            assert!(
                positions.windows(2).all(|w| w[0] < w[1])
                    && positions.last().is_none_or(|&p| (p as usize) < n)
            );
            out.entry(*step)
                .or_default()
                .push((param.clone(), positions, values.to_vec()));
        }
    }
    (state, out)
}

/// Replays the recorded trace through `encode_chunk(Auto)` (and back), and checks the bytes
/// per step against the entropy bound (docs/codecs.md: per tensor n·H(k/n) for the
/// positions, plus the changes times the step's empirical entropy of the signed ULP step) and
/// against int32 positions + raw BF16 values. Run with `--nocapture` for the table.
#[test]
fn recorded_trace_is_near_the_entropy_bound() {
    let (mut state, plan) = recorded_trace();

    println!(
        "{:>4} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7} {:>6}  codecs",
        "step",
        "changed",
        "chosen",
        "pos",
        "val",
        "bound",
        "bound_t",
        "/bound",
        "/bnd_t",
        "/abs32",
        "b/val"
    );
    for (step, params) in &plan {
        let (mut pos_bytes, mut val_bytes, mut changed) = (0usize, 0usize, 0usize);
        let (mut pos_bound_bits, mut val_bound_tensor_bits) = (0f64, 0f64);
        let mut step_hist: HashMap<i32, u64> = HashMap::new();
        let mut codecs: BTreeMap<String, usize> = BTreeMap::new();
        for (param, positions, values) in params {
            let current = state.get_mut(param).expect("step names a base tensor");
            let n = current.len() / 2;
            let k = positions.len();

            pos_bound_bits += n as f64 * h2(k as f64 / n as f64);
            let mut tensor_hist: HashMap<i32, u64> = HashMap::new();
            for (i, &p) in positions.iter().enumerate() {
                let old = to_ordered(load_bits(current, 2, p as usize), 2) as i32;
                let new = to_ordered(load_bits(values, 2, i), 2) as i32;
                let d = (new - old) as i16 as i32;
                *tensor_hist.entry(d).or_default() += 1;
                *step_hist.entry(d).or_default() += 1;
            }
            val_bound_tensor_bits += k as f64 * entropy(&tensor_hist);

            // Encode chunk by chunk, decode back, and apply.
            let mut first = 0;
            for start in (0..n).step_by(CHUNK) {
                let range = CHUNK.min(n - start) as u32;
                let end =
                    positions[first..].partition_point(|&p| (p as usize) < start + CHUNK) + first;
                let rel: Vec<u32> = positions[first..end]
                    .iter()
                    .map(|&p| p - start as u32)
                    .collect();
                let old: Vec<u8> = positions[first..end]
                    .iter()
                    .flat_map(|&p| [current[2 * p as usize], current[2 * p as usize + 1]])
                    .collect();
                let new = &values[2 * first..2 * end];
                first = end;
                if rel.is_empty() {
                    continue;
                }
                let chunk = encode_chunk(CodecChoice::Auto, 2, &rel, range, &old, new);
                let (pc, vc) = (chunk.pos_codec.unwrap(), chunk.val_codec.unwrap());
                *codecs
                    .entry(format!("{}+{}", pc.name(), vc.name()))
                    .or_default() += 1;
                pos_bytes += chunk.positions.len();
                val_bytes += chunk.values.len();
                let mut back_pos = Vec::new();
                decode_positions(pc, &chunk.positions, rel.len() as u32, range, &mut back_pos)
                    .unwrap();
                assert_eq!(back_pos, rel, "step {step} {param}");
                let mut back_val = Vec::new();
                decode_values(vc, 2, &chunk.values, &old, &mut back_val).unwrap();
                assert_eq!(back_val, new, "step {step} {param}");
            }
            for (i, &p) in positions.iter().enumerate() {
                current[2 * p as usize..2 * p as usize + 2]
                    .copy_from_slice(&values[2 * i..2 * i + 2]);
            }
            changed += k;
        }
        let total = (pos_bytes + val_bytes) as f64;
        let bound = (pos_bound_bits + changed as f64 * entropy(&step_hist)) / 8.0;
        let bound_tensor = (pos_bound_bits + val_bound_tensor_bits) / 8.0;
        let abs32_raw = 6.0 * changed as f64;
        println!(
            "{step:>4} {changed:>9} {total:>9.0} {pos_bytes:>9} {val_bytes:>9} {bound:>9.0} {bound_tensor:>9.0} {:>7.3} {:>7.3} {:>7.3} {:>6.3}  {codecs:?}",
            total / bound,
            total / bound_tensor,
            total / abs32_raw,
            val_bytes as f64 * 8.0 / changed as f64,
        );
        assert!(
            total <= 1.2 * bound,
            "step {step}: {total} bytes, bound {bound:.0}"
        );
        assert!(
            total <= 0.25 * abs32_raw,
            "step {step}: {total} bytes, abs32+raw {abs32_raw}"
        );
    }
}

/// The chooser as first written: encode every codec, keep the first smallest.
fn exhaustive_positions(rel: &[u32], range: u32) -> (PosCodec, Vec<u8>) {
    if rel.len() as u64 == range as u64 {
        return (PosCodec::All, Vec::new());
    }
    let mut best: Option<(PosCodec, Vec<u8>)> = None;
    // Holes (gaps of the unchanged elements) is a candidate for chunks more than half changed,
    // and wins only when strictly smaller.
    let dense = (range as usize - rel.len()) < rel.len();
    let candidates: &[PosCodec] = if dense {
        &[
            PosCodec::Abs32,
            PosCodec::Gaps,
            PosCodec::Bitmap,
            PosCodec::Holes,
        ]
    } else {
        &[PosCodec::Abs32, PosCodec::Gaps, PosCodec::Bitmap]
    };
    for &codec in candidates {
        let mut out = Vec::new();
        encode_positions(codec, rel, range, &mut out);
        if best.as_ref().is_none_or(|(_, b)| out.len() < b.len()) {
            best = Some((codec, out));
        }
    }
    best.unwrap()
}

/// The chooser's positions, written into a buffer that held other bytes (it must clear it).
fn choose_positions(rel: &[u32], range: u32) -> (PosCodec, Vec<u8>) {
    let mut out = vec![0xa5; 19];
    let codec = crate::codec::choose_positions(rel, range, &mut out);
    (codec, out)
}

/// The chooser's values, written into a buffer that held other bytes (it must clear it).
fn choose_values(width: usize, old: &[u8], new: &[u8]) -> (ValCodec, Vec<u8>) {
    let mut out = vec![0x5a; 23];
    let codec = crate::codec::choose_values(width, old, new, &mut out);
    (codec, out)
}

fn exhaustive_values(width: usize, old: &[u8], new: &[u8]) -> (ValCodec, Vec<u8>) {
    let mut best: Option<(ValCodec, Vec<u8>)> = None;
    // What `Auto` chooses from (`ctx` only with `AutoContext`).
    for codec in [ValCodec::Raw, ValCodec::Ulp] {
        let mut out = Vec::new();
        encode_values(codec, width, old, new, &mut out);
        if best.as_ref().is_none_or(|(_, b)| out.len() < b.len()) {
            best = Some((codec, out));
        }
    }
    best.unwrap()
}

/// The chooser against encoding every codec on chunks of many blocks around and above half
/// density, where the holes' lower bound decides whether they are sized at all.
#[test]
fn chooser_matches_encoding_every_codec_when_dense() {
    let mut rng = Rng(37);
    for range in [4099u32, 65_537, 300_001] {
        for density in [
            0.3, 0.35, 0.38, 0.4, 0.42, 0.45, 0.5, 0.52, 0.55, 0.58, 0.6, 0.62, 0.65, 0.7, 0.8,
            0.9, 0.99,
        ] {
            let rel = bernoulli_positions(&mut rng, range, density);
            assert_eq!(
                choose_positions(&rel, range),
                exhaustive_positions(&rel, range),
                "range {range} density {density}"
            );
            // Changes in runs (gaps, and holes, can win above 40 % then), runs long enough
            // for escapes now and then.
            let mut rel = Vec::new();
            let mut p = 0u64;
            while p < range as u64 {
                let longest = if rng.below(50) == 0 { 200 } else { 40 };
                let run = 1 + rng.below(longest);
                let skip = (run as f64 * (1.0 - density) / density) as u64;
                let skip = rng.below(2 * skip + 1);
                rel.extend((p..(p + run).min(range as u64)).map(|q| q as u32));
                p += run + skip;
            }
            assert_eq!(
                choose_positions(&rel, range),
                exhaustive_positions(&rel, range),
                "range {range} density {density}, runs"
            );
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(300))]

    #[test]
    fn prop_chooser_matches_encoding_every_codec(
        range in 0u32..3000,
        density in 0.0f64..1.0,
        width in proptest::sample::select(vec![1usize, 2, 4]),
        seed in proptest::prelude::any::<u64>(),
    ) {
        let mut rng = Rng(seed);
        let rel = bernoulli_positions(&mut rng, range, density * density);
        proptest::prop_assert_eq!(
            choose_positions(&rel, range),
            exhaustive_positions(&rel, range)
        );
        let old: Vec<u8> = (0..rel.len() * width).map(|_| rng.next_u64() as u8).collect();
        // Mostly small ULP steps at high `density`, mostly wild ones at low.
        let mut new = Vec::with_capacity(old.len());
        for i in 0..rel.len() {
            let bits = load_bits(&old, width, i);
            let step = if rng.unit() < density { adamw_step(&mut rng) } else { (rng.next_u64() as i64) >> 33 };
            let moved = (to_ordered(bits, width) as i64 + step).rem_euclid(1i64 << (8 * width));
            new.extend_from_slice(&from_ordered(moved as u32, width).to_le_bytes()[..width]);
        }
        proptest::prop_assert_eq!(
            choose_values(width, &old, &new),
            exhaustive_values(width, &old, &new)
        );
    }
}

/// One `EncodedChunk` reused across chunks of every size and density (empty, one element,
/// every element, odd ranges, wide and narrow elements, each choice, seeds) gives the same
/// codecs and bytes as a fresh encode of each chunk.
#[test]
fn reused_chunk_buffers_encode_like_fresh_ones() {
    use crate::codec::{
        encode_chunk_into, encode_seed_chunk, encode_seed_chunk_into, EncodedChunk,
    };
    let mut rng = Rng(91);
    let mut reused = EncodedChunk::default();
    let mut reused_seed = EncodedChunk::default();
    let choices = [
        CodecChoice::Auto,
        CodecChoice::Fixed(PosCodec::Gaps, ValCodec::Ulp),
        CodecChoice::Fixed(PosCodec::All, ValCodec::Raw),
        CodecChoice::Fixed(PosCodec::Bitmap, ValCodec::Ulp),
    ];
    let ranges = [
        0u32,
        1,
        2,
        7,
        1023,
        1024,
        1025,
        4099,
        65_537,
        300_001,
        1 << 20,
    ];
    let densities = [
        0.0, 0.001, 0.01, 0.1, 0.33, 0.39, 0.41, 0.5, 0.6, 0.9, 0.999, 1.0,
    ];
    for round in 0..3 {
        for &range in &ranges {
            for &density in &densities {
                // Big chunks only at a few densities (the test stays quick).
                if range >= 300_000 && !matches!(density, 0.01 | 0.5 | 1.0) {
                    continue;
                }
                let rel: Vec<u32> = if density >= 1.0 {
                    (0..range).collect()
                } else {
                    bernoulli_positions(&mut rng, range, density)
                };
                let width = [2usize, 1, 4][(round + rel.len()) % 3];
                let old: Vec<u8> = (0..rel.len() * width)
                    .map(|_| rng.next_u64() as u8)
                    .collect();
                let mut new = Vec::with_capacity(old.len());
                for i in 0..rel.len() {
                    let bits = load_bits(&old, width, i);
                    let step = match rng.below(20) {
                        // NaN, ±0, a subnormal, or equal bits among the AdamW steps.
                        0 => {
                            new.extend_from_slice(
                                &[0x7fc1_0001u32, 0x8000_0000, 0, 1, bits][rng.below(5) as usize]
                                    .to_le_bytes()[..width],
                            );
                            continue;
                        }
                        1 => (rng.next_u64() as i64) >> 33,
                        _ => adamw_step(&mut rng),
                    };
                    let moved =
                        (to_ordered(bits, width) as i64 + step).rem_euclid(1i64 << (8 * width));
                    new.extend_from_slice(
                        &from_ordered(moved as u32, width).to_le_bytes()[..width],
                    );
                }
                let choice = choices[(round + rel.len()) % choices.len()];
                for choice in [CodecChoice::Auto, choice] {
                    let fresh = encode_chunk(choice, width, &rel, range, &old, &new);
                    encode_chunk_into(choice, width, &rel, range, &old, &new, &mut reused);
                    let what = format!("{} range {range} density {density}", choice.name());
                    assert_eq!(reused.pos_codec, fresh.pos_codec, "{what}");
                    assert_eq!(reused.val_codec, fresh.val_codec, "{what}");
                    assert_eq!(reused.positions, fresh.positions, "{what}");
                    assert_eq!(reused.values, fresh.values, "{what}");
                }
                let fresh = encode_seed_chunk(&rel, range, &new);
                encode_seed_chunk_into(&rel, range, &new, &mut reused_seed);
                assert_eq!(reused_seed.pos_codec, fresh.pos_codec);
                assert_eq!(reused_seed.positions, fresh.positions);
                assert_eq!(reused_seed.values, fresh.values);
            }
        }
    }
}
