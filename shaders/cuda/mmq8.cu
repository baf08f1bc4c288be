// mmq8.cu: fused-dequant GEMM on Q8_1 activations with int8 tensor cores (mma.sync
// m16n8k16 s8 x s8 -> s32, sm_80+).
//
//   Y[t, n] = sum_k X[t, k] * W[n, k]   X as Q8_1 (q8.cu: xq int8 [T, K], xds float2 [T, K/32]),
//   W [N, K] GGML blocks, Y [T, N] float32
//
// Variants (engine/tuning/variants/cuda/): matmul_prefill.mmq8. Like mmq.cu (same tiles and
// warp layout) but the weight tile is decoded to int8 quants (common.cuh's decoder) with a
// float scale per 16 values of a row and an offset per 32, and the activation tile is the
// Q8_1 int8 quants: half the shared-memory bytes per k of the fp16 kernel and no conversion
// of the activations. Each 16-wide k step is one integer mma into fresh s32 accumulators,
// scaled into float32: acc += a(row, k16) * d(token, k32) * dot; once per 32 values, the
// offset term acc += b(row, k32) * d * sum q(token, k32) (Q4_K mins, Q4_1 m).
// Tunables (defines): TILE_M (64, 128), TILE_N (32, 64, 128), WARPS_M, WARPS_N; TILE_M/WARPS_M and TILE_N/WARPS_N multiples of 16.
// Kernels: mmq8_<type> for q4_0 q4_1 q5_0 q8_0 q4_k q6_k. Grid (ceil(N / TILE_M), ceil(T / TILE_N)),
// block WARPS_M * WARPS_N * 32. K must be a multiple of 32.
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
#define LDB (BKW + 16)  // bytes per shared row: 16-byte pad, ldmatrix rows on distinct banks
#define TM (TILE_M / WARPS_M)
#define TN (TILE_N / WARPS_N)
#define MT (TM / 16)
#define NT (TN / 8)
#define NTHREADS (WARPS_M * WARPS_N * 32)

// c = a (16x16 s8, row) x b (16x8 s8, col), fresh accumulators.
__device__ __forceinline__ void mma_s8(int* c, u32 a0, u32 a1, u32 b0) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, "
        "{%7, %7, %7, %7};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a0), "r"(a1), "r"(b0), "r"(0));
}

