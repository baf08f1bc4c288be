// attn_decode.cu: decode attention (one query token) over the float32 KV cache, one block per
// (key range, KV head) serving every query head of that KV head's group.
//
//   out[h] = softmax_l(q[h] . K[l, h / G] / sqrt(D)) V[l, h / G],  l <= pos,  G = H / Hkv
//
// Variant (engine/tuning/kernels/cuda.py): attention_decode.gqa. attn_split / attn_split_kw
// (attention.cu) take one q head per block, so each of a group's G heads reads the group's K and
// V again (6x on a 12q/2kv model) and a block walks its range in a chain of dependent load ->
// reduce -> softmax steps. Here a block stages a tile of KT = 32 keys' K and V rows in shared
// memory (every load of the tile in flight at once), then each warp takes G / warps q heads:
// lane = key for the scores (the K row read from shared memory, q broadcast), a warp max / sum
// for the softmax, lane = 4 dims for P.V (V from shared memory, p broadcast by shuffles).
// Online softmax over the range's tiles; partials [H, SPLITS, D] and (max, sum) as attn_split's,
// so attn_combine / attn_combine_q8 merge them, or with out non-null the KV head's last range to
// finish (a ticket per KV head, reset by that block) combines its G heads, and with xq non-null
// writes out's Q8_1 blocks (attn_combine_q8's arithmetic): one launch for the decode attention.
// With early = 1 the first tile's rows below the current position (written by earlier decode
// steps, never by the kernels this one may overlap under PDL) are loaded before the PDL wait,
// so the cache reads overlap the previous kernel; the current row and q come after the wait.
// With knew non-null (knob fuse_rope) q and knew are the projections before RoPE (biases added):
// each block ropes its group's q heads as it stages them (rope_pair's arithmetic, the angles
// once per block), and the block whose range holds the current position writes that position's
// roped k row and vnew's row into the cache before reading it: rope_kv's work, no launch.
// Needs D % 4 == 0, D <= 128, G <= 4 * warps, G <= 32 (else the host runs attn_split).
// Tunables (launch): SPLITS (grid x), warps, fuse_combine (out), early.
#include "common.cuh"

#define NEG_INF __int_as_float(0xff800000)
#define KT 32       // keys per tile: one per lane in the scores
#define HPW_MAX 4   // q heads a warp holds at most
#define GMAX 32     // q heads a KV group may have

__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ float dot4f(float4 a, float4 b, float acc) {
    return fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, acc))));
}

// keys [lo, hi) of the tile starting at t0 into ks / vs (rows of RS float4s)
__device__ __forceinline__ void load_rows(float4* ks, float4* vs, const float4* k4,
                                          const float4* v4, size_t rstride, int D4, int RS,
                                          int t0, int lo, int hi) {
    const int n = (hi - lo) * D4;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int j = lo - t0 + i / D4, c = i % D4;
        const size_t g = (size_t)(t0 + j) * rstride + c;
        ks[j * RS + c] = k4[g];
        vs[j * RS + c] = v4[g];
    }
}

