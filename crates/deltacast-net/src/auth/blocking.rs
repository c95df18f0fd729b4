//! The same handshake as [`super`] over a blocking [`TcpStream`], for links that do not run on
//! tokio (the CUDA-IPC link of `deltacast-cuda`). Only the I/O differs: every message is built
//! and checked by the steps the async handshake uses, each header is checked by
//! [`check_header`] before its payload is read (so at most [`MAX_REASON`] bytes are allocated
//! for a peer that has not authenticated), and the whole exchange runs under one deadline.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use super::{
    client_hello, client_on_challenge, refused_by_server, rejected_by_client, server_on_hello,
    server_on_proof, Link, Refuse, EXPECT_AUTH_OK, EXPECT_CHALLENGE, EXPECT_HELLO, EXPECT_PROOF,
};
use crate::error::io_err;
use crate::wire::{check_header, clean_reason, header, ty, Expect, HEADER_LEN, MAX_REASON};
use crate::{NetError, Secret};

/// Server side of the handshake on a blocking stream (the listener), within `limit`. On
/// failure the client has been told why (when there was something to tell). Leaves the
/// stream's read and write timeouts unset.
pub fn server_handshake(
    s: &mut TcpStream,
    secret: Option<&Secret>,
    link: Link,
    peer: &str,
    limit: Duration,
) -> Result<(), NetError> {
    let mut c = Conn::new(s, peer, limit);
    let done = server_steps(&mut c, secret, link);
    c.finish(done)
}

/// Client side of the handshake on a blocking stream (the connector), within `limit`. Sends
/// its proof only after the server proved it holds the secret. Leaves the stream's read and
/// write timeouts unset.
pub fn client_handshake(
    s: &mut TcpStream,
    secret: Option<&Secret>,
    link: Link,
    peer: &str,
    limit: Duration,
) -> Result<(), NetError> {
    let mut c = Conn::new(s, peer, limit);
    let done = client_steps(&mut c, secret, link);
    c.finish(done)
}

fn server_steps(c: &mut Conn<'_>, secret: Option<&Secret>, link: Link) -> Result<(), Refuse> {
    let (_, hello) = c.read_msg(EXPECT_HELLO).map_err(|e| {
        let tell = format!("handshake refused: {e}");
        Refuse::told(tell, e)
    })?;
    let pending = server_on_hello(&hello, secret, link, c.peer)?;
    c.write_msg(ty::CHALLENGE, &pending.challenge, "the handshake CHALLENGE")?;
    let (_, tag) = c
        .read_msg(EXPECT_PROOF)
        .map_err(|e| rejected_by_client(e, c.peer))?;
    server_on_proof(&pending, &tag, secret, link, c.peer)?;
    c.write_msg(ty::AUTH_OK, &[], "the handshake AUTH_OK")?;
    Ok(())
}

fn client_steps(c: &mut Conn<'_>, secret: Option<&Secret>, link: Link) -> Result<(), Refuse> {
    let (nc, hello) = client_hello(link, secret)?;
    c.write_msg(ty::HELLO, &hello, "the handshake HELLO")?;
    let (_, challenge) = c.read_msg(EXPECT_CHALLENGE).map_err(refused_by_server)?;
    let answer = client_on_challenge(&nc, &challenge, secret, link, c.peer)?;
    c.write_msg(ty::PROOF, &answer, "the handshake PROOF")?;
    c.read_msg(EXPECT_AUTH_OK).map_err(refused_by_server)?;
    Ok(())
}

/// One side's stream under the handshake's deadline.
struct Conn<'a> {
    s: &'a mut TcpStream,
    peer: &'a str,
    /// `None` for a limit too long to add to the clock.
    until: Option<Instant>,
    limit: Duration,
}

