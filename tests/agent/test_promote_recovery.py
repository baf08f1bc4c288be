"""Promotion under faults: a commit killed mid-way (``kill -9`` from a git hook, after the commit
and during it), a device class that tries to leave configs/, and a --promote-repo inside a
repository (issue 30)."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from agent.promote import PromotionRefused, promote
from engine.device_info import DeviceInfo, class_slug
from engine.synth import preset_shape
from engine.tuning import TuningConfig
from engine.tuning.promoted import promoted_path

TINY = preset_shape("qwen2", "tiny")
REL = promoted_path("cpu", TINY, 64, Path("configs"))  # where these tests' promotions go

ROOT = Path(__file__).resolve().parents[2]
CFG = TuningConfig.default("numpy").replace(**{"prefill.chunk_tokens": 64})
EVIDENCE = {"study": "s", "trial": 4, "ratio": 1.2, "target": "x", "engine_commit": "abc"}


def _git(repo: Path, *args: str) -> str:
    r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True)
    return r.stdout.strip()


def _hook(repo: Path, name: str, body: str) -> None:
    hook = repo / ".git" / "hooks" / name
    hook.write_text("#!/bin/sh\n" + body + "\n")
    hook.chmod(0o755)


def _promote_in_a_process(repo: Path, at: str) -> int:
    """promote() in a child process of its own session (its process group is python, git and
    the hook); returns its exit status (-9: killed)."""
    code = (
        "from pathlib import Path; from agent.promote import promote; "
        "from engine.tuning import TuningConfig; from engine.synth import preset_shape; "
        "cfg = TuningConfig.default('numpy').replace(**{'prefill.chunk_tokens': 64}); "
        f"ev = {{**{EVIDENCE!r}, 'promoted_at': {at!r}}}; "
        f"promote(Path({str(repo)!r}), 'cpu', preset_shape('qwen2', 'tiny'), 64, cfg, ev)"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, start_new_session=True, timeout=120)
    return r.returncode


def test_a_commit_that_landed_before_the_kill_is_recorded_not_made_twice(repo: Path) -> None:
    """kill -9 right after git committed (a post-commit hook kills the agent): the rerun finds
    the same config and evidence, all but promoted_at, at HEAD and records that commit."""
    _hook(repo, "post-commit", 'kill -9 "$(ps -o ppid= -p $PPID | tr -d " ")"')
    assert _promote_in_a_process(repo, "2026-01-01T00:00:00Z") == -9
    first = _git(repo, "rev-parse", "HEAD")
    assert _git(repo, "log", "-1", "--format=%s").startswith("promote cpu/qwen2")
    (repo / ".git" / "hooks" / "post-commit").unlink()
    again = promote(repo, "cpu", TINY, 64, CFG, {**EVIDENCE, "promoted_at": "2026-01-01T00:05:00Z"})
    assert again.recovered and again.commit == first
    assert _git(repo, "rev-parse", "HEAD") == first and _git(repo, "status", "--porcelain") == ""
    # another trial's win is a new promotion, committed
    other = promote(repo, "cpu", TINY, 64, CFG, {**EVIDENCE, "trial": 9, "promoted_at": "later"})
    assert not other.recovered and other.commit != first


def test_a_commit_killed_mid_way_says_exactly_how_to_clean_up(repo: Path) -> None:
    """kill -9 of the whole process group in a slow pre-commit hook: git's index.lock and the
    staged config stay. The rerun names the lock and gives the commands; they work."""
    _hook(repo, "pre-commit", 'kill -9 -"$(ps -o pgid= -p $$ | tr -d " ")"')
    assert _promote_in_a_process(repo, "t1") == -9
    lock = repo / ".git" / "index.lock"
    assert lock.exists() and (repo / REL).exists()
    (repo / ".git" / "hooks" / "pre-commit").unlink()
    with pytest.raises(PromotionRefused) as e:
        promote(repo, "cpu", TINY, 64, CFG, {**EVIDENCE, "promoted_at": "t2"})
    msg = str(e.value)
    assert "\n" not in msg and f"it left {lock}" in msg and str(REL) in msg
    commands = re.search(r"clean up with: (.*); then run again", msg)
    assert commands is not None, msg
    for cmd in commands.group(1).split(" && "):
        subprocess.run(shlex.split(cmd), check=True)
    assert _git(repo, "status", "--porcelain") == "" and not (repo / "configs").exists()
    p = promote(repo, "cpu", TINY, 64, CFG, {**EVIDENCE, "promoted_at": "t3"})
    assert _git(repo, "show", "--name-only", "--format=", p.commit) == str(REL)


def test_a_hostile_device_name_cannot_leave_configs(repo: Path, tmp_path: Path) -> None:
    """A driver naming its device "NVIDIA ../../../evil" made the class nvidia-../../../evil and
    promotion committed repo/evil/qwen2.toml: the class is a slug where it is derived, and the
    promoted path is checked once resolved (a symlink out of configs/ too)."""
    from engine.backends.vulkan.device import device_class

    assert device_class(0x10DE, "NVIDIA ../../../evil") == "nvidia-evil"
    assert class_slug("NVIDIA ../../../evil") == "nvidia-evil"
    info = DeviceInfo("vulkan", "x", "nvidia", "nvidia-../../../evil")
    assert info.device_class == "nvidia-evil"
    for good in ("rtx4090", "nvidia-rtx-a6000", "r9700", "llvmpipe", "cpu-sim"):
        assert class_slug(good) == good
    with pytest.raises(PromotionRefused, match="outside"):
        promote(repo, "nvidia-../../../evil", TINY, 64, CFG, EVIDENCE)
    assert not (repo.parent / "evil").exists() and not (repo / "evil").exists()
    (repo / "configs").mkdir()
    (repo / "configs" / "cpu").symlink_to(tmp_path)
    with pytest.raises(PromotionRefused, match="outside"):
        promote(repo, "cpu", TINY, 64, CFG, EVIDENCE)
    assert _git(repo, "log", "--format=%s") == "init"


def test_a_promote_repo_inside_a_repository_commits_at_its_configs(repo: Path) -> None:
    """--promote-repo repo/sub/deep committed sub/deep/configs/..., where the engine never
    looks: the promotion goes to the repository's own configs/."""
    deep = repo / "sub" / "deep"
    deep.mkdir(parents=True)
    p = promote(deep, "cpu", TINY, 64, CFG, EVIDENCE)
    assert p.path == repo / REL and p.repo == repo
    assert _git(repo, "show", "--name-only", "--format=", p.commit) == str(REL)
    assert not (deep / "configs").exists()


def test_the_agent_promotes_into_the_repository_not_the_subdirectory(
    repo: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from agent.experiment import parse_experiment
    from agent.loop import Agent, RunOptions
    from agent.storage import parse_storage

    deep = repo / "sub"
    deep.mkdir()
    exp = parse_experiment(
        {
            "name": "p",
            "models": ["synthetic:tiny"],
            "backends": ["numpy"],
            "objectives": [{"metric": "prefill_tok_s", "prompt_tokens": 8}],
            "space": {"numpy": {"prefill": {"chunk_tokens": [8, 16]}}},
        }
    )
    opts = RunOptions(parse_storage(str(repo / "s.journal")), promote_repo=deep, local=True)
    with caplog.at_level("INFO", "agent"):
        assert Agent(exp, opts).promote_repo() == repo
    assert any("where the engine looks" in r.getMessage() for r in caplog.records)
