// Receiver side: decode + verify, then scatter, of chunks whose sections sit in device memory
// (a received frame copied to the GPU, or sections assembled there). Position codecs: all,
// abs32, bitmap with raw values; steps with its escapes (or raw values: an undo). Two
// launches, as deltacast::Receiver does it on the CPU:
//
//   dc_apply_check    decodes every chunk, checks what the CPU decoders check on the section's
//                     contents (abs32: each position < range and strictly increasing; bitmap: no
//                     set bit at or past range, exactly `count` set bits; delta: no element set
//                     to the bits it already holds), and adds the chunk's digest change
//                     (delta: Σ h(new) − h(old) from the bits held; seed: Σ h(new)) to its slot.
//                     Writes nothing to the slots.
//   dc_apply_scatter  writes the new bits; the host launches it only when every chunk checked
//                     clean and the digests matched the sender's, so the state never ends
//                     half way between two versions. With a journal it first saves the bits
//                     it overwrites (a staged sync's undo scatters them back).
//
// Header-level checks (section lengths, count <= range, chunk inside its slot, pointer alignment)
// are the host's (see src/gpu.rs) and happen before the launch: the kernels never read or write
// outside what those bounds allow.

#define APPLY_THREADS 256
#define APPLY_BATCH 4

#define ERR_OUT_OF_RANGE 1u
#define ERR_NOT_SORTED 2u
#define ERR_BITMAP_COUNT 3u
#define ERR_UNCHANGED 4u
#define ERR_ESCAPES 6u

struct ApplyChunk {
    u64 dst;        // device pointer to the slot's bytes
    u64 pos;        // position section (abs32: u32 LE, 4-byte aligned; bitmap: bytes, 4-byte aligned)
    u64 val;        // raw values section, aligned to the width
    u64 start;      // first element of the chunk (slot index)
    u64 range;      // elements in the chunk
    u64 count;      // changes in the chunk
    u64 salt;       // digest salt of the slot
    u32 width;      // 1, 2 or 4
    u32 pos_codec;  // 0 all, 1 abs32, 3 bitmap, 6 steps
    u32 slot;       // index into digest_delta
    u32 seed;       // 1: seed chunk (digest Σ h(new)); 0: delta chunk
    u64 k_begin;    // the changes this entry covers: [k_begin, k_end) of the chunk's; the host
    u64 k_end;      // splits all/abs32 chunks into several entries (bitmap: always whole)
    u64 journal;    // scatter: 0, or where the k-th change's old bits are saved (raw layout),
                    // so that a staged sync can undo an applied stage
    u64 escapes;    // steps: the escaped values in `val` (its length / width)
    u32 val_raw;    // steps: `val` holds every change's new bits raw (an undo), not escapes
    u32 pad;
};

__device__ __forceinline__ void dc_flag(u32* err, u32 code) { atomicCAS(err, 0u, code); }

