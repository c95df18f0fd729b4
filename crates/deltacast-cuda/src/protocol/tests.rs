//! The stage layout against the core's own frame parser, and every bound a receiver relies on.

use super::limits::{section_bounds, value_bounds};
use super::*;

fn limits() -> TableLimits {
    TableLimits {
        hash: 0xabc,
        num_slots: 2,
        total_elements: 10_000 + 77,
        total_bytes: 20_000 + 308,
        slots: vec![(10_000, 2), (77, 4)],
        steppable: vec![true, true],
    }
}

fn entry(
    slot: u32,
    pos_codec: PosCodec,
    val_codec: ValCodec,
    (start, range, count): (u64, u64, u64),
    (pos_offset, pos_len): (u64, u64),
    (val_offset, val_len): (u64, u64),
) -> ChunkEntry {
    ChunkEntry {
        slot,
        pos_codec,
        val_codec,
        start,
        range,
        count,
        pos_offset,
        pos_len,
        val_offset,
        val_len,
    }
}

/// Four chunks over both slots, offsets relative to their regions.
fn records() -> Vec<ChunkEntry> {
    vec![
        entry(
            0,
            PosCodec::Abs32,
            ValCodec::Raw,
            (10, 500, 3),
            (0, 12),
            (0, 6),
        ),
        entry(
            0,
            PosCodec::Bitmap,
            ValCodec::Raw,
            (600, 400, 300),
            (12, 50),
            (6, 600),
        ),
        entry(
            0,
            PosCodec::Gaps,
            ValCodec::Ulp,
            (1000, 3000, 2000),
            (64, 400),
            (608, 700),
        ),
        entry(
            1,
            PosCodec::Abs32,
            ValCodec::Ulp,
            (0, 77, 1),
            (464, 4),
            (1308, 5),
        ),
    ]
}

fn delta() -> Stage {
    Stage::delta(7, 0xabc, 0, 1, 0, &[(1, 2), (3, 4)], records(), 468, 1313).expect("delta")
}

/// The same delta in two stages: slot 0 (three chunks), then slot 1 (one chunk).
fn staged() -> [Stage; 2] {
    let r = records();
    let mut last = r[3];
    last.pos_offset = 0;
    last.val_offset = 0;
    [
        Stage::delta(7, 0xabc, 0, 2, 0, &[(1, 2)], r[..3].to_vec(), 464, 1308).expect("stage 0"),
        Stage::delta(7, 0xabc, 1, 2, 1, &[(3, 4)], vec![last], 4, 5).expect("stage 1"),
    ]
}

fn decode(s: &Stage) -> Result<Stage> {
    let t = limits();
    let h = decode_header(&s.encode_header(), &t)?;
    decode_stage(h, &s.encode_manifest(), &t)
}

/// A region of `len` bytes of a recognisable pattern.
fn region(len: u64, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31) ^ seed)
        .collect()
}

