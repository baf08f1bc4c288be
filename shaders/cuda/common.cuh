// common.cuh: helpers and GGML block decoders shared by every CUDA kernel of the engine.
//
// Included textually by engine/backends/cuda/kernels.py (no include paths, no CUDA headers:
// NVRTC of CUDA 12 and 13 both compile it without cuda_fp16.h).
//
// The decoder contract. A "group" is 16 weights of one row, given as two runs of 8 weights.
// Each run is 8 int8 quants packed in two 32-bit words plus an affine map, weight = a * q + b:
// every supported block type fits this form with one (a, b) per run (Q4_K: per 32-element
// sub-block, Q6_K: per 16, the 32-element types: per block). Because of that one decoder per
// type serves the float DMMV (a * sum(q x) + b * sum(x)), the int8 paths (q and a, b used
// separately) and the dequantize-to-fp16 paths. Groups are numbered along the row; four
// consecutive groups cover one 64-wide k window exactly, for every type, which is what the
// tiled GEMM kernels rely on.
//
// Types (GGML ids): Q4_0=2 Q4_1=3 Q5_0=6 Q8_0=8 Q4_K=12 Q6_K=14. Float types F32=0, F16=1 and
// BF16=30 are handled by the dense paths (see DENSE_GET below), not by this decoder.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;

#define QT_F32 0
#define QT_F16 1
#define QT_Q4_0 2
#define QT_Q4_1 3
#define QT_Q5_0 6
#define QT_Q8_0 8
#define QT_Q4_K 12
#define QT_Q6_K 14
#define QT_BF16 30

