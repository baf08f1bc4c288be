// attn_tile.cu: decode attention (one query token) over the float32 KV cache, built for latency:
// a block per (KV head, key range) computes every q head of the group from one read of the
// range's K and V, and the ranges are cut from the position at run time.
//
//   out[h] = softmax_l(q[h] . K[l, h / G] / sqrt(D)) V[l, h / G],  l <= pos,  G = H / Hkv
//
// Variant (engine/tuning/variants/cuda/): attention_decode.tile. Why not split / split_kw /
// gqa: those walk a key range in a chain of dependent steps (load a key, reduce, exp, load its
// V: two memory round trips per step, ~5 steps a block at 550 keys), so a call costs ~15 us at
// any context. Here:
// - ranges: chunk = max(min_keys, ceil(L / SPLITS) rounded up to a 32-key tile); the first
//   nact = ceil(L / chunk) blocks of a KV head take a range each, the others exit at once. A
//   fixed grid (SPLITS x Hkv) so one captured graph serves every position, few ranges (and a
//   cheap combine) at short contexts, SPLITS ranges at long ones.
// - loads: a tile of KT = 32 keys' K and V rows goes to shared memory by cp.async, every 16-byte
//   copy of the tile in flight at once, and (stages 2) the next tile's copies are issued before
//   the current one is computed. Rows are stored XOR-swizzled (float4 c of key j at column
//   c ^ (j & 7)): lane = key reads of K and lane = dims reads of V are both free of bank
//   conflicts without padding (needs D % 32 == 0).
// - compute: warp w takes q heads w, w + warps, ... (G <= 4 x warps): lane = key for the scores
//   (q broadcast from shared memory, two accumulators), a warp max a tile for the online
//   softmax (each lane sums its own keys' p; one warp sum at the end), lane = float4 of dims
//   for P.V (p broadcast by shuffles).
// - combine (out non-null, fuse_combine): one range: the block writes out directly. Else every
//   range writes its partial
//   (unnormalized acc, max, sum) and the KV head's last range to finish (a ticket per KV head,
//   reset by that block) merges them, each thread one float4 of the group's output, its ranges'
//   (max, sum) and partials loaded together (one round trip per 16 ranges); with xq non-null it
//   writes out's Q8_1 blocks (q8_store4: quantize_q8_1's rounding). With out null every block
//   writes its partial, the ranges past the position an empty one (max -inf), for attn_combine
//   / attn_combine_q8 (a second launch: no fence, atomic or serial tail in this one).
// Needs D % 32 == 0, D <= 256, G <= 4 x warps, G <= 32, Hkv <= the ticket count (else the host
// runs attn_split_kw / attn_split).
// Tunables (launch): SPLITS (grid x), min_keys, warps, stages, fuse_combine (out), fuse_rope
// (knew).
#include "q8.cuh"
#include "attn_gqa.cuh"

#define NEG_INF __int_as_float(0xff800000)
#define KT 32     // keys per tile: one per lane in the scores
#define HPW 4     // q heads a warp holds at most
#define DL 2      // float4s of an output row a lane holds: D <= 256
#define CU 16     // ranges the combine loads at once

__device__ __forceinline__ void cp_async16(void* dst, const void* src) {
    unsigned s;
    asm("{ .reg .u64 t; cvta.to.shared.u64 t, %1; cvt.u32.u64 %0, t; }" : "=r"(s) : "l"(dst));
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(s), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_wait1() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
__device__ __forceinline__ void cp_wait0() { asm volatile("cp.async.wait_group 0;" ::: "memory"); }

__device__ __forceinline__ float dot4f(float4 a, float4 b, float acc) {
    return fmaf(a.x, b.x, fmaf(a.y, b.y, fmaf(a.z, b.z, fmaf(a.w, b.w, acc))));
}

// Keys [t0, t0 + nv) of KV head kvh into stage st ([KT][D4] K rows, then [KT][D4] V rows),
// but key skip (fuse_rope: the current key, put there by put_row).
__device__ __forceinline__ void issue_tile(float4* st, const float4* k4, const float4* v4,
                                           size_t rstride, int D4, int t0, int nv, int skip) {
    const int n = nv * D4;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int j = i / D4, c = i - j * D4;
        if (t0 + j == skip) continue;
        const size_t g = (size_t)(t0 + j) * rstride + c;
        const int o = j * D4 + (c ^ (j & 7));
        cp_async16(st + o, k4 + g);
        cp_async16(st + KT * D4 + o, v4 + g);
    }
}

