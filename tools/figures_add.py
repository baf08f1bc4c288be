"""[[figure]] records from stored measurements, appended to docs/figures.toml (issue 29).

    python -m tools.figures add --bench BENCH.json [--llama LLAMA.json] [--memory-mib N]
        [--device NAME] [--table KEY] --command "how it was measured"
    python -m tools.figures add --study STORAGE_URL [--study-name NAME] --command "..."

``--bench`` reads one ``engine bench --json`` output (engine/cli.py's cmd_bench writes it): a pp
and a tg record per prompt length, the medians with their [min..max], the config it ran (its
``config_source``), the engine's measured footprint (``memory.total_bytes``) and, with
``--memory-mib``, the GPU memory held above idle beside it. ``--llama`` is llama-bench's
``-o json`` list of {n_prompt, n_gen, avg_ts, stddev_ts} from the same call: the reference column.
``--study`` reads an agent storage: each study's best accepted trial (the study's ``best``
attr) becomes one record per objective, with its paired ratio, validate verdict and footprint.

The "counts" column is not written here: tools/figures.py derives it from source, validate and
memory when it renders. Bad input is one line naming the problem (exit 2) and the data file is
untouched: the new text is parsed by tools.figures.load before it replaces the file.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import re
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from engine.errors import ConfigError
from engine.tuning.memory import gib
from tools.figures_data import load

TITLES = {"cuda": "CUDA", "vulkan": "Vulkan", "numpy": "NumPy"}
FIELDS = (  # the order a record's fields are written in
    "table", "date", "device", "model", "metric", "figure", "config", "reference", "memory",
    "validate", "source", "command",
)  # fmt: skip


def _read_json(path: Path, what: str) -> Any:
    try:
        return json.loads(path.read_text())
    except OSError as e:
        raise ConfigError(f"{path}: cannot read {what} ({e.strerror or e})") from None
    except ValueError as e:
        raise ConfigError(f"{path}: not JSON ({e})") from None


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _rate(x: float) -> str:
    return f"{x:,.1f}"


def _stat(s: Any, where: str) -> dict[str, float]:
    if not isinstance(s, dict) or not all(isinstance(s.get(k), int | float) for k in ("median",)):
        raise ConfigError(f"{where}: not an engine bench --json output (no median)")
    return s


def _bench_figure(s: dict[str, float]) -> str:
    lo, hi = s.get("min"), s.get("max")
    span = f" [{_rate(lo)}..{_rate(hi)}]" if lo is not None and hi is not None else ""
    return _rate(s["median"]) + span


def _llama_refs(path: Path | None) -> dict[tuple[int, int], str]:
    """(n_prompt, n_gen) -> "avg (sd x)" of a llama-bench JSON list."""
    if path is None:
        return {}
    rows = _read_json(path, "llama-bench JSON")
    keys = ("n_prompt", "n_gen", "avg_ts", "stddev_ts")
    if not isinstance(rows, list) or not all(
        isinstance(r, dict) and all(k in r for k in keys) for r in rows
    ):
        raise ConfigError(f"{path}: not llama-bench JSON (a list of {{{', '.join(keys)}}})")
    return {
        (int(r["n_prompt"]), int(r["n_gen"])): f"{_rate(r['avg_ts'])} (sd {r['stddev_ts']:,.0f})"
        for r in rows
    }


def _promoted_validate(path: str | None) -> str:
    """The promoted file's own [evidence.validate] verdict (its agent trial's)."""
    try:
        ev = tomllib.loads(Path(path or "").read_text()).get("evidence", {})
    except (OSError, tomllib.TOMLDecodeError):
        return "not validated in the call"
    v = ev.get("validate") or {}
    if "passed" not in v:
        return "not validated in the call"
    kld = f" (KLD {v['kld']:.3g})" if isinstance(v.get("kld"), int | float) else ""
    return f"{'PASS' if v['passed'] else 'FAIL'} in its agent trial{kld}"


def _memory_text(total: Any, mib: int | None) -> str:
    parts = []
    if isinstance(total, int | float) and total > 0:
        parts.append(f"{gib(total)} held by the engine")
    if mib is not None:
        parts.append(f"{mib:,} MiB GPU above idle (nvidia-smi peak)")
    return "; ".join(parts)


def bench_records(
    doc: Any, where: str, llama: dict[tuple[int, int], str], mib: int | None, device: str
) -> list[dict[str, str]]:
    """pp and tg records (table, command left to the caller) of one engine bench --json."""
    need = ("model", "backend", "results", "gen_tokens", "config_source")
    if not isinstance(doc, dict) or any(k not in doc for k in need) or not doc["results"]:
        raise ConfigError(f"{where}: not an engine bench --json output (needs {', '.join(need)})")
    src = doc["config_source"] or {}
    kind, path = src.get("kind", "default"), src.get("path") or ""
    if (
        kind == "promoted"
    ):  # the path from its configs/ folder on: the machine's prefix says nothing
        shown = path[path.rfind("configs/") :] if "configs/" in path else path
        source, config, validate = "promoted bench", f"promoted {shown}", _promoted_validate(path)
    elif kind == "default":
        source, config = "defaults bench", "registry defaults"
        validate = "not validated in the call"
    else:  # a --config file or a caller's config: hand-picked, however it was found
        source, config = "hand bench", f"--config {path}" if path else "a config given by hand"
        validate = "not validated in the call"
    memory = _memory_text((doc.get("memory") or {}).get("total_bytes"), mib)
    date = str(doc.get("time") or dt.date.today().isoformat())[:10]
    dev = device or (doc.get("device") or {}).get("name", "").removeprefix("NVIDIA ")
    dev = dev or doc["backend"]
    base = dict(date=date, device=dev, model=str(doc["model"]), config=config, memory=memory)
    base |= dict(validate=validate, source=source)
    out = []
    for r in doc["results"]:
        n, g = int(r.get("prompt_tokens", 0)), int(doc["gen_tokens"])
        pp = _stat(r.get("prefill_tok_s"), where)
        out.append(base | {"metric": f"pp{n} tok/s", "figure": _bench_figure(pp)})
        out[-1]["reference"] = llama.get((n, 0), "")
        if r.get("decode_tok_s") is not None:
            tg = _stat(r["decode_tok_s"], where)
            out.append(base | {"metric": f"tg{g} tok/s", "figure": _bench_figure(tg)})
            out[-1]["reference"] = llama.get((0, g), "")
    return out


def _study_records(storage: str, name: str | None) -> tuple[str, list[dict[str, str]]]:
    """(the backend, records) of each named (or every) study's best accepted trial."""
    import optuna

    from agent.records import TrialRecord
    from agent.storage import StorageError, parse_storage

    try:
        ref = parse_storage(storage)
    except StorageError as e:
        raise ConfigError(str(e)) from None
    if ref.path is not None and not ref.path.is_file():
        raise ConfigError(f"{storage}: no such storage file")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    st = ref.open()
    names = [s.study_name for s in optuna.get_all_study_summaries(st)]
    if name is not None and name not in names:
        raise ConfigError(f"{storage}: no study {name!r}; studies: {', '.join(names) or 'none'}")
    out, backend = [], ""
    for n in [name] if name else names:
        study = optuna.load_study(study_name=n, storage=st)
        best = (study.user_attrs.get("best") or {}).get("trial")
        if best is None:
            continue
        t = study.trials[best]
        rec = TrialRecord.from_attrs(n, best, t.user_attrs)
        if not rec.accepted:
            continue
        backend = study.user_attrs.get("backend", backend)
        v = rec.validate
        if v is None:
            validate = "not validated"
        else:
            kld = f"KLD {v.kld:.3g}, " if v.kld is not None else ""
            validate = f"{'PASS' if v.passed else 'FAIL'} ({kld}NMSE {v.nmse:.3g})"
        changed = ", ".join(sorted(rec.changed)) or "the baseline's config"
        done = t.datetime_complete.timestamp() if t.datetime_complete else 0.0
        at = dt.datetime.fromtimestamp(rec.finished or done, dt.UTC)
        base = dict(
            date=at.date().isoformat(),
            device=(rec.device or str(study.user_attrs.get("device_class", ""))).removeprefix(
                "NVIDIA "
            ),  # as the bench records name it, so one device reads one way in a table
            model=str(study.user_attrs.get("model", "")),
            config=f"trial {best} of {n}: {changed}",
            reference="",
            memory=_memory_text((rec.memory or {}).get("total_bytes"), None),
            validate=validate,
            source="agent trial",
        )
        for metric, value in rec.metrics.items():
            est = rec.estimates.get(metric)
            ratio = f" (x{est.ratio:.3f} [{est.lower:.3f}, {est.upper:.3f}])" if est else ""
            out.append(base | {"metric": metric, "figure": _rate(value) + ratio})
    if not out:
        which = f"study {name!r}" if name else "no study"
        raise ConfigError(f"{storage}: {which} has an accepted best trial")
    return backend, out


