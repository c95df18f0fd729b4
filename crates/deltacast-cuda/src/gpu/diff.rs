//! Host side of kernels/diff.cu: the batched diff of many tensors against their snapshots,
//! its kernel table and per-tile slots, and the per-tensor results.

use std::sync::PoisonError;

use cudarc::driver::result as cu;
use cudarc::driver::sys;

use deltacast::digest::slot_salt;

use super::buffer::Scratch;
use super::context::Gpu;
use super::context::{Args, MAX_GRID, THREADS};
use super::driver::{drv, guarded};
use crate::error::{CudaError, Result};
use crate::{
    convert_word, map_layout, DevicePtr, DiffInput, DiffOutput, DiffResult, DiffTensorResult,
    MapCell, MapCode, MapDiff, MapOutput, MapTensorResult, ONE_PASS_ABOVE,
};

const DIFF_THREADS: u32 = 256;

/// Tiles per group of the diff's first scan level (kernels/diff.cu).
const DIFF_GROUP: u64 = 2048;

// Host twins of the kernel structs; field order and sizes must match the .cu files.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KDiffTensor {
    snap: u64,
    cur: u64,
    nbytes: u64,
    first_index: u64,
    tile_begin: u64,
    digest_out: u64,
    salt: u64,
    width: u32,
    aligned16: u32,
    convert: u32,
    pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KStepsTensor {
    map: u64,
    cell0: u64,
}

impl Args {
    /// The diff's output, as its writing kernels take it: capacity, positions, new bits, old
    /// bits (0: none).
    fn push_output(self, out: &DiffOutput) -> Self {
        self.push(out.capacity)
            .push(out.positions)
            .push(out.new_values)
            .push(out.old_values.unwrap_or(0))
    }
}

impl Gpu {
    /// Diffs many tensors in one launch sequence (see kernels/diff.cu): compares each
    /// `current` with its `snapshot` as unsigned integers, writes the changes in order to `out`
    /// (old bits too when `out.old_values` is set), refreshes the changed snapshot elements,
    /// and adds the fused digest updates. Synchronises once, at the end, to return the
    /// per-tensor counts. When the output is too small (`!is_complete()`), only a prefix of
    /// whole tiles is written, and the snapshot and digest words are updated only in part:
    /// copy `current` over the snapshot and recompute the digests.
    ///
    /// # Safety
    /// Every pointer must be valid for its size (`numel * width` bytes for the tensors,
    /// `numel * 4` for an fp32 `current`; `out` as documented on [`DiffOutput`]), snapshots must not overlap anything else, and
    /// the digest words must be valid u64.
    pub unsafe fn diff_batch(&self, inputs: &[DiffInput], out: &DiffOutput) -> Result<DiffResult> {
        // SAFETY: per this function's contract.
        unsafe { self.diff_batch_with(false, inputs, out) }
    }

    /// [`Gpu::diff_batch`] for snapshots in pinned host memory: keeps the changed vectors in
    /// registers instead of reading them a second time (which would cross PCIe).
    ///
    /// # Safety
    /// As [`Gpu::diff_batch`].
    pub unsafe fn diff_batch_host_snapshot(
        &self,
        inputs: &[DiffInput],
        out: &DiffOutput,
    ) -> Result<DiffResult> {
        // SAFETY: per this function's contract.
        unsafe { self.diff_batch_with(true, inputs, out) }
    }

