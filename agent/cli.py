"""``python -m agent``: run an experiment, list studies, check an experiment file.

    python -m agent run experiments/quickstart.toml [--storage URL] [--promote-repo PATH]
                        [--budget N] [--wall-time S]
                        [--address HOST:PORT | --local] [--no-promote] [--json]
                        [--dashboard [PORT]]
    python -m agent status [--storage URL] [--json]
    python -m agent check experiments/X.toml [--json]
    python -m agent recheck [--configs DIR] [--backend B] [--force] [--json]
    python -m agent replay TABLE [--sampler tpe,cmaes,random] [--seeds 50] [--json]
    python -m agent table from-study --storage URL --study NAME ...   (replay tables)
    python -m agent dashboard [--storage URL]     (agent/dashboard, read-only web UI)
    python -m agent runtime-env [--env KEY=VALUE]  (for ray job submit --runtime-env-json)

Exit status: 0 done; 1 the run did not do what it was asked (no study could start, a promotion
was refused: the summary says why; recheck: a promoted config fails re-validation); 2 bad
input (a bad experiment file or option, nothing run).

As a Ray job: ``ray job submit --working-dir . --runtime-env-json "$(python -m agent runtime-env)"
-- python -m agent run experiments/X.toml`` (RAY_ADDRESS is set for the job, so it joins that
cluster; the runtime env names the engine commit, which the upload without .git cannot); with no
address it starts an embedded Ray with this machine's devices.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from engine.errors import EngineError

if TYPE_CHECKING:
    from agent.summary import RunSummary


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m agent",
        description="fleettune tuning agent: Optuna studies per device class on a Ray cluster, "
        "validated and paired-benchmarked candidates, promoted configs.",
    )
    p.add_argument("-v", "--verbose", action="store_true", help="debug logging")
    sub = p.add_subparsers(dest="command", required=True)
    for add in (
        _add_run,
        _add_status,
        _add_check,
        _add_recheck,
        _add_replay,
        _add_table,
        _add_runtime_env,
        _add_dashboard,
    ):  # in this order in --help
        add(sub)
    return p


def _add_run(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``run``: the experiment, its storage and lease, promotion, budget, where."""
    r = sub.add_parser("run", help="run an experiment (resumes its studies from storage)")
    r.add_argument("experiment", type=Path, help="experiment TOML (see experiments/)")
    r.add_argument(
        "--storage",
        help="Optuna storage: sqlite:///path, postgresql://..., or a *.journal path (default: "
        "$FLEETTUNE_STORAGE, else a journal file under the cache); checked before Ray starts",
    )
    held = r.add_mutually_exclusive_group()
    held.add_argument(
        "--wait",
        action="store_true",
        help="when another agent holds a study's lease, wait for it to finish (default: exit 2)",
    )
    held.add_argument(
        "--take-over",
        action="store_true",
        help="take a study's lease from another agent (it stops at its next heartbeat)",
    )
    r.add_argument(
        "--promote-repo",
        type=Path,
        help="git repository to commit promoted configs "
        "to (default: the experiment's [promote] repo: this checkout or a scratch repo)",
    )
    r.add_argument(
        "--model",
        action="append",
        metavar="M",
        help="only this one of the experiment's models (repeatable): a device call per model",
    )
    r.add_argument("--budget", type=int, help="trials per study (overrides budget.trials)")
    r.add_argument(
        "--wall-time",
        type=float,
        metavar="S",
        help="seconds after which no new trial starts (overrides budget.wall_time_s; the "
        "trials in flight finish, then the agent decides and promotes)",
    )
    where = r.add_mutually_exclusive_group()
    where.add_argument(
        "--address", help="Ray cluster address (default: $RAY_ADDRESS, else embedded)"
    )
    where.add_argument(
        "--local",
        action="store_true",
        help="no Ray: run the trials in this process on this machine's devices (one per device "
        "class; trial timeouts are not enforced)",
    )
    r.add_argument("--no-promote", action="store_true", help="never write or commit configs")
    r.add_argument("--json", action="store_true", help="print the summary as JSON on stdout")
    r.add_argument(
        "--dashboard",
        nargs="?",
        const=8080,
        type=int,
        metavar="PORT",
        help="also serve the read-only dashboard on 127.0.0.1:PORT (default 8080) while it runs",
    )


