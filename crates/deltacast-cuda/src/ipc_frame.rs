//! The host messages of the CUDA-IPC link (`ipc::IpcComm`, with the `cuda` feature): fixed 32-byte frames on
//! a loopback TCP connection between the root and each other rank, some followed by a
//! trailer whose length the frame gives and this module bounds. The bytes of a broadcast
//! never travel here: they go through the root's staging slots on the GPU; these frames only
//! say which slot holds which piece, and when a receiver has taken it. The gathers of a
//! sharded trainer's ranks (small rows, and each rank's encoded changes to the leader) do
//! travel here, as `Part`s.
//!
//! Kept apart from the link itself (and built without the `cuda` feature) so that decoding,
//! the part that reads what a peer sent, is tested on every machine.

use crate::error::{CudaError, Result};

/// Bytes of every frame.
pub const FRAME_BYTES: usize = 32;
/// Bytes of a CUDA IPC handle (memory or event), `CU_IPC_HANDLE_SIZE`.
pub const IPC_HANDLE_BYTES: usize = 64;
/// Most staging slots a root may announce.
pub const MAX_SLOTS: u64 = 64;
/// Most u64 words one all-reduce may carry.
pub const MAX_REDUCE_WORDS: u64 = 64;
/// The link's version; both ends must speak the same. 3: every connection starts with the
/// shared-secret handshake (`ipc_setup`).
pub const LINK_VERSION: u64 = 3;

const MAGIC: u32 = u32::from_le_bytes(*b"DCIP");

/// One host message of the IPC link.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Frame {
    /// A rank joining (to the root): who it is and how many ranks it expects.
    Hello {
        rank: u64,
        nranks: u64,
        version: u64,
    },
    /// The root's staging: `slots` buffers of `slot_bytes`; followed by `slots` memory
    /// handles, then `slots` event handles (the "filled" events).
    Setup { slots: u64, slot_bytes: u64 },
    /// A rank has mapped the `slots` slots and their events.
    Joined { slots: u64 },
    /// Piece `seq` of the broadcasts, `len` bytes, is in slot `slot` once its event fires.
    Filled { seq: u64, len: u64, slot: u64 },
    /// A rank's copy of piece `seq` out of its slot has completed: the root may refill it.
    Drained { seq: u64 },
    /// A rank's part of an all-reduce: `words` u64 follow.
    Reduce { words: u64 },
    /// The root's result of an all-reduce: `words` u64 follow.
    Reduced { words: u64 },
    /// The sender is leaving the link; from the root: release what you mapped of mine.
    Bye,
    /// A part of a gather (to the root) or of an all-gather's result (from it): `len` bytes
    /// follow, read only by a reader that expects exactly that many (the lengths come from
    /// the ranks' plan, never from the frame).
    Part { len: u64 },
}

impl Frame {
    fn tag(&self) -> u32 {
        match self {
            Frame::Hello { .. } => 1,
            Frame::Setup { .. } => 2,
            Frame::Joined { .. } => 3,
            Frame::Filled { .. } => 4,
            Frame::Drained { .. } => 5,
            Frame::Reduce { .. } => 6,
            Frame::Reduced { .. } => 7,
            Frame::Bye => 8,
            Frame::Part { .. } => 9,
        }
    }

    fn fields(&self) -> [u64; 3] {
        match *self {
            Frame::Hello {
                rank,
                nranks,
                version,
            } => [rank, nranks, version],
            Frame::Setup { slots, slot_bytes } => [slots, slot_bytes, 0],
            Frame::Joined { slots } => [slots, 0, 0],
            Frame::Filled { seq, len, slot } => [seq, len, slot],
            Frame::Drained { seq } => [seq, 0, 0],
            Frame::Reduce { words } | Frame::Reduced { words } => [words, 0, 0],
            Frame::Bye => [0, 0, 0],
            Frame::Part { len } => [len, 0, 0],
        }
    }

    pub fn encode(&self) -> [u8; FRAME_BYTES] {
        let mut out = [0u8; FRAME_BYTES];
        out[..4].copy_from_slice(&MAGIC.to_le_bytes());
        out[4..8].copy_from_slice(&self.tag().to_le_bytes());
        for (i, f) in self.fields().iter().enumerate() {
            out[8 + 8 * i..16 + 8 * i].copy_from_slice(&f.to_le_bytes());
        }
        out
    }

