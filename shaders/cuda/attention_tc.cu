// attention_tc.cu: causal GQA prefill attention in one kernel on fp16 tensor cores
// (attention_prefill.flash_tc, engine/tuning/variants/cuda/; mma.sync m16n8k16, sm_80+).
//
//   out[t, h] = softmax_l(q[t, h] . K[l, h / G] / sqrt(D)) V[l, h / G],  l <= pos0 + t
//   q [T, H, D], cache [S, Hkv, D] float32, out [T, H, D] float32 (and, outh non-null, its
//   fp16 rounding: the o projection's GEMM input under matmul_prefill.resident fuse_f16)
//
// A block takes BLOCK_Q query rows of one head (16 per warp); Q is rounded to fp16 (pre-scaled by
// scale * log2(e), so the softmax uses exp2) and held in registers as mma A fragments. Keys go
// by tiles of BLOCK_K: the block converts the tile's K and V rows from the float32 cache to fp16
// shared memory, each warp computes S = Q K^T (fp32 accumulators), masks keys past each row's
// position, updates its rows' running max and sum (online softmax, FlashAttention-2), rounds
// P to fp16 A fragments in registers and accumulates O += P V (V through ldmatrix.trans).
// Shared rows are padded by 8 halves (ldmatrix rows on distinct banks).
// Tunables (defines): BLOCK_Q (query rows per block, 16 per warp), BLOCK_K (keys per tile).
// Kernels: attn_tc_d<D> for D = 32, 64, 96, 128. Grid (ceil(T / BLOCK_Q), H), block BLOCK_Q / 16 * 32,
// dynamic smem (BLOCK_Q + 2 * BLOCK_K) * (D + 8) * 2 bytes.
#include "tc.cuh"

#ifndef BLOCK_Q
#define BLOCK_Q 64
#endif
#ifndef BLOCK_K
#define BLOCK_K 64
#endif
#define FNW (BLOCK_Q / 16)
#define NEG_INF __int_as_float(0xff800000)

template <int D>
__device__ __forceinline__ void attn_tc(const float* __restrict__ q, const float* __restrict__ kc,
                                        const float* __restrict__ vc, float* __restrict__ out,
                                        u16* __restrict__ outh, int T, int H, int Hkv, int pos0,
                                        const int* pos_ptr, float qscale) {
    constexpr int LD = D + 8, D4 = D / 4;
    extern __shared__ __align__(16) u16 tc_sm[];
    u16* Qs = tc_sm;
    u16* Ks = Qs + BLOCK_Q * LD;
    u16* Vs = Ks + BLOCK_K * LD;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
    // the last query tiles (the most keys) first: the grid's tail is the short tiles
    const int t0 = (gridDim.x - 1 - blockIdx.x) * BLOCK_Q, h = blockIdx.y, kvh = h / (H / Hkv);
    const int p0 = pos_ptr ? *pos_ptr : pos0;
    for (int i = tid; i < BLOCK_Q * D4; i += FNW * 32) {
        const int r = i / D4, c = (i % D4) * 4, t = t0 + r;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (t < T) v = *(const float4*)(q + ((size_t)t * H + h) * D + c);
        *(uint2*)(Qs + r * LD + c) =
            make_uint2(f2h2(v.x * qscale, v.y * qscale), f2h2(v.z * qscale, v.w * qscale));
    }
    __syncthreads();
    u32 qf[D / 16][4];
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        tc_ldsm_x4(qf[kk], Qs + (warp * 16 + (lane & 15)) * LD + kk * 16 + (lane >> 4) * 8);
    float o[D / 8][4];
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    // this thread's two rows (gid, gid + 8 of the warp's 16): positions; rows past T act as
    // the last row (finite, never stored)
    int pr[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) pr[r] = p0 + min(t0 + warp * 16 + gid + 8 * r, T - 1);
    const int Lmax = p0 + min(t0 + BLOCK_Q, T);                // keys the block's last row sees
    const int Lwarp = p0 + min(t0 + warp * 16 + 16, T);    // ... and the warp's last row
    for (int k0 = 0; k0 < Lmax; k0 += BLOCK_K) {
        __syncthreads();  // the previous tile is consumed
        for (int i = tid; i < BLOCK_K * D4; i += FNW * 32) {
            const int j = i / D4, c = (i % D4) * 4, key = k0 + j;
            float4 kv = make_float4(0.f, 0.f, 0.f, 0.f), vv = kv;
            if (key < Lmax) {
                const size_t off = ((size_t)key * Hkv + kvh) * D + c;
                kv = *(const float4*)(kc + off);
                vv = *(const float4*)(vc + off);
            }
            *(uint2*)(Ks + j * LD + c) = make_uint2(f2h2(kv.x, kv.y), f2h2(kv.z, kv.w));
            *(uint2*)(Vs + j * LD + c) = make_uint2(f2h2(vv.x, vv.y), f2h2(vv.z, vv.w));
        }
        __syncthreads();
        if (k0 >= Lwarp) continue;  // warp-uniform: the tile is in all its rows' future
        float s[BLOCK_K / 8][4];
#pragma unroll
        for (int nb = 0; nb < BLOCK_K / 8; ++nb) s[nb][0] = s[nb][1] = s[nb][2] = s[nb][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
            for (int nb = 0; nb < BLOCK_K / 8; nb += 2) {
                u32 r4[4];
                tc_ldsm_x4(r4, Ks + (nb * 8 + (lane & 7) + ((lane >> 4) << 3)) * LD + kk * 16 +
                                   ((lane >> 3) & 1) * 8);
                tc_mma(s[nb], qf[kk], r4[0], r4[1]);
                tc_mma(s[nb + 1], qf[kk], r4[2], r4[3]);
            }
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int nb = 0; nb < BLOCK_K / 8; ++nb)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int key = k0 + nb * 8 + tig * 2 + (c & 1);
                if (key > pr[c >> 1]) s[nb][c] = NEG_INF;
                mx[c >> 1] = fmaxf(mx[c >> 1], s[nb][c]);
            }
        float corr[2], ls[2] = {0.f, 0.f};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            corr[r] = exp2f(m[r] - mx[r]);  // m = -inf at the first tile: 0
            m[r] = mx[r];
        }
        u32 pf[BLOCK_K / 16][4];
