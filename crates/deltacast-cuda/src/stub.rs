//! The build without the `cuda` feature: the same types and methods as the GPU path, each
//! returning [`CudaError::NotBuilt`]. A [`Gpu`] or [`DeviceBuffer`] can never exist here, so
//! their methods are unreachable (so is a [`HostBuffer`]).

use std::convert::Infallible;

use crate::error::{CudaError, Result, NOT_BUILT};
use crate::{
    ApplyCheck, ApplyInput, ChunkError, CodeChunk, CodePlace, CodeSizes, DecodeInput, DevicePtr,
    DiffInput, DiffOutput, DiffResult, DigestInput, EncodeInput, GridChunk, MapDiff, MapOutput,
    UpdateInput,
};

/// A second stream of a GPU; cannot exist without the `cuda` feature.
pub struct GpuStream {
    never: Infallible,
}

impl GpuStream {
    pub fn handle(&self) -> u64 {
        match self.never {}
    }
}

/// An event of a GPU; cannot exist without the `cuda` feature.
pub struct GpuEvent {
    never: Infallible,
}

impl GpuEvent {
    pub fn handle(&self) -> u64 {
        match self.never {}
    }
}

/// Bytes a decoder may read past the end of a section (as the GPU build).
pub const DECODE_SLACK: u64 = 64;

/// The entropy coder's device memory; holds nothing without the `cuda` feature.
#[derive(Default)]
pub struct CodeScratch {}

impl CodeScratch {
    pub fn new() -> Self {
        CodeScratch {}
    }

    pub fn len(&self) -> u64 {
        0
    }

    pub fn is_empty(&self) -> bool {
        true
    }
}

fn not_built<T>() -> Result<T> {
    Err(CudaError::NotBuilt(NOT_BUILT))
}

/// Compiling needs NVRTC, which only the `cuda` feature loads.
pub fn compile_kernel(_name: &str, _arch: &str) -> Result<String> {
    not_built()
}

pub fn compile_kernel_tuned(
    _name: &str,
    _arch: &str,
    _tuning: crate::DiffTuning,
) -> Result<String> {
    not_built()
}

pub fn nvrtc_present() -> Result<()> {
    not_built()
}

/// Never constructed without the `cuda` feature.
pub struct DeviceBuffer {
    never: Infallible,
}

impl DeviceBuffer {
    pub fn ptr(&self) -> DevicePtr {
        match self.never {}
    }

    pub fn len(&self) -> usize {
        match self.never {}
    }

    pub fn is_empty(&self) -> bool {
        match self.never {}
    }
}

/// Never constructed without the `cuda` feature.
pub struct HostBuffer {
    never: Infallible,
}

impl HostBuffer {
    pub fn ptr(&self) -> DevicePtr {
        match self.never {}
    }

    pub fn host_ptr(&self) -> *mut u8 {
        match self.never {}
    }

    pub fn len(&self) -> usize {
        match self.never {}
    }

    pub fn is_empty(&self) -> bool {
        match self.never {}
    }

    pub fn as_slice(&self) -> &[u8] {
        match self.never {}
    }

    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        match self.never {}
    }
}

/// Never constructed without the `cuda` feature.
pub struct Fp8Plan {
    never: Infallible,
}

impl Fp8Plan {
    pub fn blocks(&self) -> u64 {
        match self.never {}
    }
}

/// Never constructed without the `cuda` feature: [`Gpu::new`] returns
/// [`CudaError::NotBuilt`].
pub struct Gpu {
    never: Infallible,
}

#[allow(clippy::missing_safety_doc, unused_variables)]
impl Gpu {
    pub fn new(ordinal: usize) -> Result<Gpu> {
        not_built()
    }

    pub fn with_tuning(ordinal: usize, tuning: crate::DiffTuning) -> Result<Gpu> {
        not_built()
    }

    pub fn with_options(
        ordinal: usize,
        tuning: crate::DiffTuning,
        high_priority: bool,
    ) -> Result<Gpu> {
        not_built()
    }

