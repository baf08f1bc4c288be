// mmvf.cu: decode matrix-vector products on float32 activations, up to three matrices per
// launch, with an added vector in the epilogue (bias or residual).
//
//   y_i[n] = sum_k W_i[n, k] x[k] + a_i[n]   (a_i optional), i < 3, x float32 [K]
//
// Variant (engine/tuning/variants/cuda/): matmul_decode.mmvf, the CUDA default. dmmv's
// arithmetic class (float32 activations, float32 products and sums: order_only) with mmvw's
// memory shape: a group of THREADS_PER_ROW lanes (inside one warp, or THREADS_PER_ROW / 32 whole warps) walks ROWS_PER_THREAD
// rows; a lane takes every
// THREADS_PER_ROW-th slot (Q4_K / Q6_K: 32 weights from one 16-byte load of quants) and UNROLL slots per
// iteration, issuing all UNROLL * ROWS_PER_THREAD weight loads before it uses any. Partial sums meet by
// shuffles (no shared memory, no barrier).
// Why not dmmv: dmmv reads a Q4_K group as one 8-byte load (two 4-byte ones for Q6_K), converts
// each quant with I2F (a quarter-rate conversion on sm_90) and keeps one group per row in
// flight; the H200 then streams weights at ~0.7 TB/s. Here a quant becomes a float by one byte
// permute into the mantissa of 2^23 and one exact subtraction (to_f below), and every slot's
// activation sums are computed once for all ROWS_PER_THREAD rows.
// Tunables (defines): THREADS_PER_ROW lanes per row (8, 16, 32; 64 and 128: a row's warps meet in shared
// memory, in a fixed order, so rows are few per block where N is small), ROWS_PER_THREAD rows per lane
// group, WARPS warps per
// block, UNROLL slots per lane per iteration, WLOAD the K types' weight-load hint (vecdot.cuh
// wld16), MIN_BLOCKS blocks per SM for __launch_bounds__ (0: none), XSMEM 1: the block reads x from a
// copy in shared memory (the launch gives K * 4 bytes), Q4K_PAIR 1: a Q4_K slot is a whole
// sub-block pair (64 weights) instead of half of one. Rows per block: WARPS * 32/THREADS_PER_ROW * ROWS_PER_THREAD.
// Launch: grid nb0 + nb1 + nb2 blocks (block b < nb0 -> matrix 0, then 1, then 2), block WARPS*32;
// kernel mmvf (any mix of types) or mmvf_<type> (every matrix of that type).
// Types: Q4_0 Q4_1 Q5_0 Q8_0 Q4_K Q6_K (K % 256 == 0 for the K types); float weights use dmmv.
#ifndef WLOAD
#define WLOAD 0
#endif
#include "vecdot.cuh"

#ifndef THREADS_PER_ROW
#define THREADS_PER_ROW 32
#endif
#ifndef ROWS_PER_THREAD
#define ROWS_PER_THREAD 2
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
#ifndef XSMEM
#define XSMEM 0
#endif
#ifndef Q4K_PAIR
#define Q4K_PAIR 0
#endif
// Q4K_PAIR: a Q4_K slot is a sub-block pair (VF<QT_Q4K_PAIR>), not half of one
#define QT_Q4K_PAIR 112

#if THREADS_PER_ROW != 8 && THREADS_PER_ROW != 16 && THREADS_PER_ROW != 32 && THREADS_PER_ROW != 64 && THREADS_PER_ROW != 128
#error "THREADS_PER_ROW must be 8, 16, 32, 64 or 128"
#endif
#if THREADS_PER_ROW > WARPS * 32
#error "THREADS_PER_ROW > 32 spans THREADS_PER_ROW / 32 warps of the block: WARPS * 32 >= THREADS_PER_ROW"
#endif
#if MIN_BLOCKS > 0
#define MMVF_BOUNDS_MINB , MIN_BLOCKS
#else
#define MMVF_BOUNDS_MINB
#endif

