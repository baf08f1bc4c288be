"""engine.quantize against gguf.quants.dequantize (the reference dequantizer): block sizes, round
trip error per type, edge-case blocks, and the statistics of random_quantized."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from engine.errors import UnsupportedError
from engine.quantize import QTYPES, quantize, random_quantized, row_bytes
from tests.op_cases import nmse

# (elements, bytes) per block, from ggml's block structs.
BLOCKS = {
    "F32": (1, 4),
    "F16": (1, 2),
    "BF16": (1, 2),
    "Q8_0": (32, 34),
    "Q5_0": (32, 22),
    "Q5_1": (32, 24),
    "Q4_0": (32, 18),
    "Q4_1": (32, 20),
    "Q4_K": (256, 144),
    "Q6_K": (256, 210),
}

# NMSE limits on normal data, about 1.5-2x the worst measured over several seeds.
NMSE = {
    "F32": 0.0,
    "F16": 1e-6,
    "BF16": 1e-5,
    "Q8_0": 1e-4,
    "Q6_K": 6e-4,
    "Q5_1": 3e-3,
    "Q5_0": 4e-3,
    "Q4_K": 8e-3,
    "Q4_1": 1e-2,
    "Q4_0": 1.2e-2,
}
# With one large outlier per row the blocks holding it lose resolution: looser limits.
NMSE_OUTLIER = {
    **NMSE,
    "Q8_0": 3e-4,
    "Q6_K": 2e-3,
    "Q5_1": 5e-3,
    "Q5_0": 1.2e-2,
    "Q4_K": 1.5e-2,
    "Q4_1": 2e-2,
    "Q4_0": 2.5e-2,
}


def roundtrip(a: np.ndarray, qtype: str) -> np.ndarray:
    q = quantize(a, qtype)
    assert q.dtype == np.uint8
    return dequantize(q, GGMLQuantizationType[qtype]).reshape(a.shape)


def test_qtypes_cover_the_engine_types() -> None:
    assert set(QTYPES) == set(BLOCKS)


@pytest.mark.parametrize("qtype", QTYPES)
def test_byte_layout_size(qtype: str) -> None:
    bs, ts = BLOCKS[qtype]
    a = np.random.default_rng(0).standard_normal((3, 512)).astype(np.float32)
    q = quantize(a, qtype)
    assert q.shape == (3, 512 // bs * ts)
    assert row_bytes(qtype, 512) == 512 // bs * ts
    assert random_quantized(np.random.default_rng(0), (3, 512), qtype, 1.0).shape == q.shape


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("seed", [0, 1])
def test_roundtrip_normal(qtype: str, seed: int) -> None:
    a = np.random.default_rng(seed).standard_normal((32, 1024)).astype(np.float32) * 0.02
    assert nmse(a, roundtrip(a, qtype)) <= NMSE[qtype]


@pytest.mark.parametrize("qtype", QTYPES)
def test_roundtrip_varied_block_scales(qtype: str) -> None:
    # Each 32-element group has its own magnitude (x16 range), so every packed sub-block scale
    # and min of the K-quants takes different values, high bits included.
    rng = np.random.default_rng(2)
    gain = np.repeat(2.0 ** rng.uniform(-2, 2, (16, 32)), 32, axis=1)
    a = (rng.standard_normal((16, 1024)) * gain).astype(np.float32)
    assert nmse(a, roundtrip(a, qtype)) <= NMSE[qtype]


@pytest.mark.parametrize("qtype", QTYPES)
def test_all_zero_block_is_exact(qtype: str) -> None:
    a = np.zeros((2, 512), dtype=np.float32)
    a[1, 256:] = np.random.default_rng(3).standard_normal(256)  # a zero block beside a normal one
    out = roundtrip(a, qtype)
    assert np.all(np.isfinite(out))
    assert np.all(out[0] == 0) and np.all(out[1, :256] == 0)


@pytest.mark.parametrize("qtype", QTYPES)
def test_outlier_block(qtype: str) -> None:
    a = np.random.default_rng(4).standard_normal((8, 512)).astype(np.float32)
    a[:, 100] = 40.0
    out = roundtrip(a, qtype)
    assert np.allclose(out[:, 100], 40.0, rtol=0.02)
    assert nmse(a, out) <= NMSE_OUTLIER[qtype]


@pytest.mark.parametrize("qtype", QTYPES)
def test_negative_only_rows(qtype: str) -> None:
    rng = np.random.default_rng(5)
    a = -np.abs(rng.standard_normal((8, 512))).astype(np.float32) - 0.5
    out = roundtrip(a, qtype)
    assert nmse(a, out) <= NMSE[qtype]
    assert np.all(out <= 1e-3)


@pytest.mark.parametrize("qtype", QTYPES)
def test_constant_rows(qtype: str) -> None:
    a = np.full((2, 256), -0.3, dtype=np.float32)
    a[1] = 0.7
    assert np.allclose(roundtrip(a, qtype), a, rtol=5e-3, atol=0)


def test_bad_input_is_rejected() -> None:
    a = np.zeros((2, 100), dtype=np.float32)
    with pytest.raises(ValueError, match="multiple of the Q4_K block size 256"):
        quantize(a, "Q4_K")
    with pytest.raises(ValueError, match="2-D"):
        quantize(np.zeros(256, dtype=np.float32), "Q8_0")
    with pytest.raises(UnsupportedError, match="Q3_K"):
        quantize(np.zeros((1, 256), dtype=np.float32), "Q3_K")


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("std", [0.02, 1.0])
def test_random_quantized_statistics(qtype: str, std: float) -> None:
    q = random_quantized(np.random.default_rng(6), (256, 2048), qtype, std)
    w = dequantize(q, GGMLQuantizationType[qtype])
    assert w.shape == (256, 2048)
    assert np.all(np.isfinite(w))
    assert abs(w.std() / std - 1) < 0.03
    assert abs(w.mean()) < 0.01 * std
    # Not one repeated block: rows differ and scales vary between blocks.
    assert not np.array_equal(w[0], w[1])
    bs = BLOCKS[qtype][0]
    if bs > 1:
        block_rms = np.sqrt((w.reshape(-1, bs) ** 2).mean(axis=1))
        assert block_rms.std() > 0.05 * block_rms.mean()


@pytest.mark.parametrize("qtype", QTYPES)
def test_random_quantized_is_deterministic(qtype: str) -> None:
    def draw(seed: int) -> np.ndarray:
        return random_quantized(np.random.default_rng(seed), (4, 512), qtype, 0.1)

    assert np.array_equal(draw(7), draw(7))
    assert not np.array_equal(draw(7), draw(8))
