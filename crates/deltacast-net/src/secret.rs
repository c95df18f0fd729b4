//! The shared secret that authenticates peers. Kept out of `Debug` output so it never lands in
//! logs, and read from a file or the environment so it never sits on a command line.

use std::fmt;
use std::path::Path;

use crate::NetError;

/// Name of the environment variable that holds the shared secret.
pub const SECRET_ENV: &str = "DELTACAST_SECRET";

/// Shortest secret accepted: shorter ones are guessable and are almost always a mistake.
pub const MIN_SECRET_LEN: usize = 16;

/// Longest secret file read; a secret is a token, not a document.
const MAX_SECRET_FILE: u64 = 4096;

/// A shared secret (HMAC key). `Debug` prints only its length.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Vec<u8>);

impl Secret {
    /// Wraps raw key bytes; refuses secrets shorter than [`MIN_SECRET_LEN`].
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, NetError> {
        let bytes = bytes.into();
        if bytes.len() < MIN_SECRET_LEN {
            return Err(NetError::Secret(format!(
                "the secret is {} bytes; use at least {MIN_SECRET_LEN} (e.g. `openssl rand -hex 32`)",
                bytes.len()
            )));
        }
        Ok(Secret(bytes))
    }

    /// Reads the secret from `file` when one is given (the explicit configuration wins), else
    /// from `DELTACAST_SECRET`. `Ok(None)` when neither is set: the caller then runs
    /// unauthenticated, which servers allow on loopback only. Trailing newlines are stripped so
    /// `echo secret > file` works.
    pub fn from_env_or_file(file: Option<&Path>) -> Result<Option<Self>, NetError> {
        if let Some(path) = file {
            return Self::from_file(path).map(Some);
        }
        match std::env::var_os(SECRET_ENV) {
            None => Ok(None),
            Some(v) => {
                let v = v
                    .into_string()
                    .map_err(|_| NetError::Secret(format!("{SECRET_ENV} is not valid UTF-8")))?;
                let v = v.trim_end_matches(['\n', '\r']);
                if v.is_empty() {
                    return Err(NetError::Secret(format!("{SECRET_ENV} is set but empty")));
                }
                Self::new(v.as_bytes()).map(Some)
            }
        }
    }

    /// Reads a secret file (at most 4 KiB, trailing newlines stripped).
    pub fn from_file(path: &Path) -> Result<Self, NetError> {
        let shown = path.display();
        let meta = std::fs::metadata(path)
            .map_err(|e| NetError::Secret(format!("cannot read secret file {shown}: {e}")))?;
        if meta.len() > MAX_SECRET_FILE {
            return Err(NetError::Secret(format!(
                "secret file {shown} is {} bytes; at most {MAX_SECRET_FILE} expected",
                meta.len()
            )));
        }
        let mut bytes = std::fs::read(path)
            .map_err(|e| NetError::Secret(format!("cannot read secret file {shown}: {e}")))?;
        while matches!(bytes.last(), Some(b'\n' | b'\r')) {
            bytes.pop();
        }
        if bytes.is_empty() {
            return Err(NetError::Secret(format!("secret file {shown} is empty")));
        }
        Self::new(bytes)
    }

    pub(crate) fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// Random bytes in a generated token: 256 bits, far beyond guessing.
const TOKEN_BYTES: usize = 32;

/// A fresh random secret as text (64 hex digits, from the system's randomness), for a root that
/// makes the secret itself and hands it to the other ranks over a channel they already share
/// (e.g. torch.distributed's store). Text, so that it also fits `DELTACAST_SECRET` or a file.
pub fn generate_token() -> Result<String, NetError> {
    let mut raw = [0u8; TOKEN_BYTES];
    getrandom::fill(&mut raw)
        .map_err(|e| NetError::Secret(format!("no system randomness for a secret: {e}")))?;
    Ok(raw.iter().map(|b| format!("{b:02x}")).collect())
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Secret({} bytes)", self.0.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_tokens_are_fresh_hex_secrets() {
        let a = generate_token().expect("token");
        let b = generate_token().expect("token");
        assert_eq!(a.len(), 2 * TOKEN_BYTES);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, b);
        assert_eq!(
            Secret::new(a.clone()).expect("usable").as_bytes(),
            a.as_bytes()
        );
    }

    #[test]
    fn short_secret_refused() {
        assert!(Secret::new("short").is_err());
        assert!(Secret::new("0123456789abcdef").is_ok());
    }

    #[test]
    fn file_secret_strips_newline_and_hides_in_debug() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("s");
        std::fs::write(&p, "0123456789abcdef0123\n").expect("write");
        let s = Secret::from_env_or_file(Some(&p))
            .expect("read")
            .expect("some");
        assert_eq!(s.as_bytes(), b"0123456789abcdef0123");
        assert_eq!(format!("{s:?}"), "Secret(20 bytes)");
        std::fs::write(&p, "\n").expect("write");
        assert!(Secret::from_file(&p).is_err());
        assert!(Secret::from_file(&dir.path().join("missing")).is_err());
    }
}
