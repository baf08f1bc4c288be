// mmvw_pipe.cuh (included by mmvw.cu; host knob matmul_decode.pipe = PIPE_D): mmvw's launch of
// Q4_K / Q6_K matrices with each lane group streaming many rows through a ring of PIPE_D weight
// loads held in registers.
//
// Why: mmvw gives each lane group one row (or RPT rows) and 1-2 slots of it per lane on the
// layer shapes (K 1536-3584: 48-112 slots a row over 32 lanes), so a warp issues ~1 KB of
// loads, waits a full memory latency, computes, and exits: a launch runs in waves of
// (latency + compute + block start), 3-4 waves on the 1.5B's gate+up, and the SM is idle on
// memory between them. Here a block owns PIPE rows (rpb, knob pipe_rows) and each lane group
// ("worker", PIPE_TPR lanes, knob pipe_lanes) walks its rows' slots as one flat sequence of
// items (row, chunk of PIPE_TPR slots) with the loads of the next PIPE_D items always in
// flight: each item's refill is issued as it is consumed, across row ends, so the stream never
// drains inside a block. The weights are read-only, so the first PIPE_D items are requested
// before pdl_start() (under PDL they overlap the previous kernel).
// Split (ks > 1, knob pipe_split, rows with K >= split_min_k): the block's workers are ks K-parts
// x (workers / ks) row groups; partials meet in shared memory, summed in part order (fixed:
// deterministic). Slots of a part: consecutive chunks, as even as the count allows.
// Arithmetic: vecdot.cuh's narrow slots (q4k_slot, q6k_slot: mmvw's, Q4K_LEAN honoured), or
// for Q4_K under PIPE_WIDE (knob pipe_wide) its wide one (q4kw_slot: mmvw's under q4k_wide);
// with ks = 1 a lane sums its slots in mmvw's order (mmvw with TPR = PIPE_TPR, RPT 1, UNROLL 1,
// plus + 0 for a slot past the row) and the lanes' partials meet in mmvw's xor-shuffle order
// (through shared memory: no shuffles in the item loop).
// Launch: grid nb0 + nb1 + nb2 blocks as mmvw (rpb rows a block), block NW * 32 threads;
// dynamic shared memory rpb * ks * PIPE_TPR floats (a lane's partial of each row and part);
// ks divides NW * 32 / PIPE_TPR. K % 256 == 0. A lane's registers hold PIPE_D items: 8 words
// each (Q4_K), 12 (wide Q4_K), 11 (Q6_K).
#pragma once

#ifndef PIPE_D
#define PIPE_D 0
#endif
#define PIPE_DEPTH (PIPE_D > 0 ? PIPE_D : 1)  // pipe = 0: built at depth 1, never launched
#ifndef PIPE_TPR
#define PIPE_TPR 16
#endif
#if PIPE_TPR != 8 && PIPE_TPR != 16 && PIPE_TPR != 32
#error "PIPE_TPR must be 8, 16 or 32 (a worker's lanes sit inside one warp)"
#endif
#define PIPE_WORKERS (NW * 32 / PIPE_TPR)

