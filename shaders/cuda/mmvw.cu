// mmvw.cu: decode matrix-vector products on Q8_1 activations, up to three matrices per launch,
// with an added vector in the epilogue (bias or residual).
//
//   y_i[n] = sum_k W_i[n, k] x[k] + a_i[n]   (a_i optional), i < 3, x as Q8_1 (q8.cu)
//
// Variants (engine/tuning/variants/cuda/): matmul_decode.mmvw. One launch serves q, k and v (or
// gate and up) of a layer reading one quantized activation, each with its own weight type, and
// the attention-output and down projections add the residual as they store: a decode layer is
// about ten launches instead of twenty.
// Work split: a group of THREADS_PER_ROW lanes (inside one warp) walks ROWS_PER_THREAD consecutive rows; each lane takes
// every THREADS_PER_ROW-th slot of the row (vecdot.cuh: 32 weights, one 16-byte load, for Q4_K / Q6_K) and
// UNROLL slots per iteration, so UNROLL * ROWS_PER_THREAD weight loads are in flight per thread before any
// is used. The group's partial sums meet by shuffles (no shared memory, no block barrier).
// Tunables (defines): THREADS_PER_ROW threads per row (8, 16, 32), ROWS_PER_THREAD rows per thread, WARPS warps per
// block, UNROLL slots per iteration, WLOAD the K types' weight-load hint (vecdot.cuh), MIN_BLOCKS
// blocks per SM that __launch_bounds__ asks registers for (0: none), PREFETCH 1: an L2
// prefetch of the block's weight rows before pdl_start(), STAGE 1: the block's Q4_K / Q6_K rows
// copied into shared memory (one bulk copy, before pdl_start()) and read from there (the launch
// gives the dynamic shared memory). Rows per block: WARPS * (32 / THREADS_PER_ROW) * ROWS_PER_THREAD.
// SPLIT_K (split-K, knob split_k) > 1: rows with K >= SPLIT_MIN_K (knob split_min_k: the long
// rows of the down projection) are split over SPLIT_K groups of the block, each walking a range
// of the row's slots; their partial sums meet in shared memory in a fixed order
// (deterministic). Such a launch has SPLIT_K times fewer rows per block, so SPLIT_K times more
// blocks and warps streaming the same bytes: tall-skinny shapes (N 1536-3584, K 8960-18944)
// otherwise leave the SMs short of loads in flight. mmvw_qkv never splits (its K is short).
// Launch: grid nb0 + nb1 + nb2 blocks (block b < nb0 -> matrix 0, then 1, then 2), block WARPS*32.
// Types: Q4_0 Q4_1 Q5_0 Q8_0 Q4_K Q6_K (float weights use dmmv). K % 256 == 0 for the K types.
//
// Fused epilogues (host knobs matmul_decode.fuse_swiglu / fuse_norm):
//   mmvw_glu   gate and up of one activation, a block owning 32 rows of each (GLU_THREADS_PER_ROW lanes a
//              row, GLU_UNROLL slots a lane per iteration: knobs glu_threads_per_row,
//              glu_unroll): silu(g) * u and its Q8_1 block (swiglu_q8's arithmetic) written by
//              the block, no g / u in memory
//   mmvw_norm  one matrix + residual (as mmvw), then the grid's last block to finish (a ticket)
//              runs rms_norm_q8 of the whole output row: the next layer's norm, no launch
//   mmvw_qkv   q, k, v + biases (as mmvw), v stored into the KV cache, and each q / k head roped
//              (into q's output, k's cache row) by the last of its blocks to finish (a ticket
//              per head): mmvw + rope_kv in one launch (knob fuse_rope)
// WLOAD: read by vecdot.cuh's wld16 (the K types' weight loads); Q4K_WIDE (knob q4k_wide):
// vecdot.cuh's 64-weight Q4_K slot (32 qs bytes a lane per slot instead of 16); Q6K_WIDE
// (q6k_wide) its 64-weight Q6_K slot; Q4K_LEAN (knob q4k_lean): vecdot.cuh's branch-free Q4_K
// scale decode and shift-free high nibbles (the same integers, fewer instructions)
#ifndef WLOAD
#define WLOAD 0
#endif
#ifndef Q4K_WIDE
#define Q4K_WIDE 0
#endif
#ifndef Q4K_LEAN
#define Q4K_LEAN 0
#endif
#ifndef Q6K_WIDE
#define Q6K_WIDE 0
#endif
#include "q8.cuh"
#include "vecdot.cuh"

#ifndef THREADS_PER_ROW
#define THREADS_PER_ROW 32
#endif
#ifndef ROWS_PER_THREAD
#define ROWS_PER_THREAD 1
#endif
#ifndef WARPS
#define WARPS 4
#endif
#ifndef UNROLL
#define UNROLL 2
#endif

#ifndef MIN_BLOCKS
#define MIN_BLOCKS 0
#endif

#if THREADS_PER_ROW != 8 && THREADS_PER_ROW != 16 && THREADS_PER_ROW != 32
#error "THREADS_PER_ROW must be 8, 16 or 32 (a row's lanes sit inside one warp)"
#endif
#if MIN_BLOCKS > 0
#define MMVW_BOUNDS_MINB , MIN_BLOCKS
#else
#define MMVW_BOUNDS_MINB
#endif

