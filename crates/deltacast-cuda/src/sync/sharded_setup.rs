//! A sharded trainer rank's set-up, before its first sync: its own checks of its arguments,
//! and the agreements every rank takes part in whatever its own checks said (slot table and
//! stage sizes, shard layout), so that all ranks fail alike and at once; then the buffers.

use std::ops::Range;

use deltacast::plan::plan_stages;
use deltacast::{DType, SlotInfo, SlotTable};

use super::settings::Snapshot;
use super::{u64s, EntropyMode, GpuSenderConfig, Growable};
use crate::error::{CudaError, Result};
use crate::link::Link;
use crate::protocol::{check_shard_runs, HEADER_BYTES, MAX_TRAINER_RANKS};
use crate::{DeviceBuffer, DevicePtr, Gpu, DECODE_SLACK};

/// The trainer rank that gathers and sends.
pub(super) const LEADER: usize = 0;

/// One trainer rank's shard of a slot, by device pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GpuShard {
    pub name: String,
    pub dtype: DType,
    /// The whole slot's shape, as receivers hold it.
    pub shape: Vec<u64>,
    /// Slot index of the shard's first element.
    pub first_index: u64,
    /// Elements of the shard (0: this rank holds none of the slot).
    pub numel: u64,
    /// Device address of its first element (contiguous, aligned to the element width).
    pub ptr: DevicePtr,
}

impl GpuShard {
    pub(super) fn nbytes(&self) -> u64 {
        self.numel * self.dtype.width() as u64
    }
}

/// This rank's own checks of its arguments; the slot table they make.
pub(super) fn check_shards(
    trainers: &Link,
    receivers: &Option<Link>,
    shards: &[GpuShard],
    config: &GpuSenderConfig,
) -> Result<SlotTable> {
    config.check()?;
    if let Link::Frames(_) = trainers {
        return Err(CudaError::InvalidArgument(
            "trainer ranks reach each other over NCCL or the CUDA-IPC link, not a frame link"
                .into(),
        ));
    }
    if trainers.nranks() as u64 > MAX_TRAINER_RANKS {
        return Err(CudaError::InvalidArgument(format!(
            "{} trainer ranks: the GPU protocol allows at most {MAX_TRAINER_RANKS}",
            trainers.nranks()
        )));
    }
    match (receivers, trainers.rank() == LEADER) {
        (Some(r), true) if r.rank() == config.root => {}
        (Some(r), true) => {
            return Err(CudaError::InvalidArgument(format!(
                "the leader is rank {} of the receivers' communicator, the root is {}",
                r.rank(),
                config.root
            )))
        }
        (None, true) => {
            return Err(CudaError::InvalidArgument(
                "the leader (trainer rank 0) needs the receivers' communicator".into(),
            ))
        }
        (Some(_), false) => {
            return Err(CudaError::InvalidArgument(format!(
                "trainer rank {} is not the leader: only rank 0 talks to the receivers",
                trainers.rank()
            )))
        }
        (None, false) => {}
    }
    for s in shards {
        super::refuse_non_float(&s.name, s.dtype)?;
        let w = s.dtype.width() as u64;
        let Some(slot_numel) = s.shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d)) else {
            return Err(CudaError::InvalidArgument(format!(
                "the shape of `{}` overflows",
                s.name
            )));
        };
        if s.first_index
            .checked_add(s.numel)
            .is_none_or(|e| e > slot_numel)
        {
            return Err(CudaError::InvalidArgument(format!(
                "shard of `{}` ({} elements from {}) lies beyond its slot of {slot_numel}",
                s.name, s.numel, s.first_index
            )));
        }
        if s.numel > 0 && s.ptr % w != 0 {
            return Err(CudaError::InvalidArgument(format!(
                "shard of `{}` is not aligned to its element width",
                s.name
            )));
        }
    }
    SlotTable::new(
        shards
            .iter()
            .map(|s| SlotInfo::new(s.name.clone(), s.dtype, s.shape.clone()))
            .collect(),
    )
    .map_err(|e| CudaError::InvalidArgument(e.to_string()))
}

/// All-gathers `row` (the same length on every rank) over `comm`; returns every rank's
/// row, in rank order.
pub(super) fn all_gather_rows(
    gpu: &Gpu,
    comm: &mut Link,
    rows: &mut RowBuffers,
    row: &[u64],
    timeout: std::time::Duration,
    what: &'static str,
) -> Result<Vec<Vec<u64>>> {
    let world = comm.nranks();
    if row.is_empty() {
        return Ok(vec![Vec::new(); world]);
    }
    let len = (row.len() * 8) as u64;
    let mine = rows.mine.at_least(gpu, len)?;
    let all = rows.all.at_least(gpu, len * world as u64)?;
    let bytes: Vec<u8> = row.iter().flat_map(|w| w.to_le_bytes()).collect();
    // SAFETY: our buffers, sized above; the copy synchronises the stream.
    unsafe {
        gpu.copy_to_device(mine, &bytes)?;
        comm.all_gather_u64(mine, all, row.len(), gpu.stream_handle())?;
    }
    let done = gpu.record_done()?;
    comm.wait(done, timeout, what)?;
    // SAFETY: written by the all-gather that completed.
    let got = u64s(&unsafe { gpu.download(all, (len * world as u64) as usize)? });
    Ok(got.chunks(row.len()).map(<[u64]>::to_vec).collect())
}

