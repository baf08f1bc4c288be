#version 450
// attention_split.comp: split-KV ("flash-decoding") causal GQA attention over the KV cache.
// Query t of a chunk sits at position pos0 + t and sees L = pos0 + t + 1 keys; query head h reads
// kv head h / (H / Hkv). pos0 comes from the dynamic scalars, and the grid and push constants do
// not depend on it, so a replayed decode graph follows the position.
//
// PASS_PARTIAL: one workgroup per (head h, key range sp, token t), NS = n_split ranges of
// ceil(L / NS) keys each (the last ones may be short or empty). A workgroup walks its range in
// tiles of KT = WG_SIZE / KEY_THREADS keys: KEY_THREADS consecutive threads split a key's dot
// product over D (coalesced row reads) and sum it in shared memory, then each thread accumulates
// its own output dims over the tile's values with an online softmax. It writes the partial
// (max m, sum s, acc[D]) of its range; an empty range writes (-inf, 0, 0). With NS == 1 the range
// is the whole context and the output acc / s is written directly (no merge pass).
// PASS_MERGE: one workgroup per (h, t) combines the NS partials with log-sum-exp rescaling.
// Shared memory only, no subgroup operations: correct at any subgroup size.
//
// Variant: attention.split. Tunables: 0 WG_SIZE (>= D / 8: each thread owns up to 8 output dims),
// 1 KEY_THREADS (partial pass; divides WG_SIZE). NS is a push constant (<= MAX_SPLITS).
// Bindings, partial: 0 q [T, H, D], 1 cache k, 2 cache v [S, Hkv, D], 3 dst (partials
// [T, H, NS, D + 2] or out [T, H, D] when NS == 1), 4 dyn. Merge: 0 partials, 1 out [T, H, D].
// MERGE_Q8 (the merge under matmul_decode.mmvw, T == 1, D % 32 == 0): the merge also stores
// out's row [H * D] as Q8_1 (q8_1.glsl; binding 2, word q_off), each workgroup its head's
// blocks, so the attention-output matmul needs no quantize dispatch.
// FUSED_MERGE (attention.fuse_combine = 1, NS > 1): the partial pass, whose workgroup that
// finishes a head's ranges last (an atomic ticket per (t, h), reset by that workgroup) merges
// them as PASS_MERGE does: one dispatch instead of two. Partials and tickets are coherent
// buffers; each workgroup's writes are made visible (memoryBarrierBuffer) before its ticket.
// Bindings: 0-4 as the partial pass (3: partials), 5 tickets, 6 out, 7 Q8_1 (FUSED_MERGE_Q8:
// with MERGE_Q8).
#ifdef FUSED_MERGE_Q8  // one define for the pass table: both
#define FUSED_MERGE
#define MERGE_Q8
#endif
#if defined(MERGE_Q8) && !defined(FUSED_MERGE)
#define PASS_MERGE
#endif
#if defined(FUSED_MERGE)
#define PASS_PARTIAL
#endif
#if defined(MERGE_Q8) || defined(FUSED_MERGE)
#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require
#endif

layout(constant_id = 0) const uint WG_SIZE = 128;
layout(constant_id = 1) const uint KEY_THREADS = 8;
layout(local_size_x_id = 0) in;

#define MAX_D 256u
#define DIMS_PER_THREAD 8u
#define MAX_SPLITS 64u

#ifdef PASS_PARTIAL

layout(binding = 0) readonly buffer QBuf { float qs[]; };
layout(binding = 1) readonly buffer KBuf { float ck[]; };
layout(binding = 2) readonly buffer VBuf { float cv[]; };
#ifdef FUSED_MERGE
layout(binding = 3) coherent buffer DstBuf { float dst[]; };
layout(binding = 5) coherent buffer TBuf { uint tk[]; };
layout(binding = 6) writeonly buffer OBuf { float os[]; };
#ifdef MERGE_Q8
layout(binding = 7) writeonly buffer QBuf8 { uint q8w[]; };
#endif
#define PS dst
#else
layout(binding = 3) writeonly buffer DstBuf { float dst[]; };
#endif
layout(binding = 4) readonly buffer DBuf { uint dyn[]; };

layout(push_constant) uniform PC {
    uint H;
    uint Hkv;
    uint D;
    uint q_off;
    uint k_off;
    uint v_off;
    uint dst_off;
    uint pos_slot;
    uint n_split;
    float scale;
#ifdef FUSED_MERGE
    uint o_off;
    uint tk_off;
    uint q8_off;
#endif
} pc;

const uint KT = WG_SIZE / KEY_THREADS;  // keys per tile
#ifdef FUSED_MERGE

