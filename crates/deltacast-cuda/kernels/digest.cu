// State digest (docs/wire-format.md): D = Σ_i h(salt, i, bits_i) mod 2^64.
//
//   dc_digest         full digest of many tensors (or pieces of slots) in one launch: each block
//                     sums the terms of DIGEST_BLOCK_ELEMS elements of one tensor and adds the
//                     sum to that tensor's output word (wrapping adds commute, so the result is
//                     the same whatever the order).
//   dc_digest_update  the O(changed) update: Σ h(i, new) − h(i, old) over change lists laid out
//                     as dc_diff writes them (positions u64, bits at byte g * width).
//   dc_digest_refresh dc_digest that also brings a snapshot up to date and counts the elements
//                     that differed from it: what a stage sent whole without a diff needs (its
//                     digests, its snapshot refreshed, and its density for the next sync's
//                     choice), in one pass instead of a copy and a digest.
//   dc_count_sampled  counts the elements that differ from the snapshot in every `every`-th
//                     block only, writing nothing: a sender's estimate of a stage's density
//                     when it has no count yet (the first delta after a seed), for the price of
//                     reading a fraction of the bytes.

#define DIGEST_THREADS 256
#define DIGEST_PER_THREAD 32
#define DIGEST_BLOCK_ELEMS (DIGEST_THREADS * DIGEST_PER_THREAD)

struct DigestTensor {
    u64 ptr;          // device pointer to the elements (fp32 when `convert`)
    u64 numel;
    u64 first_index;  // slot index of element 0
    u64 salt;
    u64 block_begin;  // first global block of this tensor
    u64 out;          // device pointer to the u64 that receives the sum
    u32 width;        // of the digested (and refreshed) bits: 2 when `convert`
    u32 convert;      // 0, or DC_FROM_F32 | nan: digest the fp32 elements rounded to bf16
};

// dc_digest_refresh's tensor: a DigestTensor plus its snapshot and its changed count.
struct RefreshTensor {
    DigestTensor t;
    u64 snap;         // device pointer to the snapshot (numel * width bytes), written
    u64 changed_out;  // device pointer to the u64 that receives the changed count
};

struct UpdateSeg {
    u64 chg_off;      // changes [chg_off, chg_off + chg_cnt) of pos/new/old
    u64 chg_cnt;
    u64 salt;
    u64 block_begin;  // first global block of this segment
    u64 out;          // device pointer to the u64 that receives the change
    u32 width;
    u32 pad;
};

// Largest j < n with table[j].BEGIN <= b (table[0].BEGIN == 0).
#define DC_FIND(table, BEGIN, n, b, result)            \
    do {                                               \
        u32 lo_ = 0, hi_ = (n);                        \
        while (hi_ - lo_ > 1) {                        \
            const u32 mid_ = (lo_ + hi_) >> 1;         \
            if ((table)[mid_].BEGIN <= (b)) lo_ = mid_; \
            else hi_ = mid_;                           \
        }                                              \
        (result) = lo_;                                \
    } while (0)

extern "C" __global__ void __launch_bounds__(DIGEST_THREADS)
dc_digest(const DigestTensor* __restrict__ tensors, u32 num_tensors, u64 num_blocks) {
    __shared__ u64 s_sum[32];
    __shared__ u32 s_j;
    for (u64 b = blockIdx.x; b < num_blocks; b += gridDim.x) {
        if (threadIdx.x == 0) {
            u32 j;
            DC_FIND(tensors, block_begin, num_tensors, b, j);
            s_j = j;
        }
        __syncthreads();
        const DigestTensor t = tensors[s_j];
        const u64 e0 = (b - t.block_begin) * DIGEST_BLOCK_ELEMS;
        const u8* p = (const u8*)t.ptr;
        u64 sum = 0;
#pragma unroll 8
        for (u32 i = 0; i < DIGEST_PER_THREAD; ++i) {
            const u64 e = e0 + (u64)i * DIGEST_THREADS + threadIdx.x;
            if (e < t.numel)
                sum += dc_element_hash(t.salt, t.first_index + e,
                                       dc_load_source(p, e, t.width, t.convert));
        }
        const u64 total = dc_block_sum(sum, s_sum);
        if (threadIdx.x == 0) atomicAdd((u64*)t.out, total);
        __syncthreads();
    }
}

