// attention.cu: causal GQA attention over the float32 KV cache.
//
//   out[t, h] = softmax_l(q[t, h] . K[l, h / G] / sqrt(D)) V[l, h / G],  l <= pos0 + t
//   q [T, H, D], cache [S, Hkv, D], G = H / Hkv
//
// Variants (engine/tuning/variants/cuda/):
//   attention_decode.split     attn_split + attn_combine: keys cut into SPLITS ranges (a fixed
//                              count, so one captured graph serves every position), WARPS warps
//                              walk a range (one warp per key, lanes over D, online softmax),
//                              then a combine kernel merges the ranges. Also serves prefill as
//                              attention_prefill.split (grid z = query token).
//   attention_decode.split_kw  attn_split_kw + attn_combine: as split, G lanes per key and
//                              32 / G keys per warp step (LANES_PER_KEY, launch), decode only;
//                              with FUSE_COMBINE the last range of a head combines (1 launch);
//                              with KV_EARLY (kv_early) a step's V row is loaded with its K row,
//                              before the score's reduction: one memory round trip a step, not
//                              two (the same values in the same order).
//   attention_prefill.flash    attn_flash: a block takes BLOCK_Q query tokens of one head, stages 32
//                              keys and values at a time in shared memory (rows padded by four
//                              floats: no bank conflicts on 16-byte reads) and each warp keeps ROWS_PER_WARP queries'
//                              running max, sum and output in registers. Lanes own keys for
//                              the scores and head dims for P.V. Needs D <= 128, D % 4 == 0.
// Tunables: SPLITS, WARPS, LANES_PER_KEY, FUSE_COMBINE, KV_EARLY (launch), BLOCK_Q and ROWS_PER_WARP
// (attn_flash).
// pos0 comes as a scalar and a device pointer (non-null wins: the decode graph's position).
#include "common.cuh"

#define NEG_INF __int_as_float(0xff800000)
#define MAXD_LANE 8  // attn_split: D <= 256

// The warps of a block, each with (acc[D], m, l) in sm [nwarps][D + 2], merged into the
// range's partial: part[o] (unnormalized) and ml[o] = (max, sum).
__device__ __forceinline__ void block_merge(const float* sm, int nw, int D, size_t o,
                                            float* __restrict__ part, float* __restrict__ ml) {
    float M = NEG_INF;
    for (int w = 0; w < nw; ++w) M = fmaxf(M, sm[w * (D + 2) + D]);
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float a = 0.f;
        if (M != NEG_INF)
            for (int w = 0; w < nw; ++w) a += sm[w * (D + 2) + d] * expf(sm[w * (D + 2) + D] - M);
        part[o * D + d] = a;
    }
    if (threadIdx.x == 0) {
        float Ls = 0.f;
        if (M != NEG_INF)
            for (int w = 0; w < nw; ++w) Ls += sm[w * (D + 2) + D + 1] * expf(sm[w * (D + 2) + D] - M);
        ml[2 * o] = M;
        ml[2 * o + 1] = Ls;
    }
}

// grid (SPLITS, H, T); part [T, H, SPLITS, D] unnormalized, ml [T, H, SPLITS, 2] (max, sum).
extern "C" __global__ void attn_split(const float* __restrict__ q, const float* __restrict__ kc,
                                      const float* __restrict__ vc, float* __restrict__ part,
                                      float* __restrict__ ml, int T, int H, int Hkv, int D,
                                      int pos0, const int* pos_ptr, float scale) {
    extern __shared__ float sm[];  // [nwarps][D + 2]
    const int s = blockIdx.x, h = blockIdx.y, t = blockIdx.z, nsplit = gridDim.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    const int L = (pos_ptr ? *pos_ptr : pos0) + t + 1;
    const int chunk = (L + nsplit - 1) / nsplit;
    const int kb = s * chunk, ke = min(L, kb + chunk);
    const int kvh = h / (H / Hkv);
    float qv[MAXD_LANE], acc[MAXD_LANE];
#pragma unroll
    for (int i = 0; i < MAXD_LANE; ++i) {
        const int d = lane + 32 * i;
        qv[i] = d < D ? q[((size_t)t * H + h) * D + d] * scale : 0.f;
        acc[i] = 0.f;
    }
    float m = NEG_INF, l = 0.f;
    for (int j = kb + warp; j < ke; j += nw) {
        const float* kr = kc + ((size_t)j * Hkv + kvh) * D;
        const float* vr = vc + ((size_t)j * Hkv + kvh) * D;
        float sd = 0.f;
#pragma unroll
        for (int i = 0; i < MAXD_LANE; ++i) {
            const int d = lane + 32 * i;
            if (d < D) sd += qv[i] * kr[d];
        }
        sd = warp_sum(sd);
        const float mn = fmaxf(m, sd), corr = expf(m - mn), p = expf(sd - mn);
        l = l * corr + p;
#pragma unroll
        for (int i = 0; i < MAXD_LANE; ++i) {
            const int d = lane + 32 * i;
            acc[i] = acc[i] * corr + (d < D ? p * vr[d] : 0.f);
        }
        m = mn;
    }
    // merge the warps of this block
    float* mine = sm + warp * (D + 2);
#pragma unroll
    for (int i = 0; i < MAXD_LANE; ++i) {
        const int d = lane + 32 * i;
        if (d < D) mine[d] = acc[i];
    }
    if (lane == 0) {
        mine[D] = m;
        mine[D + 1] = l;
    }
    __syncthreads();
    block_merge(sm, nw, D, ((size_t)t * H + h) * nsplit + s, part, ml);
}

