"""The CUDA and Vulkan backends are one class each over op-family mixins (a module per family:
engine/backends/<backend>/{elementwise,attention,...}.py). A method defined in two of them
would silently take whichever comes first in the bases, so each name lives in exactly one
class of the stack; then the order of the bases changes nothing. Imports no GPU library."""

from __future__ import annotations

import inspect

import pytest

from engine.backends.base import Backend
from engine.backends.cuda.backend import CudaBackend
from engine.backends.vulkan.backend import VulkanBackend


def _stack(cls: type) -> list[type]:
    """The backend class and its mixins: its MRO without Backend and what Backend derives from."""
    return [c for c in cls.__mro__ if c is not object and not issubclass(Backend, c)]


def _methods(c: type) -> set[str]:
    return {
        n
        for n, v in vars(c).items()
        if not n.startswith("__")
        and (inspect.isfunction(v) or isinstance(v, (staticmethod, classmethod, property)))
    }


@pytest.mark.parametrize("cls", [CudaBackend, VulkanBackend], ids=["cuda", "vulkan"])
def test_each_method_is_defined_once_in_the_mixin_stack(cls: type) -> None:
    owners: dict[str, list[str]] = {}
    for c in _stack(cls):
        for n in _methods(c):
            owners.setdefault(n, []).append(c.__qualname__)
    assert {n: o for n, o in owners.items() if len(o) > 1} == {}


@pytest.mark.parametrize(
    ("cls", "families"),
    [
        (CudaBackend, ("elementwise", "decode_matmul", "gemm", "attention")),
        (VulkanBackend, ("elementwise", "attention", "delta_net", "moe")),
    ],
    ids=["cuda", "vulkan"],
)
def test_op_family_modules_are_mixed_in(cls: type, families: tuple[str, ...]) -> None:
    """Each family module holds a mixin of the backend, and its methods reach the backend."""
    pkg = cls.__module__.rsplit(".", 1)[0]
    mods = {c.__module__: c for c in _stack(cls)}
    for fam in families:
        mixin = mods.get(f"{pkg}.{fam}")
        assert mixin is not None, f"{pkg}.{fam} holds no mixin of {cls.__name__}"
        assert _methods(mixin), f"{mixin.__name__} is empty"
        for n in _methods(mixin):
            assert inspect.getattr_static(cls, n) is vars(mixin)[n]


@pytest.mark.parametrize("cls", [CudaBackend, VulkanBackend], ids=["cuda", "vulkan"])
def test_an_override_takes_the_arguments_of_what_it_overrides(cls: type) -> None:
    """A contract op or fusion step (engine/backends/fusion.py) a mixin overrides keeps the
    parameters of Backend's, in order (more may follow, with defaults): Backend.trunk calls the
    steps positionally, so a reordered or renamed parameter would hand a kernel the wrong
    tensor."""
    differ = {}
    for c in _stack(cls):
        for n, v in vars(c).items():
            base = inspect.getattr_static(Backend, n, None)
            if n.startswith("__") or not inspect.isfunction(v) or not inspect.isfunction(base):
                continue
            own = list(inspect.signature(v).parameters.values())
            want = list(inspect.signature(base).parameters)
            extra = own[len(want) :]
            if [p.name for p in own[: len(want)]] != want or any(
                p.default is inspect.Parameter.empty for p in extra
            ):
                differ[f"{c.__qualname__}.{n}"] = ([p.name for p in own], want)
    assert differ == {}


def test_the_backend_contract_stays_narrow() -> None:
    """Backend's public face is the device contract, at most 25 methods (issue 29): an op joins
    the op set (engine/backends/ops.py), a fusion the backend's own pass, neither this list.
    Every op of the set has its implementation hook on Backend."""
    from engine.backends.ops import OP_NAMES, Ops

    public = [n for n in dir(Backend) if not n.startswith("_") and callable(getattr(Backend, n))]
    assert len(public) <= 25, public
    ops = {n for n, v in vars(Ops).items() if inspect.isfunction(v) and not n.startswith("_")}
    assert ops - {"has"} == set(OP_NAMES)
    assert all(inspect.isfunction(getattr(Backend, "_" + op, None)) for op in OP_NAMES)
    assert not set(OP_NAMES) & set(dir(Backend))  # no op is called on the backend itself
