// q8.cuh: Q8_1 quantization helpers shared by q8.cu (quantize_q8_1, rms_norm_q8, swiglu_q8) and
// mmvw.cu's fused epilogues (mmvw_norm: the residual stream's next RMSNorm; mmvw_glu: SwiGLU),
// so a fused kernel rounds exactly as the kernel it replaces.
#pragma once
#include "norm.cuh"

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

// RMSNorm of one row x [D] by the whole block (blockDim a multiple of 32) -> y [D] and its Q8_1
// blocks. CG: x was written by other blocks of this grid (mmvw_norm's last block), so it is
// read through L2 (ld.global.cg), never a stale L1 line.
template <bool CG>
__device__ __forceinline__ void rms_norm_q8_row(const float* __restrict__ x,
                                                const float* __restrict__ w,
                                                float* __restrict__ y,
                                                signed char* __restrict__ xq,
                                                float2* __restrict__ xds, int D, float eps) {
    __shared__ float red[32];
    const int nw = blockDim.x / 32, lane = threadIdx.x & 31;
    const float4* xr = (const float4*)x;
    const int D4 = D / 4;
    float s = 0.f;
    for (int i = threadIdx.x; i < D4; i += blockDim.x) {
        const float4 v = CG ? __ldcg(xr + i) : xr[i];
        s += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    const float scale = block_rms_scale(s, red, nw, lane, D, eps);
    const float4* w4 = (const float4*)w;
    const int nr = (D4 + 31) / 32 * 32;  // whole warps through the shuffles
    for (int i = threadIdx.x; i < nr; i += blockDim.x) {
        const bool ok = i < D4;
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (ok) {
            const float4 a = CG ? __ldcg(xr + i) : xr[i], b = w4[i];
            v = make_float4(a.x * scale * b.x, a.y * scale * b.y, a.z * scale * b.z,
                            a.w * scale * b.w);
            ((float4*)y)[i] = v;
        }
        q8_store4(v, xq + 4 * i, xds + i / 8, i & 7, ok);
    }
}
