"""The dashboard in a real browser: headless Chromium (Debian package ``chromium``) loads every page
from ``python -m agent.dashboard``, driven over the DevTools protocol by a small websocket client
(stdlib only). Checks that every plot rendered (its div holds plotly's svg), that the console has
no errors, and saves a full-page screenshot of each page under the pytest tmp dir
(``<basetemp>/dashboard-screenshots``) or ``$FLEETTUNE_SCREENSHOTS``."""

from __future__ import annotations

import base64
import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.test_dashboard import REAL, ROOT, SYNTH, build_storage

CHROMIUM = Path("/usr/bin/chromium")
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)

pytestmark = pytest.mark.skipif(
    not CHROMIUM.exists(),
    reason="/usr/bin/chromium absent: install the Debian package `chromium` (./dev setup does)",
)


class DevTools:
    """A minimal Chrome DevTools Protocol client over one websocket (RFC 6455, client side)."""

    def __init__(self, ws_url: str, timeout: float = 60.0) -> None:
        rest = ws_url.removeprefix("ws://")
        hostport, _, path = rest.partition("/")
        host, _, port = hostport.partition(":")
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.sock.sendall(
            (
                f"GET /{path} HTTP/1.1\r\nHost: {hostport}\r\nUpgrade: websocket\r\n"
                f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                "Sec-WebSocket-Version: 13\r\n\r\n"
            ).encode()
        )
        head = b""
        while b"\r\n\r\n" not in head:
            chunk = self.sock.recv(1)
            if not chunk:
                raise ConnectionError("DevTools closed the connection during the handshake")
            head += chunk
        if b" 101 " not in head.split(b"\r\n", 1)[0]:
            raise ConnectionError(f"websocket handshake refused: {head!r}")
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def _read(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("DevTools connection closed")
            buf += chunk
        return bytes(buf)

    def _send_frame(self, opcode: int, payload: bytes) -> None:
        n = len(payload)
        head = bytes([0x80 | opcode])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 1 << 16:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        mask = os.urandom(4)
        body = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
        self.sock.sendall(head + mask + body)

    def _recv_message(self) -> dict[str, Any]:
        data = b""
        while True:
            b0, b1 = self._read(2)
            n = b1 & 0x7F
            if n == 126:
                (n,) = struct.unpack(">H", self._read(2))
            elif n == 127:
                (n,) = struct.unpack(">Q", self._read(8))
            mask = self._read(4) if b1 & 0x80 else b""
            payload = self._read(n)
            if mask:
                payload = bytes(b ^ mask[i % 4] for i, b in enumerate(payload))
            opcode = b0 & 0x0F
            if opcode == 0x9:  # ping
                self._send_frame(0xA, payload)
                continue
            if opcode == 0x8:
                raise ConnectionError("DevTools closed the websocket")
            data += payload
            if b0 & 0x80:  # FIN
                return json.loads(data)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        my_id = self.next_id
        self._send_frame(
            0x1, json.dumps({"id": my_id, "method": method, "params": params}).encode()
        )
        while True:
            msg = self._recv_message()
            if msg.get("id") == my_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            if "method" in msg:
                self.events.append(msg)

    def wait_event(self, method: str, timeout: float = 60.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        for i, ev in enumerate(self.events):
            if ev["method"] == method:
                return self.events.pop(i)
        while time.monotonic() < deadline:
            msg = self._recv_message()
            if msg.get("method") == method:
                return msg
            if "method" in msg:
                self.events.append(msg)
        raise TimeoutError(f"no {method} within {timeout}s")

    def evaluate(self, expression: str) -> Any:
        r = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        return r["result"].get("value")

    def close(self) -> None:
        self.sock.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_http(url: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


@pytest.fixture(scope="module")
def dashboard_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    storage = build_storage(tmp_path_factory.getbasetemp() / "dashboard-storage")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent.dashboard", "--storage", str(storage), "--port", str(port)],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_http(f"http://127.0.0.1:{port}/api/stamp")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=20)


@pytest.fixture(scope="module")
def browser() -> Iterator[DevTools]:
    profile = tempfile.mkdtemp(prefix="ft-chromium-")
    proc = subprocess.Popen(
        [
            str(CHROMIUM),
            *FLAGS,
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            "--window-size=1400,1000",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file = Path(profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"chromium did not start (exit {proc.poll()})")
            time.sleep(0.2)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
            pages = [t for t in json.loads(r.read()) if t["type"] == "page"]
        dt = DevTools(pages[0]["webSocketDebuggerUrl"])
        for domain in ("Page", "Runtime", "Log"):
            dt.call(f"{domain}.enable")
        dt.call(
            "Emulation.setDeviceMetricsOverride",
            width=1400,
            height=1000,
            deviceScaleFactor=1,
            mobile=False,
        )
        yield dt
        dt.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


def _errors(events: list[dict[str, Any]]) -> list[str]:
    out = []
    for ev in events:
        p = ev.get("params", {})
        if ev["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
            out.append("console: " + " ".join(str(a.get("value", a)) for a in p.get("args", [])))
        elif ev["method"] == "Runtime.exceptionThrown":
            d = p.get("exceptionDetails", {})
            out.append("exception: " + str(d.get("exception", {}).get("description", d)))
        elif ev["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
            e = p["entry"]
            out.append(f"log: {e.get('text')} {e.get('url', '')}")
    return out


PLOTS_DONE = """(() => {
  const divs = [...document.querySelectorAll('[data-figure], [data-src]')];
  const pending = divs.filter(d => !(d.querySelector('svg.main-svg') || d.dataset.loaded));
  return {plots: divs.length, pending: pending.map(d => d.id),
          svg: divs.filter(d => d.querySelector('svg.main-svg')).map(d => d.id)};
})()"""

PAGES = (
    ("fleet", "/", 0),
    ("studies", "/studies", 0),
    ("study-real", f"/studies/{REAL}", 2),
    ("study-synthetic", f"/studies/{SYNTH}", 2),
    ("trial-real", f"/studies/{REAL}/trials/1", 1),
    ("trial-invalid", f"/studies/{SYNTH}/trials/{{invalid}}", 0),
    ("promotions", "/promotions", 0),
)


def test_every_page_renders_in_chromium(
    browser: DevTools, dashboard_url: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    # FLEETTUNE_SCREENSHOTS=out/dashboard keeps them somewhere stable (out/ is git-ignored).
    where = os.environ.get("FLEETTUNE_SCREENSHOTS")
    shots = Path(where) if where else tmp_path_factory.getbasetemp() / "dashboard-screenshots"
    shots.mkdir(parents=True, exist_ok=True)
    with urllib.request.urlopen(
        f"{dashboard_url}/api/studies/{SYNTH}/trials?outcome=invalid&per_page=1", timeout=10
    ) as r:
        invalid = json.loads(r.read())["rows"][0]["number"]
    problems = []
    for label, path, n_plots in PAGES:
        url = dashboard_url + path.format(invalid=invalid)
        browser.events.clear()
        browser.call("Page.navigate", url=url)
        browser.wait_event("Page.loadEventFired")
        deadline = time.monotonic() + 60
        state = browser.evaluate(PLOTS_DONE)
        while state["pending"] and time.monotonic() < deadline:
            time.sleep(0.3)
            state = browser.evaluate(PLOTS_DONE)
        assert state["plots"] == n_plots, f"{label}: {state}"
        assert len(state["svg"]) == n_plots, f"{label}: plots without svg: {state}"
        assert browser.evaluate("document.querySelector('h1') !== null"), label
        shot = browser.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
        (shots / f"{label}.png").write_bytes(base64.b64decode(shot["data"]))
        browser.call("Runtime.evaluate", expression="1")  # drain late console events
        problems += [f"{label} ({url}): {e}" for e in _errors(browser.events)]
    print(f"screenshots: {shots}")
    assert not problems, "\n".join(problems)
    assert all((shots / f"{label}.png").stat().st_size > 10_000 for label, _, _ in PAGES)


def test_a_missing_page_shows_its_message(browser: DevTools, dashboard_url: str) -> None:
    browser.events.clear()
    browser.call("Page.navigate", url=f"{dashboard_url}/studies/no/such/study")
    browser.wait_event("Page.loadEventFired")
    text = browser.evaluate("document.getElementById('message').textContent")
    assert "no study named 'no/such/study'" in text
    # The error collector sees what the page test must not: the 404 is logged as an error.
    browser.call("Runtime.evaluate", expression="console.error('planted')")
    errors = _errors(browser.events)
    assert any("404" in e for e in errors) and any("planted" in e for e in errors), errors
