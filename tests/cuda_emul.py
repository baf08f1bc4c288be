"""The real mmvw_pipe kernels (shaders/cuda/mmvw_pipe.cuh with vecdot.cuh and common.cuh) built
for the CPU by g++ behind a small CUDA shim, so their indexing and arithmetic run without a GPU:
a block's CUDA threads are std::threads (threadIdx / blockIdx thread-local), __syncthreads a
std::barrier, dynamic shared memory one array (blocks run one after another), __ldg a load,
__dp4a a byte dot product; the few PTX asm lines the kernel's path reaches (fp16 to float, the
unsigned dp4a of q4k_lean) are replaced by host code (text substitutions that must all apply).
Warp shuffles are not emulated (the pipe's item loop has none). Used by
tests/test_cuda_mmvw_pipe_host.py against the NumPy int8 reference."""

from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np

from engine.backends.cuda.kernels import SHADERS

GXX = shutil.which("g++")

_SHIM = r"""
#include <algorithm>
#include <barrier>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>
using std::max;
using std::min;
#define __device__
#define __forceinline__ inline
#define __global__
#define __restrict__ __restrict
#define __shared__
#define __align__(n)
#define __launch_bounds__(...)
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
struct int2 { int x, y; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
inline int2 make_int2(int a, int b) { return {a, b}; }
struct Dim3 { unsigned x = 0, y = 0, z = 0; };
thread_local Dim3 threadIdx, blockIdx;
Dim3 blockDim, gridDim;
thread_local std::barrier<>* emu_bar;
inline void __syncthreads() { emu_bar->arrive_and_wait(); }
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __shfl_xor_sync(unsigned, T, int) { std::abort(); }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline int __dp4a(int a, int b, int c) {
    for (int i = 0; i < 4; ++i)
        c += (int)(signed char)(a >> 8 * i) * (int)(signed char)(b >> 8 * i);
    return c;
}
inline int emu_dp4a_us(unsigned a, unsigned b, int c) {  // dp4a.u32.s32: unsigned a, signed b
    for (int i = 0; i < 4; ++i)
        c += (int)(unsigned char)(a >> 8 * i) * (int)(signed char)(b >> 8 * i);
    return c;
}
inline unsigned __vsub4(unsigned a, unsigned b) {  // per-byte a - b, wrapping
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= ((a >> 8 * i) - (b >> 8 * i) & 0xFFu) << 8 * i;
    return r;
}
inline float emu_h2f(unsigned short h) {
    const int s = h >> 15, e = (h >> 10) & 31, m = h & 1023;
    float v = e == 0 ? std::ldexp((float)m, -24) : e == 31 ? (m ? NAN : INFINITY)
                                                            : std::ldexp((float)(m | 1024), e - 25);
    return s ? -v : v;
}
alignas(16) unsigned char mmvw_ws[1 << 17];
"""

