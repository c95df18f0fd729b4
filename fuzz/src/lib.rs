//! Pieces shared by the fuzz targets: sealing arbitrary bytes into a frame whose checksum is
//! right (so mutations reach the structural checks behind it), the fixed slot tables and states
//! the `apply` target receives into, and the check that a refused frame left a receiver as it was.

use deltacast::wire::{checksum, CHECKSUM_LEN, MAGIC, MIN_FRAME_LEN, WIRE_VERSION};
use deltacast::{DType, Receiver, SlotInfo, SlotTable, SyncOutcome};

/// Makes `bytes` a frame with the right magic, wire version, declared length and checksum;
/// everything else (kind, flags, reserved bytes, manifest, digests, sections) stays as fuzzed.
pub fn seal(bytes: &mut Vec<u8>) {
    if bytes.len() < MIN_FRAME_LEN {
        bytes.resize(MIN_FRAME_LEN, 0);
    }
    bytes[0..4].copy_from_slice(&MAGIC);
    bytes[4..6].copy_from_slice(&WIRE_VERSION.to_le_bytes());
    let len = bytes.len() as u64;
    bytes[32..40].copy_from_slice(&len.to_le_bytes());
    reseal(bytes);
}

/// Rewrites only the trailing checksum (a frame shorter than a checksum is left alone).
pub fn reseal(bytes: &mut [u8]) {
    if bytes.len() < CHECKSUM_LEN {
        return;
    }
    let end = bytes.len() - CHECKSUM_LEN;
    let sum = checksum(&bytes[..end]);
    bytes[end..].copy_from_slice(&sum.to_le_bytes());
}

/// Cuts a byte string into frames at their declared lengths (clamped to what is left), the way
/// a stream reader would, without judging them. A piece that declares no usable length takes
/// the rest.
pub fn cut_frames(mut data: &[u8]) -> Vec<&[u8]> {
    let mut out = Vec::new();
    while !data.is_empty() {
        let declared = data
            .get(32..40)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
            .unwrap_or(u64::MAX);
        let len = if (MIN_FRAME_LEN as u64..=data.len() as u64).contains(&declared) {
            declared as usize
        } else {
            data.len()
        };
        let (frame, rest) = data.split_at(len);
        out.push(frame);
        data = rest;
    }
    out
}

/// A receiver set-up the `apply` target attacks.
pub struct Scenario {
    pub table: SlotTable,
    pub store: Vec<Vec<u8>>,
    /// `None`: a fresh [`Receiver::new`] (zeroed, unseeded).
    pub version: Option<u64>,
}

impl Scenario {
    pub fn receiver(&self) -> Receiver {
        match self.version {
            None => Receiver::new(self.table.clone()),
            Some(v) => {
                Receiver::with_state(self.table.clone(), self.store.clone(), Some(v)).unwrap()
            }
        }
    }
}

/// The golden table of `seed_v1.dcast` / `delta_v2_abs32_raw.dcast`, fresh (the seed applies,
/// then the delta).
pub fn golden_small() -> Scenario {
    let table = SlotTable::new(vec![
        SlotInfo::new("w", DType::BF16, vec![2, 3]),
        SlotInfo::new("b", DType::F32, vec![2]),
    ])
    .unwrap();
    let store = table
        .slots()
        .iter()
        .map(|s| vec![0; s.nbytes() as usize])
        .collect();
    Scenario {
        table,
        store,
        version: None,
    }
}

/// The golden table and base state of `delta_v5_auto.dcast` (it applies to this state).
pub fn golden_entropy() -> Scenario {
    let table = SlotTable::new(vec![
        SlotInfo::new("m", DType::BF16, vec![64, 64]),
        SlotInfo::new("d", DType::F8E4M3, vec![300]),
    ])
    .unwrap();
    let store = vec![
        (0..4096u32)
            .flat_map(|i| (0x3c00u16 + (i % 977) as u16).to_le_bytes())
            .collect(),
        (0..300).map(|i| i as u8).collect(),
    ];
    Scenario {
        table,
        store,
        version: Some(4),
    }
}

