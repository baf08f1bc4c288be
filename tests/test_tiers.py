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
    for module, functions in SLOW.items():
        assert (ROOT / module).is_file(), f"{module}: no such test file"
        for function, why in functions.items():
            assert function == "*" or function in _functions(ROOT / module), (
                f"{module}::{function}: no such test"
            )
            assert why.strip(), f"{module}::{function}: say why it is slow"


def test_the_table_is_the_only_slow_mark():
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if path.name != "test_tiers.py":
            assert "mark.slow" not in path.read_text(), f"{path.name}: put it in tests/tiers.py"


def test_a_family_and_a_module_are_matched_by_node_id():
    mutants = "tests/engine/verify/test_mutants.py"
    assert _entry(f"{mutants}::test_vulkan_correct_variants_pass[flat3]") == (
        mutants,
        "test_vulkan_correct_variants_pass",
    )
    boot = "tests/deploy/test_deploy_bootstrap.py"
    assert _entry(f"{boot}::test_x") == (boot, "*")
    assert _entry(f"{mutants}::test_numpy_correct_variants_pass[flat3]") is None
