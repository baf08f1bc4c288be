"""One agent per study: a lease held in the study's own storage (a study system attr), so every
agent that can reach the storage sees it, whatever host or Ray cluster it runs on.

    {"agent": id, "host", "pid", "experiment", "since", "heartbeat", "expires"}

An agent takes the lease of each of its studies before it touches their trials (resume marks a
previous holder's RUNNING trials interrupted only once the lease is its own) and renews it from a
heartbeat thread every ttl/4; it releases it on exit. A second agent finds a live lease and stops
with a line naming the holder, or waits (``--wait``), or takes it over (``--take-over``: the holder
sees that at its next heartbeat and stops without writing). A lease whose heartbeat expired, or
whose holder is a dead process on this host, is free.

Optuna's storages have no compare-and-set, so a take is written, left to settle and read back:
of two agents that start within the same instant, the last writer wins and the other sees it
(each heartbeat reads before it renews, so a lost lease is noticed within ttl/4 at worst).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import optuna

from engine.errors import EngineError

log = logging.getLogger(__name__)

KEY = "fleettune:lease"
TTL_S = 60.0
SETTLE_S = 0.5  # between writing a take and reading it back
ERROR, WAIT, TAKE_OVER = "error", "wait", "take-over"


class LeaseHeld(EngineError):
    """Another live agent holds a study's lease."""


class LeaseLost(EngineError):
    """This agent's lease was taken over (or could not be renewed before it expired)."""


@dataclass(frozen=True)
class Holder:
    agent: str
    host: str
    pid: int
    experiment: str
    since: float
    heartbeat: float
    expires: float
    pidns: str = ""  # where ``pid`` means something: boot id and PID namespace ("" unknown)

    @staticmethod
    def from_attr(v: Any) -> Holder | None:
        if not isinstance(v, dict) or not v.get("agent"):
            return None
        fields = Holder.__dataclass_fields__
        try:
            return Holder(**{k: v[k] for k in fields if k in v})
        except TypeError:  # a key missing: a lease we cannot read is held, until it expires
            return Holder(str(v["agent"]), "?", 0, "?", 0.0, 0.0, float(v.get("expires", 0.0)))

    def describe(self, now: float | None = None) -> str:
        now = time.time() if now is None else now
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.since))
        return (
            f"host {self.host} pid {self.pid} since {since} (experiment {self.experiment}; "
            f"heartbeat {max(0.0, now - self.heartbeat):.0f}s ago, "
            f"expires in {max(0.0, self.expires - now):.0f}s)"
        )

    def dead(self, now: float) -> bool:
        """Expired, or a process of this host (same boot, same PID namespace: containers sharing
        a hostname do not count) that is gone."""
        if self.expires < now:
            return True
        if self.host != socket.gethostname() or not self.pidns or self.pidns != pid_namespace():
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False


