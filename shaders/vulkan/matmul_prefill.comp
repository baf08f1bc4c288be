#version 450
// matmul_prefill.comp: batched-prefill matmul, y[T, N] = x[T, K] @ dequant(W)[N, K]^T, T > 1.
// Each weight group is decoded once per workgroup and applied to up to MAX_COLS columns
// (prompt tokens) held in per-column accumulators sums[MAX_COLS]; grid z walks column chunks,
// so any T works (a chunk of prefill.chunk_tokens tokens is one dispatch of ceil(T / MAX_COLS)
// column tiles).
//
// Variants (one define each; QTYPE_<type> selects the weight type, see dequant.glsl):
//   VARIANT_SERIAL  one thread owns one row and walks all of K (the seed's first shader: reuse
//                   across columns, but no parallelism along K).
//   VARIANT_KPAR    one subgroup per row splits K across lanes, subgroupAdd per column at the
//                   end (the seed's winning shape). Any subgroup size: lanes and rows come from
//                   gl_SubgroupSize / gl_NumSubgroups.
// Tunables (specialization constants):
//   0 WG_SIZE      workgroup size (local_size_x)
//   1 ROWS_PER_WG  (kpar) output rows per workgroup
//   2 MAX_COLS     columns per tile = matmul_prefill.max_cols (per-thread accumulators:
//                  registers)
// Bindings: 0 W (raw GGML blocks of this row range), 1 x, 2 y.

#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require

layout(constant_id = 0) const uint WG_SIZE = 64;
layout(constant_id = 1) const uint ROWS_PER_WG = 2;  // defaults: the registry's
layout(constant_id = 2) const uint MAX_COLS = 32;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer WBuf { uint Wq[]; };
layout(binding = 1) readonly buffer XBuf { float xs[]; };
layout(binding = 2) writeonly buffer YBuf { float ys[]; };

layout(push_constant) uniform PC {
    uint K;          // weights per row (x row length)
    uint N;          // rows in this range
    uint row_bytes;  // bytes per row
    uint x_off;      // element offset of x[0, 0]
    uint y_off;      // element offset of y[0, row 0 of this range]
    uint y_stride;   // elements per y row (all rows of the weight, not only this range)
    uint T;          // columns (tokens)
} pc;

#include "common.glsl"
#include "dequant.glsl"

float sums[MAX_COLS];

// sums[c] += x[c0 + c, group g] . w for every live column
void accumulate(uint row_base, uint g, uint c0, uint ncols) {
    uint blk = g / GPB, j = g % GPB;
    uint k = g * 8u;
    vec4 lo, hi;
    dq8(row_base + blk * QBYTES, j, pc.K - k, lo, hi);
#if defined(FLOAT_W)
    if (k + 8u > pc.K) {  // ragged tail of a float row
        float w[8] = float[8](lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
        [[unroll]] for (uint c = 0u; c < MAX_COLS; c++) {
            if (c < ncols) {
                uint xb = pc.x_off + (c0 + c) * pc.K + k;
                for (uint i = 0u; i < pc.K - k; i++) sums[c] += w[i] * xs[xb + i];
            }
        }
        return;
    }
#endif
    // `if (c < ncols)` rather than `break`, and [[unroll]]: a fixed trip count lets the driver
    // unroll the loop once MAX_COLS is specialized, so sums[] indices are constants and the
    // accumulators stay in registers (a dynamically indexed sums[] lives in scratch memory).
    [[unroll]] for (uint c = 0u; c < MAX_COLS; c++) {
        if (c < ncols) {
            uint xb = pc.x_off + (c0 + c) * pc.K + k;
            vec4 x0 = vec4(xs[xb], xs[xb + 1u], xs[xb + 2u], xs[xb + 3u]);
            vec4 x1 = vec4(xs[xb + 4u], xs[xb + 5u], xs[xb + 6u], xs[xb + 7u]);
            sums[c] += dot(lo, x0) + dot(hi, x1);
        }
    }
}

void main() {
    uint c0 = gl_WorkGroupID.z * MAX_COLS;
    uint ncols = min(MAX_COLS, pc.T - c0);
    uint groups = (pc.K + 7u) / 8u;
#if defined(VARIANT_SERIAL)
    uint row = wg_linear() * WG_SIZE + gl_LocalInvocationID.x;
    if (row >= pc.N) return;
    [[unroll]] for (uint c = 0u; c < MAX_COLS; c++) sums[c] = 0.0;
    uint row_base = row * pc.row_bytes;
    for (uint g = 0u; g < groups; g++) accumulate(row_base, g, c0, ncols);
    [[unroll]] for (uint c = 0u; c < MAX_COLS; c++)
        if (c < ncols) ys[pc.y_off + (c0 + c) * pc.y_stride + row] = sums[c];
#elif defined(VARIANT_KPAR)
    uint row0 = wg_linear() * ROWS_PER_WG;
    for (uint r = gl_SubgroupID; r < ROWS_PER_WG; r += gl_NumSubgroups) {
        uint row = row0 + r;
        if (row >= pc.N) break;  // uniform per subgroup
        [[unroll]] for (uint c = 0u; c < MAX_COLS; c++) sums[c] = 0.0;
        uint row_base = row * pc.row_bytes;
        for (uint g = gl_SubgroupInvocationID; g < groups; g += gl_SubgroupSize)
            accumulate(row_base, g, c0, ncols);
        [[unroll]] for (uint c = 0u; c < MAX_COLS; c++) {
            if (c < ncols) {  // uniform: ncols is the same for the whole workgroup
                float v = subgroupAdd(sums[c]);
                if (subgroupElect()) ys[pc.y_off + (c0 + c) * pc.y_stride + row] = v;
            }
        }
    }
#else
#error "define VARIANT_SERIAL or VARIANT_KPAR"
#endif
}
