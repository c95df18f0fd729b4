//! Golden vectors for wire format v1: fixed table and data, frames compared byte for byte with
//! the files in tests/golden/ (regenerate with DELTACAST_BLESS=1 only on a deliberate format
//! change), and decoded by the receiver to the expected weights.
//!
//! The delta frame (abs32+raw), annotated (see docs/wire-format.md):
//! ```text
//! 0000  44 43 53 54 01 00 01 01   "DCST", wire version 1, kind 1 (delta), flags FINAL
//! 0008  02 00 00 00 00 00 00 00   version 2
//! 0010  .. table hash (8 B) ..
//! 0018  00 00 00 00 02 00 00 00   flush 0, 2 manifest entries
//! 0020  .. frame_len (8 B) ..     digest_count 2 at 0x28, zeros to 0x40
//! 0040  entry 0: slot 0, abs32, raw, start 0, range 4, count 2, sections
//! 0080  entry 1: slot 1, abs32, raw, start 1, range 1, count 1, sections
//! 00c0  digest records (slot, 0, base, new) × 2
//! 00f0  sections: 00 00 00 00 03 00 00 00 | 81 3f 00 80 (pad) | 00 00 00 00 (pad) | c3 16 01 00 (pad)
//! ....  xxh3-64 checksum
//! ```

use std::path::PathBuf;

use deltacast::codec::{CodecChoice, PosCodec, ValCodec};
use deltacast::flush::FlushConfig;
use deltacast::wire::{parse_frame, split_frames, FrameKind};
use deltacast::{DType, Receiver, Sender, SlotInfo, SlotTable};

fn table() -> SlotTable {
    SlotTable::new(vec![
        SlotInfo::new("w", DType::BF16, vec![2, 3]),
        SlotInfo::new("b", DType::F32, vec![2]),
    ])
    .unwrap()
}

