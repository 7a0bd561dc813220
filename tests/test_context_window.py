"""A chat longer than the model's context: the oldest turns are left out (engine.session.fit_to_context).

The window's cuts must (1) fit the prompt and a reply's room, (2) keep the system messages and the
last user turn, (3) start at a user turn, and (4) move only when the conversation no longer fits,
so consecutive turns share their prompt's prefix (the cached prefix is reused, no re-prefill).
The end-to-end test chats past SmolLM2's (shortened) context and checks every reply is what plain
greedy decoding writes for the windowed prompt.
"""

from __future__ import annotations

import random
import threading

import pytest

from engine.session import DROP_FRACTION, MESSAGE_OVERHEAD, fit_to_context, reply_reserve


def encode(messages: list[dict[str, str]]) -> list[int]:
    """A stand-in chat template: a header token per message, its words, an end token; then the reply's header."""
    ids: list[int] = []
    for m in messages:
        ids += [{"system": 1, "user": 2, "assistant": 3}[m["role"]]] + [10 + len(w) for w in m["content"].split()] + [4]
    return ids + [3]


def count(text: str) -> int:
    return len(text.split())


def msg(role: str, words: int) -> dict[str, str]:
    return {"role": role, "content": " ".join(["w"] * words)}


def starts_with(ids: list[int], prefix: list[int]) -> bool:
    return ids[: len(prefix)] == prefix


def test_a_conversation_that_fits_is_untouched() -> None:
    convo = [msg("system", 5), msg("user", 10), msg("assistant", 20), msg("user", 3)]
    ids, dropped = fit_to_context(convo, encode, count, 100, 30)
    assert (ids, dropped) == (encode(convo), 0)


def test_the_oldest_turns_go_first_and_the_system_message_stays() -> None:
    convo = [msg("system", 5)]
    for _ in range(6):
        convo += [msg("user", 10), msg("assistant", 30)]
    convo.append(msg("user", 8))
    context, reserve = 120, 30
    ids, dropped = fit_to_context(convo, encode, count, context, reserve)
    assert dropped > 0 and dropped % 2 == 0  # whole turns: the window starts at a user message
    window = [convo[0]] + convo[1 + dropped:]
    assert ids == encode(window) and len(ids) + reserve <= context
    assert window[1]["role"] == "user" and window[-1] is convo[-1]
    # at least a third of the context's tokens go at each cut, not one turn at a time
    gone = sum(count(m["content"]) + MESSAGE_OVERHEAD for m in convo[1:1 + dropped])
    assert gone >= context // DROP_FRACTION


def test_no_system_message_and_a_last_turn_too_long_for_any_window() -> None:
    convo = [msg("user", 10), msg("assistant", 10), msg("user", 500)]
    ids, dropped = fit_to_context(convo, encode, count, 100, 20)
    assert dropped == 2 and ids == encode(convo[2:])  # everything else left out; still too long
    assert len(ids) > 100  # Decoder.start refuses it with its one-line context error
    only = [msg("user", 500)]
    assert fit_to_context(only, encode, count, 100, 20) == (encode(only), 0)


def test_a_long_pasted_message_stays_in_view_for_the_questions_after_it() -> None:
    """Short turns, then a document of most of a context, then follow-ups: the window keeps the
    document while it fits (it does not jump past it to the last question), and the follow-ups
    share their prefix."""
    context, reserve = 400, 40
    convo = [msg("system", 5)]
    for _ in range(4):
        convo += [msg("user", 20), msg("assistant", 20)]
    convo.append(msg("user", 200))  # the document
    ids, dropped = fit_to_context(convo, encode, count, context, reserve)
    assert dropped == 8 and len(ids) + reserve <= context  # the turns before it could not stay beside it
    doc = convo[-1]
    prev = ids
    for _ in range(3):
        convo += [msg("assistant", 10), msg("user", 5)]
        ids, dropped = fit_to_context(convo, encode, count, context, reserve)
        window = convo[1 + dropped:]
        assert any(m is doc for m in window), dropped  # still in view
        assert len(ids) + reserve <= context and starts_with(ids, prev[:-1])
        prev = ids


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_growing_chat_keeps_its_prefix_between_cuts(seed: int) -> None:
    """Forty turns of random lengths through a 400-token context: every prompt fits with the reply's
    room; the window only moves forward; between cuts each prompt extends the previous one (the
    decoder reuses its cache); there are only as many cuts as the tokens dropped allow."""
    rng = random.Random(seed)  # now and then a message of half a context
    context = 400
    reserve = reply_reserve(60, context)
    convo = [msg("system", 12)]
    prev_ids: list[int] = []
    prev_dropped, cuts, total = 0, 0, 0
    for _ in range(40):
        convo.append(msg("user", rng.choice([rng.randint(3, 40)] * 5 + [rng.randint(100, 200)])))
        ids, dropped = fit_to_context(convo, encode, count, context, reserve)
        assert len(ids) + reserve <= context
        assert dropped >= prev_dropped and dropped % 2 == 0
        if dropped == prev_dropped:
            assert starts_with(ids, prev_ids[:-1])  # the previous prompt (less its reply header) is a prefix
        else:
            cuts += 1
            assert starts_with(ids, encode(convo[:1])[:-1])  # only the system message is shared
        reply = rng.randint(5, 60)
        total += reply + count(convo[-1]["content"]) + 2 * MESSAGE_OVERHEAD
        convo.append(msg("assistant", reply))
        prev_ids, prev_dropped = ids, dropped
    assert cuts >= 2 and cuts <= total // (context // DROP_FRACTION) + 1


