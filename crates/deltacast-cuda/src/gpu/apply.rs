//! Host side of kernels/apply.cu: a batch of chunks checked (lengths and alignment here,
//! contents and digest changes on the GPU), then scattered into their slots, journaled for
//! undo where a staged sync may have to roll back.

use cudarc::driver::result as cu;

use deltacast::digest::slot_salt;

use super::context::Gpu;
use super::context::{Args, MAX_GRID, THREADS};
use super::driver::{drv, guarded};
use crate::error::{CudaError, Result};
use crate::{
    apply_error_reason, journal_layout, ApplyCheck, ApplyInput, ApplyPositions, ApplyValues,
    ChunkError, DevicePtr,
};

// Host twin of the kernel struct; field order and sizes must match kernels/apply.cu.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KApplyChunk {
    dst: u64,
    pos: u64,
    val: u64,
    start: u64,
    range: u64,
    count: u64,
    salt: u64,
    width: u32,
    pos_codec: u32,
    slot: u32,
    seed: u32,
    k_begin: u64,
    k_end: u64,
    journal: u64,
    escapes: u64,
    val_raw: u32,
    pad: u32,
}

impl Gpu {
    /// Checks a batch of chunks on the GPU without writing anything: section lengths and
    /// alignment (host), then contents and digest changes (kernel). `seed` selects the seed
    /// digest (Σ h(new)) over the delta one (Σ h(new) − h(old), and new ≠ held).
    /// `num_slots` sizes [`ApplyCheck::digest_change`]. Synchronises once.
    ///
    /// # Safety
    /// Every pointer must be valid for the lengths given (slots: `slot_numel * width`).
    pub unsafe fn apply_check(
        &self,
        chunks: &[ApplyInput],
        seed: bool,
        num_slots: usize,
    ) -> Result<ApplyCheck> {
        guarded(|| {
            self.bind()?;
            let (table, owner) = apply_table(chunks, seed, num_slots)?;
            let n = table.len();
            let t_len = (n * std::mem::size_of::<KApplyChunk>()) as u64;
            let e_off = t_len.next_multiple_of(8);
            let d_off = e_off + (n as u64 * 4).next_multiple_of(8);
            let len = d_off + num_slots as u64 * 8;
            let (_guard, base) = self.scratch(len as usize)?;
            self.upload_typed(base, &table)?;
            // SAFETY: inside the scratch region.
            unsafe { cu::memset_d8_async(base + e_off, 0, (len - e_off) as usize, self.stream) }
                .map_err(drv("cuMemsetD8"))?;
            self.launch(
                "dc_apply_check",
                (n as u64).min(MAX_GRID),
                THREADS,
                Args::new()
                    .push(base)
                    .push(n as u64)
                    .push(base + e_off)
                    .push(base + d_off),
            )?;
            let codes: Vec<u32> = self.download_typed(base + e_off, n)?;
            let digest_change: Vec<u64> = self.download_typed(base + d_off, num_slots)?;
            let mut errors: Vec<ChunkError> = codes
                .iter()
                .zip(&owner)
                .filter(|(&c, _)| c != 0)
                .map(|(&c, &chunk)| ChunkError {
                    chunk,
                    reason: apply_error_reason(c),
                })
                .collect();
            // One error per chunk (a chunk's entries may each have found one).
            errors.dedup_by_key(|e| e.chunk);
            Ok(ApplyCheck {
                digest_change,
                errors,
            })
        })
    }

    /// Writes the chunks' new bits into their slots (no digest, no content checks beyond
    /// staying inside each chunk): call it only after [`Gpu::apply_check`] passed.
    /// Synchronises once.
    ///
    /// # Safety
    /// As [`Gpu::apply_check`]; the slots are written.
    pub unsafe fn apply_scatter(&self, chunks: &[ApplyInput]) -> Result<()> {
        // SAFETY: per this function's contract.
        unsafe { self.scatter(chunks, None) }
    }

    /// [`Gpu::apply_scatter`], saving first the bits each change overwrites into `journal`
    /// (laid out by [`journal_layout`]), so that [`Gpu::apply_undo`] can put them back.
    ///
    /// # Safety
    /// As [`Gpu::apply_scatter`]; `journal` must be valid for `journal_layout(chunks).1`
    /// bytes, 4-aligned.
    pub unsafe fn apply_scatter_journaled(
        &self,
        chunks: &[ApplyInput],
        journal: DevicePtr,
    ) -> Result<()> {
        // SAFETY: per this function's contract.
        unsafe { self.scatter(chunks, Some(journal)) }
    }

