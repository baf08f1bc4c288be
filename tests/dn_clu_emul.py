"""shaders/cuda/dn_clu.cu (delta_net.step_cluster) built for the CPU by g++ behind a small CUDA
shim, so its indexing, its cluster's division of work and its arithmetic run without a GPU:
every block of a cluster runs at once, its CUDA threads as std::threads (threadIdx / blockIdx
thread-local); __syncthreads is a block barrier, __syncwarp and each warp shuffle a warp barrier
around a slot per lane, the cluster barrier one over the cluster's threads, each block's shared
memory its own DncShared (the kernel's DNC_EMUL hooks) and a distributed shared memory load the
same offset in another block's. Used by tests/engine/backends/cuda/test_dn_clu_host.py against the
NumPy reference."""

from __future__ import annotations

import subprocess
from pathlib import Path

import numpy as np

from engine.backends import kernel_sources
from tests import host_cpp
from tests.host_cpp import SLURP

GXX = host_cpp.GXX  # test_dn_clu_host skips without it

_SHIM = r"""
#include <barrier>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <optional>
#include <thread>
#include <vector>
#define __device__
#define __forceinline__ inline
#define __global__
#define __restrict__ __restrict
#define __launch_bounds__(...)
#define __cluster_dims__(...)
struct Dim3 { unsigned x = 0, y = 0, z = 0; };
thread_local Dim3 threadIdx, blockIdx;
Dim3 blockDim, gridDim;
thread_local std::barrier<>* emu_bar;   // the block's threads
thread_local std::barrier<>* emu_wbar;  // the warp's 32 threads
thread_local std::barrier<>* emu_cbar;  // the cluster's threads
thread_local float* emu_wslots;         // the warp's shuffle slots
thread_local char* emu_smem;            // this block's shared memory
thread_local char* const* emu_cluster;  // every block's of the cluster, by rank
inline void __syncthreads() { emu_bar->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu_wbar->arrive_and_wait(); }
template <class T> inline T __ldg(const T* p) { return *p; }
inline float __shfl_xor_sync(unsigned, float v, int o) {
    const int l = threadIdx.x & 31;
    emu_wslots[l] = v;
    emu_wbar->arrive_and_wait();
    const float r = emu_wslots[l ^ o];
    emu_wbar->arrive_and_wait();
    return r;
}
inline float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline void emu_cluster_sync() { emu_cbar->arrive_and_wait(); }
thread_local std::optional<std::barrier<>::arrival_token> emu_token;
inline void emu_cluster_arrive() { emu_token.emplace(emu_cbar->arrive()); }
inline void emu_cluster_wait() { emu_cbar->wait(std::move(*emu_token)); }
template <class T> inline T* emu_block_shared() { return (T*)emu_smem; }
inline const float* emu_dsmem(const float* p, int rank) {
    return (const float*)(emu_cluster[rank] + ((const char*)p - emu_smem));
}
"""

