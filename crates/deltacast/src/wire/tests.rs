use super::*;
use crate::dtype::DType;
use crate::slot::SlotInfo;

fn sample_with(writer: FrameWriter) -> Vec<u8> {
    let mut w = writer;
    w.push_chunk(
        3,
        PosCodec::Abs32,
        ValCodec::Raw,
        1 << 20,
        1000,
        2,
        &[1, 0, 0, 0, 9, 0, 0, 0],
        &[0x80, 0x3f, 0x00, 0x40],
    );
    w.push_chunk(4, PosCodec::All, ValCodec::Raw, 0, 3, 3, &[], &[1, 2, 3]);
    w.push_digest(SlotDigest {
        slot: 3,
        base: 11,
        new: 12,
    });
    w.finish(true)
}

fn sample() -> Vec<u8> {
    sample_with(FrameWriter::new(FrameKind::Delta, 7, 0xabcd, 2))
}

#[test]
fn round_trip_in_both_layouts() {
    for (split, bytes) in [
        (false, sample()),
        (
            true,
            sample_with(
                FrameWriter::new(FrameKind::Delta, 7, 0xabcd, 2)
                    .with_flush_count(3)
                    .split_sections(4, 2),
            ),
        ),
    ] {
        let f = parse_frame(&bytes).unwrap();
        assert_eq!(f.header.kind, FrameKind::Delta);
        assert!(f.header.is_final);
        assert_eq!(
            (f.header.version, f.header.table_hash, f.header.flush_index),
            (7, 0xabcd, 2)
        );
        assert_eq!(f.header.frame_len, bytes.len() as u64);
        assert_eq!(f.entries.len(), 2);
        let e = f.entries[0];
        assert_eq!((e.slot, e.start, e.range, e.count), (3, 1 << 20, 1000, 2));
        assert_eq!(f.positions(&e), &[1, 0, 0, 0, 9, 0, 0, 0]);
        assert_eq!(f.values(&e), &[0x80, 0x3f, 0x00, 0x40]);
        assert_eq!(f.values(&f.entries[1]), &[1, 2, 3]);
        assert!(f.positions(&f.entries[1]).is_empty());
        assert_eq!(
            f.digests,
            vec![SlotDigest {
                slot: 3,
                base: 11,
                new: 12
            }]
        );
        let start = f.header.sections_start();
        if split {
            assert_eq!(f.header.flush_count, 3);
            let vs = f.header.values_start;
            // Positions packed first (8 + 0 bytes), then values from values_start.
            assert_eq!(vs, start + 8);
            for e in &f.entries {
                assert!(e.pos_offset >= start && e.pos_end() <= vs);
                assert!(e.val_offset >= vs && e.val_offset % 2 == 0);
            }
            // 2-aligned, not 8-aligned: the second value section follows the first's 4 bytes.
            assert_eq!(f.entries[1].val_offset, vs + 4);
        } else {
            assert_eq!((f.header.flush_count, f.header.values_start), (0, 0));
            for e in &f.entries {
                assert!(e.pos_offset % 8 == 0 && e.val_offset % 8 == 0);
            }
        }
    }
}

#[test]
fn every_flipped_bit_and_truncation_is_an_error() {
    let bytes = sample();
    for i in 0..bytes.len() * 8 {
        let mut b = bytes.clone();
        b[i / 8] ^= 1 << (i % 8);
        assert!(parse_frame(&b).is_err(), "flip of bit {i} accepted");
    }
    for n in 0..bytes.len() {
        assert!(parse_frame(&bytes[..n]).is_err());
    }
}

/// Re-checksums a tampered frame so the structural checks behind the checksum are reached.
fn reseal(mut b: Vec<u8>) -> Vec<u8> {
    let end = b.len() - CHECKSUM_LEN;
    let sum = checksum(&b[..end]);
    b[end..].copy_from_slice(&sum.to_le_bytes());
    b
}

