// Fused bit-exact compare + count + in-order compaction + snapshot refresh, batched over many
// tensors in one launch (plus a tiny finishing launch), with no host synchronisation per tensor.
//
// Every tensor is cut into tiles of DIFF_TILE_BYTES; tiles are numbered globally in tensor order
// (`tile_begin`). Each block takes the next tile from an atomic counter (so a block only ever
// waits for tiles that a running block already holds: no deadlock), compares its 16 KiB of
// snapshot and current as unsigned integers, and counts the changed elements. The tile's place
// in the output comes from a single-pass chained scan ("decoupled look-back"): the block
// publishes its count, sums its predecessors' published counts (a warp reads 32 at a time) until
// it meets one that already knows its inclusive prefix, then publishes its own inclusive prefix.
// So the inputs are read exactly once — no separate counting pass — and the outputs (positions,
// new and old bits) come out compacted in element order, tensor after tensor.
//
// Output layout: change g (global, in order) has its position (slot index = first_index + element)
// at pos_out[g] and its bits at new_out + g * width (old_out likewise, when given). The host
// orders tensors by non-decreasing width, so these byte ranges never overlap across tensors.
//
// Capacity: a tile whose changes would not fit `capacity` writes nothing and leaves its part of
// the snapshot untouched; the written changes are then a prefix of the full result and running the
// diff again yields the rest (resumable).
//
// Digest: when `digest_out` is set, Σ h(new) − h(old) over the tile's changes is added to it, the
// O(changed) digest update of docs/wire-format.md.

// Tuning knobs (the host passes -D to NVRTC; the defaults are what was fastest on an H200):
// DIFF_ITEMS 16-byte vectors per thread and per array (tile = 256 * 16 * DIFF_ITEMS bytes),
// DIFF_MINBLOCKS the occupancy asked of the register allocator, DIFF_RELOAD 1 to keep only the
// change masks across the chained scan and re-read the changed vectors (from L2) when writing.
#ifndef DIFF_ITEMS
#define DIFF_ITEMS 4
#endif
#ifndef DIFF_MINBLOCKS
#define DIFF_MINBLOCKS 4
#endif
#ifndef DIFF_RELOAD
#define DIFF_RELOAD 1
#endif
// DIFF_WIDE_LOOKBACK 1: each lane of the look-back reads 8 predecessors (256 per round trip).
// Compile-checked but NOT yet run on a GPU: keep it off until the GPU tests pass with it.
#ifndef DIFF_WIDE_LOOKBACK
#define DIFF_WIDE_LOOKBACK 0
#endif
#define DIFF_THREADS 256
#define DIFF_TILE_BYTES (DIFF_THREADS * DIFF_ITEMS * 16)
#define DIFF_PACKS ((DIFF_ITEMS + 3) / 4)

#define ST_AGG (1ULL << 62)
#define ST_INCL (2ULL << 62)
#define ST_VALUE ((1ULL << 62) - 1)

struct DiffTensor {
    u64 snap;         // device pointer, refreshed in place
    u64 cur;          // device pointer
    u64 nbytes;       // bytes of the tensor (whole elements)
    u64 first_index;  // slot index of element 0
    u64 tile_begin;   // first global tile
    u64 digest_out;   // 0, or device pointer to a u64 that receives Σ h(new) − h(old)
    u64 salt;         // digest salt of the slot
    u32 width;        // 1, 2 or 4
    u32 aligned16;    // both pointers 16-byte aligned: vector loads
};

__device__ __forceinline__ uint4 dc_load16(const u8* base, u64 off, u64 nbytes, bool vec) {
#if DIFF_RELOAD
    if (vec && off + 16 <= nbytes) return __ldcg((const uint4*)(base + off));
#else
    if (vec && off + 16 <= nbytes) return __ldcs((const uint4*)(base + off));
#endif
    u32 w[4] = {0, 0, 0, 0};
    for (u32 b = 0; b < 16; ++b)
        if (off + b < nbytes) w[b >> 2] |= (u32)base[off + b] << (8 * (b & 3));
    return make_uint4(w[0], w[1], w[2], w[3]);
}

extern "C" __global__ void __launch_bounds__(DIFF_THREADS, DIFF_MINBLOCKS)
dc_diff(const DiffTensor* __restrict__ tensors, u32 num_tensors, u32* tile_counter,
        u64* tile_status, u64 capacity, u64* __restrict__ pos_out, u8* __restrict__ new_out,
        u8* __restrict__ old_out) {
    __shared__ u32 s_tile, s_tensor;
    __shared__ u64 s_warp_tot[DIFF_PACKS][DIFF_THREADS / 32];
    __shared__ u64 s_excl;
    __shared__ u64 s_sum[DIFF_THREADS / 32];

    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) {
        const u32 t = atomicAdd(tile_counter, 1u);
        // Largest j with tile_begin <= t: the tensor holding tile t (empty tensors share their
        // tile_begin with the next one and are skipped by taking the largest).
        u32 lo = 0, hi = num_tensors;  // invariant: tensors[lo].tile_begin <= t
        while (hi - lo > 1) {
            const u32 mid = (lo + hi) >> 1;
            if (tensors[mid].tile_begin <= t) lo = mid; else hi = mid;
        }
        s_tile = t;
        s_tensor = lo;
    }
    __syncthreads();
    const u32 tile = s_tile;
    const DiffTensor T = tensors[s_tensor];
    const u32 w = T.width;
    const u8* snap = (const u8*)T.snap;
    const u8* cur = (const u8*)T.cur;
    const u64 byte0 = (u64)(tile - T.tile_begin) * DIFF_TILE_BYTES;
    const bool vec = T.aligned16 != 0;