#define MMVW_GROUPS (WARPS * 32 / THREADS_PER_ROW)

#ifndef PREFETCH
#define PREFETCH 0
#endif
// ROWS_PER_BLOCK: rows per block, MMVW_GROUPS * ROWS_PER_THREAD, computed once by the host (the registry's
// derived matmul_decode.mmvw.rows_per_block), which sizes its grids with the same value
#if !defined(ROWS_PER_BLOCK)
#error "ROWS_PER_BLOCK (rows per block) is the host's: engine/backends/cuda/kernels.py passes it"
#endif

#ifndef SPLIT_K
#define SPLIT_K 1
#endif
#ifndef SPLIT_MIN_K
#define SPLIT_MIN_K 8192
#endif
#if SPLIT_K != 1 && SPLIT_K != 2 && SPLIT_K != 4
#error "SPLIT_K must be 1, 2 or 4"
#endif
#if MMVW_GROUPS % SPLIT_K != 0
#error "SPLIT_K must divide the block's lane groups (WARPS * 32 / THREADS_PER_ROW)"
#endif
// Whether a launch on rows of K values splits them (uniform over the grid), and its rows per
// block; the host (CudaBackend._mmvw_rows_per_block) computes the same.
__device__ __forceinline__ bool mmvw_split(int K) { return SPLIT_K > 1 && K >= SPLIT_MIN_K; }
__device__ __forceinline__ int mmvw_rpb(bool split) { return split ? ROWS_PER_BLOCK / SPLIT_K : ROWS_PER_BLOCK; }

// PREFETCH: thread 0 asks the L2 for the block's weight rows [row0, row0 + rows) in one bulk
// request before pdl_start(), so under PDL (matmul_decode.pdl = 1) the weights stream in while
// the previous kernel finishes. A hint: skipped below sm_90 and for a range not 16-byte aligned.
__device__ __forceinline__ void l2_prefetch_rows(const u8* W, int rb, int N, int row0, int rows) {
#if PREFETCH && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x != 0 || row0 >= N) return;
    const u8* p = W + (size_t)row0 * rb;
    const unsigned int bytes = (unsigned int)min(rows, N - row0) * (unsigned int)rb;
    if ((((size_t)p) & 15) || (bytes & 15)) return;
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(p), "r"(bytes) : "memory");
#endif
}

#ifndef STAGE
#define STAGE 0
#endif

// STAGE: thread 0 starts one bulk copy (cp.async.bulk, the copy engine, sm_90) of the block's
// weight rows [row0, row0 + rows) into ws, completing on the mbarrier bar; issued before
// pdl_start(), so under PDL it overlaps the previous kernel. All of the block's weight bytes are
// in flight at once without holding registers. Returns (uniformly) whether the block staged:
// K types only, 16-byte aligned, within the launch's dynamic shared memory; else it reads global.
__device__ __forceinline__ bool mmvw_stage_start(const u8* W, int rb, int N, int qt, int row0,
                                                 int rows, u8* ws, unsigned long long* bar) {
#if STAGE && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if ((qt != QT_Q4_K && qt != QT_Q6_K) || row0 >= N) return false;
    const u8* p = W + (size_t)row0 * rb;
    const unsigned int bytes = (unsigned int)min(rows, N - row0) * (unsigned int)rb;
    unsigned int dyn;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn));
    if ((((size_t)p) & 15) || (bytes & 15) || bytes > dyn) return false;
    const unsigned int cb = bytes;
    if (threadIdx.x == 0) {
        const unsigned int b = (unsigned int)__cvta_generic_to_shared(bar);
        const unsigned int d = (unsigned int)__cvta_generic_to_shared(ws);
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(cb)
                     : "memory");
        asm volatile(
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
            "[%3];" ::"r"(d), "l"(p), "r"(cb), "r"(b)
            : "memory");
    }
    return true;
#else
    return false;
#endif
}

// Every thread of a staging block waits for its copy (call it uniformly, after pdl_start()).
__device__ __forceinline__ void mmvw_stage_wait(unsigned long long* bar) {
#if STAGE && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    __syncthreads();  // the barrier was initialised before anyone waits on it
    const unsigned int b = (unsigned int)__cvta_generic_to_shared(bar);
    unsigned int done = 0;
    while (!done) {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; "
            "selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(b)
            : "memory");
    }
#endif
}

#ifndef GLU_THREADS_PER_ROW
#define GLU_THREADS_PER_ROW 8
#endif
#ifndef GLU_UNROLL
#define GLU_UNROLL 4
#endif
#if GLU_THREADS_PER_ROW != 2 && GLU_THREADS_PER_ROW != 4 && GLU_THREADS_PER_ROW != 8 && GLU_THREADS_PER_ROW != 16
#error "GLU_THREADS_PER_ROW must be 2, 4, 8 or 16 (mmvw_glu's block is 64 * GLU_THREADS_PER_ROW threads)"
#endif

