// The two-pass diff (Gpu::diff_batch_refreshing): no block ever waits for another, so every
// pass streams at memory speed, unlike the single-pass chained scan of diff.cu whose blocks
// stall in the look-back.
//
//   1. dc_mask: one block per tile of MASK_TILE_BYTES (tiles numbered globally in tensor order,
//      as in diff.cu). Reads snapshot and current once, writes a 16-bit change mask per 16-byte
//      vector, the tile's change count, refreshes the snapshot (a changed vector is written
//      back whole: its unchanged elements equal the snapshot's already) and adds the tile's
//      digest change Σ h(new) − h(old) to the tensor's digest word.
//   2. dc_mask_scan_tiles / dc_mask_scan_groups: exclusive prefix of the tile counts (groups of
//      MASK_GROUP tiles, then the group totals; the grand total goes after the last group).
//   3. dc_mask_emit: one block per tile with changes; reads the masks and the changed vectors
//      of current (only those) and writes positions and new bits, compacted in element order.
//      A tile whose changes would pass `capacity` writes nothing (the output is then a prefix
//      of whole tiles), but pass 1 has refreshed the whole snapshot and digest regardless.
//   4. dc_mask_finish: per-tensor offsets and counts, as dc_diff_finish.
//
// Output layout: as diff.cu (change g: position at pos_out[g], bits at new_out + g * width).

// Tuning (the host passes -D to NVRTC, see DiffTuning): 16-byte vectors per thread and array,
// and the blocks per multiprocessor asked of the register allocator.
#ifndef MASK_ITEMS
#define MASK_ITEMS 4
#endif
#ifndef MASK_MINBLOCKS
#define MASK_MINBLOCKS 4
#endif
#define MASK_THREADS 256
#define MASK_TILE_BYTES (MASK_THREADS * MASK_ITEMS * 16)
#define MASK_VECS_PER_TILE (MASK_THREADS * MASK_ITEMS)
#define MASK_GROUP 2048  // tiles per group of the first scan level (MASK_THREADS * 8)
// The tile-to-tensor table and the scans do not depend on the tuning.

struct DiffTensor {
    u64 snap;
    u64 cur;
    u64 nbytes;
    u64 first_index;
    u64 tile_begin;
    u64 digest_out;
    u64 salt;
    u32 width;
    u32 aligned16;
};

__device__ __forceinline__ uint4 dc_mask_load(const u8* base, u64 off, u64 nbytes, bool vec) {
    if (vec && off + 16 <= nbytes) return __ldcs((const uint4*)(base + off));
    u32 w[4] = {0, 0, 0, 0};
    for (u32 b = 0; b < 16; ++b)
        if (off + b < nbytes) w[b >> 2] |= (u32)base[off + b] << (8 * (b & 3));
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// The tensor holding global tile t: the largest j with tile_begin <= t.
__device__ __forceinline__ u32 dc_mask_tensor_of(const DiffTensor* tensors, u32 n, u64 t) {
    u32 lo = 0, hi = n;
    while (hi - lo > 1) {
        const u32 mid = (lo + hi) >> 1;
        if (tensors[mid].tile_begin <= t) lo = mid; else hi = mid;
    }
    return lo;
}

// tile_tensor[t] = the tensor holding tile t, so that the passes below start loading at once
// (one broadcast load instead of a chain of dependent ones per block).
extern "C" __global__ void dc_mask_tile_tensor(const DiffTensor* __restrict__ tensors,
                                               u32 num_tensors, u64 num_tiles,
                                               u32* __restrict__ tile_tensor) {
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < num_tiles;
         t += (u64)gridDim.x * blockDim.x)
        tile_tensor[t] = dc_mask_tensor_of(tensors, num_tensors, t);
}