// grid (SPLITS, Hkv), block warps * 32, dynamic smem (2 * KT * (D + 4) + G * D) floats.
// q [H, D] (16-byte aligned), cache [S, Hkv, D]; part [H, SPLITS, D], ml [H, SPLITS, 2].
extern "C" __global__ void attn_gqa(const float* __restrict__ q, float* kc, float* vc,
                                    float* part, float* ml, int H, int Hkv, int D, int pos0,
                                    const int* pos_ptr, float scale, float* out,
                                    signed char* xq, float2* xds, unsigned int* tickets,
                                    int early, const float* knew, const float* vnew,
                                    float theta, int neox) {
    extern __shared__ float4 sm4[];
    const int G = H / Hkv, D4 = D / 4, RS = D4 + 1;  // K / V rows padded by one float4
    float4* ks = sm4;           // [KT][RS]
    float4* vs = ks + KT * RS;  // [KT][RS]
    float4* qs = vs + KT * RS;  // [G][D4], pre-scaled
    const int s = blockIdx.x, kvh = blockIdx.y, nsplit = gridDim.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    pdl_trigger();
    // the position: written before the graph's first kernel (decode_prep), never in flight
    const int L = (pos_ptr ? *pos_ptr : pos0) + 1;
    const int chunk = (L + nsplit - 1) / nsplit;
    const int kb = s * chunk, ke = min(L, kb + chunk);
    const size_t rstride = (size_t)Hkv * D4;  // float4s from one key's row to the next
    const float4* k4 = (const float4*)kc + (size_t)kvh * D4;
    const float4* v4 = (const float4*)vc + (size_t)kvh * D4;
    // first tile: the settled rows (below L - 1) before the wait under early, the rest after
    const int e0 = min(ke, kb + KT), settled = early ? min(e0, L - 1) : kb;
    if (settled > kb) load_rows(ks, vs, k4, v4, rstride, D4, RS, kb, kb, settled);
    pdl_wait();
    if (knew) {  // fuse_rope: q, k unroped; this position's k, v rows not yet in the cache
        __shared__ double cs[64][2];  // cos, sin of pair j at position L - 1 (D <= 128)
        const int half = D / 2;
        for (int j = threadIdx.x; j < half; j += blockDim.x) {
            const double ang = (double)(L - 1) * pow((double)theta, -2.0 * j / D);
            sincos(ang, &cs[j][1], &cs[j][0]);
        }
        __syncthreads();
        const bool owner = kb <= L - 1 && L - 1 < ke;  // the range holding the current key
        const int nq = G * half, nk = owner ? half : 0;
        float* qf = (float*)qs;
        for (int i = threadIdx.x; i < nq + nk; i += blockDim.x) {
            const bool isq = i < nq;
            const int g = isq ? i / half : 0, j = isq ? i % half : i - nq;
            const float* x = isq ? q + (size_t)(kvh * G + g) * D : knew + (size_t)kvh * D;
            const int ia = neox ? j : 2 * j, ib = neox ? j + half : 2 * j + 1;
            const double a = x[ia], b = x[ib], c = cs[j][0], sn = cs[j][1];
#ifdef MUTANT_ATTN_GQA_ROPE_SIN  // planted bug: the rotation's sine term with the wrong sign
            const float ra = (float)(a * c + b * sn), rb = (float)(b * c - a * sn);
#else
            const float ra = (float)(a * c - b * sn), rb = (float)(a * sn + b * c);  // rope_pair
#endif
            if (isq) {
                qf[g * D + ia] = ra * scale;
                qf[g * D + ib] = rb * scale;
            } else {
                float* kr = kc + ((size_t)(L - 1) * Hkv + kvh) * D;
                kr[ia] = ra;
                kr[ib] = rb;
            }
        }
        if (owner)
            for (int d = threadIdx.x; d < D; d += blockDim.x)
                vc[((size_t)(L - 1) * Hkv + kvh) * D + d] = vnew[(size_t)kvh * D + d];
        __syncthreads();  // the rows just written are read below by other threads of the block
    } else {
        for (int i = threadIdx.x; i < G * D4; i += blockDim.x) {
#ifdef MUTANT_ATTN_GQA_Q0  // planted bug: every head of the group scores with its first q head
            const float4 v = ((const float4*)q)[(size_t)kvh * G * D4 + i % D4];
#else
            const float4 v = ((const float4*)q)[(size_t)kvh * G * D4 + i];
#endif
            qs[i] = make_float4(v.x * scale, v.y * scale, v.z * scale, v.w * scale);
        }
    }
    if (e0 > max(kb, settled)) load_rows(ks, vs, k4, v4, rstride, D4, RS, kb, max(kb, settled), e0);
    __syncthreads();
    float m[HPW_MAX], l[HPW_MAX];
    float4 acc[HPW_MAX];
#pragma unroll
    for (int hh = 0; hh < HPW_MAX; ++hh) {
        m[hh] = NEG_INF;
        l[hh] = 0.f;
        acc[hh] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    for (int t0 = kb; t0 < ke; t0 += KT) {
        const int nv = min(KT, ke - t0);  // keys of this tile
        if (t0 != kb) {
            __syncthreads();  // the last tile's rows are read by every warp
            load_rows(ks, vs, k4, v4, rstride, D4, RS, t0, t0, t0 + nv);
            __syncthreads();
        }
        float sc[HPW_MAX];
#pragma unroll
        for (int hh = 0; hh < HPW_MAX; ++hh) sc[hh] = 0.f;
        const float4* kr = ks + lane * RS;  // lanes past nv read stale rows: masked below
        for (int c = 0; c < D4; ++c) {
            const float4 kf = kr[c];
#pragma unroll
            for (int hh = 0; hh < HPW_MAX; ++hh) {
                const int g = warp + hh * nw;
                if (g < G) sc[hh] = dot4f(qs[g * D4 + c], kf, sc[hh]);
            }
        }
        float p[HPW_MAX];
#pragma unroll
        for (int hh = 0; hh < HPW_MAX; ++hh) {
            const int g = warp + hh * nw;
            p[hh] = 0.f;
            if (g >= G) continue;  // warp-uniform
            const float sv = lane < nv ? sc[hh] : NEG_INF;
            const float mn = fmaxf(m[hh], warp_max(sv));  // finite: the tile has a key
            const float corr = expf(m[hh] - mn);
            p[hh] = lane < nv ? expf(sv - mn) : 0.f;
            l[hh] = l[hh] * corr + warp_sum(p[hh]);
            acc[hh].x *= corr, acc[hh].y *= corr, acc[hh].z *= corr, acc[hh].w *= corr;
            m[hh] = mn;
        }
        const bool dl = lane < D4;
        for (int j = 0; j < nv; ++j) {
            const float4 vf = dl ? vs[j * RS + lane] : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int hh = 0; hh < HPW_MAX; ++hh) {
                if (warp + hh * nw >= G) continue;
                const float pj = __shfl_sync(0xffffffffu, p[hh], j);
                acc[hh].x = fmaf(pj, vf.x, acc[hh].x);
                acc[hh].y = fmaf(pj, vf.y, acc[hh].y);
                acc[hh].z = fmaf(pj, vf.z, acc[hh].z);
                acc[hh].w = fmaf(pj, vf.w, acc[hh].w);
            }
        }
    }
#pragma unroll
    for (int hh = 0; hh < HPW_MAX; ++hh) {
        const int g = warp + hh * nw;
        if (g >= G) continue;
        const size_t o = (size_t)(kvh * G + g) * nsplit + s;
        if (lane < D4) ((float4*)part)[o * D4 + lane] = acc[hh];
        if (lane == 0) {
            ml[2 * o] = m[hh];
            ml[2 * o + 1] = l[hh];
        }
    }
    if (!out) return;
    __shared__ bool last;
    __shared__ float hm[GMAX], hinv[GMAX];
    __threadfence();  // this block's partials are visible before its ticket is counted
    __syncthreads();
    if (threadIdx.x == 0) last = atomicAdd(tickets + kvh, 1u) == (unsigned)(nsplit - 1);
    __syncthreads();
    if (!last) return;
    __threadfence();
    for (int g = threadIdx.x; g < G; g += blockDim.x) {
        const float* pm = ml + 2 * (size_t)(kvh * G + g) * nsplit;
        float M = NEG_INF;
        for (int r = 0; r < nsplit; ++r) M = fmaxf(M, __ldcg(pm + 2 * r));
        float Ls = 0.f;
        for (int r = 0; r < nsplit; ++r) {
            const float mr = __ldcg(pm + 2 * r);
            if (mr != NEG_INF) Ls += __ldcg(pm + 2 * r + 1) * expf(mr - M);
        }
        hm[g] = M;
        hinv[g] = 1.f / Ls;
    }
    __syncthreads();
    const int n = G * D;
    for (int e0 = 0; e0 < n; e0 += blockDim.x) {  // whole warps: the Q8_1 shuffles
        const int e = e0 + threadIdx.x, g = e / D, d = e - g * D;
        const bool ok = e < n;
        float a = 0.f;
        if (ok) {
            const size_t o = (size_t)(kvh * G + g) * nsplit;
            const float M = hm[g];
            for (int r = 0; r < nsplit; ++r) {
                const float mr = __ldcg(ml + 2 * (o + r));
                if (mr != NEG_INF) a += __ldcg(part + (o + r) * D + d) * expf(mr - M);
            }
            a = a * hinv[g];
        }
        const size_t oe = (size_t)kvh * n + e;  // = (kvh * G + g) * D + d
        if (xq) {  // warps cover 32 consecutive values (D % 32 == 0)
            const float amax = warp_max(fabsf(a));
            const float dq = amax / 127.f, id = amax > 0.f ? 127.f / amax : 0.f;
            const int qv = __float2int_rn(a * id);
            int sq = qv;
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
            if (ok) {
                xq[oe] = (signed char)qv;
                if (lane == 0) xds[oe / 32] = make_float2(dq, dq * (float)sq);
            }
        }
        if (ok) out[oe] = a;
    }
    if (threadIdx.x == 0) tickets[kvh] = 0;
}
