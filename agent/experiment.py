"""Experiments: TOML files that say what to tune, where, for what, and how long.

An experiment is data only (no code, no module paths): models, backends, device classes, a search
space that is a subset of the tuning registry, objectives, validation, benchmark pairing, budget,
acceptance, sampler and promotion. ``load_experiment`` checks every key and value and raises
``ExperimentError`` naming the bad key and what is allowed. See docs/agent.md for the format.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.space_rules import BackendSpace, ExperimentError, OpRule, ParamRule, show
from engine.tomlfile import read_toml
from worker.models import is_synthetic, synthetic_args
from worker.records import BenchPlan, MemoryPlan, Objective, ValidatePlan

if TYPE_CHECKING:
    from agent.space import SearchSpace

__all__ = [  # the space rules are re-exported: callers import them from here
    "BackendSpace",
    "Experiment",
    "ExperimentError",
    "OpRule",
    "ParamRule",
    "StartConfig",
    "load_experiment",
    "parse_experiment",
]

METRICS = ("prefill_tok_s", "decode_tok_s")
SAMPLERS = ("tpe", "grid", "coordinate", "random", "cmaes", "nsga2")
PROMOTE_REPOS = ("project", "scratch")
KNOWN_BACKENDS = ("numpy", "vulkan", "cuda")


def known_backends() -> tuple[str, ...]:
    """Backends the engine knows (a test may register more)."""
    from engine.backends import BACKENDS

    return tuple(BACKENDS)


@dataclass(frozen=True)
class Budget:
    trials: int = 20  # evaluated trials per study, the baseline included
    wall_time_s: float = 0.0  # 0: no limit; no new trial starts after it
    trial_timeout_s: float = 300.0  # a trial running longer is a timeout; its worker restarts


@dataclass(frozen=True)
class Acceptance:
    target: str  # objective name, e.g. "prefill_tok_s@64"
    min_gain: float = 0.02
    confidence: float = 0.95
    max_regression: float = 0.0  # others may lose up to this fraction before it is significant
    resamples: int = 2000
    confirm: bool = True  # re-run on another worker of the class, when there is one


@dataclass(frozen=True)
class SamplerSpec:
    # Coordinate descent by default: on the whole-space replay tables it comes within 2% of the
    # best in 0.15-0.24x random's trials, TPE in 0.27-0.35x (docs/replay.md).
    name: str = "coordinate"
    seed: int = 0
    startup_trials: int = 5
    # Before the sampler, one trial per code variant the space opens (each with its registry
    # defaults, the rest at the baseline): a sampler that settles early cannot leave a whole
    # variant untried (the H200 fleet-prefill run: 14 trials, `resident` never drawn).
    screen_variants: bool = False


@dataclass(frozen=True)
class StartConfig:
    """A config to try right after the baseline (``[[start]]``): a point measured by hand
    (a microbenchmark, a profile) that a short budget should not leave to the sampler's luck.
    ``config`` holds flat ``op.knob`` overrides on the baseline; the trial is validated and
    benched like any other, and must be inside the space."""

    name: str
    backend: str
    config: dict[str, Any]


@dataclass(frozen=True)
class PromoteSpec:
    enabled: bool = True
    repo: str = "project"  # "project": this checkout; "scratch": a git repo under the cache
    branch: str = "main"


@dataclass(frozen=True)
class Experiment:
    name: str
    source: str  # the file it came from
    models: tuple[str, ...]
    backends: tuple[str, ...]
    device_classes: tuple[str, ...] | None  # None: every class present
    space: tuple[BackendSpace, ...]
    objectives: tuple[Objective, ...]
    validate: ValidatePlan
    bench: BenchPlan
    budget: Budget
    acceptance: Acceptance
    sampler: SamplerSpec
    promote: PromoteSpec
    description: str = ""
    start: tuple[StartConfig, ...] = ()
    memory: MemoryPlan = field(default_factory=MemoryPlan)
    warnings: tuple[str, ...] = field(default=(), compare=False)
    # Each backend's search space, resolved against the registry once, at load: (backend,
    # ordinal, SearchSpace); ordinal: built for CMA-ES (agent.space.build_space).
    spaces: tuple[tuple[str, bool, Any], ...] = field(default=(), compare=False, repr=False)

    def space_for(self, backend: str) -> BackendSpace:
        for s in self.space:
            if s.backend == backend:
                return s
        return BackendSpace(backend, everything=True)

    def search_space(self, backend: str) -> SearchSpace:
        """The backend's resolved search space: the one built at load, or (a backend registered
        since, or another sampler's ordinal encoding) built now."""
        from agent.space import build_space

        ordinal = self.sampler.name == "cmaes"
        for b, o, space in self.spaces:
            if b == backend and o == ordinal:
                return space
        return build_space(backend, self.space_for(backend), ordinal=ordinal)

    def objective(self, name: str) -> Objective:
        for o in self.objectives:
            if o.name == name:
                return o
        raise KeyError(name)


