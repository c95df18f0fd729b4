// The batched diff (Gpu::diff_batch): compare + count + in-order compaction + snapshot refresh
// over many tensors, with no host synchronisation per tensor and no block ever waiting for
// another, so the pass over the tensors streams at memory speed.
//
// Every tensor is cut into tiles of DIFF_TILE_BYTES, numbered globally in tensor order
// (`tile_begin`; each tensor starts a new tile).
//
//   1. dc_diff: one block per tile. Reads snapshot and current once, counts the changed
//      elements and — when they fit the tile's slot (SLOT_BYTES of scratch) — writes them,
//      compacted in element order, to the slot (u16 position inside the tile, new bits, old
//      bits) and refreshes the snapshot's changed vectors while they are in registers. A tile
//      with more changes leaves its snapshot as it is, for pass 3.
//   2. dc_diff_scan_tiles / dc_diff_scan_groups: exclusive prefix of the tile counts (groups of
//      DIFF_GROUP tiles, then the group totals; the grand total goes after the last group).
//   3. dc_diff_place: one warp per tile, independent of the others. Copies the slot to the
//      tile's place in the output (positions widened to slot indices) and computes the tile's
//      digest change Σ h(new) − h(old), the lanes hashing side by side; the block adds its
//      tiles' changes to each tensor's digest word (one atomic per block and tensor). A tile
//      that overflowed its slot is diffed again by the warp, written straight to its place
//      and refreshed. A tile whose changes would pass `capacity` writes nothing.
//   4. dc_diff_finish: per-tensor offsets and counts.
//   (0. dc_diff_tile_tensor: the tensor of every tile, so that pass 1 starts loading at once.)
//
// The one-pass form (dc_diff_direct, dc_diff_resident_direct, dc_diff_finish_direct): one pass
// instead of passes 1-3. After its block scan a tile learns its place in the output from its
// predecessors by a decoupled look-back (each tile publishes its count, then its inclusive
// prefix, in one status word; a tile adds up the counts behind it until it meets a prefix),
// and writes its changes straight there, digest included: no slot, no second read of them, no
// place pass. The look-back relies on blocks starting in index order, as CUB's scans do.
// The host runs it when the caller expects more than ONE_PASS_ABOVE of the elements changed
// (or DiffTuning::direct forces it): it is slower at sparse densities (blocks hold their
// registers while they wait on the tiles before them) and faster where tiles overflow their
// slots (docs/data/gpu-diff/one-pass-choice/).
//
// Output layout: change g (global, in order) has its position (slot index = first_index +
// element) at pos_out[g] and its bits at new_out + g * width (old_out likewise, when given).
// The host orders tensors by non-decreasing width, so these byte ranges never overlap.
//
// When the output is too small (written < found) only a prefix of whole tiles is written,
// and the snapshot and the digest words are brought up to date only in part: the caller copies
// `current` over the snapshot and recomputes the digests (the sync then sends the tensors whole).

// Tuning knobs (the host passes -D to NVRTC): DIFF_ITEMS 16-byte vectors per thread and per
// array (tile = 256 * 16 * DIFF_ITEMS bytes, DIFF_ITEMS at most 4: the map diffs stash a
// tile's changed vectors in shared memory), DIFF_MINBLOCKS the occupancy asked of the
// register allocator.
#ifndef DIFF_ITEMS
#define DIFF_ITEMS 4
#endif
#if DIFF_ITEMS > 4
#error "DIFF_ITEMS at most 4"
#endif
#ifndef DIFF_MINBLOCKS
#define DIFF_MINBLOCKS 4
#endif
// DIFF_RELOAD 1: keep only the change masks across the block scan (fewer registers, more
// blocks per multiprocessor) and read the changed vectors again, from L2, to write them.
#ifndef DIFF_RELOAD
#define DIFF_RELOAD 1
#endif
// DIFF_PREFETCH > 0: each block of dc_diff asks the L2 for the lines of the tile that many
// tiles ahead (both arrays), so that the block which diffs it later finds them there. A block
// waits for its loads all at once and then computes; the prefetches keep the memory busy
// meanwhile, which raises the diff's share of a device copy (docs/data/gpu-diff/README.md,
// "Figures behind the code"). Too far ahead (about a third of the L2 in flight) and lines are
// evicted before use.
#ifndef DIFF_PREFETCH
#define DIFF_PREFETCH 264
#endif
// DIFF_STASH 1 (with DIFF_RELOAD): each warp keeps its changed vectors (both
// arrays) in shared memory, listed in order, and the write phase reads them there instead of
// again from L2 (pass 1 is bound by L2 traffic once the prefetch keeps DRAM busy).
#ifndef DIFF_STASH
#define DIFF_STASH 1
#endif
#define DIFF_THREADS 256
// Pass 3: rounds of 32 changes whose slot loads a warp issues together.
#ifndef PLACE_ROUNDS
#define PLACE_ROUNDS 4
#endif
#define DIFF_TILE_BYTES (DIFF_THREADS * DIFF_ITEMS * 16)
#define DIFF_TILE_VECS (DIFF_THREADS * DIFF_ITEMS)
#define DIFF_PACKS ((DIFF_ITEMS + 3) / 4)
#define DIFF_GROUP 2048  // tiles per group of the scan's first level (DIFF_THREADS * 8)
// Scratch per tile: an eighth of the tile (the host sizes the buffer the same way).
#define SLOT_BYTES (DIFF_TILE_BYTES / 8)

struct DiffTensor {
    u64 snap;         // device pointer, refreshed in place
    u64 cur;          // device pointer (fp32, twice the snapshot's bytes, when `convert`)
    u64 nbytes;       // bytes of the snapshot (whole elements)
    u64 first_index;  // slot index of element 0
    u64 tile_begin;   // first global tile
    u64 digest_out;   // 0, or device pointer to a u64 that receives Σ h(new) − h(old)
    u64 salt;         // digest salt of the slot
    u32 width;        // 1, 2 or 4
    u32 aligned16;    // both pointers 16-byte aligned: vector loads
    u32 convert;      // 0, or DC_FROM_F32 | nan: `cur` is fp32 rounded to bf16 as it is read
    u32 pad;
};

// Changes a slot holds at width w: u16 position + new + old bits each; a multiple of 8, so
// the new and old parts start 8-byte aligned (more than any element width needs). With old
// bits at width 1 or 2, change g's new and old bits share one word of 2w bytes, `new | old <<
// 8w`, at g of the new part (which then spans the old part too): one store in pass 1 and one
// load in pass 3 instead of two, as pass 1 is bound by its L2 requests.
__device__ __forceinline__ u32 dc_slot_cap(u32 w) { return (SLOT_BYTES / (2 + 2 * w)) & ~7u; }

