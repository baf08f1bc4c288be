"""Validate: does a candidate config compute the same model as the reference path?

Reference: per-token prefill + greedy decode with the registry-default config on the same
backend. Candidate: batched prefill + decode with the candidate config, *teacher forced*: it
consumes the reference's token stream (prompt + the reference's greedy continuation), so both
paths see the same history at every step and one flipped near-tie cannot turn the rest of the
comparison into two different texts. Compared at the last prompt position, every decode step and
a sample of earlier prompt positions (every chunk edge, plus seeded picks): KL(ref || cand) of
the softmax in float64, top-1 agreement outside near-ties (reference top-1/top-2 margin below
the budget's ``near_tie``), NMSE, max |diff|, NaN/Inf. The candidate's device argmax must be the
first maximum of its own logits at every step (exact). The budget is the loosest of the numeric
classes of the candidate's variants (engine.verify.budgets, data in budgets.toml).

MoE routing near-ties: where the reference's k-th minus (k+1)-th router logit is below the budget's
``route_tie``, the candidate is made to choose the reference's experts (with its own weights), the
routing analogue of the top-1 near-tie: rounding that moves a router logit across a near-tie swaps a
whole expert (one such flip measured NMSE 0.25 under an fp16 GEMM, where the same run with the
choice borrowed is NMSE 5e-5; scripts/moe_fp16_flip.py, in git history). Over the prompt the choice
is also borrowed where the drift explains it: the candidate's router row agrees with the reference's
within the budget's ``op_nmse`` yet picks another top-k (engine.hybrid _drift_routes). route_tie,
calibrated on a 4-layer, 8-expert model, does not cover a correct fp16 path on the 40-layer,
256-expert 35B-A3B, whose router moves up to 0.041 by its last layers (scripts/moe_drift.py in git
history, docs/verify.md); a wrong router GEMM moves the row by more than op_nmse and a wrong top-k
kernel moves no logit, so neither is borrowed. Decode positions with a forced choice run without
graph replay (a replayed graph would keep the captured mask); free-running generation (graphs) is
forced only in the prompt, and a parting after a routing near-tie at a decode step is excused like
one at a top-1 near-tie.
Op-level replay (engine.verify.op_replay) then judges every hooked op of the candidate on the
reference's own inputs, each under its own variant's numeric class (``op_nmse``): what rejects a
bug. The end-to-end logits bound stays (a model-level failure still rejects, and fused kernels
that run only unhooked are seen only there); on recurrent hybrids it is the measured, looser
RECURRENT_END_TO_END of the registry, since a correct int8 path carries its rounding through the
recurrent state (docs/verify.md). A candidate passes when both pass.

Free-running greedy generation is also run and reported; it fails only when the two texts part
where the reference was not a near-tie. Prompts: the caller's, plus seeded random prompts whose
lengths sit on the candidate's chunk and tile edges (n - 1, n, n + 1 of max_cols, chunk_tokens,
gemm_min_t, tile_n ...), so a bug that shows only at a ragged chunk is not missed, and, when no
prompt is longer than the largest such knob, one that is (it crosses every boundary). On failure,
replay's first op over its bound is blamed; when every op passes replay, blame (engine.verify.blame)
names the first op that diverges end to end.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import numpy as np

from engine.errors import UnsupportedError
from engine.model import ForcedRun, Model
from engine.models import build_model
from engine.tuning import REGISTRY, TuningConfig
from engine.verify.blame import Blame, blame
from engine.verify.budgets import Budget, end_to_end, loosest
from engine.verify.op_replay import ReplayResult, merge, replay

log = logging.getLogger(__name__)

# Fixed prompts: a short one, one longer than small prefill chunks (several chunks, a ragged last
# chunk), code, and a single character (one-token prompts exercise the T == 1 prefill edge).
PROMPTS = (
    "The capital of France is",
    "In 1889 the Eiffel Tower was completed for the World's Fair in Paris. At 330 metres it was "
    "the tallest man-made structure in the world for four decades, and engineers still study "
    "how its wrought-iron lattice spreads the wind load. Visitors climb 674 steps to the second "
    "floor, or take one of the lifts that were themselves an engineering feat of the time; the "
    "top floor offers a view that, on a clear day, reaches more than seventy kilometres.",
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
    "    return a\n\nprint([fibonacci(i) for i in range(10)])",
    "A",
)

# Integer knobs whose values are token counts at which the batched path changes shape: those
# the registry declares edge (Param.edge).
EDGE_PARAMS = REGISTRY.edge_knobs()
MAX_EDGE_TOKENS = 160  # longer edge prompts cost more per-token reference than they find
# The crossing prompt's second chunk: batched (T > 1), a full 16-token tile and a ragged one.
SECOND_CHUNK_TOKENS = 17
SAMPLED_PROMPT_POSITIONS = 6  # seeded picks besides the chunk edges


@dataclass(frozen=True)
class Tolerances:
    """Explicit bounds that replace the class budget's (engine tests, ``engine validate``'s
    flags); None keeps the budget's. The agent never passes these: experiments tighten a class's
    budget through ``budgets`` (checked against the registry)."""

    max_abs_diff: float | None = None
    nmse: float | None = None
    kld_max: float | None = None
    kld_mean: float | None = None
    near_tie: float | None = None

    def apply(self, budget: Budget) -> Budget:
        given = {f.name: getattr(self, f.name) for f in fields(self)}
        return replace(budget, **{k: v for k, v in given.items() if v is not None})


@dataclass
class PositionStats:
    pos: int
    kld: float
    nmse: float
    max_abs_diff: float
    ref_top1: int
    cand_top1: int
    margin: float  # reference top-1 minus top-2 logit


@dataclass
class PromptResult:
    prompt_tokens: int
    positions: int  # compared
    max_abs_diff: float
    argmax_index: int  # vocabulary index of the largest difference
    nmse: float  # worst position
    kld_max: float
    kld_mean: float
    top1_checked: int  # positions outside near-ties
    top1_agree: int
    nan: int
    inf: int
    reference_tokens: list[int]
    candidate_tokens: list[int]  # free-running greedy (report)
    token_agreement: float  # matching prefix / steps, free running
    passed: bool
    reasons: list[str] = field(default_factory=list)
    worst: PositionStats | None = None
    routes_forced: int = 0  # (layer, position) router choices borrowed from the reference


@dataclass
class ValidateReport:
    passed: bool
    backend: str
    device_class: str
    candidate: dict[str, Any]
    tolerances: dict[str, float]  # the budget applied
    numeric_classes: list[str]
    steps: int
    prompts: list[PromptResult]
    cross_check: dict[str, Any] | None = None
    blame: Blame | None = None
    probe: list[str] = field(default_factory=list)  # argmax probe failures
    replay: ReplayResult | None = None  # op-level replay over every prompt (None: not run)
    # drift-explained routings borrowed over every prompt: (layer, position, reference gap)
    routes_borrowed: list[tuple[int, int, float]] = field(default_factory=list)
    # wall seconds per phase: reference (per-token runs, 0 when cached), candidate (forced and
    # free runs), probe, replay, blame; on the H200 a 35B-A3B validate took 145 s of a 148 s trial
    seconds: dict[str, float] = field(default_factory=dict)
    # the candidate on the ragged synthetic model (ragged_check): passed, reasons, blame
    ragged: dict[str, Any] | None = None

    @property
    def max_abs_diff(self) -> float:
        return max((p.max_abs_diff for p in self.prompts), default=0.0)

    @property
    def nmse(self) -> float:
        return max((p.nmse for p in self.prompts), default=0.0)

    @property
    def kld_max(self) -> float:
        return max((p.kld_max for p in self.prompts), default=0.0)

    @property
    def reasons(self) -> list[str]:
        out = [r for p in self.prompts for r in p.reasons] + list(self.probe)
        if self.replay is not None:
            out += self.replay.reasons()
        if self.ragged is not None:
            out += self.ragged["reasons"]
        if self.cross_check is not None and not self.cross_check.get("passed", True):
            out += [f"cross-check: {r}" for r in self.cross_check.get("reasons", [])]
        return out

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["max_abs_diff"], d["worst_nmse"], d["worst_kld"] = (
            self.max_abs_diff,
            self.nmse,
            self.kld_max,
        )
        d["blame"] = self.blame.to_dict() if self.blame else None
        if self.ragged is not None:
            b = self.ragged["blame"]
            d["ragged"] = {**self.ragged, "blame": b.to_dict() if b else None}
        d["replay"] = self.replay.to_dict() if self.replay else None
        return d


def compare_logits(ref: np.ndarray, cand: np.ndarray) -> tuple[float, int, float, int, int]:
    """(max |diff|, its index, NMSE, NaN count, Inf count) of candidate against reference."""
    ref64, cand64 = ref.astype(np.float64), cand.astype(np.float64)
    nan, inf = int(np.isnan(cand64).sum()), int(np.isinf(cand64).sum())
    diff = np.abs(np.nan_to_num(cand64 - ref64, nan=np.inf, posinf=np.inf, neginf=np.inf))
    idx = int(np.argmax(diff))
    nmse = float(np.sum((cand64 - ref64) ** 2) / max(np.sum(ref64 * ref64), 1e-30))
    return float(diff[idx]), idx, nmse if np.isfinite(nmse) else float("inf"), nan, inf


def kl_divergence(ref: np.ndarray, cand: np.ndarray) -> float:
    """KL(softmax(ref) || softmax(cand)) in float64; inf when the candidate is not finite."""
    r, c = ref.astype(np.float64), cand.astype(np.float64)
    if not np.all(np.isfinite(c)):
        return float("inf")
    lr = r - r.max()
    lr -= np.log(np.exp(lr).sum())
    lc = c - c.max()
    lc -= np.log(np.exp(lc).sum())
    return max(float(np.sum(np.exp(lr) * (lr - lc))), 0.0)


def margin(logits: np.ndarray) -> float:
    """Top-1 minus top-2 logit."""
    top2 = np.partition(logits.astype(np.float64), -2)[-2:]
    return float(top2[1] - top2[0])


def common_prefix(ref: list[int], cand: list[int]) -> int:
    n = 0
    for a, b in zip(ref, cand, strict=False):
        if a != b:
            break
        n += 1
    return n


def agreement(ref: list[int], cand: list[int]) -> float:
    return common_prefix(ref, cand) / max(len(ref), 1)


def edge_lengths(config: TuningConfig, cap: int = MAX_EDGE_TOKENS) -> list[int]:
    """Prompt lengths on the candidate's chunk and tile edges: n - 1, n, n + 1 for every
    token-count knob n, and 2 * n + 1 for the chunk and the column tile (a ragged third one)."""
    out = {2 * n + 1 for n in (config.prefill_chunk, column_tile(config))}
    for key, value in config.flat().items():
        if key.rpartition(".")[2] in EDGE_PARAMS and isinstance(value, int) and value > 1:
            out |= {value - 1, value, value + 1}
    return sorted(n for n in out if 2 <= n <= cap)


def column_tile(config: TuningConfig) -> int:
    """Tokens per pass of the batched matmul: the chunk, or a smaller max_cols column tile of
    the variant that reads one (matmul_prefill.max_cols on Vulkan, matmul_batched on CUDA)."""
    tiles = [v for k, v in config.flat().items() if k.endswith(".max_cols") and isinstance(v, int)]
    return min([config.prefill_chunk, *tiles])


def edge_prompts(config: TuningConfig, vocab: int, cap: int = MAX_EDGE_TOKENS) -> list[list[int]]:
    from engine.bench import bench_prompt

    return [bench_prompt(n, vocab, seed=7) for n in edge_lengths(config, cap)]


def crossing_length(config: TuningConfig, longest: int, limit: int) -> int | None:
    """The one prompt length that crosses every chunk and tile boundary the candidate's knobs
    create, when no prompt of ``longest`` tokens does yet: the largest token-count knob plus a
    second chunk of SECOND_CHUNK_TOKENS (a RoPE bug past the first chunk of 256 passed, every
    prompt fitting in one chunk; one token past it runs as T == 1, like decode). None
    when the prompts cross them already or the model's context (``limit``) cannot hold it."""
    knobs = [config.prefill_chunk, column_tile(config)]
    knobs += [
        v
        for k, v in config.flat().items()
        if k.rpartition(".")[2] in EDGE_PARAMS and isinstance(v, int)
    ]
    edge = max(knobs)
    if longest >= edge + 2:  # a prompt already runs a batched second chunk
        return None
    reach = min(edge + SECOND_CHUNK_TOKENS, limit)
    return reach if reach >= edge + 2 else None


