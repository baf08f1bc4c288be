"""The replay runner, its tables, failed configs told to the sampler, and warm start."""

from __future__ import annotations

import json
import statistics
from dataclasses import replace
from pathlib import Path

import optuna
import pytest

from agent.experiment import ExperimentError, StartConfig, load_experiment
from agent.records import TrialRecord
from agent.replay import effective, prepare, run_samplers, warm_from
from agent.space import build_space, config_key, space_configs
from agent.study import StudyState
from agent.table import Row, Table, from_study, load_table
from engine.tuning import TuningConfig

DATA = Path(__file__).parents[1] / "data"
EXP = DATA / "decode-dmmv-lavapipe.toml"
MEASURED = DATA / "decode-dmmv-lavapipe.json"
TARGET = "decode_tok_s@16"
GPU_TABLES = Path(__file__).parents[2] / "docs" / "replay"


def _landscape(flat: dict) -> tuple[float | None, str]:
    """A made-up table over the lavapipe experiment's space: a smooth optimum in the block
    variant (rows_per_wg 8, threads_per_row 4, rows_per_thread 2), the shmem variant invalid
    (as validate rejected mmvq on the H200), subgroup slow."""
    v = flat["matmul_decode.variant"]
    if v == "shmem":
        return None, "invalid"
    if v == "subgroup":
        return 20.0 + flat["matmul_decode.rows_per_wg"], "ok"
    rpw = [1, 2, 4, 8, 16].index(flat["matmul_decode.rows_per_wg"])
    tpr = [0, 4, 8, 16].index(flat["matmul_decode.threads_per_row"])
    rpt = [1, 2, 4].index(flat["matmul_decode.rows_per_thread"])
    if flat["matmul_decode.threads_per_row"] == 16:
        return None, "infeasible"
    return 100.0 - 9 * abs(rpw - 3) - 7 * abs(tpr - 1) - 5 * abs(rpt - 1), "ok"


def _table(tmp_path: Path) -> Path:
    exp = load_experiment(EXP)
    space = build_space("vulkan", exp.space_for("vulkan"))
    rows = []
    for flat in space_configs(space, TuningConfig.default("vulkan").flat()):
        metric, outcome = _landscape(flat)
        rows.append(Row(flat, metric, outcome))
    path = tmp_path / "t.json"
    Table(str(EXP), "vulkan", TARGET, rows, "made up").save(path)
    return path


def test_table_round_trips_json_and_csv(tmp_path: Path) -> None:
    t = load_table(_table(tmp_path))
    t.save(tmp_path / "t.csv")
    back = load_table(tmp_path / "t.csv")
    assert back.to_dict() == t.to_dict()
    assert back.best == 100.0 and len(back.rows) == 97


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("[]", "a 'rows' list"),
        ('{"rows": [], "backend": "vulkan", "target": "x"}', "missing ['experiment']"),
        ('{"experiment": "e", "backend": "b", "target": "t", "rows": [{"config": {}}]}', "row 0"),
        (
            '{"experiment": "e", "backend": "b", "target": "t", '
            '"rows": [{"config": {}, "outcome": "ok", "metric": null}]}',
            "row 0 is ok but its metric is None",
        ),
    ],
)
def test_a_bad_table_names_the_problem(tmp_path: Path, text: str, error: str) -> None:
    p = tmp_path / "bad.json"
    p.write_text(text)
    with pytest.raises(ExperimentError, match=error.replace("[", r"\[").replace("]", r"\]")):
        load_table(p)


def test_replay_cli_bad_input_is_one_line_and_exit_2(tmp_path: Path) -> None:
    from agent.cli import main

    t = _table(tmp_path)
    assert main(["replay", str(t), "--sampler", "sobol"]) == 2
    assert main(["replay", str(tmp_path / "missing.json")]) == 2
    assert main(["table", "from-study", "--storage", str(tmp_path / "s.journal"), "--study", "s",
                 "--experiment", str(EXP), "--out", str(tmp_path / "x.txt")]) == 2  # fmt: skip
    assert not (tmp_path / "x.txt").exists()
    with pytest.raises(SystemExit):  # the measuring subcommand is gone: the agent measures
        main(["table", "measure", str(EXP), "--backend", "vulkan", "--out", str(t)])


