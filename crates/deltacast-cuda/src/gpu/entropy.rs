//! Host side of kernels/entropy.cu: the core's `gaps` and `ulp` sections sized, written and
//! decoded on the GPU, byte for byte as `deltacast::codec` writes them.

use super::context::Gpu;
use super::context::{Args, MAX_GRID};
use super::driver::{drv, guarded};
use crate::error::{CudaError, Result};
use crate::{
    apply_error_reason, ChunkError, CodeChunk, CodePlace, CodeSizes, CodeValues, DecodeInput,
    DecodePositions, DeviceBuffer, DevicePtr,
};
use cudarc::driver::result as cu;

/// Items per coding block (docs/codecs.md).
const BLOCK: u64 = 1024;
const GAPS_DIR: u64 = 7;
const ULP_DIR: u64 = 4;
/// Warps per CUDA block of `dc_code_size`.
const SIZE_WARPS: u64 = 4;
/// Bytes a decoder may read past the end of a section (its look-ahead).
pub const DECODE_SLACK: u64 = 64;

// Host twins of the kernel structs (kernels/entropy.cu).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KCodeChunk {
    pos: u64,
    new_bits: u64,
    old_bits: u64,
    count: u64,
    start: u64,
    range: u64,
    block0: u64,
    gaps_dst: u64,
    vals_dst: u64,
    width: u32,
    vals_codec: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KDecodeChunk {
    pos_sec: u64,
    pos_len: u64,
    val_sec: u64,
    val_len: u64,
    held: u64,
    start: u64,
    range: u64,
    count: u64,
    block0: u64,
    pos_out: u64,
    val_out: u64,
    width: u32,
    /// POS_ABS32, POS_GAPS or POS_ALL of kernels/entropy.cu.
    positions: u32,
}

const POS_ABS32: u32 = 0;
const POS_GAPS: u32 = 1;
const POS_ALL: u32 = 2;

/// A `holes` chunk: its decoded holes (sorted, `holes_count` of them) turned into the
/// `count` positions of its changes at `out` (kernels/entropy.cu, `dc_holes_complement`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KHolesChunk {
    holes: u64,
    out: u64,
    holes_count: u64,
    range: u64,
    count: u64,
    /// The kernel chunk that decoded the holes: skipped when it failed.
    chunk: u64,
}

/// A bitmap chunk with ulp values: its set bits listed at `out` (kernels/entropy.cu,
/// `dc_bitmap_list`).
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct KListChunk {
    bitmap: u64,
    out: u64,
    range: u64,
    count: u64,
}

/// Device memory the entropy coder keeps between sizing and writing (and reuses across
/// syncs, so a sync allocates nothing once it has seen its largest delta).
pub struct CodeScratch {
    buf: Option<DeviceBuffer>,
    /// What the last [`Gpu::entropy_size`] sized: (chunks, blocks, a fingerprint of the
    /// chunks), so that [`Gpu::entropy_write`] can refuse other chunks.
    sized: Option<(usize, u64, u64)>,
}

impl Default for CodeScratch {
    fn default() -> Self {
        CodeScratch::new()
    }
}

impl CodeScratch {
    pub fn new() -> Self {
        CodeScratch {
            buf: None,
            sized: None,
        }
    }

