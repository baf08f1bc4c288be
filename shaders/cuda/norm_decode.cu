// norm_decode.cu: RMSNorm of a row by a whole block with the row held in registers (one memory
// round trip: x and w are loaded together, before the reduction), optionally with the row's
// Q8_1 blocks (the int8 decode paths' input).
//
// Variant (engine/tuning/variants/cuda/): rms_norm.block (knob threads). rms_norm.warp
// (elementwise.cu) walks a decode row of 1536-3584 values with one warp in two scalar passes;
// q8.cu's rms_norm_q8 reads x twice with the reduction between. Here each thread takes float4
// i = tid + r * blockDim (r < NMAX) of x and w, sums its squares in that order (rms_norm_q8's
// order, so with the same threads the outputs are rms_norm_q8's to the bit), then writes
// y = x * scale * w from registers and, with xq non-null, its Q8_1 blocks (q8.cuh's q8_store4).
// Needs D % 4 == 0 (xq: D % 32 == 0) and D <= 4 * NMAX * blockDim (the host checks; else the
// warp kernel runs). Launch: grid rows, block threads (a multiple of 32).
#include "q8.cuh"

#define NMAX 8  // float4s a thread holds at most

extern "C" __global__ void __launch_bounds__(512)
    rms_norm_row(const float* __restrict__ x, const float* __restrict__ w, float* __restrict__ y,
                 signed char* __restrict__ xq, float2* __restrict__ xds, int D, float eps) {
    __shared__ float red[32];
    pdl_start();
    const int row = blockIdx.x, nw = blockDim.x / 32, lane = threadIdx.x & 31;
    const int D4 = D / 4;
    const float4* xr = (const float4*)(x + (size_t)row * D);
    const float4* w4 = (const float4*)w;
    float4 xv[NMAX], wv[NMAX];
#pragma unroll
    for (int r = 0; r < NMAX; ++r) {
        const int i = threadIdx.x + r * blockDim.x;
        xv[r] = wv[r] = make_float4(0.f, 0.f, 0.f, 0.f);
        if (i < D4) {
            xv[r] = xr[i];
            wv[r] = w4[i];
        }
    }
    float s = 0.f;
#pragma unroll
    for (int r = 0; r < NMAX; ++r) {
        const float4 v = xv[r];
        if (threadIdx.x + r * blockDim.x < D4) s += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    const float scale = block_rms_scale(s, red, nw, lane, D, eps);
    float4* yr = (float4*)(y + (size_t)row * D);
    const int nr = (D4 + 31) / 32 * 32;  // whole warps through the Q8_1 shuffles
#pragma unroll
    for (int r = 0; r < NMAX; ++r) {
        const int i = threadIdx.x + r * blockDim.x;
        if (i - lane >= nr) break;  // warp-uniform: the warp's first float4 is past the row
        const bool ok = i < D4;
        const float4 a = xv[r], b = wv[r];
        const float4 v = make_float4(a.x * scale * b.x, a.y * scale * b.y, a.z * scale * b.z,
                                     a.w * scale * b.w);
        if (ok) yr[i] = v;
        if (xq) q8_store4(v, xq + (size_t)row * D + 4 * i, xds + (size_t)row * (D / 32) + i / 8,
                          i & 7, ok);
    }
}
