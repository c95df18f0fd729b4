//! GPU kernels for deltacast: the batched bit-exact diff with snapshot refresh, the `abs32` and
//! `bitmap` position encoders on a chunk grid, the verified decode + scatter apply of a receiver,
//! and the state digest (full and O(changed)). Every kernel gives the same bits as its CPU twin
//! in the `deltacast` crate.
//!
//! # Building
//!
//! Without the `cuda` feature (the default) the crate builds everywhere and every entry point
//! returns [`CudaError::NotBuilt`], like candle. With it, [cudarc](https://docs.rs/cudarc) is used with
//! `dynamic-loading`: `libcuda` and `libnvrtc` are opened at run time, so the build needs no
//! CUDA, and a machine without them gets [`CudaError::DriverNotFound`] /
//! [`CudaError::NvrtcNotFound`] from [`Gpu::new`], never a crash.
//!
//! cudarc itself panics when a library or a symbol is missing. This crate (1) probes the library
//! first (`is_culib_present`, a plain `dlopen`), and (2) runs every call into cudarc inside
//! `catch_unwind`, turning a panic into [`CudaError::Panicked`]. (2) relies on unwinding: a build
//! with `panic = "abort"` keeps (1) but loses (2). Set `DELTACAST_CUDA_PATH` /
//! `DELTACAST_NVRTC_PATH` to a library file to load that one first (cudarc's own lookup then
//! finds it by its soname); otherwise the usual `dlopen` search (`LD_LIBRARY_PATH`, ldconfig).
//!
//! # Kernels
//!
//! The kernels are CUDA C source in `kernels/*.cu` (no headers, see [`KERNELS`]), compiled at
//! run time by NVRTC to PTX for the device's compute capability, once per process and
//! architecture, and loaded once per [`Gpu`]. `scripts/check-kernels.sh` compile-checks them
//! in CI with the NVRTC wheel from PyPI, no GPU needed (`examples/check_kernels.rs`).
//!
//! # Memory
//!
//! Entry points take raw device pointers ([`DevicePtr`]): torch tensors are borrowed by pointer
//! and never freed here. They are `unsafe` because the caller vouches that the pointers are
//! valid for the sizes given. [`DeviceBuffer`] is an owned allocation for everything else;
//! [`HostBuffer`] is page-locked host memory mapped into the device, which kernels read and
//! write in place over PCIe (the sender's snapshot can live there).
//! All work runs in order on the [`Gpu`]'s own stream; a method that returns host data
//! synchronises that stream once (never once per tensor).
//!
//! xxh3 frame checksums stay on the CPU: frames are assembled and checksummed on the host.

mod error;
pub use error::{CudaError, Result, NOT_BUILT};

pub mod choice;
mod deadline;
pub mod ipc_frame;
pub mod ipc_setup;
pub mod protocol;

#[cfg(feature = "cuda")]
pub mod frame_link;
#[cfg(feature = "cuda")]
mod gpu;
#[cfg(feature = "cuda")]
pub mod ipc;
#[cfg(feature = "cuda")]
pub mod link;
#[cfg(feature = "cuda")]
pub mod nccl;
#[cfg(feature = "cuda")]
pub mod sync;
#[cfg(feature = "cuda")]
mod wait;
#[cfg(feature = "cuda")]
pub use gpu::{
    compile_kernel, compile_kernel_tuned, nvrtc_present, CodeScratch, DeviceBuffer, Fp8Plan, Gpu,
    GpuEvent, GpuStream, HostBuffer, DECODE_SLACK,
};

#[cfg(not(feature = "cuda"))]
mod stub;
#[cfg(not(feature = "cuda"))]
pub use stub::{
    compile_kernel, compile_kernel_tuned, nvrtc_present, CodeScratch, DeviceBuffer, Fp8Plan, Gpu,
    GpuEvent, GpuStream, HostBuffer, DECODE_SLACK,
};

/// A device address (`CUdeviceptr`).
pub type DevicePtr = u64;

pub use deltacast::Bf16Rule;

/// The kernels' conversion word of a source (kernels/common.cuh, `DC_FROM_F32`): 0 for bits
/// read as they are, `0x10000 | nan` for fp32 rounded to bf16.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn convert_word(rule: Option<Bf16Rule>) -> u32 {
    rule.map_or(0, |r| 0x1_0000 | r.nan as u32)
}

