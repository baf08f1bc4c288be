#version 450
// matmul_tiled.comp: batched-prefill matmul as a shared-memory tiled GEMM with fused dequant,
// y[T, N] = x[T, K] @ dequant(W)[N, K]^T.
//
// The kpar/serial kernels (matmul_prefill.comp) stream every weight once per MAX_COLS columns
// but read x from global memory for every (weight group, column) pair and keep one row per
// subgroup: on a big GPU they run at a few percent of FMA throughput. Here a workgroup of 256
// threads owns a TILE_M x TILE_N block of y: each BK-wide step decodes TILE_M x BK weights once
// (dq8, one group of 8 per thread per pass) into shared memory, stages TILE_N x BK activations
// beside them, and every thread accumulates a (TILE_M/16) x (TILE_N/16) register block from
// shared memory. Weights are decoded ceil(T / TILE_N) times per matmul (fused dequant: no
// dequantized copy of W ever exists in device memory).
//
// Thread (tx, ty) of the 16 x 16 grid owns rows tx + 16 i and columns ty + 16 j: reads of the
// weight tile are 16 consecutive floats per half-warp (no bank conflicts), reads of the x tile
// are broadcasts, and y stores are 16 consecutive floats of a row.
//
// Tunables (specialization constants): 0 TILE_M (output rows per workgroup, multiple of 16),
// 1 TILE_N (columns per workgroup, multiple of 16). BK = 32 (a multiple of every block's 8).
// Bindings: 0 W (raw GGML blocks of this row range), 1 x, 2 y. Grid: (row tiles, folded into x
// and y, column tiles in z).

#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require

layout(constant_id = 0) const uint TILE_M = 64;
layout(constant_id = 1) const uint TILE_N = 64;
layout(local_size_x = 256) in;

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

#define BK 32u
#define TM (TILE_M / 16u)
#define TN (TILE_N / 16u)

// [k][row] and [k][col]: the inner loop reads one k-slice of each; +1 pads away bank conflicts
// of the transposed stores.
shared float w_sh[BK * (TILE_M + 1u)];
shared float x_sh[BK * (TILE_N + 1u)];

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint tx = tid % 16u, ty = tid / 16u;
    uint n0 = wg_linear() * TILE_M;
    uint c0 = gl_WorkGroupID.z * TILE_N;
    float acc[TM][TN];
    [[unroll]] for (uint i = 0u; i < TM; i++)
        [[unroll]] for (uint j = 0u; j < TN; j++) acc[i][j] = 0.0;

    for (uint k0 = 0u; k0 < pc.K; k0 += BK) {
        // Weights: TILE_M rows x 4 groups of 8, one group per thread per pass.
        for (uint e = tid; e < TILE_M * (BK / 8u); e += 256u) {
            uint r = e / (BK / 8u), q = e % (BK / 8u);
            uint n = n0 + r, k = k0 + 8u * q;
            vec4 lo = vec4(0.0), hi = vec4(0.0);
            if (n < pc.N && k < pc.K) {
                uint g = k / 8u;
                dq8(n * pc.row_bytes + (g / GPB) * QBYTES, g % GPB, pc.K - k, lo, hi);
            }
            uint s = 8u * q * (TILE_M + 1u) + r;
            w_sh[s] = lo.x;
            w_sh[s + (TILE_M + 1u)] = lo.y;
            w_sh[s + 2u * (TILE_M + 1u)] = lo.z;
            w_sh[s + 3u * (TILE_M + 1u)] = lo.w;
            w_sh[s + 4u * (TILE_M + 1u)] = hi.x;
            w_sh[s + 5u * (TILE_M + 1u)] = hi.y;
            w_sh[s + 6u * (TILE_M + 1u)] = hi.z;
            w_sh[s + 7u * (TILE_M + 1u)] = hi.w;
        }
        // Activations: TILE_N columns x BK, consecutive threads along k (coalesced).
        for (uint e = tid; e < TILE_N * BK; e += 256u) {
            uint c = e / BK, kk = e % BK;
            uint col = c0 + c, k = k0 + kk;
            x_sh[kk * (TILE_N + 1u) + c] =
                (col < pc.T && k < pc.K) ? xs[pc.x_off + col * pc.K + k] : 0.0;
        }
        barrier();
        [[unroll]] for (uint kk = 0u; kk < BK; kk++) {
            float a[TM], b[TN];
            [[unroll]] for (uint i = 0u; i < TM; i++) a[i] = w_sh[kk * (TILE_M + 1u) + tx + 16u * i];
            [[unroll]] for (uint j = 0u; j < TN; j++) b[j] = x_sh[kk * (TILE_N + 1u) + ty + 16u * j];
            [[unroll]] for (uint i = 0u; i < TM; i++)
                [[unroll]] for (uint j = 0u; j < TN; j++) acc[i][j] += a[i] * b[j];
        }
        barrier();
    }
    [[unroll]] for (uint j = 0u; j < TN; j++) {
        uint col = c0 + ty + 16u * j;
        if (col >= pc.T) continue;
        [[unroll]] for (uint i = 0u; i < TM; i++) {
            uint n = n0 + tx + 16u * i;
            if (n < pc.N) ys[pc.y_off + col * pc.y_stride + n] = acc[i][j];
        }
    }
}
