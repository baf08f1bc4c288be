#version 450
// matmul_coopmat.comp: batched-prefill matmul on tensor cores through GL_KHR_cooperative_matrix,
// y[T, N] = x[T, K] @ dequant(W)[N, K]^T, fp16 inputs into fp32 accumulators.
//
// The same tiling as matmul_tiled.comp (fused dequant: a workgroup decodes its TILE_M x BK weights
// once per k-step into shared memory, no dequantized copy of W in device memory), but the tiles
// are fp16 and the products are 16 x 16 x 16 cooperative-matrix multiply-adds: A = x (tokens x k,
// row-major), B = W^T (k x weight rows: W's rows read column-major), C = y (tokens x rows).
//
// Subgroup size: any up to 64. The 256 threads form gl_NumSubgroups subgroups (8 at 32, 4 at
// 64); the block is cut into WTILES subgroup tiles of WARP_N tokens x WARP_M rows and subgroup s
// owns tiles s, s + nsg, ... : PASSES = ceil(WTILES / 4) accumulator sets cover the wave64 case;
// at wave32 the later passes are skipped (uniform branch). Results leave through a 16 x 16 fp32
// shared-memory fragment per subgroup so ragged T and N are written bounded (never past y's row
// range: the next row range of a split weight, or the pooled buffer's canaries, follow it).
//
// Tunables (specialization constants): 0 TILE_M (weight rows per workgroup), 1 TILE_N (tokens),
// 2 WARP_M, 3 WARP_N (the subgroup tile, multiples of 16 dividing TILE_M / TILE_N); defines BK
// (k per shared-memory step, 32 or 64: fewer barriers against more shared memory), BUFFERS (1,
// or 2: double-buffered tiles, one barrier per step, the next step decoded after this one's
// multiply-adds are issued), ONE_TILE (below) and STORE_UNROLLED (the bounded
// store's lane loop with a compile-time trip count, subgroups of 32 or more lanes).
//
// Shared tiles are f16vec2 (pairs along k): a decoded group of 8 weights is 4 stores, and the
// matrix loads take their stride in pairs. x is read 4 floats per thread where its rows are
// 16-byte aligned (one buffer view: an aliased vec4 view of binding 1 is avoided).
// Bindings: 0 W (raw GGML blocks of this row range), 1 x, 2 y. Grid: (row tiles, folded into x
// and y, column tiles in z), as matmul_tiled.comp.

#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

layout(constant_id = 0) const uint TILE_M = 128;
layout(constant_id = 1) const uint TILE_N = 64;
layout(constant_id = 2) const uint WARP_M = 32;
layout(constant_id = 3) const uint WARP_N = 32;
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

#ifndef BK
#define BK 32
#endif
// Shared rows of BK halves padded by 8 (BK 32: 80 bytes): 16-byte aligned for the matrix loads
// and skewed across banks. SK2: the row stride in f16vec2 pairs.
#define SK2 ((uint(BK) + 8u) / 2u)
#define SLOTS 8u  // output fragments staged at once (one per subgroup of a wave32 workgroup)

const uint CM = WARP_M / 16u;  // fragments per subgroup tile along weight rows
const uint CN = WARP_N / 16u;  // ... along tokens
const uint TILES_M = TILE_M / WARP_M;
const uint WTILES = TILES_M * (TILE_N / WARP_N);
#ifdef ONE_TILE
// Subgroup s owns subgroup tile s, the only one: the registry admits this build only where the
// workgroup has exactly WTILES subgroups (256 / subgroup size), so no pass loop, no bounds test
// and no accumulators idle at wave32.
const uint PASSES = 1u;
#define OWNS(wt) true
#else
const uint PASSES = (WTILES + 3u) / 4u;
#define OWNS(wt) ((wt) < WTILES)
#endif

