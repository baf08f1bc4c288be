// moe_dec.cu: a decode token's MoE FFN (router, routed experts, shared expert, residual) in three
// launches instead of fifteen (moe_experts.fuse_decode; engine/backends/cuda/moe_dec.py). At
// decode a 35B-A3B-like model reads ~15 MB of experts per layer: the op-by-op schedule's
// launches, not the bytes, are what a token waits on.
//
//   moe_dec_route     logits[t, e] = Wr[e] . x[t] (e < E) and the shared expert's gate logit
//                     logits[t, E] = Ws[0] . x[t]; the token's last block (a ticket) then runs
//                     the top-k + renormalised softmax on them (topk.cuh) -> ids, w.
//   moe_dec_gate_up   h[t, j] = silu(G_e x[t]) * (U_e x[t]) for the k chosen experts e = ids[t, j]
//                     (only their rows are read) and, as slot k, the shared expert's.
//   moe_dec_down      out[t] = r[t] + (sum_j w[t, j] D_e h[t, j] + sigmoid(logits[t, E]) *
//                     Dshared h[t, k]): the down projections, the weighted combine, the gated
//                     shared expert and the residual add, in the op-by-op schedule's order.
// Knob variants (moe_experts.*, engine/tuning/variants/cuda_hybrid.py): route_vec (float4 router
// rows), topk_regs (the last block's top-k on logits held in registers, topk.cuh), route_block
// (moe_dec_route_r: a block per router row), down_wsum (moe_dec_down_w: a weighted sum per lane),
// down_split (moe_dec_down_s: a warp per expert slot), down_vec1, fuse_norm (the *_norm tails),
// gate_up_pair (moe_dec_gate_up_p), fuse_pre_norm (moe_dec_route_rn), dec_wide (qwide.cuh:
// 16-byte loads of Q4_K / Q6_K groups), l2_prefetch (gate_up brings the down matrices into
// L2), split_occupancy (moe_dec_down_s9: down_s built for 3 blocks an SM).
// Float activations throughout (the order_only class, as moe.cu): each row's dot product is a
// thread-row of THREADS_PER_ROW threads over 16-weight groups, VEC per step, then the row's reduction, as in
// dmmv.cu, so the knobs of moe_experts.dmmv (ROWS_PER_BLOCK, THREADS_PER_ROW, VEC) tune these kernels too. Weight
// types are runtime arguments (GGML ids, common.cuh QT_*): the routed and the shared experts
// may differ (Q4_K_M gives some layers' ffn_down_exps Q6_K, never the shared expert's).
#include "common.cuh"

// moe_experts.dec_wide (set by the host's modules_for): DEC_WIDE 1 decodes Q4_K / Q6_K groups
// through 16-byte loads (qwide.cuh dec_row_group). Each knob's registry default is stated here,
// in the file the knob builds (test_knob_bindings), though qwide.cuh defaults them alike.
#ifndef DEC_WIDE
#define DEC_WIDE 0
#endif
// moe_experts.dec_fcvt (set by the host too): DEC_FCVT 1 runs qwide.cuh's run_dot_x (signed
// bytes to floats by a byte permute and an FADD, not I2F) where 0 runs common.cuh's run_dot
#ifndef DEC_FCVT
#define DEC_FCVT 0
#endif
#include "qwide.cuh"
// DEC_WIDE 1: every kernel's groups wide; 2: only the split and weighted-sum down kernels'
// (moe_dec_down_s*, moe_dec_down_w: a group of each row a lane, where gate_up's lanes walk
// several groups and the header's byte extraction costs more than the loads it saves)
constexpr bool kWideUp = DEC_WIDE == 1, kWideDown = DEC_WIDE != 0;
#include "topk.cuh"

#if !defined(ROWS_PER_BLOCK) || !defined(THREADS_PER_ROW) || !defined(VEC)
#error "moe_dec.cu needs ROWS_PER_BLOCK, THREADS_PER_ROW and VEC (engine/tuning/variants/cuda_hybrid.py)"
#endif

#define RENORM true

#define MAXR 12  // rows one thread-row dots at once: k routed experts + the shared one (host)

// The thread-row helpers (QT_SWITCH, dot_rows, f32_row_x4, row_sum, row_of_thread, NT):
#include "moe_dec_rows.cuh"

// The route's last block (a ticket: every logit of token t written): the top-k + renormalised
// softmax of the token's logits by its first warp, then the ticket reset.
__device__ __forceinline__ void route_topk(float* logits, int ldl, int E, int k,
                                           int* __restrict__ ids, float* __restrict__ w, int t,
                                           unsigned int* tickets, int topk_regs) {
    __threadfence();
    if (threadIdx.x < 32) {
        if (topk_regs)  // moe_experts.topk_regs: the logits into registers once
            topk_row_regs(logits + (size_t)t * ldl, E, k, ids + (size_t)t * k,
                          w + (size_t)t * k, threadIdx.x, RENORM);
        else
            topk_row(logits + (size_t)t * ldl, E, k, ids + (size_t)t * k, w + (size_t)t * k,
                     threadIdx.x, RENORM);
    }
    if (threadIdx.x == 0) tickets[t] = 0;  // ready for the next launch (graph replay)
}

