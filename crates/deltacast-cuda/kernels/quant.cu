// Block FP8 (Gpu::fp8_quantize): fp32 tensors quantized to E4M3FN in 128x128 blocks of their
// last two dimensions, with one fp32 scale per block, by the rule of the core's
// deltacast::convert::fp8 (crates/deltacast/src/convert/fp8.rs; vLLM's
// per_block_cast_to_fp8(x, [128, 128], use_ue8m0=False)):
//
//   amax  = max |x| over the block, at least fp32(1e-4); a NaN anywhere: scale 0x7FC00000
//   scale = amax / 448, inv = 1 / scale (IEEE divisions, round to nearest even)
//   q     = E4M3FN(clamp(x * inv, -448, 448)) by torch's fp8e4m3fn_from_fp32_value; NaN -> 0x7F
//
// One thread block per 128x128 block: it reads the block once for the amax (coalesced along
// rows), and again, from L1/L2, to quantize and write it. Each job is a tensor
// [batch, rows, cols] with its blocks numbered from `first_block` (row-major over batch, row
// blocks, column blocks); the scale of global block b goes to scales[b - first_block].

#define QUANT_THREADS 256
#define QUANT_BLOCK 128

struct Fp8Job {
    u64 src;          // fp32 elements, batch * rows * cols
    u64 dst;          // E4M3FN bytes, as many
    u64 scales;       // fp32 bits, one per block
    u64 first_block;  // first global block of this job
    u32 rows;
    u32 cols;
    u32 row_blocks;
    u32 col_blocks;
};

// torch's fp32 -> E4M3FN (saturating to +-448 past the largest finite value), with every NaN
// 0x7F. The subnormal case adds 2^14 in fp32 (round to nearest even, no flush to zero) and
// keeps the bits that land at the bottom of the sum's mantissa.
__device__ __forceinline__ u32 dc_e4m3fn(u32 bits) {
    const u32 sign = bits & 0x80000000u;
    const u32 f = bits ^ sign;
    if (f > 0x7f800000u) return 0x7fu;
    u32 mag;
    if (f >= (1087u << 20)) {
        mag = 0x7eu;
    } else if (f < (121u << 23)) {
        const float sum = __fadd_rn(__uint_as_float(f), __uint_as_float(141u << 23));
        mag = (__float_as_uint(sum) - (141u << 23)) & 0xffu;
    } else {
        const u32 odd = (f >> 20) & 1u;
        mag = ((f + ((7u - 127u) << 23) + 0x7ffffu + odd) >> 20) & 0xffu;
        if (mag == 0x7fu) mag = 0x7eu;
    }
    return mag | (sign >> 24);
}

// An element of a block with factor `inv`.
__device__ __forceinline__ u32 dc_fp8_quantize_one(float x, float inv) {
    const float v = __fmul_rn(x, inv);
    if (v != v) return 0x7fu;  // NaN: fminf/fmaxf below would drop it
    return dc_e4m3fn(__float_as_uint(fminf(fmaxf(v, -448.0f), 448.0f)));
}

extern "C" __global__ void __launch_bounds__(QUANT_THREADS)
dc_fp8_quantize(const Fp8Job* __restrict__ jobs, u32 num_jobs, u64 num_blocks) {
    __shared__ u32 s_job;
    __shared__ u32 s_max[QUANT_THREADS / 32];
    __shared__ float s_inv;
    for (u64 b = blockIdx.x; b < num_blocks; b += gridDim.x) {
        if (threadIdx.x == 0) {
            u32 lo = 0, hi = num_jobs;
            while (hi - lo > 1) {
                const u32 mid = (lo + hi) >> 1;
                if (jobs[mid].first_block <= b) lo = mid;
                else hi = mid;
            }
            s_job = lo;
        }
        __syncthreads();
        const Fp8Job J = jobs[s_job];
        const u64 local = b - J.first_block;
        const u64 per_matrix = (u64)J.row_blocks * J.col_blocks;
        const u64 m = local / per_matrix;
        const u32 rb = (u32)((local % per_matrix) / J.col_blocks);
        const u32 cb = (u32)(local % J.col_blocks);
        const u32 row0 = rb * QUANT_BLOCK, col0 = cb * QUANT_BLOCK;
        const u32 nrows = min(QUANT_BLOCK, J.rows - row0), ncols = min(QUANT_BLOCK, J.cols - col0);
        const u64 base = m * J.rows * J.cols + (u64)row0 * J.cols + col0;
        const float* src = (const float*)J.src;

        // The largest magnitude as bits: non-negative floats order as their patterns, and
        // NaNs lie above +Inf, so one integer max finds both.
        u32 amax = 0;
        for (u32 i = threadIdx.x; i < QUANT_BLOCK * QUANT_BLOCK; i += QUANT_THREADS) {
            const u32 r = i / QUANT_BLOCK, c = i % QUANT_BLOCK;
            if (r < nrows && c < ncols)
                amax = max(amax, __float_as_uint(src[base + (u64)r * J.cols + c]) & 0x7fffffffu);
        }
        for (int o = 16; o > 0; o >>= 1) amax = max(amax, __shfl_xor_sync(DC_FULL_MASK, amax, o));
        if ((threadIdx.x & 31) == 0) s_max[threadIdx.x >> 5] = amax;
        __syncthreads();
        if (threadIdx.x == 0) {
            u32 all = 0;
            for (u32 w = 0; w < QUANT_THREADS / 32; ++w) all = max(all, s_max[w]);
            u32 scale;
            if (all > 0x7f800000u) {
                scale = 0x7fc00000u;
            } else {
                scale = __float_as_uint(__fdiv_rn(fmaxf(__uint_as_float(all), 1e-4f), 448.0f));
            }
            ((u32*)J.scales)[local] = scale;
            s_inv = __fdiv_rn(1.0f, __uint_as_float(scale));
        }
        __syncthreads();
        const float inv = s_inv;
        u8* dst = (u8*)J.dst;
        for (u32 i = threadIdx.x; i < QUANT_BLOCK * QUANT_BLOCK; i += QUANT_THREADS) {
            const u32 r = i / QUANT_BLOCK, c = i % QUANT_BLOCK;
            if (r < nrows && c < ncols) {
                const u64 at = base + (u64)r * J.cols + c;
                dst[at] = (u8)dc_fp8_quantize_one(src[at], inv);
            }
        }
        __syncthreads();  // s_job, s_max and s_inv are rewritten by the next block
    }
}
