// norm.cuh: the RMSNorm scale rsqrt(mean of squares + eps) of a row, by a warp or by a block:
// one copy of the sums (and their order) for the norm kernels that share it (elementwise.cu,
// prefill_f16.cu, norm_decode.cu, q8.cuh). Kept out of common.cuh, which the host-side tests
// also compile with g++ (no rsqrtf there).
#pragma once
#include "common.cuh"

// RMSNorm scale of a row xr [D] by one warp: rsqrt(mean of squares + eps), lane-strided sums
// (elementwise.cu rms_norm, prefill_f16.cu rms_norm_f16).
__device__ __forceinline__ float warp_rms_scale(const float* xr, int D, float eps, int lane) {
    float s = 0.f;
    for (int i = lane; i < D; i += 32) s += xr[i] * xr[i];
    s = warp_sum(s);
    return rsqrtf(s / (float)D + eps);
}

// An RMSNorm scale rsqrt(mean of squares + eps) of a row of D values from each thread's share s
// of the sum of squares: a warp sum, then the nw warps' sums in warp order (red: shared, one a
// warp; blockDim a multiple of 32). Every thread gets the scale. nw and lane come from the
// caller, computed where its code always did (moving the blockDim read reorders the SASS).
__device__ __forceinline__ float block_rms_scale(float s, float* red, int nw, int lane, int D,
                                                 float eps) {
    s = warp_sum(s);
    if (lane == 0) red[threadIdx.x / 32] = s;
    __syncthreads();
    s = 0.f;
    for (int i = 0; i < nw; ++i) s += red[i];
    return rsqrtf(s / (float)D + eps);
}