// attention_decode.split_kw, decode only (T = 1): as attn_split, but a warp takes 32 / G keys
// at once, G lanes per key each holding D / G dims (float4 loads; D % (4G) == 0, D / G <= 32),
// so a warp's chain of dependent load -> reduce -> softmax steps is 32 / G times shorter. The
// key groups of a warp merge by shuffles, then the block as attn_split does. Same outputs.
#define KW_DPL 32  // dims per lane at most
// With out non-null the head's last range to finish (a ticket per head, reset by that block)
// also does attn_combine's work into out [H, D], and with xq non-null writes out's Q8_1 blocks
// as attn_combine_q8 does (D % 32 == 0): one launch for the decode attention.
extern "C" __global__ void attn_split_kw(const float* __restrict__ q, const float* __restrict__ kc,
                                         const float* __restrict__ vc, float* part, float* ml,
                                         int H, int Hkv, int D, int G, int pos0,
                                         const int* pos_ptr, float scale, float* out,
                                         signed char* xq, float2* xds, unsigned int* tickets,
                                         int kv_early) {
    extern __shared__ float sm[];  // [nwarps][D + 2]
    pdl_start();
    const int s = blockIdx.x, h = blockIdx.y, nsplit = gridDim.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, nw = blockDim.x / 32;
    const int KW = 32 / G, kg = lane / G, gl = lane % G, dpl = D / G, d0 = gl * dpl;
    const int L = (pos_ptr ? *pos_ptr : pos0) + 1;
    const int chunk = (L + nsplit - 1) / nsplit;
    const int kb = s * chunk, ke = min(L, kb + chunk);
    const int kvh = h / (H / Hkv);
    float qv[KW_DPL], acc[KW_DPL];
#pragma unroll
    for (int i = 0; i < KW_DPL; i += 4) {
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < dpl) v = *(const float4*)(q + (size_t)h * D + d0 + i);
        qv[i] = v.x * scale, qv[i + 1] = v.y * scale, qv[i + 2] = v.z * scale;
        qv[i + 3] = v.w * scale;
        acc[i] = acc[i + 1] = acc[i + 2] = acc[i + 3] = 0.f;
    }
    float m = NEG_INF, l = 0.f;
    for (int j0 = kb + warp * KW; j0 < ke; j0 += nw * KW) {
        const int j = j0 + kg;
        const bool ok = j < ke;
        const size_t row = ((size_t)(ok ? j : j0) * Hkv + kvh) * D + d0;
        float4 ve[KW_DPL / 4];  // kv_early: the V row, loaded before the score is known
        float sd = 0.f;
#pragma unroll
        for (int i = 0; i < KW_DPL; i += 4) {
            if (i < dpl) {
                const float4 k4 = *(const float4*)(kc + row + i);
                if (kv_early) ve[i / 4] = *(const float4*)(vc + row + i);  // row is valid
                sd += qv[i] * k4.x + qv[i + 1] * k4.y + qv[i + 2] * k4.z + qv[i + 3] * k4.w;
            }
        }
        for (int o = G / 2; o > 0; o >>= 1) sd += __shfl_xor_sync(0xffffffffu, sd, o);
        if (ok) {
            const float mn = fmaxf(m, sd), corr = expf(m - mn), p = expf(sd - mn);
            l = l * corr + p;
#pragma unroll
            for (int i = 0; i < KW_DPL; i += 4) {
                if (i < dpl) {
                    const float4 v4 = kv_early ? ve[i / 4] : *(const float4*)(vc + row + i);
                    acc[i] = acc[i] * corr + p * v4.x;
                    acc[i + 1] = acc[i + 1] * corr + p * v4.y;
                    acc[i + 2] = acc[i + 2] * corr + p * v4.z;
                    acc[i + 3] = acc[i + 3] * corr + p * v4.w;
                }
            }
            m = mn;
        }
    }
    // merge the warp's key groups: lanes gl of every group hold the same dims
    for (int o = G; o < 32; o <<= 1) {
        const float mo = __shfl_xor_sync(0xffffffffu, m, o);
        const float lo = __shfl_xor_sync(0xffffffffu, l, o);
        const float M = fmaxf(m, mo);
        const float ca = M == NEG_INF ? 0.f : expf(m - M), cb = M == NEG_INF ? 0.f : expf(mo - M);
#pragma unroll
        for (int i = 0; i < KW_DPL; ++i) {
            const float ao = __shfl_xor_sync(0xffffffffu, acc[i], o);
            acc[i] = acc[i] * ca + ao * cb;
        }
        l = l * ca + lo * cb;
        m = M;
    }
    float* mine = sm + warp * (D + 2);
    if (kg == 0) {
#pragma unroll
        for (int i = 0; i < KW_DPL; ++i)
            if (i < dpl) mine[d0 + i] = acc[i];
        if (gl == 0) {
            mine[D] = m;
            mine[D + 1] = l;
        }
    }
    __syncthreads();
    block_merge(sm, nw, D, (size_t)h * nsplit + s, part, ml);
    if (!out) return;
    __shared__ bool last;
    SPLIT_TICKET_OR_RETURN(last, tickets + h, nsplit);
    const float* pm = ml + 2 * (size_t)h * nsplit;
    float M = NEG_INF;
    for (int r = 0; r < nsplit; ++r) M = fmaxf(M, __ldcg(pm + 2 * r));
    float Ls = 0.f;
    for (int r = 0; r < nsplit; ++r) {
        const float mr = __ldcg(pm + 2 * r);
        if (mr != NEG_INF) Ls += __ldcg(pm + 2 * r + 1) * expf(mr - M);
    }
    const float inv = 1.f / Ls;
    const int Dr = (D + blockDim.x - 1) / blockDim.x * blockDim.x;  // whole warps: shuffles
    for (int d = threadIdx.x; d < Dr; d += blockDim.x) {
        const bool ok = d < D;
        float a = 0.f;
        if (ok) {
            for (int r = 0; r < nsplit; ++r) {
                const float mr = __ldcg(pm + 2 * r);
                if (mr != NEG_INF) a += __ldcg(part + ((size_t)h * nsplit + r) * D + d) * expf(mr - M);
            }
            a = a * inv;
        }
        const size_t e = (size_t)h * D + d;
        if (xq) {  // warps cover 32 consecutive values (D % 32 == 0)
            const float amax = warp_max(fabsf(a));
            const float dq = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
            const int qv = __float2int_rn(a * id);
            int sq = qv;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
            if (ok) {
                xq[e] = (signed char)qv;
                if ((threadIdx.x & 31) == 0) xds[e / 32] = make_float2(dq, dq * (float)sq);
            }
        }
        if (ok) out[e] = a;
    }
    if (threadIdx.x == 0) tickets[h] = 0;
}

