// moe_q8.cu: the routed experts' matrix-vector products on Q8_1 activations (integer dot
// products), reading only the chosen experts' rows.
//
//   moe_q8_<t>     Y[p, n] = sum_k W[ids[p] * N + n, k] * X[p / x_div, k]
//   moe_q8_gu_<t>  Y[p, n] = silu(Wg[e, n] . X[t]) * (Wu[e, n] . X[t]), e = ids[p], t = p / x_div:
//                  gate, up and SwiGLU of a pair in one pass (gate and up of one type)
//   W [E * N, row_bytes] GGML blocks (a stacked [E, N, K] expert weight), ids [P] int32 on the
//   device (router_topk's, token-major), X as Q8_1 (q8.cu): xq int8 [P / x_div, K], xds float2
//   [P / x_div, K / 32]; Y [P, N] float32. x_div = k_used for gate / up, 1 for down.
//
// Variant: moe_experts.mmvq (engine/tuning/variants/cuda_hybrid.py), numeric class
// int8_activations. mmvw.cu's work split (vecdot.cuh's slots): a group of THREADS_PER_ROW lanes inside one
// warp walks a row, the partial sums meet by shuffles (no shared memory, no block barrier), and
// the expert is picked on the device, so a captured decode graph serves every routing.
// Tunables (defines): THREADS_PER_ROW lanes per row (8, 16, 32), WARPS warps per block; rows per block
// WARPS * 32 / THREADS_PER_ROW. Grid (ceil(N / rows), 1, pairs): pair p0 + blockIdx.z. Types: Q4_0 Q4_1 Q5_0
// Q8_0 Q4_K Q6_K (K % 256 == 0 for the K types; the backend falls back to moe.cu otherwise).
#include "vecdot.cuh"

#if !defined(THREADS_PER_ROW) || !defined(WARPS)
#error "moe_q8.cu needs THREADS_PER_ROW and WARPS (engine/tuning/variants/cuda_hybrid.py)"
#endif
#if THREADS_PER_ROW != 8 && THREADS_PER_ROW != 16 && THREADS_PER_ROW != 32
#error "THREADS_PER_ROW must be 8, 16 or 32 (a row's lanes sit inside one warp)"
#endif

#define MOE_Q8_GROUPS (WARPS * 32 / THREADS_PER_ROW)

template <int QT, bool GU>
__device__ __forceinline__ void moe_q8_rows(const u8* __restrict__ Wa, const u8* __restrict__ Wb,
                                            int row_bytes, int N, int K,
                                            const s8* __restrict__ xq,
                                            const float2* __restrict__ xds, int x_div,
                                            const int* __restrict__ ids, int E, int p0,
                                            float* __restrict__ Y) {
    pdl_start();  // (matmul_decode.pdl: chained into the decode step's dependent launches)
    const int p = p0 + blockIdx.z;
    const int g = threadIdx.x / THREADS_PER_ROW, lane = threadIdx.x % THREADS_PER_ROW;
    const int n = blockIdx.x * MOE_Q8_GROUPS + g;
    if (n >= N) return;  // whole groups leave together: the shuffles below stay full
    const int e = min(max(ids[p], 0), E - 1);  // a corrupt id must not fault
    const size_t t = (size_t)(p / x_div);
    xq += t * K;
    xds += t * (K / 32);
    const size_t off = ((size_t)e * N + n) * row_bytes;
    const u8* ra = Wa + off;
    const u8* rb = Wb + off;
    float a = 0.f, b = 0.f;
    const int ns = VD<QT>::slots(K);
    for (int s = lane; s < ns; s += THREADS_PER_ROW) {
        const XSlot x = VD<QT>::load(s, xq, xds);
        a += VD<QT>::dot(ra, s, x);
        if (GU) b += VD<QT>::dot(rb, s, x);
    }
    const unsigned mask =
        THREADS_PER_ROW == 32 ? 0xffffffffu : ((1u << THREADS_PER_ROW) - 1u) << ((threadIdx.x & 31) & ~(THREADS_PER_ROW - 1));
#pragma unroll
    for (int o = THREADS_PER_ROW / 2; o > 0; o >>= 1) {
        a += __shfl_xor_sync(mask, a, o);
        if (GU) b += __shfl_xor_sync(mask, b, o);
    }
    if (lane == 0) Y[(size_t)p * N + n] = GU ? a / (1.f + expf(-a)) * b : a;  // as swiglu
}

#define MOE_Q8_KERNELS(name, QT)                                                              \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                     \
        moe_q8_##name(const u8* W, int row_bytes, int N, int K, const s8* xq,                 \
                      const float2* xds, int x_div, const int* ids, int E, int p0, float* Y) { \
        moe_q8_rows<QT, false>(W, W, row_bytes, N, K, xq, xds, x_div, ids, E, p0, Y);         \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                     \
        moe_q8_gu_##name(const u8* Wg, const u8* Wu, int row_bytes, int N, int K,             \
                         const s8* xq, const float2* xds, int x_div, const int* ids, int E,   \
                         int p0, float* Y) {                                                  \
        moe_q8_rows<QT, true>(Wg, Wu, row_bytes, N, K, xq, xds, x_div, ids, E, p0, Y);        \
    }

MOE_Q8_KERNELS(q4_0, QT_Q4_0)
MOE_Q8_KERNELS(q4_1, QT_Q4_1)
MOE_Q8_KERNELS(q5_0, QT_Q5_0)
MOE_Q8_KERNELS(q8_0, QT_Q8_0)
MOE_Q8_KERNELS(q4_k, QT_Q4_K)
MOE_Q8_KERNELS(q6_k, QT_Q6_K)
