#version 450
// attention_flash.comp: attention.flash's prefill pass (T > 1), causal GQA flash attention on
// tensor cores (GL_KHR_cooperative_matrix), built to replace attention_coopmat.comp's pass
// (16 queries a workgroup, 5 barriers and a one-thread-per-row softmax per 32 keys, the output
// rescaled in shared memory: 235 us a layer on the 1.5B at pp512 on the H200, ~3 TFLOP/s).
//
// A workgroup of 128 threads per (head h, tile of BQ = 64 queries); the tile's 4 fragments of 16
// queries go to the subgroups (wave32: one each; wave64: two passes of the key loop, each
// subgroup one fragment per pass). Per block of BKV = 32 keys, shared by the workgroup:
//   1  K and V rows -> fp16 shared tiles (8 floats -> one 16-byte store a thread; zero past the
//      last key any query of the tile sees), one barrier before, one after
//   2  per subgroup: S = (scale Q) K^T, 16 x 32 fp32, stored into the subgroup's own region
//   3  the subgroup's lanes: lane % 16 = query row, lane / 16 = a part of the row's 32 keys;
//      causal mask, row max and sum through subgroupShuffleXor over the parts, running m, l
//      (kept in every lane of the row), P = exp(S - m) -> fp16 into the same region (S is read
//      into registers first), and the row's alpha = exp(m_old - m_new) as a 16 x 16 matrix
//   4  O (fp32 accumulators in registers, D / 16 of them) *= that matrix element by element:
//      an accumulator's elements sit in the same lanes and slots for every matrix of its type,
//      so the broadcast matrix scales each element by its own row's alpha with no knowledge of
//      the driver's layout; then O += P V
// MATRIX_SCALE (attention.matrix_scale): the rescale as one component-wise multiply of two
// matrices instead of a loop over the lane's elements (the H200's driver gave the loop's
// pipeline 256 bytes of local memory, the 8 output accumulators' size).
// Only subgroup barriers inside a subgroup's steps 2-4. At the end O *= (1 / l) the same way
// and goes out through the region, rows t < T only.
// KEY_SPLIT (attention.key_chunk): the keys split over gl_WorkGroupID.z < NS ranges of whole
// 32-key blocks (a tile's last query tile walked 16 blocks of the 1.5B's 512 keys one after the
// other on 96 workgroups: a 64 x 32 block every ~5.5 us). Range sp covers blocks from sp x C,
// C = 32 ceil(ceil((pos0 + T) / NS) / 32) keys (from the position, so a replayed graph stays
// valid), clipped to the tile's keys (an empty range runs no block). Each writes its rows'
// partials as attention_split.comp's partial pass does, [T, H, NS, D + 2] = (m, l, O not
// divided by l; l = 0 for a row that saw no key), and its PASS_MERGE combines them.
//
// Bindings: 0 q [T, H, D], 1 cache k, 2 cache v [S, Hkv, D], 3 out [T, H, D], 4 dyn. D: a
// multiple of 16, at most MAX_D (the host sends other head dims to the split kernel).
// Subgroups of 16 to 64 lanes (the registry's coopmat subgroup constraint).

#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_KHR_shader_subgroup_shuffle : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

// The variant's knobs are the split kernel's (decode runs attention_split.comp): declared here
// with their defaults, not read by this pass (its workgroup is fixed: 128 threads).
layout(constant_id = 0) const uint WG_SIZE = 128;
layout(constant_id = 1) const uint KEY_THREADS = 8;
layout(local_size_x = 128) in;

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
#ifdef KEY_SPLIT
    uint NS;  // key ranges (grid z); out_off is the partials' offset
#endif
} pc;

#define MAX_D 128u
#define MAX_DF (MAX_D / 16u)
#define NF 4u               // 16-query fragments per workgroup
#define BQ (16u * NF)
#define BKV 32u  // keys per block: two 16-key fragments (step 2 is written for two)
#define RD ((MAX_D + 8u) / 8u)  // uvec4 per Q/K/V row (136 halves: odd 16-byte count)
#define RS ((BKV + 4u) / 4u)    // uvec4 per S row (36 floats)
#define RP ((BKV + 8u) / 8u)    // uvec4 per P row (40 halves)
#define REG (16u * RS)          // a fragment's region: S, or P then the 16 x 16 broadcast
#define BC (16u * RP)           // the broadcast matrix's offset in the region (stride 4)
#define NEG_INF (-1.0 / 0.0)