#define MMVF_GROUPS (WARPS * 32 / THREADS_PER_ROW)
#define MMVF_RPB (MMVF_GROUPS * ROWS_PER_THREAD)

// Byte i of w (an unsigned value u < 256) as the float u + 2^23 (exact): the byte goes into the
// mantissa of 2^23 by one permute; subtracting 2^23 + bias then gives u - bias exactly. Used
// instead of I2F, which runs at a quarter of the FP32 rate.
__device__ __forceinline__ float to_f(u32 w, int i, float bias) {
    return __int_as_float(__byte_perm(w, 0x4B000000u, 0x7440u | (u32)i)) - bias;
}
#define MAGIC 8388608.f

// sum over the 4 bytes of w (unsigned, minus bias) times x
__device__ __forceinline__ float dot4(u32 w, float4 x, float bias, float acc) {
    acc = fmaf(to_f(w, 0, bias), x.x, acc);
    acc = fmaf(to_f(w, 1, bias), x.y, acc);
    acc = fmaf(to_f(w, 2, bias), x.z, acc);
    return fmaf(to_f(w, 3, bias), x.w, acc);
}

__device__ __forceinline__ float sum4(float4 v) { return (v.x + v.y) + (v.z + v.w); }

// A slot's activations: 32 floats in two runs of 16 (K types) or 16 in two runs of 8, and
// each run's sum (the min / offset terms).
struct FSlot {
    float4 a[4], b[4];
    float sa, sb;
};

// XSMEM: the block's copy of x in shared memory, float4 q stored at xswz<QT>(q): within each
// aligned 8 float4s (128 bytes: the banks once) a rotation by higher bits of q, so the 8 lanes
// of a quarter warp (the 8 slots of a block: every (p, h) of Q4_K, (h, c, lq) of Q6_K) read
// 8 different bank groups in each of a slot's loads. A bijection within each 8: the staging
// loop writes every float4 once.
template <int QT> __device__ __forceinline__ int xswz(int q) {
    if (QT == QT_Q4_K || QT == QT_Q4K_PAIR) return (q & ~7) | ((q + ((q >> 4) & 3)) & 7);
    if (QT == QT_Q6_K) return (q & ~7) | ((q + ((q >> 3) & 1) + 2 * ((q >> 5) & 1)) & 7);
    return q;
}

// float4 q of x: global (through L1) or, XSMEM, the block's shared copy
template <int QT> __device__ __forceinline__ float4 xld(const float* __restrict__ x, int q) {
#if XSMEM
    return ((const float4*)x)[xswz<QT>(q)];
#else
    return __ldg((const float4*)x + q);
#endif
}

// 16 floats from float4 q0 on, and their sum
template <int QT>
__device__ __forceinline__ void load16(const float* __restrict__ x, int q0, float4 (&v)[4],
                                       float& s) {
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = xld<QT>(x, q0 + i);
    s = (sum4(v[0]) + sum4(v[1])) + (sum4(v[2]) + sum4(v[3]));
}

