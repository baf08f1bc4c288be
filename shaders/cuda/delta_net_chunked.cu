// delta_net_chunked.cu: the gated delta rule of delta_net.cu in chunks of CHUNK tokens (the WY /
// triangular-solve form of llama.cpp's build_delta_net_chunking and FLA; the Vulkan backend's
// delta_net_chunked.comp), for prefill. Per V head and chunk of L tokens, with q, k
// L2-normalised (q also / sqrt(dk)) and G_t = exp(cumsum g) within the chunk (every ratio
// G_t / G_s taken with s <= t, so <= 1):
//   A[t, s] = beta_t G_t/G_s k_t.k_s (s < t),  (I + A) [W | Y] = [beta V | beta G K]
//   U = W - Y S0                  (the sequential form's corrections u_t, S0 the chunk's start)
//   O = (G Q) S0 + P U,           P[t, s] = G_t/G_s q_t.k_s (s <= t: the intra-chunk mask)
//   S = G_L S0 + ((G_L / G) K)^T U
// Two kernels (decode, T = 1, runs delta_net_seq, included below, on the same state):
//   delta_net_chunk_prep  a block per (chunk, V head): norms, cumsum, A and P, the forward
//        substitution (a thread per column of [W | Y]: columns are independent) and the decayed
//        G Q and (G_L / G) K: all that does not depend on the state, so all chunks run at once.
//   delta_net_chunk_scan  a warp per state column j (lanes over its rows, in registers, as
//        delta_net_seq), WARPS columns per block, grid (ceil(dv / WARPS), Hv): the chunks in
//        sequence, and within a chunk the tokens in parallel (a lane per token for U = W - Y S0
//        and O, the column S0 in shared memory): T / CHUNK dependent steps, not T.
// Tunables (the registry's delta_net.chunked): WARPS, MAX_DK, STATE_TRANSPOSED, PREFETCH as delta_net.cu (PREFETCH:
// its decode step's token prefetch, a no-op at T = 1); CHUNK
// (tokens per chunk; the last is ragged); the prep block size is a launch knob (<= 256).
// Scratch (h V head, t token of the call): W [Hv, T, dv], Y, GQ, GK [Hv, T, dk],
// P [Hv, T, CHUNK], GL [Hv, NC] (G_L per chunk).
#if !defined(WARPS) || !defined(MAX_DK) || !defined(STATE_TRANSPOSED) || !defined(CHUNK)
#error "delta_net_chunked.cu needs WARPS, MAX_DK, STATE_TRANSPOSED and CHUNK (engine/tuning/variants/cuda_hybrid.py)"
#endif
// delta_net.cu's PREFETCH (decode here is one token: nothing to fetch ahead)
#ifndef PREFETCH
#define PREFETCH 1
#endif
#include "delta_net.cu"

#define PREP_MAX_THREADS 256

