#version 450
// probe_mma.comp: a microbenchmark, not a kernel of the engine (tools/vulkan_probe.py). Pure
// cooperative-matrix multiply-add throughput with the operands in registers: each subgroup loads
// one A (CM_M x CM_K) and one B (CM_K x CM_N) once, then runs ITERS x NACC independent
// coopMatMulAdd chains (NACC accumulators, so NACC products are in flight per subgroup) and stores
// the accumulators once. FLOP = 2 CM_M CM_N CM_K NACC ITERS per subgroup.
//
// Defines: CM_M, CM_N, CM_K (the matrix shape), ACC_F16 (fp16 accumulators, else fp32), NACC
// (accumulators, a compile-time constant) or NACC_SPEC (the accumulator count from specialization
// constant 1, as the engine's GEMMs size their accumulator arrays: tests whether the driver keeps
// a spec-constant-sized coopmat array in registers). Specialization constant 0: the workgroup
// size (subgroups x subgroup size). LDS (1 float16_t, 2 f16vec2, 3 uvec4: the element type of
// the shared array): A and B come from shared memory every iteration instead (2 A and NACC / 2 B
// matrix loads per NACC multiply-adds, at offsets that move with the iteration, 80-byte rows as
// the engine's GEMMs): the matrix-load path's cost on top of the multiply-adds. Bindings: 0 the operands (fp16, read once), 1 the output (a tile per subgroup).

#extension GL_EXT_control_flow_attributes : require
#extension GL_KHR_cooperative_matrix : require
#extension GL_KHR_memory_scope_semantics : require
#extension GL_KHR_shader_subgroup_basic : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require

layout(local_size_x_id = 0) in;
#ifdef NACC_SPEC
layout(constant_id = 1) const uint NA = 4;
#else
const uint NA = NACC;
#endif

layout(binding = 0) readonly buffer Ops { float16_t ops[]; };
#ifdef ACC_F16
#define ACC_T float16_t
#else
#define ACC_T float
#endif
layout(binding = 1) writeonly buffer Out { ACC_T outs[]; };

layout(push_constant) uniform PC {
    uint iters;
} pc;

#ifdef LDS
#if LDS == 1
#define ELEM float16_t
#define EW 8u
#elif LDS == 2
#define ELEM f16vec2
#define EW 4u
#else
#define ELEM uvec4
#define EW 1u
#endif
const uint RS = 5u;  // row stride in 16-byte units (40 halves: 32 + 8 of padding)
const uint ROWS = 8u * 16u;  // 8 positions x 16 rows
shared ELEM sh[ROWS * RS * EW];
#endif

void main() {
#ifdef LDS
    const uint NB = NA / 2u;
    // Fill the shared rows from the operands (values do not matter, only their finiteness).
    for (uint e = gl_LocalInvocationID.x; e < ROWS * RS * EW; e += gl_WorkGroupSize.x) {
#if LDS == 1
        sh[e] = ops[e % 256u];
#elif LDS == 2
        sh[e] = f16vec2(ops[e % 256u], ops[(e + 1u) % 256u]);
#else
        sh[e] = uvec4(e % 7u) * 0x3c003c00u;
#endif
    }
    barrier();
    coopmat<ACC_T, gl_ScopeSubgroup, CM_M, CM_N, gl_MatrixUseAccumulator> acc[2u * NB];
    [[unroll]] for (uint i = 0u; i < 2u * NB; i++)
        acc[i] = coopmat<ACC_T, gl_ScopeSubgroup, CM_M, CM_N, gl_MatrixUseAccumulator>(
            ACC_T(float(i) * 1e-3));
    for (uint it = 0u; it < pc.iters; it++) {
        uint base = ((it + gl_SubgroupID) & 7u) * 16u * RS;
        coopmat<float16_t, gl_ScopeSubgroup, CM_M, CM_K, gl_MatrixUseA> a[2];
        coopmat<float16_t, gl_ScopeSubgroup, CM_K, CM_N, gl_MatrixUseB> b[NB];
        [[unroll]] for (uint j = 0u; j < 2u; j++)
            coopMatLoad(a[j], sh, EW * (base + j * 2u), EW * RS,
                        gl_CooperativeMatrixLayoutRowMajor);
        [[unroll]] for (uint i = 0u; i < NB; i++)
            coopMatLoad(b[i], sh, EW * (((base + 16u * RS * (i + 1u)) % (ROWS * RS)) + 2u),
                        EW * RS, gl_CooperativeMatrixLayoutColumnMajor);
        [[unroll]] for (uint j = 0u; j < 2u; j++)
            [[unroll]] for (uint i = 0u; i < NB; i++)
                acc[j * NB + i] = coopMatMulAdd(a[j], b[i], acc[j * NB + i]);
    }
    [[unroll]] for (uint i = 1u; i < 2u * NB; i++) acc[0] = acc[0] + acc[i];
#else
    coopmat<float16_t, gl_ScopeSubgroup, CM_M, CM_K, gl_MatrixUseA> a;
    coopmat<float16_t, gl_ScopeSubgroup, CM_K, CM_N, gl_MatrixUseB> b;
    coopMatLoad(a, ops, 0u, CM_K, gl_CooperativeMatrixLayoutRowMajor);
    coopMatLoad(b, ops, CM_M * CM_K, CM_N, gl_CooperativeMatrixLayoutRowMajor);
    coopmat<ACC_T, gl_ScopeSubgroup, CM_M, CM_N, gl_MatrixUseAccumulator> acc[NA];
    [[unroll]] for (uint i = 0u; i < NA; i++)
        acc[i] = coopmat<ACC_T, gl_ScopeSubgroup, CM_M, CM_N, gl_MatrixUseAccumulator>(
            ACC_T(float(i) * 1e-3));
    for (uint it = 0u; it < pc.iters; it++) {
        [[unroll]] for (uint i = 0u; i < NA; i++) acc[i] = coopMatMulAdd(a, b, acc[i]);
    }
    // One store per subgroup (the multiply-adds must not be dead code): accumulators summed.
    [[unroll]] for (uint i = 1u; i < NA; i++) acc[0] = acc[0] + acc[i];
#endif
    uint grp = gl_WorkGroupID.x * gl_NumSubgroups + gl_SubgroupID;
    coopMatStore(acc[0], outs, grp * CM_M * CM_N, CM_N, gl_CooperativeMatrixLayoutRowMajor);
}