def test_lookup_ignores_knobs_the_variant_does_not_read(tmp_path: Path) -> None:
    r = prepare(load_table(_table(tmp_path)), tmp_path / "t.json")
    flat = {**r.baseline, "matmul_decode.variant": "subgroup", "matmul_decode.rows_per_wg": 4}
    other = {**flat, "matmul_decode.threads_per_row": 8}  # a block knob: subgroup ignores it
    assert effective(r.space, flat) == effective(r.space, other)
    assert r.lookup(other) is not None and r.lookup(other).metric == 24.0
    assert r.budget == 97 - 15  # threads_per_row 16 rows are infeasible: they cost no trial


def test_tpe_beats_random_on_a_structured_table(tmp_path: Path) -> None:
    r = prepare(load_table(_table(tmp_path)), tmp_path / "t.json")
    tpe, rnd = run_samplers(r, ["tpe", "random"], seeds=12)
    assert tpe.reached == rnd.reached == 12  # every search gets there within the budget
    assert tpe.quartiles()[1] < rnd.quartiles()[1]
    assert all(run.trials is not None and run.trials <= r.budget for run in tpe.runs)


def test_failed_trials_are_told_as_infeasible_and_teach_tpe(tmp_path: Path) -> None:
    """The shmem variant is invalid everywhere: told PRUNED with a violated constraint, TPE
    stops proposing it; told FAIL (as before), TPE never learns and keeps spending trials."""
    r = prepare(load_table(_table(tmp_path)), tmp_path / "t.json")
    with_c = run_samplers(r, ["tpe"], seeds=10, constraints=True)[0]
    without = run_samplers(r, ["tpe"], seeds=10, constraints=False)[0]
    failed_with = statistics.fmean(x.failed for x in with_c.runs)
    failed_without = statistics.fmean(x.failed for x in without.runs)
    assert failed_with < failed_without

    exp = replace(load_experiment(EXP), objectives=(load_experiment(EXP).objectives[0],))
    st = StudyState(
        exp, "c", "vulkan", "synthetic:tiny", "", optuna.storages.InMemoryStorage(),
        r.baseline, "default",
    )  # fmt: skip
    trial, flat, role = st.ask()
    st.finish(trial, TrialRecord(st.name, trial.number, role, "invalid", config=flat), None)
    st.flush()
    t = st.study.trials[trial.number]
    assert t.state == optuna.trial.TrialState.PRUNED
    assert t.constraints == {"runs_and_validates": 1.0}
    assert st.evaluated == 1 and config_key(flat) in st.tried


def test_resume_counts_failed_trials_told_pruned(tmp_path: Path) -> None:
    from agent.storage import parse_storage

    exp = load_experiment(EXP)
    base = TuningConfig.default("vulkan").flat()
    ref = parse_storage(str(tmp_path / "s.journal"))
    st = StudyState(exp, "c", "vulkan", "synthetic:tiny", "", ref.open(), base, "default")
    trial, flat, role = st.ask()
    st.finish(trial, TrialRecord(st.name, trial.number, role, "compile_error", config=flat), None)
    st.flush()
    again = StudyState(exp, "c", "vulkan", "synthetic:tiny", "", ref.open(), base, "default")
    assert again.evaluated == 1 and config_key(flat) in again.tried


def test_warm_start_from_another_table_reaches_the_best_sooner(tmp_path: Path) -> None:
    r = prepare(load_table(_table(tmp_path)), tmp_path / "t.json")
    warm = warm_from(load_table(_table(tmp_path)), r)  # the same landscape on "another class"
    assert len(warm) == 3 and warm[0].metric == 100.0
    cold, hot = run_samplers(r, ["tpe"], 6)[0], run_samplers(r, ["tpe"], 6, warm=warm)[0]
    assert all(x.trials == 2 for x in hot.runs)  # the baseline, then the other class's best
    assert hot.quartiles()[1] < cold.quartiles()[1]


