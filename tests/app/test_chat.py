"""The chat TUI against fake engines: streaming, stop, live strategy switch, load failures."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from textual.pilot import Pilot

from app.keys import documented_keys
from app.main import SpecChatApp
from app.screens import ChatScreen, HelpScreen
from app.widgets import ChatMessage, PromptInput, StatusLine
from app.widgets.status import fit
from engine.strategy import preset

from .fakes import SAFETY_TIMEOUT_S, BlockingEngine, FailingEngine, FakeEngine

SIZE = (80, 24)
REPO = Path(__file__).resolve().parents[2]


# ---- helpers ------------------------------------------------------------------------------------
async def wait_for(pilot: Pilot, condition: Callable[[], object], timeout: float = 5.0) -> None:
    """Let the app run until ``condition()`` holds (engine threads advance in real time)."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {condition}")
        await pilot.pause(0.01)


def make_app(engine: object, **kwargs: object) -> SpecChatApp:
    return SpecChatApp(lambda: engine, **kwargs)  # type: ignore[arg-type, return-value]


async def ready(pilot: Pilot) -> SpecChatApp:
    app = pilot.app
    assert isinstance(app, SpecChatApp)
    await wait_for(pilot, lambda: app.session is not None or app.load_error is not None)
    await pilot.pause()
    return app


async def send(pilot: Pilot, text: str) -> None:
    prompt = pilot.app.query_one(PromptInput)
    prompt.text = text
    await pilot.press("enter")


async def reply_done(pilot: Pilot) -> None:
    app = pilot.app
    assert isinstance(app, SpecChatApp)
    await wait_for(pilot, lambda: not app.chat.busy)
    await pilot.pause()


def messages(app: SpecChatApp) -> list[ChatMessage]:
    return list(app.chat.query(ChatMessage))


def status(app: SpecChatApp) -> str:
    return "\n".join(app.chat.query_one(StatusLine).lines(width=80))


def notices(app: SpecChatApp) -> list[tuple[str, str]]:
    return [(n.message, n.severity) for n in app._notifications]


def screen_text(app: SpecChatApp) -> str:
    return "\n".join(strip.text for strip in app.screen._compositor.render_strips())


# ---- sending and streaming ----------------------------------------------------------------------
async def test_send_shows_reply_and_step_status() -> None:
    engine = FakeEngine(["Hello", " **world**", ", friend."])
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert "FakeLM-1M" in status(app) and "ready" in status(app)
        await send(pilot, "hi")
        await reply_done(pilot)

        user, reply = messages(app)
        assert (user.role, user.source) == ("user", "hi")
        assert (reply.role, reply.source) == ("assistant", "Hello **world**, friend.")
        assert "Hello world, friend." in screen_text(app)  # rendered Markdown, bold markers gone
        assert app.query_one(PromptInput).text == ""
        line = status(app)
        assert "step 3: drafted 5, accepted 3" in line
        assert "sd k=5 greedy T=0" in line
        assert "tok/s" in line and "4.00 tok/step" in line  # 4 emitted per step in the fake
        assert "done · eos" in line
        assert app.chat.conversation[-1] == {"role": "assistant", "content": "Hello **world**, friend."}
        assert engine.threads and all(name != threading.main_thread().name for name in engine.threads)


def record_markdown_writes(monkeypatch: pytest.MonkeyPatch) -> tuple[list[str], list[float]]:
    """The fragments appended to a streaming reply's Markdown and when (time.monotonic())."""
    writes: list[str] = []
    stamps: list[float] = []
    original = ChatMessage.append

    def recording_append(self: ChatMessage, fragment: str):
        stamps.append(time.monotonic())
        writes.append(fragment)
        return original(self, fragment)

    monkeypatch.setattr(ChatMessage, "append", recording_append)
    return writes, stamps


async def test_markdown_is_written_per_drain_not_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    writes, _ = record_markdown_writes(monkeypatch)
    script = [f"w{i} " for i in range(60)]
    engine = FakeEngine(script, step_delay_s=0.001)
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "count")
        await reply_done(pilot)
        assert messages(app)[-1].source == "".join(script)
        assert "".join(writes) == "".join(script)
        assert len(writes) < len(script) / 3, f"{len(writes)} Markdown writes for {len(script)} steps"


