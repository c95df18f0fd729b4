//! Adversarial syncs applied to a receiver holding known data. After every frame that does not
//! complete a sync, store, version and digests must be exactly as before (no half-applied
//! sync; a receiver that writes flushes as they arrive may change its store mid-sync, but a
//! refused frame must put back the state the sync started from); a completed sync must leave
//! digests that match memory. Three input modes (each with and without in-place flushes):
//!
//! - starts with `DCST`: a `.dcast` stream as recorded (the golden files), frames as they are;
//! - first byte ≡ 0 mod 4: the rest cut into frames, each resealed (right length and checksum);
//! - otherwise: a plan (via `arbitrary`) built into real frames with the library's encoders,
//!   honest digests from a model of the result, then lies, damage and reordering on top. An
//!   honest plan must be accepted and give the model's state.
#![no_main]

use std::collections::HashSet;

use arbitrary::{Arbitrary, Unstructured};
use deltacast::codec::{
    context_supports, encode_context_positions, encode_positions, encode_steps, encode_values,
    PosCodec, ValCodec,
};
use deltacast::digest::digest_slot;
use deltacast::dtype::{from_ordered, load_bits, store_bits, to_ordered};
use deltacast::wire::{FrameWriter, SlotDigest};
use deltacast::{FrameKind, Receiver, SlotTable};
use deltacast_fuzz::{
    cut_frames, golden_entropy, golden_small, mixed, reseal, scenario_for, seal, Feeder,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| POOL.install(|| one_input(data)));

// One worker, and the input runs on it: the receiver's parallel loops then run inline instead
// of waking another thread for every frame (faster, and a crash stack is the input's own).
static POOL: std::sync::LazyLock<rayon::ThreadPool> = std::sync::LazyLock::new(|| {
    rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap()
});