def sample_positions(n_prompt: int, chunk: int, seed: int = 0) -> list[int]:
    """Earlier prompt positions compared: both edges of every chunk, plus seeded picks."""
    pos = set()
    for c0 in range(0, n_prompt, chunk):
        pos |= {c0, min(c0 + chunk, n_prompt) - 1}
    rng = np.random.default_rng(seed + n_prompt)
    pos |= {int(p) for p in rng.integers(0, n_prompt, size=SAMPLED_PROMPT_POSITIONS)}
    return sorted(p for p in pos if p < n_prompt - 1)


def reference_run(
    model: Model, reference: TuningConfig, prompt: list[int], steps: int, cache: dict | None
) -> ForcedRun:
    """Per-token greedy run of the reference, logits at every prompt position and, for a MoE
    model, router logits at every (layer, position) (cached)."""
    key = (tuple(sorted(reference.flat().items())), tuple(prompt), steps)
    run = cache.get(key) if cache is not None else None
    if run is None:
        model.set_config(reference)
        sample = frozenset(range(len(prompt)))
        if model.spec.moe is None:
            run = model.forced_run(prompt, steps, "per_token", sample=sample)
        else:
            run = _recording_router(model, prompt, steps, sample)
        if cache is not None:
            cache[key] = run
    return run