// One item's weight registers for a lane: Q4_K the block header and the slot's 16 qs bytes;
// Q6_K ql, qh, the 8 scale bytes of the slot's half (h) and the word holding d. A chunk is G
// consecutive slots of SPW weights (whole blocks of BLK bytes) and l the lane's slot in it: a
// slot's offsets from its chunk's start depend on l alone (loop-invariant), its weights on the
// chunk pointer, its activations on xq + SPW G c and xds + SPW / 32 G c (vecdot's slot
// functions read the low bits of l below a block, which a chunk start leaves as the slot's).
template <int QT> struct PipeW;
#ifndef PIPE_WIDE
#define PIPE_WIDE 0
#endif
#if PIPE_WIDE
// pipe_wide: a Q4_K item is vecdot's wide slot (64 weights: the pair's 32 qs bytes), half the
// header, scale and float work per weight byte of the narrow one; a chunk is G / 4 blocks.
template <> struct PipeW<QT_Q4_K> {
    static constexpr int BLK = 144, SPW = 64;
    uint4 h, q0, q1;
    static __device__ __forceinline__ PipeW get(const u8* __restrict__ cp, int l) {
        const u8* blk = cp + 144 * (l >> 2);
        return {wld16(blk), wld16(blk + 16 + 32 * (l & 3)), wld16(blk + 32 + 32 * (l & 3))};
    }
    __device__ __forceinline__ float dot(int l, const s8* __restrict__ xq,
                                         const float2* __restrict__ xds) const {
        return q4kw_slot(h, q0, q1, l, q4kw_xload(l, xq, xds));
    }
    static __device__ __forceinline__ int2 xoff(int l) {  // q4kw_xload's x, xds offsets
        return make_int2(256 * (l >> 2) + 64 * (l & 3), 8 * (l >> 2) + 2 * (l & 3));
    }
};
#else
template <> struct PipeW<QT_Q4_K> {
    static constexpr int BLK = 144, SPW = 32;
    uint4 h, q;
    static __device__ __forceinline__ PipeW get(const u8* __restrict__ cp, int l) {
        const u8* blk = cp + 144 * (l >> 3);
        return {wld16(blk), wld16(blk + 16 + 32 * ((l >> 1) & 3) + 16 * (l & 1))};
    }
    __device__ __forceinline__ float dot(int l, const s8* __restrict__ xq,
                                         const float2* __restrict__ xds) const {
        return q4k_slot(h, q, l, q4k_xload(l, xq, xds));
    }
    static __device__ __forceinline__ int2 xoff(int l) {  // q4k_xload's x, xds offsets
        const int p = (l >> 1) & 3;
        return make_int2(256 * (l >> 3) + 64 * p + 16 * (l & 1), 8 * (l >> 3) + 2 * p);
    }
};
#endif
template <> struct PipeW<QT_Q6_K> {
    static constexpr int BLK = 224, SPW = 32;
    uint4 ql, qh;
    uint2 sc;
    u32 dw;
    static __device__ __forceinline__ PipeW get(const u8* __restrict__ cp, int l) {
        const int h = (l >> 2) & 1, c = (l >> 1) & 1, lq = l & 1;
        const u8* blk = cp + 224 * (l >> 3);
        PipeW w;
        w.ql = wld16(blk + 64 * h + 32 * c + 16 * lq);
        w.qh = wld16(blk + 128 + 32 * h + 16 * lq);
        w.sc = __ldg((const uint2*)(blk + 192 + 8 * h));
        w.dw = __ldg((const u32*)(blk + 208));
        return w;
    }
    __device__ __forceinline__ float dot(int l, const s8* __restrict__ xq,
                                         const float2* __restrict__ xds) const {
        const int i = 8 * ((l & 1) + 2 * ((l >> 1) & 1));  // scale bytes lq + 2c and + 4
        const int sca = (int)(s8)(sc.x >> i), scb = (int)(s8)(sc.y >> i);
        return q6k_slot(ql, qh, sca, scb, h2f((u16)(dw & 0xFFFF)), l, q6k_xload(l, xq, xds));
    }
    static __device__ __forceinline__ int2 xoff(int l) {  // q6k_xload's x, xds offsets
        const int h = (l >> 2) & 1, c = (l >> 1) & 1;
        return make_int2(256 * (l >> 3) + 128 * h + 32 * c + 16 * (l & 1),
                         8 * (l >> 3) + 4 * h + c);
    }
};