#[test]
fn stages_round_trip_and_are_frames_of_the_core_format() {
    let t = limits();
    for s in [delta(), staged()[0].clone(), staged()[1].clone()] {
        assert_eq!(decode(&s).expect("valid"), s, "stage {}", s.index());
        // Written as a file frame, the core's parser reads the same records, with each
        // section where the regions put it.
        let (p, v) = (region(s.position_bytes(), 1), region(s.value_bytes(), 2));
        let bytes = s.to_frame(&p, &v).expect("frame");
        let frame = deltacast::wire::parse_frame(&bytes).expect("a core frame");
        assert_eq!(frame.header, s.header);
        assert_eq!(frame.entries, s.entries);
        assert_eq!(frame.digests, s.digests);
        for e in &s.entries {
            let po = s.position_offset(e) as usize;
            assert_eq!(frame.positions(e), &p[po..po + e.pos_len as usize]);
            let vo = s.value_offset(e) as usize;
            assert_eq!(frame.values(e), &v[vo..vo + e.val_len as usize]);
        }
        assert_eq!(s.manifest_bytes() as usize, s.encode_manifest().len());
        assert!(decode_header(&s.encode_header(), &t).is_ok());
    }
    // A whole stage: its sections, back to back as broadcast, land at their offsets; slot 1
    // (4-byte elements) after slot 0's 3 two-byte ones starts 4-aligned.
    let t3 = TableLimits {
        hash: 0xabc,
        num_slots: 2,
        total_elements: 3 + 77,
        total_bytes: 6 + 308,
        slots: vec![(3, 2), (77, 4)],
        steppable: vec![true, true],
    };
    let s = Stage::whole(
        FrameKind::Dense,
        9,
        0xabc,
        (0, 1),
        0,
        &t3.slots,
        &[(5, 6), (7, 8)],
    );
    let h = decode_header(&s.encode_header(), &t3).expect("dense header");
    assert_eq!(
        decode_stage(h, &s.encode_manifest(), &t3).expect("dense"),
        s
    );
    assert_eq!(s.value_offset(&s.entries[1]) % 4, 0);
    let sent = region(6 + 308, 3);
    let bytes = s.to_frame(&[], &sent).expect("frame");
    let frame = deltacast::wire::parse_frame(&bytes).expect("a core frame");
    assert_eq!(frame.values(&frame.entries[0]), &sent[..6]);
    assert_eq!(frame.values(&frame.entries[1]), &sent[6..]);
    assert_eq!(s.wire_bytes(), 64 + s.manifest_bytes() + 314);
    assert!(s.to_frame(&[], &sent[1..]).is_err(), "short capture");
    // A close is a frame too.
    let c = Stage::close(3, 0xabc);
    let frame_bytes = c.to_frame(&[], &[]).expect("close frame");
    let frame = deltacast::wire::parse_frame(&frame_bytes).expect("a core frame");
    assert_eq!(frame.header.kind, FrameKind::Close);
    assert_eq!(
        decode_header(&c.encode_header(), &t).expect("close").kind,
        FrameKind::Close
    );
}

#[test]
fn stages_must_come_in_sequence() {
    let [s0, s1] = staged();
    assert!(s0.follows(None, 2).is_ok());
    assert!(s1.follows(Some(&s0), 2).is_ok());
    assert!(s1.follows(None, 2).is_err(), "a sync starting at stage 1");
    assert!(s0.follows(Some(&s0), 2).is_err(), "stage 0 twice");
    let mut other = s1.clone();
    other.header.version = 8;
    assert!(other.follows(Some(&s0), 2).is_err(), "another version");
    let mut other = s1.clone();
    other.header.flush_count = 3;
    assert!(other.follows(Some(&s0), 2).is_err(), "another count");
    // A last stage that stops short of the last slot.
    let mut short = s0.clone();
    short.header.flush_count = 1;
    short.header.is_final = true;
    assert!(short.follows(None, 2).is_err());
    assert!(delta().follows(None, 2).is_ok());
}

#[test]
fn stages_keep_to_their_slots() {
    let t = limits();
    let [s0, s1] = staged();
    let redecode = |s: &Stage| {
        decode_header(&s.encode_header(), &t)
            .and_then(|h| decode_stage(h, &s.encode_manifest(), &t))
    };
    // A chunk of a slot outside the stage is refused, either way round.
    let mut wrong = s1.clone();
    wrong.entries[0].slot = 0;
    assert!(redecode(&wrong).is_err());
    let mut wrong = s0.clone();
    wrong.entries[0].slot = 1;
    assert!(redecode(&wrong).is_err());
    // Digest records that are not consecutive slots of the table.
    let mut wrong = delta();
    wrong.digests[1].slot = 0;
    assert!(redecode(&wrong).is_err());
    let mut wrong = s1.clone();
    wrong.digests[0].slot = 2;
    assert!(redecode(&wrong).is_err());
    // Stage counts that cannot be.
    type Mutation = Box<dyn Fn(&mut FrameHeader)>;
    let cases: Vec<(&str, Mutation)> = vec![
        ("more stages than slots", Box::new(|h| h.flush_count = 3)),
        ("staged seed", Box::new(|h| h.kind = FrameKind::Seed)),
        ("verify", Box::new(|h| h.kind = FrameKind::Verify)),
    ];
    for (what, mutate) in cases {
        let mut bad = s1.clone();
        mutate(&mut bad.header);
        assert!(redecode(&bad).is_err(), "{what} accepted");
    }
    // A dense stage carries exactly its slots' elements, all + raw.
    let dense = Stage::whole(
        FrameKind::Dense,
        7,
        0xabc,
        (1, 2),
        1,
        &t.slots[1..],
        &[(3, 4)],
    );
    assert_eq!(redecode(&dense).expect("dense"), dense);
    let mut short = dense.clone();
    short.entries[0].range = 76;
    short.entries[0].count = 76;
    short.entries[0].val_len = 304;
    assert!(redecode(&short).is_err(), "partial cover");
    let mut coded = dense.clone();
    coded.entries[0].val_codec = ValCodec::Ulp;
    assert!(redecode(&coded).is_err(), "a coded whole chunk");
}

