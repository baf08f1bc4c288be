// prefill_f16.cu: producers of the fp16 activations the prefill GEMM reads
// (matmul_prefill.resident with fuse_f16 = 1, engine/tuning/variants/cuda/).
//
// Each kernel is its elementwise.cu twin that also stores the fp16 rounding (cvt.rn, the same
// bits dequant.cu's f32_to_f16 makes) of what it writes, so the GEMM's input needs no pass of
// its own. The float32 output is still written: other ops and the contract read it.
#include "norm.cuh"

// x [rows, D] -> y f32 and yh f16; w [D] float32. blockDim = 32 * rows per block.
extern "C" __global__ void rms_norm_f16(const float* __restrict__ x, const float* __restrict__ w,
                                        float* __restrict__ y, u16* __restrict__ yh, int rows,
                                        int D, float eps) {
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= rows) return;
    const float* xr = x + (size_t)row * D;
    const float scale = warp_rms_scale(xr, D, eps, lane);
    float* yr = y + (size_t)row * D;
    u16* hr = yh + (size_t)row * D;
    for (int i = lane; i < D; i += 32) {
        const float v = xr[i] * scale * w[i];
        yr[i] = v;
        hr[i] = f2h(v);
    }
}

// silu(g) * u -> y f32 and yh f16, n elements.
extern "C" __global__ void swiglu_f16(const float* g, const float* u, float* y, u16* yh,
                                      long long n) {
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n;
         i += (long long)gridDim.x * blockDim.x) {
        const float v = g[i];
        const float r = v / (1.f + expf(-v)) * u[i];
        y[i] = r;
        yh[i] = f2h(r);
    }
}

// gu [T, 2F] (gate in columns [0, F), up in [F, 2F): one GEMM of both) -> silu(gate) * up as
// y [T, F] f32 and yh f16. Grid (x, T): a row per blockIdx.y (no 64-bit division per element).
extern "C" __global__ void swiglu_pair_f16(const float* __restrict__ gu, float* __restrict__ y,
                                           u16* __restrict__ yh, int T, int F) {
    const int t = blockIdx.y;
    const float* g = gu + (size_t)t * 2 * F;
    const size_t o = (size_t)t * F;
    for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < F; j += gridDim.x * blockDim.x) {
        const float v = g[j];
        const float r = v / (1.f + expf(-v)) * g[F + j];
        y[o + j] = r;
        yh[o + j] = f2h(r);
    }
}

// decode_fused.cu's rope_kv for one GEMM of q, k and v: y [T, ld] holds q in columns
// [0, H*D), k in [H*D, (H+Hkv)*D) and v after them (ld = (H + 2 Hkv) * D). Biases [H*D] /
// [Hkv*D] or null; qo [T, H, D] roped, kc / vc [S, Hkv*D] rows pos0 .. pos0 + T - 1 (k roped).
// One thread per rotated pair of q or k, then one per element of v; the angle in double and
// the bias added in float before it, as rope_kv does (prefill only: pos0 from the host).
extern "C" __global__ void rope_kv_rows(const float* __restrict__ y, int ld, const float* bq,
                                        const float* bk, const float* bv, float* __restrict__ qo,
                                        float* __restrict__ kc, float* __restrict__ vc, int T,
                                        int H, int Hkv, int D, int pos0, float theta, int neox) {
    const int half = D / 2;
    const long long nq = (long long)T * H * half, nk = (long long)T * Hkv * half;
    const long long nv = (long long)T * Hkv * D;
    const long long HkvD = (long long)Hkv * D;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < nq + nk + nv;
         i += (long long)gridDim.x * blockDim.x) {
        if (i >= nq + nk) {  // v: bias, then the cache row
            const long long e = i - nq - nk, t = e / HkvD, c = e % HkvD;
            const float v = y[t * ld + (long long)(H + Hkv) * D + c];
            vc[(pos0 + t) * HkvD + c] = bv ? v + bv[c] : v;
            continue;
        }
        const RopeSlot rs = rope_slot(i, nq, H, Hkv, half);
        const bool isq = rs.isq;
        const int j = rs.j, t = rs.t, h = rs.h;
        const long long th = rs.th;
        const double ang = (double)(pos0 + t) * pow((double)theta, -2.0 * j / D);
        double s, c;
        sincos(ang, &s, &c);
        const int ia = neox ? j : 2 * j, ib = neox ? j + half : 2 * j + 1;
        const float* x = y + (long long)t * ld + (isq ? 0 : (long long)H * D) + (long long)h * D;
        const float* bias = isq ? bq : bk;
        float xa = x[ia], xb = x[ib];
        if (bias) {
            xa = xa + bias[h * D + ia];
            xb = xb + bias[h * D + ib];
        }
        const double a = xa, b = xb;
        float* out = isq ? qo + th * D : kc + (pos0 + t) * HkvD + (long long)h * D;
        out[ia] = (float)(a * c - b * s);
        out[ib] = (float)(a * s + b * c);
    }
}
