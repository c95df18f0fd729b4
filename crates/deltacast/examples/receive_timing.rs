//! Receiver time for one delta of a Qwen2.5-0.5B-sized state (494 M BF16 elements by default,
//! `DELTACAST_ELEMS` to change), ~2% of elements moved AdamW-like (mostly ±1 ULP, some jumps),
//! next to a plain copy of the same state, for `auto` and `abs32+raw` frames:
//! `cargo run --release -p deltacast --example receive_timing`.
//!
//! Each repetition applies the same frames to a fresh receiver holding the base state (built
//! outside the timed region); the figure is `Receiver::receive` over all frames of the sync
//! (verify, decode, digest check, apply). Median of `DELTACAST_REPS` (default 5).
//!
//! Then a `ChangeReceiver` (what an engine rank runs) with an owner that holds and counts
//! every element (TP 1) over the `auto` delta: `receive` of every frame (reading the old bits
//! from the owner), `settle`, `changes`; its time per change beside the full receiver's.

use std::time::Instant;

use deltacast::apply::changes::COUNTED;
use deltacast::flush::FlushConfig;
use deltacast::{
    ChangeReceiver, CodecChoice, DType, HeldBits, Receiver, Sender, SlotInfo, SlotTable,
};

/// An engine of one rank: holds every element, counts it.
struct Owner<'a>(&'a [Vec<u8>]);

impl HeldBits for Owner<'_> {
    fn read(
        &mut self,
        slot: u32,
        positions: &[u64],
        old: &mut Vec<u8>,
        share: &mut Vec<u8>,
    ) -> deltacast::Result<()> {
        let bits = &self.0[slot as usize];
        for &p in positions {
            let at = p as usize * 2;
            old.extend_from_slice(&bits[at..at + 2]);
        }
        share.resize(share.len() + positions.len(), COUNTED);
        Ok(())
    }
}

fn env(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default)
}

