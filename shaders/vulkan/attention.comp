#version 450
// attention.comp: causal GQA attention over the KV cache, one workgroup per (query head, token).
// Query t of a chunk sits at position pos0 + t and sees cache positions 0 .. pos0 + t; query
// head h reads kv head h / (H / Hkv). Decode is the T == 1 case of the same kernel.
// Keys are walked in tiles of WG_SIZE with an online (flash-style) softmax: a running max and
// sum, the accumulator rescaled when the max grows, so no [L] score buffer is needed and any
// context length fits in fixed shared memory.
// Variants: one. Tunables: 0 WG_SIZE (power of two, >= D / 8: each thread owns up to 8 output
// dims). Bindings: 0 q [T, H, D], 1 cache k, 2 cache v [S, Hkv, D], 3 out [T, H, D], 4 dyn.

#extension GL_GOOGLE_include_directive : require

layout(constant_id = 0) const uint WG_SIZE = 64;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer QBuf { float qs[]; };
layout(binding = 1) readonly buffer KBuf { float ck[]; };
layout(binding = 2) readonly buffer VBuf { float cv[]; };
layout(binding = 3) writeonly buffer OBuf { float os[]; };
layout(binding = 4) readonly buffer DBuf { uint dyn[]; };

layout(push_constant) uniform PC {
    uint H;
    uint Hkv;
    uint D;
    uint q_off;
    uint k_off;
    uint v_off;
    uint o_off;
    uint pos_slot;
    float scale;
} pc;

#define MAX_D 256u
#define DIMS_PER_THREAD 8u

shared float q_sh[MAX_D];
shared float p_sh[WG_SIZE];
shared float red[WG_SIZE];

float wg_reduce_max(float v) {
    uint tid = gl_LocalInvocationID.x;
    red[tid] = v;
    barrier();
    for (uint s = WG_SIZE / 2u; s > 0u; s >>= 1) {
        if (tid < s) red[tid] = max(red[tid], red[tid + s]);
        barrier();
    }
    float r = red[0];
    barrier();  // red is reused by the next reduction
    return r;
}

float wg_reduce_sum(float v) {
    uint tid = gl_LocalInvocationID.x;
    red[tid] = v;
    barrier();
    for (uint s = WG_SIZE / 2u; s > 0u; s >>= 1) {
        if (tid < s) red[tid] += red[tid + s];
        barrier();
    }
    float r = red[0];
    barrier();
    return r;
}

void main() {
    uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
    uint tid = gl_LocalInvocationID.x;
    uint D = pc.D;
    uint kvh = h / (pc.H / pc.Hkv);
    uint L = dyn[pc.pos_slot] + t + 1u;  // keys visible to this query
    uint qb = pc.q_off + (t * pc.H + h) * D;
    for (uint d = tid; d < D; d += WG_SIZE) q_sh[d] = qs[qb + d] * pc.scale;
    barrier();

    uint kv_stride = pc.Hkv * D;
    float m = -1.0 / 0.0, s = 0.0;
    float acc[DIMS_PER_THREAD];
    for (uint i = 0u; i < DIMS_PER_THREAD; i++) acc[i] = 0.0;

    for (uint l0 = 0u; l0 < L; l0 += WG_SIZE) {
        uint l = l0 + tid;
        float score = -1.0 / 0.0;
        if (l < L) {
            uint kb = pc.k_off + l * kv_stride + kvh * D;
            score = 0.0;
            for (uint d = 0u; d < D; d++) score += q_sh[d] * ck[kb + d];
        }
        float m_new = max(m, wg_reduce_max(score));  // finite: key l0 is always visible
        float p = l < L ? exp(score - m_new) : 0.0;
        p_sh[tid] = p;
        float corr = exp(m - m_new);  // 0 on the first tile (m = -inf)
        s = s * corr + wg_reduce_sum(p);  // the reduction's barriers also publish p_sh
        uint n = min(WG_SIZE, L - l0);
        for (uint i = 0u; i < DIMS_PER_THREAD; i++) {
            uint d = tid + i * WG_SIZE;
            if (d < D) {
                float a = acc[i] * corr;
                uint vb = pc.v_off + l0 * kv_stride + kvh * D + d;
                for (uint j = 0u; j < n; j++) a += p_sh[j] * cv[vb + j * kv_stride];
                acc[i] = a;
            }
        }
        m = m_new;
        barrier();  // p_sh is rewritten by the next tile
    }
    uint ob = pc.o_off + (t * pc.H + h) * D;
    for (uint i = 0u; i < DIMS_PER_THREAD; i++) {
        uint d = tid + i * WG_SIZE;
        if (d < D) os[ob + d] = acc[i] / s;
    }
}