#ifndef BUFFERS
#define BUFFERS 1
#endif
shared f16vec2 x_sh[BUFFERS * TILE_N * SK2];  // [buffer][token][k pair]
shared f16vec2 w_sh[BUFFERS * TILE_M * SK2];  // [buffer][weight row][k pair]
shared float c_sh[SLOTS * 256u];     // [slot][token 16][row 16]

#define ACC coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

// Decode / convert the k-step at k0 into tile buffer buf (offsets wb, xb into w_sh, x_sh).
void load_tiles(uint k0, uint wb, uint xb, uint n0, uint c0, bool x_vec4) {
    uint tid = gl_LocalInvocationID.x;
    // Weights: TILE_M rows x BK / 8 groups of 8, one group per thread per pass; the groups of
    // one row on consecutive threads (they share the block's scales).
    for (uint e = tid; e < TILE_M * (uint(BK) / 8u); e += 256u) {
        uint r = e / (uint(BK) / 8u), q = e % (uint(BK) / 8u);
        uint n = n0 + r, k = k0 + 8u * q;
        vec4 lo = vec4(0.0), hi = vec4(0.0);
        if (n < pc.N && k < pc.K) {
            uint g = k / 8u;
            dq8(n * pc.row_bytes + (g / GPB) * QBYTES, g % GPB, pc.K - k, lo, hi);
        }
        uint s = wb + r * SK2 + 4u * q;
        w_sh[s] = f16vec2(lo.xy);
        w_sh[s + 1u] = f16vec2(lo.zw);
        w_sh[s + 2u] = f16vec2(hi.xy);
        w_sh[s + 3u] = f16vec2(hi.zw);
    }
    // Activations: TILE_N tokens x BK, consecutive threads along k (coalesced).
    if (x_vec4) {
        for (uint e = tid; e < TILE_N * (uint(BK) / 4u); e += 256u) {
            uint c = e / (uint(BK) / 4u), k4 = e % (uint(BK) / 4u);
            uint col = c0 + c, k = k0 + 4u * k4;
            vec4 v = vec4(0.0);
            if (col < pc.T && k < pc.K) {  // 4 floats of one 16-byte-aligned run
                uint i = pc.x_off + col * pc.K + k;
                v = vec4(xs[i], xs[i + 1u], xs[i + 2u], xs[i + 3u]);
            }
            x_sh[xb + c * SK2 + 2u * k4] = f16vec2(v.xy);
            x_sh[xb + c * SK2 + 2u * k4 + 1u] = f16vec2(v.zw);
        }
    } else {
        for (uint e = tid; e < TILE_N * (uint(BK) / 2u); e += 256u) {
            uint c = e / (uint(BK) / 2u), k2 = e % (uint(BK) / 2u);
            uint col = c0 + c, k = k0 + 2u * k2;
            vec2 v = vec2(0.0);
            if (col < pc.T && k < pc.K) {
                uint i = pc.x_off + col * pc.K + k;
                v = vec2(xs[i], k + 1u < pc.K ? xs[i + 1u] : 0.0);
            }
            x_sh[xb + c * SK2 + k2] = f16vec2(v);
        }
    }
}

