"""The tuning registry: every kernel of every backend declares its variants, parameters, allowed
values and constraints here, once. Backends read their knobs from a TuningConfig checked against
it; the agent builds its search space from it; "supported" is derived from it.

Declarations live in ``engine/tuning/variants/<backend>`` as plain data (no GPU imports), so
the agent can read the whole space on a head node that has no GPU library installed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from engine.device_info import DeviceInfo
from engine.errors import ConfigError
from engine.verify.budgets import NUMERIC_BUDGETS, Budget, loosest

Value = int | str | bool

# How a knob reaches its kernel (Binding.kind). The backends turn a config into kernels by a
# loop over these declarations, so a knob declared here is read, and one read is declared.
SPEC = "spec_constant"  # Vulkan specialization constant; target: its constant_id
DEFINE = "define"  # a -D of the kernel source; target: the macro (a bool adds it when true)
PUSH = "push_constant"  # a launch argument: push constant or grid size, set at dispatch
SUBGROUP = "subgroup_size"  # Vulkan required subgroup size, set at pipeline creation
SCHEDULE = "schedule"  # read by host code: the model's chunking, command recording, scratch
KINDS = (SPEC, DEFINE, PUSH, SUBGROUP, SCHEDULE)


OWN = ""  # in Binding.builds: the variant's own source file


@dataclass(frozen=True)
class Binding:
    kind: str
    # SPEC: constant_id; DEFINE: macro name (None until its knob names it: see named); else None
    target: int | str | None = None
    # DEFINE: the source files (relative to shaders/, OWN: the variant's own) whose builds get
    # the define: a knob of one variant may shape a helper module it launches too (moe_dec.cu)
    builds: tuple[str, ...] = (OWN,)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"binding kind {self.kind!r}; allowed: {KINDS}")
        if (self.kind == SPEC) != isinstance(self.target, int) or (
            self.kind == DEFINE and not isinstance(self.target, str | None)
        ):
            raise ValueError(f"binding {self.kind} needs a target of its kind, not {self.target!r}")
        if not self.builds or (self.kind != DEFINE and self.builds != (OWN,)):
            raise ValueError(f"binding {self.kind}: builds {self.builds!r} (DEFINE only)")


def spec(constant_id: int) -> Binding:
    return Binding(SPEC, constant_id)


def define(*builds: str) -> Binding:
    """A -D of the variant's own source, or of the ``builds`` named (OWN among them or not).
    The macro is the knob's (or derived value's) name upper-cased: one name from experiment
    file to shader (the Param or Derived taking the binding fills it in)."""
    return Binding(DEFINE, None, builds or (OWN,))


def named(binding: Binding | None, name: str) -> Binding | None:
    """binding with a DEFINE's macro set to ``name`` upper-cased."""
    if binding is None or binding.kind != DEFINE or binding.target is not None:
        return binding
    return replace(binding, target=name.upper())


PUSHED = Binding(PUSH)
HOST = Binding(SCHEDULE)
SUBGROUP_SIZE = Binding(SUBGROUP)

# The one schedule knob of every backend: prompt tokens per forward pass of the batched prefill.
CHUNK_TOKENS = (1, 2, 4, 8, 16, 24, 32, 40, 48, 64, 96, 128, 256, 512, 1024)


class ChosenOps(Protocol):
    """What the registry reads of a TuningConfig (config.py imports this module, not back)."""

    backend: str
    ops: tuple[tuple[str, Any], ...]


@dataclass(frozen=True)
class Param:
    """One knob. ``choices`` lists the allowed values, ``default`` is one of them; ``binding``
    says how it reaches the kernel (None only while a declaration is being written: a test
    checks every registered knob has one)."""

    name: str
    choices: tuple[Value, ...]
    default: Value
    doc: str = ""
    binding: Binding | None = None
    # its value is a token count at which the batched path changes shape (a chunk, a column
    # tile, a switch): validate's edge prompts run n - 1, n and n + 1 tokens of it
    edge: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "binding", named(self.binding, self.name))
        if self.edge and not self.is_numeric:
            raise ValueError(f"param {self.name}: an edge knob is a token count (numeric)")
        if self.default not in self.choices:
            raise ValueError(f"param {self.name}: default {self.default!r} not in {self.choices}")

    @property
    def is_numeric(self) -> bool:
        return all(isinstance(c, int) and not isinstance(c, bool) for c in self.choices)