def pid_namespace() -> str:
    """This machine's boot id and this process's PID namespace ("" where /proc lacks them)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
        return f"{boot}:{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""


def holder_of(storage: optuna.storages.BaseStorage, study_id: int) -> Holder | None:
    return Holder.from_attr(storage.get_study_system_attrs(study_id).get(KEY))


class Leases:
    """The leases one agent holds (study name -> study id), renewed by a heartbeat thread."""

    def __init__(
        self,
        storage: optuna.storages.BaseStorage,
        experiment: str,
        ttl_s: float = TTL_S,
        mode: str = ERROR,
    ) -> None:
        if mode not in (ERROR, WAIT, TAKE_OVER):
            raise ValueError(f"lease mode {mode!r}")
        self.storage = storage
        self.experiment = experiment
        self.ttl_s = ttl_s
        self.mode = mode
        self.agent = uuid.uuid4().hex
        self.host = socket.gethostname()
        self.since = time.time()
        self.held: dict[str, int] = {}
        self.lost = ""  # why a lease is no longer ours ("" while all are)
        self.taken_over: dict[str, Holder] = {}  # study -> the live holder we took it from
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._expires = 0.0

    # --- taking ---------------------------------------------------------------------------
    def _mine(self, now: float) -> dict[str, Any]:
        h = Holder(
            self.agent,
            self.host,
            os.getpid(),
            self.experiment,
            self.since,
            now,
            now + self.ttl_s,
            pid_namespace(),
        )
        return asdict(h)

    def _study_id(self, name: str, directions: list[str]) -> int:
        try:
            return self.storage.get_study_id_from_name(name)
        except KeyError:
            study = optuna.create_study(
                study_name=name, storage=self.storage, directions=directions, load_if_exists=True
            )
            return study._study_id

    def acquire(self, names: Iterable[str], directions: list[str]) -> None:
        """Take the lease of every study named (creating a missing study, empty); raises
        LeaseHeld naming the holder of one that another live agent holds (mode "error")."""
        ids = {n: self._study_id(n, directions) for n in names}
        waiting_logged: set[str] = set()
        while True:
            now = time.time()
            taking: dict[str, int] = {}
            for name, sid in ids.items():
                if name in self.held:
                    continue
                h = holder_of(self.storage, sid)
                if h is None or h.agent == self.agent or h.dead(now):
                    taking[name] = sid
                elif self.mode == TAKE_OVER:
                    self.taken_over[name] = h
                    taking[name] = sid
                elif self.mode == WAIT:
                    if name not in waiting_logged:
                        log.info("study %s: waiting for the lease held by %s", name, h.describe())
                        waiting_logged.add(name)
                else:
                    raise LeaseHeld(
                        f"study {name} is in use by another agent: {h.describe(now)}; "
                        "run with --wait to wait for it, or --take-over if it is gone"
                    )
            for sid in taking.values():
                self.storage.set_study_system_attr(sid, KEY, self._mine(now))
            self._expires = now + self.ttl_s
            if taking:
                time.sleep(SETTLE_S)
            if self.taken_over.keys() & taking.keys():
                # A live holder notices at its next heartbeat (ttl/4) and stops writing: only then
                # may its RUNNING trials be marked interrupted.
                time.sleep(self.ttl_s / 2)
            for name, sid in taking.items():
                h = holder_of(self.storage, sid)
                if h is not None and h.agent == self.agent:
                    self.held[name] = sid
            if ids.keys() <= self.held.keys():
                self.renew()  # the settle (and take-over) wait used part of the ttl
                return
            time.sleep(min(self.ttl_s / 4, 5.0))

    # --- holding --------------------------------------------------------------------------
    def start(self) -> None:
        """Renew every ttl/4 from a daemon thread until ``release``."""
        self._thread = threading.Thread(target=self._beat, name="lease-heartbeat", daemon=True)
        self._thread.start()

    def _beat(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            self.renew()
            if self.lost:
                return

    def renew(self) -> None:
        now = time.time()
        try:
            for name, sid in self.held.items():
                h = holder_of(self.storage, sid)
                if h is None or h.agent != self.agent:
                    by = h.describe(now) if h else "nobody (released)"
                    self.lost = f"the lease of study {name} was taken over by {by}"
                    log.error("%s: stopping without further writes", self.lost)
                    return
            for sid in self.held.values():
                self.storage.set_study_system_attr(sid, KEY, self._mine(now))
            self._expires = now + self.ttl_s
        except Exception as e:  # noqa: BLE001 - storage briefly unreachable: retry next beat
            log.warning("lease heartbeat failed: %s", e)
            if time.time() > self._expires:
                self.lost = f"the study leases expired: storage unreachable ({e})"

    def check(self) -> None:
        """Raise LeaseLost once a lease is no longer this agent's."""
        if self.lost:
            raise LeaseLost(self.lost)

    def release(self) -> None:
        """Stop the heartbeat and free every lease still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        for sid in self.held.values():
            try:
                h = holder_of(self.storage, sid)
                if h is not None and h.agent == self.agent:
                    self.storage.set_study_system_attr(sid, KEY, None)
            except Exception as e:  # noqa: BLE001 - it expires by itself
                log.warning("lease not released (it expires in %.0fs): %s", self.ttl_s, e)
        self.held.clear()
