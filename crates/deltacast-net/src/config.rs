//! Settings shared by every TCP link, plus the socket plumbing they all need (bind policy,
//! connect with retry, keepalive), kept in one place so every link enforces the same rules.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::net::{TcpListener, TcpStream};

use crate::{NetError, Secret};

/// Default flush bucket of the core crate (512 MiB); frames never exceed it.
pub const DEFAULT_BUCKET_SIZE: u64 = 512 << 20;
/// Slack on top of the bucket for a frame's header, manifest and checksum.
pub const FRAME_SLACK: u64 = 64 << 10;

/// Timeouts, size limits and the shared secret of the TCP links.
#[derive(Clone, Debug)]
pub struct NetConfig {
    /// Shared secret; `None` runs unauthenticated, which servers allow on loopback only.
    pub secret: Option<Secret>,
    /// Whole authentication handshake, per connection.
    pub handshake_timeout: Duration,
    /// How long a connecting side retries an unreachable server, and how long the leader's
    /// rendezvous waits for every rank.
    pub connect_timeout: Duration,
    /// Collective: how long a call waits for the slowest rank to arrive (ranks diff at different
    /// speeds, so this is generous). `None` waits forever (disconnects still fail at once).
    pub op_timeout: Option<Duration>,
    /// Once a message header arrived, or a write started: how long its bytes may take.
    pub io_timeout: Duration,
    /// Frame link: how long the server waits for each receiver's ack.
    pub ack_timeout: Duration,
    /// Frame link: how long a receiver waits for the next frame (idle between syncs).
    /// `None` waits forever; a dead server is still noticed by disconnect or TCP keepalive.
    pub idle_timeout: Option<Duration>,
    /// Frame link: the kernel send buffer per receiver (`SO_SNDBUF`), `None` for the system's
    /// default. With it, a receiver that stops reading holds at most this much in the kernel
    /// before the server's write times out on it.
    pub send_buffer: Option<usize>,
    /// Largest all-gather row accepted.
    pub max_row: u64,
    /// Largest single rank → leader transfer accepted.
    pub max_transfer: u64,
    /// Largest frame accepted (bucket size + [`FRAME_SLACK`]).
    pub max_frame: u64,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            secret: None,
            handshake_timeout: Duration::from_secs(10),
            connect_timeout: Duration::from_secs(60),
            op_timeout: Some(Duration::from_secs(600)),
            io_timeout: Duration::from_secs(60),
            ack_timeout: Duration::from_secs(120),
            idle_timeout: None,
            send_buffer: None,
            max_row: 16 << 20,
            max_transfer: 4 << 30,
            max_frame: DEFAULT_BUCKET_SIZE + FRAME_SLACK,
        }
    }
}

impl NetConfig {
    /// Defaults with the secret from `file` or `DELTACAST_SECRET` (see
    /// [`Secret::from_env_or_file`]).
    pub fn from_env_or_file(file: Option<&std::path::Path>) -> Result<Self, NetError> {
        Ok(NetConfig {
            secret: Secret::from_env_or_file(file)?,
            ..NetConfig::default()
        })
    }

    /// Sets the shared secret.
    pub fn with_secret(mut self, secret: Option<Secret>) -> Self {
        self.secret = secret;
        self
    }

    /// Sizes the frame limit for flushes of at most `bucket_size` bytes.
    pub fn with_bucket_size(mut self, bucket_size: u64) -> Self {
        self.max_frame = bucket_size.saturating_add(FRAME_SLACK);
        self
    }

    /// Sets every timeout at once (handy for tests and for fail-fast deployments).
    pub fn with_timeouts(mut self, t: Duration) -> Self {
        self.handshake_timeout = t;
        self.connect_timeout = t;
        self.op_timeout = Some(t);
        self.io_timeout = t;
        self.ack_timeout = t;
        self
    }
}

/// Cap on connections that are still authenticating, so a flood of idle sockets cannot pin
/// unbounded memory (each costs at most one small pre-auth message).
pub(crate) const MAX_PENDING_HANDSHAKES: usize = 64;

