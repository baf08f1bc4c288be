"""Compile a config's kernels ahead, in a CPU process, into the backend's on-disk cache.

While the GPU measures one candidate, the next one's kernels compile elsewhere; the GPU process
then finds them cached and its ``set_config`` only loads them:

- Vulkan: every SPIR-V build the config's pipelines need for the model's weight types, into the
  cache ``engine.backends.vulkan.spirv`` reads (glslc / glslangValidator; no device at all).
- CUDA: every module of ``engine.backends.cuda.kernels.modules_for`` through NVRTC, which lands
  in CuPy's on-disk kernel cache (keyed by source, options, architecture and NVRTC version). The
  compile itself is CPU work, but CuPy loads what it compiled, so this path opens a CUDA context
  on the device it compiles for (``device``).
- NumPy: nothing to compile.

``python -m engine.precompile`` is not provided: callers run ``precompile`` in a process pool
(worker.precompile) so a compile error or a crash stays there.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from engine.tuning import TuningConfig


@dataclass
class Precompiled:
    """What one precompile did: builds asked, those already cached, seconds spent."""

    backend: str
    builds: int = 0
    cached: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)


def vulkan_builds(config: TuningConfig, qtypes: Iterable[str]) -> list[tuple[str, tuple[str, ...]]]:
    """Every (shader, defines) SPIR-V build ``set_config`` asks for on a model of these weight
    types."""
    from engine.backends.vulkan import kernels as K

    qs = sorted(set(qtypes))
    out: set[tuple[str, tuple[str, ...]]] = set()
    for op in K.BUILT_OPS:
        for q in qs if op in K.WEIGHTED_OPS else [""]:
            for prog in K.programs(op, config.op(op), q):
                out.add((prog.shader, prog.defines))
    return sorted(out)


def precompile(
    config: TuningConfig, qtypes: Iterable[str] = (), device: int | None = None
) -> Precompiled:
    """Compile ``config``'s kernels into the backend's disk cache (see the module doc). Never
    raises for a kernel that fails to compile: the error is listed and the GPU process meets it
    again, as a trial's compile error."""
    from engine.errors import KernelCompileError

    t0 = time.perf_counter()
    done = Precompiled(config.backend)
    if config.backend == "vulkan":
        from engine.backends.vulkan import spirv

        for shader, defines in vulkan_builds(config, qtypes):
            done.builds += 1
            if spirv.cached(shader, defines):
                done.cached += 1
                continue
            try:
                spirv.compile_spirv(shader, defines)
            except KernelCompileError as e:
                done.errors.append(str(e).splitlines()[0])
    elif config.backend == "cuda":
        from engine.backends.cuda import backend as cuda_backend
        from engine.backends.cuda import kernels

        cp = cuda_backend._import_cupy()
        index = device or 0
        cp.cuda.Device(index).use()
        props = cp.cuda.runtime.getDeviceProperties(index)
        cc = int(props["major"]) * 10 + int(props["minor"])
        for fname, defines in kernels.modules_for(config).values():
            done.builds += 1
            try:
                kernels.module(cp, cc, fname, defines)
            except KernelCompileError as e:
                done.errors.append(str(e).splitlines()[0])
    done.seconds = time.perf_counter() - t0
    return done
