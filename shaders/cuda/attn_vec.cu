// attn_vec.cu: attention_decode.vec, decode attention (one query token) over the float32 KV
// cache with every K / V load of a warp's round in flight at once, registers only (no K / V
// tiles in shared memory: 4 KiB of it for the block's merge).
//
//   out[h] = softmax_l(q[h] . K[l, h / G] / sqrt(D)) V[l, h / G],  l <= pos,  G = H / Hkv
//
// Why: split / split_kw walk a range as a chain of load -> reduce -> softmax steps (one memory
// round trip or two a step) and read each KV head's rows once per q head; gqa / tile stage
// 32-key tiles in 35-70 KiB of shared memory. Decode attention moves ~1 MB: it is one memory
// round trip if enough of it is requested at once (Little's law: ~1 MB in flight), so here each
// warp loads KU = 8 keys' K and V rows (a lane = 4 dims of every row, 2 x 8 float4 in flight a
// lane) and scores them against all GP (padded group) q heads of the KV head at once:
//   - scores: GP x KU dot products of 4 dims a lane, summed over the warp by a reduce-scatter
//     butterfly (5 steps, 62 shuffles at GP = 8 instead of 64 x 5), leaving lane l the sums of
//     the (head, key) pairs NV l .. NV l + NV - 1 (NV = GP KU / 32, head-major);
//   - softmax: per head, the max of the round over the head's lanes, the running (max, sum) of
//     the warp's rounds (online softmax), p = exp(s - max) in the lane holding s;
//   - P.V: acc[g] (the lane's 4 dims of head g) += p[g][u] V[u], p broadcast by shuffles.
// A block is nw warps; the warps take interleaved rounds of the block's key range and merge
// (max, sum, acc) in shared memory in warp order (a fixed order: graph == eager bit for bit).
// The range is cut from the position on the device: chunk = max(min_keys, ceil(L / SPLITS))
// rounded up to nw KU keys, ranges past L exit at once, so one captured graph serves every
// position. One range: the block normalizes and writes out; more: each writes an unnormalized
// partial [H, SPLITS, D] and (max, sum), and the KV head's last range to finish (a ticket per KV
// head, reset by that block) combines them, every range of an output float4 in flight at once;
// with xq non-null it also writes out's Q8_1 blocks (q8_store4: quantize_q8_1's rounding).
// With knew non-null (knob fuse_rope) q, knew and vnew are the projections before RoPE (biases
// added): each lane ropes its 4 dims of the group's q heads (rope_pair's arithmetic, the angles
// of its own dims in double; neox pairs' other half from the lane D4 / 2 away), and the block
// whose range holds the current position ropes that key's k row the same way, scores it from
// registers and writes it and vnew's row into the cache: rope_kv's work, no launch.
// Needs D % 4 == 0, D <= 128 (a lane = 4 dims), G <= GP (attn_vec4: 4, attn_vec8: 8); fuse_rope
// also D % 8 == 0.
#include "q8.cuh"

#define NEG_INF __int_as_float(0xff800000)
#define KU 8        // keys a warp loads and scores at once
#define VCU 16      // ranges the combine loads at once
#define VNW_MAX 8   // warps a block may have

__device__ __forceinline__ float dot4v(float4 a, float4 b) {
    return fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, a.w * b.w)));
}
__device__ __forceinline__ float4 axpy4(float a, float4 x, float4 y) {
    return make_float4(fmaf(a, x.x, y.x), fmaf(a, x.y, y.y), fmaf(a, x.z, y.z), fmaf(a, x.w, y.w));
}
__device__ __forceinline__ float4 scale4(float4 x, float a) {
    return make_float4(x.x * a, x.y * a, x.z * a, x.w * a);
}

// one step of the warp's reduce-scatter of sv[0 .. 2 HH): lanes exchange halves across offset O
template <int O, int HH>
__device__ __forceinline__ void rs_step(float* sv, int lane) {
    const bool up = lane & O;
#pragma unroll
    for (int i = 0; i < HH; ++i) {
        const float send = up ? sv[i] : sv[i + HH];
        const float keep = up ? sv[i + HH] : sv[i];
        sv[i] = keep + __shfl_xor_sync(0xffffffffu, send, O);
    }
}

