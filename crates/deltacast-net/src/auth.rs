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

pub mod blocking;

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
/// Proof length.
pub const MAC_LEN: usize = 32;
/// Payload bytes of a HELLO.
pub const HELLO_LEN: usize = 4 + 1 + 1 + 1 + NONCE_LEN;
/// Payload bytes of a CHALLENGE (a HELLO's fields and the server's proof).
pub const CHALLENGE_LEN: usize = HELLO_LEN + MAC_LEN;
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
    /// A rank joining the root of a CUDA-IPC link (crate `deltacast-cuda`), which then hands
    /// it the IPC handles of its staging buffers.
    CudaIpc = 3,
}

impl Link {
    fn name(self) -> &'static str {
        match self {
            Link::Collective => "collective",
            Link::Frames => "frame link",
            Link::CudaIpc => "CUDA-IPC link",
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

/// What a step refuses with: the reason to tell the peer (an ERROR message, when there is one)
/// and the error this side returns.
pub(crate) struct Refuse {
    pub(crate) tell: Option<String>,
    pub(crate) error: NetError,
}

impl Refuse {
    fn told(tell: String, error: NetError) -> Refuse {
        Refuse {
            tell: Some(tell),
            error,
        }
    }
}

impl From<NetError> for Refuse {
    fn from(error: NetError) -> Refuse {
        Refuse { tell: None, error }
    }
}

/// What the server accepts first: a HELLO of its fixed size.
pub(crate) const EXPECT_HELLO: Expect<'static> = Expect {
    allowed: &[(ty::HELLO, HELLO_LEN as u64)],
    what: "the handshake HELLO",
};
/// What the client accepts after its HELLO.
pub(crate) const EXPECT_CHALLENGE: Expect<'static> = Expect {
    allowed: &[(ty::CHALLENGE, CHALLENGE_LEN as u64)],
    what: "the handshake CHALLENGE",
};
/// What the server accepts after its CHALLENGE.
pub(crate) const EXPECT_PROOF: Expect<'static> = Expect {
    allowed: &[(ty::PROOF, MAC_LEN as u64)],
    what: "the handshake PROOF",
};
/// What the client accepts after its PROOF.
pub(crate) const EXPECT_AUTH_OK: Expect<'static> = Expect {
    allowed: &[(ty::AUTH_OK, 0)],
    what: "the handshake AUTH_OK",
};

/// The client's first step: its nonce and the HELLO payload carrying it.
pub(crate) fn client_hello(
    link: Link,
    secret: Option<&Secret>,
) -> Result<([u8; NONCE_LEN], Vec<u8>), NetError> {
    let nc = nonce()?;
    Ok((nc, hello_fields(link, secret, &nc)))
}

/// The nonces of a server's handshake in progress, and the CHALLENGE it answers with.
pub(crate) struct ServerPending {
    nc: [u8; NONCE_LEN],
    ns: [u8; NONCE_LEN],
    pub(crate) challenge: Vec<u8>,
}

/// The server's answer to a HELLO: checks it and builds the CHALLENGE (with the server's
/// proof when it holds a secret).
pub(crate) fn server_on_hello(
    hello: &[u8],
    secret: Option<&Secret>,
    link: Link,
    peer: &str,
) -> Result<ServerPending, Refuse> {
    let (client_has, nc) = parse_hello(hello, link).map_err(|detail| {
        Refuse::told(
            detail.clone(),
            NetError::Protocol {
                peer: peer.into(),
                detail,
            },
        )
    })?;
    if client_has != secret.is_some() {
        let reason = secret_mismatch(secret.is_some());
        return Err(Refuse::told(
            format!("authentication refused: {reason}"),
            NetError::Auth {
                peer: peer.into(),
                detail: reason,
            },
        ));
    }
    let ns = nonce()?;
    let mut challenge = hello_fields(link, secret, &ns);
    match secret {
        Some(k) => challenge.extend_from_slice(&proof(k, link, ROLE_SERVER, &nc, &ns)),
        None => challenge.extend_from_slice(&[0u8; MAC_LEN]),
    }
    Ok(ServerPending { nc, ns, challenge })
}