#if !DIFF_RELOAD
    uint4 cv[DIFF_ITEMS], sv[DIFF_ITEMS];
#endif
    u32 mask[DIFF_ITEMS];
    u64 packed[DIFF_PACKS];  // 4 counts of 16 bits per word (at most 16 per vector)
    {
#if DIFF_RELOAD
        uint4 cv[DIFF_ITEMS], sv[DIFF_ITEMS];
#endif
#pragma unroll
        for (u32 i = 0; i < DIFF_ITEMS; ++i) {
            const u64 off = byte0 + ((u64)i * DIFF_THREADS + threadIdx.x) * 16;
            cv[i] = dc_load16(cur, off, T.nbytes, vec);
            sv[i] = dc_load16(snap, off, T.nbytes, vec);
        }
#pragma unroll
        for (u32 p = 0; p < DIFF_PACKS; ++p) packed[p] = 0;
#pragma unroll
        for (u32 i = 0; i < DIFF_ITEMS; ++i) {
            mask[i] = dc_change_mask(cv[i], sv[i], w);
            packed[i / 4] |= (u64)__popc(mask[i]) << (16 * (i % 4));
        }
    }
    // Warp inclusive scan of the packed counts (each field stays below 2^16: at most 32*16).
    u64 incl[DIFF_PACKS];
#pragma unroll
    for (u32 p = 0; p < DIFF_PACKS; ++p) {
        incl[p] = packed[p];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u64 n = __shfl_up_sync(DC_FULL_MASK, incl[p], o);
            if (lane >= (u32)o) incl[p] += n;
        }
        if (lane == 31) s_warp_tot[p][warp] = incl[p];
    }
    __syncthreads();
    u64 warp_excl[DIFF_PACKS], rows[DIFF_PACKS];  // this warp's prefix per row; per-row totals
    u64 tile_total = 0;