@pytest.fixture(scope="module")
def smollm2(smollm2_gguf_path):
    """SmolLM2 (fp32, pld:auto with its datastore) with a 320-token context, shared by this module's
    engine tests (each turn reuses whatever prefix is cached, as the app's turns do)."""
    from engine.session import ChatSession

    return ChatSession.load(dtype="fp32", max_context=320, drafter="none")


def test_a_chat_past_the_context_goes_on_and_stays_lossless(smollm2) -> None:
    """SmolLM2 with a 320-token context: a chat of short turns passes it; the engine leaves the
    oldest turns out (the first event says how many), every reply is plain greedy decoding's for
    the windowed prompt, and a turn after a cut prefills only its new tokens."""
    from engine.generate import Decoder, run_generation
    from engine.strategy import preset

    s = smollm2
    assert (s.strategy.name, s.strategy.adaptive) == ("pld", True)
    ref = Decoder(s.target.model.with_own_cache(), eos_ids=set(s.tokenizer.eos_ids))
    questions = [f"Describe {x} in two sentences." for x in ("a colour", "a fruit", "an animal", "a city",
                                                              "a tree", "a sport", "a tool", "a river")]
    convo = [{"role": "system", "content": "You are a helpful assistant."}]
    seen_dropped, reused_after_cut = [], False
    for q in questions:
        convo.append({"role": "user", "content": q})
        ids, dropped = s.fit_chat(convo, 40)
        assert len(ids) + reply_reserve(40, 320) <= 320
        events = list(s.stream_chat(convo, 40, threading.Event()))
        assert events[0].dropped_messages == dropped
        assert events[-1].finish_reason in ("eos", "length")
        got = [t for e in events for t in e.emitted]
        want = [t for e in run_generation(ref, ids, preset("ar"), 40)[0] for t in e.emitted]
        assert got == want, q
        if seen_dropped and dropped == seen_dropped[-1] > 0:
            reused_after_cut = reused_after_cut or events[0].prefill_tokens < len(ids) // 2
        seen_dropped.append(dropped)
        convo.append({"role": "assistant", "content": "".join(e.text for e in events)})
    assert seen_dropped[0] == 0 and max(seen_dropped) > 0, seen_dropped
    assert reused_after_cut, seen_dropped


def test_a_reply_cut_by_the_token_limit_continues_as_if_never_cut(smollm2) -> None:
    """A conversation ending with an assistant message continues that reply: 24 tokens, then 24
    more from the cut text, are the 48 tokens of one uninterrupted greedy reply (pld:auto, fp32)."""
    s = smollm2
    convo = [{"role": "user", "content": "Explain in a few sentences why the sky is blue."}]
    whole = list(s.stream_chat(convo, 48, threading.Event()))
    assert whole[-1].finish_reason == "length"
    first = list(s.stream_chat(convo, 24, threading.Event()))
    assert first[-1].finish_reason == "length"
    cut = "".join(e.text for e in first)
    more = list(s.stream_chat(convo + [{"role": "assistant", "content": cut}], 24, threading.Event()))
    assert more[0].prefill_tokens < 8  # the cut reply's ids are still cached: no re-reading
    got = [t for e in first + more for t in e.emitted]
    assert got == [t for e in whole for t in e.emitted]
    assert cut + "".join(e.text for e in more) == "".join(e.text for e in whole)


def test_continuing_a_reply_cut_inside_a_character(smollm2) -> None:
    """A reply cut between the byte tokens of one character ends with U+FFFD: the continuation's
    prompt stops before that character (the cached ids where they match, else the text encoded),
    so the model writes the whole character again; a reply with no user message before it is refused."""
    from engine.errors import SpecchatError
    from engine.session import chat_ids

    s, tok = smollm2, smollm2.tokenizer
    user = [{"role": "user", "content": "Say Japan in Japanese."}]
    head = tok.encode(tok.apply_chat_template(user, add_generation_prompt=True), add_special_tokens=False)
    word = tok.encode("Japan: 日本語", add_special_tokens=False)  # 語 is three byte tokens
    cut = max(n for n in range(1, len(word)) if tok.decode(word[:n]).endswith("\ufffd"))
    shown = tok.decode(word[:cut])  # what the app saved: the cut character as U+FFFD
    whole = next(n for n in range(cut, 0, -1) if "\ufffd" not in tok.decode(word[:n]))
    convo = user + [{"role": "assistant", "content": shown}]
    s.decoder.history = head + word[:cut]  # the cache holds the model's own ids of the cut reply
    assert s.encode_chat(convo) == head + word[:whole]
    s.decoder.history = []  # nothing cached: the text, less the cut character, encoded
    assert s.encode_chat(convo) == chat_ids(tok, convo) == head + tok.encode(shown.rstrip("\ufffd"), add_special_tokens=False)
    with pytest.raises(SpecchatError, match="nothing to continue"):
        s.encode_chat([{"role": "system", "content": "x"}, {"role": "assistant", "content": "y"}])
