// attn_gqa.cuh: the per-warp online-softmax steps of the grouped-query decode attentions
// (attn_decode.cu, attn_tile.cu): a warp holds up to H q heads of a KV group (head hh is
// warp + hh nw, those past G idle), a lane L float4s (lane + 32 c2) of each head's output.
#pragma once
#include "common.cuh"

// Before the first key: m = -inf, l = 0, acc = 0 for each head.
template <int H, int L>
__device__ __forceinline__ void gqa_init(float (&m)[H], float (&l)[H], float4 (&acc)[H][L]) {
#pragma unroll
    for (int hh = 0; hh < H; ++hh) {
        m[hh] = __int_as_float(0xff800000);  // -inf
        l[hh] = 0.f;
#pragma unroll
        for (int c2 = 0; c2 < L; ++c2) acc[hh][c2] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
}

// acc *= corr: a head's output rescaled to the new running max.
template <int L>
__device__ __forceinline__ void gqa_rescale(float4 (&acc)[L], float corr) {
#pragma unroll
    for (int c2 = 0; c2 < L; ++c2) {
        float4& a = acc[c2];
        a.x *= corr, a.y *= corr, a.z *= corr, a.w *= corr;
    }
}

// acc[hh] += p_j vf for key j of the tile: p_j lane j's p[hh] (a shuffle), vf the key's V row
// (this lane's float4s of it).
template <int H, int L>
__device__ __forceinline__ void gqa_pv(float4 (&acc)[H][L], const float (&p)[H],
                                       const float4 (&vf)[L], int j, int warp, int nw, int G,
                                       int D4) {
#pragma unroll
    for (int hh = 0; hh < H; ++hh) {
        if (warp + hh * nw >= G) continue;
        const float pj = __shfl_sync(0xffffffffu, p[hh], j);
#pragma unroll
        for (int c2 = 0; c2 < L; ++c2) {
            if (32 * c2 >= D4) break;  // warp-uniform: no lane holds this float4
            float4& a = acc[hh][c2];
            a.x = fmaf(pj, vf[c2].x, a.x);
            a.y = fmaf(pj, vf[c2].y, a.y);
            a.z = fmaf(pj, vf[c2].z, a.z);
            a.w = fmaf(pj, vf[c2].w, a.w);
        }
    }
}

// This lane's float4s of a head's output acc into the partials' row o (part [.., D4] float4s).
template <int L>
__device__ __forceinline__ void gqa_store_part(float* part, const float4 (&acc)[L], size_t o,
                                               int lane, int D4) {
#pragma unroll
    for (int c2 = 0; c2 < L; ++c2)
        if (lane + 32 * c2 < D4) ((float4*)part)[o * D4 + lane + 32 * c2] = acc[c2];
}
