//! `ctxgaps` round trips against the input itself (the codec is lossless) on masks whose
//! change rate depends on the exponent, as an optimizer's steps do, and on uniform ones; the
//! vector planes against the one-element-at-a-time ones; hostile sections (never a panic,
//! only an error or a valid list of positions); a golden vector.

use super::super::tests::held_range;
use super::members::{class_members, members, planes, planes_scalar, select};
use super::*;
use crate::testutil::{bernoulli_positions, Rng};

/// Changes drawn per element with a probability that halves per exponent step above the
/// smallest (an update of one size crosses half an ULP less often as the ULP grows).
fn exponent_driven(rng: &mut Rng, width: usize, held: &[u8], density: f64) -> Vec<u32> {
    let nb = 8 * width as u32;
    (0..(held.len() / width) as u32)
        .filter(|&i| {
            let e = exponent(load_bits(held, width, i as usize), nb);
            let p = density * 4.0 / (1u64 << (e % 8).min(6)) as f64;
            rng.chance(p.min(1.0))
        })
        .collect()
}

/// The old bits at `rel`, and the range after the sync (each change stepped by one ULP of
/// the ordered view; the position codec reads only the old bits of each element).
fn old_and_after(width: usize, held: &[u8], rel: &[u32]) -> (Vec<u8>, Vec<u8>) {
    let mut old = Vec::with_capacity(rel.len() * width);
    let mut after = held.to_vec();
    for &p in rel {
        let o = load_bits(held, width, p as usize);
        old.extend_from_slice(&o.to_le_bytes()[..width]);
        crate::dtype::store_bits(&mut after, width, p as usize, o ^ 1);
    }
    (old, after)
}

fn round_trip(width: usize, held: &[u8], rel: &[u32]) -> usize {
    let range = (held.len() / width) as u32;
    let (old, after) = old_and_after(width, held, rel);
    let mut section = Vec::new();
    encode_positions(width, rel, &after, &old, &mut section);
    let mut back = vec![99];
    decode_positions(width, &section, rel.len() as u32, range, held, &mut back)
        .unwrap_or_else(|e| panic!("width {width} range {range} count {}: {e}", rel.len()));
    assert_eq!(back, rel, "width {width} range {range}");
    section.len()
}

#[test]
fn round_trips_every_width_size_and_density() {
    let mut rng = Rng(41);
    for width in [2usize, 4] {
        for range in [1u32, 2, 63, 64, 65, 127, 1000, 4097, 70_001] {
            let held = held_range(&mut rng, width, range);
            for density in [0.0, 0.0005, 0.01, 0.1, 0.5, 0.97, 1.0] {
                let rel = bernoulli_positions(&mut rng, range, density);
                round_trip(width, &held, &rel);
                let rel = exponent_driven(&mut rng, width, &held, density);
                round_trip(width, &held, &rel);
            }
            // The first and the last element alone, and both.
            round_trip(width, &held, &[0]);
            round_trip(width, &held, &[range - 1]);
            if range > 1 {
                round_trip(width, &held, &[0, range - 1]);
            }
        }
    }
}

#[test]
fn one_class_holds_every_change_and_classes_without_changes_cost_nothing() {
    // Every element with one exponent; then a range of many exponents where only one
    // exponent's elements change.
    let mut rng = Rng(3);
    let held: Vec<u8> = (0..5000u32)
        .flat_map(|i| (0x3F80u16 | (i % 128) as u16).to_le_bytes())
        .collect();
    let rel = bernoulli_positions(&mut rng, 5000, 0.03);
    round_trip(2, &held, &rel);
    let held: Vec<u8> = (0..5000u32)
        .flat_map(|i| (((100 + i % 40) << 7) as u16).to_le_bytes())
        .collect();
    let rel: Vec<u32> = (0..5000)
        .filter(|i| i % 40 == 7 && rng.chance(0.5))
        .collect();
    round_trip(2, &held, &rel);
}

