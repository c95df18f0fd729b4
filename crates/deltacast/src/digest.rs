//! The per-slot state digest: `D = Σ_i h(slot, i, bits_i) mod 2^64`.
//!
//! It is additive, so it shards (the digest of a slot is the sum of its pieces' digests) and
//! updates in O(changed) (`D += h(i, new) − h(i, old)`). The sender ships its digests with each
//! sync; a receiver updates its own from the old bits it actually holds and compares.

use rayon::prelude::*;

/// Elements per rayon task when hashing a whole buffer.
const PAR_CHUNK: usize = 1 << 18;

/// A strong 64-bit finalizer (the splitmix64 / Stafford variant 13 mixer): a bijection whose
/// every input bit affects every output bit.
#[inline(always)]
fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The salt that separates slots from each other.
#[inline]
pub fn slot_salt(slot_id: u32) -> u64 {
    mix64(0x6465_6c74_6163_6173 ^ (slot_id as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15))
}

/// h(slot, i, bits): the contribution of element `index` holding `bits`. For a fixed slot and
/// index the map from `bits` to the hash is a bijection (odd multiply, xor, then `mix64`), so a
/// changed element always changes its term.
#[inline(always)]
pub fn element_hash(salt: u64, index: u64, bits: u32) -> u64 {
    let key = (salt ^ index).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        ^ (bits as u64 + 1).wrapping_mul(0xd6e8_feb8_6659_fd93);
    mix64(key)
}

/// Sum of the terms of `count` elements of width `W` starting at slot index `first`.
#[inline(always)]
fn sum_terms<const W: usize>(salt: u64, bytes: &[u8], first: u64) -> u64 {
    let mut sum = 0u64;
    for (k, e) in bytes.chunks_exact(W).enumerate() {
        let mut b = [0u8; 4];
        b[..W].copy_from_slice(e);
        sum = sum.wrapping_add(element_hash(salt, first + k as u64, u32::from_le_bytes(b)));
    }
    sum
}

/// Digest of `bytes` (elements of `width` bytes) holding elements `first_index..` of a slot.
/// Parallel over chunks; the sum is order-independent so the result does not depend on threads.
pub fn digest_range(slot_id: u32, width: usize, bytes: &[u8], first_index: u64) -> u64 {
    let salt = slot_salt(slot_id);
    let chunk_bytes = PAR_CHUNK * width;
    bytes
        .par_chunks(chunk_bytes)
        .enumerate()
        .map(|(c, chunk)| {
            let base = first_index + (c * PAR_CHUNK) as u64;
            match width {
                1 => sum_terms::<1>(salt, chunk, base),
                2 => sum_terms::<2>(salt, chunk, base),
                _ => sum_terms::<4>(salt, chunk, base),
            }
        })
        .reduce(|| 0u64, u64::wrapping_add)
}

/// Digest of a whole slot.
pub fn digest_slot(slot_id: u32, width: usize, bytes: &[u8]) -> u64 {
    digest_range(slot_id, width, bytes, 0)
}

/// The change of a digest when element `index` goes from `old` to `new`.
#[inline(always)]
pub fn change(salt: u64, index: u64, old: u32, new: u32) -> u64 {
    element_hash(salt, index, new).wrapping_sub(element_hash(salt, index, old))
}

/// A `W`-byte little-endian element.
#[inline(always)]
fn le<const W: usize>(bytes: &[u8; W]) -> u32 {
    let mut b = [0u8; 4];
    b[..W].copy_from_slice(bytes);
    u32::from_le_bytes(b)
}