#[test]
fn the_chooser_takes_the_smallest_allowed_pair() {
    let mut state = 7u64;
    let mut next = |n: u64| {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (state >> 33) % n.max(1)
    };
    for _ in 0..20_000 {
        let range = 1 + next(1 << 20);
        let count = 1 + next(range);
        let width = [1, 2, 4][next(3) as usize];
        let entropy = (next(4) != 0).then(|| (1 + next(count * 7), 1 + next(count * 5)));
        let c = choose_sections(count, range, width, entropy);
        let total = c.position_len + c.value_len;
        let (abs32, bitmap, raw) = (count * 4, range.div_ceil(8), count * width);
        assert!(total <= abs32 + raw && total <= bitmap + raw);
        assert!(!(c.positions == PosCodec::Bitmap && c.values == ValCodec::Ulp));
        // Every allowed pair is at least as large.
        let mut pairs = vec![(abs32, raw), (bitmap, raw)];
        if let Some((g, u)) = entropy {
            pairs.extend([(g, raw), (abs32, u), (g, u)]);
        }
        assert!(
            pairs.iter().all(|(p, v)| p + v >= total),
            "{c:?} {entropy:?}"
        );
        let (pmin, pmax) = section_bounds(c.positions, count, range);
        if entropy.is_none() || c.positions != PosCodec::Gaps {
            assert!(c.position_len >= pmin && c.position_len <= pmax);
        }
    }
    // Ties keep abs32 + raw over gaps + ulp, and bitmap over a list.
    let c = choose_sections(10, 1000, 2, Some((40, 20)));
    assert_eq!((c.positions, c.values), (PosCodec::Abs32, ValCodec::Raw));
    let c = choose_sections(100, 800, 2, None);
    assert_eq!(c.positions, PosCodec::Bitmap);
}

