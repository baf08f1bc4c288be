#version 450
// probe_copy.comp: a microbenchmark, not a kernel of the engine (tools/vulkan_probe.py).
// Device-memory bandwidth with 16-byte loads, grid-stride: COPY dst[i] = src[i]; else a read-only
// stream (what decode's weight reads are): each thread sums what it reads and stores one word
// only when the sum is the impossible value in push constant `magic` (so the loads stay live).
// Specialization constant 0: the workgroup size. Bindings: 0 src, 1 dst.

layout(local_size_x_id = 0) in;
layout(binding = 0) readonly buffer Src { uvec4 src[]; };
layout(binding = 1) writeonly buffer Dst { uvec4 dst[]; };
layout(push_constant) uniform PC {
    uint n;  // uvec4 elements
    uint magic;
} pc;

void main() {
    uint stride = gl_NumWorkGroups.x * gl_WorkGroupSize.x;
    uint i = gl_GlobalInvocationID.x;
#ifdef COPY
    for (; i < pc.n; i += stride) dst[i] = src[i];
#else
    uvec4 s = uvec4(0u);
    for (; i < pc.n; i += stride) s ^= src[i];
    if (s.x + s.y + s.z + s.w == pc.magic) dst[gl_GlobalInvocationID.x] = s;
#endif
}