@dataclass(frozen=True)
class Derived:
    """A value computed from a variant's knobs, once (engine.tuning.knobs: the typed view holds
    it), and passed on: to the launch as the view's attribute, and to the build where
    ``binding`` is a DEFINE (then the kernel reads it, not a copy of the formula)."""

    name: str
    compute: Callable[[Any], Value]  # (the variant's knob view so far) -> value
    doc: str = ""
    binding: Binding | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "binding", named(self.binding, self.name))


@dataclass(frozen=True)
class Constraint:
    """A rule over a whole config on a device; ``doc`` is shown when it fails."""

    doc: str
    # (TuningConfig, device) -> allowed; Any, not TuningConfig: config.py imports this module
    check: Callable[[Any, DeviceInfo | None], bool]


@dataclass(frozen=True)
class Variant:
    """One implementation of an op on one backend (one shader file or code path)."""

    backend: str
    op: str
    name: str
    params: tuple[Param, ...] = ()
    constraints: tuple[Constraint, ...] = ()
    quant_types: frozenset[str] | None = None  # weight types it handles; None: not a matmul
    source: str = ""  # shader file (relative to shaders/) or module implementing it
    doc: str = ""
    # Fixed -D flags of the variant's build of ``source`` ("NAME" or "NAME=value"), before the
    # knobs bound to DEFINE: what makes one source file several variants.
    defines: tuple[str, ...] = ()
    numeric: str = ""  # its numeric class: a key of NUMERIC_BUDGETS (required)
    # What it holds beyond the loaded weights: (engine.tuning.memory.ModelShape, context tokens,
    # its knob values) -> memory.MemoryCost; None: nothing (engine.tuning.memory.estimate)
    memory: Callable[[Any, int, Any], Any] | None = None
    derived: tuple[Derived, ...] = ()  # values computed from the knobs (typed view, defines)

    def bound(self, kind: str) -> tuple[Param, ...]:
        """The knobs that reach the kernel this way."""
        return tuple(p for p in self.params if p.binding is not None and p.binding.kind == kind)

    def builds(self) -> tuple[str, ...]:
        """The source files its knobs bound to DEFINE reach (OWN resolved), own source first."""
        out = [self.source] if self.source else []
        for p in (*self.bound(DEFINE), *(d for d in self.derived if d.binding is not None)):
            if p.binding.kind != DEFINE:
                continue
            out += [f or self.source for f in p.binding.builds if (f or self.source) not in out]
        return tuple(out)

    def reaches(self, p: Param | Derived, fname: str) -> bool:
        """Whether knob (or derived value) p's define is in the build of ``fname`` (relative
        to shaders/)."""
        builds = p.binding.builds if p.binding is not None and p.binding.kind == DEFINE else ()
        return fname in (f or self.source for f in builds)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(name)


VariantDecl = Callable[[str, str], Variant]  # (backend, op) -> the variant (see ``variant``)


def variant(name: str, **fields: Any) -> VariantDecl:
    """A variant of the op that ``Registry.declare`` names (``fields``: Variant's other
    fields, by keyword)."""
    return lambda backend, op: Variant(backend, op, name, **fields)


@dataclass(frozen=True)
class Op:
    """An op of a backend: its variants in preference order (the first is the default)."""

    backend: str
    name: str
    variants: tuple[Variant, ...]
    doc: str = ""

    @property
    def default(self) -> Variant:
        return self.variants[0]

    def variant(self, name: str) -> Variant:
        for v in self.variants:
            if v.name == name:
                return v
        allowed = ", ".join(v.name for v in self.variants)
        raise ConfigError(
            f"{self.backend}: op {self.name!r} has no variant {name!r}; allowed: {allowed}"
        )


