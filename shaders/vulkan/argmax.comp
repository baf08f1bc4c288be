#version 450
// argmax.comp: logits [T, V] -> ids [T] int32, the first maximum of each row (NaN counts as the
// largest value, as in numpy.argmax: the first NaN wins). Threads stride over their elements,
// then a shared-memory tree keeps the (value, index) pair that wins, the lower index on ties.
// The sampler downloads this kernel's output buffer itself; there is no host-side copy to go
// stale between steps.
//
// Variants (defines):
//   (none)        argmax.default: one workgroup per row.
//   STAGE_SLICES  argmax.two_stage, pass 1: grid (slices, rows); workgroup s takes elements
//                 [s * c, min(V, (s + 1) * c)) with c = ceil(V / slices) and writes its winner as
//                 (float bits, index), or index NONE for an empty slice.
//   STAGE_MERGE   argmax.two_stage, pass 2: one workgroup per row over its slices' winners.
// Slices hold increasing index ranges, so the same (value, index) rule gives np.argmax's answer.
// Tunables: 0 WG_SIZE (power of two). Bindings: default 0 logits, 1 ids; STAGE_SLICES 0 logits,
// 1 partials [rows, slices, 2] uint; STAGE_MERGE 0 partials, 1 ids.

#extension GL_GOOGLE_include_directive : require

layout(constant_id = 0) const uint WG_SIZE = 256;
layout(local_size_x_id = 0) in;

#include "common.glsl"

#define NONE 0xFFFFFFFFu  // "no element yet": loses to every real index, even against -inf

#if defined(STAGE_SLICES)
layout(binding = 0) readonly buffer XBuf { float xs[]; };
layout(binding = 1) writeonly buffer PBuf { uint parts[]; };
layout(push_constant) uniform PC {
    uint V;
    uint rows;
    uint x_off;
    uint p_off;
    uint slices;
} pc;
#elif defined(STAGE_MERGE)
layout(binding = 0) readonly buffer PBuf { uint parts[]; };
layout(binding = 1) writeonly buffer IBuf { int ids[]; };
layout(push_constant) uniform PC {
    uint slices;
    uint rows;
    uint p_off;
    uint y_off;
} pc;
#else
layout(binding = 0) readonly buffer XBuf { float xs[]; };
layout(binding = 1) writeonly buffer IBuf { int ids[]; };
layout(push_constant) uniform PC {
    uint V;
    uint rows;
    uint x_off;
    uint y_off;
} pc;
#endif

shared float best_v[WG_SIZE];
shared uint best_i[WG_SIZE];

// does (v1, i1) beat (v2, i2)? i2 == NONE: anything real does.
bool beats(float v1, uint i1, float v2, uint i2) {
    if (i1 == NONE) return false;
    if (i2 == NONE) return true;
    bool n1 = isnan(v1), n2 = isnan(v2);
    if (n1 || n2) return n1 && (!n2 || i1 < i2);
    return v1 > v2 || (v1 == v2 && i1 < i2);
}

// The workgroup's winner of the per-thread (bv, bi); every thread must call it.
void wg_best(float bv, uint bi, out float v, out uint i) {
    uint tid = gl_LocalInvocationID.x;
    best_v[tid] = bv;
    best_i[tid] = bi;
    barrier();
    for (uint s = WG_SIZE / 2u; s > 0u; s >>= 1) {
        if (tid < s && beats(best_v[tid + s], best_i[tid + s], best_v[tid], best_i[tid])) {
            best_v[tid] = best_v[tid + s];
            best_i[tid] = best_i[tid + s];
        }
        barrier();
    }
    v = best_v[0];
    i = best_i[0];
}

void main() {
    uint tid = gl_LocalInvocationID.x;
    float bv = -1.0 / 0.0;
    uint bi = NONE;
#if defined(STAGE_SLICES)
    uint slice = gl_WorkGroupID.x;
    uint row = gl_WorkGroupID.z * gl_NumWorkGroups.y + gl_WorkGroupID.y;  // rows folded in y, z
    if (row >= pc.rows) return;  // uniform per workgroup
    uint c = (pc.V + pc.slices - 1u) / pc.slices;
    uint e0 = min(pc.V, slice * c), e1 = min(pc.V, e0 + c);
    uint xb = pc.x_off + row * pc.V;
    for (uint i = e0 + tid; i < e1; i += WG_SIZE) {
        float v = xs[xb + i];
        if (beats(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    wg_best(bv, bi, bv, bi);
    if (tid == 0u) {
        uint pb = pc.p_off + 2u * (row * pc.slices + slice);
        parts[pb] = floatBitsToUint(bv);
        parts[pb + 1u] = bi;
    }
#elif defined(STAGE_MERGE)
    uint row = wg_linear();
    if (row >= pc.rows) return;
    uint pb = pc.p_off + 2u * row * pc.slices;
    for (uint s = tid; s < pc.slices; s += WG_SIZE) {
        float v = uintBitsToFloat(parts[pb + 2u * s]);
        uint i = parts[pb + 2u * s + 1u];
        if (beats(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    wg_best(bv, bi, bv, bi);
    if (tid == 0u) ids[pc.y_off + row] = int(bi);
#else
    uint row = wg_linear();
    if (row >= pc.rows) return;
    uint xb = pc.x_off + row * pc.V;
    for (uint i = tid; i < pc.V; i += WG_SIZE) {
        float v = xs[xb + i];
        if (beats(v, i, bv, bi)) {
            bv = v;
            bi = i;
        }
    }
    wg_best(bv, bi, bv, bi);
    if (tid == 0u) ids[pc.y_off + row] = int(bi);
#endif
}