extern "C" __global__ void __launch_bounds__(MASK_THREADS, MASK_MINBLOCKS)
dc_mask(const DiffTensor* __restrict__ tensors, const u32* __restrict__ tile_tensor, u64 num_tiles,
        u16* __restrict__ masks, u32* __restrict__ tile_counts) {
    __shared__ u32 s_scan[32];
    __shared__ u64 s_sum[MASK_THREADS / 32];
    for (u64 tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
        const DiffTensor T = tensors[tile_tensor[tile]];
        const u32 w = T.width;
        const bool vec = T.aligned16 != 0;
        const u64 byte0 = (tile - T.tile_begin) * MASK_TILE_BYTES;
        uint4 cv[MASK_ITEMS], sv[MASK_ITEMS];
#pragma unroll
        for (u32 i = 0; i < MASK_ITEMS; ++i) {
            const u64 off = byte0 + ((u64)i * MASK_THREADS + threadIdx.x) * 16;
            cv[i] = dc_mask_load((const u8*)T.cur, off, T.nbytes, vec);
            sv[i] = dc_mask_load((const u8*)T.snap, off, T.nbytes, vec);
        }
        u32 count = 0;
        u64 dsum = 0;
#pragma unroll
        for (u32 i = 0; i < MASK_ITEMS; ++i) {
            const u64 off = byte0 + ((u64)i * MASK_THREADS + threadIdx.x) * 16;
            u32 m = dc_change_mask(cv[i], sv[i], w);
            masks[tile * MASK_VECS_PER_TILE + i * MASK_THREADS + threadIdx.x] = (u16)m;
            count += __popc(m);
            if (m == 0) continue;
            u8* snap_w = (u8*)T.snap;
            const u64 elem0 = off / w;
            if (vec && off + 16 <= T.nbytes) {
                *(uint4*)(snap_w + off) = cv[i];
            }
            while (m) {
                const u32 e = __ffs(m) - 1;
                m &= m - 1;
                const u32 nb = dc_extract(cv[i], e, w), ob = dc_extract(sv[i], e, w);
                if (!(vec && off + 16 <= T.nbytes)) dc_store_bits(snap_w, elem0 + e, w, nb);
                if (T.digest_out) {
                    const u64 index = T.first_index + elem0 + e;
                    dsum += dc_element_hash(T.salt, index, nb) - dc_element_hash(T.salt, index, ob);
                }
            }
        }
        u32 total;
        dc_block_exclusive_scan(count, s_scan, &total);
        if (threadIdx.x == 0) tile_counts[tile] = total;
        if (T.digest_out && total != 0) {
            const u64 d = dc_block_sum(dsum, s_sum);
            if (threadIdx.x == 0) atomicAdd((u64*)T.digest_out, d);
        }
    }
}

// Exclusive prefix of the tile counts within each group of MASK_GROUP tiles (one block per
// group, 8 tiles per thread); group_sums[g] gets the group's total.
extern "C" __global__ void __launch_bounds__(MASK_THREADS)
dc_mask_scan_tiles(const u32* __restrict__ tile_counts, u64 num_tiles, u32* __restrict__ tile_offsets,
                   u64* __restrict__ group_sums) {
    __shared__ u32 s_scan[32];
    const u64 g = blockIdx.x;
    const u64 first = g * MASK_GROUP + (u64)threadIdx.x * 8;
    u32 c[8];
    u32 mine = 0;
#pragma unroll
    for (u32 k = 0; k < 8; ++k) {
        c[k] = first + k < num_tiles ? tile_counts[first + k] : 0;
        mine += c[k];
    }
    u32 total;
    u32 before = dc_block_exclusive_scan(mine, s_scan, &total);
#pragma unroll
    for (u32 k = 0; k < 8; ++k) {
        if (first + k < num_tiles) tile_offsets[first + k] = before;
        before += c[k];
    }
    if (threadIdx.x == 0) group_sums[g] = total;
}

// Exclusive prefix of the group totals, in place, by one block; the grand total is written at
// group_sums[num_groups].
extern "C" __global__ void __launch_bounds__(1024)
dc_mask_scan_groups(u64* group_sums, u64 num_groups) {
    __shared__ u64 s_warp[32];
    __shared__ u64 s_carry;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (threadIdx.x == 0) s_carry = 0;
    __syncthreads();
    for (u64 base = 0; base < num_groups; base += 1024) {
        const u64 i = base + threadIdx.x;
        const u64 v = i < num_groups ? group_sums[i] : 0;
        u64 incl = v;
        for (int o = 1; o < 32; o <<= 1) {
            const u64 n = __shfl_up_sync(DC_FULL_MASK, incl, o);
            if (lane >= (u32)o) incl += n;
        }
        if (lane == 31) s_warp[warp] = incl;
        __syncthreads();
        u64 before = 0, all = 0;
        for (u32 k = 0; k < 32; ++k) {
            const u64 t = s_warp[k];
            if (k < warp) before += t;
            all += t;
        }
        const u64 carry = s_carry;
        if (i < num_groups) group_sums[i] = carry + before + incl - v;
        __syncthreads();
        if (threadIdx.x == 0) s_carry = carry + all;
        __syncthreads();
    }
    if (threadIdx.x == 0) group_sums[num_groups] = s_carry;
}

__device__ __forceinline__ u64 dc_mask_prefix(const u32* tile_offsets, const u64* group_sums,
                                              u64 num_tiles, u64 t) {
    if (t >= num_tiles) return group_sums[(num_tiles + MASK_GROUP - 1) / MASK_GROUP];
    return group_sums[t / MASK_GROUP] + tile_offsets[t];
}

