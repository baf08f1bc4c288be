"""The end of a study: promote its accepted best into the run's (repository, branch) unless a
recorded promotion of it is still there (the git side is agent.promote's); and the promoted
baseline a study started from, as the worker is told about it (``promoted_arg``)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent import report
from agent.experiment import Experiment
from agent.study import BASELINE, StudyState
from engine.errors import EngineError

log = logging.getLogger("agent")


def promote_best(
    exp: Experiment, storage: str, st: StudyState, promote_repo: Callable[[], Path]
) -> tuple[dict[str, Any] | None, str]:
    """(what this run did about the study's promotion, or None; why it was not promoted, or "").
    ``promote_repo`` is called only when there is a best to promote; ``storage`` is the
    storage's display name, for the evidence."""
    baseline_trial = st.baseline_trial()
    if st.best.trial is None or st.best.trial == baseline_trial:
        return None, ""
    from agent.promote import PromotionRefused, promote, still_there
    from engine.tuning.promoted import promoted_path

    if st.shape is None:  # got_model sets it: a study the agent started always has one
        return None, "no model shape to key the promotion by"
    repo, branch = promote_repo().resolve(), exp.promote.branch
    ctx = exp.memory.context_tokens
    rel = promoted_path(st.device_class, st.shape, ctx, repo / "configs").relative_to(repo)
    note = ""
    try:
        cfg = st.resolve(st.best.config)
        done = st.promotion_in(str(repo), branch)
        if done and done.get("trial") == st.best.trial:
            why = still_there(repo, branch, rel, str(done.get("commit", "")), cfg)
            if not why:
                return {**done, "branch": branch, "action": "already"}, ""
            note = f"the recorded promotion of trial {st.best.trial} is gone ({why})"
        elif not done and st.promotion:
            prev = st.promotion
            note = (
                f"promoted before into {prev.get('repo')} (commit "
                f"{str(prev.get('commit') or '-')[:12]}); this run promotes into {repo}"
            )
        rec = st.trials_record(st.best.trial)
        prom = promote(
            repo,
            st.device_class,
            st.shape,
            ctx,
            cfg,
            report.evidence(exp, storage, st, rec),
            branch,
        )
    except PromotionRefused as e:
        log.error("not promoted: %s", e)
        return None, str(e)
    info = {
        "trial": st.best.trial,
        "repo": str(prom.repo),
        "branch": branch,
        "path": str(prom.path),
        "commit": prom.commit,
        "at": time.time(),
    }
    st.record_promotion(info)
    action = "recorded" if prom.recovered else "committed" if prom.commit else "unchanged"
    if prom.recovered:
        note = (
            f"commit {prom.commit[:12]} already promoted trial {st.best.trial} (a run stopped "
            "before it recorded it): recorded, not committed again"
        )
    log.info("promoted %s -> %s (commit %s)", st.name, prom.path, prom.commit[:12] or "-")
    return {**info, "action": action, "note": note}, ""


def promoted_arg(st: StudyState, role: str) -> dict[str, Any] | None:
    """For a study's promoted baseline: its file and the sentinel key its evidence records (read
    now, so a resumed study sees the file as it is); the worker re-validates it when its own key
    differs. None for every other trial."""
    prefix = "promoted:"
    if role != BASELINE or not st.baseline_source.startswith(prefix):
        return None
    from engine.tuning.promoted import evidence_key, read_evidence

    path = Path(st.baseline_source[len(prefix) :])
    try:
        key = evidence_key(read_evidence(path), st.backend)
    except EngineError:  # gone or unreadable since: no recorded key, so it is re-validated
        key = None
    return {"path": str(path), "key": key}
