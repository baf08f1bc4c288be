"""Trials per GPU-hour: how many trials a worker (one device) evaluates per hour of its time.

A worker's device time is its trials' own seconds plus the gaps between consecutive trials (the
agent's ask and tell, a confirmation run between them), each gap counted up to ``IDLE_CAP_S``: a
longer one is the worker not being used (between two agent runs of a resumed study), not time
the tuning spent. Setup (load, sentinel, A/A runs) comes before the first trial and is not in
it; the run summary's ``run_trials_per_hour`` is the figure with it (trials / run wall time /
workers).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

IDLE_CAP_S = 60.0


@dataclass(frozen=True)
class WorkerRate:
    worker: str
    trials: int
    busy_s: float  # the trials' own seconds (compile, validate, bench)
    device_s: float  # busy_s plus the gaps between its trials (each up to IDLE_CAP_S)

    @property
    def trials_per_hour(self) -> float:
        return self.trials * 3600.0 / self.device_s if self.device_s > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "worker": self.worker,
            "trials": self.trials,
            "busy_s": round(self.busy_s, 3),
            "device_s": round(self.device_s, 3),
            "trials_per_hour": round(self.trials_per_hour, 1),
        }


def worker_rate(worker: str, spans: Iterable[tuple[float, float]]) -> WorkerRate:
    """The rate of one worker from its trials' (started, finished) times (unix or monotonic,
    one clock per worker); spans with no start (never dispatched) are left out."""
    done = sorted((s, f) for s, f in spans if s > 0 and f >= s)
    busy = sum(f - s for s, f in done)
    gaps = sum(
        min(IDLE_CAP_S, max(0.0, s - prev_f))
        for (_, prev_f), (s, _) in zip(done, done[1:], strict=False)
    )
    return WorkerRate(worker, len(done), busy, busy + gaps)


def rates(spans: Iterable[tuple[str, float, float]]) -> list[WorkerRate]:
    """Per worker, from (worker id, started, finished) of each trial."""
    by: dict[str, list[tuple[float, float]]] = {}
    for w, s, f in spans:
        by.setdefault(w, []).append((s, f))
    return [worker_rate(w, by[w]) for w in sorted(by)]


def per_gpu(workers: list[WorkerRate]) -> float:
    """Trials per hour of one device, over the fleet: all trials / all device hours."""
    device_s = sum(w.device_s for w in workers)
    return sum(w.trials for w in workers) * 3600.0 / device_s if device_s > 0 else 0.0


def summary(workers: list[WorkerRate], wall_s: float, n_workers: int) -> dict[str, Any]:
    """What the run summary, the status file and ``agent status --json`` report."""
    trials = sum(w.trials for w in workers)
    run = trials * 3600.0 / wall_s / n_workers if wall_s > 0 and n_workers else 0.0
    return {
        "trials_per_hour_per_gpu": round(per_gpu(workers), 1),
        "run_trials_per_hour_per_gpu": round(run, 1),
        "trials": trials,
        "workers": [w.to_dict() for w in workers],
    }
