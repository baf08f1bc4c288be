#version 450
// mmvw.comp: decode matrix-vector products on Q8_1 activations (int8 x int dot products), up to
// three matrices per dispatch, each with an optional added vector (bias or residual):
//
//   y_i[n] = sum_k W_i[n, k] x[k] + a_i[n]   (a_i optional), i < 3, x as Q8_1 (q8_1.glsl)
//
// The Vulkan port of shaders/cuda/mmvw.cu (variant matmul_decode.mmvw, numeric class
// int8_activations). One dispatch serves q, k and v (or gate and up) of a layer reading one
// quantized activation, each with its own weight type (Q4_K or Q6_K, a push constant: q4_k_m
// mixes them), and the attention-output and down projections add the residual as they store.
// Work split (as the block DMMV): clusters of THREADS_PER_ROW lanes inside one subgroup own rows,
// ROWS_PER_THREAD at a time; a lane takes every R-th slot of a row (32 weights: one 16-byte
// run of 4-bit or 6-bit values, the slot's int8 activations loaded once for those rows); the
// cluster's partial sums meet by subgroupAdd or a shuffle-xor butterfly (no shared memory).
// Correct for any subgroup size (8 .. 128: RDNA wave64 included): lanes and clusters come from
// gl_SubgroupSize. Integer dot products are plain int math (Debian's glslc has no
// GL_EXT_shader_integer_dot_product): byte by byte, or with PAIR_MUL two products per 32-bit
// multiply: (w0 + w2 * 2^16) * (x2 + x0 * 2^16) = w0 x2 + (w0 x0 + w2 x2) * 2^16 (mod 2^32),
// whose high half is read after summing while the low terms stay within +-2^15 (bounds below).
// Tunables (specialization constants, as matmul_decode.block):
//   0 WG_SIZE  1 ROWS_PER_WG  2 THREADS_PER_ROW (0: the subgroup)  3 ROWS_PER_THREAD
//   4 UNROLL (slots per lane per iteration: weight loads in flight before use)
// and the define PAIR_MUL (matmul_decode.pair_mul). Both give the same integers.
// Bindings: 0..2 W_i (raw GGML rows), 3 x as Q8_1 (uint words), 4 y_0, 5..7 a_i, 8 y_1, 9 y_2
// (the outputs at their offsets; one buffer may serve all), 10 the RoPE cos/sin table, 11 the
// dynamic scalars. Unused matrices have no workgroups (wg1 == wg2 == total).
// K % 256 == 0; x_off % 4 == 0 (uvec4 loads).
// RoPE epilogue (matmul_decode.fuse_rope; bits of a matrix's type word): MODE_ROPE rotates
// pairs of rows as rope.comp does (all dims, pairs (2p, 2p + 1), or with neox (p, p + D/2) of
// each head: logical rows 2j and 2j + 1 are pair j's, so a lane's ROWS_PER_THREAD (even) rows
// hold whole pairs), MODE_AT_POS stores at y + pos * N (pos from the dynamic scalars: the KV
// cache's row). q, k and v of a decode token then go from Q8_1 to qo and the cache in one
// dispatch.

#extension GL_GOOGLE_include_directive : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_arithmetic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_control_flow_attributes : require

layout(constant_id = 0) const uint WG_SIZE = 64;
layout(constant_id = 1) const uint ROWS_PER_WG = 4;
layout(constant_id = 2) const uint THREADS_PER_ROW = 0;
layout(constant_id = 3) const uint ROWS_PER_THREAD = 2;
layout(constant_id = 4) const uint UNROLL = 2;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer W0 { uint w0[]; };
layout(binding = 0) readonly buffer W0v { uvec4 w0v[]; };
layout(binding = 1) readonly buffer W1 { uint w1[]; };
layout(binding = 1) readonly buffer W1v { uvec4 w1v[]; };
layout(binding = 2) readonly buffer W2 { uint w2[]; };
layout(binding = 2) readonly buffer W2v { uvec4 w2v[]; };
layout(binding = 3) readonly buffer XQ { uint xq[]; };
layout(binding = 3) readonly buffer XQv { uvec4 xqv[]; };
layout(binding = 3) readonly buffer XD { vec2 xd[]; };
layout(binding = 4) writeonly buffer YBuf { float ys[]; };
layout(binding = 5) readonly buffer A0 { float a0[]; };
layout(binding = 6) readonly buffer A1 { float a1[]; };
layout(binding = 7) readonly buffer A2 { float a2[]; };
layout(binding = 8) writeonly buffer Y1Buf { float ys1[]; };
layout(binding = 9) writeonly buffer Y2Buf { float ys2[]; };
layout(binding = 10) readonly buffer CBuf { vec2 cs[]; };
layout(binding = 11) readonly buffer DBuf { uint dyn[]; };

const uint NO_ADD = 0xFFFFFFFFu;
const uint MODE_ROPE = 0x100u;  // type-word bits: RoPE epilogue
const uint MODE_AT_POS = 0x200u;
const uint QT_Q4_K = 12u;  // GGML type ids
const uint QT_Q6_K = 14u;

layout(push_constant) uniform PC {
    uint K;      // weights per row (every matrix)
    uint x_off;  // word offset of the Q8_1 row in binding 3
    uint wg1;    // first workgroup of matrix 1 (== workgroups of matrix 0)
    uint wg2;    // first workgroup of matrix 2
    uint N0, rb0, qt0, y0, ao0;  // rows, bytes per row, type, y offset, a offset or NO_ADD
    uint N1, rb1, qt1, y1, ao1;
    uint N2, rb2, qt2, y2, ao2;
    uint D;         // head dim (RoPE epilogue)
    uint neox;      // pairs (p, p + D/2) instead of (2p, 2p + 1)
    uint pos_slot;  // index of the position in dyn[]
} pc;