def test_a_new_study_starts_from_other_classes_best(tmp_path: Path) -> None:
    from agent.summary import StudySummary

    exp = load_experiment(EXP)
    storage = optuna.storages.InMemoryStorage()
    base = TuningConfig.default("vulkan").flat()
    a = StudyState(exp, "class-a", "vulkan", "synthetic:tiny", "", storage, base, "default")
    winner = {**base, "matmul_decode.rows_per_wg": 8, "matmul_decode.threads_per_row": 4}
    for flat, value in ((base, 50.0), (winner, 90.0)):
        trial, _, role = a.ask()
        metrics = {TARGET: value}
        rec = TrialRecord(a.name, trial.number, role, "ok", config=flat, metrics=metrics)
        a.finish(trial, rec, [value])
    a.set_best(1, winner, {TARGET: 90.0})
    a.flush()
    b = StudyState(exp, "class-b", "vulkan", "synthetic:tiny", "", storage, base, "default")
    assert [w["from"] for w in b.warm_start] == [a.name]
    assert b.ask()[2] == "baseline"
    _, flat, role = b.ask()
    assert config_key(flat) == config_key(winner) and role == "candidate"
    s = StudySummary(
        b.name, "class-b", "vulkan", "m", "", 0, 1, {}, "default", None, True, {}, {}, TARGET,
        None, None, None, warm_start=tuple(b.warm_start),
    )  # fmt: skip
    from agent.summary import Overhead, RunSummary

    text = RunSummary("e", "s", "f", "embedded", 1.0, (s,), (), Overhead(0, 0, 0)).text()
    assert f"warm start: 1 configs from {a.name} tried first" in text
    # The first study of an experiment has nobody to learn from.
    assert a.warm_start == []


def test_table_from_a_finished_study(tmp_path: Path) -> None:
    exp = load_experiment(EXP)
    storage = optuna.storages.InMemoryStorage()
    base = TuningConfig.default("vulkan").flat()
    st = StudyState(exp, "c", "vulkan", "synthetic:tiny", "", storage, base, "default")
    outcomes = ["ok", "invalid", "ok"]
    for i, outcome in enumerate(outcomes):
        trial, flat, role = st.ask()
        metrics = {TARGET: 10.0 + i} if outcome == "ok" else {}
        rec = TrialRecord(st.name, trial.number, role, outcome, config=flat, metrics=metrics)
        st.finish(trial, rec, [10.0 + i] if outcome == "ok" else None)
    st.flush()
    t = from_study(storage, st.name, str(EXP), "mem")
    assert [r.outcome for r in t.rows] == outcomes
    assert [r.metric for r in t.rows] == [10.0, None, 12.0]
    assert t.backend == "vulkan" and t.target == TARGET and t.device == "c"
    with pytest.raises(ExperimentError, match="no study"):
        from_study(storage, "nope", str(EXP))


def test_the_measured_lavapipe_table_replays() -> None:
    """The committed table (measured on llvmpipe, docs/agent.md) loads and replays."""
    t = load_table(MEASURED)
    assert len(t.rows) == 97 and not t.space  # measured before tables carried their space
    r = prepare(t, MEASURED)
    (res,) = run_samplers(r, ["tpe"], seeds=2)
    assert res.reached == 2
    doc = json.loads(MEASURED.read_text())
    assert doc["target"] == TARGET


def test_a_study_table_keeps_the_studys_space_and_baseline(tmp_path: Path) -> None:
    """from_study records the study's grid and baseline; both survive JSON and CSV, and the
    replay searches that grid (typed as the rows hold it), not today's experiment file."""
    exp = load_experiment(EXP)
    storage = optuna.storages.InMemoryStorage()
    base = TuningConfig.default("vulkan").flat()
    st = StudyState(exp, "c", "vulkan", "synthetic:tiny", "", storage, base, "default")
    for i in range(4):
        trial, flat, role = st.ask()
        rec = TrialRecord(st.name, trial.number, role, "ok", config=flat,
                          metrics={TARGET: 10.0 + i})  # fmt: skip
        st.finish(trial, rec, [10.0 + i])
    st.flush()
    t = from_study(storage, st.name, str(EXP), "mem")
    assert t.space == st.study.user_attrs["space"] and t.baseline == base and t.date
    for name in ("t.json", "t.csv"):
        t.save(tmp_path / name)
        assert load_table(tmp_path / name).to_dict() == t.to_dict()
    r = prepare(t, tmp_path / "t.json")
    assert r.exp.search_space("vulkan") is r.space and r.baseline == base
    for row in t.rows:  # every row is a config the recorded space can ask for
        assert r.space.params_of(row.config) is not None
        assert r.lookup(row.config) == row


def test_a_recorded_gpu_table_replays_the_same_for_a_seed() -> None:
    """A committed H200 table (docs/replay/, from the fleet's second run): its recorded space,
    narrowed to the values its rows hold; a seed gives the same search twice."""
    path = GPU_TABLES / "run2-decode-cuda.json"
    t = load_table(path)
    assert t.device == "h200" and "studies-2026-11-30-run2.db" in t.source and t.date
    r = prepare(t, path)
    assert r.baseline["matmul_decode.variant"] == "dmmv"  # the study's, not today's default
    assert r.table.best == pytest.approx(522.09, abs=0.01) and r.budget == 10
    a, b = r.run("random", 3), r.run("random", 3)
    assert a == b and a.trials is not None
    assert r.run("tpe", 1) == r.run("tpe", 1)