async def test_a_frame_updates_the_reply_the_dashboard_and_the_status_in_one_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """While a reply streams, each frame's Markdown append, dashboard repaint and status refresh
    happen inside one ``batch_update``, so Textual lays the screen out and renders it once for
    them (a MarkdownStream appended in a task of its own after the frame: ~2.7 renders a frame)."""
    from app.widgets import Dashboard

    batched: list[tuple[str, int]] = []
    append, paint = ChatMessage.append, Dashboard._paint

    def recording_append(self: ChatMessage, fragment: str):
        batched.append(("append", self.app._batch_count))
        return append(self, fragment)

    def recording_paint(self: Dashboard) -> None:
        if self.app.chat.busy:
            batched.append(("paint", self.app._batch_count))
        paint(self)

    monkeypatch.setattr(ChatMessage, "append", recording_append)
    monkeypatch.setattr(Dashboard, "_paint", recording_paint)
    script = [f"b{i} " for i in range(80)]
    app = make_app(FakeEngine(script, step_delay_s=0.004))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "go")
        await reply_done(pilot)
        assert messages(app)[-1].source == "".join(script)
    appends = [n for what, n in batched if what == "append"]
    paints = [n for what, n in batched if what == "paint"]
    assert len(appends) >= 2 and all(n > 0 for n in appends), batched
    assert paints and sum(n > 0 for n in paints) >= len(paints) - 2, batched  # (the reply's last paint is outside a frame)


