"""A synthetic storage in the agent's shape, for the dashboard's speed benchmark and for looking
at the pages without a GPU: ``python -m agent.dashboard.synthetic --storage PATH --trials 10000``.

The studies carry the study user attrs the agent sets and ``agent.records.TrialRecord`` trial
attrs (outcomes, reasons, metrics, paired samples, estimates, validate diffs, worker), with Optuna
parameters named as ``agent.space`` names them (``<op>.variant``, ``<op>.<variant>.<param>``).
The numbers are made up (seeded): this is a fixture, not a measurement.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

import optuna
from optuna.distributions import CategoricalDistribution
from optuna.trial import TrialState

from agent.fleet import write_status
from agent.records import BUDGET_OUTCOMES, TrialRecord
from agent.space import build_space
from agent.space_rules import BackendSpace, OpRule, ParamRule
from agent.storage import parse_storage
from engine.tuning import TuningConfig

# A small part of the Vulkan registry's space, resolved by agent.space as a study's is: variants
# make knobs conditional, names and choices are the registry's.
SPACE = build_space(
    "vulkan",
    BackendSpace(
        "vulkan",
        ops=(
            OpRule("prefill", params=(ParamRule("chunk_tokens", choices=(64, 128, 256, 512)),)),
            OpRule(
                "matmul_prefill",
                ("kpar", "serial"),
                (
                    ParamRule("wg_size", choices=(64, 128, 256)),
                    ParamRule("max_cols", choices=(8, 16, 32, 64)),
                    ParamRule("subgroup_size", choices=(0,)),
                ),
            ),
            OpRule("matmul_decode", ("subgroup",), (ParamRule("subgroup_size", choices=(0,)),)),
        ),
    ),
)
OBJECTIVES = ("prefill_tok_s@64", "decode_tok_s@16")
SHAPE_KEY = "l28-c1536-ff8960-h12-kv2-d128-v151936-q4_k_m"  # the 1.5B (engine/tuning/shape.py)
BASE_CONFIG = TuningConfig.default("vulkan").flat()


def _suggest(rng: random.Random) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    """(Optuna params, their distributions, the flat config) of one random candidate."""
    params: dict[str, Any] = {}
    dists: dict[str, Any] = {}
    flat = dict(BASE_CONFIG)
    for o in SPACE.ops:
        names = o.variant_dim.choices
        variant = rng.choice(names)
        if len(names) > 1:
            params[o.variant_dim.name] = variant
            dists[o.variant_dim.name] = CategoricalDistribution(names)
        flat = {k: v for k, v in flat.items() if not k.startswith(o.op + ".")}
        flat[o.variant_dim.key] = variant
        for d in o.dims_of(variant):
            value = rng.choice(d.choices)
            if len(d.choices) > 1:
                params[d.name] = value
                dists[d.name] = CategoricalDistribution(d.choices)
            flat[d.key] = value
    return params, dists, flat


def _speed(flat: dict[str, Any]) -> tuple[float, float]:
    # Graded, so a run accepts a chain of several improvements, not one jump to the top.
    cols = {8: 0.9, 16: 1.0, 32: 1.06, 64: 1.12}[int(flat.get("matmul_prefill.max_cols", 16))]
    wg = {64: 0.97, 128: 1.0, 256: 1.04}[int(flat.get("matmul_prefill.wg_size", 128))]
    rows = int(flat.get("matmul_prefill.rows_per_wg", 1))
    kpar = 1.0 + 0.03 * rows.bit_length() if flat["matmul_prefill.variant"] == "kpar" else 0.9
    pre = 900.0 * cols * wg * kpar
    dec = 60.0 * (1.0 + 0.03 * int(flat.get("matmul_decode.rows_per_wg", 1) in (2, 4)))
    return pre, dec


def _worker(device_class: str, i: int) -> dict[str, Any]:
    return {
        "worker_id": f"{device_class}-{i}",
        "host": f"node-{i}",
        "node_id": f"{i:08x}" * 7,
        "pid": 1000 + i,
        "backend": "vulkan",
        "device_class": device_class,
        "device_name": "AMD Radeon AI PRO R9700" if device_class == "r9700" else "llvmpipe",
        "vendor": "AMD",
        "driver": "Mesa 25.0.0 RADV",
        "memory_bytes": 32 << 30,
        "engine_commit": "0" * 40,
    }


def _rec(study: str, trial: int, **attrs: Any) -> TrialRecord:
    """A record from its stored shape (JSON values), as the dashboard reads one back."""
    return TrialRecord.from_attrs(study, trial, attrs)


def _record(
    name: str,
    number: int,
    rng: random.Random,
    flat: dict[str, Any],
    best: dict[str, Any],
    role: str,
    device_class: str,
    t0: float,
    best_trial: int | None = None,
) -> tuple[TrialRecord, TrialState, list[float] | None]:
    common = _common(name, number, flat, best, role, device_class, t0)
    roll = rng.random() if role == "candidate" else 1.0
    if roll < 0.06:
        reason = "glslc: error: 'rows_per_wg' : undeclared identifier\n(12 more lines)"
        return _rec(outcome="compile_error", reason=reason, **common), TrialState.FAIL, None
    if roll < 0.12:
        rec = _rec(
            outcome="invalid",
            reason="max_abs_diff 0.31 > 0.01 at index 4821",
            validate=_failed_validation(),
            **common,
        )
        return rec, TrialState.FAIL, None
    if roll < 0.14:
        return (
            _rec(outcome="crash", reason="worker died: VK_ERROR_DEVICE_LOST", **common),
            (TrialState.FAIL),
            None,
        )
    return _measured(rng, flat, best, role, best_trial, common)


def _common(
    name: str,
    number: int,
    flat: dict[str, Any],
    best: dict[str, Any],
    role: str,
    device_class: str,
    t0: float,
) -> dict[str, Any]:
    """The attrs every synthetic record has, whatever its outcome."""
    worker = _worker(device_class, number % 2)
    return {
        "study": name,
        "trial": number,
        "role": role,
        "config": flat,
        "changed": {k: [best.get(k), v] for k, v in flat.items() if best.get(k) != v},
        "worker": worker,
        "host": worker["host"],
        "device": worker["device_name"],
        "driver": worker["driver"],
        "engine_commit": worker["engine_commit"],
        "started": t0,
        "finished": t0 + 3.0,
        "wall_s": 3.0,
        "overhead_s": 0.01,
        "gpu": {
            "source": "synthetic",
            "util_pct": 97.0,
            "mem_used_mib": 9000.0,
            "mem_total_mib": 32624.0,
            "sm_clock_mhz": 2350.0 - 10 * (number % 7),
            "mem_clock_mhz": 1258.0,
            "temp_c": 61.0 + number % 9,
            "power_w": 240.0,
        },
    }


def _failed_validation() -> dict[str, Any]:
    """An invalid trial's validate record: one prompt whose tokens diverge, and its blame."""
    return {
        "passed": False,
        "max_abs_diff": 0.31,
        "nmse": 2.4e-3,
        "steps": 8,
        "tolerances": {"max_abs_diff": 0.01, "nmse": 1e-5, "min_token_agreement": 1.0},
        "prompts": [
            {
                "prompt_tokens": 5,
                "max_abs_diff": 0.31,
                "nmse": 2.4e-3,
                "nan": 0,
                "inf": 0,
                "token_agreement": 0.25,
                "reference_tokens": [12, 7, 99, 3, 3, 8, 1, 0],
                "candidate_tokens": [12, 7, 41, 3, 3, 8, 1, 0],
                "reasons": ["max_abs_diff 0.31 > 0.01 at index 4821"],
            }
        ],
        # engine.verify.blame.Blame.to_dict(): the first op that diverges
        "blame": {
            "op": "matmul_prefill",
            "layer": 0,
            "text": "matmul_prefill (kpar, max_cols 48) layer 0 ffn_up: token 47 column 12 "
            "|diff| 3.1",
        },
    }


