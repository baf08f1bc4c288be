// common.glsl: helpers shared by every fleettune Vulkan compute shader (included, not compiled).
//
// Grids: Vulkan only guarantees 65535 workgroups per grid dimension, and the LM head of a real
// model has ~152k rows, so the host folds long 1-D grids into x * y and shaders unfold them here.

#ifndef FT_COMMON_GLSL
#define FT_COMMON_GLSL

uint wg_linear() {
    return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
}

#endif