impl<'a> Conn<'a> {
    fn new(s: &'a mut TcpStream, peer: &'a str, limit: Duration) -> Conn<'a> {
        Conn {
            s,
            peer,
            until: Instant::now().checked_add(limit),
            limit,
        }
    }

    fn expired(&self) -> NetError {
        NetError::Timeout {
            peer: self.peer.to_string(),
            what: "the authentication handshake".into(),
            after: self.limit,
        }
    }

    /// Time left (at least 1 ms: a zero socket timeout means none), or the timeout error.
    fn left(&self) -> Result<Duration, NetError> {
        match self.until {
            None => Ok(Duration::from_secs(1 << 32)),
            Some(at) => match at.checked_duration_since(Instant::now()) {
                Some(d) if !d.is_zero() => Ok(d.max(Duration::from_millis(1))),
                _ => Err(self.expired()),
            },
        }
    }

    fn io(&self, doing: &str, e: std::io::Error) -> NetError {
        match e.kind() {
            ErrorKind::WouldBlock | ErrorKind::TimedOut => self.expired(),
            _ => io_err(self.peer, doing, e),
        }
    }

    /// Fills `buf` by the deadline, telling a disconnect before the first byte of a header
    /// from one in the middle of a message.
    fn read_full(&mut self, buf: &mut [u8], what: &str, is_header: bool) -> Result<(), NetError> {
        let mut got = 0;
        while got < buf.len() {
            let left = self.left()?;
            self.s
                .set_read_timeout(Some(left))
                .map_err(|e| io_err(self.peer, "setting a read timeout", e))?;
            match self.s.read(&mut buf[got..]) {
                Ok(0) => {
                    let detail = match (is_header, got) {
                        (true, 0) => format!("while we waited for {what}"),
                        (true, _) => format!("mid-header of {what} ({got} of {HEADER_LEN} bytes)"),
                        _ => format!("mid-message: {got} of {} bytes of {what}", buf.len()),
                    };
                    return Err(NetError::Disconnected {
                        peer: self.peer.to_string(),
                        detail,
                    });
                }
                Ok(n) => got += n,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io(&format!("while we waited for {what}"), e)),
            }
        }
        Ok(())
    }

    /// Reads one message of a type `expect` allows, its length checked before the payload
    /// is read; an ERROR from the peer comes back as [`NetError::Aborted`].
    fn read_msg(&mut self, expect: Expect<'_>) -> Result<(u8, Vec<u8>), NetError> {
        let mut h = [0u8; HEADER_LEN];
        self.read_full(&mut h, expect.what, true)?;
        let (kind, n) = check_header(&h, self.peer, expect)?;
        let mut payload = vec![0u8; n];
        self.read_full(&mut payload, expect.what, false)?;
        if kind == ty::ERROR {
            return Err(NetError::Aborted {
                peer: self.peer.to_string(),
                reason: clean_reason(&payload),
            });
        }
        Ok((kind, payload))
    }

    fn write_msg(&mut self, kind: u8, payload: &[u8], what: &str) -> Result<(), NetError> {
        let mut msg = Vec::with_capacity(HEADER_LEN + payload.len());
        msg.extend_from_slice(&header(kind, payload.len() as u64));
        msg.extend_from_slice(payload);
        let left = self.left()?;
        let doing = || format!("while we sent {what}");
        self.s
            .set_write_timeout(Some(left))
            .map_err(|e| io_err(self.peer, &doing(), e))?;
        self.s.write_all(&msg).map_err(|e| self.io(&doing(), e))
    }

    /// Best effort, within a second: the reason the peer will print.
    fn send_error(&mut self, reason: &str) {
        let r = &reason.as_bytes()[..reason.len().min(MAX_REASON)];
        let mut msg = Vec::with_capacity(HEADER_LEN + r.len());
        msg.extend_from_slice(&header(ty::ERROR, r.len() as u64));
        msg.extend_from_slice(r);
        if self
            .s
            .set_write_timeout(Some(Duration::from_secs(1)))
            .is_ok()
        {
            let _ = self.s.write_all(&msg);
        }
    }

    /// Tells the peer why on a refusal, unsets the timeouts, returns the outcome.
    fn finish(mut self, done: Result<(), Refuse>) -> Result<(), NetError> {
        let out = match done {
            Ok(()) => Ok(()),
            Err(r) => {
                if let Some(reason) = &r.tell {
                    self.send_error(reason);
                }
                Err(r.error)
            }
        };
        let _ = self.s.set_read_timeout(None);
        let _ = self.s.set_write_timeout(None);
        out
    }
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;

    use super::*;

    fn secret(s: &str) -> Secret {
        Secret::new(s).expect("secret")
    }

    /// Both sides over a real loopback connection, the server in a thread.
    fn pair(
        server: Option<Secret>,
        client: Option<Secret>,
        server_link: Link,
        client_link: Link,
    ) -> (Result<(), NetError>, Result<(), NetError>) {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let t = Duration::from_secs(5);
        let sv = std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            server_handshake(&mut s, server.as_ref(), server_link, "client", t)
        });
        let mut c = TcpStream::connect(addr).expect("connect");
        let cl = client_handshake(&mut c, client.as_ref(), client_link, "server", t);
        drop(c);
        (sv.join().expect("server thread"), cl)
    }

    #[test]
    fn matching_secrets_pass_and_timeouts_are_unset() {
        let k = secret("0123456789abcdef-blocking");
        let (s, c) = pair(Some(k.clone()), Some(k), Link::CudaIpc, Link::CudaIpc);
        s.expect("server");
        c.expect("client");
        let (s, c) = pair(None, None, Link::CudaIpc, Link::CudaIpc);
        s.expect("server");
        c.expect("client");
    }

    #[test]
    fn wrong_missing_or_other_link_fails_on_both_sides() {
        let (s, c) = pair(
            Some(secret("0123456789abcdef-server")),
            Some(secret("0123456789abcdef-client")),
            Link::CudaIpc,
            Link::CudaIpc,
        );
        // The client checks the server's proof first and gives up: it never sends a proof.
        assert!(
            matches!(&c, Err(NetError::Auth { detail, .. }) if detail.contains("wrong shared secret")),
            "{c:?}"
        );
        assert!(
            matches!(&s, Err(NetError::Auth { detail, .. }) if detail.contains("rejected us")),
            "{s:?}"
        );

        let (s, c) = pair(
            Some(secret("0123456789abcdef-server")),
            None,
            Link::CudaIpc,
            Link::CudaIpc,
        );
        assert!(matches!(s, Err(NetError::Auth { .. })), "{s:?}");
        assert!(
            matches!(&c, Err(NetError::Refused { reason, .. }) if reason.contains("requires")),
            "{c:?}"
        );

        // A proof for the frame link does not open a CUDA-IPC link.
        let k = secret("0123456789abcdef-shared");
        let (s, c) = pair(Some(k.clone()), Some(k), Link::CudaIpc, Link::Frames);
        assert!(matches!(s, Err(NetError::Protocol { .. })), "{s:?}");
        assert!(
            matches!(&c, Err(NetError::Refused { reason, .. }) if reason.contains("link type")),
            "{c:?}"
        );
    }

    #[test]
    fn the_blocking_server_authenticates_the_async_client() {
        let k = secret("0123456789abcdef-mixed");
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let server_secret = k.clone();
        let sv = std::thread::spawn(move || {
            let (mut s, _) = l.accept().expect("accept");
            let t = Duration::from_secs(5);
            server_handshake(&mut s, Some(&server_secret), Link::CudaIpc, "client", t)
        });
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt");
        let c = rt.block_on(async {
            let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
            let t = Duration::from_secs(5);
            super::super::client_handshake(&mut s, Some(&k), Link::CudaIpc, "server", t).await
        });
        c.expect("async client");
        sv.join().expect("thread").expect("blocking server");
    }

    #[test]
    fn silence_times_out_and_a_huge_length_is_refused_unread() {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let addr = l.local_addr().expect("addr");
        let k = secret("0123456789abcdef-shared");
        let sv = std::thread::spawn(move || {
            let mut out = Vec::new();
            for _ in 0..2 {
                let (mut s, _) = l.accept().expect("accept");
                let t = Duration::from_millis(200);
                out.push(server_handshake(
                    &mut s,
                    Some(&k),
                    Link::CudaIpc,
                    "stranger",
                    t,
                ));
            }
            out
        });
        let silent = TcpStream::connect(addr).expect("connect");
        let started = Instant::now();
        let mut huge = TcpStream::connect(addr).expect("connect");
        huge.write_all(&header(ty::HELLO, 1 << 62)).expect("header");
        let out = sv.join().expect("thread");
        drop(silent);
        assert!(
            matches!(out[0], Err(NetError::Timeout { .. })),
            "{:?}",
            out[0]
        );
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert!(
            matches!(out[1], Err(NetError::TooLarge { len, .. }) if len == 1 << 62),
            "{:?}",
            out[1]
        );
        // The stranger was told why (an ERROR message), and nothing else.
        let mut h = [0u8; HEADER_LEN];
        huge.read_exact(&mut h).expect("error header");
        assert_eq!(h[0], ty::ERROR);
    }
}
