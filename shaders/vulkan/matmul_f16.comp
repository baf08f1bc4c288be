#version 450
// matmul_f16.comp: matmul_prefill.resident, the prefill GEMM on fp16 copies (no dequant in the
// k-loop), y[T, N] = x[T, K] @ W[N, K]^T through GL_KHR_cooperative_matrix 16x16x16 fp16 into
// fp32. Three programs (defines):
//
//   PASS_W16   W's raw GGML rows -> an fp16 copy [N, Kp] (Kp = K rounded up to 64, zero-padded),
//              made once per weight and kept (the backend counts it in memory_report's weights).
//   PASS_X16   x [T, K] float32 -> fp16 [T, Kp], zero-padded (per GEMM; ~6 bytes per element).
//   (none)     the GEMM on the two copies: k runs to Kp with no bounds test (the pads are zeros).
//
// GEMM tiling: a 256-thread workgroup owns TILE_M weight rows x TILE_N tokens; each subgroup owns
// exactly one WARP_M x WARP_N subgroup tile (the registry admits only tilings with tiles x
// subgroup size = 256: wave32 or wave64 each get a full set of accumulators, none idle), i.e.
// (WARP_M / 16) x (WARP_N / 16) accumulators. Shared tiles are rows of BK halves padded by 8
// (BK 32: 80-byte rows, so the 8 rows of a 16-byte-per-lane matrix load hit 8 distinct 4-bank
// groups), filled with 16-byte (uvec4) global loads that are issued into registers before the
// current step's multiply-adds (BUFFERS 2: double-buffered, one barrier per step).
// Grid: row tiles x token tiles, linear (folded into x * y), token tiles fastest.
// Results: coopMatStore straight into y where the subgroup tile is whole and y's rows are
// 16-byte aligned, else through shared memory, bounded (y may be a row range of a wider y).
//
// Tunables: specialization constants 0 TILE_M, 1 TILE_N, 2 WARP_M, 3 WARP_N; defines BK (16, 32
// or 64: BK 16 rows are 48 bytes, still 8 distinct 4-bank groups), BUFFERS (1 or 2), SMEM_PAIRS
// (below), THREADS (the GEMM's workgroup: 128 threads of 64 x 64 subgroup tiles is
// llama.cpp's coopmat shape, 16 accumulators per subgroup), MMA_N, SMEM_HALVES, DIRECT
// (below), STORE_UNROLLED (the bounded store's lane loop with a compile-time trip count: with
// a loop bounded by gl_SubgroupSize inside the accumulator loops, NVIDIA's compiler kept the
// whole acc[] array in local memory, "Local Memory Size" = the accumulators' bytes).
//   PASS_KSUM  split_k's sum of the k-ranges' partials into y (below).
// Bindings: GEMM 0 W16, 1 x16, 2 y; PASS_W16 0 Wq, 1 -, 2 W16; PASS_X16 0 x, 1 -,
// 2 x16 (binding 1 unused: the three programs share one layout of three buffers).

#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

#ifdef FIXED_TILES
// The tiles as compile-time constants (FT_M, FT_N, FT_WM, FT_WN) instead of specialization
// constants: tools/vulkan_probe.py compares the two (is a spec-constant-sized accumulator
// array kept in registers by the driver?).
const uint TILE_M = FT_M;
const uint TILE_N = FT_N;
const uint WARP_M = FT_WM;
const uint WARP_N = FT_WN;
#else
layout(constant_id = 0) const uint TILE_M = 128;
layout(constant_id = 1) const uint TILE_N = 128;
layout(constant_id = 2) const uint WARP_M = 64;
layout(constant_id = 3) const uint WARP_N = 32;
#endif
// THREADS: the GEMM's workgroup size (128, 256 or 512; the registry admits tilings with
// (TILE_M / WARP_M) x (TILE_N / WARP_N) x subgroup size = THREADS); the two conversion passes
// are always 256.
#if !defined(THREADS) || defined(PASS_W16) || defined(PASS_X16)
#undef THREADS
#define THREADS 256
#endif
layout(local_size_x = THREADS) in;

// K: weights per row; N: rows (this range); row_bytes: raw bytes per row (PASS_W16);
// x_off: element offset of x[0, 0] (PASS_X16) or of the first raw row (PASS_W16, in rows);
// y_off, y_stride: y[0, row 0] and the elements per y row (GEMM); T: tokens.
layout(push_constant) uniform PC {
    uint K;
    uint N;
    uint row_bytes;
    uint x_off;
    uint y_off;
    uint y_stride;
    uint T;
} pc;