#[test]
fn vector_planes_equal_the_scalar_ones() {
    let mut rng = Rng(8);
    for range in [1u32, 64, 100, 128, 1000, 4096 + 37] {
        let held = held_range(&mut rng, 2, range);
        for _ in 0..20 {
            let base = rng.below(256) as u8;
            let steps = (rng.next_u64() as u16) & 0xFFFE;
            // Keep at most 8 classes: drop set bits from the top.
            let mut steps = steps;
            while steps.count_ones() as usize >= MAX_CLASSES {
                steps &= !(1 << (15 - steps.leading_zeros()));
            }
            let map = ClassMap::new(base, steps).unwrap();
            let mut fast = vec![[0u64; 4]; range.div_ceil(64) as usize];
            planes(2, &held, &map, &mut fast);
            let mut slow = vec![[0u64; 4]; range.div_ceil(64) as usize];
            planes_scalar(2, &held, &map, 0, &mut slow);
            assert_eq!(fast, slow, "range {range} base {base} steps {steps:#x}");
        }
    }
}

#[test]
fn select_finds_the_nth_set_bit() {
    let mut rng = Rng(9);
    for _ in 0..2000 {
        let v = rng.next_u64() & rng.next_u64();
        let set: Vec<u32> = (0..64).filter(|&b| v >> b & 1 == 1).collect();
        for (g, &b) in set.iter().enumerate() {
            assert_eq!(select(v, g as u32), b);
        }
    }
    assert_eq!(select(u64::MAX, 63), 63);
}

#[test]
fn class_members_are_each_class_s_members() {
    let mut rng = Rng(10);
    for _ in 0..2000 {
        // Planes are zero outside the range's mask, as `planes` writes them.
        let valid = match rng.below(3) {
            0 => u64::MAX,
            _ => mask(rng.below(64) as u32),
        };
        let p = [
            rng.next_u64() & valid,
            rng.next_u64() & valid,
            rng.next_u64() & valid,
            valid,
        ];
        let all = class_members(&p);
        for c in 0..MAX_CLASSES as u8 {
            assert_eq!(all[c as usize], members(&p, c), "class {c}");
        }
        assert_eq!(all.iter().fold(0, |a, m| a | m), valid);
    }
}

#[test]
fn beats_plain_gaps_where_the_exponent_predicts_changes() {
    // Context pays where the change rate depends on the exponent: smaller than `gaps`, and
    // within a few percent of `ctx`, which codes every element with adaptive models.
    let mut rng = Rng(12);
    let held = held_range(&mut rng, 2, 1 << 20);
    let rel = exponent_driven(&mut rng, 2, &held, 0.01);
    let (old, after) = old_and_after(2, &held, &rel);
    let fast = round_trip(2, &held, &rel);
    let mut gaps = Vec::new();
    crate::codec::encode_positions(crate::codec::PosCodec::Gaps, &rel, 1 << 20, &mut gaps);
    let mut ctx = Vec::new();
    super::super::encode_positions(2, &rel, &after, &old, &mut ctx);
    assert!(
        (fast as f64) < 0.9 * gaps.len() as f64 && (fast as f64) < 1.05 * ctx.len() as f64,
        "ctxgaps {fast} bytes, gaps {}, ctx {}",
        gaps.len(),
        ctx.len()
    );
}

#[test]
fn hostile_sections_never_panic() {
    let mut rng = Rng(77);
    for width in [2usize, 4] {
        let range = 3000u32;
        let held = held_range(&mut rng, width, range);
        let rel = exponent_driven(&mut rng, width, &held, 0.05);
        let (old, after) = old_and_after(width, &held, &rel);
        let mut section = Vec::new();
        encode_positions(width, &rel, &after, &old, &mut section);
        let count = rel.len() as u32;
        let mut out = Vec::new();
        let check = |input: &[u8], count: u32, out: &mut Vec<u32>| {
            if decode_positions(width, input, count, range, &held, out).is_ok() {
                assert_eq!(out.len(), count as usize);
                assert!(out.windows(2).all(|w| w[0] < w[1]));
                assert!(out.last().is_none_or(|&p| p < range));
            }
        };
        for cut in 0..section.len() {
            check(&section[..cut], count, &mut out);
        }
        for _ in 0..3000 {
            let mut bad = section.clone();
            let at = rng.below(bad.len() as u64) as usize;
            bad[at] ^= 1 << rng.below(8);
            check(&bad, count, &mut out);
            check(
                &section,
                count.wrapping_add(rng.below(5) as u32).min(range),
                &mut out,
            );
            let len = rng.below(40) as usize;
            check(&rng.bytes(len), count, &mut out);
        }
        // Truncated, extended and recounted sections are refused.
        assert!(decode_positions(
            width,
            &section[..section.len() - 1],
            count,
            range,
            &held,
            &mut out
        )
        .is_err());
        let mut longer = section.clone();
        longer.push(0);
        assert!(decode_positions(width, &longer, count, range, &held, &mut out).is_err());
        assert!(decode_positions(width, &section, count + 1, range, &held, &mut out).is_err());
        assert!(decode_positions(width, &section, count, range, &held[1..], &mut out).is_err());
    }
    // Widths without a class: refused.
    let mut out = Vec::new();
    assert!(decode_positions(1, &[0; 8], 1, 4, &[0; 4], &mut out).is_err());
}

