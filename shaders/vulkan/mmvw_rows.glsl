// mmvw_rows.glsl: one matrix's rows of mmvw.comp, instantiated once per weight binding
// (included three times, no include guard). The includer defines MV_I (0, 1, 2: the suffix of
// the push-constant fields and of the functions defined here), MV_W / MV_WV (the weight binding
// as uint / uvec4), MV_A (the added vector's binding) and MV_Y (the output's); mmvw.comp
// declares everything else.

#define MV_FN(n) MV_XCAT(n, MV_I)
#define MV_PC(f) MV_XCAT(pc.f, MV_I)

// 16 bytes at an even byte address a (Q6_K blocks are 210 bytes: only 2-byte aligned). The last
// word is indexed by the run's last byte, so an aligned run never reads past its own end.
uvec4 MV_FN(ld16_)(uint a) {
    uint i = a >> 2, sh = (a & 2u) << 3;
    uint v0 = MV_W[i], v1 = MV_W[i + 1u], v2 = MV_W[i + 2u], v3 = MV_W[i + 3u];
    uint v4 = MV_W[(a + 15u) >> 2];
    return uvec4(fsh(v0, v1, sh), fsh(v1, v2, sh), fsh(v2, v3, sh), fsh(v3, v4, sh));
}

uint MV_FN(u16_)(uint a) { return (MV_W[a >> 2] >> ((a & 2u) << 3)) & 0xFFFFu; }  // a even

int MV_FN(s8_)(uint a) { return bitfieldExtract(int(MV_W[a >> 2]), int((a & 3u) << 3), 8); }

float MV_FN(q4k_)(uint row_base, uint s, XS x) {
    uint p = (s >> 1) & 3u, h = s & 1u;
    uint b4 = (row_base + (s >> 3) * 144u) >> 4;
    uvec4 hd = MV_WV[b4];            // d, dmin | scales[0..3] | scales[4..7] | scales[8..11]
    uvec4 q = MV_WV[b4 + 1u + (s & 7u)];
#ifdef PAIR_MUL
    // 8 multiplies per run: high halves sum to <= 8 * 2 * 15 * 127 = 30480, low terms to
    // <= 8 * 15 * 127 = 15240 < 2^15, so (acc + 2^15) >> 16 is the exact dot
    int d0 = 0x8000, d1 = 0x8000;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        d0 += int(q[i] & 0x000F000Fu) * x.a20[i] + int((q[i] >> 8) & 0x000F000Fu) * x.a31[i];
        d1 += int((q[i] >> 4) & 0x000F000Fu) * x.b20[i] +
              int((q[i] >> 12) & 0x000F000Fu) * x.b31[i];
    }
    d0 >>= 16;
    d1 >>= 16;
#else
    int d0 = 0, d1 = 0;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        d0 += dot4(q[i] & 0x0F0F0F0Fu, x.a[i]);
        d1 += dot4((q[i] >> 4) & 0x0F0F0F0Fu, x.b[i]);
    }
#endif
    int sc0, m0, sc1, m1;
    q4k_sm(hd.y, hd.z, hd.w, 2u * p, sc0, m0);
    q4k_sm(hd.y, hd.z, hd.w, 2u * p + 1u, sc1, m1);
    vec2 dm = unpackHalf2x16(hd.x);
    float v = dm.x * (float(sc0 * d0) * x.da.x + float(sc1 * d1) * x.db.x);
    // The min term covers the whole 32-value sub-block (the Q8_1 block's sum): the slot holding
    // the first half of the sub-block adds it.
    if (h == 0u) v -= dm.y * (float(m0) * x.da.y + float(m1) * x.db.y);
    return v;
}

float MV_FN(q6k_)(uint row_base, uint s, XS x) {
    uint h = (s >> 2) & 1u, c = (s >> 1) & 1u, lq = s & 1u;
    uint base = row_base + (s >> 3) * 210u;
    uvec4 ql = MV_FN(ld16_)(base + 64u * h + 32u * c + 16u * lq);
    uvec4 qh = MV_FN(ld16_)(base + 128u + 32u * h + 16u * lq);
    uint sa = base + 192u + 8u * h + lq + 2u * c;
    int sca = MV_FN(s8_)(sa), scb = MV_FN(s8_)(sa + 4u);
    float d = unpackHalf2x16(MV_FN(u16_)(base + 208u)).x;
    uint sha = 2u * c, shb = 2u * c + 4u;
    int da = -x.oa, db = -x.ob;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        uint va = (ql[i] & 0x0F0F0F0Fu) | (((qh[i] >> sha) & 0x03030303u) << 4);
        uint vb = ((ql[i] >> 4) & 0x0F0F0F0Fu) | (((qh[i] >> shb) & 0x03030303u) << 4);
#ifdef PAIR_MUL
        // 6-bit values: one word's high halves reach 4 * 63 * 127 = 32004, its low terms
        // 2 * 63 * 127 = 16002: read per word
        da += (int(va & 0x00FF00FFu) * x.a20[i] + int((va >> 8) & 0x00FF00FFu) * x.a31[i] +
               0x8000) >> 16;
        db += (int(vb & 0x00FF00FFu) * x.b20[i] + int((vb >> 8) & 0x00FF00FFu) * x.b31[i] +
               0x8000) >> 16;
#else
        da += dot4(va, x.a[i]);
        db += dot4(vb, x.b[i]);
#endif
    }
    return d * (float(sca * da) * x.da.x + float(scb * db) * x.db.x);
}

