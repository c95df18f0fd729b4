//! Message framing shared by every TCP link: `[u8 type][u64 LE length][payload]`.
//!
//! Every length is checked against the limit for that message type *before* any allocation, and a
//! peer that stops in the middle of a message is reported as such, so a hostile or dying peer can
//! make us neither allocate without bound nor hang.

use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::error::io_err;
use crate::NetError;

/// Bytes of the header: type (1) + length (8).
pub const HEADER_LEN: usize = 9;

/// Message type codes (the first byte of every message).
pub mod ty {
    /// Client → server, first handshake message.
    pub const HELLO: u8 = 0x01;
    /// Server → client: server nonce and proof.
    pub const CHALLENGE: u8 = 0x02;
    /// Client → server: client proof.
    pub const PROOF: u8 = 0x03;
    /// Server → client: handshake accepted.
    pub const AUTH_OK: u8 = 0x04;
    /// Either way, any phase: "I give up, here is why" (UTF-8), then the sender closes.
    pub const ERROR: u8 = 0x0F;
    /// Collective, rank → leader after authentication: `u32 rank, u32 world` (LE).
    pub const JOIN: u8 = 0x10;
    /// Collective, leader → rank: every rank has joined (empty).
    pub const READY: u8 = 0x11;
    /// Collective, rank → leader: this rank's all-gather row.
    pub const ROW: u8 = 0x12;
    /// Collective, leader → rank: all rows, `u32 count` then per row `u64 len, bytes`.
    pub const ROWS: u8 = 0x13;
    /// Collective, rank → leader: an exact-size transfer.
    pub const DATA: u8 = 0x14;
    /// Frame link, receiver → server after authentication:
    /// `u8 has_version, u64 version, u64 state_digest` (LE).
    pub const ANNOUNCE: u8 = 0x20;
    /// Frame link, server → receiver: one flush frame, opaque bytes.
    pub const FRAME: u8 = 0x21;
    /// Frame link, receiver → server: `u64 version, u64 state_digest, u8 ok, UTF-8 message`.
    pub const ACK: u8 = 0x22;
}

/// Longest reason carried by an ERROR message; longer ones are cut.
pub const MAX_REASON: usize = 1024;

/// Encodes one message header.
pub fn header(kind: u8, len: u64) -> [u8; HEADER_LEN] {
    let mut h = [0u8; HEADER_LEN];
    h[0] = kind;
    h[1..].copy_from_slice(&len.to_le_bytes());
    h
}

/// Runs `fut` under `limit` (none = wait forever), turning expiry into a [`NetError::Timeout`]
/// naming `peer`.
pub async fn with_timeout<T>(
    limit: Option<Duration>,
    peer: &str,
    what: &str,
    fut: impl std::future::Future<Output = Result<T, NetError>>,
) -> Result<T, NetError> {
    match limit {
        None => fut.await,
        Some(d) => match tokio::time::timeout(d, fut).await {
            Ok(r) => r,
            Err(_) => Err(NetError::Timeout {
                peer: peer.to_string(),
                what: what.to_string(),
                after: d,
            }),
        },
    }
}

/// Writes one message; `limit` bounds the whole write so a receiver that stops reading cannot
/// stall us (the kernel socket buffer is the only queue).
pub async fn write_msg<W: AsyncWrite + Unpin>(
    w: &mut W,
    kind: u8,
    payload: &[u8],
    peer: &str,
    what: &str,
    limit: Option<Duration>,
) -> Result<(), NetError> {
    with_timeout(limit, peer, &format!("sending {what}"), async {
        let h = header(kind, payload.len() as u64);
        if payload.len() <= 64 * 1024 {
            // One segment for small messages (TCP_NODELAY is on).
            let mut buf = Vec::with_capacity(HEADER_LEN + payload.len());
            buf.extend_from_slice(&h);
            buf.extend_from_slice(payload);
            w.write_all(&buf).await
        } else {
            match w.write_all(&h).await {
                Ok(()) => w.write_all(payload).await,
                Err(e) => Err(e),
            }
        }
        .map_err(|e| io_err(peer, &format!("while we sent {what}"), e))?;
        w.flush()
            .await
            .map_err(|e| io_err(peer, &format!("while we sent {what}"), e))
    })
    .await
}

