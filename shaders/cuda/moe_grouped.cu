// moe_grouped.cu: the routed experts of a MoE FFN at prefill as a grouped GEMM, pairs sorted by
// expert (the Vulkan backend's moe_grouped.comp): each expert's weight rows are decoded once per
// tile of up to TILE_P of its (token, slot) pairs instead of once per pair as moe.cu does (which
// decode, T = 1, still runs through the moe_experts.grouped variant, with the same knobs).
//   moe_sort     one block: counts the P = T * k pairs per expert, lays the experts' runs out in
//                expert order (a counting sort; the order inside a run is whatever the atomics
//                give: each pair's sums are computed the same way in any column of a tile) and
//                cuts each run into tiles of <= TILE_P pairs: route = [n_tiles, (expert, start,
//                count) x max_tiles, order[P]] (int32), order[i] the pair at sorted position i.
//   moe_gather   xs[i] = x[order[i] / x_div] (x_div = k: a token's row for each of its pairs).
//   moe_grouped_<type>  grid (ceil(N / ROWS), 1, max_tiles): the batched DMMV of dmmv.cu with
//                COLS = TILE_P columns (the tile's pairs, contiguous in sorted order) on the
//                tile's expert; tiles past n_tiles return (the grid is sized on the host without
//                reading the routing back). Output rows stay in sorted order, so SwiGLU and the
//                down projection run on sorted rows too.
//   moe_scatter  y[order[i]] = ys[i]: back to pair order for moe_combine.
// Tunables (defines): ROWS, TPR, VEC as moe.cu (rows_per_block, threads_per_row, vec), TILE_P.
#if !defined(ROWS) || !defined(TPR) || !defined(VEC) || !defined(TILE_P)
#error "moe_grouped.cu needs ROWS, TPR, VEC and TILE_P (engine/tuning/kernels/cuda_hybrid.py)"
#endif
#define COLS TILE_P  // a tile's pairs are the batched DMMV's columns
#define RPT 1
#include "dmmv.cu"

#define MOE_SORT_THREADS 1024
#define MOE_MAX_E 1024  // router_topk's limit

__device__ __forceinline__ int moe_expert(const int* ids, int p, int E) {
    return min(max(ids[p], 0), E - 1);  // a corrupt id must not fault
}

extern "C" __global__ void __launch_bounds__(MOE_SORT_THREADS)
    moe_sort(const int* __restrict__ ids, int P, int E, int max_tiles, int* __restrict__ route) {
    __shared__ int cnt[MOE_MAX_E];
    __shared__ int cur[MOE_MAX_E];
    const int tid = threadIdx.x;
    for (int e = tid; e < E; e += blockDim.x) cnt[e] = 0;
    __syncthreads();
    for (int p = tid; p < P; p += blockDim.x) atomicAdd(&cnt[moe_expert(ids, p, E)], 1);
    __syncthreads();
    if (tid == 0) {
        int start = 0, nt = 0;
        for (int e = 0; e < E; ++e) {
            const int c = cnt[e];
            cur[e] = start;
            for (int o = 0; o < c; o += TILE_P) {
                if (nt < max_tiles) {  // max_tiles >= ceil(P / TILE_P) + min(E, P): never short
                    route[1 + 3 * nt] = e;
                    route[2 + 3 * nt] = start + o;
                    route[3 + 3 * nt] = min(TILE_P, c - o);
                }
                ++nt;
            }
            start += c;
        }
        route[0] = min(nt, max_tiles);
    }
    __syncthreads();
    int* order = route + 1 + 3 * max_tiles;
    for (int p = tid; p < P; p += blockDim.x) order[atomicAdd(&cur[moe_expert(ids, p, E)], 1)] = p;
}

extern "C" __global__ void moe_gather(const float* __restrict__ X, const int* __restrict__ route,
                                      int max_tiles, int x_div, int P, int K,
                                      float* __restrict__ Xs) {
    const int* order = route + 1 + 3 * max_tiles;
    const long long n = (long long)P * K;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < n;
         idx += (long long)gridDim.x * blockDim.x) {
        const int i = (int)(idx / K), k = (int)(idx % K);
        Xs[idx] = X[(size_t)(order[i] / x_div) * K + k];
    }
}

extern "C" __global__ void moe_scatter(const float* __restrict__ Ys,
                                       const int* __restrict__ route, int max_tiles, int P, int N,
                                       float* __restrict__ Y) {
    const int* order = route + 1 + 3 * max_tiles;
    const long long n = (long long)P * N;
    for (long long idx = blockIdx.x * (long long)blockDim.x + threadIdx.x; idx < n;
         idx += (long long)gridDim.x * blockDim.x) {
        const int i = (int)(idx / N), c = (int)(idx % N);
        Y[(size_t)order[i] * N + c] = Ys[idx];
    }
}

// blockIdx.y is 0, so dmmv's column tile is the tile's first pair: X and Y start at its row.
#define MOE_GROUPED_KERNEL(name, QT, impl)                                                  \
    extern "C" __global__ void __launch_bounds__(ROWS * TPR)                                \
        moe_grouped_##name(const u8* W, int row_bytes, int N, int K, const float* X,        \
                           const int* route, int E, float* Y) {                             \
        const int tile = blockIdx.z;                                                        \
        if (tile >= route[0]) return; /* the whole block: before any barrier */            \
        const int e = min(max(route[1 + 3 * tile], 0), E - 1);                              \
        const int start = route[2 + 3 * tile], count = route[3 + 3 * tile];                 \
        impl<QT>(W + (size_t)e * N * row_bytes, row_bytes, N, K, X + (size_t)start * K, count, \
                 Y + (size_t)start * N);                                                    \
    }

MOE_GROUPED_KERNEL(q4_0, QT_Q4_0, dmmv_q)
MOE_GROUPED_KERNEL(q4_1, QT_Q4_1, dmmv_q)
MOE_GROUPED_KERNEL(q5_0, QT_Q5_0, dmmv_q)
MOE_GROUPED_KERNEL(q8_0, QT_Q8_0, dmmv_q)
MOE_GROUPED_KERNEL(q4_k, QT_Q4_K, dmmv_q)
MOE_GROUPED_KERNEL(q6_k, QT_Q6_K, dmmv_q)
MOE_GROUPED_KERNEL(f32, QT_F32, dmmv_d)
MOE_GROUPED_KERNEL(f16, QT_F16, dmmv_d)
MOE_GROUPED_KERNEL(bf16, QT_BF16, dmmv_d)