// Per weight type: slots(K); WS the weight bytes of one slot of one row (loaded first, all of
// an iteration's at once); wload(row, s); xload(s, x); dot(WS, FSlot) -> the slot's sum.
template <int QT> struct VF {  // the 32-value block types: slot = common.cuh's group of 16
    struct WS {
        Run8 r0, r1;
    };
    static __device__ __forceinline__ int slots(int K) { return K / 16; }
    static __device__ __forceinline__ WS wload(const u8* __restrict__ row, int g) {
        WS w;
        decode_group<QT>(row + (size_t)(g / QTraits<QT>::GROUPS) * QTraits<QT>::BYTES,
                         g % QTraits<QT>::GROUPS, w.r0, w.r1);
        return w;
    }
    static __device__ __forceinline__ FSlot xload(int g, const float* __restrict__ x) {
        int o0, o1;
        run_offsets<QT>(g % QTraits<QT>::GROUPS, o0, o1);
        const int kb = (g / QTraits<QT>::GROUPS) * QTraits<QT>::BK;
        const int q0 = (kb + o0) / 4, q1 = (kb + o1) / 4;
        FSlot s;
        s.a[0] = xld<QT>(x, q0), s.a[1] = xld<QT>(x, q0 + 1);
        s.b[0] = xld<QT>(x, q1), s.b[1] = xld<QT>(x, q1 + 1);
        s.sa = sum4(s.a[0]) + sum4(s.a[1]);
        s.sb = sum4(s.b[0]) + sum4(s.b[1]);
        return s;
    }
    // Run8 quants are signed bytes: flipping the sign bit makes them u = q + 128
    static __device__ __forceinline__ float dot(const WS& w, const FSlot& x) {
        const float bias = MAGIC + 128.f;
        float qa = dot4(w.r0.q0 ^ 0x80808080u, x.a[0], bias, 0.f);
        qa = dot4(w.r0.q1 ^ 0x80808080u, x.a[1], bias, qa);
        float qb = dot4(w.r1.q0 ^ 0x80808080u, x.b[0], bias, 0.f);
        qb = dot4(w.r1.q1 ^ 0x80808080u, x.b[1], bias, qb);
        return (w.r0.a * qa + w.r0.b * x.sa) + (w.r1.a * qb + w.r1.b * x.sb);
    }
};

// Q4_K: the 6-bit scales and mins of sub-blocks 2p and 2p + 1 from the 12 scale bytes (the
// words s0 s1 s2 of hd.y .z .w) as the bytes of one word: sc(2p), sc(2p + 1), m(2p), m(2p + 1).
// Sub-blocks 0-3 are the low 6 bits of bytes of s0 (scales) and s1 (mins); 4-7 take their low 4
// bits from the nibbles of s2 and their top 2 from bits 6-7 of s0 / s1. Both gathers are one
// byte permute each; p is the same for every slot a lane takes (THREADS_PER_ROW % 8 == 0).
__device__ __forceinline__ u32 q4k_scales4(uint4 hd, int p) {
    const bool lo = p < 2;
    const u32 j = 2 * (p & 1);  // byte of sub-block 2p within its word
    const u32 sel = j | ((j + 1) << 4) | ((j + 4) << 8) | ((j + 5) << 12);
    const u32 L = __byte_perm(lo ? hd.y : hd.w, lo ? hd.z : hd.w, sel);
    const u32 H = __byte_perm(hd.y, hd.z, sel);
    // both forms, then a select: every 8 lanes hold all four p, so a branch would diverge
    const u32 hi = (L & 0x00000F0Fu) | ((L >> 4) & 0x0F0F0000u) | ((H >> 2) & 0x30303030u);
    return lo ? L & 0x3F3F3F3Fu : hi;
}

// Q4_K slot s = (block b, pair p, half h): qs[32p + 16h ..+16] holds elements 64p + 16h + j
// (low nibbles, sub-block 2p) and 64p + 32 + 16h + j (high, sub-block 2p + 1); the block's d,
// dmin and scales come in one more 16-byte load (an L1 hit for all but the first of the
// block's 8 slots).
template <> struct VF<QT_Q4_K> {
    struct WS {
        uint4 q, hd;
    };
    static __device__ __forceinline__ int slots(int K) { return K / 32; }
    static __device__ __forceinline__ WS wload(const u8* __restrict__ row, int s) {
        const int b = s >> 3, p = (s >> 1) & 3, h = s & 1;
        const u8* blk = row + 144 * b;
        WS w;
        w.q = wld16(blk + 16 + 32 * p + 16 * h);
        w.hd = ldg16(blk);  // not wld16: an L1 hit for the block's other slots
        return w;
    }
    static __device__ __forceinline__ FSlot xload(int s, const float* __restrict__ x) {
        const int b = s >> 3, p = (s >> 1) & 3, h = s & 1;
        const int q = 64 * b + 16 * p + 4 * h;  // float4 index of x[256b + 64p + 16h]
        FSlot f;
        load16<QT_Q4_K>(x, q, f.a, f.sa);
        load16<QT_Q4_K>(x, q + 8, f.b, f.sb);
        return f;
    }
    static __device__ __forceinline__ float dot(const WS& w, const FSlot& x, int s) {
        const int p = (s >> 1) & 3;
        const u32 q[4] = {w.q.x, w.q.y, w.q.z, w.q.w};
        float qa = 0.f, qb = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            qa = dot4(q[i] & 0x0F0F0F0Fu, x.a[i], MAGIC, qa);
            qb = dot4((q[i] >> 4) & 0x0F0F0F0Fu, x.b[i], MAGIC, qb);
        }
        const u32 sm = q4k_scales4(w.hd, p);
        const float d = h2f((u16)(w.hd.x & 0xFFFF)), dmin = h2f((u16)(w.hd.x >> 16));
        const float sc0 = to_f(sm, 0, MAGIC), sc1 = to_f(sm, 1, MAGIC);
        const float m0 = to_f(sm, 2, MAGIC), m1 = to_f(sm, 3, MAGIC);
        return d * (sc0 * qa + sc1 * qb) - dmin * (m0 * x.sa + m1 * x.sb);
    }
};

