//! `steps` + `esc` against a naive reference written from docs/codecs.md ("steps + esc"),
//! not from the encoder: round trips for every dtype `ulp` carries, the golden vector of the
//! docs, hostile sections (typed errors, never a panic) and the chooser.

use crate::codec::{
    check_pair, decode_positions, decode_steps_values, decode_values, encode_chunk,
    encode_chunk_with_state_into, encode_seed_chunk, encode_steps, encode_values, steps_counts,
    CodecChoice, EncodedChunk, PosCodec, ValCodec,
};
use crate::dtype::{from_ordered, to_ordered, DType};
use crate::error::CodecError;
use crate::testutil::{bernoulli_positions, Rng};

/// The five dtypes `steps` carries and patterns that matter for each: ±0, the smallest
/// subnormals, ±inf (where the format has them), NaN payloads, the largest finite values and
/// the ends of the ordered view (where a step wraps).
fn specials(dtype: DType) -> Vec<u32> {
    match dtype {
        DType::BF16 => vec![
            0x0000, 0x8000, 0x0001, 0x8001, 0x7f80, 0xff80, 0x7fc1, 0xffc1, 0x7f7f, 0x7fff, 0xffff,
        ],
        DType::F16 => vec![
            0x0000, 0x8000, 0x0001, 0x8001, 0x7c00, 0xfc00, 0x7c01, 0xfe01, 0x7bff, 0x7fff, 0xffff,
        ],
        DType::F32 => vec![
            0,
            0x8000_0000,
            1,
            0x8000_0001,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_1234,
            0xffc0_0001,
            0x7f7f_ffff,
            0x7fff_ffff,
            0xffff_ffff,
        ],
        // E4M3: no infinities, 0x7f / 0xff are NaN.
        DType::F8E4M3 => vec![0x00, 0x80, 0x01, 0x81, 0x7e, 0xfe, 0x7f, 0xff],
        _ => vec![
            0x00, 0x80, 0x01, 0x81, 0x7c, 0xfc, 0x7d, 0xfe, 0x7b, 0x7f, 0xff,
        ],
    }
}

const DTYPES: [DType; 5] = [
    DType::BF16,
    DType::F16,
    DType::F32,
    DType::F8E4M3,
    DType::F8E5M2,
];

fn bytes_of(width: usize, bits: &[u32]) -> Vec<u8> {
    bits.iter()
        .flat_map(|b| b.to_le_bytes()[..width].to_vec())
        .collect()
}

/// The reference: `before` and `after` are the bits of every element of the range. Returns
/// the changed positions, their old and new bits, the map and the escapes, each byte placed
/// as the docs say, with 64-bit arithmetic for the step.
#[allow(clippy::type_complexity)]
fn reference(
    width: usize,
    before: &[u32],
    after: &[u32],
) -> (Vec<u32>, Vec<u8>, Vec<u8>, Vec<u8>, Vec<u8>) {
    let nb = 8 * width as u32;
    let modulus = 1u64 << nb;
    let mut map = vec![0u8; before.len().div_ceil(4)];
    let (mut rel, mut old, mut new, mut esc) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for (i, (&a, &b)) in before.iter().zip(after).enumerate() {
        if a == b {
            continue;
        }
        let d = (to_ordered(b, width) as u64 + modulus - to_ordered(a, width) as u64) % modulus;
        let code: u8 = if d == 1 {
            1
        } else if d == modulus - 1 {
            2
        } else {
            esc.extend_from_slice(&b.to_le_bytes()[..width]);
            3
        };
        map[i / 4] |= code << (2 * (i % 4));
        rel.push(i as u32);
        old.extend_from_slice(&a.to_le_bytes()[..width]);
        new.extend_from_slice(&b.to_le_bytes()[..width]);
    }
    (rel, old, new, map, esc)
}

/// Old bits of a whole range: random patterns with the dtype's specials sprinkled in.
fn held(rng: &mut Rng, dtype: DType, range: u32) -> Vec<u32> {
    let width = dtype.width();
    let mask = if width == 4 {
        u32::MAX
    } else {
        (1 << (8 * width)) - 1
    };
    let sp = specials(dtype);
    (0..range)
        .map(|_| {
            if rng.below(4) == 0 {
                sp[rng.below(sp.len() as u64) as usize]
            } else {
                rng.next_u64() as u32 & mask
            }
        })
        .collect()
}

