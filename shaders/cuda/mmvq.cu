// mmvq.cu: decode matrix-vector product on Q8_1 activations with integer dot products.
//
//   y[n] = sum_k W[n, k] x[k]   W [N, K] GGML blocks, x as Q8_1 (q8.cu: xq int8 [K], xds
//   float2 [K / 32] = (d, d * sum q)), y [N] float32
//
// Variant matmul_decode.mmvq (engine/tuning/variants/cuda/). A block of WARPS warps takes ROWS_PER_BLOCK
// weight rows; its threads walk the row's "slots" together (one activation load serves ROWS_PER_BLOCK
// rows; the ROWS_PER_BLOCK rows' weight loads are independent, so more bytes are in flight), then the
// block sums each row. Each slot is one 16-byte load of quants:
//   mmvq_q4_k  slot = 16 bytes of qs: 16 low nibbles (sub-block 2p) + 16 high (2p+1), the
//              block's d, dmin and 12 scale bytes in one more 16-byte load (L1 hits for the
//              8 slots of a block); 8 dp4a; the min term d * sum(q) of the Q8_1 block, added by
//              the slot holding the first half of the sub-block
//   mmvq_q6_k  slot = 16 bytes of ql + 16 of qh (32 weights of two quarters); blocks padded
//              to 224 bytes on upload (CudaBackend.load_weight) so both loads are 16-byte ones;
//              the -32 offset is a second dp4a against 0x20202020
//   mmvq_q4_0 q4_1 q5_0 q8_0  slot = one 16-weight group of common.cuh's decoder (2-byte
//              aligned blocks: no wide loads), 4 dp4a
// Tunables (defines): WARPS warps per block, ROWS_PER_BLOCK rows per block.
// Grid: ceil(N / ROWS_PER_BLOCK), block WARPS * 32. Needs K % 256 == 0 (K types), K % 32 == 0 (others).
// vecdot.cuh: dp4a, ldg16, q4k_sm (one copy, shared with mmvw.cu)
#include "vecdot.cuh"

#ifndef WARPS
#define WARPS 4
#endif
#ifndef ROWS_PER_BLOCK
#define ROWS_PER_BLOCK 1
#endif

// Sum each row's partial over the block; thread r (< ROWS_PER_BLOCK) writes row row0 + r.
__device__ __forceinline__ void block_store(float* acc, int row0, int N, float* __restrict__ Y) {
    __shared__ float red[WARPS][ROWS_PER_BLOCK];
    const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < ROWS_PER_BLOCK; ++r) {
        const float v = warp_sum(acc[r]);
        if (lane == 0) red[w][r] = v;
    }
    __syncthreads();
    if (threadIdx.x < ROWS_PER_BLOCK && row0 + (int)threadIdx.x < N) {
        float s = 0.f;
#pragma unroll
        for (int i = 0; i < WARPS; ++i) s += red[i][threadIdx.x];
        Y[row0 + threadIdx.x] = s;
    }
}

