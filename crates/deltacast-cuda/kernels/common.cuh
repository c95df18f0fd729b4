// deltacast GPU kernels: shared prelude, prepended (as text) to every kernel file before NVRTC
// compiles it. Header-free on purpose: NVRTC needs no include path and no CUDA toolkit.
//
// The host-side twins of every struct below are `#[repr(C)]` in src/kernels.rs; keep the two in
// step (field order, sizes, 8-byte alignment).

typedef unsigned long long u64;
typedef long long i64;
typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned char u8;

#define DC_FULL_MASK 0xffffffffu

// The digest mixer of docs/wire-format.md ("State digest"), mod 2^64.
__device__ __forceinline__ u64 dc_mix64(u64 z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}

// h(s, i, b) with salt(s) precomputed on the host.
__device__ __forceinline__ u64 dc_element_hash(u64 salt, u64 index, u32 bits) {
    u64 key = ((salt ^ index) * 0x9e3779b97f4a7c15ULL) ^ (((u64)bits + 1ULL) * 0xd6e8feb86659fd93ULL);
    return dc_mix64(key);
}

// Sum over the warp, every lane gets the total.
__device__ __forceinline__ u64 dc_warp_sum(u64 v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(DC_FULL_MASK, v, o);
    return v;
}

// Block-wide sum of a u64 (wrapping), result valid in thread 0. `scratch` holds one u64 per warp.
__device__ __forceinline__ u64 dc_block_sum(u64 v, u64* scratch) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = dc_warp_sum(v);
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    u64 total = 0;
    if (threadIdx.x == 0)
        for (u32 w = 0; w < warps; ++w) total += scratch[w];
    return total;
}

// Element `e` (width 1, 2 or 4 bytes) of a little-endian buffer, zero-extended to 32 bits.
// The pointer must be aligned to the width (the host checks it).
__device__ __forceinline__ u32 dc_load_bits(const u8* p, u64 e, u32 w) {
    if (w == 1) return p[e];
    if (w == 2) return *(const u16*)(p + 2 * e);
    return *(const u32*)(p + 4 * e);
}

// fp32 bits to bf16 bits exactly as deltacast::Bf16Rule::convert (crates/deltacast/src/
// convert.rs): round to nearest even on the bit pattern (add 0x7fff plus the lowest kept bit,
// keep the high half; no float arithmetic, so no flush of subnormals and no FPU mode), values
// past the largest bf16 become ±Inf, and every NaN becomes `nan`.
__device__ __forceinline__ u32 dc_bf16_of_f32(u32 bits, u32 nan) {
    // The add wraps only for NaNs, whose rounding is discarded.
    const u32 rounded = (bits + ((bits >> 16) & 1u) + 0x7fffu) >> 16;
    return (bits & 0x7fffffffu) > 0x7f800000u ? nan : rounded;
}

// A source's conversion word, as the tables carry it: 0 when the source holds the elements as
// they are; DC_FROM_F32 | nan when it holds fp32 that the kernel rounds to bf16 as it reads
// (dc_bf16_of_f32 with that `nan`), the element width then being bf16's 2.
#define DC_FROM_F32 0x10000u

// Element `e` of a source: dc_load_bits, or (conversion word set) fp32 element `e` rounded to
// bf16. The one load of every kernel that reads a sender's tensors element by element.
__device__ __forceinline__ u32 dc_load_source(const u8* p, u64 e, u32 w, u32 convert) {
    if (convert) return dc_bf16_of_f32(*(const u32*)(p + 4 * e), convert & 0xffffu);
    return dc_load_bits(p, e, w);
}

__device__ __forceinline__ void dc_store_bits(u8* p, u64 e, u32 w, u32 bits) {
    if (w == 1) p[e] = (u8)bits;
    else if (w == 2) *(u16*)(p + 2 * e) = (u16)bits;
    else *(u32*)(p + 4 * e) = bits;
}

