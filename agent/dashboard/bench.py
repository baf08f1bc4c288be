"""How fast the dashboard answers on a big study: ``python -m agent.dashboard.bench --storage PATH
--trials 10000``. Writes the synthetic storage when PATH does not exist (minutes for 10,000
trials in SQLite), then times each page and API in process (FastAPI's TestClient: the app's own
time plus serialization, no network): the cold first load, then the median of warm repeats, then
the page right after a new trial landed (the incremental read)."""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import optuna


def _time(fn: object, repeats: int) -> tuple[float, float]:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        r = fn()  # type: ignore[operator]
        times.append(time.perf_counter() - t)
        assert r.status_code == 200, (r.status_code, r.text[:300])
    return statistics.median(times), max(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m agent.dashboard.bench", description=__doc__)
    ap.add_argument("--storage", required=True, help="storage path (written when absent)")
    ap.add_argument("--trials", type=int, default=10000)
    ap.add_argument("--repeats", type=int, default=5)
    a = ap.parse_args(argv)
    optuna.logging.set_verbosity(optuna.logging.WARNING)

    from fastapi.testclient import TestClient

    from agent.dashboard import create_app
    from agent.dashboard.synthetic import write_storage
    from agent.storage import parse_storage

    ref = parse_storage(a.storage)
    if ref.path is not None and not ref.path.exists():
        t = time.perf_counter()
        write_storage(a.storage, a.trials)
        print(f"wrote {a.trials} trials in {time.perf_counter() - t:.0f}s")
    size = ref.path.stat().st_size / 1e6 if ref.path else 0.0

    t = time.perf_counter()
    app = create_app(a.storage, warm=False)
    c = TestClient(app)
    opened = time.perf_counter() - t
    name = c.get("/api/studies").json()["studies"][0]["name"]
    cold = time.perf_counter() - t
    n = c.get(f"/api/studies/{name}").json()["trials"]
    print(
        f"{platform.node()}: {platform.processor() or platform.machine()}, "
        f"{n} trials, storage {ref.display} ({size:.0f} MB)"
    )
    print(f"cold: open {opened:.2f}s, first load of every trial {cold:.2f}s")

    mid = n // 2
    cases = {
        "GET /studies (page)": "/studies",
        "GET /studies/<study> (page, 50 rows, history plot)": f"/studies/{name}",
        "GET /studies/<study>?page=100 (page)": f"/studies/{name}?page=100",
        "GET /studies/<study>?sort=-metric&outcome=ok (page)": (
            f"/studies/{name}?sort=-metric&outcome=ok"
        ),
        "GET /studies/<study>/trials/<n> (page)": f"/studies/{name}/trials/{mid}",
        "GET /api/studies": "/api/studies",
        "GET /api/studies/<study>": f"/api/studies/{name}",
        "GET /api/studies/<study>/trials?page=100": f"/api/studies/{name}/trials?page=100",
        "GET /api/studies/<study>/trials/<n>": f"/api/studies/{name}/trials/{mid}",
        "GET /api/studies/<study>/history": f"/api/studies/{name}/history",
        "GET /api/stamp?study=<study>": f"/api/stamp?study={name}",
        "GET /api/promotions": "/api/promotions",
        "GET / (fleet page)": "/",
    }
    print(f"warm (median / max of {a.repeats}):")
    for label, url in cases.items():
        med, worst = _time(lambda url=url: c.get(url), a.repeats)
        print(f"  {label:55s} {med * 1000:7.1f} ms / {worst * 1000:7.1f} ms")
    t = time.perf_counter()
    r = c.get(f"/api/studies/{name}/importances")
    print(
        f"  {'GET /api/studies/<study>/importances (first, async)':55s} "
        f"{(time.perf_counter() - t) * 1000:7.1f} ms ({r.json()['trials']} trials used)"
    )

    # A new trial lands (written through another handle, as the agent would).
    study = optuna.load_study(study_name=name, storage=ref.open())
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.RUNNING))
    time.sleep(1.1)  # past the reader's refresh interval
    med, _ = _time(lambda: c.get(f"/studies/{name}"), 1)
    print(f"  {'GET /studies/<study> after a new trial landed':55s} {med * 1000:7.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