    /// Device bytes held.
    pub fn len(&self) -> u64 {
        self.buf.as_ref().map_or(0, |b| b.len() as u64)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// Offsets of the regions of a [`CodeScratch`] for `nc` chunks and `nb` blocks.
#[derive(Clone, Copy)]
struct Layout {
    table: u64,
    block0: u64,
    counts: u64,
    block_chunk: u64,
    gbits: u64,
    gk: u64,
    ubits: u64,
    ukc: u64,
    goff: u64,
    uoff: u64,
    totals: u64,
    errors: u64,
    len: u64,
}

impl Layout {
    fn new(nc: u64, nb: u64, entry: u64) -> Layout {
        let a8 = |x: u64| x.next_multiple_of(8);
        let table = 0;
        let block0 = a8(table + nc * entry);
        let counts = block0 + nc * 8;
        let block_chunk = counts + nc * 8;
        let per_block = a8(nb * 4);
        let gbits = a8(block_chunk + nb * 4);
        let gk = gbits + per_block;
        let ubits = gk + per_block;
        let ukc = ubits + per_block;
        let goff = ukc + per_block;
        let uoff = goff + per_block;
        let totals = uoff + per_block;
        let errors = totals + nc * 16;
        let len = errors + a8(nc * 4);
        Layout {
            table,
            block0,
            counts,
            block_chunk,
            gbits,
            gk,
            ubits,
            ukc,
            goff,
            uoff,
            totals,
            errors,
            len,
        }
    }
}

/// The chunks' first global block and their block counts.
fn blocks_of(counts: impl Iterator<Item = u64>) -> (Vec<u64>, u64) {
    let mut total = 0u64;
    let block0 = counts
        .map(|n| {
            let b = total;
            total += n.div_ceil(BLOCK);
            b
        })
        .collect();
    (block0, total)
}

fn fingerprint(chunks: &[CodeChunk]) -> u64 {
    chunks.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, c| {
        [
            c.positions,
            c.new_bits,
            c.old_bits,
            c.count,
            c.start,
            c.range,
            c.width as u64,
        ]
        .iter()
        .fold(h, |h, &v| (h ^ v).wrapping_mul(0x100_0000_01b3))
    })
}

/// Whether `DELTACAST_ENTROPY_PROFILE=1` asks for each kernel's device time on stderr.
fn profiling() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("DELTACAST_ENTROPY_PROFILE").is_ok_and(|v| v == "1"))
}

impl Gpu {
    /// Runs one launch; when profiling, synchronises around it and prints its device time.
    fn step(&self, name: &str, f: impl FnOnce() -> Result<()>) -> Result<()> {
        if !profiling() {
            return f();
        }
        let ms = self.time_ms(f)?;
        eprintln!("entropy profile: {name} {ms:.3} ms");
        Ok(())
    }

    fn code_scratch(&self, scratch: &mut CodeScratch, len: u64) -> Result<DevicePtr> {
        let len = (len.max(256) as usize).next_power_of_two();
        if scratch.buf.as_ref().is_none_or(|b| b.len() < len) {
            scratch.buf = None;
            scratch.buf = Some(self.alloc(len)?);
        }
        Ok(scratch.buf.as_ref().map_or(0, |b| b.ptr()))
    }

    /// Sizes every chunk in the two entropy codecs exactly (the best parameters of each block,
    /// as the CPU encoder picks them) and keeps the block parameters in `scratch` for
    /// [`Gpu::entropy_write`]. Synchronises once.
    ///
    /// # Safety
    /// Every chunk's `positions` (u64), `new_bits` and `old_bits` must hold `count` items and
    /// be readable [`DECODE_SLACK`] bytes past them (the kernels read 16-byte vectors).
    pub unsafe fn entropy_size(
        &self,
        scratch: &mut CodeScratch,
        chunks: &[CodeChunk],
    ) -> Result<Vec<CodeSizes>> {
        guarded(|| {
            self.bind()?;
            scratch.sized = None;
            for (i, c) in chunks.iter().enumerate() {
                if c.count == 0 || c.count > c.range || c.range > u32::MAX as u64 {
                    return Err(CudaError::InvalidArgument(format!(
                        "entropy chunk {i}: needs 1 <= count <= range <= 2^32 - 1"
                    )));
                }
                if !matches!(c.width, 1 | 2 | 4) || c.positions % 8 != 0 {
                    return Err(CudaError::InvalidArgument(format!(
                        "entropy chunk {i}: width {} or alignment",
                        c.width
                    )));
                }
            }
            let nc = chunks.len() as u64;
            if nc == 0 {
                scratch.sized = Some((0, 0, fingerprint(chunks)));
                return Ok(Vec::new());
            }
            let (block0, nb) = blocks_of(chunks.iter().map(|c| c.count));
            let lay = Layout::new(nc, nb, std::mem::size_of::<KCodeChunk>() as u64);
            let base = self.code_scratch(scratch, lay.len)?;
            let table = code_table(chunks, &block0, None)?;
            let counts: Vec<u64> = chunks.iter().map(|c| c.count).collect();
            self.upload_typed(base + lay.table, &table)?;
            self.upload_typed(base + lay.block0, &block0)?;
            self.upload_typed(base + lay.counts, &counts)?;
            self.launch_block_chunk(base, &lay, nc)?;
            self.step("dc_code_size", || {
                self.launch(
                    "dc_code_size",
                    nb.div_ceil(SIZE_WARPS).min(MAX_GRID * 4),
                    (SIZE_WARPS * 32) as u32,
                    Args::new()
                        .push(base + lay.table)
                        .push(base + lay.block_chunk)
                        .push(nb)
                        .push(base + lay.gbits)
                        .push(base + lay.gk)
                        .push(base + lay.ubits)
                        .push(base + lay.ukc),
                )
            })?;
            self.launch_totals(base, &lay, nc)?;
            let totals: Vec<u64> = self.download_typed(base + lay.totals, 2 * nc as usize)?;
            scratch.sized = Some((chunks.len(), nb, fingerprint(chunks)));
            Ok(chunks
                .iter()
                .zip(totals.chunks_exact(2))
                .map(|(c, t)| {
                    let blocks = c.count.div_ceil(BLOCK);
                    CodeSizes {
                        gaps: GAPS_DIR * blocks + t[0].div_ceil(8),
                        ulp: ULP_DIR * blocks + t[1].div_ceil(8),
                    }
                })
                .collect())
        })
    }