#pragma unroll
        for (int nb = 0; nb < BLOCK_K / 8; ++nb) {
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                s[nb][c] = exp2f(s[nb][c] - m[c >> 1]);
                ls[c >> 1] += s[nb][c];
            }
            pf[nb / 2][(nb & 1) * 2] = f2h2(s[nb][0], s[nb][1]);
            pf[nb / 2][(nb & 1) * 2 + 1] = f2h2(s[nb][2], s[nb][3]);
        }
#pragma unroll
        for (int r = 0; r < 2; ++r) l[r] = l[r] * corr[r] + ls[r];
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            o[dt][0] *= corr[0];
            o[dt][1] *= corr[0];
            o[dt][2] *= corr[1];
            o[dt][3] *= corr[1];
        }
#pragma unroll
        for (int kk = 0; kk < BLOCK_K / 16; ++kk)
#pragma unroll
            for (int dt = 0; dt < D / 8; dt += 2) {
                u32 r4[4];
                tc_ldsm_x4_t(r4, Vs + (kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8) * LD +
                                     dt * 8 + (lane >> 4) * 8);
                tc_mma(o[dt], pf[kk], r4[0], r4[1]);
                tc_mma(o[dt + 1], pf[kk], r4[2], r4[3]);
            }
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        l[r] = 1.f / l[r];
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
        const int t = t0 + warp * 16 + gid + 8 * r;
        if (t >= T) continue;
        const size_t e = ((size_t)t * H + h) * D + tig * 2;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
            const float a = o[dt][2 * r] * l[r], b = o[dt][2 * r + 1] * l[r];
            *(float2*)(out + e + dt * 8) = make_float2(a, b);
            if (outh) *(u32*)(outh + e + dt * 8) = f2h2(a, b);  // the o projection's input
        }
    }
}

// One kernel per head dim (the fragment arrays are sized by it).
#define ATTN_TC_KERNEL(name, D)                                                                 \
    extern "C" __global__ void __launch_bounds__(FNW * 32)                                      \
        attn_tc_##name(const float* q, const float* kc, const float* vc, float* out, u16* outh, \
                       int T, int H, int Hkv, int pos0, const int* pos_ptr, float qscale) {     \
        attn_tc<D>(q, kc, vc, out, outh, T, H, Hkv, pos0, pos_ptr, qscale);                     \
    }

ATTN_TC_KERNEL(d32, 32)
ATTN_TC_KERNEL(d64, 64)
ATTN_TC_KERNEL(d96, 96)
ATTN_TC_KERNEL(d128, 128)