__device__ __forceinline__ float h2f(u16 h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

__device__ __forceinline__ u16 f2h(float f) {
    u16 h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}

// Two floats to a packed f16x2, lo in the low half.
__device__ __forceinline__ u32 f2h2(float lo, float hi) {
    u32 r;
    asm("cvt.rn.f16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
    return r;
}

__device__ __forceinline__ float bf2f(u16 h) { return __uint_as_float(((u32)h) << 16); }

// 16-bit loads: several block types are 2-byte aligned only (18, 22, 34, 210 bytes).
__device__ __forceinline__ u32 ld_u32_a2(const u8* p) {
    const u16* q = (const u16*)p;
    return (u32)__ldg(q) | ((u32)__ldg(q + 1) << 16);
}

__device__ __forceinline__ float ld_h(const u8* p) { return h2f(__ldg((const u16*)p)); }

struct Run8 {
    u32 q0, q1;  // 8 signed int8 quants, element 0 in the low byte of q0
    float a, b;  // weight = a * q + b
};

template <int QT> struct QTraits;
template <> struct QTraits<QT_Q4_0> { enum { BK = 32, BYTES = 18, GROUPS = 2 }; };
template <> struct QTraits<QT_Q4_1> { enum { BK = 32, BYTES = 20, GROUPS = 2 }; };
template <> struct QTraits<QT_Q5_0> { enum { BK = 32, BYTES = 22, GROUPS = 2 }; };
template <> struct QTraits<QT_Q8_0> { enum { BK = 32, BYTES = 34, GROUPS = 2 }; };
template <> struct QTraits<QT_Q4_K> { enum { BK = 256, BYTES = 144, GROUPS = 16 }; };
// Q6_K blocks are 210 bytes in GGUF and padded to 224 on the GPU (CudaBackend.load_weight):
// every field then sits at a 16-byte-aligned offset for the 16-byte loads of mmvq.cu.
template <> struct QTraits<QT_Q6_K> { enum { BK = 256, BYTES = 224, GROUPS = 16 }; };

// Element offsets of the two runs of group gi inside its block.
template <int QT> __device__ __forceinline__ void run_offsets(int gi, int& o0, int& o1);

template <int QT> __device__ __forceinline__ void decode_group(const u8* blk, int gi, Run8& r0,
                                                               Run8& r1);

// --- Q4_0: d f16, qs[16]; element j low nibble of qs[j], element j+16 its high nibble, q-8 ---
template <> __device__ __forceinline__ void run_offsets<QT_Q4_0>(int gi, int& o0, int& o1) {
    o0 = 8 * gi;
    o1 = 16 + 8 * gi;
}
template <> __device__ __forceinline__ void decode_group<QT_Q4_0>(const u8* blk, int gi, Run8& r0,
                                                                  Run8& r1) {
    const float d = ld_h(blk);
    const u32 w0 = ld_u32_a2(blk + 2 + 8 * gi), w1 = ld_u32_a2(blk + 2 + 8 * gi + 4);
    r0.q0 = __vsub4(w0 & 0x0F0F0F0Fu, 0x08080808u);
    r0.q1 = __vsub4(w1 & 0x0F0F0F0Fu, 0x08080808u);
    r1.q0 = __vsub4((w0 >> 4) & 0x0F0F0F0Fu, 0x08080808u);
    r1.q1 = __vsub4((w1 >> 4) & 0x0F0F0F0Fu, 0x08080808u);
    r0.a = r1.a = d;
    r0.b = r1.b = 0.f;
}

// --- Q4_1: d f16, m f16, qs[16]; weight = d * nibble + m ---
template <> __device__ __forceinline__ void run_offsets<QT_Q4_1>(int gi, int& o0, int& o1) {
    o0 = 8 * gi;
    o1 = 16 + 8 * gi;
}
template <> __device__ __forceinline__ void decode_group<QT_Q4_1>(const u8* blk, int gi, Run8& r0,
                                                                  Run8& r1) {
    const float d = ld_h(blk), m = ld_h(blk + 2);
    const u32 w0 = ld_u32_a2(blk + 4 + 8 * gi), w1 = ld_u32_a2(blk + 4 + 8 * gi + 4);
    r0.q0 = w0 & 0x0F0F0F0Fu;
    r0.q1 = w1 & 0x0F0F0F0Fu;
    r1.q0 = (w0 >> 4) & 0x0F0F0F0Fu;
    r1.q1 = (w1 >> 4) & 0x0F0F0F0Fu;
    r0.a = r1.a = d;
    r0.b = r1.b = m;
}

// --- Q5_0: d f16, qh u32 (bit j: 5th bit of element j), qs[16]; q - 16 ---
template <> __device__ __forceinline__ void run_offsets<QT_Q5_0>(int gi, int& o0, int& o1) {
    o0 = 8 * gi;
    o1 = 16 + 8 * gi;
}
// Spread 4 bits (bit i of v) to bit 4 of byte i.
__device__ __forceinline__ u32 spread4_bit4(u32 v) {
    return ((v & 1u) << 4) | ((v & 2u) << 11) | ((v & 4u) << 18) | ((v & 8u) << 25);
}
template <> __device__ __forceinline__ void decode_group<QT_Q5_0>(const u8* blk, int gi, Run8& r0,
                                                                  Run8& r1) {
    const float d = ld_h(blk);
    const u32 qh = ld_u32_a2(blk + 2);
    const u32 w0 = ld_u32_a2(blk + 6 + 8 * gi), w1 = ld_u32_a2(blk + 6 + 8 * gi + 4);
    const int j = 8 * gi;  // low run: elements j..j+7 use bits j..; high run: bits j+16..
    r0.q0 = __vsub4((w0 & 0x0F0F0F0Fu) | spread4_bit4(qh >> j), 0x10101010u);
    r0.q1 = __vsub4((w1 & 0x0F0F0F0Fu) | spread4_bit4(qh >> (j + 4)), 0x10101010u);
    r1.q0 = __vsub4(((w0 >> 4) & 0x0F0F0F0Fu) | spread4_bit4(qh >> (j + 16)), 0x10101010u);
    r1.q1 = __vsub4(((w1 >> 4) & 0x0F0F0F0Fu) | spread4_bit4(qh >> (j + 20)), 0x10101010u);
    r0.a = r1.a = d;
    r0.b = r1.b = 0.f;
}

// --- Q8_0: d f16, qs[32] int8 ---
template <> __device__ __forceinline__ void run_offsets<QT_Q8_0>(int gi, int& o0, int& o1) {
    o0 = 16 * gi;
    o1 = 16 * gi + 8;
}
template <> __device__ __forceinline__ void decode_group<QT_Q8_0>(const u8* blk, int gi, Run8& r0,
                                                                  Run8& r1) {
    const float d = ld_h(blk);
    const u8* q = blk + 2 + 16 * gi;
    r0.q0 = ld_u32_a2(q);
    r0.q1 = ld_u32_a2(q + 4);
    r1.q0 = ld_u32_a2(q + 8);
    r1.q1 = ld_u32_a2(q + 12);
    r0.a = r1.a = d;
    r0.b = r1.b = 0.f;
}

// --- Q4_K: d f16, dmin f16, scales[12] (6-bit scale and min per 32-element sub-block),
// qs[128]: sub-blocks 2p and 2p+1 share qs[32p..32p+31] (low and high nibbles).
// weight = d * sc * q - dmin * m ---
template <> __device__ __forceinline__ void run_offsets<QT_Q4_K>(int gi, int& o0, int& o1) {
    const int p = gi >> 2, i = gi & 3;
    o0 = 64 * p + 8 * i;
    o1 = 64 * p + 32 + 8 * i;
}
__device__ __forceinline__ void q4k_scale_min(const u8* sc, int j, int& s, int& m) {
    if (j < 4) {
        s = __ldg(sc + j) & 63;
        m = __ldg(sc + j + 4) & 63;
    } else {
        s = (__ldg(sc + j + 4) & 0xF) | ((__ldg(sc + j - 4) >> 6) << 4);
        m = (__ldg(sc + j + 4) >> 4) | ((__ldg(sc + j) >> 6) << 4);
    }
}

// Byte i (0..15) of a 16-byte value held in registers.
__device__ __forceinline__ int u4_byte(const uint4& v, int i) {
    const u32 w = i < 4 ? v.x : i < 8 ? v.y : i < 12 ? v.z : v.w;
    return (int)((w >> (8 * (i & 3))) & 0xFFu);
}

// q4k_scale_min on a Q4_K block's 16-byte header in registers (scales at bytes 4..15).
__device__ __forceinline__ void q4k_scale_min_u4(const uint4& hdr, int j, int& s, int& m) {
    if (j < 4) {
        s = u4_byte(hdr, 4 + j) & 63;
        m = u4_byte(hdr, 8 + j) & 63;
    } else {
        s = (u4_byte(hdr, 8 + j) & 0xF) | ((u4_byte(hdr, j) >> 6) << 4);
        m = (u4_byte(hdr, 8 + j) >> 4) | ((u4_byte(hdr, 4 + j) >> 6) << 4);
    }
}
template <> __device__ __forceinline__ void decode_group<QT_Q4_K>(const u8* blk, int gi, Run8& r0,
                                                                  Run8& r1) {
    const int p = gi >> 2, i = gi & 3;
    const u32 dd = __ldg((const u32*)blk);  // d, dmin
    const float d = h2f((u16)(dd & 0xFFFF)), dmin = h2f((u16)(dd >> 16));
    const uint2 w = __ldg((const uint2*)(blk + 16 + 32 * p + 8 * i));
    int s0, m0, s1, m1;
    q4k_scale_min(blk + 4, 2 * p, s0, m0);
    q4k_scale_min(blk + 4, 2 * p + 1, s1, m1);
    r0.q0 = w.x & 0x0F0F0F0Fu;
    r0.q1 = w.y & 0x0F0F0F0Fu;
    r1.q0 = (w.x >> 4) & 0x0F0F0F0Fu;
    r1.q1 = (w.y >> 4) & 0x0F0F0F0Fu;
    r0.a = d * (float)s0;
    r0.b = -dmin * (float)m0;
    r1.a = d * (float)s1;
    r1.b = -dmin * (float)m1;
}

// --- Q6_K: ql[128], qh[64], scales[16] int8, d f16 (offset 208), 14 bytes pad. Element e of the block:
// h = e / 128, qd = (e % 128) / 32, l = e % 32; low 4 bits: nibble (qd >> 1) of
// ql[64h + l + 32 (qd & 1)], high 2 bits: bits 2qd of qh[32h + l]; q - 32; scale index
// 8h + l / 16 + 2qd. A group is 16 consecutive elements (one scale). ---
// A Q6_K group's two runs from its four words of quants (q - 32) and its scale (no offset);
// qwide.cuh's wide decode ends the same way.
__device__ __forceinline__ void q6k_runs(const u32* q, float a, Run8& r0, Run8& r1) {
    r0.q0 = q[0];
    r0.q1 = q[1];
    r1.q0 = q[2];
    r1.q1 = q[3];
    r0.a = r1.a = a;
    r0.b = r1.b = 0.f;
}
template <> __device__ __forceinline__ void run_offsets<QT_Q6_K>(int gi, int& o0, int& o1) {
    o0 = 16 * gi;
    o1 = 16 * gi + 8;
}
template <> __device__ __forceinline__ void decode_group<QT_Q6_K>(const u8* blk, int gi, Run8& r0,
                                                                  Run8& r1) {
    const int h = gi >> 3, qd = (gi >> 1) & 3, l0 = 16 * (gi & 1);
    const u8* ql = blk + 64 * h + l0 + 32 * (qd & 1);
    const u8* qh = blk + 128 + 32 * h + l0;
    const int ls = 4 * (qd >> 1), hs = 2 * qd;
    const float a = ld_h(blk + 208) * (float)(signed char)__ldg(blk + 192 + 8 * h + (gi & 1) + 2 * qd);
    u32 q[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        const u32 lo = (ld_u32_a2(ql + 4 * w) >> ls) & 0x0F0F0F0Fu;
        const u32 hi = ((ld_u32_a2(qh + 4 * w) >> hs) & 0x03030303u) << 4;
        q[w] = __vsub4(lo | hi, 0x20202020u);
    }
    q6k_runs(q, a, r0, r1);
}

// Row-level group g (0 .. K/16 - 1) of a quantized row: decode and give element offsets.
template <int QT> __device__ __forceinline__ void row_group(const u8* row, int g, Run8& r0,
                                                            Run8& r1, int& k0, int& k1) {
    const int b = g / QTraits<QT>::GROUPS, gi = g % QTraits<QT>::GROUPS;
    decode_group<QT>(row + (size_t)b * QTraits<QT>::BYTES, gi, r0, r1);
    int o0, o1;
    run_offsets<QT>(gi, o0, o1);
    k0 = b * QTraits<QT>::BK + o0;
    k1 = b * QTraits<QT>::BK + o1;
}

__device__ __forceinline__ float sbyte(u32 w, int i) { return (float)(signed char)(w >> (8 * i)); }

// Unpack a run to 8 floats.
__device__ __forceinline__ void run_floats(const Run8& r, float* v) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        v[i] = r.a * sbyte(r.q0, i) + r.b;
        v[4 + i] = r.a * sbyte(r.q1, i) + r.b;
    }
}

