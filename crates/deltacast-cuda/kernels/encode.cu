// Position encoders on a chunk grid, in the core's exact byte format.
//
// The core (flush::encode_changes) groups a slot's sorted positions by grid cell
// (cell = position / chunk_elems); each non-empty cell is one chunk whose range is tightened to
// its changes: start = first position, range = last − first + 1, and positions are stored
// relative to start. One block per cell (grid-stride):
//   - finds the cell's changes in the sorted positions (two binary searches),
//   - writes the chunk (lo, count, start, range),
//   - abs32: writes rel = position − start as a little-endian u32 at abs32_out[k] (the chunk's
//     section is then abs32_out[lo .. lo + count], contiguous),
//   - bitmap: sets bit rel (LSB first within each byte) of the cell's bitmap at
//     bitmap_out + bitmap_off; the host zeroes the buffer first and places each cell's bitmap
//     at an 8-byte aligned offset sized for the whole cell, so the section is the first
//     ceil(range / 8) bytes there (bits past range stay zero).

struct EncodeCell {
    u64 begin;       // first slot index of the cell (clamped to the tensor)
    u64 end;         // one past the last
    u64 chg_off;     // the tensor's changes: pos[chg_off .. chg_off + chg_cnt), sorted
    u64 chg_cnt;
    u64 bitmap_off;  // byte offset of this cell's bitmap in bitmap_out (multiple of 8)
};

struct EncodedCell {
    u64 lo;     // index of the chunk's first change in pos[]
    u64 count;  // changes in the chunk (0: no chunk)
    u64 start;  // chunk start (slot index of its first change)
    u64 range;  // last − first + 1
};

__device__ __forceinline__ u64 dc_lower_bound(const u64* p, u64 n, u64 key) {
    u64 lo = 0, hi = n;
    while (lo < hi) {
        const u64 mid = (lo + hi) >> 1;
        if (p[mid] < key) lo = mid + 1; else hi = mid;
    }
    return lo;
}

extern "C" __global__ void dc_encode_cells(const EncodeCell* __restrict__ cells, u64 num_cells,
                                           const u64* __restrict__ pos, EncodedCell* __restrict__ out,
                                           u32* __restrict__ abs32_out, u8* __restrict__ bitmap_out) {
    __shared__ u64 s_lo, s_hi, s_start;
    for (u64 c = blockIdx.x; c < num_cells; c += gridDim.x) {
        const EncodeCell cell = cells[c];
        if (threadIdx.x == 0) {
            const u64* p = pos + cell.chg_off;
            const u64 lo = dc_lower_bound(p, cell.chg_cnt, cell.begin);
            const u64 hi = dc_lower_bound(p, cell.chg_cnt, cell.end);
            const u64 count = hi - lo;
            const u64 start = count ? p[lo] : 0;
            EncodedCell r;
            r.lo = cell.chg_off + lo;
            r.count = count;
            r.start = start;
            r.range = count ? p[hi - 1] - start + 1 : 0;
            out[c] = r;
            s_lo = cell.chg_off + lo;
            s_hi = cell.chg_off + hi;
            s_start = start;
        }
        __syncthreads();
        const u64 lo = s_lo, hi = s_hi, start = s_start;
        u32* bm = bitmap_out ? (u32*)(bitmap_out + cell.bitmap_off) : 0;
        for (u64 k = lo + threadIdx.x; k < hi; k += blockDim.x) {
            const u32 rel = (u32)(pos[k] - start);
            if (abs32_out) abs32_out[k] = rel;
            if (bm) atomicOr(&bm[rel >> 5], 1u << (rel & 31));
        }
        __syncthreads();  // shared values are rewritten for the next cell
    }
}

// Writes each chunk's chosen position section straight into the packed positions of a GPU
// sync (after a counting run of dc_encode_cells with no outputs gave lo, count, start, range):
// abs32 (codec 1) as u32 relative positions, bitmap (codec 3) as ceil(range / 32) u32 words,
// zeroed first by the same block. One block per chunk, grid-stride.
struct PlaceCell {
    u64 lo;     // index of the chunk's first change in pos[]
    u64 count;
    u64 start;
    u64 range;
    u64 dst;    // 4-byte aligned, room for the section rounded up to whole u32 words
    u32 codec;  // 1 abs32, 3 bitmap
    u32 pad;
};

extern "C" __global__ void dc_encode_place(const PlaceCell* __restrict__ cells, u64 num_cells,
                                           const u64* __restrict__ pos) {
    for (u64 c = blockIdx.x; c < num_cells; c += gridDim.x) {
        const PlaceCell p = cells[c];
        u32* out = (u32*)p.dst;
        if (p.codec == 3) {
            const u64 words = (p.range + 31) >> 5;
            for (u64 k = threadIdx.x; k < words; k += blockDim.x) out[k] = 0;
            __syncthreads();
            for (u64 k = threadIdx.x; k < p.count; k += blockDim.x) {
                const u32 rel = (u32)(pos[p.lo + k] - p.start);
                atomicOr(&out[rel >> 5], 1u << (rel & 31));
            }
        } else {
            for (u64 k = threadIdx.x; k < p.count; k += blockDim.x)
                out[k] = (u32)(pos[p.lo + k] - p.start);
        }
        __syncthreads();  // the next chunk's zeroing must not race this one's bits
    }
}