/// Every dtype, a scalar slot and an empty slot, holding pseudo-random bits at version 7.
pub fn mixed() -> Scenario {
    let table = SlotTable::new(vec![
        SlotInfo::new("a", DType::BF16, vec![64, 50]),
        SlotInfo::new("b", DType::F32, vec![700]),
        SlotInfo::new("c", DType::F8E4M3, vec![3, 333]),
        SlotInfo::new("h", DType::F16, vec![5]),
        SlotInfo::new("s", DType::F8E5M2, vec![]),
        SlotInfo::new("z", DType::F32, vec![4, 0]),
    ])
    .unwrap();
    let mut x = 0x1234_5678_9abc_def0u64;
    let store = table
        .slots()
        .iter()
        .map(|s| {
            (0..s.nbytes())
                .map(|_| {
                    x = x
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (x >> 56) as u8
                })
                .collect()
        })
        .collect();
    Scenario {
        table,
        store,
        version: Some(7),
    }
}

/// The scenario whose table a frame names (by the table hash at bytes 16..24), else `fallback`.
pub fn scenario_for(frame: &[u8], fallback: u8) -> Scenario {
    let all = [golden_small(), golden_entropy(), mixed()];
    let hash = frame
        .get(16..24)
        .map(|b| u64::from_le_bytes(b.try_into().unwrap()));
    let pick = all
        .iter()
        .position(|s| Some(s.table.hash()) == hash)
        .unwrap_or(fallback as usize % all.len());
    all.into_iter().nth(pick).unwrap()
}

/// What a receiver held: store, version, digests.
type Held = (Vec<Vec<u8>>, Option<u64>, Vec<u64>);

fn held(r: &Receiver) -> Held {
    (r.store().clone(), r.version(), r.digests().to_vec())
}

/// Feeds frames to one receiver and checks its promises; remembers what the receiver held when
/// the sync being received started.
#[derive(Default)]
pub struct Feeder {
    start: Option<Held>,
}

impl Feeder {
    /// Feeds one frame. A frame that does not complete a sync leaves version and digests as
    /// they were, and the store too unless the receiver writes flushes as they arrive
    /// (`set_apply_as_received`); a refused frame leaves everything as it was when the sync
    /// started (what in-place flushes wrote goes back) and nothing staged; a completed sync
    /// leaves running digests that match memory; a close changes nothing. Returns the outcome.
    pub fn feed(
        &mut self,
        r: &mut Receiver,
        frame: &[u8],
    ) -> Result<Option<SyncOutcome>, deltacast::Error> {
        let before = held(r);
        if !r.is_staging() {
            self.start = Some(before.clone());
        }
        let result = r.receive(frame);
        match &result {
            Ok(Some(outcome)) if outcome.kind == deltacast::FrameKind::Close => {
                // A close between syncs: reported, nothing changes.
                assert!(r.store() == &before.0, "a close changed the store");
                assert_eq!(r.version(), before.1, "a close changed the version");
                assert_eq!(r.digests(), &before.2[..], "a close changed the digests");
                assert_eq!(outcome.version, before.1.unwrap_or(0));
                assert!(!r.is_staging());
            }
            Ok(Some(outcome)) => {
                assert_eq!(r.version(), Some(outcome.version));
                assert_eq!(outcome.state_digest, r.state_digest());
                assert!(
                    r.recompute_digests().is_empty(),
                    "applied sync left digests that do not match memory"
                );
                assert!(!r.is_staging());
                if outcome.kind == deltacast::FrameKind::Verify {
                    assert_eq!(r.store(), &before.0, "a verify sync changed the store");
                    assert_eq!(r.digests(), &before.2[..]);
                }
            }
            Ok(None) => {
                if !r.applies_as_received() {
                    assert!(r.store() == &before.0, "store changed mid-sync");
                }
                assert_eq!(r.version(), before.1, "version changed mid-sync");
                assert_eq!(r.digests(), &before.2[..], "digests changed mid-sync");
            }
            Err(_) => {
                let start = self.start.as_ref().unwrap_or(&before);
                assert!(r.store() == &start.0, "store changed: {result:?}");
                assert_eq!(r.version(), start.1, "version changed: {result:?}");
                assert_eq!(r.digests(), &start.2[..], "digests changed: {result:?}");
                assert!(!r.is_staging(), "an error left a sync staged");
            }
        }
        result
    }
}
