"""The fleet page and each study's progress, from the agent's fleet status file: workers, nodes
and device classes, every agent invocation with the trials that finished while it ran, and
whether a "running" agent can be believed (its process, its status file's age, its leases)."""

from __future__ import annotations

import bisect
import json
import logging
import os
import socket
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.dashboard.rows import BUDGET, GONE, TrialRow
from agent.throughput import worker_rate

if TYPE_CHECKING:
    from agent.dashboard.store import StudyStore

log = logging.getLogger(__name__)


def status_file(reader: StudyStore) -> dict[str, Any]:
    """The agent's fleet status file as written, {} when absent; ``error`` when unreadable."""
    path = reader.ref.status_path
    try:
        return dict(json.loads(Path(path).read_text()))
    except FileNotFoundError:
        return {}
    except (OSError, json.JSONDecodeError) as e:
        return {"error": f"cannot read {path}: {e}"}


def fleet(reader: StudyStore) -> dict[str, Any]:
    """The agent's fleet status file, with nodes and device classes derived from workers,
    every agent invocation recorded with the trials that finished during it, per-worker
    totals over all invocations, the last GPU state each worker recorded, and what each
    worker's A/A noise means for acceptance."""
    path = reader.ref.status_path
    base: dict[str, Any] = {
        "status_file": str(path),
        "present": False,
        "agent": None,
        "workers": [],
        "studies": [],
        "nodes": [],
        "device_classes": {},
        "age_s": None,
        "stale": "",
        "invocations": [],
        "ray_dashboard": "",
    }
    data = status_file(reader)
    if not data:
        return base
    if "error" in data:
        return {**base, "error": data["error"]}
    agent = data.get("agent") or None
    now = time.time()
    age = now - float(agent["updated"]) if agent and agent.get("updated") else None
    rows = [r for n in reader.study_names() for r in reader.study_cache(n).rows if r is not None]
    acceptance = (agent or {}).get("acceptance") or {}
    workers = [_worker(dict(w), rows, acceptance) for w in data.get("workers") or []]
    stale = agent_stale(reader, data)
    invocations = _invocations(data, rows, now)
    if stale and agent:  # what it last said it was doing is not what is happening
        agent = {**agent, "state": GONE, "reported_state": agent.get("state")}
        for w in workers:
            if w.get("state") != "dead":
                w["reported_state"], w["state"], w["current_s"] = (
                    w.get("state"),
                    "unknown",
                    None,
                )
        for i in invocations:
            if i.get("pid") == agent.get("pid") and i.get("started") == agent.get("started"):
                i["state"] = GONE if i.get("state") == "running" else i.get("state")
    nodes: dict[str, dict[str, Any]] = {}
    classes: dict[str, dict[str, int]] = {}
    for w in workers:
        info = w.get("info") or {}
        host = info.get("host") or "(not yet known)"
        node = nodes.setdefault(
            host, {"host": host, "node_id": info.get("node_id", ""), "workers": []}
        )
        node["workers"].append(w.get("worker_id", ""))
        cls = classes.setdefault(str(w.get("device_class", "")), {})
        state = str(w.get("state", ""))
        cls[state] = cls.get(state, 0) + 1
    return {
        **base,
        "present": True,
        "agent": agent,
        "workers": workers,
        "studies": list(data.get("studies") or []),
        "nodes": sorted(nodes.values(), key=lambda n: n["host"]),
        "device_classes": dict(sorted(classes.items())),
        "age_s": age,
        "stale": stale,
        "invocations": invocations,
        "ray_dashboard": str((agent or {}).get("ray_dashboard") or ""),
    }


def _worker(w: dict[str, Any], rows: list[TrialRow], acceptance: dict[str, Any]) -> dict[str, Any]:
    wid = str(w.get("worker_id", ""))
    mine = [r for r in rows if r.worker == wid]
    w["evaluated_all"] = sum(r.outcome in BUDGET for r in mine)
    spans = [(r.started, r.finished) for r in mine if r.outcome in BUDGET]
    w["throughput_all"] = worker_rate(wid, spans).to_dict()  # trials per GPU-hour
    with_gpu = [r for r in mine if r.gpu]
    w["gpu"] = max(with_gpu, key=lambda r: r.finished).gpu if with_gpu else None
    target = acceptance.get("target")
    min_gain = float(acceptance.get("min_gain") or 0.0)
    w["accepts_above"] = {
        model: 1.0 + max(min_gain, float(objs.get(target, 0.0)))
        for model, objs in (w.get("noise") or {}).items()
        if target and target in objs
    }
    since = w.get("current_since")
    w["current_s"] = time.time() - float(since) if since and w.get("current") else None
    return w


def agent_stale(reader: StudyStore, status: dict[str, Any] | None = None) -> str:
    """Why the status file's "running" agent cannot be believed, or "": its process gone
    (this host), its status not rewritten for longer than a trial may take, or its study
    leases no longer beating (the agent renews them every ttl/4 from a thread, whatever its
    loop waits on; killed, it stops)."""
    status = status_file(reader) if status is None else status
    agent = status.get("agent") or None
    if not agent or agent.get("state") != "running":
        return ""
    age = time.time() - float(agent["updated"]) if agent.get("updated") else None
    studies = [str(s.get("study")) for s in status.get("studies") or [] if s.get("study")]
    return _stale(agent, age) or _lease_stale(reader, agent, studies)