    /// Writes the sections the caller chose for the chunks last sized into `scratch` (the
    /// same chunks, in the same order). Destinations must be zeroed, 4-byte aligned, with
    /// room for the section rounded up to whole u32 words, and disjoint. Synchronises once.
    ///
    /// # Safety
    /// As [`Gpu::entropy_size`]; every destination valid for its section.
    pub unsafe fn entropy_write(
        &self,
        scratch: &mut CodeScratch,
        chunks: &[CodeChunk],
        places: &[CodePlace],
    ) -> Result<()> {
        guarded(|| {
            self.bind()?;
            let Some((n, nb, print)) = scratch.sized else {
                return Err(CudaError::InvalidArgument(
                    "entropy_write before entropy_size".into(),
                ));
            };
            if n != chunks.len() || places.len() != n || print != fingerprint(chunks) {
                return Err(CudaError::InvalidArgument(
                    "entropy_write: not the chunks last sized".into(),
                ));
            }
            if n == 0 {
                return Ok(());
            }
            let nc = n as u64;
            let (block0, _) = blocks_of(chunks.iter().map(|c| c.count));
            let lay = Layout::new(nc, nb, std::mem::size_of::<KCodeChunk>() as u64);
            let base = scratch.buf.as_ref().map_or(0, |b| b.ptr());
            let table = code_table(chunks, &block0, Some(places))?;
            self.upload_typed(base + lay.table, &table)?;
            self.launch_per_block(
                "dc_code_write",
                base,
                &lay,
                nb,
                &[lay.gbits, lay.gk, lay.ubits, lay.ukc, lay.goff, lay.uoff],
            )?;
            self.sync()
        })
    }

