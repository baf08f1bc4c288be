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

from agent.dashboard.synthetic import write_storage
from agent.fleet import write_status
from tests.agent.dashboard.test_dashboard import REAL, ROOT, SYNTH, build_storage

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

    def evaluate(self, expression: str, await_promise: bool = False) -> Any:
        r = self.call(
            "Runtime.evaluate",
            expression=expression,
            returnByValue=True,
            awaitPromise=await_promise,
        )
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


def _serve(storage: Path) -> Iterator[str]:
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
def dashboard_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A finished agent run, plus the synthetic study (every trial state, a running one)."""
    yield from _serve(build_storage(tmp_path_factory.getbasetemp() / "dashboard-storage"))


@pytest.fixture(scope="module")
def running_storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A synthetic storage whose status file says an agent is running it now."""
    db = tmp_path_factory.mktemp("running") / "studies.db"
    write_storage(str(db), 30)
    return db


@pytest.fixture(scope="module")
def running_url(running_storage: Path) -> Iterator[str]:
    yield from _serve(running_storage)


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # FLEETTUNE_SCREENSHOTS=out/dashboard keeps them somewhere stable (out/ is git-ignored).
    where = os.environ.get("FLEETTUNE_SCREENSHOTS")
    path = Path(where) if where else tmp_path_factory.getbasetemp() / "dashboard-screenshots"
    path.mkdir(parents=True, exist_ok=True)
    return path


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
    # label, path ({outcome} is a trial of that outcome in the synthetic study), plot divs, and
    # how many of them draw (a study page: history, importances, Pareto front with two
    # objectives, parallel coordinates; the real study's few trials give importances a caveat)
    ("finished-fleet", "/", 1, 1),  # the workers' trials per GPU-hour (agent.throughput)
    ("finished-studies", "/studies", 0, 0),
    ("finished-study-real", f"/studies/{REAL}", 4, 3),
    ("finished-trial-real", f"/studies/{REAL}/trials/1", 1, 1),
    ("study-synthetic", f"/studies/{SYNTH}", 4, 4),
    ("study-accepted-filter", f"/studies/{SYNTH}?outcome=accepted", 4, 4),
    # a synthetic trial of each outcome: only a measured one (baseline, accepted, rejected)
    # draws its plot
    *(
        (f"trial-{o}", f"/studies/{SYNTH}/trials/{{{o}}}", n, n)
        for o, n in (
            ("baseline", 1),
            ("accepted", 1),
            ("rejected", 1),
            ("running", 0),
            ("duplicate", 0),
            ("interrupted", 0),
            ("failed", 0),
            ("invalid", 0),
        )
    ),
    ("promotions", "/promotions", 0, 0),
)
STATES = ("baseline", "accepted", "rejected", "running", "duplicate", "interrupted", "failed")


def _first(url: str, study: str, outcome: str) -> int:
    q = f"{url}/api/studies/{study}/trials?outcome={outcome}&per_page=1"
    with urllib.request.urlopen(q, timeout=10) as r:
        return int(json.loads(r.read())["rows"][0]["number"])


def _visit(
    browser: DevTools, url: str, n_plots: int, n_svg: int, label: str, shots: Path
) -> list[str]:
    """Load a page, wait for its plots, screenshot it; the console errors it logged."""
    browser.events.clear()
    browser.call("Page.navigate", url=url)
    browser.wait_event("Page.loadEventFired")
    deadline = time.monotonic() + 60
    state = browser.evaluate(PLOTS_DONE)
    while state["pending"] and time.monotonic() < deadline:
        time.sleep(0.3)
        state = browser.evaluate(PLOTS_DONE)
    assert state["plots"] == n_plots, f"{label}: {state}"
    assert len(state["svg"]) == n_svg, f"{label}: plots without svg: {state}"
    assert browser.evaluate("document.querySelector('h1') !== null"), label
    _shot(browser, shots, label)
    browser.call("Runtime.evaluate", expression="1")  # drain late console events
    return [f"{label} ({url}): {e}" for e in _errors(browser.events)]


def _shot(browser: DevTools, shots: Path, label: str) -> None:
    shot = browser.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)
    (shots / f"{label}.png").write_bytes(base64.b64decode(shot["data"]))


def _text(browser: DevTools, selector: str) -> str:
    return str(browser.evaluate(f"document.querySelector({json.dumps(selector)})?.innerText ?? ''"))


def test_every_page_renders_in_chromium(browser: DevTools, dashboard_url: str, shots: Path) -> None:
    trials = {o: _first(dashboard_url, SYNTH, o) for o in (*STATES, "invalid")}
    problems = []
    for label, path, n_plots, n_svg in PAGES:
        url = dashboard_url + path.format(**trials)
        problems += _visit(browser, url, n_plots, n_svg, label, shots)
        if label == "finished-study-real":  # too few trials: a caveat, not an error
            assert "about 10 or more" in _text(browser, "#importances"), label
        if label.startswith("trial-") and label != "trial-invalid":
            state = label.removeprefix("trial-")
            verdict = _text(browser, "#verdict-card .pill")
            want = "compile_error crash timeout" if state == "failed" else state
            assert verdict in want.split(), (label, verdict)
            if state in ("running", "duplicate", "interrupted"):
                assert _text(browser, f"#{state}-card"), label
        if label == "study-accepted-filter":
            pills = browser.evaluate(
                "[...document.querySelectorAll('#trials-table tbody .pill')]"
                ".map(p => p.textContent)"
            )
            assert pills and set(pills) == {"accepted"}, pills
            color = browser.evaluate(
                "getComputedStyle(document.querySelector('#trials-table .pill.v-accepted'))"
                ".backgroundColor"
            )
            assert color == "rgb(26, 127, 55)", color  # green, not the red of a rejection
    print(f"screenshots: {shots}")
    assert not problems, "\n".join(problems)
    assert all((shots / f"{label}.png").stat().st_size > 10_000 for label, *_ in PAGES)


