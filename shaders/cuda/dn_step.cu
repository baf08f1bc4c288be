// dn_step.cu: a decode token's delta-net after the conv in one launch (delta_net.fuse_decode;
// engine/backends/cuda/hybrid.py delta_net_gated): the gates (ssm_gates), the scan's step
// (delta_net.cu, the same code: dn_load / dn_step / state_at) and the gated norm (rms_norm of
// each head's output by ssm_norm, times silu(z): rms_norm then swiglu), which the op-by-op
// schedule runs as four launches. Bit-identical to them: the same expressions in the same order.
//
// Grid (ceil(dv / WARPS), Hv), as delta_net_seq: warp j of a head's blocks owns state column j. The
// head's last block to finish (a ticket per head, reset by it) normalises the head's row of
// outputs, which the other blocks wrote and fenced, and writes the gated row.
// Compiled with the delta_net variant's WARPS, MAX_DK and STATE_TRANSPOSED (one token: no prefetch ring).
#if !defined(WARPS) || !defined(MAX_DK) || !defined(STATE_TRANSPOSED)
#error "dn_step.cu needs WARPS, MAX_DK and STATE_TRANSPOSED (engine/tuning/variants/cuda_hybrid.py)"
#endif
#include "delta_net.cu"

// q, k [Hk, dk], v [Hv, dv] (views of the conv output), a, b [Hv] (the alpha and beta
// projections), dt, sa [Hv] (ssm_dt.bias, ssm_a), state [Hv, dk * dv], o [Hv, dv] (the raw scan
// output, scratch), nw [dv] (ssm_norm), z [Hv * dv] -> y [Hv * dv]; tickets [Hv] zero between
// launches.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
    delta_net_step(const float* __restrict__ q, const float* __restrict__ k,
                   const float* __restrict__ v, const float* __restrict__ a,
                   const float* __restrict__ b, const float* __restrict__ dt,
                   const float* __restrict__ sa, float* __restrict__ state, float* o,
                   const float* __restrict__ nw, const float* __restrict__ z,
                   float* __restrict__ y, int Hk, int Hv, int dk, int dv, int grouped,
                   float eps, unsigned int* tickets) {
    __shared__ bool last;
    pdl_start();
    const int lane = threadIdx.x & 31;
    const int j = blockIdx.x * WARPS + threadIdx.x / 32;
    const int h = blockIdx.y;
    if (j < dv) {  // (no early return: the block meets at the ticket's barriers)
        // ssm_gates of head h, its expressions
        const float xg = a[h] + dt[h];
        const float softplus = fmaxf(xg, 0.f) + log1pf(expf(-fabsf(xg)));
        const float g = softplus * sa[h];
        const float beta = 1.f / (1.f + expf(-b[h]));
        const int kh = grouped ? h / (Hv / Hk) : h % Hk;
        float* sh = state + (size_t)h * dk * dv;
        const bool transposed = STATE_TRANSPOSED != 0;
        float s[RPL];
#pragma unroll
        for (int r = 0; r < RPL; ++r) {
            const int i = lane + 32 * r;
            s[r] = i < dk ? sh[state_at(i, j, dk, dv, transposed)] : 0.f;
        }
        DnIn in;  // dn_load's loads, with this head's gates from registers
        const float* kt = k + (size_t)kh * dk;
        const float* qt = q + (size_t)kh * dk;
#pragma unroll
        for (int r = 0; r < RPL; ++r) {
            const int i = lane + 32 * r;
            in.k[r] = i < dk ? __ldg(kt + i) : 0.f;
            in.q[r] = i < dk ? __ldg(qt + i) : 0.f;
        }
        in.g = g;
        in.beta = beta;
        in.v = __ldg(v + (size_t)h * dv + j);
        dn_step(s, in, o, 0, Hv, h, dv, j, lane, eps, rsqrtf((float)dk));
#pragma unroll
        for (int r = 0; r < RPL; ++r) {
            const int i = lane + 32 * r;
            if (i < dk) sh[state_at(i, j, dk, dv, transposed)] = s[r];
        }
        if (lane == 0) __threadfence();  // o[h, j] visible device-wide before the ticket
    }
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(tickets + h, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last || threadIdx.x >= 32) return;
    __threadfence();
    // rms_norm (elementwise.cu) of row h, then swiglu(z, .) (silu(z) * o)
    const float* xr = o + (size_t)h * dv;
    float ss = 0.f;
    for (int i = lane; i < dv; i += 32) {
        const float xv = __ldcg(xr + i);
        ss += xv * xv;
    }
    ss = warp_sum(ss);
    const float scale = rsqrtf(ss / (float)dv + eps);
    for (int i = lane; i < dv; i += 32) {
        const float on = __ldcg(xr + i) * scale * nw[i];
        const float zv = z[(size_t)h * dv + i];
        y[(size_t)h * dv + i] = zv / (1.f + expf(-zv)) * on;
    }
    if (lane == 0) tickets[h] = 0;  // ready for the next layer / replay
}

