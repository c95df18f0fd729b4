//! Host side of kernels/encode.cu: the core's chunks formed on the GPU over sorted change
//! lists (grid cells tightened to their changes), and their abs32 or bitmap position
//! sections written.

use cudarc::driver::result as cu;

use super::context::Gpu;
use super::context::{Args, MAX_GRID, THREADS};
use super::driver::{drv, guarded};
use crate::error::{CudaError, Result};
use crate::{ApplyPositions, DevicePtr, EncodeInput, GridChunk};

// Host twins of the kernel structs; field order and sizes must match kernels/encode.cu.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KEncodeCell {
    begin: u64,
    end: u64,
    chg_off: u64,
    chg_cnt: u64,
    bitmap_off: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
struct KEncodedCell {
    lo: u64,
    count: u64,
    start: u64,
    range: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KPlaceCell {
    lo: u64,
    count: u64,
    start: u64,
    range: u64,
    dst: u64,
    codec: u32,
    pad: u32,
}

impl Gpu {
    /// Bytes the bitmap buffer of [`Gpu::encode_positions`] needs for these inputs.
    pub fn bitmap_bytes(inputs: &[EncodeInput], chunk_elems: u64) -> u64 {
        cells(inputs, chunk_elems)
            .map(|c| c.1.end - c.1.begin)
            .map(|len| len.div_ceil(8).next_multiple_of(8))
            .sum()
    }

    /// Forms the core's chunks (grid cells of `chunk_elems`, tightened to their changes) over
    /// sorted change lists and writes their position sections: abs32 (`u32` per change, at the
    /// change's index) into `abs32_out`, and/or bitmaps into `bitmap_out` (zeroed here first;
    /// [`Gpu::bitmap_bytes`] long). Returns the non-empty chunks in order.
    ///
    /// # Safety
    /// `positions` must hold every listed change (u64); `abs32_out` one u32 per change index
    /// used; `bitmap_out` `bitmap_bytes(inputs, chunk_elems)` bytes, 8-byte aligned.
    pub unsafe fn encode_positions(
        &self,
        positions: DevicePtr,
        inputs: &[EncodeInput],
        chunk_elems: u64,
        abs32_out: Option<DevicePtr>,
        bitmap_out: Option<DevicePtr>,
    ) -> Result<Vec<GridChunk>> {
        guarded(|| {
            self.bind()?;
            if chunk_elems == 0 || chunk_elems > u32::MAX as u64 {
                return Err(CudaError::InvalidArgument(format!(
                    "chunk size {chunk_elems} outside 1..=2^32-1"
                )));
            }
            if bitmap_out.is_some_and(|p| p % 8 != 0) || abs32_out.is_some_and(|p| p % 4 != 0) {
                return Err(CudaError::InvalidArgument("misaligned output".into()));
            }
            let list: Vec<(usize, KEncodeCell)> = cells(inputs, chunk_elems).collect();
            let nc = list.len();
            if nc == 0 {
                return Ok(Vec::new());
            }
            let table: Vec<KEncodeCell> = list.iter().map(|c| c.1).collect();
            let table_len = (nc * std::mem::size_of::<KEncodeCell>()) as u64;
            let out_len = (nc * std::mem::size_of::<KEncodedCell>()) as u64;
            let (_guard, base) = self.scratch((table_len + out_len) as usize)?;
            self.upload_typed(base, &table)?;
            if let Some(bm) = bitmap_out {
                let bytes = Self::bitmap_bytes(inputs, chunk_elems);
                // SAFETY: per this function's contract.
                unsafe { cu::memset_d8_async(bm, 0, bytes as usize, self.stream) }
                    .map_err(drv("cuMemsetD8"))?;
            }
            self.launch(
                "dc_encode_cells",
                (nc as u64).min(MAX_GRID),
                THREADS,
                Args::new()
                    .push(base)
                    .push(nc as u64)
                    .push(positions)
                    .push(base + table_len)
                    .push(abs32_out.unwrap_or(0))
                    .push(bitmap_out.unwrap_or(0)),
            )?;
            let got: Vec<KEncodedCell> = self.download_typed(base + table_len, nc)?;
            let mut seen = vec![0u64; inputs.len()];
            let mut chunks = Vec::new();
            for ((input, cell), r) in list.iter().zip(&got) {
                seen[*input] += r.count;
                if r.count > 0 {
                    chunks.push(GridChunk {
                        input: *input,
                        lo: r.lo,
                        count: r.count,
                        start: r.start,
                        range: r.range,
                        bitmap_offset: cell.bitmap_off,
                    });
                }
            }
            for (i, (s, t)) in seen.iter().zip(inputs).enumerate() {
                if *s != t.change_count {
                    return Err(CudaError::InvalidArgument(format!(
                        "input {i}: {} of {} changes lie in its range (unsorted or out of range)",
                        s, t.change_count
                    )));
                }
            }
            Ok(chunks)
        })
    }