// ---- the merge of a head's NS partials at PS[pb ..] into os[ob ..] (and its Q8_1 blocks):
// every thread of the workgroup calls it (barriers).
shared float w_sh[MAX_SPLITS];  // exp(m_i - M) per partial, 0 for an empty one
#ifdef MERGE_Q8
#include "q8_1.glsl"
shared float o_sh[MAX_D];
#endif

void merge_head(uint h, uint pb, uint ob, uint NS, uint D, uint q_off, uint HD) {
    uint tid = gl_LocalInvocationID.x;
    uint row = D + 2u;
    // Empty ranges have s == 0 and are skipped; range 0 is never empty (L >= 1), so M is finite.
    float M = -1.0 / 0.0;
    for (uint i = 0u; i < NS; i++) {
        if (PS[pb + i * row + 1u] > 0.0) M = max(M, PS[pb + i * row]);
    }
    for (uint i = tid; i < NS; i += WG_SIZE) {
        float si = PS[pb + i * row + 1u];
        w_sh[i] = si > 0.0 ? exp(PS[pb + i * row] - M) : 0.0;
    }
    barrier();
    float S = 0.0;
    for (uint i = 0u; i < NS; i++) S += w_sh[i] * PS[pb + i * row + 1u];
    for (uint d = tid; d < D; d += WG_SIZE) {
        float a = 0.0;
        for (uint i = 0u; i < NS; i++) a += w_sh[i] * PS[pb + i * row + 2u + d];
        os[ob + d] = a / S;
#ifdef MERGE_Q8
        o_sh[d] = a / S;
#endif
    }
#ifdef MERGE_Q8
    barrier();
    if (tid < D / 32u) {
        float v[32];
        [[unroll]] for (uint i = 0u; i < 32u; i++) v[i] = o_sh[32u * tid + i];
        q8_store(q_off, HD, h * (D / 32u) + tid, v);
    }
#endif
}
shared bool last_sh;
#endif

shared float q_sh[MAX_D];
shared float part[WG_SIZE];  // per-thread slices of the tile's dot products
shared float sc_sh[WG_SIZE];  // the tile's scores (KT used)
shared float p_sh[WG_SIZE];  // the tile's exp(score - running max) (KT used)

void main() {
    uint h = gl_WorkGroupID.x, sp = gl_WorkGroupID.y, t = gl_WorkGroupID.z;
    uint tid = gl_LocalInvocationID.x;
    uint D = pc.D, NS = pc.n_split;
    uint kvh = h / (pc.H / pc.Hkv);
    uint L = dyn[pc.pos_slot] + t + 1u;  // keys visible to this query
    uint chunk = (L + NS - 1u) / NS;
    uint k0 = min(L, sp * chunk), k1 = min(L, k0 + chunk);  // uniform per workgroup

    uint qb = pc.q_off + (t * pc.H + h) * D;
    for (uint d = tid; d < D; d += WG_SIZE) q_sh[d] = qs[qb + d] * pc.scale;
    barrier();

    uint kv_stride = pc.Hkv * D;
    uint kbase = pc.k_off + kvh * D, vbase = pc.v_off + kvh * D;
    uint key = tid / KEY_THREADS, lane = tid % KEY_THREADS;
    float m = -1.0 / 0.0, s = 0.0;
    float acc[DIMS_PER_THREAD];
    for (uint i = 0u; i < DIMS_PER_THREAD; i++) acc[i] = 0.0;

    // Three barriers per tile: part is read (B2) before the next tile rewrites it, sc_sh and
    // p_sh are read before the next tile's B1 / B2.
    for (uint l0 = k0; l0 < k1; l0 += KT) {
        uint n = min(KT, k1 - l0);
        float dot = 0.0;
        if (key < n) {
            uint kb = kbase + (l0 + key) * kv_stride;
            for (uint d = lane; d < D; d += KEY_THREADS) dot += q_sh[d] * ck[kb + d];
        }
        part[tid] = dot;
        barrier();  // B1
        if (tid < n) {
            float sc = 0.0;
            for (uint i = 0u; i < KEY_THREADS; i++) sc += part[tid * KEY_THREADS + i];
            sc_sh[tid] = sc;
        }
        barrier();  // B2
        float tmax = sc_sh[0];  // n >= 1 inside the range
        for (uint j = 1u; j < n; j++) tmax = max(tmax, sc_sh[j]);
        float m_new = max(m, tmax);
        float corr = exp(m - m_new);  // 0 on the first tile (m = -inf)
        if (tid < n) p_sh[tid] = exp(sc_sh[tid] - m_new);
        barrier();  // B3
        float tsum = 0.0;
        for (uint j = 0u; j < n; j++) tsum += p_sh[j];
        s = s * corr + tsum;
        for (uint i = 0u; i < DIMS_PER_THREAD; i++) {
            uint d = tid + i * WG_SIZE;
            if (d < D) {
                float a = acc[i] * corr;
                uint vb = vbase + l0 * kv_stride + d;
                for (uint j = 0u; j < n; j++) a += p_sh[j] * cv[vb + j * kv_stride];
                acc[i] = a;
            }
        }
        m = m_new;
    }

    if (NS == 1u) {  // the whole context: normalize here
        uint ob = pc.dst_off + (t * pc.H + h) * D;
        for (uint i = 0u; i < DIMS_PER_THREAD; i++) {
            uint d = tid + i * WG_SIZE;
            if (d < D) dst[ob + d] = acc[i] / s;
        }
        return;
    }
    uint pb = pc.dst_off + ((t * pc.H + h) * NS + sp) * (D + 2u);
    if (tid == 0u) {
        dst[pb] = m;
        dst[pb + 1u] = s;
    }
    for (uint i = 0u; i < DIMS_PER_THREAD; i++) {
        uint d = tid + i * WG_SIZE;
        if (d < D) dst[pb + 2u + d] = acc[i];
    }
#ifdef FUSED_MERGE
    memoryBarrierBuffer();  // this workgroup's partial is visible before its ticket
    barrier();
    uint ti = pc.tk_off + t * pc.H + h;
    if (tid == 0u) last_sh = atomicAdd(tk[ti], 1u) == NS - 1u;
    barrier();
    if (!last_sh) return;  // uniform: a shared flag
    memoryBarrierBuffer();
    merge_head(h, pc.dst_off + (t * pc.H + h) * NS * (D + 2u), pc.o_off + (t * pc.H + h) * D, NS,
               D, pc.q8_off, pc.H * D);
    if (tid == 0u) tk[ti] = 0u;  // ready for the next dispatch (a replayed graph too)
#endif
}

