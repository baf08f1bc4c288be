// moe_grouped.cu: the routed experts of a MoE FFN at prefill as a grouped GEMM, pairs sorted by
// expert (the Vulkan backend's moe_grouped.comp): each expert's weight rows are decoded once per
// tile of up to TILE_PAIRS of its (token, slot) pairs instead of once per pair as moe.cu does (which
// decode, T = 1, still runs through the moe_experts.grouped variant, with the same knobs).
//   moe_sort     one block: counts the P = T * k pairs per expert, lays the experts' runs out in
//                expert order (a counting sort; the order inside a run is whatever the atomics
//                give: each pair's sums are computed the same way in any column of a tile) and
//                cuts each run into tiles of <= TILE_PAIRS pairs: route = [n_tiles, (expert, start,
//                count) x max_tiles, order[P]] (int32), order[i] the pair at sorted position i.
//   moe_gather   xs[i] = x[order[i] / x_div] (x_div = k: a token's row for each of its pairs).
//   moe_grouped_<type>  grid (ceil(N / ROWS_PER_BLOCK), 1, max_tiles): the batched DMMV of dmmv.cu with
//                MAX_COLS = TILE_PAIRS columns (the tile's pairs, contiguous in sorted order) on the
//                tile's expert; tiles past n_tiles return (the grid is sized on the host without
//                reading the routing back). Output rows stay in sorted order, so SwiGLU and the
//                down projection run on sorted rows too.
//   moe_scatter  y[order[i]] = ys[i]: back to pair order for moe_combine.
// Tunables (defines): ROWS_PER_BLOCK, THREADS_PER_ROW, VEC as moe.cu (rows_per_block, threads_per_row, vec), TILE_PAIRS.
#if !defined(ROWS_PER_BLOCK) || !defined(THREADS_PER_ROW) || !defined(VEC) || !defined(TILE_PAIRS)
#error "moe_grouped.cu needs ROWS_PER_BLOCK, THREADS_PER_ROW, VEC and TILE_PAIRS (engine/tuning/variants/cuda_hybrid.py)"
#endif
#define MAX_COLS TILE_PAIRS  // a tile's pairs are the batched DMMV's columns
#define ROWS_PER_THREAD 1
#include "dmmv.cu"

#include "moe_route.cuh"

// blockIdx.y is 0, so dmmv's column tile is the tile's first pair: X and Y start at its row.
#define MOE_GROUPED_KERNEL(name, QT)                                                        \
    extern "C" __global__ void __launch_bounds__(ROWS_PER_BLOCK * THREADS_PER_ROW)                                \
        moe_grouped_##name(const u8* W, int row_bytes, int N, int K, const float* X,        \
                           const int* route, int E, float* Y) {                             \
        const int tile = blockIdx.z;                                                        \
        if (tile >= route[0]) return; /* the whole block: before any barrier */            \
        const int e = min(max(route[1 + 3 * tile], 0), E - 1);                              \
        const int start = route[2 + 3 * tile], count = route[3 + 3 * tile];                 \
        dmmv_t<QT>(W + (size_t)e * N * row_bytes, row_bytes, N, K, X + (size_t)start * K, count, \
                   Y + (size_t)start * N);                                                    \
    }

MOE_GROUPED_KERNEL(q4_0, QT_Q4_0)
MOE_GROUPED_KERNEL(q4_1, QT_Q4_1)
MOE_GROUPED_KERNEL(q5_0, QT_Q5_0)
MOE_GROUPED_KERNEL(q8_0, QT_Q8_0)
MOE_GROUPED_KERNEL(q4_k, QT_Q4_K)
MOE_GROUPED_KERNEL(q6_k, QT_Q6_K)
MOE_GROUPED_KERNEL(f32, QT_F32)
MOE_GROUPED_KERNEL(f16, QT_F16)
MOE_GROUPED_KERNEL(bf16, QT_BF16)
