#version 450
// matmul_decode.comp: per-token DMMV, y[1, N] = x[1, K] @ dequant(W)[N, K]^T (T == 1).
//
// Variants (one define each; QTYPE_<type> selects the weight type, see dequant.glsl):
//   VARIANT_SUBGROUP  one subgroup per row: lanes stride over K in groups of 8 weights,
//                     subgroupAdd reduces. Correct for any subgroup size (8, 32, 64, varying):
//                     lanes and rows are derived from gl_SubgroupSize / gl_NumSubgroups.
//   VARIANT_SHMEM     THREADS_PER_ROW threads per row (any power of two <= WG_SIZE), reduced
//                     through shared memory: does not rely on the subgroup layout at all.
// Tunables (specialization constants):
//   0 WG_SIZE          workgroup size (local_size_x)
//   1 ROWS_PER_WG      output rows per workgroup
//   2 THREADS_PER_ROW  (shmem) threads cooperating on one row
// Bindings: 0 W (raw GGML blocks of this row range), 1 x, 2 y.
// Long weights (the LM head) are split into row ranges by the host; y_off places each range.

#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require

layout(constant_id = 0) const uint WG_SIZE = 64;
layout(constant_id = 1) const uint ROWS_PER_WG = 4;
layout(constant_id = 2) const uint THREADS_PER_ROW = 16;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer WBuf { uint Wq[]; };
layout(binding = 1) readonly buffer XBuf { float xs[]; };
layout(binding = 2) writeonly buffer YBuf { float ys[]; };

layout(push_constant) uniform PC {
    uint K;          // weights per row
    uint N;          // rows in this range
    uint row_bytes;  // bytes per row
    uint x_off;      // element offset of x
    uint y_off;      // element offset of y[0, row 0 of this range]
} pc;

#include "common.glsl"
#include "dequant.glsl"

// x[k .. k+7] . w for group g (8 weights) of a row
float dot8(uint row_base, uint g) {
    uint blk = g / GPB, j = g % GPB;
    uint k = g * 8u;
    vec4 lo, hi;
    dq8(row_base + blk * QBYTES, j, pc.K - k, lo, hi);
    uint xb = pc.x_off + k;
#if defined(FLOAT_W)
    if (k + 8u > pc.K) {  // ragged tail of a float row: only K - k weights exist
        float s = 0.0;
        float w[8] = float[8](lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
        for (uint i = 0u; i < pc.K - k; i++) s += w[i] * xs[xb + i];
        return s;
    }
#endif
    vec4 x0 = vec4(xs[xb], xs[xb + 1u], xs[xb + 2u], xs[xb + 3u]);
    vec4 x1 = vec4(xs[xb + 4u], xs[xb + 5u], xs[xb + 6u], xs[xb + 7u]);
    return dot(lo, x0) + dot(hi, x1);
}

#if defined(VARIANT_SUBGROUP)
void main() {
    uint row0 = wg_linear() * ROWS_PER_WG;
    uint groups = (pc.K + 7u) / 8u;
    // Each subgroup takes rows r, r + NumSubgroups, ...; the loop bound is uniform per subgroup,
    // so subgroupAdd always sees the whole subgroup.
    for (uint r = gl_SubgroupID; r < ROWS_PER_WG; r += gl_NumSubgroups) {
        uint row = row0 + r;
        if (row >= pc.N) break;
        uint row_base = row * pc.row_bytes;
        float acc = 0.0;
        for (uint g = gl_SubgroupInvocationID; g < groups; g += gl_SubgroupSize)
            acc += dot8(row_base, g);
        acc = subgroupAdd(acc);
        if (subgroupElect()) ys[pc.y_off + row] = acc;
    }
}

#elif defined(VARIANT_SHMEM)
shared float red[WG_SIZE];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint lane = tid % THREADS_PER_ROW;
    uint slot = tid / THREADS_PER_ROW;
    const uint rows_per_pass = WG_SIZE / THREADS_PER_ROW;
    uint row0 = wg_linear() * ROWS_PER_WG;
    uint groups = (pc.K + 7u) / 8u;
    for (uint r0 = 0u; r0 < ROWS_PER_WG; r0 += rows_per_pass) {  // uniform: barriers are legal
        uint r = r0 + slot;
        uint row = row0 + r;
        bool live = r < ROWS_PER_WG && row < pc.N;
        float acc = 0.0;
        if (live) {
            uint row_base = row * pc.row_bytes;
            for (uint g = lane; g < groups; g += THREADS_PER_ROW) acc += dot8(row_base, g);
        }
        red[tid] = acc;
        barrier();
        for (uint s = THREADS_PER_ROW / 2u; s > 0u; s >>= 1) {
            if (lane < s) red[tid] += red[tid + s];
            barrier();
        }
        if (live && lane == 0u) ys[pc.y_off + row] = red[tid];
        barrier();
    }
}
#else
#error "define VARIANT_SUBGROUP or VARIANT_SHMEM"
#endif
