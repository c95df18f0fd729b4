//! x86-64 kernels. Each is a `#[target_feature]` function generic over the element width, so the
//! compiler emits one copy per (ISA, width) with the width-specific compare folded in; the
//! dispatcher [`run`] only calls a kernel after the CPU was found to support it.

use std::arch::x86_64::*;

use super::{diff_elems, Changes, DiffImpl, Tail, BLOCK, WINDOW};

/// The SIMD kernels this CPU supports, slowest first (the portable one is always there).
pub(super) fn detect() -> Vec<DiffImpl> {
    let mut found = Vec::new();
    if is_x86_feature_detected!("avx2") {
        found.push(DiffImpl::Avx2);
    }
    if is_x86_feature_detected!("avx512bw") {
        found.push(DiffImpl::Avx512);
        if is_x86_feature_detected!("avx512vbmi2") && is_x86_feature_detected!("popcnt") {
            found.push(DiffImpl::Avx512Vbmi2);
        }
    }
    found
}

/// Runs SIMD kernel `kind` on arguments already checked by the caller.
///
/// # Panics
/// If `kind` is the portable kernel or not available here; callers check both.
pub(super) fn run(
    kind: DiffImpl,
    snapshot: &mut [u8],
    current: &[u8],
    width: usize,
    first_index: u64,
    out: &mut Changes,
) {
    // Checked here again (a cached lookup per chunk) so that the SAFETY argument below rests on
    // this function alone, not on its callers.
    assert!(
        kind.is_available(),
        "diff kernel {kind} is not available on this CPU"
    );
    // SAFETY: in every arm, the kernel's target features are exactly those `detect` found on
    // this CPU for `kind`, and `is_available` just confirmed `kind` is in that list.
    unsafe {
        match (kind, width) {
            (DiffImpl::Avx2, 1) => avx2::<1>(snapshot, current, first_index, out),
            (DiffImpl::Avx2, 2) => avx2::<2>(snapshot, current, first_index, out),
            (DiffImpl::Avx2, _) => avx2::<4>(snapshot, current, first_index, out),
            (DiffImpl::Avx512, 1) => avx512::<1>(snapshot, current, first_index, out),
            (DiffImpl::Avx512, 2) => avx512::<2>(snapshot, current, first_index, out),
            (DiffImpl::Avx512, _) => avx512::<4>(snapshot, current, first_index, out),
            (DiffImpl::Avx512Vbmi2, 1) => avx512_vbmi2::<1>(snapshot, current, first_index, out),
            (DiffImpl::Avx512Vbmi2, 2) => avx512_vbmi2::<2>(snapshot, current, first_index, out),
            (DiffImpl::Avx512Vbmi2, _) => avx512_vbmi2::<4>(snapshot, current, first_index, out),
            (DiffImpl::Scalar, _) => unreachable!("the portable kernel is not dispatched here"),
        }
    }
}

/// Reads a little-endian `W`-byte element.
///
/// # Safety
/// `p` must be valid for reading `W` bytes.
#[inline(always)]
unsafe fn read<const W: usize>(p: *const u8) -> u32 {
    // SAFETY: the caller guarantees `W` readable bytes; unaligned reads need no alignment.
    unsafe {
        match W {
            1 => p.read() as u32,
            2 => (p as *const u16).read_unaligned() as u32,
            _ => (p as *const u32).read_unaligned(),
        }
    }
}

/// Writes the low `W` bytes of `v`, little-endian.
///
/// # Safety
/// `p` must be valid for writing `W` bytes.
#[inline(always)]
unsafe fn write<const W: usize>(p: *mut u8, v: u32) {
    // SAFETY: the caller guarantees `W` writable bytes; unaligned writes need no alignment.
    unsafe {
        match W {
            1 => p.write(v as u8),
            2 => (p as *mut u16).write_unaligned(v as u16),
            _ => (p as *mut u32).write_unaligned(v),
        }
    }
}

/// Visits the changed elements of the block at byte `off`, one bit of `bits` per changed
/// element (bit `j` ↔ element `j`), pushing each change. It does not touch the snapshot: the
/// caller refreshes it with one masked store afterwards.
///
/// # Safety
/// `off + BLOCK` must be within both buffers (`sp` and `cp` of the same length), `tail` must
/// have room for every element of the block, and only elements that differ may be in `bits`.
#[inline(always)]
unsafe fn visit_bits<const W: usize>(
    bits: u64,
    off: usize,
    sp: *const u8,
    cp: *const u8,
    first_index: u64,
    tail: &mut Tail<W>,
) {
    let mut bits = bits;
    while bits != 0 {
        let at = off + bits.trailing_zeros() as usize * W;
        // SAFETY: `at + W <= off + BLOCK`, within both buffers; `tail` has room for the block,
        // which has at most `BLOCK / W` set bits.
        unsafe {
            tail.push(
                first_index + (at / W) as u64,
                read::<W>(sp.add(at)),
                read::<W>(cp.add(at)),
            )
        };
        bits &= bits - 1;
    }
}