async def test_markdown_writes_are_rate_limited_while_the_status_keeps_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each Markdown write re-lays-out the message column on the UI thread, which shares the cores
    with the decoder: the reply is written at most MARKDOWN_INTERVAL_S apart (plus the final
    flush), it still streams (more than one write), and everything arrives."""
    from app.screens import chat

    writes, stamps = record_markdown_writes(monkeypatch)
    script = [f"t{i} " for i in range(150)]
    engine = FakeEngine(script, step_delay_s=0.004)
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        t0 = time.monotonic()
        await send(pilot, "go")
        await reply_done(pilot)
        elapsed = time.monotonic() - t0
        assert messages(app)[-1].source == "".join(script)
        assert "".join(writes) == "".join(script)
        gaps = [b - a for a, b in zip(stamps, stamps[1:-1])]  # the last write is the final flush
        assert all(g >= chat.MARKDOWN_INTERVAL_S * 0.9 for g in gaps), gaps
        assert len(writes) <= elapsed / chat.MARKDOWN_INTERVAL_S + 2
        assert len(writes) >= 2  # it does stream: not one write at the end


async def test_multi_turn_sends_the_whole_conversation() -> None:
    engine = FakeEngine(["Sure", "."])
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "first")
        await reply_done(pilot)
        await send(pilot, "second")
        await reply_done(pilot)
        assert engine.calls == [
            [{"role": "user", "content": "first"}],
            [
                {"role": "user", "content": "first"},
                {"role": "assistant", "content": "Sure."},
                {"role": "user", "content": "second"},
            ],
        ]
        assert [m.role for m in messages(app)] == ["user", "assistant", "user", "assistant"]


async def test_shift_enter_fallback_inserts_newline_and_enter_sends_all() -> None:
    engine = FakeEngine(["ok"])
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("a", "ctrl+j", "b")
        assert app.query_one(PromptInput).text == "a\nb"
        assert engine.calls == []
        await pilot.press("enter")
        await reply_done(pilot)
        assert engine.calls[0] == [{"role": "user", "content": "a\nb"}]
        assert messages(app)[0].source == "a  \nb"  # shown with its line break kept


async def test_a_reply_keeps_its_line_breaks_on_screen() -> None:
    """A reply's single newlines are line breaks on screen (a list the model wrote one item a line
    ran into one paragraph before), streamed and finished; a code block keeps its lines as written."""
    engine = FakeEngine(["01: Monday\n02: Tuesday\n\n", "```\nx = 1\ny = 2\n```"])
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "days")
        await reply_done(pilot)
        lines = [line.strip("▌▎▊ ") for line in screen_text(app).splitlines()]
        assert any(line.endswith("01: Monday") for line in lines), "\n".join(lines)
        assert any(line.startswith("02: Tuesday") for line in lines)
        assert any(line.startswith("y = 2") for line in lines)


async def test_a_session_loaded_without_its_drafter_or_datastore_says_so() -> None:
    engine = FakeEngine()
    engine.drafter_error = "the paired drafter 'd' was not loaded: model 'd': its local file 'x' is missing"
    engine.datastore_error = "datastore x.npz: damaged"
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        shown = notices(app)
        assert (engine.drafter_error + "; decoding without it", "warning") in shown
        assert (engine.datastore_error + "; pld:auto drafts by prompt lookup alone", "warning") in shown


async def test_a_reply_cut_inside_a_character_is_saved_without_its_replacement_mark() -> None:
    engine = FakeEngine(["שלום ", "ר\ufffd"], finish_reason="length")
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "translate")
        await reply_done(pilot)
        assert app.chat.conversation[-1]["content"] == "שלום ר"
        assert "\ufffd" not in messages(app)[-1].source


async def test_empty_message_is_ignored_with_a_notice() -> None:
    engine = FakeEngine()
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await pilot.press("enter")
        await send(pilot, "  \n  ")
        assert engine.calls == [] and messages(app) == [] and not app.chat.busy
        assert notices(app).count(("Type a message first.", "information")) == 2
        await send(pilot, "still works")
        await reply_done(pilot)
        assert len(engine.calls) == 1


# ---- stopping -----------------------------------------------------------------------------------
async def test_escape_stops_and_keeps_partial_reply() -> None:
    engine = BlockingEngine(["Partial", " answer"])
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "tell me everything")
        await wait_for(pilot, lambda: engine.blocking.is_set() and "answer" in messages(app)[-1].source)
        assert app.chat.busy and "generating" in status(app)
        await pilot.press("escape")
        await reply_done(pilot)

        reply = messages(app)[-1]
        assert reply.source.startswith("Partial answer") and reply.source.endswith("*(stopped)*")
        assert reply.has_class("-stopped")
        assert "(stopped)" in screen_text(app)
        assert "stopped" in status(app).splitlines()[1]
        assert app.chat.conversation[-1] == {"role": "assistant", "content": "Partial answer"}


async def test_escape_before_the_first_token_puts_the_message_back_in_the_prompt() -> None:
    """Stopped with nothing back: no empty reply stays in the chat (it would be sent to the model as
    the assistant's turn next time) and the user's message goes back into the prompt, as when a
    reply fails; the next send is a clean first turn."""
    engine = BlockingEngine([])
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "a long question")
        await wait_for(pilot, lambda: engine.blocking.is_set())
        await pilot.press("escape")
        await reply_done(pilot)
        assert messages(app) == [] and app.chat.conversation == []
        assert app.query_one(PromptInput).text == "a long question"
        assert ("Stopped before the first token: your message is back in the prompt.", "information") in notices(app)
        assert "stopped" in status(app).splitlines()[1]
        chat_id = app.chat.chat_id
        assert chat_id is None or app.chat.store.messages(chat_id) == []
        await pilot.press("enter")  # sent again as it was
        await wait_for(pilot, lambda: len(engine.calls) == 2)
        assert engine.calls[-1] == [{"role": "user", "content": "a long question"}]
        await pilot.press("escape")
        await reply_done(pilot)


class ErrorBeforeFirstToken(FakeEngine):
    """Fails before its first step, once ``gate`` lets it (a long prompt's prefill running out of memory)."""

    def stream_chat(self, messages, max_new_tokens, stop):  # noqa: ANN001, ANN201 - FakeEngine's
        self.calls.append(list(messages))
        assert self.gate is not None and self.gate.acquire(timeout=SAFETY_TIMEOUT_S)
        raise RuntimeError("out of memory [/] while reading the prompt")
        yield  # a generator, as the engine's is


@pytest.mark.parametrize("how", ["escape", "error"])
async def test_a_message_answered_with_nothing_goes_back_above_the_draft_typed_meanwhile(how: str) -> None:
    """Esc (or an engine error) before the first token while a follow-up was being typed: the
    message goes back into the prompt above that draft, a blank line between them, and the notice
    says where it is (it used to be dropped whenever the prompt was not empty, though the notice
    said it was back in the prompt); the draft's cursor stays where it was."""
    gate = threading.Semaphore(0)
    engine = BlockingEngine([]) if how == "escape" else ErrorBeforeFirstToken(gate=gate)
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await send(pilot, "my long question")
        await wait_for(pilot, lambda: engine.calls and app.chat.busy)
        prompt = app.query_one(PromptInput)
        prompt.text = "a follow-up I am typing"
        prompt.move_cursor((0, 2))
        if how == "escape":
            await wait_for(pilot, lambda: engine.blocking.is_set())
            await pilot.press("escape")
        else:
            gate.release()
        await reply_done(pilot)
        assert prompt.text == "my long question\n\na follow-up I am typing"
        assert prompt.cursor_location == (2, 2)
        assert messages(app) == [] and app.chat.conversation == []
        if how == "escape":
            assert ("Stopped before the first token: your message is back in the prompt, above what you were typing.",
                    "information") in notices(app)
        else:  # the engine's own text, shown as it is (read as markup, "[/]" raised)
            assert ("Generation failed: out of memory [/] while reading the prompt", "error") in notices(app)
            await pilot.pause(0.2)


async def test_the_status_says_the_prompt_is_being_read_until_the_first_step() -> None:
    """From Enter until the first step arrives (the prompt's prefill: seconds for a long one) the
    status says so; then it says generating."""
    gate = threading.Semaphore(0)
    engine = FakeEngine(["one", " two"], gate=gate, step_delay_s=0.0)
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await pilot.pause(0.4)
        assert "reading the prompt" in status(app) and messages(app)[-1].source == ""
        gate.release(1)
        await wait_for(pilot, lambda: "generating" in status(app))
        gate.release(1)
        await reply_done(pilot)
        assert "done" in status(app)


async def test_page_keys_scroll_the_conversation_from_the_prompt() -> None:
    """The prompt keeps the focus, so PageUp/PageDown scroll the messages: up lets go of a
    streaming reply's bottom (new text no longer moves the view), down back to the bottom follows
    it again; the prompt keeps the focus and its text."""
    from app.widgets import MessageList

    gate = threading.Semaphore(0)
    engine = FakeEngine([f"line {i}\n\n" for i in range(60)], gate=gate, step_delay_s=0.0)
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "many lines please")
        gate.release(40)
        await wait_for(pilot, lambda: "line 39" in messages(app)[-1].source)
        await pilot.pause(0.3)
        column = app.chat.query_one(MessageList)
        assert column.max_scroll_y > 0 and column.scroll_y == column.max_scroll_y
        box = app.query_one(PromptInput)
        box.text = "draft"
        await pilot.press("pageup")
        await pilot.pause()
        held = column.scroll_y
        assert held < column.max_scroll_y and app.focused is box and box.text == "draft"
        gate.release(10)
        await wait_for(pilot, lambda: "line 49" in messages(app)[-1].source)
        await pilot.pause(0.3)
        assert column.scroll_y == held  # the user is reading: the reply does not pull the view down
        for _ in range(40):
            await pilot.press("pagedown")
        await pilot.pause()
        assert column.scroll_y == column.max_scroll_y
        gate.release(10)
        await reply_done(pilot)
        await pilot.pause(0.3)
        assert column.scroll_y == column.max_scroll_y  # following the reply again


async def test_up_in_a_wrapped_line_moves_the_cursor_not_the_history() -> None:
    """A one-line message wrapped over several rows: Up from a lower row moves up a row (the text
    stays); from the first row it recalls the previous prompt. Down likewise from the last row."""
    engine = FakeEngine(["ok"])
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "an earlier prompt")
        await reply_done(pilot)
        box = app.query_one(PromptInput)
        long = "word " * 40  # ~200 characters: 3+ rows at 80 columns
        box.text = long
        box.move_cursor(box.document.end)
        await pilot.pause()
        assert box.wrapped_document.height >= 3
        await pilot.press("up")
        assert box.text == long and box.wrapped_document.location_to_offset(box.cursor_location).y >= 1
        while box.wrapped_document.location_to_offset(box.cursor_location).y > 0:
            await pilot.press("up")
        assert box.text == long
        await pilot.press("up")
        assert box.text == "an earlier prompt"
        await pilot.press("down")
        assert box.text == long  # back to what was being typed


