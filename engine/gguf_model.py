"""GGUF loading: a typed ModelSpec and memory-mapped, still-quantized tensors.

The file is opened once (GGUFReader parses all metadata up front, ~7 s for a 150k-token
vocabulary); tensors are views into the memory map, so nothing is read until a backend uploads it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.quants import dequantize

from engine.errors import ModelFileError, UnsupportedError
from engine.quant_types import SUPPORTED

log = logging.getLogger(__name__)

ARCHITECTURES = ("llama", "qwen2", "qwen3")
GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class ModelSpec:
    """Hyper-parameters of a dense decoder (C = n_embd, D = head_dim)."""

    arch: str
    name: str
    n_layers: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    n_ctx_train: int
    rope_theta: float
    rms_eps: float
    rope_neox: bool  # qwen2/qwen3 rotate (i, i+D/2); llama (2i, 2i+1)
    attn_bias: bool  # qwen2 has q/k/v biases
    qk_norm: bool  # qwen3 RMS-normalizes each q and k head
    tied_embeddings: bool  # no output.weight: the LM head is token_embd

    @property
    def family(self) -> str:
        return self.arch


@dataclass(frozen=True)
class QTensor:
    """A weight as stored: raw bytes [N, row_bytes] of type qtype; logical shape (N, K) or (K,)."""

    name: str
    qtype: str
    shape: tuple[int, ...]
    raw: np.ndarray  # uint8, one row of blocks per output row

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)

    def dequantize(self) -> np.ndarray:
        """float32 array of the logical shape (the reference dequantizer: gguf.quants)."""
        out = dequantize(np.ascontiguousarray(self.raw), GGMLQuantizationType[self.qtype])
        return np.asarray(out, dtype=np.float32).reshape(self.shape)

    def dequantize_rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows ids of a 2-D weight as float32 [len(ids), K] without dequantizing the rest."""
        rows = np.ascontiguousarray(self.raw[np.asarray(ids, dtype=np.int64)])
        out = dequantize(rows, GGMLQuantizationType[self.qtype])
        return np.asarray(out, dtype=np.float32).reshape(len(ids), self.shape[-1])


