"""Memory of one loaded model in a worker: the resident growth of a fresh process from before
loading the checkpoint to after translating a few sentences with it (what NMT_MAX_LOADED_MODELS
trades against).

    python bench/memory.py --model checkpoints/en-de --dtype int8
    python bench/memory.py --shape base --dtype int8      # a random OPUS-MT-base-shaped model

Each measurement runs in a process of its own (torch imported before the baseline is taken).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

MEASURE = """
import json, sys
import torch
from model.config import read_header
from model.translator import Translator

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024

torch.set_num_threads(1)
before = rss()
translator = Translator.load(sys.argv[1], device="cpu", dtype=sys.argv[2])
loaded = rss()
translator.translate([[5, 6, 7, 8, 9, 10, 11, 12] + [translator.config.eos_id]] * 8, beam_size=4)
print(json.dumps({"dtype": translator.dtype, "load_bytes": loaded - before, "after_translating_bytes": rss() - before,
                  "parameters": read_header(sys.argv[1]).parameters}))
"""


def measure(model: Path, dtype: str) -> dict:
    run = subprocess.run([sys.executable, "-c", MEASURE, str(model), dtype], capture_output=True, text=True, cwd=ROOT,
                         check=True)
    return json.loads(run.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", type=Path, help="a checkpoint directory")
    p.add_argument("--shape", choices=["small", "base"], help="or a random MarianMT of bench/engine.py's shapes")
    p.add_argument("--dtype", default="int8,float32", help="comma-separated")
    p.add_argument("--workdir", type=Path, default=ROOT / "artifacts" / "bench")
    args = p.parse_args()
    if args.model is None:
        from bench.engine import prepare

        args.model = prepare(args.workdir, args.shape or "base", need_ct2=False)["ours"]
    print("| model | dtype | parameters | resident after loading (MB) | after translating 8 x beam 4 (MB) |")
    print("|---|---|---:|---:|---:|")
    for dtype in args.dtype.split(","):
        r = measure(args.model, dtype)
        print(f"| {args.model} | {r['dtype']} | {r['parameters']:,} | {r['load_bytes'] / 2**20:.0f} | "
              f"{r['after_translating_bytes'] / 2**20:.0f} |")


if __name__ == "__main__":
    main()
