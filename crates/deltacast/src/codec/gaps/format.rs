//! The `gaps` section's format: blocks of [`BLOCK`] positions behind a directory of 7-byte
//! entries (first position, bit count, Rice parameter `k`), and the Rice code word of a gap
//! with its escape. docs/codecs.md specifies them byte by byte.

use crate::codec::bits::{bit_len, mask};

/// Positions per block: the directory costs 56 bits per block (under 0.1 bit per position)
/// and a block is still small enough to be one unit of parallel work.
pub(crate) const BLOCK: usize = 1024;
/// Unary quotients this long are an escape: `ESC` zero bits, then the gap in `w` bits.
pub(super) const ESC: u32 = 16;
/// Largest Rice parameter (gaps are below 2^32).
pub(super) const MAX_K: u32 = 31;
pub(super) const DIR_ENTRY: usize = 7;
/// Longest code word: max(ESC - 1 + 1 + MAX_K, ESC + 32).
const MAX_CODE: u32 = 48;

// A block's bit count must fit the u16 directory field whatever its gaps.
const _: () = assert!((BLOCK as u64 - 1) * MAX_CODE as u64 <= u16::MAX as u64);

/// Bits of an escaped gap: enough for the largest gap a range can hold.
pub(super) fn escape_width(range: u32) -> u32 {
    bit_len(range.saturating_sub(1) as u64).max(1)
}

/// A lower bound on the encoded size of `count` positions (directory plus one bit per gap),
/// so the chooser can skip encoding when another codec is already at least as small.
pub(crate) fn min_len(count: usize) -> u64 {
    let blocks = count.div_ceil(BLOCK);
    (blocks * DIR_ENTRY) as u64 + ((count - blocks) as u64).div_ceil(8)
}

/// The Rice code word of `g` (`g >> k < ESC`) and its length: `q` zeros, a one, then the
/// `k` low bits.
#[inline(always)]
pub(super) fn rice_word(g: u32, k: u32) -> (u64, u32) {
    let q = g >> k;
    ((1 | ((g as u64 & mask(k)) << 1)) << q, q + 1 + k)
}

/// `(first position, bit count, k)` of one directory entry.
#[inline]
pub(super) fn read_entry(entry: &[u8]) -> (u32, u32, u32) {
    let first = u32::from_le_bytes([entry[0], entry[1], entry[2], entry[3]]);
    let bits = u16::from_le_bytes([entry[4], entry[5]]) as u32;
    (first, bits, entry[6] as u32)
}