// Exclusive block-wide scan of a u32 or u64 (blockDim.x a multiple of 32, at most 1024).
// Returns the exclusive prefix; `*total` gets the block total. `scratch` holds 32 values.
template <class T>
__device__ __forceinline__ T dc_block_exclusive_scan(T v, T* scratch, T* total) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = blockDim.x >> 5;
    T incl = v;
    for (int o = 1; o < 32; o <<= 1) {
        const T n = __shfl_up_sync(DC_FULL_MASK, incl, o);
        if (lane >= (u32)o) incl += n;
    }
    __syncthreads();  // scratch may still be read by a previous call
    if (lane == 31) scratch[warp] = incl;
    __syncthreads();
    T before = 0, all = 0;
    for (u32 w = 0; w < warps; ++w) {
        const T t = scratch[w];
        if (w < warp) before += t;
        all += t;
    }
    *total = all;
    return before + incl - v;
}

// Word `wi` (32 bits) of a map of `bits` (1 or 2) bits per element over `range` elements,
// `nbytes` bytes long (4-byte aligned; its last word may be partial): the bits at or past the
// range cleared, and *stray set when any of them was set. The bitmap and steps walks read
// their maps through it.
__device__ __forceinline__ u32 dc_map_word(const u8* map, u64 nbytes, u64 range, u64 wi, u32 bits,
                                           bool* stray) {
    u32 word = 0;
    if (wi * 4 + 4 <= nbytes) {
        word = *(const u32*)(map + wi * 4);
    } else {
        for (u64 q = wi * 4; q < nbytes; ++q) word |= (u32)map[q] << (8 * (q - wi * 4));
    }
    const u32 per = 32 / bits;
    const u64 elem0 = wi * per;
    *stray = false;
    if (elem0 + per > range) {
        const u32 keep = (1u << (bits * (u32)(range - elem0))) - 1u;  // 1..per-1 elements valid
        *stray = (word & ~keep) != 0;
        word &= keep;
    }
    return word;
}

// A bitmap section (ceil(range / 8) bytes, bit i of byte i / 8 for element i) walked by a
// block, one round of blockDim.x u32 words at a time: every thread reads one word (0 past the
// section) and the block scans the words' set-bit counts, then calls
// round(wi, word, before, total, base): the word's index and bits (past `range` dropped), the
// set bits of the round before it, the round's total, and the set bits of earlier rounds.
// Every thread of the block must call it (the scans synchronise the block, the first before
// anything is written, so a round may reuse shared memory the last one read). Returns the set
// bits in all; *stray is set in a thread that found a bit past `range`.
template <class Round>
__device__ __forceinline__ u64 dc_bitmap_rounds(const u8* b, u64 range, u32* scan_scratch,
                                                bool* stray, Round round) {
    const u64 nbytes = (range + 7) >> 3;
    const u64 nwords = (nbytes + 3) >> 2;
    u64 base = 0;
    for (u64 w0 = 0; w0 < nwords; w0 += blockDim.x) {
        const u64 wi = w0 + threadIdx.x;
        u32 word = 0;
        if (wi < nwords) {
            bool past;
            word = dc_map_word(b, nbytes, range, wi, 1, &past);
            *stray |= past;
        }
        u32 total;
        const u32 before = dc_block_exclusive_scan((u32)__popc(word), scan_scratch, &total);
        round(wi, word, before, total, base);
        base += total;
    }
    return base;
}