// grid (H, T), block >= 32: merge SPLITS partials into out [T, H, D].
extern "C" __global__ void attn_combine(const float* __restrict__ part, const float* __restrict__ ml,
                                        float* __restrict__ out, int H, int D, int nsplit) {
    const int h = blockIdx.x, t = blockIdx.y;
    const size_t base = ((size_t)t * H + h) * nsplit;
    float M = NEG_INF;
    for (int s = 0; s < nsplit; ++s) M = fmaxf(M, ml[2 * (base + s)]);
    float Ls = 0.f;
    for (int s = 0; s < nsplit; ++s) {
        const float ms = ml[2 * (base + s)];
        if (ms != NEG_INF) Ls += ml[2 * (base + s) + 1] * expf(ms - M);
    }
    const float inv = 1.f / Ls;
    for (int d = threadIdx.x; d < D; d += blockDim.x) {
        float a = 0.f;
        for (int s = 0; s < nsplit; ++s) {
            const float ms = ml[2 * (base + s)];
            if (ms != NEG_INF) a += part[(base + s) * D + d] * expf(ms - M);
        }
        out[((size_t)t * H + h) * D + d] = a * inv;
    }
}

#ifndef BLOCK_Q
#define BLOCK_Q 16
#endif
#ifndef ROWS_PER_WARP
#define ROWS_PER_WARP 4
#endif
#define KC 32