    /// Decodes the gaps positions (into `u32` relative positions) and ulp values (into raw
    /// new bits, from the bits the slot holds) of the chunks, with every check of the CPU
    /// decoders. Returns the chunks that failed (nothing else is written then but the
    /// outputs). Synchronises twice (the streams' lengths are checked on the host before any
    /// decoder reads them).
    ///
    /// # Safety
    /// Every section (abs32 ones too) must be readable for its length plus [`DECODE_SLACK`]
    /// bytes, every output valid for `count` items (gaps outputs: plus [`DECODE_SLACK`], as
    /// the ulp decoder reads them back), `held` for the slot's bytes.
    pub unsafe fn entropy_decode(
        &self,
        scratch: &mut CodeScratch,
        inputs: &[DecodeInput],
    ) -> Result<Vec<ChunkError>> {
        guarded(|| {
            self.bind()?;
            scratch.sized = None;
            if inputs.is_empty() {
                return Ok(Vec::new());
            }
            let mut bad: Vec<ChunkError> = Vec::new();
            // The kernels' chunks: one per input, but two for a `holes` input with ulp values
            // (its holes' gaps, then its values over the complement); `owner` maps them back.
            let mut table = Vec::with_capacity(inputs.len());
            let mut owner = Vec::with_capacity(inputs.len());
            let mut holes = Vec::new();
            let mut lists = Vec::new();
            for (i, c) in inputs.iter().enumerate() {
                let arg =
                    |why: &str| CudaError::InvalidArgument(format!("decode chunk {i}: {why}"));
                if c.count == 0 || c.count > c.range || c.range > u32::MAX as u64 {
                    return Err(arg("needs 1 <= count <= range <= 2^32 - 1"));
                }
                if c.start
                    .checked_add(c.range)
                    .is_none_or(|e| e > c.slot_numel)
                {
                    return Err(arg("lies beyond its slot"));
                }
                if !matches!(c.width, 1 | 2 | 4) || c.held % c.width as u64 != 0 {
                    return Err(arg("width or alignment of the slot"));
                }
                let (val_sec, val_len, val_out) = c.values.unwrap_or((0, 0, 0));
                if val_sec % 4 != 0 || val_out % c.width as u64 != 0 {
                    return Err(arg("misaligned value section or output"));
                }
                let entry = |pos_sec, pos_len, pos_out, positions, count, values: bool| {
                    let (val_sec, val_len, val_out) = if values {
                        (val_sec, val_len, val_out)
                    } else {
                        (0, 0, 0)
                    };
                    KDecodeChunk {
                        pos_sec,
                        pos_len,
                        val_sec,
                        val_len,
                        held: c.held,
                        start: c.start,
                        range: c.range,
                        count,
                        block0: 0,
                        pos_out,
                        val_out,
                        width: c.width as u32,
                        positions,
                    }
                };
                let mut parts = Vec::with_capacity(2);
                match c.positions {
                    DecodePositions::Gaps { section, len, out } => {
                        parts.push(entry(section, len, out, POS_GAPS, c.count, true))
                    }
                    DecodePositions::Abs32 { section, len } => {
                        parts.push(entry(section, len, 0, POS_ABS32, c.count, true))
                    }
                    DecodePositions::All => {
                        if c.count != c.range {
                            return Err(arg("all positions need count == range"));
                        }
                        parts.push(entry(0, 0, 0, POS_ALL, c.count, true))
                    }
                    DecodePositions::Holes {
                        section,
                        len,
                        holes: at,
                        out,
                    } => {
                        let nh = c.range - c.count;
                        if nh == 0 {
                            return Err(arg("holes positions need a hole (else all)"));
                        }
                        if at % 4 != 0 {
                            return Err(arg("misaligned holes output"));
                        }
                        parts.push(entry(section, len, at, POS_GAPS, nh, false));
                        holes.push(KHolesChunk {
                            holes: at,
                            out,
                            holes_count: nh,
                            range: c.range,
                            count: c.count,
                            chunk: table.len() as u64,
                        });
                        if val_sec != 0 {
                            parts.push(entry(out, 4 * c.count, 0, POS_ABS32, c.count, true));
                        }
                    }
                    DecodePositions::Bitmap { section, len, out } => {
                        if section % 4 != 0 || out % 4 != 0 || len != c.range.div_ceil(8) {
                            return Err(arg(
                                "bitmap section misaligned or not ceil(range / 8) bytes",
                            ));
                        }
                        lists.push(KListChunk {
                            bitmap: section,
                            out,
                            range: c.range,
                            count: c.count,
                        });
                        parts.push(entry(out, 4 * c.count, 0, POS_ABS32, c.count, true));
                    }
                }
                for k in parts {
                    if k.pos_sec % 4 != 0 || k.pos_out % 4 != 0 {
                        return Err(arg("misaligned position section or output"));
                    }
                    if k.positions != POS_GAPS && k.val_sec == 0 {
                        return Err(arg("nothing to decode"));
                    }
                    // Lengths the directories need: a chunk that lacks them is refused here.
                    let blocks = k.count.div_ceil(BLOCK);
                    let short_pos = match k.positions {
                        POS_GAPS => k.pos_len < GAPS_DIR * blocks,
                        POS_ABS32 => k.pos_len != 4 * k.count,
                        _ => false,
                    };
                    if short_pos || (k.val_sec != 0 && k.val_len < ULP_DIR * blocks) {
                        bad.push(ChunkError {
                            chunk: i,
                            reason: "a section is shorter than its directory",
                        });
                    }
                    table.push(k);
                    owner.push(i);
                }
            }
            if !bad.is_empty() {
                bad.dedup_by_key(|e| e.chunk);
                return Ok(bad);
            }
            let nc = table.len() as u64;
            let (block0, nb) = blocks_of(table.iter().map(|k| k.count));
            for (k, &b0) in table.iter_mut().zip(&block0) {
                k.block0 = b0;
            }
            let lay = Layout::new(nc, nb, std::mem::size_of::<KDecodeChunk>() as u64);
            let holes_at = lay.len.next_multiple_of(8);
            let lists_at =
                holes_at + holes.len() as u64 * std::mem::size_of::<KHolesChunk>() as u64;
            let lists_len = lists.len() as u64 * std::mem::size_of::<KListChunk>() as u64;
            let base = self.code_scratch(scratch, lists_at + lists_len)?;
            let counts: Vec<u64> = table.iter().map(|k| k.count).collect();
            self.upload_typed(base + lay.table, &table)?;
            self.upload_typed(base + lay.block0, &block0)?;
            self.upload_typed(base + lay.counts, &counts)?;
            if !holes.is_empty() {
                self.upload_typed(base + holes_at, &holes)?;
            }
            if !lists.is_empty() {
                self.upload_typed(base + lists_at, &lists)?;
            }
            // SAFETY: inside the scratch region.
            unsafe { cu::memset_d8_async(base + lay.errors, 0, (nc * 4) as usize, self.stream) }
                .map_err(drv("cuMemsetD8"))?;
            self.launch_block_chunk(base, &lay, nc)?;
            self.launch_per_block(
                "dc_code_dirs",
                base,
                &lay,
                nb,
                &[lay.gbits, lay.gk, lay.ubits, lay.ukc, lay.errors],
            )?;
            self.launch_totals(base, &lay, nc)?;
            let totals: Vec<u64> = self.download_typed(base + lay.totals, 2 * nc as usize)?;
            let codes: Vec<u32> = self.download_typed(base + lay.errors, nc as usize)?;
            for (i, ((c, t), &code)) in table
                .iter()
                .zip(totals.chunks_exact(2))
                .zip(&codes)
                .enumerate()
            {
                let blocks = c.count.div_ceil(BLOCK);
                let exact = |len: u64, dir: u64, bits: u64| len == dir * blocks + bits.div_ceil(8);
                let lengths_ok = (c.positions != POS_GAPS || exact(c.pos_len, GAPS_DIR, t[0]))
                    && (c.val_sec == 0 || exact(c.val_len, ULP_DIR, t[1]));
                if code != 0 {
                    bad.push(ChunkError {
                        chunk: owner[i],
                        reason: apply_error_reason(code),
                    });
                } else if !lengths_ok {
                    bad.push(ChunkError {
                        chunk: owner[i],
                        reason: "a code stream's length differs from its directory's bit counts",
                    });
                }
            }
            if !bad.is_empty() {
                bad.dedup_by_key(|e| e.chunk);
                return Ok(bad);
            }
            self.launch_per_block(
                "dc_gaps_decode",
                base,
                &lay,
                nb,
                &[lay.gbits, lay.gk, lay.goff, lay.errors],
            )?;
            if !holes.is_empty() {
                let n = holes.len() as u64;
                self.step("dc_holes_complement", || {
                    self.launch(
                        "dc_holes_complement",
                        n.min(MAX_GRID),
                        256,
                        Args::new()
                            .push(base + holes_at)
                            .push(n)
                            .push(base + lay.errors),
                    )
                })?;
            }
            if !lists.is_empty() {
                let n = lists.len() as u64;
                self.step("dc_bitmap_list", || {
                    self.launch(
                        "dc_bitmap_list",
                        n.min(MAX_GRID),
                        256,
                        Args::new().push(base + lists_at).push(n),
                    )
                })?;
            }
            self.launch_per_block(
                "dc_ulp_decode",
                base,
                &lay,
                nb,
                &[lay.ubits, lay.ukc, lay.uoff, lay.errors],
            )?;
            let codes: Vec<u32> = self.download_typed(base + lay.errors, nc as usize)?;
            let mut bad: Vec<ChunkError> = codes
                .iter()
                .zip(&owner)
                .filter(|(&c, _)| c != 0)
                .map(|(&c, &chunk)| ChunkError {
                    chunk,
                    reason: apply_error_reason(c),
                })
                .collect();
            bad.dedup_by_key(|e| e.chunk);
            Ok(bad)
        })
    }

