#version 450
// moe_matvec.comp: expert matrix-vector products reading only the chosen experts (MoE decode,
// and prefill as one product per token and slot). For pair p = t * k_used + j with expert
// e = ids[p]: y[p, n] = dequant(W)[e * N + n, :] . x[p / x_div, :], W the stacked experts
// [E * N, K] (raw GGML rows). gate/up read x per token (x_div = k_used), down reads its pair's
// row (x_div = 1).
// Second pass (PASS_COMBINE): the routed outputs weighted and summed per token,
// y[t, c] = sum_j w[t, j] * d[t * k + j, c], one thread per output.
// Variants: dmmv, and grouped's decode (QTYPE_<type> selects the weight type). Tunables: 0 WG_SIZE, 1 ROWS_PER_WG,
// 2 THREADS_PER_ROW (power of two <= WG_SIZE; the row's partial sums meet in shared memory).
// Bindings: 0 W, 1 x, 2 ids [pairs] (int32), 3 y [pairs, N]; PASS_COMBINE: 0 d, 1 w [T, k], 2 y.

#extension GL_GOOGLE_include_directive : require

layout(constant_id = 0) const uint WG_SIZE = 64;
layout(constant_id = 1) const uint ROWS_PER_WG = 4;
layout(constant_id = 2) const uint THREADS_PER_ROW = 16;
// moe_experts.grouped's prefill knob (moe_grouped.comp), which runs this kernel for decode.
layout(constant_id = 3) const uint TILE_P = 16;
layout(local_size_x_id = 0) in;

#include "common.glsl"

#if defined(PASS_COMBINE)
layout(binding = 0) readonly buffer DBuf { float ds[]; };
layout(binding = 1) readonly buffer CWBuf { float cws[]; };
layout(binding = 2) writeonly buffer CYBuf { float cys[]; };

layout(push_constant) uniform PC {
    uint T;
    uint C;
    uint k;
    uint d_off;
    uint w_off;
    uint y_off;
} pc;

void main() {
    uint i = wg_linear() * WG_SIZE + gl_LocalInvocationID.x;
    if (i >= pc.T * pc.C) return;
    uint t = i / pc.C, c = i % pc.C;
    float acc = 0.0;
    for (uint j = 0u; j < pc.k; ++j)
        acc += cws[pc.w_off + t * pc.k + j] * ds[pc.d_off + (t * pc.k + j) * pc.C + c];
    cys[pc.y_off + i] = acc;
}

#else
layout(binding = 0) readonly buffer WBuf { uint Wq[]; };
layout(binding = 1) readonly buffer XBuf { float xs[]; };
layout(binding = 2) readonly buffer IBuf { int ids[]; };
layout(binding = 3) writeonly buffer YBuf { float ys[]; };

layout(push_constant) uniform PC {
    uint K;
    uint N;          // rows per expert
    uint row_bytes;
    uint x_off;
    uint y_off;
    uint ids_off;
    uint row_blocks;  // workgroups per pair: ceil(N / ROWS_PER_WG)
    uint x_div;
} pc;

#include "dequant.glsl"

float dot8(uint row_base, uint xb0, uint g) {
    uint blk = g / GPB, j = g % GPB;
    uint k = g * 8u;
    vec4 lo, hi;
    dq8(row_base + blk * QBYTES, j, pc.K - k, lo, hi);
    uint xb = xb0 + k;
#if defined(FLOAT_W)
    if (k + 8u > pc.K) {
        float s = 0.0;
        float w[8] = float[8](lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
        for (uint i = 0u; i < pc.K - k; i++) s += w[i] * xs[xb + i];
        return s;
    }
#endif
    vec4 x0 = vec4(xs[xb], xs[xb + 1u], xs[xb + 2u], xs[xb + 3u]);
    vec4 x1 = vec4(xs[xb + 4u], xs[xb + 5u], xs[xb + 6u], xs[xb + 7u]);
    return dot(lo, x0) + dot(hi, x1);
}

shared float red[WG_SIZE];

void main() {
    uint wg = wg_linear();
    uint pair = wg / pc.row_blocks;
    uint row0 = (wg % pc.row_blocks) * ROWS_PER_WG;
    uint e = uint(ids[pc.ids_off + pair]);
    uint xb0 = pc.x_off + (pair / pc.x_div) * pc.K;
    uint tid = gl_LocalInvocationID.x;
    uint lane = tid % THREADS_PER_ROW;
    uint slot = tid / THREADS_PER_ROW;
    const uint rows_per_pass = WG_SIZE / THREADS_PER_ROW;
    uint groups = (pc.K + 7u) / 8u;
    for (uint r0 = 0u; r0 < ROWS_PER_WG; r0 += rows_per_pass) {  // uniform: barriers are legal
        uint row = row0 + r0 + slot;
        bool live = r0 + slot < ROWS_PER_WG && row < pc.N;
        float acc = 0.0;
        if (live) {
            uint row_base = (e * pc.N + row) * pc.row_bytes;
            for (uint g = lane; g < groups; g += THREADS_PER_ROW) acc += dot8(row_base, xb0, g);
        }
        red[tid] = acc;
        barrier();
        for (uint s = THREADS_PER_ROW / 2u; s > 0u; s >>= 1) {
            if (lane < s) red[tid] += red[tid + s];
            barrier();
        }
        if (live && lane == 0u) ys[pc.y_off + pair * pc.N + row] = red[tid];
        barrier();
    }
}
#endif