#include "common.glsl"

// Kp: K rounded up to 64 halves, the row length of both fp16 copies.
uint kpad() { return (pc.K + 63u) & ~63u; }

#if defined(PASS_W16)
layout(binding = 0) readonly buffer WBuf { uint Wq[]; };
layout(binding = 2) writeonly buffer HBuf { uvec4 wh[]; };
#include "dequant.glsl"

void main() {
    uint g8 = kpad() / 8u;  // groups of 8 per fp16 row
    uint e = wg_linear() * 256u + gl_LocalInvocationID.x;
    if (e >= pc.N * g8) return;
    uint r = e / g8, q = e % g8, k = 8u * q;
    vec4 lo = vec4(0.0), hi = vec4(0.0);
    if (k < pc.K) {
        uint g = k / 8u;
        dq8((pc.x_off + r) * pc.row_bytes + (g / GPB) * QBYTES, g % GPB, pc.K - k, lo, hi);
    }
    wh[e] = uvec4(packHalf2x16(lo.xy), packHalf2x16(lo.zw), packHalf2x16(hi.xy),
                  packHalf2x16(hi.zw));
}

#elif defined(PASS_X16)
layout(binding = 0) readonly buffer XBuf { float xs[]; };
layout(binding = 2) writeonly buffer HBuf { uvec4 xh[]; };

void main() {
    uint g8 = kpad() / 8u;
    uint e = wg_linear() * 256u + gl_LocalInvocationID.x;
    if (e >= pc.T * g8) return;
    uint t = e / g8, k = 8u * (e % g8);
    float v[8];
    [[unroll]] for (uint i = 0u; i < 8u; i++)
        v[i] = k + i < pc.K ? xs[pc.x_off + t * pc.K + k + i] : 0.0;
    xh[e] = uvec4(packHalf2x16(vec2(v[0], v[1])), packHalf2x16(vec2(v[2], v[3])),
                  packHalf2x16(vec2(v[4], v[5])), packHalf2x16(vec2(v[6], v[7])));
}

#elif defined(PASS_KSUM)
// matmul_prefill.split_k's sum: y[t, n] = the sum of the K k-ranges' partials, in range
// order. Bindings: 0 the partials [K, T, N] at x_off, 2 y.
layout(binding = 0) readonly buffer PBuf { float part[]; };
layout(binding = 2) writeonly buffer YBuf { float ys[]; };

void main() {
    uint e = wg_linear() * 256u + gl_LocalInvocationID.x;
    if (e >= pc.T * pc.N) return;
    uint t = e / pc.N, n = e % pc.N;
    uint o = pc.y_off + t * pc.y_stride + n;
    float v = 0.0;
    for (uint s = 0u; s < pc.K; s++) v += part[pc.x_off + s * pc.T * pc.N + e];
    ys[o] = v;
}

#else  // the GEMM
layout(binding = 0) readonly buffer WBuf { uvec4 wh[]; };
layout(binding = 1) readonly buffer XBuf { uvec4 xh[]; };
layout(binding = 2) writeonly buffer YBuf { float ys[]; };

#ifndef BK
#define BK 32
#endif
#ifndef BUFFERS
#define BUFFERS 2
#endif
#ifndef PREFETCH
#define PREFETCH 2  // the registry's default (with BUFFERS 1 or DIRECT, the one-ahead loop)
#endif
// MMA_N: the weight-row side of each multiply-add (16: 16x16x16; 8: 16x8x16, mma.sync's native
// m16n8k16 on NVIDIA, the shape llama.cpp takes when a driver lists it first); the token side
// is always 16.
#ifndef MMA_N
#define MMA_N 16
#endif
const uint RS = (uint(BK) + 8u) / 8u;       // shared row stride in uvec4 (8 halves)
const uint Q = uint(BK) / 8u;               // uvec4 per row per k-step
const uint LW = TILE_M * Q / THREADS;    // weight uvec4 per thread per step
const uint LX = TILE_N * Q / THREADS;    // token uvec4 per thread per step
const uint BUF = (TILE_M + TILE_N) * RS;    // one buffer: weight rows, then token rows
const uint CM = WARP_M / MMA_N;
const uint CN = WARP_N / 16u;
const uint TILES_M = TILE_M / WARP_M;
// The tiles, or (if larger) a 16 x 16 fp32 result slot (64 uvec4) per subgroup of at least 32
// lanes for the bounded stores.
#ifdef DIRECT  // no shared tiles (below): only the result slots
const uint SH_LEN = (THREADS / 32u) * 64u;
#else
const uint SH_LEN = BUFFERS * BUF > (THREADS / 32u) * 64u ? BUFFERS * BUF : (THREADS / 32u) * 64u;
#endif

