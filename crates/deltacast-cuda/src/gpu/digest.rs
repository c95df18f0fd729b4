//! Host side of kernels/digest.cu: the per-slot state digests, in full over tensors or as
//! the O(changed) update over a diff's changes.

use cudarc::driver::result as cu;

use deltacast::digest::slot_salt;

use super::context::Gpu;
use super::context::{Args, MAX_GRID, THREADS};
use super::driver::{drv, guarded};
use crate::error::{CudaError, Result};
use crate::{DevicePtr, DigestInput, UpdateInput};

/// Elements per digest block (kernels/digest.cu).
const DIGEST_BLOCK_ELEMS: u64 = 256 * 32;

// Host twins of the kernel structs; field order and sizes must match kernels/digest.cu.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KDigestTensor {
    ptr: u64,
    numel: u64,
    first_index: u64,
    salt: u64,
    block_begin: u64,
    out: u64,
    width: u32,
    pad: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KUpdateSeg {
    chg_off: u64,
    chg_cnt: u64,
    salt: u64,
    block_begin: u64,
    out: u64,
    width: u32,
    pad: u32,
}

impl Gpu {
    /// The digest of each input (`Σ h(slot, first_index + k, bits_k)`), all in one launch.
    ///
    /// # Safety
    /// Every `ptr` must be valid for `numel * width` bytes, aligned to the width.
    pub unsafe fn digest(&self, inputs: &[DigestInput]) -> Result<Vec<u64>> {
        guarded(|| {
            self.bind()?;
            let n = inputs.len();
            if n == 0 {
                return Ok(Vec::new());
            }
            let t_len = (n * std::mem::size_of::<KDigestTensor>()) as u64;
            let (_guard, base) = self.scratch((t_len + n as u64 * 8) as usize)?;
            let out = base + t_len;
            let mut table = Vec::with_capacity(n);
            let mut blocks = 0u64;
            for (i, t) in inputs.iter().enumerate() {
                if !matches!(t.width, 1 | 2 | 4) || (t.numel > 0 && t.ptr % t.width as u64 != 0) {
                    return Err(CudaError::InvalidArgument(format!(
                        "input {i}: width {} or alignment",
                        t.width
                    )));
                }
                table.push(KDigestTensor {
                    ptr: t.ptr,
                    numel: t.numel,
                    first_index: t.first_index,
                    salt: slot_salt(t.slot),
                    block_begin: blocks,
                    out: out + i as u64 * 8,
                    width: t.width as u32,
                    pad: 0,
                });
                blocks += t.numel.div_ceil(DIGEST_BLOCK_ELEMS);
            }
            self.upload_typed(base, &table)?;
            // SAFETY: inside the scratch region.
            unsafe { cu::memset_d8_async(out, 0, n * 8, self.stream) }
                .map_err(drv("cuMemsetD8"))?;
            self.launch(
                "dc_digest",
                blocks.min(MAX_GRID * 4),
                THREADS,
                Args::new().push(base).push(n as u64).push(blocks),
            )?;
            self.download_typed(out, n)
        })
    }

    /// The O(changed) digest update of each run of changes laid out as [`Gpu::diff_batch`]
    /// writes them: `Σ h(new) − h(old)` (wrapping).
    ///
    /// # Safety
    /// `positions`, `new_values` and `old_values` must hold every listed change.
    pub unsafe fn digest_update(
        &self,
        positions: DevicePtr,
        new_values: DevicePtr,
        old_values: DevicePtr,
        inputs: &[UpdateInput],
    ) -> Result<Vec<u64>> {
        guarded(|| {
            self.bind()?;
            let n = inputs.len();
            if n == 0 {
                return Ok(Vec::new());
            }
            let t_len = (n * std::mem::size_of::<KUpdateSeg>()) as u64;
            let (_guard, base) = self.scratch((t_len + n as u64 * 8) as usize)?;
            let out = base + t_len;
            let mut table = Vec::with_capacity(n);
            let mut blocks = 0u64;
            for (i, s) in inputs.iter().enumerate() {
                if !matches!(s.width, 1 | 2 | 4) {
                    return Err(CudaError::InvalidArgument(format!(
                        "input {i}: width {}",
                        s.width
                    )));
                }
                table.push(KUpdateSeg {
                    chg_off: s.change_offset,
                    chg_cnt: s.change_count,
                    salt: slot_salt(s.slot),
                    block_begin: blocks,
                    out: out + i as u64 * 8,
                    width: s.width as u32,
                    pad: 0,
                });
                blocks += s.change_count.div_ceil(DIGEST_BLOCK_ELEMS);
            }
            self.upload_typed(base, &table)?;
            // SAFETY: inside the scratch region.
            unsafe { cu::memset_d8_async(out, 0, n * 8, self.stream) }
                .map_err(drv("cuMemsetD8"))?;
            self.launch(
                "dc_digest_update",
                blocks.min(MAX_GRID * 4),
                THREADS,
                Args::new()
                    .push(base)
                    .push(n as u64)
                    .push(blocks)
                    .push(positions)
                    .push(new_values)
                    .push(old_values),
            )?;
            self.download_typed(out, n)
        })
    }
}
