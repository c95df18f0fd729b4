// Bandwidth probes for examples/bandwidth_probe.rs: what a stream over one or two arrays
// reaches on this GPU, to tell the diff kernel's own costs from the memory system's.
typedef unsigned long long u64;
typedef unsigned int u32;

__device__ __forceinline__ u32 halves_changed(uint4 a, uint4 b) {
    u32 n = 0;
    const u32 x[4] = {a.x ^ b.x, a.y ^ b.y, a.z ^ b.z, a.w ^ b.w};
#pragma unroll
    for (int k = 0; k < 4; ++k) n += ((x[k] & 0xffffu) != 0) + ((x[k] >> 16) != 0);
    return n;
}

__device__ __forceinline__ void add_block(u64 v, u64* out) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0 && v) atomicAdd(out, v);
}

// One array, grid-stride, ITEMS vectors in flight per thread: the read roofline.
template <int ITEMS>
__device__ void read1(const uint4* a, u64 nvec, u64* out) {
    u64 acc = 0;
    const u64 step = (u64)gridDim.x * blockDim.x * ITEMS;
    for (u64 base = (u64)blockIdx.x * blockDim.x * ITEMS + threadIdx.x; base < nvec; base += step) {
        uint4 v[ITEMS];
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            const u64 j = base + (u64)i * blockDim.x;
            v[i] = j < nvec ? __ldcs(a + j) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) acc += (v[i].x ^ v[i].y ^ v[i].z ^ v[i].w) == 0x12345u;
    }
    add_block(acc, out);
}
extern "C" __global__ void p_read1_4(const uint4* a, u64 nvec, u64* out) { read1<4>(a, nvec, out); }
extern "C" __global__ void p_read1_8(const uint4* a, u64 nvec, u64* out) { read1<8>(a, nvec, out); }

// Two arrays compared, grid-stride: a count-only diff.
template <int ITEMS>
__device__ void cmp_gs(const uint4* a, const uint4* b, u64 nvec, u64* out) {
    u64 acc = 0;
    const u64 step = (u64)gridDim.x * blockDim.x * ITEMS;
    for (u64 base = (u64)blockIdx.x * blockDim.x * ITEMS + threadIdx.x; base < nvec; base += step) {
        uint4 x[ITEMS], y[ITEMS];
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) {
            const u64 j = base + (u64)i * blockDim.x;
            x[i] = j < nvec ? __ldcs(a + j) : make_uint4(0, 0, 0, 0);
            y[i] = j < nvec ? __ldcs(b + j) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int i = 0; i < ITEMS; ++i) acc += halves_changed(x[i], y[i]);
    }
    add_block(acc, out);
}
extern "C" __global__ void p_cmp_gs2(const uint4* a, const uint4* b, u64 n, u64* out) { cmp_gs<2>(a, b, n, out); }
extern "C" __global__ void p_cmp_gs4(const uint4* a, const uint4* b, u64 n, u64* out) { cmp_gs<4>(a, b, n, out); }
extern "C" __global__ void p_cmp_gs8(const uint4* a, const uint4* b, u64 n, u64* out) { cmp_gs<8>(a, b, n, out); }

// Two arrays, this block's tile of 256 * 4 vectors, no loop (the diff's launch shape).
__device__ void cmp_tile(const uint4* a, const uint4* b, u64 nvec, u64* out, u64 acc) {
    const u64 base = (u64)blockIdx.x * blockDim.x * 4 + threadIdx.x;
    uint4 x[4], y[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        const u64 j = base + (u64)i * blockDim.x;
        x[i] = j < nvec ? __ldcs(a + j) : make_uint4(0, 0, 0, 0);
        y[i] = j < nvec ? __ldcs(b + j) : make_uint4(0, 0, 0, 0);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) acc += halves_changed(x[i], y[i]);
    add_block(acc, out);
}

extern "C" __global__ void p_cmp_tile(const uint4* a, const uint4* b, u64 nvec, u64* out) {
    cmp_tile(a, b, nvec, out, 0);
}

// The same after a dependent global load and a barrier (as the diff's tile lookup does).
extern "C" __global__ void p_cmp_tile_dep(const uint4* a, const uint4* b, u64 nvec, u64* out,
                                          const u32* table) {
    __shared__ u32 s;
    if (threadIdx.x == 0) s = table[blockIdx.x & 1023];
    __syncthreads();
    cmp_tile(a, b, nvec, out, s);
}

// Grid-stride copy: the kernel twin of cuMemcpyDtoD.
extern "C" __global__ void p_copy(const uint4* a, uint4* b, u64 nvec) {
    const u64 step = (u64)gridDim.x * blockDim.x * 4;
    for (u64 base = (u64)blockIdx.x * blockDim.x * 4 + threadIdx.x; base < nvec; base += step) {
        uint4 v[4];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u64 j = base + (u64)i * blockDim.x;
            if (j < nvec) v[i] = __ldcs(a + j);
        }
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u64 j = base + (u64)i * blockDim.x;
            if (j < nvec) __stcs(b + j, v[i]);
        }
    }
}

// Changes `every`-th 16-bit element of b (b += 1), to give the diff something to find.
extern "C" __global__ void p_touch(unsigned short* b, u64 n, u64 every) {
    for (u64 i = ((u64)blockIdx.x * blockDim.x + threadIdx.x) * every; i < n;
         i += (u64)gridDim.x * blockDim.x * every)
        b[i] += 1;
}