// 16-byte vectors of elements (the diff kernels).
// Bit e set when element e of the 16 bytes differs.
__device__ __forceinline__ u32 dc_change_mask(uint4 a, uint4 b, u32 w) {
    const u32 x[4] = {a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w};
    u32 m = 0;
    if (w == 4) {
        for (u32 k = 0; k < 4; ++k) m |= (x[k] != 0) << k;
    } else if (w == 2) {
        // Bit 15 / 31 of h[k]: the low / high half of word k differs ((v & 0x7fff) + 0x7fff
        // sets a half's top bit when its low 15 bits are not all zero, with no carry out of
        // the half; `| x` adds its own top bit). Then the top bits, gathered: element 2k is
        // the low half of word k, element 2k + 1 the high half.
        u32 h[4];
        for (u32 k = 0; k < 4; ++k) h[k] = (((x[k] & 0x7fff7fffu) + 0x7fff7fffu) | x[k]) & 0x80008000u;
        const u32 u = (h[0] >> 15) | (h[1] >> 13) | (h[2] >> 11) | (h[3] >> 9);
        m = (u & 0x55u) | ((u >> 15) & 0xaau);
    } else {
        for (u32 k = 0; k < 4; ++k)
            for (u32 b = 0; b < 4; ++b) m |= (((x[k] >> (8 * b)) & 0xffu) != 0) << (4 * k + b);
    }
    return m;
}

// Eight fp32 elements (`lo` then `hi`, 32 bytes) rounded to the eight bf16 of one 16-byte
// vector, in order (dc_bf16_of_f32 each): how the diff reads an fp32 source for a bf16 slot.
__device__ __forceinline__ uint4 dc_bf16x8_of_f32(uint4 lo, uint4 hi, u32 nan) {
    const u32 f[8] = {lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w};
    u32 h[4];
    for (u32 k = 0; k < 4; ++k)
        h[k] = dc_bf16_of_f32(f[2 * k], nan) | dc_bf16_of_f32(f[2 * k + 1], nan) << 16;
    return make_uint4(h[0], h[1], h[2], h[3]);
}

__device__ __forceinline__ u32 dc_word(uint4 v, u32 k) {
    return k == 0 ? v.x : k == 1 ? v.y : k == 2 ? v.z : v.w;
}

// Bits of element e (width w) inside a 16-byte vector.
__device__ __forceinline__ u32 dc_extract(uint4 v, u32 e, u32 w) {
    const u32 byte = e * w;
    const u32 word = dc_word(v, byte >> 2);
    if (w == 4) return word;
    const u32 sh = 8 * (byte & 3);
    return w == 2 ? (word >> sh) & 0xffffu : (word >> sh) & 0xffu;
}

// The steps code (docs/codecs.md, "steps + esc"): the ordered-integer view of nb-bit patterns
// (deltacast::dtype::to_ordered: sign bit 0 sets it, sign bit 1 inverts every bit), so that one
// step up or down is +1 or −1 there, modulo 2^nb.
__device__ __forceinline__ u32 dc_ordered(u32 x, u32 w) {
    const u32 all = w == 4 ? 0xffffffffu : (1u << (8 * w)) - 1u;
    const u32 sign = 1u << (8 * w - 1);
    return (x & sign) ? (~x & all) : (x | sign);
}

__device__ __forceinline__ u32 dc_unordered(u32 o, u32 w) {
    const u32 all = w == 4 ? 0xffffffffu : (1u << (8 * w)) - 1u;
    const u32 sign = 1u << (8 * w - 1);
    return (o & sign) ? (o ^ sign) : (~o & all);
}

// The 2-bit code of old bits a → new bits b: 0 unchanged, 1 one step up, 2 one step down,
// 3 any other change (its new bits travel raw, as an escape).
__device__ __forceinline__ u32 dc_step_code(u32 a, u32 b, u32 w) {
    if (a == b) return 0;
    const u32 all = w == 4 ? 0xffffffffu : (1u << (8 * w)) - 1u;
    const u32 d = (dc_ordered(b, w) - dc_ordered(a, w)) & all;
    return d == 1u ? 1u : d == all ? 2u : 3u;
}

// The new bits of a code-1 or code-2 change from old bits a.
__device__ __forceinline__ u32 dc_step_apply(u32 a, u32 code, u32 w) {
    const u32 all = w == 4 ? 0xffffffffu : (1u << (8 * w)) - 1u;
    const u32 o = (dc_ordered(a, w) + (code == 1u ? 1u : all)) & all;
    return dc_unordered(o, w);
}
