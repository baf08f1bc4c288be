"""The promotions page: every promotion, newest first, from the git history of each promoted
config file where its repository is on this machine, else from what the study recorded."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.dashboard import gitlog
from agent.dashboard.rows import StudyCache
from agent.records import TrialRecord

if TYPE_CHECKING:
    from agent.dashboard.store import StudyStore


def promotions(reader: StudyStore) -> list[dict[str, Any]]:
    """Every promotion, newest first: the git history of each promoted config file when its
    repository is on this machine (one entry per commit, diffed against the version before;
    the first against the study's baseline), else the promotion the study recorded (diffed
    against the study's baseline)."""
    out: list[dict[str, Any]] = []
    seen: set[tuple[str, str, str]] = set()
    for name in reader.study_names():
        c = reader.listed(name)
        assert c is not None  # study_names() just listed it
        recs = list(c.attrs.get("promotions") or [])
        if c.attrs.get("promotion") and c.attrs["promotion"] not in recs:
            recs.append(c.attrs["promotion"])
        base = dict((c.attrs.get("baseline") or {}).get("config") or {})
        for p in recs:
            p = dict(p)
            where = gitlog.locate(str(p.get("path", "")), str(p.get("repo", "")))
            hist = _git_history(reader, *where) if where else []
            if hist:
                assert where is not None
                for e in hist:
                    key = (str(where[0]), where[1], e["commit"])
                    if key in seen:
                        continue
                    seen.add(key)
                    ev = e["evidence"]
                    out.append(
                        {
                            "study": ev.get("study", name),
                            "device_class": ev.get("device_class", c.attrs.get("device_class", "")),
                            "family": ev.get("model_family", c.attrs.get("family", "")),
                            "trial": ev.get("trial"),
                            "at": e["at"],
                            "path": str(p.get("path", "")),
                            "repo": str(p.get("repo", "")),
                            "commit": e["commit"],
                            "message": e["message"],
                            "evidence": ev,
                            "previous": e["previous"],
                            "diff": e["diff"]
                            if e["diff"] is not None
                            else gitlog.diff(base, e["config"]),
                            "source": "git",
                        }
                    )
                continue
            trial = p.get("trial", (p.get("evidence") or {}).get("trial"))
            rec = _trial_record(reader, c, trial)
            ev = (
                dict(p.get("evidence") or {})
                or _file_evidence(p.get("path"))
                or (_record_evidence(rec, c.target))
            )
            cfg = p.get("config") or (rec.config if rec else None)
            if cfg is None:
                cfg = (c.attrs.get("best") or {}).get("config") or {}
            out.append(
                {
                    "study": name,
                    "device_class": c.attrs.get("device_class", ""),
                    "family": c.attrs.get("family", ""),
                    "trial": trial,
                    "at": p.get("at") or ev.get("at") or (c.attrs.get("best") or {}).get("at"),
                    "path": p.get("path", ""),
                    "repo": p.get("repo", ""),
                    "commit": p.get("commit", ""),
                    "message": p.get("message", ""),
                    "evidence": ev,
                    "previous": "",
                    "diff": gitlog.diff(base, cfg),
                    "source": "study",
                }
            )
    for p in out:
        p["win"] = _promotion_win(reader, p)
    out.sort(key=lambda p: float(p["at"] or 0.0), reverse=True)
    return out


def _promotion_win(reader: StudyStore, p: dict[str, Any]) -> str:
    """A promotion's two figures: from its evidence's chain when recorded, else the chain
    the study's records give for its trial now."""
    from agent.win import evidence_line, win_line

    ev = dict(p.get("evidence") or {})
    if ev.get("vs_baseline"):
        return evidence_line(ev)
    c = reader.listed(str(p.get("study")))
    trial = p.get("trial")
    if c is None or not isinstance(trial, int):
        return evidence_line(ev)
    chain = reader.chain(c, trial)
    if not chain["links"]:
        return evidence_line(ev)
    last = chain["links"][-1]
    total = chain if chain["complete"] else None
    base = next((r.number for r in c.rows if r is not None and r.role == "baseline"), None)
    return win_line(last["ratio"], last["lower"], last["against"], total, base)


def _git_history(reader: StudyStore, repo: Path, rel: str) -> list[dict[str, Any]]:
    head = gitlog.head(repo, rel)
    if head is None:
        return []
    key = (str(repo), rel, head)
    with reader.lock:
        if key not in reader.gitlog_cache:
            reader.gitlog_cache[key] = gitlog.history(repo, rel)
        return reader.gitlog_cache[key]


def _trial_record(reader: StudyStore, c: StudyCache, trial: Any) -> TrialRecord | None:
    if not isinstance(trial, int):
        return None
    c = reader.sync(c)
    if not 0 <= trial < len(c.rows) or c.rows[trial] is None:
        return None
    return reader.record(c, trial)


def _file_evidence(path: Any) -> dict[str, Any]:
    """The ``[evidence]`` table of a promoted config file, when it is readable from here."""
    if not path:
        return {}
    try:
        return dict(tomllib.loads(Path(str(path)).read_text()).get("evidence") or {})
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def _record_evidence(rec: TrialRecord | None, target: str) -> dict[str, Any]:
    """Evidence rebuilt from the promoted trial's record, when the config file is elsewhere."""
    if rec is None:
        return {}
    est, val = rec.estimates.get(target), rec.validate
    return {
        "target": target,
        "ratio": est.ratio if est else None,
        "lower_bound": est.lower if est else None,
        "confidence": est.confidence if est else None,
        "paired_against": rec.paired_against,
        "decision": rec.decision.reason if rec.decision else None,
        "validate_max_abs_diff": val.max_abs_diff if val else None,
        "validate_nmse": val.nmse if val else None,
        "device": rec.device,
        "driver": rec.driver,
        "worker": rec.worker.worker_id if rec.worker else None,
        "engine_commit": rec.engine_commit,
    }