// The block's rows [bi * rpb, + rpb) of W (clamped to N: reads of row N - 1, nothing stored)
// into Y (+ A), ks K-parts (1: no split). Every thread of the block calls it (a barrier).
// lp: rpb * ks * G floats of shared memory, a lane's partial sum of each (part, row). Calls
// pdl_start() once, after its first loads.
// The item loop is straight-line code (every condition a select or a predicated load / store,
// no shuffles): the compiler overlaps the D items of a round. The checkpoint's first build,
// with a branch per item and the group's shuffles at each row end, ran one item's dependent
// chain at a time (~0.6 us an item per lane group on the q/k/v shapes, 3x slower than mmvw).
template <int QT>
__device__ __forceinline__ void mmvw_pipe_rows(const u8* __restrict__ W, int rb, int N, int K,
                                               const s8* __restrict__ xq,
                                               const float2* __restrict__ xds, float* Y,
                                               const float* A, int bi, int rpb, int ks,
                                               float* lp) {
    constexpr int G = PIPE_TPR, D = PIPE_DEPTH;
    constexpr int SPW = PipeW<QT>::SPW;                 // weights a slot
    constexpr int CB = PipeW<QT>::BLK * G * SPW / 256;  // bytes of a chunk
    const int wk = threadIdx.x / G, lane = threadIdx.x % G;
    const int RG = PIPE_WORKERS / ks;  // row groups
    const int rg = wk % RG, kp = wk / RG;
    const int ns = K / SPW;            // slots a row
    const int nc = (ns + G - 1) / G;   // chunks of G slots a row
    const bool tail = lane >= ns - (nc - 1) * G;  // this lane has no slot in a row's last chunk
    const int cpp = (nc + ks - 1) / ks;
    const int c0 = min(nc, kp * cpp);
    int c1 = min(nc, c0 + cpp);
#ifdef MUTANT_MMVW_PIPE_CHUNK  // planted bug: each part leaves out its last chunk of slots
    c1 = max(c0, c1 - 1);
#endif
    const int nci = c1 - c0;  // chunks of this worker's part
    const int rpg = (rpb + RG - 1) / RG;
    const int lr0 = min(rpb, rg * rpg), lr1 = min(rpb, lr0 + rpg);  // block-local rows
    const int r0 = bi * rpb;
    const int lre = min(lr1, max(lr0, N - r0));  // rows past N: not walked
    const int nit = (lre - lr0) * nci;           // items: (row, chunk) in row-major order
    PipeW<QT> buf[D] = {};
    // the load cursor: chunk cl at pl, stepping CB bytes, or rstep from a part's last chunk to
    // the next row's first. A lane with no slot in a row's last chunk does not load there (its
    // slot would lie past the row); its dot runs on stale registers against the chunk's first
    // activation slot (xt, st: the lane's own offsets land there) and is dropped
    const int rstep = rb - (nci - 1) * CB;
    int cl = c0;
    const u8* pl = W + (size_t)(r0 + lr0) * rb + (size_t)c0 * CB;
#pragma unroll
    for (int j = 0; j < D; ++j) {
        if (j < nit && !(tail && cl == nc - 1)) buf[j] = PipeW<QT>::get(pl, lane);
        const bool wrap = cl + 1 == c1;
        cl = wrap ? c0 : cl + 1;
        pl += wrap ? rstep : CB;
    }
    pdl_start();
    constexpr int XC = SPW * G, SC = SPW / 32 * G;  // a chunk's activation bytes, scale pairs
    const int2 xo = PipeW<QT>::xoff(lane);
    const s8* const xt = xq + XC * (nc - 1) - xo.x;
    const float2* const st = xds + SC * (nc - 1) - xo.y;
    const s8* xc = xq + XC * c0;  // the compute cursor: chunk cc's activations, row lrc
    const float2* sc = xds + SC * c0;
    float acc = 0.f;
    int lrc = lr0, cc = c0;
    float* const lpw = lp + (size_t)kp * rpb * G + lane;  // this lane's partial of row lr: [lr G]
    for (int t0 = 0; t0 < nit; t0 += D) {
#pragma unroll
        for (int j = 0; j < D; ++j) {
            const bool valid = t0 + j < nit;
            const bool own = !(tail && cc == nc - 1);
            const float v = buf[j].dot(lane, own ? xc : xt, own ? sc : st);
            acc += valid && own ? v : 0.f;
            // the refill: D items stay in flight (predicated loads)
            if (t0 + j + D < nit && !(tail && cl == nc - 1)) buf[j] = PipeW<QT>::get(pl, lane);
            const bool wrap = cl + 1 == c1;
            cl = wrap ? c0 : cl + 1;
            pl += wrap ? rstep : CB;
            // the row's part complete: the lane's partial to shared memory (predicated store)
            const bool end = cc + 1 == c1;
            if (valid && end) lpw[lrc * G] = acc;
            acc = end ? 0.f : acc;
            lrc += end;
            cc = end ? c0 : cc + 1;
            xc += end ? -XC * (nci - 1) : XC;
            sc += end ? -SC * (nci - 1) : SC;
        }
    }
    if (nci == 0)  // a part with no slots (ks > chunks): its partials are zero
        for (int lr = lr0; lr < lr1; ++lr) lpw[lr * G] = 0.f;
    __syncthreads();
    // a thread a row: each part's G lane partials summed in the order of mmvw's xor-shuffle
    // tree (lane 0's view: v[l] += v[l + o], o = G / 2 .. 1), then the parts in order
    for (int lr = threadIdx.x; lr < rpb; lr += blockDim.x) {
        const int n = r0 + lr;
        if (n >= N) continue;
        float y = 0.f;
        for (int k = 0; k < ks; ++k) {
            float v[G];
#pragma unroll
            for (int l = 0; l < G; ++l) v[l] = lp[((size_t)k * rpb + lr) * G + l];
#pragma unroll
            for (int o = G / 2; o > 0; o >>= 1)
#pragma unroll
                for (int l = 0; l < o; ++l) v[l] += v[l + o];
            y += v[0];
        }
        Y[n] = y + (A ? A[n] : 0.f);
    }
}