def _add_status(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``status``: the studies of a storage."""
    s = sub.add_parser("status", help="list studies in a storage with their best trials")
    s.add_argument(
        "--storage",
        help="as for run (default: $FLEETTUNE_STORAGE, else the journal under the cache)",
    )
    s.add_argument("--json", action="store_true")


def _add_check(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``check``: an experiment file, nothing run."""
    c = sub.add_parser(
        "check",
        help="validate an experiment file and print its search spaces and memory footprints",
    )
    c.add_argument("experiment", type=Path)
    c.add_argument("--json", action="store_true", help="one JSON document on stdout")


def _add_recheck(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``recheck``: promoted configs whose sentinel key changed."""
    rc = sub.add_parser(
        "recheck",
        help="re-validate promoted configs whose drift-sentinel key changed (driver, engine)",
        description="For every promoted config of the device classes on this machine: when the "
        "sentinel key it was validated under (backend, device class, driver, engine version, "
        "family) differs from this machine's, run the verifier on it again (teacher-forced, the "
        "registry's class budgets, on the evidence's model when it is here, else a synthetic "
        "model of its family). Exit 1 when any fails, 2 on bad input.",
    )
    rc.add_argument(
        "--configs",
        type=Path,
        help="promoted configs folder (default: $FLEETTUNE_CONFIGS or configs/ of this checkout)",
    )
    rc.add_argument(
        "--backend",
        action="append",
        help="only this backend (repeatable; default: every backend usable here)",
    )
    rc.add_argument("--force", action="store_true", help="re-validate even when the key matches")
    rc.add_argument("--json", action="store_true", help="one JSON document on stdout")


def _add_replay(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``replay``: the search over a table of measured configs."""
    rp = sub.add_parser(
        "replay",
        help="run the search against a table of measured configs (no GPU): trials to the best",
        description="Replay the agent's search (sampler, baseline first, duplicates pruned, "
        "failures told) over a table of measured configs and report, per sampler over many "
        "seeds, how many trials it needs to come within --within of the table's best.",
    )
    rp.add_argument("table", type=Path, help="table JSON or CSV (python -m agent table --help)")
    rp.add_argument("--sampler", default="tpe,cmaes,random", help="comma list: tpe,cmaes,random")
    rp.add_argument("--seeds", type=int, default=50, help="searches per sampler (seeds 0..N-1)")
    rp.add_argument("--within", type=float, default=0.02, help="target: this close to the best")
    rp.add_argument(
        "--warm-from",
        type=Path,
        metavar="TABLE",
        help="warm start: enqueue the best configs of this table (another device class) first",
    )
    rp.add_argument("--warm-k", type=int, default=3, help="configs taken from --warm-from")
    rp.add_argument(
        "--no-constraints",
        action="store_true",
        help="tell failed configs as FAIL (unseen by the sampler), as the agent did before",
    )
    rp.add_argument(
        "--tell-duplicates",
        action="store_true",
        help="tell a repeat of a tried config its measured value (COMPLETE) instead of PRUNED",
    )
    rp.add_argument(
        "--screen-variants",
        action="store_true",
        help="one trial per code variant before the sampler (the experiment's "
        "sampler.screen_variants)",
    )
    rp.add_argument("--json", action="store_true", help="the report as JSON, every run included")


def _add_table(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``table from-study``: a replay table from a finished study."""
    tb = sub.add_parser("table", help="build a replay table from a finished study's trials")
    tsub = tb.add_subparsers(dest="table_command", required=True)
    ts = tsub.add_parser("from-study", help="a finished study's trials (e.g. the fleet's db)")
    ts.add_argument("--storage", required=True, help="Optuna storage URL or *.journal path")
    ts.add_argument("--study", required=True, help="study name (python -m agent status)")
    ts.add_argument("--experiment", type=Path, required=True, help="the study's experiment file")
    ts.add_argument("--out", type=Path, required=True, help="table .json or .csv")


def _add_runtime_env(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``runtime-env``: the Ray runtime env naming the engine commit."""
    re_ = sub.add_parser(
        "runtime-env",
        help="the Ray runtime env that names this checkout's engine commit in a submitted job",
        description="Print a runtime env JSON for `ray job submit --runtime-env-json`: Ray "
        "uploads --working-dir without .git, so the job cannot read the engine commit its trial "
        "records and promotions name; this hands it over as $FLEETTUNE_ENGINE_COMMIT (a worker "
        "with a git checkout of its own still trusts its own).",
    )
    re_.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="another environment variable for the job (repeatable)",
    )


def _add_dashboard(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """``dashboard``: its arguments are the dashboard's own (optional install)."""
    d = sub.add_parser("dashboard", help="serve the read-only dashboard over a storage")
    try:
        from agent.dashboard import add_arguments

        add_arguments(d)
    except ImportError as e:  # the dashboard's web stack is an optional install
        d.set_defaults(dashboard_missing=str(e))


def _run(args: argparse.Namespace) -> int:
    from agent import lease
    from agent.experiment import check_models, load_experiment
    from agent.loop import RunOptions, run_experiment
    from agent.storage import check_storage, parse_storage

    exp = load_experiment(args.experiment)
    if args.model:
        unknown = [m for m in args.model if m not in exp.models]
        if unknown:
            raise EngineError(
                f"--model {unknown[0]}: not one of the experiment's models {list(exp.models)}"
            )
        exp = dataclasses.replace(exp, models=tuple(m for m in exp.models if m in args.model))
    check_models(exp)  # before the storage exists: a bad model creates nothing
    if args.budget is not None and args.budget < 1:
        raise EngineError("--budget must be >= 1")
    if args.wall_time is not None and not args.wall_time > 0:
        raise EngineError("--wall-time must be > 0 seconds")
    storage = parse_storage(args.storage)
    check_storage(storage)  # before Ray starts: a bad --storage costs nothing
    if args.dashboard is not None:
        check_port_free("127.0.0.1", args.dashboard)
    opts = RunOptions(
        storage=storage,
        lease=lease.WAIT if args.wait else lease.TAKE_OVER if args.take_over else lease.ERROR,
        promote_repo=args.promote_repo.resolve() if args.promote_repo else None,
        budget=args.budget,
        wall_time_s=args.wall_time,
        address=args.address,
        promote=not args.no_promote,
        local=args.local,
    )
    if args.dashboard is not None:
        from agent.dashboard import serve_in_background

        opts.storage.open()  # the dashboard opens the storage read-only: it must exist first
        serve_in_background(opts.storage.url, "127.0.0.1", args.dashboard)
    summary = run_experiment(exp, opts)
    if args.json:
        print(json.dumps(summary.to_dict(), indent=1, default=str))
    else:
        print(summary.text())
    return _exit_code(summary)


def _exit_code(summary: RunSummary) -> int:
    """1 when the run did not do what it was asked: no study could start, or a promotion was
    refused (the reasons are in the summary); 0 otherwise."""
    failed = False
    if not summary.studies:
        why = "; ".join(summary.warnings) or "no worker"
        print(f"error: no study ran: {why}", file=sys.stderr)
        failed = True
    for s in summary.studies:
        if s.promotion_error:
            print(f"error: {s.study} not promoted: {s.promotion_error}", file=sys.stderr)
            failed = True
    return 1 if failed else 0


def check_port_free(host: str, port: int) -> None:
    """Refuse a dashboard port something else listens on: the run would announce a URL that
    serves the other program (the dashboard's own bind fails in its thread, unseen)."""
    import socket

    if not 1 <= port <= 65535:
        raise EngineError(f"--dashboard {port}: a port is 1..65535")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds it
        try:
            s.bind((host, port))
        except OSError as e:
            raise EngineError(
                f"--dashboard {port}: {host}:{port} is taken ({e.strerror}); give another port"
            ) from None


def _status(args: argparse.Namespace) -> int:
    from agent.status import fleet_status, study_rows
    from agent.storage import check_storage, parse_storage

    ref = parse_storage(args.storage)
    # Reads only: a typo must not create a storage. The default one may not exist yet.
    if args.storage is None and ref.path is not None and not ref.path.exists():
        rows = []
    else:
        rows = study_rows(ref) if check_storage(ref, create=False) else []
    fleet = fleet_status(ref, rows)
    if args.json:
        doc = {"storage": ref.display, "studies": [r.to_dict() for r in rows], **fleet}
        print(json.dumps(doc, indent=1, default=str))
        return 0
    if not rows:
        print(f"no studies in {ref.display}")
        return 0
    for r in rows:
        print(r.text())
    if fleet:
        a = fleet["agent"]
        who = f"pid {a.get('pid')} on {a.get('host')}, experiment {a.get('experiment')}"
        print(f"agent: {a.get('state')} ({who})")
        for w in fleet["workers"]:
            doing = f" on {w['current']}" if w.get("current") else ""
            print(
                f"  worker {w['worker_id']}: {w['state']}{doing}; {w.get('device') or '?'} on "
                f"{w.get('host') or '?'} ({w.get('backend')}); {w.get('trials_done')} trials, "
                f"{w.get('restarts')} restarts"
            )
        print(f"fleet status: {ref.status_path}")
    return 0


def _check(args: argparse.Namespace) -> int:
    from agent.experiment import check_models, load_experiment
    from agent.memory import check_footprints, footprint_line, plan_text
    from engine.tuning import REGISTRY

    exp = load_experiment(args.experiment)
    check_models(exp)
    lines = [
        f"experiment {exp.name}: models {list(exp.models)}, objectives "
        f"{[o.name for o in exp.objectives]}, target {exp.acceptance.target}"
    ]
    backends: dict[str, dict | None] = {}
    footprints: list[dict] = []
    for b in exp.backends:
        if b not in REGISTRY.backends():
            lines.append(f"  {b}: no kernels registered here (skipped)")
            backends[b] = None
            continue
        space = exp.search_space(b)
        grid = space.grid()
        backends[b] = {"size": space.size, "grid": grid}
        lines.append(f"  {b}: {space.size} configs")
        lines += [f"    {name}: {choices}" for name, choices in grid.items()]
        footprints += check_footprints(exp.memory, b, space, exp.models)
    lines.append(plan_text(exp.memory))
    lines += [footprint_line(f) for f in footprints]
    if args.json:
        memory = dataclasses.asdict(exp.memory) | {"models": footprints}
        doc = {
            "experiment": exp.name,
            "models": list(exp.models),
            "objectives": [o.name for o in exp.objectives],
            "target": exp.acceptance.target,
            "backends": backends,
            "memory": memory,
        }
        print(json.dumps(doc, indent=1, default=str))
    else:
        print("\n".join(lines))
    return 0


def _recheck(args: argparse.Namespace) -> int:
    from agent.recheck import recheck_all
    from engine import backends
    from engine.tuning.promoted import configs_dir
    from worker.device import engine_commit

    root = args.configs or configs_dir()
    if not root.is_dir():
        raise EngineError(f"--configs {root}: no such folder")
    names = args.backend or backends.available()
    for b in args.backend or []:
        if b not in backends.BACKENDS:
            raise EngineError(f"--backend {b}: unknown (known: {', '.join(backends.BACKENDS)})")
    results = recheck_all(root, names, engine_commit(), force=args.force)
    failed = [r for r in results if not r.passed]
    if args.json:
        doc = {"configs": str(root), "backends": names, "results": [r.to_dict() for r in results]}
        print(json.dumps({**doc, "failed": len(failed)}, indent=1))
    else:
        for r in results:
            print(r.text())
        print(
            f"{len(results)} promoted config(s) for {', '.join(names) or 'no backend'} in {root}: "
            f"{sum(r.revalidated for r in results)} re-validated, {len(failed)} failing"
        )
    return 1 if failed else 0


def _replay(args: argparse.Namespace) -> int:
    from agent.replay import main_args, text

    rep = main_args(args)
    print(json.dumps(rep, indent=1) if args.json else text(rep))
    return 0


def _table(args: argparse.Namespace) -> int:
    from agent import table as tables
    from agent.experiment import ExperimentError, load_experiment

    if args.out.suffix not in (".json", ".csv"):
        raise ExperimentError(f"--out {args.out}: a table is .json or .csv")
    load_experiment(args.experiment)  # a bad experiment file fails before any work
    from agent.storage import parse_storage

    url = parse_storage(args.storage)
    # The storage as named on the command line (password masked): a table's provenance, not
    # this machine's paths.
    t = tables.from_study(url.open(), args.study, str(args.experiment), url.display)
    if not t.rows:
        raise ExperimentError("no rows: nothing to write")
    t.experiment = tables.relative_to(args.experiment, args.out)
    t.save(args.out)
    print(f"wrote {args.out}: {len(t.rows)} rows, {len(t.ok_rows)} ok")
    return 0


def _runtime_env(args: argparse.Namespace) -> int:
    from engine.provenance import COMMIT_ENV, submit_env

    env = {}
    for item in args.env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            print(f"error: --env {item!r}: give KEY=VALUE", file=sys.stderr)
            return 2
        env[key] = value
    env |= submit_env()
    if COMMIT_ENV not in env:
        print(
            "warning: this is not a git checkout: the job's records will say engine_commit unknown",
            file=sys.stderr,
        )
    print(json.dumps({"env_vars": env}))
    return 0


def _dashboard(args: argparse.Namespace) -> int:
    missing = getattr(args, "dashboard_missing", None)
    if missing:
        raise EngineError(f"the dashboard cannot start: {missing} (pip install -e '.[agent]')")
    from agent.dashboard import run_args

    return run_args(args)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
        stream=sys.stderr,
    )
    for noisy in ("optuna", "filelock", "urllib3"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        commands = {
            "run": _run,
            "status": _status,
            "check": _check,
            "recheck": _recheck,
            "replay": _replay,
            "table": _table,
            "dashboard": _dashboard,
            "runtime-env": _runtime_env,
        }
        return commands[args.command](args)
    except EngineError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:  # Ctrl-C, or SIGTERM (agent.signals.stop_on_sigterm)
        signals = sys.modules.get("agent.signals")  # only `run` installs the SIGTERM handler
        term = signals.stopped_by_sigterm(e) if signals else False
        print(
            f"stopped by {'SIGTERM' if term else 'Ctrl-C'}: trials in flight were recorded as "
            "interrupted, a best accepted before the stop was promoted (the log says where); "
            "run again to resume",
            file=sys.stderr,
        )
        return 128 + (signal.SIGTERM if term else signal.SIGINT)