    /// The batched diff's kernels: passes 1-3 (kernels/diff.cu), or the one-pass form when the
    /// tuning asks for it or the caller expects a density above [`ONE_PASS_ABOVE`]; `host_snapshot` picks the pass 1 that keeps vectors in registers.
    unsafe fn diff_batch_with(
        &self,
        host_snapshot: bool,
        inputs: &[DiffInput],
        out: &DiffOutput,
    ) -> Result<DiffResult> {
        guarded(|| {
            self.bind()?;
            let n = inputs.len();
            if n == 0 {
                return Ok(DiffResult::default());
            }
            let numel: u64 = inputs.iter().map(|i| i.numel).sum();
            let direct = self.tuning.direct
                || out
                    .expected
                    .is_some_and(|n| n as f64 > ONE_PASS_ABOVE * numel as f64);
            let tile_bytes = self.tuning.tile_bytes();
            let (order, table, tiles) = diff_table(inputs, tile_bytes)?;
            let groups = tiles.div_ceil(DIFF_GROUP);
            // Scratch: [table n*64][tile tensors tiles*4][tile counts tiles*4]
            //          [tile offsets tiles*4][group sums (groups+1)*8][result (3n+2)*8],
            //          each 8-aligned; the tiles' slots (an eighth of each tile) apart. The
            //          one-pass form: [table][tile tensors][status tiles*8][result].
            let table_len = (n * std::mem::size_of::<KDiffTensor>()) as u64;
            let tensor_of_off = table_len;
            let counts_off = tensor_of_off + (tiles * 4).next_multiple_of(8);
            let (offsets_off, groups_off, status_off, result_off) = if direct {
                let status_off = counts_off;
                (0, 0, status_off, status_off + tiles * 8)
            } else {
                let offsets_off = counts_off + (tiles * 4).next_multiple_of(8);
                let groups_off = offsets_off + (tiles * 4).next_multiple_of(8);
                (offsets_off, groups_off, 0, groups_off + (groups + 1) * 8)
            };
            let len = result_off + (3 * n as u64 + 2) * 8;
            let (_guard, base) = self.scratch(len as usize)?;
            let slots = if direct {
                None
            } else {
                Some(self.slots(tiles * (tile_bytes / 8))?)
            };
            self.upload_typed(base, &table)?;
            let status = if direct { base + status_off } else { 0 };
            let start = self.start_diff(base, n, tiles, base + tensor_of_off, status)?;
            if let Some((_, slots)) = &slots {
                self.launch(
                    if host_snapshot {
                        "dc_diff_resident"
                    } else {
                        "dc_diff"
                    },
                    tiles,
                    DIFF_THREADS,
                    Args::new()
                        .push(base)
                        .push(base + tensor_of_off)
                        .push(base + counts_off)
                        .push(*slots)
                        .push(out.old_values.is_some() as u64),
                )?;
                self.launch(
                    "dc_diff_scan_tiles",
                    groups,
                    DIFF_THREADS,
                    Args::new()
                        .push(base + counts_off)
                        .push(tiles)
                        .push(base + offsets_off)
                        .push(base + groups_off),
                )?;
                self.launch(
                    "dc_diff_scan_groups",
                    1,
                    1024,
                    Args::new().push(base + groups_off).push(groups),
                )?;
                // A warp per tile.
                self.launch(
                    "dc_diff_place",
                    tiles.div_ceil((DIFF_THREADS / 32) as u64),
                    DIFF_THREADS,
                    Args::new()
                        .push(base)
                        .push(base + tensor_of_off)
                        .push(tiles)
                        .push(base + counts_off)
                        .push(*slots)
                        .push(base + offsets_off)
                        .push(base + groups_off)
                        .push_output(out),
                )?;
                self.launch(
                    "dc_diff_finish",
                    (n as u64).div_ceil(THREADS as u64).min(MAX_GRID),
                    THREADS,
                    Args::new()
                        .push(base)
                        .push(n as u64)
                        .push(base + offsets_off)
                        .push(base + groups_off)
                        .push(tiles)
                        .push(out.capacity)
                        .push(base + result_off),
                )?;
            } else {
                self.launch(
                    if host_snapshot {
                        "dc_diff_resident_direct"
                    } else {
                        "dc_diff_direct"
                    },
                    tiles,
                    DIFF_THREADS,
                    Args::new()
                        .push(base)
                        .push(base + tensor_of_off)
                        .push(base + status_off)
                        .push_output(out),
                )?;
                self.launch(
                    "dc_diff_finish_direct",
                    (n as u64).div_ceil(THREADS as u64).min(MAX_GRID),
                    THREADS,
                    Args::new()
                        .push(base)
                        .push(n as u64)
                        .push(base + status_off)
                        .push(tiles)
                        .push(out.capacity)
                        .push(base + result_off),
                )?;
            }
            // SAFETY: our event and stream.
            unsafe { cu::event::record(self.events.1, self.stream) }
                .map_err(drv("cuEventRecord"))?;
            let raw: Vec<u64> = self.download_typed(base + result_off, 3 * n + 2)?;
            drop(slots);
            // SAFETY: both events were recorded and the stream synchronised.
            let kernel_ms = unsafe { cu::event::elapsed(start, self.events.1) }
                .map_err(drv("cuEventElapsedTime"))?;
            Ok(diff_results(inputs, &order, &raw, kernel_ms))
        })
    }

