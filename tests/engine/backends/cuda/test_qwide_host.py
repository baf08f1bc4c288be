"""qwide.cuh (moe_experts.dec_wide: Q4_K / Q6_K groups of the fused MoE decode kernels read
through 16-byte loads) on the CPU: the real header and common.cuh built by g++ behind a
small CUDA shim, every group of random-byte blocks (every scale and min bit
pattern, any f16 d) decoded by dec_row_group and by common.cuh's row_group, which the narrow
kernels use: the same Run8 (quants, scale, offset: bytes compared) and the same element
offsets. The planted MOE_DEC_WIDE_Q6_SCALE (an odd Q6_K group taking its pair's scale)
is caught. And run_dot_x (moe_experts.dec_fcvt: bytes to floats by a byte permute and an
FADD) against run_dot on random runs: the same float to the bit; MOE_DEC_FCVT_UNSIGNED
caught. The GPU side (the kernels under the knob, bit-identical to it off) is
tests/engine/backends/cuda/test_cuda_moe_dec.py."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import numpy as np
import pytest

from engine.backends import kernel_sources
from tests import host_cpp
from tests.host_cpp import SLURP

# A CUDA shim for g++: the qualifiers away, the vector types, __ldg a load, __vsub4 per byte,
# the f16 conversion in host code (common.cuh's asm replaced by _SUBS, which must all apply)
_SHIM = r"""
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
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
template <class T> inline T __ldg(const T* p) { return *p; }
template <class T> inline T __shfl_xor_sync(unsigned, T, int) { std::abort(); }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {  // PRMT: bytes of {y, x}
    const unsigned long long v = (unsigned long long)y << 32 | x;
    unsigned r = 0;
    for (int i = 0; i < 4; ++i) r |= (unsigned)(v >> 8 * ((s >> 4 * i) & 7) & 0xFFu) << 8 * i;
    return r;
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
"""

_SUBS = [
    (r'asm\("cvt\.f32\.f16 %0, %1;" : "=f"\(f\) : "h"\(h\)\);', "f = emu_h2f(h);"),
    (r'asm\("cvt\.rn\.f16\.f32 %0, %1;" : "=h"\(h\) : "f"\(f\)\);', "std::abort();"),
    (r'asm\("cvt\.rn\.f16x2\.f32 %0, %1, %2;" : "=r"\(r\) : "f"\(hi\), "f"\(lo\)\);',
     "std::abort();"),
]  # fmt: skip

_DRIVER = r"""
template <int QT, bool W> static int mismatches(const u8* rows, int nrows, int nblk) {
    const int rb = nblk * QTraits<QT>::BYTES, ng = nblk * QTraits<QT>::GROUPS;
    int bad = 0;
    for (int r = 0; r < nrows; ++r)
        for (int g = 0; g < ng; ++g) {
            Run8 a0, a1, b0, b1;
            int ka0, ka1, kb0, kb1;
            row_group<QT>(rows + (size_t)r * rb, g, a0, a1, ka0, ka1);
            dec_row_group<QT, W>(rows + (size_t)r * rb, g, b0, b1, kb0, kb1);
            bad += std::memcmp(&a0, &b0, sizeof a0) || std::memcmp(&a1, &b1, sizeof a1) ||
                   ka0 != kb0 || ka1 != kb1;
        }
    return bad;
}
// run_dot_x (dec_fcvt) against run_dot on n runs of random quants, scales and x: the count
// whose results differ in a bit.
static int dot_mismatches(const unsigned* q, const float* f, int n) {
    int bad = 0;
    for (int i = 0; i < n; ++i, q += 2, f += 10) {
        const Run8 r = {q[0], q[1], f[0], f[1]};
        const float4 x0 = make_float4(f[2], f[3], f[4], f[5]);
        const float4 x1 = make_float4(f[6], f[7], f[8], f[9]);
        const float a = run_dot(r, x0, x1), b = run_dot_x(r, x0, x1);
        bad += std::memcmp(&a, &b, sizeof a) != 0;
    }
    return bad;
}
// argv: input file: int32 nrows, nblk, ndot, then Q4_K rows [nrows, nblk * 144], Q6_K rows
// [nrows, nblk * 224], ndot runs' quants [ndot, 2] u32 and floats [ndot, 10]. Prints the
// groups whose decodes differ and the runs whose dots differ: "<q4k> <q6k> <dot>".
int main(int argc, char** argv) {
    std::vector<char> in = slurp(argv[1]);
    const int* h = (const int*)in.data();
    const int nrows = h[0], nblk = h[1], ndot = h[2];
    const size_t n4 = (size_t)nrows * nblk * 144, n6 = (size_t)nrows * nblk * 224;
    u8* q4 = (u8*)std::aligned_alloc(16, n4);
    u8* q6 = (u8*)std::aligned_alloc(16, n6);
    std::memcpy(q4, in.data() + 12, n4);
    std::memcpy(q6, in.data() + 12 + n4, n6);
    const char* d = in.data() + 12 + n4 + n6;
    std::vector<unsigned> dq(2 * (size_t)ndot);
    std::vector<float> df(10 * (size_t)ndot);
    std::memcpy(dq.data(), d, 8 * (size_t)ndot);
    std::memcpy(df.data(), d + 8 * (size_t)ndot, 40 * (size_t)ndot);
    std::printf("%d %d %d\n", mismatches<QT_Q4_K, true>(q4, nrows, nblk),
                mismatches<QT_Q6_K, true>(q6, nrows, nblk),
                dot_mismatches(dq.data(), df.data(), ndot));
    return 0;
}
"""


def _source() -> str:
    # read as the backend reads them: a planted bug's overlay included
    common = kernel_sources.read_text("cuda/common.cuh").replace("#pragma once", "")
    for pat, rep in _SUBS:
        common, n = re.subn(pat, rep, common)
        assert n > 0, f"common.cuh: no {pat!r} to replace (the emulation is out of date)"
    qwide = kernel_sources.read_text("cuda/qwide.cuh")
    qwide = qwide.replace("#pragma once", "").replace('#include "common.cuh"', "")
    return _SHIM + common + qwide + SLURP + _DRIVER


def _build(defines: dict[str, int], out_dir: Path) -> Path:
    return host_cpp.build(_source(), defines, out_dir, "qwide")


def _mismatches(exe: Path, work: Path, seed: int) -> tuple[int, int, int]:
    """(Q4_K groups, Q6_K groups, run dots) that differ between the wide / fcvt paths and
    common.cuh's."""
    rng = np.random.default_rng(seed)
    nrows, nblk = 6, 3  # 3 blocks a row: groups of later blocks take the block offsets too
    q4 = rng.integers(0, 256, (nrows, nblk * 144), dtype=np.uint8)
    q6 = rng.integers(0, 256, (nrows, nblk * 224), dtype=np.uint8)
    ndot = 4096  # every byte value in every position, scales and x of any sign and size
    dq = rng.integers(0, 1 << 32, (ndot, 2), dtype=np.uint64).astype(np.uint32)
    df = rng.standard_normal((ndot, 10)) * np.exp2(rng.integers(-20, 20, (ndot, 10)))
    path = work / "blocks.bin"
    head = np.array([nrows, nblk, ndot], np.int32).tobytes()
    path.write_bytes(
        head + q4.tobytes() + q6.tobytes() + dq.tobytes() + df.astype(np.float32).tobytes()
    )
    r = subprocess.run([str(exe), str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr[-2000:]
    a, b, c = (int(v) for v in r.stdout.split())
    return a, b, c


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("qwide")


@pytest.mark.parametrize("fcvt", [0, 1])  # (the wide groups' scales converted either way)
@pytest.mark.parametrize("seed", [0, 1])
def test_wide_groups_and_fcvt_dots_are_the_narrow_ones_to_the_bit(work, seed, fcvt):
    exe = _build({"DEC_FCVT": fcvt}, work)
    assert _mismatches(exe, work, seed) == (0, 0, 0)


def test_planted_wide_q6k_scale_is_caught(work, plant):
    plant("MOE_DEC_WIDE_Q6_SCALE")
    exe = _build({}, work)
    q4k, q6k, dots = _mismatches(exe, work, 0)
    assert q4k == 0 and q6k > 0 and dots == 0  # the odd Q6_K groups take the wrong scale


def test_planted_fcvt_unsigned_is_caught(work, plant):
    plant("MOE_DEC_FCVT_UNSIGNED")
    exe = _build({}, work)
    q4k, q6k, dots = _mismatches(exe, work, 0)
    assert q4k == q6k == 0 and dots > 3000  # every byte 128 too high (of 4096 runs)