// 16 bytes at `off` (zero past `nbytes`). CACHE: keep the line in L2 for a second read.
template <bool CACHE>
__device__ __forceinline__ uint4 dc_load16(const u8* base, u64 off, u64 nbytes, bool vec) {
    if (vec && off + 16 <= nbytes)
        return CACHE ? __ldcg((const uint4*)(base + off)) : __ldcs((const uint4*)(base + off));
    u32 w[4] = {0, 0, 0, 0};
    for (u32 b = 0; b < 16; ++b)
        if (off + b < nbytes) w[b >> 2] |= (u32)base[off + b] << (8 * (b & 3));
    return make_uint4(w[0], w[1], w[2], w[3]);
}

// The current bits' 16 bytes at snapshot offset `off` (zero past the end), as dc_load16; for
// a converting tensor the 32 bytes of fp32 at 2 * off, rounded to eight bf16 (zeros past the
// end round to zeros, so the tail compares equal as it does unconverted). Every read of a
// diff's current bits goes through here.
template <bool CACHE>
__device__ __forceinline__ uint4 dc_load_cur16(const DiffTensor& T, u64 off, bool vec) {
    if (!T.convert) return dc_load16<CACHE>((const u8*)T.cur, off, T.nbytes, vec);
    const uint4 lo = dc_load16<CACHE>((const u8*)T.cur, 2 * off, 2 * T.nbytes, vec);
    const uint4 hi = dc_load16<CACHE>((const u8*)T.cur, 2 * off + 16, 2 * T.nbytes, vec);
    return dc_bf16x8_of_f32(lo, hi, T.convert & 0xffffu);
}

// Asks the L2 for the 128-byte lines of tile `t` of this launch (current, then snapshot), one
// or more lines per thread; nothing past the tile's tensor. A converting tensor's current
// spans twice the lines.
__device__ __forceinline__ void dc_diff_prefetch(const DiffTensor* __restrict__ tensors,
                                                 const u32* __restrict__ tile_tensor, u64 t) {
    if (t >= gridDim.x) return;
    const DiffTensor P = tensors[tile_tensor[t]];
    const u64 byte0 = (t - P.tile_begin) * DIFF_TILE_BYTES;
    const u32 scale = P.convert ? 2 : 1;
    const u32 cur_lines = scale * DIFF_TILE_BYTES / 128;
    for (u32 l = threadIdx.x; l < cur_lines + DIFF_TILE_BYTES / 128; l += DIFF_THREADS) {
        const bool cur = l < cur_lines;
        const u64 off = cur ? scale * byte0 + (u64)l * 128
                            : byte0 + (u64)(l - cur_lines) * 128;
        if (off < (cur ? scale * P.nbytes : P.nbytes)) {
            const u8* p = (const u8*)(cur ? P.cur : P.snap) + off;
            asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
        }
    }
}

// The tensor holding global tile t: the largest j with tile_begin <= t.
__device__ __forceinline__ u32 dc_diff_tensor_of(const DiffTensor* tensors, u32 n, u64 t) {
    u32 lo = 0, hi = n;
    while (hi - lo > 1) {
        const u32 mid = (lo + hi) >> 1;
        if (tensors[mid].tile_begin <= t) lo = mid; else hi = mid;
    }
    return lo;
}

// tile_tensor[t] = the tensor holding tile t, so that the passes below start loading at once
// (one broadcast load instead of a chain of dependent ones per block); and, for the one-pass
// form, status[t] = 0 (status null otherwise).
extern "C" __global__ void dc_diff_tile_tensor(const DiffTensor* __restrict__ tensors,
                                               u32 num_tensors, u64 num_tiles,
                                               u32* __restrict__ tile_tensor,
                                               u64* __restrict__ status) {
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < num_tiles;
         t += (u64)gridDim.x * blockDim.x) {
        tile_tensor[t] = dc_diff_tensor_of(tensors, num_tensors, t);
        if (status) status[t] = 0;
    }
}

// The one-pass form's status word per tile: count or inclusive prefix << 2 | flag.
#define DC_STATUS_COUNT 1u
#define DC_STATUS_PREFIX 2u

__device__ __forceinline__ u64 dc_load_status(const u64* p) {
    u64 v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ void dc_store_status(u64* p, u64 v) {
    asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(p), "l"(v) : "memory");
}

// The scan of a tile's counts per vector, packed four items (16-bit fields: at most 16 a
// vector, 4096 a row of the tile) to a word: `incl` the lane's inclusive prefix in its warp,
// `warp_excl` the warps' before it, `rows` each row's total over the tile. Returns the tile's
// total. One __syncthreads; `s_warp_tot` holds a word per pack and warp.
__device__ __forceinline__ u32 dc_tile_scan(const u64 (&packed)[DIFF_PACKS], u64 (&incl)[DIFF_PACKS],
                                            u64 (&warp_excl)[DIFF_PACKS], u64 (&rows)[DIFF_PACKS],
                                            u64 (*s_warp_tot)[DIFF_THREADS / 32]) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
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
    u32 total = 0;
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
        for (u32 f = 0; f < 4; ++f) total += (u32)(rows[p] >> (16 * f)) & 0xffffu;
    }
    return total;
}

// Decoupled look-back, by warp 0: publishes the tile's count, adds up the counts of the tiles
// behind it (32 at a time) until one has published its inclusive prefix, publishes its own
// prefix. Returns the changes before the tile, in every thread of the block.
__device__ __forceinline__ u64 dc_diff_lookback(u64* __restrict__ status, u64 tile, u32 total) {
    __shared__ u64 s_before;
    const u32 lane = threadIdx.x & 31;
    if (threadIdx.x < 32) {
        u64 before = 0;
        if (tile == 0) {
            if (lane == 0) dc_store_status(status, ((u64)total << 2) | DC_STATUS_PREFIX);
        } else {
            if (lane == 0) dc_store_status(status + tile, ((u64)total << 2) | DC_STATUS_COUNT);
            i64 nearest = (i64)tile - 1;
            while (true) {
                const i64 at = nearest - (i64)lane;
                // Before tile 0: a prefix of 0, so that the walk ends there.
                u64 s = at >= 0 ? dc_load_status(status + at) : DC_STATUS_PREFIX;
                // Not yet published: ask again after a pause (the spin's loads compete for the
                // L2 the diff is bound by).
                while (__any_sync(DC_FULL_MASK, (s & 3) == 0)) {
                    __nanosleep(64);
                    if ((s & 3) == 0) s = dc_load_status(status + at);
                }
                const u32 prefixes = __ballot_sync(DC_FULL_MASK, (s & 3) == DC_STATUS_PREFIX);
                const u32 upto = prefixes ? __ffs(prefixes) - 1 : 31;
                before += dc_warp_sum(lane <= upto ? s >> 2 : 0);
                if (prefixes) break;
                nearest -= 32;
            }
            if (lane == 0)
                dc_store_status(status + tile, ((before + total) << 2) | DC_STATUS_PREFIX);
        }
        if (lane == 0) s_before = before;
    }
    __syncthreads();
    return s_before;
}