fn malformed(bytes: Vec<u8>, needle: &str) {
    match parse_frame(&reseal(bytes)) {
        Err(Error::Malformed(m)) => assert!(m.contains(needle), "{m:?} lacks {needle:?}"),
        other => panic!("expected a malformed frame ({needle}), got {other:?}"),
    }
}

#[test]
fn structural_lies_behind_a_valid_checksum_are_errors() {
    let bytes = sample();
    // Huge entry count: must not allocate, must report truncation.
    let mut b = bytes.clone();
    b[28..32].copy_from_slice(&u32::MAX.to_le_bytes());
    assert!(matches!(
        parse_frame(&reseal(b)),
        Err(Error::Truncated { .. })
    ));
    // Section offset pointing past the end.
    let mut b = bytes.clone();
    b[HEADER_LEN + 48..HEADER_LEN + 56].copy_from_slice(&u64::MAX.to_le_bytes());
    malformed(b, "overflows");
    let mut b = bytes.clone();
    b[HEADER_LEN + 48..HEADER_LEN + 56].copy_from_slice(&(bytes.len() as u64 - 9).to_le_bytes());
    malformed(b, "lies outside");
    // Count above range.
    let mut b = bytes.clone();
    b[HEADER_LEN + 24..HEADER_LEN + 32].copy_from_slice(&5000u64.to_le_bytes());
    malformed(b, "exceeds range");
    // Version 1 of the format is refused by name.
    let mut b = bytes.clone();
    b[4] = 1;
    let err = parse_frame(&b).unwrap_err();
    assert!(matches!(
        err,
        Error::UnsupportedWireVersion {
            found: 1,
            supported: 2
        }
    ));
    assert!(err.to_string().contains("version 1"), "{err}");
    // Unknown codec.
    let mut b = bytes.clone();
    b[HEADER_LEN + 4] = 9;
    malformed(b, "position codec");
    // Reserved bytes of the header, of an entry, of a digest record; unknown flags and kinds.
    for (at, needle) in [
        (56, "reserved header"),
        (63, "reserved header"),
        (HEADER_LEN + 6, "reserved bytes"),
        (HEADER_LEN + 2 * ENTRY_LEN + 5, "reserved bytes"),
    ] {
        let mut b = bytes.clone();
        b[at] = 1;
        malformed(b, needle);
    }
    let mut b = bytes.clone();
    b[7] |= 4;
    malformed(b, "flag bits");
    let mut b = bytes;
    b[6] = 5;
    malformed(b, "unknown frame kind 5");
}

fn header() -> FrameHeader {
    FrameHeader {
        kind: FrameKind::Dense,
        is_final: false,
        version: 0x0102_0304_0506_0708,
        table_hash: 0x1112_1314_1516_1718,
        flush_index: 1,
        entry_count: 2,
        frame_len: 64 + 2 * 64 + 3 * 24 + 40 + 8,
        digest_count: 3,
        flush_count: 4,
        values_start: 64 + 2 * 64 + 3 * 24 + 16,
    }
}

#[test]
fn header_encoding_is_the_documented_one_and_decodes_back() {
    let h = header();
    let b = h.encode();
    assert_eq!(&b[0..8], &[0x44, 0x43, 0x53, 0x54, 2, 0, 3, 0]);
    assert_eq!(u64_at(&b, 8), h.version);
    assert_eq!(u64_at(&b, 16), h.table_hash);
    assert_eq!(u32_at(&b, 24), 1);
    assert_eq!(u32_at(&b, 28), 2);
    assert_eq!(u64_at(&b, 32), h.frame_len);
    assert_eq!(u32_at(&b, 40), 3);
    assert_eq!(u32_at(&b, 44), 4);
    assert_eq!(u64_at(&b, 48), h.values_start);
    assert_eq!(&b[56..64], &[0; 8]);
    assert_eq!(FrameHeader::decode(&b).unwrap(), h);
    // The final flag and every kind survive the round trip.
    for kind in [FrameKind::Seed, FrameKind::Delta, FrameKind::Dense] {
        let h = FrameHeader {
            kind,
            is_final: true,
            flush_index: 3,
            ..header()
        };
        assert_eq!(FrameHeader::decode(&h.encode()).unwrap(), h);
    }
    assert!(FrameHeader::decode(&b[..63]).is_err());
}