# --- parsing helpers ------------------------------------------------------------------------
def _table(where: str, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise ExperimentError(f"{where} must be a table, not {type(value).__name__}")
    return value


def _keys(where: str, table: Mapping[str, Any], allowed: tuple[str, ...]) -> None:
    for k in table:
        if k not in allowed:
            raise ExperimentError(f"{where}: unknown key {show(k)}; allowed keys: {list(allowed)}")


def _typed(where: str, value: Any, kind: type | tuple[type, ...], what: str) -> Any:
    ok = isinstance(value, kind) and not (isinstance(value, bool) and bool not in _as_tuple(kind))
    if not ok:
        raise ExperimentError(f"{where} = {show(value)}: must be {what}")
    return value


def _as_tuple(kind: type | tuple[type, ...]) -> tuple[type, ...]:
    return kind if isinstance(kind, tuple) else (kind,)


def _int(where: str, value: Any, lo: int = 0) -> int:
    _typed(where, value, int, "an integer")
    if value < lo:
        raise ExperimentError(f"{where} = {show(value)}: must be >= {lo}")
    return int(value)


def _num(where: str, value: Any, lo: float = 0.0, hi: float | None = None) -> float:
    _typed(where, value, (int, float), "a number")
    if not math.isfinite(value):  # nan passes every comparison; inf never fires or accepts
        raise ExperimentError(f"{where} = {value}: must be a finite number")
    if value < lo or (hi is not None and value > hi):
        bound = f"in [{lo}, {hi}]" if hi is not None else f">= {lo}"
        raise ExperimentError(f"{where} = {value}: must be {bound}")
    return float(value)


def _str_list(where: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ExperimentError(f"{where} must be a list of strings")
    return tuple(value)


def _choice(where: str, value: Any, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise ExperimentError(f"{where} = {show(value)}: allowed values: {list(allowed)}")
    return str(value)


# --- sections -------------------------------------------------------------------------------
def _param_rule(where: str, key: str, value: Any) -> ParamRule:
    variant, _, name = key.rpartition(".")
    variant_or_none = variant or None
    if value == "all":
        return ParamRule(name, variant_or_none)
    if isinstance(value, list):
        if not value:
            raise ExperimentError(f"{where}.{key}: an empty list allows nothing")
        return ParamRule(name, variant_or_none, choices=tuple(value))
    if isinstance(value, dict):
        _keys(f"{where}.{key}", value, ("min", "max"))
        lo = value.get("min")
        hi = value.get("max")
        if lo is not None:
            _typed(f"{where}.{key}.min", lo, int, "an integer")
        if hi is not None:
            _typed(f"{where}.{key}.max", hi, int, "an integer")
        return ParamRule(name, variant_or_none, min=lo, max=hi)
    raise ExperimentError(
        f'{where}.{key} = {show(value)}: must be a list of choices, {{min = .., max = ..}} or "all"'
    )


def _space(value: Any) -> tuple[BackendSpace, ...]:
    out = []
    for backend, body in _table("space", value).items():
        where = f"space.{backend}"
        _choice("space backend", backend, known_backends())
        if body == "all":
            out.append(BackendSpace(backend, everything=True))
            continue
        ops = []
        for op, rules in _table(where, body).items():
            rules = _table(f"{where}.{op}", rules)
            variants = rules.get("variants", "all")
            if variants != "all":
                variants = _str_list(f"{where}.{op}.variants", variants)
                if not variants:
                    raise ExperimentError(
                        f"{where}.{op}.variants = []: an empty list allows nothing; name a "
                        f'variant or write "all"'
                    )
            params = tuple(
                _param_rule(f"{where}.{op}", k, v) for k, v in rules.items() if k != "variants"
            )
            ops.append(OpRule(op, None if variants == "all" else variants, params))
        out.append(BackendSpace(backend, False, tuple(ops)))
    return tuple(out)


SERVED = "served"  # [[objectives]] prompt_tokens = "served": at the [memory] context


def _objectives(value: Any, context_tokens: int) -> tuple[tuple[Objective, ...], dict[str, str]]:
    """The objectives, and each served one's alias (``decode_tok_s@served`` -> its name).
    ``prompt_tokens = "served"`` measures at the context the experiment serves: the prompt is
    ``context_tokens - gen_tokens`` long, so the last step attends over the whole context."""
    if not isinstance(value, list) or not value:
        raise ExperimentError("objectives must be a non-empty array of [[objectives]] tables")
    out, aliases = [], {}
    for i, item in enumerate(value):
        where = f"objectives[{i}]"
        item = _table(where, item)
        _keys(where, item, ("metric", "prompt_tokens", "gen_tokens"))
        metric = _choice(f"{where}.metric", item.get("metric"), METRICS)
        default_gen = 16 if metric == "decode_tok_s" else 1
        gen = _int(f"{where}.gen_tokens", item.get("gen_tokens", default_gen), lo=1)
        if metric == "decode_tok_s" and gen < 2:
            raise ExperimentError(f"{where}.gen_tokens = {gen}: decode needs at least 2 tokens")
        prompt = item.get("prompt_tokens", 16)
        if prompt == SERVED:
            if context_tokens - gen < 1:
                raise ExperimentError(
                    f'{where}.prompt_tokens = "served": memory.context_tokens {context_tokens} '
                    f"leaves no prompt before {gen} generated tokens"
                )
            n = context_tokens - gen
            aliases[f"{metric}@{SERVED}"] = f"{metric}@{n}"
        else:
            if isinstance(prompt, str):
                raise ExperimentError(
                    f'{where}.prompt_tokens = {prompt!r}: a number of tokens or "served"'
                )
            n = _int(f"{where}.prompt_tokens", prompt, lo=1)
        out.append(Objective(metric, n, gen))
    names = [o.name for o in out]
    if len(set(names)) != len(names):
        raise ExperimentError(f"objectives: duplicates in {names}")
    return tuple(out), aliases


def _validate(value: Any) -> ValidatePlan:
    t = _table("validate", value)
    keys = ("prompts", "random_prompts", "steps", "budgets")
    _keys("validate", t, keys)
    d = ValidatePlan()
    prompts = _str_list("validate.prompts", t.get("prompts", []))
    rnd = t.get("random_prompts", [])
    if not isinstance(rnd, list):
        raise ExperimentError("validate.random_prompts must be a list of prompt lengths")
    random_prompts = tuple(_int("validate.random_prompts[]", n, lo=1) for n in rnd)
    if not prompts and not random_prompts:
        from engine.verify.validate import PROMPTS

        prompts = PROMPTS
    return ValidatePlan(
        prompts=prompts,
        random_prompts=random_prompts,
        steps=_int("validate.steps", t.get("steps", d.steps), lo=1),
        budgets=_budgets(t.get("budgets", {})),
    )


def _budgets(value: Any) -> tuple[tuple[str, tuple[tuple[str, float], ...]], ...]:
    """[validate.budgets.<numeric class>] tables: bounds that tighten the registry's budget of
    that class; a looser one, an unknown class or key is an error naming it."""
    from engine.errors import ConfigError
    from engine.verify.budgets import NUMERIC_BUDGETS

    t = _table("validate.budgets", value)
    out = []
    for cls, caps in sorted(t.items()):
        where = f"validate.budgets.{cls}"
        if cls not in NUMERIC_BUDGETS:
            raise ExperimentError(
                f"{where}: no numeric class {cls!r}; known: {', '.join(NUMERIC_BUDGETS)}"
            )
        caps = _table(where, caps)
        items = tuple(sorted((k, _num(f"{where}.{k}", v, 0.0)) for k, v in caps.items()))
        try:
            NUMERIC_BUDGETS[cls].tightened(**dict(items))
        except ConfigError as e:
            raise ExperimentError(f"{where}: {e}") from None
        out.append((cls, items))
    return tuple(out)


def parse_experiment(data: Mapping[str, Any], source: str = "<memory>") -> Experiment:
    """An Experiment from parsed TOML; raises ExperimentError naming any bad key or value."""
    top = (
        "name",
        "description",
        "models",
        "backends",
        "device_classes",
        "space",
        "objectives",
        "validate",
        "bench",
        "budget",
        "acceptance",
        "sampler",
        "promote",
        "start",
        "memory",
    )
    _keys("experiment", data, top)
    name = _typed("name", data.get("name", Path(source).stem), str, "a string")
    if not name or any(c in name for c in "/\\ ") or not name.isprintable():
        raise ExperimentError(
            f"name = {show(name)}: must be non-empty, without slashes, spaces or control characters"
        )
    if "models" not in data:
        raise ExperimentError("models: required (GGUF paths, checkpoint names or synthetic:tiny)")
    models = _str_list("models", data["models"])
    if not models:
        raise ExperimentError("models: at least one model")
    backends = _str_list("backends", data.get("backends", ["cuda", "vulkan", "numpy"]))
    for b in backends:
        _choice("backends[]", b, known_backends())
    classes_raw = data.get("device_classes", "all")
    classes = None if classes_raw == "all" else _str_list("device_classes", classes_raw)
    memory = _memory(data.get("memory", {}))
    objectives, served = _objectives(data.get("objectives"), memory.context_tokens)

    bench_t = _table("bench", data.get("bench", {}))
    _keys("bench", bench_t, ("pairs", "warmup"))
    bench = BenchPlan(
        objectives,
        pairs=_int("bench.pairs", bench_t.get("pairs", 5), lo=2),
        warmup=_int("bench.warmup", bench_t.get("warmup", 1), lo=0),
    )

    budget_t = _table("budget", data.get("budget", {}))
    _keys("budget", budget_t, ("trials", "wall_time_s", "trial_timeout_s"))
    budget = Budget(
        trials=_int("budget.trials", budget_t.get("trials", Budget.trials), lo=1),
        wall_time_s=_num("budget.wall_time_s", budget_t.get("wall_time_s", 0.0)),
        trial_timeout_s=_num("budget.trial_timeout_s", budget_t.get("trial_timeout_s", 300.0)),
    )
    if budget.trial_timeout_s <= 0:
        raise ExperimentError("budget.trial_timeout_s must be > 0")

    acc_t = _table("acceptance", data.get("acceptance", {}))
    _keys(
        "acceptance",
        acc_t,
        ("target", "min_gain", "confidence", "max_regression", "resamples", "confirm"),
    )
    target = acc_t.get("target", objectives[0].name)
    target = served.get(target, target)  # "decode_tok_s@served": the served objective's name
    _choice("acceptance.target", target, tuple(o.name for o in objectives))
    acceptance = Acceptance(
        target=target,
        min_gain=_num("acceptance.min_gain", acc_t.get("min_gain", 0.02)),
        confidence=_num("acceptance.confidence", acc_t.get("confidence", 0.95), 0.5, 0.9999),
        max_regression=_num("acceptance.max_regression", acc_t.get("max_regression", 0.0), 0, 1),
        resamples=_int("acceptance.resamples", acc_t.get("resamples", 2000), lo=100),
        confirm=_typed("acceptance.confirm", acc_t.get("confirm", True), bool, "true or false"),
    )

    s_t = _table("sampler", data.get("sampler", {}))
    _keys("sampler", s_t, ("name", "seed", "startup_trials", "screen_variants"))
    sampler = SamplerSpec(
        name=_choice("sampler.name", s_t.get("name", SamplerSpec.name), SAMPLERS),
        seed=_int("sampler.seed", s_t.get("seed", 0)),
        startup_trials=_int("sampler.startup_trials", s_t.get("startup_trials", 5), lo=1),
        screen_variants=_typed(
            "sampler.screen_variants", s_t.get("screen_variants", False), bool, "true or false"
        ),
    )
    if sampler.name == "cmaes" and len(objectives) > 1:
        raise ExperimentError(
            "sampler.name = 'cmaes' optimizes one objective; this experiment has "
            f"{len(objectives)}: use 'tpe' or 'nsga2', or keep one objective"
        )

    p_t = _table("promote", data.get("promote", {}))
    _keys("promote", p_t, ("enabled", "repo", "branch"))
    promote = PromoteSpec(
        enabled=_typed("promote.enabled", p_t.get("enabled", True), bool, "true or false"),
        repo=_choice("promote.repo", p_t.get("repo", "project"), PROMOTE_REPOS),
        branch=_typed("promote.branch", p_t.get("branch", "main"), str, "a branch name"),
    )

    exp = Experiment(
        name=name,
        source=source,
        models=models,
        backends=backends,
        device_classes=classes,
        space=_space(data.get("space", {})),
        objectives=objectives,
        validate=_validate(data.get("validate", {})),
        bench=bench,
        budget=budget,
        acceptance=acceptance,
        sampler=sampler,
        promote=promote,
        description=_typed("description", data.get("description", ""), str, "a string"),
        start=_starts(data.get("start", []), backends),
        memory=memory,
    )
    for i, ref in enumerate(models):
        if is_synthetic(ref):
            check_context(exp, f"models[{i}] = {show(ref)}", synthetic_context(ref))
    return _check_against_registry(exp)


def synthetic_context(ref: str) -> int:
    """The context of a ``synthetic:`` model, from engine.synth's presets (nothing written);
    an unknown preset, architecture or quant mix is refused here, not once per worker."""
    from engine.synth import ARCHS, HYBRID_ARCHS, HYBRID_PRESETS, PRESETS, QUANT_MIXES

    preset, arch, mix = synthetic_args(ref)
    presets = HYBRID_PRESETS if arch in HYBRID_ARCHS else PRESETS
    for what, value, allowed in (
        ("architecture", arch, ARCHS),
        ("preset", preset, tuple(presets)),
        ("quant mix", mix, QUANT_MIXES),
    ):
        if value not in allowed:
            raise ExperimentError(
                f"models: {show(ref)}: no synthetic {what} {show(value)}; known: "
                f"{', '.join(allowed)}"
            )
    return int(presets[preset].n_ctx)


def context_needed(exp: Experiment) -> tuple[int, str]:
    """The longest token sequence (prompt + generated) a trial asks of the model, and the keys
    that ask it. Text prompts are tokenized on the worker; each is at least one token."""
    steps = exp.validate.steps
    asks = [(steps + 1, f"validate.steps {steps} (+ a one-token prompt)")]
    asks += [
        (n + steps, f"validate.random_prompts {n} + validate.steps {steps}")
        for n in exp.validate.random_prompts
    ]
    asks += [
        (o.prompt_tokens + o.gen_tokens, f"objective {o.name}: prompt_tokens {o.prompt_tokens} + "
         f"gen_tokens {o.gen_tokens}")
        for o in exp.objectives
    ]  # fmt: skip
    return max(asks)


def check_context(exp: Experiment, model: str, n_ctx: int) -> None:
    """Refuse what the model's context cannot hold: every trial crashed with a MemoryError
    (46.6 TiB of KV cache) and the run still exited 0."""
    need, why = context_needed(exp)
    if need > n_ctx:
        raise ExperimentError(f"{why} = {need} tokens exceed the context of {model} ({n_ctx})")


def check_models(exp: Experiment) -> None:
    """Each model this machine can see: a path that exists (opened: a damaged GGUF is refused
    here) or a known checkpoint name, and its context against the experiment's lengths. Called
    by ``agent check`` and before ``agent run`` creates anything. A known checkpoint not
    cached here is checked by its worker."""
    from engine import checkpoints
    from engine.gguf_model import open_model

    for i, ref in enumerate(exp.models):
        where = f"models[{i}] = {show(ref)}"
        if is_synthetic(ref):
            continue  # checked at load
        path = Path(ref).expanduser()
        if not path.is_file():
            if path.exists():
                raise ExperimentError(f"{where}: not a file (a GGUF path or a checkpoint name)")
            if ref not in checkpoints.MODELS:
                raise ExperimentError(
                    f"{where}: no such file, and not a known checkpoint "
                    f"(known: {', '.join(sorted(checkpoints.MODELS))}, or synthetic:<preset>)"
                )
            if not checkpoints.is_cached(ref):
                continue
            path = checkpoints.cached_path(ref)
        check_context(exp, where, open_model(path).spec.n_ctx_train)


def _memory(value: Any) -> MemoryPlan:
    """[memory]: context_tokens (the context the experiment serves), and budget_bytes, or a
    reserve (reserve_bytes, or reserve_fraction of the device's memory) under the device's."""
    t = _table("memory", value)
    _keys("memory", t, ("context_tokens", "budget_bytes", "reserve_bytes", "reserve_fraction"))
    d = MemoryPlan()
    if "budget_bytes" in t and ("reserve_bytes" in t or "reserve_fraction" in t):
        raise ExperimentError(
            "memory: budget_bytes is a fixed budget; a reserve applies only without it: "
            "give one or the other"
        )
    budget = t.get("budget_bytes")
    return MemoryPlan(
        context_tokens=_int("memory.context_tokens", t.get("context_tokens", d.context_tokens), 1),
        budget_bytes=None if budget is None else _int("memory.budget_bytes", budget, lo=1),
        reserve_bytes=_int("memory.reserve_bytes", t.get("reserve_bytes", 0)),
        reserve_fraction=_num(
            "memory.reserve_fraction", t.get("reserve_fraction", d.reserve_fraction), 0.0, 0.9
        ),
    )


def _starts(value: Any, backends: tuple[str, ...]) -> tuple[StartConfig, ...]:
    """[[start]] tables: name, backend (the experiment's only one may be left out), config."""
    if not isinstance(value, list):
        raise ExperimentError("start must be an array of [[start]] tables")
    out, names = [], set()
    for i, item in enumerate(value):
        where = f"start[{i}]"
        t = _table(where, item)
        _keys(where, t, ("name", "backend", "config"))
        name = _typed(f"{where}.name", t.get("name", f"start{i}"), str, "a string")
        if name in names:
            raise ExperimentError(f"{where}.name = {show(name)}: used twice")
        names.add(name)
        if "backend" not in t and len(backends) != 1:
            raise ExperimentError(f"{where}.backend: required (this experiment has several)")
        backend = _choice(f"{where}.backend", t.get("backend", backends[0]), backends)
        config = _table(f"{where}.config", t.get("config"))
        if not config:
            raise ExperimentError(f"{where}.config: at least one 'op.knob' = value")
        out.append(StartConfig(name, backend, dict(config)))
    return tuple(out)


def _check_against_registry(exp: Experiment) -> Experiment:
    """Resolve every space against the registry now, so a typo fails at load, not mid-run.
    Backends with no kernels registered in this checkout are skipped with a warning."""
    from agent.space import build_space
    from engine.tuning import REGISTRY

    warnings = []
    spaces = []
    ordinal = exp.sampler.name == "cmaes"
    for backend in exp.backends:
        if backend not in REGISTRY.backends():
            warnings.append(f"backend {backend!r} has no kernels registered here: skipped")
            continue
        space = build_space(backend, exp.space_for(backend), ordinal)
        spaces.append((backend, ordinal, space))
        for st in exp.start:
            if st.backend == backend:
                _check_start(st, space)
    for s in exp.space:
        if s.backend not in exp.backends:
            raise ExperimentError(
                f"space.{s.backend}: backend not in backends = {list(exp.backends)}"
            )
    return Experiment(**{**exp.__dict__, "warnings": tuple(warnings), "spaces": tuple(spaces)})


def _check_start(st: StartConfig, space: SearchSpace) -> None:
    """Each knob a start config sets must be searched by the space with that value among its
    choices (else its trial could not be asked for: Optuna enqueues params, not configs)."""
    allowed: dict[str, set[Any]] = {}
    for o in space.ops:
        allowed.setdefault(o.variant_dim.key, set()).update(o.variant_dim.choices)
        for _, dims in o.params:
            for d in dims:
                allowed.setdefault(d.key, set()).update(d.choices)
    for key, value in st.config.items():
        if key not in allowed:
            raise ExperimentError(
                f"start {st.name!r}: {key} is not a knob of the {st.backend} space "
                "(an 'op.knob' the space searches or pins)"
            )
        if value not in allowed[key]:
            raise ExperimentError(
                f"start {st.name!r}: {key} = {show(value)} is outside the space's choices "
                f"{sorted(allowed[key], key=str)}"
            )


def load_experiment(path: str | Path) -> Experiment:
    path = Path(path)
    data = read_toml(path, "an experiment", ExperimentError)
    try:
        return parse_experiment(data, str(path))
    except ExperimentError as e:
        raise ExperimentError(f"{path}: {e}") from None
