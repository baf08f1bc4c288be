// prefill_f16.cu: producers of the fp16 activations the prefill GEMM reads
// (matmul_prefill.resident with fuse_f16 = 1, engine/tuning/kernels/cuda.py).
//
// Each kernel is its elementwise.cu twin that also stores the fp16 rounding (cvt.rn, the same
// bits dequant.cu's f32_to_f16 makes) of what it writes, so the GEMM's input needs no pass of
// its own. The float32 output is still written: other ops and the contract read it.
#include "common.cuh"

// x [rows, D] -> y f32 and yh f16; w [D] float32. blockDim = 32 * rows per block.
extern "C" __global__ void rms_norm_f16(const float* __restrict__ x, const float* __restrict__ w,
                                        float* __restrict__ y, u16* __restrict__ yh, int rows,
                                        int D, float eps) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* xr = x + (size_t)row * D;
    float s = 0.f;
    for (int i = lane; i < D; i += 32) s += xr[i] * xr[i];
    s = warp_sum(s);
    const float scale = rsqrtf(s / (float)D + eps);
    float* yr = y + (size_t)row * D;
    u16* hr = yh + (size_t)row * D;
    for (int i = lane; i < D; i += 32) {
        const float v = xr[i] * scale * w[i];
        yr[i] = v;
        hr[i] = f2h(v);
    }
}

// silu(g) * u -> y f32 and yh f16, n elements.
extern "C" __global__ void swiglu_f16(const float* g, const float* u, float* y, u16* yh,
                                      long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float v = g[i];
        const float r = v / (1.f + expf(-v)) * u[i];
        y[i] = r;
        yh[i] = f2h(r);
    }
}

// gu [T, 2F] (gate in columns [0, F), up in [F, 2F): one GEMM of both) -> silu(gate) * up as
// y [T, F] f32 and yh f16.
extern "C" __global__ void swiglu_pair_f16(const float* __restrict__ gu, float* __restrict__ y,
                                           u16* __restrict__ yh, int T, int F) {
    const long long n = (long long)T * F;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const long long t = i / F, j = i % F;
        const float v = gu[t * 2 * F + j];
        const float r = v / (1.f + expf(-v)) * gu[t * 2 * F + F + j];
        y[i] = r;
        yh[i] = f2h(r);
    }
}
