//! `auto+ctx` end to end: a sender with the context codecs, a receiver holding everything
//! (bit for bit the sender's state, `ctx` chunks on the wire), a `ChangeReceiver` whose owner
//! holds everything (accepted), and one whose owner holds part of a chunk (refused, typed).

use deltacast::apply::changes::{COUNTED, NOT_HELD};
use deltacast::codec::CodecChoice;
use deltacast::flush::FlushConfig;
use deltacast::{ChangeReceiver, DType, Error, HeldBits, Receiver, Sender};
use deltacast::{SlotInfo, SlotTable};

/// splitmix64.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Weight-like floats (a few exponents) as BF16 or FP32 bits, with ±0, NaN and subnormals.
fn weights(rng: &mut Rng, dtype: DType, n: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for _ in 0..n {
        let r = rng.next();
        let f = match r % 50 {
            0 => 0.0,
            1 => -0.0,
            2 => f32::NAN,
            3 => f32::from_bits(1 + (r >> 40) as u32 % 100),
            _ => ((r >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0) as f32 * 0.05,
        };
        match dtype {
            DType::BF16 => out.extend_from_slice(&((f.to_bits() >> 16) as u16).to_le_bytes()),
            _ => out.extend_from_slice(&f.to_bits().to_le_bytes()),
        }
    }
    out
}

/// A step: small-magnitude elements change more often (their ULP is small), by ±1..3 ULP.
fn step(rng: &mut Rng, dtype: DType, buf: &mut [u8]) {
    let w = dtype.width();
    for e in buf.chunks_exact_mut(w) {
        let bits = if w == 2 {
            u16::from_le_bytes([e[0], e[1]]) as u32
        } else {
            u32::from_le_bytes([e[0], e[1], e[2], e[3]])
        };
        let exp = (bits >> (8 * w as u32 - 9)) & 0xFF;
        let p = if exp < 118 { 0.3 } else { 0.01 };
        let r = rng.next();
        if ((r >> 11) as f64 / (1u64 << 53) as f64) < p {
            let d = 1 + (r % 3) as u32;
            let new = if r & 8 == 0 {
                bits.wrapping_add(d)
            } else {
                bits.wrapping_sub(d)
            };
            e.copy_from_slice(&new.to_le_bytes()[..w]);
        }
    }
}

/// Holds every element (`part` = false) or every element but one in 1000.
struct Owner {
    bufs: Vec<Vec<u8>>,
    widths: Vec<usize>,
    part: bool,
}

impl HeldBits for Owner {
    fn read(
        &mut self,
        slot: u32,
        positions: &[u64],
        old: &mut Vec<u8>,
        share: &mut Vec<u8>,
    ) -> deltacast::Result<()> {
        let w = self.widths[slot as usize];
        for &i in positions {
            let at = i as usize * w;
            if self.part && i % 1000 == 999 {
                old.extend(std::iter::repeat_n(0u8, w));
                share.push(NOT_HELD);
            } else {
                old.extend_from_slice(&self.bufs[slot as usize][at..at + w]);
                share.push(COUNTED);
            }
        }
        Ok(())
    }
}

#[test]
fn auto_ctx_syncs_bit_for_bit_and_part_holders_refuse() {
    let mut rng = Rng(2028);
    let dtypes = [DType::BF16, DType::F32, DType::BF16, DType::I32];
    let table = SlotTable::new(
        dtypes
            .iter()
            .enumerate()
            .map(|(i, &d)| SlotInfo::new(format!("w{i}"), d, vec![(37_000 + 1_000 * i) as u64]))
            .collect(),
    )
    .unwrap();
    let mut current: Vec<Vec<u8>> = table
        .slots()
        .iter()
        .map(|s| weights(&mut rng, s.dtype, s.numel() as usize))
        .collect();
    let config = FlushConfig {
        bucket_size: 64 << 10, // several frames per sync
        chunk_elems: 10_000,
        codec: CodecChoice::AutoContext,
    };
    let mut sender = Sender::new(table.clone(), config).unwrap();
    let mut rx = Receiver::new(table.clone());
    let widths: Vec<usize> = dtypes.iter().map(|d| d.width()).collect();
    let mut changes_rx = ChangeReceiver::new(table.clone());
    let mut part_rx = ChangeReceiver::new(table.clone());
    let mut saw_ctx = false;
    for round in 0..4 {
        if round > 0 {
            for (buf, &d) in current.iter_mut().zip(&dtypes) {
                step(&mut rng, d, buf);
            }
        }
        let mut frames = Vec::new();
        let slices: Vec<&[u8]> = current.iter().map(Vec::as_slice).collect();
        let report = sender
            .sync(&slices, |f| {
                frames.push(f);
                Ok(())
            })
            .unwrap();
        saw_ctx |= report.stats.codecs.keys().any(|k| k.contains("ctx"));
        let mut owner = Owner {
            bufs: rx.store().to_vec(),
            widths: widths.clone(),
            part: false,
        };
        // The part holder takes the seed whole, then holds all but one element in 1000.
        let mut part_owner = Owner {
            bufs: owner.bufs.clone(),
            widths: widths.clone(),
            part: round > 0,
        };
        let mut part_failed = false;
        for f in &frames {
            rx.receive(f).unwrap();
            changes_rx.receive(f, &mut owner).unwrap();
            if round < 2 && !part_failed {
                match part_rx.receive(f, &mut part_owner) {
                    Err(Error::Codec { .. }) => part_failed = true,
                    Err(e) => panic!("unexpected error {e}"),
                    Ok(_) => {}
                }
            }
        }
        assert_eq!(rx.store(), &current, "round {round}");
        assert!(rx.recompute_digests().is_empty());
        // The full holder settles on its own part and gets every change.
        let part = changes_rx.part().expect("a part").to_vec();
        changes_rx.settle(&part).unwrap();
        let mut held = owner.bufs.clone();
        for c in changes_rx.changes() {
            let w = widths[c.slot as usize];
            for (k, p) in c.positions(w).into_iter().enumerate() {
                held[c.slot as usize][p as usize * w..(p as usize + 1) * w]
                    .copy_from_slice(&c.values[k * w..(k + 1) * w]);
            }
        }
        assert_eq!(held, current, "change receiver, round {round}");
        changes_rx.commit().unwrap();
        if round == 0 {
            // A seed carries no ctx chunk: it is accepted.
            assert!(!part_failed);
            let part = part_rx.part().expect("a part").to_vec();
            part_rx.settle(&part).unwrap();
            part_rx.commit().unwrap();
        } else if round == 1 {
            assert!(
                report.stats.codecs.keys().any(|k| k.starts_with("ctx")),
                "{:?}",
                report.stats.codecs
            );
            assert!(part_failed, "a part holder cannot decode ctx positions");
            assert!(!part_rx.is_staging(), "the refused sync is dropped");
        }
    }
    assert!(saw_ctx, "the context codecs were chosen somewhere");
}