    /// Decodes a frame, refusing an unknown tag, a bad magic, unused fields that are not zero
    /// and trailer lengths beyond the bounds above (so a reader never allocates on a length
    /// it has not checked).
    pub fn decode(bytes: &[u8; FRAME_BYTES]) -> Result<Frame> {
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&bytes[8 + 8 * i..16 + 8 * i]);
            u64::from_le_bytes(w)
        };
        let magic = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
        if magic != MAGIC {
            return Err(bad(format!(
                "magic {magic:#010x}, not a deltacast IPC frame"
            )));
        }
        let tag = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
        let [a, b, c] = [word(0), word(1), word(2)];
        let frame = match tag {
            1 => Frame::Hello {
                rank: a,
                nranks: b,
                version: c,
            },
            2 => Frame::Setup {
                slots: a,
                slot_bytes: b,
            },
            3 => Frame::Joined { slots: a },
            4 => Frame::Filled {
                seq: a,
                len: b,
                slot: c,
            },
            5 => Frame::Drained { seq: a },
            6 => Frame::Reduce { words: a },
            7 => Frame::Reduced { words: a },
            8 => Frame::Bye,
            9 => Frame::Part { len: a },
            _ => return Err(bad(format!("unknown frame tag {tag}"))),
        };
        if frame.fields() != [a, b, c] {
            return Err(bad(format!("frame tag {tag} with unused fields set")));
        }
        match frame {
            Frame::Setup { slots, .. } | Frame::Joined { slots }
                if slots == 0 || slots > MAX_SLOTS =>
            {
                Err(bad(format!("{slots} staging slots (1 to {MAX_SLOTS})")))
            }
            Frame::Setup { slot_bytes: 0, .. } => Err(bad("staging slots of 0 bytes".into())),
            Frame::Reduce { words } | Frame::Reduced { words } if words > MAX_REDUCE_WORDS => {
                Err(bad(format!(
                    "an all-reduce of {words} words (at most {MAX_REDUCE_WORDS})"
                )))
            }
            f => Ok(f),
        }
    }

    /// Bytes that follow this frame (bounded by `decode`'s checks); a `Part`'s are read
    /// apart, by a reader that knows how many it expects.
    pub fn trailer_bytes(&self) -> usize {
        match *self {
            Frame::Setup { slots, .. } => 2 * slots as usize * IPC_HANDLE_BYTES,
            Frame::Reduce { words } | Frame::Reduced { words } => 8 * words as usize,
            _ => 0,
        }
    }
}

fn bad(msg: String) -> CudaError {
    CudaError::Protocol(format!("IPC link: {msg}"))
}

