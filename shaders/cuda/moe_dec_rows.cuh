// moe_dec_rows.cuh: the thread-row machinery of moe_dec.cu's kernels (included by it alone,
// after its knob defines): the run-time weight-type switch, a thread-row's dot products of
// quantized or float rows with x (dot_rows, f32_row_x4), its reduction (row_sum) and the row a
// thread works on (row_of_thread). Needs ROWS_PER_BLOCK, THREADS_PER_ROW, VEC (the
// moe_experts.dmmv knobs), MAXR and kWideUp from moe_dec.cu, and common.cuh / qwide.cuh.
#pragma once

// CALL (a macro of a QT_* constant) for the weight type qt given at run time: the one switch,
// in one case order, behind every *_rt dispatcher (here and in moe_dec.cu).
#define QT_SWITCH(qt, CALL)               \
    switch (qt) {                          \
        case QT_Q4_0: CALL(QT_Q4_0); break; \
        case QT_Q4_1: CALL(QT_Q4_1); break; \
        case QT_Q5_0: CALL(QT_Q5_0); break; \
        case QT_Q8_0: CALL(QT_Q8_0); break; \
        case QT_Q4_K: CALL(QT_Q4_K); break; \
        case QT_Q6_K: CALL(QT_Q6_K); break; \
        case QT_F16: CALL(QT_F16); break;   \
        case QT_BF16: CALL(QT_BF16); break; \
        default: CALL(QT_F32); break;       \
    }

// fn(g) for this lane's 16-weight groups g of a K-wide row: V consecutive groups a step, the
// thread-row's lanes THREADS_PER_ROW * V groups apart (dmmv.cu's walk; dot_rows. dot_pair keeps
// its own loop: through this helper its SASS allocates other registers).
template <int V, class Fn>
__device__ __forceinline__ void lane_groups(int K, int lane, Fn&& fn) {
    const int NG = K / 16;
    for (int g0 = lane * V; g0 < NG; g0 += THREADS_PER_ROW * V) {
#pragma unroll
        for (int jv = 0; jv < V; ++jv) {
            const int g = g0 + jv;
            if (g < NG) fn(g);
        }
    }
}

// s[i] += this thread's share (lane of THREADS_PER_ROW) of rows[i] . xs[i] over K, i < n <= MAXR, every row
// of type QT. The rows' loads of a step are independent, so they are in flight together (the
// k experts' down rows of one output, gate and up of one expert). For n = 1 this is dmmv.cu's
// loop for one row and column: the same groups in the same order.
template <int QT, int V>
__device__ __forceinline__ void dot_rows(const u8* const* rows, const float* const* xs, int n,
                                         int K, int lane, float* s) {
    if constexpr (QT == QT_F32 || QT == QT_F16 || QT == QT_BF16) {
        for (int kk = lane; kk < K; kk += THREADS_PER_ROW) {
#pragma unroll
            for (int i = 0; i < MAXR; ++i)
                if (i < n) s[i] += dense_get<QT>(rows[i], kk) * __ldg(xs[i] + kk);
        }
    } else {
        lane_groups<V>(K, lane, [&](int g) {
#pragma unroll
            for (int i = 0; i < MAXR; ++i) {
                if (i < n) {
                    Run8 a, b;
                    int k0, k1;
                    dec_row_group<QT, kWideUp>(rows[i], g, a, b, k0, k1);
                    const float4* x0 = (const float4*)(xs[i] + k0);
                    const float4* x1 = (const float4*)(xs[i] + k1);
                    s[i] += dec_run_dot(a, __ldg(x0), __ldg(x0 + 1)) +
                            dec_run_dot(b, __ldg(x1), __ldg(x1 + 1));
                }
            }
        });
    }
}

// dot_rows for a weight type given at run time (uniform per call site but the route's), V
// consecutive groups per lane per step.
template <int V = VEC>
__device__ __forceinline__ void dot_rows_rt(int qt, const u8* const* rows,
                                            const float* const* xs, int n, int K, int lane,
                                            float* s) {
#define DR(Q) dot_rows<Q, V>(rows, xs, n, K, lane, s)
    QT_SWITCH(qt, DR)
#undef DR
}

// moe_experts.route_vec: this thread's share of an F32 row . x with float4 loads, eight of the
// row's and eight of x's in flight per lane before the sums (a router row of 2048 floats is
// two such batches on 32 lanes, where the scalar loop waits on memory once per few elements).
// Row and x 16-byte aligned, K % 4 == 0 (the caller checks).
__device__ __forceinline__ float f32_row_x4(const float* __restrict__ row,
                                            const float* __restrict__ x, int K, int lane) {
    const float4* w4 = (const float4*)row;
    const float4* x4 = (const float4*)x;
    const int K4 = K >> 2;
    float s = 0.f;
    for (int c0 = lane; c0 < K4; c0 += 8 * THREADS_PER_ROW) {
        float4 wv[8], xv[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
            const int c = c0 + u * THREADS_PER_ROW;
            const bool in = c < K4;
            wv[u] = in ? __ldg(w4 + c) : make_float4(0.f, 0.f, 0.f, 0.f);
            xv[u] = in ? __ldg(x4 + c) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int u = 0; u < 8; ++u)
            s += wv[u].x * xv[u].x + wv[u].y * xv[u].y + wv[u].z * xv[u].z + wv[u].w * xv[u].w;
    }
    return s;
}

// Sum v over the THREADS_PER_ROW threads of a thread-row; the total is valid in the row's lane 0. Every
// thread of the block calls it (THREADS_PER_ROW > 32 meets at barriers).
__device__ __forceinline__ float row_sum(float v, float* red /* smem [ROWS_PER_BLOCK * THREADS_PER_ROW / 32] */) {
#pragma unroll
    for (int o = (THREADS_PER_ROW < 32 ? THREADS_PER_ROW : 32) / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (THREADS_PER_ROW > 32) {
        const int lane = threadIdx.x % THREADS_PER_ROW, r = threadIdx.x / THREADS_PER_ROW, w = lane / 32;
        if ((lane & 31) == 0) red[r * (THREADS_PER_ROW / 32) + w] = v;
        __syncthreads();
        if (lane == 0) {
            v = 0.f;
            for (int i = 0; i < THREADS_PER_ROW / 32; ++i) v += red[r * (THREADS_PER_ROW / 32) + i];
        }
        __syncthreads();  // red is reused by the next call
    }
    return v;
}

#define RED_N (THREADS_PER_ROW > 32 ? ROWS_PER_BLOCK * (THREADS_PER_ROW / 32) : 1)
// Threads per block: ROWS_PER_BLOCK * THREADS_PER_ROW, at least a warp (the shuffles name all 32 lanes; the route's
// top-k is a warp's work). Threads past ROWS_PER_BLOCK thread-rows own no row.
#define NT (ROWS_PER_BLOCK * THREADS_PER_ROW < 32 ? 32 : ROWS_PER_BLOCK * THREADS_PER_ROW)
#define NO_ROW 0x3fffffff
__device__ __forceinline__ int row_of_thread() {
    return threadIdx.x / THREADS_PER_ROW < ROWS_PER_BLOCK ? blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / THREADS_PER_ROW : NO_ROW;
}
