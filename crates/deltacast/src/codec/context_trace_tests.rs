//! The `ctx` codecs on every recorded AdamW trace: sections against the iid bound (docs/codecs.md,
//! "The entropy bound") and the context bound (the same quantities conditioned on the old
//! exponent class), each chunk decoded back bit for bit against the receiver's bits.

use crate::codec::trace_tests::{entropy, h2, recorded_trace_named, trace_dir, CHUNK, TRACES};
use crate::codec::{
    decode_positions_held, decode_values, encode_chunk_with_state_into, CodecChoice, EncodedChunk,
};
use crate::dtype::{load_bits, to_ordered};
use std::collections::{BTreeMap, HashMap};

/// Σ −c·log2(c / n) over a histogram: its empirical entropy in bits, times its total.
fn total_bits<K>(hist: &HashMap<K, u64>) -> f64 {
    hist.values().sum::<u64>() as f64 * entropy(hist)
}

#[test]
fn recorded_traces_with_context_codecs() {
    for name in TRACES {
        if trace_dir(name).is_none() {
            println!(
                "trace {name}: NOT RUN (not in the repository; set DELTACAST_EXTRA_TRACES to its \
                 folder, tests/data/traces/README.md)"
            );
            continue;
        }
        let (iid, total, abs32) = context_codecs_on(name);
        assert!(
            total as f64 <= 0.75 * iid,
            "{name}: {total} section bytes vs the iid bound {iid:.0}"
        );
        assert!(
            total as f64 <= 0.15 * abs32 as f64,
            "{name}: {total} section bytes vs abs32+raw {abs32}"
        );
    }
}

/// Prints one trace's figures per step and returns its iid bound, section bytes and
/// abs32+raw bytes over all steps.
fn context_codecs_on(name: &str) -> (f64, usize, usize) {
    let (mut state, plan) = recorded_trace_named(name);
    println!("trace {name}");
    println!(
        "{:>4} {:>9} {:>9} {:>9} {:>9} {:>9} {:>7} {:>7} {:>7}  codecs",
        "step", "iid", "context", "pos", "val", "total", "/iid", "/ctx", "/abs32"
    );
    let (mut all_iid, mut all_total, mut all_abs) = (0f64, 0usize, 0usize);
    let mut enc = EncodedChunk::default();
    for (step, params) in &plan {
        let (mut iid_pos, mut ctx_bits, mut ctx_pos) = (0f64, 0f64, 0f64);
        let (mut pos_bytes, mut val_bytes, mut changed) = (0usize, 0usize, 0usize);
        let mut step_hist: HashMap<i32, u64> = HashMap::new();
        let mut codecs: BTreeMap<String, usize> = BTreeMap::new();
        for (param, positions, values) in params {
            let positions: Vec<usize> = positions.iter().map(|&p| p as usize).collect();
            let current = state.get_mut(param).unwrap();
            let n = current.len() / 2;
            iid_pos += n as f64 * h2(positions.len() as f64 / n as f64);
            // Context bound, per tensor: the mask given the old exponent, the step given the
            // old sign and exponent.
            let mut classes: HashMap<u32, (u64, u64)> = HashMap::new();
            for i in 0..n {
                classes
                    .entry((load_bits(current, 2, i) >> 7) & 0xFF)
                    .or_default()
                    .0 += 1;
            }
            let mut joint: HashMap<(u32, i32), u64> = HashMap::new();
            let mut marg: HashMap<u32, u64> = HashMap::new();
            for (j, &p) in positions.iter().enumerate() {
                let o = load_bits(current, 2, p);
                classes.get_mut(&((o >> 7) & 0xFF)).unwrap().1 += 1;
                let d = (to_ordered(load_bits(values, 2, j), 2) as i32 - to_ordered(o, 2) as i32)
                    as i16 as i32;
                *step_hist.entry(d).or_default() += 1;
                *joint.entry((o >> 7, d)).or_default() += 1;
                *marg.entry(o >> 7).or_default() += 1;
            }
            let mask_bits = classes
                .values()
                .map(|&(n, k)| n as f64 * h2(k as f64 / n as f64))
                .sum::<f64>();
            ctx_bits += mask_bits;
            ctx_pos += mask_bits;
            ctx_bits += total_bits(&joint) - total_bits(&marg);

            let mut after = current.clone();
            for (j, &p) in positions.iter().enumerate() {
                after[2 * p..2 * p + 2].copy_from_slice(&values[2 * j..2 * j + 2]);
            }
            let mut first = 0;
            for start in (0..n).step_by(CHUNK) {
                let end = positions[first..].partition_point(|&p| p < start + CHUNK) + first;
                let (lo, hi) = (first, end);
                first = end;
                if lo == hi {
                    continue;
                }
                // The sender tightens a chunk to its first and last change (flush.rs).
                let (cs, ce) = (positions[lo], positions[hi - 1] + 1);
                let range = (ce - cs) as u32;
                let rel: Vec<u32> = positions[lo..hi].iter().map(|&p| (p - cs) as u32).collect();
                let old: Vec<u8> = positions[lo..hi]
                    .iter()
                    .flat_map(|&p| [current[2 * p], current[2 * p + 1]])
                    .collect();
                let new = &values[2 * lo..2 * hi];
                encode_chunk_with_state_into(
                    CodecChoice::AutoContext,
                    2,
                    &rel,
                    range,
                    &old,
                    new,
                    Some(&after[2 * cs..2 * ce]),
                    &mut enc,
                );
                let (pc, vc) = (enc.pos_codec.unwrap(), enc.val_codec.unwrap());
                *codecs
                    .entry(format!("{}+{}", pc.name(), vc.name()))
                    .or_default() += 1;
                pos_bytes += enc.positions.len();
                val_bytes += enc.values.len();
                let (mut back_pos, mut back_val) = (Vec::new(), Vec::new());
                let held = &current[2 * cs..2 * ce];
                decode_positions_held(
                    pc,
                    &enc.positions,
                    rel.len() as u32,
                    range,
                    2,
                    held,
                    &mut back_pos,
                )
                .unwrap();
                assert_eq!(back_pos, rel, "step {step} {param}");
                decode_values(vc, 2, &enc.values, &old, &mut back_val).unwrap();
                assert_eq!(back_val, new, "step {step} {param}");
            }
            *current = after;
            changed += positions.len();
        }
        let iid = (iid_pos + total_bits(&step_hist)) / 8.0;
        let ctx = ctx_bits / 8.0;
        let total = pos_bytes + val_bytes;
        println!(
            "{step:>4} {iid:>9.0} {ctx:>9.0} {pos_bytes:>9} {val_bytes:>9} {total:>9} {:>7.3} {:>7.3} {:>7.3}  {codecs:?}",
            total as f64 / iid,
            total as f64 / ctx,
            total as f64 / (6 * changed) as f64
        );
        println!(
            "     context bound: positions {:.0}, values {:.0}",
            ctx_pos / 8.0,
            (ctx_bits - ctx_pos) / 8.0
        );
        all_iid += iid;
        all_total += total;
        all_abs += 6 * changed;
    }
    println!(
        " all {all_iid:>9.0} {:>9} {:>9} {:>9} {all_total:>9} {:>7.3} {:>7} {:>7.3}",
        "",
        "",
        "",
        all_total as f64 / all_iid,
        "",
        all_total as f64 / all_abs as f64
    );
    (all_iid, all_total, all_abs)
}
