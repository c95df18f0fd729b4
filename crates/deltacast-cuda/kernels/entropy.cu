// The core's entropy codecs on the GPU, byte for byte (docs/codecs.md): `gaps` positions
// (Golomb–Rice gaps with the exact best k per block of 1024, escape to plain binary) and `ulp`
// values (ordered-integer steps, gamma code above k, escape to the raw bits, exact best (k, c)
// per block). A chunk's items are cut into coding blocks of CODE_BLOCK; blocks are numbered
// globally (`block0` of each chunk) and every kernel below works on blocks, so a delta of
// 10^8 changes is 10^5 independent units whatever the chunking.
//
// Sender:
//   dc_code_block_chunk  block -> chunk table
//   dc_code_size         one warp per block: gaps bits for every k (lane = k) and the ulp
//                        length histogram, then the exact best parameters and bit counts
//   dc_code_totals       one CUDA block per chunk: bit offset of each block in its chunk's
//                        stream, and the chunk's total bits (the host sizes the sections)
//   dc_code_write        one thread per block: its directory entry and its code words, at the
//                        place the host chose; words wholly inside the block's bit range are
//                        stored, the shared ones at its two ends are OR-ed (the destination is
//                        zeroed first). Raw values are copied instead when the host chose raw.
// Receiver:
//   dc_code_dirs         one thread per block: the block's bits and parameters from the section
//                        directories, checked; then dc_code_totals (the host checks each
//                        stream's byte length against its total)
//   dc_gaps_decode       one thread per block: relative positions (u32), every check of the
//                        CPU decoder
//   dc_holes_complement  one CUDA block per holes chunk: its decoded holes (gaps of the
//                        unchanged elements) turned into its changes' positions
//   dc_bitmap_list       one CUDA block per bitmap chunk with ulp values: its positions listed
//   dc_ulp_decode        one thread per block: new bits from the bits held and the steps

#define CODE_BLOCK 1024u
#define GAPS_ESC 16u
#define GAPS_DIR 7u
#define ULP_DIR 4u
#define ULP_UNCHANGED 33u  // histogram slot of unchanged elements (always raw)
#define ULP_HIST 34u
#define CODE_WARPS 4u      // warps per CUDA block of dc_code_size
#define ULP_BATCH 8u       // values per batch of the ulp decoder's gathers
#define WRITE_BATCH 8u     // items per batch of loads in dc_code_write

// Error codes (apply.cu uses 1..4).
#define ERR_CODE 5u        // a malformed code stream or directory

// Sender: one chunk whose changes are to be sized and, once placed, written.
struct CodeChunk {
    u64 pos;       // u64 slot indices of its changes, sorted (count of them)
    u64 new_bits;  // count * width bytes
    u64 old_bits;  // count * width bytes
    u64 count;
    u64 start;     // positions are coded relative to it
    u64 range;
    u64 block0;    // global index of its first coding block
    u64 gaps_dst;  // where its gaps section goes (4-aligned, zeroed), 0: not gaps
    u64 vals_dst;  // where its value section goes (4-aligned, zeroed), 0: none
    u32 width;
    u32 vals_codec;  // 0 none, 1 ulp, 2 raw copy
};

// Receiver: one chunk with an entropy-coded section to decode.
struct DecodeChunk {
    u64 pos_sec;   // gaps or abs32 section its ulp values follow (4-aligned); 0 with `all`
    u64 pos_len;
    u64 val_sec;   // ulp section (4-aligned), 0: values are not ulp
    u64 val_len;
    u64 held;      // the slot's bytes (old bits of the ulp steps)
    u64 start;
    u64 range;
    u64 count;
    u64 block0;
    u64 pos_out;   // u32 relative positions decoded from gaps, 0: positions are abs32
    u64 val_out;   // new bits decoded from ulp (count * width bytes)
    u32 width;
    u32 positions;  // POS_ABS32, POS_GAPS (pos_sec is a gaps section) or POS_ALL (every
                    // element of the range changed: the k-th value is element k's)
};

#define POS_ABS32 0u
#define POS_GAPS 1u
#define POS_ALL 2u

__device__ __forceinline__ u32 dc_bit_len(u64 v) { return v ? 64u - __clzll(v) : 0u; }
__device__ __forceinline__ u64 dc_mask64(u32 n) { return n >= 64 ? ~0ull : ((1ull << n) - 1ull); }
__device__ __forceinline__ u64 dc_blocks_of(u64 count) { return (count + CODE_BLOCK - 1) / CODE_BLOCK; }

// W of docs/codecs.md: enough bits for any gap of the range.
__device__ __forceinline__ u32 dc_escape_width(u64 range) {
    const u32 w = dc_bit_len(range > 0 ? range - 1 : 0);
    return w > 1 ? w : 1;
}