    /// Writes each chunk's position section, in the codec chosen for it, at `dst` (abs32:
    /// `count` u32; bitmap: `ceil(range / 32)` u32 words, zeroed here first), from the sorted
    /// positions at `positions` (u64). The chunks are what [`Gpu::encode_positions`] returned
    /// (run with no outputs, it only counts). Synchronises once.
    ///
    /// # Safety
    /// `positions` must hold every chunk's changes; each `dst` must be 4-byte aligned device
    /// memory with room for its section rounded up to whole words, disjoint from the others.
    pub unsafe fn encode_place(
        &self,
        positions: DevicePtr,
        chunks: &[(GridChunk, ApplyPositions, DevicePtr)],
    ) -> Result<()> {
        guarded(|| {
            self.bind()?;
            let mut table = Vec::with_capacity(chunks.len());
            for (c, codec, dst) in chunks {
                if dst % 4 != 0 || c.count == 0 || c.range == 0 || c.range > u32::MAX as u64 {
                    return Err(CudaError::InvalidArgument(
                        "encode_place: unaligned output or empty chunk".into(),
                    ));
                }
                let codec = match codec {
                    ApplyPositions::Abs32 => 1,
                    ApplyPositions::Bitmap => 3,
                    ApplyPositions::All | ApplyPositions::Steps => {
                        return Err(CudaError::InvalidArgument(
                            "encode_place: writes abs32 and bitmap sections only".into(),
                        ))
                    }
                };
                table.push(KPlaceCell {
                    lo: c.lo,
                    count: c.count,
                    start: c.start,
                    range: c.range,
                    dst: *dst,
                    codec,
                    pad: 0,
                });
            }
            if table.is_empty() {
                return Ok(());
            }
            let len = table.len() * std::mem::size_of::<KPlaceCell>();
            let (_guard, base) = self.scratch(len)?;
            self.upload_typed(base, &table)?;
            self.launch(
                "dc_encode_place",
                (table.len() as u64).min(MAX_GRID),
                THREADS,
                Args::new()
                    .push(base)
                    .push(table.len() as u64)
                    .push(positions),
            )?;
            self.sync()
        })
    }
}

/// The grid cells of every input that holds changes: (input index, cell).
fn cells(inputs: &[EncodeInput], grid: u64) -> impl Iterator<Item = (usize, KEncodeCell)> + '_ {
    let mut bitmap_off = 0u64;
    inputs
        .iter()
        .enumerate()
        .filter(move |(_, t)| t.change_count > 0 && t.numel > 0 && grid > 0)
        .flat_map(move |(i, t)| {
            let end = t.first_index + t.numel;
            let first = t.first_index / grid;
            let last = (end - 1) / grid;
            (first..=last).map(move |c| {
                (
                    i,
                    KEncodeCell {
                        begin: (c * grid).max(t.first_index),
                        end: (c * grid + grid).min(end),
                        chg_off: t.change_offset,
                        chg_cnt: t.change_count,
                        bitmap_off: 0,
                    },
                )
            })
        })
        .map(move |(i, mut c)| {
            c.bitmap_off = bitmap_off;
            bitmap_off += (c.end - c.begin).div_ceil(8).next_multiple_of(8);
            (i, c)
        })
}
