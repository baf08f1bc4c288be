// decode_fused.cu: kernels that do the work of several small ops of the decode schedule in one
// launch (fewer graph nodes per token). Each computes exactly what the ops it replaces compute,
// in the same order, so results are bit-identical to the unfused schedule.
//
// Variants (engine/tuning/kernels/cuda.py): no variant of its own; the knob rope.fuse_kv and
// the int8 decode paths (matmul_decode.mmvq / mmvw) pick these kernels:
//   rope_kv          q, k, v (+ their biases) -> RoPE of q (out) and of k, k and v written into
//                    the cache: the three bias adds, two ropes and kv_write of a layer
//   attn_combine_q8  attn_combine (attention.cu) that also writes the output's Q8_1 blocks,
//                    the attention-output projection's input
// Tunables: launch parameters only (threads per block), so nothing is compiled per config.
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
        const bool isq = i < nq;
        const long long e = isq ? i : i - nq;
        const int nh = isq ? H : Hkv;
        const int j = (int)(e % half);
        const long long th = e / half;  // t * nh + h
        const int t = (int)(th / nh), h = (int)(th % nh);
        const double ang = (double)(p0 + t) * pow((double)theta, -2.0 * j / D);
        double s, c;
        sincos(ang, &s, &c);
        const int ia = neox ? j : 2 * j, ib = neox ? j + half : 2 * j + 1;
        const float* x = isq ? q : k;
        const float* bias = isq ? bq : bk;
        const long long row = th * D;  // [T, nh * D] row-major: (t * nh + h) * D
        float xa = x[row + ia], xb = x[row + ib];
        if (bias) {
            xa = xa + bias[h * D + ia];
            xb = xb + bias[h * D + ib];
        }
        const double a = xa, b = xb;
        float* out = isq ? qo + row : kc + (p0 + t) * HkvD + (long long)h * D;
        out[ia] = (float)(a * c - b * s);
        out[ib] = (float)(a * s + b * c);
    }
}

// attention.cu's attn_combine for one token's heads (grid (H, T), block a multiple of 32
// threads) plus the Q8_1 blocks of out viewed as [T, H*D]: one value per lane, a warp per 32
// consecutive values (needs D % 32 == 0). The block count and rounding equal quantize_q8_1's.
extern "C" __global__ void attn_combine_q8(const float* __restrict__ part,
                                           const float* __restrict__ ml, float* __restrict__ out,
                                           signed char* __restrict__ xq, float2* __restrict__ xds,
                                           int H, int D, int nsplit) {
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