_DRIVER = r"""
typedef void (*Kern)(const s8*, const float2*, int, int, int, int, int, const u8*, int, int, int,
                     float*, const float*, const u8*, int, int, int, float*, const float*,
                     const u8*, int, int, int, float*, const float*);
static std::vector<char> slurp(const char* path) {
    FILE* f = std::fopen(path, "rb");
    std::fseek(f, 0, SEEK_END);
    std::vector<char> b(std::ftell(f));
    std::fseek(f, 0, SEEK_SET);
    if (std::fread(b.data(), 1, b.size(), f) != b.size()) std::abort();
    std::fclose(f);
    return b;
}
// argv: kernel name, input file, output file. Input: int32 K, nmat, rpb, ks, then per matrix
// N, qt, row bytes, has_add; then xq [K] int8, xds [K / 32] float2, then per matrix its
// weights [N, row bytes] and (has_add) its add [N] float32. Output: each matrix's y [N].
// Each PipeW<QT>::xoff(l) is where its slot function reads lane l's activations: a tail
// lane's pointer (base - xoff) must land on the chunk's first slot.
template <class X> static bool same(const X& a, const X& b) {
    return !std::memcmp(&a, &b, sizeof a);
}
static void check_xoff() {
    static s8 xq[8192];
    static float2 xds[256];
    for (int i = 0; i < 8192; ++i) xq[i] = (s8)(i * 7 + i / 251);
    for (int i = 0; i < 256; ++i) xds[i] = make_float2((float)i, (float)-i);
    for (int l = 0; l < PIPE_TPR; ++l) {
        const int2 o4 = PipeW<QT_Q4_K>::xoff(l), o6 = PipeW<QT_Q6_K>::xoff(l);
#if PIPE_WIDE
        const bool ok4 = same(q4kw_xload(l, xq, xds), q4kw_xload(0, xq + o4.x, xds + o4.y));
#else
        const bool ok4 = same(q4k_xload(l, xq, xds), q4k_xload(0, xq + o4.x, xds + o4.y));
#endif
        const bool ok6 = same(q6k_xload(l, xq, xds), q6k_xload(0, xq + o6.x, xds + o6.y));
        if (!ok4 || !ok6) {
            std::fprintf(stderr, "xoff(%d) is not the slot's activation offset\n", l);
            std::exit(3);
        }
    }
}
int main(int argc, char** argv) {
    check_xoff();
    const std::string name = argv[1];
    Kern k = name == "mmvw_pipe_q4k" ? mmvw_pipe_q4k : name == "mmvw_pipe_q6k" ? mmvw_pipe_q6k
                                                                                : mmvw_pipe;
    std::vector<char> in = slurp(argv[2]);
    const int* h = (const int*)in.data();
    const int K = h[0], nm = h[1], rpb = h[2], ks = h[3];
    size_t off = 16 + 16 * (size_t)nm;
    const s8* xq = (const s8*)(in.data() + off);
    off += K;
    const float2* xds = (const float2*)(in.data() + off);
    off += 8 * (size_t)(K / 32);
    const u8* W[3] = {};
    const float* A[3] = {};
    int N[3] = {}, qt[3] = {}, rb[3] = {}, nb[3] = {};
    std::vector<std::vector<float>> Y(3);
    for (int i = 0; i < nm; ++i) {
        N[i] = h[4 + 4 * i], qt[i] = h[5 + 4 * i], rb[i] = h[6 + 4 * i];
        W[i] = (const u8*)(in.data() + off);
        off += (size_t)N[i] * rb[i];
        if (h[7 + 4 * i]) A[i] = (const float*)(in.data() + off), off += 4 * (size_t)N[i];
        Y[i].assign(N[i], NAN);
        nb[i] = (N[i] + rpb - 1) / rpb;
    }
    const int threads = NW * 32, blocks = nb[0] + nb[1] + nb[2];
    blockDim.x = threads;
    gridDim.x = blocks;
    for (int b = 0; b < blocks; ++b) {
        std::memset(mmvw_ws, 0xFF, sizeof(mmvw_ws));  // stale shared memory: NaN floats
        std::barrier<> bar(threads);
        std::vector<std::thread> ts;
        for (int t = 0; t < threads; ++t)
            ts.emplace_back([&, t] {
                threadIdx.x = t;
                blockIdx.x = b;
                emu_bar = &bar;
                k(xq, xds, K, nb[0], nb[1], rpb, ks, W[0], rb[0], N[0], qt[0], Y[0].data(), A[0],
                  W[1], rb[1], N[1], qt[1], Y[1].data(), A[1], W[2], rb[2], N[2], qt[2],
                  Y[2].data(), A[2]);
            });
        for (auto& t : ts) t.join();
    }
    FILE* f = std::fopen(argv[3], "wb");
    for (int i = 0; i < nm; ++i) std::fwrite(Y[i].data(), 4, N[i], f);
    std::fclose(f);
    return 0;
}
"""

