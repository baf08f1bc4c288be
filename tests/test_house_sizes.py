"""The house's size rules (issue 29): no product file over 800 lines, no function over 120,
shaders included. A kernel body may stay longer only where this file states why, and only as
long as it is today: a new exception, or one that grows, fails here."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("engine", "worker", "agent", "tools", "bench", "shaders")
SOURCE = (".py", ".cu", ".cuh", ".comp", ".glsl")
MAX_FILE, MAX_FUNCTION = 800, 120

# An attention kernel's online softmax (running max, running sum, the output accumulator) lives
# in registers from its first key to its last merge; split into functions, every phase would
# take and return that state by reference for no gain in reading (ggml's fattn kernels keep one
# body too). The other two hold one loop's shared-memory staging and accumulators.
ONLINE_SOFTMAX = "online softmax state in registers across every phase of the kernel"
KERNEL_EXCEPTIONS = {
    "shaders/cuda/attention.cu:attn_split_kw": (122, ONLINE_SOFTMAX),
    "shaders/cuda/attention_tc.cu:attn_tc": (131, ONLINE_SOFTMAX),
    "shaders/cuda/attn_decode.cu:attn_gqa": (183, ONLINE_SOFTMAX),
    "shaders/cuda/attn_tile.cu:attn_tile": (216, ONLINE_SOFTMAX),
    "shaders/cuda/attn_vec.cu:attn_vec_body": (294, ONLINE_SOFTMAX),
    "shaders/vulkan/attention_flash.comp:main": (206, ONLINE_SOFTMAX),
    "shaders/cuda/dn_clu.cu:dn_clu_body": (
        122,
        "a thread-block cluster's phases meet at distributed-shared-memory barriers; one body "
        "keeps every barrier and what crosses it in sight",
    ),
    "shaders/vulkan/matmul_f16.comp:main": (
        188,
        "one cooperative-matrix K loop: its shared-memory staging and accumulators",
    ),
}

# a CUDA function definition (kernel or device function), or a GLSL one (main, helpers)
_CUDA_DEF = re.compile(r"(?:__global__|__device__)[^;{}]*?\b(\w+)\s*\([^;{}]*\)\s*(?:const\s*)?\{")
_GLSL_DEF = re.compile(
    r"^\s*(?:void|float|int|uint|bool|[iu]?vec\d|f16vec\d|float16_t)\s+(\w+)\s*\([^;{}]*\)\s*\{",
    re.M,
)


def product_files() -> Iterator[Path]:
    for top in PRODUCT:
        for p in sorted((ROOT / top).rglob("*")):
            if p.suffix in SOURCE and p.is_file():
                yield p


def python_functions(text: str) -> Iterator[tuple[str, int]]:
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name, node.end_lineno - node.lineno + 1


def shader_functions(text: str, cuda: bool) -> Iterator[tuple[str, int]]:
    """(name, lines) of each function definition: from its head to its matching brace."""
    for m in (_CUDA_DEF if cuda else _GLSL_DEF).finditer(text):
        i, depth = m.end(), 1
        while depth and i < len(text):
            depth += {"{": 1, "}": -1}.get(text[i], 0)
            i += 1
        yield m.group(1), text.count("\n", m.start(), i) + 1


def functions(path: Path) -> Iterator[tuple[str, int]]:
    text = path.read_text()
    if path.suffix == ".py":
        return python_functions(text)
    return shader_functions(text, cuda=path.suffix in (".cu", ".cuh"))


def test_no_product_file_over_800_lines():
    long = {
        str(p.relative_to(ROOT)): n
        for p in product_files()
        if (n := p.read_text().count("\n")) > MAX_FILE
    }
    assert not long, f"over {MAX_FILE} lines: {long}"


def test_no_function_over_120_lines_but_the_stated_kernels():
    seen, over = set(), {}
    for p in product_files():
        for name, n in functions(p):
            key = f"{p.relative_to(ROOT)}:{name}"
            if n <= MAX_FUNCTION:
                continue
            seen.add(key)
            limit = KERNEL_EXCEPTIONS.get(key, (MAX_FUNCTION, ""))[0]
            if n > limit:
                over[key] = n
    assert not over, f"functions over their limit ({MAX_FUNCTION}, or the stated one): {over}"
    assert not set(KERNEL_EXCEPTIONS) - seen, "stated exceptions now within 120: drop them"


def test_the_size_check_sees_both_languages():
    cu = 'extern "C" __global__ void k(int n) {\n' + "  x;\n" * 130 + "}\n"
    assert dict(shader_functions(cu, cuda=True)) == {"k": 132}
    glsl = "void main() {\n  if (a) { b; }\n}\nfloat f(float x) { return x; }\n"
    assert dict(shader_functions(glsl, cuda=False)) == {"main": 3, "f": 1}
    assert dict(python_functions("def f():\n    return 1\n")) == {"f": 2}
