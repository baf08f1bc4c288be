#version 450
// delta_net_chunked.comp: the gated delta rule of delta_net.comp in chunks of CHUNK tokens (the
// WY / triangular-solve form of llama.cpp's build_delta_net_chunking and FLA), for prefill.
// Per V head and chunk of L tokens, with q, k L2-normalised (q also / sqrt(dk)) and
// G_t = exp(cumsum g) within the chunk (every ratio G_t / G_s taken with s <= t, so <= 1):
//   A[t, s] = beta_t G_t/G_s k_t.k_s (s < t),  (I + A) [W | Y] = [beta V | beta G K]
//   U = W - Y S0                  (the sequential form's corrections u_t, S0 the chunk's start)
//   O = (G Q) S0 + P U,           P[t, s] = G_t/G_s q_t.k_s (s <= t: the intra-chunk mask)
//   S = G_L S0 + ((G_L / G) K)^T U
// Two passes (the decode step, T = 1, runs delta_net.comp on the same state):
//   PASS_PREP  one workgroup per (chunk, V head): norms, cumsum, A and P, the forward
//              substitution (a thread per column of [W | Y]: columns are independent), and the
//              decayed G Q and (G_L / G) K; everything that does not depend on the state, so
//              all chunks run at once.
//   PASS_SCAN  one workgroup per (V head, SCAN_WG state columns), a thread per column j of S
//              (in registers, as delta_net.comp); the chunks in sequence, T / CHUNK steps.
//              Columns of S evolve independently, so heads split into dv / SCAN_WG workgroups.
// Tunables (the registry's delta_net.chunked): 0 WG_SIZE (PASS_PREP local size; also the decode
// kernel's), 1 LAYOUT (state S [dk, dv] or S^T [dv, dk], as delta_net.comp), 2 MAX_DK (>= dk),
// 3 CHUNK (tokens per chunk; the last is ragged), 4 SCAN_WG (PASS_SCAN local size).
// Scratch (floats from sc_off; h V head, t token of the call): W [Hv, T, dv] (U after
// PASS_SCAN), Y, GQ, GK [Hv, T, dk], P [Hv, T, CHUNK], GL [Hv, NC] (G_L per chunk).
// Bindings: PASS_PREP 0 q [T, Hk, dk], 1 k, 2 v [T, Hv, dv], 3 g [T, Hv], 4 beta, 5 scratch;
// PASS_SCAN 0 scratch, 1 state [Hv, dk * dv] (read, then written), 2 o [T, Hv, dv].

#extension GL_GOOGLE_include_directive : require

layout(constant_id = 0) const uint WG_SIZE = 128;
layout(constant_id = 1) const uint LAYOUT = 0;
layout(constant_id = 2) const uint MAX_DK = 128;
layout(constant_id = 3) const uint CHUNK = 64;
layout(constant_id = 4) const uint SCAN_WG = 32;

#include "common.glsl"

#if defined(PASS_PREP)
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer QBuf { float qs[]; };
layout(binding = 1) readonly buffer KBuf { float ks[]; };
layout(binding = 2) readonly buffer VBuf { float vs[]; };
layout(binding = 3) readonly buffer GBuf { float gs[]; };
layout(binding = 4) readonly buffer BBuf { float bs[]; };
layout(binding = 5) buffer ScBuf { float sc[]; };

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
    uint sc_off;
    float eps;
} pc;

shared float A[CHUNK * CHUNK];
shared float gam[CHUNK];  // log G_t: cumsum of g within the chunk
shared float bt[CHUNK];
shared float rk[CHUNK];   // 1 / |k_t|
shared float rq[CHUNK];   // 1 / (|q_t| sqrt(dk))

