// dmmv_block.glsl: per-lane chunk decoders of matmul_decode's block variant (included, not
// compiled on its own).
//
// A chunk is what one lane decodes and dots with x per step: a quarter-block-row of bytes that it
// reads with as few, as wide loads as the block alignment allows, loading each block scale once
// per chunk (dq8 reloads them every 8 weights). Consecutive chunks of a row are consecutive in
// memory, so the lanes of a row together stream whole blocks.
//   Q4_K  8 chunks/block: 16 qs bytes = 32 weights (two sub-blocks of one 64-weight pair) from
//         one uvec4, plus the 16-byte header (d, dmin, 12 scale bytes) as one uvec4. Q4_K rows
//         are 144 * nb bytes: every block and its qs start 16-byte aligned.
//   Q6_K  8 chunks/block: 8 positions x 4 quarters = 32 weights; 210-byte blocks are only
//         2-byte aligned, so 8-byte runs are funnel-shifted from 3 word loads.
//   Q8_0, Q4_0, Q4_1, Q5_0, Q5_1  1 chunk/block (32 weights): word loads, funnel-shifted
//         where the block is only 2-byte aligned (Q8_0 34 B, Q4_0 18 B, Q5_0 22 B).
//   F32, F16, BF16  groups of 8 elements; uvec4 loads when rows are 16-byte aligned, a scalar
//         loop for the ragged tail of a row (K may be anything).
// x is read as vec4 when x_off is a multiple of 4 (a uniform branch), else as 4 scalars: every
// x index used here is x_off plus a multiple of 4. The x of a chunk is loaded once (load_x) and
// dotted with the same chunk of several rows: x traffic (L1) would otherwise be 4-7x the weight
// bytes (32 floats against 18-34 weight bytes per 32 weights).
//
// Needs (declared by the includer): Wq[] uint and Wq4[] uvec4 on the weight binding, xs[] float
// and xs4[] vec4 on the x binding, pc.{K, row_bytes, x_off}; dequant.glsl included first.
// Exports: XV  vec4s of x per chunk;  uint n_chunks()  chunks per row;
//          void load_x(uint c, out vec4 xv[XV])  the x of chunk c;
//          float chunk_dot(uint row_base, uint c, vec4 xv[XV])  x . w of chunk c of the row at
//          byte row_base.

#ifndef FT_DMMV_BLOCK_GLSL
#define FT_DMMV_BLOCK_GLSL

vec4 ldx(uint i) {  // x[i .. i+3], i == x_off (mod 4)
    if ((pc.x_off & 3u) == 0u) return xs4[i >> 2];
    return vec4(xs[i], xs[i + 1u], xs[i + 2u], xs[i + 3u]);
}

// The 4 bytes at byte sh/8 (0 or 2) of the 8-byte lo:hi; branch-free (no shift by 32).
uint fsh(uint lo, uint hi, uint sh) { return (lo >> sh) | ((hi << 1u) << (31u - sh)); }

// 4, 8, 16 bytes at an even byte address a. The last word is indexed by the run's last byte,
// so an aligned run never reads past its own end (the end of the buffer).
uint ld4(uint a) {
    uint sh = (a & 2u) << 3;
    return fsh(Wq[a >> 2], Wq[(a + 3u) >> 2], sh);
}
uvec2 ld8(uint a) {
    uint i = a >> 2, sh = (a & 2u) << 3;
    uint w0 = Wq[i], w1 = Wq[i + 1u], w2 = Wq[(a + 7u) >> 2];
    return uvec2(fsh(w0, w1, sh), fsh(w1, w2, sh));
}
uvec4 ld16(uint a) {
    uint i = a >> 2, sh = (a & 2u) << 3;
    uint w0 = Wq[i], w1 = Wq[i + 1u], w2 = Wq[i + 2u], w3 = Wq[i + 3u], w4 = Wq[(a + 15u) >> 2];
    return uvec4(fsh(w0, w1, sh), fsh(w1, w2, sh), fsh(w2, w3, sh), fsh(w3, w4, sh));
}

#if defined(FLOAT_W)
#define XV 2
uint n_chunks() { return (pc.K + 7u) / 8u; }

void load_x(uint g, out vec4 xv[XV]) {
    uint k = 8u * g, xi = pc.x_off + k;
    if (k + 8u > pc.K) {  // ragged tail: only K - k elements exist, the rest read as 0
        float t[8];
        [[unroll]] for (uint i = 0u; i < 8u; i++) t[i] = k + i < pc.K ? xs[xi + i] : 0.0;
        xv[0] = vec4(t[0], t[1], t[2], t[3]);
        xv[1] = vec4(t[4], t[5], t[6], t[7]);
        return;
    }
    xv[0] = ldx(xi);
    xv[1] = ldx(xi + 4u);
}

