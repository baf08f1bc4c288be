#version 450
// attention_coopmat.comp: causal GQA flash attention for prefill (T > 1) on tensor cores through
// GL_KHR_cooperative_matrix: fp16 Q, K, V and P tiles, fp32 scores, softmax state and output.
// Decode (T == 1) and head dims it does not take run attention_split.comp (the variant's other
// passes).
//
// One workgroup of wg_size threads per (head h, tile of BQ = 16 queries). Query t sits at position
// pos0 + t and sees keys 0 .. pos0 + t; query head h reads kv head h / (H / Hkv). Per tile of
// BKV = 32 keys:
//   1  K and V rows -> fp16 shared tiles (zero past the last key any query of the tile sees)
//   2  S = (scale Q) K^T: one 16 x 16 fragment per subgroup, D / 16 multiply-adds, -> s_sh (fp32)
//   3  one thread per query row: causal mask, running max m, correction alpha = exp(m - m_new),
//      P = exp(S - m_new) -> p_sh (fp16), l = l * alpha + sum P
//   4  every thread: O rows *= alpha (O lives in shared memory, fp32)
//   5  O += P V: subgroup s owns the D / 16 output fragments s, s + nsg, ...: load, multiply-add,
//      store back (KHR cooperative matrices cannot scale rows in place, hence steps 4 and 5)
// Then O / l is written for the tile's queries t < T. Fragment ownership strides by
// gl_NumSubgroups, so any subgroup size is correct.
//
// Bindings: 0 q [T, H, D], 1 cache k, 2 cache v [S, Hkv, D], 3 out [T, H, D], 4 dyn. D: a
// multiple of 16, at most MAX_D (the host sends other head dims to the split kernel).

#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

// The variant's knobs are the split kernel's: wg_size is this pass's workgroup too (any size
// of at least 32 threads: one per query row in step 3), key_threads is read by the split
// passes only.
layout(constant_id = 0) const uint WG_SIZE = 128;
layout(constant_id = 1) const uint KEY_THREADS = 8;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer QBuf { float qs[]; };
layout(binding = 1) readonly buffer KBuf { float ck[]; };
layout(binding = 2) readonly buffer VBuf { float cv[]; };
layout(binding = 3) writeonly buffer OBuf { float outs[]; };
layout(binding = 4) readonly buffer DBuf { uint dyn[]; };

layout(push_constant) uniform PC {
    uint H;
    uint Hkv;
    uint D;
    uint q_off;
    uint k_off;
    uint v_off;
    uint out_off;
    uint pos_slot;
    uint T;
    float scale;
} pc;

#define MAX_D 128u
#define BQ 16u
#define BKV 32u
#define SD (MAX_D + 8u)  // fp16 row stride of the Q, K, V tiles (16-byte aligned, bank-skewed)
#define SS (BKV + 4u)    // fp32 row stride of S
#define SP (BKV + 8u)    // fp16 row stride of P
#define NEG_INF (-1.0 / 0.0)

shared float16_t q_sh[BQ * SD];
shared float16_t k_sh[BKV * SD];
shared float16_t v_sh[BKV * SD];
shared float s_sh[BQ * SS];
shared float16_t p_sh[BQ * SP];
shared float o_sh[BQ * MAX_D];
shared float m_sh[BQ], l_sh[BQ], a_sh[BQ];

#define FRAG_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define FRAG_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define FRAG_C coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