/// New bits of one changed element: mostly ±1 in the ordered view (wrapping at its ends),
/// else other steps, specials or anything; never the old bits.
fn moved(rng: &mut Rng, dtype: DType, a: u32) -> u32 {
    let width = dtype.width();
    let mask = if width == 4 {
        u32::MAX
    } else {
        (1 << (8 * width)) - 1
    };
    let step = |d: u32| from_ordered(to_ordered(a, width).wrapping_add(d) & mask, width);
    let b = match rng.below(16) {
        0..=5 => step(1),
        6..=10 => step(mask), // −1
        11 => step(2 + rng.below(1000) as u32),
        12 => step((2 + rng.below(1000) as u32).wrapping_neg()),
        13 => specials(dtype)[rng.below(specials(dtype).len() as u64) as usize],
        _ => rng.next_u64() as u32 & mask,
    };
    if b == a {
        step(1)
    } else {
        b
    }
}

/// Encodes the change from `before` to `after` every way the crate can and decodes it back,
/// each result against the reference.
fn check(dtype: DType, before: &[u32], after: &[u32]) {
    let width = dtype.width();
    let range = before.len() as u32;
    let (rel, old, new, map, esc) = reference(width, before, after);
    let what = format!("{dtype} range {range} count {}", rel.len());
    let (mut m, mut e) = (vec![9u8], vec![9u8]);
    encode_steps(width, &rel, range, &old, &new, &mut m, &mut e);
    assert_eq!((&m, &e), (&map, &esc), "{what}");
    let chunk = encode_chunk(
        CodecChoice::Fixed(PosCodec::Steps, ValCodec::Escaped),
        width,
        &rel,
        range,
        &old,
        &new,
    );
    assert_eq!(chunk.pos_codec, Some(PosCodec::Steps), "{what}");
    assert_eq!(chunk.val_codec, Some(ValCodec::Escaped), "{what}");
    assert_eq!((&chunk.positions, &chunk.values), (&map, &esc), "{what}");
    let mut alone = Vec::new();
    encode_values(ValCodec::Escaped, width, &old, &new, &mut alone);
    assert_eq!(alone, esc, "{what}");
    let escapes = (esc.len() / width) as u64;
    assert_eq!(
        steps_counts(&map, range),
        Ok((rel.len() as u64, escapes)),
        "{what}"
    );
    let mut pos = vec![7u32];
    decode_positions(PosCodec::Steps, &map, rel.len() as u32, range, &mut pos).unwrap();
    assert_eq!(pos, rel, "{what}");
    let mut val = vec![7u8];
    decode_steps_values(width, &map, range, &esc, &old, &mut val).unwrap();
    assert_eq!(val, new, "{what}");
    assert!(matches!(
        decode_values(ValCodec::Escaped, width, &esc, &old, &mut val),
        Err(CodecError::Unsupported { .. })
    ));
}

#[test]
fn random_chunks_of_every_dtype_match_the_reference() {
    let mut rng = Rng(24);
    let ranges = [
        1u32, 2, 3, 4, 5, 6, 7, 8, 9, 31, 32, 33, 63, 64, 65, 255, 257, 1000, 4099,
    ];
    for dtype in DTYPES {
        for &range in ranges.iter().chain(&[(1 << 16) + 3]) {
            for density in [0.0, 0.01, 0.1, 0.3, 0.5, 0.9, 1.0] {
                let before = held(&mut rng, dtype, range);
                let mut after = before.clone();
                for p in bernoulli_positions(&mut rng, range, density) {
                    after[p as usize] = moved(&mut rng, dtype, before[p as usize]);
                }
                check(dtype, &before, &after);
            }
        }
    }
}

#[test]
fn the_ends_of_the_ordered_view_are_one_step_apart() {
    for dtype in DTYPES {
        let width = dtype.width();
        let top = if width == 4 {
            u32::MAX
        } else {
            (1 << (8 * width)) - 1
        };
        // The largest ordered value (+NaN, all ones) steps up to the smallest (−NaN, all
        // ones), and back down; +0 steps down to −0.
        let (max, min) = (from_ordered(top, width), from_ordered(0, width));
        let plus0 = 0;
        let minus0 = 1 << (8 * width - 1);
        let before = [max, min, plus0, minus0, max];
        let after = [min, max, minus0, plus0, max];
        let (rel, old, new, map, esc) = reference(width, &before, &after);
        assert_eq!(rel, [0, 1, 2, 3]);
        assert_eq!(map, [0b0110_1001, 0], "{dtype}");
        assert!(esc.is_empty());
        check(dtype, &before, &after);
        let (mut m, mut e) = (Vec::new(), Vec::new());
        encode_steps(width, &rel, 5, &old, &new, &mut m, &mut e);
        assert_eq!(m, map);
    }
}