// Ordered-integer view of an nb-bit pattern (deltacast::dtype::to_ordered) and back.
__device__ __forceinline__ u32 dc_ord(u32 x, u32 nb) {
    const u32 all = (u32)dc_mask64(nb), sign = 1u << (nb - 1);
    return (x & sign) ? (~x & all) : (x | sign);
}
__device__ __forceinline__ u32 dc_unord(u32 o, u32 nb) {
    const u32 all = (u32)dc_mask64(nb), sign = 1u << (nb - 1);
    return (o & sign) ? (o ^ sign) : (~o & all);
}

// Code number u of the step old -> new and its bit length; length ULP_UNCHANGED when equal.
__device__ __forceinline__ u32 dc_ulp_code(u32 old_bits, u32 new_bits, u32 nb, u32* len) {
    const u32 all = (u32)dc_mask64(nb);
    const u32 d = (dc_ord(new_bits, nb) - dc_ord(old_bits, nb)) & all;
    if (d == 0) { *len = ULP_UNCHANGED; return 0; }
    const u32 negative = d >> (nb - 1);
    const u32 magnitude = negative ? ((0u - d) & all) : d;
    const u32 u = ((magnitude - 1u) << 1) | negative;
    *len = dc_bit_len(u);
    return u;
}

// ---------------------------------------------------------------------------------------------
// Each thread reads and writes its own stream: a warp's 32 lanes touch 32 different lines, and
// the L1 serves one line per cycle. So the code streams are read 16 bytes at a time, and the
// decoders write their outputs in vectors. (The writer's code words go out a word at a time:
// gathering them into vectors measured slower; docs/data/gpu-diff/README.md, "Figures behind
// the code".)

// Bit output: code words of one block into a zeroed u32-word stream, LSB first.
struct BitOut {
    u32* base;
    u64 word;  // index of the word being filled
    u64 acc;
    u32 nacc;  // bits held in acc (< 32 between calls)
    u64 s, e;  // the block's bit range [s, e)
};

__device__ __forceinline__ void dc_out_init(BitOut* o, u32* base, u64 s, u64 e) {
    o->base = base; o->word = s >> 5; o->acc = 0; o->nacc = (u32)(s & 31); o->s = s; o->e = e;
}
__device__ __forceinline__ void dc_out_emit(BitOut* o, u32 v) {
    const u64 b0 = o->word * 32;
    if (b0 >= o->s && b0 + 32 <= o->e) o->base[o->word] = v;  // wholly ours
    else if (v) atomicOr(&o->base[o->word], v);                // shared with a neighbour
}
// Appends the low n bits of v (n <= 32, v < 2^n).
__device__ __forceinline__ void dc_out_put(BitOut* o, u64 v, u32 n) {
    o->acc |= v << o->nacc;
    o->nacc += n;
    if (o->nacc >= 32) {
        dc_out_emit(o, (u32)o->acc);
        o->acc >>= 32;
        o->nacc -= 32;
        ++o->word;
    }
}
__device__ __forceinline__ void dc_out_zeros(BitOut* o, u32 n) {
    while (n > 32) { dc_out_put(o, 0, 32); n -= 32; }
    dc_out_put(o, 0, n);
}
__device__ __forceinline__ void dc_out_finish(BitOut* o) {
    if (o->nacc > 0) dc_out_emit(o, (u32)o->acc);
}
// ORs the low nbytes bytes of v at byte offset off of a 4-aligned zeroed buffer.
__device__ __forceinline__ void dc_or_bytes(u32* base, u64 off, u64 v, u32 nbytes) {
    for (u32 i = 0; i < nbytes; ++i) {
        const u32 byte = (u32)(v >> (8 * i)) & 0xffu;
        const u64 o = off + i;
        if (byte) atomicOr(&base[o >> 2], byte << (8 * (o & 3)));
    }
}

// Bit input: a stream (or an array of elements, read as one) from any 4-aligned address,
// loaded 16 bytes at a time from the 16-aligned address at or below it, with the next vector
// always loaded ahead. May read up to DECODE_SLACK (64) bytes past the last bit consumed.
struct BitIn {
    const uint4* base;
    u64 vec;    // index of `cur`
    uint4 cur, nxt;
    u32 wi;     // next word of `cur`
    u64 buf;
    u32 avail;  // valid bits in buf (>= 33 after a refill)
    u64 pos;    // bit position (from the caller's address) of buf's bit 0
};

