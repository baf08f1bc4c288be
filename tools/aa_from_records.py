#!/usr/bin/env python3
"""Pool the per-pair noise of recorded GPU trials for the A/A simulation in tests/agent/test_aa.py.

For every measured trial of the given Optuna storages and every objective, the per-pair log
ratios log(candidate_i / best_i) are centred on their trial's mean (which removes the real
effect of the candidate) and scaled by sqrt(n / (n - 1)) (centring on a mean of n shrinks the
spread). What is left is the pairing's own noise on that device, for that objective: an A/A
draw is then n residuals resampled from one pool, with true ratio 1.

  python tools/aa_from_records.py docs/fleet-gpu/*.db --out tests/data/h200-pair-noise.json

(The H200 storages left the tree with issue 29: `git show a9a356b:docs/fleet-gpu/<file> > <file>`.)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def residuals(urls: list[str]) -> dict[str, list[float]]:
    """Pool key "<backend>/<objective>" -> centred, rescaled per-pair log ratios."""
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pools: dict[str, list[float]] = {}
    for url in urls:
        for name in optuna.get_all_study_names(url):
            study = optuna.load_study(study_name=name, storage=url)
            for t in study.get_trials(deepcopy=False):
                ua = t.user_attrs
                if ua.get("outcome") != "ok":
                    continue
                backend = (ua.get("worker") or {}).get("backend", "?")
                for obj, s in (ua.get("samples") or {}).items():
                    c, b = np.asarray(s["candidate"], float), np.asarray(s["best"], float)
                    if c.size < 3 or c.size != b.size:
                        continue
                    logs = np.log(c) - np.log(b)
                    res = (logs - logs.mean()) * np.sqrt(c.size / (c.size - 1))
                    metric = obj.split("@")[0]
                    pools.setdefault(f"{backend}/{metric}", []).extend(map(float, res))
    return pools


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("storage", nargs="+", help="sqlite files (or URLs) of GPU studies")
    ap.add_argument("--out", required=True, help="JSON file to write")
    a = ap.parse_args(argv)
    urls = [s if "://" in s else f"sqlite:///{s}" for s in a.storage]
    for s in a.storage:
        if "://" not in s and not Path(s).is_file():
            print(f"{s}: no such file", file=sys.stderr)
            return 2
    pools = residuals(urls)
    doc = {"sources": [Path(s).name for s in a.storage], "pools": pools}
    Path(a.out).write_text(json.dumps(doc, indent=0))
    for k, v in sorted(pools.items()):
        print(f"{k}: {len(v)} pairs, sd {np.std(v):.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
