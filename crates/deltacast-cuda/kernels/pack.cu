// Gathers many runs of 4-byte words into one buffer (the packed position sections of a GPU
// sync): one block per run, grid-stride over runs. Runs are short (a chunk's positions), so
// plain coalesced word copies are enough.

struct PackCopy {
    u64 src;    // 4-byte aligned
    u64 dst;    // 4-byte aligned
    u64 words;  // u32 words to copy
};

extern "C" __global__ void dc_pack_words(const PackCopy* __restrict__ copies, u64 n) {
    for (u64 c = blockIdx.x; c < n; c += gridDim.x) {
        const PackCopy p = copies[c];
        const u32* __restrict__ s = (const u32*)p.src;
        u32* __restrict__ d = (u32*)p.dst;
        for (u64 k = threadIdx.x; k < p.words; k += blockDim.x) d[k] = s[k];
    }
}