    pub fn tuning(&self) -> crate::DiffTuning {
        match self.never {}
    }

    pub fn kernel_resources(&self, _name: &str) -> Result<(i32, i32, i32)> {
        match self.never {}
    }

    pub fn device_count() -> Result<usize> {
        not_built()
    }

    pub fn ordinal(&self) -> usize {
        match self.never {}
    }

    pub fn name(&self) -> &str {
        match self.never {}
    }

    pub fn arch(&self) -> &str {
        match self.never {}
    }

    pub fn sm_count(&self) -> u32 {
        match self.never {}
    }

    pub fn stream_handle(&self) -> u64 {
        match self.never {}
    }

    pub fn fp8_plan(&self, jobs: &[crate::Fp8Job]) -> Result<Fp8Plan> {
        match self.never {}
    }

    pub unsafe fn fp8_quantize(&self, plan: &Fp8Plan) -> Result<()> {
        match self.never {}
    }

    pub fn synchronize(&self) -> Result<()> {
        match self.never {}
    }

    pub fn make_current(&self) -> Result<()> {
        match self.never {}
    }

    pub unsafe fn wait_for_stream(&self, other: u64) -> Result<()> {
        match self.never {}
    }

    pub fn record_done(&self) -> Result<u64> {
        match self.never {}
    }

    pub fn alloc(&self, len: usize) -> Result<DeviceBuffer> {
        match self.never {}
    }

    pub fn alloc_zeroed(&self, len: usize) -> Result<DeviceBuffer> {
        match self.never {}
    }

    pub fn alloc_pinned(&self, len: usize) -> Result<HostBuffer> {
        match self.never {}
    }

    pub unsafe fn copy_to_pinned(
        &self,
        dst: &HostBuffer,
        offset: usize,
        src: DevicePtr,
        len: usize,
    ) -> Result<()> {
        match self.never {}
    }

    pub unsafe fn copy_from_pinned(
        &self,
        dst: DevicePtr,
        src: &HostBuffer,
        offset: usize,
        len: usize,
    ) -> Result<()> {
        match self.never {}
    }

    pub fn upload(&self, data: &[u8]) -> Result<DeviceBuffer> {
        match self.never {}
    }

    pub unsafe fn copy_to_device(&self, dst: DevicePtr, data: &[u8]) -> Result<()> {
        match self.never {}
    }

    pub unsafe fn download(&self, src: DevicePtr, len: usize) -> Result<Vec<u8>> {
        match self.never {}
    }

    pub unsafe fn download_into(&self, src: DevicePtr, out: &mut [u8]) -> Result<()> {
        match self.never {}
    }

    pub unsafe fn memset(&self, dst: DevicePtr, value: u8, len: usize) -> Result<()> {
        match self.never {}
    }

    pub unsafe fn copy_device(&self, dst: DevicePtr, src: DevicePtr, len: usize) -> Result<()> {
        match self.never {}
    }

    pub fn time_ms(&self, f: impl FnOnce() -> Result<()>) -> Result<f32> {
        match self.never {}
    }

    pub fn large_scratch_bytes(&self) -> u64 {
        match self.never {}
    }

    pub unsafe fn diff_batch(&self, inputs: &[DiffInput], out: &DiffOutput) -> Result<DiffResult> {
        match self.never {}
    }

    pub unsafe fn diff_map(&self, inputs: &[DiffInput], out: &MapOutput) -> Result<MapDiff> {
        match self.never {}
    }

    pub unsafe fn diff_batch_host_snapshot(
        &self,
        inputs: &[DiffInput],
        out: &DiffOutput,
    ) -> Result<DiffResult> {
        match self.never {}
    }

    pub fn bitmap_bytes(inputs: &[EncodeInput], chunk_elems: u64) -> u64 {
        0
    }

    pub unsafe fn encode_positions(
        &self,
        positions: DevicePtr,
        inputs: &[EncodeInput],
        chunk_elems: u64,
        abs32_out: Option<DevicePtr>,
        bitmap_out: Option<DevicePtr>,
    ) -> Result<Vec<GridChunk>> {
        match self.never {}
    }