fn rng(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn main() {
    let n = env("DELTACAST_ELEMS", 494_032_768);
    let reps = env("DELTACAST_REPS", 5).max(1);
    let density = std::env::var("DELTACAST_DENSITY")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0.02f64);
    // One embedding-like slot of ~28% and 24 layers' worth of equal slots.
    let embed = n * 28 / 100;
    let rest = (n - embed) / 24;
    let mut shapes = vec![embed as u64];
    shapes.extend(std::iter::repeat_n(rest as u64, 24));
    let table = SlotTable::new(
        shapes
            .iter()
            .enumerate()
            .map(|(i, &len)| SlotInfo::new(format!("w{i}"), DType::BF16, vec![len]))
            .collect(),
    )
    .unwrap();
    let mut s = 7u64;
    let base: Vec<Vec<u8>> = shapes
        .iter()
        .map(|&len| {
            (0..len)
                .flat_map(|_| {
                    let r = rng(&mut s);
                    (((r & 0x7fff) as u16 % 0x3d00) | (((r >> 20) & 1) << 15) as u16).to_le_bytes()
                })
                .collect()
        })
        .collect();
    let threshold = (density * u64::MAX as f64) as u64;
    let next: Vec<Vec<u8>> = base
        .iter()
        .map(|b| {
            let mut b = b.clone();
            for e in b.chunks_exact_mut(2) {
                if rng(&mut s) < threshold {
                    let v = u16::from_le_bytes([e[0], e[1]]);
                    let r = rng(&mut s);
                    let step: i32 = match r % 100 {
                        0..=86 => 1,
                        87..=98 => 2 + (r >> 8) as i32 % 30,
                        _ => 100 + (r >> 8) as i32 % 3000,
                    };
                    let step = if (r >> 40) & 1 == 0 { step } else { -step };
                    let nv = (v as i32 + step).clamp(1, 0x7eff) as u16;
                    let nv = if nv == v { v ^ 1 } else { nv };
                    e.copy_from_slice(&nv.to_le_bytes());
                }
            }
            b
        })
        .collect();
    let slices: Vec<&[u8]> = next.iter().map(Vec::as_slice).collect();
    println!(
        "{} BF16 elements in {} slots, {:.2}% moved, {} threads",
        n,
        shapes.len(),
        density * 100.0,
        rayon::current_num_threads()
    );

    let mut copy: Vec<Vec<u8>> = base.iter().map(|b| vec![0u8; b.len()]).collect();
    let copy_ms = median(
        (0..reps.max(5))
            .map(|_| {
                let t = Instant::now();
                for (d, b) in copy.iter_mut().zip(&base) {
                    d.copy_from_slice(b);
                }
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect(),
    );
    println!("memcpy of the state: {copy_ms:.1} ms");
    drop(copy);

    for codec in ["auto", "abs32+raw"] {
        let config = FlushConfig {
            codec: CodecChoice::parse(codec).unwrap(),
            ..FlushConfig::default()
        };
        let mut sender = Sender::with_base(table.clone(), config, base.clone(), 1).unwrap();
        let mut frames = Vec::new();
        let t = Instant::now();
        sender
            .delta(&slices, |f| {
                frames.push(f);
                Ok(())
            })
            .unwrap();
        let send_ms = t.elapsed().as_secs_f64() * 1e3;
        drop(sender);
        let wire: usize = frames.iter().map(Vec::len).sum();
        let mut times = Vec::new();
        // DELTACAST_FULL_REPS=0: only the change receiver (e.g. under a profiler).
        for _ in 0..env("DELTACAST_FULL_REPS", reps).max(1) {
            let mut receiver = Receiver::with_state(table.clone(), base.clone(), Some(1)).unwrap();
            let t = Instant::now();
            for f in &frames {
                receiver.receive(f).unwrap();
            }
            times.push(t.elapsed().as_secs_f64() * 1e3);
            assert!(receiver.store() == &next);
        }
        let best = times.iter().copied().fold(f64::INFINITY, f64::min);
        let ms = median(times);
        if codec == "auto" {
            change_receiver(&table, &base, &next, ms, reps);
        }
        println!(
            "{codec}: {} flush(es), {:.2} MB; sender {send_ms:.1} ms; receiver {ms:.1} ms \
             (median of {reps}, best {best:.1}; {:.2}x the memcpy)",
            frames.len(),
            wire as f64 / 1e6,
            ms / copy_ms
        );
    }
}

/// The `auto` delta through a `ChangeReceiver` seeded with `base`; prints its time per change
/// beside the full receiver's `full_ms`.
fn change_receiver(
    table: &SlotTable,
    base: &[Vec<u8>],
    next: &[Vec<u8>],
    full_ms: f64,
    reps: usize,
) {
    let mut sender = Sender::new(table.clone(), FlushConfig::default()).unwrap();
    let mut frames = Vec::new();
    let base_slices: Vec<&[u8]> = base.iter().map(Vec::as_slice).collect();
    sender
        .sync(&base_slices, |f| {
            frames.push(f);
            Ok(())
        })
        .unwrap();
    let mut seeded = ChangeReceiver::new(table.clone());
    for f in &frames {
        seeded.receive(f, &mut Owner(base)).unwrap();
    }
    let part = seeded.part().unwrap().to_vec();
    seeded.settle(&part).unwrap();
    seeded.commit().unwrap();
    let next_slices: Vec<&[u8]> = next.iter().map(Vec::as_slice).collect();
    let mut frames = Vec::new();
    sender
        .sync(&next_slices, |f| {
            frames.push(f);
            Ok(())
        })
        .unwrap();
    let (mut times, mut changed) = (Vec::new(), 0);
    for _ in 0..reps {
        // An aborted sync leaves the version held: the same delta again.
        let t = Instant::now();
        for f in &frames {
            seeded.receive(f, &mut Owner(base)).unwrap();
        }
        let part = seeded.part().unwrap().to_vec();
        seeded.settle(&part).unwrap();
        changed = seeded
            .changes()
            .iter()
            .map(|c| c.values.len() / 2)
            .sum::<usize>();
        times.push(t.elapsed().as_secs_f64() * 1e3);
        seeded.abort_sync();
    }
    let ms = median(times);
    println!(
        "change receiver (TP 1 owner): {ms:.1} ms for {changed} changes ({:.1} ns/change; \
         the full receiver {:.1} ns/change)",
        ms * 1e6 / changed as f64,
        full_ms * 1e6 / changed as f64
    );
}
