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
