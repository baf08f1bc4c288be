#version 450
// moe_grouped.comp: the routed experts of a MoE FFN at prefill as a grouped GEMM, tokens
// sorted by expert: each expert's weight rows are decoded once per tile of up to TILE_P of its
// (token, slot) pairs, instead of once per pair as moe_matvec.comp does (which decode still
// uses, with the PASS_COMBINE sum, through the moe_experts.grouped variant).
//   PASS_SORT  one workgroup: counts the P = T * k pairs per expert, lays the experts' runs
//              out in expert order (a counting sort; the order inside a run is whatever the
//              atomics give: every pair's sum is computed the same way wherever it lands) and
//              cuts each run into tiles of <= TILE_P pairs: route = [n_tiles, (expert, start,
//              count) x max_tiles, order[P]] (int32).
//   PASS_GEMM  a workgroup per (WG_SIZE weight rows, tile): a thread per row of the tile's
//              expert walks K once, the decoded weights applied to each pair's x row in
//              per-pair accumulators; y[pair, n] = dequant(W)[e * N + n, :] . x[pair / x_div].
//              gate/up read x per token (x_div = k), down its pair's row (x_div = 1).
// Tunables: 0 WG_SIZE (rows per workgroup of PASS_GEMM, threads of PASS_SORT), 3 TILE_P (pairs
// per tile: registers per thread); 1 ROWS_PER_WG and 2 THREADS_PER_ROW are the decode
// kernel's (moe_matvec.comp), declared here with the same defaults.
// Bindings: PASS_SORT 0 ids [P] (int32), 1 route; PASS_GEMM 0 W [E * N rows], 1 x, 2 route,
// 3 y [P, N].

#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require

layout(constant_id = 0) const uint WG_SIZE = 64;
layout(constant_id = 1) const uint ROWS_PER_WG = 4;
layout(constant_id = 2) const uint THREADS_PER_ROW = 16;
layout(constant_id = 3) const uint TILE_P = 16;
layout(local_size_x_id = 0) in;

#include "common.glsl"

#if defined(PASS_SORT)
#define MAX_E 1024

layout(binding = 0) readonly buffer IBuf { int ids[]; };
layout(binding = 1) buffer RBuf { int route[]; };

layout(push_constant) uniform PC {
    uint P;
    uint E;
    uint ids_off;
    uint r_off;
    uint max_tiles;
} pc;

shared uint cnt[MAX_E];
shared uint cur[MAX_E];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint order = pc.r_off + 1u + 3u * pc.max_tiles;
    for (uint e = tid; e < pc.E; e += WG_SIZE) cnt[e] = 0u;
    barrier();
    for (uint p = tid; p < pc.P; p += WG_SIZE) atomicAdd(cnt[uint(ids[pc.ids_off + p])], 1u);
    barrier();
    if (tid == 0u) {
        uint start = 0u, nt = 0u;
        for (uint e = 0u; e < pc.E; ++e) {
            uint c = cnt[e];
            cur[e] = start;
            for (uint j = 0u; j < c; j += TILE_P) {
                uint t = pc.r_off + 1u + 3u * nt;
                route[t] = int(e);
                route[t + 1u] = int(start + j);
                route[t + 2u] = int(min(TILE_P, c - j));
                nt++;
            }
            start += c;
        }
        route[pc.r_off] = int(nt);
    }
    barrier();
    for (uint p = tid; p < pc.P; p += WG_SIZE) {
        uint pos = atomicAdd(cur[uint(ids[pc.ids_off + p])], 1u);
        route[order + pos] = int(p);
    }
}

#elif defined(PASS_GEMM)
layout(binding = 0) readonly buffer WBuf { uint Wq[]; };
layout(binding = 1) readonly buffer XBuf { float xs[]; };
layout(binding = 2) readonly buffer RBuf { int route[]; };
layout(binding = 3) writeonly buffer YBuf { float ys[]; };

layout(push_constant) uniform PC {
    uint K;
    uint N;  // rows per expert
    uint row_bytes;
    uint x_off;
    uint y_off;
    uint r_off;
    uint max_tiles;
    uint x_div;
} pc;

#include "dequant.glsl"

float sums[TILE_P];
uint xrow[TILE_P];  // element offset of each pair's x row

void main() {
    uint tile = gl_WorkGroupID.y;
    if (tile >= uint(route[pc.r_off])) return;  // uniform: fewer tiles than the grid's bound
    uint row = gl_WorkGroupID.x * WG_SIZE + gl_LocalInvocationID.x;
    if (row >= pc.N) return;  // no barriers below
    uint t = pc.r_off + 1u + 3u * tile;
    uint e = uint(route[t]), start = uint(route[t + 1u]), count = uint(route[t + 2u]);
    uint order = pc.r_off + 1u + 3u * pc.max_tiles + start;
    [[unroll]] for (uint c = 0u; c < TILE_P; c++) {
        sums[c] = 0.0;
        xrow[c] = c < count ? pc.x_off + (uint(route[order + c]) / pc.x_div) * pc.K : 0u;
    }
    uint row_base = (e * pc.N + row) * pc.row_bytes;
    uint groups = (pc.K + 7u) / 8u;
    for (uint g = 0u; g < groups; g++) {
        uint blk = g / GPB, j = g % GPB;
        uint k = g * 8u;
        vec4 lo, hi;
        dq8(row_base + blk * QBYTES, j, pc.K - k, lo, hi);
#if defined(FLOAT_W)
        if (k + 8u > pc.K) {  // ragged tail of a float row
            float w[8] = float[8](lo.x, lo.y, lo.z, lo.w, hi.x, hi.y, hi.z, hi.w);
            [[unroll]] for (uint c = 0u; c < TILE_P; c++) {
                if (c < count) {
                    for (uint i = 0u; i < pc.K - k; i++) sums[c] += w[i] * xs[xrow[c] + k + i];
                }
            }
            continue;
        }
#endif
        // a fixed trip count (TILE_P is specialized) keeps sums[] and xrow[] in registers
        [[unroll]] for (uint c = 0u; c < TILE_P; c++) {
            if (c < count) {
                uint xb = xrow[c] + k;
                vec4 x0 = vec4(xs[xb], xs[xb + 1u], xs[xb + 2u], xs[xb + 3u]);
                vec4 x1 = vec4(xs[xb + 4u], xs[xb + 5u], xs[xb + 6u], xs[xb + 7u]);
                sums[c] += dot(lo, x0) + dot(hi, x1);
            }
        }
    }
    [[unroll]] for (uint c = 0u; c < TILE_P; c++) {
        if (c < count) ys[pc.y_off + uint(route[order + c]) * pc.N + row] = sums[c];
    }
}
#endif