/// The example of docs/codecs.md ("ctxgaps"): BF16, range 8, old bits `3F80` ×4 (exponent
/// 127) then `3580` ×4 (exponent 107); elements 1, 5 and 6 change.
fn golden_example() -> (Vec<u8>, [u32; 3]) {
    let held: Vec<u8> = [
        0x3F80u16, 0x3F80, 0x3F80, 0x3F80, 0x3580, 0x3580, 0x3580, 0x3580,
    ]
    .iter()
    .flat_map(|b| b.to_le_bytes())
    .collect();
    (held, [1, 5, 6])
}

#[test]
fn golden_vectors() {
    let (held, rel) = golden_example();
    let (old, after) = old_and_after(2, &held, &rel);
    // The encoder's choice: one class (two would cost more than they save on 8 elements),
    // base 93 (the window's inner slots on exponent 107), Golomb parameter 2.
    let mut chosen = Vec::new();
    encode_positions(2, &rel, &after, &old, &mut chosen);
    // Two classes given: base 106, a step at slot 2 (class 0: exponents up to 107, class 1
    // from 108), parameters 1 and 2.
    let map = ClassMap::new(106, 1 << 2).unwrap();
    let mut given = Vec::new();
    with_scratch(|s| encode_with(2, &rel, &after, &old, &map, &[1, 2], s, &mut given));
    assert_eq!(
        [hex(&chosen), hex(&given)],
        [GOLDEN_CHOSEN, GOLDEN_TWO_CLASSES]
    );
    for section in [&chosen, &given] {
        let mut back = Vec::new();
        decode_positions(2, section, 3, 8, &held, &mut back).unwrap();
        assert_eq!(back, rel);
    }
}

const GOLDEN_CHOSEN: &str = "07 00 00 00 5c ff c1 18 00 00 00 03";
const GOLDEN_TWO_CLASSES: &str = "08 00 00 00 69 ff c5 52 00 00 00 00 01";

fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(" ")
}

/// The long case of scripts/ctx_reference.py: 20,000 BF16 elements of four sign-and-exponent
/// classes, ~30 % changed by ±1 to ±3 ULP, from the same 64-bit LCG.
fn long_case() -> (Vec<u8>, Vec<u32>, Vec<u8>) {
    let mut x = 1u64;
    let mut next = || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        x >> 33
    };
    let (mut held, mut rel, mut new) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..20_000u32 {
        let r = next();
        let bits = ((r & 1) << 15 | (120 + (r >> 1) % 2) << 7 | (r >> 2) & 0x7F) as u32;
        held.extend_from_slice(&(bits as u16).to_le_bytes());
        if next() % 10 < 3 {
            rel.push(i);
            let d = [1i32, -1, 2, -3][(next() % 4) as usize];
            let o = crate::dtype::to_ordered(bits, 2).wrapping_add(d as u32) & 0xFFFF;
            new.extend_from_slice(&(crate::dtype::from_ordered(o, 2) as u16).to_le_bytes());
        }
    }
    (held, rel, new)
}