template <int QT>
__device__ __forceinline__ void mmq8(const u8* __restrict__ W, int row_bytes, int N, int K,
                                     const signed char* __restrict__ xq,
                                     const float2* __restrict__ xds, int T,
                                     float* __restrict__ Y) {
    __shared__ __align__(16) u8 As[TILE_M * LDB];
    __shared__ __align__(16) u8 Bs[TILE_N * LDB];
    __shared__ float Asc[TILE_M][4];   // weight scale per 16 values of the window
    __shared__ float Aof[TILE_M][2];   // weight offset per 32
    __shared__ float2 Bd[TILE_N][2];   // activation (d, d * sum q) per 32
    const int tid = threadIdx.x, warp = tid / 32, lane = tid & 31;
    const int wm = warp % WARPS_M, wn = warp / WARPS_M;
    const int m0 = blockIdx.x * TILE_M, n0 = blockIdx.y * TILE_N;
    const int gid = lane >> 2, tig = lane & 3;
    float acc[MT][NT][4];
    tc_zero(acc);

    for (int k0 = 0; k0 < K; k0 += BKW) {
        const bool full = k0 + BKW <= K;  // K % 64 == 32: the last window has one half
        // Weight tile: TILE_M rows x 4 groups (a group's 16 weights sit inside this window).
        for (int i = tid; i < TILE_M * 4; i += NTHREADS) {
            const int r = i >> 2, g = k0 / 16 + (i & 3);
            const int b = g / QTraits<QT>::GROUPS, gi = g % QTraits<QT>::GROUPS;
            int o0, o1;
            run_offsets<QT>(gi, o0, o1);
            int ka = b * QTraits<QT>::BK + o0 - k0, kb = b * QTraits<QT>::BK + o1 - k0;
            Run8 r0, r1;
            r0.q0 = r0.q1 = r1.q0 = r1.q1 = 0;
            r0.a = r1.a = r0.b = r1.b = 0.f;
            if (m0 + r < N && (full || (i & 3) < 2))
                decode_group<QT>(W + (size_t)(m0 + r) * row_bytes + (size_t)b * QTraits<QT>::BYTES,
                                 gi, r0, r1);
            if (!full && (i & 3) >= 2) {  // past K: groups 2, 3 sit at 32..63 of the window
                ka = 32 + 16 * ((i & 3) - 2);
                kb = ka + 8;
            }
            *(uint2*)(As + r * LDB + ka) = make_uint2(r0.q0, r0.q1);
            *(uint2*)(As + r * LDB + kb) = make_uint2(r1.q0, r1.q1);
            Asc[r][ka >> 4] = r0.a;  // runs in one 16-wide piece share a scale, in one 32
            Asc[r][kb >> 4] = r1.a;  // the offset (every block type's layout)
            Aof[r][ka >> 5] = r0.b;
            Aof[r][kb >> 5] = r1.b;
        }
        // Activation tile: TILE_N tokens x 64 int8, 16-byte chunks, and the blocks' (d, d*sum).
        for (int i = tid; i < TILE_N * 4; i += NTHREADS) {
            const int r = i >> 2, c = i & 3, t = n0 + r, k = k0 + 16 * c;
            uint4 v = make_uint4(0, 0, 0, 0);
            if (t < T && k < K) v = __ldg((const uint4*)(xq + (size_t)t * K + k));
            *(uint4*)(Bs + r * LDB + 16 * c) = v;
            if ((c & 1) == 0) {
                float2 d = make_float2(0.f, 0.f);
                if (t < T && k < K) d = __ldg(xds + ((size_t)t * K + k) / 32);
                Bd[r][c >> 1] = d;
            }
        }
        __syncthreads();
#pragma unroll
        for (int kk = 0; kk < BKW; kk += 32) {
            u32 af[MT][4], bf[NT][2];  // [0], [1]: k 0..15 of the step; [2], [3]: 16..31
#pragma unroll
            for (int a = 0; a < MT; ++a)
                tc_ldsm_x4(af[a], As + (wm * TM + a * 16 + (lane & 15)) * LDB + kk + (lane >> 4) * 16);
#pragma unroll
            for (int b = 0; b < NT; b += 2) {
                u32 r4[4];  // matrices: (tok 0-7, k0-15) (tok 0-7, k16-31) (8-15, k0-15) (8-15, 16-31)
                tc_ldsm_x4(r4, Bs + (wn * TN + b * 8 + (lane & 7) + ((lane >> 4) << 3)) * LDB + kk +
                                ((lane >> 3) & 1) * 16);
                bf[b][0] = r4[0];
                bf[b][1] = r4[1];
                bf[b + 1][0] = r4[2];
                bf[b + 1][1] = r4[3];
            }
            const int h = kk >> 5;
#pragma unroll
            for (int a = 0; a < MT; ++a) {
                const int ra = wm * TM + a * 16 + gid;
                const float s00 = Asc[ra][2 * h], s01 = Asc[ra][2 * h + 1];
                const float s10 = Asc[ra + 8][2 * h], s11 = Asc[ra + 8][2 * h + 1];
                const float o0 = Aof[ra][h], o1 = Aof[ra + 8][h];
#pragma unroll
                for (int b = 0; b < NT; ++b) {
                    const int tb = wn * TN + b * 8 + tig * 2;
                    const float2 d0 = Bd[tb][h], d1 = Bd[tb + 1][h];
                    int lo[4], hi[4];
                    mma_s8(lo, af[a][0], af[a][1], bf[b][0]);
                    mma_s8(hi, af[a][2], af[a][3], bf[b][1]);
                    acc[a][b][0] += d0.x * (s00 * (float)lo[0] + s01 * (float)hi[0]) + o0 * d0.y;
                    acc[a][b][1] += d1.x * (s00 * (float)lo[1] + s01 * (float)hi[1]) + o0 * d1.y;
                    acc[a][b][2] += d0.x * (s10 * (float)lo[2] + s11 * (float)hi[2]) + o1 * d0.y;
                    acc[a][b][3] += d1.x * (s10 * (float)lo[3] + s11 * (float)hi[3]) + o1 * d1.y;
                }
            }
        }
        __syncthreads();
    }
    tc_store_acc(acc, lane, m0 + wm * TM, n0 + wn * TN, N, T, Y);
}

#define MMQ8_KERNEL(name, QT)                                                                  \
    extern "C" __global__ void __launch_bounds__(NTHREADS)                                     \
        mmq8_##name(const u8* W, int row_bytes, int N, int K, const signed char* xq,          \
                    const float2* xds, int T, float* Y) {                                      \
        mmq8<QT>(W, row_bytes, N, K, xq, xds, T, Y);                                           \
    }

MMQ8_KERNEL(q4_0, QT_Q4_0)
MMQ8_KERNEL(q4_1, QT_Q4_1)
MMQ8_KERNEL(q5_0, QT_Q5_0)
MMQ8_KERNEL(q8_0, QT_Q8_0)
MMQ8_KERNEL(q4_k, QT_Q4_K)
MMQ8_KERNEL(q6_k, QT_Q6_K)
