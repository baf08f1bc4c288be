// moe_tc.cu: the routed experts of a MoE FFN at prefill as a grouped GEMM on fp16 tensor cores
// (moe_experts.tc, engine/tuning/variants/cuda_hybrid.py; mma.sync m16n8k16, sm_80+).
//
// The (token, slot) pairs are sorted by expert and cut into tiles of <= TILE_PAIRS pairs by
// moe_route.cuh's moe_sort (route = [n_tiles, (expert, start, count) x max_tiles, order[P]]).
// A block takes BLOCK_ROWS weight rows of one tile's expert, as mmq.cu does for a dense matrix: each
// 64-wide k window of its rows is read from device memory once, decoded in registers
// (common.cuh) and written to shared memory as fp16; the tile's activations come in as fp16 too,
// and 4 warps (BLOCK_ROWS / 4 weight rows each, all the tile's pairs) accumulate in float32 with
// ldmatrix + mma. Shared rows are padded to 72 halves (ldmatrix rows on distinct banks).
//   moe_tc_gu_<type>   gate and up of a tile at once (two weight tiles, two accumulators),
//                      SwiGLU in registers: H [P, F] fp16 in sorted order. The activation row of
//                      sorted pair i is x[order[i] / x_div] (float32, rounded while staged).
//   moe_tc_down_<type> down on H's sorted rows, written to the pair's own row of D [P, C]
//                      (order[i]: pair order), which moe_combine sums per token.
// Rows past N, k past K (32-element blocks: K a multiple of 32) and pairs past the tile's count
// are zeros in shared memory and never stored; tiles past n_tiles return (the grid is sized on
// the host without reading the routing back).
// Tunables (defines): TILE_PAIRS (pairs per tile: 16, 32, 64), BLOCK_ROWS (weight rows per block: 64, 128),
// Q4K_WINDOW (1: a thread decodes a Q4_K row's whole window, mt_q4k_window; 0: every type a group
// of 16 per thread), WIDE_LOADS (1: Q4_K / Q6_K groups decoded from 16-byte loads, qwide.cuh's
// dec_group), DIRECT (1: Q4_K experts decoded straight into mma fragments, mt_direct).
// Grid (ceil(N / BLOCK_ROWS), max_tiles), block 128.
#if !defined(TILE_PAIRS) || !defined(BLOCK_ROWS)
#error "moe_tc.cu needs TILE_PAIRS and BLOCK_ROWS (engine/tuning/variants/cuda_hybrid.py)"
#endif
#include "common.cuh"
#include "qwide.cuh"
#include "moe_route.cuh"
#include "tc.cuh"

#define MT_WARPS 4
#define MT_THREADS (MT_WARPS * 32)
#define MT_BK 64
#define MT_LD (MT_BK + 8)
#define MT_TM (BLOCK_ROWS / MT_WARPS)  // weight rows per warp
#define MT_MF (MT_TM / 16)     // its m16 fragments
#define MT_NF (TILE_PAIRS / 8)     // n8 fragments: the tile's pairs

#ifndef Q4K_WINDOW
#define Q4K_WINDOW 0
#endif
#ifndef WIDE_LOADS
#define WIDE_LOADS 1
#endif

// A Q4_K row's 64-wide window [k0, k0 + 64) (sub-blocks 2p, 2p + 1 of its block) -> dst: the
// same weights as decode_group<QT_Q4_K> of its 4 groups gives, with d, dmin and the two
// scale / min pairs loaded and converted once and the 32 quant bytes in two 16-byte loads.
__device__ __forceinline__ void mt_q4k_window(const u8* __restrict__ row, int k0, u16* dst) {
    const u8* blk = row + (size_t)(k0 >> 8) * QTraits<QT_Q4_K>::BYTES;
    const int p = (k0 >> 6) & 3;
    const uint4 hdr = __ldg((const uint4*)blk);  // d, dmin, scales: one load
    const float d = h2f((u16)(hdr.x & 0xFFFF)), dmin = h2f((u16)(hdr.x >> 16));
    int s0, m0, s1, m1;
    q4k_scale_min_u4(hdr, 2 * p, s0, m0);
    q4k_scale_min_u4(hdr, 2 * p + 1, s1, m1);
    Run8 lo, hi;  // quant byte j: low nibble element j, high nibble element 32 + j
    lo.a = d * (float)s0;
    lo.b = -dmin * (float)m0;
    hi.a = d * (float)s1;
    hi.b = -dmin * (float)m1;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const uint4 q = __ldg((const uint4*)(blk + 16 + 32 * p + 16 * h));
        const u32 w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int u = 0; u < 2; ++u) {
            lo.q0 = w[2 * u] & 0x0F0F0F0Fu;
            lo.q1 = w[2 * u + 1] & 0x0F0F0F0Fu;
            hi.q0 = (w[2 * u] >> 4) & 0x0F0F0F0Fu;
            hi.q1 = (w[2 * u + 1] >> 4) & 0x0F0F0F0Fu;
            *(uint4*)(dst + 16 * h + 8 * u) = tc_run_f16(lo);
            *(uint4*)(dst + 32 + 16 * h + 8 * u) = tc_run_f16(hi);
        }
    }
}

