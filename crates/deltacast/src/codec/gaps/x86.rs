//! The x86-64 kernels of the `gaps` encoder: the lane writer, and the bitmap kernels of the
//! chooser's bounds (BMI2 select, AVX-512 word statistics). Same results as the portable
//! code in `encode.rs` and `bounds.rs`, which call them (and compile themselves for AVX2).

use super::format::{BLOCK, ESC};
use crate::codec::bits::{mask, put_words, BlockWriter, Lanes};

/// The bit indices in `words` (eight, little-endian, bit `64 j + b` for bit `b` of word `j`)
/// of the `r`-th and the `r + 1`-th listed bit (the set bits of each word xor `flip`),
/// counted from 1; the second is garbage when there are only `r`. Branch free: the words'
/// counts pick the word of each, a bit deposit the bit.
///
/// # Safety
///
/// The CPU must have BMI2 and POPCNT; `words` has eight words, and at least `r >= 1`
/// listed bits.
#[target_feature(enable = "bmi2,popcnt")]
#[inline]
pub(super) unsafe fn select_octet(words: &[[u8; 8]], flip: u64, r: u64) -> (u64, u64) {
    use std::arch::x86_64::_pdep_u64;
    debug_assert!(words.len() == 8 && r >= 1);
    let words: [u64; 8] = std::array::from_fn(|j| u64::from_le_bytes(words[j]) ^ flip);
    // For each rank: its word (the words whose listed bits all come before it), and the
    // listed bits before that word.
    let (mut seen, mut j, mut before, mut j_next, mut before_next) = (0u64, 0, 0u64, 0, 0u64);
    for &word in &words {
        let c = word.count_ones() as u64;
        let past = ((seen + c) < r) as u64;
        let past_next = ((seen + c) <= r) as u64;
        j += past as usize;
        before += c & past.wrapping_neg();
        j_next += past_next as usize;
        before_next += c & past_next.wrapping_neg();
        seen += c;
    }
    let pick = |j: usize, rank: u64| {
        let word = words[j % 8];
        let bit = _pdep_u64(1u64.wrapping_shl((rank - 1) as u32), word);
        (j % 8) as u64 * 64 + bit.trailing_zeros() as u64
    };
    (pick(j, r - before), pick(j_next, r + 1 - before_next))
}

/// Of nine whole bitmap words: the set bits of the first eight, and whether
/// `bounds::run_bound` is 15 for each of them in both polarities (no run of 16 set bits, nor with
/// `HOLES` of 16 clear bits, within a word or across into the next: runs across are tested
/// within the 64 bits from bit 48 of a word, a sufficient test).
///
/// # Safety
///
/// The CPU must have AVX-512F and AVX-512 VPOPCNTDQ; `words` has at least nine words.
#[target_feature(enable = "avx512f,avx512vpopcntdq")]
#[inline]
pub(super) unsafe fn octet_stats<const HOLES: bool>(words: &[[u8; 8]]) -> (u64, bool) {
    use std::arch::x86_64::*;
    debug_assert!(words.len() >= 9);
    // SAFETY: two 64-byte unaligned loads of words 0..8 and 1..9, all in `words`.
    let (w, n) = unsafe {
        (
            _mm512_loadu_si512(words.as_ptr().cast()),
            _mm512_loadu_si512(words[1..].as_ptr().cast()),
        )
    };
    let set = _mm512_reduce_add_epi64(_mm512_popcnt_epi64(w)) as u64;
    // Bit j survives when bits j..j+15 are all set.
    let run16 = |v: __m512i| {
        let r = _mm512_and_si512(v, _mm512_srli_epi64::<1>(v));
        let r = _mm512_and_si512(r, _mm512_srli_epi64::<2>(r));
        let r = _mm512_and_si512(r, _mm512_srli_epi64::<4>(r));
        _mm512_and_si512(r, _mm512_srli_epi64::<8>(r))
    };
    // Bits 48..63 of each word, then bits 0..47 of the next.
    let across = _mm512_or_si512(_mm512_srli_epi64::<48>(w), _mm512_slli_epi64::<16>(n));
    let ones = _mm512_set1_epi64(-1);
    // The changed positions' gaps are runs of clear bits.
    let mut runs = _mm512_or_si512(
        run16(_mm512_xor_si512(w, ones)),
        run16(_mm512_xor_si512(across, ones)),
    );
    if HOLES {
        runs = _mm512_or_si512(runs, _mm512_or_si512(run16(w), run16(across)));
    }
    (set, _mm512_test_epi64_mask(runs, runs) == 0)
}