fn refused(h: FrameHeader, needle: &str) {
    match FrameHeader::decode(&h.encode()) {
        Err(e) => assert!(e.to_string().contains(needle), "{e} lacks {needle:?}"),
        Ok(_) => panic!("accepted {h:?} ({needle})"),
    }
}

#[test]
fn header_decode_checks_counts_flags_and_values_start() {
    let h = header();
    let sections = h.sections_start();
    refused(
        FrameHeader {
            flush_index: 4,
            ..h
        },
        "flush 4 of a sync of 4",
    );
    refused(
        FrameHeader {
            is_final: true,
            ..h
        },
        "has the FINAL flag",
    );
    refused(
        FrameHeader {
            flush_index: 3,
            ..h
        },
        "lacks the FINAL flag",
    );
    // flush_count 0: index and FINAL are free.
    let free = FrameHeader {
        flush_count: 0,
        flush_index: 900,
        is_final: true,
        ..h
    };
    assert_eq!(FrameHeader::decode(&free.encode()).unwrap(), free);
    for values_start in [1, sections - 1, h.body_end() + 1, u64::MAX] {
        refused(FrameHeader { values_start, ..h }, "values_start");
    }
    for values_start in [0, sections, h.body_end()] {
        let ok = FrameHeader { values_start, ..h };
        assert_eq!(FrameHeader::decode(&ok.encode()).unwrap(), ok);
    }
    // The manifest must fit the frame; counts at their maximum do not overflow.
    refused(
        FrameHeader {
            frame_len: sections + 7,
            ..h
        },
        "manifest and digest table",
    );
    let huge = FrameHeader {
        entry_count: u32::MAX,
        digest_count: u32::MAX,
        frame_len: u64::MAX,
        values_start: 0,
        ..h
    };
    assert_eq!(FrameHeader::decode(&huge.encode()).unwrap(), huge);
    refused(
        FrameHeader {
            frame_len: huge.sections_start() + 7,
            ..huge
        },
        "manifest and digest table",
    );
    refused(FrameHeader { frame_len: 71, ..h }, "below the minimum");
}

#[test]
fn verify_and_close_headers_carry_what_their_kind_allows() {
    refused(
        FrameHeader {
            kind: FrameKind::Verify,
            ..header()
        },
        "verify frame carries no chunks",
    );
    let close = FrameHeader {
        kind: FrameKind::Close,
        is_final: true,
        version: 9,
        table_hash: 5,
        flush_index: 0,
        entry_count: 0,
        frame_len: MIN_FRAME_LEN as u64,
        digest_count: 0,
        flush_count: 1,
        values_start: 0,
    };
    assert_eq!(FrameHeader::decode(&close.encode()).unwrap(), close);
    let bytes = close_frame(9, 5);
    let parsed = parse_frame(&bytes).unwrap();
    assert_eq!(parsed.header.kind, FrameKind::Close);
    assert!(parsed.entries.is_empty() && parsed.digests.is_empty());
    for bad in [
        FrameHeader {
            digest_count: 1,
            frame_len: 96,
            ..close
        },
        FrameHeader {
            frame_len: 80,
            ..close
        },
        FrameHeader {
            is_final: false,
            flush_count: 0,
            ..close
        },
        FrameHeader {
            flush_index: 1,
            flush_count: 2,
            ..close
        },
    ] {
        assert!(FrameHeader::decode(&bad.encode()).is_err(), "{bad:?}");
    }
}

