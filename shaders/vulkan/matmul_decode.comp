#version 450
// matmul_decode.comp: per-token DMMV, y[1, N] = x[1, K] @ dequant(W)[N, K]^T (T == 1).
//
// Variants (one define each; QTYPE_<type> selects the weight type, see dequant.glsl):
//   VARIANT_SUBGROUP  one subgroup per row: lanes stride over K in groups of 8 weights,
//                     subgroupAdd reduces. Correct for any subgroup size (8, 32, 64, varying):
//                     lanes and rows are derived from gl_SubgroupSize / gl_NumSubgroups.
//   VARIANT_SHMEM     THREADS_PER_ROW threads per row (any power of two <= WG_SIZE), reduced
//                     through shared memory: does not rely on the subgroup layout at all.
//   VARIANT_BLOCK     THREADS_PER_ROW lanes of a subgroup per row (0: the whole subgroup) step
//                     through the row in block-sized chunks (dmmv_block.glsl): wide weight loads,
//                     block scales once per chunk, vec4 x; subgroupAdd or a shuffle-xor
//                     butterfly reduces. Decode is memory-bound: this streams the weight bytes.
// Tunables (specialization constants):
//   0 WG_SIZE          workgroup size (local_size_x)
//   1 ROWS_PER_WG      output rows per workgroup
//   2 THREADS_PER_ROW  (shmem) threads cooperating on one row; (block) lanes per row, clamped
//                      to the subgroup size, 0 = the subgroup
//   3 ROWS_PER_THREAD  (block) rows each lane accumulates at once, sharing one load of x
// Bindings: 0 W (raw GGML blocks of this row range), 1 x, 2 y.
// Long weights (the LM head) are split into row ranges by the host; y_off places each range.

#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_EXT_control_flow_attributes : require
#if defined(VARIANT_BLOCK)
#extension GL_KHR_shader_subgroup_shuffle : require
#endif

// Defaults are the registry's, per variant (tests/engine/tuning/test_knob_bindings.py checks them); a
// constant a variant does not read keeps any value.
layout(constant_id = 0) const uint WG_SIZE = 64;
#if defined(VARIANT_BLOCK)
layout(constant_id = 1) const uint ROWS_PER_WG = 4;
layout(constant_id = 2) const uint THREADS_PER_ROW = 0;
layout(constant_id = 3) const uint ROWS_PER_THREAD = 2;
#else
layout(constant_id = 1) const uint ROWS_PER_WG = 2;
layout(constant_id = 2) const uint THREADS_PER_ROW = 32;
layout(constant_id = 3) const uint ROWS_PER_THREAD = 1;
#endif
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer WBuf { uint Wq[]; };
layout(binding = 1) readonly buffer XBuf { float xs[]; };
layout(binding = 2) writeonly buffer YBuf { float ys[]; };
#if defined(VARIANT_BLOCK)  // the same bindings seen 16 bytes at a time
layout(binding = 0) readonly buffer WBuf4 { uvec4 Wq4[]; };
layout(binding = 1) readonly buffer XBuf4 { vec4 xs4[]; };
#endif

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
#elif defined(VARIANT_BLOCK)
#include "dmmv_block.glsl"

void main() {
    // Rows go to clusters of R lanes inside one subgroup (R a power of two dividing it), so the
    // reduction never leaves the subgroup; a cluster takes ROWS_PER_THREAD rows at a time and
    // its lanes share that row loop.
    uint S = gl_SubgroupSize;
    uint R = THREADS_PER_ROW == 0u ? S : min(THREADS_PER_ROW, S);
    uint lane = gl_SubgroupInvocationID & (R - 1u);
    uint slot = gl_SubgroupID * (S / R) + gl_SubgroupInvocationID / R;
    uint slots = gl_NumSubgroups * (S / R);
    uint row0 = wg_linear() * ROWS_PER_WG;
    uint n = n_chunks();
    for (uint r = slot * ROWS_PER_THREAD; r < ROWS_PER_WG; r += slots * ROWS_PER_THREAD) {
        uint row = row0 + r;
        if (row >= pc.N) break;
        uint nr = min(ROWS_PER_THREAD, min(ROWS_PER_WG - r, pc.N - row));  // live rows here
        float acc[ROWS_PER_THREAD];
        [[unroll]] for (uint i = 0u; i < ROWS_PER_THREAD; i++) acc[i] = 0.0;
        for (uint c = lane; c < n; c += R) {
            vec4 xv[XV];
            load_x(c, xv);
            [[unroll]] for (uint i = 0u; i < ROWS_PER_THREAD; i++)
                if (i < nr) acc[i] += chunk_dot((row + i) * pc.row_bytes, c, xv);
        }
        [[unroll]] for (uint i = 0u; i < ROWS_PER_THREAD; i++) {
            float a = acc[i];
            if (R == S) {
                a = subgroupAdd(a);
            } else {
                for (uint o = R >> 1; o > 0u; o >>= 1) a += subgroupShuffleXor(a, o);
            }
            if (lane == 0u && i < nr) ys[pc.y_off + row + i] = a;
        }
    }
}
#else
#error "define VARIANT_SUBGROUP, VARIANT_SHMEM or VARIANT_BLOCK"
#endif
