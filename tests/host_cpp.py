"""What the host-compiled emulators of CUDA kernels share (tests/dn_clu_emul.py,
tests/engine/backends/cuda/test_qwide_host.py): their drivers' whole-file read and the g++
build of a translation unit, cached by content."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

GXX = shutil.which("g++")


def build(src: str, defines: dict[str, int], out_dir: Path, name: str, *extra: str) -> Path:
    """The executable of src under these defines (g++ -std=c++20 -O1 plus extra flags), built
    once per content into out_dir."""
    assert GXX, "g++ not found: ./dev's APT_PKGS installs it"
    flags = [f"-D{k}={v}" for k, v in sorted(defines.items())]
    key = hashlib.sha256((src + " ".join(flags)).encode()).hexdigest()[:16]
    exe = out_dir / f"{name}_{key}"
    if not exe.exists():
        cpp = out_dir / f"{name}_{key}.cpp"
        cpp.write_text(src)
        cmd = [GXX, "-std=c++20", "-O1", *extra, "-w", *flags, "-o", str(exe), str(cpp)]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr[-3000:]
    return exe


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