/// The shard layout check against an oracle that marks every element each shard claims:
/// valid exactly when every element is claimed once and the shards run in rank order.
#[test]
fn shard_runs_are_valid_exactly_when_they_tile_the_slot_in_rank_order() {
    let mut state = 0x2545_f491_4f6c_dd1d_u64;
    let mut next = |below: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % below
    };
    let (mut valid, mut invalid) = (0, 0);
    for _ in 0..20_000 {
        let numel = next(40);
        let world = 1 + next(5) as usize;
        // Mostly a correct cut (as torch.chunk makes), then a random disturbance.
        let per = numel.div_ceil(world as u64).max(1);
        let mut runs: Vec<(u64, u64)> = (0..world as u64)
            .map(|r| {
                let first = (r * per).min(numel);
                (first, per.min(numel - first))
            })
            .collect();
        match next(4) {
            0 => {}
            1 => {
                let r = next(world as u64) as usize;
                runs[r].0 = next(numel + 2);
            }
            2 => {
                let r = next(world as u64) as usize;
                runs[r].1 = next(numel + 2);
            }
            _ => runs.reverse(),
        }
        // The oracle: claims per element, and the claimed starts in rank order.
        let mut claims = vec![0u32; numel as usize];
        let mut beyond = false;
        for &(first, count) in &runs {
            for e in first..first + count {
                match claims.get_mut(e as usize) {
                    Some(c) => *c += 1,
                    None => beyond = true,
                }
            }
        }
        let starts: Vec<u64> = runs.iter().filter(|r| r.1 > 0).map(|r| r.0).collect();
        let ordered = starts.windows(2).all(|w| w[0] < w[1]);
        let tiles = !beyond && claims.iter().all(|&c| c == 1) && ordered;
        let got = check_shard_runs("w", numel, &runs);
        assert_eq!(
            got.is_ok(),
            tiles,
            "{numel} elements, runs {runs:?}: {got:?}"
        );
        if tiles {
            valid += 1;
        } else {
            invalid += 1;
        }
    }
    assert!(
        valid > 1000 && invalid > 1000,
        "{valid} valid, {invalid} invalid"
    );
}
#[test]
fn headers_that_lie_are_refused_before_allocation() {
    let s = delta();
    let t = limits();
    let check = |h: &FrameHeader| decode_header(&h.encode(), &t);
    let mut wrong_table = s.header;
    wrong_table.table_hash ^= 1;
    assert!(matches!(
        check(&wrong_table),
        Err(CudaError::WrongTable { .. })
    ));
    let mut huge = s.header;
    huge.frame_len = u64::MAX / 2;
    assert!(check(&huge).is_err(), "huge value region");
    let mut huge = s.header;
    huge.values_start += t.total_elements * 8;
    huge.frame_len += t.total_elements * 8;
    assert!(check(&huge).is_err(), "huge position region");
    let mut many = s.header;
    many.entry_count = u32::MAX / 2;
    assert!(check(&many).is_err(), "too many chunks");
    let mut digests = s.header;
    digests.digest_count = 3;
    assert!(check(&digests).is_err(), "more digests than slots");
    let mut seed = s.header;
    seed.kind = FrameKind::Seed;
    assert!(check(&seed).is_err(), "seed with positions");
    let whole = Stage::whole(
        FrameKind::Seed,
        1,
        0xabc,
        (0, 1),
        0,
        &t.slots,
        &[(0, 1), (0, 2)],
    );
    assert_eq!(check(&whole.header).expect("seed").kind, FrameKind::Seed);
    let mut b = s.encode_header();
    b[4] = 9;
    assert!(decode_header(&b, &t).is_err(), "version");
    b = s.encode_header();
    b[0] = b'X';
    assert!(decode_header(&b, &t).is_err(), "magic");
    assert!(decode_header(&b[..10], &t).is_err(), "short");
    b = s.encode_header();
    b[6] = 99;
    assert!(decode_header(&b, &t).is_err(), "kind");
}

#[test]
fn every_single_byte_change_of_a_manifest_is_caught_or_harmless() {
    // Mutating any byte either fails the decode or yields a stage whose chunks still satisfy
    // every bound (the GPU check and the digest catch the rest): the whole delta's manifest,
    // and each stage's (whose chunks must also stay in the stage's slots).
    let t = limits();
    let [first, second] = staged();
    let mut state = 0x1234_5678u64;
    for s in [delta(), first, second] {
        let good = s.encode_manifest();
        for i in 0..good.len() {
            for _ in 0..8 {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let mut b = good.clone();
                b[i] ^= ((state >> 33) as u8) | 1;
                let Ok(d) = decode_stage(s.header, &b, &t) else {
                    continue;
                };
                assert_eq!(d.digests.len(), s.digests.len());
                for c in &d.entries {
                    assert!(d.slots().contains(&(c.slot as usize)), "{c:?}");
                    let (numel, w) = t.slots[c.slot as usize];
                    assert!(c.start + c.range <= numel);
                    assert!(c.count >= 1 && c.count <= c.range);
                    let (pmin, pmax) = section_bounds(c.pos_codec, c.count, c.range);
                    assert!(c.pos_len >= pmin && c.pos_len <= pmax);
                    assert!(d.position_offset(c) + c.pos_len <= d.position_bytes());
                    let (vmin, vmax) = value_bounds(c.val_codec, c.count, w as u64);
                    assert!(c.val_len >= vmin && c.val_len <= vmax);
                    assert!(d.value_offset(c) + c.val_len <= d.value_bytes());
                }
            }
        }
    }
}

