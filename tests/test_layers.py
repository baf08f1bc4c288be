"""The layering, checked from the source: engine <- worker <- agent, the registry and the device
record below the backends, the backends below the model and everything that runs it. Imports are
read with ast (every import: module level, inside functions and under TYPE_CHECKING, since each
is a dependency a reader must follow), so a circle or an upward import fails here before it
fails at import time on some other machine."""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("engine", "worker", "agent")

# (importer prefix, forbidden prefixes): a module under the first may import none of the second.
# Prefixes match whole dotted components ("engine.bench" is not "engine.benchmarks").
_ABOVE_BACKENDS = (
    "engine.model",
    "engine.runtime",
    "engine.verify.validate",
    "engine.verify.op_replay",
    "engine.verify.blame",
    "engine.verify.cross_check",
    "engine.bench",
    "engine.cli",
    "engine.__main__",
    "engine.checkpoints",
    "engine.synth",
)
RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("engine", ("worker", "agent")),
    # The worker reaches devices through the device contract only (engine.backends.base).
    ("worker", ("agent", "engine.backends.vulkan", "engine.backends.cuda")),
    ("engine.backends", _ABOVE_BACKENDS),
    ("engine.tuning", ("engine.backends", *_ABOVE_BACKENDS)),
    ("engine.device_info", ("engine.backends", "engine.tuning", *_ABOVE_BACKENDS)),
    # The numeric budgets are data the registry reads: below it, like the device record.
    ("engine.verify.budgets", ("engine.backends", "engine.tuning", *_ABOVE_BACKENDS)),
)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    out = {}
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            out[_module_name(path)] = path
    return out


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _targets(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """Our modules that ``name`` imports: ``from a.b import c`` is a.b.c when that is a module
    of ours, else a.b; relative imports are resolved against the importing package."""
    is_pkg = path.name == "__init__.py"
    package = name if is_pkg else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            found = [
                f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names
            ]
        else:
            continue
        out |= {t for t in found if t.split(".")[0] in PACKAGES and t != name}
    return out


def import_graph() -> dict[str, set[str]]:
    known = _modules()
    graph = {}
    for name, path in known.items():
        targets = _targets(name, path, known)
        unknown = sorted(t for t in targets if t not in known)
        assert not unknown, f"{name} imports modules that do not exist: {unknown}"
        graph[name] = targets
    return graph


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph()


def circles(graph: dict[str, set[str]], limit: int = 20) -> list[list[str]]:
    """Import circles, each as a path back to its start; one edge of each found is cut to look
    for the next, so every circle shows at least once."""
    g = {k: set(v) for k, v in graph.items()}
    found = []
    while len(found) < limit:
        try:
            graphlib.TopologicalSorter(g).prepare()
            return found
        except graphlib.CycleError as e:
            cycle = list(e.args[1])
            if cycle[1] not in g[cycle[0]]:  # graphlib may walk it backwards
                cycle.reverse()
            found.append(cycle)
            g[cycle[0]].discard(cycle[1])
    return found


def test_no_import_circles(graph):
    found = circles(graph)
    assert not found, "import circles:\n" + "\n".join(" -> ".join(c) for c in found)


def upward(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{src} imports {dst}"
        for src, dsts in sorted(graph.items())
        for dst in sorted(dsts)
        for low, forbidden in RULES
        if _within(src, low) and any(_within(dst, f) for f in forbidden)
    ]


def test_no_upward_imports(graph):
    bad = upward(graph)
    assert not bad, "upward imports:\n" + "\n".join(bad)


def test_the_checker_sees_circles_and_upward_imports(tmp_path, monkeypatch):
    """The checks above are real: a planted circle and a planted upward import are found."""
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir()
        (tmp_path / pkg / "__init__.py").write_text("")
    (tmp_path / "engine" / "a.py").write_text("from engine import b\n")
    (tmp_path / "engine" / "b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from engine.a import x\n"
    )
    (tmp_path / "worker" / "w.py").write_text("def f():\n    from agent import loop\n")
    (tmp_path / "agent" / "loop.py").write_text("")
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    g = import_graph()
    assert g["engine.a"] == {"engine.b"} and g["engine.b"] == {"engine.a"}
    assert [sorted(c) for c in circles(g)] == [["engine.a", "engine.a", "engine.b"]]
    assert upward(g) == ["worker.w imports agent.loop"]


# Device libraries only the backends may import: the worker and agent use the device contract.
DEVICE_LIBS = ("cupy", "vulkan", "cuda")


def absolute_imports(tops: tuple[str, ...]) -> Iterator[tuple[Path, str]]:
    """(file, module) for every absolute import in the .py files under the folders ``tops``
    (``from a.b import c`` gives a.b; relative imports are ours and skipped)."""
    for top in tops:
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    yield from ((path, a.name) for a in node.names)
                elif isinstance(node, ast.ImportFrom) and not node.level:
                    yield path, node.module or ""


def test_worker_and_agent_import_no_device_library():
    bad = [
        f"{path.relative_to(ROOT)}: {n}"
        for path, n in absolute_imports(("worker", "agent"))
        if n.split(".")[0] in DEVICE_LIBS
    ]
    assert not bad, "device libraries imported outside the engine's backends:\n" + "\n".join(bad)


def test_the_device_pin_is_read_in_one_place():
    """FLEETTUNE_VK_DEVICE, as a value code uses (not prose in a docstring), appears only in
    engine.backends.default_device's table: no backend reads it, nobody writes it."""
    uses = []
    for pkg in (*PACKAGES, "tools", "bench", "deploy"):
        for path in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Constant) and node.value == "FLEETTUNE_VK_DEVICE":
                    uses.append(str(path.relative_to(ROOT)))
    assert uses == ["engine/backends/__init__.py"]