    /// Launches a one-thread-per-block kernel: (chunk table, block -> chunk, blocks, then
    /// the scratch regions at `regions`).
    fn launch_per_block(
        &self,
        name: &'static str,
        base: DevicePtr,
        lay: &Layout,
        nb: u64,
        regions: &[u64],
    ) -> Result<()> {
        let args = regions.iter().fold(
            Args::new()
                .push(base + lay.table)
                .push(base + lay.block_chunk)
                .push(nb),
            |a, &r| a.push(base + r),
        );
        self.step(name, || {
            self.launch(name, nb.div_ceil(128).min(MAX_GRID * 4), 128, args)
        })
    }

    fn launch_block_chunk(&self, base: DevicePtr, lay: &Layout, nc: u64) -> Result<()> {
        self.step("dc_code_block_chunk", || {
            self.launch(
                "dc_code_block_chunk",
                nc.div_ceil(256).min(MAX_GRID),
                256,
                Args::new()
                    .push(base + lay.block0)
                    .push(base + lay.counts)
                    .push(nc)
                    .push(base + lay.block_chunk),
            )
        })
    }

    fn launch_totals(&self, base: DevicePtr, lay: &Layout, nc: u64) -> Result<()> {
        self.step("dc_code_totals", || {
            self.launch(
                "dc_code_totals",
                nc.min(MAX_GRID),
                256,
                Args::new()
                    .push(base + lay.block0)
                    .push(base + lay.counts)
                    .push(nc)
                    .push(base + lay.gbits)
                    .push(base + lay.ubits)
                    .push(base + lay.goff)
                    .push(base + lay.uoff)
                    .push(base + lay.totals),
            )
        })
    }
}

