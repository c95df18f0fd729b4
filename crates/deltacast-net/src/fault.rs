//! A loopback TCP relay that injects faults into a frame link, for the fault tests and
//! `deltacast soak`: it sits between one receiver and the server and, on request, cuts the
//! connection in the middle of a frame, flips a byte of a frame, or stops reading for a while.
//!
//! It parses the server → receiver direction by the link's own framing
//! (`[u8 type][u64 length][payload]`, see [`crate::wire`]) so a fault hits a frame's payload and
//! never the framing; the other direction is copied as is. It holds at most one message at a
//! time (up to `max_message` bytes), so a stall pushes back on the server through TCP.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

use crate::wire::{ty, HEADER_LEN};
use crate::NetError;

/// One fault, applied to the next frame(s) the server sends through the relay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Forward `after` frames whole, then half of the next one, then close both sides.
    DropMidFrame { after: u32 },
    /// Forward `after` frames whole, then flip the bits of one byte of the next one, at `offset`
    /// modulo its length.
    Corrupt { after: u32, offset: u64 },
    /// Stop reading from the server for this long before the next frame (a slow receiver).
    Stall(Duration),
}

impl Fault {
    /// A short name for reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Fault::DropMidFrame { .. } => "drop",
            Fault::Corrupt { .. } => "corrupt",
            Fault::Stall(_) => "stall",
        }
    }
}

#[derive(Default)]
struct State {
    queue: VecDeque<Fault>,
    /// Faults that took effect, in order.
    done: Vec<Fault>,
    /// Connections relayed so far.
    connections: u64,
}

/// The relay. Dropping it stops it and closes every relayed connection.
pub struct FaultProxy {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
    // Last: the task must be aborted before the runtime goes.
    rt: tokio::runtime::Runtime,
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock(s: &Mutex<State>) -> MutexGuard<'_, State> {
    // A panic while holding this lock cannot leave the queue half-updated; keep going.
    s.lock().unwrap_or_else(|p| p.into_inner())
}

impl FaultProxy {
    /// Listens on 127.0.0.1 (any port) and relays each connection to `upstream`. Messages above
    /// `max_message` bytes from the server end the connection (bounded memory).
    pub fn start(upstream: SocketAddr, max_message: u64) -> Result<Self, NetError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("deltacast-fault-proxy")
            .enable_all()
            .build()
            .map_err(|e| NetError::Setup {
                what: "cannot start the fault proxy's runtime".into(),
                source: e,
            })?;
        let lo = SocketAddr::from(([127, 0, 0, 1], 0));
        let listener = rt
            .block_on(TcpListener::bind(lo))
            .map_err(|e| NetError::Setup {
                what: "fault proxy cannot listen on 127.0.0.1".into(),
                source: e,
            })?;
        let addr = listener.local_addr().map_err(|e| NetError::Setup {
            what: "fault proxy address".into(),
            source: e,
        })?;
        let state = Arc::new(Mutex::new(State::default()));
        let task = rt.spawn(accept(listener, upstream, max_message, state.clone()));
        Ok(FaultProxy {
            addr,
            state,
            task,
            rt,
        })
    }

    /// Where receivers connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Queues a fault; faults apply one after another, each to the next frame(s).
    pub fn inject(&self, f: Fault) {
        lock(&self.state).queue.push_back(f);
    }

    /// Faults still queued.
    pub fn pending(&self) -> usize {
        lock(&self.state).queue.len()
    }

    /// Drops the queued faults that did not take effect yet.
    pub fn clear(&self) {
        lock(&self.state).queue.clear();
    }

    /// Faults that took effect so far.
    pub fn done(&self) -> Vec<Fault> {
        lock(&self.state).done.clone()
    }

    /// Connections relayed so far.
    pub fn connections(&self) -> u64 {
        lock(&self.state).connections
    }

    /// The runtime's handle (the relay runs on its own thread).
    pub fn handle(&self) -> tokio::runtime::Handle {
        self.rt.handle().clone()
    }
}

async fn accept(listener: TcpListener, upstream: SocketAddr, max: u64, state: Arc<Mutex<State>>) {
    loop {
        let Ok((down, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            continue;
        };
        lock(&state).connections += 1;
        let state = state.clone();
        tokio::spawn(async move {
            // The server may be restarting: then close, and the receiver reconnects.
            let Ok(Ok(up)) =
                tokio::time::timeout(Duration::from_secs(2), TcpStream::connect(upstream)).await
            else {
                return;
            };
            let _ = up.set_nodelay(true);
            let _ = down.set_nodelay(true);
            relay(down, up, max, state).await;
        });
    }
}

async fn relay(down: TcpStream, up: TcpStream, max: u64, state: Arc<Mutex<State>>) {
    let (mut down_r, mut down_w) = down.into_split();
    let (mut up_r, mut up_w) = up.into_split();
    let to_server = async {
        let _ = tokio::io::copy(&mut down_r, &mut up_w).await;
    };
    let to_receiver = async {
        let mut h = [0u8; HEADER_LEN];
        loop {
            if up_r.read_exact(&mut h).await.is_err() {
                return;
            }
            let mut len8 = [0u8; 8];
            len8.copy_from_slice(&h[1..]);
            let len = u64::from_le_bytes(len8);
            if len > max {
                return;
            }
            let fault = if h[0] == ty::FRAME {
                lock(&state).queue.front().copied()
            } else {
                None
            };
            if let Some(Fault::Stall(d)) = fault {
                take(&state, fault);
                tokio::time::sleep(d).await;
            }
            let mut p = vec![0u8; len as usize];
            if up_r.read_exact(&mut p).await.is_err() {
                return;
            }
            match fault {
                Some(Fault::Corrupt { after: 0, offset }) if !p.is_empty() => {
                    let at = (offset % p.len() as u64) as usize;
                    p[at] ^= 0xFF;
                    take(&state, fault);
                }
                Some(Fault::DropMidFrame { after: 0 }) => {
                    take(&state, fault);
                    let _ = down_w.write_all(&h).await;
                    let _ = down_w.write_all(&p[..p.len() / 2]).await;
                    let _ = down_w.flush().await;
                    return;
                }
                Some(Fault::DropMidFrame { .. } | Fault::Corrupt { .. }) => {
                    let mut s = lock(&state);
                    if let Some(Fault::DropMidFrame { after } | Fault::Corrupt { after, .. }) =
                        s.queue.front_mut()
                    {
                        *after = after.saturating_sub(1);
                    }
                }
                _ => {}
            }
            if down_w.write_all(&h).await.is_err() || down_w.write_all(&p).await.is_err() {
                return;
            }
        }
    };
    // Whichever direction ends first closes both.
    tokio::select! {
        () = to_server => {}
        () = to_receiver => {}
    }
}

/// Records that the fault at the queue's front took effect.
fn take(state: &Mutex<State>, fault: Option<Fault>) {
    let mut s = lock(state);
    if let Some(f) = fault {
        if s.queue.front().map(Fault::kind) == Some(f.kind()) {
            s.queue.pop_front();
        }
        s.done.push(f);
    }
}