// RoPE of this lane's 4 dims x (dims 4 lane ..) of a head's row at position p: rope_pair's
// arithmetic. Normal pairs (2j, 2j + 1) sit in the lane; neox pairs (j, j + D / 2) pair the lane
// with the lane D4 / 2 away (every lane takes part in the shuffles). cs: the lane's
// cos / sin (normal: pairs 2 lane, 2 lane + 1 in .x / .y; neox: dims 4 lane + t mod D / 2).
struct RopeCS {
    double c[4], s[4];
};
__device__ __forceinline__ RopeCS rope_cs(int lane, int D, int p, float theta, int neox) {
    RopeCS r;
    const int half = D / 2;
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        const int j = neox ? (4 * lane + t) % half : 2 * lane + t / 2;
        if (!neox && (t & 1)) {  // the pair's second dim: the same angle
            r.c[t] = r.c[t - 1], r.s[t] = r.s[t - 1];
            continue;
        }
        const double ang = (double)p * pow((double)theta, -2.0 * j / D);
        sincos(ang, &r.s[t], &r.c[t]);
    }
    return r;
}
__device__ __forceinline__ float4 rope4(float4 x, const RopeCS& r, int lane, int D4, int neox) {
    const int hl = D4 / 2;  // lanes between a neox pair's halves
    const int src = lane < hl ? lane + hl : lane - hl;
    const float yx = __shfl_sync(0xffffffffu, x.x, src), yy = __shfl_sync(0xffffffffu, x.y, src);
    const float yz = __shfl_sync(0xffffffffu, x.z, src), yw = __shfl_sync(0xffffffffu, x.w, src);
    if (!neox) {
        const double a0 = x.x, b0 = x.y, a1 = x.z, b1 = x.w;
        return make_float4((float)(a0 * r.c[0] - b0 * r.s[0]), (float)(a0 * r.s[0] + b0 * r.c[0]),
                           (float)(a1 * r.c[2] - b1 * r.s[2]), (float)(a1 * r.s[2] + b1 * r.c[2]));
    }
    const float xs[4] = {x.x, x.y, x.z, x.w}, ys[4] = {yx, yy, yz, yw};
    float o[4];
#pragma unroll
    for (int t = 0; t < 4; ++t) {
        if (lane < hl) {  // the pair's first half: a = x, b = the partner
            const double a = xs[t], b = ys[t];
            o[t] = (float)(a * r.c[t] - b * r.s[t]);
        } else {  // the second half: a = the partner, b = x
            const double a = ys[t], b = xs[t];
            o[t] = (float)(a * r.s[t] + b * r.c[t]);
        }
    }
    return make_float4(o[0], o[1], o[2], o[3]);
}

// thread-block clusters (sm_90): VCL blocks of a KV head, their shared memory read by each other
#define VCL 8
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory");
    asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory");
#endif
}
__device__ __forceinline__ unsigned dsmem_addr(const void* p, int rank) {
    unsigned a = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    unsigned l;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(l) : "l"(p));
    asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(a) : "r"(l), "r"(rank));
#endif
    return a;
}
__device__ __forceinline__ float dsmem_ld(const float* p, int rank) {
    float v = 0.f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("ld.shared::cluster.f32 %0, [%1];"
                 : "=f"(v) : "r"(dsmem_addr(p, rank)) : "memory");
#endif
    return v;
}
__device__ __forceinline__ float4 dsmem_ld4(const float4* p, int rank) {
    float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(dsmem_addr(p, rank)) : "memory");
#endif
    return v;
}

// rows [j0, j1) of a KV head's K and V (D floats each, rs floats apart) into L2: a lane a
// 128-byte line (the current key's row, rewritten by fuse_rope, may be fetched: harmless)
__device__ __forceinline__ void prefetch_rows(const float* kh, const float* vh, int j0, int j1,
                                              size_t rs, int D, int lane) {
    const int lpr = (D + 31) / 32;  // lines a row
    for (int i = lane; i < (j1 - j0) * lpr; i += 32) {
        const size_t o = (size_t)(j0 + i / lpr) * rs + 32 * (i % lpr);
        asm volatile("prefetch.global.L2 [%0];" ::"l"(kh + o));
        asm volatile("prefetch.global.L2 [%0];" ::"l"(vh + o));
    }
}

