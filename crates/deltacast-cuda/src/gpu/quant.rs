//! Host side of kernels/quant.cu: fp32 tensors quantized to block FP8 (E4M3FN elements and one
//! fp32 scale per 128×128 block, the rule of [`deltacast::convert::fp8`]) into device buffers,
//! which a sender then syncs as its FP8 and scale slots.

use deltacast::convert::fp8::BlockGrid;

use super::buffer::DeviceBuffer;
use super::context::{Args, Gpu, MAX_GRID, THREADS};
use super::driver::guarded;
use crate::error::{CudaError, Result};
use crate::Fp8Job;

// Host twin of kernels/quant.cu's `Fp8Job`; field order and sizes must match.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KFp8Job {
    src: u64,
    dst: u64,
    scales: u64,
    first_block: u64,
    rows: u32,
    cols: u32,
    row_blocks: u32,
    col_blocks: u32,
}

/// The kernel's table of some [`Fp8Job`]s, on the device: made once, launched on every sync.
pub struct Fp8Plan {
    table: DeviceBuffer,
    jobs: u32,
    blocks: u64,
}

impl Fp8Plan {
    /// Blocks (and scales) of all the jobs.
    pub fn blocks(&self) -> u64 {
        self.blocks
    }
}

/// The kernel's table of `jobs`, and their blocks in all.
fn fp8_table(jobs: &[Fp8Job]) -> Result<(Vec<KFp8Job>, u64)> {
    let mut table = Vec::with_capacity(jobs.len());
    let mut blocks = 0u64;
    for (i, j) in jobs.iter().enumerate() {
        let bad =
            |why: &str| CudaError::InvalidArgument(format!("FP8 job {i} {:?}: {why}", j.shape));
        let grid = BlockGrid::of(&j.shape).ok_or_else(|| bad("needs two or more dimensions"))?;
        let (Ok(rows), Ok(cols)) = (u32::try_from(grid.rows), u32::try_from(grid.cols)) else {
            return Err(bad("rows and columns must each fit 32 bits"));
        };
        if grid.elements() > 0 && (j.src % 4 != 0 || j.scales % 4 != 0) {
            return Err(bad("fp32 source and scales must be 4-byte aligned"));
        }
        table.push(KFp8Job {
            src: j.src,
            dst: j.dst,
            scales: j.scales,
            first_block: blocks,
            rows,
            cols,
            row_blocks: grid.row_blocks() as u32,
            col_blocks: grid.col_blocks() as u32,
        });
        blocks += if grid.elements() == 0 {
            0
        } else {
            grid.scales() as u64
        };
    }
    // An empty tensor has no block: the job after it starts at the same block, and the
    // kernel's search must find that one, so empty jobs leave the table.
    let table = table
        .into_iter()
        .zip(jobs)
        .filter(|(_, j)| j.shape.iter().product::<u64>() > 0)
        .map(|(k, _)| k)
        .collect();
    Ok((table, blocks))
}

impl Gpu {
    /// Uploads the table of `jobs` (checked: shapes, alignment) for [`Gpu::fp8_quantize`].
    pub fn fp8_plan(&self, jobs: &[Fp8Job]) -> Result<Fp8Plan> {
        let (table, blocks) = fp8_table(jobs)?;
        let bytes: Vec<u8> = table
            .iter()
            .flat_map(|k| {
                [k.src, k.dst, k.scales, k.first_block]
                    .into_iter()
                    .flat_map(u64::to_le_bytes)
                    .chain(
                        [k.rows, k.cols, k.row_blocks, k.col_blocks]
                            .into_iter()
                            .flat_map(u32::to_le_bytes),
                    )
            })
            .collect();
        debug_assert_eq!(bytes.len(), table.len() * std::mem::size_of::<KFp8Job>());
        Ok(Fp8Plan {
            table: self.upload(&bytes)?,
            jobs: table.len() as u32,
            blocks,
        })
    }

    /// Quantizes every job of `plan`, enqueued on this GPU's stream.
    ///
    /// # Safety
    /// Every job's `src` must be valid for its fp32 elements, `dst` for as many bytes and
    /// `scales` for its blocks' fp32 scales, none overlapping another, until the work is done.
    pub unsafe fn fp8_quantize(&self, plan: &Fp8Plan) -> Result<()> {
        guarded(|| {
            self.bind()?;
            self.launch(
                "dc_fp8_quantize",
                plan.blocks.min(MAX_GRID * 4),
                THREADS,
                Args::new()
                    .push(plan.table.ptr())
                    .push(plan.jobs as u64)
                    .push(plan.blocks),
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_numbers_blocks_across_jobs_and_skips_empty_ones() {
        let job = |shape: Vec<u64>| Fp8Job {
            src: 256,
            dst: 512,
            scales: 1024,
            shape,
        };
        let (t, blocks) =
            fp8_table(&[job(vec![129, 300]), job(vec![0, 5]), job(vec![2, 3, 130])]).unwrap();
        assert_eq!(blocks, 2 * 3 + 2 * 2);
        assert_eq!(t.len(), 2);
        assert_eq!(
            (t[0].first_block, t[0].row_blocks, t[0].col_blocks),
            (0, 2, 3)
        );
        assert_eq!((t[1].first_block, t[1].rows, t[1].cols), (6, 3, 130));
        assert!(fp8_table(&[job(vec![7])]).is_err());
        let mut odd = job(vec![4, 4]);
        odd.src = 2;
        assert!(fp8_table(&[odd]).is_err());
    }
}