def test_tpe_needs_fewer_trials_than_random_on_the_measured_table() -> None:
    """The committed lavapipe table (every config of its space measured): the default sampler
    comes within 2% in fewer trials than random, the same figures for the same seeds."""
    r = prepare(load_table(MEASURED), MEASURED)
    tpe, rnd = run_samplers(r, ["tpe", "random"], seeds=3)
    assert tpe.reached == rnd.reached == 3
    assert tpe.quartiles()[1] < rnd.quartiles()[1]
    assert r.run("tpe", 2) == tpe.runs[2]


def test_the_default_sampler_needs_a_quarter_of_randoms_trials_on_whole_tables(
    tmp_path: Path,
) -> None:
    """Issue 28's bar, on the tables that measure their whole space (the lavapipe one, and the
    made-up landscape over it): the default sampler comes within 2% of the best in at most a
    quarter of random's median trials (docs/replay.md)."""
    from agent.experiment import SamplerSpec

    for path in (MEASURED, _table(tmp_path)):
        r = prepare(load_table(path), path)
        default, rnd = run_samplers(r, [SamplerSpec.name, "random"], seeds=8)
        assert default.reached == 8, path
        assert default.quartiles()[1] <= rnd.quartiles()[1] / 4, (path, default, rnd)


def test_a_table_with_a_malformed_space_is_refused(tmp_path: Path) -> None:
    doc = json.loads(MEASURED.read_text())
    doc["space"] = {"matmul_decode.variant": "block"}
    (tmp_path / "t.json").write_text(json.dumps(doc))
    with pytest.raises(ExperimentError, match="'space' must map each dimension to a list"):
        load_table(tmp_path / "t.json")


@pytest.mark.parametrize(
    "lower, reason, expect",
    [
        (0.97, "", "its lower bound had to clear x1.030 (A/A noise 1.1%)"),
        # The H200 two-worker run: accepted on one worker, then the confirmation on the other
        # measured x0.916; the summary must say so, not that the bound missed.
        (
            1.045,
            "confirmation: prefill_tok_s@326 x0.916, lower bound 0.703 <= 1.030",
            "cleared x1.030 but was turned down: confirmation: prefill_tok_s@326 x0.916",
        ),
    ],
)
def test_nothing_accepted_says_why(lower: float, reason: str, expect: str) -> None:
    from agent.summary import Overhead, RunSummary, StudySummary

    miss = {"trial": 11, "ratio": 1.132, "lower": lower, "upper": 1.225, "threshold": 1.03,
            "noise": 0.011, "reason": reason}  # fmt: skip
    s = StudySummary(
        "st", "h200", "cuda", "m", "", 12, 12, {}, "default", None, True, {}, {}, TARGET,
        None, None, None, best_candidate=miss,
    )  # fmt: skip
    text = RunSummary("e", "s", "f", "embedded", 1.0, (s,), (), Overhead(0, 0, 0)).text()
    assert f"nothing accepted: best candidate trial 11 {TARGET} x1.132 [{lower:.3f}, 1.225]" in text
    assert expect in text and "best is the baseline (default)" in text


def test_replay_can_tell_repeats_their_values(tmp_path: Path) -> None:
    """The --tell-duplicates ablation reaches the made-up table's best in every search (the
    repeat guard keeps it from stalling) and says so in the report."""
    r = prepare(load_table(_table(tmp_path)), tmp_path / "t.json")
    res = run_samplers(r, ["tpe"], seeds=6, duplicates=True)[0]
    assert res.reached == 6 and res.to_dict()["tell_duplicates"] is True
    assert all(run.trials is not None and run.trials <= r.budget for run in res.runs)