/// Whether this build carries the GPU path (the `cuda` feature).
pub const fn is_built() -> bool {
    cfg!(feature = "cuda")
}

/// The text every kernel file is compiled with in front of it.
pub const PRELUDE: &str = include_str!("../kernels/common.cuh");

/// Every kernel source file: (name, CUDA C source without the prelude).
pub const KERNELS: &[(&str, &str)] = &[
    ("diff", include_str!("../kernels/diff.cu")),
    ("encode", include_str!("../kernels/encode.cu")),
    ("apply", include_str!("../kernels/apply.cu")),
    ("digest", include_str!("../kernels/digest.cu")),
    ("entropy", include_str!("../kernels/entropy.cu")),
    ("quant", include_str!("../kernels/quant.cu")),
];

/// The full program NVRTC compiles for kernel file `name` (prelude + source).
pub fn kernel_program(name: &str) -> Option<String> {
    KERNELS
        .iter()
        .find(|(n, _)| *n == name)
        .map(|(_, src)| format!("{PRELUDE}\n#line 1 \"{name}.cu\"\n{src}"))
}

/// Compile-time knobs of the diff kernel (kernels/diff.cu). The default is the fastest of the
/// tunings swept (docs/data/gpu-diff/README.md);
/// `DELTACAST_DIFF_TUNING=items,min_blocks,reload[,prefetch[,stash[,direct]]]` overrides it
/// (benches).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct DiffTuning {
    /// 16-byte vectors per thread and array: a tile is `256 * 16 * items` bytes (1..=4: the
    /// map diffs stash a tile's changed vectors in shared memory).
    pub items: u32,
    /// Blocks per multiprocessor asked of the register allocator (`__launch_bounds__`).
    pub min_blocks: u32,
    /// Keep only change masks across the block scan; re-read changed vectors to write.
    pub reload: bool,
    /// Tiles ahead whose lines each block of the diff asks the L2 to fetch (0: none), so that
    /// the block diffing that tile later finds it there (device snapshots; at most 8192).
    /// The default, 264, is two tiles per multiprocessor of an H200 (132 of them): it raises
    /// the diff's share of a device copy, while four times as far lowers it below no prefetch
    /// (docs/data/gpu-diff/README.md, "Figures behind the code").
    pub prefetch: u32,
    /// With `reload`: the write phase reads each warp's changed vectors
    /// from shared memory, stashed there as they were compared, instead of again from L2,
    /// which raises the diff's share of a device copy (docs/data/gpu-diff/README.md, "Figures
    /// behind the code").
    pub stash: bool,
    /// Always one pass instead of three: each tile finds its place in the output by a
    /// decoupled look-back over the tiles before it and writes its changes (and digest change)
    /// there, instead of to a scratch slot that a second kernel copies out. Without it, one
    /// pass runs only when the caller expects a density above [`ONE_PASS_ABOVE`].
    pub direct: bool,
}

impl Default for DiffTuning {
    fn default() -> Self {
        DiffTuning {
            items: 4,
            min_blocks: 4,
            reload: true,
            prefetch: 264,
            stash: true,
            direct: false,
        }
    }
}

impl DiffTuning {
    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn defines(&self) -> Vec<String> {
        vec![
            format!("-DDIFF_ITEMS={}", self.items),
            format!("-DDIFF_MINBLOCKS={}", self.min_blocks),
            format!("-DDIFF_RELOAD={}", self.reload as u32),
            format!("-DDIFF_PREFETCH={}", self.prefetch),
            format!("-DDIFF_STASH={}", self.stash as u32),
        ]
    }

    #[cfg_attr(not(feature = "cuda"), allow(dead_code))]
    pub(crate) fn tile_bytes(&self) -> u64 {
        256 * 16 * self.items as u64
    }

    /// Checks every knob's range.
    pub fn validate(&self) -> Result<()> {
        if (1..=4).contains(&self.items)
            && (1..=8).contains(&self.min_blocks)
            && self.prefetch <= 8192
            && (!self.stash || self.reload)
        {
            Ok(())
        } else {
            Err(CudaError::InvalidArgument(format!(
                "diff tuning {self:?}: items must lie in 1..=4, min_blocks in 1..=8, prefetch \
                 in 0..=8192; stash needs reload"
            )))
        }
    }