#[test]
fn manifests_out_of_bounds_are_refused() {
    let s = delta();
    let t = limits();
    let (ps, vs) = (s.sections_start(), s.header.values_start);
    type Mutation = Box<dyn Fn(&mut Vec<ChunkEntry>)>;
    let cases: Vec<(&str, Mutation)> = vec![
        ("slot", Box::new(|e| e[3].slot = 2)),
        ("beyond slot", Box::new(|e| e[3].range = 78)),
        ("count > range", Box::new(|e| e[0].count = 501)),
        ("zero count", Box::new(|e| e[0].count = 0)),
        ("overlap", Box::new(|e| e[1].start = 500)),
        ("pos section", Box::new(move |e| e[3].pos_offset = ps + 468)),
        ("pos align", Box::new(move |e| e[3].pos_offset = ps + 2)),
        ("pos in the values", Box::new(move |e| e[3].pos_offset = vs)),
        (
            "val section",
            Box::new(move |e| e[3].val_offset = vs + 1312),
        ),
        ("val align", Box::new(move |e| e[3].val_offset = vs + 1306)),
        (
            "val in the positions",
            Box::new(move |e| e[3].val_offset = ps),
        ),
        ("raw align", Box::new(move |e| e[1].val_offset = vs + 7)),
        ("abs32 length", Box::new(|e| e[0].pos_len = 13)),
        ("bitmap length", Box::new(|e| e[1].pos_len = 49)),
        ("raw length", Box::new(|e| e[1].val_len = 601)),
        ("gaps too short", Box::new(|e| e[2].pos_len = 7)),
        ("ulp too short", Box::new(|e| e[2].val_len = 3)),
        // 10 holes cannot take 400 bytes (9 to 61); the same count as gaps can (control below).
        (
            "holes length",
            Box::new(|e| {
                e[2].pos_codec = PosCodec::Holes;
                e[2].count = 2990;
            }),
        ),
        (
            "all with unchanged elements",
            Box::new(|e| e[3].pos_codec = PosCodec::All),
        ),
        (
            "ctxgaps",
            Box::new(|e| e[2].pos_codec = PosCodec::ContextGaps),
        ),
    ];
    for (what, mutate) in cases {
        let mut bad = s.clone();
        mutate(&mut bad.entries);
        assert!(
            decode_stage(s.header, &bad.encode_manifest(), &t).is_err(),
            "{what} accepted"
        );
    }
    let good = s.encode_manifest();
    assert!(decode_stage(s.header, &good[..good.len() - 1], &t).is_err());
    // Controls: the same records made valid are accepted (holes of 1000 unchanged elements
    // in 400 bytes; gaps of 2990 changes in 400 bytes).
    let accepted = |mutate: &dyn Fn(&mut Vec<ChunkEntry>)| {
        let mut ok = s.clone();
        mutate(&mut ok.entries);
        decode_stage(s.header, &ok.encode_manifest(), &t).is_ok()
    };
    assert!(accepted(&|e| e[2].pos_codec = PosCodec::Holes));
    // Ulp values after a bitmap (the CPU codecs allow them; the GPU lists the positions):
    // accepted with a possible length, refused with one shorter than its directory.
    let bitmap_ulp = |val_len: u64| {
        let chunk = entry(
            0,
            PosCodec::Bitmap,
            ValCodec::Ulp,
            (0, 800, 300),
            (0, 100),
            (0, val_len),
        );
        let s = Stage::delta(
            7,
            0xabc,
            0,
            1,
            0,
            &[(1, 2), (3, 4)],
            vec![chunk],
            100,
            val_len,
        )
        .expect("stage");
        decode_stage(s.header, &s.encode_manifest(), &t)
    };
    assert!(bitmap_ulp(700).is_ok());
    assert!(bitmap_ulp(3).is_err());
    assert!(accepted(&|e| e[2].count = 2990));
}