extern "C" __global__ void __launch_bounds__(MASK_THREADS)
dc_mask_emit(const DiffTensor* __restrict__ tensors, const u32* __restrict__ tile_tensor, u64 num_tiles,
             const u16* __restrict__ masks, const u32* __restrict__ tile_counts,
             const u32* __restrict__ tile_offsets, const u64* __restrict__ group_sums, u64 capacity,
             u64* __restrict__ pos_out, u8* __restrict__ new_out) {
    __shared__ u32 s_rows[MASK_ITEMS][MASK_THREADS / 32];
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (u64 tile = blockIdx.x; tile < num_tiles; tile += gridDim.x) {
        const u32 cnt = tile_counts[tile];
        if (cnt == 0) continue;  // uniform across the block
        const u64 g0 = dc_mask_prefix(tile_offsets, group_sums, num_tiles, tile);
        if (g0 + cnt > capacity) continue;
        u32 m[MASK_ITEMS], incl[MASK_ITEMS];
#pragma unroll
        for (u32 i = 0; i < MASK_ITEMS; ++i) {
            m[i] = masks[tile * MASK_VECS_PER_TILE + i * MASK_THREADS + threadIdx.x];
            incl[i] = __popc(m[i]);
            for (int o = 1; o < 32; o <<= 1) {
                const u32 n = __shfl_up_sync(DC_FULL_MASK, incl[i], o);
                if (lane >= (u32)o) incl[i] += n;
            }
            if (lane == 31) s_rows[i][warp] = incl[i];
        }
        __syncthreads();
        const DiffTensor T = tensors[tile_tensor[tile]];
        const u32 w = T.width;
        const bool vec = T.aligned16 != 0;
        const u64 byte0 = (tile - T.tile_begin) * MASK_TILE_BYTES;
        u64 row_base = 0;
#pragma unroll
        for (u32 i = 0; i < MASK_ITEMS; ++i) {
            u32 before = 0, row_total = 0;
            for (u32 k = 0; k < MASK_THREADS / 32; ++k) {
                const u32 t = s_rows[i][k];
                if (k < warp) before += t;
                row_total += t;
            }
            u32 mm = m[i];
            u64 g = g0 + row_base + before + incl[i] - __popc(mm);
            row_base += row_total;
            if (mm == 0) continue;
            const u64 off = byte0 + ((u64)i * MASK_THREADS + threadIdx.x) * 16;
            const uint4 cvi = dc_mask_load((const u8*)T.cur, off, T.nbytes, vec);
            const u64 elem0 = off / w;
            while (mm) {
                const u32 e = __ffs(mm) - 1;
                mm &= mm - 1;
                pos_out[g] = T.first_index + elem0 + e;
                dc_store_bits(new_out, g, w, dc_extract(cvi, e, w));
                ++g;
            }
        }
        __syncthreads();  // s_rows is rewritten for the next tile
    }
}

// Per tensor: [offset of its first change, changes written, changes found]; then
// [total found, total written]. As dc_diff_finish, over the two-level prefix.
extern "C" __global__ void dc_mask_finish(const DiffTensor* __restrict__ tensors, u32 num_tensors,
                                          const u32* __restrict__ tile_offsets,
                                          const u64* __restrict__ group_sums, u64 num_tiles,
                                          u64 capacity, u64* __restrict__ result) {
    const u64 total = dc_mask_prefix(tile_offsets, group_sums, num_tiles, num_tiles);
    // Written: the changes of the longest run of whole tiles, from the first, that fits.
    u64 lo = 0, hi = num_tiles;  // the largest t with prefix(t) <= capacity
    while (lo < hi) {
        const u64 mid = (lo + hi + 1) >> 1;
        if (dc_mask_prefix(tile_offsets, group_sums, num_tiles, mid) <= capacity) lo = mid; else hi = mid - 1;
    }
    const u64 written = dc_mask_prefix(tile_offsets, group_sums, num_tiles, lo);
    for (u32 j = blockIdx.x * blockDim.x + threadIdx.x; j < num_tensors; j += gridDim.x * blockDim.x) {
        const u64 b = tensors[j].tile_begin;
        const u64 e = j + 1 < num_tensors ? tensors[j + 1].tile_begin : num_tiles;
        const u64 first = dc_mask_prefix(tile_offsets, group_sums, num_tiles, b);
        const u64 end = dc_mask_prefix(tile_offsets, group_sums, num_tiles, e);
        const u64 upto = end < written ? end : written;
        result[3 * j] = first;
        result[3 * j + 1] = upto > first ? upto - first : 0;
        result[3 * j + 2] = end - first;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        result[3 * num_tensors] = total;
        result[3 * num_tensors + 1] = written;
    }
}