extern "C" __global__ void __launch_bounds__(WARPS * 32)
    mmvq_q4_k(const u8* __restrict__ W, int row_bytes, int N, int K, const s8* __restrict__ xq,
              const float2* __restrict__ xds, float* __restrict__ Y) {
    const int row0 = blockIdx.x * ROWS_PER_BLOCK;
    const int nslots = K / 32;  // 8 per 256-value block
    float acc[ROWS_PER_BLOCK];
#pragma unroll
    for (int r = 0; r < ROWS_PER_BLOCK; ++r) acc[r] = 0.f;
    for (int s = threadIdx.x; s < nslots; s += WARPS * 32) {
        const int b = s >> 3, p = (s >> 1) & 3, h = s & 1;
        const int k0 = 256 * b + 64 * p + 16 * h;
        const uint4 xa = ldg16(xq + k0), xb = ldg16(xq + k0 + 32);
        const float2 da = __ldg(xds + 8 * b + 2 * p), db = __ldg(xds + 8 * b + 2 * p + 1);
#pragma unroll
        for (int r = 0; r < ROWS_PER_BLOCK; ++r) {
            const u8* blk = W + (size_t)min(row0 + r, N - 1) * row_bytes + 144 * b;
            const uint4 hd = ldg16(blk);
            const uint4 q = ldg16(blk + 16 + 32 * p + 16 * h);
            int dot0 = dp4a(q.x & 0x0F0F0F0Fu, xa.x, 0);
            dot0 = dp4a(q.y & 0x0F0F0F0Fu, xa.y, dot0);
            dot0 = dp4a(q.z & 0x0F0F0F0Fu, xa.z, dot0);
            dot0 = dp4a(q.w & 0x0F0F0F0Fu, xa.w, dot0);
            int dot1 = dp4a((q.x >> 4) & 0x0F0F0F0Fu, xb.x, 0);
            dot1 = dp4a((q.y >> 4) & 0x0F0F0F0Fu, xb.y, dot1);
            dot1 = dp4a((q.z >> 4) & 0x0F0F0F0Fu, xb.z, dot1);
            dot1 = dp4a((q.w >> 4) & 0x0F0F0F0Fu, xb.w, dot1);
            int sc0, m0, sc1, m1;
            q4k_sm(hd.y, hd.z, hd.w, 2 * p, sc0, m0);
            q4k_sm(hd.y, hd.z, hd.w, 2 * p + 1, sc1, m1);
            const float d = h2f((u16)(hd.x & 0xFFFF)), dmin = h2f((u16)(hd.x >> 16));
            float v = d * ((float)(sc0 * dot0) * da.x + (float)(sc1 * dot1) * db.x);
            if (h == 0) v -= dmin * ((float)m0 * da.y + (float)m1 * db.y);
            acc[r] += v;
        }
    }
    block_store(acc, row0, N, Y);
}

// Q6_K in 224-byte blocks: ql[128] qh[64] scales[16] d(f16) pad[14]. Slot (h, c, lq):
// ql[64h + 32c + 16lq ..+16] (quarters qd = c low nibbles, c + 2 high), qh[32h + 16lq ..+16].
extern "C" __global__ void __launch_bounds__(WARPS * 32)
    mmvq_q6_k(const u8* __restrict__ W, int row_bytes, int N, int K, const s8* __restrict__ xq,
              const float2* __restrict__ xds, float* __restrict__ Y) {
    const int row0 = blockIdx.x * ROWS_PER_BLOCK;
    const int nslots = K / 32;
    float acc[ROWS_PER_BLOCK];
#pragma unroll
    for (int r = 0; r < ROWS_PER_BLOCK; ++r) acc[r] = 0.f;
    for (int s = threadIdx.x; s < nslots; s += WARPS * 32) {
        const int b = s >> 3, h = (s >> 2) & 1, c = (s >> 1) & 1, lq = s & 1;
        const int ka = 256 * b + 128 * h + 32 * c + 16 * lq;  // quarter c
        const uint4 xa = ldg16(xq + ka), xb = ldg16(xq + ka + 64);  // quarter c + 2
        const float dxa = __ldg(xds + 8 * b + 4 * h + c).x;
        const float dxb = __ldg(xds + 8 * b + 4 * h + c + 2).x;
        int oa = dp4a(0x20202020u, xa.x, 0);  // 32 * sum(x q) of each half: the -32 offset
        oa = dp4a(0x20202020u, xa.y, oa);
        oa = dp4a(0x20202020u, xa.z, oa);
        oa = dp4a(0x20202020u, xa.w, oa);
        int ob = dp4a(0x20202020u, xb.x, 0);
        ob = dp4a(0x20202020u, xb.y, ob);
        ob = dp4a(0x20202020u, xb.z, ob);
        ob = dp4a(0x20202020u, xb.w, ob);
        const int sha = 2 * c, shb = 2 * c + 4;
#pragma unroll
        for (int r = 0; r < ROWS_PER_BLOCK; ++r) {
            const u8* blk = W + (size_t)min(row0 + r, N - 1) * row_bytes + 224 * b;
            const uint4 ql = ldg16(blk + 64 * h + 32 * c + 16 * lq);
            const uint4 qh = ldg16(blk + 128 + 32 * h + 16 * lq);
            const u8* sc = blk + 192 + 8 * h + lq + 2 * c;
            const float d = ld_h(blk + 208);
            const int sca = (s8)__ldg(sc), scb = (s8)__ldg(sc + 4);
            int da = -oa, db = -ob;
            da = dp4a((ql.x & 0x0F0F0F0Fu) | (((qh.x >> sha) & 0x03030303u) << 4), xa.x, da);
            da = dp4a((ql.y & 0x0F0F0F0Fu) | (((qh.y >> sha) & 0x03030303u) << 4), xa.y, da);
            da = dp4a((ql.z & 0x0F0F0F0Fu) | (((qh.z >> sha) & 0x03030303u) << 4), xa.z, da);
            da = dp4a((ql.w & 0x0F0F0F0Fu) | (((qh.w >> sha) & 0x03030303u) << 4), xa.w, da);
            db = dp4a(((ql.x >> 4) & 0x0F0F0F0Fu) | (((qh.x >> shb) & 0x03030303u) << 4), xb.x, db);
            db = dp4a(((ql.y >> 4) & 0x0F0F0F0Fu) | (((qh.y >> shb) & 0x03030303u) << 4), xb.y, db);
            db = dp4a(((ql.z >> 4) & 0x0F0F0F0Fu) | (((qh.z >> shb) & 0x03030303u) << 4), xb.z, db);
            db = dp4a(((ql.w >> 4) & 0x0F0F0F0Fu) | (((qh.w >> shb) & 0x03030303u) << 4), xb.w, db);
            acc[r] += d * ((float)(sca * da) * dxa + (float)(scb * db) * dxb);
        }
    }
    block_store(acc, row0, N, Y);
}

