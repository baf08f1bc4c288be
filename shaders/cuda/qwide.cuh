// qwide.cuh: row_group (common.cuh) for the decode kernels of moe_dec.cu with Q4_K and Q6_K
// groups read through 16-byte loads when DEC_WIDE is 1 (moe_experts.dec_wide): a Q4_K group
// reads its block's 16-byte header (d, dmin, the 12 scale bytes) and its 8 quant bytes (2 loads
// where decode_group issues 8, most of them byte loads of the scales); a Q6_K group its 16 ql,
// 16 qh, the 16 scales and d (4 loads where decode_group issues 18 two-byte ones). The decode
// kernels issue a load per lane per group for a few hundred bytes a thread: the load
// instructions, not the bytes, are what their warps queue on. Same bytes, same expressions:
// the same Run8 to the bit. moe_tc.cu's prefill tiles decode through dec_group too (WIDE_LOADS).
// Needs 16-byte aligned blocks: Q4_K's 144-byte and Q6_K's GPU-padded 224-byte blocks in rows
// that start 16-byte aligned (every CudaBackend weight).
#pragma once
#include "common.cuh"

#ifndef DEC_WIDE
#define DEC_WIDE 0
#endif
#ifndef DEC_FCVT
#define DEC_FCVT 0
#endif

// A small int (|v| < 2^22) as a float: I2F (DEC_FCVT 0) or the exact 2^23 + v + 128 from the
// bits minus 2^23 + 128 (DEC_FCVT 1: an integer add and an FADD; see run_dot_x below).
__device__ __forceinline__ float dec_i2f(int v) {
    if constexpr (DEC_FCVT != 0)
        return __uint_as_float(0x4B000000u + (u32)(v + 128)) - 8388736.f;
    else
        return (float)v;
}

// W: the wide loads (moe_dec.cu passes DEC_WIDE's choice for the kernel at hand).
template <int QT, bool W>
__device__ __forceinline__ void dec_group(const u8* __restrict__ blk, int gi, Run8& r0, Run8& r1) {
    if constexpr (!W || (QT != QT_Q4_K && QT != QT_Q6_K)) {
        decode_group<QT>(blk, gi, r0, r1);
    } else if constexpr (QT == QT_Q4_K) {
        const int p = gi >> 2, i = gi & 3;
        const uint4 hdr = __ldg((const uint4*)blk);
        const uint2 w = __ldg((const uint2*)(blk + 16 + 32 * p + 8 * i));
        const float d = h2f((u16)(hdr.x & 0xFFFF)), dmin = h2f((u16)(hdr.x >> 16));
        int s0, m0, s1, m1;
        q4k_scale_min_u4(hdr, 2 * p, s0, m0);
        q4k_scale_min_u4(hdr, 2 * p + 1, s1, m1);
        r0.q0 = w.x & 0x0F0F0F0Fu;
        r0.q1 = w.y & 0x0F0F0F0Fu;
        r1.q0 = (w.x >> 4) & 0x0F0F0F0Fu;
        r1.q1 = (w.y >> 4) & 0x0F0F0F0Fu;
        r0.a = d * dec_i2f(s0);
        r0.b = -dmin * dec_i2f(m0);
        r1.a = d * dec_i2f(s1);
        r1.b = -dmin * dec_i2f(m1);
    } else {  // Q6_K (224-byte blocks on the GPU: every field 16-byte aligned)
        const int h = gi >> 3, qd = (gi >> 1) & 3, l0 = 16 * (gi & 1);
        const uint4 ql = __ldg((const uint4*)(blk + 64 * h + l0 + 32 * (qd & 1)));
        const uint4 qh = __ldg((const uint4*)(blk + 128 + 32 * h + l0));
        const uint4 sc = __ldg((const uint4*)(blk + 192));
        const int si = 8 * h + (gi & 1) + 2 * qd;
        const float a = ld_h(blk + 208) * dec_i2f((signed char)u4_byte(sc, si));
        const int ls = 4 * (qd >> 1), hs = 2 * qd;
        const u32 lw[4] = {ql.x, ql.y, ql.z, ql.w}, hw[4] = {qh.x, qh.y, qh.z, qh.w};
        u32 q[4];
#pragma unroll
        for (int w = 0; w < 4; ++w)
            q[w] = __vsub4(((lw[w] >> ls) & 0x0F0F0F0Fu) | (((hw[w] >> hs) & 0x03030303u) << 4),
                           0x20202020u);
        q6k_runs(q, a, r0, r1);
    }
}

// row_group with dec_group's loads.
template <int QT, bool W>
__device__ __forceinline__ void dec_row_group(const u8* row, int g, Run8& r0, Run8& r1, int& k0,
                                              int& k1) {
    const int b = g / QTraits<QT>::GROUPS, gi = g % QTraits<QT>::GROUPS;
    dec_group<QT, W>(row + (size_t)b * QTraits<QT>::BYTES, gi, r0, r1);
    int o0, o1;
    run_offsets<QT>(gi, o0, o1);
    k0 = b * QTraits<QT>::BK + o0;
    k1 = b * QTraits<QT>::BK + o1;
}

// moe_experts.dec_fcvt (DEC_FCVT 1): run_dot (common.cuh) with each signed byte made a float
// without I2F (a quarter-rate conversion: 16 a group, which the decode kernels' lanes queue on
// once their loads are few): byte b of w ^ 0x80808080 is b's value + 128, placed by one
// byte permute under the exponent of 2^23 (the float 2^23 + v + 128, exact) and one FADD of
// -(2^23 + 128), exact too: the same floats, in the same expression: run_dot to the bit.
__device__ __forceinline__ float sbyte_x(u32 wx, int i) {  // wx = w ^ 0x80808080
    return __uint_as_float(__byte_perm(wx, 0x4B000000u, 0x7650 + i)) - 8388736.f;
}

__device__ __forceinline__ float run_dot_x(const Run8& r, float4 x0, float4 x1) {
    const u32 p = r.q0 ^ 0x80808080u, q = r.q1 ^ 0x80808080u;
    const float qx = sbyte_x(p, 0) * x0.x + sbyte_x(p, 1) * x0.y + sbyte_x(p, 2) * x0.z +
                     sbyte_x(p, 3) * x0.w + sbyte_x(q, 0) * x1.x + sbyte_x(q, 1) * x1.y +
                     sbyte_x(q, 2) * x1.z + sbyte_x(q, 3) * x1.w;
    const float sx = (x0.x + x0.y) + (x0.z + x0.w) + (x1.x + x1.y) + (x1.z + x1.w);
    return r.a * qx + r.b * sx;
}

__device__ __forceinline__ float dec_run_dot(const Run8& r, float4 x0, float4 x1) {
    if constexpr (DEC_FCVT != 0)
        return run_dot_x(r, x0, x1);
    else
        return run_dot(r, x0, x1);
}