/// The piece lengths a broadcast of `len` bytes is cut into, for slots of `slot_bytes`:
/// both ends cut the same way, so each checks the other's `Filled` lengths.
pub fn pieces(len: u64, slot_bytes: u64) -> impl Iterator<Item = (u64, u64)> {
    let step = slot_bytes.max(1);
    (0..len.div_ceil(step)).map(move |i| {
        let at = i * step;
        (at, step.min(len - at))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn any_frame() -> impl Strategy<Value = Frame> {
        prop_oneof![
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(rank, nranks, version)| {
                Frame::Hello {
                    rank,
                    nranks,
                    version,
                }
            }),
            (1..=MAX_SLOTS, 1..u64::MAX)
                .prop_map(|(slots, slot_bytes)| Frame::Setup { slots, slot_bytes }),
            (1..=MAX_SLOTS).prop_map(|slots| Frame::Joined { slots }),
            (any::<u64>(), any::<u64>(), any::<u64>()).prop_map(|(seq, len, slot)| Frame::Filled {
                seq,
                len,
                slot
            }),
            any::<u64>().prop_map(|seq| Frame::Drained { seq }),
            (0..=MAX_REDUCE_WORDS).prop_map(|words| Frame::Reduce { words }),
            (0..=MAX_REDUCE_WORDS).prop_map(|words| Frame::Reduced { words }),
            Just(Frame::Bye),
            any::<u64>().prop_map(|len| Frame::Part { len }),
        ]
    }

    proptest! {
        #[test]
        fn every_frame_round_trips(frame in any_frame()) {
            prop_assert_eq!(Frame::decode(&frame.encode()).unwrap(), frame);
        }

        /// Random bytes never panic, and whatever decodes re-encodes to the same bytes and
        /// announces a bounded trailer.
        #[test]
        fn random_bytes_decode_or_fail_cleanly(bytes in prop::array::uniform32(any::<u8>()), tag in 0u32..11) {
            let mut bytes = bytes;
            bytes[..4].copy_from_slice(&MAGIC.to_le_bytes());
            bytes[4..8].copy_from_slice(&tag.to_le_bytes());
            if let Ok(f) = Frame::decode(&bytes) {
                prop_assert_eq!(f.encode(), bytes);
                prop_assert!(f.trailer_bytes() <= 2 * MAX_SLOTS as usize * IPC_HANDLE_BYTES);
            }
        }

        /// The pieces tile `0..len` in order, none empty, none over a slot.
        #[test]
        fn pieces_tile_the_broadcast(len in 0u64..1 << 40, slot in 1u64..1 << 34) {
            let mut at = 0;
            let mut count = 0u64;
            for (start, n) in pieces(len, slot) {
                prop_assert_eq!(start, at);
                prop_assert!(n > 0 && n <= slot);
                at += n;
                count += 1;
                if count > 1 << 16 { break; }
            }
            if len / slot < 1 << 16 {
                prop_assert_eq!(at, len);
            }
        }
    }

    #[test]
    fn bad_frames_are_refused_with_the_reason() {
        let good = Frame::Filled {
            seq: 3,
            len: 10,
            slot: 1,
        }
        .encode();
        let mut b = good;
        b[0] ^= 1;
        assert!(matches!(Frame::decode(&b), Err(CudaError::Protocol(m)) if m.contains("magic")));
        let mut b = good;
        b[4] = 99;
        assert!(matches!(Frame::decode(&b), Err(CudaError::Protocol(m)) if m.contains("tag 99")));
        // A Drained frame with its unused words set.
        let mut b = Frame::Drained { seq: 1 }.encode();
        b[20] = 1;
        assert!(matches!(Frame::decode(&b), Err(CudaError::Protocol(m)) if m.contains("unused")));
        for f in [
            Frame::Setup {
                slots: 0,
                slot_bytes: 1,
            },
            Frame::Setup {
                slots: MAX_SLOTS + 1,
                slot_bytes: 1,
            },
            Frame::Setup {
                slots: 2,
                slot_bytes: 0,
            },
            Frame::Joined { slots: 0 },
            Frame::Joined {
                slots: u64::MAX / 2,
            },
            Frame::Reduce {
                words: MAX_REDUCE_WORDS + 1,
            },
            Frame::Reduced { words: u64::MAX },
        ] {
            assert!(
                matches!(Frame::decode(&f.encode()), Err(CudaError::Protocol(_))),
                "{f:?} decoded"
            );
        }
        // At the bounds: accepted.
        assert_eq!(
            Frame::decode(&Frame::Reduce { words: 0 }.encode()).unwrap(),
            Frame::Reduce { words: 0 }
        );
        assert_eq!(
            Frame::Setup {
                slots: MAX_SLOTS,
                slot_bytes: 1
            }
            .trailer_bytes(),
            2 * 64 * 64
        );
    }

    #[test]
    fn pieces_at_the_edges() {
        assert_eq!(pieces(0, 8).count(), 0);
        assert_eq!(pieces(8, 8).collect::<Vec<_>>(), vec![(0, 8)]);
        assert_eq!(pieces(9, 8).collect::<Vec<_>>(), vec![(0, 8), (8, 1)]);
        assert_eq!(pieces(1, u64::MAX).collect::<Vec<_>>(), vec![(0, 1)]);
        assert_eq!(
            pieces(u64::MAX, u64::MAX).collect::<Vec<_>>(),
            vec![(0, u64::MAX)]
        );
    }
}