#endif  // PASS_PARTIAL

#ifdef PASS_MERGE

layout(binding = 0) readonly buffer PBuf { float ps[]; };
layout(binding = 1) writeonly buffer OBuf { float os[]; };
#ifdef MERGE_Q8
layout(binding = 2) writeonly buffer QBuf { uint q8w[]; };
#endif

layout(push_constant) uniform PC {
    uint H;
    uint D;
    uint n_split;
    uint p_off;
    uint o_off;
#ifdef MERGE_Q8
    uint q_off;
#endif
} pc;

#define PS ps

// ---- the merge of a head's NS partials at PS[pb ..] into os[ob ..] (and its Q8_1 blocks):
// every thread of the workgroup calls it (barriers).
shared float w_sh[MAX_SPLITS];  // exp(m_i - M) per partial, 0 for an empty one
#ifdef MERGE_Q8
#include "q8_1.glsl"
shared float o_sh[MAX_D];
#endif

void merge_head(uint h, uint pb, uint ob, uint NS, uint D, uint q_off, uint HD) {
    uint tid = gl_LocalInvocationID.x;
    uint row = D + 2u;
    // Empty ranges have s == 0 and are skipped; range 0 is never empty (L >= 1), so M is finite.
    float M = -1.0 / 0.0;
    for (uint i = 0u; i < NS; i++) {
        if (PS[pb + i * row + 1u] > 0.0) M = max(M, PS[pb + i * row]);
    }
    for (uint i = tid; i < NS; i += WG_SIZE) {
        float si = PS[pb + i * row + 1u];
        w_sh[i] = si > 0.0 ? exp(PS[pb + i * row] - M) : 0.0;
    }
    barrier();
    float S = 0.0;
    for (uint i = 0u; i < NS; i++) S += w_sh[i] * PS[pb + i * row + 1u];
    for (uint d = tid; d < D; d += WG_SIZE) {
        float a = 0.0;
        for (uint i = 0u; i < NS; i++) a += w_sh[i] * PS[pb + i * row + 2u + d];
        os[ob + d] = a / S;
#ifdef MERGE_Q8
        o_sh[d] = a / S;
#endif
    }
#ifdef MERGE_Q8
    barrier();
    if (tid < D / 32u) {
        float v[32];
        [[unroll]] for (uint i = 0u; i < 32u; i++) v[i] = o_sh[32u * tid + i];
        q8_store(q_off, HD, h * (D / 32u) + tid, v);
    }
#endif
}

void main() {
    uint h = gl_WorkGroupID.x, t = gl_WorkGroupID.y;
    uint D = pc.D, NS = pc.n_split;
#ifdef MERGE_Q8
    uint q_off = pc.q_off;
#else
    uint q_off = 0u;
#endif
    merge_head(h, pc.p_off + (t * pc.H + h) * NS * (D + 2u), pc.o_off + (t * pc.H + h) * D, NS, D,
               q_off, pc.H * D);
}


#endif  // PASS_MERGE