// Q6_K in 224-byte blocks (ql[128] qh[64] scales[16] d pad[14]). Slot s = (b, h, c, lq):
// ql[64h + 32c + 16lq ..+16] holds elements 128h + 32c + 16lq + j (low nibbles) and the same
// + 64 (high nibbles); qh[32h + 16lq ..+16] their top two bits (bits 2c and 2c + 4). q - 32.
template <> struct VF<QT_Q6_K> {
    struct WS {
        uint4 ql, qh;
        float da, db;  // d * scale of each run
    };
    static __device__ __forceinline__ int slots(int K) { return K / 32; }
    static __device__ __forceinline__ WS wload(const u8* __restrict__ row, int s) {
        const int b = s >> 3, h = (s >> 2) & 1, c = (s >> 1) & 1, lq = s & 1;
        const u8* blk = row + 224 * b;
        WS w;
        w.ql = wld16(blk + 64 * h + 32 * c + 16 * lq);
        w.qh = wld16(blk + 128 + 32 * h + 16 * lq);
        const u8* sc = blk + 192 + 8 * h + lq + 2 * c;
        const float d = ld_h(blk + 208);
        w.da = d * (float)(signed char)__ldg(sc);
        w.db = d * (float)(signed char)__ldg(sc + 4);
        return w;
    }
    static __device__ __forceinline__ FSlot xload(int s, const float* __restrict__ x) {
        const int b = s >> 3, h = (s >> 2) & 1, c = (s >> 1) & 1, lq = s & 1;
        const int q = 64 * b + 32 * h + 8 * c + 4 * lq;  // x[256b + 128h + 32c + 16lq]
        FSlot f;
        load16<QT_Q6_K>(x, q, f.a, f.sa);
        load16<QT_Q6_K>(x, q + 16, f.b, f.sb);
        return f;
    }
    static __device__ __forceinline__ float dot(const WS& w, const FSlot& x, int s) {
        const int c = (s >> 1) & 1;
        const int sl = 4 - 2 * c, sr = 2 * c;  // top bits 2c -> 4 (low run), 2c + 4 -> 4 (high)
        const u32 ql[4] = {w.ql.x, w.ql.y, w.ql.z, w.ql.w};
        const u32 qh[4] = {w.qh.x, w.qh.y, w.qh.z, w.qh.w};
        const float bias = MAGIC + 32.f;
        float qa = 0.f, qb = 0.f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const u32 ua = (ql[i] & 0x0F0F0F0Fu) | ((qh[i] << sl) & 0x30303030u);
            const u32 ub = ((ql[i] >> 4) & 0x0F0F0F0Fu) | ((qh[i] >> sr) & 0x30303030u);
            qa = dot4(ua, x.a[i], bias, qa);
            qb = dot4(ub, x.b[i], bias, qb);
        }
        return w.da * qa + w.db * qb;
    }
};