/// Two ranks' chunk records, each with offsets into its own sections, rebased by the first
/// rank's section lengths and put after each other: the stage built from them decodes to the
/// records of the whole delta, and passes every check.
#[test]
fn rebased_records_of_two_ranks_decode_as_one_stage() {
    let r = records();
    let encode = |chunks: &[ChunkEntry]| {
        let mut out = vec![0u8; chunks.len() * CHUNK_RECORD_BYTES];
        for (c, rec) in chunks
            .iter()
            .zip(out.as_chunks_mut::<CHUNK_RECORD_BYTES>().0)
        {
            c.encode_into(rec);
        }
        out
    };
    // Rank 0 holds elements 0..1000 of slot 0, rank 1 the rest of slot 0 and slot 1.
    let rank1: Vec<ChunkEntry> = r[2..]
        .iter()
        .map(|c| ChunkEntry {
            pos_offset: c.pos_offset - 64,
            val_offset: c.val_offset - 608,
            ..*c
        })
        .collect();
    let mut r0 = encode(&r[..2]);
    rebase_chunk_records(&mut r0, 0, 0).expect("rebase");
    let mut r1 = encode(&rank1);
    rebase_chunk_records(&mut r1, 64, 608).expect("rebase");
    let mut all = decode_chunk_records(&r0).expect("records");
    all.extend(decode_chunk_records(&r1).expect("records"));
    assert_eq!(all, r);
    let s = Stage::delta(7, 0xabc, 0, 1, 0, &[(1, 2), (3, 4)], all, 468, 1313).expect("stage");
    assert_eq!(decode(&s).expect("decode"), delta());
    // Not whole records, or an offset pushed past 2^64: refused, nothing panics.
    assert!(rebase_chunk_records(&mut r1[..63], 0, 0).is_err());
    assert!(rebase_chunk_records(&mut r1, u64::MAX, 0).is_err());
    assert!(rebase_chunk_records(&mut [], 5, 5).is_ok());
    assert!(decode_chunk_records(&r1[..63]).is_err());
}

/// The chunk bound allows one more chunk per slot for every shard border (up to
/// MAX_TRAINER_RANKS ranks), never more chunks than a slot has elements.
#[test]
fn chunk_bound_allows_shard_borders_not_more_chunks_than_elements() {
    let t = limits(); // slots of 10_000 and 77 elements
    let grid = 10_000u64.div_ceil(MIN_CHUNK_ELEMS) + 77u64.div_ceil(MIN_CHUNK_ELEMS);
    assert_eq!(t.max_chunks(0..2), (3 + MAX_TRAINER_RANKS - 1) + 77);
    assert!(
        t.max_chunks(0..2) > grid + 1,
        "a split grid cell must be allowed"
    );
    let s = delta();
    for (chunks, ok) in [(t.max_chunks(0..2), true), (t.max_chunks(0..2) + 1, false)] {
        let extra = (chunks - 4) * CHUNK_RECORD_BYTES as u64;
        let mut head = s.header;
        head.entry_count = chunks as u32;
        head.values_start += extra;
        head.frame_len += extra;
        assert_eq!(
            decode_header(&head.encode(), &t).is_ok(),
            ok,
            "{chunks} chunks"
        );
    }
}

