//! Host side of kernels/digest.cu: the per-slot state digests, in full over tensors or as
//! the O(changed) update over a diff's changes.

use cudarc::driver::result as cu;

use deltacast::digest::slot_salt;

use super::context::Gpu;
use super::context::{Args, MAX_GRID, THREADS};
use super::driver::{drv, guarded};
use crate::error::{CudaError, Result};
use crate::{convert_word, DevicePtr, DigestInput, UpdateInput};

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
    convert: u32,
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

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KRefreshTensor {
    t: KDigestTensor,
    snap: u64,
    changed_out: u64,
}

/// The kernels' table of `inputs`, each summing into the u64 at `out + 8 i`, and the blocks
/// it takes.
fn digest_table(inputs: &[DigestInput], out: DevicePtr) -> Result<(Vec<KDigestTensor>, u64)> {
    let mut table = Vec::with_capacity(inputs.len());
    let mut blocks = 0u64;
    for (i, t) in inputs.iter().enumerate() {
        // An fp32 source is read 4 bytes an element and digested as bf16.
        let src_w = if t.f32_source.is_some() {
            4
        } else {
            t.width as u64
        };
        if !matches!(t.width, 1 | 2 | 4)
            || (t.f32_source.is_some() && t.width != 2)
            || (t.numel > 0 && t.ptr % src_w != 0)
        {
            return Err(CudaError::InvalidArgument(format!(
                "input {i}: width {}{} or alignment",
                t.width,
                if t.f32_source.is_some() {
                    " (an fp32 source converts to bf16, width 2)"
                } else {
                    ""
                }
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
            convert: convert_word(t.f32_source),
        });
        blocks += t.numel.div_ceil(DIGEST_BLOCK_ELEMS);
    }
    Ok((table, blocks))
}

impl Gpu {
    /// The digest of each input (`Σ h(slot, first_index + k, bits_k)`), all in one launch.
    ///
    /// # Safety
    /// Every `ptr` must be valid for `numel * width` bytes (`numel * 4` for an fp32 source),
    /// aligned to its element width.
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
            let (table, blocks) = digest_table(inputs, out)?;
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

    /// [`Gpu::digest`] of each input that also copies the input over `snapshots[i]` where
    /// their bits differ, and counts those elements: returns (digests, changed counts). An
    /// fp32 source (`f32_source`) is compared, digested and copied as its bf16 rounding.
    ///
    /// # Safety
    /// As [`Gpu::digest`]; each snapshot valid for its input's bytes, aligned alike, not
    /// overlapping any input, and nothing else using it meanwhile.
    pub unsafe fn digest_refresh(
        &self,
        inputs: &[DigestInput],
        snapshots: &[DevicePtr],
    ) -> Result<(Vec<u64>, Vec<u64>)> {
        guarded(|| {
            self.bind()?;
            let n = inputs.len();
            if snapshots.len() != n {
                return Err(CudaError::InvalidArgument(format!(
                    "{n} inputs but {} snapshots",
                    snapshots.len()
                )));
            }
            if n == 0 {
                return Ok((Vec::new(), Vec::new()));
            }
            let t_len = (n * std::mem::size_of::<KRefreshTensor>()) as u64;
            let (_guard, base) = self.scratch((t_len + n as u64 * 16) as usize)?;
            let out = base + t_len;
            let counts = out + n as u64 * 8;
            let (digests, blocks) = digest_table(inputs, out)?;
            let mut table = Vec::with_capacity(n);
            for (i, (t, &snap)) in digests.into_iter().zip(snapshots).enumerate() {
                if t.numel > 0 && snap % t.width as u64 != 0 {
                    return Err(CudaError::InvalidArgument(format!(
                        "snapshot {i} is not aligned to its width {}",
                        t.width
                    )));
                }
                table.push(KRefreshTensor {
                    t,
                    snap,
                    changed_out: counts + i as u64 * 8,
                });
            }
            self.upload_typed(base, &table)?;
            // SAFETY: inside the scratch region (digest words and counts).
            unsafe { cu::memset_d8_async(out, 0, n * 16, self.stream) }
                .map_err(drv("cuMemsetD8"))?;
            self.launch(
                "dc_digest_refresh",
                blocks.min(MAX_GRID * 4),
                THREADS,
                Args::new().push(base).push(n as u64).push(blocks),
            )?;
            let words: Vec<u64> = self.download_typed(out, 2 * n)?;
            Ok((words[..n].to_vec(), words[n..].to_vec()))
        })
    }

    /// Per input, `(elements sampled, of them differing from snapshots[i])` over every
    /// `every`-th block of [`DIGEST_BLOCK_ELEMS`] elements of all the inputs (`every` 1:
    /// every element, the exact count); writes nothing.
    ///
    /// # Safety
    /// As [`Gpu::digest_refresh`], except that the snapshots are only read.
    pub unsafe fn count_changed_sampled(
        &self,
        inputs: &[DigestInput],
        snapshots: &[DevicePtr],
        every: u64,
    ) -> Result<Vec<(u64, u64)>> {
        guarded(|| {
            self.bind()?;
            let n = inputs.len();
            if snapshots.len() != n || every == 0 {
                return Err(CudaError::InvalidArgument(format!(
                    "{n} inputs, {} snapshots, sampling every {every}",
                    snapshots.len()
                )));
            }
            if n == 0 {
                return Ok(Vec::new());
            }
            let t_len = (n * std::mem::size_of::<KRefreshTensor>()) as u64;
            let (_guard, base) = self.scratch((t_len + n as u64 * 16) as usize)?;
            let sampled = base + t_len;
            let counts = sampled + n as u64 * 8;
            let (digests, blocks) = digest_table(inputs, sampled)?;
            let table: Vec<KRefreshTensor> = digests
                .into_iter()
                .zip(snapshots)
                .enumerate()
                .map(|(i, (t, &snap))| KRefreshTensor {
                    t,
                    snap,
                    changed_out: counts + i as u64 * 8,
                })
                .collect();
            self.upload_typed(base, &table)?;
            // SAFETY: inside the scratch region (sampled elements and counts).
            unsafe { cu::memset_d8_async(sampled, 0, n * 16, self.stream) }
                .map_err(drv("cuMemsetD8"))?;
            self.launch(
                "dc_count_sampled",
                blocks.div_ceil(every).clamp(1, MAX_GRID * 4),
                THREADS,
                Args::new()
                    .push(base)
                    .push(n as u64)
                    .push(blocks)
                    .push(every),
            )?;
            let words: Vec<u64> = self.download_typed(sampled, 2 * n)?;
            Ok(words[..n]
                .iter()
                .copied()
                .zip(words[n..].iter().copied())
                .collect())
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