/// Σ change over a chunk, and whether some element's old and new bits are equal. No early
/// exit and no branch in the loop, so the compiler vectorizes it where 64-bit lane multiplies
/// exist.
#[inline(always)]
fn change_sum<const W: usize, P: Copy + Into<u64>>(
    salt: u64,
    start: u64,
    positions: Option<&[P]>,
    old: &[u8],
    new: &[u8],
) -> (u64, bool) {
    let (old, new) = (old.as_chunks::<W>().0, new.as_chunks::<W>().0);
    let mut sum = 0u64;
    let mut same = false;
    match positions {
        Some(rel) => {
            for ((&p, a), b) in rel.iter().zip(old).zip(new) {
                let (a, b) = (le(a), le(b));
                same |= a == b;
                sum = sum.wrapping_add(change(salt, start + p.into(), a, b));
            }
        }
        None => {
            for (k, (a, b)) in old.iter().zip(new).enumerate() {
                let (a, b) = (le(a), le(b));
                same |= a == b;
                sum = sum.wrapping_add(change(salt, start + k as u64, a, b));
            }
        }
    }
    (sum, same)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx512dq,avx512vl")]
fn change_sum_avx512<const W: usize, P: Copy + Into<u64>>(
    salt: u64,
    start: u64,
    positions: Option<&[P]>,
    old: &[u8],
    new: &[u8],
) -> (u64, bool) {
    change_sum::<W, P>(salt, start, positions, old, new)
}

#[inline(always)]
fn change_sum_dispatch<const W: usize, P: Copy + Into<u64>>(
    salt: u64,
    start: u64,
    positions: Option<&[P]>,
    old: &[u8],
    new: &[u8],
) -> (u64, bool) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512dq")
        && std::arch::is_x86_feature_detected!("avx512vl")
    {
        // SAFETY: the function's only requirement is its target features, detected just above
        // on this CPU (avx512dq and avx512vl imply avx512f).
        return unsafe { change_sum_avx512::<W, P>(salt, start, positions, old, new) };
    }
    change_sum::<W, P>(salt, start, positions, old, new)
}

/// How the digest of slot `slot_id` moves when the elements of a chunk go from `old` to `new`
/// (`width` bytes each, the same count): element `k` is slot index `start + positions[k]`, or
/// `start + k` when `positions` is `None`. Equals the sum of [`change`] over the elements.
/// Also returns the first `k` whose new bits equal its old bits, if any (a receiver refuses
/// such a delta element).
pub fn chunk_change(
    slot_id: u32,
    width: usize,
    start: u64,
    positions: Option<&[u32]>,
    old: &[u8],
    new: &[u8],
) -> (u64, Option<usize>) {
    let salt = slot_salt(slot_id);
    let n =
        (old.len().min(new.len()) / width.max(1)).min(positions.map_or(usize::MAX, <[u32]>::len));
    let (old, new) = (&old[..n * width], &new[..n * width]);
    let (sum, same) = match width {
        1 => change_sum_dispatch::<1, u32>(salt, start, positions, old, new),
        2 => change_sum_dispatch::<2, u32>(salt, start, positions, old, new),
        _ => change_sum_dispatch::<4, u32>(salt, start, positions, old, new),
    };
    let first_same = same.then(|| {
        old.chunks_exact(width)
            .zip(new.chunks_exact(width))
            .position(|(a, b)| a == b)
            .unwrap_or(0)
    });
    (sum, first_same)
}

/// Σ [`change`] over elements at slot indices `positions` going from `old` to `new` (`width`
/// bytes each, one per position): what a sender adds to its digest for a slot's changes.
pub fn changes_at(slot_id: u32, width: usize, positions: &[u64], old: &[u8], new: &[u8]) -> u64 {
    let salt = slot_salt(slot_id);
    let n = (old.len().min(new.len()) / width.max(1)).min(positions.len());
    let (old, new, positions) = (&old[..n * width], &new[..n * width], Some(&positions[..n]));
    match width {
        1 => change_sum_dispatch::<1, u64>(salt, 0, positions, old, new).0,
        2 => change_sum_dispatch::<2, u64>(salt, 0, positions, old, new).0,
        _ => change_sum_dispatch::<4, u64>(salt, 0, positions, old, new).0,
    }
}

