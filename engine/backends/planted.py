"""Test-only: a planted bug compiled into every shader (the standing mutation suite,
tests/mutants.py). ``FLEETTUNE_MUTANT=<NAME>`` adds ``MUTANT_<NAME>`` as a define to every
GLSL and CUDA build; the shipped shaders hold each bug behind ``#ifdef MUTANT_<NAME>``, so no
file is edited at test time and an unset variable compiles exactly the production kernels."""

from __future__ import annotations

import os
import re

ENV = "FLEETTUNE_MUTANT"


def mutant() -> str | None:
    """The planted bug's name, or None (production)."""
    name = os.environ.get(ENV, "").strip()
    if not name:
        return None
    if not re.fullmatch(r"[A-Z0-9_]+", name):
        raise ValueError(f"{ENV}={name!r}: a mutant name is upper-case letters, digits and _")
    return name


def define() -> str | None:
    """``MUTANT_<NAME>`` when a mutant is planted."""
    name = mutant()
    return f"MUTANT_{name}" if name else None
