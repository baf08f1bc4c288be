"""A pytest plugin for the GPU suites: confine a device fault to the test that caused it.

A CUDA kernel fault (misaligned or illegal address, launch failure ...) or a lost Vulkan device
is sticky: every later call in the process fails, so one bad kernel turns the rest of a run into
errors. With FLEETTUNE_TEST_LOG set (scripts/gpu_suite.py sets it), each test's outcome is
appended there as a JSON line, and the first fault stops the session after the test that
raised it; the runner then starts a fresh process for the tests that did not run.
"""

from __future__ import annotations

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


def fault_of(text: str) -> str | None:
    """The first line of text that names a sticky device error, or None."""
    for line in text.splitlines():
        if STICKY.search(line):
            return line.strip()[:300]
    return None


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    path = os.environ.get("FLEETTUNE_TEST_LOG")
    if not path:
        return
    if report.when != "call" and report.outcome == "passed":
        return  # setup/teardown that passed says nothing; the call's report does
    fault = fault_of(report.longreprtext) if report.failed else None
    with open(path, "a", encoding="utf-8") as f:
        rec = {"nodeid": report.nodeid, "when": report.when, "outcome": report.outcome,
               "fault": fault}  # fmt: skip
        f.write(json.dumps(rec) + "\n")
    if fault is not None and "session" in _SESSION:
        _SESSION["session"].shouldstop = f"device fault in {report.nodeid}: {fault}"


_SESSION: dict[str, pytest.Session] = {}


def pytest_sessionstart(session: pytest.Session) -> None:
    _SESSION["session"] = session
