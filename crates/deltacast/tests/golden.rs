//! Golden vectors for wire format v2: fixed tables and data, frames made by the library's
//! writers and compared byte for byte with the files in tests/golden/, then decoded by the
//! receiver to the expected weights. Regenerate them only on a deliberate format change:
//! `DELTACAST_BLESS=1 cargo test -p deltacast --test golden` (then the fuzz seeds:
//! `cargo run --manifest-path fuzz/Cargo.toml --example seeds`), and update
//! docs/wire-format.md.
//!
//! The delta frame (abs32+raw), annotated (see docs/wire-format.md):
//! ```text
//! 0000  44 43 53 54 02 00 01 01   "DCST", wire version 2, kind 1 (delta), flags FINAL
//! 0008  02 00 00 00 00 00 00 00   version 2
//! 0010  .. table hash (8 B) ..
//! 0018  00 00 00 00 02 00 00 00   flush 0, 2 manifest entries
//! 0020  .. frame_len (8 B) ..
//! 0028  02 00 00 00 00 00 00 00   2 digest records, flush_count 0 (a streaming writer)
//! 0030  00 .. 00 (16 B)           values_start 0 (sections interleaved), reserved
//! 0040  entry 0: slot 0, abs32, raw, start 0, range 4, count 2, sections
//! 0080  entry 1: slot 1, abs32, raw, start 1, range 1, count 1, sections
//! 00c0  digest records (slot, 0, base, new) × 2
//! 00f0  sections: 00 00 00 00 03 00 00 00 | 81 3f 00 80 (pad) | 00 00 00 00 (pad) | c3 16 01 00 (pad)
//! ....  xxh3-64 checksum
//! ```

mod staged;

use std::path::PathBuf;

use deltacast::codec::{CodecChoice, PosCodec, ValCodec};
use deltacast::flush::FlushConfig;
use deltacast::wire::{close_frame, parse_frame, split_frames, FrameKind};
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
        "{name} changed: the encoder no longer produces wire format v2 as recorded"
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
        &[0x44, 0x43, 0x53, 0x54, 0x02, 0x00, 0x01, 0x01]
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
    assert_eq!(u32::from_le_bytes(delta[40..44].try_into().unwrap()), 2);
    // flush_count 0 (not known to a streaming writer), values_start 0, reserved 0.
    assert_eq!(&delta[44..64], &[0; 20]);
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

/// A sync as the GPU sends it: stage 0 sends slot `w` dense (two `all`+`raw` chunks, an
/// unchanged element resent), stage 1 slot `b` as a delta; each frame carries its own slot's
/// digest record, `flush_count` 2 and sections split at `values_start`.
fn staged_golden() -> Vec<Vec<u8>> {
    let (base, next) = states();
    staged::staged_sync(
        &table(),
        2,
        &base,
        &next,
        &[(0..1, staged::Stage::Dense), (1..2, staged::Stage::Delta)],
        4,
        CodecChoice::Fixed(PosCodec::Abs32, ValCodec::Raw),
    )
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().unwrap())
}

