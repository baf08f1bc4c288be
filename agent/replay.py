"""The replay runner: the agent's search (its StudyState: sampler, baseline first, duplicates
pruned, failures told) against a table of measured configs instead of a fleet; no GPU, no Ray.

Each config the sampler asks for is looked up in the table by its effective config (the variant
and the knobs that variant reads); the row's outcome and target metric are told as a worker's
result would be. A config the table lacks costs no trial and teaches the sampler nothing (told
FAIL): an unmeasured config is not a slow one.
Per sampler and seed it counts the trials (those that would have run on a worker: ok, invalid,
compile_error, crash, timeout) until one comes within ``within`` of the table's best, and reports
the median and quartiles over the seeds.

    python -m agent replay TABLE [--sampler tpe,cmaes,random] [--seeds 50] [--warm-from TABLE2]
                                 [--no-constraints] [--tell-duplicates] [--within 0.02] [--json]
"""

from __future__ import annotations

import json
import logging
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import optuna

from agent import warmstart
from agent.experiment import Experiment, ExperimentError, load_experiment
from agent.records import BUDGET_OUTCOMES, TrialRecord
from agent.space import Dim, OpSpace, SearchSpace, build_space
from agent.table import Row, Table, load_table

SAMPLERS = ("tpe", "coordinate", "cmaes", "random", "grid")
# Configs one search may ask (absent ones are free): a search past it has not reached the best.
MAX_ASKS = 3000


@dataclass(frozen=True)
class Run:
    """One search of one seed."""

    seed: int
    trials: int | None  # trials until within reach of the table's best; None: never in budget
    asks: int  # configs asked, infeasible and absent ones included (duplicates not)
    failed: int  # trials that ran and failed (invalid, compile_error, crash, timeout)


