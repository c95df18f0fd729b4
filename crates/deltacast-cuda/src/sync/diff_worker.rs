//! The GPU sender's diff thread: the diffs of a sync run back to back there, on the caller's
//! `Gpu` handle, while the sender's thread encodes and sends the stages already diffed.

use std::sync::{mpsc, Arc, Mutex, PoisonError};

use super::settings::SnapshotPlace;
use super::wall_ms;
use crate::error::{CudaError, Result};
use crate::{DiffInput, DiffOutput, DiffResult, Gpu, GpuEvent, MapDiff, MapOutput};

/// What a stage's diff writes: its changes listed (positions and bits), or a map code
/// (steps, or a bitmap of the changes).
#[derive(Debug, Clone, Copy)]
pub(super) enum DiffTarget {
    List(DiffOutput),
    Map(MapOutput),
}

/// A stage's diff, as its target had it.
pub(super) enum Diffed {
    List(DiffResult),
    Map(MapDiff),
}

/// One listing diff of a stage, with the snapshot where `place` says.
///
/// # Safety
/// As [`Gpu::diff_batch`].
pub(super) unsafe fn run_list_diff(
    gpu: &Gpu,
    place: SnapshotPlace,
    inputs: &[DiffInput],
    out: &DiffOutput,
) -> Result<DiffResult> {
    // SAFETY: per this function's contract.
    unsafe {
        match place {
            SnapshotPlace::PinnedHost => gpu.diff_batch_host_snapshot(inputs, out),
            SnapshotPlace::Device => gpu.diff_batch(inputs, out),
        }
    }
}

/// One diff of a stage into `out` (the map codes only with device snapshots).
///
/// # Safety
/// As [`Gpu::diff_batch`] and [`Gpu::diff_map`].
unsafe fn run_diff(
    gpu: &Gpu,
    place: SnapshotPlace,
    inputs: &[DiffInput],
    out: &DiffTarget,
) -> Result<Diffed> {
    // SAFETY: per this function's contract.
    unsafe {
        match (out, place) {
            (DiffTarget::List(out), _) => run_list_diff(gpu, place, inputs, out).map(Diffed::List),
            (DiffTarget::Map(out), SnapshotPlace::Device) => {
                gpu.diff_map(inputs, out).map(Diffed::Map)
            }
            (DiffTarget::Map(_), SnapshotPlace::PinnedHost) => Err(CudaError::InvalidArgument(
                "the map diffs need the snapshot in device memory".into(),
            )),
        }
    }
}

/// A diff for the diff thread: its inputs and outputs, and the event (its set's last
/// broadcasts) its stream waits for first.
pub(super) struct DiffJob {
    pub(super) inputs: Vec<DiffInput>,
    pub(super) out: DiffTarget,
    pub(super) place: SnapshotPlace,
    pub(super) after: Option<Arc<GpuEvent>>,
}

/// A diff's result, with its start and end on the wall clock (for the stage trace).
pub(super) type DiffDone = (Result<Diffed>, f64, f64);

/// The sender's diff thread, alive as long as the sender: it runs the diffs it is handed, in
/// order, on the caller's `Gpu` handle. (A thread started for each sync costs a large share of
/// a one-stage sync's diff phase: docs/data/gpu-sync/README.md, "Figures behind the code".)
pub(super) struct DiffWorker {
    jobs: Option<mpsc::Sender<DiffJob>>,
    /// (In a mutex only so that the sender stays `Sync`, as Python objects must be; it is
    /// reached through `&mut self`, never locked.)
    done: Mutex<mpsc::Receiver<DiffDone>>,
    thread: Option<std::thread::JoinHandle<()>>,
    /// Diffs handed over whose results were not taken yet.
    pending: usize,
}

impl DiffWorker {
    pub(super) fn start(gpu: Arc<Gpu>) -> Result<DiffWorker> {
        let (jobs, job_rx) = mpsc::channel::<DiffJob>();
        let (done_tx, done) = mpsc::channel::<DiffDone>();
        let thread = std::thread::Builder::new()
            .name("deltacast-diff".into())
            .spawn(move || {
                for job in job_rx {
                    let begun = wall_ms();
                    let diff = match &job.after {
                        // SAFETY: a live event of this context.
                        Some(event) => unsafe { gpu.stream_wait_event(gpu.stream_handle(), event) },
                        None => Ok(()),
                    }
                    .and_then(|()| {
                        // SAFETY: the sender's tensors and snapshots are valid (its
                        // constructor's contract); the outputs are a set's, sized for its
                        // capacity, and nothing else writes them or these tensors' snapshots
                        // until the sender has taken this result.
                        unsafe { run_diff(&gpu, job.place, &job.inputs, &job.out) }
                    });
                    if done_tx.send((diff, begun, wall_ms())).is_err() {
                        return;
                    }
                }
            })
            .map_err(|e| CudaError::InvalidArgument(format!("no diff thread: {e}")))?;
        Ok(DiffWorker {
            jobs: Some(jobs),
            done: Mutex::new(done),
            thread: Some(thread),
            pending: 0,
        })
    }

    fn stopped() -> CudaError {
        CudaError::Panicked("the diff thread stopped".into())
    }

    pub(super) fn submit(&mut self, job: DiffJob) -> Result<()> {
        let jobs = self.jobs.as_ref().ok_or_else(DiffWorker::stopped)?;
        jobs.send(job).map_err(|_| DiffWorker::stopped())?;
        self.pending += 1;
        Ok(())
    }

    /// The next result, in the order the diffs were handed over.
    pub(super) fn next(&mut self) -> Result<DiffDone> {
        let done = self
            .done
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .recv()
            .map_err(|_| DiffWorker::stopped())?;
        self.pending -= 1;
        Ok(done)
    }

    /// Waits for every diff handed over (their results are dropped).
    pub(super) fn drain(&mut self) {
        while self.pending > 0 {
            if self.next().is_err() {
                self.pending = 0;
            }
        }
    }
}

impl Drop for DiffWorker {
    fn drop(&mut self) {
        // Closing the channel ends the thread's loop once its current diff is done.
        self.jobs = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}
