"""Coordinate descent (agent/coordinate.py) through the agent's own study (agent/study.py): one
dimension at a time from the incumbent, a move to a better trial, failed configs tried but never a
centre, and a finite space run to exhaustion without a repeat. And grid, the other exhaustive
sampler, covers the batched-prefill tile table that engine/sweep.py's ``--grid prefill`` ran (git
history)."""

from __future__ import annotations

import itertools
from typing import Any

import optuna
import pytest

from agent.coordinate import CoordinateSampler
from agent.experiment import ExperimentError, parse_experiment
from agent.records import TrialRecord
from agent.samplers import make_sampler
from agent.space import config_key, space_configs
from agent.study import StudyState
from engine.tuning import REGISTRY, TuningConfig

SPACE = {
    "prefill": {"chunk_tokens": [8, 16, 32, 64]},
    "matmul_decode": {},  # variants cached_f32 (the default), ondemand
    "delta_net": {},  # sequential (the default), chunked: its knob chunk only with it
}


def _study(sampler: str = "coordinate", space: dict | None = None) -> StudyState:
    exp = parse_experiment(
        {
            "models": ["synthetic:tiny"],
            "backends": ["numpy"],
            "objectives": [{"metric": "prefill_tok_s", "prompt_tokens": 32}],
            "space": {"numpy": space or SPACE},
            "budget": {"trials": 500},
            "sampler": {"name": sampler},
        }
    )
    base = TuningConfig.default("numpy").flat()
    storage = optuna.storages.InMemoryStorage()
    return StudyState(exp, "cpu", "numpy", "synthetic:tiny", "qwen2", storage, base, "default")


def _score(flat: dict[str, Any]) -> float:
    """Separable: chunk 8 best, ondemand better, chunked with chunk 16 best of delta_net."""
    s = 10.0 + {8: 3.0, 16: 1.0, 32: 0.0, 64: -1.0}[flat["prefill.chunk_tokens"]]
    s += 2.0 if flat["matmul_decode.variant"] == "ondemand" else 0.0
    if flat["delta_net.variant"] == "chunked":
        s += 1.0 + (2.0 if flat["delta_net.chunk"] == 16 else 0.0)
    return s


def _changed(a: dict[str, Any], b: dict[str, Any]) -> set[str]:
    """The dimensions in which b differs from a: a knob, or an op's variant (its knobs with it)."""
    keys = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)}
    switched = {k.partition(".")[0] for k in keys if k.endswith(".variant")}
    return {k for k in keys if k.partition(".")[0] not in switched} | {
        f"{op}.variant" for op in switched
    }


def _tell(st: StudyState, trial: optuna.Trial, flat: dict, role: str, value: float | None) -> None:
    outcome = "ok" if value is not None else "invalid"
    st.finish(
        trial,
        TrialRecord(st.name, trial.number, role, outcome, config=flat),
        (None if value is None else [value]),
    )
    st.flush()


def test_walks_one_dimension_at_a_time_from_the_best_and_ends_exhausted() -> None:
    """Every candidate is one dimension away from the best so far (a variant switch brings its
    knobs at their registry defaults); the walk reaches the separable optimum well before the
    space is used up, and then goes on to every other config once before the agent calls the
    space exhausted."""
    st = _study()
    assert isinstance(st.study.sampler, CoordinateSampler)
    seen: list[str] = []
    best: tuple[float, dict] | None = None
    optimum_at = None
    while (asked := st.ask()) is not None:
        trial, flat, role = asked
        if best is None:
            assert role == "baseline" and flat == st.baseline
        elif optimum_at is None:
            assert len(_changed(best[1], flat)) == 1, (best[1], flat)
            if flat["delta_net.variant"] == "chunked" and best[1]["delta_net.variant"] != "chunked":
                assert flat["delta_net.chunk"] == 64  # the registry default of chunked.chunk
        seen.append(config_key(flat))
        value = _score(flat)
        _tell(st, trial, flat, role, value)
        if best is None or value > best[0]:
            best = (value, flat)
        if value == 18.0 and optimum_at is None:
            optimum_at = len(seen)
    assert best is not None and best[0] == 18.0
    assert optimum_at is not None and optimum_at <= 16 < st.space.size == 4 * 2 * 6
    assert len(seen) == len(set(seen)) == st.space.size
    assert st.exhausted


