// decode_fused.cu: kernels that do the work of several small ops of the decode schedule in one
// launch (fewer graph nodes per token). Each computes what the ops it replaces compute, with the
// same arithmetic in the same order.
//
// Variants (engine/tuning/variants/cuda/): argmax.multi; the knob rope.fuse_kv and the int8
// decode paths (matmul_decode.mmvq / mmvw) pick the others:
//   rope_kv          q, k, v (+ their biases) -> RoPE of q (out) and of k, k and v written into
//                    the cache: the three bias adds, two ropes and kv_write of a layer
//   attn_combine_q8  attn_combine (attention.cu) that also writes the output's Q8_1 blocks,
//                    the attention-output projection's input
//   argmax_multi     argmax.multi: a row's argmax over many blocks in one launch
// Tunables: launch parameters only (threads, blocks), so nothing is compiled per config.
// Positions: a scalar and a device pointer (non-null wins), as in elementwise.cu.
#include "common.cuh"

#define NEG_INF __int_as_float(0xff800000)

// q [T, H*D], k, v [T, Hkv*D] (matmul outputs), biases [H*D] / [Hkv*D] or null ->
// qo [T, H, D] roped, kc / vc [S, Hkv*D] rows pos0 .. pos0 + T - 1 (k roped). One thread per
// rotated pair of q or k, then one per element of v; angle in double, as in elementwise.cu's
// rope, and the bias added in float before it, as add_bias does.
extern "C" __global__ void rope_kv(const float* __restrict__ q, const float* __restrict__ k,
                                   const float* __restrict__ v, const float* bq,
                                   const float* bk, const float* bv, float* __restrict__ qo,
                                   float* __restrict__ kc, float* __restrict__ vc, int T, int H,
                                   int Hkv, int D, int pos0, const int* pos_ptr, float theta,
                                   int neox) {
    pdl_start();
    const int half = D / 2;
    const long long nq = (long long)T * H * half, nk = (long long)T * Hkv * half;
    const long long nv = (long long)T * Hkv * D;
    const int p0 = pos_ptr ? *pos_ptr : pos0;
    const long long HkvD = (long long)Hkv * D;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < nq + nk + nv;
         i += (long long)gridDim.x * blockDim.x) {
        if (i >= nq + nk) {  // v: bias, then the cache row
            const long long e = i - nq - nk, t = e / HkvD, c = e % HkvD;
            vc[(p0 + t) * HkvD + c] = bv ? v[e] + bv[c] : v[e];
            continue;
        }
        const RopeSlot rs = rope_slot(i, nq, H, Hkv, half);
        const bool isq = rs.isq;
        const int j = rs.j, t = rs.t, h = rs.h;
        const long long th = rs.th;
        const int ia = neox ? j : 2 * j, ib = neox ? j + half : 2 * j + 1;
        const float* x = isq ? q : k;
        const float* bias = isq ? bq : bk;
        const long long row = th * D;  // [T, nh * D] row-major: (t * nh + h) * D
        float xa = x[row + ia], xb = x[row + ib];
        if (bias) {
            xa = xa + bias[h * D + ia];
            xb = xb + bias[h * D + ib];
        }
        float* out = isq ? qo + row : kc + (p0 + t) * HkvD + (long long)h * D;
        rope_pair(xa, xb, j, D, p0 + t, theta, neox, out);
    }
}

// attention.cu's attn_combine for one token's heads (grid (H, T), block a multiple of 32
// threads) plus the Q8_1 blocks of out viewed as [T, H*D]: one value per lane, a warp per 32
// consecutive values (needs D % 32 == 0). The block count and rounding equal quantize_q8_1's.
extern "C" __global__ void attn_combine_q8(const float* __restrict__ part,
                                           const float* __restrict__ ml, float* __restrict__ out,
                                           signed char* __restrict__ xq, float2* __restrict__ xds,
                                           int H, int D, int nsplit) {
    pdl_start();
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
    const int Dr = (D + blockDim.x - 1) / blockDim.x * blockDim.x;  // whole warps: shuffles
    for (int d = threadIdx.x; d < Dr; d += blockDim.x) {
        const bool ok = d < D;
        float a = 0.f;
        if (ok) {
            for (int s = 0; s < nsplit; ++s) {
                const float ms = ml[2 * (base + s)];
                if (ms != NEG_INF) a += part[(base + s) * D + d] * expf(ms - M);
            }
            a = a * inv;
        }
        const size_t e = ((size_t)t * H + h) * D + d;
        const float amax = warp_max(fabsf(a));
        const float dq = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
        const int qv = __float2int_rn(a * id);
        int sq = qv;
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
        if (!ok) continue;
        out[e] = a;
        xq[e] = (signed char)qv;
        if ((threadIdx.x & 31) == 0) xds[e / 32] = make_float2(dq, dq * (float)sq);
    }
}

// argmax.multi: logits [T, V] -> out [T] int32, the first maximum (NaN never wins), as
// elementwise.cu's argmax, over gridDim.x blocks per row instead of one: block b reduces its
// slice to (value, index) in pv / pi [T, B]; the row's last block to finish (a ticket counter,
// reset to 0 by that block, so a captured graph replays it) reduces the B partials.
__device__ __forceinline__ void better(float v, int i, float& best, int& bi) {
    if (v > best || (v == best && i < bi)) {
        best = v;
        bi = i;
    }
}

// (best, bi) of the block into thread 0; every thread must call it.
__device__ __forceinline__ void block_argmax(float& best, int& bi) {
    __shared__ float sv[32];
    __shared__ int si[32];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        better(ov, oi, best, bi);
    }
    const int w = threadIdx.x / 32, nw = blockDim.x / 32;
    __syncthreads();  // sv / si may still be read by an earlier call
    if ((threadIdx.x & 31) == 0) {
        sv[w] = best;
        si[w] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0)
        for (int i = 1; i < nw; ++i) better(sv[i], si[i], best, bi);
}

extern "C" __global__ void argmax_multi(const float* __restrict__ x, int V, int* __restrict__ out,
                                        float* pv, int* pi, unsigned int* ticket) {
    __shared__ bool last;
    pdl_start();
    const int t = blockIdx.y, b = blockIdx.x, B = gridDim.x;
    const int chunk = (V + B - 1) / B, lo = b * chunk, hi = min(V, lo + chunk);
    const float* r = x + (size_t)t * V;
    float best = __int_as_float(0xff800000);  // -inf
    int bi = 0x7fffffff;
    for (int i = lo + threadIdx.x; i < hi; i += blockDim.x) {
        const float v = r[i];
        if (v > best) {  // strided walk: a later equal value never replaces an earlier one
            best = v;
            bi = i;
        }
    }
    block_argmax(best, bi);
    if (threadIdx.x == 0) {
        pv[(size_t)t * B + b] = best;
        pi[(size_t)t * B + b] = bi;
        __threadfence();  // the partial is visible before the ticket says so
        last = atomicAdd(ticket + t, 1u) == (unsigned)(B - 1);
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    best = __int_as_float(0xff800000);
    bi = 0x7fffffff;
    for (int i = threadIdx.x; i < B; i += blockDim.x)  // L2 reads: other blocks' partials
        better(__ldcg(pv + (size_t)t * B + i), __ldcg(pi + (size_t)t * B + i), best, bi);
    block_argmax(best, bi);
    if (threadIdx.x == 0) {
        out[t] = bi == 0x7fffffff ? 0 : bi;
        ticket[t] = 0;
    }
}
