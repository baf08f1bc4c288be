// dmmv.cu: dequantizing matrix-vector and batched matrix-"few vectors" products.
//
//   Y[t, n] = sum_k X[t, k] * W[n, k]     X [T, K] float32, W [N, K] GGML blocks, Y [T, N] float32
//
// Variants (engine/tuning/variants/cuda/):
//   matmul_decode.dmmv          T == 1: MAX_COLS = 1, K-parallel (THREADS_PER_ROW threads split each row)
//   matmul_batched.dmmv_kpar    1 < T: MAX_COLS columns per launch (max_cols), K-parallel
//   matmul_batched.dmmv_serial  1 < T: MAX_COLS columns, one thread walks a whole row (THREADS_PER_ROW = 1),
//                               the seed's first, slow shape; kept as a searchable baseline
// Tunables (defines): ROWS_PER_BLOCK thread-rows per block, ROWS_PER_THREAD weight rows per thread-row (decode only),
// THREADS_PER_ROW threads per row, MAX_COLS columns (tokens) per launch, VEC consecutive 16-weight groups a
// thread decodes per step (its load width: VEC * 8 bytes of Q4_K nibbles). Each decoded group is
// applied to every column, so a weight is read once per MAX_COLS tokens (the reason batched DMMV
// beats per-token prefill).
// Kernels: dmmv_<type> for q4_0 q4_1 q5_0 q8_0 q4_k q6_k (block decoders from common.cuh) and
// dmmv_f32 f16 bf16 (dense rows). Grid: (ceil(N / (ROWS_PER_BLOCK * ROWS_PER_THREAD)), ceil(T / MAX_COLS)), block ROWS_PER_BLOCK * THREADS_PER_ROW.
#include "common.cuh"

// No defaults: three variants with different defaults build this file, so every tunable comes
// from the registry (engine.backends.cuda.kernels.modules_for), and a build without one fails.
#if !defined(ROWS_PER_BLOCK) || !defined(THREADS_PER_ROW) || !defined(MAX_COLS) || !defined(VEC) || !defined(ROWS_PER_THREAD)
#error "dmmv.cu needs ROWS_PER_BLOCK, THREADS_PER_ROW, MAX_COLS, VEC and ROWS_PER_THREAD (engine/tuning/variants/cuda/)"
#endif

