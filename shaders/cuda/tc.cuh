// tc.cuh: fp16 tensor-core helpers (mma.sync m16n8k16, ldmatrix; sm_80+) for the kernels that
// stage tiles in shared memory (moe_tc.cu; attention_tc.cu has its own copy of the same three).
#pragma once
#include "common.cuh"

__device__ __forceinline__ u32 tc_smem_u32(const void* p) {
    u32 a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(a) : "l"(p));
    return a;
}

// Four 8x8 fp16 matrices from shared memory (rows given by lanes 0-7, 8-15, 16-23, 24-31).
__device__ __forceinline__ void tc_ldsm_x4(u32* r, const u16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
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

// A decoded run of 8 weights (common.cuh) as 8 fp16 values, element 0 in the low half.
__device__ __forceinline__ uint4 tc_run_f16(const Run8& r) {
    float v[8];
    run_floats(r, v);
    return make_uint4(f2h2(v[0], v[1]), f2h2(v[2], v[3]), f2h2(v[4], v[5]), f2h2(v[6], v[7]));
}