// Calls f(k, rel) for every change k of the chunk (k-th value, position rel relative to start),
// each exactly once, in any order across threads; invalid entries are flagged in *err and skipped.
// Every thread of the block must call it (the bitmap path scans across the block).
template <class F>
__device__ __forceinline__ void dc_for_each(const ApplyChunk& c, u32* scan_scratch, u32* err, F f) {
    if (c.pos_codec == 0) {
        for (u64 k = c.k_begin + threadIdx.x; k < c.k_end; k += blockDim.x) f(k, k);
    } else if (c.pos_codec == 1) {
        const u32* p = (const u32*)c.pos;
        for (u64 k = c.k_begin + threadIdx.x; k < c.k_end; k += blockDim.x) {
            const u32 r = p[k];
            if (r >= c.range) { dc_flag(err, ERR_OUT_OF_RANGE); continue; }
            if (k > 0 && p[k - 1] >= r) { dc_flag(err, ERR_NOT_SORTED); continue; }
            f(k, (u64)r);
        }
    } else {
        // Bitmap: a round reads one word (32 elements) per thread and scans their counts
        // across the block; each thread lists its word's set bits in shared memory at its
        // prefix, and then the block takes the round's changes in order, thread t the changes
        // t, t + blockDim, ...: every lane busy, a warp's values and slot bits side by side.
        // (Each thread walking its own word's bits instead left lanes idle as words ran out,
        // and put a warp's accesses 32 elements apart.)
        __shared__ u16 s_list[APPLY_THREADS * 32];
        bool stray = false;
        const u64 listed = dc_bitmap_rounds(
            (const u8*)c.pos, c.range, scan_scratch, &stray,
            [&](u64 wi, u32 word, u32 j, u32 total, u64 base) {
                while (word) {
                    s_list[j++] = (u16)(threadIdx.x * 32 + __ffs(word) - 1);
                    word &= word - 1;
                }
                __syncthreads();
                const u64 w0 = wi - threadIdx.x;
                for (u32 i = threadIdx.x; i < total; i += blockDim.x) {
                    const u64 k = base + i;
                    if (k < c.count) f(k, w0 * 32 + s_list[i]);
                }
            });
        if (stray) dc_flag(err, ERR_OUT_OF_RANGE);
        if (threadIdx.x == 0 && listed != c.count) dc_flag(err, ERR_BITMAP_COUNT);
    }
}

// A steps chunk (docs/codecs.md, "steps + esc"), by one block, as the bitmap path: a round
// reads one u32 of the map (16 elements) per thread, scans the counts of changes and escapes
// across the block (two 16-bit fields: at most 16 each per thread), each thread lists its
// word's changes in shared memory at its prefix (element in the round, code, escape rank),
// and then the block takes the round's changes in order, thread t the changes t, t + blockDim,
// ...: every lane busy, a warp's elements side by side. (Each thread walking its own word's
// changes left most lanes idle as the words ran out: its 16 elements hold 0 to 16 changes.)
// CHECK adds the digest change and flags errors; otherwise the new bits are written
// (journaled first when asked).
template <bool CHECK>
__device__ __forceinline__ void dc_steps_walk(const ApplyChunk& c, u32* scan_scratch, u32* err,
                                              u64* sum) {
    // Per change: its element in the round (12 bits), code (2 bits), escape rank in the
    // round (16 bits).
    __shared__ u32 s_steps[APPLY_THREADS * 16];
    const u8* map = (const u8*)c.pos;
    const u8* val = (const u8*)c.val;
    u8* dst = (u8*)c.dst;
    const u32 w = c.width;
    const u64 nbytes = (c.range + 3) >> 2;
    const u64 nwords = (nbytes + 3) >> 2;
    u64 base_k = 0, base_e = 0;
    for (u64 w0 = 0; w0 < nwords; w0 += blockDim.x) {
        const u64 wi = w0 + threadIdx.x;
        u32 word = 0;
        if (wi < nwords) {
            bool stray;
            word = dc_map_word(map, nbytes, c.range, wi, 2, &stray);
            if (stray) dc_flag(err, ERR_OUT_OF_RANGE);
        }
        u32 nz = (word | (word >> 1)) & 0x55555555u;
        const u32 es = word & (word >> 1) & 0x55555555u;
        u32 total;
        // The scan starts with a barrier: every thread is done reading the last round's list
        // before it is overwritten below.
        const u32 ex = dc_block_exclusive_scan((u32)__popc(nz) | (u32)__popc(es) << 16,
                                               scan_scratch, &total);
        u32 at = ex & 0xffffu, esc = ex >> 16;
        while (nz) {
            const u32 bit = __ffs(nz) - 1;
            nz &= nz - 1;
            const u32 code = (word >> bit) & 3u;
            s_steps[at++] = (threadIdx.x * 16 + (bit >> 1)) | code << 12 | esc << 16;
            esc += code == 3u;
        }
        __syncthreads();
        const u32 changes = total & 0xffffu;
        for (u32 i = threadIdx.x; i < changes; i += blockDim.x) {
            const u32 entry = s_steps[i];
            const u32 code = (entry >> 12) & 3u;
            const u64 k = base_k + i;
            const u64 e = base_e + (entry >> 16);
            const u64 index = c.start + w0 * 16 + (entry & 0xfffu);
            const u32 ob = dc_load_bits(dst, index, w);
            u32 nb;
            bool ok = k < c.count;
            if (c.val_raw) {
                nb = ok ? dc_load_bits(val, k, w) : ob;
            } else if (code == 3u) {
                ok = ok && e < c.escapes;
                nb = e < c.escapes ? dc_load_bits(val, e, w) : ob;
            } else {
                nb = dc_step_apply(ob, code, w);
            }
            if (CHECK) {
                if (ok && nb == ob) dc_flag(err, ERR_UNCHANGED);
                if (ok) *sum += dc_element_hash(c.salt, index, nb) - dc_element_hash(c.salt, index, ob);
            } else if (ok) {
                if (c.journal) dc_store_bits((u8*)c.journal, k, w, ob);
                dc_store_bits(dst, index, w, nb);
            }
        }
        base_k += changes;
        base_e += total >> 16;
    }
    if (CHECK && threadIdx.x == 0) {
        if (base_k != c.count) dc_flag(err, ERR_BITMAP_COUNT);
        if (!c.val_raw && base_e != c.escapes) dc_flag(err, ERR_ESCAPES);
    }
}

