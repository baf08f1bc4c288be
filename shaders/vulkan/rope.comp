#version 450
// rope.comp: rotary embedding of x [T, H, D] at positions pos0 .. pos0 + T - 1.
// cos/sin come from a host-built float64-accurate table cs[pos][i] = (cos, sin)(pos * theta^(-2i/D))
// rather than sin/cos of large angles in float32 (GPU sin/cos lose accuracy far from zero).
// pos0 is read from the dynamic-scalars buffer so a recorded decode step can be replayed at the
// next position by rewriting one integer.
// Variants: one; the pairing is a push constant: neox pairs (i, i + D/2), normal (2i, 2i + 1).
// Partial RoPE (the hybrids): only the first n_rot dims rotate (neox pairs (i, i + n_rot/2), the
// table built over n_rot); threads past the pairs copy dims n_rot .. D-1. n_rot = D: all rotate.
// Tunables: 0 WG_SIZE. Bindings: 0 x, 1 cos/sin table, 2 y, 3 dynamic scalars.
// FUSE_KV (rope.fuse_kv = 1, the rope.kv pass): q [T, H, D], k and v [T, Hkv, D] in, RoPE of q
// to qo, RoPE of k and a copy of v straight into the layer's KV cache [S, Hkv, D] at positions
// pos0 + t: one dispatch for what rope, rope and kv_write did (all dims rotate). A thread per
// rotated pair of q or k, or per pair of v values. Bindings: 0 q, 1 k, 2 v, 3 cos/sin table,
// 4 qo, 5 cache k, 6 cache v, 7 dynamic scalars.
// FUSE_BIAS (with FUSE_KV: rope.fuse_bias = 1, the rope.kv_bias pass): the q, k and v biases
// (bindings 8, 9, 10, one value per element of a row) are added as q, k, v are read, as the add
// kernel would (x + b, the same bits): three add dispatches fewer per layer.

#extension GL_GOOGLE_include_directive : require

layout(constant_id = 0) const uint WG_SIZE = 256;
layout(local_size_x_id = 0) in;

#ifdef FUSE_KV
layout(binding = 0) readonly buffer QBuf { float qs[]; };
layout(binding = 1) readonly buffer KBuf { float ks[]; };
layout(binding = 2) readonly buffer VBuf { float vs[]; };
layout(binding = 3) readonly buffer CBuf { vec2 cs[]; };
layout(binding = 4) writeonly buffer QOBuf { float qo[]; };
layout(binding = 5) writeonly buffer CKBuf { float ck[]; };
layout(binding = 6) writeonly buffer CVBuf { float cv[]; };
layout(binding = 7) readonly buffer DBuf { uint dyn[]; };
#ifdef FUSE_BIAS
layout(binding = 8) readonly buffer BQBuf { float bq[]; };
layout(binding = 9) readonly buffer BKBuf { float bk[]; };
layout(binding = 10) readonly buffer BVBuf { float bv[]; };
#endif

layout(push_constant) uniform PC {
    uint T;
    uint H;
    uint Hkv;
    uint D;
    uint q_off;
    uint k_off;
    uint v_off;
    uint qo_off;
    uint ck_off;
    uint cv_off;
    uint pos_slot;
    uint neox;
#ifdef FUSE_BIAS
    uint bq_off;
    uint bk_off;
    uint bv_off;
#endif
} pc;
#else
layout(binding = 0) readonly buffer XBuf { float xs[]; };
layout(binding = 1) readonly buffer CBuf { vec2 cs[]; };
layout(binding = 2) writeonly buffer YBuf { float ys[]; };
layout(binding = 3) readonly buffer DBuf { uint dyn[]; };

layout(push_constant) uniform PC {
    uint T;
    uint H;
    uint D;
    uint x_off;
    uint y_off;
    uint pos_slot;  // index of pos0 in dyn[]
    uint neox;
    uint n_rot;
} pc;
#endif

#include "common.glsl"

#ifdef FUSE_KV
// x + its bias (the add kernel's a + b), or x
#ifdef FUSE_BIAS
#define QB(i, x) ((x) + bq[pc.bq_off + (i) % (pc.H * pc.D)])
#define KB(i, x) ((x) + bk[pc.bk_off + (i) % (pc.Hkv * pc.D)])
#define VB(i, x) ((x) + bv[pc.bv_off + (i) % (pc.Hkv * pc.D)])
#else
#define QB(i, x) (x)
#define KB(i, x) (x)
#define VB(i, x) (x)
#endif

void main() {
    uint half_d = pc.D / 2u;
    uint i = wg_linear() * WG_SIZE + gl_LocalInvocationID.x;
    uint nq = pc.T * pc.H * half_d, nk = pc.T * pc.Hkv * half_d;
    if (i >= nq + 2u * nk) return;
    uint pos0 = dyn[pc.pos_slot];
    if (i >= nq + nk) {  // v: a pair of values into the cache
        uint j = 2u * (i - nq - nk);  // element of v [T, Hkv, D]
        uint dst = pc.cv_off + pos0 * pc.Hkv * pc.D + j;
        cv[dst] = VB(j, vs[pc.v_off + j]);
        cv[dst + 1u] = VB(j + 1u, vs[pc.v_off + j + 1u]);
        return;
    }
    bool is_q = i < nq;
    uint e = is_q ? i : i - nq;
    uint p = e % half_d, th = e / half_d, t = th / (is_q ? pc.H : pc.Hkv);
    vec2 c = cs[(pos0 + t) * half_d + p];
    uint i0 = th * pc.D + (pc.neox != 0u ? p : 2u * p);
    uint i1 = pc.neox != 0u ? i0 + half_d : i0 + 1u;
    float x0 = is_q ? QB(i0, qs[pc.q_off + i0]) : KB(i0, ks[pc.k_off + i0]);
    float x1 = is_q ? QB(i1, qs[pc.q_off + i1]) : KB(i1, ks[pc.k_off + i1]);
    float y0 = x0 * c.x - x1 * c.y, y1 = x1 * c.x + x0 * c.y;
    if (is_q) {
        qo[pc.qo_off + i0] = y0;
        qo[pc.qo_off + i1] = y1;
    } else {
        uint base = pc.ck_off + pos0 * pc.Hkv * pc.D;
        ck[base + i0] = y0;
        ck[base + i1] = y1;
    }
}
#else

void main() {
    uint half_d = pc.n_rot / 2u;
    uint per_head = half_d + pc.D - pc.n_rot;  // rotated pairs, then copied dims
    uint i = wg_linear() * WG_SIZE + gl_LocalInvocationID.x;  // one pair (or copy) per thread
    if (i >= pc.T * pc.H * per_head) return;
    uint p = i % per_head, th = i / per_head, t = th / pc.H;
    uint base = th * pc.D;
    if (p >= half_d) {
        uint d = base + pc.n_rot + (p - half_d);
        ys[pc.y_off + d] = xs[pc.x_off + d];
        return;
    }
    uint pos = dyn[pc.pos_slot] + t;
    vec2 c = cs[pos * half_d + p];
    uint i0 = pc.neox != 0u ? base + p : base + 2u * p;
    uint i1 = pc.neox != 0u ? i0 + half_d : i0 + 1u;
    float x0 = xs[pc.x_off + i0], x1 = xs[pc.x_off + i1];
    ys[pc.y_off + i0] = x0 * c.x - x1 * c.y;
    ys[pc.y_off + i1] = x1 * c.x + x0 * c.y;
}
#endif