fn one_input(data: &[u8]) {
    match data.first() {
        None => {}
        Some(b'D') => {
            let mut r = scenario_for(data, 0).receiver();
            r.set_apply_as_received(data.len() % 2 == 1);
            let mut feeder = Feeder::default();
            for f in cut_frames(data) {
                let _ = feeder.feed(&mut r, f);
            }
        }
        Some(&m) if m % 4 == 0 => {
            let frames = cut_frames(&data[1..]);
            let mut r = scenario_for(frames.first().copied().unwrap_or(&[]), m >> 2).receiver();
            r.set_apply_as_received(m & 0x40 != 0);
            let mut feeder = Feeder::default();
            for f in frames {
                let mut f = f.to_vec();
                seal(&mut f);
                let _ = feeder.feed(&mut r, &f);
            }
        }
        Some(_) => {
            if let Ok(plan) = Plan::arbitrary_take_rest(Unstructured::new(&data[1..])) {
                run_plan(&plan);
            }
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Plan {
    scenario: u8,
    fresh: bool,
    /// The receiver writes each flush of a delta as it arrives.
    in_place: bool,
    syncs: Vec<SyncPlan>,
}

#[derive(Arbitrary, Debug)]
struct SyncPlan {
    kind: u8,
    /// Below 240: the right version; 255: the last one (`u64::MAX`); else off by `skew - 239`.
    skew: u8,
    frames: u8,
    digest_frame: u8,
    chunks: Vec<ChunkPlan>,
    lies: Vec<Lie>,
    damage: Vec<Damage>,
    /// Below 5: in order; 5 reversed, 6 first frame twice, 7 last frame dropped.
    order: u8,
}

#[derive(Arbitrary, Debug)]
struct ChunkPlan {
    slot: u8,
    start: u16,
    range: u16,
    density: u8,
    seed: u32,
    pos: u8,
    val: u8,
    frame: u8,
    /// Even: small ULP steps; odd: random bit flips.
    step: u8,
}

#[derive(Arbitrary, Debug)]
enum Lie {
    Base(u8, u64),
    New(u8, u64),
    Missing(u8),
    Twice(u8),
}

#[derive(Arbitrary, Debug)]
struct Damage {
    frame: u8,
    at: u32,
    xor: u8,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u32 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) as u32
    }
}

struct Chunk {
    frame: usize,
    slot: u32,
    pos: PosCodec,
    val: ValCodec,
    start: u64,
    range: u64,
    rel: Vec<u32>,
    old: Vec<u8>,
    new: Vec<u8>,
}

fn run_plan(plan: &Plan) {
    let scenario = match plan.scenario % 3 {
        0 => golden_small(),
        1 => golden_entropy(),
        _ => mixed(),
    };
    let mut r = if plan.fresh {
        Receiver::new(scenario.table.clone())
    } else {
        scenario.receiver()
    };
    r.set_apply_as_received(plan.in_place);
    let mut feeder = Feeder::default();
    for sync in plan.syncs.iter().take(4) {
        run_sync(&mut r, &mut feeder, sync);
    }
}

fn run_sync(r: &mut Receiver, feeder: &mut Feeder, plan: &SyncPlan) {
    if r.applies_as_received() && r.is_staging() {
        // A sync left half received wrote into the store: put it back before modelling the
        // next one from what the receiver holds (a client does this when its link drops).
        r.abort_sync();
    }
    let table = r.table().clone();
    let held = r.store().clone();
    let mut model = held.clone();
    let mut honest = true;
    // Dense: a delta sync whose even frames are dense.
    let kind = [
        FrameKind::Seed,
        FrameKind::Delta,
        FrameKind::Verify,
        FrameKind::Dense,
    ][plan.kind as usize % 4];
    let delta_sync = kind.family() == FrameKind::Delta;
    let nframes = 1 + plan.frames as usize % 4;
    let mut chunks = Vec::new();
    let width = |slot: u32| table.slots()[slot as usize].dtype.width();
    // Per slot: the dense frame that sends it whole.
    let mut dense_in: Vec<Option<usize>> = vec![None; table.len()];

    match kind {
        FrameKind::Delta => {
            let mut touched = HashSet::new();
            for c in plan.chunks.iter().take(16) {
                let slot = (c.slot as usize % table.len()) as u32;
                let frame = c.frame as usize % nframes;
                let made = delta_chunk(c, slot, frame, &table, &held, &mut model, &mut touched);
                honest &= made.as_ref().is_none_or(|(_, fresh)| *fresh);
                chunks.extend(made.map(|(chunk, _)| chunk));
            }
        }
        FrameKind::Dense => {
            // A delta sync mixing frame kinds: even frames dense, odd frames delta. A slot is
            // sent whole by one even frame (its digest record there, a held value resent now
            // and then) or gets delta chunks in odd frames, never both.
            let mut touched = HashSet::new();
            for c in plan.chunks.iter().take(16) {
                let slot = (c.slot as usize % table.len()) as u32;
                let (numel, w) = (table.slots()[slot as usize].numel(), width(slot));
                let busy = touched.iter().any(|&(s, _)| s == slot);
                if numel == 0 || dense_in[slot as usize].is_some() {
                    continue;
                }
                if c.step % 3 != 0 {
                    if nframes >= 2 {
                        let frame = (c.frame as usize % (nframes / 2)) * 2 + 1;
                        let made =
                            delta_chunk(c, slot, frame, &table, &held, &mut model, &mut touched);
                        honest &= made.as_ref().is_none_or(|(_, fresh)| *fresh);
                        chunks.extend(made.map(|(chunk, _)| chunk));
                    }
                    continue;
                }
                if busy {
                    continue;
                }
                let frame = (c.frame as usize % nframes) & !1;
                dense_in[slot as usize] = Some(frame);
                let mut rng = Rng(c.seed as u64);
                let piece = 1 + c.range as u64;
                let mut start = 0u64;
                while start < numel {
                    let mut range = piece.min(numel - start);
                    if chunks.len() >= 60 {
                        range = numel - start;
                    }
                    let mut new = Vec::new();
                    for index in start as usize..(start + range) as usize {
                        let b = if rng.next().is_multiple_of(4) {
                            load_bits(&held[slot as usize], w, index)
                        } else {
                            rng.next()
                        };
                        new.extend_from_slice(&b.to_le_bytes()[..w]);
                        store_bits(&mut model[slot as usize], w, index, b);
                    }
                    chunks.push(Chunk {
                        frame,
                        slot,
                        pos: PosCodec::All,
                        val: ValCodec::Raw,
                        start,
                        range,
                        rel: (0..range as u32).collect(),
                        old: Vec::new(),
                        new,
                    });
                    start += range;
                }
            }
        }
        FrameKind::Seed => {
            // Each slot cut into pieces; a piece is one `all` chunk or two interleaved chunks.
            let mut plans = plan.chunks.iter().cycle();
            let mut rng = Rng(plan.chunks.first().map_or(1, |c| c.seed as u64));
            for slot in 0..table.len() as u32 {
                let (numel, w) = (table.slots()[slot as usize].numel(), width(slot));
                let mut start = 0u64;
                while start < numel {
                    let c = plans.next();
                    let mut range = c.map_or(numel, |c| 1 + c.range as u64).min(numel - start);
                    if chunks.len() >= 60 {
                        range = numel - start;
                    }
                    let pos = c.map_or(PosCodec::All, |c| PosCodec::ALL[c.pos as usize % 5]);
                    let frame = c.map_or(0, |c| c.frame as usize) % nframes;
                    let density = c.map_or(0, |c| c.density as u32);
                    let mut parts = vec![Vec::new(), Vec::new()];
                    for p in 0..range as u32 {
                        let part = pos != PosCodec::All && rng.next() % 256 <= density;
                        parts[part as usize].push(p);
                    }
                    for (k, rel) in parts.into_iter().enumerate() {
                        if rel.is_empty() {
                            continue;
                        }
                        let mut new = Vec::new();
                        for &p in &rel {
                            let b = rng.next();
                            new.extend_from_slice(&b.to_le_bytes()[..w]);
                            store_bits(
                                &mut model[slot as usize],
                                w,
                                (start + p as u64) as usize,
                                b,
                            );
                        }
                        let pos = if rel.len() as u64 == range {
                            PosCodec::All
                        } else if k == 0 {
                            PosCodec::ALL[1 + (density as usize + 1) % 4]
                        } else {
                            pos
                        };
                        chunks.push(Chunk {
                            frame: (frame + k) % nframes,
                            slot,
                            pos,
                            val: ValCodec::Raw,
                            start,
                            range,
                            rel,
                            old: Vec::new(),
                            new,
                        });
                    }
                    start += range;
                }
            }
        }
        FrameKind::Verify | FrameKind::Close => {}
    }

    let model_digests: Vec<u64> = (0..table.len() as u32)
        .map(|id| digest_slot(id, width(id), &model[id as usize]))
        .collect();
    let mut records: Vec<Option<SlotDigest>> = (0..table.len())
        .map(|id| {
            let base = match kind {
                FrameKind::Delta | FrameKind::Dense => r.digests()[id],
                FrameKind::Seed | FrameKind::Close => 0,
                FrameKind::Verify => model_digests[id],
            };
            Some(SlotDigest {
                slot: id as u32,
                base,
                new: model_digests[id],
            })
        })
        .collect();
    let mut twice = Vec::new();
    for lie in plan.lies.iter().take(4) {
        let pick = |s: &u8| *s as usize % table.len();
        match lie {
            Lie::Base(s, v) => {
                if let Some(rec) = &mut records[pick(s)] {
                    honest &= !delta_sync || rec.base == *v;
                    rec.base = *v;
                }
            }
            Lie::New(s, v) => {
                if let Some(rec) = &mut records[pick(s)] {
                    honest &= rec.new == *v;
                    rec.new = *v;
                }
            }
            Lie::Missing(s) => {
                honest = false;
                records[pick(s)] = None;
            }
            Lie::Twice(s) => {
                honest = false;
                twice.extend(records[pick(s)]);
            }
        }
    }

    let current = r.version();
    let version = match kind {
        FrameKind::Verify => current.unwrap_or(0),
        _ => current.map_or(1, |v| v.wrapping_add(1)),
    };
    honest &= kind == FrameKind::Seed || current.is_some();
    // No version follows the last one: a delta from there must be refused, not wrap.
    honest &= !delta_sync || current != Some(u64::MAX);
    let version = match plan.skew {
        0..240 => version,
        255 => {
            honest &= kind == FrameKind::Seed || version == u64::MAX;
            u64::MAX
        }
        skew => {
            honest = false;
            version.wrapping_add(skew as u64 - 239)
        }
    };

    let digest_frame = plan.digest_frame as usize % nframes;
    let mut frames: Vec<Vec<u8>> = (0..nframes)
        .map(|i| {
            let frame_kind = match kind {
                FrameKind::Dense if i % 2 == 1 => FrameKind::Delta,
                other => other,
            };
            let mut w = FrameWriter::new(frame_kind, version, table.hash(), i as u32);
            if plan.frames & 0x80 != 0 {
                // The GPU's layout: count known, sections split at values_start.
                w = w
                    .with_flush_count(nframes as u32)
                    .split_sections(4, [1, 2, 4][plan.frames as usize % 3]);
            }
            for (k, c) in chunks.iter().enumerate().filter(|(_, c)| c.frame == i) {
                let (mut pos, mut val) = (Vec::new(), Vec::new());
                let w_slot = width(c.slot);
                // `ctx` needs 2- or 4-byte elements and, as a real sender's chunks, a range no
                // other chunk of the sync changes (it is coded against the receiver's bits).
                let ctx_ok = context_supports(w_slot) && !changed_by_others(&chunks, k);
                let pos_codec = match c.pos {
                    p if p.needs_held() && !ctx_ok => PosCodec::Gaps,
                    p => p,
                };
                let val_codec = match c.val {
                    ValCodec::Context if !ctx_ok => ValCodec::Ulp,
                    v => v,
                };
                // `steps` and `esc` go together, on a dtype `ulp` carries; else `steps` becomes
                // `bitmap` and `esc` `ulp` (as the encoder's fixed fallbacks).
                let steps_ok = table.slots()[c.slot as usize].dtype.ulp_codable();
                let (pos_codec, val_codec) = match (pos_codec, val_codec) {
                    (PosCodec::Steps, _) | (_, ValCodec::Escaped) if steps_ok => {
                        (PosCodec::Steps, ValCodec::Escaped)
                    }
                    (p, v) => (
                        if p == PosCodec::Steps {
                            PosCodec::Bitmap
                        } else {
                            p
                        },
                        if v == ValCodec::Escaped {
                            ValCodec::Ulp
                        } else {
                            v
                        },
                    ),
                };
                if pos_codec == PosCodec::Steps {
                    let range = c.range as u32;
                    encode_steps(w_slot, &c.rel, range, &c.old, &c.new, &mut pos, &mut val);
                } else if pos_codec.needs_held() {
                    // The range's bits after the sync: the held ones, this chunk's written in.
                    let (a, b) = (
                        c.start as usize * w_slot,
                        (c.start + c.range) as usize * w_slot,
                    );
                    let mut after = held[c.slot as usize][a..b].to_vec();
                    for (j, &p) in c.rel.iter().enumerate() {
                        store_bits(&mut after, w_slot, p as usize, load_bits(&c.new, w_slot, j));
                    }
                    encode_context_positions(pos_codec, w_slot, &c.rel, &after, &c.old, &mut pos);
                } else {
                    encode_positions(pos_codec, &c.rel, c.range as u32, &mut pos);
                }
                let old = if val_codec == ValCodec::Raw {
                    &c.new
                } else {
                    &c.old
                };
                if val_codec != ValCodec::Escaped {
                    encode_values(val_codec, w_slot, old, &c.new, &mut val);
                }
                let count = c.rel.len() as u64;
                w.push_chunk(
                    c.slot, pos_codec, val_codec, c.start, c.range, count, &pos, &val,
                );
            }
            // A dense slot's record travels in its frame, every other one in the digest frame.
            let here = |rec: &&SlotDigest| match dense_in[rec.slot as usize] {
                Some(frame) => frame == i,
                None => i == digest_frame,
            };
            for rec in records.iter().flatten().filter(here) {
                w.push_digest(*rec);
            }
            if i == digest_frame {
                for rec in &twice {
                    w.push_digest(*rec);
                }
            }
            w.finish(i + 1 == nframes)
        })
        .collect();
    for d in plan.damage.iter().take(8) {
        let f = &mut frames[d.frame as usize % nframes];
        let at = d.at as usize % f.len();
        f[at] ^= d.xor;
        honest &= d.xor == 0;
        reseal(f);
    }
    match plan.order % 8 {
        5 if nframes > 1 => {
            honest = false;
            frames.reverse();
        }
        6 => {
            honest = false;
            frames.insert(1, frames[0].clone());
        }
        7 => {
            honest = false;
            frames.pop();
        }
        _ => {}
    }

    let mut last = None;
    for f in &frames {
        let result = feeder.feed(r, f);
        if honest {
            assert!(result.is_ok(), "honest {kind:?} sync refused: {result:?}");
        }
        last = Some(result);
    }
    if let Some(Ok(Some(outcome))) = &last {
        if r.digests() == model_digests && outcome.kind != FrameKind::Verify {
            assert!(r.store() == &model, "accepted sync differs from the model");
        }
    } else if honest {
        panic!("honest {kind:?} sync did not complete: {last:?}");
    }
}

/// One delta chunk of `slot` in `frame` as plan `c` says, its changes applied to `model`.
/// `None` when the slot is empty; the flag is false when an element was already changed by an
/// earlier chunk of the sync (an element sent twice: the sync must be refused).
fn delta_chunk(
    c: &ChunkPlan,
    slot: u32,
    frame: usize,
    table: &SlotTable,
    held: &[Vec<u8>],
    model: &mut [Vec<u8>],
    touched: &mut HashSet<(u32, usize)>,
) -> Option<(Chunk, bool)> {
    let mut fresh = true;
    let info = &table.slots()[slot as usize];
    let (numel, w) = (info.numel(), info.dtype.width());
    if numel == 0 {
        return None;
    }
    let start = c.start as u64 % numel;
    let range = 1 + c.range as u64 % (numel - start);
    // Every position codec, `ctx` and `steps` included (the frame writer falls back where it
    // cannot go).
    let pos = PosCodec::ALL[c.pos as usize % PosCodec::ALL.len()];
    let mut rng = Rng(c.seed as u64);
    let mut rel: Vec<u32> = (0..range as u32)
        .filter(|_| pos == PosCodec::All || rng.next() % 256 <= c.density as u32)
        .collect();
    if rel.is_empty() {
        rel.push(rng.next() % range as u32);
    }
    let (mut old, mut new) = (Vec::new(), Vec::new());
    let mask = if w == 4 {
        u32::MAX
    } else {
        (1u32 << (8 * w)) - 1
    };
    for &p in &rel {
        let index = (start + p as u64) as usize;
        fresh &= touched.insert((slot, index));
        let a = load_bits(&held[slot as usize], w, index);
        let b = if c.step.is_multiple_of(2) {
            let d = 1 + rng.next() % 4;
            let d = if rng.next().is_multiple_of(2) {
                d
            } else {
                d.wrapping_neg()
            };
            from_ordered(to_ordered(a, w).wrapping_add(d) & mask, w)
        } else {
            a ^ ((rng.next() & mask).max(1))
        };
        old.extend_from_slice(&a.to_le_bytes()[..w]);
        new.extend_from_slice(&b.to_le_bytes()[..w]);
        store_bits(&mut model[slot as usize], w, index, b);
    }
    let chunk = Chunk {
        frame,
        slot,
        pos,
        val: ValCodec::ALL[c.val as usize % ValCodec::ALL.len()],
        start,
        range,
        rel,
        old,
        new,
    };
    Some((chunk, fresh))
}

/// Whether a chunk other than `k` changes an element of chunk `k`'s range.
fn changed_by_others(chunks: &[Chunk], k: usize) -> bool {
    let c = &chunks[k];
    chunks.iter().enumerate().any(|(j, o)| {
        j != k
            && o.slot == c.slot
            && o.rel.iter().any(|&p| {
                let at = o.start + p as u64;
                (c.start..c.start + c.range).contains(&at)
            })
    })
}