async def test_quitting_mid_reply_stops_the_engine_thread() -> None:
    engine = BlockingEngine(["..."])
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "one")
        await wait_for(pilot, engine.blocking.is_set)
        await pilot.press("ctrl+q")
    assert engine.released.wait(2), "the engine never saw the stop flag after quit"


async def test_message_sent_while_replying_is_refused() -> None:
    engine = BlockingEngine(["..."])
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await send(pilot, "one")
        await wait_for(pilot, engine.blocking.is_set)
        await send(pilot, "two")
        assert any("still running" in m and sev == "warning" for m, sev in notices(app))
        assert app.query_one(PromptInput).text == "two"  # kept for later
        assert len(engine.calls) == 1 and len(messages(app)) == 2
        await pilot.press("escape")
        await reply_done(pilot)


class SlowToStop(BlockingEngine):
    """The first reply: ``script``, then it blocks until stopped, and once stopped it still takes
    until ``ended`` is set to end (a step, or a prefill piece, in flight when Esc came); the later
    replies are FakeEngine's."""

    def __init__(self, script: list[str], **kwargs: object) -> None:
        super().__init__(script, **kwargs)  # type: ignore[arg-type]
        self.ended = threading.Event()

    def stream_chat(self, messages, max_new_tokens, stop):  # noqa: ANN001, ANN201 - FakeEngine's
        if self.calls:
            yield from FakeEngine.stream_chat(self, messages, max_new_tokens, stop)
            return
        self.calls.append([dict(m) for m in messages])
        for i, chunk in enumerate(self.script, start=1):
            yield self._event(i, chunk, self.strategy, False, None)
        self.blocking.set()
        stop.wait(SAFETY_TIMEOUT_S)
        self.ended.wait(SAFETY_TIMEOUT_S)
        yield self._event(len(self.script) + 1, "", self.strategy, True, "stopped")