// mmvw_stream's x planes (stream_x): a narrow K-type slot's activations as mmvw_dot reads
// them (VD<QT>::load, bit for bit), built once per block in shared memory as planes over the
// row's ns slots: a [ns] uint4, b [ns] uint4, (da, db) [ns] float4, (oa, ob) [ns] int2 (56 bytes
// a slot). A lane's slot is then three or four conflict-free 16-byte shared loads instead of
// two half-used L1 lines and two scale loads.
__device__ __forceinline__ void xpl_store(u8* xp, int ns, int s, const XSlot& x) {
    ((uint4*)xp)[s] = x.a;
    ((uint4*)xp)[ns + s] = x.b;
    ((float4*)xp)[2 * ns + s] = make_float4(x.da.x, x.da.y, x.db.x, x.db.y);
    ((int2*)(xp + 48 * (size_t)ns))[s] = make_int2(x.oa, x.ob);
}
__device__ __forceinline__ XSlot xpl_load(const u8* xp, int ns, int s) {
    XSlot x;
    x.a = ((const uint4*)xp)[s];
    x.b = ((const uint4*)xp)[ns + s];
    const float4 d = ((const float4*)xp)[2 * ns + s];
    x.da = make_float2(d.x, d.y);
    x.db = make_float2(d.z, d.w);
    const int2 o = ((const int2*)(xp + 48 * (size_t)ns))[s];
    x.oa = o.x;
    x.ob = o.y;
    return x;
}
template <int QT, bool XS> struct XLoad {  // global activations (mmvw)
    static __device__ __forceinline__ auto get(int s, const s8* __restrict__ xq,
                                               const float2* __restrict__ xds, const u8*, int) {
        return VD<QT>::load(s, xq, xds);
    }
};
template <int QT> struct XLoad<QT, true> {  // x planes (narrow K types only)
    static __device__ __forceinline__ XSlot get(int s, const s8*, const float2*, const u8* xp,
                                                int ns) {
        return xpl_load(xp, ns, s);
    }
};

// The R dot products of rows row0.. (clamped to N - 1) by the calling group of G lanes, U
// slots per lane per iteration; every lane of the group ends with the full sums. The whole group
// calls it (the shuffles). mmvw: G, R, U = THREADS_PER_ROW, ROWS_PER_THREAD, UNROLL; mmvw_glu: GLU_THREADS_PER_ROW, 1, GLU_UNROLL.
// S: W is the block's rows staged in shared memory, row rbase first (STAGE). XS: the slots'
// activations come from x planes xp (mmvw_stream's stream_x), not xq / xds.
template <int QT, int G, int R, int U, bool S = false, bool XS = false>
__device__ __forceinline__ void mmvw_dot(const u8* __restrict__ W, int row_bytes, int N, int K,
                                         const s8* __restrict__ xq,
                                         const float2* __restrict__ xds, int row0,
                                         float (&acc)[R], int rbase = 0, int sb = 0,
                                         int se = -1, const u8* xp = nullptr) {
    const int lane = threadIdx.x % G;
    const int ns = se < 0 ? VD<QT>::slots(K) : se;  // slots [sb, ns) of the row
    const u8* rows[R];
#pragma unroll
    for (int r = 0; r < R; ++r) {
        rows[r] = W + (size_t)(min(row0 + r, N - 1) - rbase) * row_bytes;
        acc[r] = 0.f;
    }
    for (int s0 = sb + lane; s0 < ns; s0 += G * U) {
#pragma unroll
        for (int u = 0; u < U; ++u) {
            const int s = s0 + u * G;
            const bool ok = s < ns;
            const int sc = ok ? s : s0;  // a valid slot, its result dropped: straight-line code
            const auto x = XLoad<QT, XS>::get(sc, xq, xds, xp, VD<QT>::slots(K));
#pragma unroll
            for (int r = 0; r < R; ++r) {
                const float v = VD<QT>::template dot<S>(rows[r], sc, x);
                acc[r] += ok ? v : 0.f;
            }
        }
    }
    const unsigned mask =
        G == 32 ? 0xffffffffu : ((1u << G) - 1u) << ((threadIdx.x & 31) & ~(G - 1));
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int o = G / 2; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(mask, acc[r], o);
    }
}

// split (mmvw_split): SPLIT_K groups per row set, group g walks part g / (MMVW_GROUPS / SPLIT_K)
// of the slots (consecutive ranges, as even as the count allows); partials meet in shared memory,
// summed in part order by part 0's group. Every thread of the block calls it (a barrier).
template <int QT, bool S, bool XS = false>
__device__ __forceinline__ void mmvw_rows_split(const u8* __restrict__ W, int row_bytes, int N,
                                                int K, const s8* __restrict__ xq,
                                                const float2* __restrict__ xds, float* Y,
                                                const float* A, int bi,
                                                const u8* xp = nullptr) {
    constexpr int RG = MMVW_GROUPS / SPLIT_K;  // row groups per block
    __shared__ float part[SPLIT_K > 1 ? MMVW_GROUPS * ROWS_PER_THREAD : 1];
    const int g = threadIdx.x / THREADS_PER_ROW, lane = threadIdx.x % THREADS_PER_ROW;
    const int rg = g % RG, kp = g / RG;
    const int row0 = (bi * RG + rg) * ROWS_PER_THREAD;  // past N: clamped reads, nothing stored
    const int ns = VD<QT>::slots(K);
    const int per = (ns + SPLIT_K - 1) / SPLIT_K;  // any cut is exact: slots are independent
    const int sb = kp * per, se = min(ns, sb + per);
    float acc[ROWS_PER_THREAD];
    mmvw_dot<QT, THREADS_PER_ROW, ROWS_PER_THREAD, UNROLL, S, XS>(W, row_bytes, N, K, xq, xds, row0, acc,
                                          S ? bi * (ROWS_PER_BLOCK / SPLIT_K) : 0, min(sb, se), se, xp);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < ROWS_PER_THREAD; ++r) part[(kp * RG + rg) * ROWS_PER_THREAD + r] = acc[r];
    }
    __syncthreads();
    if (kp != 0 || lane != 0) return;
