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

DENSE_ARCHITECTURES = ("llama", "qwen2", "qwen3")
# Hybrids: gated delta-net layers between gated full-attention layers (engine/hybrid.py).
# qwen35 files store the delta-net's V heads tiled ([K0, K1, .., K0, K1, ..]: V head j reads
# q/k head j % n_k_heads), the qwen3next converter keeps the checkpoint's grouped order (j // r).
HYBRID_ARCHITECTURES = {"qwen35": "tiled", "qwen35moe": "tiled", "qwen3next": "grouped"}
ARCHITECTURES = DENSE_ARCHITECTURES + tuple(HYBRID_ARCHITECTURES)
GGUF_MAGIC = b"GGUF"


@dataclass(frozen=True)
class SSMSpec:
    """Gated delta-net shape: Hk q/k heads of dk, Hv value heads of dv, conv kernel d_conv."""

    d_conv: int
    n_k_heads: int  # ssm.group_count
    n_v_heads: int  # ssm.time_step_rank
    head_k_dim: int  # ssm.state_size
    head_v_dim: int  # ssm.inner_size / n_v_heads
    v_order: str  # "tiled" (qwen35) or "grouped" (qwen3next): which q/k head a V head reads

    @property
    def key_dim(self) -> int:
        return self.n_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.n_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:  # channels of [q | k | v] that the conv runs over
        return 2 * self.key_dim + self.value_dim


@dataclass(frozen=True)
class MoESpec:
    n_expert: int
    n_expert_used: int
    n_ff_exp: int
    n_ff_shexp: int  # 0: no shared expert


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
    # Hybrids only (None / 0 on dense models).
    ssm: SSMSpec | None = None
    moe: MoESpec | None = None
    recurrent: tuple[bool, ...] = ()  # per layer: a delta-net layer (else full attention)
    rope_dim: int = 0  # rotated dims per head (partial RoPE); 0: all of head_dim

    @property
    def family(self) -> str:
        return self.arch

    @property
    def hybrid(self) -> bool:
        return self.ssm is not None

    def is_recurrent(self, layer: int) -> bool:
        return bool(self.recurrent) and self.recurrent[layer]