@pytest.mark.parametrize("first_token", [True, False])
async def test_enter_right_after_escape_sends_once_the_reply_has_stopped(first_token: bool) -> None:
    """Esc, then Enter before the reply has ended (its last step, or prefill piece, still running):
    the message goes as soon as the reply has stopped. It was refused with "press Esc to stop it",
    the key just pressed, and Enter had to be pressed again; a new chat (Ctrl+N) in that moment is
    told the reply is stopping. A reply stopped before its first token gives its message back
    into the prompt, above the one typed: nothing is sent then (the notice says where it is)."""
    engine = SlowToStop(["Partial", " answer"] if first_token else [])
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await send(pilot, "one")
        await wait_for(pilot, engine.blocking.is_set)
        await pilot.press("escape")
        await pilot.press("ctrl+n")
        await send(pilot, "two")
        assert ("The reply is stopping: try again in a moment.", "warning") in notices(app)
        assert ("The reply is stopping: your message goes as soon as it has stopped.", "information") in notices(app)
        assert not any("press Esc to stop it" in m for m, _ in notices(app))
        assert app.query_one(PromptInput).text == "two" and len(engine.calls) == 1
        engine.script = ["Sure", "."]
        engine.ended.set()
        if first_token:
            await wait_for(pilot, lambda: len(engine.calls) == 2)
            await reply_done(pilot)
            assert engine.calls[-1] == [{"role": "user", "content": "one"}, {"role": "assistant", "content": "Partial answer"},
                                        {"role": "user", "content": "two"}]
            assert [m["content"] for m in app.chat.conversation] == ["one", "Partial answer", "two", "Sure."]
            assert app.query_one(PromptInput).text == ""
        else:
            await reply_done(pilot)
            await pilot.pause(0.3)
            assert len(engine.calls) == 1 and app.chat.conversation == []
            assert app.query_one(PromptInput).text == "one\n\ntwo"


