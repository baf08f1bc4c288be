"""What a call to a worker is for, and the order a worker's calls may come in: the agent's state
machine, written once. A leaf module (the fleet, the runner and the strategy all read it).

A worker is identified (INFO), loads each model (LOAD), measures A/A noise per model when its
device is new to the agent (AA), then evaluates: trials (TRIAL) and confirmations of accepted
ones (CONFIRM). A restarted worker starts again from INFO. A trial's own calls: TRIAL, then
CONFIRM when it was accepted and a confirmation is wanted; a call whose worker was lost from
outside is sent once more, in the same phase.
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

# A trial's next call given its last one: confirmed after, or retried once in the same phase.
TRIAL_NEXT: dict[Phase, frozenset[Phase]] = {
    Phase.TRIAL: frozenset({Phase.TRIAL, Phase.CONFIRM}),
    Phase.CONFIRM: frozenset({Phase.CONFIRM}),
}


def advance(last: Phase | None, nxt: Phase, table: dict = WORKER_NEXT) -> Phase:
    """``nxt``, after checking that it may follow ``last`` (an agent bug otherwise)."""
    if nxt not in table.get(last, frozenset()):
        raise AssertionError(f"a {nxt} call cannot follow a {last} call")
    return nxt
