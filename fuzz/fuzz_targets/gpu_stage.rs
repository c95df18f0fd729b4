//! The GPU receiver's host-side checks of a stage: an arbitrary header and manifest either
//! fail to decode or yield a stage whose every chunk lies inside its slot, its region and the
//! stage's slots; the frame assembler and the restager never panic on what they are fed.
#![no_main]

use deltacast::wire::HEADER_LEN;
use deltacast_cuda::protocol::{
    decode_header, decode_stage, device_parts, FrameAssembler, TableLimits,
};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let table = TableLimits {
        hash: 0xabc,
        num_slots: 3,
        total_elements: 10_000 + 77 + 5,
        total_bytes: 20_000 + 308 + 5,
        slots: vec![(10_000, 2), (77, 4), (5, 1)],
        // The byte slot as an integer one: steps chunks there are refused.
        steppable: vec![true, true, false],
    };
    if data.len() >= HEADER_LEN {
        let (head, manifest) = data.split_at(HEADER_LEN);
        let mut head = head.to_vec();
        // Mostly a header a receiver would consider: the right magic, version and table.
        head[0..4].copy_from_slice(b"DCST");
        head[4..6].copy_from_slice(&2u16.to_le_bytes());
        head[16..24].copy_from_slice(&0xabcu64.to_le_bytes());
        if let Ok(h) = decode_header(&head, &table) {
            let need = h.sections_start() as usize - HEADER_LEN;
            if let Ok(stage) = decode_stage(h, &manifest[..need.min(manifest.len())], &table) {
                let slots = stage.slots();
                assert!(slots.end <= table.num_slots);
                for e in &stage.entries {
                    assert!(slots.contains(&(e.slot as usize)));
                    let (numel, _) = table.slots[e.slot as usize];
                    assert!(e.start + e.range <= numel);
                    assert!(e.pos_offset >= stage.sections_start());
                    assert!(e.val_offset + e.val_len <= stage.header.body_end());
                }
            }
        }
    }
    // The capture side, fed the same bytes as parts of a few sizes.
    let mut assembler = FrameAssembler::new();
    let mut rest = data;
    for cut in [HEADER_LEN, 88, 24, 8, usize::MAX] {
        let (part, tail) = rest.split_at(cut.min(rest.len()));
        if assembler.push(part).is_err() {
            break;
        }
        rest = tail;
    }
    let _ = device_parts(&[data]);
});
