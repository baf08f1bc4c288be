"""Typed knob views (engine.tuning.knobs): generated from the registry's declaration of a
variant, so the backends read ``config.knobs(op).name`` and a name the variant does not declare
fails naming the op and variant; derived values are computed once and reach the build."""

from __future__ import annotations

import dataclasses
import itertools

import pytest

from engine.backends.cuda import kernels
from engine.tuning import REGISTRY, TuningConfig


def test_a_view_holds_the_variants_knobs_and_nothing_else():
    for backend in REGISTRY.backends():
        for op in REGISTRY.ops(backend):
            for v in op.variants:
                cfg = TuningConfig.default(backend).replace(**{f"{op.name}.variant": v.name})
                view = cfg.knobs(op.name)
                assert view.variant == v.name
                choice = cfg.op(op.name)
                for p in v.params:
                    assert getattr(view, p.name) == choice[p.name]
                names = {f.name for f in dataclasses.fields(view)}
                declared = [p.name for p in v.params] + [d.name for d in v.derived]
                assert names == {"variant", *declared}


def test_an_undeclared_knob_is_an_attribute_error_naming_op_and_variant():
    view = TuningConfig.default("cuda").replace(**{"matmul_decode.variant": "mmvw"})
    view = view.knobs("matmul_decode")
    with pytest.raises(AttributeError, match=r"matmul_decode\.mmvw"):
        view.vec  # dmmv's knob, not mmvw's  # noqa: B018
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.warps = 8


def test_mmvw_rows_per_block_is_derived_once_and_passed_to_its_build():
    """The derived value is the kernel's old formula (WARPS * 32 / THREADS_PER_ROW *
    ROWS_PER_THREAD) for every value of its knobs, and modules_for passes exactly it as
    ROWS_PER_BLOCK."""
    v = REGISTRY.op("cuda", "matmul_decode").variant("mmvw")
    names = ("warps", "threads_per_row", "rows_per_thread")
    base = TuningConfig.default("cuda").replace(**{"matmul_decode.variant": "mmvw"})
    for values in itertools.product(*(v.param(n).choices for n in names)):
        cfg = base.replace(**{f"matmul_decode.{n}": x for n, x in zip(names, values, strict=True)})
        nw, tpr, rpt = values
        assert cfg.knobs("matmul_decode").rows_per_block == nw * 32 // tpr * rpt
        assert kernels.modules_for(cfg)["mmvw"][1]["ROWS_PER_BLOCK"] == nw * 32 // tpr * rpt