/// The golden vector of docs/codecs.md ("steps + esc"): BF16, a range of 10.
#[test]
fn golden_vector() {
    let before = [
        0x3F80, 0x3F80, 0xBF80, 0x3F80, 0x0000, 0x7F80, 0x3580, 0x3580, 0x7FFF, 0x0001,
    ];
    let after = [
        0x3F80, 0x3F81, 0xBF81, 0x3F80, 0x8000, 0x7FC0, 0x3583, 0x3580, 0xFFFF, 0x0000,
    ];
    let (rel, old, new, ..) = reference(2, &before, &after);
    assert_eq!(rel, [1, 2, 4, 5, 6, 8, 9]);
    let chunk = encode_chunk(
        CodecChoice::Fixed(PosCodec::Steps, ValCodec::Escaped),
        2,
        &rel,
        10,
        &old,
        &new,
    );
    println!(
        "golden map {:02x?} values {:02x?}",
        chunk.positions, chunk.values
    );
    assert_eq!(chunk.positions, GOLDEN_MAP);
    assert_eq!(chunk.values, GOLDEN_VALUES);
    let mut pos = Vec::new();
    decode_positions(PosCodec::Steps, GOLDEN_MAP, 7, 10, &mut pos).unwrap();
    assert_eq!(pos, rel);
    let mut val = Vec::new();
    decode_steps_values(2, GOLDEN_MAP, 10, GOLDEN_VALUES, &old, &mut val).unwrap();
    assert_eq!(val, new);
    check(DType::BF16, &before, &after);
}

const GOLDEN_MAP: &[u8] = &[0x24, 0x3e, 0x09];
const GOLDEN_VALUES: &[u8] = &[0xc0, 0x7f, 0x83, 0x35];

#[test]
fn hostile_sections_are_typed_errors() {
    let old = bytes_of(2, &[0x3F80, 0xBF80, 0x0000, 0x7F80, 0x3580, 0x7FFF, 0x0001]);
    let ok = |map: &[u8], esc: &[u8], old: &[u8]| {
        let mut out = Vec::new();
        decode_steps_values(2, map, 10, esc, old, &mut out)
    };
    assert!(ok(GOLDEN_MAP, GOLDEN_VALUES, &old).is_ok());
    let mut pos = Vec::new();
    // The map must be exactly ceil(range / 4) bytes.
    for map in [&GOLDEN_MAP[..2], &[0x24, 0x3e, 0x09, 0x00][..], &[][..]] {
        assert!(matches!(
            ok(map, GOLDEN_VALUES, &old),
            Err(CodecError::Truncated { .. } | CodecError::TrailingBytes { .. })
        ));
        assert!(decode_positions(PosCodec::Steps, map, 7, 10, &mut pos).is_err());
        assert!(steps_counts(map, 10).is_err());
    }
    // Any code bit past the range (elements 10 and 11 of the last byte).
    for bit in 4..8 {
        let map = [0x24, 0x3e, 0x09 | 1 << bit];
        let err = steps_counts(&map, 10).unwrap_err();
        assert_eq!(
            err,
            CodecError::PositionOutOfRange {
                position: 8 + bit as u64 / 2,
                range: 10
            }
        );
        assert!(ok(&map, GOLDEN_VALUES, &old).is_err());
        assert!(decode_positions(PosCodec::Steps, &map, 7, 10, &mut pos).is_err());
        assert!(decode_positions(PosCodec::Steps, &map, 8, 10, &mut pos).is_err());
    }
    // A count other than the map's.
    for count in [0, 6, 8, 10] {
        let err = decode_positions(PosCodec::Steps, GOLDEN_MAP, count, 10, &mut pos).unwrap_err();
        assert!(matches!(err, CodecError::Malformed { codec: "steps", .. }));
    }
    assert!(ok(GOLDEN_MAP, GOLDEN_VALUES, &old[..12]).is_err());
    assert!(ok(
        GOLDEN_MAP,
        GOLDEN_VALUES,
        &[old.clone(), vec![0, 0]].concat()
    )
    .is_err());
    // Escapes: one too few, one too many, half of one.
    for esc in [
        &GOLDEN_VALUES[..2],
        &[GOLDEN_VALUES, &[1, 2]].concat()[..],
        &GOLDEN_VALUES[..3],
        &[][..],
    ] {
        assert!(matches!(
            ok(GOLDEN_MAP, esc, &old),
            Err(CodecError::Truncated { .. } | CodecError::TrailingBytes { .. })
        ));
    }
    // Widths it does not carry.
    let mut out = Vec::new();
    assert!(matches!(
        decode_steps_values(3, GOLDEN_MAP, 10, &[], &old, &mut out),
        Err(CodecError::Unsupported { .. })
    ));
    // Random sections: an error or exactly what the map says, never a panic.
    let mut rng = Rng(5);
    for _ in 0..3000 {
        let range = 1 + rng.below(200) as u32;
        let width = [1usize, 2, 4][rng.below(3) as usize];
        let len = steps_len(&mut rng, range);
        let map = rng.bytes(len);
        let count = rng.below(range as u64 + 2) as u32;
        let esc_len = rng.below(40) as usize;
        let esc = rng.bytes(esc_len);
        let old = rng.bytes(count as usize * width);
        let mut vals = Vec::new();
        if decode_steps_values(width, &map, range, &esc, &old, &mut vals).is_ok() {
            assert_eq!(vals.len(), old.len());
            assert!(decode_positions(PosCodec::Steps, &map, count, range, &mut pos).is_ok());
        }
    }
}