// A row set's slot loop for one weight type: XLOAD loads the activations' slot, DOT is the
// weight type's dot. UNROLL slots per iteration; a slot past the row is computed on a valid one
// and dropped (straight-line code: every load of the iteration can be in flight at once). A
// macro: the Q4_K and Q6_K loops are this text with two names changed, and GLSL has no
// function arguments that are functions. Defined once for the three inclusions.
#ifndef MV_SLOTS
#define MV_SLOTS(XLOAD, DOT)                                                 \
    for (uint s0 = lane; s0 < ns; s0 += R * UNROLL) {                        \
        [[unroll]] for (uint u = 0u; u < UNROLL; u++) {                      \
            uint s = s0 + u * R;                                             \
            bool ok = s < ns;                                                \
            uint sc = ok ? s : s0;                                           \
            XS x = XLOAD(sc);                                                \
            [[unroll]] for (uint i = 0u; i < ROWS_PER_THREAD; i++) {         \
                float v = DOT(prow[i] * rb, sc, x);                          \
                acc[i] += ok ? v : 0.0;                                      \
            }                                                                \
        }                                                                    \
    }
#endif

// Rows ROWS_PER_WG * wgi .. of this matrix (see mmvw.comp for the work split).
void MV_FN(rows)(uint wgi) {
    uint N = MV_PC(N), rb = MV_PC(rb), qt = MV_PC(qt) & 0xFFu;
    bool rope = (MV_PC(qt) & MODE_ROPE) != 0u, at_pos = (MV_PC(qt) & MODE_AT_POS) != 0u;
    uint half_d = pc.D / 2u;
    uint S = gl_SubgroupSize;
    uint R = THREADS_PER_ROW == 0u ? S : min(THREADS_PER_ROW, S);
    uint lane = gl_SubgroupInvocationID & (R - 1u);
    uint slot = gl_SubgroupID * (S / R) + gl_SubgroupInvocationID / R;
    uint slots = gl_NumSubgroups * (S / R);
    uint row0 = wgi * ROWS_PER_WG;
    uint ns = pc.K / 32u;  // slots per row
    for (uint r = slot * ROWS_PER_THREAD; r < ROWS_PER_WG; r += slots * ROWS_PER_THREAD) {
        uint row = row0 + r;
        if (row >= N) break;  // uniform per cluster: the butterfly stays inside live lanes
        uint nr = min(ROWS_PER_THREAD, min(ROWS_PER_WG - r, N - row));  // live rows here
        float acc[ROWS_PER_THREAD];
        uint prow[ROWS_PER_THREAD];  // the rows' physical indices (RoPE pairs: see mmvw.comp)
        [[unroll]] for (uint i = 0u; i < ROWS_PER_THREAD; i++) {
            acc[i] = 0.0;
            uint l = row + min(i, nr - 1u);
            uint j = l >> 1;  // neox: pair j is (head j / half_d, dims p and p + half_d)
            prow[i] = rope && pc.neox != 0u
                          ? (j / half_d) * pc.D + j % half_d + (l & 1u) * half_d
                          : l;
        }
        if (qt == QT_Q4_K) {  // MV_SLOTS: UNROLL slots an iteration
            MV_SLOTS(x_q4k, MV_FN(q4k_))
        } else {
            MV_SLOTS(x_q6k, MV_FN(q6k_))
        }
        uint ao = MV_PC(ao);
        [[unroll]] for (uint i = 0u; i < ROWS_PER_THREAD; i++) {
            float v = acc[i];
            if (R == S) {
                v = subgroupAdd(v);
            } else {
                for (uint o = R >> 1; o > 0u; o >>= 1) v += subgroupShuffleXor(v, o);
            }
            acc[i] = v + (ao == NO_ADD ? 0.0 : MV_A[ao + prow[i]]);
        }
        if (lane == 0u) {
            // at_pos: the KV cache's row of the device-side position (N values per position)
            uint yb = MV_PC(y) + (at_pos ? dyn[pc.pos_slot] * N : 0u);
            if (rope) {  // logical rows 2j, 2j + 1 are pair j: rotated as rope.comp does
                uint pos = dyn[pc.pos_slot];
                [[unroll]] for (uint i = 0u; i + 1u < ROWS_PER_THREAD; i += 2u) {
                    if (i < nr) {
                        vec2 c = cs[pos * half_d + ((row + i) >> 1) % half_d];
                        float x0 = acc[i], x1 = acc[i + 1u];
                        MV_Y[yb + prow[i]] = x0 * c.x - x1 * c.y;
                        MV_Y[yb + prow[i + 1u]] = x1 * c.x + x0 * c.y;
                    }
                }
            } else {
                [[unroll]] for (uint i = 0u; i < ROWS_PER_THREAD; i++)
                    if (i < nr) MV_Y[yb + prow[i]] = acc[i];
            }
        }
    }
}

#undef MV_FN
#undef MV_PC
