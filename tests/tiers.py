"""The two CPU test tiers, declared in one place (a pytest plugin, registered by conftest.py).

`./dev test` runs the fast tier (`-m "not gpu and not slow"`): every module, and of each slow
family below its first case. `./dev test --all` (what CI runs) adds the slow tier: the whole-process
fleet runs, the every-build compile sweeps and the rest of the lavapipe model and mutation suites.
The README holds the measured time of each. A test enters the slow tier here, with the reason,
not by a mark scattered in its file.
"""

from __future__ import annotations

import pytest

# test file -> {test function, or "*" for the whole file: why it is slow}
SLOW: dict[str, dict[str, str]] = {
    "tests/deploy/test_deploy_bootstrap.py": {
        "*": "installs the deploy files and starts a head and a worker",
    },
    "tests/agent/test_agent_process.py": {
        "test_two_agents_one_storage": "two agent processes, PostgreSQL",
        "test_agent_killed_mid_study_resumes_without_duplicates": (
            "kills and restarts an agent process on each storage"
        ),
        "test_ray_job_submit_against_a_head_started_here": "starts a Ray head, submits a job",
    },
    "tests/agent/test_agent_ray.py": {
        "test_whole_loop_promotes_a_real_win": "a Ray study per backend",
        "test_a_promotion_belongs_to_its_repository_and_branch": "a Ray study",
        "test_faults_fail_trials_restart_workers_and_never_promote": "Ray workers crash, restart",
    },
    "tests/agent/test_recheck.py": {
        "test_vulkan_changed_key_revalidates_and_planted_bug_fails": "two lavapipe validations",
    },
    "tests/engine/backends/cuda/test_cuda_compile.py": {
        "test_module_compiles_with_every_registered_build": "nvcc of every build of a module",
    },
    "tests/engine/backends/cuda/test_cuda_backend.py": {
        "test_sources_compile_for_sm80_and_sm90": "nvcc, two arches",
    },
    "tests/engine/backends/vulkan/test_vulkan_backend.py": {
        "test_precompile_covers_every_build": "glslc of every build",
    },
    "tests/engine/backends/vulkan/test_vulkan_coopmat.py": {
        "test_coopmat_spirv_builds_with_the_pinned_glslang": "builds glslang's coopmat SPIR-V",
    },
    "tests/engine/backends/vulkan/test_vulkan_model.py": {
        "test_validate_passes": "a lavapipe validation per config",
        "test_architectures_match_numpy": "a lavapipe forward per model",
        "test_unusable_config_is_reported_and_next_runs": "lavapipe validations",
        "test_real_qwen_paris": "the real checkpoint on lavapipe",
    },
    "tests/engine/verify/test_mutants.py": {
        "test_vulkan_mutant_is_rejected_and_blamed": "a lavapipe validation per planted bug",
        "test_vulkan_correct_variants_pass": "a lavapipe validation per config",
    },
    "tests/engine/verify/test_hybrid_mutants.py": {
        "test_vulkan_chunked_scan_mutants_are_rejected_and_blamed": (
            "a lavapipe hybrid validation per planted bug"
        ),
    },
    "tests/engine/verify/test_planted.py": {
        "test_planted_cuda_sources_compile": "nvcc of each planted CUDA bug",
        "test_planted_vulkan_sources_compile": "glslc of each planted Vulkan bug",
    },
    "tests/engine/verify/test_sentinel.py": {
        "test_validate_cross_check_disagreement_fails_the_cli": "validate's CLI, fresh processes",
    },
}


def _entry(nodeid: str) -> tuple[str, str] | None:
    """The SLOW entry (file, function or "*") that covers a collected test, or None."""
    module, _, rest = nodeid.partition("::")
    function = rest.partition("[")[0]
    for key in (function, "*"):
        if key in SLOW.get(module, {}):
            return module, key
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks the slow tier; a function family's first case stays in the fast tier, so a
    `./dev test` still runs one of each kind (one planted Vulkan bug, one every-build compile)."""
    seen: set[tuple[str, str]] = set()
    for item in items:
        key = _entry(item.nodeid)
        if key is None:
            continue
        parametrized = "[" in item.nodeid and key[1] != "*"
        if parametrized and key not in seen:
            seen.add(key)  # the representative
            continue
        item.add_marker(pytest.mark.slow)
