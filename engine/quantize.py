"""Quantize float32 weights into GGML block layouts, and draw random quantized weights directly.

`quantize` is exact about the byte layout (it must round-trip through `gguf.quants.dequantize`,
the engine's reference dequantizer); its scale search is good, not llama.cpp-optimal.
`random_quantized` skips the float stage: it fills blocks with random quants and picks the block
scales so the dequantized weights have a requested std and zero mean. That is what lets a
7B-shaped synthetic file be written in seconds.

Shape legend: N rows, K row length in elements, nb blocks (per row or in total), bs elements per
block, ts bytes per block. Rows are quantized independently, so K must be a multiple of bs.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf import quants as gq

from engine.errors import UnsupportedError

QK_K = 256  # elements per K-quant super-block

QTYPES = ("F32", "F16", "BF16", "Q8_0", "Q5_0", "Q5_1", "Q4_0", "Q4_1", "Q4_K", "Q6_K")
"""Types `quantize` and `random_quantized` write."""

_FLOAT_DTYPES = {"F32": np.float32, "F16": np.float16}


def _ggml_type(qtype: str) -> GGMLQuantizationType:
    if qtype not in QTYPES:
        raise UnsupportedError(f"cannot write quant type {qtype!r}; supported: {', '.join(QTYPES)}")
    return GGMLQuantizationType[qtype]


def block_size(qtype: str) -> int:
    """Elements per block (1 for float types)."""
    return GGML_QUANT_SIZES[_ggml_type(qtype)][0]


def type_size(qtype: str) -> int:
    """Bytes per block."""
    return GGML_QUANT_SIZES[_ggml_type(qtype)][1]


def row_bytes(qtype: str, k: int) -> int:
    """Bytes of one row of k elements; k must be a multiple of the block size."""
    bs, ts = GGML_QUANT_SIZES[_ggml_type(qtype)]
    if k % bs:
        raise ValueError(f"row length {k} is not a multiple of the {qtype} block size {bs}")
    return k // bs * ts


def _check_2d(shape: tuple[int, ...], qtype: str) -> tuple[int, int]:
    if len(shape) != 2:
        raise ValueError(f"expected a 2-D [N, K] array, got shape {tuple(shape)}")
    n, k = shape
    row_bytes(qtype, k)  # validates k against the block size
    return n, k


def quantize(a: np.ndarray, qtype: str) -> np.ndarray:
    """Quantize float [N, K] to uint8 [N, row_bytes(qtype, K)] in GGML block layout.

    Round trip: `gguf.quants.dequantize(quantize(a, t), GGMLQuantizationType[t])` ~= a.
    """
    gtype = _ggml_type(qtype)
    n, k = _check_2d(a.shape, qtype)
    a = np.ascontiguousarray(a, dtype=np.float32)
    if qtype in _FLOAT_DTYPES:
        return a.astype(_FLOAT_DTYPES[qtype]).view(np.uint8).reshape(n, -1)
    if qtype == "Q4_K":
        blocks = _quantize_q4_k(a.reshape(-1, QK_K))
    elif qtype == "Q6_K":
        blocks = _quantize_q6_k(a.reshape(-1, QK_K))
    else:
        return np.asarray(gq.quantize(a, gtype), dtype=np.uint8).reshape(n, -1)
    return blocks.reshape(n, row_bytes(qtype, k))


def _f16_round(x: np.ndarray) -> np.ndarray:
    """The float32 value a scale has once stored as f16 (so quants are fit to the stored scale)."""
    return x.astype(np.float16).astype(np.float32)


def _safe_div(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    """num / den, 0 where den == 0 (all-zero blocks have zero scales)."""
    out = np.zeros(np.broadcast_shapes(num.shape, den.shape), dtype=np.float32)
    np.divide(num, den, out=out, where=den != 0)
    return out


# ---------------------------------------------------------------------------------------------
# Q4_K: 256-element super-block = 8 sub-blocks of 32; y = d*sc[j]*q - dmin*m[j], q in 0..15,
# sc and m 6-bit. Bytes: f16 d | f16 dmin | 12 bytes packed sc/m | 128 bytes of nibbles.


def _fit_affine(x: np.ndarray, nmax: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-row fit of x ~= scale * L - mn, L in 0..nmax, scale >= 0, mn >= 0.

    x: [R, 32]. Tries a range of inverse scales around (nmax / range), re-solves scale and offset
    by least squares for each assignment and keeps the one with the lowest squared error.
    """
    xmin = np.minimum(x.min(axis=-1), 0.0)  # offset is stored as a non-negative "min"
    xmax = x.max(axis=-1)
    span = xmax - xmin
    best_scale = span / nmax
    best_min = xmin
    lvl = np.clip(np.rint(_safe_div(x - xmin[:, None], best_scale[:, None])), 0, nmax)
    best_err = ((best_scale[:, None] * lvl + xmin[:, None] - x) ** 2).sum(-1)
    n = x.shape[-1]
    sum_x = x.sum(-1)
    for step in np.arange(-1.0, 1.01, 0.1):
        iscale = _safe_div(np.float32(nmax + step), span)
        lvl = np.clip(np.rint(iscale[:, None] * (x - xmin[:, None])), 0, nmax)
        sum_l = lvl.sum(-1)
        sum_l2 = (lvl * lvl).sum(-1)
        sum_xl = (lvl * x).sum(-1)
        det = n * sum_l2 - sum_l * sum_l
        scale = _safe_div(n * sum_xl - sum_x * sum_l, det)
        offset = _safe_div(sum_l2 * sum_x - sum_l * sum_xl, det)
        # A positive offset cannot be stored: refit the scale with the offset pinned at 0.
        pos = offset > 0
        offset = np.where(pos, 0.0, offset)
        scale = np.where(pos, _safe_div(sum_xl, sum_l2), scale)
        err = ((scale[:, None] * lvl + offset[:, None] - x) ** 2).sum(-1)
        better = (err < best_err) & (scale > 0)
        best_err = np.where(better, err, best_err)
        best_scale = np.where(better, scale, best_scale)
        best_min = np.where(better, offset, best_min)
    return best_scale.astype(np.float32), (-best_min).astype(np.float32)


