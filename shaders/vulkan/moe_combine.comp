#version 450
// moe_combine.comp: the routed experts' outputs weighted and summed per token:
// y[t, c] = sum_j w[t, j] * d[t * k + j, c].
// Variants: one. Tunables: 0 WG_SIZE. Bindings: 0 d [T * k, C], 1 w [T, k], 2 y [T, C].

#extension GL_GOOGLE_include_directive : require

layout(constant_id = 0) const uint WG_SIZE = 256;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer DBuf { float ds[]; };
layout(binding = 1) readonly buffer WBuf { float ws[]; };
layout(binding = 2) writeonly buffer YBuf { float ys[]; };

layout(push_constant) uniform PC {
    uint T;
    uint C;
    uint k;
    uint d_off;
    uint w_off;
    uint y_off;
} pc;

#include "common.glsl"

void main() {
    uint i = wg_linear() * WG_SIZE + gl_LocalInvocationID.x;
    if (i >= pc.T * pc.C) return;
    uint t = i / pc.C, c = i % pc.C;
    float acc = 0.0;
    for (uint j = 0u; j < pc.k; ++j)
        acc += ws[pc.w_off + t * pc.k + j] * ds[pc.d_off + (t * pc.k + j) * pc.C + c];
    ys[pc.y_off + i] = acc;
}