    /// The tuning from `DELTACAST_DIFF_TUNING`
    /// (`items,min_blocks,reload[,prefetch[,stash[,direct]]]`), else the default.
    pub fn from_env() -> Result<Self> {
        match std::env::var("DELTACAST_DIFF_TUNING") {
            Ok(text) => Self::parse(&text),
            Err(_) => Ok(DiffTuning::default()),
        }
    }

    /// `items,min_blocks,reload[,prefetch[,stash[,direct]]]`, e.g. `4,4,1,264` or
    /// `4,4,1,264,1,1`; without `prefetch` or `direct`, the default's.
    pub fn parse(text: &str) -> Result<Self> {
        let bad = || {
            CudaError::InvalidArgument(format!(
                "DELTACAST_DIFF_TUNING={text}: expected \
                 items,min_blocks,reload[,prefetch[,stash[,direct]]] (e.g. 4,4,1,264)"
            ))
        };
        let parts: Vec<u32> = text
            .split(',')
            .map(|p| p.trim().parse().map_err(|_| bad()))
            .collect::<Result<_>>()?;
        let (items, min_blocks, reload, rest) = match parts[..] {
            [items, min_blocks, reload @ (0 | 1), ref rest @ ..] if rest.len() <= 3 => {
                (items, min_blocks, reload == 1, rest)
            }
            _ => return Err(bad()),
        };
        let tuning = DiffTuning {
            items,
            min_blocks,
            reload,
            prefetch: rest
                .first()
                .copied()
                .unwrap_or(DiffTuning::default().prefetch),
            // Without the field: on wherever it applies, as in the default.
            stash: match rest.get(1) {
                None => reload,
                Some(0) => false,
                Some(1) => true,
                Some(_) => return Err(bad()),
            },
            direct: match rest.get(2) {
                None => DiffTuning::default().direct,
                Some(0) => false,
                Some(1) => true,
                Some(_) => return Err(bad()),
            },
        };
        tuning.validate().map_err(|_| bad())?;
        Ok(tuning)
    }
}

/// One tensor to quantize to block FP8 ([`Gpu::fp8_quantize`]): fp32 elements of `shape` (two
/// or more dimensions) at `src`, into as many E4M3FN bytes at `dst` and one fp32 scale per
/// 128×128 block at `scales` (`deltacast::convert::fp8::BlockGrid::scale_shape`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fp8Job {
    pub src: DevicePtr,
    pub dst: DevicePtr,
    pub scales: DevicePtr,
    pub shape: Vec<u64>,
}

/// One tensor of a batched diff ([`Gpu::diff_batch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiffInput {
    /// The snapshot (`numel * width` bytes), refreshed in place for the changed elements.
    pub snapshot: DevicePtr,
    /// The current bits, same size.
    pub current: DevicePtr,
    pub numel: u64,
    /// Element width in bytes: 1, 2 or 4.
    pub width: usize,
    /// Slot index of element 0 (positions come out as `first_index + element`).
    pub first_index: u64,
    /// When set, `Σ h(new) − h(old)` of this tensor's changes is added (wrapping) to the u64
    /// at `.0`, with the slot id `.1` choosing the salt: the O(changed) digest update, fused.
    pub digest: Option<(DevicePtr, u32)>,
    /// When set, `current` holds `numel` fp32 elements (twice the snapshot's bytes, aligned to
    /// 4) that the diff rounds to the bf16 of this width-2 tensor as it reads them, by this
    /// rule: fp32 master weights diff against a bf16 snapshot with no converted copy.
    pub f32_source: Option<Bf16Rule>,
}

/// Share of a diff's elements expected to change above which the diff runs in one pass
/// ([`DiffOutput::expected`]): a tile's scratch slot holds about 4 % of its elements (an eighth
/// of its bytes, u16 position + new + old bits per change), and a tile with more is read twice.
/// The crossover measured: docs/benchmarks.md, "GPU diff kernel".
pub const ONE_PASS_ABOVE: f64 = 0.04;

