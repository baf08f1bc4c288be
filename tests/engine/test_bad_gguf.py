"""Hyper-parameters that disagree with the tensors, misaligned tensors and prompts that are not
UTF-8: one line naming the key (and the tensor it disagrees with), exit 2, before anything is
allocated (issue 30)."""

from __future__ import annotations

import pytest

from engine.cli import main
from engine.errors import ConfigError
from tests.gguf_edit import rewrite, shift_tensor_offset


def _run(capsys, path, prompt: str = "x") -> tuple[int, str]:
    code = main(["run", "--model", str(path), "--prompt", prompt, "--max-tokens", "2"])
    _, err = capsys.readouterr()
    return code, err


@pytest.mark.parametrize(
    ("key", "value", "tensor"),
    [
        ("embedding_length", 2**31 - 1, "token_embd.weight"),  # was a 22 GB allocation
        ("embedding_length", 0, "token_embd.weight"),  # was a ValueError
        ("block_count", 10**7, "blk.0 .. blk.1"),  # was 5.8 GB of names, then MemoryError
        ("block_count", 0, "blk.0 .. blk.1"),  # was a KeyError
        ("attention.head_count", 0, "blk.0.attn_q.weight"),  # was a ZeroDivisionError
        ("attention.head_count_kv", 0, "blk.0.attn_k.weight"),  # was a ValueError
        ("attention.head_count", 6, "blk.0.attn_q.weight"),
        ("feed_forward_length", 7, "blk.0.ffn_up.weight"),
    ],
)
def test_hyperparameter_against_tensor_shapes(
    capsys, tmp_path, tiny_model_path, key, value, tensor
):
    p = rewrite(tiny_model_path, tmp_path / "bad.gguf", metadata={f"qwen2.{key}": value})
    code, err = _run(capsys, p)
    assert code == 2, err
    assert err.count("\n") == 1 and f"qwen2.{key} = {value}" in err and tensor in err, err


def test_misaligned_tensor_offset_is_refused(capsys, tmp_path, tiny_model_path):
    """Four bytes later the tensor is still inside the file: it used to load shifted weights and
    change the output without a word."""
    p = shift_tensor_offset(tiny_model_path, tmp_path / "mis.gguf", "blk.0.attn_k.weight", 4)
    code, err = _run(capsys, p)
    assert code == 2 and "'blk.0.attn_k.weight'" in err and "alignment (32)" in err, err


def test_prompt_not_utf8(capsys, tiny_model_path):
    """Bytes that are not UTF-8 reach argv as lone surrogates (a TypeError in the tokenizer)."""
    code, err = _run(capsys, tiny_model_path, "a\udcffb")
    assert code == 2 and err.count("\n") == 1 and "not valid UTF-8" in err and "xff" in err, err


def test_kv_cache_estimated_before_allocating(tiny_model_path):
    """A context the device cannot hold is refused from the estimate, not by the OOM killer."""
    from engine.runtime import load

    model = load(tiny_model_path).model
    with pytest.raises(ConfigError, match="KV cache of 2,000,000,000 tokens needs"):
        model.new_cache(2_000_000_000)
    assert model.new_cache(64).capacity == 64