/// The kernel table of the sender's chunks, with their destinations when placed.
fn code_table(
    chunks: &[CodeChunk],
    block0: &[u64],
    places: Option<&[CodePlace]>,
) -> Result<Vec<KCodeChunk>> {
    chunks
        .iter()
        .zip(block0)
        .enumerate()
        .map(|(i, (c, &b0))| {
            let place = places.map(|p| p[i]).unwrap_or_default();
            let (vals_codec, vals_dst) = match place.values {
                None => (0, 0),
                Some((CodeValues::Ulp, dst)) => (1, dst),
                Some((CodeValues::Raw, dst)) => (2, dst),
            };
            let gaps_dst = place.gaps.unwrap_or(0);
            let null = place.gaps == Some(0) || (place.values.is_some() && vals_dst == 0);
            if !gaps_dst.is_multiple_of(4) || !vals_dst.is_multiple_of(4) || null {
                return Err(CudaError::InvalidArgument(format!(
                    "entropy chunk {i}: destination misaligned or null"
                )));
            }
            Ok(KCodeChunk {
                pos: c.positions,
                new_bits: c.new_bits,
                old_bits: c.old_bits,
                count: c.count,
                start: c.start,
                range: c.range,
                block0: b0,
                gaps_dst,
                vals_dst,
                width: c.width as u32,
                vals_codec,
            })
        })
        .collect()
}
