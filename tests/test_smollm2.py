"""The offline default model end to end: SmolLM2-135M-Instruct Q4_1 GGUF.

Logits equal transformers' own GGUF loading of the same file; every greedy strategy emits the
same tokens as plain greedy decoding on varied prompts (the drafter is SmolLM2 itself)."""

from __future__ import annotations

import pytest
import torch

from engine.generate import Decoder, run_generation
from engine.loading import load
from engine.strategy import preset

PROMPTS = [
    "What is the capital of France? Answer in one sentence.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "Rewrite formally: the server update is done, the server is back up, tell me if the server acts weird.",
    "List three primary colors.",
]


@pytest.fixture(scope="module")
def smol(smollm2_gguf_path):
    return load(str(smollm2_gguf_path))


def test_logits_match_transformers_gguf(smol, smollm2_gguf_path):
    from transformers import AutoModelForCausalLM

    ref_model = AutoModelForCausalLM.from_pretrained(str(smollm2_gguf_path.parent), gguf_file=smollm2_gguf_path.name,
                                                     dtype=torch.float32).eval()
    ids = smol.tokenizer.encode("The quick brown fox jumps over the lazy dog. 1 + 1 = 2; print('hi')")
    with torch.no_grad():
        ref = ref_model(torch.tensor([ids])).logits[0]
    out = smol.model.full_logits(ids)
    # fp32 rounding only: our projections use oneDNN's pre-packed weights (common.Linear), whose
    # blocked reduction order differs from transformers' GEMM in the last bits (~1e-5 relative
    # on logits of magnitude ~25; measured 1.4e-4 absolute)
    assert (ref - out).abs().max().item() <= 3e-4


@pytest.fixture(scope="module")
def smol_bf16(smollm2_gguf_path):
    return load(str(smollm2_gguf_path), dtype="bf16")


@pytest.fixture(scope="module")
def smol_q8(smollm2_gguf_path):
    return load(str(smollm2_gguf_path), dtype="q8")


# bf16 on a CPU without AVX-512 runs ~4x slower than the fp32 C pass (~40 s here): CI runs it with
# -m slow; bf16 greedy identity on tiny models stays in the default suite (test_generate.py)
@pytest.mark.parametrize("dtype", ["fp32", "q8", pytest.param("bf16", marks=pytest.mark.slow)])
def test_greedy_strategies_identical_on_smollm2(dtype, request):
    """Lossless in the dtype used: greedy speculative output == greedy plain decoding, fp32, q8
    (8-bit activations in the GGUF products, engine/native/quant_a8.c) and bf16 (bf16 rounds every
    op, so a verify pass must compute each row exactly as a 1-token step would:
    engine.models.common.mm)."""
    smol = request.getfixturevalue({"fp32": "smol", "q8": "smol_q8", "bf16": "smol_bf16"}[dtype])
    tok = smol.tokenizer
    dec = Decoder(smol.model, smol.model, eos_ids=set(tok.eos_ids))
    strategies = [preset("pld"), preset("sd", draft_len=4), preset("tree", tree=(2, 2, 1)), preset("ersd", draft_len=3),
                  preset("mab", arms=((2, 1), (1, 1, 1))), preset("hybrid", draft_len=2)]
    for s, text, evs, summ in _each_identical_to_ar(dec, tok, strategies, PROMPTS, 32):
        if s.name in ("sd", "tree"):  # self-drafting: every draft token is accepted
            assert summ.mean_accepted > 2.5


def _each_identical_to_ar(dec, tok, strategies, prompts, n):
    """Run every strategy on every prompt (chat template), asserting its tokens equal plain greedy
    decoding's; yields (strategy, prompt, events, summary) for further checks."""
    for text in prompts:
        ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": text}]))
        ar = [t for e in run_generation(dec, ids, preset("ar"), n)[0] for t in e.emitted]
        assert len(ar) > 3
        for s in strategies:
            evs, summ = run_generation(dec, ids, s, n)
            assert [t for e in evs for t in e.emitted] == ar, (s.label(), text)
            yield s, text, evs, summ


def test_tree_policies_identical_on_smollm2_with_a_tiny_random_mamba_drafter(smol, tmp_path):
    """Issue [drafting]: mab (the default arms and a small set) and optimal trees, drafted by a tiny
    random Mamba-2 over SmolLM2's vocabulary (nearly every draft rejected, so every step exercises
    rejection, the bonus token and the drafter's state rollback), emit exactly plain greedy's
    tokens on the real target."""
    from .tiny import saved

    drafter = load(str(saved("mamba2_smol", str(tmp_path)))).model
    tok = smol.tokenizer
    dec = Decoder(smol.model, drafter, eos_ids=set(tok.eos_ids))
    strategies = [preset("mab"), preset("mab", arms=((2, 1), (1, 1, 1))), preset("optimal", node_budget=8),
                  preset("tree", tree=(2, 2, 1))]
    for _, _, evs, _ in _each_identical_to_ar(dec, tok, strategies, PROMPTS[:2], 24):
        assert any(e.drafted for e in evs)
