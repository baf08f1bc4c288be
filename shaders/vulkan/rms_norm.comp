#version 450
// rms_norm.comp: y = x / sqrt(mean(x^2) + eps) * w over the last dim D, one workgroup per row.
// Used for [T, C] rows and for per-head [T, H, D] (qwen3 q/k norms): rows = T or T * H.
// Variants: one. Tunables: 0 WG_SIZE (power of two; the sum of squares is a shared-memory tree).
// Bindings: 0 x, 1 w [D] (float32: 1-D weights are dequantized at load), 2 y.
// OUT_Q8 (matmul_decode.mmvw's norm pass): y is also written as Q8_1 rows (q8_1.glsl) to
// binding 3 at word q_off (D % 32 == 0), a thread per 32-block: the next matmul needs no
// quantize dispatch. With COALESCED (one row): ceil(D / WG_SIZE) workgroups each sum the
// whole row's squares and store WG_SIZE of its values, a thread per value.
// ADD_RES (rms_norm.fuse_add's pass "add"): the residual add before the norm in the same
// dispatch: s = r + x is stored to binding 4 at s_off (the new residual stream, the same bits
// as the add kernel's r + x) and y = rms_norm(s) * w; binding 3 is r at r_off.
// OUT_F16 (with ADD_RES; matmul_prefill.fuse_x16): y's rows also as the resident GEMM's padded
// fp16 input (matmul_f16.comp PASS_X16's layout: [rows, kp] halves, zeros past D, a word per
// pair) to binding 5 at word h_off: the next GEMMs need no conversion dispatch.

#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require

layout(constant_id = 0) const uint WG_SIZE = 256;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer XBuf { float xs[]; };
layout(binding = 1) readonly buffer WBuf { float ws[]; };
layout(binding = 2) writeonly buffer YBuf { float ys[]; };
#ifdef OUT_Q8
layout(binding = 3) writeonly buffer QBuf { uint q8w[]; };
#endif
#ifdef ADD_RES
layout(binding = 3) readonly buffer RBuf { float rs[]; };
layout(binding = 4) writeonly buffer SBuf { float ss_out[]; };
#ifdef OUT_F16
layout(binding = 5) writeonly buffer HBuf { uint hs[]; };
#endif
#endif

layout(push_constant) uniform PC {
    uint D;
    uint rows;
    uint x_off;
    uint w_off;
    uint y_off;
    float eps;
#ifdef OUT_Q8
    uint q_off;
#endif
#ifdef ADD_RES
    uint r_off;
    uint s_off;
#ifdef OUT_F16
    uint kp;
    uint h_off;
#endif
#endif
} pc;

#include "common.glsl"
#ifdef OUT_Q8
#include "q8_1.glsl"
#endif

shared float red[WG_SIZE];

void main() {
#if defined(OUT_Q8) && defined(COALESCED)
    uint row = 0u;  // one row; workgroup i stores values i * WG_SIZE .. (each sums the row)
#else
    uint row = wg_linear();
    if (row >= pc.rows) return;  // uniform per workgroup
#endif
    uint tid = gl_LocalInvocationID.x;
    uint xb = pc.x_off + row * pc.D, yb = pc.y_off + row * pc.D;
    float ss = 0.0;
#ifdef ADD_RES
    uint rb = pc.r_off + row * pc.D, sb = pc.s_off + row * pc.D;
    for (uint d = tid; d < pc.D; d += WG_SIZE) {
        float v = rs[rb + d] + xs[xb + d];
        ss_out[sb + d] = v;
        ss += v * v;
    }
#else
    for (uint d = tid; d < pc.D; d += WG_SIZE) {
        float v = xs[xb + d];
        ss += v * v;
    }
#endif
    red[tid] = ss;
    barrier();
    for (uint s = WG_SIZE / 2u; s > 0u; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        barrier();
    }
    float scale = inversesqrt(red[0] / float(pc.D) + pc.eps);
#if defined(OUT_Q8) && defined(COALESCED)
    uint e = wg_linear() * WG_SIZE + tid;
    bool live = e < pc.D;
    float v = live ? xs[xb + e] * scale * ws[pc.w_off + e] : 0.0;
    if (live) ys[yb + e] = v;
    q8_store_wg(pc.q_off, pc.D, e, live, v);
#elif defined(OUT_Q8)
    uint qb = pc.q_off + row * q8_row_words(pc.D);
    for (uint blk = tid; blk < pc.D / 32u; blk += WG_SIZE) {
        float v[32];
        [[unroll]] for (uint i = 0u; i < 32u; i++) {
            uint d = 32u * blk + i;
            v[i] = xs[xb + d] * scale * ws[pc.w_off + d];
            ys[yb + d] = v[i];
        }
        q8_store(qb, pc.D, blk, v);
    }
#elif defined(ADD_RES)
    // each thread reads back only the sums it stored itself: no barrier needed
    for (uint d = tid; d < pc.D; d += WG_SIZE)
        ys[yb + d] = (rs[rb + d] + xs[xb + d]) * scale * ws[pc.w_off + d];
#ifdef OUT_F16
    for (uint p = tid; p < pc.kp / 2u; p += WG_SIZE) {  // the same expression as y's
        uint d = 2u * p;
        float v0 = d < pc.D ? (rs[rb + d] + xs[xb + d]) * scale * ws[pc.w_off + d] : 0.0;
        float v1 = d + 1u < pc.D
            ? (rs[rb + d + 1u] + xs[xb + d + 1u]) * scale * ws[pc.w_off + d + 1u] : 0.0;
        hs[pc.h_off + row * (pc.kp / 2u) + p] = packHalf2x16(vec2(v0, v1));
    }
#endif
#else
    for (uint d = tid; d < pc.D; d += WG_SIZE) ys[yb + d] = xs[xb + d] * scale * ws[pc.w_off + d];
#endif
}