# ---- live strategy switching --------------------------------------------------------------------
async def test_ctrl_s_switches_strategy_between_steps_of_a_reply() -> None:
    gate = threading.Semaphore(0)
    engine = FakeEngine([f"t{i} " for i in range(6)], gate=gate)
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "go")
        gate.release(2)
        await wait_for(pilot, lambda: engine.steps_done == 2)  # the loop now waits before step 3
        await pilot.press("ctrl+s")
        assert engine.strategy == preset("tree")
        assert "tree tree=3,2,2,1,1 greedy T=0" in status(app)  # shown at once, mid-reply
        assert app.chat.busy
        gate.release(1)
        await wait_for(pilot, lambda: engine.steps_done == 3)
        await pilot.press("f1")  # help on top: the reply keeps streaming, F2 still switches
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("f2")
        assert engine.strategy.name == "mab" and "mab greedy T=0" in status(app)
        gate.release(3)
        await reply_done(pilot)
        await pilot.press("escape")
        assert isinstance(app.screen, ChatScreen)
        assert engine.seen_strategies == ["sd", "sd", "tree", "mab", "mab", "mab"]
        assert messages(app)[-1].source == "t0 t1 t2 t3 t4 t5 "  # one reply, never restarted
        assert len(engine.calls) == 1


async def test_a_full_cycle_comes_back_to_the_cost_aware_default() -> None:
    """Ctrl+S through every preset from pld:auto (the default) comes back to pld:auto: the presets
    without a draft length (tree, mab, optimal, ersd) kept the cycle's auto lengths (it came back as
    a fixed pld k=8, and hybrid as hybrid k=3); from a fixed-length pld the cycle stays fixed."""
    from engine.strategy import CYCLE, from_spec

    engine = FakeEngine(strategy=from_spec("pld:auto"))
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        seen = []
        for _ in CYCLE:
            await pilot.press("ctrl+s")
            seen.append(engine.strategy)
        assert seen[-1] == from_spec("pld:auto")
        assert next(s for s in seen if s.name == "hybrid").adaptive and next(s for s in seen if s.name == "sd").adaptive
        engine.strategy = preset("pld")
        for _ in CYCLE:
            await pilot.press("ctrl+s")
        assert engine.strategy == preset("pld") and not engine.strategy.adaptive


async def test_cycle_skips_presets_that_need_a_drafter_and_keeps_temperature() -> None:
    engine = FakeEngine(has_drafter=False, strategy=preset("pld", temperature=0.7))
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+s")
        # ersd is lossless with any drafter: without a drafter model it races n-gram drafts
        assert engine.strategy == preset("ersd", temperature=0.7, drafter="ngram")
        assert "ersd k=5 ngram race T=0.7" in status(app)
        text = "\n".join(m for m, _ in notices(app))
        assert "skipped sd, tree, mab, optimal: a drafter model is needed (Ctrl+O" in text  # one line, the app's advice
        assert "--drafter" not in text
        await pilot.press("ctrl+s")
        assert engine.strategy == preset("ar", temperature=0.7)
        assert "ar sample T=0.7" in status(app)
        await pilot.press("ctrl+s")
        assert engine.strategy == preset("pld", temperature=0.7)


async def test_cycle_notice_names_the_model_pickers_key_from_the_keymap(tmp_path: Path) -> None:
    """The advice for the skipped presets names the key the user's keymap gives the model picker
    (one notice for all of them, no command-line flag)."""
    keymap = tmp_path / "keymap.toml"
    keymap.write_text('models = "f9"\n')
    engine = FakeEngine(has_drafter=False, strategy=preset("pld"))
    app = make_app(engine, keymap_file=str(keymap))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+s")
        skipped = [m for m, _ in notices(app) if "skipped" in m]
        assert skipped == ["skipped sd, tree, mab, optimal: a drafter model is needed (F9 picks a target with its drafter)"]



