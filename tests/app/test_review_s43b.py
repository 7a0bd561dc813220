"""Session 43b's review of the chat app as a daily user: a model switch the status line did not
show, Ctrl+C mid-reply, a regenerate the context refused."""

from __future__ import annotations

from pathlib import Path

from app.screens.chat import TOO_LONG_NOTICE

from .fakes import BlockingEngine, FakeEngine
from .test_chat import make_app, messages, notices, ready, reply_done, send, status, wait_for
from .test_chat_features import chat
from .test_models_screen import LoaderPerTarget, fake, models_file, open_picker, pick, send_refused  # noqa: F401 (fixtures)
from .test_models_screen import make_app as make_models_app

SIZE = (80, 24)


# ---- a model switch: the status line says it loads, a notice says when it is ready ----------------
async def test_the_status_line_shows_a_picked_model_loading_and_a_notice_says_when_it_is_ready(
        fake, models_file: Path) -> None:  # noqa: F811 (fixtures)
    """Picking a model with Ctrl+O: while it loaded the status line still said "ready" beside the old
    model, though every send was refused ("send when it is ready"), and nothing said when it was
    ready (the "Loading…" toast was gone after 4 s; a real model loads for seconds)."""
    loader = LoaderPerTarget("cached-model")
    app = make_models_app(models_file, loader)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pick(pilot, await open_picker(pilot), "cached-model")
        await wait_for(pilot, lambda: loader.started == ["cached-model"])
        await pilot.pause()
        line = status(app)
        assert "loading cached-model" in line and "ready" not in line
        assert await send_refused(pilot, "hello?")
        loader.gates["cached-model"].set()
        await wait_for(pilot, lambda: app.switching_to is None)
        await pilot.pause()
        assert "cached-model (fake)" in status(app) and "ready" in status(app)
        assert any("cached-model (fake)" in m and "ready" in m for m, _ in notices(app))


async def test_a_failed_or_dropped_switch_says_ready_again(fake, models_file: Path) -> None:  # noqa: F811
    loader = LoaderPerTarget("cached-model", fail="cached-model")
    app = make_models_app(models_file, loader)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await pick(pilot, await open_picker(pilot), "cached-model")
        await wait_for(pilot, lambda: loader.started == ["cached-model"])
        await pilot.pause()
        assert "loading cached-model" in status(app)
        loader.gates["cached-model"].set()
        await wait_for(pilot, lambda: app.switching_to is None)
        await pilot.pause()
        assert "local-model (fake)" in status(app) and "ready" in status(app) and "loading" not in status(app)
        # picked again, then the model in use picked back: the load is dropped, the line says ready
        loader.gates["cached-model"].clear()
        await pick(pilot, await open_picker(pilot), "cached-model")
        await wait_for(pilot, lambda: app.switching_to is not None)
        await pilot.pause()
        assert "loading cached-model" in status(app)
        await pick(pilot, await open_picker(pilot), "local-model")
        await wait_for(pilot, lambda: app.switching_to is None)
        await pilot.pause()
        assert "ready" in status(app) and "loading" not in status(app)
        loader.gates["cached-model"].set()


async def test_a_new_chat_opened_while_a_model_loads_keeps_saying_it_loads(fake, models_file: Path) -> None:  # noqa: F811
    loader = LoaderPerTarget("cached-model")
    app = make_models_app(models_file, loader)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await wait_for(pilot, lambda: app.session is not None)
        await chat(pilot, "hi")
        await pick(pilot, await open_picker(pilot), "cached-model")
        await wait_for(pilot, lambda: loader.started == ["cached-model"])
        await pilot.press("ctrl+n")
        await pilot.pause()
        assert "loading cached-model" in status(app)
        loader.gates["cached-model"].set()
        await wait_for(pilot, lambda: app.switching_to is None)


# ---- Ctrl+C mid-reply ----------------------------------------------------------------------------
async def test_ctrl_c_with_nothing_selected_stops_a_running_reply() -> None:
    """Ctrl+C, the terminal's interrupt, pressed while a reply streamed told the user how to quit
    the app ("Do you want to quit? Press ctrl+q") and the reply ran on; it stops it, as Esc does
    (with text selected it still copies; with no reply running Textual's quit hint stays)."""
    engine = BlockingEngine(["Partial", " answer"])
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, engine.blocking.is_set)
        await pilot.press("ctrl+c")
        await reply_done(pilot)
        assert engine.released.is_set()
        assert app.chat.conversation[-1] == {"role": "assistant", "content": "Partial answer"}
        assert messages(app)[-1].has_class("-stopped")
        assert not any("quit" in m for m, _ in notices(app))
        await pilot.press("ctrl+c")  # nothing running: Textual's hint, as before
        await pilot.pause()
        assert any("quit" in m for m, _ in notices(app))


async def test_ctrl_c_with_text_selected_in_the_prompt_copies_it_and_the_reply_runs_on() -> None:
    engine = BlockingEngine(["Partial"])
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await wait_for(pilot, engine.blocking.is_set)
        from app.widgets import PromptInput
        from textual.widgets.text_area import Selection

        prompt = app.query_one(PromptInput)
        prompt.text = "copy me"
        prompt.selection = Selection((0, 0), (0, 4))
        await pilot.press("ctrl+c")
        await pilot.pause()
        assert app.clipboard == "copy" and app.chat.busy and not app.chat.stopping
        await pilot.press("escape")
        await reply_done(pilot)


# ---- a regenerate the context refuses --------------------------------------------------------------
async def test_a_regenerate_refused_by_the_context_says_the_old_reply_is_kept() -> None:
    """Ctrl+R where the chat no longer fits (a model with a smaller context picked since): the old
    reply came back, but the notice said "This message does not fit ...: shorten it", of a message
    that was not in the prompt to shorten, and not that the reply was kept."""
    engine = FakeEngine(["An answer."])
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await chat(pilot, "question")
        engine.script, engine.finish_reason = [""], "context"

        def overflow(messages, max_new_tokens, stop):
            from engine.errors import ContextOverflowError

            raise ContextOverflowError("the message does not fit")
            yield  # pragma: no cover

        engine.stream_chat = overflow  # type: ignore[method-assign]
        await pilot.press("ctrl+r")
        await reply_done(pilot)
        assert app.chat.conversation[-1] == {"role": "assistant", "content": "An answer."}
        said = [m for m, _ in notices(app)]
        assert TOO_LONG_NOTICE not in said
        assert any("previous reply is kept" in m and "context" in m for m in said)