// grid (ceil(T / BLOCK_Q), H), block (BLOCK_Q / ROWS_PER_WARP) * 32, dynamic smem (BLOCK_Q * D + 2 * KC * (D + 4))
// floats. D % 4 == 0.
// Launch bounds: BLOCK_Q / ROWS_PER_WARP warps (up to 1024 threads) must fit the register file.
extern "C" __global__ void __launch_bounds__((BLOCK_Q / ROWS_PER_WARP) * 32) attn_flash(const float* __restrict__ q, const float* __restrict__ kc,
                                      const float* __restrict__ vc, float* __restrict__ out, int T,
                                      int H, int Hkv, int D, int pos0, const int* pos_ptr,
                                      float scale) {
    extern __shared__ float sm[];
    float* qs = sm;                 // [BLOCK_Q][D], pre-scaled
    // K rows padded to D + 4 floats: 16-byte lane reads of 8 lanes per phase hit distinct banks
    const int KS = D + 4;
    float* ks = qs + BLOCK_Q * D;   // [KC][KS]
    float* vs = ks + KC * KS;  // [KC][KS]
    const int t0 = blockIdx.x * BLOCK_Q, h = blockIdx.y, kvh = h / (H / Hkv);
    const int lane = threadIdx.x & 31, warp = threadIdx.x / 32, nthr = blockDim.x;
    const int p0 = pos_ptr ? *pos_ptr : pos0;
    for (int i = threadIdx.x; i < BLOCK_Q * D; i += nthr) {
        const int tt = t0 + i / D;
        qs[i] = tt < T ? q[((size_t)tt * H + h) * D + i % D] * scale : 0.f;
    }
    float m[ROWS_PER_WARP], l[ROWS_PER_WARP], acc[ROWS_PER_WARP][4];
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        m[r] = NEG_INF;
        l[r] = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) acc[r][i] = 0.f;
    }
    const int Lmax = p0 + min(t0 + BLOCK_Q, T);  // keys the last query of the tile sees
    for (int k0 = 0; k0 < Lmax; k0 += KC) {
        __syncthreads();
        for (int i = threadIdx.x; i < KC * D; i += nthr) {
            const int j = i / D, d = i % D, key = k0 + j;
            const bool ok = key < Lmax;
            ks[j * KS + d] = ok ? kc[((size_t)key * Hkv + kvh) * D + d] : 0.f;
            vs[j * KS + d] = ok ? vc[((size_t)key * Hkv + kvh) * D + d] : 0.f;
        }
        __syncthreads();
#pragma unroll
        for (int r = 0; r < ROWS_PER_WARP; ++r) {
            const int qi = warp * ROWS_PER_WARP + r, tq = t0 + qi;
            if (tq >= T) continue;  // warp-uniform
            const int pq = p0 + tq;
            if (k0 > pq) continue;  // the whole chunk is in this query's future
            const float4* qr = (const float4*)(qs + qi * D);
            const float4* kr = (const float4*)(ks + lane * KS);
            float s = 0.f;
            for (int d = 0; d < D / 4; ++d) {
                const float4 a = qr[d], b = kr[d];
                s += a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
            }
            if (k0 + lane > pq) s = NEG_INF;
            const float cmax = warp_max(s);
            const float mn = fmaxf(m[r], cmax), corr = expf(m[r] - mn);
            const float p = expf(s - mn);
            l[r] = l[r] * corr + warp_sum(p);
#pragma unroll
            for (int i = 0; i < 4; ++i) acc[r][i] *= corr;
            for (int j = 0; j < KC; ++j) {
                const float pj = __shfl_sync(0xffffffffu, p, j);
                const float* vr = vs + j * KS;
#pragma unroll
                for (int i = 0; i < 4; ++i) {
                    const int d = lane + 32 * i;
                    if (d < D) acc[r][i] += pj * vr[d];
                }
            }
            m[r] = mn;
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS_PER_WARP; ++r) {
        const int tq = t0 + warp * ROWS_PER_WARP + r;
        if (tq >= T) continue;
        const float inv = 1.f / l[r];
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int d = lane + 32 * i;
            if (d < D) out[((size_t)tq * H + h) * D + d] = acc[r][i] * inv;
        }
    }
}