    /// Undoes [`Gpu::apply_scatter_journaled`] of the same chunks: writes the journal's old
    /// bits back. Undo stages in the reverse order of their scatters.
    ///
    /// # Safety
    /// As [`Gpu::apply_scatter_journaled`], with the journal that scatter filled.
    pub unsafe fn apply_undo(&self, chunks: &[ApplyInput], journal: DevicePtr) -> Result<()> {
        let (offsets, _) = journal_layout(chunks);
        let back: Vec<ApplyInput> = chunks
            .iter()
            .zip(offsets)
            .map(|(c, off)| ApplyInput {
                val_section: journal + off,
                val_len: c.count * c.width as u64,
                values: ApplyValues::Raw,
                ..*c
            })
            .collect();
        // SAFETY: per this function's contract (each chunk's old bits at its offset).
        unsafe { self.scatter(&back, None) }
    }

    unsafe fn scatter(&self, chunks: &[ApplyInput], journal: Option<DevicePtr>) -> Result<()> {
        guarded(|| {
            self.bind()?;
            let (mut table, owner) = apply_table(chunks, false, usize::MAX)?;
            if let Some(base) = journal {
                if base % 4 != 0 {
                    return Err(CudaError::InvalidArgument(
                        "journal not 4-byte aligned".into(),
                    ));
                }
                let (offsets, _) = journal_layout(chunks);
                for (entry, &i) in table.iter_mut().zip(&owner) {
                    entry.journal = base + offsets[i];
                }
            }
            let n = table.len();
            let t_len = (n * std::mem::size_of::<KApplyChunk>()) as u64;
            let e_off = t_len.next_multiple_of(8);
            let len = e_off + n as u64 * 4;
            let (_guard, base) = self.scratch(len as usize)?;
            self.upload_typed(base, &table)?;
            // SAFETY: inside the scratch region.
            unsafe { cu::memset_d8_async(base + e_off, 0, n * 4, self.stream) }
                .map_err(drv("cuMemsetD8"))?;
            self.launch(
                "dc_apply_scatter",
                (n as u64).min(MAX_GRID),
                THREADS,
                Args::new().push(base).push(n as u64).push(base + e_off),
            )?;
            self.sync()
        })
    }

    /// The receiver's whole step for one staged sync: check every chunk, compute the new
    /// digests from the bits held (`held[slot]` plus the changes; a seed's from the values
    /// alone), compare them with the sender's `expected`, and only then scatter. On any
    /// failure nothing is written. Returns the new digests.
    ///
    /// # Safety
    /// As [`Gpu::apply_check`].
    pub unsafe fn apply_verified(
        &self,
        chunks: &[ApplyInput],
        seed: bool,
        held: &[u64],
        expected: &[u64],
    ) -> Result<Vec<u64>> {
        // SAFETY: per this function's contract.
        unsafe { self.verified(chunks, seed, held, expected, None) }
    }

    /// [`Gpu::apply_verified`] of a delta whose scatter saves the overwritten bits into
    /// `journal` (see [`Gpu::apply_scatter_journaled`]), for a staged sync that may have to
    /// undo it when a later stage fails.
    ///
    /// # Safety
    /// As [`Gpu::apply_scatter_journaled`].
    pub unsafe fn apply_verified_journaled(
        &self,
        chunks: &[ApplyInput],
        held: &[u64],
        expected: &[u64],
        journal: DevicePtr,
    ) -> Result<Vec<u64>> {
        // SAFETY: per this function's contract.
        unsafe { self.verified(chunks, false, held, expected, Some(journal)) }
    }

    unsafe fn verified(
        &self,
        chunks: &[ApplyInput],
        seed: bool,
        held: &[u64],
        expected: &[u64],
        journal: Option<DevicePtr>,
    ) -> Result<Vec<u64>> {
        if held.len() != expected.len() {
            return Err(CudaError::InvalidArgument(
                "held and expected digests differ in length".into(),
            ));
        }
        // SAFETY: per this function's contract.
        let check = unsafe { self.apply_check(chunks, seed, expected.len())? };
        if let Some(e) = check.errors.first() {
            return Err(CudaError::BadChunk {
                chunk: e.chunk,
                reason: e.reason,
            });
        }
        let new: Vec<u64> = check
            .digest_change
            .iter()
            .zip(held)
            .map(|(&d, &h)| if seed { d } else { h.wrapping_add(d) })
            .collect();
        for (slot, (&a, &e)) in new.iter().zip(expected).enumerate() {
            if a != e {
                return Err(CudaError::DigestMismatch {
                    slot: slot as u32,
                    expected: e,
                    actual: a,
                });
            }
        }
        // SAFETY: per this function's contract; every chunk checked clean.
        unsafe { self.scatter(chunks, journal)? };
        Ok(new)
    }
}