// grid (SPLITS, Hkv), block nw * 32 (nw <= VNW_MAX). q [H, D] (16-byte aligned), cache
// [S, Hkv, D]; part [H, SPLITS, D], ml [H, SPLITS, 2]; out [H, D] (+ Q8_1 xq / xds).
template <int GP, bool FR, bool CL>
__device__ __forceinline__ void attn_vec_body(const float* __restrict__ q, float* kc, float* vc,
                                              float* part, float* ml, int H, int Hkv, int D,
                                              int pos0, const int* pos_ptr, float scale,
                                              int min_keys, float* out, signed char* xq,
                                              float2* xds, unsigned int* tickets,
                                              const float* knew, const float* vnew, float theta,
                                              int neox, int prefetch) {
    constexpr int N = GP * KU, NV = N / 32, LPH = KU / NV;  // LPH: lanes holding a head's keys
    static_assert(N % 32 == 0 && KU % NV == 0, "GP x KU: a multiple of 32, NV <= KU");
    __shared__ float4 sacc[GP * 32];         // the block's merged acc [GP][D4]
    __shared__ float sm_m[VNW_MAX][GP], sm_l[VNW_MAX][GP];
    __shared__ bool last;
    const int G = H / Hkv, D4 = D / 4;
    const int s = blockIdx.x, kvh = blockIdx.y, nsplit = gridDim.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    pdl_start();
    const int L = (pos_ptr ? *pos_ptr : pos0) + 1;
    const int step = nw * KU;
    int chunk = max(min_keys, (L + nsplit - 1) / nsplit);
    chunk = (chunk + step - 1) / step * step;
    const int nact = (L + chunk - 1) / chunk;  // <= nsplit
    if (!CL && s >= nact) {  // block-uniform: no ticket; for a separate combine, an empty range
        if (!out)
            for (int g = threadIdx.x; g < G; g += blockDim.x)
                ((float2*)ml)[(size_t)(kvh * G + g) * nsplit + s] = make_float2(NEG_INF, 0.f);
        return;
    }
    const int kb = s * chunk, ke = min(L, kb + chunk);  // cluster: kb >= ke past nact
    const bool dl = lane < D4;  // this lane holds dims 4 lane .. 4 lane + 3
    const size_t rs = (size_t)Hkv * D;
    float* kbase = kc + (size_t)kvh * D + 4 * lane;
    float* vbase = vc + (size_t)kvh * D + 4 * lane;
    const int cur = L - 1;  // the current key: in the last range
    constexpr bool fr = FR;  // knew non-null
    const bool owner = fr && s == nact - 1;
    float4 kcur = make_float4(0.f, 0.f, 0.f, 0.f), vcur = kcur;  // fuse_rope: its rows
    // prefetch: the warp's later rounds' rows into L2 now, so those rounds wait on L2, not
    // DRAM; fuse_rope: the first round's too, while the angles are computed
    if (prefetch || fr) {
        const float* kh = kc + (size_t)kvh * D;
        const float* vh = vc + (size_t)kvh * D;
        const int j1 = kb + warp * KU;
        if (fr) prefetch_rows(kh, vh, j1, min(ke, j1 + KU), rs, D, lane);
        if (prefetch)
            for (int j0 = j1 + step; j0 < ke; j0 += step)
                prefetch_rows(kh, vh, j0, min(ke, j0 + KU), rs, D, lane);
    }
    RopeCS cs;
    if (fr) cs = rope_cs(lane, D, cur, theta, neox);
    float4 qv[GP];
#pragma unroll
    for (int g = 0; g < GP; ++g) {
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (g < G && dl) v = ((const float4*)q)[(size_t)(kvh * G + g) * D4 + lane];
        if (fr && g < G) v = rope4(v, cs, lane, D4, neox);  // warp-uniform
        qv[g] = scale4(v, scale);
    }
    if (owner) {  // block-uniform: rope the current key's k, write it and v into the cache
        float4 kn = make_float4(0.f, 0.f, 0.f, 0.f);
        if (dl) {
            kn = ((const float4*)knew)[(size_t)kvh * D4 + lane];
            vcur = ((const float4*)vnew)[(size_t)kvh * D4 + lane];
        }
        const float4 kro = rope4(kn, cs, lane, D4, neox);  // every lane: the shuffles
        kcur = kro;
        if (warp == 0 && dl) {
            *(float4*)(kbase + (size_t)cur * rs) = kro;
            *(float4*)(vbase + (size_t)cur * rs) = vcur;
        }
    }
    float m[GP];      // running max of head g (the same in every lane)
    float lown = 0.f, mo = NEG_INF;  // this lane's own head: its share of the sum, the max
    float4 acc[GP];
#pragma unroll
    for (int g = 0; g < GP; ++g) {
        m[g] = NEG_INF;
        acc[g] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
    for (int j0 = kb + warp * KU; j0 < ke; j0 += step) {
        float4 kr[KU], vr[KU];
#pragma unroll
        for (int u = 0; u < KU; ++u) {  // every load of the round issued before any use
            const bool ok = dl && j0 + u < ke;
            kr[u] = ok ? *(const float4*)(kbase + (size_t)(j0 + u) * rs)
                       : make_float4(0.f, 0.f, 0.f, 0.f);
            if (owner && j0 + u == cur) kr[u] = kcur;  // not in the cache before this kernel
        }
#pragma unroll
        for (int u = 0; u < KU; ++u) {
            const bool ok = dl && j0 + u < ke;
            vr[u] = ok ? *(const float4*)(vbase + (size_t)(j0 + u) * rs)
                       : make_float4(0.f, 0.f, 0.f, 0.f);
            if (owner && j0 + u == cur) vr[u] = vcur;
        }
        float sv[N];  // partial scores, head-major: sv[g * KU + u]
#pragma unroll
        for (int g = 0; g < GP; ++g)
#pragma unroll
            for (int u = 0; u < KU; ++u) sv[g * KU + u] = dot4v(qv[g], kr[u]);
        // reduce-scatter: after the step of offset o, a lane with bit o set keeps the upper
        // half; in the end lane l holds the full sums of entries NV l + i
        rs_step<16, N / 2>(sv, lane);
        rs_step<8, N / 4>(sv, lane);
        rs_step<4, N / 8>(sv, lane);
        rs_step<2, N / 16>(sv, lane);
        rs_step<1, N / 32>(sv, lane);
        // this lane's NV scores: head gm = NV lane / KU, keys u0 .. u0 + NV - 1
        const int e0 = NV * lane, u0 = e0 % KU;
        float rmax = NEG_INF;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            if (j0 + u0 + i >= ke) sv[i] = NEG_INF;  // past the range: no weight
            rmax = fmaxf(rmax, sv[i]);
        }
#pragma unroll
        for (int o = 1; o < LPH; o <<= 1) rmax = fmaxf(rmax, __shfl_xor_sync(0xffffffffu, rmax, o));
        float p[NV];
        float psum = 0.f;
        float mnew[GP], corr[GP];  // per head: the new running max, the old sums' factor
#pragma unroll
        for (int g = 0; g < GP; ++g) {
            const float rg = __shfl_sync(0xffffffffu, rmax, g * LPH);
            mnew[g] = fmaxf(m[g], rg);
            corr[g] = mnew[g] == NEG_INF ? 1.f : expf(m[g] - mnew[g]);  // m = -inf: 0
        }
        // the lane's own head: the same max and factor as mnew / corr of that head
        const float mown = fmaxf(mo, rmax), cown = mown == NEG_INF ? 1.f : expf(mo - mown);
        mo = mown;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
            p[i] = sv[i] == NEG_INF ? 0.f : expf(sv[i] - mown);
            psum += p[i];
        }
        lown = fmaf(lown, cown, psum);  // the lane holds the same head every round
#pragma unroll
        for (int g = 0; g < GP; ++g) {
            float4 a = scale4(acc[g], corr[g]);
#pragma unroll
            for (int u = 0; u < KU; ++u) {
                const int e = g * KU + u;  // entry e sits in lane e / NV, slot e % NV
                const float pj = __shfl_sync(0xffffffffu, p[e % NV], e / NV);
                a = axpy4(pj, vr[u], a);
            }
            acc[g] = a;
            m[g] = mnew[g];
        }
    }
    // the warp's (max, sum) per head: sums over the head's lanes, then from its first lane
    float lsum = lown;
