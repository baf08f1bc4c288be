"""Synthetic GGUF models: real shapes, metadata, tokenizer and quant layout, random weights.

Checkpoints cannot be brought onto the GPU machines, so benchmarks and tests run on files written
here. A file has everything the loader needs: llama.cpp tensor names, the Q4_K_M type layout
(or a uniform type), a byte-level BPE vocabulary with merges and a Qwen-style chat template.

Small presets quantize normal float weights with `engine.quantize.quantize` (so the files also
exercise our quantizers); the 1.5b/7b presets draw quantized blocks directly
(`random_quantized`) on all cores and stream each tensor to disk as soon as it exists.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter, LlamaFileType, TokenType

from engine.errors import ConfigError
from engine.quantize import QK_K, block_size, quantize, random_quantized, row_bytes
from engine.synth_hybrid import (
    HYBRID_ARCHS,
    HYBRID_PRESETS,
    MOE_ARCHS,
    SHAPE_KEYS,
    HybridPreset,
    add_fields,
    add_hybrid_metadata,
    hybrid_plan,
)

if TYPE_CHECKING:
    from engine.gguf_model import ModelSpec
    from engine.tuning.memory import ModelShape as MemoryShape
    from engine.tuning.shape import ModelShape

ARCHS = ("qwen2", "llama", "qwen3", *HYBRID_ARCHS)


@dataclass(frozen=True)
class Preset:
    """Model shape. C = n_embd, F = n_ff, V = n_vocab."""

    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    n_vocab: int
    n_ctx: int = 32768
    rope_base: float = 1e6
    rms_eps: float = 1e-6
    fast: bool = False  # draw quantized blocks directly instead of quantizing floats


PRESETS: dict[str, Preset] = {
    # F = 640 is not a multiple of 256, so ffn_down exercises the Q5_0/Q8_0 fallback of Q4_K_M.
    "tiny": Preset(2, 256, 640, 4, 2, 512, n_ctx=4096),
    "small": Preset(4, 512, 1376, 8, 4, 2048, n_ctx=4096),
    # Row counts that are no multiple of any tile (F = 688 rows of ffn_up/gate, 16 * 43, and an
    # F16 ffn_down; V = 509 rows of the LM head, prime): a kernel that drops a ragged tail shows.
    "ragged": Preset(2, 256, 688, 4, 2, 509, n_ctx=4096),
    "1.5b": Preset(28, 1536, 8960, 12, 2, 151936, fast=True),
    "7b": Preset(28, 3584, 18944, 28, 4, 152064, fast=True),
}

QUANT_MIXES = (
    "q4_k_m",
    "f32",
    "f16",
    "bf16",
    "q8_0",
    "q6_k",
    "q5_0",
    "q5_1",
    "q4_0",
    "q4_1",
    "q4_k",
)

_FILE_TYPES = {
    "q4_k_m": LlamaFileType.MOSTLY_Q4_K_M,
    "f32": LlamaFileType.ALL_F32,
    "f16": LlamaFileType.MOSTLY_F16,
    "bf16": LlamaFileType.MOSTLY_BF16,
    "q8_0": LlamaFileType.MOSTLY_Q8_0,
    "q6_k": LlamaFileType.MOSTLY_Q6_K,
    "q5_0": LlamaFileType.MOSTLY_Q5_0,
    "q5_1": LlamaFileType.MOSTLY_Q5_1,
    "q4_0": LlamaFileType.MOSTLY_Q4_0,
    "q4_1": LlamaFileType.MOSTLY_Q4_1,
    "q4_k": LlamaFileType.MOSTLY_Q4_K_S,  # no "all Q4_K" file type exists; S is the closest
}

# Qwen3 dense models use 128-wide heads whatever the hidden size (n_head * D != C on the small
# ones), which is the case key_length exists for.
QWEN3_HEAD_DIM = 128

CONTROL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def _check_choice(what: str, value: object, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ConfigError(f"unknown {what} {value!r}; allowed: {', '.join(allowed)}")


def head_dim(arch: str, preset: Preset) -> int:
    """Attention head width D for this arch and shape."""
    return QWEN3_HEAD_DIM if arch == "qwen3" else preset.n_embd // preset.n_head


def preset_shape(arch: str, preset: str, quant_mix: str = "q4_k_m") -> ModelShape:
    """The shape class (engine.tuning.shape) of the file ``write_synthetic`` writes for these
    arguments, without writing it (the 35b-a3b file is 21 GB): what a synthetic run tuned on."""
    from engine.tuning.shape import file_type_name, model_shape

    spec = preset_spec(arch, preset, quant_mix)
    return model_shape(spec, file_type_name(int(_FILE_TYPES[quant_mix])))


def preset_tensors(arch: str, preset: str, quant_mix: str = "q4_k_m") -> MemoryShape:
    """What the memory model reads of that file (its spec and loaded tensors), without writing
    it: ``agent check`` estimates a synthetic model's footprint from this."""
    from engine.roofline import Tensor
    from engine.tuning.memory import ModelShape as MemoryShape

    spec = preset_spec(arch, preset, quant_mix)
    presets = HYBRID_PRESETS if arch in HYBRID_ARCHS else PRESETS
    out = []
    for t in tensor_plan(arch, presets[preset], quant_mix):
        shape = t.shape
        if t.name.endswith("ffn_gate_inp_shexp.weight") and len(shape) == 1:
            shape = (1, shape[0])  # loaded as a [1, C] matrix (engine.hybrid)
        out.append(Tensor(t.name, t.qtype, shape))
    return MemoryShape(spec, tuple(out))


