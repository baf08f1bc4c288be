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
//   (verifier)         row_stats_f32 / _f16: op-level replay's per-row comparison
//
// Positions: kernels that need pos0 take it as a scalar and as a device pointer; a non-null
// pointer wins. The captured decode graph passes the pointer, so one graph serves every step.
#include "norm.cuh"

__device__ __forceinline__ int load_pos(int pos0, const int* pos_ptr) {
    return pos_ptr ? *pos_ptr : pos0;
}

// x [rows, D] -> y; w [D] float32. blockDim = 32 * rows per block.
extern "C" __global__ void rms_norm(const float* __restrict__ x, const float* __restrict__ w,
                                    float* __restrict__ y, int rows, int D, float eps) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* xr = x + (size_t)row * D;
    const float scale = warp_rms_scale(xr, D, eps, lane);
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

// Op-level replay's comparison (engine/verify/op_replay.py), one launch per hooked op use
// instead of a dozen CuPy reductions (~230 us a use on the H100; 63k uses a 1.5B validate).
// c [n, w] the candidate's output (float32, or f16 bits), r [n, w] float32 the reference's.
// out [4, n] float64: per row sum (c - r)^2, sum r^2, max |c - r| and its column (first on a
// tie; a NaN difference counts as the largest, as NumPy's max and argmax read it). One block
// of 256 threads per row.
template <typename T>
__device__ __forceinline__ double as_double(T v);
template <>
__device__ __forceinline__ double as_double<float>(float v) { return (double)v; }
template <>
__device__ __forceinline__ double as_double<u16>(u16 v) { return (double)h2f(v); }

__device__ __forceinline__ bool abs_wins(double a, int i, double b, int j) {
    const bool an = a != a, bn = b != b;  // NaN
    if (an != bn) return an;
    if (an || a == b) return i < j;
    return a > b;
}

template <typename T>
__device__ void row_stats_body(const T* __restrict__ c, const float* __restrict__ r,
                               double* __restrict__ out, int n, int w) {
    __shared__ double s_err[8], s_en[8], s_max[8];
    __shared__ int s_col[8];
    const int row = blockIdx.x;
    const T* cr = c + (size_t)row * w;
    const float* rr = r + (size_t)row * w;
    double err = 0.0, en = 0.0, mx = -1.0;
    int col = 0x7fffffff;
    for (int i = threadIdx.x; i < w; i += blockDim.x) {
        const double rv = (double)rr[i], d = as_double<T>(cr[i]) - rv;
        err += d * d;
        en += rv * rv;
        const double a = fabs(d);
        if (abs_wins(a, i, mx, col)) {
            mx = a;
            col = i;
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        err += __shfl_xor_sync(0xffffffffu, err, o);
        en += __shfl_xor_sync(0xffffffffu, en, o);
        const double om = __shfl_xor_sync(0xffffffffu, mx, o);
        const int oc = __shfl_xor_sync(0xffffffffu, col, o);
        if (abs_wins(om, oc, mx, col)) {
            mx = om;
            col = oc;
        }
    }
    const int wid = threadIdx.x / 32, nw = blockDim.x / 32;
    if ((threadIdx.x & 31) == 0) {
        s_err[wid] = err;
        s_en[wid] = en;
        s_max[wid] = mx;
        s_col[wid] = col;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int k = 1; k < nw; ++k) {
        err += s_err[k];
        en += s_en[k];
        if (abs_wins(s_max[k], s_col[k], mx, col)) {
            mx = s_max[k];
            col = s_col[k];
        }
    }
    out[row] = err;
    out[n + row] = en;
    out[2 * n + row] = mx;
    out[3 * n + row] = (double)col;
}

extern "C" __global__ void row_stats_f32(const float* c, const float* r, double* out, int n,
                                         int w) {
    row_stats_body<float>(c, r, out, n, w);
}

extern "C" __global__ void row_stats_f16(const u16* c, const float* r, double* out, int n,
                                         int w) {
    row_stats_body<u16>(c, r, out, n, w);
}
