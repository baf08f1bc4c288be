// tc.cuh: tensor-core helpers (mma.sync m16n8k16, ldmatrix; sm_80+) for the kernels that stage
// tiles in shared memory (moe_tc.cu, attention_tc.cu, mmq.cu, mmq8.cu): one copy of the asm.
#pragma once
#include "common.cuh"

__device__ __forceinline__ u32 tc_smem_u32(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// Four 8x8 b16 matrices from shared memory (rows given by lanes 0-7, 8-15, 16-23, 24-31); void*:
// mmq8.cu's int8 tiles load through it too (16 bytes a row either way).
__device__ __forceinline__ void tc_ldsm_x4(u32* r, const void* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(tc_smem_u32(p)));
}

// The same, transposed (attention_tc.cu's V tiles).
__device__ __forceinline__ void tc_ldsm_x4_t(u32* r, const u16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(tc_smem_u32(p)));
}

// c += a (16x16, row) b (16x8, col), fp16 in, fp32 accumulate.
__device__ __forceinline__ void tc_mma(float* c, const u32* a, u32 b0, u32 b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Byte i (sel 0x7540 + i) of qx = q ^ 0x80808080 as the float q: 2^23 + (q + 128) built by a byte
// permute, minus 2^23 + 128 (exact: integers below 2^24). Three full-rate instructions per weight
// with the FMA, where (float)(signed char) is an I2F at a quarter of the rate or less.
__device__ __forceinline__ float tc_qf(u32 qx, u32 sel) {
    return __int_as_float(__byte_perm(qx, 0x4B000000u, sel)) - 8388736.f;
}

// A decoded run of 8 weights (common.cuh) as 8 fp16 values, element 0 in the low half: a * q + b
// in float32 rounded once, as run_floats then f2h2 would give.
__device__ __forceinline__ uint4 tc_run_f16(const Run8& r) {
    const u32 x0 = r.q0 ^ 0x80808080u, x1 = r.q1 ^ 0x80808080u;
    float v[8];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[i] = fmaf(r.a, tc_qf(x0, 0x7540u + i), r.b);
        v[4 + i] = fmaf(r.a, tc_qf(x1, 0x7540u + i), r.b);
    }
    return make_uint4(f2h2(v[0], v[1]), f2h2(v[2], v[3]), f2h2(v[4], v[5]), f2h2(v[6], v[7]));
}

// acc = 0: a warp's MF x NF m16n8 accumulator fragments.
template <int MF, int NF>
__device__ __forceinline__ void tc_zero(float (&acc)[MF][NF][4]) {
#pragma unroll
    for (int a = 0; a < MF; ++a)
#pragma unroll
        for (int b = 0; b < NF; ++b)
#pragma unroll
            for (int c = 0; c < 4; ++c) acc[a][b][c] = 0.f;
}

// fn(a, b, c, n, t) for each value c of a warp's MF x NF m16n8 accumulator fragments
// acc[a][b][c]: n, t its row and column, counted from the warp tile's r0, c0 (the mma's C
// layout: lane = 4 gid + tig holds rows gid, gid + 8 and columns 2 tig, 2 tig + 1 of each
// fragment). The sums are written as the kernels wrote them (r0 + a * 16 + gid + ...): their
// order is the instructions' order.
template <int MF, int NF, class Fn>
__device__ __forceinline__ void tc_each_acc(int lane, int r0, int c0, Fn&& fn) {
    const int gid = lane >> 2, tig = lane & 3;
#pragma unroll
    for (int a = 0; a < MF; ++a)
#pragma unroll
        for (int b = 0; b < NF; ++b)
#pragma unroll
            for (int c = 0; c < 4; ++c)
                fn(a, b, c, r0 + a * 16 + gid + (c >> 1) * 8, c0 + b * 8 + tig * 2 + (c & 1));
}

// Y[t, n] = acc for the warp's tile at rows (outputs n) r0.., columns (tokens t) c0.., those
// inside N x T (mmq.cu, mmq8.cu: Y [T, N] float).
template <int MF, int NF>
__device__ __forceinline__ void tc_store_acc(const float (&acc)[MF][NF][4], int lane, int r0,
                                             int c0, int N, int T, float* Y) {
    tc_each_acc<MF, NF>(lane, r0, c0, [&](int a, int b, int c, int n, int t) {
        if (n < N && t < T) Y[(size_t)t * N + n] = acc[a][b][c];
    });
}