extern "C" __global__ void __launch_bounds__(DIGEST_THREADS)
dc_digest_update(const UpdateSeg* __restrict__ segs, u32 num_segs, u64 num_blocks,
                 const u64* __restrict__ pos, const u8* __restrict__ new_bits,
                 const u8* __restrict__ old_bits) {
    __shared__ u64 s_sum[32];
    __shared__ u32 s_j;
    for (u64 b = blockIdx.x; b < num_blocks; b += gridDim.x) {
        if (threadIdx.x == 0) {
            u32 j;
            DC_FIND(segs, block_begin, num_segs, b, j);
            s_j = j;
        }
        __syncthreads();
        const UpdateSeg s = segs[s_j];
        const u64 k0 = (b - s.block_begin) * DIGEST_BLOCK_ELEMS;
        u64 sum = 0;
        for (u32 i = 0; i < DIGEST_PER_THREAD; ++i) {
            const u64 k = k0 + (u64)i * DIGEST_THREADS + threadIdx.x;
            if (k < s.chg_cnt) {
                const u64 g = s.chg_off + k;
                const u64 index = pos[g];
                sum += dc_element_hash(s.salt, index, dc_load_bits(new_bits, g, s.width)) -
                       dc_element_hash(s.salt, index, dc_load_bits(old_bits, g, s.width));
            }
        }
        const u64 total = dc_block_sum(sum, s_sum);
        if (threadIdx.x == 0) atomicAdd((u64*)s.out, total);
        __syncthreads();
    }
}

extern "C" __global__ void __launch_bounds__(DIGEST_THREADS)
dc_digest_refresh(const RefreshTensor* __restrict__ tensors, u32 num_tensors, u64 num_blocks) {
    __shared__ u64 s_sum[32];
    __shared__ u32 s_j;
    for (u64 b = blockIdx.x; b < num_blocks; b += gridDim.x) {
        if (threadIdx.x == 0) {
            u32 j;
            DC_FIND(tensors, t.block_begin, num_tensors, b, j);
            s_j = j;
        }
        __syncthreads();
        const RefreshTensor r = tensors[s_j];
        const DigestTensor t = r.t;
        const u64 e0 = (b - t.block_begin) * DIGEST_BLOCK_ELEMS;
        const u8* p = (const u8*)t.ptr;
        u8* snap = (u8*)r.snap;
        u64 sum = 0, changed = 0;
#pragma unroll 8
        for (u32 i = 0; i < DIGEST_PER_THREAD; ++i) {
            const u64 e = e0 + (u64)i * DIGEST_THREADS + threadIdx.x;
            if (e < t.numel) {
                const u32 bits = dc_load_source(p, e, t.width, t.convert);
                sum += dc_element_hash(t.salt, t.first_index + e, bits);
                if (dc_load_bits(snap, e, t.width) != bits) {
                    ++changed;
                    dc_store_bits(snap, e, t.width, bits);
                }
            }
        }
        const u64 total = dc_block_sum(sum, s_sum);
        const u64 count = dc_block_sum(changed, s_sum);
        if (threadIdx.x == 0) {
            atomicAdd((u64*)t.out, total);
            if (count) atomicAdd((u64*)r.changed_out, count);
        }
        __syncthreads();
    }
}

extern "C" __global__ void __launch_bounds__(DIGEST_THREADS)
dc_count_sampled(const RefreshTensor* __restrict__ tensors, u32 num_tensors, u64 num_blocks,
                 u64 every) {
    // Per tensor: t.out receives the elements sampled, changed_out those that differ.
    __shared__ u64 s_sum[32];
    __shared__ u32 s_j;
    const u64 sampled_blocks = (num_blocks + every - 1) / every;
    for (u64 sb = blockIdx.x; sb < sampled_blocks; sb += gridDim.x) {
        const u64 b = sb * every;
        if (threadIdx.x == 0) {
            u32 j;
            DC_FIND(tensors, t.block_begin, num_tensors, b, j);
            s_j = j;
        }
        __syncthreads();
        const RefreshTensor r = tensors[s_j];
        const DigestTensor t = r.t;
        const u64 e0 = (b - t.block_begin) * DIGEST_BLOCK_ELEMS;
        const u8* p = (const u8*)t.ptr;
        const u8* snap = (const u8*)r.snap;
        u64 changed = 0;
#pragma unroll 8
        for (u32 i = 0; i < DIGEST_PER_THREAD; ++i) {
            const u64 e = e0 + (u64)i * DIGEST_THREADS + threadIdx.x;
            if (e < t.numel && dc_load_bits(snap, e, t.width) != dc_load_source(p, e, t.width, t.convert))
                ++changed;
        }
        const u64 count = dc_block_sum(changed, s_sum);
        if (threadIdx.x == 0) {
            const u64 left = t.numel - e0;
            atomicAdd((u64*)t.out, left < DIGEST_BLOCK_ELEMS ? left : (u64)DIGEST_BLOCK_ELEMS);
            if (count) atomicAdd((u64*)r.changed_out, count);
        }
        __syncthreads();
    }
}
