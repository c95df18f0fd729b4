//! Arbitrary header fields, manifest, digest table and sections behind a right magic, length
//! and checksum: what `parse_frame` accepts obeys every rule of docs/wire-format.md (v2:
//! flush_count, values_start, dense and close frames, `steps` only with `esc`) and re-encodes
//! to its own bytes.
#![no_main]

use deltacast::wire::{parse_frame, FrameKind, CHECKSUM_LEN, DIGEST_LEN, ENTRY_LEN, HEADER_LEN};
use deltacast::{PosCodec, ValCodec};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let mut bytes = data.to_vec();
    deltacast_fuzz::seal(&mut bytes);
    let Ok(frame) = parse_frame(&bytes) else {
        return;
    };
    let h = frame.header;
    let sections = (HEADER_LEN
        + h.entry_count as usize * ENTRY_LEN
        + h.digest_count as usize * DIGEST_LEN) as u64;
    let body_end = (bytes.len() - CHECKSUM_LEN) as u64;
    assert!(sections <= body_end);
    assert_eq!(sections, h.sections_start());
    assert_eq!(frame.entries.len(), h.entry_count as usize);
    assert_eq!(frame.digests.len(), h.digest_count as usize);
    assert!(!matches!(h.kind, FrameKind::Verify | FrameKind::Close) || frame.entries.is_empty());
    assert!(h.kind != FrameKind::Close || (frame.digests.is_empty() && bytes.len() == 72));
    if h.flush_count != 0 {
        assert!(h.flush_index < h.flush_count);
        assert_eq!(h.is_final, h.flush_index + 1 == h.flush_count);
    }
    assert!(h.values_start == 0 || (sections..=body_end).contains(&h.values_start));
    // Sections: positions in [sections, split), values in [split', body_end).
    let (pos_hi, val_lo) = match h.values_start {
        0 => (body_end, sections),
        v => (v, v),
    };
    let mut slots: Vec<u32> = frame.digests.iter().map(|d| d.slot).collect();
    slots.sort_unstable();
    assert!(
        slots.windows(2).all(|w| w[0] != w[1]),
        "a digest record twice"
    );
    for e in &frame.entries {
        assert!(1 <= e.count && e.count <= e.range && e.range <= u32::MAX as u64);
        assert!(e.start.checked_add(e.range).is_some());
        assert!(h.kind != FrameKind::Seed || e.val_codec == ValCodec::Raw);
        // `steps` positions and `esc` values only together.
        assert_eq!(
            e.pos_codec == PosCodec::Steps,
            e.val_codec == ValCodec::Escaped
        );
        if h.kind == FrameKind::Dense {
            assert!(e.pos_codec == PosCodec::All && e.val_codec == ValCodec::Raw);
            assert!(
                slots.binary_search(&e.slot).is_ok(),
                "dense slot without its digest"
            );
        }
        assert!(e.pos_offset >= sections && e.pos_offset + e.pos_len <= pos_hi);
        assert!(e.val_offset >= val_lo && e.val_offset + e.val_len <= body_end);
        assert_eq!(frame.positions(e).len() as u64, e.pos_len);
        assert_eq!(frame.values(e).len() as u64, e.val_len);
    }
    // The header and manifest re-encode to the bytes they were parsed from.
    assert_eq!(&h.encode()[..], &bytes[..HEADER_LEN]);
    for (i, e) in frame.entries.iter().enumerate() {
        let mut raw = [0u8; ENTRY_LEN];
        e.encode_into(&mut raw);
        assert_eq!(&raw[..], &bytes[HEADER_LEN + i * ENTRY_LEN..][..ENTRY_LEN]);
    }
});
