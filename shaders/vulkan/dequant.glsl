// dequant.glsl: GGML block decoding for every weight type the Vulkan backend supports.
//
// Include after declaring `uint Wq[]` (the raw GGML bytes of a weight, bound as 32-bit words) and
// defining exactly one QTYPE_<name>. Weights stay quantized on the device; kernels call dq8() to
// decode 8 consecutive weights of a row at a time, so the block scale is read once per 8 values.
//
// Why 32-bit words and not 8/16-bit storage: GGML blocks are byte-packed (Q8_0 is 34 bytes, Q5_0
// 22) and 8-bit storage is an optional feature; every 16-bit field of every block type sits at an
// even byte address (block sizes and row sizes are even), so a 16-bit load never straddles a word.
//
// Exports:  QK        weights per block (8 for float types: a pseudo-block of 8 elements)
//           QBYTES    bytes per block
//           FLOAT_W   defined for F32/F16/BF16, whose rows may have any length (dq8 guards K)
//           void dq8(uint base, uint j, uint kleft, out vec4 lo, out vec4 hi)
//             base:  byte address of the block; j: which 8 of the block (0 .. QK/8-1)
//             kleft: weights left in the row from this group (float types zero the rest)

#ifndef FT_DEQUANT_GLSL
#define FT_DEQUANT_GLSL

uint ld_u8(uint a) { return (Wq[a >> 2] >> ((a & 3u) << 3)) & 0xFFu; }
uint ld_u16(uint a) { return (Wq[a >> 2] >> ((a & 2u) << 3)) & 0xFFFFu; }  // a even
uint ld_u32(uint a) {  // a even; may straddle two words
    return ((a & 2u) == 0u) ? Wq[a >> 2] : (ld_u16(a) | (ld_u16(a + 2u) << 16));
}
float ld_f16(uint a) { return unpackHalf2x16(ld_u16(a)).x; }

// 4 signed bytes of a word -> vec4
vec4 s8x4(uint u) { return vec4(ivec4(u << 24, u << 16, u << 8, u) >> 24); }
// 4 nibbles (bytes' low or high halves, shift 0 or 4) of a word -> vec4
vec4 nib4(uint u, uint sh) { return vec4((uvec4(u, u >> 8, u >> 16, u >> 24) >> sh) & 0xFu); }
// 4 bytes of a word -> vec4
vec4 u8x4(uint u) { return vec4(uvec4(u, u >> 8, u >> 16, u >> 24) & 0xFFu); }

#if defined(QTYPE_F32)
#define QK 8u
#define QBYTES 32u
#define FLOAT_W
void dq8(uint base, uint j, uint kleft, out vec4 lo, out vec4 hi) {
    float v[8];
    for (uint i = 0u; i < 8u; i++)
        v[i] = (i < kleft) ? uintBitsToFloat(Wq[(base >> 2) + i]) : 0.0;
    lo = vec4(v[0], v[1], v[2], v[3]);
    hi = vec4(v[4], v[5], v[6], v[7]);
}

#elif defined(QTYPE_F16) || defined(QTYPE_BF16)
#define QK 8u
#define QBYTES 16u
#define FLOAT_W
float f16ish(uint bits) {
#if defined(QTYPE_F16)
    return unpackHalf2x16(bits).x;
#else
    return uintBitsToFloat(bits << 16);  // bfloat16: the high half of a float32
#endif
}
void dq8(uint base, uint j, uint kleft, out vec4 lo, out vec4 hi) {
    float v[8];
    for (uint i = 0u; i < 8u; i++)
        v[i] = (i < kleft) ? f16ish(ld_u16(base + 2u * i)) : 0.0;
    lo = vec4(v[0], v[1], v[2], v[3]);
    hi = vec4(v[4], v[5], v[6], v[7]);
}

#elif defined(QTYPE_Q8_0)
// block: f16 d; int8 qs[32]                                            w = d * q
#define QK 32u
#define QBYTES 34u
void dq8(uint base, uint j, uint kleft, out vec4 lo, out vec4 hi) {
    float d = ld_f16(base);
    uint a = base + 2u + 8u * j;
    lo = d * s8x4(ld_u32(a));
    hi = d * s8x4(ld_u32(a + 4u));
}

#elif defined(QTYPE_Q4_0) || defined(QTYPE_Q4_1)
// Q4_0 block: f16 d; u8 qs[16]                                         w = d * (q - 8)
// Q4_1 block: f16 d, m; u8 qs[16]                                      w = d * q + m
// weight i < 16 is the low nibble of qs[i], weight i >= 16 the high nibble of qs[i - 16]
#define QK 32u
#if defined(QTYPE_Q4_0)
#define QBYTES 18u
#define QS_AT 2u
#else
#define QBYTES 20u
#define QS_AT 4u
#endif
void dq8(uint base, uint j, uint kleft, out vec4 lo, out vec4 hi) {
    float d = ld_f16(base);
    uint a = base + QS_AT + 8u * (j & 1u);
    uint sh = (j >> 1) * 4u;
#if defined(QTYPE_Q4_0)
    lo = d * (nib4(ld_u32(a), sh) - 8.0);
    hi = d * (nib4(ld_u32(a + 4u), sh) - 8.0);
#else
    float m = ld_f16(base + 2u);
    lo = d * nib4(ld_u32(a), sh) + m;
    hi = d * nib4(ld_u32(a + 4u), sh) + m;
#endif
}

