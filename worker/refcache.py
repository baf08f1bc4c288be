"""Reference logits kept on disk, shared by the workers of a node and across their restarts.

validate's ``ref_cache`` (one dict per loaded model) holds the per-token reference runs a
study's candidates are judged against: the slow half of a validate, computed once per worker in
memory. ``RefLogits`` is that dict with a disk layer under it: a reference run missing in memory
is read from ``<cache>/reflogits/<key>.npz`` before it is computed, and one computed is written
there (write then rename: a second worker never reads half a file). The key hashes

- the model file's SHA-256 (memoised by path, size and mtime: hashed once per file),
- the backend, device class and driver (the reference runs on the device, default config),
- the engine's code (every .py of engine/ and every shader: exact even in an uncommitted tree,
  and a docs-only commit keeps the cache),
- the reference config, the prompt's token ids and the steps (what validate's key holds: a
  validate plan with other prompts or steps misses).

Only reference runs (``engine.model.ForcedRun``) go to disk; the replay's recordings stay in
memory, as before.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np

from engine.model import ForcedRun

log = logging.getLogger(__name__)

CODE_SUFFIXES = (".py", ".comp", ".glsl", ".cu", ".cuh")


def cache_root() -> Path:
    """$FLEETTUNE_CACHE/reflogits, else ~/.cache/fleettune/reflogits (XDG_CACHE_HOME honoured)."""
    root = os.environ.get("FLEETTUNE_CACHE")
    if root:
        return Path(root) / "reflogits"
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg) / "fleettune" if xdg else Path.home() / ".cache" / "fleettune"
    return base / "reflogits"


def ref_root() -> Path | None:
    """The workers' reference-logits directory: cache_root(), or None (memory only) when
    FLEETTUNE_REFLOGITS is "off"."""
    if os.environ.get("FLEETTUNE_REFLOGITS", "").strip().lower() in ("off", "0", "no"):
        return None
    return cache_root()


@functools.cache
def engine_code_digest() -> str:
    """SHA-256 of the engine's code and shaders as this process imports them (~30 ms)."""
    import engine

    root = Path(next(iter(engine.__path__))).resolve().parent
    h = hashlib.sha256()
    for top in ("engine", "shaders"):
        for p in sorted((root / top).rglob("*")):
            if p.suffix in CODE_SUFFIXES and p.is_file():
                h.update(str(p.relative_to(root)).encode() + b"\0" + p.read_bytes())
    return h.hexdigest()[:24]


def file_sha256(path: Path, memo: Path | None = None) -> str:
    """A model file's SHA-256, memoised in ``memo`` (JSON) by resolved path, size and mtime."""
    path = path.resolve()
    st = path.stat()
    stamp = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    memo = memo or cache_root() / "file-hashes.json"
    known: dict[str, str] = {}
    try:
        known = json.loads(memo.read_text())
    except (OSError, ValueError):
        pass
    if stamp in known:
        return known[stamp]
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    known[stamp] = h.hexdigest()
    try:
        memo.parent.mkdir(parents=True, exist_ok=True)
        tmp = memo.with_name(f".{memo.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(known))
        os.replace(tmp, memo)
    except OSError:  # a read-only cache still works, hashing again next time
        pass
    return known[stamp]


def _is_reference_key(key: Any) -> bool:
    """validate.reference_run's key: (reference config items, prompt ids, steps)."""
    return (
        isinstance(key, tuple)
        and len(key) == 3
        and isinstance(key[0], tuple)
        and isinstance(key[1], tuple)
        and isinstance(key[2], int)
    )


class RefLogits(dict):
    """validate's ref_cache with reference runs also read from and written to disk."""

    def __init__(self, identity: dict[str, str], root: Path | None = None) -> None:
        super().__init__()
        self.identity = dict(identity)
        self.root = root or cache_root()
        self.hits = self.misses = self.writes = 0

    def path_of(self, key: tuple) -> Path:
        doc = json.dumps([self.identity, list(key[0]), list(key[1]), key[2]], default=str)
        return self.root / f"{hashlib.sha256(doc.encode()).hexdigest()[:32]}.npz"

    def get(self, key: Any, default: Any = None) -> Any:
        if key in self or not _is_reference_key(key):
            return super().get(key, default)
        run = self._read(self.path_of(key))
        if run is None:
            self.misses += 1
            return default
        self.hits += 1
        super().__setitem__(key, run)
        return run

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        if _is_reference_key(key) and isinstance(value, ForcedRun):
            self._write(self.path_of(key), value)

    def _read(self, path: Path) -> ForcedRun | None:
        try:
            with np.load(path, allow_pickle=False) as z:
                # each z[name] reads the whole array from the file again: read each once (a
                # row of a fresh read per position held P copies of the [P, V] logits: the
                # 1.5B's 529-token prompt alone 175 GB, the H200 agent's OOM)
                arrays = {name: z[name] for name in z.files}
            pos, am = arrays["logit_pos"].tolist(), arrays["argmax"].tolist()
            rk = [tuple(k) for k in arrays["router_keys"].tolist()]
            logits, router = arrays["logits"], arrays["router"]
            return ForcedRun(
                prompt_tokens=arrays["prompt_tokens"].tolist(),
                tokens=arrays["tokens"].tolist(),
                logits={p: logits[i] for i, p in enumerate(pos)},
                device_argmax={int(p): int(v) for p, v in am},
                router={k: router[i] for i, k in enumerate(rk)},
            )
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError) as e:  # a damaged entry: computed again
            log.warning("reference logits cache: %s unreadable (%s); recomputing", path, e)
            return None

    def _write(self, path: Path, run: ForcedRun) -> None:
        pos = sorted(run.logits)
        rk = sorted(run.router)
        arrays = {
            "prompt_tokens": np.asarray(run.prompt_tokens, np.int64),
            "tokens": np.asarray(run.tokens, np.int64),
            "logit_pos": np.asarray(pos, np.int64),
            "logits": np.stack([np.asarray(run.logits[p]) for p in pos]) if pos else np.zeros(0),
            "argmax": np.asarray(sorted(run.device_argmax.items()), np.int64).reshape(-1, 2),
            "router_keys": np.asarray(rk, np.int64).reshape(-1, 2),
            "router": np.stack([run.router[k] for k in rk]) if rk else np.zeros(0),
        }
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npz")
            np.savez(tmp, **arrays)
            os.replace(tmp, path)
            self.writes += 1
        except OSError as e:  # a full or read-only disk: the memory cache still serves
            log.warning("reference logits cache: cannot write %s (%s)", path, e)
