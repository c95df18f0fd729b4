//! deltacast core: keeps inference replicas bit-identical to a trainer by sending only the
//! elements whose bits changed.
//!
//! The modules follow the data flow: [`diff`] a shard against its snapshot, [`codec`] the
//! changes per chunk, pack chunks into checksummed [`wire`] frames with the streaming
//! [`flush`] builder, and on the receiver [`apply`] a whole verified sync, proven by the
//! [`digest`] (or, for an owner that keeps the bits itself, such as an engine's
//! tensor-parallel ranks, check it with a [`ChangeReceiver`] that hands out the changes); what
//! a receiver holds and decides about each sync (versions, digests) is [`held`], shared with
//! the GPU receiver and the change receiver. [`sender`] ties the trainer side together,
//! [`sharded`] the sharded one (its deterministic cuts in [`plan`]); [`io`] reads and writes
//! safetensors.
//!
//! A slot's wire dtype need not be its source's: [`Sender::sync_from`] takes per-slot
//! [`Source`]s, and an fp32 source for a bf16 slot is rounded on the fly during the diff
//! ([`convert`]: bit-identical to torch's CPU `.to(torch.bfloat16)`, NaN result chosen by
//! [`Bf16Rule`]), so fp32 master weights sync as the bf16 an engine holds with no converted
//! copy; an fp32 source for an `F8_E4M3` slot is quantized to block FP8 with its scales in a
//! slot of their own ([`convert::fp8`], vLLM's block quantization). Other pairs are refused
//! with [`Error::UnsupportedConversion`]. Of the host senders, only the single-process
//! [`Sender`] converts so far.

pub mod codec;
pub mod convert;
pub mod diff;
pub mod digest;
pub mod dtype;
pub mod error;
pub mod placement;
pub mod slot;
pub mod slot_map;

pub use dtype::DType;
pub use error::{CodecError, Error, Result};
pub use slot::{SlotInfo, SlotTable};

pub mod apply;
pub mod flush;
pub mod held;
pub mod io;
pub mod plan;
pub mod sender;
pub mod sharded;
pub mod wire;

#[cfg(test)]
pub(crate) mod testutil;

pub use apply::changes::{ChangeChunk, ChangeReceiver, HeldBits, Progress};
pub use apply::{Receiver, SlotStore, SyncOutcome};
pub use codec::{CodecChoice, PosCodec, ValCodec};
pub use convert::Bf16Rule;
pub use flush::{FlushConfig, SyncStats};
pub use held::{HeldState, Pending};
pub use sender::{fp8_scale_slot, SendReport, Sender, Source, WeightSender, FP8_SCALE_SUFFIX};
pub use wire::FrameKind;
