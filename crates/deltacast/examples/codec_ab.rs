//! A/B harness for the codecs per core: the chunk of `benches/codecs.rs` (2^20 BF16 elements,
//! AdamW-like steps; `RANGE=n` for another size) and the serial diff on 64 MiB BF16 with the
//! best kernel, each timed `rounds` times, the best run printed as M changes/s. Built once per
//! commit and run alternately, two builds compare under the same machine load (criterion's
//! runs drift 10-20 % on a shared VM).
//!
//! `cargo run --release -p deltacast --example codec_ab -- [rounds] [densities] [only]`:
//! `densities` comma separated (default 0.1,0.5); `only` one of diff, auto, genc, benc, uenc, pdec,
//! udec, ctx, steps (a substring of the measurement) or dir (the chunk's ulp and gaps parameters).
//! `ctx_enc` / `ctx_dec` time the `auto+ctx` choice (every candidate of `auto` plus the context
//! codecs) and the decode of what it chose, against a held range whose unchanged elements take
//! exponents from the chunk's own old values; `cgpos_*`, `rcpos_*` and `cval_*` the `ctxgaps`
//! positions, the `ctx` positions and the `ctx` values alone (`cg_over_rc_bytes`: the two
//! position codecs' bytes; `cgpos` alone, when named, times only the first). `steps_enc` / `steps_dec` time the `steps+esc`
//! pair (fixed) and `steps_size` prints its bytes over those of `auto`'s choice. `auto`
//! encodes into buffers reused from round to round, as the sender does; `auto_fresh` (only when
//! named) into fresh ones each round, page faults included.
//!
//! The chunk is the same in every round, so a predictor can learn the decoders' branches: on
//! a larger range (`RANGE=5242880`) the ulp decoder's figure at 10 % is about half the
//! 2^20 one (fresh data in a real sync is never the same twice). `CHUNKS=n` times n
//! different chunks of the range one after the other in each round: new data per chunk at
//! the sender's chunk size (2^20), as in a sync, without the larger range's cache misses.
use deltacast::codec::{
    decode_positions, decode_positions_held, decode_steps_values, decode_values, encode_chunk,
    encode_chunk_into, encode_chunk_with_state_into, encode_context_positions, encode_positions,
    encode_values, CodecChoice, EncodedChunk, PosCodec, ValCodec,
};
use deltacast::diff::{best_impl, diff_serial_with, Changes};
use std::hint::black_box;
use std::time::Instant;

static RANGE_CELL: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
fn range() -> u32 {
    *RANGE_CELL.get_or_init(|| {
        std::env::var("RANGE")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1 << 20)
    })
}

use deltacast_testkit::adamw_chunk::{chunk_seeded, Chunk};