/// A map length for a random section: mostly right, so the content checks are reached.
fn steps_len(rng: &mut Rng, range: u32) -> usize {
    let right = (range as usize).div_ceil(4);
    match rng.below(8) {
        0 => right + 1,
        1 => right.saturating_sub(1),
        _ => right,
    }
}

#[test]
fn pairs_and_fallbacks() {
    use PosCodec::*;
    use ValCodec::*;
    for pos in PosCodec::ALL {
        for val in ValCodec::ALL {
            let ok = (pos == Steps) == (val == Escaped);
            assert_eq!(check_pair(pos, val, None).is_ok(), ok, "{pos:?} {val:?}");
            for dtype in DType::ALL {
                let ok = ok && (pos != Steps || dtype.ulp_codable());
                assert_eq!(check_pair(pos, val, Some(dtype)).is_ok(), ok, "{dtype}");
            }
        }
    }
    let pair = CodecChoice::Fixed(Steps, Escaped);
    assert_eq!(CodecChoice::parse("steps+esc"), Some(pair));
    assert_eq!(pair.name(), "steps+esc");
    assert_eq!(pair.for_dtype(DType::BF16), pair);
    assert_eq!(pair.for_dtype(DType::U16), CodecChoice::Fixed(Bitmap, Raw));
    let rel = [1u32, 5];
    let (old, new) = (
        bytes_of(2, &[0x3F80, 0x3F80]),
        bytes_of(2, &[0x3F81, 0x3F7F]),
    );
    // A fixed choice that pairs one of them with another codec: bitmap positions for
    // `steps`, ulp values for `esc`; never a pair a receiver refuses.
    for (choice, want) in [
        ((Steps, Raw), (Bitmap, Raw)),
        ((Steps, Ulp), (Bitmap, Ulp)),
        ((Gaps, Escaped), (Gaps, Ulp)),
        ((Abs32, Escaped), (Abs32, Ulp)),
        ((All, Escaped), (Abs32, Ulp)),
    ] {
        let c = encode_chunk(
            CodecChoice::Fixed(choice.0, choice.1),
            2,
            &rel,
            8,
            &old,
            &new,
        );
        assert_eq!((c.pos_codec, c.val_codec), (Some(want.0), Some(want.1)));
    }
    // Seeds never: raw values.
    let seed = encode_seed_chunk(&rel, 8, &new);
    assert_eq!(seed.val_codec, Some(Raw));
}

/// `count` changes of ±1 at iid positions of a BF16 range, a share `down` of them −1 and a
/// share `escape` of them a jump of hundreds of ULPs.
fn dense_chunk(rng: &mut Rng, range: u32, density: f64, down: f64, escape: f64) -> Chunk {
    let rel = bernoulli_positions(rng, range, density);
    let (mut old, mut new) = (Vec::new(), Vec::new());
    for _ in &rel {
        let a = 0x3c00 + rng.below(0x800) as u32;
        let d: u32 = if rng.chance(escape) {
            300 + rng.below(300) as u32
        } else if rng.chance(down) {
            0xffff
        } else {
            1
        };
        let b = from_ordered(to_ordered(a, 2).wrapping_add(d) & 0xffff, 2);
        old.extend_from_slice(&(a as u16).to_le_bytes());
        new.extend_from_slice(&(b as u16).to_le_bytes());
    }
    Chunk { rel, old, new }
}