def _toml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a TOML basic string (\uXXXX escapes included)


def _append(text: str, tables: dict[str, str], cmd: tuple[str, str] | None, recs: list) -> str:
    """``text`` with the new [commands] entry, [[table]] and [[figure]] records added."""
    if cmd is not None:
        head = re.search(r"^\[commands\]\n", text, re.M)
        if head is None:
            raise ConfigError("the data file has no [commands] table")
        line = f"{cmd[0]} = {_toml_str(cmd[1])}\n"
        text = text[: head.end()] + line + text[head.end() :]
    text = text.rstrip("\n") + "\n"
    for key, title in tables.items():
        text += f'\n[[table]]\nkey = "{key}"\ntitle = {_toml_str(title)}\n'
    for rec in recs:
        text += "\n[[figure]]\n" + "".join(
            f"{k} = {_toml_str(rec[k])}\n" for k in FIELDS if rec.get(k) or k == "table"
        )
    return text


def add(args: argparse.Namespace) -> list[dict[str, str]]:
    """Append the records ``args`` asks for to ``args.data``; returns them."""
    tables, commands, _ = load(args.data)
    keys = {t["key"] for t in tables}
    if args.bench is None and (args.llama or args.memory_mib is not None):
        raise ConfigError("--llama and --memory-mib go with --bench (a study has no llama-bench)")
    if args.bench is not None:
        llama = _llama_refs(args.llama)
        doc = _read_json(args.bench, "bench JSON")
        recs = bench_records(doc, str(args.bench), llama, args.memory_mib, args.device)
        backend = str(doc["backend"])
    else:
        backend, recs = _study_records(args.study, args.study_name)
        if args.device:
            recs = [r | {"device": args.device} for r in recs]
    if args.model:
        recs = [r | {"model": args.model} for r in recs]
    short = recs[0]["device"].removeprefix("NVIDIA ")
    table = args.table or f"{backend}-{_slug(short)}"
    new_tables = {}
    if table not in keys:
        new_tables[table] = f"{TITLES.get(backend, backend)} on the {short}"
    cmd, how = None, " ".join(args.command.split())
    key = next((k for k, v in commands.items() if " ".join(v.split()) == how), None)
    if key is None:
        key = "add-" + hashlib.sha1(how.encode()).hexdigest()[:8]
        # an entry edited by hand after it was added keeps its key: the same note measured
        # again (the same command on the same day) must not collide with it
        base, n = key, 2
        while key in commands:
            key, n = f"{base}-{n}", n + 1
        cmd = (key, how)
    recs = [r | {"table": table, "command": key} for r in recs]
    text = _append(args.data.read_text(), new_tables, cmd, recs)
    fd, tmp = tempfile.mkstemp(dir=args.data.parent, prefix=".figures-", suffix=".toml")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        load(Path(tmp))  # a record the renderer would refuse never lands
        os.replace(tmp, args.data)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return recs


def parser(data: Path) -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="python -m tools.figures add", description=__doc__.split("\n\n")[0]
    )
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--bench", type=Path, help="an `engine bench --json` output")
    what.add_argument("--study", help="an agent storage URL: its best accepted trials")
    ap.add_argument("--study-name", help="one study of --study (default: each)")
    ap.add_argument("--llama", type=Path, help="llama-bench -o json of the same call")
    ap.add_argument("--memory-mib", type=int, help="GPU MiB held above idle (nvidia-smi)")
    ap.add_argument("--device", default="", help="the device's name (default: the JSON's)")
    ap.add_argument("--model", default="", help="the model's label (default: the JSON's)")
    ap.add_argument("--table", help="a [[table]] key (default: BACKEND-DEVICE, made if new)")
    ap.add_argument("--command", required=True, help="how it was measured (the source note)")
    ap.add_argument("--data", type=Path, default=data)
    return ap