def test_screen_variants_tries_every_variant_right_after_the_baseline() -> None:
    """sampler.screen_variants: after the baseline, one trial per other code variant of the
    space, each with its registry defaults; the sampler takes over after them."""
    exp = load_experiment(EXP)
    exp = replace(exp, sampler=replace(exp.sampler, screen_variants=True))
    base = TuningConfig.default("vulkan").flat()
    st = StudyState(
        exp, "c", "vulkan", "synthetic:tiny", "", optuna.storages.InMemoryStorage(), base,
        "default",
    )  # fmt: skip
    key = "matmul_decode.variant"
    others = [v for o in st.space.ops if o.variant_dim.key == key for v in o.variant_dim.choices]
    others.remove(base[key])
    assert len(others) >= 2  # the experiment opens several variants
    seen = []
    for _ in range(1 + len(others)):
        trial, flat, role = st.ask()
        seen.append((flat, role))
        st.finish(trial, TrialRecord(st.name, trial.number, role, "invalid", config=flat), None)
        st.flush()
    assert seen[0][0][key] == base[key] and seen[0][1] == "baseline"
    assert sorted(f[key] for f, _ in seen[1:]) == sorted(others)
    for flat, role in seen[1:]:  # each with its registry defaults where the space allows them
        assert role == "candidate"
        d = TuningConfig.default("vulkan").replace(**{key: flat[key]}).flat()
        o = next(o for o in st.space.ops if o.variant_dim.key == key)
        for dim in o.dims_of(flat[key]):
            want = d[dim.key] if d[dim.key] in dim.choices else dim.choices[0]
            assert flat[dim.key] == want, (flat[key], dim.key)
    assert st.study.user_attrs["screened_variants"] == [f"{key}={v}" for v in others]


def test_start_configs_run_right_after_the_baseline() -> None:
    """[[start]]: each start config (the baseline with its overrides) is the next trial after
    the baseline, in file order, before the sampler; the study records their names."""
    exp = load_experiment(EXP)
    o = next(o for o in exp.search_space("vulkan").ops if len(o.variant_dim.choices) > 1)
    base = TuningConfig.default("vulkan").flat()
    other = next(v for v in o.variant_dim.choices if v != base[o.variant_dim.key])
    starts = (StartConfig("mine", "vulkan", {o.variant_dim.key: other}),)
    st = StudyState(
        replace(exp, start=starts), "c", "vulkan", "synthetic:tiny", "",
        optuna.storages.InMemoryStorage(), base, "default",
    )  # fmt: skip
    seen = []
    for _ in range(2):
        trial, flat, role = st.ask()
        seen.append((flat, role))
        st.finish(trial, TrialRecord(st.name, trial.number, role, "invalid", config=flat), None)
        st.flush()
    assert seen[0][1] == "baseline" and seen[0][0][o.variant_dim.key] == base[o.variant_dim.key]
    assert seen[1][1] == "candidate" and seen[1][0][o.variant_dim.key] == other
    assert st.start_configs == ["mine"]


def test_a_start_config_that_switches_variant_gets_that_variants_defaults() -> None:
    """A hybrid-35b start that switches matmul_decode to mmvw (the seventh session's), whose
    knobs the float baseline does not carry: it is enqueued with mmvw's registry defaults (that
    fleet skipped it as outside the space), and every start runs exactly its own values."""
    exp = load_experiment(Path(__file__).parents[2] / "experiments" / "hybrid-35b.toml")
    mmvw = {"matmul_decode.variant": "mmvw", "matmul_decode.threads_per_row": 32,
            "moe_experts.route_block": 128}  # fmt: skip
    exp = replace(exp, start=(*exp.start, StartConfig("mmvw_rb128", "cuda", mmvw)))
    base = TuningConfig.default("cuda").flat()
    st = StudyState(
        exp, "h200", "cuda", "synthetic:35b-a3b:qwen35moe", "",
        optuna.storages.InMemoryStorage(), base, "default",
    )  # fmt: skip
    assert st.start_configs == [s.name for s in exp.start]
    trial, flat, role = st.ask()
    st.finish(trial, TrialRecord(st.name, trial.number, role, "invalid", config=flat), None)
    st.flush()
    for start in exp.start:
        trial, flat, role = st.ask()
        assert role == "candidate" and trial.user_attrs.get("start_config") == start.name
        assert {k: flat[k] for k in start.config} == start.config
        st.finish(trial, TrialRecord(st.name, trial.number, role, "invalid", config=flat), None)
        st.flush()
    d = TuningConfig.default("cuda").replace(**mmvw).flat()  # mmvw's own knobs at its defaults
    own = [k for k in d if k.startswith("matmul_decode.") and k not in base]
    assert own and all(flat[k] == d[k] for k in own), {k: (flat[k], d[k]) for k in own}
