// dequant.cu: whole-row dequantization.
//
// Variants (engine/tuning/variants/cuda/):
//   embedding.get_rows           get_rows_<type>: rows ids[t] of a quantized table -> float32
//                                [T, K]; the ids stay on the device (the decode graph feeds
//                                the argmax of the previous step straight in)
//   matmul_prefill.staged        dequant_f16_<type>: rows [r0, r0 + n) of W -> fp16 scratch
//                                [n, K] for a cuBLAS GEMM (the seed's staged baseline: it
//                                writes and re-reads 2 bytes per weight)
//   (all fp16 GEMM paths)        f32_to_f16: activations to fp16
// Tunables: none compiled in; threads per block is a launch parameter (embedding.threads).
// One thread decodes one 16-weight group (common.cuh) or, for float types, 16 elements.
#include "common.cuh"

// Eight decoded values to out: float32 as two float4 stores, fp16 as one uint4.
__device__ __forceinline__ void store8(float* out, const float* v) {
    *(float4*)out = make_float4(v[0], v[1], v[2], v[3]);
    *(float4*)(out + 4) = make_float4(v[4], v[5], v[6], v[7]);
}
__device__ __forceinline__ void store8(u16* out, const float* v) {
    *(uint4*)out = make_uint4(f2h2(v[0], v[1]), f2h2(v[2], v[3]), f2h2(v[4], v[5]),
                              f2h2(v[6], v[7]));
}

// Group g of a quantized row, decoded, into out (float or u16: fp16) at the group's offsets.
template <int QT, class O>
__device__ __forceinline__ void store_group(const u8* row, int g, O* out) {
    Run8 r0, r1;
    int k0, k1;
    row_group<QT>(row, g, r0, r1, k0, k1);
    float v[8];
    run_floats(r0, v);
    store8(out + k0, v);
    run_floats(r1, v);
    store8(out + k1, v);
}

// ids [T] int32 -> out [T, K] float32. Grid-stride over T * K/16 groups.
template <int QT>
__device__ void get_rows_q(const u8* W, int row_bytes, int K, const int* ids, int T, float* out) {
    const int NG = K / 16;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (long long)T * NG;
         i += (long long)gridDim.x * blockDim.x) {
        const int t = (int)(i / NG), g = (int)(i % NG);
        store_group<QT>(W + (size_t)ids[t] * row_bytes, g, out + (size_t)t * K);
    }
}

template <int QT>
__device__ void get_rows_d(const u8* W, int row_bytes, int K, const int* ids, int T, float* out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (long long)T * K;
         i += (long long)gridDim.x * blockDim.x) {
        const int t = (int)(i / K), k = (int)(i % K);
        out[i] = dense_get<QT>(W + (size_t)ids[t] * row_bytes, k);
    }
}

// Rows [r0, r0 + n) of W -> out [n, K] fp16.
template <int QT>
__device__ void dequant_f16_q(const u8* W, int row_bytes, int K, int r0, int n, u16* out) {
    const int NG = K / 16;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (long long)n * NG;
         i += (long long)gridDim.x * blockDim.x) {
        const int r = (int)(i / NG), g = (int)(i % NG);
        store_group<QT>(W + (size_t)(r0 + r) * row_bytes, g, out + (size_t)r * K);
    }
}

template <int QT>
__device__ void dequant_f16_d(const u8* W, int row_bytes, int K, int r0, int n, u16* out) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (long long)n * K;
         i += (long long)gridDim.x * blockDim.x) {
        const int r = (int)(i / K), k = (int)(i % K);
        out[i] = f2h(dense_get<QT>(W + (size_t)(r0 + r) * row_bytes, k));
    }
}

#define DEQ_KERNELS(name, QT, kind)                                                            \
    extern "C" __global__ void get_rows_##name(const u8* W, int row_bytes, int K, const int* ids, \
                                               int T, float* out) {                            \
        get_rows_##kind<QT>(W, row_bytes, K, ids, T, out);                                     \
    }                                                                                          \
    extern "C" __global__ void dequant_f16_##name(const u8* W, int row_bytes, int K, int r0,    \
                                                  int n, u16* out) {                           \
        dequant_f16_##kind<QT>(W, row_bytes, K, r0, n, out);                                   \
    }

DEQ_KERNELS(q4_0, QT_Q4_0, q)
DEQ_KERNELS(q4_1, QT_Q4_1, q)
DEQ_KERNELS(q5_0, QT_Q5_0, q)
DEQ_KERNELS(q8_0, QT_Q8_0, q)
DEQ_KERNELS(q4_k, QT_Q4_K, q)
DEQ_KERNELS(q6_k, QT_Q6_K, q)
DEQ_KERNELS(f32, QT_F32, d)
DEQ_KERNELS(f16, QT_F16, d)
DEQ_KERNELS(bf16, QT_BF16, d)

// x [n] float32 -> y [n] fp16.
extern "C" __global__ void f32_to_f16(const float* x, u16* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        y[i] = f2h(x[i]);
}

// y [n] fp16 -> x [n] float32 (the staged GEMM's fp16 output back to the engine's float32).
extern "C" __global__ void f16_to_f32(const u16* y, float* x, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        x[i] = h2f(y[i]);
}
