//! The GPU apply kernels against the CPU receiver, bit for bit: plain and journaled
//! scatters (undone to the previous bytes), and refusals of bad chunks that write nothing.
//!
//! Built without the `cuda` feature, every test is `ignored` with its reason; built with
//! it, a missing GPU fails the test (`scripts/gpu-tests.sh`).

mod kernel_cases;

use deltacast::codec::{PosCodec, ValCodec};
use deltacast::digest::{change, digest_range, slot_salt};
use deltacast::dtype::load_bits;
use deltacast::wire::parse_frame;
use deltacast::{CodecChoice, DType, FlushConfig, Receiver, Sender, SlotInfo, SlotTable};
use deltacast_cuda::{ApplyInput, ApplyPositions, ApplyValues, CudaError, DeviceBuffer, Gpu};
use deltacast_testkit::Rng;
use kernel_cases::*;

fn table() -> SlotTable {
    SlotTable::new(vec![
        SlotInfo::new("a.bf16", DType::BF16, vec![300, 517]),
        SlotInfo::new("b.f32", DType::F32, vec![12_345]),
        SlotInfo::new("c.f8", DType::F8E4M3, vec![3, 7, 11]),
        SlotInfo::new("d.f16", DType::F16, vec![1]),
        SlotInfo::new("e.bf16", DType::BF16, vec![1 << 18]),
    ])
    .unwrap()
}

/// One sync's frames on the GPU: the frames copied to the device (kept alive by the
/// returned buffers), their chunks, the digests they announce, and whether it is a seed.
struct DeviceSync {
    _frames: Vec<DeviceBuffer>,
    chunks: Vec<ApplyInput>,
    expected: Vec<u64>,
    seed: bool,
}

fn device_sync(
    gpu: &Gpu,
    table: &SlotTable,
    slots: &[DeviceBuffer],
    frames: &[Vec<u8>],
) -> DeviceSync {
    let mut dev_frames = Vec::new();
    let mut chunks = Vec::new();
    let mut expected = vec![None; table.len()];
    let mut seed = false;
    for f in frames {
        let frame = parse_frame(f).expect("a valid frame");
        seed = frame.header.kind == deltacast::wire::FrameKind::Seed;
        let dev = gpu.upload(f).unwrap();
        for e in &frame.entries {
            let values = match e.val_codec {
                ValCodec::Raw => ApplyValues::Raw,
                ValCodec::Escaped => ApplyValues::Escaped,
                other => panic!("no GPU apply of {other:?} values"),
            };
            let s = &table.slots()[e.slot as usize];
            chunks.push(ApplyInput {
                dst: slots[e.slot as usize].ptr(),
                slot_numel: s.numel(),
                width: s.dtype.width(),
                slot: e.slot,
                start: e.start,
                range: e.range,
                count: e.count,
                positions: ApplyPositions::from_pos_codec(e.pos_codec).expect("GPU codec"),
                pos_section: dev.ptr() + e.pos_offset,
                pos_len: e.pos_len,
                val_section: dev.ptr() + e.val_offset,
                val_len: e.val_len,
                values,
            });
        }
        for d in &frame.digests {
            expected[d.slot as usize] = Some(d.new);
        }
        dev_frames.push(dev);
    }
    DeviceSync {
        _frames: dev_frames,
        chunks,
        expected: expected.into_iter().map(|d| d.expect("digest")).collect(),
        seed,
    }
}

/// Applies one sync's frames on the GPU (frames copied to the device, chunks decoded there).
fn gpu_apply(
    gpu: &Gpu,
    table: &SlotTable,
    slots: &[DeviceBuffer],
    frames: &[Vec<u8>],
    held: &[u64],
) -> deltacast_cuda::Result<Vec<u64>> {
    let sync = device_sync(gpu, table, slots, frames);
    // SAFETY: chunk pointers are inside the uploaded frames and slots.
    unsafe { gpu.apply_verified(&sync.chunks, sync.seed, held, &sync.expected) }
}

/// The CPU side of the apply tests: a core sender and receiver over `table()` with random
/// contents, and zeroed device slots for the GPU's copy of the receiver's state.
struct ApplyRig {
    table: SlotTable,
    sender: Sender,
    receiver: Receiver,
    current: Vec<Vec<u8>>,
    slots: Vec<DeviceBuffer>,
    digests: Vec<u64>,
    rng: Rng,
}

