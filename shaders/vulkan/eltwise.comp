#version 450
// eltwise.comp: elementwise ops over n floats.
// Variants (one define each):
//   OP_ADD     y = a + b; b is a tensor of the same shape (residual), or with bcast > 0 a vector
//              [bcast] repeated over rows (bias)
//   OP_SWIGLU  y = silu(a) * b = a / (1 + exp(-a)) * b
//   OP_SIGMOID_MUL  y = b * sigmoid(a) (the hybrids' output gates); with bcast > 0, a holds one
//              gate per row of bcast (the MoE shared expert's [T, 1] gate)
// SWIGLU_Q8 (quantize_act.q8_1's swiglu pass: OP_SWIGLU with OUT_Q8): a thread per 32-block of one row
// of n values (n % 32 == 0) writes y and its Q8_1 form (q8_1.glsl) to binding 3 at word q_off
// (with COALESCED a thread per value).
// OUT_F16 (with OP_SWIGLU; matmul_prefill.fuse_x16): rows of cols values; a thread per pair of
// columns also writes them as the resident GEMM's padded fp16 input (matmul_f16.comp PASS_X16's
// layout: [rows, kp] halves, zeros past cols) to binding 3 at word h_off.
// Tunables: 0 WG_SIZE. Bindings: 0 a, 1 b, 2 y.

#extension GL_GOOGLE_include_directive : require
#extension GL_EXT_control_flow_attributes : require

#ifdef SWIGLU_Q8
#define OP_SWIGLU
#define OUT_Q8
#endif

layout(constant_id = 0) const uint WG_SIZE = 256;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer ABuf { float as_[]; };
layout(binding = 1) readonly buffer BBuf { float bs[]; };
layout(binding = 2) writeonly buffer YBuf { float ys[]; };
#ifdef OUT_Q8
layout(binding = 3) writeonly buffer QBuf { uint q8w[]; };
#endif
#ifdef OUT_F16
layout(binding = 3) writeonly buffer HBuf { uint hs[]; };
#endif

layout(push_constant) uniform PC {
    uint n;
    uint a_off;
    uint b_off;
    uint y_off;
    uint bcast;
#ifdef OUT_Q8
    uint q_off;
#endif
#ifdef OUT_F16
    uint cols;
    uint kp;
    uint h_off;
#endif
} pc;

#include "common.glsl"

#if defined(OUT_Q8) && defined(COALESCED)
#include "q8_1.glsl"

void main() {  // a value per thread
    uint e = wg_linear() * WG_SIZE + gl_LocalInvocationID.x;
    bool live = e < pc.n;
    float v = 0.0;
    if (live) {
        float a = as_[pc.a_off + e];
        v = a / (1.0 + exp(-a)) * bs[pc.b_off + e];
        ys[pc.y_off + e] = v;
    }
    q8_store_wg(pc.q_off, pc.n, e, live, v);
}
#elif defined(OUT_Q8)
#include "q8_1.glsl"

void main() {  // a 32-block per thread
    uint blk = wg_linear() * WG_SIZE + gl_LocalInvocationID.x;
    if (blk >= pc.n / 32u) return;
    float v[32];
    [[unroll]] for (uint i = 0u; i < 32u; i++) {
        uint e = 32u * blk + i;
        float a = as_[pc.a_off + e];
        v[i] = a / (1.0 + exp(-a)) * bs[pc.b_off + e];
        ys[pc.y_off + e] = v[i];
    }
    q8_store(pc.q_off, pc.n, blk, v);
}
#elif defined(OUT_F16)
void main() {  // a pair of columns per thread, pads included
    uint e = wg_linear() * WG_SIZE + gl_LocalInvocationID.x;
    uint hp = pc.kp / 2u;
    if (e >= (pc.n / pc.cols) * hp) return;
    uint t = e / hp, c = 2u * (e % hp);
    float v[2];
    [[unroll]] for (uint i = 0u; i < 2u; i++) {
        v[i] = 0.0;
        if (c + i < pc.cols) {
            uint o = t * pc.cols + c + i;
            float a = as_[pc.a_off + o];
            v[i] = a / (1.0 + exp(-a)) * bs[pc.b_off + o];
            ys[pc.y_off + o] = v[i];
        }
    }
    hs[pc.h_off + e] = packHalf2x16(vec2(v[0], v[1]));
}
#else
void main() {
    uint i = wg_linear() * WG_SIZE + gl_LocalInvocationID.x;
    if (i >= pc.n) return;
#if defined(OP_SIGMOID_MUL)
    float a = as_[pc.a_off + (pc.bcast > 0u ? i / pc.bcast : i)];
    float b = bs[pc.b_off + i];
#else
    float a = as_[pc.a_off + i];
    float b = bs[pc.b_off + (pc.bcast > 0u ? i % pc.bcast : i)];
#endif
#if defined(OP_ADD)
    ys[pc.y_off + i] = a + b;
#elif defined(OP_SWIGLU)
    ys[pc.y_off + i] = a / (1.0 + exp(-a)) * b;
#elif defined(OP_SIGMOID_MUL)
    ys[pc.y_off + i] = b / (1.0 + exp(-a));
#else
#error "define OP_ADD, OP_SWIGLU or OP_SIGMOID_MUL"
#endif
}
#endif