// x [T, K]; Wr [E, K] (type qr, rows of rb_r bytes); Ws [1, K] (type qs) or null (no shared
// expert gate); logits [T, ldl] (ldl >= E + 1); ids, w [T, k]; tickets [T] zero between launches;
// vec4: moe_experts.route_vec (f32_row_x4 for F32 rows); topk_regs: moe_experts.topk_regs.
// Grid (ceil((E + 1) / ROWS_PER_BLOCK), T), block NT.
extern "C" __global__ void __launch_bounds__(NT)
    moe_dec_route(const float* __restrict__ x, const u8* __restrict__ Wr, int rb_r, int qr,
                  const u8* __restrict__ Ws, int qs, int E, int K, float* logits, int ldl,
                  int* __restrict__ ids, float* __restrict__ w, int k,
                  unsigned int* tickets, int vec4, int topk_regs) {
    __shared__ float red[RED_N];
    __shared__ bool last;
    pdl_start();
    const int t = blockIdx.y, lane = threadIdx.x % THREADS_PER_ROW;
    const int n = row_of_thread();
    const float* xt = x + (size_t)t * K;
    float v[MAXR] = {0.f};
    const u8* row[1] = {n < E ? Wr + (size_t)n * rb_r : Ws};
    if (n < E || (n == E && Ws)) {
        const int qt = n < E ? qr : qs;
        if (vec4 && qt == QT_F32 && (K & 3) == 0 && ((size_t)row[0] & 15) == 0 &&
            ((size_t)xt & 15) == 0)
            v[0] = f32_row_x4((const float*)row[0], xt, K, lane);
        else
            dot_rows_rt(qt, row, &xt, 1, K, lane, v);
    }
    v[0] = row_sum(v[0], red);
    if (lane == 0 && n <= E) {
        logits[(size_t)t * ldl + n] = v[0];
        __threadfence();  // visible device-wide before the block's ticket
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();  // this block's logits are visible before the ticket says so
        last = atomicAdd(tickets + t, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    route_topk(logits, ldl, E, k, ids, w, t, tickets, topk_regs);
}

// moe_experts.route_block: the route with one router row per block of blockDim.x threads
// (128 or 256), a lane's float4 loads of its row and of x (K / 4 / blockDim.x each: 4 or 2 for
// a 2048-wide row) in flight together, a block sum; E (+ 1) blocks, so the whole router's rows
// are loading at once where moe_dec_route's ceil((E + 1) / ROWS_PER_BLOCK) blocks walk theirs in batches.
// The grid's last block (ticket) runs the top-k (topk_regs as in moe_dec_route). F32 router
// and shared gate rows, K % 4 == 0, 16-byte aligned (the host checks; else moe_dec_route).
// NORM (moe_dec_route_rn, moe_experts.fuse_pre_norm): x is the residual row y and every block
// first takes its RMSNorm scale (norm_decode.cu rms_norm_row's sums in its order: the same
// scale at the same thread count), then dots its row with h = y * scale * nw, which block 0
// also stores for gate_up: the post-attention norm's launch folded into the route.
// Grid (E + (Ws ? 1 : 0), T), block 128 or 256.
template <bool NORM>
__device__ __forceinline__ void route_row(const float* __restrict__ x,
                                          const float* __restrict__ nw, float eps,
                                          float* __restrict__ hout, const u8* __restrict__ Wr,
                                          int rb_r, const u8* __restrict__ Ws, int E, int K,
                                          float* logits, int ldl, int* __restrict__ ids,
                                          float* __restrict__ w, int k, unsigned int* tickets,
                                          int topk_regs) {
    __shared__ float part[8];
    __shared__ bool last;
    const int n = blockIdx.x, t = blockIdx.y, nt = blockDim.x;
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
    const float4* w4 = (const float4*)(n < E ? Wr + (size_t)n * rb_r : Ws);
    const float4* x4 = (const float4*)(x + (size_t)t * K);
    const int K4 = K >> 2;
    // The first batch of the row's weights (all of a 2048-wide row at 128 threads) and of the
    // norm's weights in flight before the PDL wait (read-only: under matmul_decode.pdl their
    // wait overlaps the previous grid's tail) and before the norm's loads and barriers, then
    // the first batch of x, from which the norm's sums start; the dot loop's first step uses
    // them all: the same loads and sums as a loop that loads each as it comes.
    const float4 z4 = make_float4(0.f, 0.f, 0.f, 0.f);
    const float4* n4 = (const float4*)nw;
    float4 w0[4], x0[4], n0[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
        const int c = threadIdx.x + u * nt;
        w0[u] = c < K4 ? __ldg(w4 + c) : z4;
        if constexpr (NORM) n0[u] = c < K4 ? __ldg(n4 + c) : z4;
    }
    pdl_start();
    if constexpr (NORM) {
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int c = threadIdx.x + u * nt;
            x0[u] = c < K4 ? x4[c] : z4;
        }
    }
    float scale = 1.f;
    if constexpr (NORM) {  // rms_norm_row's sum of squares, its order
        float ss = 0.f;
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            if (threadIdx.x + u * nt < K4) {
                const float4 v = x0[u];
                ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
        }
        for (int i = threadIdx.x + 4 * nt; i < K4; i += nt) {
            const float4 v = x4[i];
            ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
        }
        ss = warp_sum(ss);
        if (lane == 0) part[wid] = ss;
        __syncthreads();
        ss = 0.f;
        for (int i = 0; i < nt / 32; ++i) ss += part[i];
        scale = rsqrtf(ss / (float)K + eps);
        __syncthreads();  // part is reused below
    }
    float4* h4 = NORM ? (float4*)(hout + (size_t)t * K) : nullptr;
    float s = 0.f;
    for (int c0 = threadIdx.x; c0 < K4; c0 += 4 * nt) {
        float4 wv[4], xv[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) {
            const int c = c0 + u * nt;
            const bool in = c < K4;
            const bool first = c0 == threadIdx.x;  // the batch loaded above
            wv[u] = first ? w0[u] : in ? __ldg(w4 + c) : z4;
            if constexpr (NORM) {
                const float4 a = first ? x0[u] : in ? x4[c] : z4;
                const float4 b = first ? n0[u] : in ? __ldg(n4 + c) : z4;
                xv[u] = make_float4(a.x * scale * b.x, a.y * scale * b.y, a.z * scale * b.z,
                                    a.w * scale * b.w);  // rms_norm_row's expression
                if (n == 0 && in) h4[c] = xv[u];
            } else {
                xv[u] = in ? __ldg(x4 + c) : make_float4(0.f, 0.f, 0.f, 0.f);
            }
        }
#pragma unroll
        for (int u = 0; u < 4; ++u)
            s += wv[u].x * xv[u].x + wv[u].y * xv[u].y + wv[u].z * xv[u].z + wv[u].w * xv[u].w;
    }
    s = warp_sum(s);
    if (lane == 0) part[wid] = s;
    __syncthreads();
    if (threadIdx.x == 0) {
        float v = 0.f;
        for (int i = 0; i < nt / 32; ++i) v += part[i];
        logits[(size_t)t * ldl + n] = v;
        __threadfence();  // this block's logit is visible before the ticket says so
        last = atomicAdd(tickets + t, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    route_topk(logits, ldl, E, k, ids, w, t, tickets, topk_regs);
}

extern "C" __global__ void __launch_bounds__(256)
    moe_dec_route_r(const float* __restrict__ x, const u8* __restrict__ Wr, int rb_r,
                    const u8* __restrict__ Ws, int E, int K, float* logits, int ldl,
                    int* __restrict__ ids, float* __restrict__ w, int k, unsigned int* tickets,
                    int topk_regs) {
    route_row<false>(x, nullptr, 0.f, nullptr, Wr, rb_r, Ws, E, K, logits, ldl, ids, w, k,
                     tickets, topk_regs);
}

// y [T, K] the residual stream, nw [K] its norm's weights -> hout [T, K] = rms_norm(y) * nw
// (for gate_up), and the route of hout; the other arguments moe_dec_route_r's.
extern "C" __global__ void __launch_bounds__(256)
    moe_dec_route_rn(const float* __restrict__ y, const float* __restrict__ nw, float eps,
                     float* __restrict__ hout, const u8* __restrict__ Wr, int rb_r,
                     const u8* __restrict__ Ws, int E, int K, float* logits, int ldl,
                     int* __restrict__ ids, float* __restrict__ w, int k, unsigned int* tickets,
                     int topk_regs) {
    route_row<true>(y, nw, eps, hout, Wr, rb_r, Ws, E, K, logits, ldl, ids, w, k, tickets,
                    topk_regs);
}

// moe_experts.gate_up_pair: dot_rows for the gate and up rows of one output, which share x:
// each group's x (four float4) loaded once for both rows, where dot_rows loads it per row (it
// cannot know two rows' x are one); fewer loads and registers in flight for the same bytes of
// weights. The same groups, in the same order, with the same expressions: sg, su are dot_rows'
// s[0], s[1] to the bit.
template <int QT, int V>
__device__ __forceinline__ void dot_pair(const u8* __restrict__ rg, const u8* __restrict__ ru,
                                         const float* __restrict__ x, int K, int lane,
                                         float& sg, float& su) {
    if constexpr (QT == QT_F32 || QT == QT_F16 || QT == QT_BF16) {
        for (int kk = lane; kk < K; kk += THREADS_PER_ROW) {
            const float xv = __ldg(x + kk);
            sg += dense_get<QT>(rg, kk) * xv;
            su += dense_get<QT>(ru, kk) * xv;
        }
    } else {
        const int NG = K / 16;
        for (int g0 = lane * V; g0 < NG; g0 += THREADS_PER_ROW * V) {
#pragma unroll
            for (int jv = 0; jv < V; ++jv) {
                const int g = g0 + jv;
                if (g < NG) {
                    Run8 a, b, c, d;
                    int k0, k1;
                    dec_row_group<QT, kWideUp>(rg, g, a, b, k0, k1);
                    dec_row_group<QT, kWideUp>(ru, g, c, d, k0, k1);
                    const float4* x0 = (const float4*)(x + k0);
                    const float4* x1 = (const float4*)(x + k1);
                    const float4 xa = __ldg(x0), xb = __ldg(x0 + 1);
                    const float4 xc = __ldg(x1), xd = __ldg(x1 + 1);
                    sg += dec_run_dot(a, xa, xb) + dec_run_dot(b, xc, xd);
                    su += dec_run_dot(c, xa, xb) + dec_run_dot(d, xc, xd);
                }
            }
        }
    }
}

__device__ __forceinline__ void dot_pair_rt(int qt, const u8* rg, const u8* ru, const float* x,
                                            int K, int lane, float& sg, float& su) {
#define DP(Q) dot_pair<Q, VEC>(rg, ru, x, K, lane, sg, su)
    QT_SWITCH(qt, DP)
#undef DP
}

// moe_experts.l2_prefetch: this block's share of the bytes [base, base + bytes) into L2, a
// 128-byte line per thread per step (prefetch.global.L2: a hint, no registers held, nothing
// waits on it). The gate_up grid's ceil(F / ROWS_PER_BLOCK) blocks of slot j split the down matrix that
// slot's down pass reads, so the down kernel's loads meet L2, not device memory: gate_up,
// latency-bound at ~0.7 TB/s, has the bandwidth to spare.
__device__ __forceinline__ void l2_prefetch_share(const u8* base, size_t bytes, int part,
                                                  int nparts) {
    const size_t chunk = ((bytes + nparts - 1) / nparts + 127) & ~(size_t)127;
    const size_t lo = (size_t)part * chunk, hi = min(bytes, lo + chunk);
    for (size_t o = lo + (size_t)threadIdx.x * 128; o < hi; o += (size_t)blockDim.x * 128)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(base + o));
}

// Slot j's down matrix: D [E, C, F] expert ids[j]'s C rows of rb_d bytes (contiguous), or the
// shared expert's SD [C, Fs] for slot k (SD null: none). C = gate_up's K.
__device__ __forceinline__ void prefetch_down(const u8* D, int rb_d, const u8* SD, int rb_sd,
                                              int C, int E, const int* it, int k, int j) {
    if (j < k) {
        const int e = min(max(it[j], 0), E - 1);
        l2_prefetch_share(D + (size_t)e * C * rb_d, (size_t)C * rb_d, blockIdx.x, gridDim.x);
    } else if (SD) {
        l2_prefetch_share(SD, (size_t)C * rb_sd, blockIdx.x, gridDim.x);
    }
}

// PAIR (moe_experts.gate_up_pair, moe_dec_gate_up_p): dot_pair, x loaded once for gate and up;
// else dot_rows over the two rows.
template <bool PAIR>
__device__ __forceinline__ void gate_up_body(const float* __restrict__ x, const u8* __restrict__ G,
                                             const u8* __restrict__ U, int rb_e, int qe, int F,
                                             int E, const int* __restrict__ ids, int k,
                                             const u8* __restrict__ SG, const u8* __restrict__ SU,
                                             int rb_s, int qsh, int Fs, int K,
                                             float* __restrict__ h, int ldh, const u8* D,
                                             int rb_d, const u8* SD, int rb_sd) {
    __shared__ float red[RED_N];
    pdl_start();
    const int j = blockIdx.y, t = blockIdx.z, lane = threadIdx.x % THREADS_PER_ROW;
    const int n = row_of_thread();
    const bool shared = j == k;
    const int N = shared ? Fs : F;
    const float* xt = PAIR ? nullptr : x + (size_t)t * K;  // PAIR: at its call, as it was
    if (D) prefetch_down(D, rb_d, SD, rb_sd, K, E, ids + (size_t)t * k, k, j);
    float sg = 0.f, su = 0.f;  // PAIR's sums (scalars: its registers)
    float s[MAXR] = {0.f};     // dot_rows' (s[0] gate, s[1] up)
    if (n < N) {
        const u8 *rg, *ru;
        if (shared) {
            rg = SG + (size_t)n * rb_s;
            ru = SU + (size_t)n * rb_s;
        } else {
            const int e = min(max(ids[(size_t)t * k + j], 0), E - 1);  // a corrupt id: no fault
            rg = G + ((size_t)e * F + n) * rb_e;
            ru = U + ((size_t)e * F + n) * rb_e;
        }
        if constexpr (PAIR) {
            dot_pair_rt(shared ? qsh : qe, rg, ru, x + (size_t)t * K, K, lane, sg, su);
        } else {
            const u8* rows[2] = {rg, ru};
            const float* xs[2] = {xt, xt};
            dot_rows_rt(shared ? qsh : qe, rows, xs, 2, K, lane, s);
        }
    }
    const float g = row_sum(PAIR ? sg : s[0], red), u = row_sum(PAIR ? su : s[1], red);
    if (lane == 0 && n < N) h[((size_t)t * (k + 1) + j) * ldh + n] = g / (1.f + expf(-g)) * u;
}

// x [T, K]; G, U [E, F, K] (type qe, rows of rb_e bytes): the routed experts' gate and up;
// SG, SU [Fs, K] (type qsh, rows of rb_s) or null: the shared expert's; ids [T, k] ->
// h [T, k + 1, ldh] (slot k: the shared expert). D (rows of rb_d), SD (rb_sd): the down
// matrices moe_experts.l2_prefetch brings into L2 (D null: no prefetch). Grid
// (ceil(max(F, Fs) / ROWS_PER_BLOCK), k + shared, T).
#define MOE_DEC_GATE_UP_KERNEL(name, PAIR)                                                      \
    extern "C" __global__ void __launch_bounds__(NT)                                            \
        moe_dec_##name(const float* __restrict__ x, const u8* __restrict__ G,                   \
                       const u8* __restrict__ U, int rb_e, int qe, int F, int E,                \
                       const int* __restrict__ ids, int k, const u8* __restrict__ SG,           \
                       const u8* __restrict__ SU, int rb_s, int qsh, int Fs, int K,             \
                       float* __restrict__ h, int ldh, const u8* D, int rb_d, const u8* SD,     \
                       int rb_sd) {                                                             \
        gate_up_body<PAIR>(x, G, U, rb_e, qe, F, E, ids, k, SG, SU, rb_s, qsh, Fs, K, h, ldh, D, \
                           rb_d, SD, rb_sd);                                                    \
    }

MOE_DEC_GATE_UP_KERNEL(gate_up, false)
MOE_DEC_GATE_UP_KERNEL(gate_up_p, true)

// The down kernels' parameters: moe_dec_<name> with ATTRS (its launch bounds),
// the body after the macro. _NORM: and the fuse_norm tail's nw, eps, hn, tickets (out then not
// __restrict__: the tail reads it back). Each list written out: tests/cuda_fake.py reads the
// kernels' signatures from these macros' text.
#define MOE_DEC_DOWN_KERNEL(name, ATTRS)                                                   \
    extern "C" __global__ void ATTRS                                                       \
        moe_dec_##name(const float* __restrict__ h, int ldh, const u8* __restrict__ D, int rb_e, int qe,  \
                         int F, int E, const int* __restrict__ ids, const float* __restrict__ w, \
                         int k, const u8* __restrict__ SD, int rb_s, int qsh, int Fs,            \
                         const float* __restrict__ logits, int ldl, const float* __restrict__ r, \
                         float* __restrict__ out, int C)