__device__ __forceinline__ u32 dc_in_take(BitIn* r) {
    const u32 v = dc_word(r->cur, r->wi);
    if (++r->wi == 4) {
        r->wi = 0;
        r->cur = r->nxt;
        ++r->vec;
        r->nxt = r->base[r->vec + 1];
    }
    return v;
}
__device__ __forceinline__ void dc_in_refill(BitIn* r) {
    while (r->avail <= 32) {
        r->buf |= (u64)dc_in_take(r) << r->avail;
        r->avail += 32;
    }
}
__device__ __forceinline__ void dc_in_init(BitIn* r, const void* p, u64 s) {
    const u64 mis = (u64)p & 15;
    r->base = (const uint4*)((u64)p - mis);
    r->pos = s;
    const u64 bit = s + mis * 8;
    const u64 w = bit >> 5;
    r->vec = w >> 2;
    r->cur = r->base[r->vec];
    r->nxt = r->base[r->vec + 1];
    r->wi = (u32)(w & 3);
    r->buf = (u64)(dc_in_take(r) >> (bit & 31));
    r->avail = 32 - (u32)(bit & 31);
    dc_in_refill(r);
}
__device__ __forceinline__ void dc_in_skip(BitIn* r, u32 n) {  // n <= 33
    r->buf = n >= 64 ? 0 : r->buf >> n;
    r->avail -= n;
    r->pos += n;
    dc_in_refill(r);
}
__device__ __forceinline__ u32 dc_in_read(BitIn* r, u32 n) {  // n <= 32
    const u32 v = (u32)(r->buf & dc_mask64(n));
    dc_in_skip(r, n);
    return v;
}
// Zero bits before the first one bit, counting no further than `cap` (<= 33).
__device__ __forceinline__ u32 dc_in_zeros(const BitIn* r, u32 cap) {
    const u32 z = r->buf ? (u32)__ffsll((long long)r->buf) - 1 : 64u;
    return z < cap ? z : cap;
}

// ---------------------------------------------------------------------------------------------
// Block -> chunk. One thread per chunk.
extern "C" __global__ void dc_code_block_chunk(const u64* __restrict__ block0, const u64* __restrict__ counts,
                                               u64 num_chunks, u32* __restrict__ block_chunk) {
    for (u64 c = (u64)blockIdx.x * blockDim.x + threadIdx.x; c < num_chunks; c += (u64)gridDim.x * blockDim.x) {
        const u64 n = dc_blocks_of(counts[c]);
        for (u64 i = 0; i < n; ++i) block_chunk[block0[c] + i] = (u32)c;
    }
}