#include "common.glsl"

// One slot's activations: 16 int8 at run a and 16 at run b, their blocks' (d, d * sum(q)), and the
// offsets the weight encoding needs (Q6_K: 32 * sum of the run's values).
struct XS {
#ifdef PAIR_MUL
    ivec4 a20, a31, b20, b31;  // per word of a run: x2 + x0 * 2^16, x3 + x1 * 2^16
#else
    ivec4 a[4];
    ivec4 b[4];
#endif
    vec2 da;
    vec2 db;
    int oa;
    int ob;
};

ivec4 s8x4i(uint u) { return ivec4(int(u) << 24, int(u) << 16, int(u) << 8, int(u)) >> 24; }

// sum of the 4 unsigned bytes of w times the 4 values of x
int dot4(uint w, ivec4 x) {
    return int(w & 0xFFu) * x.x + int((w >> 8) & 0xFFu) * x.y + int((w >> 16) & 0xFFu) * x.z +
           int(w >> 24) * x.w;
}

int hsum(ivec4 v) { return v.x + v.y + v.z + v.w; }

XS x_runs(uint ka, uint kb, uint ba, uint bb) {
    XS x;
    uint base = pc.x_off >> 2;
    uvec4 ua = xqv[base + (ka >> 4)], ub = xqv[base + (kb >> 4)];
    ivec4 sa = ivec4(0), sb = ivec4(0);
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        ivec4 va = s8x4i(ua[i]), vb = s8x4i(ub[i]);
        sa += va;
        sb += vb;
#ifdef PAIR_MUL
        x.a20[i] = va.z + (va.x << 16);
        x.a31[i] = va.w + (va.y << 16);
        x.b20[i] = vb.z + (vb.x << 16);
        x.b31[i] = vb.w + (vb.y << 16);
#else
        x.a[i] = va;
        x.b[i] = vb;
#endif
    }
    x.oa = 32 * hsum(sa);  // Q6_K's -32 offset (unused, so dropped, for Q4_K)
    x.ob = 32 * hsum(sb);
    uint ds = (pc.x_off + pc.K / 4u) >> 1;
    x.da = xd[ds + ba];
    x.db = xd[ds + bb];
    return x;
}

// Q4_K slot s = 16 bytes of qs: low nibbles are weights 64p + 16h + i (sub-block 2p), high
// nibbles the same + 32 (sub-block 2p + 1): Q8_1 blocks 8b + 2p and 8b + 2p + 1.
XS x_q4k(uint s) {
    uint b = s >> 3, p = (s >> 1) & 3u, h = s & 1u;
    uint k0 = 256u * b + 64u * p + 16u * h;
    return x_runs(k0, k0 + 32u, 8u * b + 2u * p, 8u * b + 2u * p + 1u);
}

// Q6_K slot s = (b, h, c, lq): ql[64h + 32c + 16lq ..+16] holds quarter c (low nibbles) and
// c + 2 (high) of half h; the -32 offset becomes 32 * sum(x) per run.
XS x_q6k(uint s) {
    uint b = s >> 3, h = (s >> 2) & 1u, c = (s >> 1) & 1u, lq = s & 1u;
    uint ka = 256u * b + 128u * h + 32u * c + 16u * lq;
    return x_runs(ka, ka + 64u, 8u * b + 4u * h + c, 8u * b + 4u * h + c + 2u);
}

// Q4_K 6-bit scale and min of sub-block j from the 12 scale bytes as 3 words
void q4k_sm(uint s0, uint s1, uint s2, uint j, out int sc, out int m) {
    if (j < 4u) {
        sc = int((s0 >> (8u * j)) & 63u);
        m = int((s1 >> (8u * j)) & 63u);
    } else {
        uint i = 8u * (j - 4u);
        sc = int(((s2 >> i) & 0xFu) | (((s0 >> (i + 6u)) & 3u) << 4));
        m = int(((s2 >> (i + 4u)) & 0xFu) | (((s1 >> (i + 6u)) & 3u) << 4));
    }
}

// The 4 bytes at byte sh/8 (0 or 2) of the 8-byte lo:hi; branch-free (no shift by 32).
uint fsh(uint lo, uint hi, uint sh) { return (lo >> sh) | ((hi << 1u) << (31u - sh)); }

#define MV_CAT(a, b) a##b
#define MV_XCAT(a, b) MV_CAT(a, b)

#define MV_I 0
#define MV_W w0
#define MV_WV w0v
#define MV_A a0
#define MV_Y ys
#include "mmvw_rows.glsl"
#undef MV_I
#undef MV_W
#undef MV_WV
#undef MV_A
#undef MV_Y

#define MV_I 1
#define MV_W w1
#define MV_WV w1v
#define MV_A a1
#define MV_Y ys1
#include "mmvw_rows.glsl"
#undef MV_I
#undef MV_W
#undef MV_WV
#undef MV_A
#undef MV_Y

#define MV_I 2
#define MV_W w2
#define MV_WV w2v
#define MV_A a2
#define MV_Y ys2
#include "mmvw_rows.glsl"

void main() {
    uint wg = wg_linear();
    if (wg < pc.wg1) {
        rows0(wg);
    } else if (wg < pc.wg2) {
        rows1(wg - pc.wg1);
    } else {
        rows2(wg - pc.wg2);
    }
}
