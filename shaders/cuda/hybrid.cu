// hybrid.cu: the small ops of the hybrid schedule (engine/hybrid.py) that are not the scan or
// the expert matmuls. One variant each (engine/tuning/variants/cuda_hybrid.py); tunables are launch
// parameters only (threads, rows per block), so changing them never recompiles:
//   ssm_conv.default      ssm_conv (a thread per output element) then ssm_conv_state; with
//                         fuse_step a one-token call is ssm_conv_step (conv and state in one)
//   ssm_gates.default     ssm_gates: g = softplus(a + dt_bias) * ssm_a, beta = sigmoid(b)
//   sigmoid_mul.default   sigmoid_mul: x * sigmoid(gate), gate per element or per row
//   rope_partial.pairs    rope_partial: neox RoPE of the first n_rot dims of each head
//   router_topk.default   router_topk: a warp per token: top-k of the logits, softmax over them
//   moe_experts.dmmv      moe_combine: the weighted sum of a token's k expert outputs
//   rope_partial.fuse_qk  attn_qk_prep: a decode token's q / k norms, RoPE, KV write, q and gate
// pos0 comes as a scalar and a device pointer (non-null wins: the decode graph's position).
// Every kernel starts with pdl_start() (common.cuh): under matmul_decode.pdl the backend chains
// them into the decode step's programmatic dependent launches.
#include "common.cuh"
#include "topk.cuh"

#define GRID_STRIDE(i, n)                                                              \
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < (n); \
         i += (long long)gridDim.x * blockDim.x)

// Causal depthwise conv + SiLU over xs = [state; x] ([K-1+T, Cc]): tap j of channel c meets
// xs[t + j], tap K-1 is token t. x [T, Cc], state [K-1, Cc], w [Cc, K] float32 -> y [T, Cc].
extern "C" __global__ void ssm_conv(const float* __restrict__ x, const float* __restrict__ state,
                                    const float* __restrict__ w, float* __restrict__ y, int T,
                                    int Cc, int K) {
    pdl_start();
    GRID_STRIDE(i, (long long)T * Cc) {
        const int t = (int)(i / Cc), c = (int)(i % Cc);
        float acc = 0.f;
        for (int j = 0; j < K; ++j) {
            const int src = t + j;  // row of xs
            const float xv = src < K - 1 ? state[(size_t)src * Cc + c]
                                         : x[(size_t)(src - (K - 1)) * Cc + c];
            acc += __ldg(w + (size_t)c * K + j) * xv;
        }
        y[i] = acc / (1.f + expf(-acc));
    }
}

#define MAX_CONV 8
// Channel c's K - 1 old inputs (the state's rows) into registers, zeros past them.
__device__ __forceinline__ void conv_old(const float* __restrict__ state, int Cc, int K, int c,
                                         float* old) {
#pragma unroll
    for (int i = 0; i < MAX_CONV - 1; ++i) old[i] = i < K - 1 ? state[(size_t)i * Cc + c] : 0.f;
}

// After ssm_conv (same stream): state <- the last K-1 rows of [state; x]. A thread per channel
// holds its old column, so T < K-1 (old rows shifting up) is safe in place.
extern "C" __global__ void ssm_conv_state(const float* __restrict__ x, float* __restrict__ state,
                                          int T, int Cc, int K) {
    pdl_start();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= Cc) return;
    float old[MAX_CONV - 1];
    conv_old(state, Cc, K, c, old);
#pragma unroll
    for (int i = 0; i < MAX_CONV - 1; ++i) {
        if (i >= K - 1) break;
        const int src = T + i;  // row of xs
        float val = 0.f;
#pragma unroll
        for (int m = 0; m < MAX_CONV - 1; ++m)  // old[src], indexed by a constant (registers)
            if (m == src) val = old[m];
        state[(size_t)i * Cc + c] = src < K - 1 ? val : x[(size_t)(src - (K - 1)) * Cc + c];
    }
}