LABS = ("scripts", "bench")
# Ways to run a file's code without an import statement: by path (a lab's script) or by name.
_LOADERS = ("spec_from_file_location", "run_path", "import_module", "SourceFileLoader")
_LOADED = "a loader call in a file that names a lab"


def _top(name: str) -> str:
    return name.replace("/", ".").split(".")[0]


def lab_imports(path: Path) -> list[str]:
    """What a test file takes from a lab: an import of scripts.* or bench.*, or a loader call
    (importlib by path or by name, runpy) in a file that names a lab folder. Running a bench as
    a program (subprocess) is how a test exercises it."""
    tree = ast.parse(path.read_text(), str(path))
    lab_named = any(
        isinstance(n, ast.Constant) and isinstance(n.value, str) and _top(n.value) in LABS
        for n in ast.walk(tree)
    )
    bad = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        elif isinstance(node, ast.Call) and lab_named:
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in _LOADERS:
                bad.append(_LOADED)
        bad += [n for n in names if n.split(".")[0] in LABS]
    return bad


def test_tests_import_no_lab_and_there_is_no_scripts_folder():
    """The lab left the tree (issue 29): product tools live in tools/ (the fleet's GPU driver
    included), microbenchmarks in bench/, one-run scripts in git history; no scripts/ folder.
    No test imports or loads code from scripts/ or bench/ (tests/bench runs each bench as a
    program)."""
    bad = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        bad += [f"{path.relative_to(ROOT)}: {n}" for n in lab_imports(path)]
    assert not bad, bad
    assert not (ROOT / "scripts").exists()


def test_the_lab_check_sees_imports_and_loads(tmp_path):
    """lab_imports finds each way in, and passes a test that runs a bench as a program."""
    cases = {
        "from bench.attn_decode_bench import BENCH\n": ["bench.attn_decode_bench"],
        "import bench.harness as h\n": ["bench.harness"],
        "import importlib.util\np = ROOT / 'bench' / 'x.py'\n"
        "importlib.util.spec_from_file_location('x', p)\n": [_LOADED],
        "import runpy\nrunpy.run_path('bench/x.py')\n": [_LOADED],
        "import importlib\nimportlib.import_module('bench.x')\n": [_LOADED],
        "import subprocess\nsubprocess.run(['python', ROOT / 'bench' / 'x.py'])\n": [],
        "from engine.bench import bench_prompt\n": [],
    }
    for i, (src, want) in enumerate(cases.items()):
        (tmp_path / f"t{i}.py").write_text(src)
        assert lab_imports(tmp_path / f"t{i}.py") == want, src


def test_the_product_holds_no_test_code():
    """Test-only code stays in tests/ (issue 29): no module of engine, worker, agent or tools
    imports from tests, and no product source or shader names a planted bug (MUTANT): the tests
    plant theirs through the general FLEETTUNE_KERNEL_SOURCES overlay (tests/planted)."""
    bad = [  # the product's tools too (the calibration is the tests' own: tests/calibrate.py)
        f"{path.relative_to(ROOT)} imports {n}"
        for path, n in absolute_imports((*PACKAGES, "tools"))
        if n.split(".")[0] == "tests"
    ]
    for top in (*PACKAGES, "shaders"):
        for path in sorted((ROOT / top).rglob("*")):
            if path.is_file() and path.suffix in (".py", ".comp", ".glsl", ".cu", ".cuh"):
                if "MUTANT" in path.read_text():
                    bad.append(f"{path.relative_to(ROOT)} names MUTANT")
    assert not bad, "test code in the product:\n" + "\n".join(bad)
