#version 450
// ssm_gates.comp: the delta-net's per-token, per-V-head gates from a, b [T, Hv]:
//   g = softplus(a + dt_bias) * ssm_a   (a log-decay; ssm_a = -exp(A_log) < 0)
//   beta = sigmoid(b)
// Variants: one. Tunables: 0 WG_SIZE. Bindings: 0 a, 1 b, 2 dt_bias [Hv], 3 ssm_a [Hv], 4 g, 5 beta.

#extension GL_GOOGLE_include_directive : require

layout(constant_id = 0) const uint WG_SIZE = 256;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer ABuf { float as_[]; };
layout(binding = 1) readonly buffer BBuf { float bs[]; };
layout(binding = 2) readonly buffer DBuf { float dts[]; };
layout(binding = 3) readonly buffer SBuf { float sas[]; };
layout(binding = 4) writeonly buffer GBuf { float gs[]; };
layout(binding = 5) writeonly buffer EBuf { float betas[]; };

layout(push_constant) uniform PC {
    uint n;
    uint Hv;
    uint a_off;
    uint b_off;
    uint dt_off;
    uint sa_off;
    uint g_off;
    uint beta_off;
} pc;

#include "common.glsl"

void main() {
    uint i = wg_linear() * WG_SIZE + gl_LocalInvocationID.x;
    if (i >= pc.n) return;
    uint h = i % pc.Hv;
    float x = as_[pc.a_off + i] + dts[pc.dt_off + h];
    float sp = max(x, 0.0) + log(1.0 + exp(-abs(x)));  // softplus without overflow
    gs[pc.g_off + i] = sp * sas[pc.sa_off + h];
    betas[pc.beta_off + i] = 1.0 / (1.0 + exp(-bs[pc.b_off + i]));
}