def _measured(
    rng: random.Random,
    flat: dict[str, Any],
    best: dict[str, Any],
    role: str,
    best_trial: int | None,
    common: dict[str, Any],
) -> tuple[TrialRecord, TrialState, list[float] | None]:
    """An ok trial: paired samples against the best, estimates, the acceptance decision."""
    pre, dec = _speed(flat)
    bpre, bdec = _speed(best)
    samples = {}
    estimates = {}
    metrics = {}
    for obj, c, b in ((OBJECTIVES[0], pre, bpre), (OBJECTIVES[1], dec, bdec)):
        cand = [c * (1 + rng.gauss(0, 0.01)) for _ in range(5)]
        ref = [b * (1 + rng.gauss(0, 0.01)) for _ in range(5)]
        samples[obj] = {"candidate": cand, "best": ref}
        ratio = sum(x / y for x, y in zip(cand, ref, strict=True)) / 5
        estimates[obj] = {
            "ratio": ratio,
            "lower": ratio - 0.01,
            "upper": ratio + 0.01,
            "pairs": 5,
            "confidence": 0.95,
        }
        metrics[obj] = sorted(cand)[2]
    est = estimates[OBJECTIVES[0]]
    threshold = 1.02
    accepted = role == "candidate" and est["lower"] > threshold
    sign = ">" if accepted else "<="
    why = (
        f"{OBJECTIVES[0]} x{est['ratio']:.3f}, lower bound {est['lower']:.3f} {sign} "
        f"{threshold:.3f} (min gain 0.020, A/A noise 0.004)"
    )
    val = {"passed": True, "max_abs_diff": 1.2e-4, "nmse": 3e-9, "steps": 8, "prompts": []}
    rec = _rec(
        outcome="ok",
        metrics=metrics,
        samples=samples,
        estimates=estimates,
        accepted=accepted,
        reason="" if accepted or role == "baseline" else why,
        paired_against=best_trial,
        validate=val,
        decision={
            "accepted": accepted,
            "reason": why,
            "target": OBJECTIVES[0],
            "threshold": threshold,
            "noise": 0.004,
        },
        phase_s={"compile_s": 0.5, "validate_s": 1.0, "bench_s": 1.5},
        **common,
    )
    return rec, TrialState.COMPLETE, [metrics[o] for o in OBJECTIVES]