#pragma unroll
    for (int r = 0; r < ROWS_PER_THREAD; ++r) {
        const int n = row0 + r;
        float v = 0.f;
#pragma unroll
        for (int k = 0; k < SPLIT_K; ++k) v += part[(k * RG + rg) * ROWS_PER_THREAD + r];
        if (n < N) Y[n] = v + (A ? A[n] : 0.f);
    }
}

template <int QT, bool S = false, bool XS = false>
__device__ __forceinline__ void mmvw_rows(const u8* __restrict__ W, int row_bytes, int N, int K,
                                          const s8* __restrict__ xq,
                                          const float2* __restrict__ xds, float* Y,
                                          const float* A, int bi, bool split = false,
                                          const u8* xp = nullptr) {
    if (SPLIT_K > 1 && split) {
        mmvw_rows_split<QT, S, XS>(W, row_bytes, N, K, xq, xds, Y, A, bi, xp);
        return;
    }
    const int g = threadIdx.x / THREADS_PER_ROW, lane = threadIdx.x % THREADS_PER_ROW;
    const int row0 = (bi * MMVW_GROUPS + g) * ROWS_PER_THREAD;
    if (row0 >= N) return;  // whole groups leave together: the shuffles below stay full
    float acc[ROWS_PER_THREAD];
    mmvw_dot<QT, THREADS_PER_ROW, ROWS_PER_THREAD, UNROLL, S, XS>(W, row_bytes, N, K, xq, xds, row0, acc,
                                          S ? bi * ROWS_PER_BLOCK : 0, 0, -1, xp);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < ROWS_PER_THREAD; ++r) {
            const int n = row0 + r;
            if (n < N) Y[n] = acc[r] + (A ? A[n] : 0.f);
        }
    }
}


// One matrix's rows of this block (the switch of mmvw over the block types).
// ws: the block's rows staged in shared memory (mmvw_stage_start), else null.
__device__ __forceinline__ void mmvw_rows_qt(int qt, const u8* W, int rb, int N, int K,
                                             const s8* __restrict__ xq,
                                             const float2* __restrict__ xds, float* Y,
                                             const float* A, int b, const u8* ws = nullptr,
                                             bool sp = false) {
#if STAGE
    if (ws != nullptr) {  // only the K types are staged
        if (qt == QT_Q4_K) mmvw_rows<QT_Q4_K, true>(ws, rb, N, K, xq, xds, Y, A, b, sp);
        if (qt == QT_Q6_K) mmvw_rows<QT_Q6_K, true>(ws, rb, N, K, xq, xds, Y, A, b, sp);
        return;
    }
#endif
    switch (qt) {
        case QT_Q4_K: mmvw_rows<QT_Q4_K>(W, rb, N, K, xq, xds, Y, A, b, sp); break;
        case QT_Q6_K: mmvw_rows<QT_Q6_K>(W, rb, N, K, xq, xds, Y, A, b, sp); break;
        case QT_Q4_0: mmvw_rows<QT_Q4_0>(W, rb, N, K, xq, xds, Y, A, b, sp); break;
        case QT_Q4_1: mmvw_rows<QT_Q4_1>(W, rb, N, K, xq, xds, Y, A, b, sp); break;
        case QT_Q5_0: mmvw_rows<QT_Q5_0>(W, rb, N, K, xq, xds, Y, A, b, sp); break;
        case QT_Q8_0: mmvw_rows<QT_Q8_0>(W, rb, N, K, xq, xds, Y, A, b, sp); break;
        default: break;
    }
}

// One row's dot product by a group of GLU_THREADS_PER_ROW lanes (mmvw_glu), by weight type.
__device__ __forceinline__ float mmvw_glu_dot(int qt, const u8* W, int rb, int N, int K,
                                              const s8* __restrict__ xq,
                                              const float2* __restrict__ xds, int row) {
    float acc[1] = {0.f};
#define MMVW_GLU_CASE(T) \
    case T: mmvw_dot<T, GLU_THREADS_PER_ROW, 1, GLU_UNROLL>(W, rb, N, K, xq, xds, row, acc); break;
    switch (qt) {
        MMVW_GLU_CASE(QT_Q4_K)
        MMVW_GLU_CASE(QT_Q6_K)
        MMVW_GLU_CASE(QT_Q4_0)
        MMVW_GLU_CASE(QT_Q4_1)
        MMVW_GLU_CASE(QT_Q5_0)
        MMVW_GLU_CASE(QT_Q8_0)
        default: break;
    }
#undef MMVW_GLU_CASE
    return acc[0];
}

