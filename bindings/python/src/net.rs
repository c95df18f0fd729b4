//! deltacast-net's frame link in Python: `FrameServer` (a trainer rank fans frames out to
//! receivers and collects their acks) and `FrameClient` (a receiver), both authenticated with
//! a shared secret (HMAC challenge–response) and loopback-only without one. Blocking calls
//! release the GIL.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Mutex;
use std::time::Duration;

use deltacast_net::{Ack, FrameClient as RsClient, FrameServer as RsServer, NetConfig, NetError};
use deltacast_net::{ReceiverId, Secret};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use crate::arrays::frame_bytes;
use crate::errors::{invalid, raise};

/// A link error as the package's exceptions: timeouts as `SyncTimeoutError`, a failed
/// handshake as `AuthenticationError`, bad arguments as `InvalidArgumentError`, the rest as
/// `LinkError`; the message names the peer.
fn net_err(e: NetError) -> PyErr {
    let class = match &e {
        NetError::Timeout { .. } => "SyncTimeoutError",
        NetError::Auth { .. } => "AuthenticationError",
        NetError::InvalidArgument(_)
        | NetError::Secret(_)
        | NetError::UnauthenticatedNonLoopback { .. } => "InvalidArgumentError",
        _ => "LinkError",
    };
    raise(class, e.to_string(), &[])
}

fn seconds(s: f64, what: &str) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .map_err(|_| invalid(format!("{what} must be a finite number >= 0")))
}

/// The link settings: the secret (given, else `DELTACAST_SECRET`) and every timeout.
fn config(secret: Option<&Bound<'_, PyAny>>, timeout_s: f64) -> PyResult<NetConfig> {
    let mut cfg = match secret {
        Some(s) => {
            let bytes: Vec<u8> = if let Ok(text) = s.extract::<String>() {
                text.into_bytes()
            } else {
                s.extract::<Vec<u8>>()
                    .map_err(|_| invalid("secret must be str or bytes"))?
            };
            NetConfig::default().with_secret(Some(Secret::new(bytes).map_err(net_err)?))
        }
        None => NetConfig::from_env_or_file(None).map_err(net_err)?,
    };
    cfg = cfg.with_timeouts(seconds(timeout_s, "timeout_s")?);
    Ok(cfg)
}

fn parse_address(text: &str) -> PyResult<SocketAddr> {
    text.to_socket_addrs()
        .map_err(|e| invalid(format!("address {text:?}: {e}")))?
        .next()
        .ok_or_else(|| invalid(format!("address {text:?} resolves to nothing")))
}

fn frame_vec(frame: &Bound<'_, PyAny>) -> PyResult<Vec<u8>> {
    let (_held, view) = frame_bytes(frame)?;
    // SAFETY: `_held` keeps the object alive while its bytes are copied.
    Ok(unsafe { view.bytes() }.to_vec())
}

/// Runs `f` on the open end in `slot` without the GIL; a closed end is a `LinkError` naming
/// `what`.
fn with_open<S: Send, T: Send>(
    py: Python<'_>,
    slot: &Mutex<Option<S>>,
    what: &str,
    f: impl FnOnce(&mut S) -> T + Send,
) -> PyResult<T> {
    py.detach(|| {
        let mut guard = slot.lock().unwrap_or_else(|p| p.into_inner());
        guard.as_mut().map(f)
    })
    .ok_or_else(|| raise("LinkError", format!("the {what} is closed"), &[]))
}

/// A trainer rank's end of the frame link: binds `address` ("host:port", port 0 picks one),
/// accepts and authenticates receivers in the background. `secret` (str or bytes, ≥ 16
/// bytes) or else `DELTACAST_SECRET`; without either only a loopback address may be bound.
/// `timeout_s` bounds every wait (handshake, writes, acks); `max_frame` the largest frame.
#[pyclass(module = "deltacast._native")]
pub struct FrameServer {
    inner: Mutex<Option<RsServer>>,
    address: String,
    authenticated: bool,
    timeout: Duration,
}

impl FrameServer {
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut RsServer) -> T + Send,
    ) -> PyResult<T> {
        with_open(py, &self.inner, "frame server", f)
    }
}