// delta_net.fuse_conv: the conv step (hybrid.cu ssm_conv_step's expressions) folded in front of
// delta_net_step, so a decode token's delta-net from the raw q/k/v projection is one launch
// (the op-by-op schedule: ssm_conv_step, three column copies, delta_net_step). Each block
// convolves what it reads from the old conv state: its K head's q and k channels (into shared
// memory, with their input windows) and its warps' v channels (a window in registers). A v
// channel has one reader, its column's warp, which writes its new state right away; the q / k
// channels of a K head are read by every block of the V heads sharing it, so the last of those
// blocks to finish (a ticket per K head, tickets[DN_TICKETS + kh]) writes their new state from
// its shared windows (stores only: the H200 run of 2026-12-01 measured 17.5 us a call when that
// block reloaded and shifted the state channel by channel, a chain of round trips).
#define DN_MAX_CONV 8  // hybrid.cu MAX_CONV: K - 1 <= 7 taps of the state per channel
#define DN_TICKETS 1024  // engine/backends/cuda/hybrid.py MAX_DN_HEADS: the K heads' tickets

// Channel c's input window into win (rows 0..K-2 the state, K-1 the new input; all loads first)
// -> the conv + SiLU: tap j meets win[j].
__device__ __forceinline__ float dn_conv_win(const float* __restrict__ xr, const float* cs,
                                             const float* __restrict__ cw, int c, int Cc, int K,
                                             float* win) {
#pragma unroll
    for (int j = 0; j < DN_MAX_CONV; ++j)
        win[j] = j < K - 1 ? cs[(size_t)j * Cc + c] : (j == K - 1 ? xr[c] : 0.f);
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < DN_MAX_CONV; ++j) {
        if (j >= K) break;
        acc += __ldg(cw + (size_t)c * K + j) * win[j];
    }
    return acc / (1.f + expf(-acc));
}