// sum over the run of w * x, x given as two float4.
__device__ __forceinline__ float run_dot(const Run8& r, float4 x0, float4 x1) {
    const float qx = sbyte(r.q0, 0) * x0.x + sbyte(r.q0, 1) * x0.y + sbyte(r.q0, 2) * x0.z +
                     sbyte(r.q0, 3) * x0.w + sbyte(r.q1, 0) * x1.x + sbyte(r.q1, 1) * x1.y +
                     sbyte(r.q1, 2) * x1.z + sbyte(r.q1, 3) * x1.w;
    const float sx = (x0.x + x0.y) + (x0.z + x0.w) + (x1.x + x1.y) + (x1.z + x1.w);
    return r.a * qx + r.b * sx;
}

// Dense (float-typed) weights: element k of a row.
template <int QT> __device__ __forceinline__ float dense_get(const u8* row, int k);
template <> __device__ __forceinline__ float dense_get<QT_F32>(const u8* row, int k) {
    return __ldg((const float*)row + k);
}
template <> __device__ __forceinline__ float dense_get<QT_F16>(const u8* row, int k) {
    return h2f(__ldg((const u16*)row + k));
}
template <> __device__ __forceinline__ float dense_get<QT_BF16>(const u8* row, int k) {
    return bf2f(__ldg((const u16*)row + k));
}

