//! Arbitrary bytes as one frame and as a `.dcast` stream: errors, never panics.
#![no_main]

use deltacast::wire::{parse_frame, peek_header, split_frames};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = peek_header(data);
    if let Ok(frame) = parse_frame(data) {
        for e in &frame.entries {
            let _ = (frame.positions(e), frame.values(e));
        }
    }
    if let Ok(frames) = split_frames(data) {
        assert_eq!(frames.iter().map(|f| f.len()).sum::<usize>(), data.len());
        for f in frames {
            let _ = parse_frame(f);
        }
    }
});
