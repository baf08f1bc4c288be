// dn_clu.cu: a decode token's delta-net from the raw q/k/v projection row in one launch, as
// dn_step.cu's delta_net_conv_step computes it (the conv step + SiLU, the gates, the scan's step,
// the gated norm), laid out for latency (delta_net.step_cluster; engine/backends/cuda/hybrid.py
// delta_net_conv_gated). Why: delta_net_conv_step took 12.3 us a call on the H200's 35B-A3B
// (2 MB of state: ~1 us of traffic); its time is a chain of round trips, not bytes: each of its
// 1024 blocks convolves the K head's 2 dk q / k channels in two passes, then a fence, two
// global tickets and a last block that reloads the head's outputs, its z and norm weights.
// Here:
//   - a thread-block cluster (sm_90) of RV x STEP_CLUSTER blocks owns one K head: its RV V heads (the
//     heads that read its q / k channels) x STEP_CLUSTER blocks of ceil(dv / STEP_CLUSTER) state columns each;
//   - a column belongs to a group of STEP_LANES lanes (rows i = g + STEP_LANES r, MAX_DK / STEP_LANES per lane), so a
//     block is ceil(dv / STEP_CLUSTER) * STEP_LANES threads and a column's sums are log2(STEP_LANES) shuffles;
//   - the head's norm sums the blocks' partial sums of squares through distributed shared
//     memory after one cluster barrier: no fence, no ticket, no output round trip;
//   - the K head's q / k conv state is rewritten after that barrier by the cluster's first
//     block (every block of the cluster has read the old state by then);
//   - the norm weights and gate biases are loaded before griddepcontrol.wait (under PDL they
//     fly during the previous GEMV's tail); after it the state's loads go first, so they are
//     in flight while the conv runs.
// The same expressions as delta_net_conv_step per value; the sums of squares (q, k, the norm's)
// in another order (order_only). q, k L2-normalised in the kernel, as delta_net.cu does.
// Defines: MAX_DK, STATE_TRANSPOSED (the delta_net variant's), STEP_CLUSTER blocks per V head, STEP_LANES lanes per column.
// Kernels dn_clu_r1 / _r2 / _r4: RV = Hv / Hk (the cluster's second dimension).
#ifndef DNC_EMUL
#include "common.cuh"
#endif

#if !defined(MAX_DK) || !defined(STATE_TRANSPOSED) || !defined(STEP_CLUSTER) || !defined(STEP_LANES)
#error "dn_clu.cu needs MAX_DK, STATE_TRANSPOSED, STEP_CLUSTER and STEP_LANES (engine/tuning/variants/cuda_hybrid.py)"
#endif
#if STEP_LANES != 8 && STEP_LANES != 16 && STEP_LANES != 32
#error "STEP_LANES (lanes per state column) must be 8, 16 or 32"
#endif
#if STEP_CLUSTER != 1 && STEP_CLUSTER != 2 && STEP_CLUSTER != 4
#error "STEP_CLUSTER (blocks per V head) must be 1, 2 or 4"
#endif

#define DNC_RPG (MAX_DK / STEP_LANES)  // rows of a column per lane
#define DNC_MAX_CONV 8         // hybrid.cu MAX_CONV: K - 1 <= 7 taps of the state per channel
#define DNC_THREADS 512  // the most a block may have (the host checks): 128 registers a thread

// A block's shared memory: one struct (the host emulation gives each block its own).
struct DncShared {
    float qk[2 * MAX_DK];  // the K head's convolved q [dk], then k [dk]
    float qk_win[DNC_MAX_CONV - 1][2 * MAX_DK];  // (the first block) their new conv state
    float red[DNC_THREADS / 32];
    float part;  // this block's sum of squares of its outputs (read cluster-wide)
};
#ifdef DNC_EMUL
#define DNC_SHARED(v) DncShared& v = *emu_block_shared<DncShared>()
#else
#define DNC_SHARED(v) __shared__ DncShared v
#endif