// Q4K_PAIR: Q4_K slot s = (block b, pair p): both 16-byte halves of qs[32p ..+32] (elements 64p + j
// low nibbles, 64p + 32 + j high, j < 32), one header load and one scale decode for 64 weights
// (half of the header loads, scale work and address arithmetic of VF<QT_Q4_K> per weight).
struct FSlot2 {
    float4 a0[4], a1[4], b0[4], b1[4];  // x[64p + 0..15], [16..31], [32..47], [48..63]
    float sa, sb;
};
template <> struct VF<QT_Q4K_PAIR> {
    struct WS {
        uint4 q0, q1, hd;
    };
    static __device__ __forceinline__ int slots(int K) { return K / 64; }
    static __device__ __forceinline__ WS wload(const u8* __restrict__ row, int s) {
        const u8* blk = row + 144 * (s >> 2) + 16 + 32 * (s & 3);
        WS w;
        w.q0 = wld16(blk);
        w.q1 = wld16(blk + 16);
        w.hd = ldg16(row + 144 * (s >> 2));
        return w;
    }
    static __device__ __forceinline__ FSlot2 xload(int s, const float* __restrict__ x) {
        const int q = 64 * (s >> 2) + 16 * (s & 3);  // float4 index of x[256b + 64p]
        FSlot2 f;
        float s0, s1, s2, s3;
        load16<QT_Q4K_PAIR>(x, q, f.a0, s0);
        load16<QT_Q4K_PAIR>(x, q + 4, f.a1, s1);
        load16<QT_Q4K_PAIR>(x, q + 8, f.b0, s2);
        load16<QT_Q4K_PAIR>(x, q + 12, f.b1, s3);
        f.sa = s0 + s1;
        f.sb = s2 + s3;
        return f;
    }
    static __device__ __forceinline__ float dot(const WS& w, const FSlot2& x, int s) {
        const u32 q0[4] = {w.q0.x, w.q0.y, w.q0.z, w.q0.w};
        const u32 q1[4] = {w.q1.x, w.q1.y, w.q1.z, w.q1.w};
        float qa0 = 0.f, qa1 = 0.f, qb0 = 0.f, qb1 = 0.f;  // four chains (latency)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            qa0 = dot4(q0[i] & 0x0F0F0F0Fu, x.a0[i], MAGIC, qa0);
            qa1 = dot4(q1[i] & 0x0F0F0F0Fu, x.a1[i], MAGIC, qa1);
            qb0 = dot4((q0[i] >> 4) & 0x0F0F0F0Fu, x.b0[i], MAGIC, qb0);
            qb1 = dot4((q1[i] >> 4) & 0x0F0F0F0Fu, x.b1[i], MAGIC, qb1);
        }
        const u32 sm = q4k_scales4(w.hd, s & 3);
        const float d = h2f((u16)(w.hd.x & 0xFFFF)), dmin = h2f((u16)(w.hd.x >> 16));
        const float sc0 = to_f(sm, 0, MAGIC), sc1 = to_f(sm, 1, MAGIC);
        const float m0 = to_f(sm, 2, MAGIC), m1 = to_f(sm, 3, MAGIC);
        return d * (sc0 * (qa0 + qa1) + sc1 * (qb0 + qb1)) - dmin * (m0 * x.sa + m1 * x.sb);
    }
};

// The 32-value types' dot takes no slot index; one call shape for all.
template <int QT, typename SlotT>
__device__ __forceinline__ float vf_dot(const typename VF<QT>::WS& w, const SlotT& x, int s) {
    if constexpr (QT == QT_Q4_K || QT == QT_Q6_K || QT == QT_Q4K_PAIR) {
        return VF<QT>::dot(w, x, s);
    } else {
        return VF<QT>::dot(w, x);
    }
}