#[test]
fn entry_and_digest_records_round_trip_and_refuse_what_they_alone_can() {
    let e = ChunkEntry {
        slot: 0x0a0b_0c0d,
        pos_codec: PosCodec::Gaps,
        val_codec: ValCodec::Ulp,
        start: 1 << 40,
        range: MAX_CHUNK_RANGE,
        count: 17,
        pos_offset: 1000,
        pos_len: 33,
        val_offset: 1033,
        val_len: 9,
    };
    let mut raw = [0u8; ENTRY_LEN];
    e.encode_into(&mut raw);
    assert_eq!(&raw[0..8], &[0x0d, 0x0c, 0x0b, 0x0a, 2, 1, 0, 0]);
    assert_eq!(u64_at(&raw, 8), 1 << 40);
    assert_eq!(u64_at(&raw, 56), 9);
    assert_eq!(ChunkEntry::decode(&raw).unwrap(), e);
    assert!(matches!(
        ChunkEntry::decode(&raw[..63]),
        Err(Error::Truncated { .. })
    ));
    for bad in [
        ChunkEntry { range: 0, ..e },
        ChunkEntry {
            range: MAX_CHUNK_RANGE + 1,
            ..e
        },
        ChunkEntry { count: 0, ..e },
        ChunkEntry {
            count: 1 << 33,
            ..e
        },
        ChunkEntry {
            start: u64::MAX - 5,
            range: 6,
            count: 1,
            ..e
        },
        ChunkEntry {
            pos_offset: u64::MAX,
            ..e
        },
        ChunkEntry {
            val_len: u64::MAX,
            ..e
        },
    ] {
        bad.encode_into(&mut raw);
        assert!(ChunkEntry::decode(&raw).is_err(), "{bad:?}");
    }
    let d = SlotDigest {
        slot: 7,
        base: u64::MAX,
        new: 3,
    };
    let mut raw = [0u8; DIGEST_LEN];
    d.encode_into(&mut raw);
    assert_eq!(SlotDigest::decode(&raw).unwrap(), d);
    raw[5] = 1;
    assert!(SlotDigest::decode(&raw).is_err());
}

/// A header for `entries` and `digests` whose sections hold `sections` bytes.
fn manifest_header(kind: FrameKind, entries: u32, digests: u32, sections: u64) -> FrameHeader {
    let start = 64 + 64 * entries as u64 + 24 * digests as u64;
    FrameHeader {
        kind,
        is_final: true,
        version: 2,
        table_hash: 1,
        flush_index: 0,
        entry_count: entries,
        frame_len: start + sections + 8,
        digest_count: digests,
        flush_count: 0,
        values_start: 0,
    }
}

fn manifest(entries: &[ChunkEntry], digests: &[SlotDigest]) -> Vec<u8> {
    let mut out = Vec::new();
    for e in entries {
        let mut raw = [0u8; ENTRY_LEN];
        e.encode_into(&mut raw);
        out.extend_from_slice(&raw);
    }
    for d in digests {
        let mut raw = [0u8; DIGEST_LEN];
        d.encode_into(&mut raw);
        out.extend_from_slice(&raw);
    }
    out
}