/// Changes in one window above which the next window counts as dense. A window is 64 blocks, so
/// this is about one block in ten holding a change (≈ 0.3 % of BF16 elements changed).
const DENSE_WINDOW_CHANGES: usize = 6;

/// The block loop every SIMD kernel shares: windows of reserved output, 64-byte blocks, and the
/// sub-block tail through the checked path. `block(off, sp, cp, tail, dense)` handles one block;
/// `dense` says the previous window had many changes, so that a kernel can drop its "unchanged
/// block" branch where it would mispredict often (it is constant over a window, so the branch
/// on it is free).
#[inline(always)]
fn drive<const W: usize>(
    snapshot: &mut [u8],
    current: &[u8],
    first_index: u64,
    out: &mut Changes,
    mut block: impl FnMut(usize, *mut u8, *const u8, &mut Tail<W>, bool),
) {
    let len = current.len();
    debug_assert_eq!(snapshot.len(), len);
    let blocks_end = len - len % BLOCK;
    let sp = snapshot.as_mut_ptr();
    let cp = current.as_ptr();
    let mut off = 0;
    let mut dense = false;
    while off < blocks_end {
        let window_end = (off + WINDOW).min(blocks_end);
        let mut tail = out.reserve_tail::<W>((window_end - off) / W);
        while off < window_end {
            block(off, sp, cp, &mut tail, dense);
            off += BLOCK;
        }
        dense = tail.len >= DENSE_WINDOW_CHANGES;
        // SAFETY: the tail came from `out.reserve_tail` above, `out` was not touched since, and
        // the block handlers advance `tail.len` only over entries they wrote.
        unsafe { out.commit(tail) };
    }
    diff_elems::<W>(snapshot, current, blocks_end, first_index, out);
}

/// AVX2: two 32-byte compares per block; `movemask` gives one bit per byte, thinned to one bit
/// per element (its lowest byte), so bit `j·W` ↔ element `j`.
///
/// # Safety
/// The CPU must support AVX2.
#[target_feature(enable = "avx2")]
unsafe fn avx2<const W: usize>(
    snapshot: &mut [u8],
    current: &[u8],
    first_index: u64,
    out: &mut Changes,
) {
    let keep: u64 = match W {
        1 => !0,
        2 => 0x5555_5555_5555_5555,
        _ => 0x1111_1111_1111_1111,
    };
    drive::<W>(
        snapshot,
        current,
        first_index,
        out,
        |off, sp, cp, tail, _dense| {
            // SAFETY: `drive` passes only offsets with `off + BLOCK <= len` (both buffers);
            // unaligned loads need no alignment.
            let (a0, a1, b0, b1) = unsafe {
                (
                    _mm256_loadu_si256(sp.add(off) as *const __m256i),
                    _mm256_loadu_si256(sp.add(off + 32) as *const __m256i),
                    _mm256_loadu_si256(cp.add(off) as *const __m256i),
                    _mm256_loadu_si256(cp.add(off + 32) as *const __m256i),
                )
            };
            let (e0, e1) = match W {
                1 => (_mm256_cmpeq_epi8(a0, b0), _mm256_cmpeq_epi8(a1, b1)),
                2 => (_mm256_cmpeq_epi16(a0, b0), _mm256_cmpeq_epi16(a1, b1)),
                _ => (_mm256_cmpeq_epi32(a0, b0), _mm256_cmpeq_epi32(a1, b1)),
            };
            let eq = (_mm256_movemask_epi8(e0) as u32 as u64)
                | ((_mm256_movemask_epi8(e1) as u32 as u64) << 32);
            // One bit per changed element, at its first byte: bit `j·W` ↔ element `j`.
            let mut ne = !eq & keep;
            while ne != 0 {
                let at = off + ne.trailing_zeros() as usize;
                // SAFETY: `at` is the first byte of an element inside this block, so
                // `at + W <= off + BLOCK <= len`; the window reserved room for every element
                // of the block.
                unsafe {
                    let new = read::<W>(cp.add(at));
                    tail.push(first_index + (at / W) as u64, read::<W>(sp.add(at)), new);
                    // Refresh only the changed element: the only snapshot store is here.
                    write::<W>(sp.add(at), new);
                }
                ne &= ne - 1;
            }
        },
    );
}