void main() {
    uint nc = (pc.T + CHUNK - 1u) / CHUNK;
    uint wg = wg_linear();
    if (wg >= nc * pc.Hv) return;  // uniform per workgroup
    uint c = wg / pc.Hv, h = wg % pc.Hv;
    uint tid = gl_LocalInvocationID.x;
    uint c0 = c * CHUNK, L = min(CHUNK, pc.T - c0);
    uint kh = pc.grouped != 0u ? h / (pc.Hv / pc.Hk) : h % pc.Hk;
    uint Tdk = pc.Hv * pc.T * pc.dk;
    uint w_base = pc.sc_off, y_base = w_base + pc.Hv * pc.T * pc.dv;
    uint q_base = y_base + Tdk, k_base = q_base + Tdk, p_base = k_base + Tdk;
    uint decay_base = p_base + pc.Hv * pc.T * CHUNK;
    uint row0 = h * pc.T + c0;  // scratch row of the chunk's first token

    for (uint t = tid; t < L; t += WG_SIZE) {
        uint qk = ((c0 + t) * pc.Hk + kh) * pc.dk;
        float sk = 0.0, sq = 0.0;
        for (uint i = 0u; i < pc.dk; ++i) {
            float kv = ks[pc.k_off + qk + i], qv = qs[pc.q_off + qk + i];
            sk += kv * kv;
            sq += qv * qv;
        }
        rk[t] = inversesqrt(sk + pc.eps);
        rq[t] = inversesqrt(sq + pc.eps) * inversesqrt(float(pc.dk));
        bt[t] = bs[pc.b_off + (c0 + t) * pc.Hv + h];
    }
    if (tid == 0u) {
        float acc = 0.0;
        for (uint t = 0u; t < L; ++t) {
            acc += gs[pc.g_off + (c0 + t) * pc.Hv + h];
            gam[t] = acc;
        }
        sc[decay_base + h * nc + c] = exp(acc);
    }
    barrier();

    // A (strictly lower) into shared memory, P (lower with the diagonal) into scratch.
    for (uint p = tid; p < L * CHUNK; p += WG_SIZE) {
        uint t = p / CHUNK, s = p % CHUNK;
        float a = 0.0, pq = 0.0;
        if (s <= t) {
            uint kt = ((c0 + t) * pc.Hk + kh) * pc.dk, kss = ((c0 + s) * pc.Hk + kh) * pc.dk;
            float kk = 0.0, qk = 0.0;
            for (uint i = 0u; i < pc.dk; ++i) {
                float k_s = ks[pc.k_off + kss + i];
                kk += ks[pc.k_off + kt + i] * k_s;
                qk += qs[pc.q_off + kt + i] * k_s;
            }
            float ratio = exp(gam[t] - gam[s]);
            if (s < t) a = bt[t] * ratio * kk * rk[t] * rk[s];
            pq = ratio * qk * rq[t] * rk[s];
        }
        A[p] = a;
        sc[p_base + (row0 + t) * CHUNK + s] = pq;
    }
    // The state-independent operands of PASS_SCAN: G Q and (G_L / G) K.
    for (uint p = tid; p < L * pc.dk; p += WG_SIZE) {
        uint t = p / pc.dk, i = p % pc.dk;
        uint src = ((c0 + t) * pc.Hk + kh) * pc.dk + i;
        uint dst = (row0 + t) * pc.dk + i;
        sc[q_base + dst] = exp(gam[t]) * qs[pc.q_off + src] * rq[t];
        sc[k_base + dst] = exp(gam[L - 1u] - gam[t]) * ks[pc.k_off + src] * rk[t];
    }
    barrier();

    // (I + A) X = R by forward substitution, a thread per column of [W | Y]; each thread reads
    // back only the rows of its own column it wrote.
    for (uint col = tid; col < pc.dv + pc.dk; col += WG_SIZE) {
        bool is_w = col < pc.dv;
        uint base = is_w ? w_base + row0 * pc.dv + col : y_base + row0 * pc.dk + (col - pc.dv);
        uint stride = is_w ? pc.dv : pc.dk;
        for (uint t = 0u; t < L; ++t) {
            float r;
            if (is_w) {
                r = bt[t] * vs[pc.v_off + ((c0 + t) * pc.Hv + h) * pc.dv + col];
            } else {
                uint src = ((c0 + t) * pc.Hk + kh) * pc.dk + (col - pc.dv);
                r = bt[t] * exp(gam[t]) * ks[pc.k_off + src] * rk[t];
            }
            for (uint s = 0u; s < t; ++s) r -= A[t * CHUNK + s] * sc[base + s * stride];
            sc[base + t * stride] = r;
        }
    }
}