#define MOE_DEC_DOWN_NORM_KERNEL(name, ATTRS)                                              \
    extern "C" __global__ void ATTRS                                                       \
        moe_dec_##name(const float* __restrict__ h, int ldh, const u8* __restrict__ D, int rb_e, int qe,  \
                         int F, int E, const int* __restrict__ ids, const float* __restrict__ w, \
                         int k, const u8* __restrict__ SD, int rb_s, int qsh, int Fs,            \
                         const float* __restrict__ logits, int ldl, const float* __restrict__ r, \
                         float* out, int C, const float* __restrict__ nw, float eps,             \
                         float* __restrict__ hn, unsigned int* tickets)

// h [T, k + 1, ldh]; D [E, C, F] (type qe, rows of rb_e); SD [C, Fs] (type qsh, rows of rb_s)
// or null; ids, w [T, k]; logits [T, ldl] (column E: the shared expert's gate logit); r, out
// [T, C]. Grid (ceil(C / ROWS_PER_BLOCK), T). V: groups per lane per step of the routed rows (VEC, or 1
// in moe_dec_down_v1: moe_experts.down_vec1, a kernel of its own so the default's registers are
// its own too).
template <int V>
__device__ __forceinline__ void down_body(const float* __restrict__ h, int ldh,
                                          const u8* __restrict__ D, int rb_e, int qe, int F,
                                          int E, const int* __restrict__ ids,
                                          const float* __restrict__ w, int k,
                                          const u8* __restrict__ SD, int rb_s, int qsh, int Fs,
                                          const float* __restrict__ logits, int ldl,
                                          const float* __restrict__ r, float* __restrict__ out,
                                          int C, float* red) {
    const int t = blockIdx.y, lane = threadIdx.x % THREADS_PER_ROW;
    const int c = row_of_thread();
    const float* ht = h + (size_t)t * (k + 1) * ldh;
    // fold: the shared expert is row k of the same dot_rows call (same type and width)
    const bool fold = SD && qsh == qe && Fs == F;
    const int nr = k + (fold ? 1 : 0);
    float s[MAXR] = {0.f}, sh[MAXR] = {0.f};
    if (c < C) {
        const u8* rows[MAXR];
        const float* xs[MAXR];
#pragma unroll
        for (int j = 0; j < MAXR; ++j) {
            if (j < k) {
                const int e = min(max(ids[(size_t)t * k + j], 0), E - 1);
                rows[j] = D + ((size_t)e * C + c) * rb_e;
            } else {
                rows[j] = SD + (size_t)c * rb_s;  // only read as row k when folded
            }
            xs[j] = ht + (size_t)j * ldh;
        }
        dot_rows_rt<V>(qe, rows, xs, nr, F, lane, s);
        if (SD && !fold) {
            const u8* srow[1] = {SD + (size_t)c * rb_s};
            const float* sx[1] = {ht + (size_t)k * ldh};
            dot_rows_rt(qsh, srow, sx, 1, Fs, lane, sh);
        }
    }
    float acc = 0.f;  // moe_combine's sum, in its order
#pragma unroll
    for (int j = 0; j < MAXR; ++j) {
        if (j < k) {
            const float v = row_sum(s[j], red);
            acc += w[(size_t)t * k + j] * v;
        }
    }
    float y = acc;
    if (SD) {
        float sv = sh[0];
#pragma unroll
        for (int j = 0; j < MAXR; ++j)  // s[k], indexed by a constant (registers)
            if (fold && j == k) sv = s[j];
        const float v = row_sum(sv, red);
        y = acc + v / (1.f + expf(-logits[(size_t)t * ldl + E]));  // sigmoid_mul, then add
    }
    if (lane == 0 && c < C) out[(size_t)t * C + c] = r[(size_t)t * C + c] + y;
}