// Matrix i: weights W_i [N_i, row_bytes_i] of GGML type qt_i, output Y_i [N_i], added A_i
// [N_i] or null. Y_i may be A_i (each element is read, then written, by one thread).
extern "C" __global__ void __launch_bounds__(WARPS * 32 MMVW_BOUNDS_MINB)
    mmvw(const s8* __restrict__ xq, const float2* __restrict__ xds, int K, int nb0, int nb1,
         const u8* W0, int rb0, int N0, int qt0, float* Y0, const float* A0,
         const u8* W1, int rb1, int N1, int qt1, float* Y1, const float* A1,
         const u8* W2, int rb2, int N2, int qt2, float* Y2, const float* A2) {
    extern __shared__ __align__(16) u8 mmvw_ws[];  // STAGE: this block's weight rows
    __shared__ __align__(8) unsigned long long mmvw_bar;
    int b = blockIdx.x;
    const u8* W = W0;
    int rb = rb0, N = N0, qt = qt0;
    float* Y = Y0;
    const float* A = A0;
    if (b >= nb0 + nb1) {
        b -= nb0 + nb1;
        W = W2, rb = rb2, N = N2, qt = qt2, Y = Y2, A = A2;
    } else if (b >= nb0) {
        b -= nb0;
        W = W1, rb = rb1, N = N1, qt = qt1, Y = Y1, A = A1;
    }
    const bool sp = mmvw_split(K);
    const int rpb = mmvw_rpb(sp);
#if PREFETCH
    l2_prefetch_rows(W, rb, N, b * rpb, rpb);
#endif
    const bool st = mmvw_stage_start(W, rb, N, qt, b * rpb, rpb, mmvw_ws, &mmvw_bar);
    pdl_start();
    if (st) mmvw_stage_wait(&mmvw_bar);
    mmvw_rows_qt(qt, W, rb, N, K, xq, xds, Y, A, b, st ? mmvw_ws : nullptr, sp);
}

// mmvw_q4k (host knob matmul_decode.q4k_kernel): mmvw for a launch whose matrices are all
// Q4_K, built for that type alone. mmvw's registers are the most any of its six types' code
// needs (Q6_K's); the Q4_K code alone needs fewer, so more warps fit on an SM (the checkpoint:
// warps per SM, not bytes in flight, set the rate), and Q4K_MIN_BLOCKS bounds it alone (with
// q4k_lean, 16 blocks of 4 warps fit in 32 registers; Q6_K's code would spill there). Same
// arguments, arithmetic and output.
// Q4K_MIN_BLOCKS (knob q4k_min_blocks): mmvw_q4k's own blocks per SM bound (0: MIN_BLOCKS's)
#ifndef Q4K_MIN_BLOCKS
#define Q4K_MIN_BLOCKS 0
#endif
#if Q4K_MIN_BLOCKS > 0
#define MMVW_Q4K_BOUNDS , Q4K_MIN_BLOCKS
#else
#define MMVW_Q4K_BOUNDS MMVW_BOUNDS_MINB
#endif
extern "C" __global__ void __launch_bounds__(WARPS * 32 MMVW_Q4K_BOUNDS)
    mmvw_q4k(const s8* __restrict__ xq, const float2* __restrict__ xds, int K, int nb0, int nb1,
             const u8* W0, int rb0, int N0, int qt0, float* Y0, const float* A0,
             const u8* W1, int rb1, int N1, int qt1, float* Y1, const float* A1,
             const u8* W2, int rb2, int N2, int qt2, float* Y2, const float* A2) {
    extern __shared__ __align__(16) u8 mmvw_ws[];
    __shared__ __align__(8) unsigned long long mmvw_bar;
    int b = blockIdx.x;
    const u8* W = W0;
    int rb = rb0, N = N0;
    float* Y = Y0;
    const float* A = A0;
    if (b >= nb0 + nb1) {
        b -= nb0 + nb1;
        W = W2, rb = rb2, N = N2, Y = Y2, A = A2;
    } else if (b >= nb0) {
        b -= nb0;
        W = W1, rb = rb1, N = N1, Y = Y1, A = A1;
    }
    const bool sp = mmvw_split(K);
    const int rpb = mmvw_rpb(sp);
#if PREFETCH
    l2_prefetch_rows(W, rb, N, b * rpb, rpb);
#endif
    const bool st = mmvw_stage_start(W, rb, N, QT_Q4_K, b * rpb, rpb, mmvw_ws, &mmvw_bar);
    pdl_start();
    if (st) mmvw_stage_wait(&mmvw_bar);
#if STAGE
    if (st) {
        mmvw_rows<QT_Q4_K, true>(mmvw_ws, rb, N, K, xq, xds, Y, A, b, sp);
        return;
    }
#endif
    mmvw_rows<QT_Q4_K>(W, rb, N, K, xq, xds, Y, A, b, sp);
}

// mmvw_stream (host knob matmul_decode.stream = the ring's stages, stream_blocks): mmvw's
// launch of Q4_K / Q6_K matrices with persistent blocks, each walking the row sets (a block's
// rows under mmvw, one contiguous run of weight bytes) q = blockIdx.x, + gridDim.x, ... < nsets
// through a ring of `stages` shared-memory stages of stage_bytes each, filled by bulk copies
// (cp.async.bulk, sm_90, completing on a per-stage mbarrier). Thread 0 keeps stages - 1 sets
// ahead in flight while the block computes one: the weight stream never waits for a block to
// start, and a block's bytes in flight do not hold registers (mmvw's stage knob copied one set
// per block and then waited, all of its bytes at once). Each set is computed by mmvw_rows on
// the staged rows: the same arithmetic as mmvw, bit for bit, split_k included.
#ifndef MMVW_STREAM_MAX
#define MMVW_STREAM_MAX 8  // stages at most (the host caps the knob by shared memory)
#endif
struct MmvwSet {
    const u8* W;
    int rb, N, qt, bi;
    float* Y;
    const float* A;
};

