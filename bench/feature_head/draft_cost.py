"""Milliseconds a step of the feature drafter takes (catch-up of a few rows + a chain or tree), at
SmolLM2-135M's width, in fp32 and bf16. Usage: python bench/feature_head/draft_cost.py [HEAD_DIR]"""
import sys, time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from engine.drafters.base import DraftRequest  # noqa: E402
from engine.drafters.feature import FeatureDrafter  # noqa: E402
from engine.feature_head import FeatureHead, load_head  # noqa: E402


def main():
    import os
    if os.environ.get("THREADS"):
        torch.set_num_threads(int(os.environ["THREADS"]))
    torch.manual_seed(0)
    V, D = 49152, 576
    emb = torch.randn(V, D)
    for q8 in (True, False):
        head = load_head(Path(sys.argv[1])) if len(sys.argv) > 1 else FeatureHead(D, 9, 64, 1536, torch.arange(8192))
        fd = FeatureDrafter(head, emb, emb, 2048, q8=q8)
        hist = torch.randint(0, V, (150,)).tolist()  # a bench prompt's context (its replies: 128 tokens more)
        fd.append(torch.randn(149, D))
        fd.propose(hist, DraftRequest(shape=(1,)))
        for shape in [(1,) * 5, (1,) * 8, (2, 2, 1, 1, 1), (4, 2, 1, 1, 1)]:
            ts = []
            for i in range(30):
                n = len(hist)
                hist = hist + torch.randint(0, V, (3,)).tolist()
                fd.append(torch.randn(3, D))
                t0 = time.perf_counter()
                fd.propose(hist, DraftRequest(shape=shape))
                ts.append((time.perf_counter() - t0) * 1000)
                if len(hist) > 300:
                    fd.reset(); hist = hist[:150]; fd.append(torch.randn(149, D))
            ts.sort()
            print(f"{'q8' if q8 else 'fp32':5s} shape {shape}: median {ts[len(ts) // 2]:.2f} ms (min {ts[0]:.2f})", flush=True)


if __name__ == "__main__":
    main()
