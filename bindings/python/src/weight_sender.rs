//! What every sender class offers, written once over [`deltacast::WeightSender`]: the four
//! native senders (`Sender`, `RankSender`, `NativeGpuSender`, `NativeGpuShardedSender`) each
//! hold theirs as `inner` and get these methods from [`weight_sender_methods!`]; their `sync`
//! and `seed` differ only in what they read.

/// `request_seed()`, `version`, `state_digest` and `digests` (by slot name) for `$class`.
macro_rules! weight_sender_methods {
    ($class:ty) => {
        #[pyo3::pymethods]
        impl $class {
            /// Makes the next sync a seed (a receiver joined late or asked for one; on a
            /// sharded sender the request of any rank, or the leader's, wins).
            fn request_seed(&mut self) {
                deltacast::WeightSender::request_seed(&mut self.inner);
            }

            /// The version of the last sync that went out whole (0 before the first).
            #[getter]
            fn version(&self) -> u64 {
                deltacast::WeightSender::version(&self.inner)
            }

            /// The combined digest receivers must ack (a sharded sender: the leader's).
            #[getter]
            fn state_digest(&self) -> u64 {
                deltacast::WeightSender::state_digest(&self.inner)
            }

            /// Per-slot digests of that version, by slot name (a sharded sender: the
            /// leader's, the whole slots').
            #[getter]
            fn digests<'py>(
                &self,
                py: pyo3::Python<'py>,
            ) -> pyo3::PyResult<pyo3::Bound<'py, pyo3::types::PyDict>> {
                crate::values::digests_dict(
                    py,
                    deltacast::WeightSender::slot_table(&self.inner),
                    deltacast::WeightSender::digests(&self.inner),
                )
            }
        }
    };
}

pub(crate) use weight_sender_methods;
