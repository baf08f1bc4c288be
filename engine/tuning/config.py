"""TuningConfig: one typed, immutable object holding every knob of every kernel of one backend.

Flat form (what the agent and Optuna see):   {"prefill.chunk_tokens": 40,
                                              "matmul_prefill.variant": "kpar",
                                              "matmul_prefill.rows_per_wg": 2, ...}
TOML form (what configs/ and --config hold):  [ops.matmul_prefill]
                                              variant = "kpar"
                                              rows_per_wg = 2
Any key missing takes the registry's default, so a config file names only what it changes.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engine.errors import ConfigError
from engine.tomlfile import read_toml
from engine.tuning.knobs import knobs
from engine.tuning.registry import REGISTRY, Value

# Keys a config file may hold: [evidence] is what a promotion adds (read by people, not the engine).
TOP_LEVEL = ("backend", "ops", "evidence")

if TYPE_CHECKING:
    from engine.device_info import DeviceInfo


@dataclass(frozen=True)
class OpChoice:
    variant: str
    params: tuple[tuple[str, Value], ...]  # sorted by name; hashable

    def __getitem__(self, name: str) -> Value:
        for k, v in self.params:
            if k == name:
                return v
        raise KeyError(f"{self.variant} has no parameter {name!r}")

    def as_dict(self) -> dict[str, Value]:
        return dict(self.params)


@dataclass(frozen=True)
class TuningConfig:
    backend: str
    ops: tuple[tuple[str, OpChoice], ...]  # sorted by op name

    # --- construction -------------------------------------------------------------------
    @classmethod
    def default(cls, backend: str) -> TuningConfig:
        return cls.from_flat(backend, {})

    @classmethod
    def from_flat(cls, backend: str, flat: Mapping[str, Any]) -> TuningConfig:
        """Build from {"op.variant": name, "op.param": value}; unknown keys or values raise
        ConfigError naming the key and what is allowed."""
        by_op: dict[str, dict[str, Any]] = {}
        for key, value in flat.items():
            op, sep, name = key.partition(".")
            if not sep or not name:
                raise ConfigError(f"tuning key {key!r} must look like 'op.param' or 'op.variant'")
            by_op.setdefault(op, {})[name] = value
        known = {o.name for o in REGISTRY.ops(backend)}
        for op in by_op:
            if op not in known:
                raise ConfigError(
                    f"tuning key {op!r}: backend {backend!r} has no such op; "
                    f"allowed: {sorted(known)}"
                )
        choices = []
        for entry in sorted(REGISTRY.ops(backend), key=lambda o: o.name):
            given = dict(by_op.get(entry.name, {}))
            variant = entry.variant(str(given.pop("variant", entry.default.name)))
            params: dict[str, Value] = {}
            for p in variant.params:
                value = given.pop(p.name, p.default)
                if value not in p.choices or type(value) is not type(p.default):
                    raise ConfigError(
                        f"{entry.name}.{p.name} = {value!r} is not allowed for variant "
                        f"{variant.name!r}; allowed: {list(p.choices)}"
                    )
                params[p.name] = value
            if given:
                allowed = [p.name for p in variant.params] or ["(none)"]
                raise ConfigError(
                    f"{entry.name}: variant {variant.name!r} has no parameter(s) {sorted(given)}; "
                    f"its parameters: {allowed}"
                )
            choices.append((entry.name, OpChoice(variant.name, tuple(sorted(params.items())))))
        return cls(backend, tuple(choices))

    @classmethod
    def from_toml(cls, path: str | Path, backend: str | None = None) -> TuningConfig:
        path = Path(path)
        data = read_toml(path, "a config")
        file_backend = data.get("backend")
        if backend is None:
            backend = file_backend
        if backend is None:
            raise ConfigError(f"{path}: no 'backend' key, and none given on the command line")
        if file_backend is not None and file_backend != backend:
            raise ConfigError(f"{path}: config is for backend {file_backend!r}, not {backend!r}")
        ops = data.get("ops", {})
        stray = sorted(k for k in data if k != "ops" and REGISTRY.supports(backend, k))
        if stray:  # a silently ignored [matmul_prefill] would benchmark the defaults
            raise ConfigError(
                f"{path}: top-level table(s) {', '.join(stray)} name ops; op settings go under "
                f"[ops.<op>], e.g. [ops.{stray[0]}]"
            )
        unknown = sorted(k for k in data if k not in TOP_LEVEL and k not in stray)
        if unknown:  # a silently ignored [op.prefill] would benchmark the defaults too
            raise ConfigError(
                f"{path}: unknown top-level key(s) {', '.join(unknown)}; a config file holds "
                f"only {', '.join(TOP_LEVEL)} (op settings go under [ops.<op>])"
            )
        if not isinstance(ops, dict):
            raise ConfigError(f"{path}: 'ops' must be a table of [ops.<op>] tables")
        flat: dict[str, Any] = {}
        for op, table in ops.items():
            if not isinstance(table, dict):
                raise ConfigError(f"{path}: [ops.{op}] must be a table")
            for k, v in table.items():
                flat[f"{op}.{k}"] = v
        try:
            return cls.from_flat(backend, flat)
        except ConfigError as e:
            raise ConfigError(f"{path}: {e}") from None

    # --- access -------------------------------------------------------------------------
    def op(self, name: str) -> OpChoice:
        for k, c in self.ops:
            if k == name:
                return c
        raise ConfigError(f"backend {self.backend!r} config has no op {name!r}")

    def knobs(self, name: str) -> Any:
        """The typed view of op ``name``'s chosen variant (engine.tuning.knobs): its knobs and
        derived values as attributes."""
        return knobs(self.backend, name, self.op(name))

    @property
    def prefill_chunk(self) -> int:
        """Prompt tokens per forward pass of the batched prefill (``prefill.chunk_tokens``)."""
        return int(self.knobs("prefill").chunk_tokens)

    def flat(self) -> dict[str, Value]:
        out: dict[str, Value] = {}
        for op, c in self.ops:
            out[f"{op}.variant"] = c.variant
            for k, v in c.params:
                out[f"{op}.{k}"] = v
        return out

    def replace(self, **flat: Value) -> TuningConfig:
        """A copy with some flat keys changed, e.g. cfg.replace(**{"prefill.chunk_tokens": 16})."""
        merged = self.flat()
        # Changing a variant resets that op's params to the new variant's defaults.
        for key in flat:
            op, _, name = key.partition(".")
            if name == "variant":
                merged = {k: v for k, v in merged.items() if not k.startswith(op + ".")}
        merged.update(flat)
        return TuningConfig.from_flat(self.backend, merged)

    def diff(self, other: TuningConfig) -> dict[str, tuple[Value | None, Value | None]]:
        a, b = self.flat(), other.flat()
        return {k: (a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)}

    def problems(self, device: DeviceInfo | None = None) -> list[str]:
        """Constraint violations of the chosen variants on this device (empty: allowed)."""
        out = []
        for op, c in self.ops:
            variant = REGISTRY.op(self.backend, op).variant(c.variant)
            for rule in variant.constraints:
                if not rule.check(self, device):
                    out.append(f"{op}.{c.variant}: {rule.doc}")
        return out

    def check(self, device: DeviceInfo | None = None) -> TuningConfig:
        bad = self.problems(device)
        if bad:
            raise ConfigError("config violates constraints: " + "; ".join(bad))
        return self

    def to_toml(self, only_changed: bool = False) -> str:
        """TOML text (tomli-w; a promotion's [evidence] table is appended by the agent)."""
        import tomli_w

        default = TuningConfig.default(self.backend).flat() if only_changed else {}
        ops: dict[str, dict[str, Any]] = {}
        for op, c in self.ops:
            items = [("variant", c.variant), *c.params]
            if only_changed:
                items = [(k, v) for k, v in items if default.get(f"{op}.{k}") != v]
            if items:
                ops[op] = dict(items)
        return tomli_w.dumps({"backend": self.backend, "ops": ops})
