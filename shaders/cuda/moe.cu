// moe.cu: the routed experts' matrix-vector products, reading only the chosen experts' rows.
//
//   Y[p, n] = sum_k X[p / x_div, k] * W[ids[p] * N + n, k]
//   W [E * N, K] GGML blocks (a stacked [E, N, K] expert weight), ids [P] int32 on the device
//   (router_topk's, token-major: pair p = t * k_used + j), X [P / x_div, K], Y [P, N] float32.
// x_div = k_used for gate and up (every chosen expert of token t reads x[t]), 1 for down.
//
// Variant: moe_experts.dmmv (engine/tuning/variants/cuda_hybrid.py). The kernels are the decode
// DMMV of dmmv.cu (the same block decoders and K-parallel row reduction, one column) with the
// expert's rows picked on the device, so a captured decode graph serves every routing. Tunables
// (defines): ROWS_PER_BLOCK weight rows per block, THREADS_PER_ROW threads splitting a row, VEC consecutive 16-weight
// groups per thread per step. Grid (ceil(N / ROWS_PER_BLOCK), 1, pairs); pair p0 + blockIdx.z.
#if !defined(ROWS_PER_BLOCK) || !defined(THREADS_PER_ROW) || !defined(VEC)
#error "moe.cu needs ROWS_PER_BLOCK, THREADS_PER_ROW and VEC (engine/tuning/variants/cuda_hybrid.py)"
#endif
#define MAX_COLS 1  // one token per pair
#define ROWS_PER_THREAD 1
#include "dmmv.cu"

#define MOE_KERNEL(name, QT)                                                                \
    extern "C" __global__ void __launch_bounds__(ROWS_PER_BLOCK * THREADS_PER_ROW)                                \
        moe_##name(const u8* W, int row_bytes, int N, int K, const float* X, int x_div,     \
                   const int* ids, int E, int p0, float* Y) {                               \
        pdl_start(); /* matmul_decode.pdl: chained into the decode step's launches */       \
        const int p = p0 + blockIdx.z;                                                      \
        const int e = min(max(ids[p], 0), E - 1); /* a corrupt id must not fault */         \
        dmmv_t<QT>(W + (size_t)e * N * row_bytes, row_bytes, N, K, X + (size_t)(p / x_div) * K, \
                   1, Y + (size_t)p * N);                                                     \
    }

MOE_KERNEL(q4_0, QT_Q4_0)
MOE_KERNEL(q4_1, QT_Q4_1)
MOE_KERNEL(q5_0, QT_Q5_0)
MOE_KERNEL(q8_0, QT_Q8_0)
MOE_KERNEL(q4_k, QT_Q4_K)
MOE_KERNEL(q6_k, QT_Q6_K)
MOE_KERNEL(f32, QT_F32)
MOE_KERNEL(f16, QT_F16)
MOE_KERNEL(bf16, QT_BF16)