/// The server's last check: the client's PROOF (any when neither side has a secret).
pub(crate) fn server_on_proof(
    pending: &ServerPending,
    tag: &[u8],
    secret: Option<&Secret>,
    link: Link,
    peer: &str,
) -> Result<(), Refuse> {
    match secret {
        Some(k) if !verify(k, link, ROLE_CLIENT, &pending.ns, &pending.nc, tag) => {
            Err(Refuse::told(
                "authentication failed: wrong shared secret".into(),
                NetError::Auth {
                    peer: peer.into(),
                    detail: "wrong shared secret (the client's proof did not verify)".into(),
                },
            ))
        }
        _ => Ok(()),
    }
}

/// The client's answer to a CHALLENGE: checks the server's proof first, then makes its own.
pub(crate) fn client_on_challenge(
    nc: &[u8; NONCE_LEN],
    challenge: &[u8],
    secret: Option<&Secret>,
    link: Link,
    peer: &str,
) -> Result<[u8; MAC_LEN], Refuse> {
    let (server_has, ns) = parse_hello(challenge, link).map_err(|detail| {
        Refuse::told(
            detail.clone(),
            NetError::Protocol {
                peer: peer.into(),
                detail,
            },
        )
    })?;
    if server_has != secret.is_some() {
        let reason = secret_mismatch(secret.is_some());
        return Err(Refuse::told(
            format!("authentication refused: {reason}"),
            NetError::Auth {
                peer: peer.into(),
                detail: reason,
            },
        ));
    }
    let Some(k) = secret else {
        return Ok([0u8; MAC_LEN]);
    };
    if !verify(k, link, ROLE_SERVER, nc, &ns, &challenge[HELLO_LEN..]) {
        return Err(Refuse::told(
            "authentication failed: the server's proof did not verify (wrong shared secret)".into(),
            NetError::Auth {
                peer: peer.into(),
                detail: "wrong shared secret (the server's proof did not verify)".into(),
            },
        ));
    }
    Ok(proof(k, link, ROLE_CLIENT, &ns, nc))
}

/// A client's read refused by the server's ERROR: the server refused us.
pub(crate) fn refused_by_server(e: NetError) -> NetError {
    match e {
        NetError::Aborted { peer, reason } => NetError::Refused { peer, reason },
        other => other,
    }
}

/// A server's PROOF read cut by the client's ERROR: the client rejected our proof.
pub(crate) fn rejected_by_client(e: NetError, peer: &str) -> NetError {
    match e {
        NetError::Aborted { reason, .. } => NetError::Auth {
            peer: peer.into(),
            detail: format!("the client rejected us: {reason}"),
        },
        other => other,
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
        let (_, hello) = match read_msg(s, peer, EXPECT_HELLO, None, None).await {
            Ok(m) => m,
            Err(e) => {
                send_error(s, &format!("handshake refused: {e}")).await;
                return Err(e);
            }
        };
        let pending = match server_on_hello(&hello, secret, link, peer) {
            Ok(p) => p,
            Err(r) => return Err(tell(s, r).await),
        };
        write_msg(
            s,
            ty::CHALLENGE,
            &pending.challenge,
            peer,
            "the handshake CHALLENGE",
            None,
        )
        .await?;
        let (_, tag) = read_msg(s, peer, EXPECT_PROOF, None, None)
            .await
            .map_err(|e| rejected_by_client(e, peer))?;
        if let Err(r) = server_on_proof(&pending, &tag, secret, link, peer) {
            return Err(tell(s, r).await);
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
    with_timeout(Some(limit), peer, "the authentication handshake", async {
        let (nc, hello) = client_hello(link, secret)?;
        write_msg(s, ty::HELLO, &hello, peer, "the handshake HELLO", None).await?;
        let (_, challenge) = read_msg(s, peer, EXPECT_CHALLENGE, None, None)
            .await
            .map_err(refused_by_server)?;
        let answer = match client_on_challenge(&nc, &challenge, secret, link, peer) {
            Ok(a) => a,
            Err(r) => return Err(tell(s, r).await),
        };
        write_msg(s, ty::PROOF, &answer, peer, "the handshake PROOF", None).await?;
        read_msg(s, peer, EXPECT_AUTH_OK, None, None)
            .await
            .map_err(refused_by_server)?;
        Ok(())
    })
    .await
}

/// Tells the peer why (when there is something to tell) and returns the error.
async fn tell<S: AsyncWrite + Unpin>(s: &mut S, r: Refuse) -> NetError {
    if let Some(reason) = &r.tell {
        send_error(s, reason).await;
    }
    r.error
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