/// `CHUNKS=n` (default 1) different chunks of the same kind: each measurement goes over all
/// of them, as a sync encodes chunk after chunk of new data, so no predictor learns one
/// chunk's branches while the chunk keeps its real size.
fn chunks(density: f64) -> Vec<Chunk> {
    let n: u64 = std::env::var("CHUNKS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1)
        .max(1);
    (0..n)
        .map(|seed| chunk_seeded(density, range(), seed))
        .collect()
}

fn splitmix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn best<F: FnMut()>(rounds: usize, mut f: F) -> f64 {
    let mut b = f64::MAX;
    for _ in 0..rounds {
        let t = Instant::now();
        f();
        b = b.min(t.elapsed().as_secs_f64());
    }
    b
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let rounds: usize = args.get(1).and_then(|s| s.parse().ok()).unwrap_or(40);
    let densities: Vec<f64> = args
        .get(2)
        .map(|s| s.split(',').filter_map(|d| d.parse().ok()).collect())
        .unwrap_or(vec![0.1, 0.5]);
    let only: Option<&str> = args.get(3).map(|s| s.as_str());
    let want = |name: &str| only.is_none_or(|o| name.contains(o));
    for &density in &densities {
        let all = chunks(density);
        let n: f64 = all.iter().map(|c| c.rel.len() as f64).sum();
        let rate = |t: f64| n / t / 1e6;
        let mut line = format!("d={density}");
        if want("diff") {
            // Serial diff on 64 MiB BF16, alternating snapshot as in benches/diff.rs.
            let bytes = 64usize << 20;
            let mut s = 1u64;
            let p: Vec<u8> = (0..bytes).map(|_| splitmix(&mut s) as u8).collect();
            let threshold = (density * u64::MAX as f64) as u64;
            let mut c = p.clone();
            let mut s = 7u64;
            for e in c.chunks_exact_mut(2) {
                if splitmix(&mut s) < threshold {
                    e[0] ^= (splitmix(&mut s) as u8 & 7) | 1;
                }
            }
            let mut snap = p.clone();
            let mut is_p = true;
            let mut out = Changes::default();
            let kind = best_impl();
            let mut count = 0;
            let t = best(rounds.div_ceil(4).max(5), || {
                out.clear();
                let cur = if is_p { &c[..] } else { &p[..] };
                diff_serial_with(kind, &mut snap, cur, 2, 0, &mut out);
                is_p = !is_p;
                count = out.positions.len();
            });
            line += &format!(" diff={:.0}", count as f64 / t / 1e6);
        }
        if want("auto") && only != Some("auto_fresh") {
            // As the sender encodes: into one chunk's buffers, reused from chunk to chunk.
            let mut enc = EncodedChunk::default();
            let t = best(rounds, || {
                for c in &all {
                    encode_chunk_into(
                        CodecChoice::Auto,
                        2,
                        black_box(&c.rel),
                        range(),
                        &c.old,
                        &c.new,
                        &mut enc,
                    );
                    black_box(&enc);
                }
            });
            line += &format!(" auto={:.0}", rate(t));
        }
        if only == Some("auto_fresh") {
            // Fresh section vectors per chunk (page faults included).
            let t = best(rounds, || {
                for c in &all {
                    black_box(encode_chunk(
                        CodecChoice::Auto,
                        2,
                        black_box(&c.rel),
                        range(),
                        &c.old,
                        &c.new,
                    ));
                }
            });
            line += &format!(" auto_fresh={:.0}", rate(t));
        }
        if only == Some("cgpos") {
            let held: Vec<(Vec<u8>, Vec<u8>)> = all.iter().map(held_range).collect();
            let (te, td, _) = context_positions(PosCodec::ContextGaps, &all, &held, rounds);
            line += &format!(" cgpos_enc={:.1} cgpos_dec={:.1}", rate(te), rate(td));
        } else if want("ctx") {
            line += &context_rates(&all, rounds);
        }
        if want("steps") {
            line += &steps_rates(&all, rounds);
        }
        let chosen: Vec<_> = all
            .iter()
            .map(|c| encode_chunk(CodecChoice::Auto, 2, &c.rel, range(), &c.old, &c.new))
            .collect();
        // The section decoders below time the first chunk's codecs on every chunk: the
        // chooser picks the same pair for every chunk of one density (checked here).
        let (Some(pos), Some(val)) = (chosen[0].pos_codec, chosen[0].val_codec) else {
            continue;
        };
        if chosen
            .iter()
            .any(|e| e.pos_codec != Some(pos) || e.val_codec != Some(val))
        {
            println!("d={density}: the chunks chose different codecs; decoders not timed");
            continue;
        }
        if only == Some("dir") {
            let (rel, chosen) = (&all[0].rel, &chosen[0]);
            let blocks = rel.len().div_ceil(1024);
            let kc: Vec<(u8, u8)> = chosen.values[..4 * blocks]
                .chunks(4)
                .map(|e| (e[2], e[3]))
                .collect();
            let (counts, same) = params_summary(&kc);
            println!(
                "{density}: (k,c) counts {counts:?}, neighbours equal {same}/{}",
                blocks - 1
            );
            let mut g = Vec::new();
            encode_positions(PosCodec::Gaps, rel, range(), &mut g);
            let ks: Vec<u8> = g[..7 * blocks].chunks(7).map(|e| e[6]).collect();
            let (counts, same) = params_summary(&ks);
            println!("gaps k counts {counts:?}, neighbours equal {same}");
        }
        for (key, codec) in [("genc", PosCodec::Gaps), ("benc", PosCodec::Bitmap)] {
            if want(key) {
                let mut enc = Vec::new();
                let t = best(rounds, || {
                    for c in &all {
                        enc.clear();
                        encode_positions(codec, black_box(&c.rel), range(), &mut enc)
                    }
                });
                line += &format!(" {}_enc={:.0}", codec.name(), rate(t));
            }
        }
        if want("uenc") {
            let mut enc = Vec::new();
            let t = best(rounds, || {
                for c in &all {
                    enc.clear();
                    encode_values(ValCodec::Ulp, 2, black_box(&c.old), &c.new, &mut enc)
                }
            });
            line += &format!(" ulp_enc={:.0}", rate(t));
        }
        let mut tp = 0.0;
        if want("pdec") {
            let mut out = Vec::new();
            tp = best(rounds, || {
                for (c, e) in all.iter().zip(&chosen) {
                    decode_positions(
                        pos,
                        black_box(&e.positions),
                        c.rel.len() as u32,
                        range(),
                        &mut out,
                    )
                    .expect("the chunk's own positions decode")
                }
            });
            line += &format!(" {}_dec={:.0}", pos.name(), rate(tp));
        }
        if want("udec") {
            let mut out = Vec::new();
            let tv = best(rounds, || {
                for (c, e) in all.iter().zip(&chosen) {
                    if val == ValCodec::Escaped {
                        let map = &e.positions;
                        decode_steps_values(2, map, range(), black_box(&e.values), &c.old, &mut out)
                    } else {
                        decode_values(val, 2, black_box(&e.values), &c.old, &mut out)
                    }
                    .expect("the chunk's own values decode")
                }
            });
            line += &format!(" {}_dec={:.0}", val.name(), rate(tv));
            if tp > 0.0 {
                line += &format!(" chunk_dec={:.0}", rate(tp + tv));
            }
        }
        println!("{line}");
    }
}

/// The receiver's bits of a chunk's whole range before and after the sync: changed elements
/// hold their old and new values, the others old values drawn from the chunk (so the exponent
/// classes the context codecs condition on look like the changed elements' own).
fn held_range(c: &Chunk) -> (Vec<u8>, Vec<u8>) {
    let mut s = 11u64;
    let count = (c.old.len() / 2).max(1);
    let mut before = vec![0u8; range() as usize * 2];
    for e in before.chunks_exact_mut(2) {
        let j = (splitmix(&mut s) % count as u64) as usize;
        if let Some(v) = c.old.get(2 * j..2 * j + 2) {
            e.copy_from_slice(v);
        }
    }
    for (j, &p) in c.rel.iter().enumerate() {
        let p = p as usize;
        before[2 * p..2 * p + 2].copy_from_slice(&c.old[2 * j..2 * j + 2]);
    }
    let mut after = before.clone();
    for (j, &p) in c.rel.iter().enumerate() {
        let p = p as usize;
        after[2 * p..2 * p + 2].copy_from_slice(&c.new[2 * j..2 * j + 2]);
    }
    (before, after)
}

/// ` ctx_enc=… ctx_dec=… ctx_codecs=POS+VAL`: the `auto+ctx` encode of every chunk and the
/// decode of its choice, in M changes per second.
fn context_rates(all: &[Chunk], rounds: usize) -> String {
    let held: Vec<(Vec<u8>, Vec<u8>)> = all.iter().map(held_range).collect();
    let n: f64 = all.iter().map(|c| c.rel.len() as f64).sum();
    let mut enc = EncodedChunk::default();
    let te = best(rounds, || {
        for (c, (_, after)) in all.iter().zip(&held) {
            encode_chunk_with_state_into(
                CodecChoice::AutoContext,
                2,
                black_box(&c.rel),
                range(),
                &c.old,
                &c.new,
                Some(after),
                &mut enc,
            );
            black_box(&enc);
        }
    });
    let chosen: Vec<EncodedChunk> = all
        .iter()
        .zip(&held)
        .map(|(c, (_, after))| {
            let mut e = EncodedChunk::default();
            encode_chunk_with_state_into(
                CodecChoice::AutoContext,
                2,
                &c.rel,
                range(),
                &c.old,
                &c.new,
                Some(after),
                &mut e,
            );
            e
        })
        .collect();
    let (mut pos, mut val) = (Vec::new(), Vec::new());
    let td = best(rounds, || {
        for ((c, e), (before, _)) in all.iter().zip(&chosen).zip(&held) {
            let (Some(pc), Some(vc)) = (e.pos_codec, e.val_codec) else {
                continue;
            };
            decode_positions_held(
                pc,
                black_box(&e.positions),
                c.rel.len() as u32,
                range(),
                2,
                before,
                &mut pos,
            )
            .expect("the chunk's own positions decode");
            decode_values(vc, 2, &e.values, &c.old, &mut val)
                .expect("the chunk's own values decode");
        }
    });
    // Checked once outside the timing: what was decoded is the chunk.
    for ((c, e), (before, _)) in all.iter().zip(&chosen).zip(&held) {
        let (Some(pc), Some(vc)) = (e.pos_codec, e.val_codec) else {
            continue;
        };
        decode_positions_held(
            pc,
            &e.positions,
            c.rel.len() as u32,
            range(),
            2,
            before,
            &mut pos,
        )
        .expect("the chunk's own positions decode");
        decode_values(vc, 2, &e.values, &c.old, &mut val).expect("the chunk's own values decode");
        assert!(pos == c.rel && val == c.new, "ctx round trip");
    }
    // The two halves alone: `ctxgaps` positions (and `ctx` positions, one range-coder step
    // per element, for comparison) and `ctx` values.
    let (tpe, tpd, sections) = context_positions(PosCodec::ContextGaps, all, &held, rounds);
    let (trpe, trpd, rc_sections) = context_positions(PosCodec::Context, all, &held, rounds);
    let (mut section, mut out) = (Vec::new(), Vec::new());
    let bytes = |v: &[Vec<u8>]| v.iter().map(Vec::len).sum::<usize>() as f64;
    let size_ratio = bytes(&sections) / bytes(&rc_sections);
    let tve = best(rounds, || {
        for c in all {
            section.clear();
            encode_values(ValCodec::Context, 2, &c.old, &c.new, &mut section);
            black_box(&section);
        }
    });
    let values: Vec<Vec<u8>> = all
        .iter()
        .map(|c| {
            let mut s = Vec::new();
            encode_values(ValCodec::Context, 2, &c.old, &c.new, &mut s);
            s
        })
        .collect();
    let tvd = best(rounds, || {
        for (c, s) in all.iter().zip(&values) {
            decode_values(ValCodec::Context, 2, s, &c.old, &mut out)
                .expect("the chunk's own values decode");
        }
    });
    let first = &chosen[0];
    format!(
        " ctx_enc={:.1} ctx_dec={:.1} cgpos_enc={:.1} cgpos_dec={:.1} rcpos_enc={:.1} rcpos_dec={:.1} cg_over_rc_bytes={:.3} cval_enc={:.1} cval_dec={:.1} ctx_codecs={}+{}",
        n / te / 1e6,
        n / td / 1e6,
        n / tpe / 1e6,
        n / tpd / 1e6,
        n / trpe / 1e6,
        n / trpd / 1e6,
        size_ratio,
        n / tve / 1e6,
        n / tvd / 1e6,
        first.pos_codec.map_or("-", |c| c.name()),
        first.val_codec.map_or("-", |c| c.name())
    )
}

/// Times the `codec` positions (one that needs the held range) of every chunk: the best
/// encode and decode times over `rounds`, and the sections.
fn context_positions(
    codec: PosCodec,
    all: &[Chunk],
    held: &[(Vec<u8>, Vec<u8>)],
    rounds: usize,
) -> (f64, f64, Vec<Vec<u8>>) {
    let encode = |c: &Chunk, after: &[u8], out: &mut Vec<u8>| {
        out.clear();
        encode_context_positions(codec, 2, &c.rel, after, &c.old, out);
    };
    let mut section = Vec::new();
    let te = best(rounds, || {
        for (c, (_, after)) in all.iter().zip(held) {
            encode(c, after, &mut section);
            black_box(&section);
        }
    });
    let sections: Vec<Vec<u8>> = all
        .iter()
        .zip(held)
        .map(|(c, (_, after))| {
            let mut s = Vec::new();
            encode(c, after, &mut s);
            s
        })
        .collect();
    let mut pos = Vec::new();
    let td = best(rounds, || {
        for ((c, s), (before, _)) in all.iter().zip(&sections).zip(held) {
            let count = c.rel.len() as u32;
            decode_positions_held(codec, s, count, range(), 2, before, &mut pos)
                .expect("the chunk's own positions decode");
        }
    });
    (te, td, sections)
}

/// ` steps_enc=… steps_dec=… steps_size=…`: the `steps+esc` encode of every chunk and the
/// decode of its positions and values, in M changes per second, and its bytes over `auto`'s.
fn steps_rates(all: &[Chunk], rounds: usize) -> String {
    let n: f64 = all.iter().map(|c| c.rel.len() as f64).sum();
    let pair = CodecChoice::Fixed(PosCodec::Steps, ValCodec::Escaped);
    let mut enc = EncodedChunk::default();
    let te = best(rounds, || {
        for c in all {
            encode_chunk_into(
                pair,
                2,
                black_box(&c.rel),
                range(),
                &c.old,
                &c.new,
                &mut enc,
            );
            black_box(&enc);
        }
    });
    let coded: Vec<EncodedChunk> = all
        .iter()
        .map(|c| encode_chunk(pair, 2, &c.rel, range(), &c.old, &c.new))
        .collect();
    let (mut pos, mut val) = (Vec::new(), Vec::new());
    let td = best(rounds, || {
        for (c, e) in all.iter().zip(&coded) {
            let count = c.rel.len() as u32;
            decode_positions(
                PosCodec::Steps,
                black_box(&e.positions),
                count,
                range(),
                &mut pos,
            )
            .expect("the chunk's own positions decode");
            decode_steps_values(2, &e.positions, range(), &e.values, &c.old, &mut val)
                .expect("the chunk's own values decode");
        }
    });
    // Checked once outside the timing: what was decoded is the chunk.
    let (mut steps_bytes, mut auto_bytes) = (0, 0);
    for (c, e) in all.iter().zip(&coded) {
        let count = c.rel.len() as u32;
        decode_positions(PosCodec::Steps, &e.positions, count, range(), &mut pos)
            .expect("the chunk's own positions decode");
        decode_steps_values(2, &e.positions, range(), &e.values, &c.old, &mut val)
            .expect("the chunk's own values decode");
        assert!(pos == c.rel && val == c.new, "steps round trip");
        let auto = encode_chunk(CodecChoice::Auto, 2, &c.rel, range(), &c.old, &c.new);
        steps_bytes += e.positions.len() + e.values.len();
        auto_bytes += auto.positions.len() + auto.values.len();
    }
    format!(
        " steps_enc={:.0} steps_dec={:.0} steps_size={:.2}",
        n / te / 1e6,
        n / td / 1e6,
        steps_bytes as f64 / auto_bytes.max(1) as f64
    )
}

/// How often each block parameter occurs, and how many neighbouring blocks share theirs.
fn params_summary<T: Ord + Copy>(params: &[T]) -> (std::collections::BTreeMap<T, usize>, usize) {
    let mut counts = std::collections::BTreeMap::new();
    for &x in params {
        *counts.entry(x).or_insert(0) += 1;
    }
    let same = params.windows(2).filter(|w| w[0] == w[1]).count();
    (counts, same)
}
