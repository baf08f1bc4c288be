"""The slow tier's table (tests/tiers.py) names tests that exist, and is the only place a test
enters the slow tier: a renamed test must not fall silently out of `./dev test --all`'s list."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.tiers import SLOW, _entry

ROOT = Path(__file__).resolve().parents[1]


def _functions(module: Path) -> set[str]:
    return {
        n.name
        for n in ast.walk(ast.parse(module.read_text()))
        if isinstance(n, ast.FunctionDef) and n.name.startswith("test_")
    }


def test_every_slow_entry_names_a_test_that_exists():
    for key, why in SLOW.items():
        module, _, function = key.partition("::")
        assert (ROOT / module).is_file(), f"{key}: no such module"
        assert not function or function in _functions(ROOT / module), f"{key}: no such test"
        assert why.strip(), f"{key}: say why it is slow"


def test_the_table_is_the_only_slow_mark():
    for path in sorted((ROOT / "tests").glob("test_*.py")):
        if path.name != "test_tiers.py":
            assert "mark.slow" not in path.read_text(), f"{path.name}: put it in tests/tiers.py"


def test_a_family_and_a_module_are_matched_by_node_id():
    assert _entry("tests/test_mutants.py::test_vulkan_correct_variants_pass[flat3]") == (
        "tests/test_mutants.py::test_vulkan_correct_variants_pass"
    )
    assert _entry("tests/test_deploy_bootstrap.py::test_x") == "tests/test_deploy_bootstrap.py"
    assert _entry("tests/test_mutants.py::test_numpy_correct_variants_pass[flat3]") is None