extern "C" __global__ void __launch_bounds__(PREP_MAX_THREADS)
    delta_net_chunk_prep(const float* __restrict__ q, const float* __restrict__ k,
                         const float* __restrict__ v, const float* __restrict__ g,
                         const float* __restrict__ beta, float* __restrict__ W,
                         float* __restrict__ Y, float* __restrict__ GQ, float* __restrict__ GK,
                         float* __restrict__ P, float* __restrict__ GL, int T, int Hk, int Hv,
                         int dk, int dv, int grouped, float eps) {
    __shared__ float A[CHUNK * CHUNK];
    __shared__ float gam[CHUNK];  // log G_t: cumsum of g within the chunk
    __shared__ float bt[CHUNK];
    __shared__ float rk[CHUNK];  // 1 / |k_t|
    __shared__ float rq[CHUNK];  // 1 / (|q_t| sqrt(dk))
    const int c = blockIdx.x, h = blockIdx.y;
    const int tid = threadIdx.x, nth = blockDim.x;
    const int lane = tid & 31, warp = tid >> 5, nwarps = nth >> 5;
    const int nc = (T + CHUNK - 1) / CHUNK;
    const int c0 = c * CHUNK, L = min(CHUNK, T - c0);
    const int kh = grouped ? h / (Hv / Hk) : h % Hk;
    const size_t row0 = (size_t)h * T + c0;  // scratch row of the chunk's first token
    const float inv_sqrt_dk = rsqrtf((float)dk);

    for (int t = warp; t < L; t += nwarps) {  // a warp per token: coalesced over dk
        const size_t qk = ((size_t)(c0 + t) * Hk + kh) * dk;
        float sk = 0.f, sq = 0.f;
        for (int i = lane; i < dk; i += 32) {
            const float kv = __ldg(k + qk + i), qv = __ldg(q + qk + i);
            sk += kv * kv;
            sq += qv * qv;
        }
        sk = warp_sum(sk);
        sq = warp_sum(sq);
        if (lane == 0) {
            rk[t] = rsqrtf(sk + eps);
            rq[t] = rsqrtf(sq + eps) * inv_sqrt_dk;
            bt[t] = __ldg(beta + (size_t)(c0 + t) * Hv + h);
        }
    }
    if (tid == 0) {
        float acc = 0.f;
        for (int t = 0; t < L; ++t) {
            acc += __ldg(g + (size_t)(c0 + t) * Hv + h);
            gam[t] = acc;
        }
        GL[(size_t)h * nc + c] = expf(acc);
    }
    __syncthreads();

    // A (strictly lower) into shared memory, P (lower with the diagonal) into scratch: a warp
    // per (t, s), lanes over dk.
    for (int p = warp; p < L * CHUNK; p += nwarps) {
        const int t = p / CHUNK, s = p % CHUNK;
        float a = 0.f, pq = 0.f;
        if (s <= t) {  // warp-uniform
            const size_t kt = ((size_t)(c0 + t) * Hk + kh) * dk;
            const size_t ks = ((size_t)(c0 + s) * Hk + kh) * dk;
            float kk = 0.f, qk = 0.f;
            for (int i = lane; i < dk; i += 32) {
                const float k_s = __ldg(k + ks + i);
                kk += __ldg(k + kt + i) * k_s;
                qk += __ldg(q + kt + i) * k_s;
            }
            kk = warp_sum(kk);
            qk = warp_sum(qk);
            const float ratio = expf(gam[t] - gam[s]);
            if (s < t) a = bt[t] * ratio * kk * rk[t] * rk[s];
            pq = ratio * qk * rq[t] * rk[s];
        }
        if (lane == 0) {
            A[p] = a;
            P[(row0 + t) * CHUNK + s] = pq;
        }
    }
    // The state-independent operands of the scan: G Q and (G_L / G) K.
    for (int p = tid; p < L * dk; p += nth) {
        const int t = p / dk, i = p % dk;
        const size_t src = ((size_t)(c0 + t) * Hk + kh) * dk + i;
        const size_t dst = (row0 + t) * dk + i;
        GQ[dst] = expf(gam[t]) * __ldg(q + src) * rq[t];
        GK[dst] = expf(gam[L - 1] - gam[t]) * __ldg(k + src) * rk[t];
    }
    __syncthreads();

    // (I + A) X = R by forward substitution, a thread per column of [W | Y]; each thread reads
    // back only the rows of its own column it wrote.
    for (int col = tid; col < dv + dk; col += nth) {
        const bool is_w = col < dv;
        float* x = is_w ? W + row0 * dv + col : Y + row0 * dk + (col - dv);
        const int stride = is_w ? dv : dk;
        for (int t = 0; t < L; ++t) {
            float r;
            if (is_w) {
                r = bt[t] * __ldg(v + ((size_t)(c0 + t) * Hv + h) * dv + col);
            } else {
                const size_t src = ((size_t)(c0 + t) * Hk + kh) * dk + (col - dv);
                r = bt[t] * expf(gam[t]) * __ldg(k + src) * rk[t];
            }
            for (int s = 0; s < t; ++s) r -= A[t * CHUNK + s] * x[(size_t)s * stride];
            x[(size_t)t * stride] = r;
        }
    }
}