#pragma unroll
    for (u32 p = 0; p < DIFF_PACKS; ++p) {
        warp_excl[p] = 0;
        rows[p] = 0;
#pragma unroll
        for (u32 k = 0; k < DIFF_THREADS / 32; ++k) {
            const u64 t = s_warp_tot[p][k];
            if (k < warp) warp_excl[p] += t;
            rows[p] += t;
        }
#pragma unroll
        for (u32 f = 0; f < 4; ++f) tile_total += (rows[p] >> (16 * f)) & 0xffffu;
    }

    // Chained scan across tiles.
    if (warp == 0) {
        u64 excl = 0;
        if (tile == 0) {
            if (lane == 0) *(volatile u64*)&tile_status[0] = ST_INCL | tile_total;
        } else {
            if (lane == 0) *(volatile u64*)&tile_status[tile] = ST_AGG | tile_total;
#if DIFF_WIDE_LOOKBACK
            // Each lane reads 8 consecutive predecessors (nearest first), so one round trip to
            // L2 covers 256 tiles: the look-back rarely takes more than one or two rounds.
            i64 pred = (i64)tile - 1;
            while (true) {
                u64 v[8];
#pragma unroll
                for (u32 j = 0; j < 8; ++j) {
                    const i64 idx = pred - (i64)(lane * 8 + j);
                    v[j] = idx >= 0 ? *(volatile u64*)&tile_status[idx] : ST_INCL;
                }
                u32 first_incl = 8;
                bool invalid = false;
                u64 sum = 0;
#pragma unroll
                for (u32 j = 0; j < 8; ++j) {
                    const u32 flag = (u32)(v[j] >> 62);
                    if (first_incl == 8) {
                        invalid |= flag == 0;
                        sum += v[j] & ST_VALUE;
                        if (flag == 2) first_incl = j;
                    }
                }
                const u32 incl_lanes = __ballot_sync(DC_FULL_MASK, first_incl < 8);
                const u32 bad_lanes = __ballot_sync(DC_FULL_MASK, invalid);
                const u32 stop = incl_lanes ? (u32)(__ffs(incl_lanes) - 1) : 31u;
                const u32 needed = stop == 31 ? DC_FULL_MASK : ((2u << stop) - 1u);
                if (bad_lanes & needed) {
                    __nanosleep(32);
                    continue;
                }
                excl += dc_warp_sum(lane <= stop ? sum : 0ULL);
                if (incl_lanes) break;
                pred -= 256;
            }
#else
            // A lane per predecessor: one round trip to L2 covers 32 tiles.
            i64 pred = (i64)tile - 1;
            while (true) {
                const i64 idx = pred - (i64)lane;
                const u64 s = idx >= 0 ? *(volatile u64*)&tile_status[idx] : ST_INCL;
                const u32 flag = (u32)(s >> 62);
                const u32 incl_lanes = __ballot_sync(DC_FULL_MASK, flag == 2);
                const u32 invalid = __ballot_sync(DC_FULL_MASK, flag == 0);
                const u32 stop = incl_lanes ? (u32)(__ffs(incl_lanes) - 1) : 31u;
                const u32 needed = stop == 31 ? DC_FULL_MASK : ((2u << stop) - 1u);
                if (invalid & needed) {
                    __nanosleep(64);
                    continue;
                }
                excl += dc_warp_sum(lane <= stop ? (s & ST_VALUE) : 0ULL);
                if (incl_lanes) break;
                pred -= 32;
            }
#endif
            if (lane == 0) *(volatile u64*)&tile_status[tile] = ST_INCL | (excl + tile_total);
        }
        if (lane == 0) s_excl = excl;
    }
    __syncthreads();
    const u64 g0 = s_excl;
    const bool fits = g0 + tile_total <= capacity;

    u64 dsum = 0;
    if (fits && tile_total != 0) {
        u8* snap_w = (u8*)T.snap;
        u64 row_base = 0;
#pragma unroll
        for (u32 i = 0; i < DIFF_ITEMS; ++i) {
            const u32 p = i / 4, f = 16 * (i % 4);
            u32 m = mask[i];
            u64 g = g0 + row_base + ((warp_excl[p] >> f) & 0xffffu) + (((incl[p] - packed[p]) >> f) & 0xffffu);
            row_base += (rows[p] >> f) & 0xffffu;
            if (m == 0) continue;
            const u64 off = byte0 + ((u64)i * DIFF_THREADS + threadIdx.x) * 16;
#if DIFF_RELOAD
            const uint4 cvi = dc_load16(cur, off, T.nbytes, vec);
            const uint4 svi = dc_load16(snap, off, T.nbytes, vec);
#else
            const uint4 cvi = cv[i], svi = sv[i];
#endif
            const u64 elem0 = off / w;
            while (m) {
                const u32 e = __ffs(m) - 1;
                m &= m - 1;
                const u32 nb = dc_extract(cvi, e, w), ob = dc_extract(svi, e, w);
                const u64 index = T.first_index + elem0 + e;
                pos_out[g] = index;
                dc_store_bits(new_out, g, w, nb);
                if (old_out) dc_store_bits(old_out, g, w, ob);
                dc_store_bits(snap_w, elem0 + e, w, nb);  // refresh only the changed element
                if (T.digest_out) dsum += dc_element_hash(T.salt, index, nb) - dc_element_hash(T.salt, index, ob);
                ++g;
            }
        }
    }
    if (T.digest_out) {
        const u64 total = dc_block_sum(dsum, s_sum);
        if (threadIdx.x == 0 && fits && tile_total != 0) atomicAdd((u64*)T.digest_out, total);
    }
}

// Per tensor: [offset of its first change, changes written, changes found]; then
// [total found, total written]. `result` holds 3 * num_tensors + 2 u64.
extern "C" __global__ void dc_diff_finish(const DiffTensor* __restrict__ tensors, u32 num_tensors,
                                          const u64* __restrict__ tile_status, u64 num_tiles,
                                          u64 capacity, u64* __restrict__ result) {
    // Inclusive prefix through tile t-1 (0 for t == 0).
    #define DC_PREFIX(t) ((t) == 0 ? 0ULL : (tile_status[(t) - 1] & ST_VALUE))
    const u64 total = DC_PREFIX(num_tiles);
    // Written: the largest tile prefix that fits (tiles are written or not as a whole, in order).
    u64 lo = 0, hi = num_tiles;  // find the largest t with prefix(t) <= capacity
    while (lo < hi) {
        const u64 mid = (lo + hi + 1) >> 1;
        if (DC_PREFIX(mid) <= capacity) lo = mid; else hi = mid - 1;
    }
    const u64 written = DC_PREFIX(lo);
    for (u32 j = blockIdx.x * blockDim.x + threadIdx.x; j < num_tensors; j += gridDim.x * blockDim.x) {
        const u64 b = tensors[j].tile_begin;
        const u64 e = j + 1 < num_tensors ? tensors[j + 1].tile_begin : num_tiles;
        const u64 first = DC_PREFIX(b), end = DC_PREFIX(e);
        result[3 * j] = first;
        result[3 * j + 1] = (end < written ? end : written) > first ? (end < written ? end : written) - first : 0;
        result[3 * j + 2] = end - first;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        result[3 * num_tensors] = total;
        result[3 * num_tensors + 1] = written;
    }
    #undef DC_PREFIX
}
