//! Inputs found by the fuzz targets in fuzz/, or while writing them, kept as plain tests: each
//! is fed to the decoder or receiver it broke and must be an error, never a panic, a huge
//! allocation or a half-applied sync.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;

use deltacast::codec::{PosCodec, ValCodec};
use deltacast::wire::{FrameWriter, SlotDigest};
use deltacast::{DType, Error, FrameKind, Receiver, SlotInfo, SlotTable};

/// Records the largest single allocation, so a test can bound what one frame makes the
/// receiver allocate.
struct PeakAlloc;

static LARGEST: AtomicUsize = AtomicUsize::new(0);
/// Receives (and so allocation measurements) run one at a time.
static MEASURE: Mutex<()> = Mutex::new(());

unsafe impl GlobalAlloc for PeakAlloc {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        LARGEST.fetch_max(layout.size(), Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        LARGEST.fetch_max(new_size, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: PeakAlloc = PeakAlloc;

/// Receives `frame` and asserts it is refused with the receiver exactly as it was. Returns the
/// error and the largest single allocation made while receiving.
fn assert_refused(r: &mut Receiver, frame: &[u8]) -> (Error, usize) {
    let before = (r.store().clone(), r.version(), r.digests().to_vec());
    let _one_at_a_time = MEASURE.lock().unwrap_or_else(|e| e.into_inner());
    LARGEST.store(0, Ordering::Relaxed);
    let err = r.receive(frame).expect_err("hostile frame accepted");
    let largest = LARGEST.load(Ordering::Relaxed);
    assert_eq!(r.store(), &before.0, "store changed by a refused frame");
    assert_eq!(r.version(), before.1);
    assert_eq!(r.digests(), &before.2[..]);
    assert!(!r.is_staging());
    (err, largest)
}

/// A chunk that claims every element of a large range (`all` positions, or `holes` with no
/// holes: zero position bytes either way) but carries no values must be refused before the
/// receiver materializes `count` positions: a frame of a few hundred bytes made it allocate
/// 4 bytes per element of the range (up to 16 GiB per chunk, once per chunk of the frame).
/// Found while writing the `apply` target (its slots are too small for libFuzzer's RSS limit).
#[test]
fn dense_chunk_without_values_is_refused_before_allocating_positions() {
    const N: u64 = 1 << 24;
    let table = SlotTable::new(vec![SlotInfo::new("big", DType::F8E4M3, vec![N])]).unwrap();
    let mut r = Receiver::with_state(table.clone(), vec![vec![0u8; N as usize]], Some(1)).unwrap();
    for (kind, pos, val, val_bytes) in [
        (FrameKind::Delta, PosCodec::All, ValCodec::Raw, &[][..]),
        (FrameKind::Delta, PosCodec::Holes, ValCodec::Raw, &[][..]),
        (
            FrameKind::Delta,
            PosCodec::All,
            ValCodec::Ulp,
            &[0u8; 8][..],
        ),
        (
            FrameKind::Delta,
            PosCodec::Holes,
            ValCodec::Ulp,
            &[0u8; 8][..],
        ),
        // A dense frame covering the slot exactly, with no value bytes.
        (FrameKind::Dense, PosCodec::All, ValCodec::Raw, &[][..]),
    ] {
        let mut w = FrameWriter::new(kind, 2, table.hash(), 0);
        w.push_chunk(0, pos, val, 0, N, N, &[], val_bytes);
        w.push_digest(SlotDigest {
            slot: 0,
            base: r.digests()[0],
            new: 0,
        });
        let frame = w.finish(true);
        let (err, largest) = assert_refused(&mut r, &frame);
        assert!(
            largest < 1 << 20,
            "{kind:?} {pos:?}+{val:?}: refusing a {} byte frame allocated {largest} bytes at once ({err})",
            frame.len()
        );
        assert!(matches!(err, Error::Codec { .. }), "{err}");
    }
}

fn small_table() -> SlotTable {
    SlotTable::new(vec![
        SlotInfo::new("w", DType::BF16, vec![2, 3]),
        SlotInfo::new("b", DType::F32, vec![2]),
    ])
    .unwrap()
}

/// A one-frame sync of `kind` carrying `chunks` (slot, all positions, raw values) and digests.
fn sync_frame(
    table: &SlotTable,
    kind: FrameKind,
    version: u64,
    chunks: &[(u32, &[u8])],
    digests: &[(u64, u64)],
) -> Vec<u8> {
    let mut w = FrameWriter::new(kind, version, table.hash(), 0);
    for &(slot, values) in chunks {
        let width = table.slots()[slot as usize].dtype.width();
        let n = (values.len() / width) as u64;
        w.push_chunk(slot, PosCodec::All, ValCodec::Raw, 0, n, n, &[], values);
    }
    for (slot, &(base, new)) in digests.iter().enumerate() {
        w.push_digest(SlotDigest {
            slot: slot as u32,
            base,
            new,
        });
    }
    w.finish(true)
}

/// fuzz/apply found it: a seed may bring a receiver to version u64::MAX, and the next delta's
/// expected version `current + 1` overflowed (a panic with overflow checks, a wrap to 0
/// without). No version follows the last one: the delta is refused.
#[test]
fn delta_after_the_last_version_is_refused() {
    let table = small_table();
    let seed: [&[u8]; 2] = [
        &[1, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0],
        &[1, 2, 3, 4, 5, 6, 7, 8],
    ];
    let digests: Vec<u64> = (0..2)
        .map(|id| deltacast::digest::digest_slot(id, [2, 4][id as usize], seed[id as usize]))
        .collect();
    let mut r = Receiver::new(table.clone());
    let frame = sync_frame(
        &table,
        FrameKind::Seed,
        u64::MAX,
        &[(0, seed[0]), (1, seed[1])],
        &[(0, digests[0]), (1, digests[1])],
    );
    r.receive(&frame).unwrap().unwrap();
    assert_eq!(r.version(), Some(u64::MAX));
    // Any delta: it is refused on its version before anything else is looked at.
    for version in [0, 1, u64::MAX] {
        let next: [&[u8]; 2] = [&[9, 0, 2, 0, 3, 0, 4, 0, 5, 0, 6, 0], seed[1]];
        let frame = sync_frame(
            &table,
            FrameKind::Delta,
            version,
            &[(0, next[0])],
            &[(0, 0), (1, 0)],
        );
        let (err, _) = assert_refused(&mut r, &frame);
        assert!(matches!(err, Error::VersionMismatch { .. }), "{err}");
    }
    // A verify at that version still works.
    let frame = sync_frame(
        &table,
        FrameKind::Verify,
        u64::MAX,
        &[],
        &[(digests[0], digests[0]), (digests[1], digests[1])],
    );
    r.receive(&frame).unwrap().unwrap();
}