    /// Diffs many tensors straight into `out.code` (kernels/diff.cu, `dc_diff_steps` or
    /// `dc_diff_bitmap`), in one pass: each tensor's codes into its map, the escapes' new bits
    /// compacted, the snapshot refreshed, the digest updates added, and the changes and
    /// escapes of every cell counted. Synchronises once, at the end. When the escapes pass
    /// `out.capacity` (`!is_complete`), the snapshots are current but the digest words are
    /// not: recompute them.
    ///
    /// # Safety
    /// As [`Gpu::diff_batch`]; `out.map` valid for `map_layout(inputs, out.code).1` bytes and
    /// `out.escapes` for `out.capacity` escapes of the widest tensor.
    pub unsafe fn diff_map(&self, inputs: &[DiffInput], out: &MapOutput) -> Result<MapDiff> {
        guarded(|| {
            self.bind()?;
            let n = inputs.len();
            let tile_bytes = self.tuning.tile_bytes();
            let cell_elems = out.cell_elems.max(1).next_multiple_of(tile_bytes);
            if n == 0 {
                return Ok(MapDiff {
                    code: out.code,
                    tensors: Vec::new(),
                    found: 0,
                    escapes: 0,
                    cell_elems,
                    kernel_ms: 0.0,
                });
            }
            if !out.map.is_multiple_of(4) {
                return Err(CudaError::InvalidArgument(
                    "diff map not 4-byte aligned".into(),
                ));
            }
            let (order, table, tiles) = diff_table(inputs, tile_bytes)?;
            let (map_offsets, _) = map_layout(inputs, out.code);
            // Cells per tensor, numbered in the kernel's (width) order.
            let mut steps = Vec::with_capacity(n);
            let mut cell_base = vec![0u64; n];
            let mut cells = 0u64;
            for &i in &order {
                steps.push(KStepsTensor {
                    map: out.map + map_offsets[i],
                    cell0: cells,
                });
                cell_base[i] = cells;
                cells += inputs[i].numel.div_ceil(cell_elems);
            }
            // Scratch: [table n*64][steps n*16][tile tensors tiles*4][status tiles*8]
            //          [cells cells*8], each 8-aligned.
            let table_len = (n * std::mem::size_of::<KDiffTensor>()) as u64;
            let steps_off = table_len;
            let tensor_of_off = steps_off + (n * std::mem::size_of::<KStepsTensor>()) as u64;
            let status_off = tensor_of_off + (tiles * 4).next_multiple_of(8);
            let cells_off = status_off + tiles * 8;
            let len = cells_off + cells * 8;
            let (_guard, base) = self.scratch(len as usize)?;
            self.upload_typed(base, &table)?;
            self.upload_typed(base + steps_off, &steps)?;
            // SAFETY: inside the scratch region.
            unsafe { cu::memset_d8_async(base + cells_off, 0, (cells * 8) as usize, self.stream) }
                .map_err(drv("cuMemsetD8"))?;
            let start = self.start_diff(base, n, tiles, base + tensor_of_off, base + status_off)?;
            if tiles > 0 {
                self.launch(
                    match out.code {
                        MapCode::Steps => "dc_diff_steps",
                        MapCode::Bitmap => "dc_diff_bitmap",
                    },
                    tiles,
                    DIFF_THREADS,
                    Args::new()
                        .push(base)
                        .push(base + steps_off)
                        .push(base + tensor_of_off)
                        .push(base + status_off)
                        .push(out.capacity)
                        .push(out.escapes)
                        .push(base + cells_off)
                        .push(cell_elems),
                )?;
            }
            // SAFETY: our event and stream.
            unsafe { cu::event::record(self.events.1, self.stream) }
                .map_err(drv("cuEventRecord"))?;
            let raw: Vec<u32> = self.download_typed(base + cells_off, 2 * cells as usize)?;
            // SAFETY: both events were recorded and the stream synchronised.
            let kernel_ms = unsafe { cu::event::elapsed(start, self.events.1) }
                .map_err(drv("cuEventElapsedTime"))?;
            let mut tensors = vec![MapTensorResult::default(); n];
            let (mut found, mut escapes) = (0u64, 0u64);
            for &i in &order {
                let c0 = cell_base[i] as usize;
                let count = inputs[i].numel.div_ceil(cell_elems) as usize;
                let list: Vec<MapCell> = raw[2 * c0..2 * (c0 + count)]
                    .chunks_exact(2)
                    .map(|p| MapCell {
                        changes: p[0],
                        escapes: p[1],
                    })
                    .collect();
                let changes: u64 = list.iter().map(|c| c.changes as u64).sum();
                tensors[i] = MapTensorResult {
                    map_offset: map_offsets[i],
                    changes,
                    escape0: escapes,
                    cells: list,
                };
                found += changes;
                escapes += tensors[i]
                    .cells
                    .iter()
                    .map(|c| c.escapes as u64)
                    .sum::<u64>();
            }
            Ok(MapDiff {
                code: out.code,
                tensors,
                found,
                escapes,
                cell_elems,
                kernel_ms,
            })
        })
    }

    /// The start of every diff's launches: the timing event, then each tile's tensor (and,
    /// with `status` set, the one-pass forms' status words zeroed). Returns the event.
    fn start_diff(
        &self,
        table: DevicePtr,
        n: usize,
        tiles: u64,
        tile_tensor: DevicePtr,
        status: DevicePtr,
    ) -> Result<sys::CUevent> {
        let start = self.events.0;
        // SAFETY: our event and stream.
        unsafe { cu::event::record(start, self.stream) }.map_err(drv("cuEventRecord"))?;
        self.launch(
            "dc_diff_tile_tensor",
            tiles.div_ceil(THREADS as u64).min(MAX_GRID),
            THREADS,
            Args::new()
                .push(table)
                .push(n as u64)
                .push(tiles)
                .push(tile_tensor)
                .push(status),
        )?;
        Ok(start)
    }