__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
    for (int o = STEP_LANES / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// (DNC_EMUL: tests/dn_clu_emul.py's host build, a block's threads as std::threads)
__device__ __forceinline__ void dnc_cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#elif defined(DNC_EMUL)
    emu_cluster_sync();
#endif
}

// the exit barrier in two halves: arrive once this block's reads of the others' shared memory
// are done, wait (before leaving) after its last stores, which so overlap the others' arrivals
__device__ __forceinline__ void dnc_cluster_arrive() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
#elif defined(DNC_EMUL)
    emu_cluster_arrive();
#endif
}
__device__ __forceinline__ void dnc_cluster_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#elif defined(DNC_EMUL)
    emu_cluster_wait();
#endif
}

// *p in the shared memory of the cluster's block rank
__device__ __forceinline__ float dnc_dsmem_ld(const float* p, int rank) {
    float v = *p;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned l, a;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(l) : "l"(p));
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(l), "r"(rank));
    asm volatile("ld.shared::cluster.f32 %0, [%1];" : "=f"(v) : "r"(a) : "memory");
#elif defined(DNC_EMUL)
    v = *emu_dsmem(p, rank);
#endif
    return v;
}

// pdl_start's two halves (common.cuh): let the next grid launch; wait for the previous one
__device__ __forceinline__ void dnc_pdl_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void dnc_pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ size_t dnc_state_at(int i, int j, int dk, int dv) {
    return STATE_TRANSPOSED ? (size_t)j * dk + i : (size_t)i * dv + j;  // delta_net.cu state_at
}

// Channel c's window into win (rows 0..K-2 the state, K-1 the new input) -> conv + SiLU
// (dn_step.cu dn_conv_win's expressions).
__device__ __forceinline__ float dnc_conv(const float* __restrict__ xr, const float* cs,
                                          const float* __restrict__ cw, int c, int Cc, int K,
                                          float* win) {
#pragma unroll
    for (int j = 0; j < DNC_MAX_CONV; ++j)
        win[j] = j < K - 1 ? cs[(size_t)j * Cc + c] : (j == K - 1 ? xr[c] : 0.f);
    float acc = 0.f;
#pragma unroll
    for (int j = 0; j < DNC_MAX_CONV; ++j) {
        if (j >= K) break;
        acc += __ldg(cw + (size_t)c * K + j) * win[j];
    }
    return acc / (1.f + expf(-acc));
}