@dataclass(frozen=True)
class QTensor:
    """A weight as stored: raw bytes [rows, row_bytes] of type qtype; logical shape (N, K), (K,)
    or (E, N, K) for stacked experts (rows = E * N)."""

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
        raw = raw.reshape(int(np.prod(shape[:-1])) if len(shape) >= 2 else 1, -1)
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
        emb = self._tensors.get("token_embd.weight")
        if emb is None:
            raise ModelFileError(f"{self.path}: missing tensor 'token_embd.weight'")
        # Every size is checked against the tensors before anything is derived from it: a
        # hyper-parameter that disagrees with them was a 22 GB allocation or a ZeroDivisionError.
        n_embd = self._agree(f"{arch}.embedding_length", "token_embd.weight", 0)
        n_layers = self._check_block_count(arch)
        n_head = self._int(f"{arch}.attention.head_count")
        head_kv = self._int(f"{arch}.attention.head_count_kv", n_head)
        heads = {
            f"{arch}.attention.head_count": (n_head, "blk.0.attn_q.weight"),
            f"{arch}.attention.head_count_kv": (head_kv, "blk.0.attn_k.weight"),
        }
        for key, (v, tensor) in heads.items():
            if v < 1:
                raise ModelFileError(
                    f"{self.path}: {key} = {v} disagrees with tensor {tensor!r}: a model has "
                    f"at least one attention head"
                )
        if n_head % head_kv:
            raise ModelFileError(
                f"{self.path}: {arch}.attention.head_count {n_head} is not a multiple of "
                f"{arch}.attention.head_count_kv {head_kv}"
            )
        head_dim = self._int(f"{arch}.attention.key_length", n_embd // n_head)
        vocab = self.metadata.get("tokenizer.ggml.tokens")
        n_vocab = int(emb.shape[1]) if vocab is None else len(vocab)
        if not 0 < n_vocab <= int(emb.shape[1]):
            raise ModelFileError(
                f"{self.path}: tokenizer.ggml.tokens has {n_vocab} tokens, but tensor "
                f"'token_embd.weight' has {int(emb.shape[1])} rows"
            )
        hybrid = self._read_hybrid(arch, n_layers) if arch in HYBRID_ARCHITECTURES else {}
        n_ff = self._get(f"{arch}.feed_forward_length", 0, required=not hybrid)
        if not hybrid:
            self._check_dense_shapes(arch, n_head, head_kv, head_dim, int(n_ff))
        n_ctx = self._int(f"{arch}.context_length", 4096)
        if n_ctx < 1:
            raise ModelFileError(f"{self.path}: {arch}.context_length = {n_ctx} is not positive")
        return ModelSpec(
            arch=arch,
            name=str(self.metadata.get("general.name", self.path.stem)),
            n_layers=n_layers,
            n_embd=n_embd,
            n_ff=int(n_ff),
            n_head=n_head,
            n_head_kv=int(head_kv),
            head_dim=head_dim,
            n_vocab=n_vocab,
            n_ctx_train=n_ctx,
            rope_theta=float(self._get(f"{arch}.rope.freq_base", 10000.0, required=False)),
            rms_eps=float(self._get(f"{arch}.attention.layer_norm_rms_epsilon")),
            rope_neox=arch != "llama",
            attn_bias="blk.0.attn_q.bias" in self._tensors,
            qk_norm="blk.0.attn_q_norm.weight" in self._tensors,
            tied_embeddings="output.weight" not in self._tensors,
            **hybrid,
        )

    def _int(self, key: str, default: int | None = None) -> int:
        """An integer hyper-parameter (a string or float there is a damaged file, not a crash)."""
        v = self._get(key, default, required=default is None)
        if isinstance(v, bool) or not isinstance(v, int):
            raise ModelFileError(f"{self.path}: metadata {key} = {_short(v)} is not an integer")
        return v

    def _dims(self, name: str) -> tuple[int, ...]:
        """A tensor's GGML dims (ne0 = the row length first), or a one-line error if absent."""
        t = self._tensors.get(name)
        if t is None:
            raise ModelFileError(f"{self.path}: missing tensor {name!r}")
        return tuple(int(d) for d in t.shape.tolist())

    def _agree(self, key: str, tensor: str, dim: int) -> int:
        """metadata ``key`` must equal GGML dim ``dim`` of ``tensor``."""
        v = self._int(key)
        dims = self._dims(tensor)
        if v != dims[dim]:
            raise ModelFileError(
                f"{self.path}: {key} = {_short(v)} disagrees with tensor {tensor!r} of shape "
                f"{tuple(reversed(dims))}, which says {dims[dim]}"
            )
        return v

    def _check_block_count(self, arch: str) -> int:
        """block_count against the blk.N tensors, before a list of N layers is ever built."""
        key = f"{arch}.block_count"
        n = self._int(key)
        blocks = {int(m) for m in (_block_index(t) for t in self._tensors) if m is not None}
        held = max(blocks) + 1 if blocks else 0
        if not 1 <= n <= held:  # fewer is allowed: extra blocks (MTP heads) go unused
            raise ModelFileError(
                f"{self.path}: {key} = {_short(n)} disagrees with the tensors, which hold "
                + (f"blocks blk.0 .. blk.{held - 1} ({held})" if held else "no blk.N block")
            )
        return n

    def _check_dense_shapes(self, arch: str, n_head: int, n_kv: int, head_dim: int, n_ff: int):
        """A dense file's attention and FFN sizes against blk.0's tensors."""
        heads, kv, ff = (
            f"{arch}.{k}"
            for k in ("attention.head_count", "attention.head_count_kv", "feed_forward_length")
        )
        want = {
            "blk.0.attn_q.weight": (heads, n_head * head_dim, f"{n_head} heads x {head_dim} = "),
            "blk.0.attn_k.weight": (kv, n_kv * head_dim, f"{n_kv} heads x {head_dim} = "),
            "blk.0.ffn_up.weight": (ff, n_ff, ""),
        }
        for tensor, (key, rows, how) in want.items():
            dims = self._dims(tensor)
            if len(dims) != 2 or dims[1] != rows:
                raise ModelFileError(
                    f"{self.path}: {key} = {self.metadata.get(key)} disagrees with tensor "
                    f"{tensor!r} of shape {tuple(reversed(dims))}: {how}{rows} rows expected"
                )

    def _read_hybrid(self, arch: str, n_layers: int) -> dict[str, Any]:
        """SSM / MoE hyper-parameters and the layer pattern of a qwen35 / qwen3next file."""
        n_v = int(self._get(f"{arch}.ssm.time_step_rank"))
        ssm = SSMSpec(
            d_conv=int(self._get(f"{arch}.ssm.conv_kernel")),
            n_k_heads=int(self._get(f"{arch}.ssm.group_count")),
            n_v_heads=n_v,
            head_k_dim=int(self._get(f"{arch}.ssm.state_size")),
            head_v_dim=int(self._get(f"{arch}.ssm.inner_size")) // n_v,
            v_order=HYBRID_ARCHITECTURES[arch],
        )
        if ssm.n_v_heads % ssm.n_k_heads:
            raise ModelFileError(
                f"{self.path}: ssm.time_step_rank {n_v} is not a multiple of "
                f"ssm.group_count {ssm.n_k_heads}"
            )
        # As llama.cpp: every interval-th layer (1-based) is full attention, the rest recurrent.
        interval = int(self._get(f"{arch}.full_attention_interval", 4, required=False))
        recurrent = tuple((i + 1) % interval != 0 for i in range(n_layers))
        moe = None
        n_expert = int(self._get(f"{arch}.expert_count", 0, required=False))
        if n_expert:
            moe = MoESpec(
                n_expert=n_expert,
                n_expert_used=int(self._get(f"{arch}.expert_used_count")),
                n_ff_exp=int(self._get(f"{arch}.expert_feed_forward_length")),
                n_ff_shexp=int(
                    self._get(f"{arch}.expert_shared_feed_forward_length", 0, required=False)
                ),
            )
        head_dim = int(self._get(f"{arch}.attention.key_length"))
        rope_dim = int(self._get(f"{arch}.rope.dimension_count", head_dim, required=False))
        return {"ssm": ssm, "moe": moe, "recurrent": recurrent, "rope_dim": rope_dim}

    def layer_tensor_names(self, layer: int) -> list[str]:
        s, p = self.spec, f"blk.{layer}."
        if s.hybrid:
            return self._hybrid_layer_names(layer)
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

    def _hybrid_layer_names(self, layer: int) -> list[str]:
        s, p = self.spec, f"blk.{layer}."
        names = [p + "attn_norm.weight", p + "post_attention_norm.weight"]
        if s.is_recurrent(layer):
            names += [
                p + n
                for n in (
                    "attn_qkv.weight",  # [q | k | v] rows, q and k per K head, v per V head
                    "attn_gate.weight",  # z, the output gate
                    "ssm_conv1d.weight",
                    "ssm_dt.bias",
                    "ssm_a",  # -exp(A_log)
                    "ssm_norm.weight",
                    "ssm_out.weight",
                )
            ]
            # qwen3next packs [b, a] per K head in one matrix; qwen35 has two.
            if self.has(p + "ssm_ba.weight"):
                names.append(p + "ssm_ba.weight")
            else:
                names += [p + "ssm_beta.weight", p + "ssm_alpha.weight"]
        else:
            names += [
                p + n
                for n in (
                    "attn_q.weight",  # [q, gate] per head
                    "attn_k.weight",
                    "attn_v.weight",
                    "attn_output.weight",
                    "attn_q_norm.weight",
                    "attn_k_norm.weight",
                )
            ]
        if s.moe is None:
            names += [p + "ffn_gate.weight", p + "ffn_up.weight", p + "ffn_down.weight"]
            return names
        names += [p + "ffn_gate_inp.weight", p + "ffn_down_exps.weight"]
        if self.has(p + "ffn_gate_up_exps.weight"):
            names.append(p + "ffn_gate_up_exps.weight")
        else:
            names += [p + "ffn_gate_exps.weight", p + "ffn_up_exps.weight"]
        if s.moe.n_ff_shexp or self.has(p + "ffn_up_shexp.weight"):
            names += [
                p + n + ".weight"
                for n in ("ffn_gate_inp_shexp", "ffn_gate_shexp", "ffn_up_shexp", "ffn_down_shexp")
            ]
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
        # GGUF aligns every tensor; one that is not was edited or mis-written, and reading it
        # anyway silently shifted its weights (the output changed, nothing said so).
        if (t.data_offset - reader.data_offset) % reader.alignment:
            raise ModelFileError(
                f"{path}: tensor {t.name!r} starts at byte {t.data_offset:,}, not a multiple of "
                f"the file's alignment ({reader.alignment}) past the data section: a damaged file"
            )
        if t.data_offset + t.n_bytes > size or t.data.nbytes != t.n_bytes:
            raise ModelFileError(
                f"{path}: truncated GGUF file: tensor {t.name!r} ends at byte "
                f"{t.data_offset + t.n_bytes:,} but the file has {size:,}"
            )
    return reader


def _block_index(name: str) -> str | None:
    if not name.startswith("blk."):
        return None
    i = name[4:].split(".", 1)[0]
    return i if i.isdigit() else None


def _short(v: object, n: int = 40) -> str:
    s = repr(v)
    return s if len(s) <= n else s[:n] + "..."


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