// Weight rows [0, rows) of one expert (W at its first row), k window [k0, k0 + 64) -> Ws.
// rot: the thread that takes row 0 of a window-per-thread decode (gate and up of BLOCK_ROWS = 64 rows
// on the two halves of the block).
template <int QT>
__device__ __forceinline__ void mt_stage_w(const u8* __restrict__ W, int row_bytes, int rows,
                                           int K, int k0, u16* Ws, int rot = 0) {
    if (QT == QT_Q4_K && Q4K_WINDOW) {  // a thread per row window (K is a multiple of 256)
        for (int r = (threadIdx.x + MT_THREADS - rot) % MT_THREADS; r < BLOCK_ROWS; r += MT_THREADS) {
            u16* dst = Ws + r * MT_LD;
            if (r < rows) {
                mt_q4k_window(W + (size_t)r * row_bytes, k0, dst);
            } else {
#pragma unroll
                for (int c = 0; c < MT_BK; c += 8) *(uint4*)(dst + c) = make_uint4(0, 0, 0, 0);
            }
        }
        return;
    }
    const int NG = K / 16;
    for (int i = threadIdx.x; i < BLOCK_ROWS * 4; i += MT_THREADS) {
        const int r = i >> 2, g = k0 / 16 + (i & 3);
        u16* dst = Ws + r * MT_LD;
        if (r < rows && g < NG) {
            const int b = g / QTraits<QT>::GROUPS, gi = g % QTraits<QT>::GROUPS;
            Run8 r0, r1;
            const u8* blk = W + (size_t)r * row_bytes + (size_t)b * QTraits<QT>::BYTES;
            dec_group<QT, WIDE_LOADS != 0>(blk, gi, r0, r1);
            int o0, o1;  // row_group's element offsets
            run_offsets<QT>(gi, o0, o1);
            const int kb0 = b * QTraits<QT>::BK - k0;
            *(uint4*)(dst + kb0 + o0) = tc_run_f16(r0);
            *(uint4*)(dst + kb0 + o1) = tc_run_f16(r1);
        } else {  // the 4 groups of a window cover it, in any type's order: zero by position
            *(uint4*)(dst + 16 * (i & 3)) = make_uint4(0, 0, 0, 0);
            *(uint4*)(dst + 16 * (i & 3) + 8) = make_uint4(0, 0, 0, 0);
        }
    }
}

// acc[w][mf][nf] += weight tile w's rows (this warp's) x Xs rows (the tile's pairs) over one
// 64-wide window, for NWT tiles (gate and up: 2) sharing the pairs' fragments (loaded once).
template <int NWT>
__device__ __forceinline__ void mt_window(const u16* const (&Ws)[NWT], const u16* Xs,
                                          float (&acc)[NWT][MT_MF][MT_NF][4]) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x & 31;
