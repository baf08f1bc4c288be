"""Op-level replay: every hooked op of the candidate judged on the reference's own inputs.

End to end, a candidate's logits carry every op's rounding compounded through the layers and,
on a hybrid, through the recurrent state from token to token: a correct int8 decode path on a
gated delta-net model drifts as far as a real bug (docs/verify.md). Replay removes the
compounding. The reference (per-token, default config) runs the token stream with
``Model.hook`` recording every op's output; the candidate (batched prefill, candidate config)
then runs the same stream, and each of its op outputs is compared with the reference's at the
same (op, label, layer, positions) and *replaced* by the reference's value before the next op
consumes it. So each op is judged on exactly the reference's inputs, by the per-op bound
(``op_nmse``) of its own variant's numeric class: an int8 matmul by int8's, the float delta-net
scan beside it by order_only's.

Recurrent state is part of the op's output. After each delta_net call (the matrix state S per V
head) and each ssm_conv call (the last d_conv-1 inputs), ``Model._tap_state`` hands over the
state after the call's last position; the candidate's is compared with the reference's state
after that position (canonical S layout: a ``delta_net.state_transposed`` cache holds S^T) and
replaced by it, so the next chunk or decode step starts from the reference's state. A scan that
computes S k, a state dropped between prefill and decode, a conv window off by one: each shows
at its own op. K/V rows are judged (``kv_write``: what landed in the cache) but not replaced: a
row is a function of its own, replaced, inputs, so the cache differs from the reference's only
by kv_write's judged error and nothing compounds through it.

NMSE is per token position (row): sum (c - r)^2 of one row over the larger of its own reference
energy sum r^2 and the call's mean row energy. Per row, so an error confined to one token of a
long chunk (a ragged edge) is not averaged away over the chunk; the mean as a floor, so a row that
is near zero by cancellation (a 1-wide router or shared-expert gate row) is not judged by its
own tiny norm. A decode call (one row) is the usual whole-tensor NMSE.

Memory: reference rows are kept as float32 on the host for one segment of the stream at a time
(the candidate's prefill chunks grouped to at least ``SEGMENT_TOKENS``, the decode steps with
the last one) and each row is dropped once the candidate consumed it; states are kept only at
the candidate's chunk ends. The backend switches between the two configs once per segment.

Time: the candidate's comparisons (``Backend.row_stats``: per row the squared error, the
reference energy, the largest |diff| and its column) are queued where the tensors are and judged
after each forward from one download (``stats_host``), so no hooked op waits for the host. On
CUDA the comparison is one kernel a use (elementwise.cu ``row_stats``): as a dozen CuPy
reductions it was ~230 us a use, 15 of a 1.5B replay's 33 s on the H100 (63,746 uses over
validate's prompts); with it a warm 1.5B replay takes 14-19 s (docs/BENCHMARKS.md, Fleet on GPUs).
"""

from __future__ import annotations

import os
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from engine.backends.base import host_row_stats
from engine.model import Model
from engine.tuning import TuningConfig
from engine.verify.blame import Blame
from engine.verify.budgets import NUMERIC_BUDGETS, Budget

SEGMENT_TOKENS = 128  # prompt tokens recorded per reference pass (whole candidate chunks)
CACHE_FLOOR = 4 << 30  # reference recordings kept across candidates in validate's ref_cache


