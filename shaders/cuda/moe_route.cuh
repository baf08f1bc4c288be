// moe_route.cuh: the routing side of the grouped expert GEMMs (moe_grouped.cu, moe_tc.cu):
// moe_sort (a counting sort of the (token, slot) pairs by expert, cut into tiles of <= TILE_PAIRS
// pairs), moe_gather and moe_scatter, as documented in moe_grouped.cu. Needs TILE_PAIRS.
#pragma once
#include "common.cuh"

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
            for (int o = 0; o < c; o += TILE_PAIRS) {
                if (nt < max_tiles) {  // max_tiles >= ceil(P / TILE_PAIRS) + min(E, P): never short
                    route[1 + 3 * nt] = e;
                    route[2 + 3 * nt] = start + o;
                    route[3 + 3 * nt] = min(TILE_PAIRS, c - o);
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

