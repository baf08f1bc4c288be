// attn_decode.cu: decode attention (one query token) over the float32 KV cache, one block per
// (key range, KV head) serving every query head of that KV head's group.
//
//   out[h] = softmax_l(q[h] . K[l, h / G] / sqrt(D)) V[l, h / G],  l <= pos,  G = H / Hkv
//
// Variant (engine/tuning/variants/cuda/): attention_decode.gqa. attn_split / attn_split_kw
// (attention.cu) take one q head per block, so each of a group's G heads reads the group's K and
// V again (6x on a 12q/2kv model) and a block walks its range in a chain of dependent load ->
// reduce -> softmax steps. Here a block stages a tile of KT = 32 keys' K and V rows in shared
// memory (every load of the tile in flight at once), then each warp takes G / warps q heads:
// lane = key for the scores (the K row read from shared memory, q broadcast), a warp max / sum
// for the softmax, lane = 4 dims (and 4 more past 128) for P.V (V from shared memory, p
// broadcast by shuffles).
// Online softmax over the range's tiles; partials [H, SPLITS, D] and (max, sum) as attn_split's,
// so attn_combine / attn_combine_q8 merge them, or with out non-null the KV head's last range to
// finish (a ticket per KV head, reset by that block) combines its G heads (the ranges' (max,
// sum) staged in shared memory, every range's partial of an output float4 in flight at once),
// and with xq non-null writes out's Q8_1 blocks (q8.cuh's q8_store4: quantize_q8_1's
// rounding): one launch for the decode attention.
// With early = 1 the first tile's rows below the current position (written by earlier decode
// steps, never by the kernels this one may overlap under PDL) are loaded before the PDL wait,
// so the cache reads overlap the previous kernel; the current row and q come after the wait.
// With knew non-null (knob fuse_rope) q and knew are the projections before RoPE (biases added):
// each block ropes its group's q heads as it stages them (rope_pair's arithmetic, the angles
// once per block), and the block whose range holds the current position writes that position's
// roped k row and vnew's row into the cache before reading it: rope_kv's work, no launch.
// Needs D % 4 == 0, D <= 256, G <= 4 * warps, G <= 32 (else the host runs attn_split).
// Tunables (launch): SPLITS (grid x), warps, fuse_combine (out), early.
#include "q8.cuh"
#include "attn_gqa.cuh"

#define NEG_INF __int_as_float(0xff800000)
#define KT 32       // keys per tile: one per lane in the scores
#define HPW_MAX 4   // q heads a warp holds at most
#define GMAX 32     // q heads a KV group may have
#define DL 2        // float4s of an output row a lane holds: D <= 256

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

// keys [lo, hi) of the tile starting at t0 into ks / vs (rows of RS float4s): LU float4s of
// K and of V a thread, all loads issued before any store (one memory round trip a tile at
// 128 threads and D = 128; a plain loop waited for each pair in turn)
#define LU 8
__device__ __forceinline__ void load_rows(float4* ks, float4* vs, const float4* k4,
                                          const float4* v4, size_t rstride, int D4, int RS,
                                          int t0, int lo, int hi) {
    const int n = (hi - lo) * D4;
    for (int i0 = threadIdx.x; i0 < n; i0 += LU * blockDim.x) {
        float4 kr[LU], vr[LU];
#pragma unroll
        for (int u = 0; u < LU; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i < n) {
                const int j = lo - t0 + i / D4, c = i % D4;
                const size_t g = (size_t)(t0 + j) * rstride + c;
                kr[u] = k4[g];
                vr[u] = v4[g];
            }
        }
#pragma unroll
        for (int u = 0; u < LU; ++u) {
            const int i = i0 + u * blockDim.x;
            if (i < n) {
                const int j = lo - t0 + i / D4, c = i % D4;
                ks[j * RS + c] = kr[u];
                vs[j * RS + c] = vr[u];
            }
        }
    }
}

