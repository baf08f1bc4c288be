"""Promotion: write ``configs/<device class>/<model family>.toml`` with its evidence and commit it
to the main branch of the promote repository, touching nothing else.

Refuses (``PromotionRefused``, a clear message, nothing written) when the repository is not on
the promotion branch, when the index already holds staged changes (the commit would carry them),
or when the config file itself has uncommitted edits. The file is a TuningConfig TOML
(``backend`` + ``[ops.*]``) plus an ``[evidence]`` table that ``TuningConfig.from_toml`` ignores.
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import EngineError
from engine.tuning import TuningConfig
from engine.tuning.promoted import promoted_path


class PromotionRefused(EngineError):
    """A promotion that would commit more than its config file, or to the wrong branch."""


@dataclass(frozen=True)
class Promotion:
    repo: Path
    path: Path  # absolute path of the config file
    commit: str  # the commit that added it ("" when the file already held this content)
    message: str


def _git(repo: Path, *args: str, check: bool = True) -> str:
    env = dict(os.environ)
    # A commit needs an identity; machines set up only to run the agent may have none.
    env.setdefault("GIT_AUTHOR_NAME", "fleettune agent")
    env.setdefault("GIT_AUTHOR_EMAIL", "agent@fleettune.invalid")
    env.setdefault("GIT_COMMITTER_NAME", env["GIT_AUTHOR_NAME"])
    env.setdefault("GIT_COMMITTER_EMAIL", env["GIT_AUTHOR_EMAIL"])
    r = subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, timeout=60
    )
    if check and r.returncode != 0:
        raise PromotionRefused(f"git {' '.join(args)} failed in {repo}: {r.stderr.strip()}")
    return r.stdout.strip()


def config_text(config: TuningConfig, evidence: dict[str, Any]) -> str:
    header = (
        "# Promoted by the fleettune agent. The engine loads this for its device class and model\n"
        "# family at start-up; --config overrides it. [evidence] says why it won.\n"
    )
    return header + config.to_toml() + "\n" + evidence_toml({"evidence": evidence})


def evidence_toml(data: dict[str, Any]) -> str:
    """TOML of plain data (tomli-w); None, which TOML lacks, is written as ""."""
    import tomli_w

    def plain(v: Any) -> Any:
        if v is None:
            return ""
        if isinstance(v, dict):
            return {str(k): plain(x) for k, x in v.items()}
        if isinstance(v, list | tuple):
            return [plain(x) for x in v]
        return v

    return tomli_w.dumps(plain(data))


def scratch_repo() -> Path:
    """A git repository under the cache for demos: created on first use, branch main."""
    from agent.storage import default_dir

    repo = default_dir() / "promote-scratch"
    if not (repo / ".git").exists():
        repo.mkdir(parents=True, exist_ok=True)
        _git(repo, "init", "-q", "-b", "main")
        (repo / "README.md").write_text(
            "Scratch repository of configs promoted by `./dev demo` (fleettune agent).\n"
            "Use them with FLEETTUNE_CONFIGS=<this folder>/configs.\n"
        )
        _git(repo, "add", "README.md")
        _git(repo, "commit", "-q", "-m", "scratch repository for demo promotions")
    return repo


def check_repo(repo: Path, rel: Path, branch: str) -> None:
    """Raise PromotionRefused unless a commit of ``rel`` alone onto ``branch`` is possible."""
    if not (repo / ".git").exists() and not _git(repo, "rev-parse", "--git-dir", check=False):
        raise PromotionRefused(
            f"{repo} is not a git repository; give --promote-repo a git checkout"
        )
    head = _git(repo, "symbolic-ref", "--quiet", "--short", "HEAD", check=False)
    if head != branch:
        raise PromotionRefused(
            f"{repo} is on {head or 'a detached HEAD'!s}, not {branch}: promotion commits only to "
            f"{branch}. Check out {branch} there, or promote into another repository "
            "(--promote-repo)."
        )
    staged = _git(repo, "diff", "--cached", "--name-only")
    if staged:
        files = ", ".join(staged.splitlines()[:5])
        raise PromotionRefused(
            f"{repo} has staged changes ({files}): the promotion commit would include them. "
            "Commit or unstage them, or promote into another repository (--promote-repo)."
        )
    dirty = _git(repo, "status", "--porcelain", "--", str(rel))
    if dirty and not dirty.startswith("??"):
        raise PromotionRefused(
            f"{repo / rel} has uncommitted edits: refusing to overwrite them. "
            "Commit or revert them."
        )


def promote(
    repo: Path,
    device_class: str,
    family: str,
    config: TuningConfig,
    evidence: dict[str, Any],
    branch: str = "main",
) -> Promotion:
    """Write and commit the promoted config; returns where and which commit."""
    repo = repo.resolve()
    path = promoted_path(device_class, family, repo / "configs")
    rel = path.relative_to(repo)
    check_repo(repo, rel, branch)
    text = config_text(config, evidence)
    message = (
        f"promote {device_class}/{family}: {evidence.get('target', '')} "
        f"x{evidence.get('ratio', 0):.3f} (lower bound {evidence.get('lower_bound', 0):.3f}), "
        f"{evidence.get('study', '')} trial {evidence.get('trial', '')}"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.read_text() if path.exists() else None
    path.write_text(text)
    try:
        check = TuningConfig.from_toml(path)
        if check != config:
            raise PromotionRefused(f"{path}: written config does not read back the same")
    except Exception:
        if old is None:
            path.unlink()
        else:
            path.write_text(old)
        raise
    if old == text:
        return Promotion(repo, path, "", message)
    _git(repo, "add", "--", str(rel))
    _git(repo, "commit", "-q", "-m", message, "--", str(rel))
    return Promotion(repo, path, _git(repo, "rev-parse", "HEAD"), message)
