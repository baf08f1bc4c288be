// attention_gemm.cu: causal GQA prefill attention on tensor cores through cuBLAS
// (attention_prefill.gemm, engine/tuning/variants/cuda/; host side CudaBackend._attn_gemm).
//
//   out[t, h] = softmax_l(q[t, h] . K[l, h / G] * scale) V[l, h / G],  l <= pos0 + t
//
// The backend packs q and the cache rows [0, L) to fp16 head-major arrays (each kv head
// repeated for its G query heads, so every cuBLAS batch has one stride), then per pass of
// query rows [t0, t1): S = Q K^T (cuBLAS strided-batched, fp16 in, fp32 accumulate and out,
// scale as alpha), attg_softmax (causal mask, fp16 P), O = P V written by cuBLAS straight into
// out [T, H, D]. Key counts are padded to a multiple of 8 (cuBLAS tensor-op alignment): padded
// keys are zero in K and V and zero in P.
// Tunables: the softmax's warps per block (launch); the pass length is host scheduling.
#include "common.cuh"

#define NEG_INF __int_as_float(0xff800000)

// q [T, H, D] f32 -> qh [H, T, D] f16 (a thread per element of q: coalesced reads).
extern "C" __global__ void attg_pack_q(const float* __restrict__ q, u16* __restrict__ qh, int T,
                                       int H, int D) {
    const long long n = (long long)T * H * D;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int d = (int)(i % D);
        const long long th = i / D;
        const int h = (int)(th % H), t = (int)(th / H);
        qh[((size_t)h * T + t) * D + d] = f2h(q[i]);
    }
}

// cache rows [0, L) of kc, vc [S, Hkv, D] -> kh, vh [H, Lp, D] f16, the kv head of query head
// h in slot h; rows [L, Lp) zero (P is zero there too, and 0 * garbage may be NaN).
extern "C" __global__ void attg_pack_kv(const float* __restrict__ kc, const float* __restrict__ vc,
                                        u16* __restrict__ kh, u16* __restrict__ vh, int L, int Lp,
                                        int H, int Hkv, int D) {
    const long long n = (long long)H * Lp * D;
    const int G = H / Hkv;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int d = (int)(i % D);
        const long long r = i / D;
        const int l = (int)(r % Lp), h = (int)(r / Lp);
        float k = 0.f, v = 0.f;
        if (l < L) {
            const size_t src = ((size_t)l * Hkv + h / G) * D + d;
            k = kc[src];
            v = vc[src];
        }
        kh[i] = f2h(k);
        vh[i] = f2h(v);
    }
}

// S [rows = H * tb, Lp] f32 (scaled scores of one pass) -> P [rows, Lp] f16: row (h, i) is
// query t0 + i at position qpos0 + i (qpos0 = pos0 + t0) and sees keys l <= qpos0 + i; P is
// zero past them. One warp per row, blockDim.x / 32 rows per block.
extern "C" __global__ void attg_softmax(const float* __restrict__ S, u16* __restrict__ P, int rows,
                                        int tb, int Lp, int qpos0) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= rows) return;
    const int n = qpos0 + row % tb + 1;
    const float* s = S + (size_t)row * Lp;
    u16* p = P + (size_t)row * Lp;
    float m = NEG_INF;
    for (int l = lane; l < n; l += 32) m = fmaxf(m, s[l]);
    m = warp_max(m);
    float sum = 0.f;
    for (int l = lane; l < n; l += 32) sum += expf(s[l] - m);
    const float inv = 1.f / warp_sum(sum);
    for (int l = lane; l < Lp; l += 32) p[l] = f2h(l < n ? expf(s[l] - m) * inv : 0.f);
}