    /// Bytes held by the diff's per-tile slots (0 before the first diff).
    pub fn large_scratch_bytes(&self) -> u64 {
        let m = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        m.buf.as_ref().map_or(0, |b| b.len() as u64)
    }

    /// The diff's per-tile slots, at least `len` bytes, valid until the guard drops (sized to
    /// what is asked, not a power of two: it is large).
    fn slots(&self, len: u64) -> Result<(std::sync::MutexGuard<'_, Scratch>, DevicePtr)> {
        let mut m = self.slots.lock().unwrap_or_else(PoisonError::into_inner);
        let len = (len.max(256) as usize).next_multiple_of(1 << 20);
        if m.buf.as_ref().is_none_or(|b| b.len() < len) {
            m.buf = None;
            m.buf = Some(self.alloc(len)?);
        }
        let ptr = m.buf.as_ref().map(|b| b.ptr()).unwrap_or(0);
        Ok((m, ptr))
    }
}

/// Checks a diff batch and builds the kernel table: tensors ordered by non-decreasing width
/// (so value ranges at `g * width` never overlap), tiles numbered globally. Returns (order,
/// table, number of tiles).
fn diff_table(
    inputs: &[DiffInput],
    tile_bytes: u64,
) -> Result<(Vec<usize>, Vec<KDiffTensor>, u64)> {
    let n = inputs.len();
    if n >= u32::MAX as usize {
        return Err(CudaError::InvalidArgument("too many tensors".into()));
    }
    for (i, t) in inputs.iter().enumerate() {
        if !matches!(t.width, 1 | 2 | 4) {
            return Err(CudaError::InvalidArgument(format!(
                "tensor {i}: width {} (1, 2 or 4)",
                t.width
            )));
        }
        let w = t.width as u64;
        if t.numel.checked_mul(w).is_none() || t.first_index.checked_add(t.numel).is_none() {
            return Err(CudaError::InvalidArgument(format!(
                "tensor {i}: size overflows"
            )));
        }
        // An fp32 source: 4-byte elements, rounded into a bf16 snapshot.
        let src_w = if t.f32_source.is_some() { 4 } else { w };
        if t.f32_source.is_some() && (w != 2 || t.numel.checked_mul(4).is_none()) {
            return Err(CudaError::InvalidArgument(format!(
                "tensor {i}: an fp32 source converts into a bf16 (width 2) snapshot, not width {w}"
            )));
        }
        if t.numel > 0 && (t.snapshot % w != 0 || t.current % src_w != 0) {
            return Err(CudaError::InvalidArgument(format!(
                "tensor {i}: pointers not aligned to the element widths ({w}, source {src_w})"
            )));
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by_key(|&i| inputs[i].width);
    let mut table = Vec::with_capacity(n);
    let mut tiles = 0u64;
    for &i in &order {
        let t = &inputs[i];
        let nbytes = t.numel * t.width as u64;
        let (digest_out, salt) = match t.digest {
            Some((ptr, slot)) => (ptr, slot_salt(slot)),
            None => (0, 0),
        };
        table.push(KDiffTensor {
            snap: t.snapshot,
            cur: t.current,
            nbytes,
            first_index: t.first_index,
            tile_begin: tiles,
            digest_out,
            salt,
            width: t.width as u32,
            aligned16: (t.snapshot | t.current).is_multiple_of(16) as u32,
            convert: convert_word(t.f32_source),
            pad: 0,
        });
        tiles += nbytes.div_ceil(tile_bytes);
    }
    if tiles >= (1 << 31) {
        return Err(CudaError::InvalidArgument(format!(
            "batch of {tiles} tiles; split it (at most 2^31 tiles of {tile_bytes} B)"
        )));
    }
    Ok((order, table, tiles))
}

/// The per-tensor results of a diff, from the finishing kernel's words, in input order.
fn diff_results(inputs: &[DiffInput], order: &[usize], raw: &[u64], kernel_ms: f32) -> DiffResult {
    let n = inputs.len();
    let mut tensors = vec![DiffTensorResult::default(); n];
    for (k, &i) in order.iter().enumerate() {
        let offset = raw[3 * k];
        tensors[i] = DiffTensorResult {
            offset,
            written: raw[3 * k + 1],
            found: raw[3 * k + 2],
            value_offset: offset * inputs[i].width as u64,
        };
    }
    DiffResult {
        tensors,
        found: raw[3 * n],
        written: raw[3 * n + 1],
        kernel_ms,
    }
}
