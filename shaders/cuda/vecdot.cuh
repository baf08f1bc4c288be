// vecdot.cuh: integer dot products of GGML weight blocks with Q8_1 activations (q8.cu), shared
// by the decode matrix-vector kernels (mmvq.cu, mmvw.cu).
//
// Q8_1 activations: xq int8 [K], xds float2 [K / 32] = (d, d * sum q) per 32 values.
// A "slot" is the unit one thread takes per row: 32 weights (one 16-byte load of quants) for
// Q4_K and Q6_K, one 16-weight group of common.cuh's decoder for the 32-value block types.
// VD<QT>::load reads the slot's activations (shared by every row a thread walks), VD<QT>::dot
// the weights of one row and returns the slot's float contribution.
#pragma once
#include "common.cuh"

typedef signed char s8;

__device__ __forceinline__ int dp4a(u32 a, u32 b, int c) { return __dp4a((int)a, (int)b, c); }

__device__ __forceinline__ uint4 ldg16(const void* p) { return __ldg((const uint4*)p); }

// Weight loads of the K types (mmvw's knob matmul_decode.wload, the define WLOAD): 0 __ldg
// (ld.global.nc); 1 also L1::no_allocate (weights are read once: keep L1 for the activations);
// 2 also L2::256B (the L2 fetches the whole 256-byte run a warp's neighbours read next).
#ifndef WLOAD
#define WLOAD 0
#endif
__device__ __forceinline__ uint4 wld16(const void* p) {
#if WLOAD == 0
    return ldg16(p);
#else
    uint4 r;
#if WLOAD == 1
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
#else
    asm("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w) : "l"(p));
#endif
    return r;
#endif
}

// S: the row lies in shared memory (mmvw's STAGE: a bulk copy put it there), read generically.
template <bool S> __device__ __forceinline__ uint4 wl16(const u8* p) {
    return S ? *(const uint4*)p : wld16(p);
}
template <bool S> __device__ __forceinline__ int wl_s8(const u8* p) {
    return S ? (int)*(const s8*)p : (int)(s8)__ldg(p);
}
template <bool S> __device__ __forceinline__ float wl_h(const u8* p) {
    return S ? h2f(*(const u16*)p) : ld_h(p);
}

// Q4_K sub-block scale and min (6 bits each) of sub-block j from the 12 scale bytes as 3 words.
__device__ __forceinline__ void q4k_sm(u32 s0, u32 s1, u32 s2, int j, int& sc, int& m) {
    if (j < 4) {
        sc = (s0 >> (8 * j)) & 63;
        m = (s1 >> (8 * j)) & 63;
    } else {
        const int i = 8 * (j - 4);
        sc = ((s2 >> i) & 0xF) | (((s0 >> (i + 6)) & 3) << 4);
        m = ((s2 >> (i + 4)) & 0xF) | (((s1 >> (i + 6)) & 3) << 4);
    }
}

#ifndef Q4K_LEAN
#define Q4K_LEAN 0
#endif
// Q4K_LEAN (mmvw's knob q4k_lean): sub-blocks 2p and 2p + 1's scales and mins from the 3 scale
// words, branch-free (q4k_sm branches on j < 4: lanes of one warp hold different pairs, so a
// warp ran both sides): the four 6-bit scales (mins) of pair half p >> 1 packed one a byte,
// then bytes 2 (p & 1) and 2 (p & 1) + 1. The same integers as q4k_sm.
__device__ __forceinline__ void q4k_sm_pair(u32 s0, u32 s1, u32 s2, int p, int& sc0, int& sc1,
                                            int& m0, int& m1) {
    const u32 M = 0x0F0F0F0Fu, H = 0x30303030u;
    const bool hi = p >= 2;
    const u32 a = hi ? (s2 & M) | ((s0 >> 2) & H) : s0 & 0x3F3F3F3Fu;
    const u32 b = hi ? ((s2 >> 4) & M) | ((s1 >> 2) & H) : s1 & 0x3F3F3F3Fu;
    const int sh = 16 * (p & 1);
    sc0 = (a >> sh) & 0xFF, sc1 = (a >> (sh + 8)) & 0xFF;
    m0 = (b >> sh) & 0xFF, m1 = (b >> (sh + 8)) & 0xFF;
}

// sum over 4 words of (the high nibbles of q, as 16 x nibble) x (signed x): dp4a with unsigned
// weight bytes (dp4a.u32.s32), then / 16, exact (every term is a multiple of 16): the high
// nibbles' dot product without a shift per word.
__device__ __forceinline__ int dp4a_hi4(uint4 q, uint4 x) {
    const u32 H = 0xF0F0F0F0u;
    int d = 0;
    asm("dp4a.u32.s32 %0, %1, %2, %0;" : "+r"(d) : "r"(q.x & H), "r"(x.x));
    asm("dp4a.u32.s32 %0, %1, %2, %0;" : "+r"(d) : "r"(q.y & H), "r"(x.y));
    asm("dp4a.u32.s32 %0, %1, %2, %0;" : "+r"(d) : "r"(q.z & H), "r"(x.z));
    asm("dp4a.u32.s32 %0, %1, %2, %0;" : "+r"(d) : "r"(q.w & H), "r"(x.w));
    return d >> 4;
}

// A slot's activations: two 16-byte runs (K types) or two 8-byte runs (the others), their
// Q8_1 scales and the sums the weight offsets need.
struct XSlot {
    uint4 a, b;
    float2 da, db;
    int oa, ob;
};

// The 32-value block types: slot = group g (16 weights, runs at k0 and k1 of one Q8_1 block).
template <int QT> struct VD {
    static __device__ __forceinline__ int slots(int K) { return K / 16; }
    static __device__ __forceinline__ XSlot load(int g, const s8* __restrict__ xq,
                                                 const float2* __restrict__ xds) {
        int o0, o1;
        run_offsets<QT>(g % QTraits<QT>::GROUPS, o0, o1);
        const int kb = (g / QTraits<QT>::GROUPS) * QTraits<QT>::BK;
        const uint2 x0 = __ldg((const uint2*)(xq + kb + o0));
        const uint2 x1 = __ldg((const uint2*)(xq + kb + o1));
        XSlot x;
        x.a = make_uint4(x0.x, x0.y, 0u, 0u);
        x.b = make_uint4(x1.x, x1.y, 0u, 0u);
        x.da = __ldg(xds + (kb + o0) / 32);
        x.db = x.da;
        x.oa = QT == QT_Q4_1 ? dp4a(0x01010101u, x0.x, dp4a(0x01010101u, x0.y, 0)) : 0;
        x.ob = QT == QT_Q4_1 ? dp4a(0x01010101u, x1.x, dp4a(0x01010101u, x1.y, 0)) : 0;
        return x;
    }
    template <bool S = false>  // never staged: the 32-value types read global memory
    static __device__ __forceinline__ float dot(const u8* __restrict__ row, int g,
                                                const XSlot& x) {
        Run8 a, b;
        decode_group<QT>(row + (size_t)(g / QTraits<QT>::GROUPS) * QTraits<QT>::BYTES,
                         g % QTraits<QT>::GROUPS, a, b);
        const int sa = dp4a(a.q1, x.a.y, dp4a(a.q0, x.a.x, 0));
        const int sb = dp4a(b.q1, x.b.y, dp4a(b.q0, x.b.x, 0));
        float v = x.da.x * (a.a * (float)sa + b.a * (float)sb);
        if (QT == QT_Q4_1) v += x.da.x * (a.b * (float)x.oa + b.b * (float)x.ob);
        return v;
    }
};

// The narrow Q4_K slot (32 weights) as free functions on registers, used by VD<QT_Q4_K> (when
// not Q4K_WIDE): its activations, and its contribution from the block header hd (16 bytes) and
// the slot's 16 qs bytes q, already loaded.
__device__ __forceinline__ XSlot q4k_xload(int s, const s8* __restrict__ xq,
                                           const float2* __restrict__ xds) {
    const int b = s >> 3, p = (s >> 1) & 3, h = s & 1;
    const int k0 = 256 * b + 64 * p + 16 * h;
    XSlot x;
    x.a = ldg16(xq + k0);
    x.b = ldg16(xq + k0 + 32);
    x.da = __ldg(xds + 8 * b + 2 * p);
    x.db = __ldg(xds + 8 * b + 2 * p + 1);
    x.oa = x.ob = 0;
    return x;
}
__device__ __forceinline__ float q4k_slot(uint4 hd, uint4 q, int s, const XSlot& x) {
    const int p = (s >> 1) & 3, h = s & 1;
    int d0 = dp4a(q.x & 0x0F0F0F0Fu, x.a.x, 0);
    d0 = dp4a(q.y & 0x0F0F0F0Fu, x.a.y, d0);
    d0 = dp4a(q.z & 0x0F0F0F0Fu, x.a.z, d0);
    d0 = dp4a(q.w & 0x0F0F0F0Fu, x.a.w, d0);
#if Q4K_LEAN  // no shifts, no divergent branches: the same integers and float expressions
    const int d1 = dp4a_hi4(q, x.b);
    int sc0, m0, sc1, m1;
    q4k_sm_pair(hd.y, hd.z, hd.w, p, sc0, sc1, m0, m1);
    const float d = h2f((u16)(hd.x & 0xFFFF)), dmin = h2f((u16)(hd.x >> 16));
    const float v = d * ((float)(sc0 * d0) * x.da.x + (float)(sc1 * d1) * x.db.x);
    const float t = dmin * ((float)m0 * x.da.y + (float)m1 * x.db.y);
    return h == 0 ? v - t : v;
#else
    int d1 = dp4a((q.x >> 4) & 0x0F0F0F0Fu, x.b.x, 0);
    d1 = dp4a((q.y >> 4) & 0x0F0F0F0Fu, x.b.y, d1);
    d1 = dp4a((q.z >> 4) & 0x0F0F0F0Fu, x.b.z, d1);
    d1 = dp4a((q.w >> 4) & 0x0F0F0F0Fu, x.b.w, d1);
    int sc0, m0, sc1, m1;
    q4k_sm(hd.y, hd.z, hd.w, 2 * p, sc0, m0);
    q4k_sm(hd.y, hd.z, hd.w, 2 * p + 1, sc1, m1);
    const float d = h2f((u16)(hd.x & 0xFFFF)), dmin = h2f((u16)(hd.x >> 16));
    float v = d * ((float)(sc0 * d0) * x.da.x + (float)(sc1 * d1) * x.db.x);
    if (h == 0) v -= dmin * ((float)m0 * x.da.y + (float)m1 * x.db.y);
    return v;
#endif
}

#ifndef Q4K_WIDE
#define Q4K_WIDE 0
#endif
// A wide Q4_K slot's activations (Q4K_WIDE): 64 int8 in four 16-byte runs, two Q8_1 scales.
struct XSlotW {
    uint4 a, b, c, d;
    float2 da, db;
};

// The wide Q4_K slot (64 weights) as free functions on registers, used by VD<QT_Q4_K> under
// Q4K_WIDE: slot s = all 32 qs bytes of pair p = s & 3 of block
// s >> 2 (q0, q1: two 16-byte loads), sub-blocks 2p (low nibbles) and 2p + 1 (high), 64 weights
// against 64 contiguous activations. Per 16 weight bytes half the header loads, scale decodes,
// Q8_1 scale loads and float work of the narrow slot, and both halves' min term in one slot.
__device__ __forceinline__ XSlotW q4kw_xload(int s, const s8* __restrict__ xq,
                                             const float2* __restrict__ xds) {
    const int b = s >> 2, p = s & 3;
    const s8* x0 = xq + 256 * b + 64 * p;
    XSlotW x;
    x.a = ldg16(x0);
    x.b = ldg16(x0 + 16);
    x.c = ldg16(x0 + 32);
    x.d = ldg16(x0 + 48);
    x.da = __ldg(xds + 8 * b + 2 * p);
    x.db = __ldg(xds + 8 * b + 2 * p + 1);
    return x;
}
__device__ __forceinline__ float q4kw_slot(uint4 hd, uint4 q0, uint4 q1, int s,
                                           const XSlotW& x) {
    const int p = s & 3;
    const u32 M = 0x0F0F0F0Fu;
    int d0 = dp4a(q0.x & M, x.a.x, 0);
    d0 = dp4a(q0.y & M, x.a.y, d0);
    d0 = dp4a(q0.z & M, x.a.z, d0);
    d0 = dp4a(q0.w & M, x.a.w, d0);
    d0 = dp4a(q1.x & M, x.b.x, d0);
    d0 = dp4a(q1.y & M, x.b.y, d0);
    d0 = dp4a(q1.z & M, x.b.z, d0);
    d0 = dp4a(q1.w & M, x.b.w, d0);
    const uint4 xd = x.d;
#if Q4K_LEAN
    const int d1 = dp4a_hi4(q0, x.c) + dp4a_hi4(q1, xd);
    int sc0, m0, sc1, m1;
    q4k_sm_pair(hd.y, hd.z, hd.w, p, sc0, sc1, m0, m1);
#else
    int d1 = dp4a((q0.x >> 4) & M, x.c.x, 0);
    d1 = dp4a((q0.y >> 4) & M, x.c.y, d1);
    d1 = dp4a((q0.z >> 4) & M, x.c.z, d1);
    d1 = dp4a((q0.w >> 4) & M, x.c.w, d1);
    d1 = dp4a((q1.x >> 4) & M, xd.x, d1);
    d1 = dp4a((q1.y >> 4) & M, xd.y, d1);
    d1 = dp4a((q1.z >> 4) & M, xd.z, d1);
    d1 = dp4a((q1.w >> 4) & M, xd.w, d1);
    int sc0, m0, sc1, m1;
    q4k_sm(hd.y, hd.z, hd.w, 2 * p, sc0, m0);
    q4k_sm(hd.y, hd.z, hd.w, 2 * p + 1, sc1, m1);
#endif
    const float d = h2f((u16)(hd.x & 0xFFFF)), dmin = h2f((u16)(hd.x >> 16));
    float v = d * ((float)(sc0 * d0) * x.da.x + (float)(sc1 * d1) * x.db.x);
    v -= dmin * ((float)m0 * x.da.y + (float)m1 * x.db.y);
    return v;
}

#if Q4K_WIDE
// Q4K_WIDE (mmvw's knob q4k_wide): vecdot's slot is the wide one above.
template <> struct VD<QT_Q4_K> {
    static __device__ __forceinline__ int slots(int K) { return K / 64; }
    static __device__ __forceinline__ XSlotW load(int s, const s8* __restrict__ xq,
                                                  const float2* __restrict__ xds) {
        return q4kw_xload(s, xq, xds);
    }
    template <bool S = false>
    static __device__ __forceinline__ float dot(const u8* __restrict__ row, int s,
                                                const XSlotW& x) {
        const u8* blk = row + 144 * (s >> 2) + 32 * (s & 3);
        return q4kw_slot(wl16<S>(row + 144 * (s >> 2)), wl16<S>(blk + 16), wl16<S>(blk + 32), s,
                         x);
    }
};
#else
// Q4_K: slot s = 16 bytes of qs: 16 low nibbles (sub-block 2p, half h) and 16 high (2p + 1);
// the block's d, dmin and 12 scale bytes come in one more 16-byte load (an L1 hit for all but
// the first of the block's 8 slots). The min term uses d * sum(q) of the Q8_1 block and is
// added by the slot holding the first half of the sub-block.
template <> struct VD<QT_Q4_K> {
    static __device__ __forceinline__ int slots(int K) { return K / 32; }
    static __device__ __forceinline__ XSlot load(int s, const s8* __restrict__ xq,
                                                 const float2* __restrict__ xds) {
        return q4k_xload(s, xq, xds);
    }
    template <bool S = false>
    static __device__ __forceinline__ float dot(const u8* __restrict__ row, int s,
                                                const XSlot& x) {
        const u8* blk = row + 144 * (s >> 3);
        return q4k_slot(wl16<S>(blk), wl16<S>(blk + 16 + 32 * ((s >> 1) & 3) + 16 * (s & 1)),
                        s, x);
    }
};
#endif

// The narrow Q6_K slot (32 weights; slot s = (b, h, c, lq), layout below) as free functions on
// registers, used by VD<QT_Q6_K> (when not Q6K_WIDE): its activations with
// the -32 offsets' sums, and its contribution from ql / qh (16 bytes each), the two scales and d.
__device__ __forceinline__ XSlot q6k_xload(int s, const s8* __restrict__ xq,
                                           const float2* __restrict__ xds) {
    const int b = s >> 3, h = (s >> 2) & 1, c = (s >> 1) & 1, lq = s & 1;
    const int ka = 256 * b + 128 * h + 32 * c + 16 * lq;
    XSlot x;
    x.a = ldg16(xq + ka);
    x.b = ldg16(xq + ka + 64);
    x.da = __ldg(xds + 8 * b + 4 * h + c);
    x.db = __ldg(xds + 8 * b + 4 * h + c + 2);
    int oa = dp4a(0x20202020u, x.a.x, 0);
    oa = dp4a(0x20202020u, x.a.y, oa);
    oa = dp4a(0x20202020u, x.a.z, oa);
    x.oa = dp4a(0x20202020u, x.a.w, oa);
    int ob = dp4a(0x20202020u, x.b.x, 0);
    ob = dp4a(0x20202020u, x.b.y, ob);
    ob = dp4a(0x20202020u, x.b.z, ob);
    x.ob = dp4a(0x20202020u, x.b.w, ob);
    return x;
}
__device__ __forceinline__ float q6k_slot(uint4 ql, uint4 qh, int sca, int scb, float d, int s,
                                          const XSlot& x) {
    const int c = (s >> 1) & 1;
    const int sha = 2 * c, shb = 2 * c + 4;
    int da = -x.oa, db = -x.ob;
    da = dp4a((ql.x & 0x0F0F0F0Fu) | (((qh.x >> sha) & 0x03030303u) << 4), x.a.x, da);
    da = dp4a((ql.y & 0x0F0F0F0Fu) | (((qh.y >> sha) & 0x03030303u) << 4), x.a.y, da);
    da = dp4a((ql.z & 0x0F0F0F0Fu) | (((qh.z >> sha) & 0x03030303u) << 4), x.a.z, da);
    da = dp4a((ql.w & 0x0F0F0F0Fu) | (((qh.w >> sha) & 0x03030303u) << 4), x.a.w, da);
    db = dp4a(((ql.x >> 4) & 0x0F0F0F0Fu) | (((qh.x >> shb) & 0x03030303u) << 4), x.b.x, db);
    db = dp4a(((ql.y >> 4) & 0x0F0F0F0Fu) | (((qh.y >> shb) & 0x03030303u) << 4), x.b.y, db);
    db = dp4a(((ql.z >> 4) & 0x0F0F0F0Fu) | (((qh.z >> shb) & 0x03030303u) << 4), x.b.z, db);
    db = dp4a(((ql.w >> 4) & 0x0F0F0F0Fu) | (((qh.w >> shb) & 0x03030303u) << 4), x.b.w, db);
    return d * ((float)(sca * da) * x.da.x + (float)(scb * db) * x.db.x);
}

#ifndef Q6K_WIDE
#define Q6K_WIDE 0
#endif
// A wide Q6_K slot's activations (Q6K_WIDE): runs a (ql low nibbles) and b (high), 32 int8 each
// as two 16-byte halves, their Q8_1 scales, and each 16's dp4a against 0x20 (the -32 offset).
struct XSlot6W {
    uint4 a0, a1, b0, b1;
    float2 da, db;
    int oa0, oa1, ob0, ob1;
};

#if Q6K_WIDE
// Q6K_WIDE (mmvw's knob q6k_wide): slot s = (b, h, c) = both lq halves of the narrow slot
// below: ql[64h + 32c ..+32] and qh[32h ..+32] in four 16-byte loads, 64 weights against two
// 32-value runs of activations (one Q8_1 block each); half the per-slot work per weight byte.
template <> struct VD<QT_Q6_K> {
    static __device__ __forceinline__ int slots(int K) { return K / 64; }
    static __device__ __forceinline__ int off(uint4 v) {
        int o = dp4a(0x20202020u, v.x, 0);
        o = dp4a(0x20202020u, v.y, o);
        o = dp4a(0x20202020u, v.z, o);
        return dp4a(0x20202020u, v.w, o);
    }
    static __device__ __forceinline__ XSlot6W load(int s, const s8* __restrict__ xq,
                                                   const float2* __restrict__ xds) {
        const int b = s >> 2, h = (s >> 1) & 1, c = s & 1;
        const s8* x0 = xq + 256 * b + 128 * h + 32 * c;
        XSlot6W x;
        x.a0 = ldg16(x0);
        x.a1 = ldg16(x0 + 16);
        x.b0 = ldg16(x0 + 64);
        x.b1 = ldg16(x0 + 80);
        x.da = __ldg(xds + 8 * b + 4 * h + c);
        x.db = __ldg(xds + 8 * b + 4 * h + c + 2);
        x.oa0 = off(x.a0), x.oa1 = off(x.a1), x.ob0 = off(x.b0), x.ob1 = off(x.b1);
        return x;
    }
    // 16 values: ql's nibbles (shift 0 or 4) with qh's 2 bits at sh, against x, less 32 * sum x
    static __device__ __forceinline__ int run16(uint4 ql, uint4 qh, int lo, int sh, uint4 x,
                                                int o) {
        int d = -o;
        d = dp4a(((ql.x >> lo) & 0x0F0F0F0Fu) | (((qh.x >> sh) & 0x03030303u) << 4), x.x, d);
        d = dp4a(((ql.y >> lo) & 0x0F0F0F0Fu) | (((qh.y >> sh) & 0x03030303u) << 4), x.y, d);
        d = dp4a(((ql.z >> lo) & 0x0F0F0F0Fu) | (((qh.z >> sh) & 0x03030303u) << 4), x.z, d);
        d = dp4a(((ql.w >> lo) & 0x0F0F0F0Fu) | (((qh.w >> sh) & 0x03030303u) << 4), x.w, d);
        return d;
    }
    template <bool S = false>
    static __device__ __forceinline__ float dot(const u8* __restrict__ row, int s,
                                                const XSlot6W& x) {
        const int b = s >> 2, h = (s >> 1) & 1, c = s & 1;
        const u8* blk = row + 224 * b;
        const uint4 ql0 = wl16<S>(blk + 64 * h + 32 * c), ql1 = wl16<S>(blk + 64 * h + 32 * c + 16);
        const uint4 qh0 = wl16<S>(blk + 128 + 32 * h), qh1 = wl16<S>(blk + 128 + 32 * h + 16);
        const u8* sc = blk + 192 + 8 * h + 2 * c;  // lq 0, 1 at sc[0], sc[1]; +64 at sc[4], sc[5]
        const float d = wl_h<S>(blk + 208);
        const int sa0 = wl_s8<S>(sc), sa1 = wl_s8<S>(sc + 1);
        const int sb0 = wl_s8<S>(sc + 4), sb1 = wl_s8<S>(sc + 5);
        const int sha = 2 * c, shb = 2 * c + 4;
        const int da0 = run16(ql0, qh0, 0, sha, x.a0, x.oa0);
        const int da1 = run16(ql1, qh1, 0, sha, x.a1, x.oa1);
        const int db0 = run16(ql0, qh0, 4, shb, x.b0, x.ob0);
        const int sbx = sb1;
        const int db1 = run16(ql1, qh1, 4, shb, x.b1, x.ob1);
        return d * ((float)(sa0 * da0 + sa1 * da1) * x.da.x +
                    (float)(sb0 * db0 + sbx * db1) * x.db.x);
    }
};
#else
// Q6_K in 224-byte blocks (ql[128] qh[64] scales[16] d pad[14]). Slot s = (b, h, c, lq):
// ql[64h + 32c + 16lq ..+16] holds quarter c (low nibbles) and c + 2 (high), qh[32h + 16lq
// ..+16] their top bits; the -32 offset is a dp4a of the activations against 0x20202020.
template <> struct VD<QT_Q6_K> {
    static __device__ __forceinline__ int slots(int K) { return K / 32; }
    static __device__ __forceinline__ XSlot load(int s, const s8* __restrict__ xq,
                                                 const float2* __restrict__ xds) {
        return q6k_xload(s, xq, xds);
    }
    template <bool S = false>
    static __device__ __forceinline__ float dot(const u8* __restrict__ row, int s,
                                                const XSlot& x) {
        const int b = s >> 3, h = (s >> 2) & 1, c = (s >> 1) & 1, lq = s & 1;
        const u8* blk = row + 224 * b;
        const uint4 ql = wl16<S>(blk + 64 * h + 32 * c + 16 * lq);
        const uint4 qh = wl16<S>(blk + 128 + 32 * h + 16 * lq);
        const u8* sc = blk + 192 + 8 * h + lq + 2 * c;
        return q6k_slot(ql, qh, wl_s8<S>(sc), wl_s8<S>(sc + 4), wl_h<S>(blk + 208), s, x);
    }
};
#endif