async def test_initial_strategy_is_applied_or_refused_with_a_notice() -> None:
    engine = FakeEngine()
    app = make_app(engine, initial_strategy=preset("tree"))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert engine.strategy == preset("tree") and "tree tree=" in status(app)

    engine = FakeEngine(has_drafter=False, strategy=preset("pld"))
    app = make_app(engine, initial_strategy=preset("sd"))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        assert engine.strategy == preset("pld")
        assert any("needs a drafter model" in m for m, _ in notices(app))


# ---- loading and failures -----------------------------------------------------------------------
async def test_status_says_loading_until_the_factory_returns() -> None:
    release = threading.Event()
    engine = FakeEngine(["ok"])

    def slow_factory() -> FakeEngine:
        release.wait(5)
        return engine

    app = SpecChatApp(slow_factory)  # type: ignore[arg-type]
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.pause()
        assert "Loading model…" in status(app)
        assert "Loading model…" in screen_text(app)  # the UI is up while the model loads
        await send(pilot, "early")
        assert any("still loading" in m for m, _ in notices(app)) and engine.calls == []
        release.set()
        await ready(pilot)
        assert "FakeLM-1M" in status(app)
        await send(pilot, "now")
        await reply_done(pilot)
        assert messages(app)[-1].source == "ok"


async def test_the_palettes_measure_says_when_there_is_nothing_to_measure() -> None:
    """The palette's "Measure plain-decoding baseline" while the model loads (or after its load
    failed): it said "Measuring plain decoding (ar)…" and measured nothing; it says why not now."""
    release = threading.Event()

    def slow_factory() -> FakeEngine:
        release.wait(SAFETY_TIMEOUT_S)
        return FakeEngine(["ok"])

    app = SpecChatApp(slow_factory)  # type: ignore[arg-type]
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pilot.pause()
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"Measure plain")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause()
        assert ("No model loaded yet: nothing to measure.", "warning") in notices(app)
        assert not any(m.startswith("Measuring") for m, _ in notices(app))
        release.set()
        await ready(pilot)


async def test_factory_error_shows_a_toast_and_the_app_stays_usable() -> None:
    def broken_factory() -> FakeEngine:
        raise FileNotFoundError("no model named 'nope' in models.toml")

    app = SpecChatApp(broken_factory)  # type: ignore[arg-type]
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        assert app.session is None
        assert ("no model named 'nope' in models.toml", "error") in notices(app)
        assert "No model loaded" in status(app)
        await send(pilot, "hello?")
        assert any(m.startswith("No model loaded: no model named") for m, _ in notices(app))
        assert messages(app) == []
        await pilot.press("ctrl+s")
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        assert isinstance(app.screen, ChatScreen) and app.is_running


async def test_engine_error_mid_reply_keeps_partial_text_and_app_usable() -> None:
    engine = FailingEngine()
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await send(pilot, "try")
        await reply_done(pilot)
        reply = messages(app)[-1]
        assert reply.source.startswith("Half a") and reply.has_class("-error")
        assert ("Generation failed: device out of memory", "error") in notices(app)
        assert "error" in status(app)
        engine.script = ["fine"]
        await send(pilot, "again")
        await reply_done(pilot)
        assert len(engine.calls) == 2


async def test_context_full_is_announced() -> None:
    engine = FakeEngine(["It is"], finish_reason="context")
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await send(pilot, "long chat")
        await reply_done(pilot)
        assert "context full" in status(app)
        assert any(m.startswith("Context full") and sev == "warning" for m, sev in notices(app))


# ---- keys, layout, the torch-free rule ----------------------------------------------------------
async def test_help_lists_every_key_binding() -> None:
    bound = {key.strip() for binding in (*SpecChatApp.BINDINGS, *ChatScreen.BINDINGS)
             for key in binding.key.split(",")}  # type: ignore[union-attr]
    assert bound <= documented_keys()
    app = make_app(FakeEngine())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen)
        text = screen_text(app)
        for shown in ("Ctrl+S / F2", "Esc", "Shift+Enter / Ctrl+J", "Ctrl+Q", "F1"):
            assert shown in text
        await pilot.press("escape")
        assert isinstance(app.screen, ChatScreen)


