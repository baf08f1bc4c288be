// dn_step.cu: a decode token's delta-net after the conv in one launch (delta_net.fuse_decode;
// engine/backends/cuda/hybrid.py delta_net_gated): the gates (ssm_gates), the scan's step
// (delta_net.cu, the same code: dn_load / dn_step / state_at) and the gated norm (rms_norm of
// each head's output by ssm_norm, times silu(z): rms_norm then swiglu), which the op-by-op
// schedule runs as four launches. Bit-identical to them: the same expressions in the same order.
//
// Grid (ceil(dv / NW), Hv), as delta_net_seq: warp j of a head's blocks owns state column j. The
// head's last block to finish (a ticket per head, reset by it) normalises the head's row of
// outputs, which the other blocks wrote and fenced, and writes the gated row.
// Compiled with the delta_net variant's NW, MAX_DK and STATE_T (one token: no prefetch ring).
#if !defined(NW) || !defined(MAX_DK) || !defined(STATE_T)
#error "dn_step.cu needs NW, MAX_DK and STATE_T (engine/tuning/kernels/cuda_hybrid.py)"
#endif
#include "delta_net.cu"

// q, k [Hk, dk], v [Hv, dv] (views of the conv output), a, b [Hv] (the alpha and beta
// projections), dt, sa [Hv] (ssm_dt.bias, ssm_a), state [Hv, dk * dv], o [Hv, dv] (the raw scan
// output, scratch), nw [dv] (ssm_norm), z [Hv * dv] -> y [Hv * dv]; tickets [Hv] zero between
// launches.
extern "C" __global__ void __launch_bounds__(NW * 32)
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
    const int j = blockIdx.x * NW + threadIdx.x / 32;
    const int h = blockIdx.y;
    if (j < dv) {  // (no early return: the block meets at the ticket's barriers)
        // ssm_gates of head h, its expressions
        const float xg = a[h] + dt[h];
        const float softplus = fmaxf(xg, 0.f) + log1pf(expf(-fabsf(xg)));
        const float g = softplus * sa[h];
        const float beta = 1.f / (1.f + expf(-b[h]));
        const int kh = grouped ? h / (Hv / Hk) : h % Hk;
        float* sh = state + (size_t)h * dk * dv;
        const bool transposed = STATE_T != 0;
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
#ifdef MUTANT_DN_STEP_UNGATED
        y[(size_t)h * dv + i] = on;  // planted bug: the output gate silu(z) left out
#else
        y[(size_t)h * dv + i] = zv / (1.f + expf(-zv)) * on;
#endif
    }
    if (lane == 0) tickets[h] = 0;  // ready for the next layer / replay
}