#pragma unroll
    for (int kk = 0; kk < MT_BK; kk += 16) {
        u32 af[NWT][MT_MF][4];
#pragma unroll
        for (int w = 0; w < NWT; ++w)
#pragma unroll
            for (int a = 0; a < MT_MF; ++a)
                tc_ldsm_x4(af[w][a], Ws[w] + (warp * MT_TM + a * 16 + (lane & 15)) * MT_LD + kk +
                                         (lane >> 4) * 8);
#pragma unroll
        for (int b = 0; b < MT_NF; b += 2) {
            u32 r4[4];
            tc_ldsm_x4(r4, Xs + (b * 8 + (lane & 7) + ((lane >> 4) << 3)) * MT_LD + kk +
                               ((lane >> 3) & 1) * 8);
#pragma unroll
            for (int w = 0; w < NWT; ++w)
#pragma unroll
                for (int a = 0; a < MT_MF; ++a) {
                    tc_mma(acc[w][a][b], af[w][a], r4[0], r4[1]);
                    tc_mma(acc[w][a][b + 1], af[w][a], r4[2], r4[3]);
                }
        }
    }
}

template <int NWT>
__device__ __forceinline__ void mt_zero(float (&acc)[NWT][MT_MF][MT_NF][4]) {
#pragma unroll
    for (int w = 0; w < NWT; ++w)
#pragma unroll
        for (int a = 0; a < MT_MF; ++a)
#pragma unroll
            for (int b = 0; b < MT_NF; ++b)
#pragma unroll
                for (int c = 0; c < 4; ++c) acc[w][a][b][c] = 0.f;
}

// The tile of this block: false past n_tiles (the whole block returns before any barrier).
__device__ __forceinline__ bool mt_tile(const int* route, int E, int& e, int& start, int& count) {
    const int tile = blockIdx.y;
    if (tile >= route[0]) return false;
    e = min(max(route[1 + 3 * tile], 0), E - 1);
    start = route[2 + 3 * tile];
    count = route[3 + 3 * tile];
    return true;
}

#ifndef DIRECT
#define DIRECT 1
#endif

// DIRECT = 1, Q4_K experts: a warp decodes its own rows straight into mma A fragments
// (no shared-memory weight tile: its stores and ldmatrix reads were most of the block's shared
// traffic). In a 64-wide window (sub-blocks 2p, 2p + 1 of a block) lane tig of a row takes the
// quant bytes 8 tig .. 8 tig + 7; its k16 step s holds elements mt_phys(s, tig) + j, j = 0..3
// (s = 0, 1: low nibbles of bytes 8 tig + 4 s + j, sub-block 2p; s = 2, 3: high nibbles of
// bytes 8 tig + 4 (s - 2) + j, sub-block 2p + 1) at the fragment's k positions 2 tig, 2 tig + 1,
// 2 tig + 8, 2 tig + 9. The pairs' x is staged with the same permutation, so each product
// pairs the same weight and x as before (a sum over k in another order).
__device__ __forceinline__ int mt_phys(int s, int t) { return (s >> 1) * 32 + 8 * t + 4 * (s & 1); }

// This lane's raw data of a row window: the block's header and its 8 quant bytes (zeros: a row
// past N, whose weights then decode to 0).
__device__ __forceinline__ void mt_q4k_raw(const u8* __restrict__ row, bool ok, int k0, int tig,
                                           uint4& hdr, uint2& qs) {
    hdr = make_uint4(0, 0, 0, 0);
    qs = make_uint2(0, 0);
    if (ok) {
        const u8* blk = row + (size_t)(k0 >> 8) * QTraits<QT_Q4_K>::BYTES;
        hdr = __ldg((const uint4*)blk);
        qs = __ldg((const uint2*)(blk + 16 + 32 * ((k0 >> 6) & 3) + 8 * tig));
    }
}

// f[s][0] = fp16 (j0, j1), f[s][1] = (j2, j3) of k16 step s (a * q + b in float32, rounded once).
__device__ __forceinline__ void mt_q4k_frag(const uint4& hdr, const uint2& qs, int p,
                                            u32 (&f)[4][2]) {
    const float d = h2f((u16)(hdr.x & 0xFFFF)), dmin = h2f((u16)(hdr.x >> 16));
    int s0, m0, s1, m1;
    q4k_scale_min_u4(hdr, 2 * p, s0, m0);
    q4k_scale_min_u4(hdr, 2 * p + 1, s1, m1);
    const float a[2] = {d * (float)s0, d * (float)s1}, b[2] = {-dmin * (float)m0, -dmin * (float)m1};
    const u32 w[4] = {qs.x & 0x0F0F0F0Fu, qs.y & 0x0F0F0F0Fu, (qs.x >> 4) & 0x0F0F0F0Fu,
                      (qs.y >> 4) & 0x0F0F0F0Fu};
#pragma unroll
    for (int st = 0; st < 4; ++st) {
        const u32 x = w[st] ^ 0x80808080u;
        float v[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) v[j] = fmaf(a[st >> 1], tc_qf(x, 0x7540u + j), b[st >> 1]);
        f[st][0] = f2h2(v[0], v[1]);
        f[st][1] = f2h2(v[2], v[3]);
    }
}

