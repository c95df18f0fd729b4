//! Bit-exact diff of a shard against its snapshot.
//!
//! Elements are compared as unsigned integers (never as floats: NaN ≠ NaN and +0 == −0 would
//! lie). The same pass refreshes the snapshot, writing only the changed elements.

use rayon::prelude::*;

use crate::dtype::{load_bits, store_bits};

/// Elements per parallel task.
pub const PAR_CHUNK_ELEMS: usize = 1 << 20;

/// The changes found in one buffer: sorted positions with their old and new bit patterns
/// (little-endian, `width` bytes each).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Changes {
    pub positions: Vec<u64>,
    pub old_values: Vec<u8>,
    pub new_values: Vec<u8>,
}

impl Changes {
    pub fn len(&self) -> usize {
        self.positions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.positions.is_empty()
    }

    pub fn clear(&mut self) {
        self.positions.clear();
        self.old_values.clear();
        self.new_values.clear();
    }

    fn append(&mut self, other: &Changes) {
        self.positions.extend_from_slice(&other.positions);
        self.old_values.extend_from_slice(&other.old_values);
        self.new_values.extend_from_slice(&other.new_values);
    }
}

/// Compares `current` with `snapshot` (same length, `width`-byte elements), appends every
/// changed element to `out` with its position offset by `first_index`, and copies the new
/// bits into `snapshot` for those elements only.
///
/// # Panics
/// If the buffers differ in length or are not whole elements (a caller bug, not data).
pub fn diff_and_refresh(snapshot: &mut [u8], current: &[u8], width: usize, first_index: u64, out: &mut Changes) {
    assert_eq!(snapshot.len(), current.len(), "snapshot and current differ in length");
    assert!(matches!(width, 1 | 2 | 4), "unsupported element width {width}");
    assert_eq!(current.len() % width, 0, "buffer is not whole elements");
    let chunk_bytes = PAR_CHUNK_ELEMS * width;
    if current.len() <= chunk_bytes {
        diff_serial(snapshot, current, width, first_index, out);
        return;
    }
    let parts: Vec<Changes> = snapshot
        .par_chunks_mut(chunk_bytes)
        .zip(current.par_chunks(chunk_bytes))
        .enumerate()
        .map(|(c, (snap, cur))| {
            let mut part = Changes::default();
            diff_serial(snap, cur, width, first_index + (c * PAR_CHUNK_ELEMS) as u64, &mut part);
            part
        })
        .collect();
    let total: usize = parts.iter().map(Changes::len).sum();
    out.positions.reserve(total);
    out.old_values.reserve(total * width);
    out.new_values.reserve(total * width);
    for part in &parts {
        out.append(part);
    }
}

/// Single-threaded diff of one piece.
pub fn diff_serial(snapshot: &mut [u8], current: &[u8], width: usize, first_index: u64, out: &mut Changes) {
    let n = current.len() / width;
    for i in 0..n {
        let old = load_bits(snapshot, width, i);
        let new = load_bits(current, width, i);
        if old != new {
            out.positions.push(first_index + i as u64);
            out.old_values.extend_from_slice(&old.to_le_bytes()[..width]);
            out.new_values.extend_from_slice(&new.to_le_bytes()[..width]);
            store_bits(snapshot, width, i, new);
        }
    }
}
