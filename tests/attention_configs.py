"""Flat configs of the CUDA decode-attention variants (gqa, tile, vec), shared by their host
tests (tests/cuda_fake.py) and their kernel tests (-m gpu)."""

from __future__ import annotations


def attention_flat(variant: str, dec: str | None = None, **knobs: int) -> dict:
    """The flat config of decode attention variant with its knobs (attention_decode.<name>)
    set, under matmul_decode dec where given."""
    flat = {"attention_decode.variant": variant}
    if dec is not None:
        flat["matmul_decode.variant"] = dec
    return flat | {f"attention_decode.{k}": v for k, v in knobs.items()}


MMVW = {"matmul_decode.variant": "mmvw"}  # int8 decode: attention leaves the Q8_1 form
# a whole model's int8 decode: the KV write in rope_kv, the multi-block argmax
MMVW_MODEL = MMVW | {"rope.fuse_kv": 1, "argmax.variant": "multi"}


def model_configs(default: dict, other: dict) -> list[dict]:
    """A variant's whole-model configs: its defaults, other knob values, its defaults under
    the int8 decode of MMVW_MODEL."""
    return [default, other, default | MMVW_MODEL]


def rope_pair(flat: dict) -> tuple[dict, dict]:
    """(flat with q, k RoPE and the KV write fused into attention, flat with them in rope_kv):
    two configs that must decode to the bit alike."""
    return flat | {"attention_decode.fuse_rope": 1}, flat | {"rope.fuse_kv": 1}