// The ROWS_PER_THREAD dot products of rows row0.. (clamped to N - 1) by the calling group of THREADS_PER_ROW lanes;
// every lane of the group ends with the full sums (the whole group calls it: shuffles).
// W2 non-null (mmvf_glu): rows r < ROWS_PER_THREAD / 2 are W's rows row0 + r, the others W2's rows
// row0 + r - ROWS_PER_THREAD / 2 (gate and up of the same outputs, one activation load for both).
template <int QT>
__device__ __forceinline__ void mmvf_dot(const u8* __restrict__ W, int row_bytes, int N, int K,
                                         const float* __restrict__ x, int row0,
                                         float (&acc)[ROWS_PER_THREAD], const u8* __restrict__ W2 = nullptr) {
    const int lane = threadIdx.x % THREADS_PER_ROW;
    const int ns = VF<QT>::slots(K);
    const u8* rows[ROWS_PER_THREAD];
#pragma unroll
    for (int r = 0; r < ROWS_PER_THREAD; ++r) {
        const bool second = W2 != nullptr && r >= ROWS_PER_THREAD / 2;
        const int n = second ? row0 + r - ROWS_PER_THREAD / 2 : row0 + r;
        rows[r] = (second ? W2 : W) + (size_t)min(n, N - 1) * row_bytes;
        acc[r] = 0.f;
    }
    for (int s0 = lane; s0 < ns; s0 += THREADS_PER_ROW * UNROLL) {
        // every weight load of the iteration first, then the activations and the arithmetic.
        // The arithmetic of slots past the row is skipped: in the last iteration whole unroll
        // steps usually are (a 7B row has 112 Q4_K slots), so the branch is uniform over the
        // warp and saves their work (their loads read the last slot again: no branch there).
        typename VF<QT>::WS w[UNROLL][ROWS_PER_THREAD];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int s = min(s0 + u * THREADS_PER_ROW, ns - 1);  // past the row: a valid slot, unused
#pragma unroll
            for (int r = 0; r < ROWS_PER_THREAD; ++r) w[u][r] = VF<QT>::wload(rows[r], s);
        }
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            const int s = s0 + u * THREADS_PER_ROW;
            if (s < ns) {
                const auto xs = VF<QT>::xload(s, x);
#pragma unroll
                for (int r = 0; r < ROWS_PER_THREAD; ++r) acc[r] += vf_dot<QT>(w[u][r], xs, s);
            }
        }
    }
    constexpr int G = THREADS_PER_ROW < 32 ? THREADS_PER_ROW : 32;  // the group's lanes within one warp
    const unsigned mask =
        G == 32 ? 0xffffffffu : ((1u << G) - 1u) << ((threadIdx.x & 31) & ~(G - 1));
#pragma unroll
    for (int r = 0; r < ROWS_PER_THREAD; ++r) {
#pragma unroll
        for (int o = G / 2; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(mask, acc[r], o);
    }
#if THREADS_PER_ROW > 32
    // the group's THREADS_PER_ROW / 32 warps: each warp's sums through shared memory, added in warp order
    // by every lane of the group (the whole block calls this: no group leaves early)
    __shared__ float red[WARPS][ROWS_PER_THREAD];
    if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int r = 0; r < ROWS_PER_THREAD; ++r) red[threadIdx.x / 32][r] = acc[r];
    }
    __syncthreads();
    const int w0 = threadIdx.x / THREADS_PER_ROW * (THREADS_PER_ROW / 32);
#pragma unroll
    for (int r = 0; r < ROWS_PER_THREAD; ++r) {
        float v = 0.f;
#pragma unroll
        for (int i = 0; i < THREADS_PER_ROW / 32; ++i) v += red[w0 + i][r];
        acc[r] = v;
    }
#endif
}

// XSMEM: the block copies x [K] into shared memory (K * 4 bytes of dynamic shared memory, given
// by the launch) in xswz order, then its rows read it there. Every thread of the block calls
// it (the barrier), before any group leaves.
template <int QT> __device__ __forceinline__ const float* mmvf_x(const float* __restrict__ x,
                                                                  int K) {
#if XSMEM
    extern __shared__ float4 mmvf_xs[];
    for (int i = threadIdx.x; i < K / 4; i += blockDim.x)
        mmvf_xs[xswz<QT>(i)] = __ldg((const float4*)x + i);
    __syncthreads();
    return (const float*)mmvf_xs;
#else
    return x;
#endif
}