@dataclass(frozen=True)
class SamplerResult:
    sampler: str
    constraints: bool
    warm: int  # configs enqueued from the warm-start table
    runs: tuple[Run, ...]
    seconds: float
    duplicates: bool = False  # repeats told their config's values (StudyState.tell_duplicates)
    screen: bool = False  # one trial per code variant first (sampler.screen_variants)

    @property
    def reached(self) -> int:
        return sum(r.trials is not None for r in self.runs)

    def quartiles(self) -> tuple[float, float, float]:
        """Q1, median, Q3 of trials-to-target; a run that never got there counts as infinite."""
        xs = sorted(math.inf if r.trials is None else float(r.trials) for r in self.runs)
        if len(xs) == 1:
            return xs[0], xs[0], xs[0]
        q = statistics.quantiles(xs, n=4, method="inclusive") if math.inf not in xs else None
        if q is None:  # quantiles() cannot interpolate with inf: take order statistics
            n = len(xs)
            return xs[(n - 1) // 4], xs[(n - 1) // 2], xs[(3 * (n - 1)) // 4]
        return q[0], q[1], q[2]

    def to_dict(self) -> dict[str, Any]:
        q1, med, q3 = self.quartiles()
        return {
            "sampler": self.sampler,
            "constraints": self.constraints,
            "warm_start": self.warm,
            "tell_duplicates": self.duplicates,
            "screen_variants": self.screen,
            "seeds": len(self.runs),
            "reached": self.reached,
            "median": _num(med),
            "q1": _num(q1),
            "q3": _num(q3),
            "mean_failed": statistics.fmean(r.failed for r in self.runs),
            "seconds": round(self.seconds, 2),
            "runs": [asdict(r) for r in self.runs],
        }


@dataclass(frozen=True)
class Replay:
    """A table bound to its experiment's search space, ready to search."""

    table: Table
    exp: Experiment
    space: SearchSpace
    baseline: dict[str, Any]
    index: dict[tuple, Row]
    budget: int  # trials a search may run: every table row that would run on a worker
    within: float
    # A config the table lacks costs no trial and is told FAIL: the sampler never sees it. Told
    # infeasible instead (True, as before), TPE on a sparse table (a study's dozen trials)
    # learned where rows are missing, not where configs are slow (docs/replay.md).
    teach_absent: bool = False

    @property
    def threshold(self) -> float:
        return self.table.best * (1.0 - self.within)

    def lookup(self, flat: Mapping[str, Any]) -> Row | None:
        return self.index.get(effective(self.space, flat))

    def run(
        self,
        sampler: str,
        seed: int,
        constraints: bool = True,
        warm: Sequence[warmstart.WarmConfig] = (),
        duplicates: bool = False,
        screen: bool | None = None,
    ) -> Run:
        from agent.study import CANDIDATE, StudyState

        sp = replace(self.exp.sampler, name=sampler, seed=seed)
        if screen is not None:  # else the experiment's own setting
            sp = replace(sp, screen_variants=screen)
        exp = replace(
            self.exp,
            sampler=sp,
            budget=replace(self.exp.budget, trials=self.budget),
        )
        storage = optuna.storages.InMemoryStorage()
        st = StudyState(
            exp, "replay", self.table.backend, exp.models[0], "", storage, self.baseline, "default"
        )
        st.teach_failures = constraints
        st.tell_duplicates = duplicates
        if warm:
            warmstart.enqueue(st.study, st.space, self.baseline, warm, CANDIDATE)
        asks = failed = 0
        target = self.table.target
        while st.budget_left() > 0 and asks < MAX_ASKS:
            asked = st.ask()
            if asked is None:  # every config of the space tried
                break
            trial, flat, role = asked
            asks += 1
            row = self.lookup(flat)
            outcome = row.outcome if row is not None else "infeasible"
            ok = outcome == "ok" and row is not None and row.metric is not None
            metrics = {target: row.metric} if ok and row is not None else {}
            rec = TrialRecord(st.name, trial.number, role, outcome, config=flat, metrics=metrics)
            values = [metrics[o.name] for o in exp.objectives] if ok else None
            if row is None and not self.teach_absent:  # told FAIL: unseen by the sampler
                st.teach_failures = False
            st.finish(trial, rec, values)
            st.flush()
            st.teach_failures = constraints
            if outcome in BUDGET_OUTCOMES and not ok:
                failed += 1
            if ok and metrics[target] >= self.threshold:
                return Run(seed, st.evaluated, asks, failed)
        return Run(seed, None, asks, failed)


def effective(space: SearchSpace, flat: Mapping[str, Any]) -> tuple:
    """The part of a config the searched kernels read: each opened op's variant and the knobs
    of that variant (a knob the chosen variant does not read cannot change a measurement)."""
    out: list[Any] = []
    for o in space.ops:
        v = flat.get(o.variant_dim.key)
        out.append(v)
        out += [flat.get(d.key) for d in o.dims_of(str(v))]
    return tuple(out)


def prepare(table: Table, table_path: Path, within: float = 0.02) -> Replay:
    """Read the table's experiment (its path is relative to the table or to the working
    directory) and index the table on the experiment's search space; the experiment's
    objectives narrow to the table's target (the replay is single-objective)."""
    from engine.tuning import TuningConfig

    exp_path = table_path.parent / table.experiment  # as written: relative to the table
    if not exp_path.exists():
        exp_path = Path(table.experiment)
    exp = load_experiment(exp_path)
    objectives = tuple(o for o in exp.objectives if o.name == table.target)
    if not objectives:
        names = [o.name for o in exp.objectives]
        raise ExperimentError(f"table target {table.target!r} is not an objective of {names}")
    exp = replace(exp, objectives=objectives)
    if table.space:  # the study's own space: what it searched, whatever the file says today
        space = recorded_space(table)
        frozen = ((table.backend, False, space), (table.backend, True, recorded_space(table, True)))
        exp = replace(exp, spaces=frozen)
    else:  # for lookups only: each search builds its own (ordinal for CMA-ES), as the agent does
        space = build_space(table.backend, exp.space_for(table.backend))
    index: dict[tuple, Row] = {}
    for r in table.rows:
        index.setdefault(effective(space, r.config), r)
    budget = sum(r.outcome in BUDGET_OUTCOMES for r in index.values())
    if not any(r.outcome == "ok" for r in index.values()):
        raise ExperimentError(f"{table_path}: no ok row inside the experiment's search space")
    if not 0 < within < 1:
        raise ExperimentError(f"--within {within}: must be between 0 and 1")
    base = dict(table.baseline) or TuningConfig.default(table.backend).flat()
    if space.params_of(base) is None:
        raise ExperimentError(f"{table_path}: the baseline is outside the table's search space")
    return Replay(table, exp, space, base, index, budget, within)


def recorded_space(table: Table, ordinal: bool = False) -> SearchSpace:
    """The search space a study recorded (its ``space`` attr: ``op.variant`` and
    ``op.variant.knob`` dimensions, values as text), typed by the values the table's rows and
    baseline hold, and narrowed to the values they hold; an op the grid names no variant of runs
    the baseline's. Knobs the study held at one value are not dimensions: they cannot tell two
    of its configs apart."""
    seen: dict[str, dict[str, Any]] = {}  # flat key -> text -> value
    for cfg in (table.baseline, *(r.config for r in table.rows)):
        for k, v in cfg.items():
            seen.setdefault(k, {})[str(v)] = v
    variants: dict[str, list[str]] = {}
    knobs: dict[str, dict[str, list[tuple[str, list[str]]]]] = {}
    for name, choices in table.space.items():
        parts = name.split(".")
        if len(parts) == 2 and parts[1] == "variant":
            variants[parts[0]] = choices
        elif len(parts) == 3:
            knobs.setdefault(parts[0], {}).setdefault(parts[1], []).append((parts[2], choices))
        else:
            raise ExperimentError(f"table space: {name!r} is not op.variant or op.variant.knob")
    ops = []
    for op in dict.fromkeys([*variants, *knobs]):
        vs = variants.get(op) or [str(table.baseline.get(f"{op}.variant", ""))]
        params = []
        for v in vs:
            dims = []
            for knob, choices in knobs.get(op, {}).get(v, []):
                key = f"{op}.{knob}"
                # Only the values some row holds: a sparse table (a study's own dozen trials)
                # has no answer for the rest, and asking them would only spin the search.
                typed = tuple(seen[key][c] for c in choices if c in seen.get(key, {}))
                if not typed:
                    continue
                numeric = all(isinstance(c, int | float) for c in typed)
                dims.append(Dim(f"{op}.{v}.{knob}", key, typed, ordinal and numeric))
            params.append((v, tuple(dims)))
        ops.append(OpSpace(op, Dim(f"{op}.variant", f"{op}.variant", tuple(vs)), tuple(params)))
    return SearchSpace(table.backend, tuple(ops))


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def warm_from(table: Table, replay: Replay, k: int = warmstart.TOP_K) -> list[warmstart.WarmConfig]:
    """The k fastest ok configs of another table (another device class), inside the space."""
    ranked = sorted(table.ok_rows, key=lambda r: -(r.metric or 0.0))
    out = []
    for r in ranked:
        if replay.space.params_of({**replay.baseline, **r.config}) is not None:
            out.append(warmstart.WarmConfig(table.device or "table", None, r.config, r.metric))
        if len(out) == k:
            break
    return out


def run_samplers(
    replay: Replay,
    samplers: Sequence[str],
    seeds: int,
    constraints: bool = True,
    warm: Sequence[warmstart.WarmConfig] = (),
    duplicates: bool = False,
    screen: bool = False,
) -> list[SamplerResult]:
    logging.getLogger("agent.study").setLevel(logging.WARNING)
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    out = []
    for name in samplers:
        t0 = time.perf_counter()
        runs = tuple(
            replay.run(name, seed, constraints, warm, duplicates, screen or None)
            for seed in range(seeds)
        )
        dt = time.perf_counter() - t0
        out.append(SamplerResult(name, constraints, len(warm), runs, dt, duplicates, screen))
    return out


def report(replay: Replay, results: Sequence[SamplerResult]) -> dict[str, Any]:
    t = replay.table
    rows = list(replay.index.values())
    return {
        "table": {
            "experiment": t.experiment,
            "backend": t.backend,
            "target": t.target,
            "device": t.device,
            "rows": len(rows),
            "ok": sum(r.outcome == "ok" for r in rows),
            "best": t.best,
            "within": replay.within,
            "near_best": sum(r.metric is not None and r.metric >= replay.threshold for r in rows),
            "space": replay.space.size,
            "budget": replay.budget,
        },
        "results": [r.to_dict() for r in results],
    }


def text(rep: dict[str, Any]) -> str:
    t = rep["table"]
    lines = [
        f"table: {t['rows']} configs of {t['space']} in the space ({t['ok']} ok), {t['target']} "
        f"best {t['best']:.2f} on {t['device'] or 'an unnamed device'}; {t['near_best']} within "
        f"{t['within']:.0%} of it; budget {t['budget']} trials",
    ]
    for r in rep["results"]:
        tag = "" if r["constraints"] else ", failures not told"
        tag += f", warm start {r['warm_start']}" if r["warm_start"] else ""
        tag += ", duplicates told" if r.get("tell_duplicates") else ""
        tag += ", variants screened first" if r.get("screen_variants") else ""
        lines.append(
            f"  {r['sampler']:7s}{tag}: median {_fmt(r['median'])} trials "
            f"[Q1 {_fmt(r['q1'])}, Q3 {_fmt(r['q3'])}], reached {r['reached']}/{r['seeds']} "
            f"seeds, {r['mean_failed']:.1f} failed trials per search ({r['seconds']:.0f} s)"
        )
    return "\n".join(lines)


def _num(x: float) -> float | None:
    return None if math.isinf(x) else x


def _fmt(x: float | None) -> str:
    return "never" if x is None else f"{x:g}"


def main_args(args: Any) -> dict[str, Any]:
    """``python -m agent replay``: the CLI body (argument checks raise ExperimentError)."""
    samplers = [s.strip() for s in args.sampler.split(",") if s.strip()]
    bad = [s for s in samplers if s not in SAMPLERS]
    if bad or not samplers:
        raise ExperimentError(f"--sampler {args.sampler!r}: choose from {list(SAMPLERS)}")
    if args.seeds < 1:
        raise ExperimentError("--seeds must be >= 1")
    if "cmaes" in samplers:
        try:
            import cmaes  # noqa: F401
        except ImportError:
            raise ExperimentError("--sampler cmaes needs the 'cmaes' package") from None
    table = load_table(args.table)
    replay = prepare(table, args.table, args.within)
    warm: list[warmstart.WarmConfig] = []
    if args.warm_from is not None:
        other = load_table(args.warm_from)
        if other.backend != table.backend:
            raise ExperimentError(
                f"--warm-from {args.warm_from}: backend {other.backend!r}, the table's is "
                f"{table.backend!r}"
            )
        warm = warm_from(other, replay, args.warm_k)
        if not warm:
            raise ExperimentError(f"--warm-from {args.warm_from}: no ok config inside the space")
    results = run_samplers(
        replay,
        samplers,
        args.seeds,
        not args.no_constraints,
        warm,
        args.tell_duplicates,
        args.screen_variants,
    )
    return report(replay, results)
