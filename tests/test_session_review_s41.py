"""Review of the chat session layer (engine/session.py over Decoder.start/steps), session 41.

A tiny random Llama over ByteTokenizer's 259 ids, whose chat template strips ``<think>...</think>``
from earlier assistant turns (the rendering of a turn changes once a later turn is added, as in
Qwen3's), chatted with turn by turn: every reply must be token for token what a fresh session fed
the same whole conversation writes (greedy), whatever the cache held from the turns before it (a
stopped reply, a regenerate, a live strategy switch, a failed prefill, a rolling window).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

THINK = ("{% for m in messages %}{% set c = m.content %}"
         "{% if m.role == 'assistant' and not loop.last %}{% set c = c.split('</think>')[-1] %}{% endif %}"
         "<|bos|>{{ m.role }}\n{{ c }}<|eos|>\n{% endfor %}{% if add_generation_prompt %}<|bos|>assistant\n{% endif %}")


def _tiny(root: Path, name: str, seed: int, max_pos: int = 1024) -> Path:
    from transformers import AutoModelForCausalLM, LlamaConfig

    from engine.tokenizer import ByteTokenizer
    from tests.tiny import sharpen

    path = root / name
    if not (path / "config.json").exists():
        cfg = LlamaConfig(vocab_size=260, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=1, max_position_embeddings=max_pos, tie_word_embeddings=False,
                          bos_token_id=256, eos_token_id=257)
        torch.manual_seed(seed)
        sharpen(AutoModelForCausalLM.from_config(cfg)).save_pretrained(path)
        ByteTokenizer(chat_template=THINK).save(path)
    return path


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("session_s41")
    return {"target": str(_tiny(root, "target", 0)), "drafter": str(_tiny(root, "drafter", 1)),
            "small": str(_tiny(root, "small", 1, max_pos=96)), "none": "none"}


def _session(models, drafter: str, strategy: str, ctx: int = 400):
    from engine.session import ChatSession

    return ChatSession.load(target=models["target"], drafter=models[drafter] if drafter in models else drafter,
                            dtype="fp32", max_context=ctx, strategy=strategy)


def _run(s, convo, n, stop_after: int | None = None, switch: dict | None = None):
    stop, out = threading.Event(), []
    for i, ev in enumerate(s.stream_chat(convo, n, stop)):
        out.append(ev)
        if stop_after is not None and i + 1 == stop_after:
            stop.set()
        if switch and i in switch:
            s.strategy = switch[i]
    return out


def _toks(events) -> list[int]:
    return [t for e in events for t in e.emitted]


def _text(events) -> str:
    return "".join(e.text for e in events).rstrip("\ufffd")  # as the app saves a cut reply (ReplyRun.drain)


@pytest.mark.parametrize("drafter, strategy", [("none", "pld:auto"), ("drafter", "sd"), ("target", "tree"),
                                               ("target", "hybrid"), ("drafter", "sd:auto")])
def test_each_turn_is_what_a_fresh_session_writes(models, drafter, strategy) -> None:
    """A reply with <think> continued, then turns whose template drops it: the cached prefix is
    reused where it still matches, and each reply equals a fresh session's; a stopped reply and a
    regenerate after it too."""
    s = _session(models, drafter, strategy)
    convo = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"},
             {"role": "assistant", "content": "<think>hmm</think>ok"}]
    convo[-1]["content"] += _text(_run(s, convo, 12))  # continued: the think block is the last turn's, kept
    for turn in range(3):
        convo.append({"role": "user", "content": f"question {turn}"})
        events = _run(s, convo, 20, stop_after=2 if turn == 1 else None)
        fresh = _session(models, drafter, strategy)
        assert _toks(events) == _toks(_run(fresh, convo, 20))[:len(_toks(events))], turn
        if turn == 1:  # stopped: regenerate, then the partial reply is what the chat keeps
            assert events[-1].finish_reason == "stopped"
            again = _run(s, convo, 20)
            assert _toks(again) == _toks(_run(fresh, convo, 20))
        convo.append({"role": "assistant", "content": _text(events)})


def test_a_live_switch_mid_reply_keeps_the_reply(models) -> None:
    from engine.strategy import preset

    s = _session(models, "target", "sd")
    convo = [{"role": "user", "content": "hello"}]
    want = _toks(_run(s, convo, 30))
    for backtrack in ("joint", "recompute"):
        got = _run(s, convo, 30, switch={0: preset("tree"), 1: preset("ar"), 2: preset("pld", backtrack=backtrack),
                                         4: preset("sd", backtrack=backtrack), 6: preset("hybrid")})
        assert _toks(got) == want and len(got) > 5
        s.strategy = preset("sd")


def test_a_prefill_that_failed_leaves_a_usable_chat(models) -> None:
    """An error between the prefill pieces of a long prompt (CUDA out of memory, a MemoryError) is
    shown and the chat goes on: the next turn must not read the cache by the history of the turn
    before (it failed with IndexError, every turn after, or reused K/V rows of other tokens)."""
    s = _session(models, "none", "ar", ctx=1000)
    convo = [{"role": "user", "content": "hi"}]
    first = _run(s, convo, 1)
    convo += [{"role": "assistant", "content": _text(first)}, {"role": "user", "content": "x" * 600}]
    model, calls = s.target.model, []
    prefill = model.prefill

    def failing(ids):
        calls.append(len(ids))
        if len(calls) == 2:
            raise RuntimeError("out of memory (simulated)")
        return prefill(ids)

    model.prefill = failing
    try:
        with pytest.raises(RuntimeError, match="simulated"):
            _run(s, convo, 8)
    finally:
        model.prefill = prefill
    assert len(calls) == 2
    fresh = _session(models, "none", "ar", ctx=1000)
    assert _toks(_run(s, convo, 8)) == _toks(_run(fresh, convo, 8))
    shorter = convo[:-1] + [{"role": "user", "content": "x" * 40}]  # what the user sends instead
    assert _toks(_run(s, shorter, 8)) == _toks(_run(fresh, shorter, 8))


def test_a_long_chat_with_a_drafter_of_a_shorter_context(models) -> None:
    """A 200-token context, a drafter whose own is 96: turns past it go on (plain steps where the
    drafter is full, drafts again after a cut), the system prompt stays, every reply is plain
    greedy decoding's for the windowed prompt; one message longer than the context is a
    ContextOverflowError that leaves the session usable."""
    from engine.errors import ContextOverflowError
    from engine.generate import Decoder, run_generation
    from engine.session import reply_reserve
    from engine.strategy import preset

    s = _session(models, "small", "sd", ctx=200)
    assert s.decoder.drafters["model"].model.cache.capacity < s.context_length
    ref = Decoder(s.target.model.with_own_cache(), eos_ids=set(s.tokenizer.eos_ids))
    convo = [{"role": "system", "content": "sys prompt"}]
    dropped_seen = []
    for turn in range(6):
        convo.append({"role": "user", "content": f"question number {turn} " + "ab" * (turn % 3 * 5)})
        ids, dropped = s.fit_chat(convo, 40)
        assert len(ids) + reply_reserve(40, 200) <= 200
        assert s.tokenizer.decode(ids).startswith("<|bos|>system\nsys prompt<|eos|>\n<|bos|>user\n")
        events = _run(s, convo, 40)
        assert events[0].dropped_messages == dropped
        assert _toks(events) == [t for e in run_generation(ref, ids, preset("ar"), 40)[0] for t in e.emitted]
        dropped_seen.append(dropped)
        convo.append({"role": "assistant", "content": _text(events)})
    assert max(dropped_seen) > 0 and all(d % 2 == 0 for d in dropped_seen)
    with pytest.raises(ContextOverflowError, match="context holds 200"):
        list(s.stream_chat(convo + [{"role": "user", "content": "y" * 300}], 40, threading.Event()))
    convo.append({"role": "user", "content": "again"})
    ids, _ = s.fit_chat(convo, 40)
    assert _toks(_run(s, convo, 40)) == [t for e in run_generation(ref, ids, preset("ar"), 40)[0] for t in e.emitted]


def test_a_reply_that_fills_the_context_then_the_next_turn(models) -> None:
    """A reply cut by the context (no end of turn on the way: stop ids off) ends at the context's
    last row; the next turn leaves that turn out and is a fresh session's reply."""
    s, fresh = _session(models, "target", "tree", ctx=120), _session(models, "target", "tree", ctx=120)
    s.decoder.eos_ids = fresh.decoder.eos_ids = set()
    convo = [{"role": "user", "content": "fill it"}]
    events = _run(s, convo, 500)
    assert events[-1].finish_reason == "context" and events[-1].position == 120 == len(s.decoder.history)
    convo += [{"role": "assistant", "content": _text(events)}, {"role": "user", "content": "next"}]
    got = _run(s, convo, 20)
    assert got[0].dropped_messages == 2 and _toks(got) == _toks(_run(fresh, convo, 20))


@pytest.mark.parametrize("drafter, strategy", [("none", "pld:auto"), ("none", "ar"), ("drafter", "sd"), ("target", "ersd")])
def test_regenerate_draws_a_new_reply_when_sampling(models, drafter, strategy) -> None:
    """Ctrl+R at a temperature > 0 asks for another reply: it wrote the same one every time (the
    reply's random stream restarted at the strategy's seed). A prompt's first reply keeps the seed
    (a fresh session writes the same), a greedy regenerate the same reply."""
    s = _session(models, drafter, strategy)
    s.strategy = s.strategy.replace(temperature=1.0, seed=7)
    convo = [{"role": "user", "content": "hi"}]
    replies = [_toks(_run(s, convo, 16)) for _ in range(3)]
    fresh = _session(models, drafter, strategy)
    fresh.strategy = s.strategy
    assert replies[0] == _toks(_run(fresh, convo, 16))
    assert len({tuple(r) for r in replies}) == 3, replies
    s.strategy = s.strategy.replace(temperature=0.0)
    greedy = _toks(_run(s, convo, 16))
    assert _toks(_run(s, convo, 16)) == greedy
