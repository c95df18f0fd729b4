//! A GPU sender's buffers for one stage in flight: the diff's output, the packed sections,
//! the header and manifest, and the event that says when its broadcasts are done.

use std::ops::Range;
use std::sync::Arc;

use super::{GpuTensor, Growable};
use crate::error::Result;
use crate::protocol::HEADER_BYTES;
use crate::{map_layout, DeviceBuffer, DiffInput, Gpu, GpuEvent, MapCode, DECODE_SLACK};

/// One set of a sender's delta buffers. A stage uses a set from its diff until its
/// broadcasts complete; with two sets the next stage's diff writes the other while they run.
pub(super) struct StageSet {
    /// The diff's output: u64 positions, new bits, and old bits (entropy codecs only); a
    /// map diff's maps in `positions` and its escapes in `values`.
    pub(super) positions: DeviceBuffer,
    pub(super) values: DeviceBuffer,
    pub(super) old_values: Option<DeviceBuffer>,
    pub(super) packed: Growable,
    /// The value sections, packed (entropy codecs; otherwise `values` is sent as it is).
    pub(super) packed_values: Growable,
    pub(super) header: DeviceBuffer,
    pub(super) manifest: Growable,
    /// Recorded on the NCCL stream after this set's last broadcast (shared with the diff
    /// thread, whose stream waits for it).
    pub(super) sent: Arc<GpuEvent>,
    pub(super) in_flight: bool,
}

impl StageSet {
    pub(super) fn new(gpu: &Gpu, capacity: u64, max_width: u64, entropy: bool) -> Result<StageSet> {
        // (The entropy coder reads its inputs 16 bytes at a time: DECODE_SLACK past the end
        // keeps those reads inside the buffers.)
        let value_bytes = ((capacity * max_width).next_multiple_of(8) + DECODE_SLACK) as usize;
        Ok(StageSet {
            positions: gpu.alloc((capacity * 8 + DECODE_SLACK) as usize)?,
            values: gpu.alloc(value_bytes)?,
            old_values: if entropy {
                Some(gpu.alloc(value_bytes)?)
            } else {
                None
            },
            packed: Growable::new(),
            packed_values: Growable::new(),
            header: gpu.alloc(HEADER_BYTES)?,
            manifest: Growable::new(),
            sent: Arc::new(gpu.new_event()?),
            in_flight: false,
        })
    }

    pub(super) fn bytes(&self) -> u64 {
        (self.positions.len() + self.values.len() + self.header.len()) as u64
            + self.old_values.as_ref().map_or(0, |b| b.len() as u64)
            + self.packed.len()
            + self.packed_values.len()
            + self.manifest.len()
    }

    /// Whether the position buffer holds the steps maps of every stage (so that the map
    /// diffs may write there: a bitmap is half a steps map).
    pub(super) fn holds_maps(&self, tensors: &[GpuTensor], stages: &[Range<usize>]) -> bool {
        stages.iter().all(|r| {
            let inputs: Vec<DiffInput> = tensors[r.clone()]
                .iter()
                .map(|t| DiffInput {
                    snapshot: 0,
                    current: 0,
                    numel: t.numel(),
                    width: t.dtype.width(),
                    first_index: 0,
                    digest: None,
                    f32_source: None,
                })
                .collect();
            map_layout(&inputs, MapCode::Steps).1 <= self.positions.len() as u64
        })
    }
}