#[test]
fn manifest_sections_respect_values_start() {
    // 1 entry, 1 digest: sections start at 152; 16 bytes of sections, split at 160.
    let h = FrameHeader {
        values_start: 160,
        ..manifest_header(FrameKind::Delta, 1, 1, 16)
    };
    let d = [SlotDigest {
        slot: 0,
        base: 1,
        new: 2,
    }];
    let e = ChunkEntry {
        slot: 0,
        pos_codec: PosCodec::Abs32,
        val_codec: ValCodec::Raw,
        start: 0,
        range: 10,
        count: 2,
        pos_offset: 152,
        pos_len: 8,
        val_offset: 160,
        val_len: 4,
    };
    let (entries, digests) = parse_manifest(&h, &manifest(&[e], &d)).unwrap();
    assert_eq!((entries, digests), (vec![e], d.to_vec()));
    // Odd offsets are fine: alignment is no longer a rule of the format.
    let odd = ChunkEntry {
        pos_offset: 153,
        pos_len: 7,
        val_offset: 163,
        val_len: 1,
        count: 1,
        ..e
    };
    parse_manifest(&h, &manifest(&[odd], &d)).unwrap();
    // Empty sections may sit at their region's end.
    let empty = ChunkEntry {
        pos_codec: PosCodec::All,
        count: 10,
        pos_offset: 160,
        pos_len: 0,
        val_offset: 164,
        val_len: 4,
        ..e
    };
    parse_manifest(&h, &manifest(&[empty], &d)).unwrap();
    for (bad, needle) in [
        // positions crossing values_start, values before it, positions after it
        (ChunkEntry { pos_len: 9, ..e }, "positions section"),
        (
            ChunkEntry {
                val_offset: 159,
                ..e
            },
            "values section",
        ),
        (
            ChunkEntry {
                pos_offset: 160,
                pos_len: 4,
                ..e
            },
            "positions section",
        ),
        // outside the sections altogether
        (
            ChunkEntry {
                pos_offset: 151,
                ..e
            },
            "positions section",
        ),
        (ChunkEntry { val_len: 9, ..e }, "values section"),
    ] {
        let err = parse_manifest(&h, &manifest(&[bad], &d)).unwrap_err();
        assert!(err.to_string().contains(needle), "{err} lacks {needle}");
    }
    // Without values_start the same sections may interleave.
    let h0 = FrameHeader {
        values_start: 0,
        ..h
    };
    let swapped = ChunkEntry {
        pos_offset: 160,
        pos_len: 4,
        val_offset: 152,
        val_len: 8,
        count: 2,
        ..e
    };
    parse_manifest(&h0, &manifest(&[swapped], &d)).unwrap();
    assert!(parse_manifest(&h, &manifest(&[swapped], &d)).is_err());
    // The manifest bytes must be exactly the announced size.
    let bytes = manifest(&[e], &d);
    assert!(parse_manifest(&h, &bytes[..bytes.len() - 1]).is_err());
    assert!(parse_manifest(&h, &[bytes.clone(), vec![0]].concat()).is_err());
}

#[test]
fn dense_frames_are_all_raw_with_their_digests_and_no_digest_twice() {
    let h = manifest_header(FrameKind::Dense, 1, 1, 8);
    let e = ChunkEntry {
        slot: 2,
        pos_codec: PosCodec::All,
        val_codec: ValCodec::Raw,
        start: 0,
        range: 4,
        count: 4,
        pos_offset: 152,
        pos_len: 0,
        val_offset: 152,
        val_len: 8,
    };
    let d = SlotDigest {
        slot: 2,
        base: 1,
        new: 2,
    };
    parse_manifest(&h, &manifest(&[e], &[d])).unwrap();
    for bad in [
        ChunkEntry {
            pos_codec: PosCodec::Abs32,
            ..e
        },
        ChunkEntry {
            val_codec: ValCodec::Ulp,
            ..e
        },
    ] {
        let err = parse_manifest(&h, &manifest(&[bad], &[d])).unwrap_err();
        assert!(err.to_string().contains("dense chunk"), "{err}");
    }
    let other = SlotDigest { slot: 3, ..d };
    let err = parse_manifest(&h, &manifest(&[e], &[other])).unwrap_err();
    assert!(err.to_string().contains("no digest record"), "{err}");
    let h2 = manifest_header(FrameKind::Dense, 1, 2, 8);
    let e2 = ChunkEntry {
        pos_offset: 176,
        val_offset: 176,
        ..e
    };
    let err = parse_manifest(&h2, &manifest(&[e2], &[d, d])).unwrap_err();
    assert!(err.to_string().contains("two digest records"), "{err}");
    // A dense frame may carry digest records of slots it sends no chunk of (empty slots).
    parse_manifest(&h2, &manifest(&[e2], &[d, other])).unwrap();
}