// grid (SPLITS, Hkv), block warps * 32, dynamic smem max(2 * KT * (D + 4) + G * D, 2 * G * SPLITS)
// floats.
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
        __shared__ double cs[128][2];  // cos, sin of pair j at position L - 1 (D <= 256)
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
            const float ra = (float)(a * c - b * sn), rb = (float)(a * sn + b * c);  // rope_pair
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
            const float4 v = ((const float4*)q)[(size_t)kvh * G * D4 + i];
            qs[i] = make_float4(v.x * scale, v.y * scale, v.z * scale, v.w * scale);
        }
    }
    if (e0 > max(kb, settled)) load_rows(ks, vs, k4, v4, rstride, D4, RS, kb, max(kb, settled), e0);
    __syncthreads();
    float m[HPW_MAX], l[HPW_MAX];
    float4 acc[HPW_MAX][DL];  // float4s lane and lane + 32 of each head's output
    gqa_init(m, l, acc);
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
            gqa_rescale(acc[hh], corr);
            m[hh] = mn;
        }
        for (int j = 0; j < nv; ++j) {
            float4 vf[DL];
#pragma unroll
            for (int c2 = 0; c2 < DL; ++c2)
                vf[c2] = lane + 32 * c2 < D4 ? vs[j * RS + lane + 32 * c2]
                                             : make_float4(0.f, 0.f, 0.f, 0.f);
            gqa_pv(acc, p, vf, j, warp, nw, G, D4);
        }
    }
#pragma unroll
    for (int hh = 0; hh < HPW_MAX; ++hh) {
        const int g = warp + hh * nw;
        if (g >= G) continue;
        const size_t o = (size_t)(kvh * G + g) * nsplit + s;
        gqa_store_part(part, acc[hh], o, lane, D4);
        if (lane == 0) {
            ml[2 * o] = m[hh];
            ml[2 * o + 1] = l[hh];
        }
    }
    if (!out) return;
    __shared__ bool last;
    __shared__ float hinv[GMAX];
    SPLIT_TICKET_OR_RETURN(last, tickets + kvh, nsplit);
    // The group's (max, sum) pairs into shared memory (the K / V tiles' space) in one round
    // trip; a warp per head: its max over the ranges, 1 / sum, and a weight per range
    // exp(m_r - max) (0 for an empty range) in place of m_r.
    const int nml = G * nsplit;  // [G][nsplit]
    float* wts = (float*)sm4;
    float* sums = wts + nml;
    for (int i = threadIdx.x; i < nml; i += blockDim.x) {
        const float2 v = __ldcg((const float2*)ml + (size_t)kvh * nml + i);
        wts[i] = v.x;
        sums[i] = v.y;
    }
    __syncthreads();
    for (int g = warp; g < G; g += nw) {
        float* wg = wts + g * nsplit;
        float M = NEG_INF;
        for (int r = lane; r < nsplit; r += 32) M = fmaxf(M, wg[r]);
        M = warp_max(M);
        float Ls = 0.f;
        for (int r = lane; r < nsplit; r += 32) {
            const float mr = wg[r], w = mr != NEG_INF ? expf(mr - M) : 0.f;
            Ls += sums[g * nsplit + r] * w;
            wg[r] = w;  // each lane rewrites only the entries it read
        }
        Ls = warp_sum(Ls);
        if (lane == 0) hinv[g] = 1.f / Ls;
    }
    __syncthreads();
    // outputs 4 at a time: every range's partial of a float4 in flight before the sums
    const int n4 = G * D4;
    const float4* p4 = (const float4*)part + (size_t)kvh * G * nsplit * D4;
    for (int e0 = 0; e0 < n4; e0 += blockDim.x) {  // whole warps: the Q8_1 shuffles
        const int e = e0 + threadIdx.x, g = e / D4, d4 = e - g * D4;
        const bool ok = e < n4;
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
        if (ok) {
            const float* wg = wts + g * nsplit;
            const float4* pg = p4 + (size_t)g * nsplit * D4 + d4;
            for (int r0 = 0; r0 < nsplit; r0 += LU) {
                float4 pv[LU];
#pragma unroll
                for (int u = 0; u < LU; ++u)
                    pv[u] = r0 + u < nsplit ? __ldcg(pg + (size_t)(r0 + u) * D4)
                                            : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
                for (int u = 0; u < LU; ++u) {
                    const float w = r0 + u < nsplit ? wg[r0 + u] : 0.f;
                    a.x = fmaf(pv[u].x, w, a.x), a.y = fmaf(pv[u].y, w, a.y);
                    a.z = fmaf(pv[u].z, w, a.z), a.w = fmaf(pv[u].w, w, a.w);
                }
            }
            const float inv = hinv[g];
            a = make_float4(a.x * inv, a.y * inv, a.z * inv, a.w * inv);
        }
        const size_t oe = (size_t)kvh * n4 + e;  // float4 index: ((kvh * G + g) * D) / 4 + d4
        if (xq) q8_store4(a, xq + 4 * oe, xds + oe / 8, (int)(oe & 7), ok);  // D % 32 == 0
        if (ok) ((float4*)out)[oe] = a;
    }
    if (threadIdx.x == 0) tickets[kvh] = 0;
}