/// The buffers of the small all-gathers.
#[derive(Default)]
pub(super) struct RowBuffers {
    pub(super) mine: Growable,
    pub(super) all: Growable,
}

/// The constructor's first exchange: every rank's table hash, slot count, stage size and
/// whether its own checks passed (`local`). Returns the table when every rank agrees.
pub(super) fn agree_on_heads(
    gpu: &Gpu,
    trainers: &mut Link,
    rows: &mut RowBuffers,
    local: Result<(SlotTable, u64)>,
    timeout: std::time::Duration,
) -> Result<SlotTable> {
    let head = match &local {
        Ok((t, stage_bytes)) => [1, t.hash(), t.len() as u64, *stage_bytes],
        Err(_) => [0; 4],
    };
    let heads = all_gather_rows(gpu, trainers, rows, &head, timeout, "the slot tables")?;
    let (table, _) = local?;
    let refused: Vec<usize> = (0..heads.len()).filter(|&r| heads[r][0] != 1).collect();
    if !refused.is_empty() {
        return Err(CudaError::InvalidArgument(format!(
            "trainer rank(s) {refused:?} refused their shards, communicators or settings"
        )));
    }
    if heads.iter().any(|h| h[1..] != head[1..]) {
        return Err(CudaError::InvalidArgument(format!(
            "trainer ranks differ in slot table or stage size (ok, hash, slots, stage bytes \
             per rank: {heads:?})"
        )));
    }
    Ok(table)
}

/// The constructor's second exchange, after the tables were found equal: every rank's shard
/// ranges; checks that each slot's shards follow each other in rank order and cover it
/// exactly, and returns them per slot (`[slot][rank]`: first element, elements).
pub(super) fn agree_on_layout(
    gpu: &Gpu,
    trainers: &mut Link,
    rows: &mut RowBuffers,
    shards: &[GpuShard],
    table: &SlotTable,
    config: &GpuSenderConfig,
) -> Result<Vec<Vec<(u64, u64)>>> {
    let world = trainers.nranks();
    let row: Vec<u64> = shards
        .iter()
        .flat_map(|s| [s.first_index, s.numel])
        .collect();
    let all = all_gather_rows(
        gpu,
        trainers,
        rows,
        &row,
        config.timeout,
        "the shard layout",
    )?;
    let mut layout = Vec::with_capacity(shards.len());
    for (i, slot) in table.slots().iter().enumerate() {
        let runs: Vec<(u64, u64)> = (0..world)
            .map(|r| (all[r][2 * i], all[r][2 * i + 1]))
            .collect();
        check_shard_runs(&slot.name, slot.numel(), &runs)?;
        layout.push(runs);
    }
    Ok(layout)
}

/// A trainer rank's device and pinned buffers, allocated before the last exchange of the
/// constructor (so that a rank short of memory fails with the others).
pub(super) struct Buffers {
    pub(super) snapshots: Vec<Snapshot>,
    pub(super) positions: DeviceBuffer,
    pub(super) values: DeviceBuffer,
    pub(super) old_values: Option<DeviceBuffer>,
    pub(super) header: DeviceBuffer,
    pub(super) status: DeviceBuffer,
    pub(super) digests_dev: DeviceBuffer,
    pub(super) capacity: u64,
    pub(super) stages: Vec<Range<usize>>,
}

impl Buffers {
    pub(super) fn allocate(
        gpu: &Gpu,
        shards: &[GpuShard],
        table: &SlotTable,
        config: &GpuSenderConfig,
    ) -> Result<Buffers> {
        let max_width = shards.iter().map(|s| s.dtype.width()).max().unwrap_or(1) as u64;
        let slot_bytes: Vec<u64> = table.slots().iter().map(|s| s.nbytes()).collect();
        let stages = plan_stages(&slot_bytes, config.stage_bytes);
        let stage_elems = stages
            .iter()
            .map(|r| shards[r.clone()].iter().map(|s| s.numel).sum::<u64>())
            .max()
            .unwrap_or(0);
        let capacity =
            ((stage_elems as f64 * config.capacity).ceil() as u64).clamp(1, stage_elems.max(1));
        let value_bytes = ((capacity * max_width).next_multiple_of(8) + DECODE_SLACK) as usize;
        let entropy = config.entropy != EntropyMode::Off;
        Ok(Buffers {
            snapshots: shards
                .iter()
                .map(|s| Snapshot::allocate(gpu, config.snapshot, s.nbytes()))
                .collect::<Result<Vec<_>>>()?,
            positions: gpu.alloc((capacity * 8 + DECODE_SLACK) as usize)?,
            values: gpu.alloc(value_bytes)?,
            old_values: if entropy {
                Some(gpu.alloc(value_bytes)?)
            } else {
                None
            },
            header: gpu.alloc(HEADER_BYTES)?,
            status: gpu.alloc(32)?,
            digests_dev: gpu.alloc_zeroed(shards.len().max(1) * 8)?,
            capacity,
            stages,
        })
    }
}
