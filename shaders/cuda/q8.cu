// q8.cu: activations quantized to Q8_1 blocks for the integer (dp4a / int8 mma) matmul paths.
//
//   x [T, K] float32 -> xq [T, K] int8 and xds [T, K / 32] float2 (d, d * sum(q)) per 32 values
//   (x ~ d * q, d = max|x| / 127 over the block; d * sum(q) serves the weight types that carry
//   an offset: Q4_K's min, Q4_1's m).
//
// Variants (engine/tuning/kernels/cuda.py): used by matmul_decode.mmvq and matmul_prefill.mmq8;
// launch parameters only (QTHREADS = matmul_decode.quant_threads is a launch size), so nothing
// here is compiled per config:
//   quantize_q8_1  plain quantization, 8 lanes (one float4 each) per block of 32
//   rms_norm_q8    RMSNorm of one row and its quantization in one pass (one block per row):
//                  writes the float output too, which the op contract returns
//   swiglu_q8      silu(gate) * up and its quantization in one pass
// Needs K % 32 == 0 (every block type's row length is).
#include "common.cuh"

// v: this lane's 4 values of a 32-value block held by 8 consecutive lanes (lane & 7 = quarter
// of 4). Writes 4 int8 and, from the block's first lane, (d, d * sum q); every lane takes
// part in the shuffles, only lanes with ok store.
__device__ __forceinline__ void q8_store4(float4 v, signed char* xq, float2* xds, int lane8,
                                          bool ok) {
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
    const int q0 = __float2int_rn(v.x * id), q1 = __float2int_rn(v.y * id);
    const int q2 = __float2int_rn(v.z * id), q3 = __float2int_rn(v.w * id);
    int s = q0 + q1 + q2 + q3;
#pragma unroll
    for (int o = 4; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (!ok) return;
    *(u32*)xq = (u32)(q0 & 0xFF) | ((u32)(q1 & 0xFF) << 8) | ((u32)(q2 & 0xFF) << 16) |
                ((u32)(q3 & 0xFF) << 24);
    if (lane8 == 0) *xds = make_float2(d, d * (float)s);
}

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
    __shared__ float red[32];
    pdl_start();
    const int row = blockIdx.x, nw = blockDim.x / 32, lane = threadIdx.x & 31;
    const float4* xr = (const float4*)(x + (size_t)row * D);
    const int D4 = D / 4;
    float s = 0.f;
    for (int i = threadIdx.x; i < D4; i += blockDim.x) {
        const float4 v = xr[i];
        s += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    s = warp_sum(s);
    if (lane == 0) red[threadIdx.x / 32] = s;
    __syncthreads();
    s = 0.f;
    for (int i = 0; i < nw; ++i) s += red[i];
    const float scale = rsqrtf(s / (float)D + eps);
    const float4* w4 = (const float4*)w;
    const int nr = (D4 + 31) / 32 * 32;  // whole warps through the shuffles
    for (int i = threadIdx.x; i < nr; i += blockDim.x) {
        const bool ok = i < D4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (ok) {
            const float4 a = xr[i], b = w4[i];
            v = make_float4(a.x * scale * b.x, a.y * scale * b.y, a.z * scale * b.z,
                            a.w * scale * b.w);
            ((float4*)(y + (size_t)row * D))[i] = v;
        }
        q8_store4(v, xq + (size_t)row * D + 4 * i, xds + (size_t)row * (D / 32) + i / 8, i & 7,
                  ok);
    }
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