@dataclass
class Registry:
    _ops: dict[tuple[str, str], Op] = field(default_factory=dict)
    # backend -> bytes one loaded tensor (engine.roofline.Tensor) holds on it, where it differs
    # from engine.tuning.memory.loaded_default (the file's blocks; 1-D tensors as float32)
    loaded_bytes: dict[str, Callable[[Any], int]] = field(default_factory=dict)

    def register(self, backend: str, op: str, variants: Iterable[Variant], doc: str = "") -> Op:
        vs = tuple(variants)
        if not vs:
            raise ValueError(f"{backend}.{op}: at least one variant")
        for v in vs:
            if (v.backend, v.op) != (backend, op):
                raise ValueError(
                    f"variant {v.name} declared for {v.backend}.{v.op}, not {backend}.{op}"
                )
            if v.numeric not in NUMERIC_BUDGETS:
                raise ValueError(
                    f"variant {backend}.{op}.{v.name}: numeric class {v.numeric!r}; declare one "
                    f"of {', '.join(NUMERIC_BUDGETS)}"
                )
        entry = Op(backend, op, vs, doc)
        self._ops[(backend, op)] = entry
        return entry

    def declare(self, backend: str, op: str, variants: Iterable[VariantDecl], doc: str = "") -> Op:
        """``register`` for declarations written with ``variant``: the backend and op are named
        once, here, not again in every variant."""
        return self.register(backend, op, [v(backend, op) for v in variants], doc)

    def register_prefill(self, backend: str, chunk_default: int, *params: Param, doc: str) -> Op:
        """The engine schedule's ``prefill`` op, which every backend declares the same way: one
        variant, ``batched``, whose ``chunk_tokens`` (prompt tokens per forward pass, read by
        engine.model through TuningConfig.prefill_chunk) has the same meaning and choices on
        every backend; ``params`` adds the backend's own schedule knobs."""
        chunk = Param(
            "chunk_tokens",
            CHUNK_TOKENS,
            chunk_default,
            "prompt tokens per forward pass through every layer (the last chunk is ragged)",
            HOST,
            edge=True,
        )
        # Chunking changes matmul shapes and so summation order, nothing else.
        variant = Variant(
            backend, "prefill", "batched", params=(chunk, *params), doc=doc, numeric="order_only"
        )
        return self.register(
            backend, "prefill", [variant], "engine schedule knobs of the prefill path"
        )

    def numeric_classes(self, config: ChosenOps) -> dict[str, str]:
        """{op: numeric class} of the variants a config chooses."""
        return {op: self.op(config.backend, op).variant(c.variant).numeric for op, c in config.ops}

    def budget(
        self, config: ChosenOps, budgets: dict[str, Budget] | None = None
    ) -> tuple[Budget, list[str]]:
        """The loosest budget over the classes of the chosen variants (``budgets`` replaces the
        registry's per class, e.g. an experiment's tightened ones), and those classes."""
        return loosest(self.numeric_classes(config).values(), budgets)

    def edge_knobs(self) -> tuple[str, ...]:
        """Names of the knobs declared ``edge`` on any backend (the verifier's edge prompts
        read every knob of such a name)."""
        return tuple(
            sorted(
                {p.name for o in self._ops.values() for v in o.variants for p in v.params if p.edge}
            )
        )

    def unregister(self, backend: str, op: str) -> None:
        self._ops.pop((backend, op), None)

    def backends(self) -> list[str]:
        return sorted({b for b, _ in self._ops})

    def ops(self, backend: str) -> list[Op]:
        found = [o for (b, _), o in self._ops.items() if b == backend]
        if not found:
            raise ConfigError(
                f"no kernels registered for backend {backend!r}; known: {self.backends()}"
            )
        return found

    def op(self, backend: str, op: str) -> Op:
        try:
            return self._ops[(backend, op)]
        except KeyError:
            names = ", ".join(o.name for o in self.ops(backend))
            raise ConfigError(f"backend {backend!r} has no op {op!r}; its ops: {names}") from None

    def supports(self, backend: str, op: str, quant_type: str | None = None) -> bool:
        """Derived from the declarations: an op is supported when some variant handles the type."""
        entry = self._ops.get((backend, op))
        if entry is None:
            return False
        if quant_type is None:
            return True
        return any(v.quant_types is None or quant_type in v.quant_types for v in entry.variants)


REGISTRY = Registry()  # filled by engine.tuning (the package) importing engine.tuning.variants.*