fn bf16s(v: &[u16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn f32s(v: &[u32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn states() -> (Vec<Vec<u8>>, Vec<Vec<u8>>) {
    // 1.0, -2.0, 0.5, +0, -0, NaN with payload; 1.5 and a subnormal.
    let base = vec![
        bf16s(&[0x3f80, 0xc000, 0x3f00, 0x0000, 0x8000, 0x7fc1]),
        f32s(&[0x3fc0_0000, 0x0001_16c2]),
    ];
    let next = vec![
        bf16s(&[0x3f81, 0xc000, 0x3f00, 0x8000, 0x8000, 0x7fc1]),
        f32s(&[0x3fc0_0000, 0x0001_16c3]),
    ];
    (base, next)
}

fn golden(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name)
}

fn check_or_bless(name: &str, bytes: &[u8]) {
    let path = golden(name);
    if std::env::var_os("DELTACAST_BLESS").is_some() {
        std::fs::write(&path, bytes).unwrap();
        return;
    }
    let expected = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{}: {e} (bless with DELTACAST_BLESS=1)", path.display()));
    assert_eq!(
        bytes,
        expected.as_slice(),
        "{name} changed: the encoder no longer produces wire format v1 as recorded"
    );
}

fn encode(codec: CodecChoice) -> (Vec<u8>, Vec<u8>) {
    let (base, next) = states();
    let cfg = FlushConfig {
        bucket_size: 1024,
        chunk_elems: 1 << 20,
        codec,
    };
    let mut sender = Sender::new(table(), cfg).unwrap();
    let mut seed = Vec::new();
    sender
        .sync(&[&base[0], &base[1]], |f| {
            seed.extend(f);
            Ok(())
        })
        .unwrap();
    let mut delta = Vec::new();
    sender
        .sync(&[&next[0], &next[1]], |f| {
            delta.extend(f);
            Ok(())
        })
        .unwrap();
    (seed, delta)
}

#[test]
fn encoder_reproduces_the_golden_frames() {
    let (seed, delta) = encode(CodecChoice::Fixed(PosCodec::Abs32, ValCodec::Raw));
    check_or_bless("seed_v1.dcast", &seed);
    check_or_bless("delta_v2_abs32_raw.dcast", &delta);
}

/// A larger delta in the entropy-coded codecs (gaps, bitmap, holes positions; ulp values),
/// fixed so that any change of their bit layout shows.
fn entropy_coded_delta() -> (Vec<Vec<u8>>, Vec<Vec<u8>>, Vec<u8>) {
    let table = SlotTable::new(vec![
        SlotInfo::new("m", DType::BF16, vec![64, 64]),
        SlotInfo::new("d", DType::F8E4M3, vec![300]),
    ])
    .unwrap();
    let mut x = 7u64;
    let mut next_u64 = move || {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        x >> 11
    };
    let base: Vec<Vec<u8>> = vec![
        (0..4096u32)
            .flat_map(|i| (0x3c00u16 + (i % 977) as u16).to_le_bytes())
            .collect(),
        (0..300).map(|i| i as u8).collect(),
    ];
    let mut next = base.clone();
    for i in 0..4096usize {
        // Sparse region (gaps), then a dense one; ±1 ULP mostly, some big jumps.
        let p = match i {
            0..1024 => 3,
            1024..3072 => 50,
            _ => 92,
        };
        if next_u64() % 100 < p {
            let v = u16::from_le_bytes([next[0][2 * i], next[0][2 * i + 1]]);
            let nv = match next_u64() % 8 {
                0 => v.wrapping_add(300),
                1..=4 => v + 1,
                _ => v - 1,
            };
            next[0][2 * i..2 * i + 2].copy_from_slice(&nv.to_le_bytes());
        }
    }
    for (i, b) in next[1].iter_mut().enumerate().take(300) {
        if i % 50 != 0 {
            *b = b.wrapping_add(1 + (next_u64() % 255) as u8);
        }
    }
    let cfg = FlushConfig {
        bucket_size: 1 << 20,
        chunk_elems: 1024,
        codec: CodecChoice::Auto,
    };
    let mut sender = Sender::with_base(table, cfg, base.clone(), 4).unwrap();
    let mut frames = Vec::new();
    sender
        .delta(&[&next[0], &next[1]], |f| {
            frames.extend(f);
            Ok(())
        })
        .unwrap();
    (base, next, frames)
}

#[test]
fn entropy_coded_golden_frame() {
    let (base, next, frames) = entropy_coded_delta();
    check_or_bless("delta_v5_auto.dcast", &frames);
    let recorded = std::fs::read(golden("delta_v5_auto.dcast")).unwrap();
    let parsed = parse_frame(&recorded).unwrap();
    let codecs: std::collections::BTreeSet<String> = parsed
        .entries
        .iter()
        .map(|e| format!("{}+{}", e.pos_codec.name(), e.val_codec.name()))
        .collect();
    for expected in ["gaps+ulp", "bitmap+ulp", "holes+ulp", "holes+raw"] {
        assert!(
            codecs.iter().any(|c| c == expected),
            "golden frame lacks {expected}: {codecs:?}"
        );
    }
    let table = SlotTable::new(vec![
        SlotInfo::new("m", DType::BF16, vec![64, 64]),
        SlotInfo::new("d", DType::F8E4M3, vec![300]),
    ])
    .unwrap();
    let mut r = Receiver::with_state(table, base, Some(4)).unwrap();
    for f in split_frames(&recorded).unwrap() {
        r.receive(f).unwrap();
    }
    assert_eq!(r.store(), &next);
}

#[test]
fn golden_frames_decode_to_the_expected_state() {
    let (base, next) = states();
    let seed = std::fs::read(golden("seed_v1.dcast")).unwrap();
    let delta = std::fs::read(golden("delta_v2_abs32_raw.dcast")).unwrap();

    // Independent byte-level reading of the delta header, per docs/wire-format.md.
    assert_eq!(
        &delta[0..8],
        &[0x44, 0x43, 0x53, 0x54, 0x01, 0x00, 0x01, 0x01]
    );
    assert_eq!(u64::from_le_bytes(delta[8..16].try_into().unwrap()), 2);
    assert_eq!(
        u64::from_le_bytes(delta[16..24].try_into().unwrap()),
        table().hash()
    );
    assert_eq!(u32::from_le_bytes(delta[28..32].try_into().unwrap()), 2);
    assert_eq!(
        u64::from_le_bytes(delta[32..40].try_into().unwrap()),
        delta.len() as u64
    );
    let entry0 = &delta[64..128];
    assert_eq!(&entry0[0..8], &[0, 0, 0, 0, 1, 0, 0, 0]); // slot 0, abs32, raw
    assert_eq!(u64::from_le_bytes(entry0[24..32].try_into().unwrap()), 2); // two changes
    let pos_at = u64::from_le_bytes(entry0[32..40].try_into().unwrap()) as usize;
    let val_at = u64::from_le_bytes(entry0[48..56].try_into().unwrap()) as usize;
    assert_eq!(&delta[pos_at..pos_at + 8], &[0, 0, 0, 0, 3, 0, 0, 0]);
    assert_eq!(&delta[val_at..val_at + 4], &[0x81, 0x3f, 0x00, 0x80]);

    let frames = split_frames(&seed).unwrap();
    assert_eq!(parse_frame(frames[0]).unwrap().header.kind, FrameKind::Seed);
    let mut r = Receiver::new(table());
    for f in frames {
        r.receive(f).unwrap();
    }
    assert_eq!(r.store(), &base);
    for f in split_frames(&delta).unwrap() {
        r.receive(f).unwrap();
    }
    assert_eq!(r.store(), &next);
    assert_eq!(r.version(), Some(2));
}
