"""Review of the chat session layer (engine/session.py), session 42: what a daily user hits.

A tiny random Llama over ByteTokenizer's ids (tests/test_session_review_s41.py's models), chatted
with through ``ChatSession.stream_chat`` as the app drives it: regenerate (Ctrl+R) after a Continue,
after another chat's turn, after a send that brought nothing back; the plain-decoding baseline under
a short ``--max-context``; and the edges of a reply (no tokens, one token, EOS first, a prompt that
alone overflows the context, a reply that ends at the context's last row), each strategy's greedy
reply token for token plain decoding's (``ar``).
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from tests.test_session_review_s41 import _run, _text, _tiny, _toks


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("session_s42")
    return {"target": str(_tiny(root, "target", 0)), "drafter": str(_tiny(root, "drafter", 1)), "none": "none"}


def _session(models, drafter: str = "none", strategy: str = "ar", ctx: int = 400):
    from engine.session import ChatSession

    return ChatSession.load(target=models["target"], drafter=models[drafter] if drafter in models else drafter,
                            dtype="fp32", max_context=ctx, strategy=strategy)


def _sampling(s, seed: int = 7) -> None:
    s.strategy = s.strategy.replace(temperature=1.0, seed=seed)


def _until(s, convo, n: int, tokens: int):
    """A reply stopped (Esc) once it has ``tokens`` tokens and some text (a random model's bytes
    are often no UTF-8: the app offers no Continue for a reply with no text)."""
    stop, out = threading.Event(), []
    for ev in s.stream_chat(convo, n, stop):
        out.append(ev)
        if len(_toks(out)) >= tokens and _text(out).strip():
            stop.set()
    return out


STRATEGIES = [("none", "ar"), ("none", "pld"), ("drafter", "sd"), ("target", "tree")]


# ---- regenerate draws anew ----------------------------------------------------------------------------------
@pytest.mark.parametrize("drafter, strategy", STRATEGIES)
def test_regenerate_after_continue_draws_a_new_reply(models, drafter, strategy) -> None:
    """A sampled reply stopped (Esc) or cut by the token limit, continued (Ctrl+P), then
    regenerated (Ctrl+R): the regenerate wrote the first reply's opening again, token for token
    (the session compared the prompt with the last one only, which was the continued one, so the
    regenerate was taken for the prompt's first reply and drawn with the same seed)."""
    s = _session(models, drafter, strategy)
    _sampling(s)
    convo = [{"role": "user", "content": "hi"}]
    first = _until(s, convo, 24, 6)
    assert first[-1].finish_reason == "stopped" and _text(first).strip()  # a reply the app lets one continue
    _run(s, convo + [{"role": "assistant", "content": _text(first)}], 8)  # Continue
    again = _toks(_run(s, convo, 24))  # Ctrl+R: the reply is dropped, the same prompt asked again
    n = len(_toks(first))
    assert again[:n] != _toks(first), "the regenerate after a Continue wrote the first reply again"
    # and it is the draw a regenerate straight after the first reply makes (the Continue changes nothing)
    plain = _session(models, drafter, strategy)
    _sampling(plain)
    _until(plain, convo, 24, 6)
    assert again == _toks(_run(plain, convo, 24))


def test_regenerate_after_another_chats_turn_draws_a_new_reply(models) -> None:
    """Chat A's reply, a turn in chat B (another prompt), back to chat A and Ctrl+R: not A's first
    reply again."""
    s = _session(models)
    _sampling(s)
    a = [{"role": "user", "content": "hi"}]
    reply = _toks(_run(s, a, 16))
    _run(s, [{"role": "user", "content": "something else"}], 16)
    assert _toks(_run(s, a, 16)) != reply


def test_a_send_that_drew_nothing_leaves_the_first_reply_to_its_retry(models) -> None:
    """A send stopped in its prefill (Esc before the first token) drew nothing: the message sent
    again is still the prompt's first reply, the one a fresh session writes (the seed as set), as
    the README promises; a stop after the first token counts as a draw."""
    s, fresh = _session(models), _session(models)
    _sampling(s), _sampling(fresh)
    convo = [{"role": "user", "content": "hi"}]
    stop = threading.Event()
    stop.set()  # Esc as the reply began: the prefill stops, no step runs
    events = list(s.stream_chat(convo, 16, stop))
    assert events[-1].finish_reason == "stopped" and not _toks(events)
    want = _toks(_run(fresh, convo, 16))
    assert _toks(_run(s, convo, 16)) == want
    assert _toks(_run(s, convo, 16)) != want  # a regenerate of a reply that came back: a new draw


def test_regenerate_when_greedy_is_the_same_reply(models) -> None:
    s = _session(models, "drafter", "sd")
    convo = [{"role": "user", "content": "hi"}]
    first = _run(s, convo, 20, stop_after=2)
    _run(s, convo + [{"role": "assistant", "content": _text(first)}], 8)
    want = _toks(_run(_session(models), convo, 20))
    assert _toks(_run(s, convo, 20)) == want == _toks(_run(s, convo, 20))


# ---- the plain-decoding baseline under a short context --------------------------------------------------------
@pytest.mark.parametrize("ctx", [16, 64, 80])
def test_the_baseline_measures_under_a_short_max_context(models, ctx) -> None:
    """``--max-context`` below the baseline's own prompt (68 tokens here; ~50 for SmolLM2 with its
    default system prompt): the app's baseline failed with "prompt is 68 tokens but the context
    holds 64 ...; shorten it", a prompt the user never wrote; at 80 it measured 12 tokens. The
    prompt is cut to leave the measure its room; the chat's own state is untouched."""
    s = _session(models, ctx=ctx)
    convo = [{"role": "user", "content": "hi"}]  # 21 tokens in this template
    before = _toks(_run(s, convo, 4)) if ctx > 32 else []
    history = list(s.decoder.history)
    b = s.measure_baseline(new_tokens=48)
    assert b.tokens_per_s > 0 and b.tokens == min(48, ctx - 1) and not b.stopped
    assert s.decoder.history == history
    if before:
        assert _toks(_run(s, convo, 4)) == before


# ---- the edges of a reply: every strategy's greedy reply is plain decoding's ------------------------------------
EDGE_STRATEGIES = [("none", "ar"), ("none", "pld"), ("none", "pld:auto"), ("drafter", "sd"), ("drafter", "sd:auto"),
                   ("target", "tree"), ("drafter", "hybrid"), ("target", "mab"), ("target", "optimal"), ("drafter", "ersd")]


@pytest.mark.parametrize("drafter, strategy", EDGE_STRATEGIES)
def test_reply_edges_are_plain_decodings(models, drafter, strategy) -> None:
    """No tokens asked (a step, nothing emitted, "length"), one token, an empty user message, EOS
    as the very first token (finish "eos", no text), and a reply that runs into the context's last
    row: each is what ``ar`` writes, and the session goes on after each."""
    ctx = 160
    s, ar = _session(models, drafter, strategy, ctx=ctx), _session(models, ctx=ctx)
    convo = [{"role": "system", "content": "sys"}, {"role": "user", "content": "hello"}]
    passes = []
    verify = s.decoder.target.verify
    s.decoder.target.verify = lambda *a, **k: passes.append(1) or verify(*a, **k)
    zero = _run(s, convo, 0)
    assert [e.emitted for e in zero] == [[]] and zero[-1].finish_reason == "length" and _text(zero) == ""
    assert passes == [] and zero[-1].drafted == 0  # no draft, no verify pass (it ran both, for nothing)
    del s.decoder.target.verify
    one = _run(s, convo, 1)
    assert _toks(one) == _toks(_run(ar, convo, 1)) and one[-1].finish_reason == "length"
    empty = [{"role": "user", "content": ""}]
    assert _toks(_run(s, empty, 12)) == _toks(_run(ar, empty, 12))
    s.decoder.eos_ids = ar.decoder.eos_ids = {_toks(one)[0]}  # the reply's first token ends it
    eos = _run(s, convo, 12)
    assert _toks(eos) == _toks(one) and eos[-1].finish_reason == "eos" and _text(eos) == ""
    s.decoder.eos_ids = ar.decoder.eos_ids = set()
    full = _run(s, convo, 10_000)
    want = _run(ar, convo, 10_000)
    assert _toks(full) == _toks(want) and full[-1].finish_reason == "context" == want[-1].finish_reason
    assert len(s.decoder.history) == ctx
    # the token limit landing on the context's last row: "context" (it said "length", for which the
    # app offers Continue, which then failed: the prompt no longer fits)
    exact = _run(s, convo, len(_toks(want)))
    assert _toks(exact) == _toks(want) and exact[-1].finish_reason == "context"
    convo2 = convo + [{"role": "assistant", "content": _text(full)}, {"role": "user", "content": "next"}]
    got = _run(s, convo2, 16)
    assert got[0].dropped_messages == 2 and _toks(got) == _toks(_run(ar, convo2, 16))


def test_a_prompt_alone_past_the_context_is_an_error_that_changes_nothing(models) -> None:
    """One message longer than the context: a ContextOverflowError naming both sizes; the cached
    conversation is untouched, and the next turn is what it would have been."""
    from engine.errors import ContextOverflowError

    s, fresh = _session(models, "drafter", "sd", ctx=120), _session(models, ctx=120)
    convo = [{"role": "user", "content": "hi"}]
    reply = _run(s, convo, 8)
    convo.append({"role": "assistant", "content": _text(reply)})
    history = list(s.decoder.history)
    with pytest.raises(ContextOverflowError, match="context holds 120"):
        list(s.stream_chat(convo + [{"role": "user", "content": "y" * 200}], 8, threading.Event()))
    assert s.decoder.history == history
    convo.append({"role": "user", "content": "short"})
    assert _toks(_run(s, convo, 8)) == _toks(_run(fresh, convo, 8))


# ---- each reply its own random stream ---------------------------------------------------------------------
def _seeds_used(s) -> list[int]:
    """The seeds of the strategies the session's replies decode with (spied on ``Decoder.steps``)."""
    seeds, steps = [], s.decoder.steps

    def spy(strategy, max_new_tokens, stop=None):
        get = strategy if callable(strategy) else (lambda: strategy)
        seeds.append(int(get().seed))
        return steps(strategy, max_new_tokens, stop)

    s.decoder.steps = spy
    return seeds


@pytest.mark.parametrize("drafter, strategy", [("none", "ar"), ("drafter", "sd"), ("drafter", "ersd")])
def test_each_prompt_draws_from_a_stream_of_its_own(models, drafter, strategy) -> None:
    """Sampling: every reply restarted the random stream at the strategy's seed, so each turn of a
    chat (and every chat) drew with the same numbers. Now the stream is the seed mixed with the
    prompt: each turn's differs, and the same seed and conversation still write the same reply (a
    fresh session's); greedy decoding is untouched (no draws)."""
    s = _session(models, drafter, strategy)
    _sampling(s, 11)
    seeds = _seeds_used(s)
    convo = [{"role": "user", "content": "hi"}]
    for turn in range(3):
        events = _run(s, convo, 10)
        fresh = _session(models, drafter, strategy)
        _sampling(fresh, 11)
        assert _toks(events) == _toks(_run(fresh, convo, 10)), turn  # reproducible
        convo += [{"role": "assistant", "content": _text(events)}, {"role": "user", "content": "again"}]
    assert len(set(seeds)) == 3, seeds
    s.strategy = s.strategy.replace(temperature=0.0)
    _run(s, convo, 4)
    assert seeds[-1] == 11  # greedy: the strategy as set


def test_a_sampled_chat_does_not_repeat_its_reply_every_turn(smollm2_gguf_path) -> None:
    """The daily symptom, on SmolLM2 at T = 1: "Pick a random number" and then "Pick another"
    five times wrote the very same reply six turns running ('100  # Since numB')."""
    from engine.session import ChatSession

    s = ChatSession.load(target=str(smollm2_gguf_path), drafter="none", strategy="ar", max_context=2048)
    s.strategy = s.strategy.replace(temperature=1.0, seed=3)
    convo = [{"role": "user", "content": "Pick a random number between 1 and 100. Answer with the number only."}]
    replies = []
    for _ in range(6):
        replies.append("".join(e.text for e in s.stream_chat(convo, 8, threading.Event())))
        convo += [{"role": "assistant", "content": replies[-1]},
                  {"role": "user", "content": "Pick another random number between 1 and 100. Number only."}]
    assert len(set(replies[1:])) > 1, replies
