// dmmv.cu: dequantizing matrix-vector and batched matrix-"few vectors" products.
//
//   Y[t, n] = sum_k X[t, k] * W[n, k]     X [T, K] float32, W [N, K] GGML blocks, Y [T, N] float32
//
// Variants (engine/tuning/kernels/cuda.py):
//   matmul_decode.dmmv          T == 1: COLS = 1, K-parallel (TPR threads split each row)
//   matmul_batched.dmmv_kpar    1 < T: COLS columns per launch (MAX_COLS), K-parallel
//   matmul_batched.dmmv_serial  1 < T: COLS columns, one thread walks a whole row (TPR = 1),
//                               the seed's first, slow shape; kept as a searchable baseline
// Tunables (defines): ROWS rows per block, TPR threads per row, COLS columns (tokens) per
// launch, VEC consecutive 16-weight groups a thread decodes per step (its load width: VEC * 8
// bytes of Q4_K nibbles). Each decoded group is applied to every column, so a weight is read
// once per COLS tokens (the reason batched DMMV beats per-token prefill).
// Kernels: dmmv_<type> for q4_0 q4_1 q5_0 q8_0 q4_k q6_k (block decoders from common.cuh) and
// dmmv_f32 f16 bf16 (dense rows). Grid: (ceil(N / ROWS), ceil(T / COLS)), block ROWS * TPR.
#include "common.cuh"

#ifndef ROWS
#define ROWS 4
#endif
#ifndef TPR
#define TPR 32
#endif
#ifndef COLS
#define COLS 1
#endif
#ifndef VEC
#define VEC 1
#endif

// Sum each column's partial over the TPR threads of a row; result valid in the row's lane 0.
__device__ __forceinline__ void reduce_cols(float* sums, float* red /* smem [ROWS][TPR/32][COLS] */) {
    if (TPR == 1) return;
#pragma unroll
    for (int c = 0; c < COLS; ++c) {
        float v = sums[c];
#pragma unroll
        for (int o = (TPR < 32 ? TPR : 32) / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
        sums[c] = v;
    }
    if (TPR > 32) {
        const int lane = threadIdx.x % TPR, r = threadIdx.x / TPR, w = lane / 32;
        if ((lane & 31) == 0) {
#pragma unroll
            for (int c = 0; c < COLS; ++c) red[(r * (TPR / 32) + w) * COLS + c] = sums[c];
        }
        __syncthreads();
        if (lane == 0) {
#pragma unroll
            for (int c = 0; c < COLS; ++c) {
                float v = 0.f;
                for (int i = 0; i < TPR / 32; ++i) v += red[(r * (TPR / 32) + i) * COLS + c];
                sums[c] = v;
            }
        }
    }
}

#define RED_SIZE (TPR > 32 ? ROWS * (TPR / 32) * COLS : 1)

template <int QT>
__device__ __forceinline__ void dmmv_q(const u8* __restrict__ W, int row_bytes, int N, int K,
                                       const float* __restrict__ X, int T,
                                       float* __restrict__ Y) {
    __shared__ float red[RED_SIZE];
    const int lane = threadIdx.x % TPR;
    const int row = blockIdx.x * ROWS + threadIdx.x / TPR;
    const int col0 = blockIdx.y * COLS;
    const int ncols = min(COLS, T - col0);
    float sums[COLS];
#pragma unroll
    for (int c = 0; c < COLS; ++c) sums[c] = 0.f;
    if (row < N) {
        const u8* wr = W + (size_t)row * row_bytes;
        const float* xb = X + (size_t)col0 * K;
        const int NG = K / 16;
        for (int g0 = lane * VEC; g0 < NG; g0 += TPR * VEC) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
                const int g = g0 + j;
                if (g < NG) {
                    Run8 r0, r1;
                    int k0, k1;
                    row_group<QT>(wr, g, r0, r1, k0, k1);
#pragma unroll
                    for (int c = 0; c < COLS; ++c) {
                        if (c < ncols) {
                            const float4* x0 = (const float4*)(xb + (size_t)c * K + k0);
                            const float4* x1 = (const float4*)(xb + (size_t)c * K + k1);
                            sums[c] += run_dot(r0, __ldg(x0), __ldg(x0 + 1)) +
                                       run_dot(r1, __ldg(x1), __ldg(x1 + 1));
                        }
                    }
                }
            }
        }
    }
    reduce_cols(sums, red);
    if (row < N && lane == 0) {
#pragma unroll
        for (int c = 0; c < COLS; ++c)
            if (c < ncols) Y[(size_t)(col0 + c) * N + row] = sums[c];
    }
}

template <int QT>
__device__ __forceinline__ void dmmv_d(const u8* __restrict__ W, int row_bytes, int N, int K,
                                       const float* __restrict__ X, int T,
                                       float* __restrict__ Y) {
    __shared__ float red[RED_SIZE];
    const int lane = threadIdx.x % TPR;
    const int row = blockIdx.x * ROWS + threadIdx.x / TPR;
    const int col0 = blockIdx.y * COLS;
    const int ncols = min(COLS, T - col0);
    float sums[COLS];
#pragma unroll
    for (int c = 0; c < COLS; ++c) sums[c] = 0.f;
    if (row < N) {
        const u8* wr = W + (size_t)row * row_bytes;
        const float* xb = X + (size_t)col0 * K;
        for (int k = lane; k < K; k += TPR) {
            const float w = dense_get<QT>(wr, k);
#pragma unroll
            for (int c = 0; c < COLS; ++c)
                if (c < ncols) sums[c] += w * __ldg(xb + (size_t)c * K + k);
        }
    }
    reduce_cols(sums, red);
    if (row < N && lane == 0) {
#pragma unroll
        for (int c = 0; c < COLS; ++c)
            if (c < ncols) Y[(size_t)(col0 + c) * N + row] = sums[c];
    }
}

#define DMMV_KERNEL(name, QT, impl)                                                           \
    extern "C" __global__ void __launch_bounds__(ROWS* TPR)                                   \
        dmmv_##name(const u8* W, int row_bytes, int N, int K, const float* X, int T, float* Y) { \
        impl<QT>(W, row_bytes, N, K, X, T, Y);                                                \
    }

DMMV_KERNEL(q4_0, QT_Q4_0, dmmv_q)
DMMV_KERNEL(q4_1, QT_Q4_1, dmmv_q)
DMMV_KERNEL(q5_0, QT_Q5_0, dmmv_q)
DMMV_KERNEL(q8_0, QT_Q8_0, dmmv_q)
DMMV_KERNEL(q4_k, QT_Q4_K, dmmv_q)
DMMV_KERNEL(q6_k, QT_Q6_K, dmmv_q)
DMMV_KERNEL(f32, QT_F32, dmmv_d)
DMMV_KERNEL(f16, QT_F16, dmmv_d)
DMMV_KERNEL(bf16, QT_BF16, dmmv_d)
