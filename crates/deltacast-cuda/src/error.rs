/// Everything the GPU path can fail with. Never a panic: a missing library, a missing device or
/// a failing kernel is an error that says so.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
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
    /// The digest computed from the bits held differs from the sender's: nothing was written.
    #[error("digest of slot {slot} would be {actual:#018x}, the sender says {expected:#018x}")]
    DigestMismatch {
        slot: u32,
        expected: u64,
        actual: u64,
    },
}

pub type Result<T, E = CudaError> = std::result::Result<T, E>;

/// The message of [`CudaError::NotBuilt`].
pub const NOT_BUILT: &str = "deltacast was built without the `cuda` feature";