#elif defined(QTYPE_Q5_0) || defined(QTYPE_Q5_1)
// Q5_0 block: f16 d; u32 qh; u8 qs[16]                                 w = d * (q - 16)
// Q5_1 block: f16 d, m; u32 qh; u8 qs[16]                              w = d * q + m
// low 4 bits as in Q4_0/Q4_1, bit 4 of weight i is bit i of qh
#define QK 32u
#if defined(QTYPE_Q5_0)
#define QBYTES 22u
#define QH_AT 2u
#else
#define QBYTES 24u
#define QH_AT 4u
#endif
void dq8(uint base, uint j, uint kleft, out vec4 lo, out vec4 hi) {
    float d = ld_f16(base);
    uint qh = ld_u32(base + QH_AT) >> (8u * j);
    uint a = base + QH_AT + 4u + 8u * (j & 1u);
    uint sh = (j >> 1) * 4u;
    vec4 hb0 = vec4((uvec4(qh, qh >> 1, qh >> 2, qh >> 3) & 1u) << 4);
    vec4 hb1 = vec4((uvec4(qh >> 4, qh >> 5, qh >> 6, qh >> 7) & 1u) << 4);
    vec4 q0 = nib4(ld_u32(a), sh) + hb0;
    vec4 q1 = nib4(ld_u32(a + 4u), sh) + hb1;
#if defined(QTYPE_Q5_0)
    lo = d * (q0 - 16.0);
    hi = d * (q1 - 16.0);
#else
    float m = ld_f16(base + 2u);
    lo = d * q0 + m;
    hi = d * q1 + m;
#endif
}

#elif defined(QTYPE_Q4_K)
// block (256 weights): f16 d, dmin; u8 scales[12] (8 x 6-bit scale + 6-bit min); u8 qs[128]
// sub-block s (32 weights) uses nibble (s & 1) of qs[32 * (s / 2) .. +31]; w = d*sc*q - dmin*m
#define QK 256u
#define QBYTES 144u
void dq8(uint base, uint j, uint kleft, out vec4 lo, out vec4 hi) {
    uint s = j >> 2;  // sub-block
    float d = ld_f16(base), dmin = ld_f16(base + 2u);
    uint sc, mn;
    if (s < 4u) {
        sc = ld_u8(base + 4u + s) & 63u;
        mn = ld_u8(base + 8u + s) & 63u;
    } else {
        uint hi8 = ld_u8(base + 8u + s);
        sc = (hi8 & 0xFu) | ((ld_u8(base + s) >> 6) << 4);
        mn = (hi8 >> 4) | ((ld_u8(base + 4u + s) >> 6) << 4);
    }
    float ds = d * float(sc), dm = dmin * float(mn);
    uint a = base + 16u + 32u * (s >> 1) + 8u * (j & 3u);
    uint sh = (s & 1u) * 4u;
    lo = ds * nib4(ld_u32(a), sh) - dm;
    hi = ds * nib4(ld_u32(a + 4u), sh) - dm;
}

#elif defined(QTYPE_Q6_K)
// block (256 weights): u8 ql[128]; u8 qh[64]; int8 scales[16]; f16 d            w = d*sc*(q-32)
// weight e: half h = e/128, r = e%128, quarter c = r/32, l = r%32;
//   low 4 bits: nibble (c >= 2) of ql[64h + 32(c & 1) + l]; high 2 bits: bits 2c of qh[32h + l];
//   scale: scales[8h + l/16 + 2c]
#define QK 256u
#define QBYTES 210u
void dq8(uint base, uint j, uint kleft, out vec4 lo, out vec4 hi) {
    uint e = 8u * j;
    uint h = e >> 7, c = (e >> 5) & 3u, l = e & 31u;
    float d = ld_f16(base + 208u);
    float sc = float(int(ld_u8(base + 192u + 8u * h + (l >> 4) + 2u * c) << 24) >> 24);
    uint a = base + 64u * h + 32u * (c & 1u) + l;
    uint sh = (c >> 1) * 4u;
    uint qa = base + 128u + 32u * h + l;
    uint qh0 = ld_u32(qa), qh1 = ld_u32(qa + 4u);
    uint hs = 2u * c;
    vec4 h0 = u8x4((qh0 >> hs) & 0x03030303u) * 16.0;
    vec4 h1 = u8x4((qh1 >> hs) & 0x03030303u) * 16.0;
    float ds = d * sc;
    lo = ds * (nib4(ld_u32(a), sh) + h0 - 32.0);
    hi = ds * (nib4(ld_u32(a + 4u), sh) + h1 - 32.0);
}

#else
#error "define one QTYPE_<type>"
#endif

// Groups of 8 weights per block, and bytes per row of K weights.
#define GPB (QK / 8u)

#endif