/// A CPU sender's syncs (several frames each, every codec) restaged into device parts and
/// assembled back into frames: a CPU receiver of the reassembled frames holds the sender's
/// bits after every sync (a naive copy of the sender's buffers is the oracle); a byte
/// flipped in any frame is refused by the restager.
#[test]
fn cpu_syncs_survive_restaging_and_reassembly_bit_for_bit() {
    use deltacast::{CodecChoice, DType, FlushConfig, Receiver, Sender, SlotInfo, SlotTable};
    let table = SlotTable::new(vec![
        SlotInfo::new("e", DType::BF16, vec![0]),
        SlotInfo::new("a", DType::BF16, vec![3, 1001]),
        SlotInfo::new("b", DType::F32, vec![777]),
        SlotInfo::new("c", DType::F8E4M3, vec![5]),
        SlotInfo::new("d", DType::F16, vec![4099]),
    ])
    .expect("table");
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let specials: [u16; 6] = [0x0000, 0x8000, 0x7fc1, 0xffff, 0x0001, 0x7f80];
    let mut bufs: Vec<Vec<u8>> = table
        .slots()
        .iter()
        .map(|s| (0..s.nbytes()).map(|_| next() as u8).collect())
        .collect();
    for codec in ["auto", "gaps+ulp", "abs32+raw", "bitmap+raw", "holes+raw"] {
        let config = FlushConfig {
            bucket_size: 4096,
            chunk_elems: 512,
            codec: CodecChoice::parse(codec).expect("codec"),
        };
        let mut sender = Sender::new(table.clone(), config).expect("sender");
        let mut rx = Receiver::new(table.clone());
        for (k, density) in [0.0, 0.01, 0.3, 0.0, 0.9, 0.002].into_iter().enumerate() {
            if k > 0 {
                for (s, b) in table.slots().iter().zip(bufs.iter_mut()) {
                    let w = s.dtype.width();
                    for e in 0..s.numel() as usize {
                        if (next() % 10_000) as f64 / 10_000.0 < density {
                            let v = match next() % 4 {
                                0 => specials[(next() % 6) as usize] as u64,
                                _ => next(),
                            };
                            b[e * w..(e + 1) * w].copy_from_slice(&v.to_le_bytes()[..w]);
                        }
                    }
                }
            }
            let views: Vec<&[u8]> = bufs.iter().map(Vec::as_slice).collect();
            let mut frames = Vec::new();
            sender
                .sync(&views, |f| {
                    frames.push(f);
                    Ok(())
                })
                .expect("sync");
            let refs: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
            let parts = device_parts(&refs).expect("restage");
            // What a GPU receiver checks of the parts, before it allocates or receives.
            let limits = TableLimits {
                hash: table.hash(),
                num_slots: table.len(),
                total_elements: table.total_elements(),
                total_bytes: table.total_bytes(),
                slots: table
                    .slots()
                    .iter()
                    .map(|s| (s.numel(), s.dtype.width()))
                    .collect(),
                steppable: table
                    .slots()
                    .iter()
                    .map(|s| s.dtype.ulp_codable())
                    .collect(),
            };
            let head = decode_header(&parts[0], &limits)
                .unwrap_or_else(|e| panic!("{codec} sync {k}: header refused: {e}"));
            match decode_stage(head, &parts[1], &limits) {
                Ok(stage) => {
                    assert_eq!(stage.slots(), 0..table.len());
                    assert!(stage.follows(None, table.len()).is_ok());
                }
                // Only what the GPU does not decode is refused, by name.
                Err(e) => assert!(
                    codec == "holes+raw" || codec == "auto",
                    "{codec} sync {k}: {e}"
                ),
            }
            let mut assembler = FrameAssembler::new();
            let mut rebuilt = Vec::new();
            for p in &parts {
                if let Some(f) = assembler.push(p).expect("assemble") {
                    rebuilt.push(f);
                }
            }
            assert!(assembler.is_idle());
            assert_eq!(rebuilt.len(), 1, "{codec} sync {k}: one stage");
            let outcome = rx.receive(&rebuilt[0]).expect("apply the restaged frame");
            assert!(outcome.is_some(), "{codec} sync {k}: complete");
            for (i, b) in bufs.iter().enumerate() {
                assert_eq!(&rx.store()[i], b, "{codec} sync {k} slot {i}");
            }
            // Any flipped byte: refused (checksum), never a panic.
            let f = next() as usize % frames.len();
            let at = next() as usize % frames[f].len();
            let mut bad = frames.clone();
            bad[f][at] ^= 0x20;
            let refs: Vec<&[u8]> = bad.iter().map(Vec::as_slice).collect();
            assert!(
                device_parts(&refs).is_err(),
                "{codec} sync {k}: corruption passed"
            );
        }
    }
    // Parts that do not fit what a stage announced are refused.
    let mut assembler = FrameAssembler::new();
    let s = delta();
    assert!(assembler
        .push(&s.encode_header())
        .expect("header")
        .is_none());
    assert!(assembler
        .push(&s.encode_manifest())
        .expect("manifest")
        .is_none());
    assert!(
        assembler.push(&[0u8; 3]).is_err(),
        "a short position region"
    );
    assert!(assembler.is_idle(), "starts over");
    assert!(assembler.push(&[1u8; 10]).is_err(), "not a header");
    assert!(device_parts(&[]).is_err());
}