struct Chunk {
    rel: Vec<u32>,
    old: Vec<u8>,
    new: Vec<u8>,
}

fn auto(c: &Chunk, range: u32, choice: CodecChoice) -> EncodedChunk {
    let mut out = EncodedChunk::default();
    encode_chunk_with_state_into(choice, 2, &c.rel, range, &c.old, &c.new, None, &mut out);
    out
}

#[test]
fn the_chooser_takes_steps_only_when_strictly_smaller() {
    let mut rng = Rng(50);
    let range = 1 << 16;
    let map = range as usize / 4;
    // Half the range changed by one ULP down, and a few escapes: the ulp code spends 2 bits
    // on −1 (1 on +1) and the bitmap 1 per element, so 2 bits per element and the ulp
    // directories, against the map's 2 bits flat. Then 60 %, nine in ten steps down.
    for (c, choice) in [
        (
            dense_chunk(&mut rng, range, 0.5, 1.0, 0.01),
            CodecChoice::Auto,
        ),
        (
            dense_chunk(&mut rng, range, 0.6, 0.9, 0.01),
            CodecChoice::Auto,
        ),
    ] {
        let e = auto(&c, range, choice);
        assert_eq!(e.pos_codec, Some(PosCodec::Steps), "{choice:?}");
        assert_eq!(e.val_codec, Some(ValCodec::Escaped));
        let escapes = e.values.len() / 2;
        assert_eq!(e.positions.len() + e.values.len(), map + 2 * escapes);
        // Strictly smaller than what the other codecs give.
        let mut plain = EncodedChunk::default();
        encode_chunk_with_state_into(
            CodecChoice::Fixed(PosCodec::Bitmap, ValCodec::Ulp),
            2,
            &c.rel,
            range,
            &c.old,
            &c.new,
            None,
            &mut plain,
        );
        assert!(e.positions.len() + e.values.len() < plain.positions.len() + plain.values.len());
        let mut val = Vec::new();
        decode_steps_values(2, &e.positions, range, &e.values, &c.old, &mut val).unwrap();
        assert_eq!(val, c.new);
    }
    // `auto+ctx` considers it too, after the context codecs: they learn a constant sign (so
    // they win on the chunks above), but carry no 1-byte elements.
    let rel = bernoulli_positions(&mut rng, range, 0.5);
    let old: Vec<u8> = rel.iter().map(|_| 0x30 + rng.below(0x40) as u8).collect();
    let new: Vec<u8> = old.iter().map(|&a| a - 1).collect();
    let mut e = EncodedChunk::default();
    let choice = CodecChoice::AutoContext;
    encode_chunk_with_state_into(choice, 1, &rel, range, &old, &new, None, &mut e);
    assert_eq!(e.pos_codec, Some(PosCodec::Steps));
    assert_eq!((e.positions.len(), e.values.len()), (map, 0));
    // Never with raw values.
    let c = dense_chunk(&mut rng, range, 0.5, 1.0, 0.01);
    let e = auto(&c, range, CodecChoice::AutoRaw);
    assert_eq!(e.val_codec, Some(ValCodec::Raw));
    // Balanced ±1 at half the range: bitmap + ulp spend 1 + 1.5 / 2 = 1.75 bits per element,
    // under the map's 2: not taken (the pair is for kernels that stream it, not for size).
    let c = dense_chunk(&mut rng, range, 0.5, 0.5, 0.01);
    let e = auto(&c, range, CodecChoice::Auto);
    assert_eq!(
        (e.pos_codec, e.val_codec),
        (Some(PosCodec::Bitmap), Some(ValCodec::Ulp))
    );
    // Sparse: the map alone is larger than what was chosen.
    for down in [0.0, 0.5, 1.0] {
        let c = dense_chunk(&mut rng, range, 0.01, down, 0.0);
        let e = auto(&c, range, CodecChoice::Auto);
        assert_ne!(e.pos_codec, Some(PosCodec::Steps));
        assert!(e.positions.len() + e.values.len() < map);
    }
}