MOE_DEC_DOWN_KERNEL(down, __launch_bounds__(NT)) {
    __shared__ float red[RED_N];
    pdl_start();
    down_body<VEC>(h, ldh, D, rb_e, qe, F, E, ids, w, k, SD, rb_s, qsh, Fs, logits, ldl, r, out, C,
                  red);
}

MOE_DEC_DOWN_KERNEL(down_v1, __launch_bounds__(NT)) {
    __shared__ float red[RED_N];
    pdl_start();
    down_body<1>(h, ldh, D, rb_e, qe, F, E, ids, w, k, SD, rb_s, qsh, Fs, logits, ldl, r, out, C,
                red);
}

// moe_experts.fuse_norm: moe_dec_down (or _v1) and then the next layer's input norm of the new
// residual row: the token's last block to finish its outputs (a ticket per token, reset by it)
// normalises out[t] by nw into hn[t] with all its threads (a warp alone walking a 2048-4096
// row is latency-bound: ~10 us on the H200, elementwise.cu rms_norm's cost at decode).
// tickets [T] zero between launches.
__device__ __forceinline__ void down_norm_tail(const float* out, const float* __restrict__ nw,
                                               float eps, float* __restrict__ hn, int C,
                                               unsigned int* tickets) {
    __shared__ bool last;
    __shared__ float part[32];
    // nt: blockDim.x (NT for the thread-row kernels, 32 (k + 1) for moe_dec_down_s)
    const int t = blockIdx.y, lane = threadIdx.x & 31, wid = threadIdx.x / 32, nt = blockDim.x;
    __threadfence();  // this thread's outputs visible device-wide before the ticket
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(tickets + t, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    // The row's values of this thread (i = threadIdx.x + r nt) into registers with all their
    // loads in flight (and nw's), then the rest of a row longer than NV nt in a loop: each
    // thread still sums its values in increasing i, as a plain loop would, where a plain
    // loop waited on L2 every few values (16 values a thread at nt 128 and C 2048).
    constexpr int NV = 16;
    const float* xr = out + (size_t)t * C;
    float v[NV], wv[NV];
#pragma unroll
    for (int r = 0; r < NV; ++r) {
        const int i = threadIdx.x + r * nt;
        v[r] = i < C ? __ldcg(xr + i) : 0.f;
        wv[r] = i < C ? __ldg(nw + i) : 0.f;
    }
    float s = 0.f;
#pragma unroll
    for (int r = 0; r < NV; ++r)
        if (threadIdx.x + r * nt < C) s += v[r] * v[r];
    for (int i = threadIdx.x + NV * nt; i < C; i += nt) {
        const float x = __ldcg(xr + i);
        s += x * x;
    }
    s = warp_sum(s);
    if (lane == 0) part[wid] = s;
    __syncthreads();
    s = 0.f;
    for (int i = 0; i < nt / 32; ++i) s += part[i];
    const float scale = rsqrtf(s / (float)C + eps);
    float* yr = hn + (size_t)t * C;
#pragma unroll
    for (int r = 0; r < NV; ++r) {
        const int i = threadIdx.x + r * nt;
        if (i < C) yr[i] = v[r] * scale * wv[r];
    }
    for (int i = threadIdx.x + NV * nt; i < C; i += nt) yr[i] = __ldcg(xr + i) * scale * nw[i];
    if (threadIdx.x == 0) tickets[t] = 0;  // ready for the next launch (graph replay)
}

MOE_DEC_DOWN_NORM_KERNEL(down_norm, __launch_bounds__(NT)) {
    __shared__ float red[RED_N];
    pdl_start();
    down_body<VEC>(h, ldh, D, rb_e, qe, F, E, ids, w, k, SD, rb_s, qsh, Fs, logits, ldl, r, out, C,
                   red);
    down_norm_tail(out, nw, eps, hn, C, tickets);
}

MOE_DEC_DOWN_NORM_KERNEL(down_v1_norm, __launch_bounds__(NT)) {
    __shared__ float red[RED_N];
    pdl_start();
    down_body<1>(h, ldh, D, rb_e, qe, F, E, ids, w, k, SD, rb_s, qsh, Fs, logits, ldl, r, out, C,
                 red);
    down_norm_tail(out, nw, eps, hn, C, tickets);
}

// moe_experts.down_wsum: the down kernel as a weighted sum per lane. A thread-row (THREADS_PER_ROW lanes)
// owns output c; each lane accumulates w_j * (its groups of D_{e_j}[c] . h_j) over the k routed
// experts (j unrolled by four: their loads in flight together) and sigmoid(shared logit) *
// (its groups of the shared expert's row . h_k), then one reduction per output, where
// moe_dec_down reduces each expert's row apart and keeps k + 1 rows' decodes in registers.
// Another summation order (order_only). nw null: no norm tail; else moe_experts.fuse_norm's.
template <int QT>
__device__ __forceinline__ float row_dot(const u8* __restrict__ row, const float* __restrict__ x,
                                         int K, int lane) {
    float p = 0.f;
    if constexpr (QT == QT_F32 || QT == QT_F16 || QT == QT_BF16) {
        for (int kk = lane; kk < K; kk += THREADS_PER_ROW) p += dense_get<QT>(row, kk) * __ldg(x + kk);
    } else {
        for (int g = lane; g < K / 16; g += THREADS_PER_ROW) {
            Run8 a, b;
            int k0, k1;
            dec_row_group<QT, kWideDown>(row, g, a, b, k0, k1);
            const float4* x0 = (const float4*)(x + k0);
            const float4* x1 = (const float4*)(x + k1);
            p += dec_run_dot(a, __ldg(x0), __ldg(x0 + 1)) +
                 dec_run_dot(b, __ldg(x1), __ldg(x1 + 1));
        }
    }
    return p;
}

template <int QT>
__device__ __forceinline__ float routed_wsum(const float* __restrict__ ht, int ldh,
                                             const u8* __restrict__ D, int rb_e, int F, int E,
                                             const int* __restrict__ ids,
                                             const float* __restrict__ w, int k, int C, int c,
                                             int lane) {
    float acc = 0.f;
#pragma unroll 4
    for (int j = 0; j < k; ++j) {
        const int e = min(max(__ldg(ids + j), 0), E - 1);  // a corrupt id: no fault
        acc += __ldg(w + j) * row_dot<QT>(D + ((size_t)e * C + c) * rb_e, ht + (size_t)j * ldh,
                                          F, lane);
    }
    return acc;
}

__device__ __forceinline__ float row_dot_rt(int qt, const u8* row, const float* x, int K,
                                            int lane) {
#define RD(Q) return row_dot<Q>(row, x, K, lane)
    QT_SWITCH(qt, RD)
#undef RD
}

MOE_DEC_DOWN_NORM_KERNEL(down_w, __launch_bounds__(NT)) {
    __shared__ float red[RED_N];
    pdl_start();
    const int t = blockIdx.y, lane = threadIdx.x % THREADS_PER_ROW;
    const int c = row_of_thread();
    const float* ht = h + (size_t)t * (k + 1) * ldh;
    const int* it = ids + (size_t)t * k;
    const float* wt = w + (size_t)t * k;
    float v = 0.f;
    if (c < C) {
#define RW(Q) v = routed_wsum<Q>(ht, ldh, D, rb_e, F, E, it, wt, k, C, c, lane)
        QT_SWITCH(qe, RW)
#undef RW
        if (SD) {
            const float sg = 1.f / (1.f + expf(-logits[(size_t)t * ldl + E]));
            v += sg * row_dot_rt(qsh, SD + (size_t)c * rb_s, ht + (size_t)k * ldh, Fs, lane);
        }
    }
    v = row_sum(v, red);
    if (lane == 0 && c < C) out[(size_t)t * C + c] = r[(size_t)t * C + c] + v;
    if (nw) down_norm_tail(out, nw, eps, hn, C, tickets);
}

// moe_experts.down_split: the down kernel with a warp per expert slot. A block owns ROWS_PER_BLOCK
// consecutive outputs and has k (+ 1: the shared expert) warps; warp j walks slot j's ROWS_PER_BLOCK down
// rows (expert ids[j]'s, or the shared expert's as slot k), lane l over groups l, l + 32, ...,
// the ROWS_PER_BLOCK rows' loads of a group in flight together, then a warp sum per row into shared
// memory; the block's first ROWS_PER_BLOCK threads combine them (w_j in slot order, the sigmoid-gated
// shared expert, the residual: moe_dec_down's expressions). moe_dec_down's thread-row holds all
// k + 1 rows of one output (their decodes at once, spilling on sm_90); here 9x the threads each
// hold one group of ROWS_PER_BLOCK rows: a token's down pass waits on about one batch of loads. With
// F / 16 <= 32 (a 35B-A3B's 512) and threads_per_row 32 the sums are moe_dec_down_v1's, in its
// order. nw null: no norm tail; else moe_experts.fuse_norm's.
template <int QT, int R>
__device__ __forceinline__ void warp_rows(const u8* __restrict__ row0, int rb, int nr,
                                          const float* __restrict__ x, int K, int lane,
                                          float* s) {
    if constexpr (QT == QT_F32 || QT == QT_F16 || QT == QT_BF16) {
        for (int kk = lane; kk < K; kk += 32) {
            const float xv = __ldg(x + kk);
#pragma unroll
            for (int r = 0; r < R; ++r)
                if (r < nr) s[r] += dense_get<QT>(row0 + (size_t)r * rb, kk) * xv;
        }
    } else {
        const int NG = K / 16;
        const int NGW = NG;
        for (int g = lane; g < NGW; g += 32) {
            Run8 a[R], b[R];
            int k0 = 0, k1 = 0;
#pragma unroll
            for (int r = 0; r < R; ++r)
                if (r < nr)
                    dec_row_group<QT, kWideDown>(row0 + (size_t)r * rb, g, a[r], b[r], k0, k1);
            const float4* x0 = (const float4*)(x + k0);
            const float4* x1 = (const float4*)(x + k1);
            const float4 xa = __ldg(x0), xb = __ldg(x0 + 1), xc = __ldg(x1), xd = __ldg(x1 + 1);
#pragma unroll
            for (int r = 0; r < R; ++r)
                if (r < nr) s[r] += dec_run_dot(a[r], xa, xb) + dec_run_dot(b[r], xc, xd);
        }
    }
}

template <int R>
__device__ __forceinline__ void warp_rows_rt(int qt, const u8* row0, int rb, int nr,
                                             const float* x, int K, int lane, float* s) {
#define WR(Q) warp_rows<Q, R>(row0, rb, nr, x, K, lane, s)
    QT_SWITCH(qt, WR)
#undef WR
}

// Arguments: moe_dec_down_w's. Grid (ceil(C / ROWS_PER_BLOCK), T), block 32 (k + (SD ? 1 : 0)), k < MAXR.
template <int R>
__device__ __forceinline__ void down_split_body(
    const float* __restrict__ h, int ldh, const u8* __restrict__ D, int rb_e, int qe, int F,
    int E, const int* __restrict__ ids, const float* __restrict__ w, int k,
    const u8* __restrict__ SD, int rb_s, int qsh, int Fs, const float* __restrict__ logits,
    int ldl, const float* __restrict__ r, float* out, int C, const float* __restrict__ nw,
    float eps, float* __restrict__ hn, unsigned int* tickets) {
    __shared__ float part[MAXR][R];
    pdl_start();
    const int t = blockIdx.y, j = threadIdx.x / 32, lane = threadIdx.x & 31;
    const int c0 = blockIdx.x * R, nr = min(R, C - c0);
    const float* ht = h + (size_t)t * (k + 1) * ldh;
    float s[R];
#pragma unroll
    for (int i = 0; i < R; ++i) s[i] = 0.f;
    if (j < k) {
        const int e = min(max(__ldg(ids + (size_t)t * k + j), 0), E - 1);  // corrupt id: no fault
        warp_rows_rt<R>(qe, D + ((size_t)e * C + c0) * rb_e, rb_e, nr, ht + (size_t)j * ldh, F,
                     lane, s);
    } else if (SD) {
        warp_rows_rt<R>(qsh, SD + (size_t)c0 * rb_s, rb_s, nr, ht + (size_t)k * ldh, Fs, lane, s);
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const float v = warp_sum(s[i]);
        if (lane == 0) part[j][i] = v;
    }
    __syncthreads();
    if (threadIdx.x < nr) {
        const int c = c0 + threadIdx.x;
        float acc = 0.f;  // moe_combine's sum, in its order
        for (int jj = 0; jj < k; ++jj) acc += w[(size_t)t * k + jj] * part[jj][threadIdx.x];
        float y = acc;
        if (SD) y = acc + part[k][threadIdx.x] / (1.f + expf(-logits[(size_t)t * ldl + E]));
        out[(size_t)t * C + c] = r[(size_t)t * C + c] + y;
    }
    if (nw) down_norm_tail(out, nw, eps, hn, C, tickets);
}

MOE_DEC_DOWN_NORM_KERNEL(down_s, __launch_bounds__(32 * MAXR)) {
    down_split_body<ROWS_PER_BLOCK>(h, ldh, D, rb_e, qe, F, E, ids, w, k, SD, rb_s, qsh, Fs, logits, ldl, r,
                          out, C, nw, eps, hn, tickets);
}

// moe_experts.split_occupancy 3: moe_dec_down_s compiled for 3 blocks of 9 warps an SM (k +
// shared <= 9; 72 registers, no spills at rows_per_block 4) where the compiler's own count
// (80) leaves 2: a 2048-wide layer's 512 blocks (rows_per_block 4) then start 396 at once, not
// 264. The same code: bit-identical.
MOE_DEC_DOWN_NORM_KERNEL(down_s9, __launch_bounds__(32 * 9, 3)) {
    down_split_body<ROWS_PER_BLOCK>(h, ldh, D, rb_e, qe, F, E, ids, w, k, SD, rb_s, qsh, Fs, logits, ldl, r,
                          out, C, nw, eps, hn, tickets);
}

// moe_experts.split_occupancy 2: the split down with 8 outputs a block whatever rows_per_block
// (which shapes gate_up too: 8 there makes 576 blocks of 256 threads, two waves), compiled
// for 2 blocks of 9 warps an SM (112 registers, where the compiler's own 128 leave 1 and
// __launch_bounds__(288, 2) spills): a 2048-wide layer's 256 blocks in one wave on 132 SMs, a
// lane's 8 rows' loads in flight together. The same code at R = 8: moe_dec_down_s at
// rows_per_block 8 to the bit. Blocks of up to 9 warps (k + shared <= 9; the host checks).
MOE_DEC_DOWN_NORM_KERNEL(down_s9r8, __maxnreg__(112)) {
    down_split_body<8>(h, ldh, D, rb_e, qe, F, E, ids, w, k, SD, rb_s, qsh, Fs, logits, ldl, r,
                       out, C, nw, eps, hn, tickets);
}
