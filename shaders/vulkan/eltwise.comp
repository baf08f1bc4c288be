#version 450
// eltwise.comp: elementwise ops over n floats.
// Variants (one define each):
//   OP_ADD     y = a + b; b is a tensor of the same shape (residual), or with bcast > 0 a vector
//              [bcast] repeated over rows (bias)
//   OP_SWIGLU  y = silu(a) * b = a / (1 + exp(-a)) * b
//   OP_SIGMOID_MUL  y = b * sigmoid(a) (the hybrids' output gates); with bcast > 0, a holds one
//              gate per row of bcast (the MoE shared expert's [T, 1] gate)
// Tunables: 0 WG_SIZE. Bindings: 0 a, 1 b, 2 y.

#extension GL_GOOGLE_include_directive : require

layout(constant_id = 0) const uint WG_SIZE = 256;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer ABuf { float as_[]; };
layout(binding = 1) readonly buffer BBuf { float bs[]; };
layout(binding = 2) writeonly buffer YBuf { float ys[]; };

layout(push_constant) uniform PC {
    uint n;
    uint a_off;
    uint b_off;
    uint y_off;
    uint bcast;
} pc;

#include "common.glsl"

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
