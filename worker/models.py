"""Model references in experiments: a GGUF path, a known checkpoint name, or a synthetic model.

``synthetic:<preset>[:<arch>[:<quant mix>]]`` (e.g. ``synthetic:tiny``) names a random-weight
model written by ``engine.synth``; it is generated into the cache the first time a node needs it.
The same reference gives the same bytes on every node (fixed seed), so workers agree.
"""

from __future__ import annotations

from pathlib import Path

SYNTHETIC = "synthetic:"


def is_synthetic(ref: str) -> bool:
    return ref.startswith(SYNTHETIC)


def synthetic_args(ref: str) -> tuple[str, str, str]:
    """(preset, arch, quant mix) of a ``synthetic:`` reference."""
    parts = ref[len(SYNTHETIC) :].split(":")
    preset = parts[0] or "tiny"
    arch = parts[1] if len(parts) > 1 and parts[1] else "qwen2"
    mix = parts[2] if len(parts) > 2 and parts[2] else "q4_k_m"
    return preset, arch, mix


def model_label(ref: str) -> str:
    """A short name for study names: the file stem, or ``synthetic-<arch>-<preset>-<mix>``."""
    if is_synthetic(ref):
        preset, arch, mix = synthetic_args(ref)
        return f"synthetic-{arch}-{preset}-{mix}"
    return Path(ref).stem if ref.endswith(".gguf") else ref


def resolve_model(ref: str) -> Path:
    """A local GGUF path for the reference, generating or fetching it into the cache if needed."""
    if is_synthetic(ref):
        from engine.checkpoints import cache_dir
        from engine.synth import write_synthetic

        preset, arch, mix = synthetic_args(ref)
        path = cache_dir() / f"{model_label(ref)}.gguf"
        if not path.exists():
            write_synthetic(path, arch=arch, preset=preset, quant_mix=mix, progress=False)
        return path
    from engine.runtime import resolve_model_path

    return resolve_model_path(ref)
