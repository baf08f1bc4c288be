"""Promotion: write ``configs/<device class>/<family>/<shape key>.ctx<context>.toml`` (keyed by
what it was tuned on: engine/tuning/promoted.py) with its evidence and commit it to the main
branch of the promote repository, touching nothing else.

Refuses (``PromotionRefused``, a clear message, nothing written) when the repository is missing,
not git, not on the promotion branch, when the index already holds staged changes (the commit
would carry them), or when the config file itself has uncommitted edits or is untracked (a
hand-written file). A commit that fails (hook, identity, timeout) is rolled back: the file is
unstaged and restored. The file is a TuningConfig TOML (``backend`` + ``[ops.*]``) plus an
``[evidence]`` table that ``TuningConfig.from_toml`` ignores; its ``tuned_on`` table records the
model shape and the served context that the path is keyed by.

A promotion belongs to a (repository, branch): ``still_there`` tells whether a recorded one is
on that branch now (its commit reachable, the file at the branch head holding its config).
"""

from __future__ import annotations

import os
import subprocess
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.errors import EngineError
from engine.tuning import TuningConfig
from engine.tuning.promoted import promoted_path, tuned_on
from engine.tuning.shape import ModelShape


class PromotionRefused(EngineError):
    """A promotion that would commit more than its config file, or to the wrong branch."""


@dataclass(frozen=True)
class Promotion:
    repo: Path
    path: Path  # absolute path of the config file
    commit: str  # the commit that added it ("" when the file already held this content)
    message: str
    recovered: bool = False  # committed by an earlier run killed before it recorded the commit


def _git(repo: Path, *args: str, check: bool = True) -> str:
    env = dict(os.environ)
    # A commit needs an identity; machines set up only to run the agent may have none.
    env.setdefault("GIT_AUTHOR_NAME", "fleettune agent")
    env.setdefault("GIT_AUTHOR_EMAIL", "agent@fleettune.invalid")
    env.setdefault("GIT_COMMITTER_NAME", env["GIT_AUTHOR_NAME"])
    env.setdefault("GIT_COMMITTER_EMAIL", env["GIT_AUTHOR_EMAIL"])
    try:
        r = subprocess.run(
            ["git", "-C", str(repo), *args], capture_output=True, text=True, env=env, timeout=60
        )
    except subprocess.TimeoutExpired:
        raise PromotionRefused(f"git {' '.join(args)} timed out in {repo}") from None
    except OSError as e:  # no git binary, or the repository path vanished
        raise PromotionRefused(f"git {' '.join(args)} cannot run in {repo}: {e}") from None
    if check and r.returncode != 0:
        raise PromotionRefused(f"git {' '.join(args)} failed in {repo}: {r.stderr.strip()}")
    return r.stdout.strip()


