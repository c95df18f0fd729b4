//! `deltacast._native`: the Python bindings of the deltacast core.
//!
//! Arrays are borrowed, never copied: numpy arrays (and CPU torch tensors viewed as numpy)
//! are checked for dtype width, shape, contiguity and, for receivers, writability, then read
//! or written in place by the core with the GIL released. Every core error kind maps to one
//! exception class of `deltacast._errors`.

use pyo3::prelude::*;

mod arrays;
mod changes;
mod cuda;
mod errors;
mod files;
mod fp8;
mod net;
mod params;
mod receiver;
mod sender;
mod sharded;
mod slot;
mod table;
mod values;
mod weight_sender;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<slot::Slot>()?;
    m.add_class::<table::SlotTable>()?;
    m.add_class::<sender::Sender>()?;
    m.add_class::<sender::SyncResult>()?;
    m.add_class::<receiver::Receiver>()?;
    m.add_class::<receiver::SyncOutcome>()?;
    m.add_class::<changes::ChangeReceiver>()?;
    m.add_class::<net::FrameServer>()?;
    m.add_class::<net::FrameClient>()?;
    m.add_function(wrap_pyfunction!(net::generate_token, m)?)?;
    m.add_class::<params::Converter>()?;
    m.add_class::<params::Param>()?;
    m.add_class::<sharded::Layout>()?;
    m.add_class::<sharded::RankSender>()?;
    m.add_class::<sharded::RankSyncResult>()?;
    m.add_function(wrap_pyfunction!(files::load_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(files::save_safetensors, m)?)?;
    m.add_function(wrap_pyfunction!(files::read_sync_file, m)?)?;
    m.add_function(wrap_pyfunction!(files::write_sync_file, m)?)?;
    m.add_function(wrap_pyfunction!(files::frame_header, m)?)?;
    m.add_class::<cuda::NcclComm>()?;
    m.add_class::<cuda::IpcComm>()?;
    m.add_class::<cuda::FrameFeed>()?;
    m.add_class::<cuda::NativeGpuSender>()?;
    m.add_class::<cuda::NativeGpuShardedSender>()?;
    m.add_class::<cuda::NativeGpuReceiver>()?;
    m.add_class::<fp8::Fp8Quantizer>()?;
    m.add_function(wrap_pyfunction!(cuda::cuda_available, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::nccl_unique_id, m)?)?;
    m.add_function(wrap_pyfunction!(cuda::decline_sharded, m)?)?;
    m.add("DEFAULT_BUCKET_SIZE", deltacast::flush::DEFAULT_BUCKET_SIZE)?;
    m.add("DEFAULT_CHUNK_ELEMS", deltacast::flush::DEFAULT_CHUNK_ELEMS)?;
    m.add("DEFAULT_CAPACITY", deltacast_cuda::sync::DEFAULT_CAPACITY)?;
    m.add(
        "DEFAULT_STAGE_BYTES",
        deltacast_cuda::sync::DEFAULT_STAGE_BYTES,
    )?;
    Ok(())
}