def _lease_stale(reader: StudyStore, agent: dict[str, Any], studies: list[str]) -> str:
    from agent.lease import KEY, Holder

    now = time.time()
    late: list[tuple[float, float]] = []
    mine = 0
    try:
        ids = reader.study_ids(studies)
        for sid in ids:
            h = Holder.from_attr(reader.storage.get_study_system_attrs(sid).get(KEY))
            if h is None or h.host != agent.get("host") or h.pid != agent.get("pid"):
                continue
            mine += 1
            ttl = max(h.expires - h.heartbeat, 1.0)
            if now - h.heartbeat <= ttl / 2:
                return ""  # one lease beating is enough: the agent lives
            late.append((now - h.heartbeat, ttl))
    except Exception as e:  # noqa: BLE001 - the leases cannot tell; the other checks stand
        log.debug("dashboard: leases not read: %s", e)
        return ""
    if late:
        since, ttl = min(late)
        return (
            f"the agent's lease heartbeat stopped {since:.0f} s ago (it beats every "
            f"{ttl / 4:.0f} s while it runs): the agent is gone"
        )
    if ids and not mine:
        return "the agent holds none of its studies' leases any more: it is gone"
    return ""


def progress(reader: StudyStore, name: str) -> dict[str, Any]:
    """How far the study is: evaluated / budget, this invocation's elapsed time and rate,
    the time left, and each running trial against its timeout (from the status file)."""
    c = reader.study_cache(name)
    rows = [r for r in c.rows if r is not None]
    evaluated = sum(r.outcome in BUDGET for r in rows)
    status = status_file(reader)
    agent = status.get("agent") or {}
    entry = next((s for s in status.get("studies") or [] if s.get("study") == name), {})
    budget = entry.get("budget")
    now = time.time()
    started = float(agent.get("started") or 0.0)
    stale = agent_stale(reader, status)
    running_agent = agent.get("state") == "running" and bool(entry) and not stale
    end = now if running_agent else float(agent.get("updated") or now)
    elapsed = end - started if started and entry else None
    this_run = sum(r.outcome in BUDGET and r.finished >= started for r in rows) if entry else 0
    per_hour = this_run / elapsed * 3600 if elapsed and this_run else None
    left = max(0, int(budget) - evaluated) if isinstance(budget, int) else None
    eta = left / per_hour * 3600 if left is not None and per_hour and running_agent else None
    wall = agent.get("wall_time_s")
    if wall and running_agent and started:
        wall_left = max(0.0, started + float(wall) - now)
        eta = wall_left if eta is None else min(eta, wall_left)
    timeout = agent.get("trial_timeout_s")
    by_trial = {str(w.get("current")): w for w in status.get("workers") or [] if w.get("current")}
    current = []
    for r in rows:
        if r.outcome not in ("running", "waiting"):
            continue
        w = by_trial.get(f"{name} #{r.number}") or {}
        since = w.get("current_since")
        current.append(
            {
                "number": r.number,
                "worker": w.get("worker_id", ""),
                "elapsed_s": now - float(since) if since else None,
                "timeout_s": timeout,
                "queued": not w,
            }
        )
    return {
        "evaluated": evaluated,
        "budget": budget,
        "left": left,
        "agent_state": GONE if stale else agent.get("state", ""),
        "in_this_run": bool(entry),
        "evaluated_this_run": this_run,
        "elapsed_s": elapsed,
        "per_hour": per_hour,
        "eta_s": eta,
        "trial_timeout_s": timeout,
        "current": current,
        "stale": stale,
        "acceptance": agent.get("acceptance") or {},
    }


def _stale(agent: dict[str, Any] | None, age: float | None) -> str:
    """Why a status file that says "running" cannot be believed, or ""."""
    if not agent or agent.get("state") != "running":
        return ""
    pid, host = agent.get("pid"), agent.get("host")
    if host == socket.gethostname() and isinstance(pid, int) and pid > 0:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return f"the agent (pid {pid} on {host}) is not running: it stopped without saying so"
        except PermissionError:
            pass
    # The agent rewrites the file at least once per trial timeout while it runs.
    limit = float(agent.get("trial_timeout_s") or 600.0) + 60.0
    if age is not None and age > limit:
        return (
            f"the agent last wrote its status {age:.0f} s ago (it writes at least every "
            f"{limit:.0f} s while it runs): it may have died or lost its storage"
        )
    return ""


def _invocations(data: dict[str, Any], rows: list[TrialRow], now: float) -> list[dict[str, Any]]:
    """Every agent invocation the status file recorded (oldest first), each with the trials that
    finished while it ran, by verdict; trials before the first recorded one come first, as
    "earlier": the counts add up to every trial in the storage."""
    runs = [dict(i) for i in data.get("invocations") or [] if i.get("started")]
    agent = data.get("agent")
    if (
        agent
        and agent.get("started")
        and not any(
            i.get("started") == agent.get("started") and i.get("pid") == agent.get("pid")
            for i in runs
        )
    ):
        runs.append(dict(agent))
    runs.sort(key=lambda i: float(i["started"]))
    starts = [float(i["started"]) for i in runs]
    buckets: list[dict[str, int]] = [{} for _ in range(len(runs) + 1)]

    for r in rows:
        t = r.finished or now  # unfinished: the latest invocation has it
        k = bisect.bisect_right(starts, t)  # 0: before the first recorded invocation
        buckets[k][r.verdict] = buckets[k].get(r.verdict, 0) + 1
    out = []
    if buckets[0]:
        out.append({"label": "earlier (not recorded)", "counts": buckets[0]})
    for i, run in enumerate(runs):
        counts = buckets[i + 1]
        out.append(
            {
                "label": f"{run.get('host', '?')} pid {run.get('pid', '?')}",
                "host": run.get("host"),
                "pid": run.get("pid"),
                "experiment": run.get("experiment"),
                "started": run.get("started"),
                "updated": run.get("updated"),
                "state": run.get("state"),
                "counts": counts,
            }
        )
    for o in out:
        o["total"] = sum(o["counts"].values())
    return out
