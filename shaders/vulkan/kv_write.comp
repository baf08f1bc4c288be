#version 450
// kv_write.comp: store k, v [T, Hkv, D] at positions pos0 .. of one layer's cache [S, Hkv, D].
// pos0 comes from the dynamic-scalars buffer (replayable decode step).
// Variants: one. Tunables: 0 WG_SIZE. Bindings: 0 k, 1 v, 2 cache k, 3 cache v, 4 dyn scalars.

#extension GL_GOOGLE_include_directive : require

layout(constant_id = 0) const uint WG_SIZE = 256;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer KBuf { float ks[]; };
layout(binding = 1) readonly buffer VBuf { float vs[]; };
layout(binding = 2) writeonly buffer CKBuf { float ck[]; };
layout(binding = 3) writeonly buffer CVBuf { float cv[]; };
layout(binding = 4) readonly buffer DBuf { uint dyn[]; };

layout(push_constant) uniform PC {
    uint n;       // T * Hkv * D
    uint row;     // Hkv * D: elements per position
    uint k_off;
    uint v_off;
    uint ck_off;
    uint cv_off;
    uint pos_slot;
} pc;

#include "common.glsl"

void main() {
    uint i = wg_linear() * WG_SIZE + gl_LocalInvocationID.x;
    if (i >= pc.n) return;
    uint dst = dyn[pc.pos_slot] * pc.row + i;
    ck[pc.ck_off + dst] = ks[pc.k_off + i];
    cv[pc.cv_off + dst] = vs[pc.v_off + i];
}
