//! Waiting on the GPU and on peers without hanging: every wait has a deadline, and polls
//! (spinning while the wait is likely short, then sleeping) instead of blocking in the
//! driver, so that a peer that is gone turns into an error. Used by both links.

use std::time::{Duration, Instant};

use cudarc::driver::{result as cu, sys};

use crate::error::Result;
use crate::gpu::{drv, guarded};

pub(crate) use crate::deadline::Deadline;

/// Polls `done` until it says so, spinning briefly and then sleeping, until `deadline`.
pub(crate) fn poll(
    deadline: Deadline,
    what: &'static str,
    mut done: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let started = Instant::now();
    loop {
        if done()? {
            return Ok(());
        }
        if deadline.passed() {
            return Err(deadline.expired(what));
        }
        // Spin while the wait is likely short (its latency is what a sync measures), then
        // back off so a long wait does not burn a core.
        if started.elapsed() < Duration::from_millis(50) {
            std::thread::yield_now();
        } else {
            std::thread::sleep(Duration::from_micros(20));
        }
    }
}

/// Whether `ev`'s last record has completed.
pub(crate) fn event_done(ev: sys::CUevent) -> Result<bool> {
    guarded(|| {
        // SAFETY: a live event of the caller's.
        match unsafe { cu::event::query(ev) } {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(drv("cuEventQuery")(e)),
        }
    })
}

/// Whether everything enqueued on `stream` has completed.
pub(crate) fn stream_done(stream: sys::CUstream) -> Result<bool> {
    guarded(|| {
        // SAFETY: a live stream of the caller's.
        match unsafe { sys::cuStreamQuery(stream) }.result() {
            Ok(()) => Ok(true),
            Err(e) if e.0 == sys::cudaError_enum::CUDA_ERROR_NOT_READY => Ok(false),
            Err(e) => Err(drv("cuStreamQuery")(e)),
        }
    })
}