impl ApplyRig {
    fn new(gpu: &Gpu, pos: PosCodec, chunk_elems: u64, seed: u64) -> ApplyRig {
        let mut rng = Rng(seed);
        let table = table();
        let config = FlushConfig {
            bucket_size: 64 << 10,
            chunk_elems,
            codec: CodecChoice::Fixed(
                pos,
                if pos == PosCodec::Steps {
                    ValCodec::Escaped
                } else {
                    ValCodec::Raw
                },
            ),
        };
        let current = table
            .slots()
            .iter()
            .map(|s| fill_old(&mut rng, s.numel() as usize, s.dtype.width()))
            .collect();
        let slots = table
            .slots()
            .iter()
            .map(|s| gpu.alloc_zeroed(s.nbytes() as usize).unwrap())
            .collect();
        ApplyRig {
            sender: Sender::new(table.clone(), config).unwrap(),
            receiver: Receiver::new(table.clone()),
            digests: vec![0; table.len()],
            table,
            current,
            slots,
            rng,
        }
    }

    /// The next sync's frames, applied by the CPU receiver too.
    fn frames(&mut self) -> Vec<Vec<u8>> {
        let mut frames = Vec::new();
        let refs: Vec<&[u8]> = self.current.iter().map(Vec::as_slice).collect();
        self.sender
            .sync(&refs, |f| {
                frames.push(f);
                Ok(())
            })
            .unwrap();
        for f in &frames {
            self.receiver.receive(f).unwrap();
        }
        frames
    }

    /// Asserts the GPU slots hold `want` (one byte vector per slot).
    fn assert_slots(&self, gpu: &Gpu, want: &[Vec<u8>], what: &str) {
        for (id, s) in self.slots.iter().enumerate() {
            assert_eq!(dl(gpu, s.ptr(), s.len()), want[id], "{what} slot {id}");
        }
    }

