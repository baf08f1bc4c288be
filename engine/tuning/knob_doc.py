"""The registry as Markdown: docs/vulkan.md's and docs/cuda.md's "Kernels and knobs" sections.

They are generated between marker comments (engine.doc_block) by
``python -m engine kernels --backend B --markdown --write docs/B.md``, so the tables cannot drift
from the declarations: tests/tools/test_docs_generated.py fails on a registry change that forgot
them
and names that command. Prose that explains why stays outside the markers."""

from __future__ import annotations

from engine.tuning.registry import OWN, Binding, Op, Registry, Variant


def command(backend: str) -> str:
    """The command that writes ``backend``'s section, as its begin marker names it."""
    return f"python -m engine kernels --backend {backend} --markdown --write docs/{backend}.md"


def binding_text(b: Binding | None) -> str:
    """How a knob reaches its kernel, e.g. "spec_constant 2", "define COLS", "schedule"."""
    if b is None:
        return "unbound"
    text = f"{b.kind} {b.target}" if b.target is not None else b.kind
    if b.builds != (OWN,):  # a define of helper builds too (Binding.builds)
        text += " in " + ", ".join(f or "its source" for f in b.builds)
    return text


def _cell(text: object) -> str:
    # A table cell is one line; a bare | would end it.
    return " ".join(str(text).split()).replace("|", "\\|")


def _value(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


def _variants_table(op: Op) -> list[str]:
    rows = ["| variant | source | numeric class | weight types | what |", "|---|---|---|---|---|"]
    for i, v in enumerate(op.variants):
        name = f"`{v.name}`" + (" (default)" if i == 0 else "")
        source = f"`{v.source}`" if v.source else ""
        if v.defines:
            source += " " + " ".join(f"`-D{d}`" for d in v.defines)
        types = ", ".join(sorted(v.quant_types)) if v.quant_types else "any"
        rows.append(f"| {name} | {_cell(source)} | {v.numeric} | {types} | {_cell(v.doc)} |")
    return rows


def _knobs_table(op: Op) -> list[str]:
    """One row per knob declaration, the variants that share it listed together (wg_size is the
    same knob on most variants of an op; a knob whose default or meaning differs gets its row)."""
    shared: dict[tuple, list[str]] = {}
    for v in op.variants:
        for p in v.params:
            key = (p.name, p.default, p.choices, binding_text(p.binding), p.doc)
            shared.setdefault(key, []).append(v.name)
    if not shared:
        return []
    rows = ["| knob | variants | default | choices | binding | what |", "|---|---|---|---|---|---|"]
    for (name, default, choices, binding, doc), names in shared.items():
        which = "all" if len(names) == len(op.variants) > 1 else ", ".join(names)
        values = " ".join(_value(c) for c in choices)
        rows.append(
            f"| `{name}` | {which} | {_value(default)} | {values} | {binding} | {_cell(doc)} |"
        )
    return rows


def _constraints(variants: tuple[Variant, ...]) -> list[str]:
    shared: dict[str, list[str]] = {}
    for v in variants:
        for c in v.constraints:
            shared.setdefault(c.doc, []).append(v.name)
    if not shared:
        return []
    head = "Constraints (a config that breaks one on the device is refused before any build):"
    return [head, ""] + [f"- {', '.join(names)}: {_cell(doc)}" for doc, names in shared.items()]


def markdown(registry: Registry, backend: str) -> str:
    """``backend``'s ops, variants, knobs and constraints as Markdown (a heading per op)."""
    ops = registry.ops(backend)
    variants = sum(len(o.variants) for o in ops)
    knobs = sum(len(v.params) for o in ops for v in o.variants)
    out = [
        f"{len(ops)} ops, {variants} variants, {knobs} knob declarations. The first variant of an "
        "op is its default; a knob's binding says how it reaches the kernel "
        "(engine/tuning/registry.py: spec_constant, define, push_constant, subgroup_size, or "
        "schedule: read by host code).",
    ]
    for op in ops:
        out += ["", f"### `{op.name}`", ""]
        if op.doc:
            out += [_cell(op.doc), ""]
        out += _variants_table(op)
        knobs_rows = _knobs_table(op)
        if knobs_rows:
            out += ["", *knobs_rows]
        cons = _constraints(op.variants)
        if cons:
            out += ["", *cons]
    return "\n".join(out) + "\n"
