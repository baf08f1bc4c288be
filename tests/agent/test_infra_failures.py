"""Infrastructure is not the config (issue 30): a worker killed by Ray's memory monitor (another
process filled the node), a node lost, a result lost with its node are retried with backoff,
never charged to the budget and never told to the sampler; a worker that died with no outside
cause keeps the retry-once rule. The Ray runner's handling, without starting Ray."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest
import ray

from agent import runner as runner_mod
from agent.dispatch import Pending
from agent.fleet import DEAD, IDLE, STARTING
from agent.infra import INFRA_TRIES, infrastructure_cause
from agent.phase import Phase, TrialStage
from agent.runner import Fleet, RayRunner
from worker.records import Outcome

OOM = ray.exceptions.OutOfMemoryError(
    "Task was killed due to the node running low on memory. Memory on the node (IP: 10.0.0.2) "
    "was 15.2GB / 16GB (0.95), which exceeds the memory usage threshold of 0.95."
)


class Study:
    name = "e/cpu-sim/m"

    def __init__(self) -> None:
        self.moves: list[tuple[int, TrialStage]] = []
        self.best = SimpleNamespace(trial=0)

    def move(self, number: int, stage: TrialStage) -> None:
        self.moves.append((number, stage))


class Strategy:
    def __init__(self) -> None:
        self.lost_calls: list[tuple[Outcome, str]] = []  # what the strategy would record
        self.abandoned: list[str] = []

    def lost(self, p: Pending, outcome: Outcome, reason: str) -> None:
        self.lost_calls.append((outcome, reason))

    def abandon(self, p: Pending, reason: str) -> None:
        self.abandoned.append(reason)

    def dispatch_work(self, slot: Any) -> bool:
        return False


class Actor:
    def __getattr__(self, name: str) -> Any:
        return SimpleNamespace(remote=lambda *a, **k: f"ref-{name}")


@pytest.fixture
def runner(monkeypatch: pytest.MonkeyPatch) -> RayRunner:
    r = RayRunner(Strategy(), ("m",), 60.0, [])
    r.fleet = Fleet({"cpu-sim": 2}, {"cpu-sim": ("numpy",)}, None, "c")
    for s in r.fleet.slots:
        s.actor, s.state = Actor(), IDLE
    monkeypatch.setattr(runner_mod, "spawn", lambda *a, **k: Actor())
    monkeypatch.setattr(runner_mod.ray, "kill", lambda *a, **k: None)  # would start Ray
    return r


def _trial(slot: Any, study: Study) -> Pending:
    trial = SimpleNamespace(number=3)
    return Pending(Phase.TRIAL, slot, "ref", 0.0, float("inf"), "m", study, trial, {"k": 1})


def _raises(monkeypatch: pytest.MonkeyPatch, e: BaseException) -> None:
    def get(ref: Any) -> Any:
        raise e

    monkeypatch.setattr(runner_mod.ray, "get", get)


def test_outside_causes_are_told_apart_from_the_configs() -> None:
    assert "memory monitor" in infrastructure_cause(OOM)
    assert infrastructure_cause(ray.exceptions.NodeDiedError("node x died")) == "its node died"
    died = ray.exceptions.RayActorError(
        error_msg="The actor is dead because its worker process has died. "
        "Worker exit type: NODE_OUT_OF_MEMORY Worker exit detail: Task was killed due to the "
        "node running low on memory."
    )
    assert "memory monitor" in infrastructure_cause(died)
    assert infrastructure_cause(ray.exceptions.RayActorError(preempted=True)) is not None
    # what Ray 2.60 raised when a node was removed under a running call (ray.cluster_utils)
    gone = ray.exceptions.ActorUnavailableError(
        "The actor is temporarily unavailable: RpcError: RPC error: Socket closed rpc_code: 14.",
        None,
    )
    assert infrastructure_cause(gone) == "its worker was unreachable"
    # a worker that died with no outside cause named: may be the config (a segfault)
    assert infrastructure_cause(ray.exceptions.ActorDiedError()) is None
    # an error raised inside the engine, device memory included: the config's
    inner = ray.exceptions.RayTaskError("evaluate", "tb", RuntimeError("Out of memory"))
    assert infrastructure_cause(inner) is None


def test_a_memory_monitor_kill_is_retried_with_backoff_and_never_charged(
    runner: RayRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The issue's run: an OOM kill from outside turned 10 trials into crashes in a second,
    spent the budget and taught the sampler those configs fail."""
    strategy = runner.strategy
    a, b = runner.slots
    study = Study()
    p = _trial(a, study)
    _raises(monkeypatch, OOM)
    now = time.monotonic()
    runner._handle(p, now)
    assert strategy.lost_calls == [] and strategy.abandoned == []  # nothing recorded as failed
    assert study.moves == [(3, TrialStage.TRIAL_RETRY)] and p.infra_tries == 1
    assert b.resubmit == [p]  # sent again on the other live worker
    assert a.actor is None and a.state == STARTING and a.restart_at >= now + 1.0  # backoff
    a.restart_at = now - 1  # its backoff over: started again at the next dispatch
    b.resubmit.clear()
    runner.dispatch_idle()
    assert a.restart_at == 0.0 and a.actor is not None and a.restarts == 1
    # lost to infrastructure every time: given up as interrupted (no budget, config free)
    for _ in range(INFRA_TRIES - 1):
        runner._handle(p, time.monotonic())
    assert strategy.lost_calls == []
    (why,) = strategy.abandoned
    assert f"lost to infrastructure {INFRA_TRIES} times" in why and "not the config" in why


def test_a_worker_death_with_no_outside_cause_keeps_the_retry_once_rule(
    runner: RayRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = runner.slots
    p = _trial(a, Study())
    _raises(monkeypatch, ray.exceptions.ActorDiedError())
    runner._handle(p, time.monotonic())
    assert p.lost and b.resubmit == [p] and not a.restart_at
    p.slot = b
    b.resubmit.clear()
    runner._handle(p, time.monotonic())
    ((outcome, reason),) = runner.strategy.lost_calls
    assert outcome is Outcome.CRASH and "lost once before and retried" in reason


def test_a_worker_lost_to_infrastructure_again_and_again_is_retired(
    runner: RayRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    from agent.infra import INFRA_LOSSES_IN_A_ROW

    a, _ = runner.slots
    _raises(monkeypatch, OOM)
    for _ in range(INFRA_LOSSES_IN_A_ROW):
        runner._handle(Pending(Phase.LOAD, a, "ref", 0.0, float("inf"), "m"), time.monotonic())
    assert a.state == DEAD and "losses to infrastructure in a row" in runner.warnings[-1]


def test_the_runner_waits_out_a_backoff_instead_of_ending(runner: RayRunner) -> None:
    a, _ = runner.slots
    a.restart_at = time.monotonic() + 0.2
    t0 = time.monotonic()
    assert runner.wait() is True and time.monotonic() - t0 >= 0.15
