#version 450
// ssm_conv.comp: causal depthwise conv1d + SiLU with state (the hybrids' delta-net layers).
// x [T, Cc]; w [Cc, K] (float32); state [K-1, Cc] the inputs before x. One thread per channel c
// walks the T tokens: y[t, c] = silu(sum_j w[c, j] * in(t + j - (K-1))), in() reading the state
// for negative indices; then the state becomes the last K-1 inputs (in place).
// Variants: one. Tunables: 0 WG_SIZE. Bindings: 0 x, 1 w, 2 state (read, then written), 3 y.

#extension GL_GOOGLE_include_directive : require

layout(constant_id = 0) const uint WG_SIZE = 256;
layout(local_size_x_id = 0) in;

#define MAX_K 8

layout(binding = 0) readonly buffer XBuf { float xs[]; };
layout(binding = 1) readonly buffer WBuf { float ws[]; };
layout(binding = 2) buffer SBuf { float ss[]; };
layout(binding = 3) writeonly buffer YBuf { float ys[]; };

layout(push_constant) uniform PC {
    uint T;
    uint Cc;
    uint K;
    uint x_off;
    uint w_off;
    uint s_off;
    uint y_off;
} pc;

#include "common.glsl"

void main() {
    uint c = wg_linear() * WG_SIZE + gl_LocalInvocationID.x;
    if (c >= pc.Cc) return;
    float win[MAX_K];  // the window: win[K-1] is the current token
    float w[MAX_K];
    for (uint j = 0u; j < pc.K; ++j) w[j] = ws[pc.w_off + c * pc.K + j];
    for (uint j = 0u; j + 1u < pc.K; ++j) win[j] = ss[pc.s_off + j * pc.Cc + c];
    for (uint t = 0u; t < pc.T; ++t) {
        win[pc.K - 1u] = xs[pc.x_off + t * pc.Cc + c];
        float acc = 0.0;
        for (uint j = 0u; j < pc.K; ++j) acc += w[j] * win[j];
        ys[pc.y_off + t * pc.Cc + c] = acc / (1.0 + exp(-acc));
        for (uint j = 0u; j + 1u < pc.K; ++j) win[j] = win[j + 1u];
    }
    for (uint j = 0u; j + 1u < pc.K; ++j) ss[pc.s_off + j * pc.Cc + c] = win[j];
}
