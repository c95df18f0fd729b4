//! One error type for every transport, so callers match on the kind and the message always names
//! the peer that caused it (a rank, a receiver or the leader, with its address).

use std::net::SocketAddr;
use std::time::Duration;

/// Everything that can go wrong in a transport. `peer` strings read like `rank 3 (127.0.0.1:4100)`,
/// `receiver #2 (10.0.0.5:5123)` or `leader (rank 0, 127.0.0.1:4000)`.
#[derive(Debug, thiserror::Error)]
pub enum NetError {
    /// The socket failed for a reason other than a clean disconnect.
    #[error("I/O error with {peer}: {source}")]
    Io {
        peer: String,
        #[source]
        source: std::io::Error,
    },
    /// The peer closed or reset the connection; `detail` says where in the protocol.
    #[error("{peer} disconnected {detail}")]
    Disconnected { peer: String, detail: String },
    /// The peer did not answer within the configured time.
    #[error("timed out after {after:?} waiting for {peer} ({what})")]
    Timeout {
        peer: String,
        what: String,
        after: Duration,
    },
    /// A length prefix above the configured maximum; refused before allocating.
    #[error("{peer} announced {what} of {len} bytes, above the limit of {max} bytes")]
    TooLarge {
        peer: String,
        what: String,
        len: u64,
        max: u64,
    },
    /// A transfer whose size differs from the one the plan says.
    #[error("{peer} sent {got} bytes where the plan says {expected}")]
    SizeMismatch {
        peer: String,
        expected: u64,
        got: u64,
    },
    /// The peer broke the message protocol (unexpected type, malformed payload).
    #[error("protocol error with {peer}: {detail}")]
    Protocol { peer: String, detail: String },
    /// The shared-secret handshake failed on this side.
    #[error("authentication with {peer} failed: {detail}")]
    Auth { peer: String, detail: String },
    /// The other side refused us and said why.
    #[error("{peer} refused the connection: {reason}")]
    Refused { peer: String, reason: String },
    /// A peer gave up and told us so, so that we fail fast instead of waiting.
    #[error("{peer} aborted: {reason}")]
    Aborted { peer: String, reason: String },
    /// A server without a shared secret was asked to listen beyond loopback.
    #[error(
        "refusing to listen on {addr} without a shared secret: set DELTACAST_SECRET or a secret \
         file, or bind to a loopback address (127.0.0.1 / ::1)"
    )]
    UnauthenticatedNonLoopback { addr: SocketAddr },
    /// The secret could not be read or is unusable.
    #[error("shared secret: {0}")]
    Secret(String),
    /// The caller used the API wrongly (a rank out of range, a leader-only call on a non-leader).
    #[error("invalid use: {0}")]
    InvalidArgument(String),
    /// An earlier error left the streams out of step; the object must be rebuilt.
    #[error("unusable after an earlier error: {0}")]
    Poisoned(String),
    /// Binding, accepting or starting the runtime failed.
    #[error("{what}: {source}")]
    Setup {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl NetError {
    /// True when the error came from the other side going away or giving up (as opposed to
    /// a protocol violation or a local mistake); callers may reconnect on these.
    pub fn is_disconnect(&self) -> bool {
        matches!(
            self,
            NetError::Disconnected { .. } | NetError::Aborted { .. } | NetError::Io { .. }
        )
    }
}

/// A transport failure as the core sees it (a [`Collective`](deltacast::sharded::Collective)
/// call, a frame sink): [`deltacast::Error::Transport`], this error kept as its source.
impl From<NetError> for deltacast::Error {
    fn from(e: NetError) -> Self {
        deltacast::Error::Transport(Box::new(e))
    }
}

/// The transport error inside a core error, for callers that match on its kind; any other
/// core error comes back unchanged as the `Err`.
impl TryFrom<deltacast::Error> for NetError {
    type Error = deltacast::Error;

    fn try_from(e: deltacast::Error) -> Result<Self, deltacast::Error> {
        match e {
            deltacast::Error::Transport(inner) => match inner.downcast::<NetError>() {
                Ok(net) => Ok(*net),
                Err(other) => Err(deltacast::Error::Transport(other)),
            },
            other => Err(other),
        }
    }
}

/// Maps an I/O error while talking to `peer` into a disconnect or a plain I/O error.
pub(crate) fn io_err(peer: &str, detail: &str, e: std::io::Error) -> NetError {
    use std::io::ErrorKind::*;
    match e.kind() {
        UnexpectedEof | ConnectionReset | ConnectionAborted | BrokenPipe | NotConnected => {
            NetError::Disconnected {
                peer: peer.to_string(),
                detail: format!("{detail} ({e})"),
            }
        }
        _ => NetError::Io {
            peer: peer.to_string(),
            source: e,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_net_error_crosses_the_core_and_comes_back_whole() {
        let net = NetError::SizeMismatch {
            peer: "rank 3 (127.0.0.1:4100)".into(),
            expected: 10,
            got: 7,
        };
        let text = net.to_string();
        let core = deltacast::Error::from(net);
        assert_eq!(core.to_string(), format!("transport failed: {text}"));
        let source = std::error::Error::source(&core).expect("the cause is kept");
        assert_eq!(source.to_string(), text);
        assert!(matches!(
            NetError::try_from(core),
            Ok(NetError::SizeMismatch {
                expected: 10,
                got: 7,
                ..
            })
        ));
        // Any other core error, or another transport's, comes back unchanged.
        let other = NetError::try_from(deltacast::Error::Malformed("m".into()));
        assert!(matches!(other, Err(deltacast::Error::Malformed(m)) if m == "m"));
        let foreign = deltacast::Error::Transport("a foreign transport".into());
        assert!(matches!(
            NetError::try_from(foreign),
            Err(deltacast::Error::Transport(e)) if e.to_string() == "a foreign transport"
        ));
    }
}