// One token (decode): ssm_conv and ssm_conv_state in one launch, a thread per channel holding
// its K-1 old inputs; the same taps in the same order as ssm_conv (bit-identical).
extern "C" __global__ void ssm_conv_step(const float* __restrict__ x, float* __restrict__ state,
                                         const float* __restrict__ w, float* __restrict__ y,
                                         int Cc, int K) {
    pdl_start();
    const int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= Cc) return;
    float old[MAX_CONV - 1];
    conv_old(state, Cc, K, c, old);
    const float xc = x[c];
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < MAX_CONV; ++j) {
        if (j >= K) break;
        const float xv = j < K - 1 ? old[j] : xc;
        acc += __ldg(w + (size_t)c * K + j) * xv;
    }
    y[c] = acc / (1.f + expf(-acc));
#pragma unroll
    for (int i = 0; i < MAX_CONV - 1; ++i) {  // rows 1.. of the old state, then x
        if (i >= K - 1) break;
        float nxt = xc;
#pragma unroll
        for (int m = 0; m < MAX_CONV - 1; ++m)
            if (m == i + 1 && m < K - 1) nxt = old[m];
        state[(size_t)i * Cc + c] = nxt;
    }
}

// a, b [n] (n = T * Hv), dt_bias, ssm_a [Hv] -> g, beta [n].
extern "C" __global__ void ssm_gates(const float* __restrict__ a, const float* __restrict__ b,
                                     const float* __restrict__ dt, const float* __restrict__ sa,
                                     float* __restrict__ g, float* __restrict__ beta,
                                     long long n, int Hv) {
    pdl_start();
    GRID_STRIDE(i, n) {
        const int h = (int)(i % Hv);
        const float x = a[i] + dt[h];
        const float softplus = fmaxf(x, 0.f) + log1pf(expf(-fabsf(x)));  // no overflow
        g[i] = softplus * sa[h];
        beta[i] = 1.f / (1.f + expf(-b[i]));
    }
}

// y[i] = x[i] * sigmoid(gate[i / div]): div 1 (same shape) or the row width (a gate per row).
extern "C" __global__ void sigmoid_mul(const float* __restrict__ gate, const float* __restrict__ x,
                                       float* __restrict__ y, long long n, int div) {
    pdl_start();
    GRID_STRIDE(i, n) { y[i] = x[i] / (1.f + expf(-gate[i / div])); }
}

// x [T, H, D] -> y: pairs (e, e + n_rot/2) of the first n_rot dims rotated by
// (pos0 + t) * theta^(-2e / n_rot) (angle in double, as rope), the other dims copied.
extern "C" __global__ void rope_partial(const float* __restrict__ x, float* __restrict__ y, int T,
                                        int H, int D, int n_rot, int pos0, const int* pos_ptr,
                                        float theta) {
    pdl_start();
    const int half = n_rot / 2, per = half + (D - n_rot);  // work items per head row
    const int p0 = pos_ptr ? *pos_ptr : pos0;
    GRID_STRIDE(i, (long long)T * H * per) {
        const long long th = i / per;  // t * H + h
        const int e = (int)(i % per), t = (int)(th / H);
        const float* xr = x + th * D;
        float* yr = y + th * D;
        if (e >= half) {
            const int d = n_rot + (e - half);
            yr[d] = xr[d];
            continue;
        }
        const double ang = (double)(p0 + t) * pow((double)theta, -2.0 * e / n_rot);
        double s, c;
        sincos(ang, &s, &c);
        const double a = xr[e], b = xr[e + half];
        yr[e] = (float)(a * c - b * s);
        yr[e + half] = (float)(a * s + b * c);
    }
}

// logits [T, E] (E <= 1024) -> ids [T, k], w [T, k]: topk.cuh, a warp per token.
extern "C" __global__ void router_topk(const float* __restrict__ logits, int* __restrict__ ids,
                                       float* __restrict__ w, int T, int E, int k) {
    pdl_start();
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x & 31;
    if (row >= T) return;
    topk_row(logits + (size_t)row * E, E, k, ids + (size_t)row * k, w + (size_t)row * k, lane);
}