// Sum each of the S partials of a thread-row over its THREADS_PER_ROW threads; result in the row's lane 0.
template <int S>
__device__ __forceinline__ void reduce_sums(float* sums, float* red /* smem [ROWS_PER_BLOCK][THREADS_PER_ROW/32][S] */) {
    if (THREADS_PER_ROW == 1) return;
#pragma unroll
    for (int c = 0; c < S; ++c) {
        float v = sums[c];
#pragma unroll
        for (int o = (THREADS_PER_ROW < 32 ? THREADS_PER_ROW : 32) / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        sums[c] = v;
    }
    if (THREADS_PER_ROW > 32) {
        const int lane = threadIdx.x % THREADS_PER_ROW, r = threadIdx.x / THREADS_PER_ROW, w = lane / 32;
        if ((lane & 31) == 0) {
#pragma unroll
            for (int c = 0; c < S; ++c) red[(r * (THREADS_PER_ROW / 32) + w) * S + c] = sums[c];
        }
        __syncthreads();
        if (lane == 0) {
#pragma unroll
            for (int c = 0; c < S; ++c) {
                float v = 0.f;
                for (int i = 0; i < THREADS_PER_ROW / 32; ++i) v += red[(r * (THREADS_PER_ROW / 32) + i) * S + c];
                sums[c] = v;
            }
        }
    }
}

#define NSUM (ROWS_PER_THREAD * MAX_COLS)
#define RED_SIZE (THREADS_PER_ROW > 32 ? ROWS_PER_BLOCK * (THREADS_PER_ROW / 32) * NSUM : 1)

// A thread owns ROWS_PER_THREAD rows (row0 .. row0 + ROWS_PER_THREAD - 1) and MAX_COLS columns: each activation load
// serves ROWS_PER_THREAD rows, each decoded group serves MAX_COLS columns, and the ROWS_PER_THREAD rows' weight loads are
// independent, so more bytes are in flight per thread.
template <int QT>
__device__ __forceinline__ void dmmv_t(const u8* __restrict__ W, int row_bytes, int N, int K,
                                       const float* __restrict__ X, int T,
                                       float* __restrict__ Y) {
    __shared__ float red[RED_SIZE];
    const int lane = threadIdx.x % THREADS_PER_ROW;
    const int row0 = (blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / THREADS_PER_ROW) * ROWS_PER_THREAD;
    const int col0 = blockIdx.y * MAX_COLS;
    const int ncols = min(MAX_COLS, T - col0);
    float sums[NSUM];
#pragma unroll
    for (int c = 0; c < NSUM; ++c) sums[c] = 0.f;
    const float* xb = X + (size_t)col0 * K;
    if constexpr (QT == QT_F32 || QT == QT_F16 || QT == QT_BF16) {  // dense rows: a weight a step
        const int KK = row0 < N ? K : 0;
        for (int k = lane; k < KK; k += THREADS_PER_ROW) {
#pragma unroll
            for (int r = 0; r < ROWS_PER_THREAD; ++r) {
                const float w = dense_get<QT>(W + (size_t)min(row0 + r, N - 1) * row_bytes, k);
#pragma unroll
                for (int c = 0; c < MAX_COLS; ++c)
                    if (c < ncols) sums[r * MAX_COLS + c] += w * __ldg(xb + (size_t)c * K + k);
            }
        }
    } else {  // quantized rows: VEC 16-weight groups a step
        const int NG = row0 < N ? K / 16 : 0;
        for (int g0 = lane * VEC; g0 < NG; g0 += THREADS_PER_ROW * VEC) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                const int g = g0 + j;
                if (g < NG) {
                    Run8 a[ROWS_PER_THREAD], b[ROWS_PER_THREAD];
                    int k0, k1;
#pragma unroll
                    for (int r = 0; r < ROWS_PER_THREAD; ++r)  // rows past N decode row N - 1; never written
                        row_group<QT>(W + (size_t)min(row0 + r, N - 1) * row_bytes, g, a[r], b[r], k0,
                                      k1);
#pragma unroll
                    for (int c = 0; c < MAX_COLS; ++c) {
                        if (c < ncols) {
                            const float4* x0 = (const float4*)(xb + (size_t)c * K + k0);
                            const float4* x1 = (const float4*)(xb + (size_t)c * K + k1);
                            const float4 x0a = __ldg(x0), x0b = __ldg(x0 + 1);
                            const float4 x1a = __ldg(x1), x1b = __ldg(x1 + 1);
#pragma unroll
                            for (int r = 0; r < ROWS_PER_THREAD; ++r)
                                sums[r * MAX_COLS + c] += run_dot(a[r], x0a, x0b) + run_dot(b[r], x1a, x1b);
                        }
                    }
                }
            }
        }
    }
    reduce_sums<NSUM>(sums, red);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < ROWS_PER_THREAD; ++r)
#pragma unroll
            for (int c = 0; c < MAX_COLS; ++c)
                if (row0 + r < N && c < ncols) Y[(size_t)(col0 + c) * N + row0 + r] = sums[r * MAX_COLS + c];
    }
}

#define DMMV_KERNEL(name, QT)                                                                 \
    extern "C" __global__ void __launch_bounds__(ROWS_PER_BLOCK* THREADS_PER_ROW)                                   \
        dmmv_##name(const u8* W, int row_bytes, int N, int K, const float* X, int T, float* Y) { \
        dmmv_t<QT>(W, row_bytes, N, K, X, T, Y);                                              \
    }

DMMV_KERNEL(q4_0, QT_Q4_0)
DMMV_KERNEL(q4_1, QT_Q4_1)
DMMV_KERNEL(q5_0, QT_Q5_0)
DMMV_KERNEL(q8_0, QT_Q8_0)
DMMV_KERNEL(q4_k, QT_Q4_K)
DMMV_KERNEL(q6_k, QT_Q6_K)
DMMV_KERNEL(f32, QT_F32)
DMMV_KERNEL(f16, QT_F16)
DMMV_KERNEL(bf16, QT_BF16)
