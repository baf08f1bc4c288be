#version 450
// slice.comp: y[r, c] = x[r, start + c] for r < rows, c < n: a contiguous copy of columns
// start .. start + n - 1 of a row-major [rows, width] tensor (the hybrids split [q | k | v] and
// [q | gate] projections this way).
// Variants: one. Tunables: 0 WG_SIZE. Bindings: 0 x, 1 y.

#extension GL_GOOGLE_include_directive : require

layout(constant_id = 0) const uint WG_SIZE = 256;
layout(local_size_x_id = 0) in;

layout(binding = 0) readonly buffer XBuf { float xs[]; };
layout(binding = 1) writeonly buffer YBuf { float ys[]; };

layout(push_constant) uniform PC {
    uint rows;
    uint width;
    uint start;
    uint n;
    uint x_off;
    uint y_off;
} pc;

#include "common.glsl"

void main() {
    uint i = wg_linear() * WG_SIZE + gl_LocalInvocationID.x;
    if (i >= pc.rows * pc.n) return;
    uint r = i / pc.n, c = i % pc.n;
    ys[pc.y_off + i] = xs[pc.x_off + r * pc.width + pc.start + c];
}
