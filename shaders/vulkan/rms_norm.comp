#version 450
// rms_norm.comp: y = x / sqrt(mean(x^2) + eps) * w over the last dim D, one workgroup per row.
// Used for [T, C] rows and for per-head [T, H, D] (qwen3 q/k norms): rows = T or T * H.
// Variants: one. Tunables: 0 WG_SIZE (power of two; the sum of squares is a shared-memory tree).
// Bindings: 0 x, 1 w [D] (float32: 1-D weights are dequantized at load), 2 y.

#extension GL_GOOGLE_include_directive : require

layout(constant_id = 0) const uint WG_SIZE = 256;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer XBuf { float xs[]; };
layout(binding = 1) readonly buffer WBuf { float ws[]; };
layout(binding = 2) writeonly buffer YBuf { float ys[]; };

layout(push_constant) uniform PC {
    uint D;
    uint rows;
    uint x_off;
    uint w_off;
    uint y_off;
    float eps;
} pc;

#include "common.glsl"

shared float red[WG_SIZE];

void main() {
    uint row = wg_linear();
    if (row >= pc.rows) return;  // uniform per workgroup
    uint tid = gl_LocalInvocationID.x;
    uint xb = pc.x_off + row * pc.D, yb = pc.y_off + row * pc.D;
    float ss = 0.0;
    for (uint d = tid; d < pc.D; d += WG_SIZE) {
        float v = xs[xb + d];
        ss += v * v;
    }
    red[tid] = ss;
    barrier();
    for (uint s = WG_SIZE / 2u; s > 0u; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        barrier();
    }
#ifdef MUTANT_RMS_EPS_FIXED  // planted bug: eps fixed at 1e-5 whatever the model says
    float scale = inversesqrt(red[0] / float(pc.D) + 1e-5);
#else
    float scale = inversesqrt(red[0] / float(pc.D) + pc.eps);
#endif
#ifdef MUTANT_RMS_WEIGHT_TWICE  // planted bug: the weight applied twice
    for (uint d = tid; d < pc.D; d += WG_SIZE)
        ys[yb + d] = xs[xb + d] * scale * ws[pc.w_off + d] * ws[pc.w_off + d];
#else
    for (uint d = tid; d < pc.D; d += WG_SIZE) ys[yb + d] = xs[xb + d] * scale * ws[pc.w_off + d];
#endif
}
