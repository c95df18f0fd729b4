//! Streams and events: a GPU's own stream and the ones made on its context, events to order
//! them on the device or to poll, and device timing.

use cudarc::driver::{result as cu, sys};

use super::context::Gpu;
use super::driver::{drv, guarded, release_in};
use crate::error::Result;

/// A second stream on a GPU's context (the sync's collectives run on one, so that they
/// overlap the kernels of the next stage on the GPU's own stream). Destroyed on drop.
pub struct GpuStream {
    stream: sys::CUstream,
    ctx: sys::CUcontext,
}

// SAFETY: handles of the driver API, which is thread-safe; nothing here is mutated after
// creation.
unsafe impl Send for GpuStream {}
unsafe impl Sync for GpuStream {}

impl GpuStream {
    /// The raw `CUstream`.
    pub fn handle(&self) -> u64 {
        self.stream as u64
    }
}

impl Drop for GpuStream {
    fn drop(&mut self) {
        let stream = self.stream;
        release_in(self.ctx, || {
            // SAFETY: our stream, created in this context, synchronised and destroyed once.
            unsafe {
                let _ = cu::stream::synchronize(stream);
                let _ = cu::stream::destroy(stream);
            }
        });
    }
}

/// A CUDA event without timing: recorded on one stream, waited on by another, or polled
/// (`NcclComm::wait`). Destroyed on drop.
pub struct GpuEvent {
    event: sys::CUevent,
    ctx: sys::CUcontext,
}

// SAFETY: as for GpuStream.
unsafe impl Send for GpuEvent {}
unsafe impl Sync for GpuEvent {}

impl GpuEvent {
    /// The raw `CUevent`.
    pub fn handle(&self) -> u64 {
        self.event as u64
    }
}

impl Drop for GpuEvent {
    fn drop(&mut self) {
        let event = self.event;
        release_in(self.ctx, || {
            // SAFETY: our event, created in this context, destroyed once.
            let _ = unsafe { cu::event::destroy(event) };
        });
    }
}

impl Gpu {
    /// The raw `CUstream` every method enqueues on.
    pub fn stream_handle(&self) -> u64 {
        self.stream as u64
    }

    /// Makes our stream wait (on the device, no host sync) for everything enqueued so far on
    /// `other`, a stream of the same context (e.g. torch's current stream; 0 is the legacy
    /// default stream).
    ///
    /// # Safety
    /// `other` must be a live stream handle of this GPU's context, or 0.
    pub unsafe fn wait_for_stream(&self, other: u64) -> Result<()> {
        guarded(|| {
            self.bind()?;
            // SAFETY: per this function's contract; our event and stream.
            unsafe {
                cu::event::record(self.wait_event, other as sys::CUstream)
                    .map_err(drv("cuEventRecord"))?;
                cu::stream::wait_event(
                    self.stream,
                    self.wait_event,
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
                .map_err(drv("cuStreamWaitEvent"))
            }
        })
    }

    /// Records an event after everything enqueued so far and returns its handle, to poll
    /// (`NcclComm::wait`) instead of blocking in a stream synchronisation.
    pub fn record_done(&self) -> Result<u64> {
        guarded(|| {
            self.bind()?;
            // SAFETY: our event and stream.
            unsafe { cu::event::record(self.done_event, self.stream) }
                .map_err(drv("cuEventRecord"))?;
            Ok(self.done_event as u64)
        })
    }

    /// A new stream on this GPU's context; `high_priority` gives it the device's greatest
    /// priority, so that its small kernels (NCCL's) are scheduled ahead of a long diff.
    pub fn new_stream(&self, high_priority: bool) -> Result<GpuStream> {
        guarded(|| {
            self.bind()?;
            let priority = if high_priority {
                cu::stream::get_priority_range()
                    .map_err(drv("cuCtxGetStreamPriorityRange"))?
                    .1
            } else {
                0
            };
            let stream =
                cu::stream::create_with_priority(cu::stream::StreamKind::NonBlocking, priority)
                    .map_err(drv("cuStreamCreateWithPriority"))?;
            Ok(GpuStream {
                stream,
                ctx: self.ctx,
            })
        })
    }

    /// A new event (no timing) on this GPU's context.
    pub fn new_event(&self) -> Result<GpuEvent> {
        guarded(|| {
            self.bind()?;
            let event = cu::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING)
                .map_err(drv("cuEventCreate"))?;
            Ok(GpuEvent {
                event,
                ctx: self.ctx,
            })
        })
    }

    /// Records `event` after everything enqueued so far on `stream`: a handle of this
    /// GPU's context ([`Gpu::stream_handle`] for its own), or 0, CUDA's legacy default
    /// stream (what torch reports as its default stream), as for [`Gpu::wait_for_stream`].
    ///
    /// # Safety
    /// `stream` must be a live stream of this GPU's context, or 0.
    pub unsafe fn record_event(&self, event: &GpuEvent, stream: u64) -> Result<()> {
        guarded(|| {
            self.bind()?;
            let stream = stream as sys::CUstream;
            // SAFETY: per this function's contract; the event is alive (borrowed).
            unsafe { cu::event::record(event.event, stream) }.map_err(drv("cuEventRecord"))
        })
    }

    /// Makes `stream` (as for [`Gpu::record_event`]: 0 is the legacy default stream, never
    /// this GPU's own, which is non-blocking) wait, on the device, for the last record of
    /// `event`.
    ///
    /// # Safety
    /// As [`Gpu::record_event`].
    pub unsafe fn stream_wait_event(&self, stream: u64, event: &GpuEvent) -> Result<()> {
        guarded(|| {
            self.bind()?;
            let stream = stream as sys::CUstream;
            // SAFETY: per this function's contract; the event is alive (borrowed).
            unsafe {
                cu::stream::wait_event(
                    stream,
                    event.event,
                    sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT,
                )
            }
            .map_err(drv("cuStreamWaitEvent"))
        })
    }

    pub(super) fn sync(&self) -> Result<()> {
        // SAFETY: our stream.
        unsafe { cu::stream::synchronize(self.stream) }.map_err(drv("cuStreamSynchronize"))
    }

    /// Waits for everything enqueued so far.
    pub fn synchronize(&self) -> Result<()> {
        guarded(|| {
            self.bind()?;
            self.sync()
        })
    }

    /// Device time of whatever `f` enqueues on this GPU's stream, in milliseconds (events).
    pub fn time_ms(&self, f: impl FnOnce() -> Result<()>) -> Result<f32> {
        guarded(|| {
            self.bind()?;
            // SAFETY: our events and stream.
            unsafe { cu::event::record(self.events.0, self.stream) }
                .map_err(drv("cuEventRecord"))?;
            f()?;
            self.bind()?;
            // SAFETY: as above.
            unsafe {
                cu::event::record(self.events.1, self.stream).map_err(drv("cuEventRecord"))?;
                cu::event::synchronize(self.events.1).map_err(drv("cuEventSynchronize"))?;
                cu::event::elapsed(self.events.0, self.events.1).map_err(drv("cuEventElapsedTime"))
            }
        })
    }
}