void main() {
    uint sg = gl_SubgroupID, nsg = gl_NumSubgroups;
    uint n0 = wg_linear() * TILE_M;
    uint c0 = gl_WorkGroupID.z * TILE_N;

    ACC acc[PASSES * CN * CM];
    [[unroll]] for (uint i = 0u; i < PASSES * CN * CM; i++) acc[i] = ACC(0.0);

    // x rows are 16-byte aligned when K and x_off are multiples of 4 (every real model's K)
    bool x_vec4 = (pc.K & 3u) == 0u && (pc.x_off & 3u) == 0u;
    uint steps = (pc.K + uint(BK) - 1u) / uint(BK);
#if BUFFERS == 2
    // Double-buffered: step st multiplies buffer st & 1 while it fills the other with step
    // st + 1; one barrier per step (the other buffer was last read before the previous one).
    load_tiles(0u, 0u, 0u, n0, c0, x_vec4);
    barrier();
#endif
    for (uint st = 0u; st < steps; st++) {
#if BUFFERS == 2
        uint cur = st & 1u;
#else
        uint cur = 0u;
        load_tiles(st * uint(BK), 0u, 0u, n0, c0, x_vec4);
        barrier();
#endif
        uint wb = cur * (TILE_M * SK2), xb = cur * (TILE_N * SK2);
        [[unroll]] for (uint p = 0u; p < PASSES; p++) {
            uint wt = sg + p * nsg;
            if (OWNS(wt)) {
                uint rm = (wt % TILES_M) * WARP_M, tn = (wt / TILES_M) * WARP_N;
                [[unroll]] for (uint kk = 0u; kk < uint(BK) / 2u; kk += 8u) {  // pairs
                    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a[CN];
                    coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB> b[CM];
                    [[unroll]] for (uint j = 0u; j < CN; j++)
                        coopMatLoad(a[j], x_sh, xb + (tn + 16u * j) * SK2 + kk, SK2,
                                    gl_CooperativeMatrixLayoutRowMajor);
                    [[unroll]] for (uint i = 0u; i < CM; i++)
                        coopMatLoad(b[i], w_sh, wb + (rm + 16u * i) * SK2 + kk, SK2,
                                    gl_CooperativeMatrixLayoutColumnMajor);
                    [[unroll]] for (uint j = 0u; j < CN; j++)
                        [[unroll]] for (uint i = 0u; i < CM; i++)
                            acc[(p * CN + j) * CM + i] =
                                coopMatMulAdd(a[j], b[i], acc[(p * CN + j) * CM + i]);
                }
            }
        }
#if BUFFERS == 2
        if (st + 1u < steps)
            load_tiles((st + 1u) * uint(BK), (cur ^ 1u) * (TILE_M * SK2),
                       (cur ^ 1u) * (TILE_N * SK2), n0, c0, x_vec4);
#endif
        barrier();
    }

    // Bounded stores through shared memory, SLOTS subgroups at a time (one round at wave32/64).
    uint lane = gl_SubgroupInvocationID, width = gl_SubgroupSize;
    for (uint round = 0u; round * SLOTS < nsg; round++) {
        if (sg / SLOTS == round) {
            uint slot = (sg % SLOTS) * 256u;
            [[unroll]] for (uint p = 0u; p < PASSES; p++) {
                uint wt = sg + p * nsg;
                if (OWNS(wt)) {
                    uint rm = (wt % TILES_M) * WARP_M, tn = (wt / TILES_M) * WARP_N;
                    [[unroll]] for (uint j = 0u; j < CN; j++)
                        [[unroll]] for (uint i = 0u; i < CM; i++) {
                            coopMatStore(acc[(p * CN + j) * CM + i], c_sh, slot, 16u,
                                         gl_CooperativeMatrixLayoutRowMajor);
                            subgroupMemoryBarrierShared();
                            subgroupBarrier();
                            uint col0 = c0 + tn + 16u * j, row0 = n0 + rm + 16u * i;
#ifdef STORE_UNROLLED
                            // a compile-time trip count (subgroups of at least 32 lanes): the
                            // driver unrolls the accumulator loops around it (acc[] stays in
                            // registers, not local memory)
                            [[unroll]] for (uint r = 0u; r < 8u; r++) {
                                uint e = lane + r * width;
                                if (e >= 256u) continue;
#else
                            for (uint e = lane; e < 256u; e += width) {
#endif
                                uint col = col0 + e / 16u, n = row0 + e % 16u;
                                if (col < pc.T && n < pc.N)
                                    ys[pc.y_off + col * pc.y_stride + n] = c_sh[slot + e];
                            }
                            subgroupBarrier();  // the fragment is read before the next store
                        }
                }
            }
        }
        barrier();
    }
}