// fuse_rope: the current key's K and V rows (shared kr, vr) into row j of stage st.
__device__ __forceinline__ void put_row(float4* st, const float* kr, const float* vr, int j,
                                        int D4) {
    for (int c = threadIdx.x; c < D4; c += blockDim.x) {
        const int o = j * D4 + (c ^ (j & 7));
        st[o] = ((const float4*)kr)[c];
        st[KT * D4 + o] = ((const float4*)vr)[c];
    }
}

// grid (SPLITS, Hkv), block warps * 32, dynamic smem (G + 2 * stages * KT + 2) * D floats;
// stages 2: tile t + 1 loads while tile t is computed, 1: half the shared memory (under the
// 48 KiB default at D = 128), each tile loaded after the last one's compute.
// q [H, D] (16-byte aligned), cache [S, Hkv, D]; part [H, SPLITS, D], ml [H, SPLITS, 2];
// out [H, D] or null; xq / xds: out's Q8_1 form or null; tickets [Hkv], zero between launches.
// knew non-null (fuse_rope): q and knew [Hkv, D] are the projections before RoPE (biases
// added), vnew [Hkv, D]: every block ropes its group's q (rope_pair's arithmetic, the angles
// once a block, while its tiles load), and the block whose range ends at the current key
// writes that key's roped k row and v row into the cache and into its tile (rope_kv's work).
extern "C" __global__ void attn_tile(const float* __restrict__ q, float* kc, float* vc,
                                     float* part, float* ml, int H, int Hkv, int D, int pos0,
                                     const int* pos_ptr, float scale, int min_keys, int nst,
                                     float* out,
                                     signed char* xq, float2* xds, unsigned int* tickets,
                                     const float* knew, const float* vnew, float theta,
                                     int neox) {
    extern __shared__ float4 sm4[];
    const int G = H / Hkv, D4 = D / 4;
    const int s = blockIdx.x, kvh = blockIdx.y, nsplit = gridDim.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    float4* qs = sm4;            // [G][D4], unscaled (the score is scaled)
    float4* tiles = qs + G * D4;  // nst (1 or 2) stages of [2][KT][D4]
    float* krow = (float*)(tiles + nst * 2 * KT * D4);  // fuse_rope: the current key's rows
    float* vrow = krow + D;
    pdl_start();
    const int L = (pos_ptr ? *pos_ptr : pos0) + 1;
    int chunk = (L + nsplit - 1) / nsplit;
    chunk = max(min_keys, (chunk + KT - 1) / KT * KT);
    const int nact = (L + chunk - 1) / chunk;  // <= nsplit
    if (s >= nact) {  // block-uniform: no ticket; for a separate combine, an empty range
        if (!out)
            for (int g = threadIdx.x; g < G; g += blockDim.x)
                ((float2*)ml)[(size_t)(kvh * G + g) * nsplit + s] = make_float2(NEG_INF, 0.f);
        return;
    }
    const int kb = s * chunk, ke = min(L, kb + chunk), ntile = (ke - kb + KT - 1) / KT;
    const size_t rstride = (size_t)Hkv * D4;  // float4s from one key's row to the next
    const float4* k4 = (const float4*)kc + (size_t)kvh * D4;
    const float4* v4 = (const float4*)vc + (size_t)kvh * D4;
    const int cur = L - 1;  // the current key: in the last range (ke == L)
    const bool fr = knew != nullptr, owner = fr && ke == L;
    const int skip = owner ? cur : -1, tc = (cur - kb) / KT;  // tc: the owner's tile of cur
    // group 0: q and tile 0; group 1: tile 1 under 2 stages (maybe empty); then one a tile
    if (!fr)
        for (int i = threadIdx.x; i < G * D4; i += blockDim.x)
            cp_async16(qs + i, (const float4*)q + (size_t)kvh * G * D4 + i);
    issue_tile(tiles, k4, v4, rstride, D4, kb, min(KT, ke - kb), skip);
    cp_commit();
    if (nst == 2 && ntile > 1)
        issue_tile(tiles + 2 * KT * D4, k4, v4, rstride, D4, kb + KT, min(KT, ke - kb - KT), skip);
    cp_commit();
    if (fr) {  // while the tiles load: rope q (and the owner's k row), rope_kv's arithmetic
        __shared__ double cs[128][2];  // cos, sin of pair j at position cur (D <= 256)
        const int half = D / 2;
        for (int j = threadIdx.x; j < half; j += blockDim.x) {
            const double ang = (double)cur * pow((double)theta, -2.0 * j / D);
            sincos(ang, &cs[j][1], &cs[j][0]);
        }
        __syncthreads();
        const int nq = G * half, nk = owner ? half : 0;
        float* qf = (float*)qs;
        float* kcur = kc + ((size_t)cur * Hkv + kvh) * D;
        for (int i = threadIdx.x; i < nq + nk; i += blockDim.x) {
            const bool isq = i < nq;
            const int g = isq ? i / half : 0, j = isq ? i % half : i - nq;
            const float* x = isq ? q + (size_t)(kvh * G + g) * D : knew + (size_t)kvh * D;
            const int ia = neox ? j : 2 * j, ib = neox ? j + half : 2 * j + 1;
            const double a = x[ia], b = x[ib], c = cs[j][0], sn = cs[j][1];
            const float ra = (float)(a * c - b * sn), rb = (float)(a * sn + b * c);  // rope_pair
            float* dst = isq ? qf + g * D : krow;
            dst[ia] = ra;
            dst[ib] = rb;
            if (!isq) kcur[ia] = ra, kcur[ib] = rb;
        }
        if (owner)
            for (int d = threadIdx.x; d < D; d += blockDim.x) {
                const float vv = vnew[(size_t)kvh * D + d];
                vrow[d] = vv;
                vc[((size_t)cur * Hkv + kvh) * D + d] = vv;
            }
        __syncthreads();  // krow / vrow are copied by other threads
        if (owner && tc < nst) put_row(tiles + tc * 2 * KT * D4, krow, vrow, cur - kb - tc * KT, D4);
    }

    float m[HPW], l[HPW];
    float4 acc[HPW][DL];  // float4s lane and lane + 32 of each head's output
    gqa_init(m, l, acc);
    const int sw = lane & 7;  // this lane's key's swizzle in the scores
    for (int t = 0; t < ntile; ++t) {
        if (nst == 2)
            cp_wait1();  // all groups but the newest: tile t (and q) landed
        else
            cp_wait0();
        __syncthreads();
        const float4* ks = tiles + (t % nst) * 2 * KT * D4;
        const float4* vs = ks + KT * D4;
        const int t0 = kb + t * KT, nv = min(KT, ke - t0);
        // two accumulators a head (even / odd float4s): half the dependent FMA chain
        float sc[HPW], sc1[HPW];
#pragma unroll
        for (int hh = 0; hh < HPW; ++hh) sc[hh] = sc1[hh] = 0.f;
        const float4* kr = ks + lane * D4;  // lanes past nv read stale rows: masked below
#pragma unroll 4
        for (int c = 0; c < D4; c += 2) {  // D4 % 8 == 0: 8 float4 loads a step in flight
            const float4 kf = kr[c ^ sw], kf1 = kr[(c + 1) ^ sw];
#pragma unroll
            for (int hh = 0; hh < HPW; ++hh) {
                const int g = warp + hh * nw;
                if (g < G) {
                    sc[hh] = dot4f(qs[g * D4 + c], kf, sc[hh]);
                    sc1[hh] = dot4f(qs[g * D4 + c + 1], kf1, sc1[hh]);
                }
            }
        }
        float p[HPW];
#pragma unroll
        for (int hh = 0; hh < HPW; ++hh) {
            const int g = warp + hh * nw;
            p[hh] = 0.f;
            if (g >= G) continue;  // warp-uniform
            const float sv = lane < nv ? (sc[hh] + sc1[hh]) * scale : NEG_INF;
            const float mn = fmaxf(m[hh], warp_max(sv));  // finite: the tile has a key
            const float corr = expf(m[hh] - mn);
            p[hh] = lane < nv ? expf(sv - mn) : 0.f;
            l[hh] = l[hh] * corr + p[hh];  // this lane's keys' sum: reduced once, at the end
            gqa_rescale(acc[hh], corr);
            m[hh] = mn;
        }
#pragma unroll 8  // 8 keys' V loads and p shuffles in flight before their FMAs
        for (int j = 0; j < nv; ++j) {
            float4 vf[DL];
#pragma unroll
            for (int c2 = 0; c2 < DL; ++c2) {
                const int c = lane + 32 * c2;
                vf[c2] = c < D4 ? vs[j * D4 + (c ^ (j & 7))] : make_float4(0.f, 0.f, 0.f, 0.f);
            }
            gqa_pv(acc, p, vf, j, warp, nw, G, D4);
        }
        __syncthreads();  // every warp is done with stage t % nst
        if (t + nst < ntile) {
            const int n0 = t0 + nst * KT;
            float4* st = tiles + (t % nst) * 2 * KT * D4;
            issue_tile(st, k4, v4, rstride, D4, n0, min(KT, ke - n0), skip);
            if (owner && t + nst == tc) put_row(st, krow, vrow, cur - n0, D4);
        }
        cp_commit();  // possibly empty: keeps "tile t + 1 is the second newest group"
    }
#pragma unroll
    for (int hh = 0; hh < HPW; ++hh)
        if (warp + hh * nw < G) l[hh] = warp_sum(l[hh]);  // warp-uniform
    const size_t ho = (size_t)kvh * G * D4;  // float4 index of the group's first output
    if (nact == 1 && out) {  // one range: normalize and write, no partials, no ticket
#pragma unroll
        for (int hh = 0; hh < HPW; ++hh) {
            const int g = warp + hh * nw;
            if (g >= G) continue;  // warp-uniform
            const float inv = 1.f / l[hh];
#pragma unroll
            for (int c2 = 0; c2 < DL; ++c2) {
                if (32 * c2 >= D4) break;
                const int c = lane + 32 * c2;
                const float4 a = acc[hh][c2];
                const float4 o = make_float4(a.x * inv, a.y * inv, a.z * inv, a.w * inv);
                const size_t oe = ho + (size_t)g * D4 + c;
                if (xq) q8_store4(o, xq + 4 * oe, xds + oe / 8, (int)(oe & 7), c < D4);
                if (c < D4) ((float4*)out)[oe] = o;
            }
        }
        return;
    }
#pragma unroll
    for (int hh = 0; hh < HPW; ++hh) {
        const int g = warp + hh * nw;
        if (g >= G) continue;
        const size_t o = (size_t)(kvh * G + g) * nsplit + s;
        gqa_store_part(part, acc[hh], o, lane, D4);
        if (lane == 0) ((float2*)ml)[o] = make_float2(m[hh], l[hh]);
    }
    if (!out) return;  // fuse_combine 0: attn_combine(_q8) merges every range
    __shared__ bool last;
    SPLIT_TICKET_OR_RETURN(last, tickets + kvh, nact);
    // a thread per output float4 (whole warps: the Q8_1 shuffles), online over the ranges
    const int n4 = G * D4;
    for (int e0 = 0; e0 < n4; e0 += blockDim.x) {
        const int e = e0 + threadIdx.x, g = e / D4, c = e - g * D4;
        const bool ok = e < n4;
        float4 a = make_float4(0.f, 0.f, 0.f, 0.f);
        float M = NEG_INF, Ls = 0.f;
        if (ok) {
            const size_t o = (size_t)(kvh * G + g) * nsplit;
            const float2* pm = (const float2*)ml + o;
            const float4* pp = (const float4*)part + o * D4 + c;
            for (int r0 = 0; r0 < nact; r0 += CU) {
                float2 mr[CU];
                float4 pv[CU];
#pragma unroll
                for (int u = 0; u < CU; ++u) {
                    const bool in = r0 + u < nact;
                    mr[u] = in ? __ldcg(pm + r0 + u) : make_float2(NEG_INF, 0.f);
                    pv[u] = in ? __ldcg(pp + (size_t)(r0 + u) * D4) : make_float4(0.f, 0.f, 0.f, 0.f);
                }
                float Mn = M;
#pragma unroll
                for (int u = 0; u < CU; ++u) Mn = fmaxf(Mn, mr[u].x);  // finite: range 0 has keys
                const float cw = M == NEG_INF ? 0.f : expf(M - Mn);
                a = make_float4(a.x * cw, a.y * cw, a.z * cw, a.w * cw);
                Ls *= cw;
#pragma unroll
                for (int u = 0; u < CU; ++u) {
                    const float w = mr[u].x == NEG_INF ? 0.f : expf(mr[u].x - Mn);
                    Ls = fmaf(mr[u].y, w, Ls);
                    a.x = fmaf(pv[u].x, w, a.x), a.y = fmaf(pv[u].y, w, a.y);
                    a.z = fmaf(pv[u].z, w, a.z), a.w = fmaf(pv[u].w, w, a.w);
                }
                M = Mn;
            }
            const float inv = 1.f / Ls;
            a = make_float4(a.x * inv, a.y * inv, a.z * inv, a.w * inv);
        }
        const size_t oe = ho + e;
        if (xq) q8_store4(a, xq + 4 * oe, xds + oe / 8, (int)(oe & 7), ok);  // D % 32 == 0
        if (ok) ((float4*)out)[oe] = a;
    }
    if (threadIdx.x == 0) tickets[kvh] = 0;
}