float chunk_dot(uint row_base, uint g, vec4 xv[XV]) {
    uint k = 8u * g;
    vec4 lo, hi;
    if (k + 8u > pc.K) {  // ragged tail: element loads, never past the row
        float w[8];
        [[unroll]] for (uint i = 0u; i < 8u; i++) {
#if defined(QTYPE_F32)
            w[i] = k + i < pc.K ? uintBitsToFloat(Wq[(row_base >> 2) + k + i]) : 0.0;
#else
            w[i] = k + i < pc.K ? f16ish(ld_u16(row_base + 2u * (k + i))) : 0.0;
#endif
        }
        lo = vec4(w[0], w[1], w[2], w[3]);
        hi = vec4(w[4], w[5], w[6], w[7]);
        return dot(lo, xv[0]) + dot(hi, xv[1]);
    }
    bool a16 = (pc.row_bytes & 15u) == 0u;  // uniform: rows (hence groups) 16-byte aligned
#if defined(QTYPE_F32)
    uvec4 w0, w1;
    if (a16) {
        uint i = (row_base >> 4) + 2u * g;
        w0 = Wq4[i];
        w1 = Wq4[i + 1u];
    } else {
        uint i = (row_base >> 2) + k;
        w0 = uvec4(Wq[i], Wq[i + 1u], Wq[i + 2u], Wq[i + 3u]);
        w1 = uvec4(Wq[i + 4u], Wq[i + 5u], Wq[i + 6u], Wq[i + 7u]);
    }
    lo = uintBitsToFloat(w0);
    hi = uintBitsToFloat(w1);
#else
    uint a = row_base + 16u * g;
    uvec4 w = a16 ? Wq4[a >> 4] : ld16(a);
#if defined(QTYPE_F16)
    lo = vec4(unpackHalf2x16(w.x), unpackHalf2x16(w.y));
    hi = vec4(unpackHalf2x16(w.z), unpackHalf2x16(w.w));
#else  // bfloat16 pairs: element 2i in the low half, 2i+1 in the high half of word i
    lo = uintBitsToFloat(uvec4(w.x << 16, w.x & 0xFFFF0000u, w.y << 16, w.y & 0xFFFF0000u));
    hi = uintBitsToFloat(uvec4(w.z << 16, w.z & 0xFFFF0000u, w.w << 16, w.w & 0xFFFF0000u));
#endif
#endif
    return dot(lo, xv[0]) + dot(hi, xv[1]);
}

#elif defined(QTYPE_Q4_K)
#define XV 8
uint n_chunks() { return (pc.K / 256u) * 8u; }

// chunk c: block c / 8, part = c % 8 covers qs[16 * part .. +15]: low nibbles are weights
// 64p + 16(part & 1) + i of sub-block 2p (p = part / 2), high nibbles the same + 32 (2p + 1).
void load_x(uint c, out vec4 xv[XV]) {
    uint part = c & 7u;
    uint xi = pc.x_off + (c >> 3) * 256u + (part >> 1) * 64u + (part & 1u) * 16u;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        xv[i] = ldx(xi + 4u * i);
        xv[4u + i] = ldx(xi + 32u + 4u * i);
    }
}

float chunk_dot(uint row_base, uint c, vec4 xv[XV]) {
    uint part = c & 7u, p = part >> 1;
    uint b4 = (row_base + (c >> 3) * 144u) >> 4;
    uvec4 hdr = Wq4[b4];            // d, dmin | scales[0..3] | scales[4..7] | scales[8..11]
    uvec4 q = Wq4[b4 + 1u + part];  // qs[16 * part .. +15]
    vec2 dm = unpackHalf2x16(hdr.x);
    // 6-bit scale / min of sub-blocks 0-3 (p < 2) or 4-7, one byte per sub-block
    uint scw = p < 2u ? hdr.y & 0x3F3F3F3Fu
                      : (hdr.w & 0x0F0F0F0Fu) | ((hdr.y >> 2) & 0x30303030u);
    uint mw = p < 2u ? hdr.z & 0x3F3F3F3Fu
                     : ((hdr.w >> 4) & 0x0F0F0F0Fu) | ((hdr.z >> 2) & 0x30303030u);
    uint sb = (p & 1u) * 16u;
    vec2 sc = vec2((scw >> sb) & 0xFFu, (scw >> (sb + 8u)) & 0xFFu);
    vec2 mn = vec2((mw >> sb) & 0xFFu, (mw >> (sb + 8u)) & 0xFFu);
    vec2 qx = vec2(0.0), sx = vec2(0.0);
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        qx += vec2(dot(nib4(q[i], 0u), xv[i]), dot(nib4(q[i], 4u), xv[4u + i]));
        sx += vec2(dot(xv[i], vec4(1.0)), dot(xv[4u + i], vec4(1.0)));
    }
    return dm.x * dot(sc, qx) - dm.y * dot(mn, sx);
}

#elif defined(QTYPE_Q6_K)
#define XV 8
uint n_chunks() { return (pc.K / 256u) * 8u; }