/// The digest terms of a chunk's elements holding `bits` (`width` bytes each), at slot indices
/// `start + positions[k]`, or `start + k` when `positions` is `None`.
pub fn chunk_terms(
    slot_id: u32,
    width: usize,
    start: u64,
    positions: Option<&[u32]>,
    bits: &[u8],
) -> u64 {
    let Some(rel) = positions else {
        return digest_range(slot_id, width, bits, start);
    };
    let salt = slot_salt(slot_id);
    rel.iter()
        .zip(bits.chunks_exact(width.max(1)))
        .fold(0u64, |sum, (&p, e)| {
            let mut b = [0u8; 4];
            b[..e.len()].copy_from_slice(e);
            sum.wrapping_add(element_hash(salt, start + p as u64, u32::from_le_bytes(b)))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::{load_bits, store_bits};

    #[test]
    fn digest_shards_and_updates_incrementally() {
        let width = 2;
        let mut buf: Vec<u8> = (0..2000u32)
            .flat_map(|i| ((i * 7919) as u16).to_le_bytes())
            .collect();
        let full = digest_slot(3, width, &buf);
        let (a, b) = buf.split_at(600 * width);
        assert_eq!(
            full,
            digest_range(3, width, a, 0).wrapping_add(digest_range(3, width, b, 600))
        );

        let salt = slot_salt(3);
        let mut running = full;
        for &i in &[0usize, 17, 599, 600, 1999] {
            let old = load_bits(&buf, width, i);
            let new = old ^ 0x8001;
            running = running.wrapping_add(change(salt, i as u64, old, new));
            store_bits(&mut buf, width, i, new);
        }
        assert_eq!(running, digest_slot(3, width, &buf));
        assert_ne!(running, full);
    }

    #[test]
    fn digest_separates_slots_positions_and_signed_zero() {
        let zero = 0.0f32.to_bits().to_le_bytes();
        let neg = (-0.0f32).to_bits().to_le_bytes();
        assert_ne!(digest_slot(0, 4, &zero), digest_slot(0, 4, &neg));
        assert_ne!(digest_slot(0, 4, &zero), digest_slot(1, 4, &zero));
        // Swapping two elements changes the digest.
        let ab = [1u8, 2];
        let ba = [2u8, 1];
        assert_ne!(digest_slot(0, 1, &ab), digest_slot(0, 1, &ba));
        assert_eq!(digest_slot(0, 2, &[]), 0);
    }

    /// Bit patterns that matter: ±0, subnormals, infinities, NaN payloads, plus noise.
    fn patterns(width: usize, n: usize, seed: u64) -> Vec<u8> {
        let special: [u32; 8] = [
            0,
            0x8000_0000,
            1,
            0x8000_0001,
            0x7f80_0000,
            0xff80_0000,
            0x7fc0_0001,
            0xffff_ffff,
        ];
        let mut state = seed;
        let mut out = Vec::with_capacity(n * width);
        for i in 0..n {
            state = mix64(state.wrapping_add(0x9e37_79b9_7f4a_7c15));
            let bits = if i % 3 == 0 {
                special[(state % 8) as usize] >> (32 - 8 * width as u32)
            } else {
                state as u32
            };
            out.extend_from_slice(&bits.to_le_bytes()[..width]);
        }
        out
    }

    #[test]
    fn fused_chunk_change_equals_the_oracle() {
        for width in [1usize, 2, 4] {
            for n in [0usize, 1, 7, 64, 1000, 4099] {
                let old = patterns(width, n, 1 + n as u64);
                let mut new = patterns(width, n, 1000 + n as u64);
                // No element equal, except where a test puts one.
                for k in 0..n {
                    let b = load_bits(&new, width, k);
                    if load_bits(&old, width, k) == b {
                        store_bits(&mut new, width, k, b ^ 1);
                    }
                }
                let rel: Vec<u32> = (0..n as u32).map(|k| k * 3 + (k % 2)).collect();
                let start = 12_345u64;
                let salt = slot_salt(5);
                let oracle = |positions: Option<&[u32]>| {
                    (0..n).fold(0u64, |sum, k| {
                        let index = start + positions.map_or(k as u64, |r| r[k] as u64);
                        sum.wrapping_add(change(
                            salt,
                            index,
                            load_bits(&old, width, k),
                            load_bits(&new, width, k),
                        ))
                    })
                };
                for positions in [Some(rel.as_slice()), None] {
                    assert_eq!(
                        chunk_change(5, width, start, positions, &old, &new),
                        (oracle(positions), None),
                        "width {width}, n {n}"
                    );
                }
                let abs: Vec<u64> = rel.iter().map(|&p| start + p as u64).collect();
                assert_eq!(changes_at(5, width, &abs, &old, &new), oracle(Some(&rel)));
                // Seed terms against element_hash.
                let terms = (0..n).fold(0u64, |sum, k| {
                    sum.wrapping_add(element_hash(
                        salt,
                        start + rel[k] as u64,
                        load_bits(&new, width, k),
                    ))
                });
                assert_eq!(chunk_terms(5, width, start, Some(&rel), &new), terms);
                assert_eq!(
                    chunk_terms(5, width, start, None, &new),
                    digest_range(5, width, &new, start)
                );
                // An unchanged element is found, the first one reported.
                if n > 5 {
                    let mut same = new.clone();
                    store_bits(&mut same, width, n - 2, load_bits(&old, width, n - 2));
                    store_bits(&mut same, width, 4, load_bits(&old, width, 4));
                    assert_eq!(
                        chunk_change(5, width, start, Some(&rel), &old, &same).1,
                        Some(4)
                    );
                }
            }
        }
    }
}