def preset_spec(arch: str, preset: str, quant_mix: str = "q4_k_m") -> ModelSpec:
    """The ModelSpec of the file ``write_synthetic`` writes for these arguments."""
    from engine.gguf_model import HYBRID_ARCHITECTURES, ModelSpec, MoESpec, SSMSpec

    _check_choice("architecture", arch, ARCHS)
    presets = HYBRID_PRESETS if arch in HYBRID_ARCHS else PRESETS
    _check_choice(f"preset for {arch}", preset, tuple(presets))
    _check_choice("quant mix", quant_mix, QUANT_MIXES)
    p = presets[preset]
    hybrid: dict = {}
    if isinstance(p, HybridPreset):
        ssm = SSMSpec(
            p.d_conv, p.n_k_heads, p.n_v_heads, p.head_k_dim, p.head_v_dim,
            HYBRID_ARCHITECTURES[arch],
        )  # fmt: skip
        moe = (
            MoESpec(p.n_expert, p.n_expert_used, p.n_ff_exp, p.n_ff_shexp)
            if arch in MOE_ARCHS
            else None
        )
        recurrent = tuple((i + 1) % p.interval != 0 for i in range(p.n_layer))
        hybrid = {"ssm": ssm, "moe": moe, "recurrent": recurrent, "rope_dim": p.rope_dim}
        d = p.head_dim
    else:
        d = head_dim(arch, p)
    return ModelSpec(
        arch=arch,
        name=f"synthetic-{arch}-{preset}-{quant_mix}",
        n_layers=p.n_layer,
        n_embd=p.n_embd,
        n_ff=p.n_ff,
        n_head=p.n_head,
        n_head_kv=p.n_head_kv,
        head_dim=d,
        n_vocab=p.n_vocab,
        n_ctx_train=p.n_ctx,
        rope_theta=p.rope_base,
        rms_eps=p.rms_eps,
        rope_neox=arch != "llama",
        attn_bias=False,
        qk_norm=False,
        tied_embeddings=False,
        **hybrid,
    )


# ---------------------------------------------------------------------------------------------
# Quant mixes