#[test]
fn the_python_reference_writes_the_same_bytes() {
    // scripts/ctx_reference.py is written from docs/codecs.md alone: the spec, the reference
    // and this crate agree on every section, golden and long (where the models halve).
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../scripts/ctx_reference.py"
    );
    let run = std::process::Command::new("python3")
        .arg(script)
        .output()
        .expect("python3 runs (the README's setup installs it)");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let printed: std::collections::HashMap<String, String> = String::from_utf8_lossy(&run.stdout)
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();

    let mut ours = Vec::new();
    let (held, rel) = golden_example();
    let (old, after) = old_and_after(2, &held, &rel);
    let mut s = Vec::new();
    encode_positions(2, &rel, &after, &old, &mut s);
    ours.push(("ctxgaps_chosen", s));
    let mut s = Vec::new();
    let map = ClassMap::new(106, 1 << 2).unwrap();
    with_scratch(|sc| encode_with(2, &rel, &after, &old, &map, &[1, 2], sc, &mut s));
    ours.push(("ctxgaps_two_classes", s));

    let (held, rel, new) = long_case();
    let old: Vec<u8> = rel
        .iter()
        .flat_map(|&p| held[2 * p as usize..2 * p as usize + 2].to_vec())
        .collect();
    let mut after = held.clone();
    for (k, &p) in rel.iter().enumerate() {
        after[2 * p as usize..2 * p as usize + 2].copy_from_slice(&new[2 * k..2 * k + 2]);
    }
    let mut s = Vec::new();
    super::super::encode_positions(2, &rel, &after, &old, &mut s);
    ours.push(("long_positions", s));
    let mut s = Vec::new();
    super::super::encode_values(2, &old, &new, &mut s);
    ours.push(("long_values", s));
    let mut s = Vec::new();
    let map = ClassMap::new(119, 1 << 2).unwrap();
    with_scratch(|sc| encode_with(2, &rel, &after, &old, &map, &[3, 2], sc, &mut s));
    ours.push(("long_ctxgaps", s));
    for (name, bytes) in ours {
        assert_eq!(
            printed.get(name).map(String::as_str),
            Some(hex(&bytes).as_str()),
            "{name}: the reference and the crate differ"
        );
    }
}

/// Every build of the member passes this CPU runs (portable, BMI, AVX-512) turns a chunk's
/// changes into the same gaps, and the gaps back into the changes; a class with a change past
/// its last member is refused with nothing listed.
#[test]
fn every_build_of_the_member_passes_agrees() {
    use super::members::{class_gaps, place_changes, Build, ClassGaps};
    let mut rng = Rng(15);
    for width in [2usize, 4] {
        for range in [1u32, 63, 64, 65, 4095, 4096, 4097, 9000] {
            let held = held_range(&mut rng, width, range);
            for density in [0.0, 0.01, 0.3, 1.0] {
                let rel = exponent_driven(&mut rng, width, &held, density);
                let (old, after) = old_and_after(width, &held, &rel);
                let base = rng.below(256) as u8;
                let mut steps = (rng.next_u64() as u16) & 0xFFFE;
                while steps.count_ones() as usize >= MAX_CLASSES {
                    steps &= !(1 << (15 - steps.leading_zeros()));
                }
                let map = ClassMap::new(base, steps).unwrap();
                let mut expected: Option<Vec<Vec<u32>>> = None;
                for build in Build::every() {
                    let mut gaps = ClassGaps::default();
                    class_gaps(build, width, &rel, &after, &old, &map, &mut gaps);
                    let by_class = gaps.by_class;
                    assert_eq!(by_class.iter().map(Vec::len).sum::<usize>(), rel.len());
                    match &expected {
                        None => expected = Some(by_class.clone()),
                        Some(e) => {
                            assert_eq!(&by_class, e, "{build:?} width {width} range {range}")
                        }
                    }
                    // Gaps to each change's index among its class's members, class by class.
                    let mut targets = Vec::new();
                    let counts: Vec<u32> = by_class.iter().map(|l| l.len() as u32).collect();
                    for list in &by_class {
                        let mut from = 0;
                        for &g in list {
                            targets.push(from + g);
                            from += g + 1;
                        }
                    }
                    let mut out = vec![7];
                    place_changes(build, width, &held, &map, &targets, &counts, &mut out)
                        .unwrap_or_else(|e| panic!("{build:?}: {e}"));
                    assert_eq!(out, rel, "{build:?} width {width} range {range}");
                    // One change moved past its class's last member.
                    if let Some(last) = targets.last_mut() {
                        *last += range;
                        let r =
                            place_changes(build, width, &held, &map, &targets, &counts, &mut out);
                        assert!(r.is_err() && out.is_empty(), "{build:?}");
                    }
                }
            }
        }
    }
}
