"""A storage outage during a run (PostgreSQL stopped or restarting, a journal on a full disk or
made read-only) is retried with backoff; when it lasts, one ``StorageDown`` names the storage.

``retrying`` wraps the agent's Optuna storage in place (it stays the same object, so Optuna's
own wrapping of an RDBStorage still applies): every storage call that fails for an outage is
tried again after RETRY_DELAYS_S; once they are spent the storage is down, and every later call
fails at once (the agent's cleanup must not wait out the backoff again for each write).

A failed write did not happen (the journal cuts a failed append back, PostgreSQL rolls the
transaction back), so trying it again is safe; a retried tell that finds its trial finished was
the one that committed before the connection dropped.
"""

from __future__ import annotations

import errno
import functools
import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import optuna
from optuna.exceptions import UpdateFinishedTrialError

from agent.storage import StorageError

log = logging.getLogger("agent.storage")

RETRY_DELAYS_S: tuple[float, ...] = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)  # ~30 s in all
OUTAGE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EPERM, errno.EACCES}
T = TypeVar("T")


class StorageDown(StorageError):
    """The storage failed every try over the backoff: the run stops (exit 2)."""


def outage(e: BaseException) -> str | None:
    """What makes ``e`` (or an exception it was raised from) a storage outage, in a few words;
    None for any other error (a bug or bad data, which a retry would not fix)."""
    import sqlalchemy.exc as sa

    seen: set[int] = set()
    cur: BaseException | None = e
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in OUTAGE_ERRNOS:
            return f"{cur.strerror or errno.errorcode.get(cur.errno or 0, 'I/O error')}"
        if isinstance(cur, (sa.OperationalError, sa.InterfaceError)) or (
            isinstance(cur, sa.DBAPIError) and cur.connection_invalidated
        ):
            orig = getattr(cur, "orig", None) or cur
            text = str(orig).strip()
            return text.splitlines()[0][:200] if text else type(orig).__name__
        cur = cur.__cause__ or cur.__context__
    return None


class Retrier:
    """The retry state of one storage: ``down`` holds why once the backoff is spent."""

    def __init__(self, display: str, delays: Sequence[float] | None = None) -> None:
        self.display = display
        self.delays = tuple(RETRY_DELAYS_S if delays is None else delays)
        self.down: str | None = None
        self._lock = threading.Lock()

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        if self.down:
            raise StorageDown(self.down)
        t0 = time.monotonic()
        for attempt in range(len(self.delays) + 1):
            try:
                return fn(*args, **kwargs)
            except UpdateFinishedTrialError:
                if attempt == 0 or what != "set_trial_state_values":
                    raise
                return True  # type: ignore[return-value] - the failed try had committed
            except StorageDown:
                raise
            except Exception as e:
                why = outage(e)
                if why is None:
                    raise
                if attempt == len(self.delays):
                    with self._lock:
                        self.down = self.down or (
                            f"storage {self.display} failed {attempt + 1} times over "
                            f"{time.monotonic() - t0:.0f} s ({what}: {why})"
                        )
                    raise StorageDown(self.down) from None
                log.warning(
                    "storage %s: %s failed (%s); trying again in %.1f s",
                    self.display,
                    what,
                    why,
                    self.delays[attempt],
                )
                time.sleep(self.delays[attempt])
                if self.down:
                    raise StorageDown(self.down) from None
        raise AssertionError("unreachable")


def retrying(
    storage: optuna.storages.BaseStorage, display: str, delays: Sequence[float] | None = None
) -> Retrier:
    """Make every public method of ``storage`` retry outages (in place); returns its Retrier."""
    retrier = Retrier(display, delays)
    for name in dir(optuna.storages.BaseStorage):
        if name.startswith("_"):
            continue
        method = getattr(storage, name, None)
        if callable(method):
            setattr(storage, name, _wrapped(retrier, name, method))
    storage.retrier = retrier  # type: ignore[attr-defined]
    return retrier


def _wrapped(retrier: Retrier, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def call(*args: Any, **kwargs: Any) -> Any:
        return retrier.call(name, method, *args, **kwargs)

    return call
