//! When a wait must end: one deadline for a whole exchange, shared by the GPU waits
//! (`wait.rs`) and the IPC link's sockets (`ipc_setup.rs`, built without the `cuda` feature).

use std::time::{Duration, Instant};

use crate::error::CudaError;

/// When a wait must end; `None` for timeouts too long to add to the clock (no end).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Deadline {
    at: Option<Instant>,
    timeout: Duration,
}

impl Deadline {
    pub(crate) fn after(timeout: Duration) -> Deadline {
        Deadline {
            at: Instant::now().checked_add(timeout),
            timeout,
        }
    }

    pub(crate) fn left(&self) -> Duration {
        self.at.map_or(Duration::MAX, |at| {
            at.saturating_duration_since(Instant::now())
        })
    }

    pub(crate) fn passed(&self) -> bool {
        self.at.is_some_and(|at| Instant::now() >= at)
    }

    pub(crate) fn expired(&self, what: &'static str) -> CudaError {
        CudaError::Timeout {
            what,
            seconds: self.timeout.as_secs(),
        }
    }
}