/// Where a batched diff writes its changes. Change `g` (in order: tensor after tensor, element
/// order within each) has its position at `positions[g]` (u64) and its bits at byte
/// `g * width` of `new_values` (and `old_values`), `width` being its tensor's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiffOutput {
    /// `capacity` u64.
    pub positions: DevicePtr,
    /// `capacity * largest width in the batch` bytes.
    pub new_values: DevicePtr,
    /// Same size as `new_values`, or `None` to skip the old bits.
    pub old_values: Option<DevicePtr>,
    /// Changes the buffers hold.
    pub capacity: u64,
    /// Changes the caller expects (e.g. the last diff's count for the same tensors), or `None`.
    /// Above [`ONE_PASS_ABOVE`] of the elements the diff runs in one pass: most tiles would
    /// overflow their scratch slot and be diffed twice.
    pub expected: Option<u64>,
}

/// What the diff found in one tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DiffTensorResult {
    /// Index of its first change in the output.
    pub offset: u64,
    /// Changes written (and refreshed in the snapshot).
    pub written: u64,
    /// Changes found; more than `written` only when the output was too small.
    pub found: u64,
    /// Byte offset of its first change's bits in `new_values` / `old_values`.
    pub value_offset: u64,
}

/// The result of [`Gpu::diff_batch`], tensors in input order.
///
/// When the output is too small, the changes that fit are written as a prefix of the full
/// result (whole 16 KiB tiles, in order) and only those are refreshed in the snapshot: running
/// the same diff again yields the rest.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DiffResult {
    pub tensors: Vec<DiffTensorResult>,
    pub found: u64,
    pub written: u64,
    /// Device time of the diff kernels (events around the launches), in milliseconds.
    pub kernel_ms: f32,
}

impl DiffResult {
    /// Whether every change was written.
    pub fn is_complete(&self) -> bool {
        self.found == self.written
    }
}

/// The code a map diff ([`Gpu::diff_map`]) writes: a fixed number of bits per element in a
/// map of fixed place, plus the "escaped" changes' new bits compacted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MapCode {
    /// steps + esc (docs/codecs.md): 2 bits an element; changes other than one step escape.
    Steps,
    /// bitmap + raw: 1 bit an element; every change's new bits are the raw values. What a
    /// dense plain delta wants: no positions listed, no encoding pass after the diff.
    Bitmap,
}

impl MapCode {
    /// Bits of the map per element.
    pub fn bits(self) -> u64 {
        match self {
            MapCode::Steps => 2,
            MapCode::Bitmap => 1,
        }
    }
}

/// Where a map diff ([`Gpu::diff_map`]) writes a stage in `code`: every tensor's codes in the
/// map region at the offsets of [`map_layout`], the escapes' new bits compacted in order
/// (change `g` of the stage's escapes at byte `g * width` of `escapes`, tensors ordered by
/// width as in [`DiffOutput`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MapOutput {
    pub code: MapCode,
    /// `map_layout(.., code).1` bytes.
    pub map: DevicePtr,
    /// `capacity * largest width in the batch` bytes.
    pub escapes: DevicePtr,
    /// Escapes the buffer holds.
    pub capacity: u64,
    /// Elements of each chunk (the last of a tensor may be shorter); rounded up to whole
    /// diff tiles by the diff.
    pub cell_elems: u64,
}

/// Byte offset of each tensor's map in a map diff's map region (16-aligned, room for the
/// codes of every 16-byte vector of the tensor), and the region's length.
pub fn map_layout(inputs: &[DiffInput], code: MapCode) -> (Vec<u64>, u64) {
    let mut at = 0u64;
    let offsets = inputs
        .iter()
        .map(|t| {
            let off = at;
            let vectors = (t.numel * t.width as u64).div_ceil(16);
            let elements = vectors * 16 / t.width as u64;
            at += (elements * code.bits()).div_ceil(8).next_multiple_of(16);
            off
        })
        .collect();
    (offsets, at)
}

/// Changes and escapes of one chunk-sized cell of a map diff.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MapCell {
    pub changes: u32,
    pub escapes: u32,
}

/// What a map diff found in one tensor.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MapTensorResult {
    /// Byte offset of its map in the map region.
    pub map_offset: u64,
    pub changes: u64,
    /// Index of its first escape in the stage's escapes (its bits at `escape0 * width`).
    pub escape0: u64,
    /// Its cells in order, each `cell_elems` elements (the last what remains).
    pub cells: Vec<MapCell>,
}

/// The result of [`Gpu::diff_map`], tensors in input order.
#[derive(Debug, Clone, PartialEq)]
pub struct MapDiff {
    pub code: MapCode,
    pub tensors: Vec<MapTensorResult>,
    pub found: u64,
    pub escapes: u64,
    /// Elements per cell, as the diff rounded them.
    pub cell_elems: u64,
    /// Device time of the diff kernels, in milliseconds.
    pub kernel_ms: f32,
}