def _recording_router(model: Model, prompt: list[int], steps: int, sample: frozenset) -> ForcedRun:
    router: dict[tuple[int, int], np.ndarray] = {}
    outer = model.hook

    def hook(op: str, label: str, layer: int, t: Any, pos0: int) -> None:
        if label == "ffn_gate_inp":
            for j, row in enumerate(model.backend.download(t)):
                router[(layer, pos0 + j)] = np.asarray(row, dtype=np.float64)
        if outer is not None:
            outer(op, label, layer, t, pos0)

    model.hook = hook
    try:  # graphs off: a replayed decode step would not pass the hook
        run = model.forced_run(prompt, steps, "per_token", sample=sample, graphs=False)
    finally:
        model.hook = outer
    run.router = router
    return run


def near_tie_routes(
    router: dict[tuple[int, int], np.ndarray], k: int, bound: float
) -> dict[tuple[int, int], np.ndarray]:
    """(layer, position) -> the reference's top-k expert ids where its k-th minus (k+1)-th router
    logit is below ``bound`` (ties broken toward the lower id, like router_topk's stable sort)."""
    out = {}
    for key, z in router.items():
        order = np.argsort(-z, kind="stable")
        if z[order[k - 1]] - z[order[k]] < bound:
            out[key] = order[:k].copy()
    return out


