// delta_net.cu: the gated delta rule of the hybrids' linear-attention layers (qwen35 / qwen3next),
// sequential over the T tokens of a call (decode: T = 1; a prefill chunk: T > 1).
//
// Per V head h (its q/k head kh = h / (Hv / Hk) "grouped", else h % Hk "tiled") and token t, with
// the head's state S [dk, dv]:
//   q, k L2-normalised here (q also by 1 / sqrt(dk));
//   S = exp(g) S;  u = beta (v - S^T k);  S += k u^T;  o = S^T q.
// Column j of S is all that output j needs, so a warp owns one column (lanes own its rows
// i = lane + 32 r, in registers for the whole call): S^T k and S^T q are warp sums. This is the
// seed's fixed kernel shape; its bug (lanes over the wrong axis: S k) is planted as
// DELTA_NET_SK (tests/planted).
//
// Variant: delta_net.sequential (engine/tuning/variants/cuda_hybrid.py). Tunables (defines):
//   WARPS       warps (state columns) per block; grid (ceil(dv / WARPS), Hv)
//   MAX_DK   the register array of a column (MAX_DK / 32 per lane), >= dk (the host checks)
//   STATE_TRANSPOSED  layout of the state between calls: 0 S [dk, dv] (lanes of a warp read a column:
//            stride dv, a cache line each), 1 S^T [dv, dk] (a column is contiguous: coalesced).
//            Read once and written once per call, so decode (T = 1) is where it shows: the
//            seed's 7x was this choice.
//   PREFETCH       tokens whose inputs (q, k, g, beta, v) sit in registers ahead of use: 1 loads each
//            token as it comes; 2, 4 or 8 keep a ring of PREFETCH tokens, each slot refilled with token
//            t + PREFETCH as soon as token t is consumed, so the loads of the next tokens are in
//            flight during this one's warp sums (the state's chain never waits on memory).
//            Same arithmetic in the same order for every PREFETCH (bit-identical outputs).
// q, k [T, Hk, dk], v [T, Hv, dv], g, beta [T, Hv], state [Hv, dk * dv] (read, then written in
// place), o [T, Hv, dv].
#include "common.cuh"

#if !defined(WARPS) || !defined(MAX_DK) || !defined(STATE_TRANSPOSED)
#error "delta_net.cu needs WARPS, MAX_DK and STATE_TRANSPOSED (engine/tuning/variants/cuda_hybrid.py)"
#endif

#define RPL (MAX_DK / 32)  // rows of a column per lane
#ifndef PREFETCH
#define PREFETCH 1
#endif
#if PREFETCH != 1 && PREFETCH != 2 && PREFETCH != 4 && PREFETCH != 8
#error "PREFETCH must be 1, 2, 4 or 8"
#endif

// One token's inputs for the warp of column j of V head h (q/k head kh).
struct DnIn {
    float k[RPL], q[RPL];
    float g, beta, v;
};

__device__ __forceinline__ void dn_load(DnIn& in, const float* __restrict__ q,
                                        const float* __restrict__ k, const float* __restrict__ v,
                                        const float* __restrict__ g,
                                        const float* __restrict__ beta, int t, int Hk, int Hv,
                                        int kh, int h, int dk, int dv, int j, int lane) {
    const float* kt = k + ((size_t)t * Hk + kh) * dk;
    const float* qt = q + ((size_t)t * Hk + kh) * dk;
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
        const int i = lane + 32 * r;
        in.k[r] = i < dk ? __ldg(kt + i) : 0.f;
        in.q[r] = i < dk ? __ldg(qt + i) : 0.f;
    }
    const size_t th = (size_t)t * Hv + h;
    in.g = __ldg(g + th);
    in.beta = __ldg(beta + th);
    in.v = __ldg(v + th * dv + j);
}

