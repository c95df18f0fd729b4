// The batched diff (Gpu::diff_batch): two passes in which no block ever waits for another, so
// each streams at memory speed.
//
//   1. dc_mask: one block per tile of MASK_TILE_BYTES (tiles numbered globally in tensor order,
//      each tensor starting a new tile). Reads snapshot and current once, writes a 16-bit change
//      mask per 16-byte vector, the tile's change count and the offset of each of its rows
//      (256 vectors) inside the tile, and adds the tile's digest change
//      Σ h(new) − h(old) to the tensor's digest word. Writes nothing else: the snapshot keeps
//      its old bits for pass 3.
//   2. dc_mask_scan_tiles / dc_mask_scan_groups: exclusive prefix of the tile counts (groups of
//      MASK_GROUP tiles, then the group totals; the grand total goes after the last group).
//   3. dc_mask_emit: a warp per row; reads the masks and only the changed vectors of current (and of the
//      snapshot when old bits are asked for), writes positions, new bits and old bits
//      compacted in element order, and refreshes the snapshot's changed vectors. A tile whose
//      changes would pass `capacity` writes nothing, and its part of the snapshot keeps its old
//      bits: the output is then a prefix of whole tiles, and only those tiles are refreshed
//      (the digest words, updated by pass 1, describe `current` in full).
//   4. dc_mask_finish: per-tensor offsets and counts.
//
// Output layout: change g (global, in order) has its position (slot index = first_index +
// element) at pos_out[g] and its bits at new_out + g * width (old_out likewise, when given).
// The host orders tensors by non-decreasing width, so these byte ranges never overlap across
// tensors.

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
#define MASK_PACKS ((MASK_ITEMS + 3) / 4)  // u64 words of four 16-bit row counts
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
        u16* __restrict__ masks, u32* __restrict__ tile_counts, u16* __restrict__ row_offsets) {
    // One tile per block (the grid is num_tiles): the loads start right after one lookup.
    __shared__ u64 s_rows[MASK_PACKS][MASK_THREADS / 32];
    __shared__ u64 s_sum[MASK_THREADS / 32];
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u64 tile = blockIdx.x;
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
    // Row i of the tile is vectors [256 i, 256 i + 256): its count goes in 16-bit field i % 4
    // of packed[i / 4] (a row holds at most 256 * 16 changes).
    u64 packed[MASK_PACKS];
#pragma unroll
    for (u32 p = 0; p < MASK_PACKS; ++p) packed[p] = 0;
    u64 dsum = 0;
#pragma unroll
    for (u32 i = 0; i < MASK_ITEMS; ++i) {
        u32 m = dc_change_mask(cv[i], sv[i], w);
        masks[tile * MASK_VECS_PER_TILE + i * MASK_THREADS + threadIdx.x] = (u16)m;
        packed[i / 4] += (u64)__popc(m) << (16 * (i % 4));
        if (m == 0 || !T.digest_out) continue;
        const u64 elem0 = (byte0 + ((u64)i * MASK_THREADS + threadIdx.x) * 16) / w;
        while (m) {
            const u32 e = __ffs(m) - 1;
            m &= m - 1;
            const u64 index = T.first_index + elem0 + e;
            dsum += dc_element_hash(T.salt, index, dc_extract(cv[i], e, w)) -
                    dc_element_hash(T.salt, index, dc_extract(sv[i], e, w));
        }
    }
#pragma unroll
    for (u32 p = 0; p < MASK_PACKS; ++p) {
        packed[p] = dc_warp_sum(packed[p]);
        if (lane == 0) s_rows[p][warp] = packed[p];
    }
    __syncthreads();
    u32 total = 0;
    if (threadIdx.x == 0) {
        // Exclusive offsets of the rows inside the tile, then the tile's count.
#pragma unroll
        for (u32 i = 0; i < MASK_ITEMS; ++i) {
            u32 row = 0;
#pragma unroll
            for (u32 k = 0; k < MASK_THREADS / 32; ++k)
                row += (u32)(s_rows[i / 4][k] >> (16 * (i % 4))) & 0xffffu;
            row_offsets[tile * MASK_ITEMS + i] = (u16)total;
            total += row;
        }
        tile_counts[tile] = total;
    }
    if (T.digest_out) {
        const u64 d = dc_block_sum(dsum, s_sum);
        if (threadIdx.x == 0 && d != 0) atomicAdd((u64*)T.digest_out, d);
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

// The 16-bit change mask of vector j (0..8) in a lane's 16 bytes of masks.
__device__ __forceinline__ u32 dc_lane_mask(uint4 mk, u32 j) {
    const u32 word = j < 2 ? mk.x : j < 4 ? mk.y : j < 6 ? mk.z : mk.w;
    return (word >> (16 * (j & 1))) & 0xffffu;
}

// One warp per row (256 vectors) of a tile, independent of every other warp: no barrier, so a
// multiprocessor keeps dozens of rows in flight. Lane l takes the row's vectors [8 l, 8 l + 8)
// (one 16-byte load of masks); its place in the output is the tile's offset, plus the row's
// offset inside the tile (from pass 1), plus the changes of the lanes before it.
extern "C" __global__ void __launch_bounds__(MASK_THREADS)
dc_mask_emit(const DiffTensor* __restrict__ tensors, const u32* __restrict__ tile_tensor, u64 num_tiles,
             const u16* __restrict__ masks, const u32* __restrict__ tile_counts,
             const u16* __restrict__ row_offsets, const u32* __restrict__ tile_offsets,
             const u64* __restrict__ group_sums, u64 capacity, u64* __restrict__ pos_out,
             u8* __restrict__ new_out, u8* __restrict__ old_out) {
    const u32 lane = threadIdx.x & 31;
    const u64 row = ((u64)blockIdx.x * MASK_THREADS + threadIdx.x) >> 5;
    if (row >= num_tiles * MASK_ITEMS) return;  // whole warps
    const u64 tile = row / MASK_ITEMS;
    // Everything that depends on the row alone, issued together.
    const uint4 mk = *(const uint4*)(masks + row * MASK_THREADS + 8 * lane);
    const u32 tt = tile_tensor[tile];
    const u64 first = dc_mask_prefix(tile_offsets, group_sums, num_tiles, tile);
    const u32 count = tile_counts[tile];
    const u32 row_first = row_offsets[row];
    const u32 mine = __popc(mk.x) + __popc(mk.y) + __popc(mk.z) + __popc(mk.w);
    u32 incl = mine;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u32 n = __shfl_up_sync(DC_FULL_MASK, incl, o);
        if (lane >= (u32)o) incl += n;
    }
    if (mine == 0 || first + count > capacity) return;  // no shuffle follows
    const DiffTensor& T = tensors[tt];
    const u32 w = T.width;
    const bool vec = T.aligned16 != 0;
    u8* snap_w = (u8*)T.snap;
    const u64 byte0 = (tile - T.tile_begin) * MASK_TILE_BYTES +
                      ((row % MASK_ITEMS) * MASK_THREADS + 8 * lane) * 16;
    u64 at = first + row_first + incl - mine;
    // Bit j: vector j of this lane changed.
    u32 changed = 0;
#pragma unroll
    for (u32 j = 0; j < 8; ++j) changed |= (u32)(dc_lane_mask(mk, j) != 0) << j;
    // This lane's changed vectors, four at a time: their loads go out together.
    while (changed) {
        u32 pick[4];
        bool has[4];
#pragma unroll
        for (u32 q = 0; q < 4; ++q) {
            has[q] = changed != 0;
            pick[q] = has[q] ? __ffs(changed) - 1 : 0;
            changed &= changed - 1;
        }
        uint4 cv[4], sv[4];
#pragma unroll
        for (u32 q = 0; q < 4; ++q) {
            if (has[q]) {
                const u64 off = byte0 + (u64)pick[q] * 16;
                cv[q] = dc_mask_load((const u8*)T.cur, off, T.nbytes, vec);
                if (old_out) sv[q] = dc_mask_load((const u8*)T.snap, off, T.nbytes, vec);
            }
        }
#pragma unroll
        for (u32 q = 0; q < 4; ++q) {
            if (!has[q]) continue;
            const u64 off = byte0 + (u64)pick[q] * 16;
            const bool whole = vec && off + 16 <= T.nbytes;
            // Refresh: the whole vector (its unchanged elements equal the snapshot's already).
            if (whole) *(uint4*)(snap_w + off) = cv[q];
            const u64 elem0 = off / w;
            u32 m = dc_lane_mask(mk, pick[q]);
            while (m) {
                const u32 e = __ffs(m) - 1;
                m &= m - 1;
                const u32 nb = dc_extract(cv[q], e, w);
                pos_out[at] = T.first_index + elem0 + e;
                dc_store_bits(new_out, at, w, nb);
                if (old_out) dc_store_bits(old_out, at, w, dc_extract(sv[q], e, w));
                if (!whole) dc_store_bits(snap_w, elem0 + e, w, nb);
                ++at;
            }
        }
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
