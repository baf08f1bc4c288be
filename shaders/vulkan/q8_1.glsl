// q8_1.glsl: Q8_1 activations, as the int8 decode matmul (mmvw.comp) reads them (included).
//
// A row of K floats (K % 32 == 0) becomes K int8 values in blocks of 32, each with a float
// scale d = max|x| / 127 and d * sum(q), the sum of the rounded values (what the Q4_K min term
// multiplies: with it a Q4_K row dots exactly the rounded x, whose error is then w . (x - x~);
// the exact float sum would leave d * sc * q . (x - x~), ~10x that). Layout of a row at word q_off of a uint buffer:
//   words q_off .. q_off + K/4 - 1       the int8 values, 4 a word (little-endian)
//   words q_off + K/4 + 2b, + 2b + 1     block b's d and d * sum(q) as float bits
// so a row is 5K/16 words; 16-byte runs of values are uvec4 loads when q_off % 4 == 0.
//
// Needs (declared by the includer): ``uint q8w[]`` on the output binding (and WG_SIZE for
// COALESCED). Exports: uint q8_row_words(uint K); void q8_store(uint q_off, uint K,
// uint blk, float v[32]) (one thread, one block); with COALESCED also
// void q8_store_wg(uint q_off, uint K, uint e, bool live, float v) (one value per thread).

#ifndef FT_Q8_1_GLSL
#define FT_Q8_1_GLSL

uint q8_row_words(uint K) { return K / 4u + K / 16u; }

void q8_store(uint q_off, uint K, uint blk, float v[32]) {
    float amax = 0.0;
    [[unroll]] for (uint i = 0u; i < 32u; i++) amax = max(amax, abs(v[i]));
    int sum = 0;
    float d = amax / 127.0;
    float id = d > 0.0 ? 1.0 / d : 0.0;
    [[unroll]] for (uint w = 0u; w < 8u; w++) {
        uint packed = 0u;
        [[unroll]] for (uint j = 0u; j < 4u; j++) {
            int q = clamp(int(round(v[4u * w + j] * id)), -127, 127);
            sum += q;
            packed |= (uint(q) & 0xFFu) << (8u * j);
        }
        q8w[q_off + 8u * blk + w] = packed;
    }
    uint ds = q_off + K / 4u + 2u * blk;
    q8w[ds] = floatBitsToUint(d);
    q8w[ds + 1u] = floatBitsToUint(d * float(sum));
}

#endif

// COALESCED: the workgroup quantizes WG_SIZE consecutive values (WG_SIZE % 32 == 0), one per
// thread: coalesced loads and stores, block maxima and sums through shared memory. Every thread
// of the workgroup must call it (barriers); live is false past the row (whole 32-blocks, as
// e0 and K are multiples of 32).
#ifdef COALESCED
shared float q8_am[WG_SIZE];
shared int q8_qi[WG_SIZE];

void q8_store_wg(uint q_off, uint K, uint e, bool live, float v) {
    uint tid = gl_LocalInvocationID.x;
    q8_am[tid] = live ? abs(v) : 0.0;
    barrier();
    for (uint s = 16u; s > 0u; s >>= 1) {
        if ((tid & 31u) < s) q8_am[tid] = max(q8_am[tid], q8_am[tid + s]);
        barrier();
    }
    float d = q8_am[tid & ~31u] / 127.0;
    float id = d > 0.0 ? 1.0 / d : 0.0;
    q8_qi[tid] = live ? clamp(int(round(v * id)), -127, 127) : 0;
    barrier();
    if (live && (tid & 3u) == 0u) {
        uint packed = 0u;
        [[unroll]] for (uint j = 0u; j < 4u; j++)
            packed |= (uint(q8_qi[tid + j]) & 0xFFu) << (8u * j);
        q8w[q_off + e / 4u] = packed;
    }
    if (live && (tid & 31u) == 0u) {
        int sum = 0;
        [[unroll]] for (uint j = 0u; j < 32u; j++) sum += q8_qi[tid + j];
        uint ds = q_off + K / 4u + 2u * (e / 32u);
        q8w[ds] = floatBitsToUint(d);
        q8w[ds + 1u] = floatBitsToUint(d * float(sum));
    }
}
#endif
