// mmvw.cu: decode matrix-vector products on Q8_1 activations, up to three matrices per launch,
// with an added vector in the epilogue (bias or residual).
//
//   y_i[n] = sum_k W_i[n, k] x[k] + a_i[n]   (a_i optional), i < 3, x as Q8_1 (q8.cu)
//
// Variants (engine/tuning/kernels/cuda.py): matmul_decode.mmvw. One launch serves q, k and v (or
// gate and up) of a layer reading one quantized activation, each with its own weight type, and
// the attention-output and down projections add the residual as they store: a decode layer is
// about ten launches instead of twenty.
// Work split: a group of TPR lanes (inside one warp) walks RPT consecutive rows; each lane takes
// every TPR-th slot of the row (vecdot.cuh: 32 weights, one 16-byte load, for Q4_K / Q6_K) and
// UNROLL slots per iteration, so UNROLL * RPT weight loads are in flight per thread before any
// is used. The group's partial sums meet by shuffles (no shared memory, no block barrier).
// Tunables (defines): TPR threads per row (8, 16, 32), RPT rows per thread, NW warps per
// block, UNROLL slots per iteration. Rows per block: NW * (32 / TPR) * RPT.
// Launch: grid nb0 + nb1 + nb2 blocks (block b < nb0 -> matrix 0, then 1, then 2), block NW*32.
// Types: Q4_0 Q4_1 Q5_0 Q8_0 Q4_K Q6_K (float weights use dmmv). K % 256 == 0 for the K types.
#include "vecdot.cuh"

#ifndef TPR
#define TPR 32
#endif
#ifndef RPT
#define RPT 1
#endif
#ifndef NW
#define NW 4
#endif
#ifndef UNROLL
#define UNROLL 2
#endif

#if TPR != 8 && TPR != 16 && TPR != 32
#error "TPR must be 8, 16 or 32 (a row's lanes sit inside one warp)"
#endif

#define MMVW_GROUPS (NW * 32 / TPR)

template <int QT>
__device__ __forceinline__ void mmvw_rows(const u8* __restrict__ W, int row_bytes, int N, int K,
                                          const s8* __restrict__ xq,
                                          const float2* __restrict__ xds, float* Y,
                                          const float* A, int bi) {
    const int g = threadIdx.x / TPR, lane = threadIdx.x % TPR;
    const int row0 = (bi * MMVW_GROUPS + g) * RPT;
    if (row0 >= N) return;  // whole groups leave together: the shuffles below stay full
    const int ns = VD<QT>::slots(K);
    const u8* rows[RPT];
    float acc[RPT];
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
        rows[r] = W + (size_t)min(row0 + r, N - 1) * row_bytes;
        acc[r] = 0.f;
    }
    for (int s0 = lane; s0 < ns; s0 += TPR * UNROLL) {
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int s = s0 + u * TPR;
            const bool ok = s < ns;
            const int sc = ok ? s : s0;  // a valid slot, its result dropped: straight-line code
            const XSlot x = VD<QT>::load(sc, xq, xds);
#pragma unroll
            for (int r = 0; r < RPT; ++r) {
                const float v = VD<QT>::dot(rows[r], sc, x);
                acc[r] += ok ? v : 0.f;
            }
        }
    }
    const unsigned mask =
        TPR == 32 ? 0xffffffffu : ((1u << TPR) - 1u) << ((threadIdx.x & 31) & ~(TPR - 1));
#pragma unroll
    for (int r = 0; r < RPT; ++r) {
#pragma unroll
        for (int o = TPR / 2; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(mask, acc[r], o);
    }
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < RPT; ++r) {
            const int n = row0 + r;
#ifdef MUTANT_MMVW_TAIL_ROWS  // planted bug: rows past the last multiple of 32 are not written
            if (n < (N & ~31)) Y[n] = acc[r] + (A ? A[n] : 0.f);
#else
            if (n < N) Y[n] = acc[r] + (A ? A[n] : 0.f);
#endif
        }
    }
}

// Matrix i: weights W_i [N_i, row_bytes_i] of GGML type qt_i, output Y_i [N_i], added A_i
// [N_i] or null. Y_i may be A_i (each element is read, then written, by one thread).
extern "C" __global__ void __launch_bounds__(NW * 32)
    mmvw(const s8* __restrict__ xq, const float2* __restrict__ xds, int K, int nb0, int nb1,
         const u8* W0, int rb0, int N0, int qt0, float* Y0, const float* A0,
         const u8* W1, int rb1, int N1, int qt1, float* Y1, const float* A1,
         const u8* W2, int rb2, int N2, int qt2, float* Y2, const float* A2) {
    pdl_start();
    int b = blockIdx.x;
    const u8* W = W0;
    int rb = rb0, N = N0, qt = qt0;
    float* Y = Y0;
    const float* A = A0;
    if (b >= nb0 + nb1) {
        b -= nb0 + nb1;
        W = W2, rb = rb2, N = N2, qt = qt2, Y = Y2, A = A2;
    } else if (b >= nb0) {
        b -= nb0;
        W = W1, rb = rb1, N = N1, qt = qt1, Y = Y1, A = A1;
    }
    switch (qt) {
        case QT_Q4_K: mmvw_rows<QT_Q4_K>(W, rb, N, K, xq, xds, Y, A, b); break;
        case QT_Q6_K: mmvw_rows<QT_Q6_K>(W, rb, N, K, xq, xds, Y, A, b); break;
        case QT_Q4_0: mmvw_rows<QT_Q4_0>(W, rb, N, K, xq, xds, Y, A, b); break;
        case QT_Q4_1: mmvw_rows<QT_Q4_1>(W, rb, N, K, xq, xds, Y, A, b); break;
        case QT_Q5_0: mmvw_rows<QT_Q5_0>(W, rb, N, K, xq, xds, Y, A, b); break;
        case QT_Q8_0: mmvw_rows<QT_Q8_0>(W, rb, N, K, xq, xds, Y, A, b); break;
        default: break;
    }
}