// SMEM_PAIRS: the shared tiles as f16vec2 (llama.cpp's coopmat layout: matrix loads take their
// offsets and strides in pairs) instead of uvec4; the same bytes, another element type for the
// driver's matrix-load lowering.
#ifdef SMEM_PAIRS
const uint EW = 4u;  // shared elements per uvec4
shared f16vec2 sh[SH_LEN * EW];
#define SH_PUT(i, u)                                                              \
    {                                                                             \
        uint o_ = EW * (i);                                                       \
        sh[o_] = unpackFloat2x16((u).x);                                          \
        sh[o_ + 1u] = unpackFloat2x16((u).y);                                     \
        sh[o_ + 2u] = unpackFloat2x16((u).z);                                     \
        sh[o_ + 3u] = unpackFloat2x16((u).w);                                     \
    }
#define SH_GET(i)                                                                 \
    uvec4(packFloat2x16(sh[EW * (i)]), packFloat2x16(sh[EW * (i) + 1u]),          \
          packFloat2x16(sh[EW * (i) + 2u]), packFloat2x16(sh[EW * (i) + 3u]))
#elif defined(SMEM_HALVES)
// SMEM_HALVES: the shared tiles as float16_t, the matrices' own element type (strides and
// offsets in halves).
const uint EW = 8u;
shared float16_t sh[SH_LEN * EW];
#define SH_PUT(i, u)                                                              \
    {                                                                             \
        uint o_ = EW * (i);                                                       \
        f16vec2 p0_ = unpackFloat2x16((u).x), p1_ = unpackFloat2x16((u).y);       \
        f16vec2 p2_ = unpackFloat2x16((u).z), p3_ = unpackFloat2x16((u).w);       \
        sh[o_] = p0_.x;                                                           \
        sh[o_ + 1u] = p0_.y;                                                      \
        sh[o_ + 2u] = p1_.x;                                                      \
        sh[o_ + 3u] = p1_.y;                                                      \
        sh[o_ + 4u] = p2_.x;                                                      \
        sh[o_ + 5u] = p2_.y;                                                      \
        sh[o_ + 6u] = p3_.x;                                                      \
        sh[o_ + 7u] = p3_.y;                                                      \
    }
#define SH_H2(j) packFloat2x16(f16vec2(sh[j], sh[(j) + 1u]))
#define SH_GET(i)                                                                 \
    uvec4(SH_H2(EW * (i)), SH_H2(EW * (i) + 2u), SH_H2(EW * (i) + 4u), SH_H2(EW * (i) + 6u))
#else
const uint EW = 1u;
shared uvec4 sh[SH_LEN];
#define SH_PUT(i, u) sh[i] = (u);
#define SH_GET(i) sh[i]
#endif

#define ACC coopmat<float, gl_ScopeSubgroup, 16, MMA_N, gl_MatrixUseAccumulator>