#elif defined(PASS_SCAN)
layout(local_size_x_id = 4) in;

layout(binding = 0) buffer ScBuf { float sc[]; };
layout(binding = 1) buffer SBuf { float ss[]; };
layout(binding = 2) writeonly buffer OBuf { float os[]; };

layout(push_constant) uniform PC {
    uint T;
    uint Hv;
    uint dk;
    uint dv;
    uint sc_off;
    uint s_off;
    uint o_off;
} pc;

void main() {
    uint blocks = (pc.dv + SCAN_WG - 1u) / SCAN_WG;
    uint wg = wg_linear();
    uint h = wg / blocks;
    uint j = (wg % blocks) * SCAN_WG + gl_LocalInvocationID.x;
    if (h >= pc.Hv || j >= pc.dv) return;  // no barriers below: a thread per column
    uint nc = (pc.T + CHUNK - 1u) / CHUNK;
    uint Tdk = pc.Hv * pc.T * pc.dk;
    uint w_base = pc.sc_off, y_base = w_base + pc.Hv * pc.T * pc.dv;
    uint q_base = y_base + Tdk, k_base = q_base + Tdk, p_base = k_base + Tdk;
    uint decay_base = p_base + pc.Hv * pc.T * CHUNK;
    uint sb = pc.s_off + h * pc.dk * pc.dv;

    float s[MAX_DK];
    for (uint i = 0u; i < pc.dk; ++i) {
        s[i] = LAYOUT == 0u ? ss[sb + i * pc.dv + j] : ss[sb + j * pc.dk + i];
    }
    for (uint c = 0u; c < nc; ++c) {
        uint c0 = c * CHUNK, L = min(CHUNK, pc.T - c0);
        uint row0 = h * pc.T + c0;
        for (uint t = 0u; t < L; ++t) {
            uint row = row0 + t;
            float ys = 0.0, qs0 = 0.0;  // (Y S0)[t, j], (G Q S0)[t, j]
            for (uint i = 0u; i < pc.dk; ++i) {
                ys += sc[y_base + row * pc.dk + i] * s[i];
                qs0 += sc[q_base + row * pc.dk + i] * s[i];
            }
            float u = sc[w_base + row * pc.dv + j] - ys;
            sc[w_base + row * pc.dv + j] = u;  // W becomes U, in place: column j is this thread's
            float acc = qs0;
            for (uint r = 0u; r <= t; ++r) {
                acc += sc[p_base + row * CHUNK + r] * sc[w_base + (row0 + r) * pc.dv + j];
            }
            os[pc.o_off + ((c0 + t) * pc.Hv + h) * pc.dv + j] = acc;
        }
        float gl = sc[decay_base + h * nc + c];
        for (uint i = 0u; i < pc.dk; ++i) s[i] *= gl;
        for (uint t = 0u; t < L; ++t) {
            float u = sc[w_base + (row0 + t) * pc.dv + j];
            for (uint i = 0u; i < pc.dk; ++i) s[i] += sc[k_base + (row0 + t) * pc.dk + i] * u;
        }
    }
    for (uint i = 0u; i < pc.dk; ++i) {
        if (LAYOUT == 0u) ss[sb + i * pc.dv + j] = s[i];
        else ss[sb + j * pc.dk + i] = s[i];
    }
}
#endif
