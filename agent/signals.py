"""Stopping a run cleanly: SIGTERM (``ray job stop``, systemd, kill) ends it like Ctrl-C, and
both wait for the end of a storage write (``signals_held``); the CLI reads which one stopped it."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# The SIGTERM that stopped this process, if one did: the KeyboardInterrupt stop_on_sigterm raises
# can reach the CLI re-raised without its message (seen with a trial in flight), so the exit
# code (143, not Ctrl-C's 130) is read from here.
_SIGTERM_SEEN: list[int] = []


def stopped_by_sigterm(e: BaseException) -> bool:
    """Whether the KeyboardInterrupt e ending a run came from SIGTERM rather than Ctrl-C."""
    return str(e) == f"signal {signal.SIGTERM}" or bool(_SIGTERM_SEEN)


@contextmanager
def stop_on_sigterm(ignore: bool = False) -> Iterator[None]:
    """SIGTERM (``ray job stop``, systemd, kill) ends the run like Ctrl-C: a KeyboardInterrupt,
    so the agent cleans up; with ``ignore``, both are held off during the cleanup itself."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        _SIGTERM_SEEN.append(signum)
        raise KeyboardInterrupt(f"signal {signum}")

    handler = signal.SIG_IGN if ignore else stop
    old_term = signal.signal(signal.SIGTERM, handler)
    old_int = signal.signal(signal.SIGINT, signal.SIG_IGN) if ignore else None
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old_term)
        if old_int is not None:
            signal.signal(signal.SIGINT, old_int)


@contextmanager
def signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait for the end of the block, then act as they would have: the agent's
    storage writes (Optuna's journal takes a file lock and renames files) are not interrupted
    half way. A SIGTERM inside the journal's lock release once left the agent exiting 1 on a
    FileNotFoundError instead of 143 with its trials recorded as interrupted."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []

    def hold(signum: int, frame: Any) -> None:
        got.append(signum)

    old = {s: signal.signal(s, hold) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        for s in got[:1]:  # the first one, as its own handler would have taken it
            if callable(old[s]):
                old[s](s, None)
            elif old[s] == signal.SIG_DFL:
                signal.raise_signal(s)
