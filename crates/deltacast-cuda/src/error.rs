/// Everything the GPU path can fail with. Never a panic: a missing library, a missing device or
/// a failing kernel is an error that says so.
#[derive(Debug, thiserror::Error)]
pub enum CudaError {
    /// This build has no GPU path.
    #[error("{0}")]
    NotBuilt(&'static str),
    /// `libcuda` could not be loaded (no NVIDIA driver on this machine).
    #[error("the CUDA driver library could not be loaded: {0}")]
    DriverNotFound(String),
    /// `libnvrtc` could not be loaded (needed to compile the kernels).
    #[error("the NVRTC library could not be loaded: {0}")]
    NvrtcNotFound(String),
    /// The driver loaded but there is no such device.
    #[error("no CUDA device: {0}")]
    NoDevice(String),
    /// A CUDA driver call failed.
    #[error("CUDA {op} failed: {msg}")]
    Driver { op: &'static str, msg: String },
    /// NVRTC refused a kernel file; `log` is the compiler's.
    #[error("kernel `{name}` does not compile for {arch}:\n{log}")]
    Compile {
        name: String,
        arch: String,
        log: String,
    },
    /// An argument the caller passed is unusable (size, width, alignment, range).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// cudarc panicked (a library or symbol vanished): caught and turned into an error.
    #[error("the CUDA bindings panicked: {0}")]
    Panicked(String),
    /// A chunk failed the GPU check (apply): nothing was written.
    #[error("chunk {chunk} refused: {reason}")]
    BadChunk { chunk: usize, reason: &'static str },
    /// [`Gpu::apply_verified`](crate::Gpu::apply_verified): the digest computed from the bits
    /// held differs from the one expected, nothing was written. (A receiver's refusal of a
    /// sync is [`CudaError::Sync`], naming the slot.)
    #[error("digest of slot {slot} would be {actual:#018x}, the sender says {expected:#018x}")]
    DigestMismatch {
        slot: u32,
        expected: u64,
        actual: u64,
    },
    /// `libnccl` could not be loaded.
    #[error("the NCCL library could not be loaded: {0}")]
    NcclNotFound(String),
    /// An NCCL call failed (or a peer failed: NCCL's asynchronous error).
    #[error("NCCL {op} failed: {msg}")]
    Nccl { op: &'static str, msg: String },
    /// The CUDA-IPC link failed: a peer closed its connection, or its set-up went wrong.
    #[error("IPC link {op} failed: {msg}")]
    Link { op: &'static str, msg: String },
    /// A collective did not finish in time; the communicator was aborted.
    #[error("{what} did not finish within {seconds} s; the communicator was aborted")]
    Timeout { what: &'static str, seconds: u64 },
    /// A GPU sync message is malformed or announces sizes this receiver's slots cannot have.
    #[error("malformed GPU sync: {0}")]
    Protocol(String),
    /// The sender's slot table is not the receiver's.
    #[error("slot table {got:#018x} is not this receiver's {expected:#018x}")]
    WrongTable { expected: u64, got: u64 },
    /// The receiver refused the sync by what it holds (the core's decision, shared with the
    /// CPU receiver): a version that does not follow, a base or new digest that differs, a
    /// sync that misses a slot. It then needs a seed.
    #[error(transparent)]
    Sync(#[from] deltacast::Error),
    /// A receiver refused the sync (its digest check or its input checks failed).
    #[error("{0} receiver(s) refused the sync; the next sync is a seed")]
    ReceiverRefused(u64),
}

impl CudaError {
    /// Whether this is a failure of the link itself (a peer gone, a collective that did not
    /// finish), as opposed to a refusal of what it carried.
    pub fn is_link_failure(&self) -> bool {
        matches!(
            self,
            CudaError::Link { .. } | CudaError::Nccl { .. } | CudaError::Timeout { .. }
        )
    }
}

pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// The message of [`CudaError::NotBuilt`].
pub const NOT_BUILT: &str = "deltacast was built without the `cuda` feature";