def test_status_fit_keeps_the_right_column() -> None:
    assert fit("model", "sd", 10) == "model   sd"
    assert fit("a very long model name", "sd k=5", 16) == "a very l… sd k=5"
    assert len(fit("x" * 200, "right", 80)) == 80
    # the step line loses whole parts, never half a number
    step = "step 12: drafted 5, accepted 3 · 26.2 tok/s · 3.10 tok/step"
    line = fit(step, "editing", 60, parts=" · ")
    assert line.startswith("step 12: drafted 5, accepted 3 · 26.2 tok/s … ") and line.endswith(" editing") and len(line) == 60
    assert fit(step, "editing", 30, parts=" · ") == " " * 22 + " editing"
    assert fit(step, "done", 80, parts=" · ") == step.ljust(75) + " done"


def test_app_never_imports_torch() -> None:
    code = "import sys, app.main; sys.exit(1 if 'torch' in sys.modules else 0)"
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr or "app.main imported torch"


async def test_the_app_quits_when_its_terminal_goes_away(monkeypatch) -> None:
    """A hung-up terminal (window closed, `make chat`'s make holding the SIGHUP): the app quits,
    stopping the reply in flight, instead of running on unseen."""
    import app.main as main

    alive = {"tty": True}
    monkeypatch.setattr(main, "terminal_fd", lambda: 99)
    monkeypatch.setattr(main, "terminal_alive", lambda fd: fd == 99 and alive["tty"])
    monkeypatch.setattr(main, "TERMINAL_CHECK_S", 0.05)
    engine = BlockingEngine(["..."])
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "one")
        await wait_for(pilot, engine.blocking.is_set)
        await pilot.pause(0.2)
        assert app.is_running  # the terminal is there: nothing happens
        alive["tty"] = False
        await wait_for(pilot, lambda: not app.is_running)
    assert engine.released.wait(2), "the engine never saw the stop flag after the terminal went away"


class _Cycle:
    """An object in a reference cycle: only the garbage collector frees it."""

    def __init__(self) -> None:
        self.me = self


async def test_a_loaded_session_is_frozen_out_of_the_collector_and_a_switch_unfreezes_it() -> None:
    """The loaded engine is moved out of the collector's full collections (app.main.freeze_heap);
    the next freeze (a model switch) unfreezes first, so cyclic garbage of the previous session
    is still collected."""
    import gc
    import weakref

    from app.main import freeze_heap

    try:
        app = make_app(FakeEngine(["ok"]))
        async with app.run_test(size=SIZE) as pilot:
            await ready(pilot)
            await pilot.pause()
            assert gc.get_freeze_count() > 0
        old = _Cycle()
        ref = weakref.ref(old)
        freeze_heap()  # `old` is alive: frozen with the rest
        del old
        gc.collect()
        assert ref() is not None, "a frozen cycle is out of the collector's reach"
        freeze_heap()  # the next session's freeze: unfreeze, collect, freeze
        assert ref() is None, "the previous session's cyclic garbage was never collected"
    finally:
        gc.unfreeze()


async def test_palette_screenshot_saves_without_a_downloads_folder(tmp_path, monkeypatch) -> None:
    """The palette's Screenshot went to ~/Downloads and failed where there is none (servers,
    containers): it now saves into the current directory there, and into Downloads where it exists."""
    import app.main as main_mod

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_DOWNLOAD_DIR", str(home / "Downloads"))
    monkeypatch.chdir(tmp_path)
    assert main_mod.screenshot_dir() == tmp_path
    app = make_app(FakeEngine(["Hello"]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        app.action_screenshot()
        # the driver writes the file after the notice is queued: wait for the whole SVG
        await wait_for(pilot, lambda: any("</svg>" in f.read_text() for f in tmp_path.glob("*.svg")))
        assert next(tmp_path.glob("*.svg")).read_text().lstrip().startswith("<svg")
    (home / "Downloads").mkdir()
    assert main_mod.screenshot_dir() == home / "Downloads"