extern "C" __global__ void __launch_bounds__(APPLY_THREADS)
dc_apply_check(const ApplyChunk* __restrict__ chunks, u64 num_chunks, u32* __restrict__ errors,
               u64* __restrict__ digest_delta) {
    __shared__ u32 s_scan[32];
    __shared__ u64 s_sum[32];
    for (u64 ci = blockIdx.x; ci < num_chunks; ci += gridDim.x) {
        const ApplyChunk c = chunks[ci];
        u32* err = &errors[ci];
        const u8* dst = (const u8*)c.dst;
        const u8* val = (const u8*)c.val;
        u64 sum = 0;
        if (c.pos_codec == 6) {
            dc_steps_walk<true>(c, s_scan, err, &sum);
        } else if (c.pos_codec == 1) {
            // abs32, batched: every load of APPLY_BATCH changes is issued before any is used
            // (the old bits are scattered reads; one at a time would leave the bus idle).
            const u32* p = (const u32*)c.pos;
            const u64 stride = blockDim.x;
            for (u64 k0 = c.k_begin + threadIdx.x; k0 < c.k_end; k0 += APPLY_BATCH * stride) {
                u32 r[APPLY_BATCH], prev[APPLY_BATCH], nb[APPLY_BATCH], ob[APPLY_BATCH];
#pragma unroll
                for (u32 j = 0; j < APPLY_BATCH; ++j) {
                    const u64 k = k0 + j * stride;
                    const bool in = k < c.k_end;
                    r[j] = in ? p[k] : 0;
                    prev[j] = in && k > 0 ? p[k - 1] : 0;
                    nb[j] = in ? dc_load_bits(val, k, c.width) : 0;
                }
#pragma unroll
                for (u32 j = 0; j < APPLY_BATCH; ++j) {
                    const u64 k = k0 + j * stride;
                    ob[j] = (!c.seed && k < c.k_end && r[j] < c.range)
                                ? dc_load_bits(dst, c.start + r[j], c.width) : 0;
                }
#pragma unroll
                for (u32 j = 0; j < APPLY_BATCH; ++j) {
                    const u64 k = k0 + j * stride;
                    if (k >= c.k_end) continue;
                    if (r[j] >= c.range) { dc_flag(err, ERR_OUT_OF_RANGE); continue; }
                    if (k > 0 && prev[j] >= r[j]) { dc_flag(err, ERR_NOT_SORTED); continue; }
                    const u64 index = c.start + r[j];
                    if (c.seed) {
                        sum += dc_element_hash(c.salt, index, nb[j]);
                    } else {
                        if (ob[j] == nb[j]) dc_flag(err, ERR_UNCHANGED);
                        sum += dc_element_hash(c.salt, index, nb[j]) - dc_element_hash(c.salt, index, ob[j]);
                    }
                }
            }
        } else dc_for_each(c, s_scan, err, [&](u64 k, u64 rel) {
            const u64 index = c.start + rel;
            const u32 nb = dc_load_bits(val, k, c.width);
            if (c.seed) {
                sum += dc_element_hash(c.salt, index, nb);
            } else {
                const u32 ob = dc_load_bits(dst, index, c.width);
                if (ob == nb) dc_flag(err, ERR_UNCHANGED);
                sum += dc_element_hash(c.salt, index, nb) - dc_element_hash(c.salt, index, ob);
            }
        });
        const u64 total = dc_block_sum(sum, s_sum);
        if (threadIdx.x == 0) atomicAdd(&digest_delta[c.slot], total);
        __syncthreads();
    }
}

