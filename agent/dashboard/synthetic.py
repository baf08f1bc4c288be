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
from agent.records import TrialRecord
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
    cols = int(flat.get("matmul_prefill.max_cols", 32))
    kpar = flat["matmul_prefill.variant"] == "kpar"
    pre = 900.0 * (1.0 + 0.1 * (cols in (32, 64))) * (1.05 if kpar else 0.9)
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


def _record(
    name: str,
    number: int,
    rng: random.Random,
    flat: dict[str, Any],
    best: dict[str, Any],
    role: str,
    device_class: str,
    t0: float,
) -> tuple[TrialRecord, TrialState, list[float] | None]:
    worker = _worker(device_class, number % 2)
    common = {
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
    }
    roll = rng.random() if role == "candidate" else 1.0
    if roll < 0.06:
        reason = "glslc: error: 'rows_per_wg' : undeclared identifier\n(12 more lines)"
        return TrialRecord(outcome="compile_error", reason=reason, **common), TrialState.FAIL, None
    if roll < 0.12:
        val = {
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
        }
        rec = TrialRecord(
            outcome="invalid",
            reason="max_abs_diff 0.31 > 0.01 at index 4821",
            validate=val,
            **common,
        )
        return rec, TrialState.FAIL, None
    if roll < 0.14:
        return (
            TrialRecord(outcome="crash", reason="worker died: VK_ERROR_DEVICE_LOST", **common),
            (TrialState.FAIL),
            None,
        )
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
    accepted = role == "candidate" and estimates[OBJECTIVES[0]]["lower"] > 1.02
    val = {"passed": True, "max_abs_diff": 1.2e-4, "nmse": 3e-9, "steps": 8, "prompts": []}
    rec = TrialRecord(
        outcome="ok",
        metrics=metrics,
        samples=samples,
        estimates=estimates,
        accepted=accepted,
        paired_against=0,
        validate=val,
        decision={"accepted": accepted, "reason": "synthetic", "target": OBJECTIVES[0]},
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
    best_trial, best_metrics = 0, {}
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
        rec, state, values = _record(name, n, rng, flat, best, role, device_class, t0 + 3.0 * n)
        if rec.outcome == "ok" and (role == "baseline" or rec.accepted):
            best, best_trial, best_metrics = dict(flat), n, dict(rec.metrics)
        batch.append(
            optuna.trial.create_trial(
                params=params,
                distributions=dists,
                values=values,
                state=state,
                user_attrs=json.loads(json.dumps(rec.user_attrs())),
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
                "path": f"configs/{device_class}/qwen2.toml",
                "repo": "/srv/fleettune",
                "commit": f"{rng.getrandbits(160):040x}",
                "message": f"promote {device_class}/qwen2: {OBJECTIVES[0]}",
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


def write_fleet(status_path: Path, classes: tuple[str, ...], studies: list[str]) -> None:
    """A fleet status file as ``agent.fleet.write_status`` writes it."""
    workers = []
    for cls in classes:
        for i in range(2):
            workers.append(
                {
                    "worker_id": f"{cls}-{i}",
                    "device_class": cls,
                    "backend": "vulkan",
                    "state": "busy" if i == 0 else "idle",
                    "current": f"{studies[0]} #{1}" if i == 0 and studies else "",
                    "restarts": i,
                    "trials_done": 10 + i,
                    "noise": {"synthetic:tiny": {OBJECTIVES[0]: 0.004}},
                    "info": _worker(cls, i),
                }
            )
    now = time.time()
    write_status(
        status_path,
        {
            "agent": {
                "host": "head",
                "pid": 1,
                "experiment": "synthetic",
                "storage": "",
                "started": now - 60,
                "updated": now,
                "state": "running",
            },
            "workers": workers,
            "studies": [{"study": s} for s in studies],
        },
    )


def write_storage(url: str, trials: int, classes: tuple[str, ...] = ("r9700",)) -> list[str]:
    ref = parse_storage(url)
    storage = ref.open()
    names = [write_study(storage, c, trials, seed=i) for i, c in enumerate(classes)]
    write_fleet(ref.status_path, classes, names)
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