/// Sends an ERROR message (best effort, short timeout): the reason the peer will print.
pub async fn send_error<W: AsyncWrite + Unpin>(w: &mut W, reason: &str) {
    let mut r = reason.as_bytes();
    if r.len() > MAX_REASON {
        r = &r[..MAX_REASON];
    }
    let _ = tokio::time::timeout(Duration::from_secs(1), async {
        let _ = w.write_all(&header(ty::ERROR, r.len() as u64)).await;
        let _ = w.write_all(r).await;
        let _ = w.flush().await;
    })
    .await;
}

/// A write failed because the peer went away; it may have sent an ERROR saying why just before.
/// Fetches that reason (briefly) so the caller reports the cause, not just "broken pipe".
pub async fn explain<S: AsyncRead + Unpin>(s: &mut S, peer: &str, e: NetError) -> NetError {
    if !matches!(e, NetError::Disconnected { .. } | NetError::Io { .. }) {
        return e;
    }
    let expect = Expect {
        allowed: &[],
        what: "its reason",
    };
    let brief = Some(Duration::from_millis(200));
    match read_msg(s, peer, expect, brief, brief).await {
        Err(aborted @ NetError::Aborted { .. }) => aborted,
        _ => e,
    }
}

/// What one read accepts: the allowed types, each with its own maximum length.
#[derive(Clone, Copy)]
pub struct Expect<'a> {
    /// `(type, max payload length)`; ERROR is always accepted (up to [`MAX_REASON`]).
    pub allowed: &'a [(u8, u64)],
    /// Human words for the awaited message, used in errors ("the all-gather row").
    pub what: &'a str,
}

/// Reads one message. `wait` bounds the wait for the header (none = forever: a receiver idles
/// between syncs), `body` bounds the rest once the header arrived. An ERROR from the peer is
/// returned as [`NetError::Aborted`] carrying its reason.
pub async fn read_msg<R: AsyncRead + Unpin>(
    r: &mut R,
    peer: &str,
    expect: Expect<'_>,
    wait: Option<Duration>,
    body: Option<Duration>,
) -> Result<(u8, Vec<u8>), NetError> {
    let what = expect.what;
    let mut h = [0u8; HEADER_LEN];
    with_timeout(wait, peer, &format!("waiting for {what}"), async {
        read_full(r, &mut h, peer, what, true).await
    })
    .await?;
    let (kind, n) = check_header(&h, peer, expect)?;
    let payload = with_timeout(body, peer, &format!("receiving {what}"), async {
        read_exact_vec(r, n, peer, what).await
    })
    .await?;
    if kind == ty::ERROR {
        return Err(NetError::Aborted {
            peer: peer.to_string(),
            reason: clean_reason(&payload),
        });
    }
    Ok((kind, payload))
}

/// Checks a header against what the read accepts, before anything is allocated for its
/// payload: returns the type and the payload length (at most the type's limit). Shared by
/// [`read_msg`] and the blocking handshake ([`crate::auth::blocking`]).
pub fn check_header(
    h: &[u8; HEADER_LEN],
    peer: &str,
    expect: Expect<'_>,
) -> Result<(u8, usize), NetError> {
    let what = expect.what;
    let kind = h[0];
    let mut len8 = [0u8; 8];
    len8.copy_from_slice(&h[1..]);
    let len = u64::from_le_bytes(len8);
    let max = if kind == ty::ERROR {
        MAX_REASON as u64
    } else {
        match expect.allowed.iter().find(|(t, _)| *t == kind) {
            Some(&(_, max)) => max,
            None => {
                return Err(NetError::Protocol {
                    peer: peer.to_string(),
                    detail: format!("expected {what}, got message type {kind:#04x} ({len} bytes)"),
                })
            }
        }
    };
    if len > max {
        return Err(NetError::TooLarge {
            peer: peer.to_string(),
            what: format!("{what} (type {kind:#04x})"),
            len,
            max,
        });
    }
    // `len <= max`, and every max fits in memory by configuration, so this cannot truncate.
    let n = usize::try_from(len).map_err(|_| NetError::TooLarge {
        peer: peer.to_string(),
        what: what.to_string(),
        len,
        max: usize::MAX as u64,
    })?;
    Ok((kind, n))
}

/// Turns untrusted reason bytes into a printable line.
pub fn clean_reason(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .take(MAX_REASON)
        .collect()
}