#pragma unroll
    for (int o = 1; o < LPH; o <<= 1) lsum += __shfl_xor_sync(0xffffffffu, lsum, o);
#pragma unroll
    for (int g = 0; g < GP; ++g) {
        const float lg = __shfl_sync(0xffffffffu, lsum, g * LPH);
        if (lane == 0) sm_m[warp][g] = m[g], sm_l[warp][g] = lg;
    }
    __syncthreads();
    // block merge: M = max over warps; each warp's acc scaled by exp(m_w - M), summed in warp
    // order into sacc
    float wsc[GP];
#pragma unroll
    for (int g = 0; g < GP; ++g) {
        float M = NEG_INF;
        for (int w = 0; w < nw; ++w) M = fmaxf(M, sm_m[w][g]);
        wsc[g] = m[g] == NEG_INF ? 0.f : expf(m[g] - M);
    }
    for (int w = 0; w < nw; ++w) {
        if (warp == w && dl)
#pragma unroll
            for (int g = 0; g < GP; ++g) {
                float4& o = sacc[g * 32 + lane];  // explicit fmaf: the same rounding in every build
                o = w == 0 ? scale4(acc[g], wsc[g]) : axpy4(wsc[g], acc[g], o);
            }
        __syncthreads();
    }
    const int n4 = G * D4;
    const size_t ho = (size_t)kvh * G * D4;  // float4 index of the group's first output
    if (CL) {  // cluster: the 8 ranges of the KV head merge through distributed shared memory
        __shared__ float bm[GP], bl[GP];  // this block's (max, sum) per head
        if (threadIdx.x < GP) {
            const int g = threadIdx.x;
            float M = NEG_INF, Ls = 0.f;
            for (int w = 0; w < nw; ++w) M = fmaxf(M, sm_m[w][g]);
            for (int w = 0; w < nw; ++w)
                if (sm_m[w][g] != NEG_INF) Ls = fmaf(sm_l[w][g], expf(sm_m[w][g] - M), Ls);
            bm[g] = M, bl[g] = Ls;  // a range past the position: (-inf, 0), sacc 0
        }
        cluster_sync();  // every block's sacc, bm, bl written
        const int nc = gridDim.x;  // == the cluster's size: a cluster per KV head
        for (int e00 = s * blockDim.x; e00 < n4; e00 += nc * blockDim.x) {  // whole warps
            const int e = e00 + threadIdx.x, g = e / D4, c = e - g * D4;
            const bool ok = e < n4;
            float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
            if (ok) {
                float mr[VCL], lr[VCL];
                float4 pr[VCL];
#pragma unroll
                for (int r = 0; r < VCL; ++r) {
                    mr[r] = dsmem_ld(&bm[g], r);
                    lr[r] = dsmem_ld(&bl[g], r);
                    pr[r] = dsmem_ld4(&sacc[g * 32 + c], r);
                }
                float M = NEG_INF, Ls = 0.f;
#pragma unroll
                for (int r = 0; r < VCL; ++r) M = fmaxf(M, mr[r]);  // range 0 has keys
#pragma unroll
                for (int r = 0; r < VCL; ++r) {
                    const float w = mr[r] == NEG_INF ? 0.f : expf(mr[r] - M);
                    Ls = fmaf(lr[r], w, Ls);
                    a = axpy4(w, pr[r], a);
                }
                a = scale4(a, 1.f / Ls);
            }
            const size_t oe = ho + e;
            if (xq) q8_store4(a, xq + 4 * oe, xds + oe / 8, (int)(oe & 7), ok);
            if (ok) ((float4*)out)[oe] = a;
        }
        cluster_sync();  // no block leaves while another reads its shared memory
        return;
    }
    // the block's (max, sum) of head g: every thread recomputes it from sm_m / sm_l
    if (nact == 1 && out) {  // one range: normalize and write out, no partials, no ticket
        for (int e00 = 0; e00 < n4; e00 += blockDim.x) {  // whole warps: the Q8_1 shuffles
            const int e = e00 + threadIdx.x, g = e / D4, c = e - g * D4;
            const bool ok = e < n4;
            float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
            if (ok) {
                float M = NEG_INF, Ls = 0.f;
                for (int w = 0; w < nw; ++w) M = fmaxf(M, sm_m[w][g]);
                for (int w = 0; w < nw; ++w)
                    if (sm_m[w][g] != NEG_INF) Ls = fmaf(sm_l[w][g], expf(sm_m[w][g] - M), Ls);
                o = scale4(sacc[g * 32 + c], 1.f / Ls);
            }
            const size_t oe = ho + e;
            if (xq) q8_store4(o, xq + 4 * oe, xds + oe / 8, (int)(oe & 7), ok);
            if (ok) ((float4*)out)[oe] = o;
        }
        return;
    }
    for (int e = threadIdx.x; e < n4; e += blockDim.x) {
        const int g = e / D4, c = e - g * D4;
        const size_t o = (size_t)(kvh * G + g) * nsplit + s;
        ((float4*)part)[o * D4 + c] = sacc[g * 32 + c];
        if (c == 0) {
            float M = NEG_INF, Ls = 0.f;
            for (int w = 0; w < nw; ++w) M = fmaxf(M, sm_m[w][g]);
            for (int w = 0; w < nw; ++w)
                if (sm_m[w][g] != NEG_INF) Ls = fmaf(sm_l[w][g], expf(sm_m[w][g] - M), Ls);
            ((float2*)ml)[o] = make_float2(M, Ls);
        }
    }
    if (!out) return;  // fuse_combine 0: attn_combine(_q8) merges the ranges
    SPLIT_TICKET_OR_RETURN(last, tickets + kvh, nact);
    for (int e00 = 0; e00 < n4; e00 += blockDim.x) {  // whole warps: the Q8_1 shuffles
        const int e = e00 + threadIdx.x, g = e / D4, c = e - g * D4;
        const bool ok = e < n4;
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
        if (ok) {
            const size_t o = (size_t)(kvh * G + g) * nsplit;
            const float2* pm = (const float2*)ml + o;
            const float4* pp = (const float4*)part + o * D4 + c;
            float M = NEG_INF, Ls = 0.f;
            for (int r0 = 0; r0 < nact; r0 += VCU) {
                float2 mr[VCU];
                float4 pv[VCU];
#pragma unroll
                for (int u = 0; u < VCU; ++u) {
                    const bool in = r0 + u < nact;
                    mr[u] = in ? __ldcg(pm + r0 + u) : make_float2(NEG_INF, 0.f);
                    pv[u] = in ? __ldcg(pp + (size_t)(r0 + u) * D4)
                               : make_float4(0.f, 0.f, 0.f, 0.f);
                }
                float Mn = M;
#pragma unroll
                for (int u = 0; u < VCU; ++u) Mn = fmaxf(Mn, mr[u].x);  // range 0 has keys
                const float cw = M == NEG_INF ? 0.f : expf(M - Mn);
                a = scale4(a, cw);
                Ls *= cw;
#pragma unroll
                for (int u = 0; u < VCU; ++u) {
                    const float w = mr[u].x == NEG_INF ? 0.f : expf(mr[u].x - Mn);
                    Ls = fmaf(mr[u].y, w, Ls);
                    a = axpy4(w, pv[u], a);
                }
                M = Mn;
            }
            a = scale4(a, 1.f / Ls);
        }
        const size_t oe = ho + e;
        if (xq) q8_store4(a, xq + 4 * oe, xds + oe / 8, (int)(oe & 7), ok);  // D % 32 == 0
        if (ok) ((float4*)out)[oe] = a;
    }
    if (threadIdx.x == 0) tickets[kvh] = 0;
}