def cache_bytes() -> int:
    """The recordings' byte budget: a quarter of this machine's memory, at least 4 GiB. The
    9B-like qwen35 records ~14 MB a position (its ~450-position prompt set: ~6 GB), so a fixed
    4 GiB recorded its long prompts again for every candidate (a 35B-A3B trial on the H200:
    145 s of validate); a GPU node has 128 GiB or more."""
    try:
        phys = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):  # no sysconf (Windows) or no such name
        phys = 0
    return max(CACHE_FLOOR, phys // 4)


CACHE_BYTES = cache_bytes()
JUDGED_ONLY = frozenset({"kv_write"})  # compared, not replaced (see the module docstring)


@dataclass
class OpStat:
    """One registry op over every use in a replay: its worst per-position NMSE and where."""

    op: str  # registry op, e.g. matmul_decode
    variant: str
    numeric: str  # the variant's numeric class
    bound: float  # that class's op_nmse, or the reference's class's for the op where looser
    nmse: float  # worst per-position NMSE over its uses
    label: str  # where the worst one was
    layer: int
    token: int
    column: int
    abs_diff: float
    uses: int = 0  # hooked outputs judged (op calls x labels x layers)
    failed: int = 0  # of them over the bound

    @property
    def passed(self) -> bool:
        return self.failed == 0


@dataclass
class ReplayResult:
    """Per-op verdict of one or more replayed prompts."""

    passed: bool
    ops: list[OpStat]  # per registry op, the worst first (by nmse / bound)
    first: Blame | None = None  # the first use over its bound, in the candidate's order
    # taps one side made and the other did not (fails: an op not compared is not vouched for)
    unmatched: list[str] = field(default_factory=list)

    @property
    def worst(self) -> OpStat | None:
        return self.ops[0] if self.ops else None

    def reasons(self) -> list[str]:
        out = []
        if self.first is not None:
            bad = [s for s in self.ops if not s.passed]
            out.append(
                f"op-level replay: {len(bad)} op(s) over their class's op_nmse on the "
                f"reference's inputs; first: {self.first} > {self.bound_of(self.first.op):g}"
            )
        if self.unmatched:
            out.append(f"op-level replay: not compared (one side only): {self.unmatched[:4]}")
        return out

    def lines(self, top: int = 6) -> list[str]:
        """Human summary: the verdict, the worst op and the per-op worst NMSE against its bound."""
        w = self.worst
        head = f"op-level replay: {'PASS' if self.passed else 'FAIL'}"
        if w is not None:
            head += (
                f"  worst op {w.op} ({w.variant}, {w.numeric}): NMSE {w.nmse:.3g} against "
                f"op_nmse {w.bound:g} (layer {w.layer} {w.label}, token {w.token})"
            )
        out = [head]
        if self.ops:
            out.append(
                "    per op (worst NMSE / bound): "
                + ", ".join(f"{s.op} {s.nmse:.2g}/{s.bound:g}" for s in self.ops[:top])
                + (f" (+{len(self.ops) - top} more)" if len(self.ops) > top else "")
            )
        if self.first is not None:
            out.append(f"    first op over its bound: {self.first}")
        if self.unmatched:
            out.append(f"    not compared (one side only): {', '.join(self.unmatched[:4])}")
        return out

    def bound_of(self, op: str) -> float:
        return next((s.bound for s in self.ops if s.op == op), 0.0)

    def to_dict(self) -> dict[str, Any]:
        w = self.worst
        return {
            "passed": self.passed,
            "worst": {"op": w.op, "nmse": w.nmse, "bound": w.bound} if w else None,
            "first_failure": self.first.to_dict() if self.first else None,
            "ops": [asdict(s) for s in self.ops],
            "unmatched": self.unmatched,
        }


def merge(results: list[ReplayResult]) -> ReplayResult:
    """One result over several prompts: per op the worst; ``first`` of the first failing."""
    by_op: dict[str, OpStat] = {}
    for r in results:
        for s in r.ops:
            cur = by_op.get(s.op)
            if cur is None:
                by_op[s.op] = OpStat(**asdict(s))
                continue
            uses, failed = cur.uses + s.uses, cur.failed + s.failed
            if s.nmse > cur.nmse:
                cur = by_op[s.op] = OpStat(**asdict(s))
            cur.uses, cur.failed = uses, failed
    first = next((r.first for r in results if r.first is not None), None)
    unmatched = sorted({u for r in results for u in r.unmatched})
    return ReplayResult(all(r.passed for r in results), _ranked(by_op.values()), first, unmatched)


def _ranked(stats: Any) -> list[OpStat]:
    return sorted(stats, key=lambda s: -(s.nmse / s.bound if s.bound > 0 else np.inf))


def _transposed(config: TuningConfig) -> bool:
    try:
        return bool(config.op("delta_net").as_dict().get("state_transposed", False))
    except Exception:  # noqa: BLE001 - a backend without delta_net (dense models never ask)
        return False


class _Reference:
    """Reference side: op outputs by (op, label, layer) and position, float32 on the host."""

    def __init__(self, model: Model, config: TuningConfig, state_positions: set[int]) -> None:
        # weakly: a recording kept in a reference cache must not keep its model's weights on the
        # device (validate's ragged model would count in the served model's footprint)
        self.model = weakref.proxy(model)
        self.rows: dict[tuple[str, str, int], dict[int, np.ndarray]] = {}
        self.pending: list[tuple[tuple[str, str, int], Any, int]] = []
        self.state_positions = state_positions
        self.keep = False  # a cached recording: the candidate reads rows without dropping them
        self.transposed = _transposed(config)

    def __call__(self, op: str, label: str, layer: int, t: Any, pos0: int) -> None:
        # downloaded at the token's end (flush): no host sync between one op and the next. Ops
        # return new tensors (the backend contract); the in-place states go through state().
        self.pending.append(((op, label, layer), t, pos0))

    @property
    def nbytes(self) -> int:
        return sum(r.nbytes for store in self.rows.values() for r in store.values())

    def flush(self) -> None:
        for key, t, pos0 in self.pending:
            a = self.model.backend.download(t)
            a = a.reshape(a.shape[0], -1)
            store = self.rows.setdefault(key, {})
            for j in range(a.shape[0]):
                store[pos0 + j] = a[j]
        self.pending.clear()

    def state(self, op: str, label: str, layer: int, states: list, pos: int) -> None:
        if pos in self.state_positions:
            a = _canonical(self.model, label, self.model.backend.download(states[layer]),
                           self.transposed)  # fmt: skip
            self.rows.setdefault((op, label, layer), {})[pos] = a.reshape(1, -1)[0]


def _canonical(model: Model, label: str, a: np.ndarray, transposed: bool) -> np.ndarray:
    """A state as S [Hv, dk, dv] (a state_transposed delta_net cache holds S^T)."""
    if label != "ssm_state" or not transposed:
        return a
    ssm = model.spec.ssm
    hv, dk, dv = ssm.n_v_heads, ssm.head_k_dim, ssm.head_v_dim
    return a.reshape(hv, dv, dk).transpose(0, 2, 1).copy()


def _layout(model: Model, label: str, a: np.ndarray, transposed: bool) -> np.ndarray:
    """_canonical's inverse: S into the candidate's cache layout."""
    if label != "ssm_state" or not transposed:
        return a
    ssm = model.spec.ssm
    hv, dk, dv = ssm.n_v_heads, ssm.head_k_dim, ssm.head_v_dim
    return np.ascontiguousarray(a.reshape(hv, dk, dv).transpose(0, 2, 1))


class _Candidate:
    """Candidate side: compare each op output with the reference's rows, hand back the
    reference's value in its place, keep per-op statistics and the first use over its bound."""

    def __init__(
        self,
        model: Model,
        config: TuningConfig,
        table: dict[str, Budget],
        reference: TuningConfig,
    ) -> None:
        self.model, self.config, self.table = model, config, table
        self.ref: _Reference | None = None  # the current segment's recording
        self.stats: dict[str, OpStat] = {}
        self.first: Blame | None = None
        self.unmatched: set[str] = set()
        self.used: set[tuple[str, str, int]] = set()
        self.transposed = _transposed(config)
        self.classes = model.backend.numeric_classes(config)
        # the reference's own classes: an int8 reference (validate --reference mmvq) records
        # rows with int8 error in them, so a float op of the candidate is judged against those
        # rows by the looser of the two classes (the float default as reference: no change)
        self.ref_classes = model.backend.numeric_classes(reference)
        # uses compared but not judged yet: (op, label, layer, n, pos0, row stats), judged in
        # order by flush() at the end of each forward, so no op waits for a download
        self.pending: list[tuple[str, str, int, int, int, Any]] = []

    def __call__(self, op: str, label: str, layer: int, t: Any, pos0: int) -> Any:
        b = self.model.backend
        n = int(t.shape[0])
        assert self.ref is not None
        store = self.ref.rows.get((op, label, layer), {})
        if any(pos0 + j not in store for j in range(n)):
            self.unmatched.add(f"{op} {label} layer {layer}")
            return None
        take = store.get if self.ref.keep else store.pop
        r = np.stack([take(pos0 + j) for j in range(n)])
        self.used.add((op, label, layer))
        shape = tuple(int(d) for d in t.shape)
        ref = b.upload(r.reshape(shape))  # the reference's value: compared on the device
        self.pending.append((op, label, layer, n, pos0, b.row_stats(t, ref, r)))
        return None if op in JUDGED_ONLY else ref

    def state(self, op: str, label: str, layer: int, states: list, pos: int) -> None:
        b = self.model.backend
        assert self.ref is not None
        store = self.ref.rows.get((op, label, layer), {})
        if pos not in store:
            self.unmatched.add(f"{op} {label} layer {layer}")
            return
        r = store[pos] if self.ref.keep else store.pop(pos)
        self.used.add((op, label, layer))
        a = b.download(states[layer])
        c = _canonical(self.model, label, a, self.transposed).reshape(1, -1)
        self.pending.append((op, label, layer, 1, pos, host_row_stats(c, r[None, :])))
        ref = _layout(self.model, label, r, self.transposed).reshape(a.shape).astype(a.dtype)
        states[layer] = b.upload(ref)

    def flush(self) -> None:
        """Judge the pending uses, in the order they ran (one download for all of them)."""
        if not self.pending:
            return
        dev = [i for i, p in enumerate(self.pending) if not isinstance(p[5], np.ndarray)]
        host = self.model.backend.stats_host([self.pending[i][5] for i in dev])
        stats = [p[5] for p in self.pending]
        for i, h in zip(dev, host, strict=True):
            stats[i] = h
        for (op, label, layer, n, pos0, _), st in zip(self.pending, stats, strict=True):
            self._judge(op, label, layer, n, np.asarray(st, np.float64), pos0)
        self.pending.clear()

    def _judge(self, op: str, label: str, layer: int, n: int, stats: np.ndarray, pos0: int) -> None:
        """stats [4, n]: per row sum (c - r)^2, sum r^2, max |c - r| and its column."""
        err, energy, maxabs, cols = stats
        denom = np.maximum(energy, max(float(np.mean(energy)), 1e-30))
        with np.errstate(invalid="ignore", over="ignore"):
            row_nmse = err / denom
        row_nmse = np.where(np.isfinite(row_nmse), row_nmse, np.inf)  # NaN / Inf outputs
        j = int(np.argmax(row_nmse))
        nmse = float(row_nmse[j])
        col = int(cols[j])
        abs_diff = float(maxabs[j]) if np.isfinite(maxabs[j]) else float("inf")
        reg = self.model.backend.registry_op(op, n)
        s = self.stats.get(reg)
        if s is None:
            numeric = self.classes.get(reg, "order_only")  # schedule-only ops: float32
            variant = self._variant(reg)
            # the reference ran this op one token at a time: its registry op is the n = 1 one
            ref_numeric = self.ref_classes.get(self.model.backend.registry_op(op, 1), "order_only")
            bound = max(self.table[numeric].op_nmse, self.table[ref_numeric].op_nmse)
            s = self.stats[reg] = OpStat(reg, variant, numeric, bound, -1.0, "", -1, -1, -1, 0.0)
        s.uses += 1
        if nmse > s.nmse:
            s.nmse, s.label, s.layer, s.token = nmse, label, layer, pos0 + j
            s.column, s.abs_diff = col, abs_diff
        if not nmse <= s.bound:
            s.failed += 1
            if self.first is None:
                params = self._params(reg, n)
                self.first = Blame(
                    reg, s.variant, params, label, layer, pos0 + j, col, abs_diff, nmse
                )

    def _variant(self, reg: str) -> str:
        try:
            return self.config.op(reg).variant
        except Exception:  # noqa: BLE001 - an op the config does not name (schedule-only)
            return "default"

    def _params(self, reg: str, n: int) -> dict[str, Any]:
        try:
            params = self.config.op(reg).as_dict()
        except Exception:  # noqa: BLE001
            return {}
        if n > 1 and reg.startswith("matmul"):
            params = {**params, "chunk_tokens": self.config.prefill_chunk}
        return params

    def result(self) -> ReplayResult:
        self.flush()
        stats = list(self.stats.values())
        return ReplayResult(
            all(s.passed for s in stats) and self.first is None and not self.unmatched,
            _ranked(stats),
            self.first,
            sorted(self.unmatched),
        )


def segments(n_prompt: int, chunk: int, min_tokens: int = SEGMENT_TOKENS) -> list[list[int]]:
    """The candidate's prefill chunk starts, grouped into segments of whole chunks of at least
    ``min_tokens`` tokens (the last one may be shorter)."""
    out: list[list[int]] = [[]]
    count = 0
    for c0 in range(0, n_prompt, chunk):
        if count >= min_tokens:
            out.append([])
            count = 0
        out[-1].append(c0)
        count += min(chunk, n_prompt - c0)
    return out


def replay(
    model: Model,
    reference: TuningConfig,
    candidate: TuningConfig,
    prompt: list[int],
    tokens: list[int],
    steps: int,
    budgets: dict[str, Budget] | None = None,
    cache: dict[Any, Any] | None = None,
    cache_bytes: int = CACHE_BYTES,
) -> ReplayResult:
    """Replay ``prompt`` then ``steps`` forced decode tokens (``tokens``: the reference's
    greedy continuation, as validate's teacher forcing) op by op; leaves the model on the
    candidate config with no hooks. ``budgets``: per-class table (op_nmse is read from it).

    ``cache`` (validate's ref_cache: one dict per loaded model) keeps whole reference
    recordings, by (reference config, prompt, tokens, candidate chunk), while they fit in
    ``cache_bytes`` all together: the per-token hooked reference pass is most of a replay's
    cost, and an agent's study validates many candidates against one reference. A recording that
    would not fit (the first one measures the bytes per position) streams in segments."""
    if not prompt:
        raise ValueError("empty prompt: at least one token is needed")
    if len(tokens) < steps:
        raise ValueError(f"forced stream of {len(tokens)} tokens for {steps} steps")
    table = budgets or NUMERIC_BUDGETS
    b, P = model.backend, len(prompt)
    chunk = candidate.prefill_chunk
    ids = b.upload(np.asarray(prompt, dtype=np.int32))
    decode = [(P + i, tokens[i]) for i in range(steps - 1)]  # forced_run's decode forwards
    chunk_ends = {min(c0 + chunk, P) - 1 for c0 in range(0, P, chunk)}
    cand_cache = model.new_cache(P + steps)
    ref_key = ("replay", tuple(sorted(reference.flat().items())), tuple(prompt),
               tuple(tokens[: steps - 1]), chunk)  # fmt: skip
    cached = cache.get(ref_key) if cache is not None else None
    whole = cached is not None or _fits(cache, P + steps, cache_bytes)
    segs = [list(range(0, P, chunk))] if whole else segments(P, chunk)
    judge = _Candidate(model, candidate, table, reference)
    try:
        for k, starts in enumerate(segs):
            last = k == len(segs) - 1
            rec = cached
            if rec is None:
                if k == 0:
                    ref_cache = model.new_cache(P + steps)
                model.set_config(reference)
                rec = _Reference(model, reference, chunk_ends | {p for p, _ in decode})
                rec.keep = whole and cache is not None
                model.hook, model.state_hook = rec, rec.state
                for pos in range(starts[0], min(starts[-1] + chunk, P)):
                    x = model.trunk(b.ops.rows(ids, pos, pos + 1), 1, pos, ref_cache)
                    if pos == P - 1:
                        model.head(x, 0, pos)
                    rec.flush()
                for pos, tok in decode if last else ():
                    model.forward(b.upload(np.asarray([tok], np.int32)), 1, pos, ref_cache)
                    rec.flush()
                _remember(cache, ref_key, rec, P + steps if last else 0, k == 0)
            model.set_config(candidate)
            judge.ref = rec
            model.hook, model.state_hook = judge, judge.state
            for c0 in starts:
                c1 = min(c0 + chunk, P)
                x = model.trunk(b.ops.rows(ids, c0, c1), c1 - c0, c0, cand_cache)
                if c1 == P:
                    model.head(x, c1 - 1 - c0, P - 1)
                judge.flush()
            for pos, tok in decode if last else ():
                model.forward(b.upload(np.asarray([tok], np.int32)), 1, pos, cand_cache)
                judge.flush()
            # taps the reference recorded and the candidate never made
            left = {key for key, v in rec.rows.items() if v and not rec.keep}
            left |= {key for key in rec.rows if key not in judge.used}
            judge.unmatched |= {f"{o} {lb} layer {ly}" for o, lb, ly in left}
    finally:
        model.hook, model.state_hook = None, None
        model.set_config(candidate)
    return judge.result()


_BPP, _USED = ("replay", "bytes_per_position"), ("replay", "bytes_cached")


def _fits(cache: dict | None, positions: int, cache_bytes: int) -> bool:
    """Whether a whole recording of ``positions`` would fit the cache's byte budget (unknown
    until a first recording measured the bytes per position)."""
    if cache is None or _BPP not in cache:
        return False
    return cache.get(_USED, 0) + cache[_BPP] * positions <= cache_bytes


def _remember(cache: dict | None, key: Any, rec: _Reference, positions: int, first: bool) -> None:
    """Measure bytes per position (a first, streamed recording) and keep a whole one."""
    if cache is None:
        return
    if _BPP not in cache and first and rec.rows:
        n = max(len(v) for v in rec.rows.values())  # positions this segment recorded
        cache[_BPP] = rec.nbytes / max(n, 1)
    if rec.keep and positions:
        cache[key] = rec
        cache[_USED] = cache.get(_USED, 0) + rec.nbytes
