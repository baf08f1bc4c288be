"""Cross-check the engine against an independent implementation: Hugging Face transformers
loading the same GGUF (it dequantizes the weights into PyTorch and runs its own Qwen2 code).

Not part of the test suite (it needs torch + transformers, ~1 GB); run by hand in a separate
environment:
    python3 -m venv /tmp/tfenv && /tmp/tfenv/bin/pip install torch==2.13.0 transformers gguf
    /tmp/tfenv/bin/python tools/check_against_transformers.py MODEL.gguf \
        --engine-python .venv/bin/python
Prints both token lists and exits 1 if the greedy tokens differ.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--prompt", default="The capital of France is")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--engine-python", default=sys.executable)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    d, f = str(args.gguf.parent), args.gguf.name
    tok = AutoTokenizer.from_pretrained(d, gguf_file=f)
    model = AutoModelForCausalLM.from_pretrained(d, gguf_file=f, torch_dtype=torch.float32)
    ids = tok(args.prompt, return_tensors="pt").input_ids
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=args.max_tokens, do_sample=False)
    hf_tokens = out[0, ids.shape[1] :].tolist()

    eng = subprocess.run(
        [
            args.engine_python,
            "-m",
            "engine",
            "run",
            "--model",
            str(args.gguf),
            "--prompt",
            args.prompt,
            "--max-tokens",
            str(args.max_tokens),
            "--json",
            "--no-promoted",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    res = json.loads(eng.stdout)
    print(
        json.dumps(
            {
                "prompt_tokens_hf": ids[0].tolist(),
                "prompt_tokens_engine": res["prompt_tokens"],
                "hf": hf_tokens,
                "engine": res["tokens"],
                "hf_text": tok.decode(hf_tokens),
                "engine_text": res["text"],
            },
            indent=1,
        )
    )
    same = hf_tokens == res["tokens"] and ids[0].tolist() == res["prompt_tokens"]
    print("MATCH" if same else "DIFFER")
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
