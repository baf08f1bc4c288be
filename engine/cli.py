"""`python -m engine ...`: run, validate, bench, models, synth, info, kernels, devices."""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

from engine.errors import ConfigError, EngineError

log = logging.getLogger("engine")


def _prefill_and_profile(p: argparse.ArgumentParser) -> None:
    """``run``'s and ``bench``'s prefill mode and kernel profile."""
    p.add_argument("--prefill", choices=("batched", "per_token"), default="batched")
    p.add_argument(
        "--profile",
        action="store_true",
        help="after the timed runs, one more run of the first prompt length timing every kernel "
        "(vulkan: GPU timestamps, cuda: CUDA events, graphs off; numpy: wall clock per op), "
        "slowest first",
    )


def _common(p: argparse.ArgumentParser, model: bool = True) -> None:
    if model:
        p.add_argument(
            "--model", required=True, help="GGUF path or known checkpoint name (see `models list`)"
        )
    p.add_argument("--backend", default="numpy", help="numpy | vulkan | cuda (default numpy)")
    p.add_argument(
        "--device",
        type=int,
        default=None,
        help="device index from `devices` (default: $FLEETTUNE_VK_DEVICE for vulkan, else the "
        "backend's choice: the best kind of device present)",
    )
    p.add_argument("--config", type=Path, help="tuning config TOML (overrides a promoted one)")
    p.add_argument(
        "--no-promoted",
        action="store_true",
        help="ignore configs/<device class>/<family>/; use registry defaults",
    )
    p.add_argument(
        "--context",
        type=_positive_int,
        default=None,
        help="the context this run serves: picks the promoted config tuned nearest to it "
        "(default 4096, an experiment's default [memory] context_tokens)",
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")


def _positive_int(s: str) -> int:
    try:
        n = int(s)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {s!r}")
    return n


def _csv_ints(s: str) -> list[int]:
    try:
        out = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {s!r}") from None
    if not out or min(out) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {s!r}")
    return out


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m engine", description=__doc__)
    ap.add_argument("-v", "--verbose", action="store_true", help="log what is happening")
    sub = ap.add_subparsers(dest="cmd", required=True)

    p = sub.add_parser("run", help="generate text greedily")
    _common(p)
    p.add_argument("--prompt", required=True)
    p.add_argument("--max-tokens", type=int, default=16)
    _prefill_and_profile(p)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the chat template")

    p = sub.add_parser("validate", help="candidate (batched, --config) vs reference (per-token)")
    _common(p)
    p.add_argument("--steps", type=int, default=8, help="greedy decode steps compared")
    p.add_argument(
        "--max-abs-diff",
        type=float,
        default=None,
        help="tighten the numeric class's max |diff| (never looser than the registry's)",
    )
    p.add_argument("--nmse", type=float, default=None, help="tighten the class's NMSE bound")
    p.add_argument(
        "--cross-check",
        action="store_true",
        help="also check the reference path against the NumPy backend; a disagreement fails",
    )

    p = sub.add_parser("bench", help="prefill / decode tok/s and time to first token")
    _common(p)
    p.add_argument("--prompt-tokens", type=_csv_ints, default=[105, 512])
    p.add_argument("--gen-tokens", type=int, default=128)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--warmup", type=int, default=1)
    _prefill_and_profile(p)

    p = sub.add_parser("models", help="known real checkpoints")
    msub = p.add_subparsers(dest="models_cmd", required=True)
    q = msub.add_parser("list", help="known checkpoints and whether they are cached")
    q.add_argument("--json", action="store_true")
    q = msub.add_parser("fetch", help="download, assemble, verify and cache a checkpoint")
    q.add_argument("name")
    q.add_argument("--json", action="store_true")

    p = sub.add_parser("synth", help="write a synthetic GGUF with random weights")
    p.add_argument(
        "--arch", default="qwen2", help="qwen2, llama, qwen3, qwen35, qwen35moe, qwen3next"
    )
    p.add_argument(
        "--preset", default="tiny", help="dense: tiny small 1.5b 7b; hybrid: tiny 9b 35b-a3b"
    )
    p.add_argument("--quant", default="q4_k_m")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("info", help="model spec and tensor types")
    p.add_argument("--model", required=True)
    p.add_argument("--json", action="store_true")

    p = sub.add_parser("kernels", help="the tuning registry: ops, variants, parameters")
    p.add_argument("--backend", default=None)
    p.add_argument("--json", action="store_true")
    p.add_argument("--markdown", action="store_true", help="one backend's knob tables (docs/)")
    p.add_argument(
        "--write",
        type=Path,
        default=None,
        help="with --markdown: replace the section between that file's generated-by markers",
    )

    p = sub.add_parser("devices", help="backends usable on this machine and their device class")
    p.add_argument("--json", action="store_true")
    return ap


def _emit(args: argparse.Namespace, obj: dict[str, Any], text: str) -> None:
    print(json.dumps(obj, indent=2, default=str) if args.json else text)


def _load(args: argparse.Namespace, progress: Any = None):  # noqa: ANN202
    from engine.backends import default_device
    from engine.runtime import load
    from engine.tuning.promoted import DEFAULT_CONTEXT

    device = args.device if args.device is not None else default_device(args.backend)
    return load(
        args.model,
        args.backend,
        args.config,
        use_promoted=not args.no_promoted,
        device=device,
        context_tokens=args.context or DEFAULT_CONTEXT,
        progress=progress,
    )


def _source_line(eng: Any) -> str:
    """Which config ran and why (a promoted one: the file and how near it is)."""
    s = eng.source
    return f"  config: {s} ({s.reason}); model shape {s.shape_key}, serving {s.context_tokens}"


def _short(commit: str) -> str:
    """A commit as a header shows it: 12 hex digits, "+dirty" kept."""
    return commit[:12] + ("+dirty" if commit.endswith("+dirty") else "")


def _check_context(n_ctx: int, prompt: int, gen: int, what: str) -> None:
    """Refuse what the model cannot hold (a KV cache past its context was a 477 GiB allocation)."""
    if prompt > n_ctx:
        raise ConfigError(f"{what} is {prompt} tokens, longer than the model's context ({n_ctx})")
    if prompt + gen > n_ctx:
        raise ConfigError(
            f"--max-tokens/--gen-tokens {gen}: {prompt} prompt tokens + {gen} exceed the model's "
            f"context ({n_ctx}); at most {n_ctx - prompt}"
        )


def _check_utf8(text: str, what: str) -> None:
    """argv bytes that are not UTF-8 arrive as lone surrogates, which the tokenizer rejects with
    a TypeError deep inside; say which byte instead."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        bad = text[e.start].encode("utf-8", "surrogateescape")
        raise ConfigError(
            f"{what} is not valid UTF-8 (byte {bad!r} at character {e.start}): give UTF-8 text"
        ) from None


def cmd_run(args: argparse.Namespace) -> int:
    """Generate, with a bar per phase on stderr (loading, compile, prefill, decode: a large model
    on lavapipe is otherwise silent for most of a minute) and the timings at the end."""
    if not args.prompt:
        raise ConfigError("--prompt is empty: give some text")
    _check_utf8(args.prompt, "--prompt")
    t0 = time.perf_counter()
    loading: list[Any] = []  # its bar, from the first weight on (a bad --device: no bar)

    def loaded(done: int, total: int) -> None:
        if not loading:
            loading.append(_bar(args, "load", total=total, unit="B", unit_scale=True))
        loading[0].update(done - loading[0].n)

    try:
        eng = _load(args, progress=loaded)
    finally:
        for b in loading:
            b.close()
    load_s = time.perf_counter() - t0
    tok = eng.tokenizer()
    text = tok.render_chat([{"role": "user", "content": args.prompt}]) if args.chat else args.prompt
    ids = tok.encode(text)
    if not ids:
        raise ConfigError("--prompt encodes to no tokens: give some text")
    _check_context(eng.gguf.spec.n_ctx_train, len(ids), args.max_tokens, "the prompt")
    # One token through prefill and a decode step first: the kernels compile (lazily, at their
    # first launch) here, not inside the timed prefill.
    t0 = time.perf_counter()
    with _bar(args, "compile (warm-up)", total=1) as bar:
        eng.model.generate(ids[:1], min(args.max_tokens, 2), path=args.prefill)
        bar.update(1)
    warmup_s = time.perf_counter() - t0
    bars = [_bar(args, "prefill", total=len(ids), unit="tok")]

    def token(_: int) -> None:  # the first one ends the prefill
        if len(bars) == 1:
            bars[0].close()
            bars.append(_bar(args, "decode", total=args.max_tokens, unit="tok"))
        bars[-1].update(1)

    try:
        g = eng.model.generate(
            ids, args.max_tokens, path=args.prefill, stop=tok.eos_ids,
            on_chunk=bars[0].update, on_token=token,
        )  # fmt: skip
    finally:
        for b in bars:
            b.close()
    out = tok.decode(g.tokens)
    steps = len(g.tokens) - 1  # the first token comes from prefill
    timings = {
        "load_s": load_s,
        "warmup_s": warmup_s,
        "prefill_s": g.prefill_s,
        "prefill_tok_s": len(ids) / g.prefill_s if g.prefill_s > 0 else None,
        "decode_s": g.decode_s,
        "decode_tok_s": steps / g.decode_s if steps > 0 and g.decode_s > 0 else None,
    }
    obj = {
        "model": eng.gguf.spec.name,
        "backend": args.backend,
        "config": eng.config_source,
        "config_source": eng.source.to_dict(),
        "prompt": args.prompt,
        "prompt_tokens": ids,
        "tokens": g.tokens,
        "text": out,
        **timings,
    }
    _emit(args, obj, args.prompt + out)
    if not args.json:  # the text alone on stdout; the timings beside the bars
        print(_timings_line(timings, len(ids), steps), file=sys.stderr)
    return 0


def _bar(args: argparse.Namespace, desc: str, **kw: Any) -> Any:
    from tqdm import tqdm

    return tqdm(desc=desc, file=sys.stderr, disable=args.json, leave=False, **kw)


def _timings_line(t: dict[str, Any], prompt: int, steps: int) -> str:
    def rate(v: float | None) -> str:
        return f"{v:.1f} tok/s" if v else "-"

    return (
        f"load {t['load_s']:.1f} s, compile (warm-up) {t['warmup_s']:.1f} s, "
        f"prefill {prompt} tok {rate(t['prefill_tok_s'])}, "
        f"decode {max(steps, 0)} tok {rate(t['decode_tok_s'])}"
    )


def cmd_validate(args: argparse.Namespace) -> int:
    from engine.tuning.registry import REGISTRY
    from engine.verify.cross_check import apply_cross_check, cross_check_numpy
    from engine.verify.validate import Tolerances, tokenize_prompts, validate

    eng = _load(args)
    cand = eng.model.config
    budget, _ = REGISTRY.budget(cand)
    caps = {"max_abs_diff": args.max_abs_diff, "nmse": args.nmse}
    budget.tightened(**{k: v for k, v in caps.items() if v is not None})  # never looser
    tol = Tolerances(**caps)
    prompts = tokenize_prompts(eng.tokenizer())
    cross = cross_check_numpy(eng.model, prompts[:2]) if args.cross_check else None
    rep = validate(eng.model, cand, prompts, steps=args.steps, tol=tol)
    if cross is not None:  # a reference off against NumPy fails, blamed on the shared kernel
        apply_cross_check(rep, cross)
    lines = [
        f"validate {args.backend} on {rep.device_class}: {'PASS' if rep.passed else 'FAIL'}  "
        f"(numeric classes {', '.join(rep.numeric_classes)}: KLD <= "
        f"{rep.tolerances['kld_max']:g}, NMSE <= {rep.tolerances['nmse']:g}, near-tie "
        f"{rep.tolerances['near_tie']:g})"
    ]
    for p in rep.prompts:
        lines.append(
            f"  prompt {p.prompt_tokens:4d} tok  {p.positions:3d} pos  KLD={p.kld_max:.3g}  "
            f"nmse={p.nmse:.3g}  max_abs_diff={p.max_abs_diff:.3g}  "
            f"top-1 {p.top1_agree}/{p.top1_checked}  nan={p.nan} inf={p.inf}  "
            f"free-running tokens agree {p.token_agreement:.0%}"
            + (f"  routing near-ties forced {p.routes_forced}" if p.routes_forced else "")
            + "".join(f"\n    {r}" for r in p.reasons)
        )
    lines += [f"  {r}" for r in rep.probe]
    if rep.replay is not None:
        lines += [f"  {r}" for r in rep.replay.lines()]
    if cross:
        verdict = "agrees" if cross["passed"] else "DISAGREES"
        lines.append(
            f"  cross-check vs numpy: reference path {verdict}: KLD={cross['kld']:.3g} "
            f"nmse={cross['nmse']:.3g} max_abs_diff={cross['max_abs_diff']:.3g}"
            + "".join(f"\n    {r}" for r in cross["reasons"][:4])
            + (f"\n    first divergence: {cross['blame']['text']}" if cross["blame"] else "")
        )
    if rep.blame is not None:
        lines.append(f"  first divergence: {rep.blame}")
    if rep.ragged is not None and not rep.ragged["passed"]:
        lines += [f"  {r}" for r in rep.ragged["reasons"][:4]]
    lines.append("  time: " + ", ".join(f"{k} {v:.1f} s" for k, v in rep.seconds.items()))
    lines.append(_source_line(eng))
    longest = max((len(p) for p in prompts), default=1)
    memory = _footprint(eng, longest, args.steps, lines)
    doc = rep.to_dict() | {"config_source": eng.source.to_dict(), "memory": memory}
    _emit(args, doc, "\n".join(lines))
    return 0 if rep.passed else 1


def cmd_bench(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from engine.bench import bench
    from engine.provenance import config_source, describe_source, engine_commit

    eng = _load(args)
    for n in args.prompt_tokens:
        _check_context(eng.gguf.spec.n_ctx_train, n, args.gen_tokens, f"--prompt-tokens {n}")
    be = eng.model.backend
    total = len(args.prompt_tokens) * args.repeats
    with tqdm(total=total, desc="bench", file=sys.stderr, disable=args.json) as bar:
        rep = bench(
            eng.model,
            args.prompt_tokens,
            args.gen_tokens,
            args.repeats,
            args.warmup,
            args.prefill,
            progress=bar,
        )
    source = config_source(eng.config_source)
    commit, at = engine_commit(), time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    lines = [
        f"{rep.model} on {rep.device['name']} ({rep.device['device_class']}, {rep.backend}), "
        f"{rep.path} prefill, median of {rep.repeats} [min..max]",
        f"config: {describe_source(source)} ({eng.source.reason}); model shape "
        f"{eng.source.shape_key}, serving {eng.source.context_tokens}; "
        f"engine {_short(commit)}, {at}",
    ]
    for r in rep.results:
        s = (
            f"  pp{r.prompt_tokens:<5d} {r.prefill_tok_s.median:10.1f} tok/s "
            f"[{r.prefill_tok_s.min:.1f}..{r.prefill_tok_s.max:.1f}]  ttft {r.ttft_s.median:.3f} s"
        )
        if r.decode_tok_s:
            s += (
                f"  tg{rep.gen_tokens} {r.decode_tok_s.median:8.2f} tok/s "
                f"[{r.decode_tok_s.min:.2f}..{r.decode_tok_s.max:.2f}]"
            )
        lines.append(s)
    doc = rep.to_dict()
    doc |= {"config_source": eng.source.to_dict(), "engine_commit": commit, "time": at}
    doc["roofline"] = _roofline(eng, rep, lines)
    doc["memory"] = _footprint(eng, max(args.prompt_tokens), args.gen_tokens, lines)
    if args.profile:
        from engine.bench import bench_prompt, measure

        be.set_profiling(True)
        be.profile(reset=True)
        prompt = bench_prompt(args.prompt_tokens[0], eng.model.spec.n_vocab)
        measure(eng.model, prompt, args.gen_tokens, args.prefill)
        prof = be.profile(reset=True)
        be.set_profiling(False)
        doc["profile"] = prof.to_dict()
        total_ms = prof.total_ms
        lines.append(
            f"kernels of one pp{args.prompt_tokens[0]} + tg{args.gen_tokens} run "
            f"({total_ms:.1f} ms, clock: {prof.clock}):"
        )
        for name, k in list(prof.kernels.items())[:15]:
            share = 100 * k.total_ms / total_ms if total_ms else 0.0
            lines.append(
                f"  {name:40s} {k.calls:6d} calls {k.total_ms:9.2f} ms {share:5.1f}%"
                f" {k.mean_us:9.1f} us/call"
            )
    _emit(args, doc, "\n".join(lines))
    return 0


def _footprint(eng: Any, prompt_tokens: int, gen_tokens: int, lines: list[str]) -> dict[str, Any]:
    """The config's device footprint at this run's context (engine.footprint: one more prefill
    of the longest prompt, its cache alive), appended to ``lines``."""
    from engine.bench import bench_prompt
    from engine.footprint import lines as footprint_lines
    from engine.footprint import measure

    prompt = bench_prompt(prompt_tokens, eng.model.spec.n_vocab)
    fp = measure(eng.model, prompt_tokens + gen_tokens, prompt)
    lines += footprint_lines(fp)
    return fp


def _roofline(eng: Any, rep: Any, lines: list[str]) -> list[dict[str, Any]]:
    """Each bench figure's roofline position (engine.roofline), appended to ``lines``."""
    from engine.roofline import (
        CEILINGS,
        decode_position,
        gguf_tensors,
        model_work,
        prefill_position,
    )

    work = model_work(eng.gguf.spec, gguf_tensors(eng.gguf))
    ceil = CEILINGS.get(rep.device["device_class"])
    out = []
    for r in rep.results:
        pos = [prefill_position(work, r.prompt_tokens, r.prefill_tok_s.median, ceil)]
        if r.decode_tok_s:
            d = decode_position(work, r.prompt_tokens, rep.gen_tokens, r.decode_tok_s.median, ceil)
            pos.append(d)
        out.append({"prompt_tokens": r.prompt_tokens, **{p.metric: p.to_dict() for p in pos}})
        lines.append(
            f"  roofline pp{r.prompt_tokens}: " + "; ".join(f"{p.metric} {p}" for p in pos)
        )
    if ceil is None:
        lines.append(f"  (no measured ceilings for {rep.device['device_class']}: engine.roofline)")
    return out


def cmd_models(args: argparse.Namespace) -> int:
    from engine import checkpoints

    if args.models_cmd == "list":
        rows = checkpoints.list_models()
        text = "\n".join(
            f"{r['name']:28s} {r['arch']:8s} {r['size'] / 2**20:8.1f} MiB  "
            f"{'cached ' + str(r['path']) if r['cached'] else 'not cached'}"
            for r in rows
        )
        _emit(args, {"models": rows}, text)
    else:
        path = checkpoints.fetch(args.name, progress=not args.json)
        _emit(args, {"name": args.name, "path": str(path)}, str(path))
    return 0


def cmd_synth(args: argparse.Namespace) -> int:
    from engine.synth import write_synthetic

    if args.out.is_dir():
        raise ConfigError(f"synth --out {args.out}: is a directory; give a file name (x.gguf)")
    path = write_synthetic(
        args.out,
        arch=args.arch,
        preset=args.preset,
        quant_mix=args.quant,
        seed=args.seed,
        progress=not args.json,
    )
    _emit(args, {"path": str(path), "bytes": path.stat().st_size}, f"wrote {path}")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from dataclasses import asdict

    from engine.gguf_model import open_model
    from engine.roofline import gguf_tensors, model_work
    from engine.runtime import resolve_model_path
    from engine.tuning.shape import shape_of

    m = open_model(resolve_model_path(args.model))
    work = model_work(m.spec, gguf_tensors(m))
    shape = shape_of(m)
    obj = {
        "path": str(m.path),
        "bytes": m.file_bytes,
        "shape_key": shape.key,  # what promoted configs are keyed by (configs/README.md)
        "spec": asdict(m.spec),
        "quant_types": m.quant_summary(),
        "work_per_token": asdict(work),
    }
    text = "\n".join(
        [f"{m.path} ({m.file_bytes / 2**20:.1f} MiB)", f"  shape key: {shape.key}"]
        + [f"  {k}: {v}" for k, v in asdict(m.spec).items()]
        + [f"  tensors: {m.quant_summary()}"]
        + [
            f"  per token: decode reads {work.weight_bytes / 1e9:.3f} GB of weights "
            f"+ {work.kv_bytes_per_pos / 1e3:.1f} kB of KV per context position; prefill "
            f"computes {work.matmul_flops / 1e9:.2f} GFLOP of GEMMs"
        ]
    )
    _emit(args, obj, text)
    return 0


def cmd_kernels(args: argparse.Namespace) -> int:
    from engine.tuning import REGISTRY
    from engine.tuning.knob_doc import binding_text

    if args.markdown or args.write:
        return _kernels_markdown(args, REGISTRY)
    names = [args.backend] if args.backend else REGISTRY.backends()
    obj: dict[str, Any] = {}
    lines = []
    for b in names:
        obj[b] = {}
        lines.append(b)
        for op in REGISTRY.ops(b):
            obj[b][op.name] = [
                {
                    "variant": v.name,
                    "doc": v.doc,
                    "source": v.source,
                    "quant_types": sorted(v.quant_types) if v.quant_types else None,
                    "defines": list(v.defines),
                    "params": {
                        p.name: {
                            "choices": list(p.choices),
                            "default": p.default,
                            "doc": p.doc,
                            "binding": binding_text(p.binding),
                        }
                        for p in v.params
                    },
                    "constraints": [c.doc for c in v.constraints],
                }
                for v in op.variants
            ]
            for v in op.variants:
                ps = ", ".join(f"{p.name}={p.default} {list(p.choices)}" for p in v.params)
                lines.append(f"  {op.name:18s} {v.name:14s} {ps}")
    _emit(args, obj, "\n".join(lines))
    return 0


def _kernels_markdown(args: argparse.Namespace, registry: Any) -> int:
    """docs/<backend>.md's generated "Kernels and knobs" section: printed, or spliced into
    --write's file between its markers (engine.doc_block)."""
    from engine import doc_block
    from engine.tuning.knob_doc import command, markdown

    if not args.backend or args.json:
        raise ConfigError("kernels --markdown: name one --backend, without --json")
    if args.write and not args.markdown:
        raise ConfigError("kernels --write: add --markdown (the text it writes)")
    text = markdown(registry, args.backend)
    if args.write is None:
        print(text, end="")
        return 0
    changed = doc_block.write(args.write, command(args.backend), text)
    print(f"{args.write}: {'rewritten' if changed else 'already current'}")
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    from engine import backends
    from engine.device_info import served

    # Every device each backend lists, with the index --device / open() take; a worker node
    # serves the best kind present, one worker per card (worker/device.py, worker/claim.py).
    rows: list[dict[str, Any]] = []
    lines = []
    for name in backends.BACKENDS:
        try:
            found = backends.backend_class(name).list_devices()
        except Exception as e:  # noqa: BLE001 - report, keep listing the others
            rows.append({"backend": name, "error": str(e)})
            lines.append(f"{name:7s} unavailable: {e}")
            continue
        serving = {d.index for d in served(found)}
        for d in found:
            rows.append(d.to_dict() | {"served": d.index in serving})
            mark = "served by workers" if d.index in serving else "not served"
            lines.append(
                f"{name:7s} [{d.index}] {d.device_class:14s} {d.name} "
                f"({d.kind}, {d.memory_bytes / 2**30:.1f} GiB, {mark})"
            )
        if not found:
            lines.append(f"{name:7s} no device")
    _emit(args, {"devices": rows}, "\n".join(lines))
    return 0


COMMANDS = {
    "run": cmd_run,
    "validate": cmd_validate,
    "bench": cmd_bench,
    "models": cmd_models,
    "synth": cmd_synth,
    "info": cmd_info,
    "kernels": cmd_kernels,
    "devices": cmd_devices,
}


# Argument bounds checked before any work (exit 2, like argparse's own errors: validate's
# exit 1 means "does not compute the same model").
MINIMUM = {"max_tokens": 0, "gen_tokens": 0, "warmup": 0, "seed": 0, "steps": 1, "repeats": 1}


def check_args(args: argparse.Namespace) -> None:
    """Raise ConfigError naming the first argument out of its range."""
    for flag, lo in MINIMUM.items():
        value = getattr(args, flag, None)
        if value is not None and value < lo:
            raise ConfigError(f"--{flag.replace('_', '-')} {value}: must be >= {lo}")
    for flag in ("max_abs_diff", "nmse"):
        value = getattr(args, flag, None)
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"--{flag.replace('_', '-')} {value}: must be a finite number >= 0")


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(asctime)s %(name)s %(levelname)s %(message)s",
        stream=sys.stderr,
    )
    try:
        check_args(args)
        return COMMANDS[args.cmd](args)
    except (EngineError, ConfigError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