fn ids_of(py: Python<'_>, s: &RsServer) -> PyResult<Py<PyList>> {
    let ids: Vec<u64> = s.receivers().iter().map(|r| r.id.0).collect();
    Ok(PyList::new(py, ids)?.unbind())
}

#[pymethods]
impl FrameServer {
    #[new]
    #[pyo3(signature = (address = "127.0.0.1:0", *, secret = None, timeout_s = 60.0, max_frame = None))]
    fn new(
        py: Python<'_>,
        address: &str,
        secret: Option<&Bound<'_, PyAny>>,
        timeout_s: f64,
        max_frame: Option<u64>,
    ) -> PyResult<Self> {
        let mut cfg = config(secret, timeout_s)?;
        if let Some(m) = max_frame {
            cfg.max_frame = m;
        }
        let timeout = cfg.ack_timeout;
        let addr = parse_address(address)?;
        let server = py.detach(|| RsServer::bind(addr, cfg)).map_err(net_err)?;
        Ok(FrameServer {
            address: server.local_addr().to_string(),
            authenticated: server.is_authenticated(),
            timeout,
            inner: Mutex::new(Some(server)),
        })
    }

    /// The bound "host:port".
    #[getter]
    fn address(&self) -> String {
        self.address.clone()
    }

    /// Whether receivers must prove the shared secret.
    #[getter]
    fn authenticated(&self) -> bool {
        self.authenticated
    }

    /// Waits until at least `n` receivers are connected (up to `timeout_s`, else the
    /// server's timeout); the ids of every receiver connected now.
    #[pyo3(signature = (n, timeout_s = None))]
    fn wait_for_receivers(
        &self,
        py: Python<'_>,
        n: usize,
        timeout_s: Option<f64>,
    ) -> PyResult<Py<PyList>> {
        let limit = match timeout_s {
            Some(t) => seconds(t, "timeout_s")?,
            None => self.timeout,
        };
        self.with(py, |s| s.wait_for_receivers(n, limit).map(|_| ()))?
            .map_err(net_err)?;
        let guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        match guard.as_ref() {
            Some(s) => ids_of(py, s),
            None => Err(raise("LinkError", "the frame server is closed".into(), &[])),
        }
    }

    /// The connected receivers: dicts of `id`, `peer` (address), `version` (announced; None:
    /// holds nothing) and `state_digest`.
    fn receivers<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let infos = self.with(py, |s| {
            s.accept_new();
            s.receivers()
        })?;
        let out = PyList::empty(py);
        for r in infos {
            let d = PyDict::new(py);
            d.set_item("id", r.id.0)?;
            d.set_item("peer", r.addr.to_string())?;
            d.set_item("version", r.version)?;
            d.set_item("state_digest", r.state_digest)?;
            out.append(d)?;
        }
        Ok(out)
    }

    /// Sends `frame` (bytes-like or a uint8 array) to every connected receiver; the ids of
    /// those that failed and were dropped.
    fn broadcast(&self, py: Python<'_>, frame: &Bound<'_, PyAny>) -> PyResult<Vec<u64>> {
        let data = frame_vec(frame)?;
        let report = self.with(py, |s| s.broadcast(&data))?.map_err(net_err)?;
        Ok(report.failed.iter().map(|(id, _)| id.0).collect())
    }

    /// Sends `frame` to one receiver; an error if it failed (it is dropped then).
    fn send_to(&self, py: Python<'_>, receiver_id: u64, frame: &Bound<'_, PyAny>) -> PyResult<()> {
        let data = frame_vec(frame)?;
        self.with(py, |s| s.send_to(ReceiverId(receiver_id), &data))?
            .map_err(net_err)
    }

    /// One ack from every connected receiver, waited for concurrently up to the server's
    /// timeout: dicts of `id`, `version`, `state_digest`, `ok`, `message`, or `id` and
    /// `error` for a receiver whose link failed (it is dropped).
    fn collect_acks<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let acks = self.with(py, |s| s.collect_acks())?;
        let out = PyList::empty(py);
        for (id, r) in acks {
            let d = PyDict::new(py);
            d.set_item("id", id.0)?;
            match r {
                Ok(a) => {
                    d.set_item("version", a.version)?;
                    d.set_item("state_digest", a.state_digest)?;
                    d.set_item("ok", a.ok)?;
                    d.set_item("message", a.message)?;
                }
                Err(e) => d.set_item("error", e.to_string())?,
            }
            out.append(d)?;
        }
        Ok(out)
    }

    /// Drops one receiver, telling it why.
    fn disconnect(&self, py: Python<'_>, receiver_id: u64, reason: &str) -> PyResult<()> {
        self.with(py, |s| s.disconnect(ReceiverId(receiver_id), reason))
    }

    /// Tells every receiver the session is over and stops listening.
    #[pyo3(signature = (reason = "closed"))]
    fn close(&self, py: Python<'_>, reason: &str) {
        py.detach(|| {
            let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(mut s) = guard.take() {
                for r in s.receivers() {
                    s.disconnect(r.id, reason);
                }
            }
        })
    }
}

