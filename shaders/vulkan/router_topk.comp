#version 450
// router_topk.comp: the MoE router of one token per workgroup: softmax over the E expert
// logits, the k most probable (ties: the lower index, as a stable sort), their probabilities
// renormalised to sum to 1.
// Variants: one. Tunables: 0 WG_SIZE (power of two). E <= MAX_E, k <= MAX_K.
// Bindings: 0 logits [T, E], 1 ids [T, k] (int32), 2 weights [T, k].

#extension GL_GOOGLE_include_directive : require

layout(constant_id = 0) const uint WG_SIZE = 256;
layout(local_size_x_id = 0) in;

#define MAX_E 1024
#define MAX_K 32

layout(binding = 0) readonly buffer LBuf { float ls[]; };
layout(binding = 1) writeonly buffer IBuf { int ids[]; };
layout(binding = 2) writeonly buffer WBuf { float ws[]; };

layout(push_constant) uniform PC {
    uint T;
    uint E;
    uint k;
    uint l_off;
    uint i_off;
    uint w_off;
} pc;

#include "common.glsl"

shared float p[MAX_E];
shared float rv[WG_SIZE];
shared uint ri[WG_SIZE];
shared float top_p[MAX_K];

void main() {
    uint t = wg_linear();
    if (t >= pc.T) return;  // uniform per workgroup
    uint tid = gl_LocalInvocationID.x;
    uint lb = pc.l_off + t * pc.E;
    float m = -3.4e38;
    for (uint e = tid; e < pc.E; e += WG_SIZE) m = max(m, ls[lb + e]);
    rv[tid] = m;
    barrier();
    for (uint s = WG_SIZE / 2u; s > 0u; s >>= 1) {
        if (tid < s) rv[tid] = max(rv[tid], rv[tid + s]);
        barrier();
    }
    m = rv[0];
    barrier();
    float sum = 0.0;
    for (uint e = tid; e < pc.E; e += WG_SIZE) {
        float v = exp(ls[lb + e] - m);
        p[e] = v;
        sum += v;
    }
    rv[tid] = sum;
    barrier();
    for (uint s = WG_SIZE / 2u; s > 0u; s >>= 1) {
        if (tid < s) rv[tid] += rv[tid + s];
        barrier();
    }
    float total = rv[0];
    barrier();
    for (uint j = 0u; j < pc.k; ++j) {
        float best = -1.0;
        uint bi = 0xFFFFFFFFu;
        for (uint e = tid; e < pc.E; e += WG_SIZE) {
            if (p[e] > best) { best = p[e]; bi = e; }  // ascending e: the first of ties wins
        }
        rv[tid] = best;
        ri[tid] = bi;
        barrier();
        for (uint s = WG_SIZE / 2u; s > 0u; s >>= 1) {
            if (tid < s && (rv[tid + s] > rv[tid] || (rv[tid + s] == rv[tid] && ri[tid + s] < ri[tid]))) {
                rv[tid] = rv[tid + s];
                ri[tid] = ri[tid + s];
            }
            barrier();
        }
        if (tid == 0u) {
            top_p[j] = rv[0] / total;
            ids[pc.i_off + t * pc.k + j] = int(ri[0]);
            p[ri[0]] = -2.0;  // taken
        }
        barrier();
    }
    if (tid == 0u) {
        float s = 0.0;
        for (uint j = 0u; j < pc.k; ++j) s += top_p[j];
        for (uint j = 0u; j < pc.k; ++j) ws[pc.w_off + t * pc.k + j] = top_p[j] / s;
    }
}