def write_study(
    storage: optuna.storages.BaseStorage,
    device_class: str,
    trials: int,
    seed: int = 0,
    running: int = 1,
) -> str:
    """One study of ``trials`` trials (the last ``running`` left RUNNING); returns its name."""
    rng = random.Random(seed)
    name = f"synthetic/{device_class}/synthetic-qwen2-tiny-q4_k_m"
    study = optuna.create_study(
        study_name=name, storage=storage, directions=["maximize"] * len(OBJECTIVES)
    )
    attrs = {
        "experiment": "synthetic",
        "experiment_file": "experiments/synthetic.toml",
        "device_class": device_class,
        "backend": "vulkan",
        "model": "synthetic:tiny",
        "family": "qwen2",
        "objectives": list(OBJECTIVES),
        "target": OBJECTIVES[0],
        "baseline": {"config": BASE_CONFIG, "source": "default"},
    }
    for k, v in attrs.items():
        study.set_user_attr(k, v)
    best = dict(BASE_CONFIG)
    best_trial: int | None = None
    best_metrics: dict[str, float] = {}
    t0 = time.time() - trials * 3.0
    batch: list[optuna.trial.FrozenTrial] = []
    for n in range(trials):
        if n == 0:
            params, dists, flat, role = {}, {}, dict(BASE_CONFIG), "baseline"
        else:
            params, dists, flat = _suggest(rng)
            role = "candidate"
        if n >= trials - running:
            batch.append(
                optuna.trial.create_trial(
                    params=params,
                    distributions=dists,
                    state=TrialState.RUNNING,
                    user_attrs={"role": role},
                )
            )
            continue
        if role == "candidate" and n % 13 in (5, 11):  # a repeat, and a run cut short
            outcome = "duplicate" if n % 13 == 5 else "interrupted"
            attrs: dict[str, Any] = {"role": role, "outcome": outcome}
            if outcome == "duplicate":
                attrs["config"] = flat
            else:
                attrs["reason"] = "the agent stopped while this trial ran"
            state = TrialState.PRUNED if outcome == "duplicate" else TrialState.FAIL
            batch.append(
                optuna.trial.create_trial(
                    params=params, distributions=dists, state=state, user_attrs=attrs
                )
            )
            continue
        rec, state, values = _record(
            name, n, rng, flat, best, role, device_class, t0 + 3.0 * n, best_trial
        )
        if rec.outcome == "ok" and (role == "baseline" or rec.accepted):
            best, best_trial, best_metrics = dict(flat), n, dict(rec.metrics)
        batch.append(
            optuna.trial.create_trial(
                params=params,
                distributions=dists,
                values=values,
                state=state,
                user_attrs=json.loads(json.dumps(rec.to_attrs())),
            )
        )
    study.add_trials(batch)
    study.set_user_attr(
        "best", {"trial": best_trial, "config": best, "metrics": best_metrics, "at": time.time()}
    )
    if best_trial != 0:
        study.set_user_attr(
            "promotion",
            {
                "path": f"configs/{device_class}/qwen2/{SHAPE_KEY}.ctx4096.toml",
                "repo": "/srv/fleettune",
                "commit": f"{rng.getrandbits(160):040x}",
                "message": f"promote {device_class}/qwen2/{SHAPE_KEY} ctx4096: {OBJECTIVES[0]}",
                "at": time.time(),
                "evidence": {
                    "study": name,
                    "trial": best_trial,
                    "target": OBJECTIVES[0],
                    "ratio": 1.08,
                    "lower_bound": 1.05,
                    "confidence": 0.95,
                    "max_abs_diff": 1.2e-4,
                    "driver": "Mesa 25.0.0 RADV",
                },
            },
        )
    return name