/// Largest `k` of [`write_lanes`]: a plain code word then has at most `ESC + k = 32` bits.
pub(super) const LANES_K: u32 = 32 - ESC;

// The lane writer's scratch holds a whole block.
const _: () = assert!(BLOCK <= crate::codec::bits::LANES_MAX);

/// `encode::write_block` for `k <= LANES_K` in the AVX2 build: every gap's code word and length in
/// one branch-free loop the compiler vectorizes, then written eight per store where they fit
/// ([`put_words`]); escapes (rare) are marked for the general path. Same bits as
/// `encode::write_block`.
///
/// # Safety
///
/// The CPU must have the features of [`crate::codec::bits::x86_wide`].
#[target_feature(enable = "avx2,bmi1,bmi2,lzcnt,popcnt")]
#[inline]
pub(super) unsafe fn write_lanes(
    out: &mut BlockWriter<'_>,
    lanes: &mut Lanes,
    gaps: &[u32],
    k: u32,
    w: u32,
) {
    debug_assert!(k <= LANES_K && gaps.len() <= BLOCK);
    let m = gaps.len().min(BLOCK);
    let Lanes { word, len } = lanes;
    let mk = mask(k) as u32;
    for ((word, len), &g) in word[..m].iter_mut().zip(&mut len[..m]).zip(&gaps[..m]) {
        let q = g >> k;
        // All ones for an escape (a length of 64 marks it for the general path).
        let escape = ((q >= ESC) as u32).wrapping_neg();
        let q = q.min(ESC - 1);
        *word = (((g & mk) << 1 | 1) << q) & !escape;
        *len = (q + 1 + k) & !escape | 64 & escape;
    }
    put_words(out, &word[..m], &len[..m], |out, i| {
        // ESC zeros, then the gap in w bits.
        out.put((gaps[i] as u64) << ESC, ESC + w)
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::Rng;

    /// `select_octet` finds the `r`-th and `r + 1`-th listed bits as a walk over the bits
    /// does, in both polarities, on random, sparse, full and empty words.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn select_octet_matches_a_walk() {
        if !(std::arch::is_x86_feature_detected!("bmi2")
            && std::arch::is_x86_feature_detected!("popcnt"))
        {
            return;
        }
        let mut rng = Rng(41);
        for round in 0..4000 {
            let words: Vec<[u8; 8]> = (0..8)
                .map(|_| {
                    let x = match round % 4 {
                        0 => rng.next_u64(),
                        1 => rng.next_u64() & rng.next_u64() & rng.next_u64(),
                        2 => [0, !0][rng.below(2) as usize],
                        _ => rng.next_u64() | rng.next_u64(),
                    };
                    x.to_le_bytes()
                })
                .collect();
            for flip in [0, !0u64] {
                let listed: Vec<u64> = (0..512u64)
                    .filter(|&b| {
                        (u64::from_le_bytes(words[b as usize / 64]) ^ flip) >> (b % 64) & 1 == 1
                    })
                    .collect();
                for r in 1..=listed.len() as u64 {
                    // SAFETY: the features were detected above; eight words, `r` listed.
                    let (at, next) = unsafe { select_octet(&words, flip, r) };
                    assert_eq!(at, listed[r as usize - 1], "round {round} r {r}");
                    if let Some(&want) = listed.get(r as usize) {
                        assert_eq!(next, want, "round {round} r {r}");
                    }
                }
            }
        }
    }
}
