// topk.cuh: the MoE router's top-k of one token, a warp's work (hybrid.cu router_topk and
// moe_dec.cu's fused route, whose grid's last block reads logits other blocks wrote: hence the
// L2 loads, __ldcg, which read what any block stored before a fence).
#pragma once
#include "common.cuh"

// The k winners' weights from their logits (lane r < k: round r's): exp(z - max) over their sum.
__device__ __forceinline__ void topk_weights(float mine, int k, float* __restrict__ w, int lane,
                                             bool renorm) {
    const float top = __shfl_sync(0xffffffffu, mine, 0);  // round 0: the largest
    const float e = lane < k ? expf(mine - top) : 0.f;
    const float sum = warp_sum(e);
    if (lane < k) w[lane] = renorm ? e / sum : e;
}

// z [E] (E <= 1024) -> ids [k] (largest first, ties to the lower index: a stable sort's order),
// w [k] = softmax of the chosen logits: the full softmax renormalised over the chosen k (its
// denominator cancels). Called by all 32 lanes of a warp; lane l owns experts l + 32 m.
// renorm false is a planted bug only (tests/planted's MOE_DEC_UNNORMALISED: exp(z - max)
// of the chosen, never divided by their sum).
__device__ __forceinline__ void topk_row(const float* z, int E, int k, int* __restrict__ ids,
                                         float* __restrict__ w, int lane, bool renorm = true) {
    unsigned taken = 0u;  // bit m: expert lane + 32 m already chosen
    float mine = 0.f;     // lane r < k: the logit chosen in round r
    for (int r = 0; r < k; ++r) {
        float best = 0.f;
        int bi = 0x7fffffff;
        for (int m = 0; lane + 32 * m < E; ++m) {
            const float v = __ldcg(z + lane + 32 * m);
            if (!((taken >> m) & 1u) && v == v && (bi == 0x7fffffff || v > best)) {  // no NaN
                best = v;
                bi = lane + 32 * m;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            if (oi != 0x7fffffff && (bi == 0x7fffffff || ov > best || (ov == best && oi < bi))) {
                best = ov;
                bi = oi;
            }
        }
        if (bi == 0x7fffffff) bi = 0;  // only NaN left: a valid index all the same
        if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
        if (lane == r) mine = best;
        if (lane == 0) ids[r] = bi;
    }
    topk_weights(mine, k, w, lane, renorm);
}

// moe_experts.topk_regs: topk_row with the token's logits loaded once into registers (lane l:
// experts l + 32 m, m < M, all M loads in flight together) where topk_row reads them from L2
// again in each of its k rounds, a few loads at a time: a 256-expert top-8 waited on ~16 L2
// round trips in a row. Same rounds, same comparisons, same ties: the same ids and weights.
#define TOPK_TIE_LOW true
template <int M>
__device__ __forceinline__ void topk_row_regs_m(const float* z, int E, int k,
                                                int* __restrict__ ids, float* __restrict__ w,
                                                int lane, bool renorm) {
    constexpr int NONE = 0x7fffffff;
    float v[M];
#pragma unroll
    for (int m = 0; m < M; ++m) v[m] = lane + 32 * m < E ? __ldcg(z + lane + 32 * m) : 0.f;
    unsigned taken = 0u;  // bit m: expert lane + 32 m already chosen
    float mine = 0.f;     // lane r < k: the logit chosen in round r
    for (int r = 0; r < k; ++r) {
        float best = 0.f;
        int bi = NONE;
#pragma unroll
        for (int m = 0; m < M; ++m) {
            const bool in = lane + 32 * m < E && !((taken >> m) & 1u) && v[m] == v[m];  // no NaN
            if (in && (bi == NONE || v[m] > best)) {
                best = v[m];
                bi = lane + 32 * m;
            }
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
            const float ov = __shfl_xor_sync(0xffffffffu, best, o);
            const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
            const bool tie = ov == best && (TOPK_TIE_LOW ? oi < bi : oi > bi);
            if (oi != NONE && (bi == NONE || ov > best || tie)) {
                best = ov;
                bi = oi;
            }
        }
        if (bi == NONE) bi = 0;  // only NaN left: a valid index all the same
        if ((bi & 31) == lane) taken |= 1u << (bi >> 5);
        if (lane == r) mine = best;
        if (lane == 0) ids[r] = bi;
    }
    topk_weights(mine, k, w, lane, renorm);
}

// topk_row_regs_m with M = the smallest of 1, 2, 4, 8, 16, 32 that holds E (E <= 1024).
__device__ __forceinline__ void topk_row_regs(const float* z, int E, int k, int* __restrict__ ids,
                                              float* __restrict__ w, int lane,
                                              bool renorm = true) {
    if (E <= 32) topk_row_regs_m<1>(z, E, k, ids, w, lane, renorm);
    else if (E <= 64) topk_row_regs_m<2>(z, E, k, ids, w, lane, renorm);
    else if (E <= 128) topk_row_regs_m<4>(z, E, k, ids, w, lane, renorm);
    else if (E <= 256) topk_row_regs_m<8>(z, E, k, ids, w, lane, renorm);
    else if (E <= 512) topk_row_regs_m<16>(z, E, k, ids, w, lane, renorm);
    else topk_row_regs_m<32>(z, E, k, ids, w, lane, renorm);
}