class GGUFModel:
    """An opened GGUF file: ``spec``, ``metadata`` (plain Python values) and ``tensor(name)``."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self._reader = _open_reader(self.path)
        self.metadata: dict[str, Any] = _decode_fields(self._reader)
        self._tensors = {t.name: t for t in self._reader.tensors}
        self.spec = self._read_spec()
        self._check_tensors()

    # --- tensors ------------------------------------------------------------------------
    def has(self, name: str) -> bool:
        return name in self._tensors

    def tensor(self, name: str) -> QTensor:
        t = self._tensors.get(name)
        if t is None:
            raise ModelFileError(
                f"{self.path}: missing tensor {name!r} (the file is incomplete "
                f"or not a {self.spec.arch} model)"
            )
        qtype = t.tensor_type.name
        if qtype not in SUPPORTED:
            raise UnsupportedError(
                f"{self.path}: tensor {name!r} has quant type {qtype}, which "
                f"this engine does not support; supported: {sorted(SUPPORTED)}"
            )
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))  # GGML order -> row-major
        raw = t.data.view(np.uint8)
        raw = raw.reshape(shape[0] if len(shape) == 2 else 1, -1)
        return QTensor(name, qtype, shape, raw)

    @cached_property
    def tensor_names(self) -> list[str]:
        return list(self._tensors)

    @property
    def file_bytes(self) -> int:
        return self.path.stat().st_size

    def quant_summary(self) -> dict[str, int]:
        """Count of tensors per quant type."""
        out: dict[str, int] = {}
        for t in self._tensors.values():
            out[t.tensor_type.name] = out.get(t.tensor_type.name, 0) + 1
        return out

    # --- spec ---------------------------------------------------------------------------
    def _get(self, key: str, default: Any = None, required: bool = True) -> Any:
        if key in self.metadata:
            return self.metadata[key]
        if required and default is None:
            raise ModelFileError(f"{self.path}: metadata key {key!r} is missing")
        return default

    def _read_spec(self) -> ModelSpec:
        arch = self._get("general.architecture")
        if arch not in ARCHITECTURES:
            raise UnsupportedError(
                f"{self.path}: architecture {arch!r} is not supported; "
                f"supported: {', '.join(ARCHITECTURES)}"
            )
        n_embd = int(self._get(f"{arch}.embedding_length"))
        n_head = int(self._get(f"{arch}.attention.head_count"))
        head_kv = self._get(f"{arch}.attention.head_count_kv", n_head, required=False)
        head_dim = int(self._get(f"{arch}.attention.key_length", n_embd // n_head, required=False))
        vocab = self.metadata.get("tokenizer.ggml.tokens")
        emb = self._tensors.get("token_embd.weight")
        if emb is None:
            raise ModelFileError(f"{self.path}: missing tensor 'token_embd.weight'")
        n_vocab = int(emb.shape[1]) if vocab is None else len(vocab)
        return ModelSpec(
            arch=arch,
            name=str(self.metadata.get("general.name", self.path.stem)),
            n_layers=int(self._get(f"{arch}.block_count")),
            n_embd=n_embd,
            n_ff=int(self._get(f"{arch}.feed_forward_length")),
            n_head=n_head,
            n_head_kv=int(head_kv),
            head_dim=head_dim,
            n_vocab=n_vocab,
            n_ctx_train=int(self._get(f"{arch}.context_length", 4096, required=False)),
            rope_theta=float(self._get(f"{arch}.rope.freq_base", 10000.0, required=False)),
            rms_eps=float(self._get(f"{arch}.attention.layer_norm_rms_epsilon")),
            rope_neox=arch in ("qwen2", "qwen3"),
            attn_bias="blk.0.attn_q.bias" in self._tensors,
            qk_norm="blk.0.attn_q_norm.weight" in self._tensors,
            tied_embeddings="output.weight" not in self._tensors,
        )

    def layer_tensor_names(self, layer: int) -> list[str]:
        s, p = self.spec, f"blk.{layer}."
        names = [
            p + n
            for n in (
                "attn_norm.weight",
                "attn_q.weight",
                "attn_k.weight",
                "attn_v.weight",
                "attn_output.weight",
                "ffn_norm.weight",
                "ffn_gate.weight",
                "ffn_up.weight",
                "ffn_down.weight",
            )
        ]
        if s.attn_bias:
            names += [p + "attn_q.bias", p + "attn_k.bias", p + "attn_v.bias"]
        if s.qk_norm:
            names += [p + "attn_q_norm.weight", p + "attn_k_norm.weight"]
        return names

    def model_tensor_names(self) -> list[str]:
        """Every tensor the forward pass reads, in load order."""
        names = ["token_embd.weight", "output_norm.weight"]
        for i in range(self.spec.n_layers):
            names += self.layer_tensor_names(i)
        if not self.spec.tied_embeddings:
            names.append("output.weight")
        return names

    def _check_tensors(self) -> None:
        """Fail at load, naming the first missing or unsupported tensor, not mid-generation."""
        for n in self.model_tensor_names():
            self.tensor(n)


def _open_reader(path: Path) -> GGUFReader:
    if not path.exists():
        raise ModelFileError(f"{path}: no such file")
    if path.is_dir():
        raise ModelFileError(f"{path}: is a directory, not a GGUF file")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise ModelFileError(f"{path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
    try:
        reader = GGUFReader(path)
    except Exception as e:  # noqa: BLE001 - the reader raises ValueError/IndexError/... on damage
        raise ModelFileError(
            f"{path}: truncated or corrupt GGUF file ({type(e).__name__}: {e})"
        ) from None
    size = path.stat().st_size
    for t in reader.tensors:
        if t.data_offset + t.n_bytes > size or t.data.nbytes != t.n_bytes:
            raise ModelFileError(
                f"{path}: truncated GGUF file: tensor {t.name!r} ends at byte "
                f"{t.data_offset + t.n_bytes:,} but the file has {size:,}"
            )
    return reader


def _decode_fields(reader: GGUFReader) -> dict[str, Any]:
    """Metadata as plain Python values (strings decoded, arrays as lists)."""
    out: dict[str, Any] = {}
    for name, f in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        if not f.types:
            continue
        main = f.types[0]
        if main == GGUFValueType.STRING:
            out[name] = bytes(f.parts[f.data[0]]).decode("utf-8", errors="replace")
        elif main == GGUFValueType.ARRAY:
            sub = f.types[-1]
            if sub == GGUFValueType.STRING:
                out[name] = [bytes(f.parts[i]).decode("utf-8", errors="replace") for i in f.data]
            else:
                out[name] = [f.parts[i][0].item() for i in f.data]
        else:
            out[name] = f.parts[f.data[0]][0].item()
    return out


_OPEN: dict[Path, GGUFModel] = {}


def open_model(path: str | os.PathLike[str]) -> GGUFModel:
    """Open a GGUF once per process (GGUFReader is slow on big vocabularies)."""
    key = Path(path).resolve()
    if key not in _OPEN:
        log.info("opening %s", key)
        _OPEN[key] = GGUFModel(key)
    return _OPEN[key]
