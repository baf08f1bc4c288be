"""Measured results a run could not store (its storage went down mid-run), kept aside for the
next run: a JSON file ``{study: {trial number: record attrs}}``.

The next run, before it opens its studies, writes each kept record onto its trial when that
trial is still RUNNING in the storage; resume (StudyState.settle_running) then finishes it as
a whole record instead of failing it as interrupted, so no measured trial is run twice.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import TrialState

from agent.storage import StorageRef, default_dir

log = logging.getLogger("agent.storage")


def paths(ref: StorageRef) -> list[Path]:
    """Where the file may be: next to the fleet status file, else (that disk full or read-only)
    in the cache."""
    status = ref.status_path
    digest = hashlib.sha1(ref.url.encode()).hexdigest()[:12]
    return [
        status.with_name(status.stem + ".unsaved.json"),
        default_dir() / f"unsaved-{digest}.json",
    ]


def save(ref: StorageRef, studies: Iterable[Any]) -> Path | None:
    """Write the records the studies still hold unsaved (merged with a file already there);
    returns where, or None when there was nothing to keep or nowhere to write it."""
    doc: dict[str, dict[str, Any]] = {}
    for st in studies:
        if st.unsaved:
            doc[st.name] = {str(n): attrs for n, attrs in st.unsaved.items()}
    if not doc:
        return None
    for path in paths(ref):
        try:
            old = _read(path)
            for name, recs in old.items():
                doc[name] = {**recs, **doc.get(name, {})}
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            try:
                tmp.write_text(json.dumps(doc, default=str))
                tmp.replace(path)
            finally:
                tmp.unlink(missing_ok=True)
            return path
        except OSError as e:
            log.warning("unsaved results not written to %s: %s", path, e)
    return None


def restore(ref: StorageRef, storage: optuna.storages.BaseStorage) -> int:
    """Write kept records onto their trials that are still RUNNING; removes each file once
    applied. Returns how many trials got their record back."""
    n = 0
    for path in paths(ref):
        doc = _read(path)
        if not doc:
            continue
        for name, recs in doc.items():
            try:
                study = optuna.load_study(study_name=name, storage=storage)
            except KeyError:
                continue
            trials = {t.number: t for t in study.get_trials(deepcopy=False)}
            for number, attrs in recs.items():
                t = trials.get(int(number))
                if t is None or t.state is not TrialState.RUNNING or "outcome" in t.user_attrs:
                    continue
                rest = dict(attrs)
                outcome = rest.pop("outcome", None)
                for k, v in rest.items():  # "outcome" last, as StudyState.finish writes it
                    storage.set_trial_user_attr(t._trial_id, k, v)
                if outcome is not None:
                    storage.set_trial_user_attr(t._trial_id, "outcome", outcome)
                n += 1
        path.unlink(missing_ok=True)
        log.info(
            "%s: %d measured trial(s) kept by a run whose storage went down, restored", path, n
        )
    return n


def _read(path: Path) -> dict[str, dict[str, Any]]:
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}
