//! Mutual HMAC challenge–response on a fresh connection, before anything else is read.
//!
//! Each side sends a random 32-byte nonce and answers the other's with
//! `HMAC-SHA256(secret, CONTEXT || link || own role || peer nonce || own nonce)`: the role byte
//! stops a proof from being reflected back, the link byte stops a proof for one link type from
//! opening another, and the own nonce binds both halves of the exchange. The client sends its
//! proof only after checking the server's. Until the handshake completes only fixed, tiny
//! messages are read (at most [`crate::wire::MAX_REASON`] bytes), all under one timeout.
//!
//! This authenticates the peers at connect time; it does not encrypt or MAC the later
//! traffic (frames carry their own checksums), so an active man in the middle on the path is out
//! of scope.

use std::time::Duration;

use hmac::{Hmac, KeyInit, Mac};
use sha2::Sha256;
use tokio::io::{AsyncRead, AsyncWrite};

use crate::wire::{read_msg, send_error, ty, with_timeout, write_msg, Expect};
use crate::{NetError, Secret};

/// First bytes of HELLO and CHALLENGE: tells a deltacast peer from anything else early.
pub const MAGIC: [u8; 4] = *b"DCNT";
/// Handshake protocol version.
pub const PROTO_VERSION: u8 = 1;
/// Domain-separation prefix of every MAC input.
pub const MAC_CONTEXT: &[u8] = b"deltacast-net v1 auth";
/// Role byte of the side that listens.
pub const ROLE_SERVER: u8 = b'S';
/// Role byte of the side that connects.
pub const ROLE_CLIENT: u8 = b'C';
/// Nonce and MAC length.
pub const NONCE_LEN: usize = 32;
const MAC_LEN: usize = 32;
const HELLO_LEN: usize = 4 + 1 + 1 + 1 + NONCE_LEN;
const CHALLENGE_LEN: usize = HELLO_LEN + MAC_LEN;
/// Flag bit: this side holds a shared secret.
const FLAG_SECRET: u8 = 1;

/// Which link a connection is for; part of the MAC input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u8)]
pub enum Link {
    /// A trainer rank joining the leader's collective.
    Collective = 1,
    /// A receiver joining the leader's frame fan-out.
    Frames = 2,
}

impl Link {
    fn name(self) -> &'static str {
        match self {
            Link::Collective => "collective",
            Link::Frames => "frame link",
        }
    }
}

fn nonce() -> Result<[u8; NONCE_LEN], NetError> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n)
        .map_err(|e| NetError::Secret(format!("no system randomness for a nonce: {e}")))?;
    Ok(n)
}

fn keyed(
    secret: &Secret,
    link: Link,
    role: u8,
    peer_nonce: &[u8],
    own_nonce: &[u8],
) -> Hmac<Sha256> {
    #[allow(clippy::expect_used)] // HMAC takes keys of any length: this cannot fail.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret.as_bytes())
        .expect("HMAC accepts keys of any length");
    mac.update(MAC_CONTEXT);
    mac.update(&[link as u8, role]);
    mac.update(peer_nonce);
    mac.update(own_nonce);
    mac
}

/// The proof a side with `role` sends, answering `peer_nonce`.
pub fn proof(
    secret: &Secret,
    link: Link,
    role: u8,
    peer_nonce: &[u8],
    own_nonce: &[u8],
) -> [u8; 32] {
    let tag = keyed(secret, link, role, peer_nonce, own_nonce)
        .finalize()
        .into_bytes();
    let mut out = [0u8; MAC_LEN];
    out.copy_from_slice(&tag);
    out
}

/// Constant-time check of a proof made by the side with `role`.
fn verify(
    secret: &Secret,
    link: Link,
    role: u8,
    peer_nonce: &[u8],
    own_nonce: &[u8],
    tag: &[u8],
) -> bool {
    keyed(secret, link, role, peer_nonce, own_nonce)
        .verify_slice(tag)
        .is_ok()
}

fn hello_fields(link: Link, secret: Option<&Secret>, nonce: &[u8; NONCE_LEN]) -> Vec<u8> {
    let mut m = Vec::with_capacity(CHALLENGE_LEN);
    m.extend_from_slice(&MAGIC);
    m.push(PROTO_VERSION);
    m.push(link as u8);
    m.push(if secret.is_some() { FLAG_SECRET } else { 0 });
    m.extend_from_slice(nonce);
    m
}

