//! deltacast transports.
//!
//! - The core's [`Collective`](deltacast::sharded::Collective) (the few collective calls the
//!   sharded trainer makes: all-gather of the plan matrix, exact-size transfers to the leader)
//!   as [`InProcessCollective`] (threads of one process) and [`TcpCollective`] (a star through
//!   rank 0). Their errors reach the core as [`deltacast::Error::Transport`].
//! - [`FrameServer`] / [`FrameClient`]: fan-out of flush frames from the leader to receivers,
//!   with acks carrying (version, state digest).
//! - [`SyncServer`] / [`SyncClient`] ([`session`]): the resync protocol on top of the frame link,
//!   which repairs dropped links, corrupted flushes, restarts on either side, slow readers and
//!   tampered weights (docs/reliability.md). [`fault::FaultProxy`] injects those faults in tests.
//!
//! Every TCP link frames messages as `[u8 type][u64 LE length][payload]` ([`wire`]), checks
//! each length against a configured limit before allocating, and starts with a mutual HMAC
//! challenge–response on a shared secret ([`auth`]). Without a secret, servers listen on loopback
//! only. Every blocking call fails, naming the peer, at once on disconnect or after its timeout.

pub mod auth;
pub mod collective;
pub mod config;
pub mod error;
pub mod fault;
pub mod frames;
pub mod secret;
pub mod session;
pub mod tcp;
pub mod wire;

pub use collective::InProcessCollective;
pub use config::NetConfig;
pub use error::NetError;
pub use frames::{
    Ack, BroadcastReport, FrameClient, FrameServer, ReceiverId, ReceiverInfo, ServerEvent,
};
pub use secret::{generate_token, Secret, SECRET_ENV};
pub use session::{ClientEvent, SessionConfig, SessionError, SyncClient, SyncReport, SyncServer};
pub use tcp::{LeaderRendezvous, TcpCollective};
