"""validate with op-level replay on one model and config, timed and printed per op (the replay
helper's device checkpoint; docs/verify.md). Runs validate end to end without replay first
(the reference run cached), then the replay alone, so both costs show; --mutant plants a
FLEETTUNE_MUTANT shader bug for the candidate's build.

usage: python scripts/device_replay.py MODEL.gguf [--flat k=v,k=v] [--mutant NAME]
       [--prompts N] [--steps 4] [--no-edges] [--name NAME] [--out DIR] [--backend cuda]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.backends.planted import ENV  # noqa: E402
from engine.tuning import TuningConfig  # noqa: E402
from engine.validate import tokenize_prompts, validate  # noqa: E402


def _flat(text: str) -> dict:
    out: dict = {}
    for part in filter(None, text.split(",")):
        key, _, value = part.partition("=")
        out[key] = int(value) if value.lstrip("-").isdigit() else value
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--flat", default="", help="candidate knobs: k=v,k=v")
    ap.add_argument("--mutant", default="", help="FLEETTUNE_MUTANT for the candidate")
    ap.add_argument("--prompts", type=int, default=4, help="the first N fixed prompts")
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--no-edges", action="store_true")
    ap.add_argument("--name", default="replay")
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--again", action="store_true", help="validate with replay a second time")
    args = ap.parse_args()
    if not Path(args.model).is_file():
        print(f"error: {args.model}: no such file")
        return 2
    from engine.runtime import load

    if args.mutant:  # T > 1 bugs: the per-token reference never runs the planted code
        os.environ[ENV] = args.mutant
    t0 = time.time()
    ref = TuningConfig.default(args.backend)
    eng = load(args.model, args.backend, ref, use_promoted=False)
    m = eng.model
    cand = ref.replace(**_flat(args.flat))
    print(
        f"{args.name}: loaded in {time.time() - t0:.1f}s; candidate {_flat(args.flat)}", flush=True
    )
    prompts = tokenize_prompts(eng.tokenizer())[: args.prompts]
    kw = {"ref_cache": {}, "edges": not args.no_edges, "blame_failures": False}
    t1 = time.time()
    validate(m, cand, prompts, args.steps, replay_ops=False, **kw)  # references cached
    t2 = time.time()
    plain = validate(m, cand, prompts, args.steps, replay_ops=False, **kw)
    t3 = time.time()
    rep = validate(m, cand, prompts, args.steps, **kw)  # records the replay's references
    t4 = time.time()
    secs = {"first_validate": t2 - t1, "validate": t3 - t2, "validate_replay": t4 - t3}
    if args.again:  # the agent's steady state: recordings kept in ref_cache (if they fit)
        validate(m, cand, prompts, args.steps, **kw)
        secs["validate_replay_cached"] = time.time() - t4
    r = rep.replay
    print(f"{args.name}: {'PASS' if rep.passed else 'FAIL'}  end to end "
          f"{'pass' if plain.passed else 'FAIL'}: KLD {rep.kld_max:.3g} NMSE {rep.nmse:.3g} "
          f"(bounds KLD {rep.tolerances['kld_max']:g}, NMSE {rep.tolerances['nmse']:g}; "
          f"classes {', '.join(rep.numeric_classes)})", flush=True)  # fmt: skip
    for line in r.lines(top=30) if r else []:
        print(f"  {line}")
    for reason in rep.reasons[:4]:
        print(f"  reason: {reason[:300]}")
    print(
        f"  time: first validate (references) {secs['first_validate']:.1f}s, validate "
        f"{secs['validate']:.1f}s, with replay {secs['validate_replay']:.1f}s, again "
        f"{secs.get('validate_replay_cached', -1):.1f}s; prompts "
        f"{[p.prompt_tokens for p in rep.prompts]} tokens, {args.steps} steps",
        flush=True,
    )
    out = Path(args.out) / "replay"
    out.mkdir(parents=True, exist_ok=True)
    d = rep.to_dict() | {"seconds": secs}
    for p in d["prompts"]:  # keep the file small
        p.pop("reference_tokens", None)
        p.pop("candidate_tokens", None)
    (out / f"{args.name}.json").write_text(json.dumps(d, indent=1, default=str))
    if args.json:
        print(json.dumps({"passed": rep.passed, "replay": r.to_dict() if r else None}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