void main() {
    uint tid = gl_LocalInvocationID.x, sg = gl_SubgroupID;
    // One linear grid, token tiles fastest: the workgroups of one weight tile run together, so
    // its rows come from DRAM once and from L2 for the other token tiles (the x tiles are small
    // and stay in L2 anyway).
    uint ntok = (pc.T + TILE_N - 1u) / TILE_N, lin = wg_linear();
    uint n0 = (lin / ntok) * TILE_M, c0 = (lin % ntok) * TILE_N;
    uint q16 = kpad() / 8u;  // uvec4 per fp16 row
    // split_k: row_bytes (unused by the GEMM otherwise) = k-steps per range, range z of the
    // grid (the host dispatches only non-empty ranges), whose partial sums go z x T x y_stride
    // floats further on (a [ranges, T, N] buffer; PASS_KSUM sums it into y). 0: all of k.
    uint steps = kpad() / uint(BK), kbase = 0u;
    if (pc.row_bytes != 0u) {
        kbase = gl_WorkGroupID.z * pc.row_bytes;
        steps = min(steps - kbase, pc.row_bytes);
    }
    uint y_off = pc.y_off + gl_WorkGroupID.z * pc.T * pc.y_stride;
    uint rm = (sg % TILES_M) * WARP_M, tn = (sg / TILES_M) * WARP_N;

    ACC acc[CN * CM];
    [[unroll]] for (uint i = 0u; i < CN * CM; i++) acc[i] = ACC(0.0);

#ifdef DIRECT
    // DIRECT: every subgroup loads its matrices straight from the fp16 copies (L1 / L2 serve
    // the reuse between subgroups and workgroups): no shared tiles, no barriers. The copies'
    // allocations are padded to 256 rows (engine/backends/vulkan/resident.py), so a ragged
    // tile reads pad rows, whose products are never stored.
    for (uint st = 0u; st < steps; st++) {
        [[unroll]] for (uint kk = 0u; kk < Q; kk += 2u) {  // 16 k = 2 uvec4
            uint kq = (kbase + st) * Q + kk;
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a[CN];
            coopmat<float16_t, gl_ScopeSubgroup, 16, MMA_N, gl_MatrixUseB> b[CM];
            [[unroll]] for (uint j = 0u; j < CN; j++)
                coopMatLoad(a[j], xh, (c0 + tn + 16u * j) * q16 + kq, q16,
                            gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint i = 0u; i < CM; i++)
                coopMatLoad(b[i], wh, (n0 + rm + MMA_N * i) * q16 + kq, q16,
                            gl_CooperativeMatrixLayoutColumnMajor);
            [[unroll]] for (uint j = 0u; j < CN; j++)
                [[unroll]] for (uint i = 0u; i < CM; i++)
                    acc[j * CM + i] = coopMatMulAdd(a[j], b[i], acc[j * CM + i]);
        }
    }
#else
    // Each thread's slots: element e = tid + 256 i of the tile, row e / Q, uvec4 e % Q; rows
    // past N or T load zeros (their products are never stored).
    uvec4 rw[LW], rx[LX];
    [[unroll]] for (uint i = 0u; i < LW; i++) rw[i] = uvec4(0u);
    [[unroll]] for (uint i = 0u; i < LX; i++) rx[i] = uvec4(0u);

#define FETCH_TO(st, RW, RX)                                                       \
    {                                                                              \
        uint kq = (kbase + (st)) * Q;                                              \
        [[unroll]] for (uint i = 0u; i < LW; i++) {                                \
            uint e = tid + THREADS * i, r = n0 + e / Q;                         \
            RW[i] = r < pc.N ? wh[r * q16 + kq + e % Q] : uvec4(0u);               \
        }                                                                          \
        [[unroll]] for (uint i = 0u; i < LX; i++) {                                \
            uint e = tid + THREADS * i, c = c0 + e / Q;                         \
            RX[i] = c < pc.T ? xh[c * q16 + kq + e % Q] : uvec4(0u);               \
        }                                                                          \
    }
#define STASH_FROM(b, RW, RX)                                                      \
    {                                                                              \
        [[unroll]] for (uint i = 0u; i < LW; i++) {                                \
            uint e = tid + THREADS * i;                                         \
            SH_PUT((b) * BUF + (e / Q) * RS + e % Q, RW[i]);                       \
        }                                                                          \
        [[unroll]] for (uint i = 0u; i < LX; i++) {                                \
            uint e = tid + THREADS * i;                                         \
            SH_PUT((b) * BUF + (TILE_M + e / Q) * RS + e % Q, RX[i]);              \
        }                                                                          \
    }
#define FETCH(st) FETCH_TO(st, rw, rx)
#define STASH(b) STASH_FROM(b, rw, rx)

// one k-step's multiply-adds on shared buffer `cur`
#define MMA_STEP(cur)                                                              \
    {                                                                              \
        uint wb = (cur) * BUF, xb = wb + TILE_M * RS;                              \
        [[unroll]] for (uint kk = 0u; kk < Q; kk += 2u) { /* 16 k = 2 uvec4 */     \
            coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA> a[CN];     \
            coopmat<float16_t, gl_ScopeSubgroup, 16, MMA_N, gl_MatrixUseB> b[CM];  \
            [[unroll]] for (uint j = 0u; j < CN; j++)                              \
                coopMatLoad(a[j], sh, EW * (xb + (tn + 16u * j) * RS + kk), EW * RS,   \
                            gl_CooperativeMatrixLayoutRowMajor);                   \
            [[unroll]] for (uint i = 0u; i < CM; i++)                              \
                coopMatLoad(b[i], sh, EW * (wb + (rm + MMA_N * i) * RS + kk), EW * RS, \
                            gl_CooperativeMatrixLayoutColumnMajor);                \
            [[unroll]] for (uint j = 0u; j < CN; j++)                              \
                [[unroll]] for (uint i = 0u; i < CM; i++)                          \
                    acc[j * CM + i] = coopMatMulAdd(a[j], b[i], acc[j * CM + i]);  \
        }                                                                          \
    }

#if PREFETCH == 2 && BUFFERS == 2
    // PREFETCH 2: the global loads of step st + 2 are issued before step st's multiply-adds
    // (two register sets: rw / rx hold even steps, rw2 / rx2 odd ones), so each load has two
    // steps of multiply-adds to arrive instead of one; the step loop is unrolled by two so
    // both sets are indexed at compile time. The same shared buffers and barriers, the same
    // products in the same order: the same bits.
    uvec4 rw2[LW], rx2[LX];
    [[unroll]] for (uint i = 0u; i < LW; i++) rw2[i] = uvec4(0u);
    [[unroll]] for (uint i = 0u; i < LX; i++) rx2[i] = uvec4(0u);
    FETCH(0u);
    STASH(0u);
    if (1u < steps) FETCH_TO(1u, rw2, rx2);
    barrier();
    for (uint st = 0u; st < steps; st += 2u) {
        if (st + 2u < steps) FETCH(st + 2u);  // rw / rx: step st's data went to buffer 0
        MMA_STEP(0u);
        if (st + 1u < steps) STASH_FROM(1u, rw2, rx2);  // buffer 1: last read in step st - 1
        barrier();
        if (st + 1u >= steps) break;
        if (st + 3u < steps) FETCH_TO(st + 3u, rw2, rx2);
        MMA_STEP(1u);
        if (st + 2u < steps) STASH(0u);  // buffer 0: last read above, before the barrier
        barrier();
    }
#else
    FETCH(0u);
    STASH(0u);
    barrier();
    for (uint st = 0u; st < steps; st++) {
#if BUFFERS == 2
        uint cur = st & 1u;
#else
        uint cur = 0u;
#endif
        if (st + 1u < steps) FETCH(st + 1u);  // global loads in flight over the multiply-adds
        MMA_STEP(cur);
        if (st + 1u < steps) {
#if BUFFERS == 2
            STASH(cur ^ 1u);  // last read in step st - 1, before that step's barrier
#else
            barrier();  // every subgroup is done reading the one buffer
            STASH(0u);
#endif
        }
        barrier();
    }
#endif

#endif

    // y: straight from the accumulators where the subgroup tile is whole and 16-byte aligned,
    // else through this subgroup's 16 x 16 float slot of sh (free now: the loop ended on a
    // barrier), bounded.
    uint row0 = n0 + rm, col0 = c0 + tn;
    bool aligned = (y_off & 3u) == 0u && (pc.y_stride & 3u) == 0u;
    if (aligned && row0 + WARP_M <= pc.N && col0 + WARP_N <= pc.T) {
        [[unroll]] for (uint j = 0u; j < CN; j++)
            [[unroll]] for (uint i = 0u; i < CM; i++)
                coopMatStore(acc[j * CM + i], ys,
                             y_off + (col0 + 16u * j) * pc.y_stride + row0 + MMA_N * i,
                             pc.y_stride, gl_CooperativeMatrixLayoutRowMajor);
        return;
    }
    uint lane = gl_SubgroupInvocationID, width = gl_SubgroupSize, slot = sg * 64u;
    [[unroll]] for (uint j = 0u; j < CN; j++)
        [[unroll]] for (uint i = 0u; i < CM; i++) {
            coopMatStore(acc[j * CM + i], sh, EW * slot, EW * 4u,
                         gl_CooperativeMatrixLayoutRowMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
#ifdef STORE_UNROLLED
            // a compile-time trip count (subgroups of 32 or 64 lanes: two rounds cover the
            // slot's 64 uvec4): the driver unrolls these loops and keeps acc[] in registers
            [[unroll]] for (uint r = 0u; r < 2u; r++) {
                uint e = lane + r * width;
                if (e >= 64u) continue;
#else
            for (uint e = lane; e < 64u; e += width) {  // a row of 16 = 4 uvec4
#endif
                uint col = col0 + 16u * j + e / 4u, n = row0 + MMA_N * i + 4u * (e % 4u);
                vec4 v = uintBitsToFloat(SH_GET(slot + e));
                if (col < pc.T && 4u * (e % 4u) < MMA_N) {  // MMA_N 8: half a slot row
                    uint o = y_off + col * pc.y_stride + n;
                    [[unroll]] for (uint c = 0u; c < 4u; c++)
                        if (n + c < pc.N) ys[o + c] = v[c];
                }
            }
            subgroupBarrier();  // the slot is read before the next store
        }
}
#endif