def test_api_docs_render_offline(browser: DevTools, dashboard_url: str, shots: Path) -> None:
    requested: list[str] = []
    browser.call("Network.enable")
    browser.events.clear()
    browser.call("Page.navigate", url=f"{dashboard_url}/api/docs")
    browser.wait_event("Page.loadEventFired")
    deadline = time.monotonic() + 30
    while not browser.evaluate("!!document.querySelector('.swagger-ui .opblock')"):
        assert time.monotonic() < deadline, "Swagger UI did not render the API"
        time.sleep(0.3)
    _shot(browser, shots, "api-docs")
    for ev in browser.events:
        if ev["method"] == "Network.requestWillBeSent":
            requested.append(ev["params"]["request"]["url"])
    browser.call("Network.disable")
    assert requested and all(u.startswith((dashboard_url, "data:")) for u in requested), requested
    assert not _errors(browser.events)


def test_running_agent_pages(browser: DevTools, running_url: str, shots: Path) -> None:
    name = SYNTH
    problems = _visit(browser, running_url + "/", 1, 1, "running-fleet", shots)
    assert "gains above ×1.020" in _text(browser, "#workers")  # what A/A noise means
    assert "°C" in _text(browser, "#workers")  # GPU state per worker
    runs = _text(browser, "#invocations")
    assert "earlier" not in runs and "pid 2" in runs and "pid 1" in runs
    problems += _visit(browser, f"{running_url}/studies/{name}", 4, 4, "running-study", shots)
    prog = _text(browser, "#progress-card")
    assert "/ 40" in prog and "trials/h" in prog and "of 10 min timeout" in prog, prog
    assert "×1.020" in _text(browser, "#threshold-card")
    running = _first(running_url, name, "running")
    problems += _visit(
        browser, f"{running_url}/studies/{name}/trials/{running}", 0, 0, "running-trial", shots
    )
    assert "of 10 min timeout" in _text(browser, "#running-card")
    assert not problems, "\n".join(problems)


def _poll(browser: DevTools) -> None:
    time.sleep(1.2)  # the dashboard reads the storage at most once a second
    browser.evaluate("window.ftPoll()", await_promise=True)


def test_live_refresh_updates_in_place_and_shows_errors(
    browser: DevTools, running_url: str, running_storage: Path, shots: Path
) -> None:
    import optuna

    from agent.storage import parse_storage

    ref = parse_storage(str(running_storage))
    browser.call("Page.navigate", url=f"{running_url}/studies/{SYNTH}")
    browser.wait_event("Page.loadEventFired")
    browser.evaluate("window.ftPoll()", await_promise=True)
    browser.evaluate("window.__kept = 1")  # gone if the page reloads
    browser.evaluate(
        "Plotly.relayout(document.getElementById('history'), {'xaxis2.range': [3, 9]})"
        ".then(() => true)",
        await_promise=True,
    )
    before = _text(browser, "#counts")
    # A trial lands: the table and counts change in place; the zoom and the page stay.
    study = optuna.load_study(study_name=SYNTH, storage=ref.open())
    study.add_trial(
        optuna.trial.create_trial(
            state=optuna.trial.TrialState.FAIL,
            user_attrs={"role": "candidate", "outcome": "crash", "reason": "planted crash"},
        )
    )
    _poll(browser)
    assert browser.evaluate("document.body.dataset.refreshes") == "1"
    assert browser.evaluate("window.__kept") == 1
    assert _text(browser, "#counts") != before and "planted crash" in _text(
        browser, "#trials-table"
    )
    zoom = browser.evaluate("document.getElementById('history').layout.xaxis2.range")
    assert zoom == [3, 9], zoom
    _shot(browser, shots, "live-updated")
    # The agent died without a word (its pid is gone): the page says its status is stale.
    dead = subprocess.Popen(["true"])
    dead.wait()
    data = json.loads(ref.status_path.read_text())
    data["agent"].update(host=socket.gethostname(), pid=dead.pid)
    write_status(ref.status_path, data)
    _poll(browser)
    assert "not running" in _text(browser, "#stale"), _text(browser, "main")
    _shot(browser, shots, "failed-agent-stale")
    # The storage vanishes: an error on the page, not a frozen "checked" label.
    running_storage.rename(running_storage.with_suffix(".gone"))
    try:
        _poll(browser)
        err = _text(browser, "#live-error")
        assert "is gone" in err and "showing what was read" in err, err
        assert "check failed" in _text(browser, "#refreshed")
        _shot(browser, shots, "storage-gone")
    finally:
        running_storage.with_suffix(".gone").rename(running_storage)
    _poll(browser)
    assert browser.evaluate("document.getElementById('live-error').hidden") is True


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