/// Fills `buf`, telling a disconnect before the first byte (`between` messages) from one in the
/// middle of a message.
async fn read_full<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut [u8],
    peer: &str,
    what: &str,
    header: bool,
) -> Result<(), NetError> {
    let mut got = 0;
    while got < buf.len() {
        let n = r
            .read(&mut buf[got..])
            .await
            .map_err(|e| io_err(peer, &format!("while we waited for {what}"), e))?;
        if n == 0 {
            let detail = if header && got == 0 {
                format!("while we waited for {what}")
            } else if header {
                format!("mid-header of {what} ({got} of {HEADER_LEN} bytes)")
            } else {
                format!("mid-message: {got} of {} bytes of {what}", buf.len())
            };
            return Err(NetError::Disconnected {
                peer: peer.to_string(),
                detail,
            });
        }
        got += n;
    }
    Ok(())
}

/// Reads exactly `n` bytes into a vector allocated once (never grown past `n`).
async fn read_exact_vec<R: AsyncRead + Unpin>(
    r: &mut R,
    n: usize,
    peer: &str,
    what: &str,
) -> Result<Vec<u8>, NetError> {
    let mut buf = Vec::with_capacity(n);
    let mut limited = AsyncReadExt::take(&mut *r, n as u64);
    while buf.len() < n {
        let got = limited
            .read_buf(&mut buf)
            .await
            .map_err(|e| io_err(peer, &format!("while we received {what}"), e))?;
        if got == 0 {
            return Err(NetError::Disconnected {
                peer: peer.to_string(),
                detail: format!("mid-message: {} of {n} bytes of {what}", buf.len()),
            });
        }
    }
    Ok(buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rt() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime")
    }

    const ROW: Expect<'static> = Expect {
        allowed: &[(ty::ROW, 100)],
        what: "the row",
    };

    #[test]
    fn round_trip() {
        rt().block_on(async {
            let mut out = Vec::new();
            write_msg(&mut out, ty::ROW, b"hello", "p", "row", None)
                .await
                .expect("write");
            assert_eq!(out.len(), HEADER_LEN + 5);
            let (k, p) = read_msg(&mut out.as_slice(), "p", ROW, None, None)
                .await
                .expect("read");
            assert_eq!((k, p.as_slice()), (ty::ROW, &b"hello"[..]));
        });
    }

    #[test]
    fn oversize_refused_before_allocation() {
        // A length of 2^62 would abort the process if allocated; it must be refused instead.
        let msg = header(ty::ROW, 1 << 62);
        let e = rt()
            .block_on(read_msg(&mut &msg[..], "rank 1", ROW, None, None))
            .expect_err("must refuse");
        assert!(matches!(e, NetError::TooLarge { len, max: 100, .. } if len == 1 << 62));
        assert!(e.to_string().contains("rank 1"), "{e}");
    }

    #[test]
    fn wrong_type_and_truncations() {
        let rt = rt();
        let msg = header(ty::DATA, 3);
        let e = rt
            .block_on(read_msg(&mut &msg[..], "p", ROW, None, None))
            .expect_err("type");
        assert!(matches!(e, NetError::Protocol { .. }), "{e}");

        let e = rt
            .block_on(read_msg(&mut &msg[..4], "p", ROW, None, None))
            .expect_err("short header");
        assert!(e.to_string().contains("mid-header"), "{e}");

        let e = rt
            .block_on(read_msg(&mut &[][..], "p", ROW, None, None))
            .expect_err("eof");
        assert!(matches!(e, NetError::Disconnected { .. }), "{e}");

        let mut m = header(ty::ROW, 10).to_vec();
        m.extend_from_slice(b"abc");
        let e = rt
            .block_on(read_msg(&mut m.as_slice(), "p", ROW, None, None))
            .expect_err("short body");
        assert!(e.to_string().contains("3 of 10 bytes"), "{e}");
    }

    #[test]
    fn error_message_becomes_aborted() {
        let mut m = header(ty::ERROR, 4).to_vec();
        m.extend_from_slice(b"oops");
        let e = rt()
            .block_on(read_msg(&mut m.as_slice(), "leader", ROW, None, None))
            .expect_err("aborted");
        assert!(
            matches!(&e, NetError::Aborted { reason, .. } if reason == "oops"),
            "{e}"
        );
    }
}
