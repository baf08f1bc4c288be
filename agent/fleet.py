"""The agent's view of the fleet: one slot per device of each class, each holding a worker (a Ray
actor that agent.runner.Fleet restarts in place when it dies or hangs, or agent.local's
in-process evaluator); and the fleet status file the dashboard reads. Imports no Ray.

Status file (JSON, rewritten atomically on every change; path from ``StorageRef.status_path``):
``{"agent": {...}, "workers": [...], "studies": [...]}`` -- keys in docs/agent.md.
"""

from __future__ import annotations

import json
import os
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.phase import Phase
from agent.throughput import worker_rate
from worker.records import WorkerInfo

STARTING, IDLE, BUSY, DEAD = "starting", "idle", "busy", "dead"
MAX_RESTARTS_IN_A_ROW = 4  # a slot whose worker keeps dying without one good result is retired


@dataclass
class Slot:
    worker_id: str
    device_class: str
    backends: tuple[str, ...]  # candidates for this class, in experiment order
    backend_index: int = 0
    actor: Any = None
    state: str = STARTING
    info: WorkerInfo | None = None
    noise: dict[str, dict[str, float]] = field(default_factory=dict)  # model -> objective -> A/A
    setup: list[tuple[Phase, str]] = field(default_factory=list)  # (INFO|LOAD|AA, model)
    phase: Phase | None = None  # its worker's last call (agent.phase.WORKER_NEXT)
    restarts: int = 0
    failures_in_a_row: int = 0
    trials_done: int = 0
    free_since: float = 0.0  # monotonic time it last became idle
    last_finished: float = 0.0  # worker clock: end of its last evaluation (0: none since start)
    current: str = ""  # "<study> #<trial>" while busy
    resubmit: list[Any] = field(default_factory=list)  # calls queued on a worker that died
    restart_at: float = 0.0  # monotonic time a worker lost to infrastructure starts again
    infra_losses: int = 0  # losses to infrastructure in a row (agent.infra), for the backoff
    spans: list[tuple[float, float]] = field(default_factory=list)  # its trials' (start, end)
    _since: tuple[str, float] = ("", 0.0)  # (current, wall time it was first seen) for status

    @property
    def backend(self) -> str:
        return self.backends[self.backend_index]

    def status(self) -> dict[str, Any]:
        # The agent writes its status on every turn of its loop: the first write that shows a
        # new current trial dates it (the dashboard shows its elapsed time against the timeout).
        if self.current != self._since[0]:
            self._since = (self.current, time.time())
        return {
            "worker_id": self.worker_id,
            "device_class": self.device_class,
            "backend": self.backend if self.backend_index < len(self.backends) else "",
            "state": self.state,
            "current": self.current,
            "current_since": self._since[1] if self.current else None,
            "restarts": self.restarts,
            "trials_done": self.trials_done,
            "noise": self.noise,
            "info": self.info.to_dict() if self.info else None,
            "throughput": worker_rate(self.worker_id, self.spans).to_dict(),
        }


def setup_calls(models: tuple[str, ...], fresh: bool) -> list[tuple[Phase, str]]:
    """A (re)started worker's calls before its first evaluation: identify, load each model, and
    on a device new to the agent measure A/A noise per model (a restarted one keeps its noise)."""
    calls = [(Phase.INFO, "")] + [(Phase.LOAD, m) for m in models]
    return calls + [(Phase.AA, m) for m in models] if fresh else calls


def write_status(path: Path, payload: dict[str, Any]) -> None:
    """Atomic JSON write (readers never see half a file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(payload, indent=1, default=str))
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)  # a write cut short (a full disk) leaves no orphan


def remove_stale_temps(path: Path) -> list[Path]:
    """Remove temp files of ``path`` left by writers that are gone (killed mid-write, before
    write_status cleaned up after itself); returns those removed."""
    removed = []
    for tmp in path.parent.glob(f".{path.name}.*.tmp"):
        pid = tmp.name[len(path.name) + 2 : -len(".tmp")]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            tmp.unlink(missing_ok=True)
            removed.append(tmp)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


MAX_INVOCATIONS = 200  # the status file keeps this many past agent runs, for the dashboard
INVOCATION_KEYS = ("host", "pid", "experiment", "started", "updated", "state")


def past_invocations(path: Path, started: float) -> list[dict[str, Any]]:
    """The agent runs an earlier status file at ``path`` recorded (its own list, then its own
    agent entry), without this run's (``started``); [] when there is none or it is unreadable."""
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return []
    runs = [dict(i) for i in data.get("invocations") or [] if isinstance(i, dict)]
    agent = data.get("agent")
    if isinstance(agent, dict) and not any(
        i.get("started") == agent.get("started") and i.get("pid") == agent.get("pid") for i in runs
    ):
        runs.append(dict(agent))
    runs = [{k: i.get(k) for k in INVOCATION_KEYS} for i in runs if i.get("started") != started]
    return runs[-MAX_INVOCATIONS:]


def agent_status(experiment: str, storage: str, started: float, state: str) -> dict[str, Any]:
    return {
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "experiment": experiment,
        "storage": storage,
        "started": started,
        "updated": time.time(),
        "state": state,
    }