/// Checks magic, version and link of a HELLO / CHALLENGE; returns (has_secret, nonce).
fn parse_hello(p: &[u8], link: Link) -> Result<(bool, [u8; NONCE_LEN]), String> {
    if p.len() < HELLO_LEN || p[..4] != MAGIC {
        return Err("not a deltacast peer (bad magic)".into());
    }
    if p[4] != PROTO_VERSION {
        return Err(format!(
            "handshake version {} unsupported (this side speaks {PROTO_VERSION})",
            p[4]
        ));
    }
    if p[5] != link as u8 {
        return Err(format!(
            "link type {} does not match this {} (type {})",
            p[5],
            link.name(),
            link as u8
        ));
    }
    if p[6] & !FLAG_SECRET != 0 {
        return Err(format!("unknown handshake flags {:#04x}", p[6]));
    }
    let mut n = [0u8; NONCE_LEN];
    n.copy_from_slice(&p[7..7 + NONCE_LEN]);
    Ok((p[6] & FLAG_SECRET != 0, n))
}

fn secret_mismatch(we_have: bool) -> String {
    if we_have {
        "this side requires the shared secret (DELTACAST_SECRET or a secret file) and the other \
         side has none"
            .into()
    } else {
        "this side runs without a shared secret but the other side has one: configure the same \
         secret on both sides"
            .into()
    }
}

/// Server side of the handshake (the listener). On failure the client has been told why.
pub async fn server_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    secret: Option<&Secret>,
    link: Link,
    peer: &str,
    limit: Duration,
) -> Result<(), NetError> {
    with_timeout(Some(limit), peer, "the authentication handshake", async {
        let hello = Expect {
            allowed: &[(ty::HELLO, HELLO_LEN as u64)],
            what: "the handshake HELLO",
        };
        let (_, p) = match read_msg(s, peer, hello, None, None).await {
            Ok(m) => m,
            Err(e) => {
                send_error(s, &format!("handshake refused: {e}")).await;
                return Err(e);
            }
        };
        let (client_has, nc) = match parse_hello(&p, link) {
            Ok(v) => v,
            Err(detail) => {
                send_error(s, &detail).await;
                return Err(NetError::Protocol {
                    peer: peer.into(),
                    detail,
                });
            }
        };
        if client_has != secret.is_some() {
            let reason = secret_mismatch(secret.is_some());
            send_error(s, &format!("authentication refused: {reason}")).await;
            return Err(NetError::Auth {
                peer: peer.into(),
                detail: reason,
            });
        }
        let ns = nonce()?;
        let mut challenge = hello_fields(link, secret, &ns);
        match secret {
            Some(k) => challenge.extend_from_slice(&proof(k, link, ROLE_SERVER, &nc, &ns)),
            None => challenge.extend_from_slice(&[0u8; MAC_LEN]),
        }
        write_msg(
            s,
            ty::CHALLENGE,
            &challenge,
            peer,
            "the handshake CHALLENGE",
            None,
        )
        .await?;
        let expect = Expect {
            allowed: &[(ty::PROOF, MAC_LEN as u64)],
            what: "the handshake PROOF",
        };
        let tag = match read_msg(s, peer, expect, None, None).await {
            Ok((_, t)) => t,
            Err(NetError::Aborted { reason, .. }) => {
                return Err(NetError::Auth {
                    peer: peer.into(),
                    detail: format!("the client rejected us: {reason}"),
                })
            }
            Err(e) => return Err(e),
        };
        if let Some(k) = secret {
            if !verify(k, link, ROLE_CLIENT, &ns, &nc, &tag) {
                send_error(s, "authentication failed: wrong shared secret").await;
                return Err(NetError::Auth {
                    peer: peer.into(),
                    detail: "wrong shared secret (the client's proof did not verify)".into(),
                });
            }
        }
        write_msg(s, ty::AUTH_OK, &[], peer, "the handshake AUTH_OK", None).await
    })
    .await
}