    /// Changes `density` of every slot's elements.
    fn mutate(&mut self, density: f64) {
        for (c, s) in self.current.iter_mut().zip(self.table.slots()) {
            *c = mutate(&mut self.rng, c, s.dtype.width(), density);
        }
    }
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn journaled_apply_matches_the_receiver_and_undoes_to_the_previous_bytes() {
    // Each delta applied with a journal, then undone (the bytes must be the previous
    // version's again, byte for byte), then applied again (the receiver's bytes).
    let gpu = gpu();
    for (pos, chunk_elems) in [
        (PosCodec::Abs32, 1000u64),
        (PosCodec::Bitmap, 777),
        (PosCodec::Steps, 999),
    ] {
        let mut rig = ApplyRig::new(&gpu, pos, chunk_elems, 60 + chunk_elems);
        for step in 0..6 {
            let before: Vec<Vec<u8>> = rig.receiver.store().to_vec();
            let frames = rig.frames();
            let sync = device_sync(&gpu, &rig.table, &rig.slots, &frames);
            let what = format!("{pos:?} step {step}");
            if sync.seed {
                // SAFETY: chunk pointers are inside the uploaded frames and slots.
                rig.digests =
                    unsafe { gpu.apply_verified(&sync.chunks, true, &rig.digests, &sync.expected) }
                        .unwrap();
            } else {
                let (_, len) = deltacast_cuda::journal_layout(&sync.chunks);
                let journal = gpu.alloc(len.max(4) as usize).unwrap();
                for round in 0..2 {
                    // SAFETY: as above; the journal is sized by its layout.
                    let got = unsafe {
                        gpu.apply_verified_journaled(
                            &sync.chunks,
                            &rig.digests,
                            &sync.expected,
                            journal.ptr(),
                        )
                    }
                    .unwrap_or_else(|e| panic!("{what}: {e}"));
                    assert_eq!(got, rig.receiver.digests(), "{what}");
                    if round == 0 {
                        // SAFETY: the same chunks and the journal their scatter filled.
                        unsafe { gpu.apply_undo(&sync.chunks, journal.ptr()) }.unwrap();
                        rig.assert_slots(&gpu, &before, &format!("{what}: undo"));
                    } else {
                        rig.digests = got;
                    }
                }
            }
            rig.assert_slots(&gpu, rig.receiver.store(), &what);
            rig.mutate([0.01, 0.3, 0.0005, 1.0, 0.05, 0.0][step % 6]);
        }
    }
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn apply_matches_the_receiver() {
    let gpu = gpu();
    for (pos, chunk_elems) in [
        (PosCodec::Abs32, 1000u64),
        (PosCodec::Bitmap, 777),
        (PosCodec::Abs32, 1 << 20),
        (PosCodec::Bitmap, 1 << 16),
        (PosCodec::Steps, 4099),
        (PosCodec::Steps, 1 << 18),
    ] {
        let mut rig = ApplyRig::new(&gpu, pos, chunk_elems, 6 + chunk_elems);
        for step in 0..5 {
            let frames = rig.frames();
            let what = format!("{pos:?} step {step}");
            rig.digests = gpu_apply(&gpu, &rig.table, &rig.slots, &frames, &rig.digests)
                .unwrap_or_else(|e| panic!("{what}: {e}"));
            assert_eq!(rig.digests, rig.receiver.digests(), "{what}");
            rig.assert_slots(&gpu, rig.receiver.store(), &what);
            rig.mutate([0.01, 0.3, 0.0005, 1.0][step % 4]);
        }
    }
}

#[test]
#[cfg_attr(not(feature = "cuda"), ignore = "needs the cuda feature and a GPU")]
fn apply_refuses_bad_chunks_and_writes_nothing() {
    let gpu = gpu();
    let table = SlotTable::new(vec![SlotInfo::new("w", DType::BF16, vec![10_000])]).unwrap();
    let slot = gpu.upload(&vec![0u8; 20_000]).unwrap();
    let held = {
        let zeros = vec![0u8; 20_000];
        digest_range(0, 2, &zeros, 0)
    };
    let mk = |pos: ApplyPositions,
              sec: &DeviceBuffer,
              pos_len: u64,
              vals: &DeviceBuffer,
              count: u64,
              range: u64| ApplyInput {
        dst: slot.ptr(),
        slot_numel: 10_000,
        width: 2,
        slot: 0,
        start: 100,
        range,
        count,
        positions: pos,
        pos_section: sec.ptr(),
        pos_len,
        val_section: vals.ptr(),
        val_len: count * 2,
        values: ApplyValues::Raw,
    };
    let vals = gpu.upload(&[1, 0, 2, 0, 3, 0]).unwrap();
    let abs = |p: [u32; 3]| {
        gpu.upload(&p.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>())
            .unwrap()
    };
    let cases: Vec<(DeviceBuffer, ApplyPositions, u64, &str)> = vec![
        (abs([1, 5, 50]), ApplyPositions::Abs32, 12, "position lies"),
        (
            abs([5, 5, 9]),
            ApplyPositions::Abs32,
            12,
            "strictly increasing",
        ),
        (
            abs([9, 5, 20]),
            ApplyPositions::Abs32,
            12,
            "strictly increasing",
        ),
        // bitmap of range 50 with 4 bits set for a count of 3
        (
            gpu.upload(&[0b1011, 0, 0, 0, 0, 0, 0b10, 0]).unwrap(),
            ApplyPositions::Bitmap,
            7,
            "count",
        ),
        // a stray bit past the range (bit 50 = byte 6, bit 2)
        (
            gpu.upload(&[0b11, 0, 0, 0, 0, 0, 0b100, 0]).unwrap(),
            ApplyPositions::Bitmap,
            7,
            "at or past",
        ),
    ];
    for (sec, codec, pos_len, why) in &cases {
        let chunk = mk(*codec, sec, *pos_len, &vals, 3, 50);
        // SAFETY: inside the buffers above.
        let err = unsafe { gpu.apply_verified(&[chunk], false, &[held], &[0]) }.unwrap_err();
        match err {
            CudaError::BadChunk { chunk: 0, reason } => {
                assert!(reason.contains(why), "{reason} / {why}")
            }
            e => panic!("{why}: {e}"),
        }
        assert_eq!(
            dl(&gpu, slot.ptr(), 20_000),
            vec![0u8; 20_000],
            "{why}: nothing written"
        );
    }
    // Unchanged element (value 0 onto 0), alone and between two real changes: refused, and
    // the real changes are not written either.
    let zeros = gpu.upload(&[0u8; 6]).unwrap();
    let good = abs([1, 5, 9]);
    let chunk = mk(ApplyPositions::Abs32, &good, 12, &zeros, 3, 50);
    // SAFETY: as above.
    let err = unsafe { gpu.apply_verified(&[chunk], false, &[held], &[0]) }.unwrap_err();
    assert!(matches!(err, CudaError::BadChunk { .. }), "{err}");
    let one_noop = gpu.upload(&[7, 0, 0, 0, 9, 0]).unwrap();
    let chunk = mk(ApplyPositions::Abs32, &good, 12, &one_noop, 3, 50);
    // SAFETY: as above.
    let err = unsafe { gpu.apply_verified(&[chunk], false, &[held], &[0]) }.unwrap_err();
    match err {
        CudaError::BadChunk { chunk: 0, reason } => assert!(reason.contains("already"), "{reason}"),
        e => panic!("no-op change: {e}"),
    }
    assert_eq!(
        dl(&gpu, slot.ptr(), 20_000),
        vec![0u8; 20_000],
        "no-op change: nothing written"
    );
    // Steps chunks (range 50: a 13-byte map, element e's code at byte e / 4, bits 2(e % 4)):
    // a code past the range, more codes than the count, escapes the section does not hold,
    // an escape onto the bits held. Each refused by name, nothing written.
    let steps = |map: [u8; 13], escapes: &[u8], count: u64| {
        let sec = gpu.upload(&map).unwrap();
        let val = gpu.upload(&[escapes, &[0u8; 8]].concat()).unwrap();
        let chunk = ApplyInput {
            positions: ApplyPositions::Steps,
            pos_section: sec.ptr(),
            pos_len: 13,
            val_section: val.ptr(),
            val_len: escapes.len() as u64,
            values: ApplyValues::Escaped,
            ..mk(ApplyPositions::Abs32, &good, 12, &vals, count, 50)
        };
        (chunk, sec, val)
    };
    let mut past = [0u8; 13];
    past[0] = 0b01_01_01;
    past[12] = 0b01_0000; // element 50
    let mut four = [0u8; 13];
    four[0] = 0b01_01_01_01;
    let mut esc = [0u8; 13];
    esc[0] = 0b01_01_11;
    for (map, escapes, why) in [
        (past, &[][..], "at or past"),
        (four, &[][..], "count"),
        (esc, &[][..], "escapes differ"),
        (esc, &[5, 0, 6, 0][..], "escapes differ"),
        (esc, &[0, 0][..], "already"),
    ] {
        let (chunk, _sec, _val) = steps(map, escapes, 3);
        // SAFETY: inside the buffers above (the map's 13 bytes, the escapes and padding).
        let err = unsafe { gpu.apply_verified(&[chunk], false, &[held], &[0]) };
        match err {
            Err(CudaError::BadChunk { chunk: 0, reason }) => {
                assert!(reason.contains(why), "{reason} / {why}")
            }
            Err(CudaError::InvalidArgument(reason)) if why == "escapes differ" => {
                assert!(!reason.is_empty())
            }
            other => panic!("steps {why}: {other:?}"),
        }
        assert_eq!(
            dl(&gpu, slot.ptr(), 20_000),
            vec![0u8; 20_000],
            "steps {why}: nothing written"
        );
    }
    // A good steps chunk: +1 step at 101 (+0 → the least subnormal), −1 step at 102 (+0 →
    // −0, its neighbour below in the ordered view), escape 0x4000 at 104.
    let mut map = [0u8; 13];
    map[0] = 0b10_01_00;
    map[1] = 0b11;
    let (chunk, _sec, _val) = steps(map, &[0x00, 0x40], 3);
    let salt = slot_salt(0);
    let want = [(101u64, 1u32), (102, 0x8000), (104, 0x4000)]
        .iter()
        .fold(held, |d, &(i, v)| d.wrapping_add(change(salt, i, 0, v)));
    // SAFETY: as above.
    let got = unsafe { gpu.apply_verified(&[chunk], false, &[held], &[want]) }.unwrap();
    assert_eq!(got, vec![want]);
    let after = dl(&gpu, slot.ptr(), 20_000);
    assert_eq!(
        [101, 102, 103, 104].map(|i| load_bits(&after, 2, i)),
        [1, 0x8000, 0, 0x4000]
    );
    // SAFETY: the slot's 20 000 bytes, zeroed again for the cases below.
    unsafe { gpu.memset(slot.ptr(), 0, 20_000) }.unwrap();
    // Header-level refusals, before any launch.
    let chunk = mk(ApplyPositions::Abs32, &good, 8, &vals, 3, 50);
    // SAFETY: as above.
    assert!(unsafe { gpu.apply_check(&[chunk], false, 1) }.is_err());
    let mut far = mk(ApplyPositions::Abs32, &good, 12, &vals, 3, 50);
    far.start = 9_990;
    // SAFETY: as above.
    assert!(unsafe { gpu.apply_check(&[far], false, 1) }.is_err());
    // A good chunk with the wrong expected digest: refused, nothing written.
    let chunk = mk(ApplyPositions::Abs32, &good, 12, &vals, 3, 50);
    // SAFETY: as above.
    let err = unsafe { gpu.apply_verified(&[chunk], false, &[held], &[12345]) }.unwrap_err();
    assert!(matches!(err, CudaError::DigestMismatch { .. }), "{err}");
    assert_eq!(dl(&gpu, slot.ptr(), 20_000), vec![0u8; 20_000]);
    // And with the right one: applied.
    let salt = slot_salt(0);
    let want = [(101u64, 1u32), (105, 2), (109, 3)]
        .iter()
        .fold(held, |d, &(i, v)| d.wrapping_add(change(salt, i, 0, v)));
    // SAFETY: as above.
    let got = unsafe { gpu.apply_verified(&[chunk], false, &[held], &[want]) }.unwrap();
    assert_eq!(got, vec![want]);
    let after = dl(&gpu, slot.ptr(), 20_000);
    assert_eq!(load_bits(&after, 2, 101), 1);
    assert_eq!(load_bits(&after, 2, 109), 3);
    let _ = table;
}