/// Found by the `gpu_stage` fuzz target: a header whose sections are not split
/// (`values_start` 0, which a file frame may have) is refused by every device-link reader,
/// not an overflow.
#[test]
fn unsplit_sections_are_refused_on_a_device_link() {
    let mut h = delta().header;
    h.values_start = 0;
    let bytes = h.encode();
    assert!(FrameHeader::decode(&bytes).is_ok(), "a valid file header");
    let err = decode_header(&bytes, &limits()).expect_err("not a stage");
    assert!(err.to_string().contains("values_start"), "{err}");
    assert!(FrameAssembler::new().push(&bytes).is_err());
    // Mixed kinds pass through frame by frame: an unsplit one is refused there too.
    let mut dense = Stage::whole(
        FrameKind::Dense,
        7,
        0xabc,
        (0, 2),
        0,
        &limits().slots[..1],
        &[(1, 2)],
    );
    dense.header.values_start = 0;
    let d = dense.to_frame(&[], &region(20_000, 1)).expect("frame");
    let [_, s1] = staged();
    let f1 = s1
        .to_frame(
            &region(s1.position_bytes(), 2),
            &region(s1.value_bytes(), 3),
        )
        .expect("frame");
    assert!(device_parts(&[&d, &f1]).is_err());
}

/// Found by the `gpu_stage` fuzz target: a captured whole stage whose header claims sections
/// far past what arrived is refused, never an allocation of the claimed size.
#[test]
fn captured_frames_are_sized_by_what_arrived() {
    let t = limits();
    let mut s = Stage::whole(
        FrameKind::Dense,
        7,
        0xabc,
        (1, 2),
        1,
        &t.slots[1..],
        &[(3, 4)],
    );
    s.entries[0].val_offset = u64::MAX / 4;
    assert!(
        s.to_frame(&[], &region(308, 1)).is_err(),
        "an entry far past the last"
    );
    let mut s = Stage::whole(
        FrameKind::Dense,
        7,
        0xabc,
        (1, 2),
        1,
        &t.slots[1..],
        &[(3, 4)],
    );
    s.header.frame_len = u64::MAX / 2;
    assert!(
        s.to_frame(&[], &region(308, 1)).is_err(),
        "a frame end far past the sections"
    );
    let mut s = delta();
    s.header.frame_len = u64::MAX / 2;
    assert!(
        s.to_frame(&region(468, 1), &region(1313, 2)).is_err(),
        "regions not as claimed"
    );
    // An empty whole stage whose header claims bytes: assembled from what arrived, refused.
    let mut empty = Stage::whole(FrameKind::Dense, 7, 0xabc, (1, 2), 1, &[], &[]);
    empty.header.frame_len += 1 << 40;
    assert!(empty.to_frame(&[], &[]).is_err());
}

#[test]
fn steps_chunks_are_taken_on_float_slots_with_their_exact_map() {
    // Slot 0 (10 000 bf16): a steps chunk of range 1000 (a 250-byte map), 40 changes of which
    // 3 escaped.
    let steps = |pos_len: u64, val_len: u64| {
        let e = entry(
            0,
            PosCodec::Steps,
            ValCodec::Escaped,
            (64, 1000, 40),
            (0, pos_len),
            (0, val_len),
        );
        Stage::delta(7, 0xabc, 0, 1, 0, &[(1, 2), (3, 4)], vec![e], 256, 80).expect("stage")
    };
    assert!(decode(&steps(250, 6)).is_ok());
    // Any other map length, or more escaped bytes than changes: refused before anything is
    // received.
    for (pos_len, val_len) in [(249, 6), (251, 6), (250, 82)] {
        let s = Stage::delta(
            7,
            0xabc,
            0,
            1,
            0,
            &[(1, 2), (3, 4)],
            vec![entry(
                0,
                PosCodec::Steps,
                ValCodec::Escaped,
                (64, 1000, 40),
                (0, pos_len),
                (0, val_len),
            )],
            256,
            100,
        )
        .expect("stage");
        assert!(decode(&s).is_err(), "map {pos_len}, escapes {val_len}");
    }
    // The same chunk on a slot whose dtype does not step: refused by name.
    let t = TableLimits {
        steppable: vec![false, true],
        ..limits()
    };
    let s = steps(250, 6);
    let h = decode_header(&s.encode_header(), &t).expect("header");
    let err = decode_stage(h, &s.encode_manifest(), &t).unwrap_err();
    assert!(err.to_string().contains("floating-point"), "{err}");
}
