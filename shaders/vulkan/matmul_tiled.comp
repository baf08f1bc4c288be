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
// Thread (tx, ty) of the 16 x 16 grid owns TM rows and TN columns of the block. Two layouts
// (define VEC4 or not):
//   0  rows tx + 16 i, columns ty + 16 j: scalar shared-memory reads, 16 consecutive floats per
//      half-warp (no bank conflicts), y stores of 16 consecutive floats.
//   1  rows TM * tx + i, columns TN * ty + j: the inner loop reads its weights and activations
//      as vec4 (TM, TN multiples of 4), a quarter of the shared-memory load instructions, which
//      otherwise outnumber the FMAs 1:2 at a 4 x 4 register block.
//
// Tunables (specialization constants): 0 TILE_M (output rows per workgroup, multiple of 16;
// of 64 with VEC4), 1 TILE_N (columns per workgroup, likewise). BK = 32 (a multiple of every
// block's 8).
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
const uint KU = TM * TN > 16u ? 8u : BK;  // k-slices unrolled at once (see the k-loop)

// [k][row] and [k][col]: the inner loop reads one k-slice of each. Row strides padded by 1
// (scalar layout: conflict-free transposed stores) or 4 (vec4 layout: 16-byte aligned rows).
// The layouts are separate builds (define VEC4), not a specialization constant: float arrays
// indexed through a vec4 declaration made the scalar layout 1.8x slower on the H200.
#if defined(VEC4)
const uint WS = TILE_M + 4u;
const uint XS = TILE_N + 4u;
shared vec4 w_sh[BK * WS / 4u];
shared vec4 x_sh[BK * XS / 4u];
void w_put(uint i, float v) { w_sh[i >> 2][i & 3u] = v; }
void x_put(uint i, float v) { x_sh[i >> 2][i & 3u] = v; }
#else
const uint WS = TILE_M + 1u;
const uint XS = TILE_N + 1u;
shared float w_sh[BK * WS];
shared float x_sh[BK * XS];
void w_put(uint i, float v) { w_sh[i] = v; }
void x_put(uint i, float v) { x_sh[i] = v; }
#endif

void main() {
    uint tid = gl_LocalInvocationID.x;
    uint tx = tid % 16u, ty = tid / 16u;
    uint n0 = wg_linear() * TILE_M;
    uint c0 = gl_WorkGroupID.z * TILE_N;
    // The thread's first row / column and the step between its rows / columns.
#if defined(VEC4)
    uint r_base = TM * tx, r_step = 1u, c_base = TN * ty, c_step = 1u;
#else
    uint r_base = tx, r_step = 16u, c_base = ty, c_step = 16u;
#endif
    float acc[TM][TN];
    [[unroll]] for (uint i = 0u; i < TM; i++)
        [[unroll]] for (uint j = 0u; j < TN; j++) acc[i][j] = 0.0;

    for (uint k0 = 0u; k0 < pc.K; k0 += BK) {
        // Weights: TILE_M rows x 4 groups of 8, one group per thread per pass. Four consecutive
        // threads decode the four groups of one row (they share the block's scales and cache
        // lines: on the H200 a row-major order, consecutive threads on consecutive rows, made
        // the kernel 1.8x slower).
        for (uint e = tid; e < TILE_M * (BK / 8u); e += 256u) {
            uint r = e / (BK / 8u), q = e % (BK / 8u);
            uint n = n0 + r, k = k0 + 8u * q;
            vec4 lo = vec4(0.0), hi = vec4(0.0);
            if (n < pc.N && k < pc.K) {
                uint g = k / 8u;
                dq8(n * pc.row_bytes + (g / GPB) * QBYTES, g % GPB, pc.K - k, lo, hi);
            }
            uint s = 8u * q * WS + r;
            w_put(s, lo.x);
            w_put(s + WS, lo.y);
            w_put(s + 2u * WS, lo.z);
            w_put(s + 3u * WS, lo.w);
            w_put(s + 4u * WS, hi.x);
            w_put(s + 5u * WS, hi.y);
            w_put(s + 6u * WS, hi.z);
            w_put(s + 7u * WS, hi.w);
        }
        // Activations: TILE_N columns x BK, consecutive threads along k (coalesced).
        for (uint e = tid; e < TILE_N * BK; e += 256u) {
            uint c = e / BK, kk = e % BK;
            uint col = c0 + c, k = k0 + kk;
            x_put(kk * XS + c, (col < pc.T && k < pc.K) ? xs[pc.x_off + col * pc.K + k] : 0.0);
        }
        barrier();
        // The k-slices: KU of them unrolled per trip of a loop the driver keeps (KU = BK, one
        // trip, at the default 4 x 4 register block; 8 above it: NVIDIA's compiler took over
        // 90 s on a fully unrolled 8 x 4 block at BK 32, the vec4 m128 build). Same order of
        // the k terms either way.
        [[dont_unroll]] for (uint k8 = 0u; k8 < BK; k8 += KU) {
#if defined(VEC4)
        [[unroll]] for (uint u = 0u; u < KU; u++) {
                uint kk = k8 + u;
                vec4 a[TM / 4u], b[TN / 4u];
                [[unroll]] for (uint i = 0u; i < TM / 4u; i++)
                    a[i] = w_sh[(kk * WS + r_base) / 4u + i];
                [[unroll]] for (uint j = 0u; j < TN / 4u; j++)
                    b[j] = x_sh[(kk * XS + c_base) / 4u + j];
                [[unroll]] for (uint i = 0u; i < TM; i++)
                    [[unroll]] for (uint j = 0u; j < TN; j++)
                        acc[i][j] += a[i / 4u][i % 4u] * b[j / 4u][j % 4u];
            }
#else
        [[unroll]] for (uint u = 0u; u < KU; u++) {
            uint kk = k8 + u;
            float a[TM], b[TN];
            [[unroll]] for (uint i = 0u; i < TM; i++) a[i] = w_sh[kk * WS + tx + 16u * i];
            [[unroll]] for (uint j = 0u; j < TN; j++) b[j] = x_sh[kk * XS + ty + 16u * j];
            [[unroll]] for (uint i = 0u; i < TM; i++)
                [[unroll]] for (uint j = 0u; j < TN; j++) acc[i][j] += a[i] * b[j];
        }
#endif
        }
        barrier();
    }
    [[unroll]] for (uint j = 0u; j < TN; j++) {
        uint col = c0 + c_base + c_step * j;
        if (col >= pc.T) continue;
        [[unroll]] for (uint i = 0u; i < TM; i++) {
            uint n = n0 + r_base + r_step * i;
            if (n < pc.N) ys[pc.y_off + col * pc.y_stride + n] = acc[i][j];
        }
    }
}
