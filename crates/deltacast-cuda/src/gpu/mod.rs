//! The GPU path (feature `cuda`): cudarc's thin `result` layer over the driver API, NVRTC for the
//! kernels, every call guarded so that a missing library is an error and never a panic.
//!
//! Two layers, each file importing only those before it. The driver, memory and streams:
//! `driver.rs` (loading the libraries and the kernels' PTX, guarded calls), `buffer.rs`
//! ([`DeviceBuffer`], [`HostBuffer`], the launchers' scratch), `context.rs` (a [`Gpu`]: device,
//! context, loaded kernels, launches), `memory.rs` (its allocations and copies), `stream.rs`
//! ([`GpuStream`], [`GpuEvent`], ordering and timing). Above them the kernel launchers, one
//! per kernel file, each owning its inputs' host twins and tables: `diff.rs`, `encode.rs`,
//! `apply.rs`, `digest.rs`, `entropy.rs`, `quant.rs`.

mod apply;
mod buffer;
mod context;
mod diff;
mod digest;
mod driver;
mod encode;
mod entropy;
mod memory;
mod quant;
mod stream;

pub use buffer::{DeviceBuffer, HostBuffer};
pub use context::Gpu;
pub use driver::{compile_kernel, compile_kernel_tuned, nvrtc_present};
pub(crate) use driver::{drv, guarded, release_in};
pub use entropy::{CodeScratch, DECODE_SLACK};
pub use quant::Fp8Plan;
pub use stream::{GpuEvent, GpuStream};