#[test]
fn staged_dense_and_close_golden_frames() {
    let frames = staged_golden();
    check_or_bless("dense_v2_staged.dcast", &frames.concat());
    let close = close_frame(2, table().hash());
    check_or_bless("close_v2.dcast", &close);

    let recorded = std::fs::read(golden("dense_v2_staged.dcast")).unwrap();
    let frames = split_frames(&recorded).unwrap();
    assert_eq!(frames.len(), 2);
    // Independent byte-level reading of the dense frame, per docs/wire-format.md.
    let dense = frames[0];
    assert_eq!(
        &dense[0..8],
        &[0x44, 0x43, 0x53, 0x54, 0x02, 0x00, 0x03, 0x00]
    );
    assert_eq!(u64_at(dense, 8), 2);
    assert_eq!(u64_at(dense, 16), table().hash());
    assert_eq!((u32_at(dense, 24), u32_at(dense, 28)), (0, 2)); // flush 0, 2 entries
    assert_eq!(u64_at(dense, 32), dense.len() as u64);
    assert_eq!((u32_at(dense, 40), u32_at(dense, 44)), (1, 2)); // 1 digest, 2 flushes
    let sections_start = 64 + 2 * 64 + 24;
    // No position bytes in a dense frame: the values begin where the sections do.
    assert_eq!(u64_at(dense, 48), sections_start as u64);
    assert_eq!(&dense[56..64], &[0; 8]);
    let (base, next) = states();
    for (e, (start, range)) in [(0u64, 4u64), (4, 2)].into_iter().enumerate() {
        let entry = &dense[64 + 64 * e..128 + 64 * e];
        assert_eq!(&entry[0..8], &[0, 0, 0, 0, 0, 0, 0, 0]); // slot 0, all, raw
        assert_eq!(
            (u64_at(entry, 8), u64_at(entry, 16), u64_at(entry, 24)),
            (start, range, range)
        );
        assert_eq!(u64_at(entry, 40), 0);
        let (at, len) = (u64_at(entry, 48) as usize, u64_at(entry, 56) as usize);
        assert_eq!(len, range as usize * 2);
        assert_eq!(&dense[at..at + len], &next[0][start as usize * 2..][..len]);
    }
    let digest = &dense[192..216];
    assert_eq!(u32_at(digest, 0), 0);
    assert_eq!(
        u64_at(digest, 8),
        deltacast::digest::digest_slot(0, 2, &base[0])
    );
    assert_eq!(
        u64_at(digest, 16),
        deltacast::digest::digest_slot(0, 2, &next[0])
    );
    // The delta frame: FINAL, flush 1 of 2, its positions before values_start.
    let delta = frames[1];
    assert_eq!(&delta[4..8], &[0x02, 0x00, 0x01, 0x01]);
    assert_eq!((u32_at(delta, 24), u32_at(delta, 44)), (1, 2));
    let values_start = u64_at(delta, 48);
    let entry = &delta[64..128];
    assert_eq!(&entry[0..8], &[1, 0, 0, 0, 1, 0, 0, 0]); // slot 1, abs32, raw
    assert_eq!(u64_at(entry, 32), 64 + 64 + 24);
    assert!(u64_at(entry, 32) + u64_at(entry, 40) <= values_start);
    assert_eq!(u64_at(entry, 48), values_start);
    let at = values_start as usize;
    assert_eq!(&delta[at..at + 4], &[0xc3, 0x16, 0x01, 0x00]);

    // Applied on a receiver that holds the golden seed: the expected state, reported dense
    // only if every frame is.
    let mut r = Receiver::new(table());
    for f in split_frames(&std::fs::read(golden("seed_v1.dcast")).unwrap()).unwrap() {
        r.receive(f).unwrap();
    }
    assert!(r.receive(frames[0]).unwrap().is_none());
    let outcome = r.receive(frames[1]).unwrap().expect("a complete sync");
    assert_eq!(
        (outcome.kind, outcome.version, outcome.flushes),
        (FrameKind::Delta, 2, 2)
    );
    assert_eq!(r.store(), &next);

    // The close frame: a header and a checksum, nothing else; the receiver reports it and
    // changes nothing.
    let close = std::fs::read(golden("close_v2.dcast")).unwrap();
    assert_eq!(close.len(), 72);
    assert_eq!(
        &close[0..8],
        &[0x44, 0x43, 0x53, 0x54, 0x02, 0x00, 0x04, 0x01]
    );
    assert_eq!(u64_at(&close, 8), 2);
    assert_eq!(u64_at(&close, 16), table().hash());
    assert_eq!(u64_at(&close, 32), 72);
    assert_eq!(&close[24..32], &[0; 8]);
    assert_eq!(&close[40..64], &[0; 24]);
    let outcome = r.receive(&close).unwrap().expect("an outcome");
    assert_eq!(
        (outcome.kind, outcome.version, outcome.changed),
        (FrameKind::Close, 2, 0)
    );
    assert_eq!(r.store(), &next);
    assert_eq!(r.version(), Some(2));
}
