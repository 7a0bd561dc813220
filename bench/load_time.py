"""How long a model takes to load, each run in a fresh process (the import of torch timed apart).

    .venv/bin/python bench/load_time.py                              # SmolLM2 q8, 3 runs
    .venv/bin/python bench/load_time.py --ref smollm2-135m-instruct --dtype fp32 --runs 5
    .venv/bin/python bench/load_time.py --tree /tmp/old               # another checkout, alternated

``--tree DIR`` times a second checkout of the repo too (``git worktree add /tmp/old REV``),
alternating the two run by run on the same machine, so that before/after ratios see the same load.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import json, sys, time
t0 = time.perf_counter()
import torch  # noqa: F401
from engine import loading
t1 = time.perf_counter()
m = loading.load(sys.argv[1], dtype=sys.argv[2])
t2 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "kept": m.kept_quantized, "act8": m.act8}))
"""


def one(tree: Path, ref: str, dtype: str) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree))
    out = subprocess.run([sys.executable, "-c", CHILD, ref, dtype], cwd=tree, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ref", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="q8")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tree", default=None, help="another checkout to time alternately (before/after)")
    args = ap.parse_args()
    trees = {"this": ROOT} | ({"other": Path(args.tree).resolve()} if args.tree else {})
    times: dict[str, list[float]] = {k: [] for k in trees}
    for r in range(args.runs):
        for name, tree in trees.items():
            res = one(tree, args.ref, args.dtype)
            times[name].append(res["load_s"])
            print(f"run {r + 1} {name:5s} ({tree}): import {res['import_s']:.2f} s, load {res['load_s']:.2f} s, "
                  f"kept {res['kept']}, act8 {res['act8']}", flush=True)
    for name, ts in times.items():
        print(f"{name}: load median {statistics.median(ts):.2f} s (min {min(ts):.2f}, max {max(ts):.2f}) over {len(ts)} runs")
    if "other" in times:
        print(f"this / other: {statistics.median(times['this']) / statistics.median(times['other']):.2f}x the time")


if __name__ == "__main__":
    main()