def write_fleet(
    status_path: Path,
    classes: tuple[str, ...],
    studies: list[str],
    current: str = "",
    trials: int = 0,
    state: str = "running",
) -> None:
    """A fleet status file as ``agent.fleet.write_status`` writes it, with one earlier run."""
    workers = []
    for cls in classes:
        for i in range(2):
            workers.append(
                {
                    "worker_id": f"{cls}-{i}",
                    "device_class": cls,
                    "backend": "vulkan",
                    "state": "busy" if i == 0 else "idle",
                    "current": current if i == 0 and studies else "",
                    "current_since": time.time() - 42.0 if i == 0 and studies else None,
                    "restarts": i,
                    "trials_done": 10 + i,
                    "noise": {"synthetic:tiny": {OBJECTIVES[0]: 0.004}},
                    "info": _worker(cls, i),
                }
            )
    now = time.time()
    started = now - trials * 3.0 * 0.4  # the last 40% of the trials ran in this invocation
    agent = {
        "host": "head",
        "pid": 1,
        "experiment": "synthetic",
        "storage": "",
        "started": started,
        "updated": now,
        "state": state,
        "trial_timeout_s": 600.0,
        "wall_time_s": 0.0,
        "acceptance": {"target": OBJECTIVES[0], "min_gain": 0.02, "confidence": 0.95},
        "ray_dashboard": "",
    }
    earlier = {
        "host": "head",
        "pid": 2,
        "experiment": "synthetic",
        "started": now - trials * 3.0 - 60.0,
        "updated": started - 30,
        "state": "finished",
    }
    keys = ("host", "pid", "experiment", "started", "updated", "state")
    write_status(
        status_path,
        {
            "agent": agent,
            "invocations": [earlier, {k: agent[k] for k in keys}],
            "workers": workers,
            "studies": [
                {"study": s, "evaluated": 0, "budget": trials + 10, "in_flight": []}
                for s in studies
            ],
        },
    )


def _set_evaluated(
    status_path: Path, storage: optuna.storages.BaseStorage, names: list[str]
) -> None:
    data = json.loads(status_path.read_text())
    for entry in data["studies"]:
        study = optuna.load_study(study_name=entry["study"], storage=storage)
        entry["evaluated"] = sum(
            t.user_attrs.get("outcome") in BUDGET_OUTCOMES for t in study.get_trials(deepcopy=False)
        )
    write_status(status_path, data)


def write_storage(url: str, trials: int, classes: tuple[str, ...] = ("r9700",)) -> list[str]:
    ref = parse_storage(url)
    storage = ref.open()
    names = [write_study(storage, c, trials, seed=i) for i, c in enumerate(classes)]
    write_fleet(ref.status_path, classes, names, f"{names[0]} #{trials - 1}", trials)
    _set_evaluated(ref.status_path, storage, names)
    return names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m agent.dashboard.synthetic", description=__doc__)
    ap.add_argument("--storage", required=True, help="storage URL or path (created)")
    ap.add_argument("--trials", type=int, default=200)
    ap.add_argument("--classes", default="r9700", help="comma-separated device classes")
    a = ap.parse_args(argv)
    t = time.perf_counter()
    names = write_storage(a.storage, a.trials, tuple(a.classes.split(",")))
    print(f"wrote {', '.join(names)} ({a.trials} trials each) in {time.perf_counter() - t:.1f}s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