// RoPE of one pair j of a head's D values (xa, xb: bias already added) at position p into
// out (the head's D outputs): rope_kv's and mmvw_qkv's arithmetic (angle in double).
__device__ __forceinline__ void rope_pair(float xa, float xb, int j, int D, int p, float theta,
                                          int neox, float* out) {
    const double ang = (double)p * pow((double)theta, -2.0 * j / D);
    double s, c;
    sincos(ang, &s, &c);
    const int ia = neox ? j : 2 * j, ib = neox ? j + D / 2 : 2 * j + 1;
    const double a = xa, b = xb;
    out[ia] = (float)(a * c - b * s);
    out[ib] = (float)(a * s + b * c);
}

// Block-level sums used by many kernels.
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// Programmatic dependent launch (engine/backends/cuda/pdl.py, sm_90+). A kernel the backend may
// launch that way calls pdl_start() before touching memory: it lets the next grid of the stream
// begin launching, then waits until the previous grid has completed (its writes visible). The
// next grid may so start while this one still waits: it too waits before it reads or writes
// anything, and only reads weights before that (mmvw's prefetch / stage: read-only memory), so
// a chain of kernels can have its next GEMVs' weights in flight while the current one runs.
// A grid's dependents launch only once all its blocks have started, so the oldest grid always
// has every block resident. Both are no-ops for an ordinary launch and below sm_90.
__device__ __forceinline__ void pdl_start() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// A split grid's ticket (the decode attentions' fuse_combine): this block's writes made visible
// and counted on *ticket; every block but the one that counts the n-th returns, and that one
// fences, so its reads of the others' writes come after them (it resets *ticket itself). last:
// a __shared__ bool of the kernel's. A macro, not a function: it returns from the kernel, and
// as an inline function's flag the kernels' instruction schedule changed.
#define SPLIT_TICKET_OR_RETURN(last, ticket, n)                                \
    __threadfence(); /* this block's partials, visible before its ticket */   \
    __syncthreads();                                                           \
    if (threadIdx.x == 0) last = atomicAdd(ticket, 1u) == (unsigned)(n - 1);   \
    __syncthreads();                                                           \
    if (!last) return;                                                         \
    __threadfence()

// Pair i of the q / k rope passes (decode_fused.cu rope_kv, prefill_f16.cu rope_kv_rows): the
// first nq pairs are q's [T, H, half], the rest k's [T, Hkv, half]; j the pair in its head,
// th = t * nh + h its head row.
struct RopeSlot {
    bool isq;
    int j, t, h;
    long long th;
};
__device__ __forceinline__ RopeSlot rope_slot(long long i, long long nq, int H, int Hkv,
                                              int half) {
    RopeSlot r;
    r.isq = i < nq;
    const long long e = r.isq ? i : i - nq;
    const int nh = r.isq ? H : Hkv;
    r.j = (int)(e % half);
    r.th = e / half;  // t * nh + h
    r.t = (int)(r.th / nh), r.h = (int)(r.th % nh);
    return r;
}
