#version 450
// q8_quant.comp: a float row x [K] (K % 32 == 0) as Q8_1 (q8_1.glsl), a thread per 32-block,
// or with COALESCED (quantize_act.coalesced) a thread per value.
// Used by matmul_decode.mmvw when its activation has no Q8_1 form yet (the fused producers,
// rms_norm and swiglu under mmvw, write one as they store).
// Tunables: 0 WG_SIZE. Bindings: 0 x (float), 1 the Q8_1 row (uint words).

#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require

layout(constant_id = 0) const uint WG_SIZE = 256;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer XBuf { float xs[]; };
layout(binding = 1) writeonly buffer QBuf { uint q8w[]; };

layout(push_constant) uniform PC {
    uint K;
    uint x_off;
    uint q_off;  // word offset, a multiple of 4
} pc;

#include "common.glsl"
#include "q8_1.glsl"

#ifdef COALESCED
void main() {  // a value per thread
    uint e = wg_linear() * WG_SIZE + gl_LocalInvocationID.x;
    bool live = e < pc.K;
    q8_store_wg(pc.q_off, pc.K, e, live, live ? xs[pc.x_off + e] : 0.0);
}
#else
void main() {  // a 32-block per thread
    uint blk = wg_linear() * WG_SIZE + gl_LocalInvocationID.x;
    if (blk >= pc.K / 32u) return;
    float v[32];
    [[unroll]] for (uint i = 0u; i < 32u; i++) v[i] = xs[pc.x_off + 32u * blk + i];
    q8_store(pc.q_off, pc.K, blk, v);
}
#endif