void main() {
    uint h = gl_WorkGroupID.x, t0 = gl_WorkGroupID.y * BQ;
    uint tid = gl_LocalInvocationID.x;
    uint sg = gl_SubgroupID, nsg = gl_NumSubgroups;
    uint D = pc.D, DF = D / 16u;
    uint kvh = h / (pc.H / pc.Hkv);
    uint pos0 = dyn[pc.pos_slot];
    uint nq = min(BQ, pc.T - t0);    // queries of this tile
    uint L = pos0 + t0 + nq;         // keys the tile's last query sees
    uint kv_stride = pc.Hkv * D;

    // Q (scaled) -> fp16; O = 0; softmax state
    for (uint e = tid; e < BQ * D; e += WG_SIZE) {
        uint i = e / D, d = e % D;
        float v = i < nq ? qs[pc.q_off + ((t0 + i) * pc.H + h) * D + d] * pc.scale : 0.0;
        q_sh[i * SD + d] = float16_t(v);
        o_sh[i * MAX_D + d] = 0.0;
    }
    if (tid < BQ) {
        m_sh[tid] = NEG_INF;
        l_sh[tid] = 0.0;
    }

    for (uint kb = 0u; kb < L; kb += BKV) {
        // 1: K, V rows kb .. kb + BKV - 1
        for (uint e = tid; e < BKV * D; e += WG_SIZE) {
            uint j = e / D, d = e % D;
            bool in_range = kb + j < L;
            uint a = (kb + j) * kv_stride + kvh * D + d;
            k_sh[j * SD + d] = float16_t(in_range ? ck[pc.k_off + a] : 0.0);
            v_sh[j * SD + d] = float16_t(in_range ? cv[pc.v_off + a] : 0.0);
        }
        barrier();
        // 2: S = Q K^T, fragment f covers keys 16 f .. 16 f + 15
        for (uint f = sg; f < BKV / 16u; f += nsg) {
            FRAG_C s = FRAG_C(0.0);
            for (uint dc = 0u; dc < DF; dc++) {
                FRAG_A qa;
                FRAG_B kt;
                coopMatLoad(qa, q_sh, 16u * dc, SD, gl_CooperativeMatrixLayoutRowMajor);
                coopMatLoad(kt, k_sh, 16u * f * SD + 16u * dc, SD,
                            gl_CooperativeMatrixLayoutColumnMajor);
                s = coopMatMulAdd(qa, kt, s);
            }
            coopMatStore(s, s_sh, 16u * f, SS, gl_CooperativeMatrixLayoutRowMajor);
        }
        barrier();
        // 3: online softmax, one thread per query row
        if (tid < BQ) {
            uint i = tid;
            uint last = pos0 + t0 + i;  // the last key row i sees
            float m_old = m_sh[i];
            float mx = NEG_INF;
            if (i < nq) {
                for (uint j = 0u; j < BKV; j++)
                    if (kb + j <= last) mx = max(mx, s_sh[i * SS + j]);
            }
            float m_new = max(m_old, mx);
            // a row with no visible key yet (or a padding row) keeps alpha 1 and P = 0
            float alpha = m_new == NEG_INF ? 1.0 : exp(m_old - m_new);
            float sum = 0.0;
            for (uint j = 0u; j < BKV; j++) {
                float p = (i < nq && kb + j <= last) ? exp(s_sh[i * SS + j] - m_new) : 0.0;
                p_sh[i * SP + j] = float16_t(p);
                sum += p;
            }
            m_sh[i] = m_new;
            l_sh[i] = l_sh[i] * alpha + sum;
            a_sh[i] = alpha;
        }
        barrier();
        // 4: O rows *= alpha
        for (uint e = tid; e < BQ * D; e += WG_SIZE) {
            uint i = e / D, d = e % D;
            o_sh[i * MAX_D + d] *= a_sh[i];
        }
        barrier();
        // 5: O += P V, fragment dc covers output dims 16 dc .. 16 dc + 15
        for (uint dc = sg; dc < DF; dc += nsg) {
            FRAG_C o;
            coopMatLoad(o, o_sh, 16u * dc, MAX_D, gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint kc = 0u; kc < BKV / 16u; kc++) {
                FRAG_A pa;
                FRAG_B vb;
                coopMatLoad(pa, p_sh, 16u * kc, SP, gl_CooperativeMatrixLayoutRowMajor);
                coopMatLoad(vb, v_sh, 16u * kc * SD + 16u * dc, SD,
                            gl_CooperativeMatrixLayoutRowMajor);
                o = coopMatMulAdd(pa, vb, o);
            }
            coopMatStore(o, o_sh, 16u * dc, MAX_D, gl_CooperativeMatrixLayoutRowMajor);
        }
        barrier();
    }

    for (uint e = tid; e < nq * D; e += WG_SIZE) {
        uint i = e / D, d = e % D;
        outs[pc.out_off + ((t0 + i) * pc.H + h) * D + d] = o_sh[i * MAX_D + d] / l_sh[i];
    }
}