def judge(
    ref: ForcedRun, cand: ForcedRun, positions: list[int], budget: Budget
) -> tuple[list[PositionStats], list[str], int, int, int, int]:
    """Per-position statistics and the reasons the candidate fails (empty: it passes)."""
    stats, reasons = [], []
    nan = inf = checked = agree = 0
    for pos in positions:
        r, c = ref.logits[pos], cand.logits[pos]
        mad, _, nmse, n_nan, n_inf = compare_logits(r, c)
        nan, inf = nan + n_nan, inf + n_inf
        s = PositionStats(
            pos, kl_divergence(r, c), nmse, mad, int(np.argmax(r)), int(np.argmax(c)), margin(r)
        )
        stats.append(s)
        if s.margin >= budget.near_tie:
            checked += 1
            if s.ref_top1 == s.cand_top1:
                agree += 1
            elif not any("top-1" in x for x in reasons):
                reasons.append(
                    f"top-1 differs at position {pos}: reference {s.ref_top1}, candidate "
                    f"{s.cand_top1} (reference margin {s.margin:.3g} >= near-tie "
                    f"{budget.near_tie:g})"
                )
    for pos, tok in cand.device_argmax.items():
        first = int(np.argmax(cand.logits[pos]))
        if tok != first:
            reasons.append(
                f"device argmax {tok} at position {pos} is not the first maximum {first} of "
                "the candidate's own logits"
            )
            break
    if nan or inf:
        reasons.append(f"{nan} NaN and {inf} Inf in candidate logits")
    worst = lambda k: max(stats, key=lambda s: getattr(s, k))  # noqa: E731
    checks = [
        ("kld", budget.kld_max, "KLD"),
        ("nmse", budget.nmse, "NMSE"),
        ("max_abs_diff", budget.max_abs_diff, "max_abs_diff"),
    ]
    for key, bound, name in checks:
        w = worst(key)
        if not getattr(w, key) <= bound:
            reasons.append(f"{name} {getattr(w, key):.3g} > {bound:g} at position {w.pos}")
    mean_kld = float(np.mean([s.kld for s in stats]))
    if not mean_kld <= budget.kld_mean:
        reasons.append(f"mean KLD {mean_kld:.3g} > {budget.kld_mean:g}")
    return stats, reasons, nan, inf, checked, agree


