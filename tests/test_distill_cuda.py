"""Distillation on a lent GPU (`distill data --device cuda`, `distill train --device cuda`): run
by `bench/gpu_distill.sh`'s first step on the device; skipped where there is no CUDA device (the
CPU-side wiring is tested in test_distill.py)."""
from __future__ import annotations

import json

import pytest
import torch

from engine.cli import main
from tests.tiny import saved

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
def test_batched_greedy_on_the_gpu_equals_the_cpu(tmp_path_factory, kind):
    """The target built on the GPU (load(device=...): weights, rope tables) decodes left-padded
    rows to the same greedy replies as on the CPU, in float64 (no near-ties)."""
    from engine.distill import batched_greedy
    from engine.loading import load

    path = saved(kind, str(tmp_path_factory.mktemp("m")))
    cpu = load(str(path), dtype=torch.float64).model
    gpu = load(str(path), dtype=torch.float64, device="cuda").model
    assert gpu.embed.device.type == "cuda" and gpu.rope.cos.device.type == "cuda"
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 96, (int(n),), generator=g).tolist() for n in (3, 9, 1, 17, 6, 12, 5)]
    want = dict(batched_greedy(cpu, prompts, 12, {7}, batch=3))
    got = dict(batched_greedy(gpu, prompts, 12, {7}, batch=3))
    assert got == want
    sampled = dict(batched_greedy(gpu, prompts, 8, {7}, batch=4, temperature=1.0, top_p=0.95, seed=3))
    assert sorted(sampled) == list(range(len(prompts)))


def test_distill_data_and_train_on_the_gpu(tmp_path, make_tiny_gguf):
    gguf, _, _ = make_tiny_gguf(tied=True)
    data = tmp_path / "d"
    prompts = tmp_path / "prompts.json"  # short ones: the tiny model's context is 128 tokens
    prompts.write_text(json.dumps([{"name": f"q{i}", "text": "hi " * (i + 1)} for i in range(6)]))
    assert main(["distill", "data", "--target", str(gguf), "--out", str(data), "--device", "cuda", "--dtype", "fp32",
                 "--prompts", str(prompts), "--batch", "4", "--max-new-tokens", "8"]) == 0
    rows = [json.loads(x) for x in (data / "responses.jsonl").read_text().splitlines()]
    assert sorted(r["id"] for r in rows) == [f"q{i}" for i in range(6)] and all(r["response_ids"] for r in rows)
    out = tmp_path / "drafter"
    assert main(["distill", "train", "--data", str(data), "--target", str(gguf), "--out", str(out), "--device", "cuda",
                 "--d-model", "64", "--layers", "1", "--head-dim", "32", "--d-state", "16", "--batch", "2", "--seq-len", "64",
                 "--holdout", "0.25", "--steps", "5", "--eval-every", "5"]) == 0
    rec = json.loads((out / "distill.json").read_text())
    assert rec["steps"] == 5 and 0.0 <= rec["held_out_top1"] <= 1.0
    from engine.loading import load

    assert load(str(out)).model.vocab_size >= 6


def test_distill_head_on_the_gpu(tmp_path):
    """`distill head --device cuda`: features from the target built on the GPU, the head trained there;
    the saved head drafts on the CPU for plain decoding's tokens."""
    from engine.feature_head import load_head
    from engine.generate import Decoder, run_generation
    from engine.loading import load
    from engine.strategy import from_spec
    from tests.test_feature_head_s46 import _replies

    target = str(saved("llama_tied", str(tmp_path)))
    data = _replies(tmp_path / "data", 30)
    out = tmp_path / "head"
    assert main(["distill", "head", "--device", "cuda", "--target", target, "--data", str(data), "--out", str(out),
                 "--replies", "30", "--minutes", "0.05", "--vocab", "50", "--inter", "32", "--batch-tokens", "256"]) == 0
    dec = Decoder(load(target).model)
    dec.attach_feature_head(load_head(out))
    got, _ = run_generation(dec, [5, 8, 11], from_spec("sd:4"), 20)
    want, _ = run_generation(Decoder(load(target).model), [5, 8, 11], from_spec("ar"), 20)
    assert [t for e in got for t in e.emitted] == [t for e in want for t in e.emitted]