// xr [Cc] (Cc = 2 Hk dk + Hv dv: the attn_qkv row before the conv), cs [K-1, Cc] the conv state,
// cw [Cc, K]; the rest as delta_net_step; tickets [2 * DN_TICKETS] zero between launches.
extern "C" __global__ void __launch_bounds__(WARPS * 32)
    delta_net_conv_step(const float* __restrict__ xr, float* cs, const float* __restrict__ cw,
                        int K, const float* __restrict__ a, const float* __restrict__ b,
                        const float* __restrict__ dt, const float* __restrict__ sa,
                        float* __restrict__ state, float* o, const float* __restrict__ nw,
                        const float* __restrict__ z, float* __restrict__ y, int Hk, int Hv,
                        int dk, int dv, int grouped, float eps, unsigned int* tickets) {
    __shared__ float qk[2 * MAX_DK];  // the K head's convolved q [dk], then k [dk]
    __shared__ float qk_win[DN_MAX_CONV - 1][2 * MAX_DK];  // their windows' rows 1..K-1
    __shared__ bool last, last_group;
    pdl_start();
    const int lane = threadIdx.x & 31;
    const int j = blockIdx.x * WARPS + threadIdx.x / 32;
    const int h = blockIdx.y;
    const int rv = Hv / Hk;
    const int kh = grouped ? h / rv : h % Hk;
    const int kd = Hk * dk, Cc = 2 * kd + Hv * dv;
    float* sh = state + (size_t)h * dk * dv;
    const bool transposed = STATE_TRANSPOSED != 0;
    float s[RPL];  // the state column's loads first: in flight during the conv
#pragma unroll
    for (int r = 0; r < RPL; ++r) {
        const int i = lane + 32 * r;
        s[r] = i < dk && j < dv ? sh[state_at(i, j, dk, dv, transposed)] : 0.f;
    }
    const float xg = a[h] + dt[h];
    const float bh = b[h], sah = sa[h];
    float win[DN_MAX_CONV];
    for (int t = threadIdx.x; t < 2 * dk; t += blockDim.x) {
        const int c = (t < dk ? kh * dk + t : kd + kh * dk + t - dk);
        qk[t] = dn_conv_win(xr, cs, cw, c, Cc, K, win);
#pragma unroll
        for (int r = 0; r < DN_MAX_CONV - 1; ++r)
            if (r < K - 1) qk_win[r][t] = win[r + 1];  // (the new state's row r)
    }
    float vj = 0.f;
    if (j < dv) {  // the v channel's only reader: its new state written here
        const int c = 2 * kd + h * dv + j;
        vj = dn_conv_win(xr, cs, cw, c, Cc, K, win);
        if (lane < K - 1) {
            float nxt = 0.f;
#pragma unroll
            for (int r = 0; r < DN_MAX_CONV - 1; ++r)  // win[lane + 1], constant indices
                if (r == lane) nxt = win[r + 1];
            cs[(size_t)lane * Cc + c] = nxt;
        }
    }
    __syncthreads();  // (and this block's reads of the conv state are done)
    if (j < dv) {
        const float softplus = fmaxf(xg, 0.f) + log1pf(expf(-fabsf(xg)));
        const float g = softplus * sah;
        const float beta = 1.f / (1.f + expf(-bh));
        DnIn in;
#pragma unroll
        for (int r = 0; r < RPL; ++r) {
            const int i = lane + 32 * r;
            in.k[r] = i < dk ? qk[dk + i] : 0.f;
            in.q[r] = i < dk ? qk[i] : 0.f;
        }
        in.g = g;
        in.beta = beta;
        in.v = vj;
        dn_step(s, in, o, 0, Hv, h, dv, j, lane, eps, rsqrtf((float)dk));
#pragma unroll
        for (int r = 0; r < RPL; ++r) {
            const int i = lane + 32 * r;
            if (i < dk) sh[state_at(i, j, dk, dv, transposed)] = s[r];
        }
        if (lane == 0) __threadfence();  // o[h, j] visible device-wide before the ticket
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        last = atomicAdd(tickets + h, 1u) == gridDim.x - 1;
        last_group = atomicAdd(tickets + DN_TICKETS + kh, 1u) == gridDim.x * rv - 1;
    }
    __syncthreads();
    if (last_group) {  // the K head's q / k channels: state <- their windows' rows 1..K-1
        for (int e = threadIdx.x; e < (K - 1) * 2 * dk; e += blockDim.x) {
            const int r = e / (2 * dk), t = e % (2 * dk);
            const int c = t < dk ? kh * dk + t : kd + kh * dk + t - dk;
            cs[(size_t)r * Cc + c] = qk_win[r][t];
        }
        if (threadIdx.x == 0) tickets[DN_TICKETS + kh] = 0;
    }
    if (!last || threadIdx.x >= 32) return;
    __threadfence();
    const float* xo = o + (size_t)h * dv;
    float ss = 0.f;
    for (int i = lane; i < dv; i += 32) {
        const float xv = __ldcg(xo + i);
        ss += xv * xv;
    }
    ss = warp_sum(ss);
    const float scale = rsqrtf(ss / (float)dv + eps);
    for (int i = lane; i < dv; i += 32) {
        const float on = __ldcg(xo + i) * scale * nw[i];
        const float zv = z[(size_t)h * dv + i];
        y[(size_t)h * dv + i] = zv / (1.f + expf(-zv)) * on;
    }
    if (lane == 0) tickets[h] = 0;
}
