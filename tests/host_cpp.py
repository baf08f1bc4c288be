"""C++ the host-compiled emulators of CUDA kernels share (tests/dn_clu_emul.py,
tests/engine/backends/cuda/test_qwide_host.py): their drivers' whole-file read."""

from __future__ import annotations

SLURP = r"""
#include <cstdio>
#include <cstdlib>
#include <vector>
static std::vector<char> slurp(const char* path) {
    FILE* f = std::fopen(path, "rb");
    std::fseek(f, 0, SEEK_END);
    std::vector<char> b(std::ftell(f));
    std::fseek(f, 0, SEEK_SET);
    if (std::fread(b.data(), 1, b.size(), f) != b.size()) std::abort();
    std::fclose(f);
    return b;
}
"""
