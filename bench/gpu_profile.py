#!/usr/bin/env python3
"""Where an eager decode step's time goes on a GPU: PyTorch's profiler over steady-state steps.

    python3 bench/gpu_profile.py --out DIR [--model mamba2-2.7b] [--steps 5]

The GPU suite (bench/gpu_suite.py) found a Mamba-2-2.7B-size ``ar`` step at ~40 ms eager on an
H200, flat in the number of rows verified, where its weights stream in ~1 ms: the host sets the
pace. This names the host-side cost: the ops with the most self CPU time, how many kernels a
step launches, and the host-device synchronisations (``aten::item``, ``cudaStreamSynchronize``,
``cudaMemcpy`` device-to-host) that stall the launch queue. Writes DIR/profile_<model>.txt
(tables) and DIR/profile_<model>.json (the counts per step). Random weights (bench/configs),
bf16. Runs on a CPU too (no CUDA rows), as its own smoke check.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from bench.gpu_suite import SMOKE_CONFIGS, random_model, sync  # noqa: E402

SYNC_NAMES = ("aten::item", "aten::_local_scalar_dense", "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync",
              "aten::nonzero", "aten::tolist")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="mamba2-2.7b", choices=sorted(SMOKE_CONFIGS))
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--smoke", action="store_true", help="the tiny stand-in config (any device)")
    args = ap.parse_args(argv)
    from torch.profiler import ProfilerActivity, profile

    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    model = random_model(args.model, dtype, dev, args.smoke or dev.type != "cuda")
    model.use_cuda_graphs(False)
    model.cache.reset()
    model.prefill(list(range(1, 65)))

    def step() -> None:
        model.verify([1], [-1])
        model.commit([0])

    for _ in range(3):
        step()
    sync(dev)
    t0 = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync(dev)
    wall_ms = (time.perf_counter() - t0) * 1000 / args.steps
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
    with profile(activities=acts) as prof:
        for _ in range(args.steps):
            step()
        sync(dev)
    ka = prof.key_averages()
    per = {e.key: e.count / args.steps for e in ka}
    kernels = sum(e.count for e in ka if getattr(e, "device_type", None) is not None and "CUDA" in str(e.device_type)) / args.steps
    syncs = {k: per[k] for k in SYNC_NAMES if k in per}
    launches = {k: v for k, v in per.items() if k in ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")}
    summary = {"model": args.model, "device": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu", "dtype": str(dtype),
               "wall_ms_per_step": round(wall_ms, 3), "layers": model.describe().get("layers"), "kernels_per_step": kernels,
               "launch_calls_per_step": launches, "syncs_per_step": syncs,
               "device_ms_per_step": round(sum(e.self_device_time_total for e in ka if hasattr(e, "self_device_time_total")) / 1000 / args.steps, 3)}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = [json.dumps(summary, indent=1), "", "# by self CPU time", ka.table(sort_by="self_cpu_time_total", row_limit=30)]
    if dev.type == "cuda":
        text += ["", "# by self device time", ka.table(sort_by="self_device_time_total", row_limit=20)]
    (out / f"profile_{args.model}.txt").write_text("\n".join(text) + "\n")
    (out / f"profile_{args.model}.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    print(ka.table(sort_by="self_cpu_time_total", row_limit=15))
    return 0


if __name__ == "__main__":
    sys.exit(main())