// The 32-value block types through common.cuh's group decoder: slot = group g (16 weights,
// runs at k0 and k1, both inside Q8_1 block k0 / 32).
template <int QT>
__device__ __forceinline__ void mmvq_g(const u8* __restrict__ W, int row_bytes, int N, int K,
                                       const s8* __restrict__ xq, const float2* __restrict__ xds,
                                       float* __restrict__ Y) {
    const int row0 = blockIdx.x * ROWS_PER_BLOCK;
    const int ng = K / 16;
    float acc[ROWS_PER_BLOCK];
#pragma unroll
    for (int r = 0; r < ROWS_PER_BLOCK; ++r) acc[r] = 0.f;
    for (int g = threadIdx.x; g < ng; g += WARPS * 32) {
        int o0, o1;
        run_offsets<QT>(g % QTraits<QT>::GROUPS, o0, o1);
        const int kb = (g / QTraits<QT>::GROUPS) * QTraits<QT>::BK;
        const uint2 x0 = __ldg((const uint2*)(xq + kb + o0)), x1 = __ldg((const uint2*)(xq + kb + o1));
        const float dx = __ldg(xds + (kb + o0) / 32).x;
        int sx = 0;
        if (QT == QT_Q4_1) sx = dp4a(0x01010101u, x0.x, dp4a(0x01010101u, x0.y, 0));
        int sx1 = 0;
        if (QT == QT_Q4_1) sx1 = dp4a(0x01010101u, x1.x, dp4a(0x01010101u, x1.y, 0));
#pragma unroll
        for (int r = 0; r < ROWS_PER_BLOCK; ++r) {
            Run8 a, b;
            decode_group<QT>(W + (size_t)min(row0 + r, N - 1) * row_bytes +
                                 (size_t)(g / QTraits<QT>::GROUPS) * QTraits<QT>::BYTES,
                             g % QTraits<QT>::GROUPS, a, b);
            const int da = dp4a(a.q1, x0.y, dp4a(a.q0, x0.x, 0));
            const int db = dp4a(b.q1, x1.y, dp4a(b.q0, x1.x, 0));
            float v = dx * (a.a * (float)da + b.a * (float)db);
            if (QT == QT_Q4_1) v += dx * (a.b * (float)sx + b.b * (float)sx1);
            acc[r] += v;
        }
    }
    block_store(acc, row0, N, Y);
}

#define MMVQ_KERNEL(name, QT)                                                                 \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                     \
        mmvq_##name(const u8* W, int row_bytes, int N, int K, const s8* xq, const float2* xds, \
                    float* Y) {                                                               \
        mmvq_g<QT>(W, row_bytes, N, K, xq, xds, Y);                                           \
    }

MMVQ_KERNEL(q4_0, QT_Q4_0)
MMVQ_KERNEL(q4_1, QT_Q4_1)
MMVQ_KERNEL(q5_0, QT_Q5_0)
MMVQ_KERNEL(q8_0, QT_Q8_0)
