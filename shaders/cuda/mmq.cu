// mmq.cu: fused-dequant GEMM on fp16 tensor cores (mma.sync m16n8k16, sm_80+).
//
//   Y[t, n] = sum_k X[t, k] * W[n, k]   X as fp16 [T, K], W [N, K] GGML blocks, Y [T, N] f32
//
// Variants (engine/tuning/variants/cuda/): matmul_prefill.mmq. The quantized weight tile is
// read from device memory once per block, decoded in registers (common.cuh) and written to
// shared memory as fp16; it never exists in device memory as fp16 (the staged variant's 8x
// weight traffic, seeds/fused-dequant-gemm.txt). A block computes a TILE_M x TILE_N tile (weight rows
// x tokens) over 64-wide k windows; WARPS_M x WARPS_N warps each own a (TILE_M/WARPS_M) x (TILE_N/WARPS_N) sub-tile and
// issue ldmatrix + mma from padded shared rows (LDS = 72 halves: ldmatrix rows land on
// distinct banks). Accumulation is float32.
// Tunables (defines): TILE_M (64, 128), TILE_N (32, 64, 128), WARPS_M, WARPS_N; TILE_M/WARPS_M and TILE_N/WARPS_N multiples of 16.
// Kernels: mmq_<type> for q4_0 q4_1 q5_0 q8_0 q4_k q6_k. Grid (ceil(N / TILE_M), ceil(T / TILE_N)),
// block WARPS_M * WARPS_N * 32. K must be a multiple of 32 (every block type's K is).
#include "tc.cuh"

#ifndef TILE_M
#define TILE_M 128
#endif
#ifndef TILE_N
#define TILE_N 128
#endif
#ifndef WARPS_M
#define WARPS_M 2
#endif
#ifndef WARPS_N
#define WARPS_N 4
#endif
#define BKW 64
#define LDS (BKW + 8)
#define TM (TILE_M / WARPS_M)
#define TN (TILE_N / WARPS_N)
#define MT (TM / 16)
#define NT (TN / 8)
#define NTHREADS (WARPS_M * WARPS_N * 32)

__device__ __forceinline__ uint4 run_f16(const Run8& r) {
    float v[8];
    run_floats(r, v);
    return make_uint4(f2h2(v[0], v[1]), f2h2(v[2], v[3]), f2h2(v[4], v[5]), f2h2(v[6], v[7]));
}

template <int QT>
__device__ __forceinline__ void mmq(const u8* __restrict__ W, int row_bytes, int N, int K,
                                    const u16* __restrict__ Xh, int T, float* __restrict__ Y) {
    __shared__ __align__(16) u16 As[TILE_M * LDS];
    __shared__ __align__(16) u16 Bs[TILE_N * LDS];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
    const int wm = warp % WARPS_M, wn = warp / WARPS_M;
    const int m0 = blockIdx.x * TILE_M, n0 = blockIdx.y * TILE_N;
    const int NG = K / 16;
    float acc[MT][NT][4];
    tc_zero(acc);

    for (int k0 = 0; k0 < K; k0 += BKW) {
        // Weight tile: TILE_M rows x 4 groups (a group's 16 weights sit inside this 64-window).
        for (int i = tid; i < TILE_M * 4; i += NTHREADS) {
            const int r = i >> 2, g = k0 / 16 + (i & 3);
            const int b = g / QTraits<QT>::GROUPS, gi = g % QTraits<QT>::GROUPS;
            int o0, o1;
            run_offsets<QT>(gi, o0, o1);
            const int ka = b * QTraits<QT>::BK + o0 - k0, kb = b * QTraits<QT>::BK + o1 - k0;
            uint4 va = make_uint4(0, 0, 0, 0), vb = va;
            if (m0 + r < N && g < NG) {
                Run8 r0, r1;
                decode_group<QT>(W + (size_t)(m0 + r) * row_bytes + (size_t)b * QTraits<QT>::BYTES,
                                 gi, r0, r1);
                va = run_f16(r0);
                vb = run_f16(r1);
            }
            *(uint4*)(As + r * LDS + ka) = va;
            *(uint4*)(As + r * LDS + kb) = vb;
        }
        // Activation tile: TILE_N tokens x 64 halves, 16-byte chunks.
        for (int i = tid; i < TILE_N * 8; i += NTHREADS) {
            const int r = i >> 3, c = i & 7, t = n0 + r, k = k0 + 8 * c;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (t < T && k < K) v = __ldg((const uint4*)(Xh + (size_t)t * K + k));
            *(uint4*)(Bs + r * LDS + 8 * c) = v;
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BKW; kk += 16) {
            u32 af[MT][4], bf[NT][2];
#pragma unroll
            for (int a = 0; a < MT; ++a)
                tc_ldsm_x4(af[a], As + (wm * TM + a * 16 + (lane & 15)) * LDS + kk + (lane >> 4) * 8);
#pragma unroll
            for (int b = 0; b < NT; b += 2) {
                u32 r4[4];
                tc_ldsm_x4(r4, Bs + (wn * TN + b * 8 + (lane & 7) + ((lane >> 4) << 3)) * LDS + kk +
                                ((lane >> 3) & 1) * 8);
                bf[b][0] = r4[0];
                bf[b][1] = r4[1];
                bf[b + 1][0] = r4[2];
                bf[b + 1][1] = r4[3];
            }
#pragma unroll
            for (int a = 0; a < MT; ++a)
#pragma unroll
                for (int b = 0; b < NT; ++b) tc_mma(acc[a][b], af[a], bf[b][0], bf[b][1]);
        }
        __syncthreads();
    }
    tc_store_acc(acc, lane, m0 + wm * TM, n0 + wn * TN, N, T, Y);
}

#define MMQ_KERNEL(name, QT)                                                                   \
    extern "C" __global__ void __launch_bounds__(NTHREADS)                                     \
        mmq_##name(const u8* W, int row_bytes, int N, int K, const u16* Xh, int T, float* Y) {  \
        mmq<QT>(W, row_bytes, N, K, Xh, T, Y);                                                 \
    }

MMQ_KERNEL(q4_0, QT_Q4_0)
MMQ_KERNEL(q4_1, QT_Q4_1)
MMQ_KERNEL(q5_0, QT_Q5_0)
MMQ_KERNEL(q8_0, QT_Q8_0)
MMQ_KERNEL(q4_k, QT_Q4_K)
MMQ_KERNEL(q6_k, QT_Q6_K)