template <int QT>
__device__ __forceinline__ void mmvf_rows(const u8* __restrict__ W, int row_bytes, int N, int K,
                                          const float* __restrict__ x, float* Y, const float* A,
                                          int bi) {
    const int g = threadIdx.x / THREADS_PER_ROW, lane = threadIdx.x % THREADS_PER_ROW;
    constexpr int QE = Q4K_PAIR && QT == QT_Q4_K ? QT_Q4K_PAIR : QT;  // the slot form of the type
    x = mmvf_x<QE>(x, K);
    const int row0 = (bi * MMVF_GROUPS + g) * ROWS_PER_THREAD;
#if THREADS_PER_ROW <= 32
    if (row0 >= N) return;  // whole groups leave together: the shuffles stay full
#endif  // (THREADS_PER_ROW > 32: every thread reaches the barrier; rows past N are clamped, not written)
    float acc[ROWS_PER_THREAD];
    mmvf_dot<QE>(W, row_bytes, N, K, x, row0, acc);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < ROWS_PER_THREAD; ++r) {
            const int n = row0 + r;
            if (n < N) Y[n] = acc[r] + (A ? A[n] : 0.f);
        }
    }
}

// Matrix i: weights W_i [N_i, row_bytes_i] of GGML type qt_i, output Y_i [N_i], added A_i
// [N_i] or null. Y_i may be A_i (each element is read, then written, by one thread).
// mmvf takes any mix of types (a switch per block, registers for the widest type's code);
// mmvf_<type> serves launches whose matrices are all of one type (its own register budget).
// This block's matrix (W, rb, N, Y, A) and block index b within it.
#define MMVF_PICK                                                                           \
    int b = blockIdx.x;                                                                     \
    const u8* W = W0;                                                                       \
    int rb = rb0, N = N0;                                                                   \
    float* Y = Y0;                                                                          \
    const float* A = A0;                                                                    \
    if (b >= nb0 + nb1) {                                                                   \
        b -= nb0 + nb1;                                                                     \
        W = W2, rb = rb2, N = N2, Y = Y2, A = A2;                                           \
    } else if (b >= nb0) {                                                                  \
        b -= nb0;                                                                           \
        W = W1, rb = rb1, N = N1, Y = Y1, A = A1;                                           \
    }                                                                                       \
    pdl_start();

extern "C" __global__ void __launch_bounds__(WARPS * 32 MMVF_BOUNDS_MINB)
    mmvf(const float* __restrict__ x, int K, int nb0, int nb1,
         const u8* W0, int rb0, int N0, int qt0, float* Y0, const float* A0,
         const u8* W1, int rb1, int N1, int qt1, float* Y1, const float* A1,
         const u8* W2, int rb2, int N2, int qt2, float* Y2, const float* A2) {
    const int qt = blockIdx.x >= nb0 + nb1 ? qt2 : blockIdx.x >= nb0 ? qt1 : qt0;
    MMVF_PICK
    switch (qt) {
        case QT_Q4_K: mmvf_rows<QT_Q4_K>(W, rb, N, K, x, Y, A, b); break;
        case QT_Q6_K: mmvf_rows<QT_Q6_K>(W, rb, N, K, x, Y, A, b); break;
        case QT_Q4_0: mmvf_rows<QT_Q4_0>(W, rb, N, K, x, Y, A, b); break;
        case QT_Q4_1: mmvf_rows<QT_Q4_1>(W, rb, N, K, x, Y, A, b); break;
        case QT_Q5_0: mmvf_rows<QT_Q5_0>(W, rb, N, K, x, Y, A, b); break;
        case QT_Q8_0: mmvf_rows<QT_Q8_0>(W, rb, N, K, x, Y, A, b); break;
        default: break;
    }
}