def _pack_q4_k_scales(sc: np.ndarray, mn: np.ndarray) -> np.ndarray:
    """[nb, 8] 6-bit scales and mins -> [nb, 12] bytes (layout of ggml's get_scale_min_k4)."""
    sc = sc.astype(np.uint8)
    mn = mn.astype(np.uint8)
    out = np.empty((sc.shape[0], 12), dtype=np.uint8)
    # bytes 0-3: low 6 bits of sc[0:4], top 2 bits hold sc[4:8] >> 4; bytes 4-7 the same for
    # mins; bytes 8-11: low nibbles of sc[4:8] and mn[4:8].
    out[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    out[:, 4:8] = mn[:, 0:4] | ((mn[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((mn[:, 4:8] & 0x0F) << 4)
    return out


def _pack_nibbles_q4_k(q: np.ndarray) -> np.ndarray:
    """[nb, 8, 32] values 0..15 -> [nb, 128]: sub-block 2j in low nibbles, 2j+1 in high ones."""
    q = q.astype(np.uint8)
    return (q[:, 0::2] | (q[:, 1::2] << 4)).reshape(q.shape[0], 128)


def _q4_k_bytes(d: np.ndarray, dmin: np.ndarray, scales: np.ndarray, qs: np.ndarray) -> np.ndarray:
    out = np.empty((d.shape[0], 144), dtype=np.uint8)
    out[:, 0:2] = d.astype(np.float16).reshape(-1, 1).view(np.uint8)
    out[:, 2:4] = dmin.astype(np.float16).reshape(-1, 1).view(np.uint8)
    out[:, 4:16] = scales
    out[:, 16:144] = qs
    return out


def _quantize_q4_k(x: np.ndarray) -> np.ndarray:
    """x [nb, 256] float32 -> [nb, 144] uint8."""
    nb = x.shape[0]
    xs = x.reshape(nb, 8, 32)
    scale, mn = _fit_affine(xs.reshape(-1, 32), nmax=15)
    scale = scale.reshape(nb, 8)
    mn = mn.reshape(nb, 8)
    d = _f16_round(scale.max(-1) / 63)
    dmin = _f16_round(mn.max(-1) / 63)
    sc = np.clip(np.rint(_safe_div(scale, d[:, None])), 0, 63)
    m = np.clip(np.rint(_safe_div(mn, dmin[:, None])), 0, 63)
    # Re-fit the quants to the scales as stored (f16 times 6-bit), not to the ideal ones.
    eff_scale = (d[:, None] * sc)[..., None]
    eff_min = (dmin[:, None] * m)[..., None]
    q = np.clip(np.rint(_safe_div(xs + eff_min, eff_scale)), 0, 15)
    return _q4_k_bytes(d, dmin, _pack_q4_k_scales(sc, m), _pack_nibbles_q4_k(q))


# ---------------------------------------------------------------------------------------------
# Q6_K: 256-element super-block = 16 sub-blocks of 16; y = d*sc[j]*(q - 32), q in 0..63, sc int8.
# Bytes: 128 ql (low nibbles) | 64 qh (high 2 bits) | 16 int8 scales | f16 d.


def _fit_symmetric(x: np.ndarray, nmax: int) -> np.ndarray:
    """Per-row signed scale for x ~= scale * L, L in -nmax..nmax-1. x: [R, 16] -> [R]."""
    imax = np.abs(x).argmax(-1)
    vmax = np.take_along_axis(x, imax[:, None], -1)[:, 0]  # signed value of largest magnitude
    best_scale = np.zeros(x.shape[0], dtype=np.float32)
    best_gain = np.full(x.shape[0], -1.0, dtype=np.float32)
    # Map vmax near -nmax (the asymmetric range has one more negative level), try neighbours.
    for step in np.arange(-0.9, 0.91, 0.1):
        iscale = _safe_div(np.float32(-(nmax + step)), vmax)
        lvl = np.clip(np.rint(iscale[:, None] * x), -nmax, nmax - 1)
        sum_xl = (lvl * x).sum(-1)
        sum_l2 = (lvl * lvl).sum(-1)
        # Least-squares scale sum_xl/sum_l2 reduces the error by sum_xl^2/sum_l2: maximise it.
        gain = _safe_div(sum_xl * sum_xl, sum_l2)
        better = gain > best_gain
        best_gain = np.where(better, gain, best_gain)
        best_scale = np.where(better, _safe_div(sum_xl, sum_l2), best_scale)
    return best_scale


def _pack_q6_k(q: np.ndarray, sc: np.ndarray, d: np.ndarray) -> np.ndarray:
    """q [nb, 256] in 0..63, sc [nb, 16] int8, d [nb] -> [nb, 210] uint8.

    Each 128-element half h: element h*128 + s*32 + b (s = 0..3, b = 0..31) keeps its low nibble
    in ql[h*64 + (s % 2)*32 + b] (shifted by 4 when s >= 2) and its top 2 bits in
    qh[h*32 + b] at bit 2*s.
    """
    nb = q.shape[0]
    q = q.astype(np.uint8).reshape(nb, 2, 4, 32)  # [nb, half, s, b]
    low = q & 0x0F
    high = q >> 4
    ql = np.concatenate(
        [low[:, :, 0] | (low[:, :, 2] << 4), low[:, :, 1] | (low[:, :, 3] << 4)], axis=-1
    )  # [nb, half, 64]
    qh = high[:, :, 0] | (high[:, :, 1] << 2) | (high[:, :, 2] << 4) | (high[:, :, 3] << 6)
    out = np.empty((nb, 210), dtype=np.uint8)
    out[:, 0:128] = ql.reshape(nb, 128)
    out[:, 128:192] = qh.reshape(nb, 64)
    out[:, 192:208] = sc.astype(np.int8).view(np.uint8)
    out[:, 208:210] = d.astype(np.float16).reshape(-1, 1).view(np.uint8)
    return out


def _quantize_q6_k(x: np.ndarray) -> np.ndarray:
    """x [nb, 256] float32 -> [nb, 210] uint8."""
    nb = x.shape[0]
    xs = x.reshape(nb, 16, 16)
    scale = _fit_symmetric(xs.reshape(-1, 16), nmax=32).reshape(nb, 16)
    imax = np.abs(scale).argmax(-1)
    smax = np.take_along_axis(scale, imax[:, None], -1)[:, 0]
    # The largest sub-scale maps to -128 (int8 has one more negative level).
    d = _f16_round(smax / -128)
    sc = np.clip(np.rint(_safe_div(scale, d[:, None])), -128, 127)
    eff = (d[:, None] * sc)[..., None]
    q = np.clip(np.rint(_safe_div(xs, eff)), -32, 31) + 32
    return _pack_q6_k(q.reshape(nb, 256), sc, d)


# ---------------------------------------------------------------------------------------------
# Random blocks. Quants are uniform random bytes; per-block scales come from a positive factor
# u ~ U(0.75, 1.25) so kernels see varied scales, and a sign or offset that cancels the mean.

_U_LO, _U_HI = 0.75, 1.25
_E_U2 = (_U_HI**3 - _U_LO**3) / (3 * (_U_HI - _U_LO))  # E[u^2]


def _uniform_int_moments(lo: int, hi: int) -> tuple[float, float]:
    """Mean and E[x^2] of a uniform integer on [lo, hi]."""
    v = np.arange(lo, hi + 1, dtype=np.float64)
    return float(v.mean()), float((v * v).mean())


def _random_bytes(rng: np.random.Generator, n: int) -> np.ndarray:
    # SFC64.random_raw runs about 3x faster than Generator.integers for bulk bytes; seeding it
    # from rng keeps the result a pure function of rng's state.
    raw = np.random.SFC64(int(rng.integers(0, 2**63))).random_raw((n + 7) // 8)
    return raw.view(np.uint8)[:n]


def _random_scale(rng: np.random.Generator, nb: int, base: float, signed: bool) -> np.ndarray:
    u = rng.uniform(_U_LO, _U_HI, size=nb).astype(np.float32) * np.float32(base)
    if signed:
        u *= np.where(rng.integers(0, 2, size=nb, dtype=np.uint8) == 1, 1.0, -1.0).astype(
            np.float32
        )
    return u


def random_quantized(
    rng: np.random.Generator, shape: tuple[int, int], qtype: str, std: float
) -> np.ndarray:
    """Random valid blocks: uint8 [N, row_bytes(qtype, K)] that dequantize to ~N(0, std^2)-scale
    weights (zero mean, the requested std; the distribution is uniform-ish, not normal).

    Float types are drawn from a normal distribution directly.
    """
    gtype = _ggml_type(qtype)
    n, k = _check_2d(tuple(shape), qtype)
    if qtype in ("F32", "F16", "BF16"):
        a = rng.standard_normal((n, k), dtype=np.float32) * np.float32(std)
        if qtype == "BF16":
            return np.asarray(gq.quantize(a, gtype), dtype=np.uint8).reshape(n, -1)
        return a.astype(_FLOAT_DTYPES[qtype]).view(np.uint8).reshape(n, -1)

    bs, ts = GGML_QUANT_SIZES[gtype]
    nb = n * k // bs
    blocks = _random_bytes(rng, nb * ts).reshape(nb, ts)

    def put_f16(col: int, v: np.ndarray) -> None:
        blocks[:, col : col + 2] = v.astype(np.float16).reshape(-1, 1).view(np.uint8)

    if qtype in ("Q8_0", "Q4_0", "Q5_0"):
        # y = d * (q - zero): symmetric quants, a random sign on d cancels the -0.5 mean.
        levels = {"Q8_0": 256, "Q4_0": 16, "Q5_0": 32}[qtype]
        _, ex2 = _uniform_int_moments(-levels // 2, levels // 2 - 1)
        put_f16(0, _random_scale(rng, nb, std / np.sqrt(ex2 * _E_U2), signed=True))
    elif qtype in ("Q4_1", "Q5_1"):
        # y = d * q + m with m = -d * mean(q): zero mean per block.
        levels = 16 if qtype == "Q4_1" else 32
        mean, ex2 = _uniform_int_moments(0, levels - 1)
        d = _random_scale(rng, nb, std / np.sqrt((ex2 - mean * mean) * _E_U2), signed=False)
        put_f16(0, d)
        put_f16(2, -d * np.float32(mean))
    elif qtype == "Q4_K":
        # y = d*sc*q - dmin*m; with m = sc and dmin = 7.5*d each sub-block is d*sc*(q - 7.5).
        sc = rng.integers(16, 41, size=(nb, 8), dtype=np.uint8)
        _, sc2 = _uniform_int_moments(16, 40)
        mean, ex2 = _uniform_int_moments(0, 15)
        d = _random_scale(rng, nb, std / np.sqrt(sc2 * (ex2 - mean * mean) * _E_U2), False)
        put_f16(0, d)
        put_f16(2, d * np.float32(mean))
        blocks[:, 4:16] = _pack_q4_k_scales(sc, sc)
    elif qtype == "Q6_K":
        # y = d*sc*(q - 32): random-sign int8 scales cancel the -0.5 mean of (q - 32).
        mag = rng.integers(32, 128, size=(nb, 16), dtype=np.int16)
        sign = np.where(rng.integers(0, 2, size=(nb, 16), dtype=np.uint8) == 1, 1, -1)
        blocks[:, 192:208] = (mag * sign).astype(np.int8).view(np.uint8)
        _, sc2 = _uniform_int_moments(32, 127)
        _, ex2 = _uniform_int_moments(-32, 31)
        put_f16(208, _random_scale(rng, nb, std / np.sqrt(sc2 * ex2 * _E_U2), signed=False))
    else:  # pragma: no cover - QTYPES and the branches above must agree
        raise AssertionError(qtype)
    return blocks.reshape(n, nb // n * ts)