extern "C" __global__ void __launch_bounds__(APPLY_THREADS)
dc_apply_scatter(const ApplyChunk* __restrict__ chunks, u64 num_chunks, u32* __restrict__ errors) {
    __shared__ u32 s_scan[32];
    for (u64 ci = blockIdx.x; ci < num_chunks; ci += gridDim.x) {
        const ApplyChunk c = chunks[ci];
        u8* dst = (u8*)c.dst;
        const u8* val = (const u8*)c.val;
        if (c.pos_codec == 6) {
            dc_steps_walk<false>(c, s_scan, &errors[ci], nullptr);
        } else if (c.pos_codec == 1) {
            // abs32, batched as in the check (which has already validated every position).
            const u32* p = (const u32*)c.pos;
            const u64 stride = blockDim.x;
            for (u64 k0 = c.k_begin + threadIdx.x; k0 < c.k_end; k0 += APPLY_BATCH * stride) {
                u32 r[APPLY_BATCH], nb[APPLY_BATCH];
#pragma unroll
                for (u32 j = 0; j < APPLY_BATCH; ++j) {
                    const u64 k = k0 + j * stride;
                    r[j] = k < c.k_end ? p[k] : 0;
                    nb[j] = k < c.k_end ? dc_load_bits(val, k, c.width) : 0;
                }
                if (c.journal) {
                    u32 ob[APPLY_BATCH];
#pragma unroll
                    for (u32 j = 0; j < APPLY_BATCH; ++j) {
                        const u64 k = k0 + j * stride;
                        ob[j] = (k < c.k_end && r[j] < c.range) ? dc_load_bits(dst, c.start + r[j], c.width) : 0;
                    }
#pragma unroll
                    for (u32 j = 0; j < APPLY_BATCH; ++j) {
                        const u64 k = k0 + j * stride;
                        if (k < c.k_end && r[j] < c.range) dc_store_bits((u8*)c.journal, k, c.width, ob[j]);
                    }
                }
#pragma unroll
                for (u32 j = 0; j < APPLY_BATCH; ++j) {
                    const u64 k = k0 + j * stride;
                    if (k < c.k_end && r[j] < c.range) dc_store_bits(dst, c.start + r[j], c.width, nb[j]);
                }
            }
        } else dc_for_each(c, s_scan, &errors[ci], [&](u64 k, u64 rel) {
            if (c.journal) dc_store_bits((u8*)c.journal, k, c.width, dc_load_bits(dst, c.start + rel, c.width));
            dc_store_bits(dst, c.start + rel, c.width, dc_load_bits(val, k, c.width));
        });
        __syncthreads();
    }
}
