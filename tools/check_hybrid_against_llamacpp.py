"""Cross-check a hybrid GGUF (qwen35 / qwen35moe / qwen3next) between the engine's NumPy
reference and llama.cpp (through llama-cpp-python, which builds llama.cpp from source): last-token
logits of a token-id prompt and greedy tokens. It also shows that llama.cpp loads the file, which
the GPU comparison of issue 15 needs (llama-bench on synthetic files).

Not part of the test suite (llama-cpp-python compiles llama.cpp, ~15 min on 2 cores); by hand:
    python3 -m venv /tmp/llvenv && /tmp/llvenv/bin/pip install llama-cpp-python numpy
    /tmp/llvenv/bin/python tools/check_hybrid_against_llamacpp.py MODEL.gguf \
        --engine-python .venv/bin/python
Exits 1 if the NMSE exceeds --max-nmse or the greedy tokens differ.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ENGINE = """
import json, sys
import numpy as np
from engine.backends.numpy_ref import NumpyBackend
from engine.gguf_model import GGUFModel
from engine.models import build_model
ids, n = json.loads(sys.argv[1]), int(sys.argv[2])
g = build_model(GGUFModel(sys.argv[3]), NumpyBackend()).generate(ids, n)
print(json.dumps({"logits": g.last_logits.tolist(), "tokens": g.tokens}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("gguf", type=Path)
    ap.add_argument("--ids", default="5,17,99,3,42,7,250,11,64,2,8,200,31")
    ap.add_argument("--max-tokens", type=int, default=16)
    ap.add_argument("--max-nmse", type=float, default=1e-3)
    ap.add_argument("--engine-python", default=sys.executable)
    args = ap.parse_args()
    if not args.gguf.is_file():
        print(f"error: {args.gguf}: no such file", file=sys.stderr)
        return 2
    ids = [int(t) for t in args.ids.split(",")]

    import numpy as np
    from llama_cpp import Llama

    llm = Llama(str(args.gguf), n_ctx=256, logits_all=True, verbose=False, n_threads=2)
    llm.eval(ids)
    ref = np.array(llm.scores[llm.n_tokens - 1], dtype=np.float64)
    toks = []
    for _ in range(args.max_tokens):
        t = int(np.argmax(llm.scores[llm.n_tokens - 1]))
        toks.append(t)
        llm.eval([t])

    root = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [args.engine_python, "-c", ENGINE, json.dumps(ids), str(args.max_tokens), str(args.gguf)],
        capture_output=True,
        text=True,
        cwd=root,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        check=True,
    )
    eng = json.loads(out.stdout)
    mine = np.array(eng["logits"])
    nmse = float(np.sum((mine - ref) ** 2) / np.sum(ref**2))
    print(f"llama.cpp tokens: {toks}\nengine tokens:    {eng['tokens']}\nlogits NMSE {nmse:.3e}")
    return 0 if nmse <= args.max_nmse and toks == eng["tokens"] else 1


if __name__ == "__main__":
    sys.exit(main())
