//! `Fp8Quantizer`: fp32 CUDA tensors quantized to block FP8 on the GPU (kernels/quant.cu,
//! the rule of the core's `convert::fp8`), into buffers that a `GpuSender` syncs as its FP8
//! and scale slots (`deltacast/cuda.py` wires it up for `wire_dtypes` of `f8_e4m3`).

use deltacast_cuda::{Fp8Job, Fp8Plan, Gpu, GpuEvent};
use pyo3::prelude::*;

use crate::cuda::CudaResult;

/// Quantizes a fixed set of tensors, each `(src, dst, scales, shape)` by device pointer: fp32
/// elements at `src`, E4M3FN bytes to `dst`, fp32 scales (one per 128×128 block of the last
/// two dimensions) to `scales`. The caller keeps the tensors alive while it is in use.
#[pyclass(module = "deltacast._native")]
pub struct Fp8Quantizer {
    gpu: Gpu,
    plan: Fp8Plan,
    done: GpuEvent,
}

#[pymethods]
impl Fp8Quantizer {
    #[new]
    fn new(py: Python<'_>, device: usize, jobs: Vec<(u64, u64, u64, Vec<u64>)>) -> PyResult<Self> {
        py.detach(|| {
            let gpu = Gpu::new(device)?;
            let jobs: Vec<Fp8Job> = jobs
                .into_iter()
                .map(|(src, dst, scales, shape)| Fp8Job {
                    src,
                    dst,
                    scales,
                    shape,
                })
                .collect();
            let plan = gpu.fp8_plan(&jobs)?;
            let done = gpu.new_event()?;
            Ok(Fp8Quantizer { gpu, plan, done })
        })
        .py()
    }

    /// Quantizes every tensor after the work enqueued so far on `stream` (torch's current
    /// stream), and makes `stream` wait for the result: work enqueued on it afterwards (a
    /// sender's sync) reads the new bits.
    fn run(&self, py: Python<'_>, stream: u64) -> PyResult<()> {
        py.detach(|| {
            // SAFETY: `stream` is a live stream of this device's context (the wrapper passes
            // torch's current one); the jobs' buffers are kept alive by the wrapper.
            unsafe {
                self.gpu.wait_for_stream(stream)?;
                self.gpu.fp8_quantize(&self.plan)?;
                self.gpu
                    .record_event(&self.done, self.gpu.stream_handle())?;
                self.gpu.stream_wait_event(stream, &self.done)
            }
        })
        .py()
    }

    /// Blocks quantized per run (the scales written).
    #[getter]
    fn blocks(&self) -> u64 {
        self.plan.blocks()
    }
}
