#version 450
// embedding.comp: get_rows on a quantized table, out[t, :] = dequant(table[ids[t], :]).
// The ids are read from a device buffer (the previous step's argmax feeds decode directly).
// Variants: one (QTYPE_<type> selects the table type). Tunables: 0 WG_SIZE.
// Bindings: 0 table rows [row0, row0 + nrows) (tables over maxStorageBufferRange come in row
// ranges, one dispatch each; a token outside this range is left to the other dispatches),
// 1 ids (int32), 2 out [T, C].

#extension GL_GOOGLE_include_directive : require

layout(constant_id = 0) const uint WG_SIZE = 256;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer WBuf { uint Wq[]; };
layout(binding = 1) readonly buffer IBuf { int ids[]; };
layout(binding = 2) writeonly buffer YBuf { float ys[]; };

layout(push_constant) uniform PC {
    uint C;          // row length
    uint T;          // tokens
    uint row_bytes;
    uint row0;       // first table row in this range
    uint nrows;      // rows in this range
    uint ids_off;
    uint y_off;
} pc;

#include "common.glsl"
#include "dequant.glsl"

void main() {
    uint groups = (pc.C + 7u) / 8u;
    uint i = wg_linear() * WG_SIZE + gl_LocalInvocationID.x;  // one group of 8 per thread
    if (i >= pc.T * groups) return;
    uint t = i / groups, g = i % groups;
    uint id = uint(ids[pc.ids_off + t]);
    if (id < pc.row0 || id >= pc.row0 + pc.nrows) return;
    uint k = g * 8u;
    vec4 lo, hi;
    dq8((id - pc.row0) * pc.row_bytes + (g / GPB) * QBYTES, g % GPB, pc.C - k, lo, hi);
    float w[8] = float[8](lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
    uint yb = pc.y_off + t * pc.C + k;
    for (uint e = 0u; e < 8u; e++)
        if (k + e < pc.C) ys[yb + e] = w[e];
}