# (pattern, replacement, file): the asm the pipe's path reaches, as host code
_SUBS = [
    (r'asm\("cvt\.f32\.f16 %0, %1;" : "=f"\(f\) : "h"\(h\)\);', "f = emu_h2f(h);", "common.cuh"),
    (r'asm\("cvt\.rn\.f16\.f32 %0, %1;" : "=h"\(h\) : "f"\(f\)\);', "std::abort();", "common.cuh"),
    (r'asm\("cvt\.rn\.f16x2\.f32 %0, %1, %2;" : "=r"\(r\) : "f"\(hi\), "f"\(lo\)\);',
     "std::abort();", "common.cuh"),
    (r'asm\("dp4a\.u32\.s32 %0, %1, %2, %0;" : "\+r"\(d\) : "r"\(([^)]*)\), "r"\(([^)]*)\)\);',
     r"d = emu_dp4a_us(\1, \2, d);", "vecdot.cuh"),
]  # fmt: skip


def source() -> str:
    """The emulation translation unit (shim, the three sources patched, the driver)."""
    texts = {f: (SHADERS / f).read_text().replace("#pragma once", "") for f in
             ("common.cuh", "vecdot.cuh", "mmvw_pipe.cuh")}  # fmt: skip
    for pat, rep, f in _SUBS:
        texts[f], n = re.subn(pat, rep, texts[f])
        assert n > 0, f"{f}: no {pat!r} to replace (the emulation is out of date)"
    texts["vecdot.cuh"] = texts["vecdot.cuh"].replace('#include "common.cuh"', "")
    body = texts["common.cuh"] + texts["vecdot.cuh"] + texts["mmvw_pipe.cuh"]
    return _SHIM + "#define MMVW_BOUNDS_MINB\n" + body + _DRIVER


def build(defines: dict[str, int], out_dir: Path) -> Path:
    """The emulator executable for these defines (NW, PIPE_D, ...), built once per content."""
    src = source()
    flags = [f"-D{k}={v}" for k, v in sorted(defines.items())]
    key = hashlib.sha256((src + " ".join(flags)).encode()).hexdigest()[:16]
    exe = out_dir / f"pipe_emul_{key}"
    if not exe.exists():
        cpp = out_dir / f"pipe_emul_{key}.cpp"
        cpp.write_text(src)
        cmd = [str(GXX), "-std=c++20", "-O1", "-pthread", "-w", *flags, "-o", str(exe), str(cpp)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
    return exe


QT = {"Q4_K": 12, "Q6_K": 14}


def q8_1(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [K] as q8.cu's Q8_1: int8 [K] and (d, d * sum q) [K / 32] float32 pairs."""
    b = x.astype(np.float32).reshape(-1, 32)
    amax = np.abs(b).max(1)
    d = (amax / np.float32(127)).astype(np.float32)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    q = np.rint(b * inv[:, None]).astype(np.int32)
    ds = np.stack([d, d * q.sum(1).astype(np.float32)], 1).astype(np.float32)
    return q.astype(np.int8).reshape(-1), ds


def run(
    exe: Path,
    kernel: str,
    x: np.ndarray,
    mats: list[tuple[str, np.ndarray, np.ndarray | None]],
    rpb: int,
    ks: int,
    work: Path,
) -> list[np.ndarray]:
    """Each (type, raw [N, row bytes] uint8, add [N] or None) times x through the emulated
    launch (rpb rows a block, ks parts): the outputs, NaN where the kernel wrote nothing."""
    K = x.shape[-1]
    xq, xds = q8_1(x.reshape(-1))
    head = [K, len(mats), rpb, ks]
    for t, raw, a in mats:
        head += [raw.shape[0], QT[t], raw.shape[1], int(a is not None)]
    parts = [np.array(head, np.int32).tobytes(), xq.tobytes(), xds.tobytes()]
    for _, raw, a in mats:
        parts.append(np.ascontiguousarray(raw, np.uint8).tobytes())
        if a is not None:
            parts.append(np.asarray(a, np.float32).tobytes())
    (work / "in.bin").write_bytes(b"".join(parts))
    r = subprocess.run(
        [str(exe), kernel, str(work / "in.bin"), str(work / "out.bin")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-2000:]
    y = np.fromfile(work / "out.bin", np.float32)
    outs, i = [], 0
    for _, raw, _ in mats:
        outs.append(y[i : i + raw.shape[0]])
        i += raw.shape[0]
    return outs
