//! One error enum for the whole core library. Every variant names the problem so a
//! user (or a Python exception class mapped from it) knows what went wrong.
//!
//! A variant that wraps another error says its message in its own (Python and `to_string`
//! users see it whole) and also returns it as `source()`; a printer of the whole chain
//! (the `deltacast` binary) says each message once. Dtypes appear by name, so this module
//! depends on no other (`dtype` uses it, not the reverse).

/// Errors from decoding a position or value section.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("section truncated: needed {needed} bytes, {available} available")]
    Truncated { needed: u64, available: u64 },
    #[error("section has {extra} trailing bytes after {count} items")]
    TrailingBytes { count: u64, extra: u64 },
    #[error("position {position} is out of the chunk range of {range} elements")]
    PositionOutOfRange { position: u64, range: u64 },
    #[error("positions are not strictly increasing at item {index}")]
    NotSorted { index: u64 },
    #[error("count {count} does not fit the chunk range of {range} elements")]
    CountExceedsRange { count: u64, range: u64 },
    #[error("bitmap holds {found} set bits, manifest says {expected}")]
    BitmapCount { found: u64, expected: u64 },
    #[error("codec `{codec}` cannot carry {what}")]
    Unsupported {
        codec: &'static str,
        what: &'static str,
    },
    #[error("malformed {codec} section: {reason}")]
    Malformed { codec: &'static str, reason: String },
}

/// Errors of the core library.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("not a deltacast frame (bad magic {found:02x?})")]
    BadMagic { found: [u8; 4] },
    #[error("unsupported wire format version {found} (this build reads version {supported})")]
    UnsupportedWireVersion { found: u16, supported: u16 },
    #[error("frame truncated: {what} needs {needed} bytes, frame has {available}")]
    Truncated {
        what: &'static str,
        needed: u64,
        available: u64,
    },
    #[error("frame checksum mismatch: frame says {expected:016x}, computed {computed:016x}")]
    ChecksumMismatch { expected: u64, computed: u64 },
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error(
        "slot table mismatch: frame was built for table {frame:016x}, receiver holds {local:016x}"
    )]
    SlotTableMismatch { frame: u64, local: u64 },
    /// `current`: the version held (None: none yet); `expected`: the version a delta or
    /// verify may have now (None: only a seed can follow).
    #[error("version mismatch: {}", version_mismatch(*current, *got, *expected))]
    VersionMismatch {
        current: Option<u64>,
        got: u64,
        expected: Option<u64>,
    },
    #[error("sync is incomplete: {0}")]
    IncompleteSync(String),
    #[error("flush out of order: expected flush {expected} of version {version}, got {got}")]
    FlushOutOfOrder {
        version: u64,
        expected: u32,
        got: u32,
    },
    #[error("base digest mismatch on slot `{slot}`: the sync expects {expected:016x}, this state has {actual:016x}")]
    BaseDigestMismatch {
        slot: String,
        expected: u64,
        actual: u64,
    },
    #[error("digest mismatch after apply on slot `{slot}`: sender {expected:016x}, receiver {actual:016x}")]
    DigestMismatch {
        slot: String,
        expected: u64,
        actual: u64,
    },
    #[error("unknown slot id {0}")]
    UnknownSlot(u32),
    #[error("unknown slot `{0}`")]
    UnknownSlotName(String),
    #[error("slot `{slot}`: {reason}")]
    SlotMismatch { slot: String, reason: String },
    #[error("unknown dtype code {0}")]
    UnknownDType(u8),
    #[error("dtype {0} is not supported")]
    UnsupportedDType(String),
    /// A sender was given a source of a dtype it cannot convert to the slot's.
    #[error("slot `{slot}`: no conversion from a {from:?} source to the slot's {to:?}")]
    UnsupportedConversion {
        slot: String,
        from: crate::DType,
        to: crate::DType,
    },
    #[error("buffer of {len} bytes is not a whole number of {dtype} elements")]
    Misaligned { len: usize, dtype: String },
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("section of slot {slot} chunk at {start}: {source}")]
    Codec {
        slot: u32,
        start: u64,
        #[source]
        source: CodecError,
    },
    #[error("safetensors: {0}")]
    SafeTensors(#[from] safetensors::SafeTensorError),
    #[error("I/O error on {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// A transport (a [`Collective`](crate::sharded::Collective), a frame link) failed; the
    /// transport's own error is kept as the source, for callers that downcast to it.
    #[error("transport failed: {0}")]
    Transport(#[source] Box<dyn std::error::Error + Send + Sync + 'static>),
}

impl Error {
    pub(crate) fn io(path: impl AsRef<std::path::Path>, source: std::io::Error) -> Self {
        Error::Io {
            path: path.as_ref().display().to_string(),
            source,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The text of [`Error::VersionMismatch`].
fn version_mismatch(current: Option<u64>, got: u64, expected: Option<u64>) -> String {
    match (current, expected) {
        (None, _) => {
            format!("receiver holds no version yet, got a sync for version {got} (needs a seed)")
        }
        (Some(c), Some(e)) => {
            format!(
                "receiver is at version {c}, got a sync for version {got} (needs {e} or a seed)"
            )
        }
        (Some(c), None) => {
            format!("receiver is at version {c}, got a sync for version {got} (needs a seed)")
        }
    }
}