// moe_tc_gu (NWT = 2: gate and up, x gathered) or moe_tc_down (NWT = 1: H's sorted rows, out to
// the pairs' rows) for Q4_K with DIRECT: same tiles, same outputs.
template <int NWT>
__device__ __forceinline__ void mt_direct(const u8* __restrict__ W0, const u8* __restrict__ W1,
                                          int row_bytes, int N, int K,
                                          const float* __restrict__ X, int x_div,
                                          const u16* __restrict__ Hin,
                                          const int* __restrict__ route, int max_tiles, int E,
                                          u16* __restrict__ H, float* __restrict__ D) {
    __shared__ __align__(16) u16 Xs[TILE_PAIRS * MT_LD];
    __shared__ int xrow[TILE_PAIRS];
    int e, start, count;
    if (!mt_tile(route, E, e, start, count)) return;
    const int tid = threadIdx.x, n0 = blockIdx.x * BLOCK_ROWS, rows = min(BLOCK_ROWS, N - n0);
    const int warp = tid / 32, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
    const int* order = route + 1 + 3 * max_tiles;
    for (int r = tid; r < TILE_PAIRS; r += MT_THREADS)  // gate / up: x's row; down: H's
        xrow[r] = r >= count ? -1 : NWT == 2 ? order[start + r] / x_div : start + r;
    const u8* base[2] = {W0 + ((size_t)e * N + n0) * row_bytes,
                         W1 + ((size_t)e * N + n0) * row_bytes};
    uint4 hdr[NWT][MT_MF][2];  // [weight][m16 fragment][row gid / gid + 8]
    uint2 qs[NWT][MT_MF][2];
#pragma unroll
    for (int w = 0; w < NWT; ++w)
#pragma unroll
        for (int a = 0; a < MT_MF; ++a)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int lr = warp * MT_TM + a * 16 + gid + 8 * h;
                mt_q4k_raw(base[w] + (size_t)lr * row_bytes, lr < rows, 0, tig, hdr[w][a][h],
                           qs[w][a][h]);
            }
    float acc[NWT][MT_MF][MT_NF][4];
    mt_zero(acc);
    __syncthreads();
    for (int k0 = 0; k0 < K; k0 += MT_BK) {
        u32 fr[NWT][MT_MF][2][4][2];
#pragma unroll
        for (int w = 0; w < NWT; ++w)
#pragma unroll
            for (int a = 0; a < MT_MF; ++a)
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    mt_q4k_frag(hdr[w][a][h], qs[w][a][h], (k0 >> 6) & 3, fr[w][a][h]);
                    const int lr = warp * MT_TM + a * 16 + gid + 8 * h;  // next window in flight
                    if (k0 + MT_BK < K)
                        mt_q4k_raw(base[w] + (size_t)lr * row_bytes, lr < rows, k0 + MT_BK, tig,
                                   hdr[w][a][h], qs[w][a][h]);
                }
        for (int i = tid; i < TILE_PAIRS * 16; i += MT_THREADS) {  // 4 k at a time, permuted alike
            const int r = i >> 4, ph = (i & 15) * 4, t = xrow[r];
            u32 lo = 0, hi = 0;
            if (t >= 0 && NWT == 2) {
                const float4 v = __ldg((const float4*)(X + (size_t)t * K + k0 + ph));
                lo = f2h2(v.x, v.y);
                hi = f2h2(v.z, v.w);
            } else if (t >= 0) {
                const uint2 v = __ldg((const uint2*)(Hin + (size_t)t * K + k0 + ph));
                lo = v.x;
                hi = v.y;
            }
            const int st = (ph >> 5) * 2 + ((ph >> 2) & 1), tg = (ph & 31) >> 3;
            u16* dst = Xs + r * MT_LD + 16 * st + 2 * tg;
            *(u32*)dst = lo;
            *(u32*)(dst + 8) = hi;
        }
        __syncthreads();
