#version 450
// argmax.comp: logits [T, V] -> ids [T] int32, the first maximum of each row (NaN counts as the
// largest value, as in numpy.argmax). One workgroup per row; threads stride over V, then a
// shared-memory tree keeps the (value, index) pair that wins, the lower index on ties.
// The sampler downloads this kernel's output buffer itself; there is no host-side copy to go
// stale between steps.
// Variants: one. Tunables: 0 WG_SIZE (power of two). Bindings: 0 logits, 1 ids.

#extension GL_GOOGLE_include_directive : require

layout(constant_id = 0) const uint WG_SIZE = 256;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer XBuf { float xs[]; };
layout(binding = 1) writeonly buffer IBuf { int ids[]; };

layout(push_constant) uniform PC {
    uint V;
    uint rows;
    uint x_off;
    uint y_off;
} pc;

#include "common.glsl"

shared float best_v[WG_SIZE];
shared uint best_i[WG_SIZE];

// does (v1, i1) beat (v2, i2)?
bool beats(float v1, uint i1, float v2, uint i2) {
    bool n1 = isnan(v1), n2 = isnan(v2);
    if (n1 || n2) return n1 && (!n2 || i1 < i2);
    return v1 > v2 || (v1 == v2 && i1 < i2);
}

void main() {
    uint row = wg_linear();
    if (row >= pc.rows) return;  // uniform per workgroup
    uint tid = gl_LocalInvocationID.x;
    uint xb = pc.x_off + row * pc.V;
    float bv = -1.0 / 0.0;
    uint bi = 0xFFFFFFFFu;  // "none yet": loses to every real index on ties with -inf
    for (uint i = tid; i < pc.V; i += WG_SIZE) {
        float v = xs[xb + i];
        if (bi == 0xFFFFFFFFu || beats(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    best_v[tid] = bv;
    best_i[tid] = bi;
    barrier();
    for (uint s = WG_SIZE / 2u; s > 0u; s >>= 1) {
        if (tid < s) {
            float ov = best_v[tid + s];
            uint oi = best_i[tid + s];
            if (oi != 0xFFFFFFFFu && (best_i[tid] == 0xFFFFFFFFu || beats(ov, oi, best_v[tid], best_i[tid]))) {
                best_v[tid] = ov;
                best_i[tid] = oi;
            }
        }
        barrier();
    }
    if (tid == 0u) ids[pc.y_off + row] = int(best_i[0]);
}