// Sizes every coding block: gaps (bits, k) and ulp (bits, k | c << 8), both the exact best of
// the CPU encoder, with its tie rules. One warp per block.
extern "C" __global__ void __launch_bounds__(CODE_WARPS * 32)
dc_code_size(const CodeChunk* __restrict__ chunks, const u32* __restrict__ block_chunk, u64 num_blocks,
             u32* __restrict__ gbits, u32* __restrict__ gk, u32* __restrict__ ubits, u32* __restrict__ ukc) {
    __shared__ u32 s_hist[CODE_WARPS][ULP_HIST];
    const u32 lane = threadIdx.x & 31, wib = threadIdx.x >> 5;
    u32* hist = s_hist[wib];
    for (u64 b = (u64)blockIdx.x * CODE_WARPS + wib; b < num_blocks; b += (u64)gridDim.x * CODE_WARPS) {
        const CodeChunk c = chunks[block_chunk[b]];
        const u64 i0 = (b - c.block0) * CODE_BLOCK;
        const u32 m = (u32)min((u64)CODE_BLOCK, c.count - i0);

        // gaps: lane k sums the cost of every gap with parameter k.
        const u64* p = (const u64*)c.pos + i0;
        const u32 W = dc_escape_width(c.range);
        u32 cost = 0;
        u64 carry = 0;
        for (u32 base = 0; base < m; base += 32) {
            const u32 j = base + lane;
            const u64 pj = j < m ? p[j] : 0;
            u64 prev = __shfl_up_sync(DC_FULL_MASK, pj, 1);
            if (lane == 0) prev = carry;
            const u32 g = (j >= 1 && j < m) ? (u32)(pj - prev - 1) : 0;
            carry = __shfl_sync(DC_FULL_MASK, pj, 31);
            const u32 t_end = min(32u, m - base);
            for (u32 t = (base == 0 ? 1u : 0u); t < t_end; ++t) {
                const u32 gt = __shfl_sync(DC_FULL_MASK, g, t);
                const u32 q = gt >> lane;
                cost += q < GAPS_ESC ? q + 1 + lane : GAPS_ESC + W;
            }
            // (the shuffles above are warp-uniform: t_end is the same on every lane)
        }
        u64 key = ((u64)cost << 5) | lane;
        for (int o = 16; o > 0; o >>= 1) {
            const u64 other = __shfl_xor_sync(DC_FULL_MASK, key, o);
            key = other < key ? other : key;
        }
        if (lane == 0) { gbits[b] = (u32)(key >> 5); gk[b] = (u32)(key & 31); }

        // ulp: the bit length histogram of the block's code numbers.
        const u32 w = c.width, nb = 8 * w;
        hist[lane] = 0;
        if (lane < ULP_HIST - 32) hist[32 + lane] = 0;
        __syncwarp();
        for (u32 j = lane; j < m; j += 32) {
            const u32 ob = dc_load_bits((const u8*)c.old_bits, i0 + j, w);
            const u32 nbits = dc_load_bits((const u8*)c.new_bits, i0 + j, w);
            u32 len;
            dc_ulp_code(ob, nbits, nb, &len);
            atomicAdd(&hist[len], 1u);
        }
        __syncwarp();
        // Candidates in the CPU's order: all-raw, then (k, c) by k then c; the first of the
        // smallest wins. key = bits << 16 | rank, rank 0 for all-raw, 1 + 64 k + c otherwise.
        u64 best = lane == 0 ? ((u64)(m * nb) << 16) : ~0ull;
        if (lane < nb) {
            const u32 k = lane;
            u32 shortn = 0;
            for (u32 l = 0; l <= k; ++l) shortn += hist[l];
            const u32 basebits = shortn * (k + 1);
            u32 coded = 0, raw = m - shortn;
            for (u32 cc = 1; cc <= nb - k + 1; ++cc) {
                const u32 bits = basebits + coded + raw * (cc + nb);
                const u64 kk = ((u64)bits << 16) | (1u + 64u * k + cc);
                best = kk < best ? kk : best;
                const u32 l = k + cc;
                if (l <= nb) {
                    coded += hist[l] * (2 * l - k);
                    raw -= hist[l];
                }
            }
        }
        for (int o = 16; o > 0; o >>= 1) {
            const u64 other = __shfl_xor_sync(DC_FULL_MASK, best, o);
            best = other < best ? other : best;
        }
        if (lane == 0) {
            const u32 rank = (u32)(best & 0xffffu);
            const u32 k = rank ? (rank - 1) / 64 : 0, cc = rank ? (rank - 1) % 64 : 0;
            ubits[b] = (u32)(best >> 16);
            ukc[b] = k | (cc << 8);
        }
        __syncwarp();  // hist is cleared for the next block
    }
}

// Bit offset of every block in its chunk's stream (exclusive prefix) and each chunk's total
// bits: totals[2c] gaps, totals[2c + 1] ulp. One CUDA block per chunk.
extern "C" __global__ void __launch_bounds__(256)
dc_code_totals(const u64* __restrict__ block0, const u64* __restrict__ counts, u64 num_chunks,
               const u32* __restrict__ gbits, const u32* __restrict__ ubits,
               u32* __restrict__ goff, u32* __restrict__ uoff, u64* __restrict__ totals) {
    __shared__ u32 s_scan[32];
    for (u64 c = blockIdx.x; c < num_chunks; c += gridDim.x) {
        const u64 b0 = block0[c], n = dc_blocks_of(counts[c]);
        u64 gbase = 0, ubase = 0;
        for (u64 r = 0; r < n; r += blockDim.x) {
            const u64 b = b0 + r + threadIdx.x;
            const bool in = r + threadIdx.x < n;
            const u32 gv = in ? gbits[b] : 0, uv = in ? ubits[b] : 0;
            u32 gt, ut;
            const u32 gx = dc_block_exclusive_scan(gv, s_scan, &gt);
            const u32 ux = dc_block_exclusive_scan(uv, s_scan, &ut);
            if (in) { goff[b] = (u32)(gbase + gx); uoff[b] = (u32)(ubase + ux); }
            gbase += gt;
            ubase += ut;
        }
        if (threadIdx.x == 0) { totals[2 * c] = gbase; totals[2 * c + 1] = ubase; }
        __syncthreads();
    }
}