// chunk c: block c / 8, half h = (c / 4) % 2, positions l = 8t .. 8t+7 (t = c % 4) of each of
// the 4 quarters: weights 128h + 32 * quarter + l. xv[2 * quarter + word].
void load_x(uint c, out vec4 xv[XV]) {
    uint xi = pc.x_off + (c >> 3) * 256u + ((c >> 2) & 1u) * 128u + (c & 3u) * 8u;
    [[unroll]] for (uint i = 0u; i < 8u; i++) xv[i] = ldx(xi + 32u * (i >> 1) + 4u * (i & 1u));
}

float chunk_dot(uint row_base, uint c, vec4 xv[XV]) {
    uint h = (c >> 2) & 1u, t = c & 3u;
    uint base = row_base + (c >> 3) * 210u, l0 = 8u * t;
    uvec2 ql0 = ld8(base + 64u * h + l0);        // quarters 0 (low nibbles), 2 (high)
    uvec2 ql1 = ld8(base + 64u * h + 32u + l0);  // quarters 1, 3
    uvec2 qh = ld8(base + 128u + 32u * h + l0);  // 2 bits per quarter
    uvec2 scw = ld8(base + 192u + 8u * h);       // scales[8h + l/16 + 2 * quarter]
    float d = unpackHalf2x16(ld_u16(base + 208u)).x;
    int so = int(t >> 1) * 8;
    vec4 sc = vec4(bitfieldExtract(int(scw.x), so, 8), bitfieldExtract(int(scw.x), so + 16, 8),
                   bitfieldExtract(int(scw.y), so, 8), bitfieldExtract(int(scw.y), so + 16, 8));
    vec4 acc = vec4(0.0);  // per quarter: x . (q - 32)
    [[unroll]] for (uint w = 0u; w < 2u; w++) {
        [[unroll]] for (uint qq = 0u; qq < 4u; qq++) {
            uint ql = ((qq & 1u) == 0u ? ql0[w] : ql1[w]) >> (4u * (qq >> 1));
            uint q = (ql & 0x0F0F0F0Fu) | (((qh[w] >> (2u * qq)) & 0x03030303u) << 4);
            acc[qq] += dot(u8x4(q) - 32.0, xv[2u * qq + w]);
        }
    }
    return d * dot(sc, acc);
}

#else  // the 32-weight blocks: one chunk per block
#define XV 8
uint n_chunks() { return pc.K / 32u; }

// weight i < 16: low nibble (Q8_0: byte) of qs[i]; weight 16 + i: its high nibble
void load_x(uint c, out vec4 xv[XV]) {
    uint xi = pc.x_off + 32u * c;
    [[unroll]] for (uint i = 0u; i < 8u; i++) xv[i] = ldx(xi + 4u * i);
}

// Q5 high bits of weights s .. s+3 (bits of qh), as 16s
vec4 hb4(uint qh, uint s) {
    return vec4((uvec4(qh >> s, qh >> (s + 1u), qh >> (s + 2u), qh >> (s + 3u)) & 1u) << 4);
}

float chunk_dot(uint row_base, uint c, vec4 xv[XV]) {
    uint base = row_base + c * QBYTES;
#if defined(QTYPE_Q8_0)
    float d = ld_f16(base);
    uvec4 q0 = ld16(base + 2u), q1 = ld16(base + 18u);
    float s = 0.0;
    [[unroll]] for (uint i = 0u; i < 4u; i++)
        s += dot(s8x4(q0[i]), xv[i]) + dot(s8x4(q1[i]), xv[4u + i]);
    return d * s;
#else
#if defined(QTYPE_Q4_1) || defined(QTYPE_Q5_1)  // 20/24-byte blocks: 4-byte aligned words
    uint i0 = base >> 2;
    vec2 dm = unpackHalf2x16(Wq[i0]);
#if defined(QTYPE_Q5_1)
    uint qh = Wq[i0 + 1u];
    i0 += 1u;
#endif
    uvec4 q = uvec4(Wq[i0 + 1u], Wq[i0 + 2u], Wq[i0 + 3u], Wq[i0 + 4u]);
#else  // Q4_0 (18 B), Q5_0 (22 B): 2-byte aligned
    vec2 dm = vec2(ld_f16(base), 0.0);
#if defined(QTYPE_Q5_0)
    uint qh = ld4(base + 2u);
    uvec4 q = ld16(base + 6u);
#else
    uvec4 q = ld16(base + 2u);
#endif
#endif
    float qx = 0.0, sx = 0.0;
    [[unroll]] for (uint i = 0u; i < 4u; i++) {
        vec4 wl = nib4(q[i], 0u), wh = nib4(q[i], 4u);
#if defined(QTYPE_Q5_0) || defined(QTYPE_Q5_1)
        wl += hb4(qh, 4u * i);
        wh += hb4(qh, 16u + 4u * i);
#endif
        qx += dot(wl, xv[i]) + dot(wh, xv[4u + i]);
        sx += dot(xv[i] + xv[4u + i], vec4(1.0));
    }
#if defined(QTYPE_Q4_0)
    return dm.x * (qx - 8.0 * sx);
#elif defined(QTYPE_Q5_0)
    return dm.x * (qx - 16.0 * sx);
#else
    return dm.x * qx + dm.y * sx;
#endif
#endif
}
#endif

#endif