/// Client side of the handshake (the connector). Sends its proof only after the server proved
/// it holds the secret.
pub async fn client_handshake<S: AsyncRead + AsyncWrite + Unpin>(
    s: &mut S,
    secret: Option<&Secret>,
    link: Link,
    peer: &str,
    limit: Duration,
) -> Result<(), NetError> {
    let refused = |e: NetError| match e {
        NetError::Aborted { peer, reason } => NetError::Refused { peer, reason },
        other => other,
    };
    with_timeout(Some(limit), peer, "the authentication handshake", async {
        let nc = nonce()?;
        write_msg(s, ty::HELLO, &hello_fields(link, secret, &nc), peer, "the handshake HELLO", None)
            .await?;
        let expect = Expect {
            allowed: &[(ty::CHALLENGE, CHALLENGE_LEN as u64)],
            what: "the handshake CHALLENGE",
        };
        let (_, p) = read_msg(s, peer, expect, None, None).await.map_err(refused)?;
        let (server_has, ns) = match parse_hello(&p, link) {
            Ok(v) => v,
            Err(detail) => {
                send_error(s, &detail).await;
                return Err(NetError::Protocol { peer: peer.into(), detail });
            }
        };
        if server_has != secret.is_some() {
            let reason = secret_mismatch(secret.is_some());
            send_error(s, &format!("authentication refused: {reason}")).await;
            return Err(NetError::Auth { peer: peer.into(), detail: reason });
        }
        let mut answer = [0u8; MAC_LEN];
        if let Some(k) = secret {
            if !verify(k, link, ROLE_SERVER, &nc, &ns, &p[HELLO_LEN..]) {
                send_error(s, "authentication failed: the server's proof did not verify (wrong shared secret)")
                    .await;
                return Err(NetError::Auth {
                    peer: peer.into(),
                    detail: "wrong shared secret (the server's proof did not verify)".into(),
                });
            }
            answer = proof(k, link, ROLE_CLIENT, &ns, &nc);
        }
        write_msg(s, ty::PROOF, &answer, peer, "the handshake PROOF", None).await?;
        let expect = Expect {
            allowed: &[(ty::AUTH_OK, 0)],
            what: "the handshake AUTH_OK",
        };
        read_msg(s, peer, expect, None, None).await.map_err(refused)?;
        Ok(())
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret(s: &str) -> Secret {
        Secret::new(s).expect("secret")
    }

    async fn pair(
        server: Option<Secret>,
        client: Option<Secret>,
    ) -> (Result<(), NetError>, Result<(), NetError>) {
        let (mut a, mut b) = tokio::io::duplex(4096);
        let t = Duration::from_secs(2);
        let sv = async move {
            let r = server_handshake(&mut a, server.as_ref(), Link::Frames, "client", t).await;
            drop(a);
            r
        };
        let cl = async move {
            let r = client_handshake(&mut b, client.as_ref(), Link::Frames, "server", t).await;
            drop(b);
            r
        };
        tokio::join!(sv, cl)
    }

    fn run<F: std::future::Future>(f: F) -> F::Output {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("rt")
            .block_on(f)
    }

    #[test]
    fn matching_secrets_and_no_secrets_pass() {
        let k = secret("0123456789abcdef-shared");
        let (s, c) = run(pair(Some(k.clone()), Some(k)));
        s.expect("server");
        c.expect("client");
        let (s, c) = run(pair(None, None));
        s.expect("server");
        c.expect("client");
    }

    #[test]
    fn wrong_or_missing_secret_fails_on_both_sides() {
        let (s, c) = run(pair(
            Some(secret("0123456789abcdef-server")),
            Some(secret("0123456789abcdef-client")),
        ));
        let (s, c) = (s.expect_err("server"), c.expect_err("client"));
        assert!(s.to_string().contains("secret"), "{s}");
        assert!(c.to_string().contains("wrong shared secret"), "{c}");

        let (s, c) = run(pair(Some(secret("0123456789abcdef-server")), None));
        assert!(matches!(s, Err(NetError::Auth { .. })), "{s:?}");
        assert!(
            matches!(&c, Err(NetError::Refused { reason, .. }) if reason.contains("requires")),
            "{c:?}"
        );

        let (s, c) = run(pair(None, Some(secret("0123456789abcdef-client"))));
        assert!(s.is_err() && c.is_err(), "{s:?} {c:?}");
    }

    #[test]
    fn proof_depends_on_role_link_and_nonces() {
        let k = secret("0123456789abcdef-shared");
        let (a, b) = ([1u8; 32], [2u8; 32]);
        let p = proof(&k, Link::Frames, ROLE_SERVER, &a, &b);
        assert_ne!(p, proof(&k, Link::Frames, ROLE_CLIENT, &a, &b));
        assert_ne!(p, proof(&k, Link::Collective, ROLE_SERVER, &a, &b));
        assert_ne!(p, proof(&k, Link::Frames, ROLE_SERVER, &b, &a));
        assert!(verify(&k, Link::Frames, ROLE_SERVER, &a, &b, &p));
        assert!(!verify(&k, Link::Frames, ROLE_SERVER, &a, &b, &p[..31]));
    }
}