def use_more_bits(i_layer: int, n_layers: int) -> bool:
    """llama.cpp's rule for the layers Q4_K_M gives Q6_K attn_v/ffn_down: the first and last
    eighth, and every third layer in between."""
    return (
        i_layer < n_layers // 8
        or i_layer >= 7 * n_layers // 8
        or (i_layer - n_layers // 8) % 3 == 2
    )


def fit_row(qtype: str, row_len: int) -> str:
    """The type llama.cpp falls back to when rows of row_len do not split into qtype blocks."""
    if qtype in ("Q4_K", "Q6_K") and row_len % QK_K:
        qtype = {"Q4_K": "Q5_0", "Q6_K": "Q8_0"}[qtype]
    if row_len % block_size(qtype):
        qtype = "F16"
    return qtype


_LAYER = re.compile(r"^blk\.(\d+)\.")


def choose_qtype(mix: str, name: str, row_len: int, n_layers: int) -> str:
    """Storage type of the 2-D weight `name` (rows of row_len) under a quant mix."""
    _check_choice("quant mix", mix, QUANT_MIXES)
    if mix != "q4_k_m":
        return fit_row(mix.upper(), row_len)
    m = _LAYER.match(name)
    if name == "output.weight":
        want = "Q6_K"
    elif m and name.endswith((".attn_v.weight", ".ffn_down.weight", ".ffn_down_exps.weight")):
        want = "Q6_K" if use_more_bits(int(m.group(1)), n_layers) else "Q4_K"
    else:
        want = "Q4_K"
    return fit_row(want, row_len)


# ---------------------------------------------------------------------------------------------
# Tensor plan


@dataclass(frozen=True)
class TensorPlan:
    """One tensor to write. shape is row-major [N, K] (GGUF stores it as ne = [K, N])."""

    name: str
    shape: tuple[int, ...]
    qtype: str  # "F32" for 1-D tensors
    kind: str  # "weight" | "norm" | "bias"
    std: float

    @property
    def rows(self) -> int:  # stacked experts [E, N, K] are E * N rows
        return int(np.prod(self.shape[:-1]))

    @property
    def nbytes(self) -> int:
        if len(self.shape) == 1:
            return self.shape[0] * 4
        return self.rows * row_bytes(self.qtype, self.shape[-1])


def _weight_std(row_len: int) -> float:
    # 1/sqrt(K) keeps each projection's output near unit RMS on small models (so attention is
    # not uniform and tokens vary); 0.02 is the usual init scale and floor for the big ones.
    return max(0.02, 1.0 / np.sqrt(row_len))


def _hybrid_tensor_plan(arch: str, p: HybridPreset, quant_mix: str) -> list[TensorPlan]:
    out: list[TensorPlan] = []

    def add(name: str, shape: tuple[int, ...], kind: str) -> None:
        if len(shape) == 1:
            out.append(TensorPlan(name, shape, "F32", kind, 0.1))
        elif kind in ("conv", "f32"):  # llama.cpp keeps conv kernels and routers in F32
            out.append(TensorPlan(name, shape, "F32", "weight", 1.0 / np.sqrt(shape[-1])))
        else:
            qt = choose_qtype(quant_mix, name, shape[-1], p.n_layer)
            std = 1.0 if kind == "embd" else _weight_std(shape[-1])
            out.append(TensorPlan(name, shape, qt, "weight", std))

    hybrid_plan(arch, p, add)
    return out


def tensor_plan(arch: str, preset: Preset | HybridPreset, quant_mix: str) -> list[TensorPlan]:
    """Every tensor of the model in file order, with its type and init scale."""
    if isinstance(preset, HybridPreset):
        return _hybrid_tensor_plan(arch, preset, quant_mix)
    c, f, v, n = preset.n_embd, preset.n_ff, preset.n_vocab, preset.n_layer
    d = head_dim(arch, preset)
    q_out, kv_out = preset.n_head * d, preset.n_head_kv * d
    out: list[TensorPlan] = []

    def weight(name: str, rows: int, cols: int, std: float | None = None) -> None:
        qt = choose_qtype(quant_mix, name, cols, n)
        out.append(TensorPlan(name, (rows, cols), qt, "weight", std or _weight_std(cols)))

    def vec(name: str, size: int, kind: str) -> None:
        out.append(TensorPlan(name, (size,), "F32", kind, 0.1))

    weight("token_embd.weight", v, c, std=1.0)  # RMSNorm rescales; unit scale avoids f16 subnormals
    for i in range(n):
        p = f"blk.{i}."
        vec(p + "attn_norm.weight", c, "norm")
        weight(p + "attn_q.weight", q_out, c)
        weight(p + "attn_k.weight", kv_out, c)
        weight(p + "attn_v.weight", kv_out, c)
        if arch == "qwen2":
            vec(p + "attn_q.bias", q_out, "bias")
            vec(p + "attn_k.bias", kv_out, "bias")
            vec(p + "attn_v.bias", kv_out, "bias")
        if arch == "qwen3":
            vec(p + "attn_q_norm.weight", d, "norm")
            vec(p + "attn_k_norm.weight", d, "norm")
        weight(p + "attn_output.weight", c, q_out)
        vec(p + "ffn_norm.weight", c, "norm")
        weight(p + "ffn_gate.weight", f, c)
        weight(p + "ffn_up.weight", f, c)
        weight(p + "ffn_down.weight", c, f)
    vec("output_norm.weight", c, "norm")
    weight("output.weight", v, c)
    return out


# ---------------------------------------------------------------------------------------------
# Byte-level BPE vocabulary


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible map from bytes to printable characters (space -> 'Ġ', newline -> 'Ċ').

    Printable Latin-1 bytes map to themselves; the other 68 take code points from 256 upward.
    Insertion order is the GPT-2 token order of the 256 byte tokens.
    """
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    rest = [b for b in range(256) if b not in keep]
    table = {b: chr(b) for b in keep}
    table.update({b: chr(256 + i) for i, b in enumerate(rest)})
    return table


_CORPUS = """
The river town woke slowly in the grey light of the morning. Fishermen walked down to the water
with their nets, and the baker opened his shop on the corner of the main street. Children ran to
school past the old stone bridge, where the water moved quickly after the rain of the night. In
the market, people were talking about the weather, the price of bread and the news from the
city. A young teacher stopped to buy apples and asked the farmer where they had been grown. He
said that his family had worked the same land for more than a hundred years, and that the best
fruit always came from the trees closest to the river. She thanked him and walked on, thinking
about how much of the town had changed and how much had stayed the same. The library was still
open every day except Sunday, and the clock on the tower still struck the hour a little late.
Later that afternoon the sky cleared, the wind turned to the west, and the boats came back with
fish for the evening meal. Everyone agreed it had been a good day, one of the first warm days of
the year. When the lights of the houses came on, the streets grew quiet again, and the only sound
was the river running under the bridge toward the sea. What would tomorrow bring? Nobody knew,
but they were ready for it: the work, the weather, the people and the stories they would share.
Numbers appear too: 1 2 3 4 5 6 7 8 9 10, 2024, 100%, and symbols like (a), [b], {c}, x = y + 1.
"""

_PRETOKEN = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?[A-Za-z]+| ?[0-9]| ?[^\sA-Za-z0-9]+|\s+")


@dataclass(frozen=True)
class Vocab:
    """tokens[i] is token i; merges are "a b" strings in rank order; types are TokenType ints."""

    tokens: list[str]
    types: list[int]
    merges: list[str]
    bos_id: int
    eos_id: int
    pad_id: int


def _learn_merges(limit: int, known: set[str]) -> list[tuple[str, str]]:
    """Plain BPE training on _CORPUS: repeatedly merge the most frequent adjacent pair."""
    enc = bytes_to_unicode()
    words = Counter(
        tuple(enc[b] for b in w.encode("utf-8")) for w in _PRETOKEN.findall(_CORPUS.strip())
    )
    merges: list[tuple[str, str]] = []
    while len(merges) < limit:
        pairs: Counter[tuple[str, str]] = Counter()
        for w, cnt in words.items():
            for pair in zip(w, w[1:], strict=False):
                pairs[pair] += cnt
        # Most frequent first, ties broken by the pair itself so the result is deterministic;
        # a pair whose result already exists (reached by another split) is skipped for uniqueness.
        ranked = sorted(pairs.items(), key=lambda kv: (-kv[1], kv[0]))
        best = next((p for p, _ in ranked if p[0] + p[1] not in known), None)
        if best is None:
            break
        a, b = best
        known.add(a + b)
        merges.append(best)
        merged: Counter[tuple[str, ...]] = Counter()
        for w, cnt in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(a + b)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            merged[tuple(out)] += cnt
        words = merged
    return merges


def _wordish(tok: str) -> bool:
    body = tok[1:] if tok.startswith("Ġ") else tok
    return (body.isascii() and body.isalpha() and body.islower()) or tok == "Ġ"


def _synthetic_merges(tokens: list[str], known: set[str], count: int) -> list[tuple[str, str]]:
    """count more merges of existing word pieces into new, unique, word-like tokens.

    Pieces are lower-case letters with an optional leading 'Ġ' (a word start); the right-hand
    piece never starts a word. Early (short) pieces are preferred (u^3 indexing).
    """
    rng = np.random.default_rng(0x5EED)  # fixed: the vocabulary does not depend on the model seed
    heads = [t for t in tokens if _wordish(t)]
    tails = [t for t in heads if not t.startswith("Ġ")]
    out: list[tuple[str, str]] = []
    while len(out) < count:
        for ua, ub in rng.random((8192, 2)) ** 3:
            a, b = heads[int(ua * len(heads))], tails[int(ub * len(tails))]
            s = a + b
            if len(s) > 12 or s in known:
                continue
            known.add(s)
            out.append((a, b))
            heads.append(s)
            if not s.startswith("Ġ"):
                tails.append(s)
            if len(out) == count:
                break
    return out


@lru_cache(maxsize=8)
def build_vocab(n_vocab: int) -> Vocab:
    """A consistent byte-level BPE vocabulary of exactly n_vocab tokens.

    256 byte tokens (GPT-2 order), then one token per merge (merges learned from a short English
    text first, then synthetic ones), then the control tokens. Every merge's parts precede it.
    """
    n_merges = n_vocab - 256 - len(CONTROL_TOKENS)
    if n_merges < 0:
        raise ConfigError(f"vocabulary of {n_vocab} is too small; need at least 259 tokens")
    tokens = list(bytes_to_unicode().values())
    known = set(tokens)
    merges = _learn_merges(n_merges, known)
    tokens += [a + b for a, b in merges]
    extra = _synthetic_merges(tokens, known, n_merges - len(merges))
    tokens += [a + b for a, b in extra]
    merges += extra
    first_control = len(tokens)
    tokens += CONTROL_TOKENS
    types = [int(TokenType.NORMAL)] * first_control + [int(TokenType.CONTROL)] * len(CONTROL_TOKENS)
    return Vocab(
        tokens=tokens,
        types=types,
        merges=[f"{a} {b}" for a, b in merges],
        bos_id=first_control,  # <|endoftext|>, as in Qwen2.5 files
        eos_id=first_control + 2,  # <|im_end|>
        pad_id=first_control,
    )


# ---------------------------------------------------------------------------------------------
# Writing

_CHUNK_ELEMS = 1 << 23  # elements per parallel generation task (~4 MB of Q4_K)


def _add_metadata(
    w: GGUFWriter,
    arch: str,
    preset_name: str,
    p: Preset | HybridPreset,
    quant_mix: str,
    vocab: Vocab,
) -> None:
    w.add_name(f"synthetic-{arch}-{preset_name}-{quant_mix}")
    if isinstance(p, HybridPreset):
        add_hybrid_metadata(w, arch, p)
    else:
        _add_dense_metadata(w, arch, p)
    w.add_file_type(int(_FILE_TYPES[quant_mix]))
    if quant_mix not in ("f32", "f16", "bf16"):
        w.add_quantization_version(2)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("llama-bpe" if arch == "llama" else "qwen2")
    w.add_token_list(vocab.tokens)
    w.add_token_types(vocab.types)
    w.add_token_merges(vocab.merges)
    w.add_bos_token_id(vocab.bos_id)
    w.add_eos_token_id(vocab.eos_id)
    w.add_pad_token_id(vocab.pad_id)
    w.add_add_bos_token(False)
    w.add_chat_template(CHAT_TEMPLATE)


_DENSE_KEYS = (
    *SHAPE_KEYS,
    (GGUFWriter.add_layer_norm_rms_eps, "rms_eps"),
    (GGUFWriter.add_rope_freq_base, "rope_base"),
)


def _add_dense_metadata(w: GGUFWriter, arch: str, p: Preset) -> None:
    d = head_dim(arch, p)
    add_fields(w, p, _DENSE_KEYS)
    if arch == "qwen3" or d != p.n_embd // p.n_head:
        w.add_key_length(d)
        w.add_value_length(d)
    if arch == "llama":
        w.add_rope_dimension_count(d)
        w.add_vocab_size(p.n_vocab)


def _tensor_rng(seed: int, *key: int) -> np.random.Generator:
    # One independent stream per (tensor, chunk): output is the same for any thread count.
    return np.random.default_rng(np.random.SeedSequence(seed, spawn_key=key))


def _make_small(t: TensorPlan, index: int, seed: int) -> np.ndarray:
    """A whole tensor from normal floats (1-D tensors always; 2-D ones on small presets)."""
    rng = _tensor_rng(seed, index)
    if t.kind == "ssm_a":  # -exp(A_log) with A in [1, 8]: per-token decays exp(g) in (0, 1)
        return -rng.uniform(1.0, 8.0, t.shape).astype(np.float32)
    x = rng.standard_normal(t.shape, dtype=np.float32) * np.float32(t.std)
    if len(t.shape) == 1:
        return x + np.float32(1.0) if t.kind == "norm" else x
    return quantize(x.reshape(t.rows, t.shape[-1]), t.qtype).reshape(*t.shape[:-1], -1)


def _submit(
    pool: ThreadPoolExecutor, t: TensorPlan, index: int, seed: int, fast: bool, repeat: bool = False
) -> Callable[[], np.ndarray]:
    """Start generating tensor t; returns a function that waits for it. repeat: only the first
    chunk is drawn; every later chunk is that chunk's block stream rotated by a random number of
    blocks (never whole rows), so its rows are new mixes of real blocks at a memcpy's cost (rows
    of one block have no such mix: drawn in full)."""
    if not fast or len(t.shape) == 1:
        return pool.submit(_make_small, t, index, seed).result
    n, k = t.rows, t.shape[-1]
    out = np.empty((n, row_bytes(t.qtype, k)), dtype=np.uint8)
    rows = max(1, _CHUNK_ELEMS // k)
    n_chunks = (n + rows - 1) // rows

    def fill(chunk: int) -> None:
        r0, r1 = chunk * rows, min(n, (chunk + 1) * rows)
        out[r0:r1] = random_quantized(_tensor_rng(seed, index, chunk), (r1 - r0, k), t.qtype, t.std)

    bb = row_bytes(t.qtype, block_size(t.qtype))  # bytes per block
    per_row = out.shape[1] // bb
    if not repeat or n_chunks < 2 or per_row < 2:
        futures = [pool.submit(fill, c) for c in range(n_chunks)]
    else:
        first = pool.submit(fill, 0)
        base = out[:rows].reshape(-1, bb)

        def rotate(chunk: int) -> None:
            first.result()
            nb = len(base)
            off = 1 + int(_tensor_rng(seed, index, chunk).integers(0, nb - 1))
            if off % per_row == 0:  # a whole-row shift would copy rows of the first chunk
                off = off % (nb - 1) + 1
            r0, r1 = chunk * rows, min(n, (chunk + 1) * rows)
            dst = out[r0:r1].reshape(-1, bb)
            head = min(len(dst), nb - off)
            dst[:head] = base[off : off + head]
            dst[head:] = base[: len(dst) - head]

        futures = [first] + [pool.submit(rotate, c) for c in range(1, n_chunks)]

    def wait() -> np.ndarray:
        for fut in futures:
            fut.result()
        return out

    return wait


def write_synthetic(
    path: str | os.PathLike[str],
    arch: str = "qwen2",
    preset: str = "tiny",
    quant_mix: str = "q4_k_m",
    seed: int = 0,
    progress: bool = True,
) -> Path:
    """Write a random-weight GGUF model of the given architecture, shape preset and quant mix.

    The same arguments always give the same bytes. Tensors are generated on all cores one tensor
    ahead of the disk and written as they complete, so memory stays at about two tensors.
    """
    _check_choice("architecture", arch, ARCHS)
    presets = HYBRID_PRESETS if arch in HYBRID_ARCHS else PRESETS
    _check_choice(f"preset for {arch}", preset, tuple(presets))
    _check_choice("quant mix", quant_mix, QUANT_MIXES)
    if not isinstance(seed, int) or seed < 0:
        raise ConfigError(f"seed must be a non-negative integer, got {seed!r}")
    p = presets[preset]
    plan = tensor_plan(arch, p, quant_mix)
    vocab = build_vocab(p.n_vocab)

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written under a temporary name and renamed at the end: an interrupted run leaves no
    # truncated file under the real name for a later run to load.
    partial = path.with_name(path.name + ".partial")
    writer = GGUFWriter(partial, arch)
    _add_metadata(writer, arch, preset, p, quant_mix, vocab)
    for t in plan:
        if len(t.shape) == 1:
            writer.add_tensor_info(t.name, t.shape, np.dtype(np.float32), t.nbytes)
        else:
            shape = (*t.shape[:-1], row_bytes(t.qtype, t.shape[-1]))
            writer.add_tensor_info(
                t.name, shape, np.dtype(np.uint8), t.nbytes, raw_dtype=GGMLQuantizationType[t.qtype]
            )

    from tqdm import tqdm

    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        total = sum(t.nbytes for t in plan)
        with (
            ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool,
            tqdm(
                total=total, unit="B", unit_scale=True, desc=path.name, disable=not progress
            ) as bar,
        ):
            rep = getattr(p, "repeat", False)
            pending = _submit(pool, plan[0], 0, seed, p.fast, rep)
            for i, t in enumerate(plan):
                data = pending().reshape(*t.shape[:-1], -1)
                if i + 1 < len(plan):
                    pending = _submit(pool, plan[i + 1], i + 1, seed, p.fast, rep)
                writer.write_tensor_data(data)
                bar.update(t.nbytes)
        writer.close()
        partial.replace(path)
    except BaseException:
        writer.close()
        partial.unlink(missing_ok=True)
        raise
    return path


# ---------------------------------------------------------------------------------------------
# Command line (`python -m engine.synth`; `python -m engine synth` in engine/cli.py is the same)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The synth options, for a parser or sub-parser."""
    parser.add_argument("--arch", default="qwen2", help=f"one of {', '.join(ARCHS)}")
    parser.add_argument(
        "--preset",
        default="tiny",
        help=f"dense: {', '.join(PRESETS)}; hybrid: {', '.join(HYBRID_PRESETS)}",
    )
    parser.add_argument("--quant", default="q4_k_m", help=f"one of {', '.join(QUANT_MIXES)}")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True, help="output .gguf path")
    parser.add_argument("--no-progress", action="store_true")


def synth_command(args: argparse.Namespace) -> Path:
    """Run `synth` for parsed arguments (see add_arguments)."""
    return write_synthetic(
        args.out,
        arch=args.arch,
        preset=args.preset,
        quant_mix=args.quant,
        seed=args.seed,
        progress=not getattr(args, "no_progress", False),
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m engine.synth", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        path = synth_command(args)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