impl MapDiff {
    /// Whether every escape was written (else nothing of the stage's codes may be sent: the
    /// snapshots are current, the digest words are not).
    pub fn is_complete(&self, capacity: u64) -> bool {
        self.escapes <= capacity
    }
}

/// One tensor's sorted change list, as input to [`Gpu::encode_positions`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeInput {
    /// Its changes are `positions[change_offset .. change_offset + change_count]`.
    pub change_offset: u64,
    pub change_count: u64,
    /// The tensor covers slot indices `first_index .. first_index + numel`.
    pub first_index: u64,
    pub numel: u64,
}

/// One chunk of the grid, as the core's `flush::encode_changes` forms it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GridChunk {
    /// Which [`EncodeInput`].
    pub input: usize,
    /// Index of the chunk's first change in the positions buffer (its abs32 section is the
    /// u32 at `abs32_out[lo .. lo + count]`).
    pub lo: u64,
    pub count: u64,
    /// Slot index of the first change; positions are relative to it.
    pub start: u64,
    /// Last − first + 1.
    pub range: u64,
    /// Byte offset of its bitmap (`ceil(range / 8)` bytes) in the bitmap buffer.
    pub bitmap_offset: u64,
}

/// Position codec of a chunk to apply (the wire codes of `deltacast::PosCodec`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApplyPositions {
    All = 0,
    Abs32 = 1,
    Bitmap = 3,
    /// The 2-bit codes of the steps + esc pair (docs/codecs.md): positions and most values.
    Steps = 6,
}

/// What a chunk's value section holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ApplyValues {
    /// Every change's new bits.
    #[default]
    Raw,
    /// `steps` positions only: the new bits of the escaped changes (code 3).
    Escaped,
}

impl ApplyPositions {
    /// The GPU codec for a wire codec, if the GPU decodes it.
    pub fn from_pos_codec(codec: deltacast::PosCodec) -> Option<Self> {
        match codec {
            deltacast::PosCodec::All => Some(ApplyPositions::All),
            deltacast::PosCodec::Abs32 => Some(ApplyPositions::Abs32),
            deltacast::PosCodec::Bitmap => Some(ApplyPositions::Bitmap),
            deltacast::PosCodec::Steps => Some(ApplyPositions::Steps),
            _ => None,
        }
    }
}

/// One chunk whose sections are in device memory, to apply to a slot ([`Gpu::apply_check`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApplyInput {
    /// The slot's bytes.
    pub dst: DevicePtr,
    pub slot_numel: u64,
    pub width: usize,
    /// Slot id (salt of the digest, and index of its digest change).
    pub slot: u32,
    pub start: u64,
    pub range: u64,
    pub count: u64,
    pub positions: ApplyPositions,
    /// The position section (4-byte aligned) and its length; ignored for `All`.
    pub pos_section: DevicePtr,
    pub pos_len: u64,
    /// The value section (aligned to the width) and its length.
    pub val_section: DevicePtr,
    pub val_len: u64,
    pub values: ApplyValues,
}

/// Where [`Gpu::apply_scatter_journaled`] saves each chunk's old bits: per chunk a byte
/// offset (4-aligned; `count * width` bytes each) into the journal, and the journal's length.
pub fn journal_layout(chunks: &[ApplyInput]) -> (Vec<u64>, u64) {
    let mut at = 0u64;
    let offsets = chunks
        .iter()
        .map(|c| {
            let off = at;
            at += (c.count * c.width as u64).next_multiple_of(4);
            off
        })
        .collect();
    (offsets, at)
}

/// A chunk that failed its check, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkError {
    pub chunk: usize,
    pub reason: &'static str,
}

/// What [`Gpu::apply_check`] found.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ApplyCheck {
    /// Per slot id (`0..num_slots`): the digest change of a delta (Σ h(new) − h(old)), or the
    /// digest contribution of a seed (Σ h(new)).
    pub digest_change: Vec<u64>,
    pub errors: Vec<ChunkError>,
}