def config_text(config: TuningConfig, evidence: dict[str, Any]) -> str:
    header = (
        "# Promoted by the fleettune agent. The engine loads the promoted config nearest to its\n"
        "# device class, model shape and served context at start-up ([evidence.tuned_on] says\n"
        "# what this one was tuned on); --config overrides it. [evidence] says why it won.\n"
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


def check_target(repo: Path, branch: str) -> None:
    """Raise PromotionRefused unless ``repo`` is a git checkout on ``branch`` with nothing staged:
    checked before the first trial, so a bad --promote-repo fails in seconds, not after the run."""
    if not repo.is_dir():
        raise PromotionRefused(f"promotion repository {repo} does not exist")
    if not _git(repo, "rev-parse", "--git-dir", check=False):
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
    check_interrupted_commit(repo)
    staged = _git(repo, "diff", "--cached", "--name-only")
    if staged:
        files = ", ".join(staged.splitlines()[:5])
        raise PromotionRefused(
            f"{repo} has staged changes ({files}): the promotion commit would include them. "
            "Commit or unstage them, or promote into another repository (--promote-repo)."
        )


def check_repo(repo: Path, rel: Path, branch: str) -> None:
    """Raise PromotionRefused unless a commit of ``rel`` alone onto ``branch`` is possible."""
    check_target(repo, branch)
    dirty = _git(repo, "status", "--porcelain", "--", str(rel))
    if dirty.startswith("??"):
        raise PromotionRefused(
            f"{repo / rel} exists but git does not track it (written by hand?): refusing to "
            "overwrite it. Commit it, move it away, or promote into another repository."
        )
    if dirty:
        raise PromotionRefused(
            f"{repo / rel} has uncommitted edits: refusing to overwrite them. "
            "Commit or revert them."
        )


# --- recovery and path checks (a promotion killed mid-way, a hostile device class) -----------
VOLATILE_EVIDENCE = ("promoted_at",)  # differs between two promotions of the same trial


def repo_root(repo: Path) -> Path:
    """The top of the git checkout ``repo`` lies in (``repo`` itself when it is not in one, for
    check_target to refuse): the engine reads ``configs/`` there, never in a subdirectory."""
    top = _git(repo, "rev-parse", "--show-toplevel", check=False) if repo.is_dir() else ""
    return Path(top).resolve() if top else repo


def check_inside(path: Path, root: Path) -> None:
    """Refuse a config path that resolves outside ``root`` (a device class or family made of
    ``..`` or a symlink leading out): the check is on the resolved path, not its spelling."""
    if not path.resolve().is_relative_to(root.resolve()):
        raise PromotionRefused(
            f"promoted config path {path} resolves outside {root}: refusing to write it"
        )


def check_interrupted_commit(repo: Path) -> None:
    """Refuse, saying exactly how to clean up, a repository where a git process was killed
    mid-commit (a promotion killed with its process group): ``index.lock`` left behind, and the
    config it was committing still staged and written, where the engine would load it."""
    lock = Path(_git(repo, "rev-parse", "--git-path", "index.lock"))
    lock = lock if lock.is_absolute() else repo / lock
    if not lock.exists():
        return
    staged = _git(repo, "diff", "--cached", "--name-only", check=False).splitlines()
    steps = [f"rm {lock}"]
    if staged:
        files = " ".join(staged)
        steps.append(f"git -C {repo} restore --source=HEAD --staged --worktree -- {files}")
    raise PromotionRefused(
        f"{repo}: a git commit was killed mid-way (it left {lock}"
        + (f" and {len(staged)} staged file(s): {', '.join(staged[:5])}" if staged else "")
        + "). If no git process runs there now, clean up with: "
        + " && ".join(steps)
        + "; then run again"
    )


def committed_already(repo: Path, rel: Path, config: TuningConfig, evidence: dict[str, Any]) -> str:
    """The commit that already promoted this (same config, same evidence but the time): a run
    killed after git committed and before its storage recorded the commit must not commit a
    second time on rerun. "" when the file at HEAD is another promotion (or none)."""
    text = _git(repo, "show", f"HEAD:{rel.as_posix()}", check=False)
    if not text:
        return ""
    try:
        data = tomllib.loads(text)
        same = TuningConfig.from_flat(config.backend, _flat(data)) == config
    except (tomllib.TOMLDecodeError, EngineError):
        return ""
    ours = tomllib.loads(evidence_toml({"evidence": evidence}))["evidence"]
    theirs = data.get("evidence", {})
    for key in VOLATILE_EVIDENCE:
        ours.pop(key, None)
        theirs.pop(key, None)
    if not same or ours != theirs:
        return ""
    return _git(repo, "log", "-1", "--format=%H", "--", rel.as_posix())


def commit_subject(where: str, evidence: dict[str, Any]) -> str:
    """The promotion commit's subject: where (class/family/shape key and context), both
    speedups named (agent.win), study and trial."""
    from agent.win import evidence_line

    figures = evidence_line(evidence) or (
        f"x{evidence.get('ratio', 0):.3f} (lower bound {evidence.get('lower_bound', 0):.3f})"
    )
    return (
        f"promote {where}: {evidence.get('target', '')} {figures}, "
        f"{evidence.get('study', '')} trial {evidence.get('trial', '')}"
    )


def _ok(repo: Path, *args: str) -> bool:
    try:
        r = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def still_there(repo: Path, branch: str, rel: Path, commit: str, config: TuningConfig) -> str:
    """ "" when a recorded promotion is on ``branch`` of ``repo`` now, else why not."""
    if not repo.is_dir() or not _ok(repo, "rev-parse", "--git-dir"):
        return f"{repo} is not a git repository now"
    if commit and not _ok(repo, "cat-file", "-e", f"{commit}^{{commit}}"):
        return f"commit {commit[:12]} is not in {repo}"
    if commit and not _ok(repo, "merge-base", "--is-ancestor", commit, branch):
        return f"commit {commit[:12]} is no longer on {branch} of {repo}"
    text = _git(repo, "show", f"{branch}:{rel.as_posix()}", check=False)
    try:
        data = tomllib.loads(text)
        same = bool(text) and TuningConfig.from_flat(config.backend, _flat(data)) == config
    except (tomllib.TOMLDecodeError, EngineError):
        same = False
    return "" if same else f"{rel} on {branch} of {repo} no longer holds this config"


def _flat(data: dict[str, Any]) -> dict[str, Any]:
    return {f"{op}.{k}": v for op, t in data.get("ops", {}).items() for k, v in t.items()}


def promote(
    repo: Path,
    device_class: str,
    shape: ModelShape,
    context_tokens: int,
    config: TuningConfig,
    evidence: dict[str, Any],
    branch: str = "main",
) -> Promotion:
    """Write and commit the config promoted for this device class, model shape and served
    context (recorded in the evidence's ``tuned_on``); returns where and which commit."""
    repo = repo_root(repo.resolve())
    path = promoted_path(device_class, shape, context_tokens, repo / "configs")
    check_inside(path, repo / "configs")
    rel = path.relative_to(repo)
    check_repo(repo, rel, branch)
    evidence = {"tuned_on": tuned_on(shape, context_tokens), **evidence}  # the path's key
    text = config_text(config, evidence)
    if path.exists() and path.read_text() != text:
        done = committed_already(repo, rel, config, evidence)
        if done:
            message = _git(repo, "log", "-1", "--format=%s", done)
            return Promotion(repo, path, done, message, recovered=True)
    where = f"{device_class}/{shape.family}/{shape.key} ctx{context_tokens}"
    message = commit_subject(where, evidence)
    before = _git(repo, "rev-parse", "--verify", "-q", "HEAD", check=False)
    new_dirs = [d for d in (path.parent, *path.parents[1:3]) if not d.exists()]
    path.parent.mkdir(parents=True, exist_ok=True)
    old = path.read_text() if path.exists() else None

    def restore() -> None:
        if old is not None:
            path.write_text(old)
            return
        path.unlink(missing_ok=True)
        for d in new_dirs:  # innermost first
            if d.is_dir() and not any(d.iterdir()):
                d.rmdir()

    path.write_text(text)
    try:
        check = TuningConfig.from_toml(path)
        if check != config:
            raise PromotionRefused(f"{path}: written config does not read back the same")
    except Exception:
        restore()
        raise
    if old == text:
        return Promotion(repo, path, "", message)
    try:
        _git(repo, "add", "--", str(rel))
        _git(repo, "commit", "-q", "-m", message, "--", str(rel))
        after = _git(repo, "rev-parse", "--verify", "-q", "HEAD", check=False)
        if after == before:
            raise PromotionRefused(f"git commit in {repo} made no commit")
    except BaseException as e:  # a git failure, or Ctrl-C / SIGTERM mid-commit
        # Leave nothing staged or written: the engine would load a config nobody promoted,
        # and every later promotion would be refused for the staged change.
        if _git(repo, "rev-parse", "--verify", "-q", "HEAD", check=False) != before:
            raise  # the commit landed (stopped just after it): nothing to undo
        if before:
            _git(repo, "reset", "-q", "--", str(rel), check=False)
        else:
            _git(repo, "rm", "-q", "--cached", "--", str(rel), check=False)
        restore()
        if isinstance(e, PromotionRefused):
            raise PromotionRefused(f"promotion commit failed, rolled back: {e}") from None
        raise
    return Promotion(repo, path, after, message)