__device__ __forceinline__ MmvwSet mmvw_set(int q, int nb0, int nb1, const u8* W0, int rb0,
                                            int N0, int qt0, float* Y0, const float* A0,
                                            const u8* W1, int rb1, int N1, int qt1, float* Y1,
                                            const float* A1, const u8* W2, int rb2, int N2,
                                            int qt2, float* Y2, const float* A2) {
    if (q >= nb0 + nb1) return {W2, rb2, N2, qt2, q - nb0 - nb1, Y2, A2};
    if (q >= nb0) return {W1, rb1, N1, qt1, q - nb0, Y1, A1};
    return {W0, rb0, N0, qt0, q, Y0, A0};
}

// Thread 0: set s's rows [bi * rpb, + rpb) clamped to N (one contiguous run) into stage dst,
// its completion counted on bar (armed for the bytes first).
__device__ __forceinline__ void mmvw_stream_issue(const MmvwSet& s, int rpb, u8* dst,
                                                  unsigned long long* bar) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const int row0 = s.bi * rpb;
    const unsigned int bytes = (unsigned int)min(rpb, s.N - row0) * (unsigned int)s.rb;
    const unsigned int cb = bytes;
    const unsigned int b = (unsigned int)__cvta_generic_to_shared(bar);
    const unsigned int d = (unsigned int)__cvta_generic_to_shared(dst);
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(cb)
                 : "memory");
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, "
        "[%3];" ::"r"(d), "l"(s.W + (size_t)row0 * s.rb), "r"(cb), "r"(b)
        : "memory");
#endif
}

// Every thread waits until phase `parity` of bar has completed (its stage's bytes landed).
__device__ __forceinline__ void mmvw_stream_wait(unsigned long long* bar, unsigned int parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    const unsigned int b = (unsigned int)__cvta_generic_to_shared(bar);
    unsigned int done = 0;
    while (!done) {
        asm volatile(
            "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; "
            "selp.u32 %0, 1, 0, p; }"
            : "=r"(done)
            : "r"(b), "r"(parity)
            : "memory");
    }
#endif
}

// Matrix i as mmvw's (every W_i Q4_K or Q6_K, 16-byte aligned; row bytes multiples of 16);
// nsets = nb0 + nb1 + nb2 row sets of mmvw_rpb rows; grid <= nsets persistent blocks, block
// WARPS * 32, dynamic shared memory stages * stage_bytes (stage_bytes >= rpb * max row bytes, a
// multiple of 16), 2 <= stages <= MMVW_STREAM_MAX, then the x planes: x4 / x6 the byte offsets
// of the Q4_K / Q6_K slots' planes (56 * K / 32 bytes each), -1: none (global activations;
// always -1 for a wide slot type).
extern "C" __global__ void __launch_bounds__(WARPS * 32 MMVW_BOUNDS_MINB)
    mmvw_stream(const s8* __restrict__ xq, const float2* __restrict__ xds, int K, int nb0,
                int nb1, int nsets, int stages, int stage_bytes, int x4, int x6,
                const u8* W0, int rb0, int N0, int qt0, float* Y0, const float* A0,
                const u8* W1, int rb1, int N1, int qt1, float* Y1, const float* A1,
                const u8* W2, int rb2, int N2, int qt2, float* Y2, const float* A2) {
    extern __shared__ __align__(16) u8 mmvw_ws[];
    __shared__ __align__(8) unsigned long long full[MMVW_STREAM_MAX];
#define MMVW_SET(q)                                                                          \
    mmvw_set(q, nb0, nb1, W0, rb0, N0, qt0, Y0, A0, W1, rb1, N1, qt1, Y1, A1, W2, rb2, N2, qt2, \
             Y2, A2)
    const bool sp = mmvw_split(K);
    const int rpb = mmvw_rpb(sp);
    const int G = gridDim.x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    if (threadIdx.x == 0) {
        for (int st = 0; st < stages; ++st) {
            const unsigned int b = (unsigned int)__cvta_generic_to_shared(&full[st]);
            asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b) : "memory");
        }
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        // the weights are read-only: the first sets stream in before the PDL wait
        for (int st = 0, q = blockIdx.x; st < stages && q < nsets; ++st, q += G)
            mmvw_stream_issue(MMVW_SET(q), rpb, mmvw_ws + (size_t)st * stage_bytes, &full[st]);
    }
#endif
    pdl_start();
    const int nxs = K / 32;  // narrow K-type slots of a row
#if !Q4K_WIDE
    if (x4 >= 0)
        for (int t = threadIdx.x; t < nxs; t += blockDim.x)
            xpl_store(mmvw_ws + x4, nxs, t, VD<QT_Q4_K>::load(t, xq, xds));
#endif
#if !Q6K_WIDE
    if (x6 >= 0)
        for (int t = threadIdx.x; t < nxs; t += blockDim.x)
            xpl_store(mmvw_ws + x6, nxs, t, VD<QT_Q6_K>::load(t, xq, xds));