def test_the_first_candidates_sweep_one_knob_then_move_to_the_best() -> None:
    """From the baseline (chunk 32, cached_f32, sequential): chunk_tokens through its choices
    in order; the first better one (8) becomes the centre and the walk finishes that knob's
    sweep from there (16, 64) before it turns to the next dimension."""
    st = _study(space={"prefill": {"chunk_tokens": [8, 16, 32, 64]}, "matmul_decode": {}})
    order = []
    for _ in range(6):
        trial, flat, role = st.ask()
        order.append((flat["prefill.chunk_tokens"], flat["matmul_decode.variant"]))
        _tell(st, trial, flat, role, _score(flat | {"delta_net.variant": "sequential"}))
    assert order == [
        (32, "cached_f32"),  # the baseline
        (8, "cached_f32"),  # better: the centre from here
        (16, "cached_f32"),
        (64, "cached_f32"),
        (8, "ondemand"),  # the next dimension, from chunk 8
        (16, "ondemand"),  # ondemand won: chunk_tokens again around it
    ]


def test_a_failed_neighbour_is_tried_once_and_never_a_centre() -> None:
    """Configs that fail (told PRUNED with the violated constraint, as the agent does) are
    never suggested again and never walked from, however the sampler would have scored them."""
    st = _study(space={"prefill": {"chunk_tokens": [8, 16, 32, 64]}, "matmul_decode": {}})
    asked = []
    while (a := st.ask()) is not None:
        trial, flat, role = a
        asked.append(flat)
        failed = flat["matmul_decode.variant"] == "ondemand"
        _tell(st, trial, flat, role, None if failed else _score(flat | {"delta_net.variant": "x"}))
    assert len({config_key(f) for f in asked}) == len(asked) == 8
    # the walk reached chunk 8 on the float path, then only the failed variant's configs were
    # left: none of them was a centre, so none was followed by its own one-knob neighbour
    fails = [i for i, f in enumerate(asked) if f["matmul_decode.variant"] == "ondemand"]
    first = asked[fails[0]]
    assert first["prefill.chunk_tokens"] == 8  # the switch tried from the best float config


def test_an_incumbent_in_flight_is_walked_from_before_it_completes() -> None:
    """Two workers: the second asks while the baseline still runs; it gets a neighbour of the
    baseline, not a random draw."""
    st = _study(space={"prefill": {"chunk_tokens": [8, 16, 32, 64]}, "matmul_decode": {}})
    _, base, _ = st.ask()
    _, second, _ = st.ask()
    assert len(_changed(base, second)) == 1


def test_coordinate_sampler_in_the_factory_and_the_experiment_format() -> None:
    st = _study()
    assert isinstance(make_sampler(st.exp, st.space), CoordinateSampler)
    minimal = {"models": ["m"], "objectives": [{"metric": "decode_tok_s", "prompt_tokens": 16}]}
    with pytest.raises(ExperimentError, match="sampler.name.*coordinate"):
        parse_experiment(minimal | {"sampler": {"name": "cd"}})


def _prefill_tile_table(backend: str) -> set[str]:
    """engine/sweep.py's --grid prefill table (git history), from the registry: every column
    tile of every variant of the batched-prefill matmuls (max_cols >= 8; tile_m x tile_n)."""
    out = set()
    ops = {o.name: o for o in REGISTRY.ops(backend)}
    for op in (ops[n] for n in ("matmul_prefill", "matmul_batched") if n in ops):
        for v in op.variants:
            tiles = [p for p in v.params if p.name in ("max_cols", "tile_m", "tile_n")]
            for values in itertools.product(*(p.choices for p in tiles)):
                if len(values) == 1 and values[0] < 8:
                    continue
                flat = {f"{op.name}.variant": v.name}
                flat |= {f"{op.name}.{p.name}": x for p, x in zip(tiles, values, strict=True)}
                out.add(config_key(flat))
    return out


def test_grid_covers_the_prefill_tile_table_on_vulkan() -> None:
    """An experiment opening matmul_prefill's variants with only their tile knobs (the others
    pinned at their defaults) and max_cols >= 8: the grid sampler's configs are that table."""
    op = REGISTRY.op("vulkan", "matmul_prefill")
    rule: dict[str, Any] = {"variants": [v.name for v in op.variants], "max_cols": {"min": 8}}
    for v in op.variants:
        for p in v.params:
            if p.name not in ("max_cols", "tile_m", "tile_n"):
                rule[f"{v.name}.{p.name}"] = [p.default]
    exp = parse_experiment(
        {
            "models": ["synthetic:tiny"],
            "backends": ["vulkan"],
            "objectives": [{"metric": "prefill_tok_s", "prompt_tokens": 105}],
            "space": {"vulkan": {"matmul_prefill": rule}},
            "sampler": {"name": "grid"},
        }
    )
    space = exp.search_space("vulkan")
    keep = ("matmul_prefill.variant", "matmul_prefill.max_cols", "matmul_prefill.tile_m",
            "matmul_prefill.tile_n")  # fmt: skip
    got = {config_key({k: f[k] for k in keep if k in f}) for f in space_configs(space, {})}
    assert got == _prefill_tile_table("vulkan")
    grid = make_sampler(exp, space)
    assert isinstance(grid, optuna.samplers.GridSampler)
    n = 1
    for choices in space.grid().values():
        n *= len(choices)
    assert len(got) <= n  # the grid's product covers every config of the space