// Arguments as delta_net_conv_step's without the scratch and the tickets: xr [Cc] the attn_qkv
// row, cs [K-1, Cc] the conv state, cw [Cc, K], a, b [Hv] (alpha, beta projections), dt, sa
// [Hv], state [Hv, dk * dv], nw [dv], z [Hv * dv] -> y [Hv * dv]. Grid (STEP_CLUSTER, Hv), block
// ceil(ceil(dv / STEP_CLUSTER) * STEP_LANES / 32) warps; cluster (STEP_CLUSTER, RV).
template <int RV>
__device__ __forceinline__ void dn_clu_body(const float* __restrict__ xr, float* cs,
                                            const float* __restrict__ cw, int K,
                                            const float* __restrict__ a,
                                            const float* __restrict__ b,
                                            const float* __restrict__ dt,
                                            const float* __restrict__ sa, float* state,
                                            const float* __restrict__ nw,
                                            const float* __restrict__ z, float* __restrict__ y,
                                            int Hk, int Hv, int dk, int dv, int grouped,
                                            float eps) {
    DNC_SHARED(sm);
    float* qk = sm.qk;
    const int tid = threadIdx.x, lane = tid & 31, g = tid % STEP_LANES, cl = tid / STEP_LANES;
    const int cpb = (dv + STEP_CLUSTER - 1) / STEP_CLUSTER;
    const int bx = blockIdx.x, vr = blockIdx.y % RV, kh = blockIdx.y / RV;
    const int h = grouped ? blockIdx.y : vr * Hk + kh;  // grouped: h / RV = kh; tiled: h % Hk
    const int j = bx * cpb + cl;
    const bool col = cl < cpb && j < dv;
    const int kd = Hk * dk, Cc = 2 * kd + Hv * dv;
    float* sh = state + (size_t)h * dk * dv;
    dnc_pdl_launch();
    const float nwj = col ? nw[j] : 0.f;  // weights: no kernel writes them
    const float dth = dt[h], sah = sa[h];
    dnc_pdl_wait();  // the row, a, b and z are the previous kernel's; the state an earlier one's
    float s[DNC_RPG];  // column j's rows g + STEP_LANES r, first: in flight during the conv
#pragma unroll
    for (int r = 0; r < DNC_RPG; ++r) {
        const int i = g + STEP_LANES * r;
        s[r] = col && i < dk ? sh[dnc_state_at(i, j, dk, dv)] : 0.f;
    }
    const float xg = a[h] + dth;
    const float bh = b[h];
    const float zj = col ? z[(size_t)h * dv + j] : 0.f;
    const bool writer = bx == 0 && vr == 0;  // rewrites the K head's q / k conv state
    float win[DNC_MAX_CONV];
    for (int t = tid; t < 2 * dk; t += blockDim.x) {
        const int c = t < dk ? kh * dk + t : kd + kh * dk + t - dk;
        qk[t] = dnc_conv(xr, cs, cw, c, Cc, K, win);
        if (writer) {
#pragma unroll
            for (int r = 0; r < DNC_MAX_CONV - 1; ++r)
                if (r < K - 1) sm.qk_win[r][t] = win[r + 1];
        }
    }
    float vj = 0.f, nxt = 0.f;
    if (col) {  // the v channel's only readers: its group, which writes its new state
        const int c = 2 * kd + h * dv + j;
        vj = dnc_conv(xr, cs, cw, c, Cc, K, win);
#pragma unroll
        for (int r = 0; r < DNC_MAX_CONV - 1; ++r)  // win[g + 1], constant indices
            if (r == g) nxt = win[r + 1];
    }
    __syncwarp();  // every lane of the group has read the old rows
    if (col && g < K - 1) cs[(size_t)g * Cc + 2 * kd + h * dv + j] = nxt;
    __syncthreads();  // qk complete
    // the gates (ssm_gates' expressions) and the scan's step (delta_net.cu dn_step's), a column
    // per group of STEP_LANES lanes; every lane runs the shuffles (zeros off the columns)
    const float softplus = fmaxf(xg, 0.f) + log1pf(expf(-fabsf(xg)));
    const float gt = softplus * sah;
    const float beta = 1.f / (1.f + expf(-bh));
    float sk = 0.f, sq = 0.f;
#pragma unroll
    for (int r = 0; r < DNC_RPG; ++r) {
        const int i = g + STEP_LANES * r;
        const float kv = i < dk ? qk[dk + i] : 0.f, qv = i < dk ? qk[i] : 0.f;
        sk += kv * kv;
        sq += qv * qv;
    }
    const float rk = rsqrtf(group_sum(sk) + eps);
    const float rq = rsqrtf(group_sum(sq) + eps) * rsqrtf((float)dk);
    const float decay = expf(gt);
    float pred = 0.f;  // (S^T k)_j, k not yet normalised
#pragma unroll
    for (int r = 0; r < DNC_RPG; ++r) {
        const int i = g + STEP_LANES * r;
        s[r] *= decay;
        pred += s[r] * (i < dk ? qk[dk + i] : 0.f);
    }
    pred = group_sum(pred) * rk;
    const float u = beta * (vj - pred) * rk;
    float acc = 0.f;
#pragma unroll
    for (int r = 0; r < DNC_RPG; ++r) {
        const int i = g + STEP_LANES * r;
        s[r] += (i < dk ? qk[dk + i] : 0.f) * u;
        acc += s[r] * (i < dk ? qk[i] : 0.f);
    }
    const float o = group_sum(acc) * rq;
#pragma unroll
    for (int r = 0; r < DNC_RPG; ++r) {
        const int i = g + STEP_LANES * r;
        if (col && i < dk) sh[dnc_state_at(i, j, dk, dv)] = s[r];
    }
    // the gated norm: this block's sum of squares, then the head's over its STEP_CLUSTER blocks
    float ss = col && g == 0 ? o * o : 0.f;
    ss = warp_sum(ss);
    if (lane == 0) sm.red[tid / 32] = ss;
    __syncthreads();
    if (tid == 0) {
        float p = 0.f;
        for (int w = 0; w < (int)(blockDim.x / 32); ++w) p += sm.red[w];
        sm.part = p;
    }
    dnc_cluster_sync();  // every part written; every block's reads of the old conv state done
    if (writer) {
        for (int e = tid; e < (K - 1) * 2 * dk; e += blockDim.x) {
            const int r = e / (2 * dk), t = e % (2 * dk);
            const int c = t < dk ? kh * dk + t : kd + kh * dk + t - dk;
            cs[(size_t)r * Cc + c] = sm.qk_win[r][t];
        }
    }
    float tot = 0.f;
#pragma unroll
    for (int x = 0; x < STEP_CLUSTER; ++x) tot += dnc_dsmem_ld(&sm.part, vr * STEP_CLUSTER + x);
    dnc_cluster_arrive();  // done with the others' parts
    const float scale = rsqrtf(tot / (float)dv + eps);
    if (col && g == 0) {
        const float on = o * scale * nwj;
        y[(size_t)h * dv + j] = zj / (1.f + expf(-zj)) * on;
    }
    dnc_cluster_wait();  // no block leaves while another may read its part
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ < 900  // no clusters: built, never launched (the
#undef __cluster_dims__                             // host checks the device), so a config
#define __cluster_dims__(...)                       // with the knob still loads everywhere
#endif
// (one kernel per RV written out: tests/cuda_fake.py reads the signatures)
extern "C" __global__ void __launch_bounds__(DNC_THREADS) __cluster_dims__(STEP_CLUSTER, 1, 1)
    dn_clu_r1(const float* __restrict__ xr, float* cs, const float* __restrict__ cw, int K,
              const float* __restrict__ a, const float* __restrict__ b,
              const float* __restrict__ dt, const float* __restrict__ sa, float* state,
              const float* __restrict__ nw, const float* __restrict__ z, float* __restrict__ y,
              int Hk, int Hv, int dk, int dv, int grouped, float eps) {
    dn_clu_body<1>(xr, cs, cw, K, a, b, dt, sa, state, nw, z, y, Hk, Hv, dk, dv, grouped, eps);
}
extern "C" __global__ void __launch_bounds__(DNC_THREADS) __cluster_dims__(STEP_CLUSTER, 2, 1)
    dn_clu_r2(const float* __restrict__ xr, float* cs, const float* __restrict__ cw, int K,
              const float* __restrict__ a, const float* __restrict__ b,
              const float* __restrict__ dt, const float* __restrict__ sa, float* state,
              const float* __restrict__ nw, const float* __restrict__ z, float* __restrict__ y,
              int Hk, int Hv, int dk, int dv, int grouped, float eps) {
    dn_clu_body<2>(xr, cs, cw, K, a, b, dt, sa, state, nw, z, y, Hk, Hv, dk, dv, grouped, eps);
}
#if STEP_CLUSTER <= 2  // a portable cluster: at most 8 blocks
extern "C" __global__ void __launch_bounds__(DNC_THREADS) __cluster_dims__(STEP_CLUSTER, 4, 1)
    dn_clu_r4(const float* __restrict__ xr, float* cs, const float* __restrict__ cw, int K,
              const float* __restrict__ a, const float* __restrict__ b,
              const float* __restrict__ dt, const float* __restrict__ sa, float* state,
              const float* __restrict__ nw, const float* __restrict__ z, float* __restrict__ y,
              int Hk, int Hv, int dk, int dv, int grouped, float eps) {
    dn_clu_body<4>(xr, cs, cw, K, a, b, dt, sa, state, nw, z, y, Hk, Hv, dk, dv, grouped, eps);
}
#endif