// Adds a tile's digest changes (`dsum`, each thread's) to its tensor's digest word with one
// atomic; every thread of the block calls it (one __syncthreads); `scratch` one word per warp.
__device__ __forceinline__ void dc_diff_digest_add(u64 dsum, u64* scratch, u64 digest_out) {
    dsum = dc_warp_sum(dsum);
    if ((threadIdx.x & 31) == 0) scratch[threadIdx.x >> 5] = dsum;
    __syncthreads();
    if (threadIdx.x == 0) {
        u64 sum = 0;
#pragma unroll
        for (u32 k = 0; k < DIFF_THREADS / 32; ++k) sum += scratch[k];
        if (sum != 0) atomicAdd((u64*)digest_out, sum);
    }
}

// Where the one-pass form writes (pass 3's arguments).
struct DiffDirect {
    u64* status;  // one word per tile, zeroed by dc_diff_tile_tensor
    u64 capacity;
    u64* pos_out;
    u8* new_out;
    u8* old_out;  // or null
};

// Pass 1 for one tile. RELOAD: keep only the change masks across the block scan and read the
// changed vectors again (from L2) to write them; without it they stay in registers (what a
// snapshot in host memory wants: a second read would cross PCIe).
// W: the tensor's element width, a constant so that the masks, extractions and stores
// compile to their one case (the kernel is bound by its integer instructions at 1 %: Nsight
// Compute, docs/data/gpu-diff/pass1-rewrites/).
// STASH: `stash` holds 2 * DIFF_THREADS * DIFF_ITEMS vectors of shared memory (current, then
// snapshot, DIFF_ITEMS * 32 per warp each).
// DIRECT: the one-pass form: writes to `D`'s output at the place the look-back gives (and
// adds the digest change) instead of to the tile's slot; `tile_counts`, `slots` unused.
template <bool RELOAD, bool PREFETCH, bool STASH, bool DIRECT, u32 W>
__device__ __forceinline__ void dc_diff_tile(const DiffTensor* __restrict__ tensors,
                                             const u32* __restrict__ tile_tensor,
                                             u32* __restrict__ tile_counts, u8* __restrict__ slots,
                                             u32 want_old, uint4* __restrict__ stash,
                                             const DiffDirect& D) {
    __shared__ u64 s_warp_tot[DIFF_PACKS][DIFF_THREADS / 32];
    __shared__ u64 s_digest[DIFF_THREADS / 32];
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u64 tile = blockIdx.x;
    const DiffTensor T = tensors[tile_tensor[tile]];
    const u32 w = W;
    const bool vec = T.aligned16 != 0;
    const u64 byte0 = (tile - T.tile_begin) * DIFF_TILE_BYTES;

    uint4 cv[DIFF_ITEMS], sv[DIFF_ITEMS];  // dead after the masks when RELOAD
    u32 mask[DIFF_ITEMS];
    u64 packed[DIFF_PACKS];  // 4 counts of 16 bits per word (at most 16 per vector)
    {
#pragma unroll
        for (u32 i = 0; i < DIFF_ITEMS; ++i) {
            const u64 off = byte0 + ((u64)i * DIFF_THREADS + threadIdx.x) * 16;
            cv[i] = dc_load_cur16<RELOAD>(T, off, vec);
            sv[i] = dc_load16<RELOAD>((const u8*)T.snap, off, T.nbytes, vec);
        }
        // After this tile's loads are issued, so that they do not wait behind its lookups.
        if (PREFETCH) dc_diff_prefetch(tensors, tile_tensor, tile + DIFF_PREFETCH);
#pragma unroll
        for (u32 p = 0; p < DIFF_PACKS; ++p) packed[p] = 0;
#pragma unroll
        for (u32 i = 0; i < DIFF_ITEMS; ++i) {
            mask[i] = dc_change_mask(cv[i], sv[i], w);
            packed[i / 4] |= (u64)__popc(mask[i]) << (16 * (i % 4));
        }
    }
    // STASH: item i's place in the warp's list, 8 bits per item (at most 4 * 32 places).
    u32 stash_at = 0;
    uint4* stash_cur = STASH ? stash + warp * (DIFF_ITEMS * 32) : nullptr;
    uint4* stash_snap = STASH ? stash_cur + DIFF_THREADS * DIFF_ITEMS : nullptr;
    if (STASH) {
        u32 listed = 0;
#pragma unroll
        for (u32 i = 0; i < DIFF_ITEMS; ++i) {
            const u32 has = __ballot_sync(DC_FULL_MASK, mask[i] != 0);
            if (mask[i] != 0) {
                const u32 at = listed + __popc(has & ((1u << lane) - 1));
                stash_cur[at] = cv[i];
                stash_snap[at] = sv[i];
                stash_at |= at << (8 * i);
            }
            listed += __popc(has);
        }
    }
    u64 incl[DIFF_PACKS], warp_excl[DIFF_PACKS], rows[DIFF_PACKS];
    const u32 tile_total = dc_tile_scan(packed, incl, warp_excl, rows, s_warp_tot);
    if (!DIRECT && threadIdx.x == 0) tile_counts[tile] = tile_total;
    const u64 before = DIRECT ? dc_diff_lookback(D.status, tile, tile_total) : 0;

    const u32 cap = dc_slot_cap(w);
    // Uniform: the changes fit the slot, or (DIRECT) the output.
    const bool fits = DIRECT ? before + tile_total <= D.capacity : tile_total <= cap;
    u64 dsum = 0;  // DIRECT: Σ h(new) − h(old) of this thread's changes
    const bool keep_old = want_old || T.digest_out;  // pass 3 hashes old and new bits
    u8* slot = slots + tile * SLOT_BYTES;
    u16* slot_pos = (u16*)slot;
    u8* slot_new = slot + 2 * cap;
    u8* slot_old = slot_new + (u64)cap * w;
    u8* snap_w = (u8*)T.snap;
    u32 row_base = 0;
#pragma unroll
    for (u32 i = 0; i < DIFF_ITEMS; ++i) {
        const u32 p = i / 4, f = 16 * (i % 4);
        u32 m = mask[i];
        u32 g = row_base + (u32)((warp_excl[p] >> f) & 0xffffu) + (u32)(((incl[p] - packed[p]) >> f) & 0xffffu);
        row_base += (u32)(rows[p] >> f) & 0xffffu;
        // DIRECT refreshes the snapshot even when the output is full (pass 3 would not).
        if (m == 0 || (!DIRECT && !fits)) continue;
        const u64 off = byte0 + ((u64)i * DIFF_THREADS + threadIdx.x) * 16;
        const u32 at = (stash_at >> (8 * i)) & 0xffu;
        const uint4 cvi = STASH    ? stash_cur[at]
                          : RELOAD ? dc_load_cur16<true>(T, off, vec)
                                   : cv[i];
        const uint4 svi = STASH    ? stash_snap[at]
                          : RELOAD ? dc_load16<true>((const u8*)T.snap, off, T.nbytes, vec)
                                   : sv[i];
        const bool whole = vec && off + 16 <= T.nbytes;
        // Refresh: the whole vector (its unchanged elements equal the snapshot's already).
        if (whole) *(uint4*)(snap_w + off) = cvi;
        const u32 rel0 = (u32)(((u64)i * DIFF_THREADS + threadIdx.x) * 16 / w);
        const u64 elem0 = off / w;
        if (DIRECT) {
            const u64 index0 = T.first_index + elem0;
            u64 at = before + g;
            while (m) {
                const u32 e = __ffs(m) - 1;
                m &= m - 1;
                const u32 nb = dc_extract(cvi, e, w);
                if (!whole) dc_store_bits(snap_w, elem0 + e, w, nb);
                if (!fits) continue;
                const u32 ob = dc_extract(svi, e, w);
                D.pos_out[at] = index0 + e;
                dc_store_bits(D.new_out, at, w, nb);
                if (D.old_out) dc_store_bits(D.old_out, at, w, ob);
                if (T.digest_out)
                    dsum += dc_element_hash(T.salt, index0 + e, nb) -
                            dc_element_hash(T.salt, index0 + e, ob);
                ++at;
            }
            continue;
        }
        while (m) {
            const u32 e = __ffs(m) - 1;
            m &= m - 1;
            const u32 nb = dc_extract(cvi, e, w);
            slot_pos[g] = (u16)(rel0 + e);
            if (keep_old && W <= 2)  // one store of both: `new | old << 8W` (see dc_slot_pair)
                dc_store_bits(slot_new, g, 2 * W, nb | dc_extract(svi, e, w) << (8 * W));
            else
                dc_store_bits(slot_new, g, w, nb);
            if (keep_old && W > 2) dc_store_bits(slot_old, g, w, dc_extract(svi, e, w));
            if (!whole) dc_store_bits(snap_w, elem0 + e, w, nb);
            ++g;
        }
    }
    if (DIRECT && T.digest_out && fits && tile_total != 0)  // uniform
        dc_diff_digest_add(dsum, s_digest, T.digest_out);
}

