#version 450
// delta_net.comp: the gated delta rule (qwen35 / qwen3next linear-attention layers), sequential
// over the T tokens of a call. One workgroup per V head h; thread j < dv owns column j of the
// head's state S [dk, dv] (S[:, j] lives in registers for the whole call). Per token t:
//   q, k of the head's K head, L2-normalised here (the model requires it; q also / sqrt(dk));
//   S = exp(g) S;  u_j = beta (v_j - S[:, j] . k)   (S^T k, column j: not S k);
//   S[:, j] += k u_j;  o_j = S[:, j] . q.
// Variants: sequential; delta_net.chunked (delta_net_chunked.comp) runs it for decode.
// Tunables: 0 WG_SIZE (power of two, >= dv), 2 MAX_DK (>= dk: the register array holding a
// column; smaller spills less), 1 LAYOUT of S in the
// state buffer between calls: 0 S row-major [dk, dv] (the NumPy cache's layout; thread j reads
// element j of each row: contiguous across threads), 1 S^T [dv, dk] (column j contiguous per
// thread). Both are read once and written once per call; decode (T = 1) is where it shows.
// Bindings: 0 q [T, Hk, dk], 1 k [T, Hk, dk], 2 v [T, Hv, dv], 3 g [T, Hv], 4 beta [T, Hv],
// 5 state [Hv, dk * dv] (read, then written), 6 o [T, Hv, dv].

#extension GL_GOOGLE_include_directive : require

layout(constant_id = 0) const uint WG_SIZE = 128;
layout(constant_id = 1) const uint LAYOUT = 0;
layout(constant_id = 2) const uint MAX_DK = 128;
// Read by delta_net_chunked.comp only: the chunked variant runs this kernel for decode (T = 1)
// with its specialization, so the constants are declared here with the same defaults.
layout(constant_id = 3) const uint CHUNK = 64;
layout(constant_id = 4) const uint SCAN_WG = 32;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer QBuf { float qs[]; };
layout(binding = 1) readonly buffer KBuf { float ks[]; };
layout(binding = 2) readonly buffer VBuf { float vs[]; };
layout(binding = 3) readonly buffer GBuf { float gs[]; };
layout(binding = 4) readonly buffer BBuf { float bs[]; };
layout(binding = 5) buffer SBuf { float ss[]; };
layout(binding = 6) writeonly buffer OBuf { float os[]; };

layout(push_constant) uniform PC {
    uint T;
    uint Hk;
    uint Hv;
    uint dk;
    uint dv;
    uint grouped;  // 1: V head h reads K head h / (Hv / Hk); 0 (tiled): h % Hk
    uint q_off;
    uint k_off;
    uint v_off;
    uint g_off;
    uint b_off;
    uint s_off;
    uint o_off;
    float eps;
} pc;

#include "common.glsl"

shared float kt[MAX_DK];
shared float qt[MAX_DK];
shared float red_k[WG_SIZE];
shared float red_q[WG_SIZE];

void main() {
    uint h = wg_linear();
    if (h >= pc.Hv) return;  // uniform per workgroup
    uint j = gl_LocalInvocationID.x;
    uint kh = pc.grouped != 0u ? h / (pc.Hv / pc.Hk) : h % pc.Hk;
    bool owner = j < pc.dv;
    uint sb = pc.s_off + h * pc.dk * pc.dv;

    float s[MAX_DK];
    if (owner) {
        for (uint i = 0u; i < pc.dk; ++i) {
            s[i] = LAYOUT == 0u ? ss[sb + i * pc.dv + j] : ss[sb + j * pc.dk + i];
        }
    }
    float inv_sqrt_dk = inversesqrt(float(pc.dk));
    for (uint t = 0u; t < pc.T; ++t) {
        uint qk = (t * pc.Hk + kh) * pc.dk;
        float sk = 0.0, sq = 0.0;
        for (uint i = j; i < pc.dk; i += WG_SIZE) {
            float kv = ks[pc.k_off + qk + i], qv = qs[pc.q_off + qk + i];
            kt[i] = kv;
            qt[i] = qv;
            sk += kv * kv;
            sq += qv * qv;
        }
        red_k[j] = sk;
        red_q[j] = sq;
        barrier();
        for (uint w = WG_SIZE / 2u; w > 0u; w >>= 1) {
            if (j < w) {
                red_k[j] += red_k[j + w];
                red_q[j] += red_q[j + w];
            }
            barrier();
        }
        float rk = inversesqrt(red_k[0] + pc.eps);
        float rq = inversesqrt(red_q[0] + pc.eps) * inv_sqrt_dk;
        if (owner) {
            uint th = t * pc.Hv + h;
            float decay = exp(gs[pc.g_off + th]);
            float pred = 0.0;  // (S^T k)_j
            for (uint i = 0u; i < pc.dk; ++i) {
                s[i] *= decay;
                pred += s[i] * kt[i];
            }
            float u = bs[pc.b_off + th] * (vs[pc.v_off + th * pc.dv + j] - pred * rk);
            float acc = 0.0;
            for (uint i = 0u; i < pc.dk; ++i) {
                s[i] += kt[i] * rk * u;
                acc += s[i] * qt[i];
            }
            os[pc.o_off + th * pc.dv + j] = acc * rq;
        }
        barrier();  // kt, qt and red are rewritten by the next token
    }
    if (owner) {
        for (uint i = 0u; i < pc.dk; ++i) {
            if (LAYOUT == 0u) ss[sb + i * pc.dv + j] = s[i];
            else ss[sb + j * pc.dk + i] = s[i];
        }
    }
}