/// Most changes per apply table entry of an all/abs32 chunk (a default grid cell's worth).
const APPLY_SEGMENT: u64 = 1 << 20;

/// Host-side checks of apply chunks (what `parse_frame` and the receiver check on the
/// manifest), then the kernel table: (entries, the chunk of each entry).
fn apply_table(
    chunks: &[ApplyInput],
    seed: bool,
    num_slots: usize,
) -> Result<(Vec<KApplyChunk>, Vec<usize>)> {
    let bad = |chunk: usize, reason: &'static str| CudaError::BadChunk { chunk, reason };
    let mut table = Vec::with_capacity(chunks.len());
    let mut owner = Vec::with_capacity(chunks.len());
    for (i, c) in chunks.iter().enumerate() {
        if !matches!(c.width, 1 | 2 | 4) {
            return Err(bad(i, "element width is not 1, 2 or 4"));
        }
        let w = c.width as u64;
        if (c.slot as usize) >= num_slots {
            return Err(bad(i, "slot id beyond the digest table"));
        }
        if c.range == 0 || c.range > u32::MAX as u64 || c.count == 0 || c.count > c.range {
            return Err(bad(i, "needs 1 <= count <= range <= 2^32 - 1"));
        }
        if c.start
            .checked_add(c.range)
            .is_none_or(|end| end > c.slot_numel)
        {
            return Err(bad(i, "chunk lies beyond its slot"));
        }
        let steps = c.positions == ApplyPositions::Steps;
        match c.values {
            ApplyValues::Raw if c.val_len != c.count * w => {
                return Err(bad(
                    i,
                    "raw value section length differs from count * width",
                ));
            }
            ApplyValues::Escaped if !steps => {
                return Err(bad(i, "escaped values come only with steps positions"));
            }
            ApplyValues::Escaped if c.val_len % w != 0 || c.val_len / w > c.count => {
                return Err(bad(
                    i,
                    "escape section not whole elements, or more of them than changes",
                ));
            }
            _ => {}
        }
        if steps && seed {
            return Err(bad(
                i,
                "a seed's values do not depend on what the receiver held",
            ));
        }
        let pos_ok = match c.positions {
            ApplyPositions::All => c.count == c.range && c.pos_len == 0,
            ApplyPositions::Abs32 => c.pos_len == c.count * 4,
            ApplyPositions::Bitmap => c.pos_len == c.range.div_ceil(8),
            ApplyPositions::Steps => c.pos_len == c.range.div_ceil(4),
        };
        if !pos_ok {
            return Err(bad(i, "position section length does not fit its codec"));
        }
        if c.dst % w != 0 || c.val_section % w != 0 {
            return Err(bad(
                i,
                "slot or value section not aligned to the element width",
            ));
        }
        if c.positions != ApplyPositions::All && c.pos_section % 4 != 0 {
            return Err(bad(i, "position section not 4-byte aligned"));
        }
        let entry = KApplyChunk {
            dst: c.dst,
            pos: c.pos_section,
            val: c.val_section,
            start: c.start,
            range: c.range,
            count: c.count,
            salt: slot_salt(c.slot),
            width: c.width as u32,
            pos_codec: c.positions as u32,
            slot: c.slot,
            seed: seed as u32,
            k_begin: 0,
            k_end: c.count,
            journal: 0,
            escapes: c.val_len / w,
            val_raw: (c.values == ApplyValues::Raw) as u32,
            pad: 0,
        };
        // A bitmap is decoded by one block scanning it. The changes of all/abs32 chunks are
        // independent and could be shared out between blocks, but shared out a 7B delta
        // applied slower than with a block per chunk (docs/data/gpu-sync/README.md, "Figures
        // behind the code"): APPLY_SEGMENT is kept at a whole grid cell.
        let step = if matches!(c.positions, ApplyPositions::Bitmap | ApplyPositions::Steps) {
            c.count
        } else {
            APPLY_SEGMENT
        };
        let mut k = 0;
        while k < c.count {
            let end = (k + step).min(c.count);
            table.push(KApplyChunk {
                k_begin: k,
                k_end: end,
                ..entry
            });
            owner.push(i);
            k = end;
        }
    }
    Ok((table, owner))
}
