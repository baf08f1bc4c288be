"""What every microbenchmark under bench/ shares: its argument conventions (--json, --out,
--repeats, --list), the refusal of bad input (one line, exit 2, before any GPU work),
the timing loop (warmup, then the median of repeats) and the output of its rows.

A bench script builds its parser with ``parser(__doc__)``, checks its input with ``refuse``,
answers ``--list`` with ``list_cases`` (its cases as flat configs, validated, no GPU: what the
tests read) and ends with ``emit``. Timing: ``median_ms(measure)`` over any callable that
returns one measurement in ms, e.g. ``cuda_events_ms`` of a graph launch.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/x.py`: the engine comes from this tree
    sys.path.insert(0, str(ROOT))


def parser(
    doc: str | None, *, repeats: int | None = 5, out: bool = True, listing: bool = True
) -> argparse.ArgumentParser:
    """A bench's parser, its docstring as help, with the shared options: --json always, and
    --repeats (given a default), --out and --list where the bench has them."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    if repeats is not None:
        ap.add_argument(
            "--repeats", type=int, default=repeats, help="timed runs (default %(default)s)"
        )
    if out:
        ap.add_argument("--out", type=Path, default=None, help="also write the JSON record here")
    ap.add_argument("--json", action="store_true", help="print the JSON record on stdout")
    if listing:
        ap.add_argument(
            "--list",
            action="store_true",
            help="print the cases as JSON flat configs and exit (no GPU)",
        )
    return ap


def refuse(name: str, message: str) -> int:
    """Bad input: one line naming the problem, exit status 2."""
    print(f"{name}: {message}", flush=True)
    return 2


def names(text: str) -> list[str]:
    """A comma list (empty items dropped)."""
    return [x for x in text.split(",") if x]


def ints(text: str) -> list[int]:
    """A comma list of integers (ValueError on anything else)."""
    return [int(x) for x in names(text)]


def unknown(wanted: list[str], known: Mapping[str, Any] | list[str]) -> list[str]:
    return [w for w in wanted if w not in known]


def list_cases(
    cases: Mapping[str, Mapping[str, Any]], backend: str = "cuda", **extra: object
) -> int:
    """--list: every case's flat config, each parsed as a TuningConfig first (a bad knob fails
    here, on any machine), printed as one JSON object {"configs": ..., **extra}."""
    from engine.tuning import TuningConfig

    for flat in cases.values():
        TuningConfig.from_flat(backend, dict(flat))
    print(json.dumps({"configs": {name: dict(flat) for name, flat in cases.items()}, **extra}))
    return 0


def median_ms(measure: Callable[[], float], repeats: int = 5, warmup: int = 1) -> float:
    """The median of ``repeats`` calls of ``measure`` (each returns ms), after ``warmup``
    untimed ones (first-launch costs: module loads, graph uploads)."""
    for _ in range(warmup):
        measure()
    return statistics.median(measure() for _ in range(max(1, repeats)))


def cuda_events_ms(cp: Any, stream: Any, fn: Callable[[], object]) -> float:
    """ms of one fn() on stream, between two CUDA events."""
    e0, e1 = cp.cuda.Event(), cp.cuda.Event()
    e0.record(stream)
    fn()
    e1.record(stream)
    e1.synchronize()
    return float(cp.cuda.get_elapsed_time(e0, e1))


def emit(record: object, args: argparse.Namespace, default_name: str) -> None:
    """Write the record to --out (a directory, or a name without a suffix, gets default_name
    inside it). Called after each step too, so a run cut short keeps what it measured."""
    if args.out is not None:
        out = args.out / default_name if args.out.is_dir() or not args.out.suffix else args.out
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(record, indent=1))


def finish(record: object, args: argparse.Namespace, default_name: str) -> int:
    """The end of a run: the last write, and the record on stdout under --json."""
    emit(record, args, default_name)
    if args.json:
        print(json.dumps(record))
    return 0


def keep_row(rows: list, row: dict, args: argparse.Namespace) -> None:
    """Add row to rows and, without --json, print it now (a run cut short still shows it)."""
    rows.append(row)
    if not args.json:
        print(row, flush=True)


def close_and_print(be: Any, device: str, args: argparse.Namespace, rows: list) -> int:
    """The end of a device bench's run: the backend closed, and under --json its device,
    token count and rows on stdout."""
    be.close()
    if args.json:
        print(json.dumps({"device": device, "tokens": args.tokens, "rows": rows}, indent=1))
    return 0
