"""submit.prefill_ahead (engine/backends/vulkan/stream.py: Stream._submit_ahead): prefill pieces
queued behind the one in flight, each a one-time command buffer with its own fence and its own
dynamic slots. Runs on any Vulkan device (lavapipe in CI): the model's logits bit for bit against
one submission per forward, over chunked prefills at several positions and the decode steps
after them; a chain of dependent pieces; and a planted bug (a piece's dynamic slots left
unwritten) that the model check rejects.
"""

from __future__ import annotations

import numpy as np
import pytest

from engine.backends.vulkan.stream import Stream
from engine.tuning import TuningConfig
from tests.engine.backends.vulkan.test_vulkan_helpers import (
    assert_no_validation_errors,
    make_backend,
    prefill_and_decode,
)


def _cfg(flat: dict) -> TuningConfig:
    return TuningConfig.default("vulkan").replace(**flat)


AHEAD = {"submit.prefill_kick": 32, "submit.prefill_ahead": True}


def _logits(eng, flat: dict) -> tuple[list[np.ndarray], int]:  # noqa: ANN001
    """Logits of a chunked prefill (3 forwards at positions 0, 16, 32) and 3 decode steps,
    and the prefill's submits."""
    from engine.bench import bench_prompt

    m, be = eng.model, eng.backend
    m.set_config(_cfg({"prefill.chunk_tokens": 16} | flat))
    prompt = bench_prompt(45, m.spec.n_vocab)
    return prefill_and_decode(m, be, prompt, 3)


@pytest.fixture(scope="module")
def eng(tiny_model_path):
    from engine.runtime import load

    e = load(tiny_model_path, "vulkan", _cfg({}), use_promoted=False)
    yield e
    assert_no_validation_errors(e.backend)
    e.backend.close()


@pytest.mark.parametrize("kick", [16, 32, 64])
def test_ahead_pieces_give_the_same_logits(eng, kick):
    """kick 64: with submit.max_nodes 64 the node budget's own submits come between the pieces
    queued ahead."""
    ref, one = _logits(eng, {})
    extra = {"submit.max_nodes": 64} if kick == 64 else {}
    got, pieces = _logits(eng, AHEAD | {"submit.prefill_kick": kick} | extra)
    assert one == 1 and pieces >= 2
    for a, b in zip(ref, got, strict=True):
        assert np.array_equal(a, b)
    st = eng.backend.stream
    assert not st.older and st.dyn_sent == 0  # all waited for at the download, table reset


def test_planted_unwritten_slots_are_rejected(eng, monkeypatch):
    """A piece whose dynamic slots are not written (the positions of the chunk at 32 read as
    whatever the table held) changes the logits: the check above catches it."""
    ref, _ = _logits(eng, {})
    real = Stream._submit_ahead

    def unwritten(self):  # noqa: ANN001, ANN202
        self.dyn_host[self.dyn_sent : len(self.dyn_values)] = 0
        self.dyn_sent = len(self.dyn_values)
        return real(self)

    monkeypatch.setattr(Stream, "_submit_ahead", unwritten)
    got, _ = _logits(eng, AHEAD | {"submit.prefill_kick": 16})
    assert not all(np.array_equal(a, b) for a, b in zip(ref, got, strict=True))


def test_chain_of_pieces_queued_ahead():
    """Dependent pieces y = y + x, each kicked ahead: several in flight at once (fences of
    their own, recycled after the wait), the sum exact."""
    be = make_backend()
    try:
        be.set_config(_cfg({}))
        x = be.upload(np.ones(1 << 16, np.float32))
        y = x
        for _ in range(4):
            y = be.ops.add(y, x)
            assert be.stream.kick(1, ahead=True)
        assert len(be.stream.older) >= 1 or be.stream.idle()
        assert np.array_equal(be.download(y), np.full(1 << 16, 5, np.float32))
        assert not be.stream.older and len(be.stream.spare_fences) >= 1
        assert_no_validation_errors(be)
    finally:
        be.close()


def test_pieces_ahead_around_a_waiting_submit():
    """Dynamic slots across the two kinds of submit: a piece queued ahead, a flush (its slots
    from 0, not waited for), another piece ahead (whose slots from 0 again would be read by the
    flush's submission: it waits for it first); each KV write lands at its own position."""
    be = make_backend()
    try:
        be.set_config(_cfg({}))
        cache = be.new_kv_cache(1, 8, 1, 16)
        rows = [np.full((1, 1, 16), i + 1, np.float32) for i in range(5)]
        for i, r in enumerate(rows):
            be.ops.kv_write(cache, 0, be.upload(r), be.upload(-r), i)
            if i % 2 == 0:
                assert be.stream.kick(1, ahead=True)
            else:
                be.stream.flush(wait=False)
                assert be.stream.dyn_pinned > 0
        k = be.download(cache.k[0])
        assert np.array_equal(k[:5, 0, 0], np.arange(1, 6, dtype=np.float32))
        assert not k[5:].any() and be.stream.dyn_pinned == 0
        assert_no_validation_errors(be)
    finally:
        be.close()