#define TPL ((CHUNK + 31) / 32)  // tokens of a chunk per lane in the token-parallel steps

extern "C" __global__ void __launch_bounds__(WARPS * 32)
    delta_net_chunk_scan(const float* __restrict__ W, const float* __restrict__ Y,
                         const float* __restrict__ GQ, const float* __restrict__ GK,
                         const float* __restrict__ P, const float* __restrict__ GL,
                         float* __restrict__ state, float* __restrict__ o, int T, int Hv, int dk,
                         int dv) {
    __shared__ float ush[WARPS][CHUNK];   // U[:, j] of the current chunk, per warp (its column)
    __shared__ float ssh[WARPS][MAX_DK];  // S0[:, j], the chunk's start column, per warp
    const int lane = threadIdx.x & 31, w = threadIdx.x / 32;
    const int j = blockIdx.x * WARPS + w;  // the warp's state column
    const int h = blockIdx.y;
    if (j >= dv) return;  // a whole warp; the kernel has no block-level barrier
    const int nc = (T + CHUNK - 1) / CHUNK;
    float* sh = state + (size_t)h * dk * dv;
    const bool transposed = STATE_TRANSPOSED != 0;
    float s[RPL];  // lanes over the rows of column j, as delta_net_seq
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
        const int i = lane + 32 * r;
        s[r] = i < dk ? sh[state_at(i, j, dk, dv, transposed)] : 0.f;
    }
    for (int c = 0; c < nc; ++c) {
        const int c0 = c * CHUNK, L = min(CHUNK, T - c0);
        const size_t row0 = (size_t)h * T + c0;
#pragma unroll
        for (int r = 0; r < RPL; ++r) {
            const int i = lane + 32 * r;
            if (i < dk) ssh[w][i] = s[r];
        }
        __syncwarp();
        // Token-parallel (a lane per token): u_t = W[t, j] - Y[t] . S0[:, j] and (G Q S0)[t, j].
        float qs0[TPL];
#pragma unroll
        for (int m = 0; m < TPL; ++m) {
            const int t = lane + 32 * m;
            qs0[m] = 0.f;
            if (t < L) {
                const float* yr = Y + (row0 + t) * dk;
                const float* qr = GQ + (row0 + t) * dk;
                float ys = 0.f, qs = 0.f;
                for (int i = 0; i < dk; ++i) {
                    const float si = ssh[w][i];
                    ys += __ldg(yr + i) * si;
                    qs += __ldg(qr + i) * si;
                }
                ush[w][t] = __ldg(W + (row0 + t) * dv + j) - ys;
                qs0[m] = qs;
            }
        }
        __syncwarp();
        // O[t, j] = (G Q S0)[t, j] + sum_{r <= t} P[t, r] u_r, still a lane per token.
#pragma unroll
        for (int m = 0; m < TPL; ++m) {
            const int t = lane + 32 * m;
            if (t < L) {
                const float* pr = P + (row0 + t) * CHUNK;
                float acc = qs0[m];
                for (int r = 0; r <= t; ++r) acc += __ldg(pr + r) * ush[w][r];
                o[((size_t)(c0 + t) * Hv + h) * dv + j] = acc;
            }
        }
        // S = G_L S0 + ((G_L / G) K)^T U, lanes over rows again.
        const float gl = __ldg(GL + (size_t)h * nc + c);
#pragma unroll
        for (int r = 0; r < RPL; ++r) s[r] *= gl;
        for (int t = 0; t < L; ++t) {
            const float u = ush[w][t];
            const float* kr = GK + (row0 + t) * dk;
#pragma unroll
            for (int r = 0; r < RPL; ++r) {
                const int i = lane + 32 * r;
                if (i < dk) s[r] += __ldg(kr + i) * u;
            }
        }
        __syncwarp();  // every lane is done with this chunk's U and S0 before the next writes
    }
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
        const int i = lane + 32 * r;
        if (i < dk) sh[state_at(i, j, dk, dv, transposed)] = s[r];
    }
}