def test_after_a_move_the_walk_goes_on_from_the_dimension_that_moved_it() -> None:
    """Cyclic order: chunk_tokens swept from the baseline without a gain, then ondemand wins;
    the next candidate varies delta_net (the dimension after the one that moved), not
    chunk_tokens again."""
    st = _study()

    def score(f: dict[str, Any]) -> float:
        s = (
            10.0
            - (f["prefill.chunk_tokens"] != 32)
            + 2 * (f["matmul_decode.variant"] != "cached_f32")
        )
        return s - (f["delta_net.variant"] == "chunked")

    order = []
    for _ in range(6):
        trial, flat, role = st.ask()
        order.append(flat)
        _tell(st, trial, flat, role, score(flat))
    assert [f["prefill.chunk_tokens"] for f in order[:4]] == [32, 8, 16, 64]
    assert order[4]["matmul_decode.variant"] == "ondemand"
    assert (order[5]["prefill.chunk_tokens"], order[5]["delta_net.variant"]) == (32, "chunked")


def test_decode_h200_holds_the_hand_path_and_its_neighbourhood_fits_the_budget() -> None:
    """experiments/decode-h200.toml: the hand-found best (d17_vec_cl_w8) and the steps on its
    path are start configs inside the CUDA space, and the baseline, the starts and every
    one-step neighbour of the best fit the trial budget (one device call per model)."""
    from pathlib import Path

    from agent.experiment import load_experiment

    exp = load_experiment(Path(__file__).resolve().parents[2] / "experiments/decode-h200.toml")
    starts = {s.name: s.config for s in exp.start}
    assert list(starts)[0] == "d17_vec_cl_w8" and {"dec8_split2", "d17_vec", "tc_attn"} <= set(
        starts
    )
    best = TuningConfig.default("cuda").replace(**starts["d17_vec_cl_w8"])
    assert best.op("attention_decode").variant == "vec"
    assert (
        best.flat()["attention_decode.cluster"] == 1 and best.flat()["attention_decode.warps"] == 8
    )
    assert best.flat()["matmul_decode.split_k"] == 2 and best.problems() == []
    # a 16 GiB card's budget: the starts hold the weights quantized (no resident fp16 copies)
    assert all("matmul_prefill.variant" not in c for c in starts.values())
    assert exp.memory.context_tokens == 4096 and exp.memory.budget_bytes < 16 * 2**30
    space = exp.search_space("cuda")
    params = space.params_of(best.flat())
    assert params is not None
    sampler = CoordinateSampler(space)
    around = list(sampler.neighbours(params))
    assert len({config_key(p) for _, p in around}) == len(around)
    assert 1 + len(starts) + len(around) <= exp.budget.trials
    assert exp.sampler.name == "coordinate" and exp.acceptance.target == "decode_tok_s@512"


@pytest.mark.parametrize("backend", ["numpy", "vulkan", "cuda"])
def test_neighbours_of_the_defaults_cover_every_variant_and_knob_of_the_registry(backend: str):
    """What engine/sweep.py's one-step sample covered (git history), from the coordinate walk's
    first centre: over the whole registry of a backend (``space = "all"``), the one-dimension
    neighbours of the default config switch each op to each other variant (its knobs at their
    defaults) and move each knob of the default variants to each other choice; each is a config
    the registry resolves."""
    exp = parse_experiment(
        {
            "models": ["synthetic:tiny"],
            "backends": [backend],
            "objectives": [{"metric": "decode_tok_s", "prompt_tokens": 16}],
            "space": {backend: "all"},
            "sampler": {"name": "coordinate"},
        }
    )
    space = exp.search_space(backend)
    default = TuningConfig.default(backend)
    params = space.params_of(default.flat())
    assert params is not None
    moves = list(CoordinateSampler(space).neighbours(params))
    want = set()
    for op in REGISTRY.ops(backend):
        for v in op.variants:
            if v is not op.default:
                want.add((f"{op.name}.variant", v.name))
        for p in op.default.params:
            want |= {
                (f"{op.name}.{op.default.name}.{p.name}", c) for c in p.choices if c != p.default
            }
    assert {(dim, p[dim]) for dim, p in moves} == want
    for dim, p in moves:
        flat = space.suggest(optuna.trial.FixedTrial(p), default.flat())
        assert sum(flat[k] != v for k, v in default.flat().items() if k in flat) >= 1
        op = dim.partition(".")[0]
        if dim.endswith(".variant"):  # the new variant's knobs at their registry defaults
            v = REGISTRY.op(backend, op).variant(p[dim])
            assert all(flat[f"{op}.{k.name}"] == k.default for k in v.params), (dim, p[dim])
        TuningConfig.from_flat(backend, flat)  # resolves (a ConfigError names the knob)