#[test]
fn steps_positions_and_esc_values_only_go_together() {
    // A BF16 chunk of 10 elements: the 3-byte map, two escapes (docs/codecs.md's golden one).
    let e = ChunkEntry {
        slot: 0,
        pos_codec: PosCodec::Steps,
        val_codec: ValCodec::Escaped,
        start: 0,
        range: 10,
        count: 7,
        pos_offset: 152,
        pos_len: 3,
        val_offset: 156,
        val_len: 4,
    };
    let d = SlotDigest {
        slot: 0,
        base: 1,
        new: 2,
    };
    let delta = manifest_header(FrameKind::Delta, 1, 1, 8);
    parse_manifest(&delta, &manifest(&[e], &[d])).unwrap();
    let mut raw = [0u8; ENTRY_LEN];
    e.encode_into(&mut raw);
    assert_eq!(&raw[4..6], &[6, 3]);
    assert_eq!(ChunkEntry::decode(&raw).unwrap(), e);
    // Either one with anything else, in an entry alone or in a frame of any kind.
    let mut bad = Vec::new();
    for val in [ValCodec::Raw, ValCodec::Ulp, ValCodec::Context] {
        bad.push(ChunkEntry {
            val_codec: val,
            ..e
        });
    }
    for pos in [
        PosCodec::All,
        PosCodec::Abs32,
        PosCodec::Bitmap,
        PosCodec::Context,
    ] {
        bad.push(ChunkEntry {
            pos_codec: pos,
            ..e
        });
    }
    for b in bad {
        b.encode_into(&mut raw);
        let err = ChunkEntry::decode(&raw).unwrap_err();
        assert!(err.to_string().contains("go together"), "{err}");
        for kind in [FrameKind::Delta, FrameKind::Seed, FrameKind::Dense] {
            let h = manifest_header(kind, 1, 1, 8);
            let err = parse_manifest(&h, &manifest(&[b], &[d])).unwrap_err();
            assert!(matches!(err, Error::Malformed(_)), "{err}");
        }
    }
    // The pair itself in a seed or a dense frame: refused by what those kinds carry.
    for (kind, needle) in [
        (FrameKind::Seed, "seed chunk"),
        (FrameKind::Dense, "dense chunk"),
    ] {
        let h = manifest_header(kind, 1, 1, 8);
        let err = parse_manifest(&h, &manifest(&[e], &[d])).unwrap_err();
        assert!(err.to_string().contains(needle), "{err}");
    }
}

#[test]
fn dense_cover_is_exact() {
    let table = SlotTable::new(vec![
        SlotInfo::new("a", DType::BF16, vec![10]),
        SlotInfo::new("b", DType::F32, vec![3]),
    ])
    .unwrap();
    let chunk = |slot: u32, start: u64, range: u64| ChunkEntry {
        slot,
        pos_codec: PosCodec::All,
        val_codec: ValCodec::Raw,
        start,
        range,
        count: range,
        pos_offset: 0,
        pos_len: 0,
        val_offset: 0,
        val_len: 0,
    };
    let ok = [chunk(1, 0, 3), chunk(0, 6, 4), chunk(0, 0, 6)];
    assert_eq!(check_dense_cover(&table, &ok).unwrap(), vec![0, 1]);
    assert_eq!(check_dense_cover(&table, &[]).unwrap(), Vec::<u32>::new());
    for (bad, needle) in [
        (vec![chunk(0, 0, 6)], "covers [0, 6)"),
        (vec![chunk(0, 0, 6), chunk(0, 7, 3)], "missing"),
        (vec![chunk(0, 1, 9)], "missing"),
        (vec![chunk(0, 0, 6), chunk(0, 5, 5)], "sent twice"),
        (vec![chunk(0, 0, 10), chunk(0, 0, 10)], "sent twice"),
        (vec![chunk(0, 0, 11)], "covers [0, 11)"),
        (vec![chunk(1, 0, 3), chunk(1, 3, 1)], "covers [0, 4)"),
    ] {
        let err = check_dense_cover(&table, &bad).unwrap_err();
        assert!(err.to_string().contains(needle), "{err} lacks {needle}");
    }
    assert!(matches!(
        check_dense_cover(&table, &[chunk(2, 0, 1)]),
        Err(Error::UnknownSlot(2))
    ));
}