// Token t through column j's state s (the gated delta rule), its output into o.
__device__ __forceinline__ void dn_step(float* s, const DnIn& in, float* __restrict__ o, int t,
                                        int Hv, int h, int dv, int j, int lane, float eps,
                                        float inv_sqrt_dk) {
    float sk = 0.f, sq = 0.f;
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
        sk += in.k[r] * in.k[r];
        sq += in.q[r] * in.q[r];
    }
    const float rk = rsqrtf(warp_sum(sk) + eps);
    const float rq = rsqrtf(warp_sum(sq) + eps) * inv_sqrt_dk;
    const float decay = expf(in.g);
    float pred = 0.f;  // (S^T k)_j, k not yet normalised
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
        s[r] *= decay;
        pred += s[r] * in.k[r];
    }
    pred = warp_sum(pred) * rk;
    const float u = in.beta * (in.v - pred) * rk;  // k u, k normed
    float acc = 0.f;
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
        s[r] += in.k[r] * u;
        acc += s[r] * in.q[r];
    }
    acc = warp_sum(acc);
    if (lane == 0) o[((size_t)t * Hv + h) * dv + j] = acc * rq;
}

// The state's element (row i, column j) of one head, in the layout the config chose.
__device__ __forceinline__ size_t state_at(int i, int j, int dk, int dv, bool transposed) {
    return transposed ? (size_t)j * dk + i : (size_t)i * dv + j;
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
    delta_net_seq(const float* __restrict__ q, const float* __restrict__ k,
                  const float* __restrict__ v, const float* __restrict__ g,
                  const float* __restrict__ beta, float* __restrict__ state,
                  float* __restrict__ o, int T, int Hk, int Hv, int dk, int dv, int grouped,
                  float eps) {
    pdl_start();  // (matmul_decode.pdl: chained into the decode step's dependent launches)
    const int lane = threadIdx.x & 31;
    const int j = blockIdx.x * WARPS + threadIdx.x / 32;  // the warp's state column
    const int h = blockIdx.y;
    if (j >= dv) return;  // a whole warp; the kernel has no block-level barrier
    const int kh = grouped ? h / (Hv / Hk) : h % Hk;
    float* sh = state + (size_t)h * dk * dv;
    bool transposed = STATE_TRANSPOSED != 0;
    const bool swap = false;
    float s[RPL];
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
        const int i = lane + 32 * r;
        s[r] = i < dk ? sh[swap ? state_at(j, i, dk, dv, transposed)
                                : state_at(i, j, dk, dv, transposed)]
                      : 0.f;
    }
    const float inv_sqrt_dk = rsqrtf((float)dk);
#if PREFETCH == 1
    for (int t = 0; t < T; ++t) {
        DnIn in;
        dn_load(in, q, k, v, g, beta, t, Hk, Hv, kh, h, dk, dv, j, lane);
        dn_step(s, in, o, t, Hv, h, dv, j, lane, eps, inv_sqrt_dk);
    }
#else
    DnIn ring[PREFETCH];  // slot u holds token t0 + u (constant indices after unrolling: registers)
#pragma unroll
    for (int u = 0; u < PREFETCH; ++u)
        if (u < T) dn_load(ring[u], q, k, v, g, beta, u, Hk, Hv, kh, h, dk, dv, j, lane);
    for (int t0 = 0; t0 < T; t0 += PREFETCH) {
#pragma unroll
        for (int u = 0; u < PREFETCH; ++u) {
            const int t = t0 + u;
            if (t < T) {
                dn_step(s, ring[u], o, t, Hv, h, dv, j, lane, eps, inv_sqrt_dk);
                if (t + PREFETCH < T)
                    dn_load(ring[u], q, k, v, g, beta, t + PREFETCH, Hk, Hv, kh, h, dk, dv, j, lane);
            }
        }
    }
#endif
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
        const int i = lane + 32 * r;
        if (i < dk)
            sh[swap ? state_at(j, i, dk, dv, transposed) : state_at(i, j, dk, dv, transposed)] =
                s[r];
    }
}