// the group padded to 4 (attn_vec4*) or 8 (attn_vec8*) q heads; *_rope: fuse_rope (knew non-null);
// *_c: a cluster of VCL blocks a KV head (ATTRS: its __cluster_dims__)
#define ATTN_VEC_KERNEL(name, GP, FR, CL, ATTRS)                                                  \
    extern "C" __global__ void __launch_bounds__(VNW_MAX * 32) ATTRS                              \
        attn_vec##name(const float* __restrict__ q, float* kc, float* vc, float* part, float* ml, \
                       int H, int Hkv, int D, int pos0, const int* pos_ptr, float scale,          \
                       int min_keys, float* out, signed char* xq, float2* xds,                    \
                       unsigned int* tickets, const float* knew, const float* vnew, float theta,  \
                       int neox, int prefetch) {                                                  \
        attn_vec_body<GP, FR, CL>(q, kc, vc, part, ml, H, Hkv, D, pos0, pos_ptr, scale,          \
                                  min_keys, out, xq, xds, tickets, knew, vnew, theta, neox,       \
                                  prefetch);                                                      \
    }

ATTN_VEC_KERNEL(4, 4, false, false, )
ATTN_VEC_KERNEL(8, 8, false, false, )
ATTN_VEC_KERNEL(4_rope, 4, true, false, )
ATTN_VEC_KERNEL(8_rope, 8, true, false, )
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 900  // clusters: sm_90 and later
ATTN_VEC_KERNEL(4_c, 4, false, true, __cluster_dims__(VCL, 1, 1))
ATTN_VEC_KERNEL(8_c, 8, false, true, __cluster_dims__(VCL, 1, 1))
ATTN_VEC_KERNEL(4_c_rope, 4, true, true, __cluster_dims__(VCL, 1, 1))
ATTN_VEC_KERNEL(8_c_rope, 8, true, true, __cluster_dims__(VCL, 1, 1))
#endif
