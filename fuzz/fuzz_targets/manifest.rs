//! Arbitrary header fields, manifest, digest table and sections behind a right magic, length
//! and checksum: what `parse_frame` accepts obeys every rule of docs/wire-format.md.
#![no_main]

use deltacast::wire::{parse_frame, FrameKind, CHECKSUM_LEN, DIGEST_LEN, ENTRY_LEN, HEADER_LEN};
use deltacast::ValCodec;
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
    assert_eq!(frame.entries.len(), h.entry_count as usize);
    assert_eq!(frame.digests.len(), h.digest_count as usize);
    assert!(h.kind != FrameKind::Verify || frame.entries.is_empty());
    for e in &frame.entries {
        assert!(1 <= e.count && e.count <= e.range && e.range <= u32::MAX as u64);
        assert!(e.start.checked_add(e.range).is_some());
        assert!(h.kind != FrameKind::Seed || e.val_codec == ValCodec::Raw);
        for (at, len) in [(e.pos_offset, e.pos_len), (e.val_offset, e.val_len)] {
            assert!(at % 8 == 0 && at >= sections && at + len <= body_end);
        }
        assert_eq!(frame.positions(e).len() as u64, e.pos_len);
        assert_eq!(frame.values(e).len() as u64, e.val_len);
    }
});