#pragma unroll
        for (int st = 0; st < 4; ++st)
#pragma unroll
            for (int b = 0; b < MT_NF; b += 2) {
                u32 r4[4];
                tc_ldsm_x4(r4, Xs + (b * 8 + (lane & 7) + ((lane >> 4) << 3)) * MT_LD + 16 * st +
                                   ((lane >> 3) & 1) * 8);
#pragma unroll
                for (int w = 0; w < NWT; ++w)
#pragma unroll
                    for (int a = 0; a < MT_MF; ++a) {
                        const u32 af[4] = {fr[w][a][0][st][0], fr[w][a][1][st][0],
                                           fr[w][a][0][st][1], fr[w][a][1][st][1]};
                        tc_mma(acc[w][a][b], af, r4[0], r4[1]);
                        tc_mma(acc[w][a][b + 1], af, r4[2], r4[3]);
                    }
            }
        __syncthreads();
    }
#pragma unroll
    for (int a = 0; a < MT_MF; ++a)
#pragma unroll
        for (int b = 0; b < MT_NF; ++b)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int n = n0 + warp * MT_TM + a * 16 + gid + (c >> 1) * 8;
                const int p = b * 8 + tig * 2 + (c & 1);
                if (n >= N || p >= count) continue;
                if (NWT == 2) {
                    const float g = acc[0][a][b][c];
                    H[(size_t)(start + p) * N + n] = f2h(g / (1.f + expf(-g)) * acc[NWT - 1][a][b][c]);
                } else {
                    D[(size_t)order[start + p] * N + n] = acc[0][a][b][c];
                }
            }
}

template <int QT>
__device__ __forceinline__ void moe_tc_gu(const u8* __restrict__ Wg, const u8* __restrict__ Wu,
                                          int row_bytes, int N, int K,
                                          const float* __restrict__ X, int x_div,
                                          const int* __restrict__ route, int max_tiles, int E,
                                          u16* __restrict__ H) {
    if (DIRECT && QT == QT_Q4_K) {
        mt_direct<2>(Wg, Wu, row_bytes, N, K, X, x_div, nullptr, route, max_tiles, E, H, nullptr);
        return;
    }
    __shared__ __align__(16) u16 Gs[BLOCK_ROWS * MT_LD];
    __shared__ __align__(16) u16 Us[BLOCK_ROWS * MT_LD];
    __shared__ __align__(16) u16 Xs[TILE_PAIRS * MT_LD];
    __shared__ int xrow[TILE_PAIRS];
    int e, start, count;
    if (!mt_tile(route, E, e, start, count)) return;
    const int tid = threadIdx.x, n0 = blockIdx.x * BLOCK_ROWS, rows = min(BLOCK_ROWS, N - n0);
    const int* order = route + 1 + 3 * max_tiles;
    for (int r = tid; r < TILE_PAIRS; r += MT_THREADS) xrow[r] = r < count ? order[start + r] / x_div : -1;
    const size_t w0 = ((size_t)e * N + n0) * row_bytes;
    float acc[2][MT_MF][MT_NF][4];  // gate, up
    mt_zero(acc);
    const u16* const ws[2] = {Gs, Us};
    __syncthreads();
    for (int k0 = 0; k0 < K; k0 += MT_BK) {
        mt_stage_w<QT>(Wg + w0, row_bytes, rows, K, k0, Gs);
        mt_stage_w<QT>(Wu + w0, row_bytes, rows, K, k0, Us, BLOCK_ROWS % MT_THREADS);
        for (int i = tid; i < TILE_PAIRS * 16; i += MT_THREADS) {  // float4 chunks of the pairs' x
            const int r = i >> 4, c = (i & 15) * 4, t = xrow[r];
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (t >= 0 && k0 + c < K) v = __ldg((const float4*)(X + (size_t)t * K + k0 + c));
            *(uint2*)(Xs + r * MT_LD + c) = make_uint2(f2h2(v.x, v.y), f2h2(v.z, v.w));
        }
        __syncthreads();
        mt_window(ws, Xs, acc);
        __syncthreads();
    }
    const int warp = tid / 32, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int a = 0; a < MT_MF; ++a)