// d [T * k, C] (expert outputs, token-major), w [T, k] -> out [T, C] = sum_j w[t, j] d[t k + j].
extern "C" __global__ void moe_combine(const float* __restrict__ d, const float* __restrict__ w,
                                       float* __restrict__ out, int T, int C, int k) {
    pdl_start();
    GRID_STRIDE(i, (long long)T * C) {
        const long long t = i / C, c = i % C;
        float acc = 0.f;
        for (int j = 0; j < k; ++j) acc += w[t * k + j] * d[(t * k + j) * C + c];
        out[i] = acc;
    }
}

// rope_partial.fuse_qk: a decode token's gated-attention inputs in one launch, bit-identical to
// rms_norm (elementwise.cu) of q and k by their norms, rope_partial of both, kv_write of k and v
// and the contiguous copies of q and of the gate that the op-by-op schedule's views cost.
// qg [H, 2D] ([q | gate] per head), k, v [Hkv, D] (one token), qn, kn [D] -> q [H, D] roped,
// gate [H, D], the cache rows at position p0 (kc, vc [S, Hkv * D]). A warp per q head and per
// k head (which also copies its v row); its normalised row goes through shared memory, where
// the lanes meet for the RoPE pairs. Block: 32 * ATTN_PREP_WARPS threads; D <= ATTN_PREP_MAX_D.
#define ATTN_PREP_WARPS 4
#define ATTN_PREP_MAX_D 512
extern "C" __global__ void __launch_bounds__(32 * ATTN_PREP_WARPS)
    attn_qk_prep(const float* __restrict__ qg, const float* __restrict__ k,
                 const float* __restrict__ v, const float* __restrict__ qn,
                 const float* __restrict__ kn, float* __restrict__ q, float* __restrict__ gate,
                 float* __restrict__ kc, float* __restrict__ vc, int H, int Hkv, int D,
                 int n_rot, int pos0, const int* pos_ptr, float theta, float eps) {
    __shared__ float rowbuf[ATTN_PREP_WARPS][ATTN_PREP_MAX_D];
    pdl_start();
    const int wi = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int row = blockIdx.x * ATTN_PREP_WARPS + wi;  // q heads 0 .. H-1, then k heads
    if (row >= H + Hkv) return;  // a whole warp; no block-level barrier below
    const bool isq = row < H;
    const int hh = isq ? row : row - H;
    const int p0 = pos_ptr ? *pos_ptr : pos0;
    const float* xr = isq ? qg + (size_t)hh * 2 * D : k + (size_t)hh * D;
    const float* w = isq ? qn : kn;
    float s = 0.f;  // rms_norm's row
    for (int i = lane; i < D; i += 32) s += xr[i] * xr[i];
    s = warp_sum(s);
    const float scale = rsqrtf(s / (float)D + eps);
    float* buf = rowbuf[wi];
    for (int i = lane; i < D; i += 32) buf[i] = xr[i] * scale * w[i];
    __syncwarp();
    float* out = isq ? q + (size_t)hh * D : kc + ((size_t)p0 * Hkv + hh) * D;
    const int half = n_rot / 2;
    for (int e = lane; e < half + (D - n_rot); e += 32) {  // rope_partial's work items
        if (e >= half) {
            const int d = n_rot + (e - half);
            out[d] = buf[d];
            continue;
        }
        const double ang = (double)p0 * pow((double)theta, -2.0 * e / n_rot);
        double sn, cs;
        sincos(ang, &sn, &cs);
        const double a = buf[e], b = buf[e + half];
        out[e] = (float)(a * cs - b * sn);
        out[e + half] = (float)(a * sn + b * cs);
    }
    if (isq) {  // the gate, contiguous
        for (int i = lane; i < D; i += 32) gate[(size_t)hh * D + i] = xr[D + i];
    } else {  // v into the cache
        float* vo = vc + ((size_t)p0 * Hkv + hh) * D;
        for (int i = lane; i < D; i += 32) vo[i] = v[(size_t)hh * D + i];
    }
}
