"""A pytest plugin for the GPU suites: confine a device fault or a hang to the test that caused it.

A CUDA kernel fault (misaligned or illegal address, launch failure ...) or a lost Vulkan device
is sticky: every later call in the process fails, so one bad kernel turns the rest of a run into
errors; a hung kernel stops the run outright. With FLEETTUNE_TEST_LOG set (tools/gpu_suite.py
sets it), each test's start and outcome are appended there as JSON lines, and the first fault
stops the session after the test that raised it. With FLEETTUNE_TEST_TIMEOUT (seconds) set, a
test that runs longer ends the process (faulthandler prints where it hung); the log's last
"start" without an outcome names it. The runner then starts a fresh process for the tests that
did not run.
"""

from __future__ import annotations

import faulthandler
import json
import os
import re

import pytest

# Errors after which the context (CUDA) or device (Vulkan) is unusable; an out-of-memory error
# or a compile error is not among them.
STICKY = re.compile(
    r"CUDA_ERROR_(MISALIGNED_ADDRESS|ILLEGAL_ADDRESS|ILLEGAL_INSTRUCTION|LAUNCH_FAILED"
    r"|HARDWARE_STACK_ERROR|INVALID_PC|ASSERT|LAUNCH_TIMEOUT)"
    r"|cudaError(MisalignedAddress|IllegalAddress|LaunchFailure|IllegalInstruction)"
    r"|VK_ERROR_DEVICE_LOST|ErrorDeviceLost"
)
_SESSION: dict[str, pytest.Session] = {}


def fault_of(text: str) -> str | None:
    """The first line of text that names a sticky device error, or None."""
    for line in text.splitlines():
        if STICKY.search(line):
            return line.strip()[:300]
    return None


def _log(rec: dict) -> None:
    path = os.environ.get("FLEETTUNE_TEST_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(rec) + "\n")


def pytest_sessionstart(session: pytest.Session) -> None:
    _SESSION["session"] = session


def pytest_runtest_logstart(nodeid: str, location: tuple) -> None:
    _log({"nodeid": nodeid, "when": "start"})
    timeout = float(os.environ.get("FLEETTUNE_TEST_TIMEOUT") or 0)
    if timeout > 0:
        faulthandler.dump_traceback_later(timeout, exit=True)


def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    faulthandler.cancel_dump_traceback_later()


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not os.environ.get("FLEETTUNE_TEST_LOG"):
        return
    if report.when != "call" and report.outcome == "passed":
        return  # setup/teardown that passed says nothing; the call's report does
    fault = fault_of(report.longreprtext) if report.failed else None
    _log({"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome, "fault": fault})
    if fault is not None and "session" in _SESSION:
        _SESSION["session"].shouldstop = f"device fault in {report.nodeid}: {fault}"