/// A receiver's end of the frame link: connects to `address` (retrying while the server is
/// not up, up to `timeout_s`), authenticates, announces `version` (None: holds nothing) and
/// `state_digest`. `idle_timeout_s` bounds the wait for the next frame (None: forever).
#[pyclass(module = "deltacast._native")]
pub struct FrameClient {
    inner: Mutex<Option<RsClient>>,
    server: String,
}

impl FrameClient {
    fn with<T: Send>(
        &self,
        py: Python<'_>,
        f: impl FnOnce(&mut RsClient) -> T + Send,
    ) -> PyResult<T> {
        with_open(py, &self.inner, "frame client", f)
    }
}

#[pymethods]
impl FrameClient {
    #[new]
    #[pyo3(signature = (address, *, secret = None, version = None, state_digest = 0, timeout_s = 60.0, idle_timeout_s = None, max_frame = None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        address: &str,
        secret: Option<&Bound<'_, PyAny>>,
        version: Option<u64>,
        state_digest: u64,
        timeout_s: f64,
        idle_timeout_s: Option<f64>,
        max_frame: Option<u64>,
    ) -> PyResult<Self> {
        let mut cfg = config(secret, timeout_s)?;
        cfg.idle_timeout = match idle_timeout_s {
            Some(t) => Some(seconds(t, "idle_timeout_s")?),
            None => None,
        };
        if let Some(m) = max_frame {
            cfg.max_frame = m;
        }
        let addr = parse_address(address)?;
        let client = py
            .detach(|| RsClient::connect(addr, version, state_digest, cfg))
            .map_err(net_err)?;
        Ok(FrameClient {
            server: client.server().to_string(),
            inner: Mutex::new(Some(client)),
        })
    }

    /// The server, as errors name it.
    #[getter]
    fn server(&self) -> String {
        self.server.clone()
    }

    /// The next frame, as bytes.
    fn recv_frame<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyBytes>> {
        let frame = self.with(py, |c| c.recv_frame())?.map_err(net_err)?;
        Ok(PyBytes::new(py, &frame))
    }

    /// Acknowledges a sync: the version and state digest now held, whether it applied, why not.
    #[pyo3(signature = (version, state_digest, ok = true, message = ""))]
    fn send_ack(
        &self,
        py: Python<'_>,
        version: u64,
        state_digest: u64,
        ok: bool,
        message: &str,
    ) -> PyResult<()> {
        let ack = Ack {
            version,
            state_digest,
            ok,
            message: message.to_string(),
        };
        self.with(py, |c| c.send_ack(&ack))?.map_err(net_err)
    }

    /// Says goodbye with `reason` and closes.
    #[pyo3(signature = (reason = "closed"))]
    fn close(&self, py: Python<'_>, reason: &str) {
        py.detach(|| {
            let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(c) = guard.take() {
                c.close(reason);
            }
        })
    }
}

/// A random token to use as a shared secret (hand it to the other side through a channel
/// that is already trusted).
#[pyfunction]
pub fn generate_token() -> PyResult<String> {
    deltacast_net::generate_token().map_err(net_err)
}