    pub unsafe fn encode_place(
        &self,
        positions: DevicePtr,
        chunks: &[(GridChunk, crate::ApplyPositions, DevicePtr)],
    ) -> Result<()> {
        match self.never {}
    }

    pub unsafe fn apply_check(
        &self,
        chunks: &[ApplyInput],
        seed: bool,
        num_slots: usize,
    ) -> Result<ApplyCheck> {
        match self.never {}
    }

    pub unsafe fn apply_scatter(&self, chunks: &[ApplyInput]) -> Result<()> {
        match self.never {}
    }

    pub unsafe fn apply_verified(
        &self,
        chunks: &[ApplyInput],
        seed: bool,
        held: &[u64],
        expected: &[u64],
    ) -> Result<Vec<u64>> {
        match self.never {}
    }

    pub unsafe fn apply_scatter_journaled(
        &self,
        chunks: &[ApplyInput],
        journal: DevicePtr,
    ) -> Result<()> {
        match self.never {}
    }

    pub unsafe fn apply_undo(&self, chunks: &[ApplyInput], journal: DevicePtr) -> Result<()> {
        match self.never {}
    }

    pub unsafe fn apply_verified_journaled(
        &self,
        chunks: &[ApplyInput],
        held: &[u64],
        expected: &[u64],
        journal: DevicePtr,
    ) -> Result<Vec<u64>> {
        match self.never {}
    }

    pub fn new_stream(&self, high_priority: bool) -> Result<GpuStream> {
        match self.never {}
    }

    pub fn new_event(&self) -> Result<GpuEvent> {
        match self.never {}
    }

    pub unsafe fn record_event(&self, event: &GpuEvent, stream: u64) -> Result<()> {
        match self.never {}
    }

    pub unsafe fn stream_wait_event(&self, stream: u64, event: &GpuEvent) -> Result<()> {
        match self.never {}
    }

    pub unsafe fn digest(&self, inputs: &[DigestInput]) -> Result<Vec<u64>> {
        match self.never {}
    }

    pub unsafe fn digest_refresh(
        &self,
        inputs: &[DigestInput],
        snapshots: &[DevicePtr],
    ) -> Result<(Vec<u64>, Vec<u64>)> {
        match self.never {}
    }

    pub unsafe fn count_changed_sampled(
        &self,
        inputs: &[DigestInput],
        snapshots: &[DevicePtr],
        every: u64,
    ) -> Result<Vec<(u64, u64)>> {
        match self.never {}
    }

    pub unsafe fn digest_update(
        &self,
        positions: DevicePtr,
        new_values: DevicePtr,
        old_values: DevicePtr,
        inputs: &[UpdateInput],
    ) -> Result<Vec<u64>> {
        match self.never {}
    }

    pub unsafe fn entropy_size(
        &self,
        scratch: &mut CodeScratch,
        chunks: &[CodeChunk],
    ) -> Result<Vec<CodeSizes>> {
        match self.never {}
    }

    pub unsafe fn entropy_write(
        &self,
        scratch: &mut CodeScratch,
        chunks: &[CodeChunk],
        places: &[CodePlace],
    ) -> Result<()> {
        match self.never {}
    }

    pub unsafe fn entropy_decode(
        &self,
        scratch: &mut CodeScratch,
        inputs: &[DecodeInput],
    ) -> Result<Vec<ChunkError>> {
        match self.never {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_entry_point_says_not_built() {
        let e = Gpu::new(0).err().expect("no GPU without the feature");
        assert!(
            matches!(e, CudaError::NotBuilt(m) if m == NOT_BUILT),
            "{e:?}"
        );
        assert_eq!(
            e.to_string(),
            "deltacast was built without the `cuda` feature"
        );
        assert!(Gpu::device_count().is_err());
        assert!(matches!(
            compile_kernel("diff", "compute_90"),
            Err(CudaError::NotBuilt(_))
        ));
        assert!(nvrtc_present().is_err());
        assert!(!crate::is_built());
    }
}