/// One bit per element that differs between `a` and `b`.
#[target_feature(enable = "avx512bw")]
#[inline]
fn ne_mask<const W: usize>(a: __m512i, b: __m512i) -> u64 {
    match W {
        1 => _mm512_cmpneq_epi8_mask(a, b),
        2 => _mm512_cmpneq_epi16_mask(a, b) as u64,
        _ => _mm512_cmpneq_epi32_mask(a, b) as u64,
    }
}

/// Stores the elements of `v` selected by `m` at `p`; memory under unselected elements is not
/// written (AVX-512 masked stores suppress those lanes entirely, faults included).
///
/// # Safety
/// `p` must be valid for writing 64 bytes.
#[target_feature(enable = "avx512bw")]
#[inline]
unsafe fn masked_store<const W: usize>(p: *mut u8, m: u64, v: __m512i) {
    // SAFETY: the caller guarantees 64 writable bytes at `p`; no alignment is needed.
    unsafe {
        match W {
            1 => _mm512_mask_storeu_epi8(p as *mut i8, m, v),
            2 => _mm512_mask_storeu_epi16(p as *mut i16, m as u32, v),
            _ => _mm512_mask_storeu_epi32(p as *mut i32, m as u16, v),
        }
    }
}

/// AVX-512BW: one mask compare per block, a per-change loop for the outputs, one masked store
/// refreshing exactly the changed elements.
///
/// # Safety
/// The CPU must support AVX-512BW.
#[target_feature(enable = "avx512bw")]
unsafe fn avx512<const W: usize>(
    snapshot: &mut [u8],
    current: &[u8],
    first_index: u64,
    out: &mut Changes,
) {
    drive::<W>(
        snapshot,
        current,
        first_index,
        out,
        |off, sp, cp, tail, _dense| {
            // SAFETY: `drive` passes only offsets with `off + BLOCK <= len` (both buffers);
            // unaligned loads need no alignment.
            let (a, b) = unsafe {
                (
                    _mm512_loadu_si512(sp.add(off) as *const _),
                    _mm512_loadu_si512(cp.add(off) as *const _),
                )
            };
            let m = ne_mask::<W>(a, b);
            if m != 0 {
                // SAFETY: the block is in bounds, the window reserved room for all its elements,
                // `m` holds only differing elements; the outputs read the old bits before the
                // store.
                unsafe {
                    visit_bits::<W>(m, off, sp, cp, first_index, tail);
                    // Refresh only the changed elements: the mask selects exactly those.
                    masked_store::<W>(sp.add(off), m, b);
                }
            }
        },
    );
}

/// Lane indices 0, 1, 2, … as `W`-byte integers, compressed to give the changed lanes' indices.
#[target_feature(enable = "avx512bw")]
#[inline]
fn lane_iota<const W: usize>() -> __m512i {
    static IOTA8: [u8; 64] = {
        let mut a = [0u8; 64];
        let mut i = 0;
        while i < 64 {
            a[i] = i as u8;
            i += 1;
        }
        a
    };
    static IOTA16: [u16; 32] = {
        let mut a = [0u16; 32];
        let mut i = 0;
        while i < 32 {
            a[i] = i as u16;
            i += 1;
        }
        a
    };
    static IOTA32: [u32; 16] = {
        let mut a = [0u32; 16];
        let mut i = 0;
        while i < 16 {
            a[i] = i as u32;
            i += 1;
        }
        a
    };
    // SAFETY: each static is exactly 64 bytes; loadu needs no alignment.
    unsafe {
        match W {
            1 => _mm512_loadu_si512(IOTA8.as_ptr() as *const _),
            2 => _mm512_loadu_si512(IOTA16.as_ptr() as *const _),
            _ => _mm512_loadu_si512(IOTA32.as_ptr() as *const _),
        }
    }
}

/// Packs the lanes of `v` selected by `m` to the bottom (zeroing the rest).
#[target_feature(enable = "avx512bw,avx512vbmi2")]
#[inline]
fn compress<const W: usize>(m: u64, v: __m512i) -> __m512i {
    match W {
        1 => _mm512_maskz_compress_epi8(m, v),
        2 => _mm512_maskz_compress_epi16(m as u32, v),
        _ => _mm512_maskz_compress_epi32(m as u16, v),
    }
}