#endif
    __syncthreads();  // the barriers are initialised (and the x planes written) before use
    for (int i = 0, q = blockIdx.x; q < nsets; ++i, q += G) {
        const int st = i % stages;
        mmvw_stream_wait(&full[st], (unsigned int)(i / stages) & 1u);
        const MmvwSet s = MMVW_SET(q);
        const u8* ws = mmvw_ws + (size_t)st * stage_bytes;
        if (s.qt == QT_Q4_K) {
#if !Q4K_WIDE
            if (x4 >= 0)
                mmvw_rows<QT_Q4_K, true, true>(ws, s.rb, s.N, K, xq, xds, s.Y, s.A, s.bi, sp,
                                               mmvw_ws + x4);
            else
#endif
                mmvw_rows<QT_Q4_K, true>(ws, s.rb, s.N, K, xq, xds, s.Y, s.A, s.bi, sp);
        } else {
#if !Q6K_WIDE
            if (x6 >= 0)
                mmvw_rows<QT_Q6_K, true, true>(ws, s.rb, s.N, K, xq, xds, s.Y, s.A, s.bi, sp,
                                               mmvw_ws + x6);
            else
#endif
                mmvw_rows<QT_Q6_K, true>(ws, s.rb, s.N, K, xq, xds, s.Y, s.A, s.bi, sp);
        }
        __syncthreads();  // stage st is read by everyone before it is refilled
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        const int qn = q + stages * G;
        if (threadIdx.x == 0 && qn < nsets) {
            asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
            mmvw_stream_issue(MMVW_SET(qn), rpb, mmvw_ws + (size_t)st * stage_bytes, &full[st]);
        }
#endif
    }
#undef MMVW_SET
}

// gate Wg [N, rbg], up Wu [N, rbu] (types qtg, qtu) on x (Q8_1, K) -> y = silu(x Wg^T) *
// (x Wu^T) [N] and, when yq is not null (N % 32 == 0), its Q8_1 blocks yq [N], yds [N / 32].
// Grid ceil(N / 32) blocks (the last one's rows past N are computed, not stored), block
// 64 * GLU_THREADS_PER_ROW threads: block b's group v < 64 (GLU_THREADS_PER_ROW lanes) computes gate row 32b + v
// (v < 32) or up row 32b + v - 32, all 64 in one pass (lanes per row of its own, not THREADS_PER_ROW: with
// 32 outputs a block, the grid is small and each block must keep many loads in flight).
extern "C" __global__ void __launch_bounds__(64 * GLU_THREADS_PER_ROW)
    mmvw_glu(const s8* __restrict__ xq, const float2* __restrict__ xds, int K, int N,
             const u8* Wg, int rbg, int qtg, const u8* Wu, int rbu, int qtu,
             float* __restrict__ y, s8* __restrict__ yq, float2* __restrict__ yds) {
    __shared__ float gu[64];
#if PREFETCH
    l2_prefetch_rows(Wg, rbg, N, 32 * blockIdx.x, 32);
    l2_prefetch_rows(Wu, rbu, N, 32 * blockIdx.x, 32);
#endif
    pdl_start();
    const int gi = threadIdx.x / GLU_THREADS_PER_ROW, b = blockIdx.x;
    const bool up = gi >= 32;
    const float acc = mmvw_glu_dot(up ? qtu : qtg, up ? Wu : Wg, up ? rbu : rbg, N, K, xq, xds,
                                   32 * b + (up ? gi - 32 : gi));
    if (threadIdx.x % GLU_THREADS_PER_ROW == 0) gu[gi] = acc;
    __syncthreads();
    if (threadIdx.x >= 32) return;
    // swiglu_q8's arithmetic, a value a lane: silu(g) * u, then Q8_1 over the warp (the same
    // d, rounding and integer sum as q8_store4's 8 lanes of 4)
    const int l = threadIdx.x, n = 32 * b + l;
    const float a = gu[l], c = gu[32 + l];
    const float v = a / (1.f + expf(-a)) * c;
    if (n < N) y[n] = v;
    if (yq == nullptr) return;  // N % 32 != 0: no Q8_1 form (its consumer cannot read one)
    float amax = fabsf(v);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
    const float d = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
    const int q = __float2int_rn(v * id);
    int sq = q;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
    yq[n] = (s8)q;
    if (l == 0) yds[b] = make_float2(d, d * (float)sq);
}