// Writes every block's directory entries and code words (or copies its raw values). One thread
// per block.
extern "C" __global__ void __launch_bounds__(128)
dc_code_write(const CodeChunk* __restrict__ chunks, const u32* __restrict__ block_chunk, u64 num_blocks,
              const u32* __restrict__ gbits, const u32* __restrict__ gk, const u32* __restrict__ ubits,
              const u32* __restrict__ ukc, const u32* __restrict__ goff, const u32* __restrict__ uoff) {
    for (u64 b = (u64)blockIdx.x * blockDim.x + threadIdx.x; b < num_blocks; b += (u64)gridDim.x * blockDim.x) {
        const CodeChunk c = chunks[block_chunk[b]];
        const u64 bi = b - c.block0, nblk = dc_blocks_of(c.count);
        const u64 i0 = bi * CODE_BLOCK;
        const u32 m = (u32)min((u64)CODE_BLOCK, c.count - i0);
        if (c.gaps_dst) {
            u32* out = (u32*)c.gaps_dst;
            const u32 bits = gbits[b], k = gk[b], W = dc_escape_width(c.range);
            const u64* p = (const u64*)c.pos + i0;
            const u64 entry = (u64)(u32)(p[0] - c.start) | ((u64)bits << 32) | ((u64)k << 48);
            dc_or_bytes(out, GAPS_DIR * bi, entry, GAPS_DIR);
            const u64 s = GAPS_DIR * nblk * 8 + goff[b];
            BitOut o;
            dc_out_init(&o, out, s, s + bits);
            u64 prev = p[0];
            // Loads a batch at a time: each would otherwise stall the thread for a latency.
            for (u32 j0 = 1; j0 < m; j0 += WRITE_BATCH) {
                u64 pj[WRITE_BATCH];
#pragma unroll
                for (u32 t = 0; t < WRITE_BATCH; ++t) pj[t] = j0 + t < m ? p[j0 + t] : 0;
#pragma unroll
                for (u32 t = 0; t < WRITE_BATCH; ++t) {
                    if (j0 + t >= m) continue;
                    const u32 g = (u32)(pj[t] - prev - 1);
                    prev = pj[t];
                    const u32 q = g >> k;
                    if (q < GAPS_ESC) {
                        dc_out_zeros(&o, q);
                        dc_out_put(&o, 1ull | (((u64)g & dc_mask64(k)) << 1), k + 1);
                    } else {
                        dc_out_zeros(&o, GAPS_ESC);
                        dc_out_put(&o, g, W);
                    }
                }
            }
            dc_out_finish(&o);
        }
        const u32 w = c.width, nb = 8 * w;
        if (c.vals_codec == 1) {
            u32* out = (u32*)c.vals_dst;
            const u32 bits = ubits[b], k = ukc[b] & 0xffu, cc = ukc[b] >> 8;
            out[bi] = bits | (k << 16) | (cc << 24);  // 4-aligned entry, this block's alone
            const u64 s = ULP_DIR * nblk * 8 + uoff[b];
            BitOut o;
            dc_out_init(&o, out, s, s + bits);
            for (u32 j0 = 0; j0 < m; j0 += WRITE_BATCH) {
                u32 ob[WRITE_BATCH], nw[WRITE_BATCH];
#pragma unroll
                for (u32 t = 0; t < WRITE_BATCH; ++t) {
                    const bool in = j0 + t < m;
                    ob[t] = in ? dc_load_bits((const u8*)c.old_bits, i0 + j0 + t, w) : 0;
                    nw[t] = in ? dc_load_bits((const u8*)c.new_bits, i0 + j0 + t, w) : 0;
                }
#pragma unroll
                for (u32 t = 0; t < WRITE_BATCH; ++t) {
                    if (j0 + t >= m) continue;
                    const u32 nbits = nw[t];
                    u32 len;
                    const u32 u = dc_ulp_code(ob[t], nbits, nb, &len);
                    const u32 z = len == ULP_UNCHANGED ? 0 : (len > k ? len - k : 0);
                    if (len == ULP_UNCHANGED || z >= cc) {
                        dc_out_zeros(&o, cc);
                        dc_out_put(&o, nbits, nb);
                    } else if (z == 0) {
                        dc_out_put(&o, ((u64)u << 1) | 1ull, k + 1);
                    } else {
                        dc_out_zeros(&o, z);
                        dc_out_put(&o, ((u64)(u ^ (1u << (len - 1))) << 1) | 1ull, len);
                    }
                }
            }
            dc_out_finish(&o);
        } else if (c.vals_codec == 2) {
            for (u32 j = 0; j < m; ++j)
                dc_store_bits((u8*)c.vals_dst, i0 + j, w, dc_load_bits((const u8*)c.new_bits, i0 + j, w));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Receiver.

// Stores `n` (<= ULP_BATCH) values of width w at element `at` of `out`: a full batch with one or
// two vector stores when aligned (a thread's values are contiguous: one wide store instead of
// eight scattered ones), else element by element.
__device__ __forceinline__ void dc_store_batch(u8* out, u64 at, u32 w, const u32* v, u32 n) {
    u8* p = out + at * w;
    if (n == ULP_BATCH && w == 2 && ((u64)p & 15) == 0) {
        *(uint4*)p = make_uint4(v[0] | (v[1] << 16), v[2] | (v[3] << 16), v[4] | (v[5] << 16),
                                v[6] | (v[7] << 16));
    } else if (n == ULP_BATCH && w == 1 && ((u64)p & 7) == 0) {
        *(uint2*)p = make_uint2(v[0] | (v[1] << 8) | (v[2] << 16) | (v[3] << 24),
                                v[4] | (v[5] << 8) | (v[6] << 16) | (v[7] << 24));
    } else if (n == ULP_BATCH && w == 4 && ((u64)p & 15) == 0) {
        *(uint4*)p = make_uint4(v[0], v[1], v[2], v[3]);
        *(uint4*)(p + 16) = make_uint4(v[4], v[5], v[6], v[7]);
    } else {
        for (u32 t = 0; t < n; ++t) dc_store_bits(out, at + t, w, v[t]);
    }
}

__device__ __forceinline__ void dc_code_flag(u32* err, u32 code) { atomicCAS(err, 0u, code); }

__device__ __forceinline__ u32 dc_byte_at(const u8* p, u64 off, u32 n) {
    u32 v = 0;
    for (u32 i = 0; i < n; ++i) v |= (u32)p[off + i] << (8 * i);
    return v;
}

// Each block's bits and parameters from the directories (0 bits where a chunk has no such
// section), checked against the codecs' limits. One thread per block.
extern "C" __global__ void dc_code_dirs(const DecodeChunk* __restrict__ chunks, const u32* __restrict__ block_chunk,
                                        u64 num_blocks, u32* __restrict__ gbits, u32* __restrict__ gk,
                                        u32* __restrict__ ubits, u32* __restrict__ ukc, u32* __restrict__ errors) {
    for (u64 b = (u64)blockIdx.x * blockDim.x + threadIdx.x; b < num_blocks; b += (u64)gridDim.x * blockDim.x) {
        const u32 ci = block_chunk[b];
        const DecodeChunk c = chunks[ci];
        const u64 bi = b - c.block0;
        u32 g = 0, k = 0, ub = 0, kc = 0;
        if (c.positions == POS_GAPS) {
            const u8* d = (const u8*)c.pos_sec + GAPS_DIR * bi;
            g = dc_byte_at(d, 4, 2);
            k = d[6];
            if (k > 31) dc_code_flag(&errors[ci], ERR_CODE);
        }
        if (c.val_sec) {
            const u32 e = ((const u32*)c.val_sec)[bi];
            const u32 nb = 8 * c.width, uk = (e >> 16) & 0xffu, uc = e >> 24;
            ub = e & 0xffffu;
            kc = uk | (uc << 8);
            if (uk >= nb || uc > nb + 1) dc_code_flag(&errors[ci], ERR_CODE);
        }
        gbits[b] = g;
        gk[b] = k;
        ubits[b] = ub;
        ukc[b] = kc;
    }
}

extern "C" __global__ void __launch_bounds__(128)
dc_gaps_decode(const DecodeChunk* __restrict__ chunks, const u32* __restrict__ block_chunk, u64 num_blocks,
               const u32* __restrict__ gbits, const u32* __restrict__ gk, const u32* __restrict__ goff,
               u32* __restrict__ errors) {
    for (u64 b = (u64)blockIdx.x * blockDim.x + threadIdx.x; b < num_blocks; b += (u64)gridDim.x * blockDim.x) {
        const u32 ci = block_chunk[b];
        const DecodeChunk c = chunks[ci];
        if (c.positions != POS_GAPS) continue;
        u32* err = &errors[ci];
        if (*err) continue;  // a directory already failed its check
        const u64 bi = b - c.block0, nblk = dc_blocks_of(c.count);
        const u64 i0 = bi * CODE_BLOCK;
        const u32 m = (u32)min((u64)CODE_BLOCK, c.count - i0);
        const u8* dir = (const u8*)c.pos_sec;
        const u32 k = gk[b], W = dc_escape_width(c.range);
        u32* out = (u32*)c.pos_out + i0;
        u64 p = dc_byte_at(dir, GAPS_DIR * bi, 4);
        if (p >= c.range) { dc_code_flag(err, ERR_CODE); continue; }
        // Positions go out four at a time (one 16-byte store instead of four scattered ones)
        // when the output is 16-aligned.
        const bool vec = ((u64)out & 15) == 0;
        const u64 s = GAPS_DIR * nblk * 8 + goff[b], e = s + gbits[b];
        BitIn r;
        dc_in_init(&r, (const u32*)c.pos_sec, s);
        bool bad = false;
        for (u32 g0 = 0; g0 < m && !bad; g0 += 4) {
            u32 grp[4];
#pragma unroll
            for (u32 t = 0; t < 4; ++t) {
                const u32 j = g0 + t;
                grp[t] = (u32)p;  // j == 0: the block's first position
                if (j == 0 || j >= m || bad) continue;
                const u32 z = dc_in_zeros(&r, GAPS_ESC);
                u64 g;
                if (z < GAPS_ESC) {
                    dc_in_skip(&r, z + 1);
                    g = ((u64)z << k) | dc_in_read(&r, k);
                } else {
                    dc_in_skip(&r, GAPS_ESC);
                    g = dc_in_read(&r, W);
                }
                p += g + 1;
                if (r.pos > e || p >= c.range) bad = true;
                grp[t] = (u32)p;
            }
            if (bad) break;
            if (g0 + 4 <= m && vec) {
                *(uint4*)(out + g0) = make_uint4(grp[0], grp[1], grp[2], grp[3]);
            } else {
#pragma unroll
                for (u32 t = 0; t < 4; ++t)
                    if (g0 + t < m) out[g0 + t] = grp[t];
            }
        }
        if (bad || r.pos != e) { dc_code_flag(err, ERR_CODE); continue; }
        if (bi + 1 < nblk) {
            // The next block must start past this one's last position.
            if (dc_byte_at(dir, GAPS_DIR * (bi + 1), 4) <= p) dc_code_flag(err, ERR_CODE);
        } else if (e & 7) {
            // The last byte's padding bits must be zero.
            const u32 pad = 8 - (u32)(e & 7);
            if (dc_in_read(&r, pad) != 0) dc_code_flag(err, ERR_CODE);
        }
    }
}

// A holes chunk: the sorted holes dc_gaps_decode wrote at `holes` turned into the positions
// of the changes (the elements between them) at `out`.
struct HolesChunk {
    u64 holes;
    u64 out;
    u64 holes_count;
    u64 range;
    u64 count;
    u64 chunk;  // the DecodeChunk that decoded the holes: skipped when it failed
};

// One CUDA block per chunk; thread i writes the run of changes between hole i - 1 and hole i.
// The change at p with i holes before it is change p - i. Holes that failed their decode are
// never read; the bounds checks keep even unchecked ones inside `out`.
extern "C" __global__ void dc_holes_complement(const HolesChunk* __restrict__ chunks, u64 n,
                                               const u32* __restrict__ errors) {
    for (u64 ci = blockIdx.x; ci < n; ci += gridDim.x) {
        const HolesChunk c = chunks[ci];
        if (errors[c.chunk]) continue;
        const u32* h = (const u32*)c.holes;
        u32* out = (u32*)c.out;
        for (u64 i = threadIdx.x; i <= c.holes_count; i += blockDim.x) {
            const u64 lo = i == 0 ? 0 : (u64)h[i - 1] + 1;
            const u64 hi = i == c.holes_count ? c.range : min((u64)h[i], c.range);
            for (u64 p = lo; p < hi; ++p)
                if (p >= i && p - i < c.count) out[p - i] = (u32)p;
        }
    }
}

// A bitmap chunk with ulp values: its set bits listed as relative positions at `out` (the
// ulp decoder reads each change's old bits there). Bits past the range are dropped and at most
// `count` positions written; the apply checks the bitmap itself (range, count) and refuses the
// chunk when they disagree.
struct ListChunk {
    u64 bitmap;  // 4-byte aligned, ceil(range / 8) bytes
    u64 out;
    u64 range;
    u64 count;
};

// One CUDA block per chunk, walking its bitmap as the apply does (dc_bitmap_rounds): each
// thread writes its word's positions at its prefix.
extern "C" __global__ void __launch_bounds__(256) dc_bitmap_list(const ListChunk* __restrict__ chunks, u64 n) {
    __shared__ u32 scan_scratch[32];
    for (u64 ci = blockIdx.x; ci < n; ci += gridDim.x) {
        const ListChunk c = chunks[ci];
        u32* out = (u32*)c.out;
        bool stray = false;  // (the apply flags it)
        dc_bitmap_rounds((const u8*)c.bitmap, c.range, scan_scratch, &stray,
                         [&](u64 wi, u32 word, u32 j, u32, u64 base) {
                             while (word) {
                                 const u64 k = base + j++;
                                 if (k < c.count) out[k] = (u32)(wi * 32 + __ffs(word) - 1);
                                 word &= word - 1;
                             }
                         });
    }
}

extern "C" __global__ void __launch_bounds__(128)
dc_ulp_decode(const DecodeChunk* __restrict__ chunks, const u32* __restrict__ block_chunk, u64 num_blocks,
              const u32* __restrict__ ubits, const u32* __restrict__ ukc, const u32* __restrict__ uoff,
              u32* __restrict__ errors) {
    for (u64 b = (u64)blockIdx.x * blockDim.x + threadIdx.x; b < num_blocks; b += (u64)gridDim.x * blockDim.x) {
        const u32 ci = block_chunk[b];
        const DecodeChunk c = chunks[ci];
        if (!c.val_sec) continue;
        u32* err = &errors[ci];
        if (*err) continue;  // the directories or the positions already failed
        const u64 bi = b - c.block0, nblk = dc_blocks_of(c.count);
        const u64 i0 = bi * CODE_BLOCK;
        const u32 m = (u32)min((u64)CODE_BLOCK, c.count - i0);
        const u32 w = c.width, nb = 8 * w, all = (u32)dc_mask64(nb);
        const u32 k = ukc[b] & 0xffu, cc = ukc[b] >> 8;
        const bool every = c.positions == POS_ALL;
        const u32* rel = every ? nullptr : (const u32*)(c.positions == POS_GAPS ? c.pos_out : c.pos_sec) + i0;
        const bool rel_vec = !every && ((u64)rel & 15) == 0;  // so are staged gaps positions
        const u64 s = ULP_DIR * nblk * 8 + uoff[b], e = s + ubits[b];
        BitIn r;
        dc_in_init(&r, (const u32*)c.val_sec, s);
        bool bad = false;
        // Batches of ULP_BATCH values: parse their code words, then issue every gather of the
        // old bits at once (one at a time, each would stall the thread for a memory latency).
        for (u32 j0 = 0; j0 < m && !bad; j0 += ULP_BATCH) {
            u32 q[ULP_BATCH], code[ULP_BATCH], ob[ULP_BATCH];
            u32 raw = 0;  // bit t: code[t] holds the new bits themselves
            if (rel_vec && j0 + ULP_BATCH <= m) {
                const uint4 a = *(const uint4*)(rel + j0), a2 = *(const uint4*)(rel + j0 + 4);
                q[0] = a.x; q[1] = a.y; q[2] = a.z; q[3] = a.w;
                q[4] = a2.x; q[5] = a2.y; q[6] = a2.z; q[7] = a2.w;
            } else {
#pragma unroll
                for (u32 t = 0; t < ULP_BATCH; ++t)
                    q[t] = j0 + t >= m ? 0 : every ? (u32)(i0 + j0 + t) : rel[j0 + t];
            }
#pragma unroll
            for (u32 t = 0; t < ULP_BATCH; ++t) {
                code[t] = 0;
                if (j0 + t >= m || bad) continue;
                if (q[t] >= c.range) { bad = true; continue; }
                const u32 z = dc_in_zeros(&r, cc);
                if (z >= cc) {
                    dc_in_skip(&r, cc);
                    code[t] = dc_in_read(&r, nb);
                    raw |= 1u << t;
                } else if (z == 0) {
                    dc_in_skip(&r, 1);
                    code[t] = dc_in_read(&r, k);
                } else {
                    const u32 len = z + k;
                    if (len > nb) { bad = true; continue; }
                    dc_in_skip(&r, z + 1);
                    code[t] = (1u << (len - 1)) | dc_in_read(&r, len - 1);
                }
                if (!((raw >> t) & 1u) && code[t] == all - 1u) bad = true;  // 2^nb - 2: no step
                if (r.pos > e) bad = true;
            }
            if (bad) break;
#pragma unroll
            for (u32 t = 0; t < ULP_BATCH; ++t)
                ob[t] = (j0 + t < m && !((raw >> t) & 1u))
                            ? dc_load_bits((const u8*)c.held, c.start + q[t], w) : 0;
            u32 nv[ULP_BATCH];
#pragma unroll
            for (u32 t = 0; t < ULP_BATCH; ++t) {
                nv[t] = code[t];
                if (!((raw >> t) & 1u)) {
                    const u32 u = code[t], negative = u & 1u, magnitude = (u >> 1) + 1u;
                    const u32 d = negative ? (0u - magnitude) : magnitude;
                    nv[t] = dc_unord((dc_ord(ob[t], nb) + d) & all, nb);
                }
            }
            dc_store_batch((u8*)c.val_out, i0 + j0, w, nv, m - j0 < ULP_BATCH ? m - j0 : ULP_BATCH);
        }
        if (bad || r.pos != e) { dc_code_flag(err, ERR_CODE); continue; }
        if (bi + 1 == nblk && (e & 7)) {
            const u32 pad = 8 - (u32)(e & 7);
            if (dc_in_read(&r, pad) != 0) dc_code_flag(err, ERR_CODE);
        }
    }
}