// Pass 1 for the block's tile, at its tensor's width.
template <bool RELOAD, bool PREFETCH, bool STASH, bool DIRECT>
__device__ __forceinline__ void dc_diff_tile_at_width(const DiffTensor* __restrict__ tensors,
                                                      const u32* __restrict__ tile_tensor,
                                                      u32* __restrict__ tile_counts,
                                                      u8* __restrict__ slots, u32 want_old,
                                                      uint4* __restrict__ stash,
                                                      const DiffDirect& D) {
    const u32 w = tensors[tile_tensor[blockIdx.x]].width;
    if (w == 2)
        dc_diff_tile<RELOAD, PREFETCH, STASH, DIRECT, 2>(tensors, tile_tensor, tile_counts,
                                                         slots, want_old, stash, D);
    else if (w == 4)
        dc_diff_tile<RELOAD, PREFETCH, STASH, DIRECT, 4>(tensors, tile_tensor, tile_counts,
                                                         slots, want_old, stash, D);
    else
        dc_diff_tile<RELOAD, PREFETCH, STASH, DIRECT, 1>(tensors, tile_tensor, tile_counts,
                                                         slots, want_old, stash, D);
}

template <bool DIRECT>
__device__ __forceinline__ void dc_diff_device_snapshot(const DiffTensor* __restrict__ tensors,
                                                        const u32* __restrict__ tile_tensor,
                                                        u32* __restrict__ tile_counts,
                                                        u8* __restrict__ slots, u32 want_old,
                                                        const DiffDirect& D) {
#if DIFF_STASH && DIFF_RELOAD
    __shared__ uint4 s_stash[2 * DIFF_THREADS * DIFF_ITEMS];
    dc_diff_tile_at_width<true, (DIFF_PREFETCH > 0), true, DIRECT>(
        tensors, tile_tensor, tile_counts, slots, want_old, s_stash, D);
#else
    dc_diff_tile_at_width<DIFF_RELOAD != 0, (DIFF_PREFETCH > 0), false, DIRECT>(
        tensors, tile_tensor, tile_counts, slots, want_old, nullptr, D);
#endif
}

extern "C" __global__ void __launch_bounds__(DIFF_THREADS, DIFF_MINBLOCKS)
dc_diff(const DiffTensor* __restrict__ tensors, const u32* __restrict__ tile_tensor,
        u32* __restrict__ tile_counts, u8* __restrict__ slots, u32 want_old) {
    dc_diff_device_snapshot<false>(tensors, tile_tensor, tile_counts, slots, want_old,
                                   DiffDirect{});
}

// The same with the vectors kept in registers, for snapshots in host memory.
extern "C" __global__ void __launch_bounds__(DIFF_THREADS, DIFF_MINBLOCKS)
dc_diff_resident(const DiffTensor* __restrict__ tensors, const u32* __restrict__ tile_tensor,
                 u32* __restrict__ tile_counts, u8* __restrict__ slots, u32 want_old) {
    dc_diff_tile_at_width<false, false, false, false>(tensors, tile_tensor, tile_counts, slots,
                                                      want_old, nullptr, DiffDirect{});
}

// The one-pass forms (DiffTuning::direct): passes 1-3 in one, then dc_diff_finish_direct.
extern "C" __global__ void __launch_bounds__(DIFF_THREADS, DIFF_MINBLOCKS)
dc_diff_direct(const DiffTensor* __restrict__ tensors, const u32* __restrict__ tile_tensor,
               u64* __restrict__ status, u64 capacity, u64* __restrict__ pos_out,
               u8* __restrict__ new_out, u8* __restrict__ old_out) {
    const DiffDirect D{status, capacity, pos_out, new_out, old_out};
    dc_diff_device_snapshot<true>(tensors, tile_tensor, nullptr, nullptr, old_out != nullptr, D);
}

