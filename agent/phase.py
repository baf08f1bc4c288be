"""The agent's two state machines, written once: a worker's calls (``Phase``, ``WORKER_NEXT``)
and a trial's life (``TrialStage``, ``TRIAL_MOVES``). A leaf module (the fleet, the runners and
the strategy all read it); a move the tables do not allow raises ``IllegalTransition``.

A worker is identified (INFO), loads each model (LOAD), measures A/A noise per model when its
device is new to the agent (AA), then evaluates: trials (TRIAL) and confirmations of accepted
ones (CONFIRM). A restarted worker starts again from INFO.

A trial is ASKED of the sampler, RUNNING on a worker (or queued there), then FINISHED (recorded
and told); an accepted one that wants a confirmation waits (CONFIRM_WAIT) and is CONFIRMING on
a worker before it finishes. A call whose worker was lost is sent again (TRIAL_RETRY or
CONFIRM_RETRY, back to the same phase); a trial that will not run any more (stopped, its worker
retired, infeasible) finishes from wherever it is.
"""

from __future__ import annotations

from enum import StrEnum


class Phase(StrEnum):
    INFO = "info"
    LOAD = "load"
    AA = "aa"
    TRIAL = "trial"
    CONFIRM = "confirm"

    @property
    def setup(self) -> bool:
        """Before the worker evaluates anything (these calls carry no trial)."""
        return self in SETUP

    @property
    def evaluation(self) -> bool:
        return self in (Phase.TRIAL, Phase.CONFIRM)


SETUP = frozenset({Phase.INFO, Phase.LOAD, Phase.AA})

# A worker's next call given its last one (None: a fresh or restarted worker).
WORKER_NEXT: dict[Phase | None, frozenset[Phase]] = {
    None: frozenset({Phase.INFO}),
    Phase.INFO: frozenset({Phase.LOAD, Phase.TRIAL, Phase.CONFIRM}),
    Phase.LOAD: frozenset({Phase.LOAD, Phase.AA, Phase.TRIAL, Phase.CONFIRM}),
    Phase.AA: frozenset({Phase.AA, Phase.TRIAL, Phase.CONFIRM}),
    Phase.TRIAL: frozenset({Phase.TRIAL, Phase.CONFIRM}),
    Phase.CONFIRM: frozenset({Phase.TRIAL, Phase.CONFIRM}),
}


class IllegalTransition(AssertionError):
    """A move the state tables do not allow: a bug in the agent, never bad input."""


def advance(last: Phase | None, nxt: Phase) -> Phase:
    """A worker's ``nxt`` call, after checking that it may follow ``last``."""
    if nxt not in WORKER_NEXT.get(last, frozenset()):
        raise IllegalTransition(f"a {nxt} call cannot follow a {last} call")
    return nxt


class TrialStage(StrEnum):
    """Where a trial is in the agent (not Optuna's TrialState: that is told only at the end)."""

    ASKED = "asked"
    RUNNING = "running"
    TRIAL_RETRY = "trial_retry"  # its worker was lost: to be sent again as a trial
    CONFIRM_WAIT = "confirm_wait"  # accepted, waiting for a worker to confirm it
    CONFIRMING = "confirming"
    CONFIRM_RETRY = "confirm_retry"  # the confirming worker was lost: to be sent again
    FINISHED = "finished"

    @classmethod
    def sent(cls, phase: Phase) -> TrialStage:
        """The state of a trial whose ``phase`` call was just sent to a worker."""
        return {Phase.TRIAL: cls.RUNNING, Phase.CONFIRM: cls.CONFIRMING}[phase]

    @classmethod
    def retry(cls, phase: Phase) -> TrialStage:
        """The state of a trial whose ``phase`` call lost its worker and will be sent again."""
        return {Phase.TRIAL: cls.TRIAL_RETRY, Phase.CONFIRM: cls.CONFIRM_RETRY}[phase]


_T = TrialStage
TRIAL_MOVES: dict[TrialStage, frozenset[TrialStage]] = {
    _T.ASKED: frozenset({_T.RUNNING, _T.FINISHED}),  # finished: infeasible here, or stopped
    _T.RUNNING: frozenset({_T.FINISHED, _T.CONFIRM_WAIT, _T.TRIAL_RETRY}),
    _T.TRIAL_RETRY: frozenset({_T.RUNNING, _T.FINISHED}),
    _T.CONFIRM_WAIT: frozenset({_T.CONFIRMING, _T.FINISHED}),
    _T.CONFIRMING: frozenset({_T.FINISHED, _T.CONFIRM_RETRY}),
    _T.CONFIRM_RETRY: frozenset({_T.CONFIRMING, _T.FINISHED}),
    _T.FINISHED: frozenset(),
}


def move(trial: int, last: TrialStage | None, nxt: TrialStage) -> TrialStage:
    """Trial ``trial``'s next state, after checking the move (None: not asked by this agent)."""
    if last is None or nxt not in TRIAL_MOVES[last]:
        raise IllegalTransition(f"trial {trial}: {last or 'unknown'} -> {nxt} is not a move")
    return nxt