/// Refuses to listen beyond loopback without a secret; says loudly when running without one.
pub(crate) fn check_bind(addr: SocketAddr, secret: Option<&Secret>) -> Result<(), NetError> {
    if secret.is_some() {
        return Ok(());
    }
    if !addr.ip().is_loopback() {
        return Err(NetError::UnauthenticatedNonLoopback { addr });
    }
    log::warn!(
        "deltacast-net: no shared secret (DELTACAST_SECRET): serving UNAUTHENTICATED on loopback {addr}"
    );
    Ok(())
}

/// Binds a listener after the loopback policy check.
pub(crate) async fn bind(
    addr: SocketAddr,
    secret: Option<&Secret>,
) -> Result<TcpListener, NetError> {
    check_bind(addr, secret)?;
    TcpListener::bind(addr).await.map_err(|e| NetError::Setup {
        what: format!("cannot listen on {addr}"),
        source: e,
    })
}

/// Small messages go out at once, and a peer that vanished without a FIN (host died, cable
/// pulled) is still noticed within about a minute by TCP keepalive.
pub(crate) fn tune(stream: &TcpStream) {
    let _ = stream.set_nodelay(true);
    let ka = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(30))
        .with_interval(Duration::from_secs(10));
    #[cfg(any(target_os = "linux", target_os = "macos", target_os = "freebsd"))]
    let ka = ka.with_retries(3);
    let _ = socket2::SockRef::from(stream).set_tcp_keepalive(&ka);
}

/// Resolves `addr` (a `host:port` string or a socket address).
pub(crate) fn resolve(addr: impl std::net::ToSocketAddrs) -> Result<Vec<SocketAddr>, NetError> {
    let addrs: Vec<SocketAddr> = addr
        .to_socket_addrs()
        .map_err(|e| NetError::Setup {
            what: "cannot resolve the server address".into(),
            source: e,
        })?
        .collect();
    if addrs.is_empty() {
        return Err(NetError::InvalidArgument(
            "the server address resolved to nothing".into(),
        ));
    }
    Ok(addrs)
}

/// Connects, retrying while the server is not up yet (ranks and receivers may start before the
/// leader), until `limit` has passed.
pub(crate) async fn connect_retry(
    addrs: &[SocketAddr],
    peer: &str,
    limit: Duration,
) -> Result<(TcpStream, SocketAddr), NetError> {
    let deadline = Instant::now() + limit;
    let mut delay = Duration::from_millis(20);
    loop {
        let mut last = None;
        for &a in addrs {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left.max(Duration::from_millis(1)), TcpStream::connect(a))
                .await
            {
                Ok(Ok(s)) => {
                    tune(&s);
                    return Ok((s, a));
                }
                Ok(Err(e)) => last = Some(e),
                Err(_) => {}
            }
        }
        if Instant::now() + delay >= deadline {
            let why = last.map_or_else(|| "no answer".to_string(), |e| e.to_string());
            return Err(NetError::Timeout {
                peer: peer.to_string(),
                what: format!("connecting ({why})"),
                after: limit,
            });
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(500));
    }
}

pub(crate) fn current_thread_runtime() -> Result<tokio::runtime::Runtime, NetError> {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| NetError::Setup {
            what: "cannot start the tokio runtime".into(),
            source: e,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_policy() {
        let lo: SocketAddr = "127.0.0.1:0".parse().expect("addr");
        let lo6: SocketAddr = "[::1]:0".parse().expect("addr");
        let any: SocketAddr = "0.0.0.0:0".parse().expect("addr");
        assert!(check_bind(lo, None).is_ok());
        assert!(check_bind(lo6, None).is_ok());
        let e = check_bind(any, None).expect_err("must refuse");
        assert!(e.to_string().contains("without a shared secret"), "{e}");
        let k = Secret::new("0123456789abcdef").expect("secret");
        assert!(check_bind(any, Some(&k)).is_ok());
    }
}