#pragma unroll
        for (int b = 0; b < MT_NF; ++b)
#pragma unroll
            for (int c = 0; c < 4; ++c) {
                const int n = n0 + warp * MT_TM + a * 16 + gid + (c >> 1) * 8;
                const int p = b * 8 + tig * 2 + (c & 1);
                if (n < N && p < count) {
                    const float g = acc[0][a][b][c];
                    H[(size_t)(start + p) * N + n] = f2h(g / (1.f + expf(-g)) * acc[1][a][b][c]);
                }
            }
}

template <int QT>
__device__ __forceinline__ void moe_tc_down(const u8* __restrict__ W, int row_bytes, int N, int K,
                                            const u16* __restrict__ H,
                                            const int* __restrict__ route, int max_tiles, int E,
                                            float* __restrict__ D) {
    if (DIRECT && QT == QT_Q4_K) {
        mt_direct<1>(W, W, row_bytes, N, K, nullptr, 1, H, route, max_tiles, E, nullptr, D);
        return;
    }
    __shared__ __align__(16) u16 Ws[BLOCK_ROWS * MT_LD];
    __shared__ __align__(16) u16 Xs[TILE_PAIRS * MT_LD];
    int e, start, count;
    if (!mt_tile(route, E, e, start, count)) return;
    const int tid = threadIdx.x, n0 = blockIdx.x * BLOCK_ROWS, rows = min(BLOCK_ROWS, N - n0);
    const size_t w0 = ((size_t)e * N + n0) * row_bytes;
    float acc[1][MT_MF][MT_NF][4];
    mt_zero(acc);
    const u16* const ws[1] = {Ws};
    for (int k0 = 0; k0 < K; k0 += MT_BK) {
        mt_stage_w<QT>(W + w0, row_bytes, rows, K, k0, Ws);
        for (int i = tid; i < TILE_PAIRS * 8; i += MT_THREADS) {  // 16-byte chunks of H's rows
            const int r = i >> 3, c = (i & 7) * 8;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (r < count && k0 + c < K) v = __ldg((const uint4*)(H + (size_t)(start + r) * K + k0 + c));
            *(uint4*)(Xs + r * MT_LD + c) = v;
        }
        __syncthreads();
        mt_window(ws, Xs, acc);
        __syncthreads();
    }
    const int* order = route + 1 + 3 * max_tiles;
    const int warp = tid / 32, lane = tid & 31, gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int b = 0; b < MT_NF; ++b)
#pragma unroll
        for (int c = 0; c < 4; ++c) {
            const int p = b * 8 + tig * 2 + (c & 1);
            if (p >= count) continue;
            const size_t row = (size_t)order[start + p] * N;
#pragma unroll
            for (int a = 0; a < MT_MF; ++a) {
                const int n = n0 + warp * MT_TM + a * 16 + gid + (c >> 1) * 8;
                if (n < N) D[row + n] = acc[0][a][b][c];
            }
        }
}

#define MOE_TC_KERNELS(name, QT)                                                               \
    extern "C" __global__ void __launch_bounds__(MT_THREADS)                                   \
        moe_tc_gu_##name(const u8* Wg, const u8* Wu, int row_bytes, int N, int K,              \
                         const float* X, int x_div, const int* route, int max_tiles, int E,    \
                         u16* H) {                                                             \
        moe_tc_gu<QT>(Wg, Wu, row_bytes, N, K, X, x_div, route, max_tiles, E, H);              \
    }                                                                                          \
    extern "C" __global__ void __launch_bounds__(MT_THREADS)                                   \
        moe_tc_down_##name(const u8* W, int row_bytes, int N, int K, const u16* H,             \
                           const int* route, int max_tiles, int E, float* D) {                 \
        moe_tc_down<QT>(W, row_bytes, N, K, H, route, max_tiles, E, D);                        \
    }

MOE_TC_KERNELS(q4_0, QT_Q4_0)
MOE_TC_KERNELS(q4_1, QT_Q4_1)
MOE_TC_KERNELS(q5_0, QT_Q5_0)
MOE_TC_KERNELS(q8_0, QT_Q8_0)
MOE_TC_KERNELS(q4_k, QT_Q4_K)
MOE_TC_KERNELS(q6_k, QT_Q6_K)