// mmvw for one matrix W [N, rb] (type qt) with the residual A: Y = x W^T + A, then the last
// block to finish (ticket, zero between launches; that block resets it) normalizes the whole
// row Y [N] by RMSNorm with weight nw -> h [N] and its Q8_1 form hq, hds (rms_norm_q8's
// arithmetic, Y read through L2). N % 32 == 0; grid ceil(N / rows per block), block WARPS * 32.
extern "C" __global__ void __launch_bounds__(WARPS * 32 MMVW_BOUNDS_MINB)
    mmvw_norm(const s8* __restrict__ xq, const float2* __restrict__ xds, int K,
              const u8* W, int rb, int N, int qt, float* Y, const float* A,
              const float* __restrict__ nw, float eps, float* __restrict__ h,
              s8* __restrict__ hq, float2* __restrict__ hds, unsigned int* ticket) {
    __shared__ bool last;
    extern __shared__ __align__(16) u8 mmvw_ws[];
    __shared__ __align__(8) unsigned long long mmvw_bar;
    const bool sp = mmvw_split(K);
    const int rpb = mmvw_rpb(sp);
#if PREFETCH
    l2_prefetch_rows(W, rb, N, blockIdx.x * rpb, rpb);
#endif
    const int b = blockIdx.x;
    const bool st = mmvw_stage_start(W, rb, N, qt, b * rpb, rpb, mmvw_ws, &mmvw_bar);
    pdl_start();
    if (st) mmvw_stage_wait(&mmvw_bar);
    mmvw_rows_qt(qt, W, rb, N, K, xq, xds, Y, A, b, st ? mmvw_ws : nullptr, sp);
    __threadfence();  // this block's rows are visible before its ticket is counted
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    __syncthreads();
    if (!last) return;
    __threadfence();
    rms_norm_q8_row<true>(Y, nw, h, hq, hds, N, eps);
    if (threadIdx.x == 0) *ticket = 0;
}

// q, k, v of one decode row (T = 1) in one launch (grid nb0 + nb1 + nb2 blocks, as mmvw), each
// with its bias Ai (or null) added as it stores, then rope_kv's work where it becomes possible:
// v's rows go straight into the cache row vc[p0]; a block that finds it was the last of a q or
// k head's blocks to finish (a ticket per head: tickets [H + Hkv], zero between launches, reset
// by that block) ropes the head (rope_pair, the values read through L2) into qo or kc[p0].
// Same arithmetic as mmvw then rope_kv. Position: pos_ptr when not null, else pos0.
extern "C" __global__ void __launch_bounds__(WARPS * 32 MMVW_BOUNDS_MINB)
    mmvw_qkv(const s8* __restrict__ xq, const float2* __restrict__ xds, int K, int nb0, int nb1,
             const u8* W0, int rb0, int qt0, const float* A0, const u8* W1, int rb1, int qt1,
             const float* A1, const u8* W2, int rb2, int qt2, const float* A2, float* q,
             float* k, float* qo, float* kc, float* vc, int H, int Hkv, int D, int pos0,
             const int* pos_ptr, float theta, int neox, unsigned int* tickets) {
    __shared__ unsigned int done;
    extern __shared__ __align__(16) u8 mmvw_ws[];
    __shared__ __align__(8) unsigned long long mmvw_bar;
    int b = blockIdx.x, m = 0;
    if (b >= nb0 + nb1) {
        b -= nb0 + nb1;
        m = 2;
    } else if (b >= nb0) {
        b -= nb0;
        m = 1;
    }
    const int N = (m == 0 ? H : Hkv) * D;
    const u8* W = m == 0 ? W0 : m == 1 ? W1 : W2;
    const int rb = m == 0 ? rb0 : m == 1 ? rb1 : rb2, qt = m == 0 ? qt0 : m == 1 ? qt1 : qt2;
#if PREFETCH
    l2_prefetch_rows(W, rb, N, b * ROWS_PER_BLOCK, ROWS_PER_BLOCK);
#endif
    const bool st = mmvw_stage_start(W, rb, N, qt, b * ROWS_PER_BLOCK, ROWS_PER_BLOCK, mmvw_ws, &mmvw_bar);
    pdl_start();
    if (st) mmvw_stage_wait(&mmvw_bar);
    const int p0 = pos_ptr ? *pos_ptr : pos0;
    const long long HkvD = (long long)Hkv * D;
    float* Y = m == 0 ? q : m == 1 ? k : vc + p0 * HkvD;
    mmvw_rows_qt(qt, W, rb, N, K, xq, xds, Y, m == 0 ? A0 : m == 1 ? A1 : A2, b,
                 st ? mmvw_ws : nullptr);
    if (m == 2) return;  // uniform per block: v needs no rope
    const int rpb = ROWS_PER_BLOCK;
    const int r0 = b * rpb, r1 = min(N, r0 + rpb);
    const int h0 = r0 / D, h1 = (r1 - 1) / D;  // heads this block's rows touch (<= 32 of them)
    __threadfence();  // this block's rows are visible before its tickets are counted
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned int mask = 0;
        for (int h = h0; h <= h1; ++h) {
            const unsigned int want = (unsigned)(((h + 1) * D - 1) / rpb - h * D / rpb + 1);
            unsigned int* t = tickets + (m == 0 ? h : H + h);
            if (atomicAdd(t, 1u) == want - 1) {
                mask |= 1u << (h - h0);
                *t = 0;  // every block of the head has counted: ready for the next launch
            }
        }
        done = mask;
    }
    __syncthreads();
    const unsigned int mask = done;
    if (!mask) return;
    __threadfence();
    const int half = D / 2;
    for (int i = 0; i <= h1 - h0; ++i) {
        if (!((mask >> i) & 1u)) continue;
        const int h = h0 + i;
        const float* x = (m == 0 ? q : k) + (long long)h * D;
        float* out = m == 0 ? qo + (long long)h * D : kc + p0 * HkvD + (long long)h * D;
        for (int j = threadIdx.x; j < half; j += blockDim.x) {
            const int ia = neox ? j : 2 * j, ib = neox ? j + half : 2 * j + 1;
            rope_pair(__ldcg(x + ia), __ldcg(x + ib), j, D, p0, theta, neox, out);
        }
    }
}