extern "C" __global__ void __launch_bounds__(DIFF_THREADS, DIFF_MINBLOCKS)
dc_diff_resident_direct(const DiffTensor* __restrict__ tensors,
                        const u32* __restrict__ tile_tensor, u64* __restrict__ status,
                        u64 capacity, u64* __restrict__ pos_out, u8* __restrict__ new_out,
                        u8* __restrict__ old_out) {
    const DiffDirect D{status, capacity, pos_out, new_out, old_out};
    dc_diff_tile_at_width<false, false, false, true>(tensors, tile_tensor, nullptr, nullptr,
                                                     old_out != nullptr, nullptr, D);
}

// Exclusive prefix of the tile counts within each group of DIFF_GROUP tiles (one block per
// group, 8 tiles per thread); group_sums[g] gets the group's total.
extern "C" __global__ void __launch_bounds__(DIFF_THREADS)
dc_diff_scan_tiles(const u32* __restrict__ tile_counts, u64 num_tiles, u32* __restrict__ tile_offsets,
                   u64* __restrict__ group_sums) {
    __shared__ u32 s_scan[32];
    const u64 g = blockIdx.x;
    const u64 first = g * DIFF_GROUP + (u64)threadIdx.x * 8;
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
dc_diff_scan_groups(u64* group_sums, u64 num_groups) {
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

__device__ __forceinline__ u64 dc_diff_prefix(const u32* tile_offsets, const u64* group_sums,
                                              u64 num_tiles, u64 t) {
    if (t >= num_tiles) return group_sums[(num_tiles + DIFF_GROUP - 1) / DIFF_GROUP];
    return group_sums[t / DIFF_GROUP] + tile_offsets[t];
}

// A tile that overflowed its slot, diffed again by one warp, 32 vectors per round, straight
// to the output from `first` on (pass 1 left its snapshot as it was). Returns this lane's
// Σ h(new) − h(old).
__device__ u64 dc_diff_tile_warp(const DiffTensor& T, u64 byte0, u64 first, u64* pos_out,
                                 u8* new_out, u8* old_out) {
    const u32 lane = threadIdx.x & 31;
    const u32 w = T.width;
    const bool vec = T.aligned16 != 0;
    u64 dsum = 0;
    u8* snap_w = (u8*)T.snap;
    u64 g = first;
    for (u32 r = 0; r < DIFF_TILE_VECS / 32; ++r) {
        const u64 off = byte0 + ((u64)r * 32 + lane) * 16;
        const uint4 c = dc_load_cur16<false>(T, off, vec);
        const uint4 s = dc_load16<false>((const u8*)T.snap, off, T.nbytes, vec);
        u32 m = dc_change_mask(c, s, w);
        const u32 mine = __popc(m);
        u32 incl = mine;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u32 n = __shfl_up_sync(DC_FULL_MASK, incl, o);
            if (lane >= (u32)o) incl += n;
        }
        const u32 round_total = __shfl_sync(DC_FULL_MASK, incl, 31);
        u64 at = g + incl - mine;
        g += round_total;
        if (m == 0) continue;
        const bool whole = vec && off + 16 <= T.nbytes;
        if (whole) *(uint4*)(snap_w + off) = c;
        const u64 elem0 = off / w;
        while (m) {
            const u32 e = __ffs(m) - 1;
            m &= m - 1;
            const u32 nb = dc_extract(c, e, w);
            const u32 ob = dc_extract(s, e, w);
            const u64 index = T.first_index + elem0 + e;
            pos_out[at] = index;
            dc_store_bits(new_out, at, w, nb);
            if (old_out) dc_store_bits(old_out, at, w, ob);
            if (!whole) dc_store_bits(snap_w, elem0 + e, w, nb);
            if (T.digest_out)
                dsum += dc_element_hash(T.salt, index, nb) - dc_element_hash(T.salt, index, ob);
            ++at;
        }
    }
    return dsum;
}

// Per tensor: [offset of its first change, changes written, changes found]; then
// [total found, total written]. `prefix(t)`: the changes of the tiles before t.
template <typename Prefix>
__device__ __forceinline__ void dc_diff_finish_with(const DiffTensor* __restrict__ tensors,
                                                    u32 num_tensors, u64 num_tiles,
                                                    u64 capacity, u64* __restrict__ result,
                                                    Prefix prefix) {
    const u64 total = prefix(num_tiles);
    // Written: the changes of the longest run of whole tiles, from the first, that fits.
    u64 lo = 0, hi = num_tiles;  // the largest t with prefix(t) <= capacity
    while (lo < hi) {
        const u64 mid = (lo + hi + 1) >> 1;
        if (prefix(mid) <= capacity) lo = mid; else hi = mid - 1;
    }
    const u64 written = prefix(lo);
    for (u32 j = blockIdx.x * blockDim.x + threadIdx.x; j < num_tensors; j += gridDim.x * blockDim.x) {
        const u64 b = tensors[j].tile_begin;
        const u64 e = j + 1 < num_tensors ? tensors[j + 1].tile_begin : num_tiles;
        const u64 first = prefix(b);
        const u64 end = prefix(e);
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

// Over the two-level prefix of the counts (passes 1-3).
extern "C" __global__ void dc_diff_finish(const DiffTensor* __restrict__ tensors, u32 num_tensors,
                                          const u32* __restrict__ tile_offsets,
                                          const u64* __restrict__ group_sums, u64 num_tiles,
                                          u64 capacity, u64* __restrict__ result) {
    dc_diff_finish_with(tensors, num_tensors, num_tiles, capacity, result, [&](u64 t) {
        return dc_diff_prefix(tile_offsets, group_sums, num_tiles, t);
    });
}

// Over the inclusive prefixes the one-pass form left in the status words.
extern "C" __global__ void dc_diff_finish_direct(const DiffTensor* __restrict__ tensors,
                                                 u32 num_tensors,
                                                 const u64* __restrict__ status, u64 num_tiles,
                                                 u64 capacity, u64* __restrict__ result) {
    dc_diff_finish_with(tensors, num_tensors, num_tiles, capacity, result,
                        [&](u64 t) { return t == 0 ? 0 : status[t - 1] >> 2; });
}

// Pass 3 for one tile, by its warp: copies the slot to its place (or diffs an overflowed
// tile again) and returns this lane's share of the digest change (0 without a digest).
__device__ __forceinline__ u64 dc_diff_place_tile(const DiffTensor& T, u64 tile, u32 count,
                                                  u64 first, const u8* __restrict__ slots,
                                                  u64* __restrict__ pos_out,
                                                  u8* __restrict__ new_out,
                                                  u8* __restrict__ old_out) {
    const u32 lane = threadIdx.x & 31;
    const u32 w = T.width;
    const u64 byte0 = (tile - T.tile_begin) * DIFF_TILE_BYTES;
    const u64 index0 = T.first_index + byte0 / w;
    const u32 cap = dc_slot_cap(w);
    if (count > cap) return dc_diff_tile_warp(T, byte0, first, pos_out, new_out, old_out);
    u64 dsum = 0;
    const u8* slot = slots + tile * SLOT_BYTES;
    const u16* slot_pos = (const u16*)slot;
    const u8* slot_new = slot + 2 * cap;
    const u8* slot_old = slot_new + (u64)cap * w;
    const bool with_old = old_out || T.digest_out;  // uniform
    // PLACE_ROUNDS rounds of 32 changes at a time, all their loads issued before the first
    // store: the pass is bound by the latency of these loads, not by bandwidth.
    for (u32 base = 0; base < count; base += 32 * PLACE_ROUNDS) {
        u32 rel[PLACE_ROUNDS], nb[PLACE_ROUNDS], ob[PLACE_ROUNDS];
#pragma unroll
        for (u32 r = 0; r < PLACE_ROUNDS; ++r) {
            const u32 k = base + 32 * r + lane;
            rel[r] = nb[r] = ob[r] = 0;
            if (k < count) {
                rel[r] = slot_pos[k];
                if (with_old && w <= 2) {
                    const u32 pair = dc_load_bits(slot_new, k, 2 * w);
                    nb[r] = pair & ((1u << (8 * w)) - 1);
                    ob[r] = pair >> (8 * w);
                } else {
                    nb[r] = dc_load_bits(slot_new, k, w);
                    if (with_old) ob[r] = dc_load_bits(slot_old, k, w);
                }
            }
        }
#pragma unroll
        for (u32 r = 0; r < PLACE_ROUNDS; ++r) {
            const u32 k = base + 32 * r + lane;
            if (k >= count) break;
            const u64 index = index0 + rel[r];
            pos_out[first + k] = index;
            dc_store_bits(new_out, first + k, w, nb[r]);
            if (old_out) dc_store_bits(old_out, first + k, w, ob[r]);
            if (T.digest_out)
                dsum += dc_element_hash(T.salt, index, nb[r]) -
                        dc_element_hash(T.salt, index, ob[r]);
        }
    }
    return dsum;
}

extern "C" __global__ void __launch_bounds__(DIFF_THREADS)
dc_diff_place(const DiffTensor* __restrict__ tensors, const u32* __restrict__ tile_tensor,
              u64 num_tiles, const u32* __restrict__ tile_counts, const u8* __restrict__ slots,
              const u32* __restrict__ tile_offsets, const u64* __restrict__ group_sums,
              u64 capacity, u64* __restrict__ pos_out, u8* __restrict__ new_out,
              u8* __restrict__ old_out) {
    // The block's warps (consecutive tiles) add their digest changes up here, so that one
    // atomic per block and tensor reaches the digest word instead of one per tile: with a
    // single large tensor every tile's atomic went to the same word, and they queued there
    // (docs/data/gpu-diff/README.md, "Figures behind the code").
    __shared__ u32 s_tensor[DIFF_THREADS / 32];
    __shared__ u64 s_sum[DIFF_THREADS / 32];
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u64 tile = ((u64)blockIdx.x * DIFF_THREADS + threadIdx.x) >> 5;
    const bool in_range = tile < num_tiles;  // whole warps
    const u32 tt = in_range ? tile_tensor[tile] : 0xffffffffu;
    u64 dsum = 0;  // Σ h(new) − h(old) of this lane's changes
    if (in_range) {
        const u32 count = tile_counts[tile];
        const u64 first = dc_diff_prefix(tile_offsets, group_sums, num_tiles, tile);
        if (count != 0 && first + count <= capacity)
            dsum = dc_diff_place_tile(tensors[tt], tile, count, first, slots, pos_out, new_out,
                                      old_out);
    }
    dsum = dc_warp_sum(dsum);
    if (lane == 0) {
        s_tensor[warp] = tt;
        s_sum[warp] = dsum;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        u64 run = 0;
        for (u32 k = 0; k < DIFF_THREADS / 32; ++k) {
            run += s_sum[k];
            const bool last = k + 1 == DIFF_THREADS / 32 || s_tensor[k + 1] != s_tensor[k];
            if (last) {
                if (s_tensor[k] != 0xffffffffu && run != 0 && tensors[s_tensor[k]].digest_out)
                    atomicAdd((u64*)tensors[s_tensor[k]].digest_out, run);
                run = 0;
            }
        }
    }
}

// The map diffs (dc_diff_steps, dc_diff_bitmap): a dense stage written straight in a code of
// fixed size per element, in one pass. dc_diff_steps writes the steps + esc code
// (docs/codecs.md): 2 bits an element, escapes the changes other than one step;
// dc_diff_bitmap writes bitmap + raw: 1 bit an element, every change "escaped" (its new bits
// are the raw values). Each tensor's codes go to a map of fixed place (element e at bit
// BITS * e of the tensor's map), so a tile writes its codes without knowing what the tiles
// before it found; only the escapes are compacted, in element order, at the place a
// decoupled look-back over the tiles' escape counts gives. The snapshot is refreshed, the
// digest change added and each grid cell's changes and escapes counted (a tile lies inside
// one cell: cells are whole tiles). Escapes past `capacity`: nothing of the tile's escapes or
// digest is written (the host sends the stage whole; the snapshot is current all the same).
// Dense steps want the bitmap form over the listing diff: it writes 1 bit an element instead
// of 8 bytes of position a change, and needs no encoding pass after it.
struct StepsTensor {
    u64 map;    // element e's code at bit BITS * e (16-aligned, room for every vector's codes)
    u64 cell0;  // index of the tensor's first cell in `cells`
};

// The codes of one 16-byte vector's elements (old s, new c), 2 bits each in element order:
// two or four elements at a time in a word (SIMD-in-a-word compares and subtracts), the
// ordered view taken by flipping every bit of a negative element and the sign of a positive
// one. Bit 0 of a code is "changed and not one step down", bit 1 "changed and not one up".
template <u32 W>
__device__ __forceinline__ u32 dc_step_codes(uint4 s, uint4 c) {
    u32 out = 0;
#pragma unroll
    for (u32 k = 0; k < 4; ++k) {
        const u32 a = dc_word(s, k), b = dc_word(c, k);
        if (W == 4) {
            out |= dc_step_code(a, b, 4) << (2 * k);
        } else if (W == 2) {
            const u32 changed = __vcmpne2(a, b);
            const u32 oa = a ^ (0x80008000u | (__vcmpgeu2(a, 0x80008000u) & 0x7fff7fffu));
            const u32 ob = b ^ (0x80008000u | (__vcmpgeu2(b, 0x80008000u) & 0x7fff7fffu));
            const u32 d = __vsub2(ob, oa);
            const u32 b0 = changed & ~__vcmpeq2(d, 0xffffffffu);
            const u32 b1 = changed & ~__vcmpeq2(d, 0x00010001u);
            const u32 q = (b0 & 1u) | (b1 & 1u) << 1 | (b0 >> 16 & 1u) << 2 | (b1 >> 16 & 1u) << 3;
            out |= q << (4 * k);
        } else {
            const u32 changed = __vcmpne4(a, b);
            const u32 oa = a ^ (0x80808080u | (__vcmpgeu4(a, 0x80808080u) & 0x7f7f7f7fu));
            const u32 ob = b ^ (0x80808080u | (__vcmpgeu4(b, 0x80808080u) & 0x7f7f7f7fu));
            const u32 d = __vsub4(ob, oa);
            const u32 b0 = changed & ~__vcmpeq4(d, 0xffffffffu);
            const u32 b1 = changed & ~__vcmpeq4(d, 0x01010101u);
            u32 q = 0;
#pragma unroll
            for (u32 j = 0; j < 4; ++j) q |= (b0 >> (8 * j) & 1u) << (2 * j) | (b1 >> (8 * j) & 1u) << (2 * j + 1);
            out |= q << (8 * k);
        }
    }
    return out;
}

// The map code of one vector, BITS (1 or 2) per element in element order.
template <u32 W, u32 BITS>
__device__ __forceinline__ u32 dc_map_codes(uint4 s, uint4 c) {
    return BITS == 2 ? dc_step_codes<W>(s, c) : dc_change_mask(c, s, W);
}

// The changed elements of a vector's map code: one bit each, at bit BITS * e.
template <u32 BITS>
__device__ __forceinline__ u32 dc_map_changed(u32 c) {
    return BITS == 2 ? (c | (c >> 1)) & 0x55555555u : c;
}

// Stores one vector's codes at byte `off` of the tensor (`off` < its bytes). A vector's
// codes are 32 * BITS / 16 / W bits: whole bytes but for the bitmap of 4-byte elements (4
// bits), where the even lane of each pair writes both vectors' (adjacent: lanes 2k and 2k + 1
// read consecutive vectors). Every lane must call it (the pairs shuffle).
template <u32 W, u32 BITS>
__device__ __forceinline__ void dc_store_codes(u8* map, u64 off, u32 c, bool inside) {
    if (BITS == 1 && W == 4) {
        const u32 odd = __shfl_down_sync(DC_FULL_MASK, c, 1);
        if (inside && (threadIdx.x & 1) == 0) map[off / 32] = (u8)(c | odd << 4);
        return;
    }
    if (!inside) return;
    u8* at = map + off / W * BITS / 8;
    constexpr u32 bits = 16 / W * BITS;
    if (bits == 32) *(u32*)at = c;
    else if (bits == 16) *(u16*)at = (u16)c;
    else *at = (u8)c;
}

// Shared memory of a map-diff block, declared once per kernel (not per width).
struct MapShared {
    uint4* stash;  // each warp's changed vectors, current then snapshot (as dc_diff_tile's)
    u16* list;     // each warp's changes of one item: MAP_LIST entries
};
// A warp's changes of one item: at most 16 a vector (width 1).
#define MAP_LIST (32 * 16)

template <u32 W, u32 BITS>
__device__ __forceinline__ void dc_map_tile(const DiffTensor* __restrict__ tensors,
                                            const StepsTensor* __restrict__ steps,
                                            const u32* __restrict__ tile_tensor,
                                            u64* __restrict__ status, u64 capacity,
                                            u8* __restrict__ esc_out, u32* __restrict__ cells,
                                            u64 cell_elems, const MapShared& sh) {
    __shared__ u64 s_warp_tot[DIFF_PACKS][DIFF_THREADS / 32];
    __shared__ u32 s_warp_changed[DIFF_THREADS / 32];
    __shared__ u64 s_digest[DIFF_THREADS / 32];
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 lanes_below = (1u << lane) - 1u;
    const u64 tile = blockIdx.x;
    const u32 tt = tile_tensor[tile];
    const DiffTensor T = tensors[tt];
    const StepsTensor S = steps[tt];
    const bool vec = T.aligned16 != 0;
    const u64 byte0 = (tile - T.tile_begin) * DIFF_TILE_BYTES;
    uint4* stash_cur = sh.stash + warp * (DIFF_ITEMS * 32);
    uint4* stash_snap = stash_cur + DIFF_THREADS * DIFF_ITEMS;
    u16* list = sh.list + warp * MAP_LIST;
    u8* snap_w = (u8*)T.snap;

    // Phase 1: codes into the map; every changed vector refreshed in the snapshot at once and
    // stashed (both sides) for phase 3, so that only the codes stay in registers across the
    // look-back and nothing is read twice from memory.
    uint4 cv[DIFF_ITEMS], sv[DIFF_ITEMS];
#pragma unroll
    for (u32 i = 0; i < DIFF_ITEMS; ++i) {
        const u64 off = byte0 + ((u64)i * DIFF_THREADS + threadIdx.x) * 16;
        cv[i] = dc_load_cur16<true>(T, off, vec);
        sv[i] = dc_load16<true>((const u8*)T.snap, off, T.nbytes, vec);
    }
    if (DIFF_PREFETCH > 0) dc_diff_prefetch(tensors, tile_tensor, tile + DIFF_PREFETCH);
    // Escape counts per item, 16 bits each (at most 16 a vector, 4096 a row of the tile),
    // four items to a word; the place of item i's vector in the warp's stash, 8 bits each.
    u32 codes[DIFF_ITEMS];
    u64 packed[DIFF_PACKS];
    u32 changed = 0, stash_at = 0, stashed = 0;
#pragma unroll
    for (u32 p = 0; p < DIFF_PACKS; ++p) packed[p] = 0;
#pragma unroll
    for (u32 i = 0; i < DIFF_ITEMS; ++i) {
        const u32 c = dc_map_codes<W, BITS>(sv[i], cv[i]);
        codes[i] = c;
        const u32 nz = dc_map_changed<BITS>(c);
        const u32 es = BITS == 2 ? c & (c >> 1) & 0x55555555u : c;
        changed += __popc(nz);
        packed[i / 4] |= (u64)__popc(es) << (16 * (i % 4));
        const u64 off = byte0 + ((u64)i * DIFF_THREADS + threadIdx.x) * 16;
        dc_store_codes<W, BITS>((u8*)S.map, off, c, off < T.nbytes);
        const u32 has = __ballot_sync(DC_FULL_MASK, c != 0);
        if (c != 0) {
            const u32 at = stashed + __popc(has & lanes_below);
            stash_cur[at] = cv[i];
            stash_snap[at] = sv[i];
            stash_at |= at << (8 * i);
            // The whole vector (its unchanged elements equal the snapshot's already), or
            // element by element at a tensor's ragged end.
            if (vec && off + 16 <= T.nbytes) {
                *(uint4*)(snap_w + off) = cv[i];
            } else {
                for (u32 m = nz; m; m &= m - 1) {
                    const u32 e = (__ffs(m) - 1) / BITS;
                    dc_store_bits(snap_w, off / W + e, W, dc_extract(cv[i], e, W));
                }
            }
        }
        stashed += __popc(has);
    }

    // Phase 2: the warps' escape counts scanned; the tile's counts into its cell; its place
    // in the escapes by the look-back.
    const u64 warp_changed = dc_warp_sum(changed);
    if (lane == 0) s_warp_changed[warp] = (u32)warp_changed;  // read after the scan's sync
    u64 incl[DIFF_PACKS], warp_excl[DIFF_PACKS], rows[DIFF_PACKS];
    const u32 tile_escapes = dc_tile_scan(packed, incl, warp_excl, rows, s_warp_tot);
    u32 tile_changed = 0;
#pragma unroll
    for (u32 k = 0; k < DIFF_THREADS / 32; ++k) tile_changed += s_warp_changed[k];
    if (threadIdx.x == 0) {
        const u64 cell = S.cell0 + byte0 / W / cell_elems;
        if (tile_changed) atomicAdd(&cells[2 * cell], tile_changed);
        if (tile_escapes) atomicAdd(&cells[2 * cell + 1], tile_escapes);
    }
    const u64 before = dc_diff_lookback(status, tile, tile_escapes);
    // Escapes past the capacity: nothing of the tile's escapes or digest is written.
    if (before + tile_escapes > capacity || tile_changed == 0) return;  // uniform

    // Phase 3, item by item: each lane lists its changes in the warp's list (element order),
    // then the warp's lanes take them 32 at a time, so that the work per change (the two
    // element hashes, the escape's store) is spread evenly and the stores are coalesced.
    u64 dsum = 0;
    u32 row_base = 0;
#pragma unroll
    for (u32 i = 0; i < DIFF_ITEMS; ++i) {
        const u32 p = i / 4, f = 16 * (i % 4);
        const u64 esc0 = before + row_base + ((warp_excl[p] >> f) & 0xffffu);
        row_base += (u32)(rows[p] >> f) & 0xffffu;
        const u32 c = codes[i];
        const u32 nz = dc_map_changed<BITS>(c);
        u32 first = __popc(nz);  // this lane's first place in the list, once scanned
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u32 n = __shfl_up_sync(DC_FULL_MASK, first, o);
            if (lane >= (u32)o) first += n;
        }
        const u32 listed = __shfl_sync(DC_FULL_MASK, first, 31);
        first -= __popc(nz);
        if (listed == 0) continue;  // uniform in the warp
        // Entry: bit 9 escaped, bits 4-8 the lane, bits 0-3 the element of its vector.
        for (u32 m = nz, k = first; m; m &= m - 1, ++k) {
            const u32 bit = __ffs(m) - 1;
            const u32 esc = BITS == 1 || ((c >> bit) & 3u) == 3u;
            list[k] = (u16)(esc << 9 | lane << 4 | bit / BITS);
        }
        __syncwarp();
        u64 esc_at = esc0;
        for (u32 j0 = 0; j0 < listed; j0 += 32) {
            const u32 j = j0 + lane;
            const bool live = j < listed;
            const u32 entry = live ? list[j] : 0;
            const u32 src = (entry >> 4) & 31u, e = entry & 15u;
            const bool esc = live && (entry >> 9) != 0;
            const u32 at = (__shfl_sync(DC_FULL_MASK, stash_at, src) >> (8 * i)) & 0xffu;
            const u32 escs = __ballot_sync(DC_FULL_MASK, esc);
            if (live) {
                const u32 nb = dc_load_bits((const u8*)(stash_cur + at), e, W);
                if (esc) dc_store_bits(esc_out, esc_at + __popc(escs & lanes_below), W, nb);
                if (T.digest_out) {
                    const u32 ob = dc_load_bits((const u8*)(stash_snap + at), e, W);
                    const u64 vec_i = (u64)i * DIFF_THREADS + warp * 32 + src;
                    const u64 index = T.first_index + (byte0 + vec_i * 16) / W + e;
                    dsum += dc_element_hash(T.salt, index, nb) - dc_element_hash(T.salt, index, ob);
                }
            }
            esc_at += __popc(escs);
        }
        __syncwarp();  // the list is written again by the next item
    }
    if (T.digest_out) dc_diff_digest_add(dsum, s_digest, T.digest_out);  // uniform
}

template <u32 BITS>
__device__ __forceinline__ void dc_map_diff(const DiffTensor* __restrict__ tensors,
                                            const StepsTensor* __restrict__ steps,
                                            const u32* __restrict__ tile_tensor,
                                            u64* __restrict__ status, u64 capacity,
                                            u8* __restrict__ esc_out, u32* __restrict__ cells,
                                            u64 cell_elems) {
    __shared__ uint4 s_stash[2 * DIFF_THREADS * DIFF_ITEMS];
    __shared__ u16 s_list[DIFF_THREADS / 32 * MAP_LIST];
    const MapShared sh{s_stash, s_list};
    const u32 w = tensors[tile_tensor[blockIdx.x]].width;
    if (w == 2)
        dc_map_tile<2, BITS>(tensors, steps, tile_tensor, status, capacity, esc_out, cells,
                             cell_elems, sh);
    else if (w == 4)
        dc_map_tile<4, BITS>(tensors, steps, tile_tensor, status, capacity, esc_out, cells,
                             cell_elems, sh);
    else
        dc_map_tile<1, BITS>(tensors, steps, tile_tensor, status, capacity, esc_out, cells,
                             cell_elems, sh);
}

extern "C" __global__ void __launch_bounds__(DIFF_THREADS, DIFF_MINBLOCKS)
dc_diff_steps(const DiffTensor* __restrict__ tensors, const StepsTensor* __restrict__ steps,
              const u32* __restrict__ tile_tensor, u64* __restrict__ status, u64 capacity,
              u8* __restrict__ esc_out, u32* __restrict__ cells, u64 cell_elems) {
    dc_map_diff<2>(tensors, steps, tile_tensor, status, capacity, esc_out, cells, cell_elems);
}

extern "C" __global__ void __launch_bounds__(DIFF_THREADS, DIFF_MINBLOCKS)
dc_diff_bitmap(const DiffTensor* __restrict__ tensors, const StepsTensor* __restrict__ steps,
               const u32* __restrict__ tile_tensor, u64* __restrict__ status, u64 capacity,
               u8* __restrict__ esc_out, u32* __restrict__ cells, u64 cell_elems) {
    dc_map_diff<1>(tensors, steps, tile_tensor, status, capacity, esc_out, cells, cell_elems);
}