def argmax_probe(model: Model, vocab: int) -> list[str]:
    """The candidate's argmax kernel on rows with planted ties: the first maximum must win
    (model logits almost never tie exactly, so a wrong tie-break needs a probe)."""
    b = model.backend
    rng = np.random.default_rng(vocab)
    out = []
    cases = [
        [vocab // 3 + 1, (2 * vocab) // 3, vocab - 1],
        [0, vocab - 1],
        [vocab // 2, vocab // 2 + 1],
        [vocab - 2, vocab - 1],
    ]
    for where in cases:
        row = rng.uniform(-1.0, 1.0, size=(1, vocab)).astype(np.float32)
        row[0, where] = 3.0
        got = int(b.download(b.ops.argmax(b.upload(row)))[0])
        if got != min(where):
            out.append(f"argmax of a row tied at {where} is {got}, not the first maximum")
    return out


def validate(
    model: Model, candidate: TuningConfig, *args: Any, ragged: bool = True, **kw: Any
) -> ValidateReport:
    """Judge ``candidate`` (see _validate) with the backend's poison on: every output and
    scratch buffer allocated during the runs starts as NaN / -1, so an element a kernel leaves
    unwritten fails every time instead of when stale memory happened to lose. ``ragged``: when
    it passes, judge it once more on the ragged synthetic model (ragged_check)."""
    be = model.backend
    was, be.poison = be.poison, True
    try:
        rep = _validate(model, candidate, *args, **kw)
        if ragged and rep.passed:
            rep.ragged = ragged_check(model, candidate, **_ragged_kw(kw))
            rep.seconds["ragged"] = rep.ragged["seconds"]
            if not rep.ragged["passed"]:
                rep.passed = False
                if kw.get("blame_failures", True) and rep.ragged["blame"] is not None:
                    rep.blame = rep.ragged["blame"]
        return rep
    finally:
        be.poison = was
        model.set_config(candidate)


def _ragged_kw(kw: dict[str, Any]) -> dict[str, Any]:
    keep = ("tol", "reference", "budgets", "blame_failures", "replay_ops")
    return {k: v for k, v in kw.items() if k in keep}


RAGGED_PRESET = ("qwen2", "ragged", "q4_k_m")  # engine.synth: rows no tile size divides
RAGGED_STEPS = 3


def ragged_model(backend: Any) -> tuple[Model, dict[Any, Any]]:
    """The ragged synthetic model on ``backend`` (written into the cache once) and its reference
    cache (kept per backend). The model is built for each check and dropped after it, so its
    weights never count in the served model's footprint (engine.footprint)."""
    held = getattr(backend, "_validate_ragged", None)  # (path, reference cache)
    if held is None:
        from engine.checkpoints import cache_dir
        from engine.gguf_model import open_model
        from engine.synth import write_synthetic

        arch, preset, mix = RAGGED_PRESET
        path = cache_dir() / "validate" / f"{arch}-{preset}-{mix}.gguf"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
            write_synthetic(tmp, arch=arch, preset=preset, quant_mix=mix, progress=False)
            tmp.replace(path)  # whole or absent
        held = backend._validate_ragged = (path, {})
    path, cache = held
    from engine.gguf_model import open_model

    return build_model(open_model(path), backend), cache


def ragged_check(model: Model, candidate: TuningConfig, **kw: Any) -> dict[str, Any]:
    """The candidate on the ragged synthetic model (F = 688, V = 509: rows no tile divides),
    one short prompt past its column tile and a few decode steps: a kernel that skips a
    partial row block passed on a model whose rows all fill their blocks. Skipped (passed) on
    a model that is itself ragged. {passed, reasons, blame, seconds}."""
    from engine.bench import bench_prompt

    t = time.perf_counter()
    if model.spec.name.startswith(f"synthetic-{RAGGED_PRESET[0]}-{RAGGED_PRESET[1]}"):
        return {"passed": True, "reasons": [], "blame": None, "seconds": 0.0}
    rmodel, cache = ragged_model(model.backend)
    n = min(column_tile(candidate), 32) + 5  # a ragged last tile, and T == 1 decode steps
    try:
        rep = _validate(
            rmodel, candidate, [bench_prompt(n, rmodel.spec.n_vocab, seed=5)], RAGGED_STEPS,
            ref_cache=cache, edges=False, **kw,
        )  # fmt: skip
    except UnsupportedError as e:  # a variant for the served model's types, not the ragged F16
        log.info("ragged check skipped: %s", e)
        return {"passed": True, "reasons": [], "blame": None, "skipped": str(e), "seconds": 0.0}
    finally:
        del rmodel  # its weights go now (Backend tracks them weakly), not with the backend
    return {
        "passed": rep.passed,
        "reasons": [f"ragged model: {r}" for r in rep.reasons],
        "blame": rep.blame,
        "seconds": round(time.perf_counter() - t, 3),
    }


def _validate(
    model: Model,
    candidate: TuningConfig,
    prompts: list[list[int]],
    steps: int = 8,
    tol: Tolerances | None = None,
    reference: TuningConfig | None = None,
    ref_cache: dict[Any, Any] | None = None,
    budgets: dict[str, Budget] | None = None,
    edges: bool = True,
    blame_failures: bool = True,
    replay_ops: bool = True,
    drift_routes: bool = True,
) -> ValidateReport:
    """Judge ``candidate`` against the reference on each tokenized prompt (plus edge prompts
    when ``edges``); leaves the model on the candidate.

    ``budgets`` replaces the registry's per-class budgets (an experiment's tightened ones);
    ``tol`` then overrides single bounds. ``ref_cache`` (one dict per loaded model, kept by the
    caller) holds reference runs by (reference config, prompt, steps): the per-token reference
    is the slow half of a validate and does not change between candidates; one computed before
    any candidate ran is also the safer one (a candidate that corrupted device state cannot
    bend it); it keeps the replay's reference recordings too, within engine.verify.op_replay's
    CACHE_BYTES. ``replay_ops``: run the op-level replay (op_replay) on every prompt."""
    reference = reference or TuningConfig.default(candidate.backend)
    op_classes = model.backend.numeric_classes(candidate)
    budget, classes = loosest(op_classes.values(), end_to_end(budgets, model.spec.hybrid))
    if tol is not None:
        budget = tol.apply(budget)
    all_prompts = _with_edges(model, candidate, prompts, steps) if edges else _given(prompts)
    clock = _Phases()
    refs = [reference_run(model, reference, p, steps, ref_cache) for p in all_prompts]
    clock.lap("reference")
    model.set_config(candidate)
    results, routes_of, borrowed_all = [], [], []
    for p, ref in zip(all_prompts, refs, strict=True):
        result, routes, borrowed = _judge_prompt(
            model, candidate, p, ref, steps, budget, drift_routes
        )
        results.append(result)
        routes_of.append(routes)
        borrowed_all += borrowed
    clock.lap("candidate")
    probe = argmax_probe(model, model.spec.n_vocab)
    clock.lap("probe")
    replays = []
    if replay_ops:  # each op on the reference's inputs (routing forced nowhere: inputs agree)
        replays = [
            replay(model, reference, candidate, p, ref.tokens, steps, budgets, ref_cache)
            for p, ref in zip(all_prompts, refs, strict=True)
        ]
    replayed = merge(replays) if replays else None
    clock.lap("replay")
    dev = model.backend.device_info()
    rep = ValidateReport(
        all(r.passed for r in results) and not probe and (replayed is None or replayed.passed),
        candidate.backend,
        dev.device_class,
        candidate.flat(),
        asdict(budget),
        classes,
        steps,
        results,
        probe=probe,
        replay=replayed,
        routes_borrowed=borrowed_all,
    )
    if blame_failures:
        first = [(len(p), r.first) for p, r in zip(all_prompts, replays, strict=False) if r.first]
        if first:  # on the reference's inputs: the op itself, no drift (replays is [] when off)
            rep.blame = min(first, key=lambda f: f[0])[1]
        elif not rep.passed:
            rep.blame = _end_to_end_blame(
                rep, model, reference, candidate, all_prompts, budget, routes_of, ref_cache,
                budgets, tol,
            )  # fmt: skip
            clock.lap("blame")
    rep.seconds = clock.seconds
    return rep


def _given(prompts: list[list[int]]) -> list[list[int]]:
    return [list(p) for p in prompts if p]


def _with_edges(
    model: Model, candidate: TuningConfig, prompts: list[list[int]], steps: int
) -> list[list[int]]:
    """The caller's prompts, then the candidate's edge prompts not among them, then one that
    crosses every boundary when no prompt is longer than the largest edge knob."""
    out = _given(prompts)
    seen = {tuple(p) for p in out}
    vocab = model.spec.n_vocab
    out += [p for p in edge_prompts(candidate, vocab) if tuple(p) not in seen]
    longest = max((len(p) for p in out), default=0)
    reach = crossing_length(candidate, longest, model.spec.n_ctx_train - steps)
    if reach is not None:
        from engine.bench import bench_prompt

        out.append(bench_prompt(reach, vocab, seed=7))
    return out


def _judge_prompt(
    model: Model,
    candidate: TuningConfig,
    p: list[int],
    ref: ForcedRun,
    steps: int,
    budget: Budget,
    drift_routes: bool,
) -> tuple[PromptResult, dict[tuple[int, int], np.ndarray], list[Any]]:
    """The candidate teacher forced on the reference's stream of one prompt, and its free-running
    generation; the result, the routes forced at near-ties and those borrowed for drift."""
    P, chunk, moe = len(p), candidate.prefill_chunk, model.spec.moe
    sample = sample_positions(P, min(chunk, column_tile(candidate)))
    routes = near_tie_routes(ref.router, moe.n_expert_used, budget.route_tie) if moe else {}
    graphs = not any(pos >= P for _, pos in routes)
    _set_routes(model, routes)
    if moe and drift_routes:  # drift-explained routing over the prompt (hybrid _drift_routes)
        model.route_ref = {key: z for key, z in ref.router.items() if key[1] < P}
        model.route_nmse, model.routes_borrowed = budget.op_nmse, []
    cand = model.forced_run(
        p, steps, "batched", forced=ref.tokens, sample=frozenset(sample), graphs=graphs
    )
    borrowed = list(getattr(model, "routes_borrowed", []))
    if moe:
        model.route_ref = {}
    positions = sorted(cand.logits)
    stats, reasons, nan, inf, checked, agree = judge(ref, cand, positions, budget)
    _set_routes(model, {key: v for key, v in routes.items() if key[1] < P})  # graphs decode
    free = model.generate(p, steps, path="batched").tokens
    _set_routes(model, {})
    ag = agreement(ref.tokens, free)
    k = common_prefix(ref.tokens, free)
    # decode steps up to the parting whose routing was a near-tie (not forced: graphs)
    tied = sorted({pos for _, pos in routes if P <= pos <= P - 1 + k})
    if k < len(ref.tokens) and not tied:
        m = margin(ref.logits[P - 1 + k])
        if m >= budget.near_tie:
            reasons.append(
                f"free-running greedy tokens part at step {k} where the reference margin "
                f"is {m:.3g} >= near-tie {budget.near_tie:g} (reference {ref.tokens}, "
                f"candidate {free})"
            )
    worst = max(stats, key=lambda s: (s.kld, s.nmse))
    mad_at = max(stats, key=lambda s: s.max_abs_diff).pos
    _, idx, _, _, _ = compare_logits(ref.logits[mad_at], cand.logits[mad_at])
    result = PromptResult(
        P, len(stats), max(s.max_abs_diff for s in stats), idx,
        max(s.nmse for s in stats), max(s.kld for s in stats),
        float(np.mean([s.kld for s in stats])), checked, agree, nan, inf,
        list(ref.tokens), free, ag, not reasons, reasons, worst,
        len(routes) + len(borrowed),
    )  # fmt: skip
    return result, routes, borrowed


def _end_to_end_blame(
    rep: ValidateReport,
    model: Model,
    reference: TuningConfig,
    candidate: TuningConfig,
    all_prompts: list[list[int]],
    budget: Budget,
    routes_of: list[dict[tuple[int, int], np.ndarray]],
    ref_cache: dict[Any, Any] | None,
    budgets: dict[str, Budget] | None,
    tol: Tolerances | None,
) -> Blame | None:
    """Who failed a candidate that every replayed op passed: the first op whose activations part
    end to end, else the sampler (a wrong device argmax), else a fused kernel that runs only
    unhooked; leaves the model on the candidate."""
    results, steps = rep.prompts, rep.steps
    found = blame_report(
        model, reference, candidate, all_prompts, results, budget, steps, routes_of
    )
    argmax_wrong = rep.probe or any("device argmax" in r for r in rep.reasons)
    if found is None and argmax_wrong:  # every op's output agreed: the sampler did not
        found = _argmax_blame(model, candidate)
    elif found is None:  # the hooked ops agreed: the fault is in a fused kernel
        failed = [p for p, r in zip(all_prompts, results, strict=True) if not r.passed]
        bad = min(failed, key=len) if failed else None  # the cheapest to run again
        found = _fusion_blame(model, candidate, bad, steps, reference, ref_cache, budgets, tol)
    model.set_config(candidate)
    return found


class _Phases:
    """Wall seconds per named phase, each from the end of the previous one."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = round(now - self._t, 3)
        self._t = now


def _argmax_blame(model: Model, candidate: TuningConfig) -> Blame:
    op = model.backend.registry_op("argmax", 1)
    choice = candidate.op(op)
    return Blame(op, choice.variant, choice.as_dict(), "greedy token", -1, -1, -1, 0.0, 0.0)


def _fusion_blame(
    model: Model,
    candidate: TuningConfig,
    prompt: list[int] | None = None,
    steps: int = 0,
    reference: TuningConfig | None = None,
    ref_cache: dict[Any, Any] | None = None,
    budgets: dict[str, Budget] | None = None,
    tol: Tolerances | None = None,
) -> Blame | None:
    """The registry op whose fused kernels (which the hooked replay bypasses) the failure is in:
    with several, the one whose fusions turned off (its ``fuse_*`` knobs at 0) let the failing
    ``prompt`` pass end to end; else the first one."""
    ops = model.backend.hook_bypassed_fusions(candidate)
    if not ops:
        return None
    culprit, label = ops[0], "fused schedule (the hooked, unfused ops agree)"
    tries = [(op, off) for op in ops if (off := _fusions_off(candidate, op)) is not None]
    for op, off in tries if prompt is not None and len(ops) > 1 else []:
        rep = validate(
            model, off, [prompt], steps, tol=tol, reference=reference, ref_cache=ref_cache,
            budgets=budgets, edges=False, blame_failures=False, replay_ops=False, ragged=False,
        )  # fmt: skip
        model.set_config(candidate)
        if rep.passed:
            culprit = op
            label = f"fused schedule: passes with {op}'s fusions off (the hooked ops agree)"
            break
    choice = candidate.op(culprit)
    return Blame(culprit, choice.variant, choice.as_dict(), label, -1, -1, -1, 0.0, 0.0)


def _fusions_off(candidate: TuningConfig, op: str) -> TuningConfig | None:
    """``candidate`` with ``op``'s fuse_* knobs at 0; None when it has none on."""
    flat = candidate.flat()
    on = [k for k, v in flat.items() if k.startswith(f"{op}.fuse_") and v]
    if not on:
        return None
    return TuningConfig.from_flat(candidate.backend, {**flat, **dict.fromkeys(on, 0)})


def blame_report(
    model: Model,
    reference: TuningConfig,
    candidate: TuningConfig,
    prompts: list[list[int]],
    results: list[PromptResult],
    budget: Budget,
    steps: int,
    routes_of: list[dict[tuple[int, int], np.ndarray]] | None = None,
) -> Blame | None:
    """Blame on the shortest failing prompt (cheapest to replay with every op hooked), with the
    routing near-ties validate forced on it still forced (on both runs: the reference's own
    choice changes nothing there), so a routing flip validate excused is not blamed."""
    routes_of = routes_of or [{} for _ in prompts]
    failing = [
        (len(p), i) for i, (p, r) in enumerate(zip(prompts, results, strict=True)) if not r.passed
    ]
    if not failing:
        return None
    _, i = min(failing)
    _set_routes(model, routes_of[i])
    try:
        return blame(
            model, model, prompts[i], steps, budget.op_nmse, ref_config=reference,
            cand_config=candidate,
        )  # fmt: skip
    finally:
        _set_routes(model, {})


def _set_routes(model: Model, routes: dict[tuple[int, int], np.ndarray]) -> None:
    if hasattr(model, "routes"):  # a MoE (hybrid) model
        model.routes = routes


def tokenize_prompts(tokenizer: Any, texts: tuple[str, ...] = PROMPTS) -> list[list[int]]:
    return [tokenizer.encode(t) for t in texts]