/// Why the GPU check refused a chunk, by the kernel's code.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
pub(crate) fn apply_error_reason(code: u32) -> &'static str {
    match code {
        1 => "a position lies at or past the chunk's range",
        2 => "positions are not strictly increasing",
        3 => "the bitmap's set bits differ from the chunk's count",
        4 => "a delta element sets the value the receiver already holds",
        5 => "a malformed gaps or ulp section (directory, code words or padding)",
        6 => "the steps map's escapes differ from the values the section holds",
        _ => "unknown error",
    }
}

/// One chunk of a sender's changes to size and write in the entropy codecs
/// ([`Gpu::entropy_size`], [`Gpu::entropy_write`]): `gaps` positions and `ulp` values, the
/// core's formats byte for byte.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeChunk {
    /// `count` sorted slot indices (u64, 8-byte aligned).
    pub positions: DevicePtr,
    /// `count` new and old bit patterns of `width` bytes.
    pub new_bits: DevicePtr,
    pub old_bits: DevicePtr,
    pub count: u64,
    /// Positions are coded relative to `start` (the first), within `range`.
    pub start: u64,
    pub range: u64,
    pub width: usize,
}

/// Exact section bytes of a chunk in each entropy codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CodeSizes {
    pub gaps: u64,
    pub ulp: u64,
}

/// How a chunk's values are written by [`Gpu::entropy_write`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CodeValues {
    Ulp,
    /// The new bits copied as they are.
    Raw,
}

/// Where [`Gpu::entropy_write`] puts a chunk's sections (`None`: not written there).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct CodePlace {
    pub gaps: Option<DevicePtr>,
    pub values: Option<(CodeValues, DevicePtr)>,
}

/// The position section of a chunk to decode ([`Gpu::entropy_decode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecodePositions {
    /// A gaps section of `len` bytes, decoded into `count` u32 relative positions at `out`.
    Gaps {
        section: DevicePtr,
        len: u64,
        out: DevicePtr,
    },
    /// An abs32 section (read by the ulp decoder for the old bits; checked by the apply).
    Abs32 { section: DevicePtr, len: u64 },
    /// No section: every element of the range changed (`count == range`).
    All,
    /// A holes section (gaps of the `range − count` unchanged elements, at least one): the
    /// holes are decoded into `holes` (`range − count` u32 plus [`DECODE_SLACK`]), their
    /// complement, the changes' relative positions, into `out` (`count` u32), which the apply
    /// then reads as abs32.
    Holes {
        section: DevicePtr,
        len: u64,
        holes: DevicePtr,
        out: DevicePtr,
    },
    /// A bitmap section of `ceil(range / 8)` bytes (applied as it is): its set bits are
    /// listed into `out` (`count` u32) for the ulp decoder.
    Bitmap {
        section: DevicePtr,
        len: u64,
        out: DevicePtr,
    },
}

/// One received chunk with an entropy-coded section.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeInput {
    /// The slot's bytes (the old bits of the ulp steps).
    pub held: DevicePtr,
    pub slot_numel: u64,
    pub width: usize,
    pub start: u64,
    pub range: u64,
    pub count: u64,
    pub positions: DecodePositions,
    /// An ulp section `(section, len, out)`: decoded into `count` new bit patterns at `out`.
    pub values: Option<(DevicePtr, u64, DevicePtr)>,
}

/// One tensor (or piece of a slot) to digest ([`Gpu::digest`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DigestInput {
    pub ptr: DevicePtr,
    pub numel: u64,
    pub width: usize,
    /// Slot index of element 0.
    pub first_index: u64,
    pub slot: u32,
    /// When set, `ptr` holds fp32 elements, digested (and, by [`Gpu::digest_refresh`], copied
    /// into the snapshot) as the bf16 this rule rounds them to; `width` is then 2.
    pub f32_source: Option<Bf16Rule>,
}

/// One run of changes laid out as [`Gpu::diff_batch`] writes them ([`Gpu::digest_update`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UpdateInput {
    pub change_offset: u64,
    pub change_count: u64,
    pub width: usize,
    pub slot: u32,
}

#[cfg(test)]
mod tests {
    use super::DiffTuning;