/// Zero-extends the first eight `W`-byte integers of `v` to 64 bits.
#[target_feature(enable = "avx512bw")]
#[inline]
fn widen8<const W: usize>(v: __m128i) -> __m512i {
    match W {
        1 => _mm512_cvtepu8_epi64(v),
        2 => _mm512_cvtepu16_epi64(v),
        // Only the low 128 bits are given; four-byte lanes take the 256-bit path in the caller.
        _ => unreachable!("widen8 is for 1- and 2-byte lanes"),
    }
}

/// AVX-512BW + VBMI2: as [`avx512`], but a changed block's outputs are written branch-free:
/// old and new values with one compress + full-register store each, positions by compressing
/// the lane indices and widening eight at a time. The stores run past the real count into the
/// reserved slack and the cursor then advances by the count, so no per-change loop remains.
///
/// # Safety
/// The CPU must support AVX-512BW, AVX-512VBMI2 and POPCNT.
#[target_feature(enable = "avx512bw,avx512vbmi2,popcnt")]
unsafe fn avx512_vbmi2<const W: usize>(
    snapshot: &mut [u8],
    current: &[u8],
    first_index: u64,
    out: &mut Changes,
) {
    let iota = lane_iota::<W>();
    drive::<W>(
        snapshot,
        current,
        first_index,
        out,
        |off, sp, cp, tail, dense| {
            // SAFETY: `drive` passes only offsets with `off + BLOCK <= len` (both buffers);
            // unaligned loads need no alignment.
            let (a, b) = unsafe {
                (
                    _mm512_loadu_si512(sp.add(off) as *const _),
                    _mm512_loadu_si512(cp.add(off) as *const _),
                )
            };
            let m = ne_mask::<W>(a, b);
            // Sparse: skip unchanged blocks (a well-predicted branch). Dense: run the
            // branch-free path on every block; with m = 0 it stores nothing (masked store) or
            // only into the slack, and advances by zero.
            if m == 0 && !dense {
                return;
            }
            let k = m.count_ones() as usize;
            let base = _mm512_set1_epi64((first_index + (off / W) as u64) as i64);
            let idx = compress::<W>(m, iota);
            // SAFETY: the window reserved `max` changes plus SLACK_POSITIONS (8) positions and
            // SLACK_VALUE_BYTES (64) value bytes, and `tail.len + k <= max` since each element
            // is pushed at most once. So the 64 value bytes stored at `tail.len * W` fit, and a
            // group of 8 positions at `tail.len + 8g`, stored only when `k > 8g`, ends at
            // `tail.len + 8g + 8 <= max - k + 8g + 8 < max + 8`. The block is in bounds for the
            // masked store. The spill reads 16 bytes at `8gW` with `8g < k <= 64 / W`: at most
            // up to byte 72 of its 80. Unaligned loads and stores need no alignment.
            unsafe {
                let pos = tail.pos.add(tail.len);
                _mm512_storeu_si512(tail.old.add(tail.len * W) as *mut _, compress::<W>(m, a));
                _mm512_storeu_si512(tail.new.add(tail.len * W) as *mut _, compress::<W>(m, b));
                if W == 4 {
                    // 16 lanes at most: two groups, from the two 256-bit halves.
                    let lo = _mm512_cvtepu32_epi64(_mm512_castsi512_si256(idx));
                    _mm512_storeu_si512(pos as *mut _, _mm512_add_epi64(lo, base));
                    if k > 8 {
                        let hi = _mm512_cvtepu32_epi64(_mm512_extracti64x4_epi64::<1>(idx));
                        _mm512_storeu_si512(pos.add(8) as *mut _, _mm512_add_epi64(hi, base));
                    }
                } else {
                    let lo = widen8::<W>(_mm512_castsi512_si128(idx));
                    _mm512_storeu_si512(pos as *mut _, _mm512_add_epi64(lo, base));
                    if k > 8 {
                        // Rare at realistic densities: spill the indices and widen the rest.
                        let mut spill = [0u8; 64 + 16];
                        _mm512_storeu_si512(spill.as_mut_ptr() as *mut _, idx);
                        let mut g = 1;
                        while 8 * g < k {
                            let v =
                                _mm_loadu_si128(spill.as_ptr().add(8 * g * W) as *const __m128i);
                            _mm512_storeu_si512(
                                pos.add(8 * g) as *mut _,
                                _mm512_add_epi64(widen8::<W>(v), base),
                            );
                            g += 1;
                        }
                    }
                }
                tail.len += k;
                // Refresh only the changed elements: the mask selects exactly those.
                masked_store::<W>(sp.add(off), m, b);
            }
        },
    );
}