_DRIVER = r"""
typedef void (*Kern)(const float*, float*, const float*, int, const float*, const float*,
                     const float*, const float*, float*, const float*, const float*, float*, int,
                     int, int, int, int, float);
// argv: input file, output file. Input: int32 Hk, Hv, dk, dv, K, grouped, threads, float32 eps,
// then float32 xr [Cc], cs [K-1, Cc], cw [Cc, K], a, b, dt, sa [Hv], state [Hv dk dv], nw [dv],
// z [Hv dv]. Output: y [Hv dv], state, cs (both updated in place).
int main(int argc, char** argv) {
    std::vector<char> in = slurp(argv[1]);
    const int* h = (const int*)in.data();
    const int Hk = h[0], Hv = h[1], dk = h[2], dv = h[3], K = h[4], grouped = h[5];
    const int threads = h[6];
    float eps;
    std::memcpy(&eps, h + 7, 4);
    const int Cc = 2 * Hk * dk + Hv * dv, RV = Hv / Hk;
    float* p = (float*)(in.data() + 32);
    float *xr = p, *cs = xr + Cc, *cw = cs + (size_t)(K - 1) * Cc, *a = cw + (size_t)Cc * K;
    float *b = a + Hv, *dt = b + Hv, *sa = dt + Hv, *state = sa + Hv;
    float *nw = state + (size_t)Hv * dk * dv, *z = nw + dv;
    std::vector<float> y((size_t)Hv * dv, NAN);
#if STEP_CLUSTER <= 2
    Kern k = RV == 1 ? dn_clu_r1 : RV == 2 ? dn_clu_r2 : dn_clu_r4;
#else
    Kern k = RV == 1 ? dn_clu_r1 : dn_clu_r2;  // (no 16-block clusters)
#endif
    blockDim.x = threads;
    gridDim.x = STEP_CLUSTER, gridDim.y = Hv;
    const int nb = STEP_CLUSTER * RV, nt = nb * threads;
    for (int cy = 0; cy < Hv / RV; ++cy) {  // one cluster at a time: its blocks at once
        std::vector<std::vector<char>> smem(nb, std::vector<char>(sizeof(DncShared)));
        std::vector<char*> bases(nb);
        for (int r = 0; r < nb; ++r) {
            std::memset(smem[r].data(), 0xFF, sizeof(DncShared));  // stale: NaN floats
            bases[r] = smem[r].data();
        }
        std::barrier<> cbar(nt);
        std::vector<std::barrier<>*> bbar, wbar;
        std::vector<std::vector<float>> slots;
        for (int r = 0; r < nb; ++r) bbar.push_back(new std::barrier<>(threads));
        for (int w = 0; w < nt / 32; ++w) {
            wbar.push_back(new std::barrier<>(32));
            slots.emplace_back(32);
        }
        std::vector<std::thread> ts;
        for (int t = 0; t < nt; ++t)
            ts.emplace_back([&, t] {
                const int r = t / threads, tid = t % threads;  // rank = x + STEP_CLUSTER * (y % RV)
                threadIdx.x = tid;
                blockIdx.x = r % STEP_CLUSTER;
                blockIdx.y = cy * RV + r / STEP_CLUSTER;
                emu_bar = bbar[r];
                emu_wbar = wbar[t / 32];
                emu_wslots = slots[t / 32].data();
                emu_cbar = &cbar;
                emu_smem = bases[r];
                emu_cluster = bases.data();
                k(xr, cs, cw, K, a, b, dt, sa, state, nw, z, y.data(), Hk, Hv, dk, dv, grouped,
                  eps);
            });
        for (auto& t : ts) t.join();
        for (auto* q : bbar) delete q;
        for (auto* q : wbar) delete q;
    }
    FILE* f = std::fopen(argv[2], "wb");
    std::fwrite(y.data(), 4, y.size(), f);
    std::fwrite(state, 4, (size_t)Hv * dk * dv, f);
    std::fwrite(cs, 4, (size_t)(K - 1) * Cc, f);
    std::fclose(f);
    return 0;
}
"""


def source() -> str:
    """The emulation translation unit: the shim, dn_clu.cu (DNC_EMUL; read as the backend
    reads it: a planted bug's overlay included), the driver."""
    dn_clu = kernel_sources.read_text("cuda/dn_clu.cu")
    return _SHIM + "#define DNC_EMUL 1\n" + dn_clu + SLURP + _DRIVER


def build(defines: dict[str, int], out_dir: Path) -> Path:
    """The emulator executable for these defines (MAX_DK, STATE_TRANSPOSED, STEP_CLUSTER,
    STEP_LANES), built once per content."""
    return host_cpp.build(source(), defines, out_dir, "dn_clu_emul", "-pthread")


def run(
    exe: Path,
    shape: tuple[int, int, int, int, int],
    grouped: bool,
    threads: int,
    eps: float,
    arrays: list[np.ndarray],
    work: Path,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One emulated launch. shape (Hk, Hv, dk, dv, K); arrays xr, cs, cw, a, b, dt, sa, state
    (the device layout), nw, z -> y [Hv * dv] (NaN where the kernel wrote nothing), the state
    and the conv state after it."""
    Hk, Hv, dk, dv, K = shape
    head = np.array([Hk, Hv, dk, dv, K, int(grouped), threads], np.int32).tobytes()
    body = b"".join(np.ascontiguousarray(x, np.float32).tobytes() for x in arrays)
    (work / "in.bin").write_bytes(head + np.float32(eps).tobytes() + body)
    r = subprocess.run(
        [str(exe), str(work / "in.bin"), str(work / "out.bin")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    out = np.fromfile(work / "out.bin", np.float32)
    n_s = Hv * dk * dv
    Cc = 2 * Hk * dk + Hv * dv
    return out[: Hv * dv], out[Hv * dv : Hv * dv + n_s], out[Hv * dv + n_s :].reshape(K - 1, Cc)