    #[test]
    fn diff_tuning_parses_three_or_four_numbers_in_range() {
        let t = DiffTuning::parse("2, 8,0").unwrap();
        assert_eq!((t.items, t.min_blocks, t.reload), (2, 8, false));
        assert_eq!(t.prefetch, DiffTuning::default().prefetch);
        assert_eq!(DiffTuning::parse("4,4,1").unwrap(), DiffTuning::default());
        assert_eq!(DiffTuning::parse("4,4,1,0").unwrap().prefetch, 0);
        assert_eq!(DiffTuning::parse("4,4,1,8192").unwrap().prefetch, 8192);
        assert!(DiffTuning::parse("4,4,1,264,1").unwrap().stash);
        assert!(!DiffTuning::parse("4,4,1,264,0").unwrap().stash);
        assert!(!DiffTuning::parse("4,4,0,264").unwrap().stash);
        assert!(DiffTuning::parse("4,4,1,264,1,1").unwrap().direct);
        assert!(!DiffTuning::parse("4,4,1,264,1,0").unwrap().direct);
        assert_eq!(
            DiffTuning::parse("4,4,1,264,1").unwrap().direct,
            DiffTuning::default().direct
        );
        for bad in [
            "",
            "4,4",
            "4,4,2",
            "9,4,1",
            "5,4,1",
            "0,4,1",
            "4,0,1",
            "4,9,1",
            "a,b,c",
            "4,4,1,8193",
            "4,4,1,-1",
            "4,4,1,1,2",
            "4,4,0,264,1",
            "5,4,1,264,1",
            "4,4,1,1,1,2",
            "4,4,1,1,1,1,1",
        ] {
            assert!(DiffTuning::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    use super::*;

    #[test]
    fn journal_sections_are_aligned_disjoint_and_sized_by_their_chunks() {
        let chunk = |count: u64, width: usize| ApplyInput {
            dst: 0,
            slot_numel: 1 << 20,
            width,
            slot: 0,
            start: 0,
            range: count.max(1),
            count,
            positions: ApplyPositions::Abs32,
            pos_section: 0,
            pos_len: count * 4,
            val_section: 0,
            val_len: count * width as u64,
            values: ApplyValues::Raw,
        };
        assert_eq!(journal_layout(&[]), (vec![], 0));
        let chunks = [
            chunk(3, 2),
            chunk(5, 1),
            chunk(1, 4),
            chunk(7, 2),
            chunk(4, 1),
        ];
        let (offsets, total) = journal_layout(&chunks);
        // 6 → 8, 5 → 8, 4, 14 → 16, 4.
        assert_eq!(offsets, vec![0, 8, 16, 20, 36]);
        assert_eq!(total, 40);
        for (c, w) in chunks.iter().zip(offsets.windows(2)) {
            assert_eq!(w[0] % 4, 0);
            assert!(w[0] + c.count * c.width as u64 <= w[1], "sections overlap");
        }
    }

    #[test]
    fn every_kernel_has_a_program() {
        for (name, _) in KERNELS {
            let program = kernel_program(name).expect("listed");
            assert!(program.contains("dc_mix64"), "{name} lacks the prelude");
            assert!(program.contains("extern \"C\" __global__"), "{name}");
        }
        assert!(kernel_program("nope").is_none());
    }

    #[test]
    fn host_structs_match_the_kernels() {
        // The kernel structs are mirrored in gpu.rs; their sizes are fixed by the .cu comments.
        let src: String = KERNELS.iter().map(|(_, s)| *s).collect();
        for name in [
            "struct DiffTensor",
            "struct EncodeCell",
            "struct EncodedCell",
            "struct ApplyChunk",
            "struct DigestTensor",
            "struct UpdateSeg",
            "struct PlaceCell",
            "struct CodeChunk",
            "struct DecodeChunk",
            "struct Fp8Job",
            "struct StepsTensor",
        ] {
            assert!(src.contains(name), "{name}");
        }
    }

    #[test]
    fn apply_codes_map_wire_codecs() {
        use deltacast::PosCodec;
        assert_eq!(
            ApplyPositions::from_pos_codec(PosCodec::Abs32),
            Some(ApplyPositions::Abs32)
        );
        assert_eq!(ApplyPositions::from_pos_codec(PosCodec::Gaps), None);
        for c in [
            ApplyPositions::All,
            ApplyPositions::Abs32,
            ApplyPositions::Bitmap,
            ApplyPositions::Steps,
        ] {
            let wire = PosCodec::from_code(c as u8).expect("a wire code");
            assert_eq!(ApplyPositions::from_pos_codec(wire), Some(c));
        }
    }
}
