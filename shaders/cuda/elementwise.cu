// elementwise.cu: the small ops of the schedule.
//
// Variants (engine/tuning/variants/cuda/), one each. Tunables: launch parameters only
// (threads per block, rows per block), so changing them never recompiles:
//   rms_norm.warp      rms_norm: one warp per row of the last dim ([T, C] and per-head [T, H, D])
//   add.elementwise    add_same (residual), add_bias (1-D weight broadcast over rows)
//   swiglu.elementwise swiglu: silu(gate) * up
//   rope.pairs         rope: normal (2i, 2i+1) and neox (i, i + D/2) pairs
//   kv_write.copy      kv_write: k, v [T, Hkv, D] into the cache at pos0
//   argmax.block       argmax: one block per row, first maximum wins
//   (decode graph)     decode_prep: set the device position and feed the sampled token in
//
// Positions: kernels that need pos0 take it as a scalar and as a device pointer; a non-null
// pointer wins. The captured decode graph passes the pointer, so one graph serves every step.
#include "common.cuh"

__device__ __forceinline__ int load_pos(int pos0, const int* pos_ptr) {
    return pos_ptr ? *pos_ptr : pos0;
}

// x [rows, D] -> y; w [D] float32. blockDim = 32 * rows per block.
extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w,
                                    float* __restrict__ y, int rows, int D, float eps) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* xr = x + (size_t)row * D;
    float s = 0.f;
    for (int i = lane; i < D; i += 32) s += xr[i] * xr[i];
    s = warp_sum(s);
    const float scale = rsqrtf(s / (float)D + eps);
    float* yr = y + (size_t)row * D;
    for (int i = lane; i < D; i += 32) yr[i] = xr[i] * scale * w[i];
}

extern "C" __global__ void add_same(const float* a, const float* b, float* y, long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        y[i] = a[i] + b[i];
}

extern "C" __global__ void add_bias(const float* a, const float* b, float* y, long long n, int N) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x)
        y[i] = a[i] + b[i % N];
}

extern "C" __global__ void swiglu(const float* g, const float* u, float* y, long long n) {
    pdl_start();  // a decode row's swiglu may be launched with PDL (matmul_decode.mmvf pdl)
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float v = g[i];
        y[i] = v / (1.f + expf(-v)) * u[i];
    }
}

// x [T, H, D] -> y. One thread per rotated pair. The angle is computed in double: positions
// reach the 10^4s and theta^(-2i/D) spans many decades, and float loses the low bits.
extern "C" __global__ void rope(const float* __restrict__ x, float* __restrict__ y, int T, int H,
                                int D, int pos0, const int* pos_ptr, float theta, int neox) {
    const int half = D / 2;
    const long long n = (long long)T * H * half;
    const int p0 = load_pos(pos0, pos_ptr);
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const int j = (int)(i % half);
        const long long th = i / half;  // t * H + h
        const int t = (int)(th / H);
        const double ang = (double)(p0 + t) * pow((double)theta, -2.0 * j / D);
        double s, c;
        sincos(ang, &s, &c);
        const int ia = neox ? j : 2 * j, ib = neox ? j + half : 2 * j + 1;
        const float* xr = x + th * D;
        float* yr = y + th * D;
        const double a = xr[ia], b = xr[ib];
        yr[ia] = (float)(a * c - b * s);
        yr[ib] = (float)(a * s + b * c);
    }
}

// k, v [T, Hkv * D] -> cache [S, Hkv * D] at rows pos0 .. pos0 + T - 1.
extern "C" __global__ void kv_write(const float* k, const float* v, float* kc, float* vc, int T,
                                    int HD, int pos0, const int* pos_ptr) {
    const long long n = (long long)T * HD;
    const long long base = (long long)load_pos(pos0, pos_ptr) * HD;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        kc[base + i] = k[i];
        vc[base + i] = v[i];
    }
}

// logits [T, V] -> out [T] int32: index of the first maximum (NaN never wins).
extern "C" __global__ void argmax(const float* __restrict__ x, int V, int* out) {
    __shared__ float sv[32];
    __shared__ int si[32];
    const float* r = x + (size_t)blockIdx.x * V;
    float best = __int_as_float(0xff800000);  // -inf
    int bi = 0x7fffffff;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        const float v = r[i];
        if (v > best) {  // strided walk: a later equal value never replaces an earlier one
            best = v;
            bi = i;
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float ov = __shfl_xor_sync(0xffffffffu, best, o);
        const int oi = __shfl_xor_sync(0xffffffffu, bi, o);
        if (ov > best || (ov == best && oi < bi)) {
            best = ov;
            bi = oi;
        }
    }
    const int w = threadIdx.x / 32, nw = blockDim.x / 32;
    if ((threadIdx.x & 31) == 0) {
        sv[w] = best;
        si[w] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < nw; ++i)
            if (sv[i] > best || (sv[i] == best && si[i] < bi)) {
                best = sv[i];
                bi = si[i];
            }
        out[blockIdx.x] = bi == 0x7fffffff ? 0 : bi;
    }
}

// Before a graph replay: the step's position and its input token (the previous argmax).
extern "C" __global__ void decode_prep(int* pos_dev, int pos, int* tok_in, const int* tok) {
    if (threadIdx.x == 0) {
        *pos_dev = pos;
        *tok_in = *tok;
    }
}
