// delta_net.cu: the gated delta rule of the hybrids' linear-attention layers (qwen35 / qwen3next),
// sequential over the T tokens of a call (decode: T = 1; a prefill chunk: T > 1).
//
// Per V head h (its q/k head kh = h / (Hv / Hk) "grouped", else h % Hk "tiled") and token t, with
// the head's state S [dk, dv]:
//   q, k L2-normalised here (q also by 1 / sqrt(dk));
//   S = exp(g) S;  u = beta (v - S^T k);  S += k u^T;  o = S^T q.
// Column j of S is all that output j needs, so a warp owns one column (lanes own its rows
// i = lane + 32 r, in registers for the whole call): S^T k and S^T q are warp sums. This is the
// seed's fixed kernel shape; its bug (lanes over the wrong axis: S k) is MUTANT_DELTA_NET_SK.
//
// Variant: delta_net.sequential (engine/tuning/kernels/cuda_hybrid.py). Tunables (defines):
//   NW       warps (state columns) per block; grid (ceil(dv / NW), Hv)
//   MAX_DK   the register array of a column (MAX_DK / 32 per lane), >= dk (the host checks)
//   STATE_T  layout of the state between calls: 0 S [dk, dv] (lanes of a warp read a column:
//            stride dv, a cache line each), 1 S^T [dv, dk] (a column is contiguous: coalesced).
//            Read once and written once per call, so decode (T = 1) is where it shows: the
//            seed's 7x was this choice.
// q, k [T, Hk, dk], v [T, Hv, dv], g, beta [T, Hv], state [Hv, dk * dv] (read, then written in
// place), o [T, Hv, dv].
#include "common.cuh"

#if !defined(NW) || !defined(MAX_DK) || !defined(STATE_T)
#error "delta_net.cu needs NW, MAX_DK and STATE_T (engine/tuning/kernels/cuda_hybrid.py)"
#endif

#define RPL (MAX_DK / 32)  // rows of a column per lane

// The state's element (row i, column j) of one head, in the layout the config chose.
__device__ __forceinline__ size_t state_at(int i, int j, int dk, int dv, bool transposed) {
    return transposed ? (size_t)j * dk + i : (size_t)i * dv + j;
}

extern "C" __global__ void __launch_bounds__(NW * 32)
    delta_net_seq(const float* __restrict__ q, const float* __restrict__ k,
                  const float* __restrict__ v, const float* __restrict__ g,
                  const float* __restrict__ beta, float* __restrict__ state,
                  float* __restrict__ o, int T, int Hk, int Hv, int dk, int dv, int grouped,
                  float eps) {
    pdl_start();  // (matmul_decode.pdl: chained into the decode step's dependent launches)
    const int lane = threadIdx.x & 31;
    const int j = blockIdx.x * NW + threadIdx.x / 32;  // the warp's state column
    const int h = blockIdx.y;
    if (j >= dv) return;  // a whole warp; the kernel has no block-level barrier
    const int kh = grouped ? h / (Hv / Hk) : h % Hk;
    float* sh = state + (size_t)h * dk * dv;
    bool transposed = STATE_T != 0;
#ifdef MUTANT_DELTA_NET_SK
    // planted bug (prefill only, as the seed's warp kernel): the warp walks row j instead of
    // column j, so every contraction runs over the wrong axis; its prediction for k is S k.
    const bool swap = T > 1 && dk == dv;
#else
    const bool swap = false;
#endif
    float s[RPL];
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
        const int i = lane + 32 * r;
        s[r] = i < dk ? sh[swap ? state_at(j, i, dk, dv, transposed)
                                : state_at(i, j, dk, dv, transposed)]
                      : 0.f;
    }
    const float inv_sqrt_dk = rsqrtf((float)dk);
    for (int t = 0; t < T; ++t) {
        const float* kt = k + ((size_t)t * Hk + kh) * dk;
        const float* qt = q + ((size_t)t * Hk + kh) * dk;
        float kr[RPL], qr[RPL];
        float sk = 0.f, sq = 0.f;
#pragma unroll
        for (int r = 0; r < RPL; ++r) {
            const int i = lane + 32 * r;
            kr[r] = i < dk ? __ldg(kt + i) : 0.f;
            qr[r] = i < dk ? __ldg(qt + i) : 0.f;
            sk += kr[r] * kr[r];
            sq += qr[r] * qr[r];
        }
        const float rk = rsqrtf(warp_sum(sk) + eps);
        const float rq = rsqrtf(warp_sum(sq) + eps) * inv_sqrt_dk;
        const size_t th = (size_t)t * Hv + h;
        const float decay = expf(__ldg(g + th));
        float pred = 0.f;  // (S^T k)_j, k not yet normalised
#pragma unroll
        for (int r = 0; r < RPL; ++r) {
            s[r] *= decay;
            pred += s[r] * kr[r];
        }
        pred = warp_sum(pred) * rk;
        const float u = __ldg(beta + th) * (__ldg(v + th * dv + j) - pred) * rk;  // k u, k normed
        float acc = 0.f;
#pragma unroll
        for (int r = 0; r < RPL; ++r) {
            s[r] += kr[r] * u;
            acc += s[r] * qr[r];
        }
        acc = warp_sum(acc);
        if (lane == 0) o[th * dv + j] = acc * rq;
    }
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
        const int i = lane + 32 * r;
        if (i < dk)
            sh[swap ? state_at(j, i, dk, dv, transposed) : state_at(i, j, dk, dv, transposed)] =
                s[r];
    }
}