#define MMVF_KERNEL(name, QT)                                                               \
    extern "C" __global__ void __launch_bounds__(WARPS * 32 MMVF_BOUNDS_MINB)                  \
        mmvf_##name(const float* __restrict__ x, int K, int nb0, int nb1, const u8* W0,        \
                    int rb0, int N0, int qt0, float* Y0, const float* A0, const u8* W1,        \
                    int rb1, int N1, int qt1, float* Y1, const float* A1, const u8* W2,        \
                    int rb2, int N2, int qt2, float* Y2, const float* A2) {                    \
        MMVF_PICK                                                                           \
        mmvf_rows<QT>(W, rb, N, K, x, Y, A, b);                                             \
    }

MMVF_KERNEL(q4_k, QT_Q4_K)
MMVF_KERNEL(q6_k, QT_Q6_K)
MMVF_KERNEL(q4_0, QT_Q4_0)
MMVF_KERNEL(q4_1, QT_Q4_1)
MMVF_KERNEL(q5_0, QT_Q5_0)
MMVF_KERNEL(q8_0, QT_Q8_0)

// matmul_decode.mmvf fuse_swiglu: y[n] = silu(gate[n] . x) * (up[n] . x), gate and up of one
// type and shape; a lane group walks ROWS_PER_THREAD / 2 rows of each together (ROWS_PER_THREAD even), so the block
// count is the gate launch's alone and no gate / up output goes through memory. silu * up as
// elementwise.cu's swiglu computes it (the same bits).
#define MMVF_GLU_KERNEL(name, QT)                                                           \
    extern "C" __global__ void __launch_bounds__(WARPS * 32 MMVF_BOUNDS_MINB)                  \
        mmvf_glu_##name(const float* __restrict__ x, int K, const u8* Wg, const u8* Wu,       \
                        int rb, int N, float* Y) {                                          \
        pdl_start();                                                                        \
        mmvf_glu_rows<QT>(Wg, Wu, rb, N, K, x, Y, blockIdx.x);                              \
    }

template <int QT>
__device__ __forceinline__ void mmvf_glu_rows(const u8* __restrict__ Wg, const u8* __restrict__ Wu,
                                              int row_bytes, int N, int K,
                                              const float* __restrict__ x, float* Y, int bi) {
    static_assert(ROWS_PER_THREAD % 2 == 0, "mmvf_glu pairs gate and up rows: ROWS_PER_THREAD even");
    constexpr int H = ROWS_PER_THREAD / 2;
    const int g = threadIdx.x / THREADS_PER_ROW, lane = threadIdx.x % THREADS_PER_ROW;
    constexpr int QE = Q4K_PAIR && QT == QT_Q4_K ? QT_Q4K_PAIR : QT;
    x = mmvf_x<QE>(x, K);
    const int row0 = (bi * MMVF_GROUPS + g) * H;
#if THREADS_PER_ROW <= 32
    if (row0 >= N) return;
#endif
    float acc[ROWS_PER_THREAD];
    mmvf_dot<QE>(Wg, row_bytes, N, K, x, row0, acc, Wu);
    if (lane == 0) {
#pragma unroll
        for (int r = 0; r < H; ++r) {
            const int n = row0 + r;
            const float v = acc[r], u = acc[r + H];
            if (n < N) Y[n] = v / (1.f + expf(-v)) * u;
        }
    }
}

#if ROWS_PER_THREAD % 2 == 0
MMVF_GLU_KERNEL(q4_k, QT_Q4_K)
MMVF_GLU_KERNEL(q6_k, QT_Q6_K)
MMVF_GLU_KERNEL(q4_0, QT_Q4_0)
MMVF_GLU_KERNEL(q4_1, QT_Q4_1)
MMVF_GLU_KERNEL(q5_0, QT_Q5_0)
MMVF_GLU_KERNEL(q8_0, QT_Q8_0)
#endif
