"""Write a modified copy of a GGUF (another architecture, a tensor dropped or re-typed) to test
the loader's errors on files that are valid GGUF but not a usable model."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter
from gguf.constants import GGML_QUANT_SIZES

from engine.gguf_model import GGUFModel


def rewrite(
    src: Path,
    dst: Path,
    arch: str | None = None,
    drop: str | None = None,
    retype: tuple[str, str] | None = None,
    metadata: dict | None = None,
) -> Path:
    g = GGUFModel(src)
    md = {**g.metadata, **(metadata or {})}
    old_arch = md.pop("general.architecture")
    arch = arch or old_arch
    w = GGUFWriter(dst, arch)
    for key, v in md.items():
        key = key.replace(f"{old_arch}.", f"{arch}.", 1)
        if isinstance(v, bool):
            w.add_bool(key, v)
        elif isinstance(v, int):
            w.add_uint32(key, v) if v >= 0 else w.add_int32(key, v)
        elif isinstance(v, float):
            w.add_float32(key, v)
        elif isinstance(v, str):
            w.add_string(key, v)
        elif isinstance(v, list):
            w.add_array(key, v)
    for name in g.tensor_names:
        if name == drop:
            continue
        t = g._tensors[name]
        if retype and name == retype[0]:
            qt = GGMLQuantizationType[retype[1]]
            block, size = GGML_QUANT_SIZES[qt]
            rows = int(np.prod(t.shape[1:]))
            raw = np.zeros((rows, int(t.shape[0]) // block * size), np.uint8)
            w.add_tensor(name, raw, raw_dtype=qt)
        else:
            w.add_tensor(name, np.array(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return dst


def shift_tensor_offset(src: Path, dst: Path, name: str, delta: int) -> Path:
    """A byte copy of src whose tensor ``name`` starts ``delta`` bytes later (its offset field,
    the last part of its tensor-info record, patched in place)."""
    r = GGUFReader(src)
    t = next(t for t in r.tensors if t.name == name)
    at = t.field.offset + sum(int(p.nbytes) for p in t.field.parts[:-1])
    data = bytearray(Path(src).read_bytes())
    old = int(np.frombuffer(data, np.uint64, 1, at)[0])
    data[at : at + 8] = np.array([old + delta], np.uint64).tobytes()
    Path(dst).write_bytes(bytes(data))
    return Path(dst)