// Matrix i as mmvw's, every W_i Q4_K or Q6_K; rpb rows a block in ks K-parts (the host's
// _pipe_plan: pipe_rows / ks and pipe_split from split_min_k on, else pipe_rows and 1). Y_i may
// be A_i (each element is read, then written, by one thread). TYPES: 1 every matrix Q4_K, 2
// every one Q6_K, 3 either (the kernel's registers are its widest path's: a launch of one type
// gets the kernel built for that type alone, as many warps an SM as its own path allows).
template <int TYPES>
__device__ __forceinline__ void mmvw_pipe_body(
    const s8* __restrict__ xq, const float2* __restrict__ xds, int K, int nb0, int nb1, int rpb,
    int ks, const u8* W0, int rb0, int N0, int qt0, float* Y0, const float* A0, const u8* W1,
    int rb1, int N1, int qt1, float* Y1, const float* A1, const u8* W2, int rb2, int N2, int qt2,
    float* Y2, const float* A2) {
    extern __shared__ __align__(16) u8 mmvw_ws[];  // rpb * ks * PIPE_TPR floats (the host's)
    float* const part = (float*)mmvw_ws;
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
    if (TYPES == 1 || (TYPES == 3 && qt == QT_Q4_K))
        mmvw_pipe_rows<QT_Q4_K>(W, rb, N, K, xq, xds, Y, A, b, rpb, ks, part);
    else
        mmvw_pipe_rows<QT_Q6_K>(W, rb, N, K, xq, xds, Y, A, b, rpb, ks, part);
}

extern "C" __global__ void __launch_bounds__(NW * 32 MMVW_BOUNDS_MINB)
    mmvw_pipe_q4k(const s8* __restrict__ xq, const float2* __restrict__ xds, int K, int nb0,
        int nb1, int rpb, int ks, const u8* W0, int rb0, int N0, int qt0, float* Y0,
        const float* A0, const u8* W1, int rb1, int N1, int qt1, float* Y1, const float* A1,
        const u8* W2, int rb2, int N2, int qt2, float* Y2, const float* A2) {
    mmvw_pipe_body<1>(xq, xds, K, nb0, nb1, rpb, ks, W0, rb0, N0, qt0, Y0, A0, W1, rb1, N1,
                       qt1, Y1, A1, W2, rb2, N2, qt2, Y2, A2);
}
extern "C" __global__ void __launch_bounds__(NW * 32 MMVW_BOUNDS_MINB)
    mmvw_pipe_q6k(const s8* __restrict__ xq, const float2* __restrict__ xds, int K, int nb0,
        int nb1, int rpb, int ks, const u8* W0, int rb0, int N0, int qt0, float* Y0,
        const float* A0, const u8* W1, int rb1, int N1, int qt1, float* Y1, const float* A1,
        const u8* W2, int rb2, int N2, int qt2, float* Y2, const float* A2) {
    mmvw_pipe_body<2>(xq, xds, K, nb0, nb1, rpb, ks, W0, rb0, N0, qt0, Y0, A0, W1, rb1, N1,
                       qt1, Y1, A1, W2, rb2, N2, qt2, Y2, A2);
}
extern "C" __global__ void __launch_bounds__(NW * 32 MMVW_BOUNDS_MINB)
    mmvw_pipe(const s8* __restrict__ xq, const float2* __restrict__ xds, int K, int nb0,
        int nb1, int rpb, int ks, const u8* W0, int rb0, int N0, int qt0, float* Y0,
        const float* A0, const u8* W1, int rb1, int N1, int qt1, float* Y1, const float* A1,
        const u8* W2, int rb2, int N2, int qt2, float* Y2, const float* A2) {
    mmvw_pipe_body<3>(xq, xds, K, nb0, nb1, rpb, ks, W0, rb0, N0, qt0, Y0, A0, W1, rb1, N1,
                       qt1, Y1, A1, W2, rb2, N2, qt2, Y2, A2);
}