shared uvec4 q_sh[BQ * RD];
shared uvec4 k_sh[BKV * RD];
shared uvec4 v_sh[BKV * RD];
shared uvec4 r_sh[NF * REG];

#define FRAG_A coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseA>
#define FRAG_B coopmat<float16_t, gl_ScopeSubgroup, 16, 16, gl_MatrixUseB>
#define FRAG_C coopmat<float, gl_ScopeSubgroup, 16, 16, gl_MatrixUseAccumulator>

uvec4 pack8(float v[8]) {
    return uvec4(packHalf2x16(vec2(v[0], v[1])), packHalf2x16(vec2(v[2], v[3])),
                 packHalf2x16(vec2(v[4], v[5])), packHalf2x16(vec2(v[6], v[7])));
}

// row r's value x in every element of row r of the region's 16 x 16 broadcast matrix; the
// lanes of a row (parts) split its 4 uvec4
void put_row(uint reg, uint r, uint part, uint nparts, float x) {
    [[unroll]] for (uint k = 0u; k < 4u; k++) {  // a compile-time trip count (see the output)
        uint u = part + k * nparts;
        if (u < 4u) r_sh[reg + BC + 4u * r + u] = uvec4(floatBitsToUint(x));
    }
}

void main() {
    uint h = gl_WorkGroupID.x, t0 = gl_WorkGroupID.y * BQ;
    uint tid = gl_LocalInvocationID.x;
    uint sg = gl_SubgroupID, nsg = gl_NumSubgroups, lane = gl_SubgroupInvocationID;
    uint D = pc.D, DF = D / 16u, G8 = D / 8u;
    uint kvh = h / (pc.H / pc.Hkv);
    uint pos0 = dyn[pc.pos_slot];
    uint nq = min(BQ, pc.T - t0);  // queries of this tile
    uint L = pos0 + t0 + nq;       // keys the tile's last query sees
    uint kb0 = 0u;                 // this workgroup's first key
#ifdef KEY_SPLIT
    uint sp = gl_WorkGroupID.z;
    uint C = BKV * ((((pos0 + pc.T + pc.NS - 1u) / pc.NS) + BKV - 1u) / BKV);
    kb0 = min(sp * C, L);
    L = min(L, kb0 + C);
#endif
    uint kv_stride = pc.Hkv * D;

    // Q (scaled) -> fp16, zero rows past T
    for (uint e = tid; e < BQ * G8; e += 128u) {
        uint i = e / G8, d = 8u * (e % G8);
        float v[8];
        uint a = pc.q_off + ((t0 + i) * pc.H + h) * D + d;
        [[unroll]] for (uint c = 0u; c < 8u; c++)
            v[c] = i < nq ? qs[a + c] * pc.scale : 0.0;
        q_sh[i * RD + d / 8u] = pack8(v);
    }

    // this lane's query row and part of the key block (3)
    uint r = lane % 16u, part = lane / 16u, nparts = gl_SubgroupSize / 16u;
    uint ncol = BKV / nparts;  // 16 (wave32) or 8 (wave64): whole uvec4 of P
    uint c0 = part * ncol;

    for (uint f0 = 0u; f0 < NF; f0 += nsg) {  // one pass at wave32, two at wave64
        uint f = f0 + sg;
        bool live = f < NF;  // subgroup-uniform
        uint reg = (live ? f : 0u) * REG;
        uint qi = t0 + 16u * f + r;  // this lane's query (tile-relative row 16 f + r)
        uint last = pos0 + qi;       // the last key it sees
        bool valid = live && qi < pc.T;
        float m = NEG_INF, l = 0.0;
        FRAG_C o[MAX_DF];
        [[unroll]] for (uint dc = 0u; dc < MAX_DF; dc++) o[dc] = FRAG_C(0.0);

        for (uint kb = kb0; kb < L; kb += BKV) {
            barrier();  // the previous block's K, V (and at first Q) reads and writes are done
            // 1: K, V rows kb .. kb + BKV - 1
            for (uint e = tid; e < BKV * G8; e += 128u) {
                uint j = e / G8, d = 8u * (e % G8);
                float kv[8], vv[8];
                uint a = (kb + j) * kv_stride + kvh * D + d;
                bool in_range = kb + j < L;
                [[unroll]] for (uint c = 0u; c < 8u; c++) {
                    kv[c] = in_range ? ck[pc.k_off + a + c] : 0.0;
                    vv[c] = in_range ? cv[pc.v_off + a + c] : 0.0;
                }
                k_sh[j * RD + d / 8u] = pack8(kv);
                v_sh[j * RD + d / 8u] = pack8(vv);
            }
            barrier();
            if (!live) continue;
            // 2: S = Q K^T, 16 queries x 32 keys as two 16 x 16 fragments (each Q fragment
            // loaded once for both)
            FRAG_C s0 = FRAG_C(0.0);
            FRAG_C s1 = FRAG_C(0.0);
            [[unroll]] for (uint dc = 0u; dc < MAX_DF; dc++) {
                if (dc < DF) {
                    FRAG_A qa;
                    FRAG_B k0;
                    FRAG_B k1;  // one declarator each: glslang 13.1.1 mistypes a second one
                    coopMatLoad(qa, q_sh, 16u * f * RD + 2u * dc, RD,
                                gl_CooperativeMatrixLayoutRowMajor);
                    coopMatLoad(k0, k_sh, 2u * dc, RD, gl_CooperativeMatrixLayoutColumnMajor);
                    coopMatLoad(k1, k_sh, 16u * RD + 2u * dc, RD,
                                gl_CooperativeMatrixLayoutColumnMajor);
                    s0 = coopMatMulAdd(qa, k0, s0);
                    s1 = coopMatMulAdd(qa, k1, s1);
                }
            }
            coopMatStore(s0, r_sh, reg, RS, gl_CooperativeMatrixLayoutRowMajor);
            coopMatStore(s1, r_sh, reg + 4u, RS, gl_CooperativeMatrixLayoutRowMajor);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            // 3: online softmax over the lanes of each row
            float sv[16];
            float mx = NEG_INF;
            [[unroll]] for (uint u = 0u; u < 4u; u++) {  // whole uvec4 (c0 is a multiple of 8)
                vec4 x4 = 4u * u < ncol ? uintBitsToFloat(r_sh[reg + r * RS + c0 / 4u + u])
                                        : vec4(0.0);
                [[unroll]] for (uint c = 0u; c < 4u; c++) {
                    uint col = c0 + 4u * u + c;
                    bool see = 4u * u < ncol && valid && kb + col <= last;
                    sv[4u * u + c] = see ? x4[c] : NEG_INF;
                    mx = max(mx, sv[4u * u + c]);
                }
            }
            for (uint w = 16u; w < gl_SubgroupSize; w <<= 1u)
                mx = max(mx, subgroupShuffleXor(mx, w));
            float m_new = max(m, mx);
            // a row with no visible key yet (or a padding row) keeps alpha 1 and P = 0
            float alpha = m_new == NEG_INF ? 1.0 : exp(m - m_new);
            float sum = 0.0;
            [[unroll]] for (uint c = 0u; c < 16u; c++) {
                sv[c] = sv[c] == NEG_INF ? 0.0 : exp(sv[c] - m_new);
                sum += sv[c];
            }
            for (uint w = 16u; w < gl_SubgroupSize; w <<= 1u)
                sum += subgroupShuffleXor(sum, w);
            m = m_new;
            l = l * alpha + sum;
            subgroupBarrier();  // every lane has read S before P overwrites it
            [[unroll]] for (uint u = 0u; u < 2u; u++) {
                if (8u * u < ncol) {
                    float p8[8];
                    [[unroll]] for (uint c = 0u; c < 8u; c++) p8[c] = sv[8u * u + c];
                    r_sh[reg + r * RP + (c0 + 8u * u) / 8u] = pack8(p8);
                }
            }
            put_row(reg, r, part, nparts, alpha);
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            // 4: O *= alpha (per row), O += P V
            FRAG_C am;
            coopMatLoad(am, r_sh, reg + BC, 4u, gl_CooperativeMatrixLayoutRowMajor);
            [[unroll]] for (uint dc = 0u; dc < MAX_DF; dc++) {
                if (dc < DF) {
#ifdef MATRIX_SCALE
                    o[dc] = o[dc] * am;  // component-wise (OpFMul of two matrices)
#else
                    [[unroll]] for (uint i = 0u; i < am.length(); i++) o[dc][i] *= am[i];
#endif
                }
            }
            [[unroll]] for (uint kc = 0u; kc < BKV / 16u; kc++) {
                FRAG_A pa;
                coopMatLoad(pa, r_sh, reg + 2u * kc, RP, gl_CooperativeMatrixLayoutRowMajor);
                [[unroll]] for (uint dc = 0u; dc < MAX_DF; dc++) {
                    if (dc < DF) {
                        FRAG_B vb;
                        coopMatLoad(vb, v_sh, 16u * kc * RD + 2u * dc, RD,
                                    gl_CooperativeMatrixLayoutRowMajor);
                        o[dc] = coopMatMulAdd(pa, vb, o[dc]);
                    }
                }
            }
            subgroupBarrier();  // P and the broadcast are read before the next S
        }

        if (live) {
            // O / l through the region (16 x 16 fp32 at a stride of RS uvec4), rows t < T
            subgroupBarrier();
#ifdef KEY_SPLIT
            put_row(reg, r, part, nparts, 1.0);  // the merge divides
            uint ps = pc.NS * (D + 2u);          // a (t, h) row of partials
            uint tr = t0 + 16u * f + r;
            if (part == 0u && tr < pc.T) {
                outs[pc.out_off + (tr * pc.H + h) * ps + sp * (D + 2u)] = m;
                outs[pc.out_off + (tr * pc.H + h) * ps + sp * (D + 2u) + 1u] = l;
            }
#else
            put_row(reg, r, part, nparts, l > 0.0 ? 1.0 / l : 0.0);
#endif
            subgroupMemoryBarrierShared();
            subgroupBarrier();
            FRAG_C inv;
            coopMatLoad(inv, r_sh, reg + BC, 4u, gl_CooperativeMatrixLayoutRowMajor);
            subgroupBarrier();  // the broadcast is read before the first output overwrites it
            [[unroll]] for (uint dc = 0u; dc < MAX_DF; dc++) {
                if (dc < DF) {
#ifdef MATRIX_SCALE
                    o[dc] = o[dc] * inv;
#else
                    [[unroll]] for (uint i = 0u; i < inv.length(); i++) o[dc][i] *= inv[i];
#endif
                    coopMatStore(o[dc], r_sh, reg, RS, gl_CooperativeMatrixLayoutRowMajor);
                    subgroupMemoryBarrierShared();
                    subgroupBarrier();
                    // 16 rows x 4 uvec4: lane e takes row e / 4, uvec4 e % 4; a compile-time
                    // trip count, so the driver unrolls the dc loop and keeps o[] in registers
                    // (a gl_SubgroupSize-bounded loop here put matmul_f16.comp's accumulators
                    // in local memory)
                    [[unroll]] for (uint k = 0u; k < 4u; k++) {
                        uint e = lane + k * gl_SubgroupSize;
                        if (e >= 64u) continue;
                        uint row = e / 4u, t = t0 + 16u * f + row;
                        if (t < pc.T) {
                            vec4 v = uintBitsToFloat(r_sh[reg + row * RS + e % 4u]);
#ifdef KEY_SPLIT
                            uint a = pc.out_off + (t * pc.H + h) * ps + sp * (D + 2u) + 2u
                                + 16u * dc + 4u * (e % 4u);
#else
                            uint a = pc.out_off + (t * pc.H + h) * D + 16u * dc + 4u * (e % 4u);
#endif
                            outs[a] = v.x;
                            outs[a + 1u] = v.y;
                            outs[a + 2u] = v.z;
                            outs[a + 3u] = v.w;
                        }
                    }
                    subgroupBarrier();  // the slot is read before the next fragment's store
                }
            }
        }
    }
}
