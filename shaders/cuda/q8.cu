// q8.cu: activations quantized to Q8_1 blocks for the integer (dp4a / int8 mma) matmul paths.
//
//   x [T, K] float32 -> xq [T, K] int8 and xds [T, K / 32] float2 (d, d * sum(q)) per 32 values
//   (x ~ d * q, d = max|x| / 127 over the block; d * sum(q) serves the weight types that carry
//   an offset: Q4_K's min, Q4_1's m).
//
// Variants (engine/tuning/variants/cuda/): used by matmul_decode.mmvq and matmul_prefill.mmq8;
// launch parameters only (QTHREADS = matmul_decode.quant_threads is a launch size), so nothing
// here is compiled per config:
//   quantize_q8_1  plain quantization, 8 lanes (one float4 each) per block of 32
//   rms_norm_q8    RMSNorm of one row and its quantization in one pass (one block per row):
//                  writes the float output too, which the op contract returns
//   swiglu_q8      silu(gate) * up and its quantization in one pass
// Needs K % 32 == 0 (every block type's row length is).
#include "q8.cuh"

// n4 = T * K / 4 float4s; grid-stride with whole warps (every lane of a warp takes part in the
// shuffles: the loop bound is rounded up to the warp and idle lanes quantize zeros unwritten).
extern "C" __global__ void quantize_q8_1(const float* __restrict__ x, signed char* __restrict__ xq,
                                         float2* __restrict__ xds, long long n4) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long nr = (n4 + 31) / 32 * 32;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < nr; i += stride) {
        const bool ok = i < n4;
        const float4 v = ok ? ((const float4*)x)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        q8_store4(v, xq + 4 * i, xds + i / 8, (int)(i & 7), ok);
    }
}

// One block per row: x [rows, D] -> y (float) and xq, xds. D % 32 == 0.
extern "C" __global__ void rms_norm_q8(const float* __restrict__ x, const float* __restrict__ w,
                                       float* __restrict__ y, signed char* __restrict__ xq,
                                       float2* __restrict__ xds, int D, float eps) {
    pdl_start();
    const int row = blockIdx.x;
    rms_norm_q8_row<false>(x + (size_t)row * D, w, y + (size_t)row * D, xq + (size_t)row * D,
                           xds + (size_t)row * (D / 32), D, eps);
}

// gate, up [n] -> y = silu(gate) * up, and its Q8_1 blocks. n % 32 == 0.
extern "C" __global__ void swiglu_q8(const float* __restrict__ g, const float* __restrict__ u,
                                     float* __restrict__ y, signed char* __restrict__ xq,
                                     float2* __restrict__ xds, long long n4) {
    pdl_start();
    const long long stride = (long long)gridDim.x * blockDim.x;
    const long long nr = (n4 + 31) / 32 * 32;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < nr; i += stride) {
        const bool ok = i < n4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (ok) {
            const float4 a = ((const float4*)g)[i], b = ((const float4*)u)[i];
            v = make_float4(a.x / (1.f + expf(-a.x)) * b.x, a.y / (1.f + expf(-a.y)) * b.y,
                            a.z / (1.f + expf(-a.z)) * b.z, a.w / (1.f + expf(-a.w)) * b.w);
            ((float4*)y)[i] = v;
        }
        q8_store4(v, xq + 4 * i, xds + i / 8, (int)(i & 7), ok);
    }
}
