"""Chat features against fake engines: prompt history, regenerate, copy, several chats saved across
relaunches, the chat list, the context-full notice, and the settings that come back."""

from __future__ import annotations

import base64
from datetime import datetime, timezone
from pathlib import Path

import pytest
from textual.widgets import Static

from app.keys import KEYS, documented_keys, with_keys
from app.main import SpecChatApp
from app.screens import ChatScreen, HelpScreen
from app.screens.chat import CONTEXT_NOTICE, TOO_LONG_NOTICE, SETTING_DASHBOARD, SETTING_STRATEGY, SETTING_THEME, window_notice
from app.store import DB_NAME, ChatStore
from app.widgets import Dashboard, PromptInput
from app.widgets.chat_list import ChatList, when
from engine.strategy import preset

from .fakes import BlockingEngine, FailingEngine, FakeEngine
from .test_chat import SIZE, make_app, messages, notices, ready, reply_done, screen_text, send, status, wait_for


def saved(data_dir: Path) -> ChatStore:
    """The app's database, opened the way a relaunch would."""
    return ChatStore.open(data_dir / DB_NAME)


def shown(app: SpecChatApp) -> list[tuple[str, str]]:
    return [(m.role, m.source) for m in messages(app)]


def prompt(app: SpecChatApp) -> PromptInput:
    return app.query_one(PromptInput)


def chat_list(app: SpecChatApp) -> ChatList:
    return app.query_one(ChatList)


async def chat(pilot: object, *texts: str) -> None:
    for text in texts:
        await send(pilot, text)  # type: ignore[arg-type]
        await reply_done(pilot)  # type: ignore[arg-type]


# ---- prompt history -----------------------------------------------------------------------------
async def test_up_and_down_recall_prompts_like_a_shell() -> None:
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await chat(pilot, "one", "two\nlines", "three")
        box = prompt(app)
        await pilot.press("d", "r")  # a draft in progress
        await pilot.press("up")
        assert box.text == "three"
        await pilot.press("up")
        assert box.text == "two\nlines"
        await pilot.press("up")  # a recalled multi-line prompt still walks the history
        assert box.text == "one"
        await pilot.press("up")
        assert box.text == "one"  # the oldest stays
        await pilot.press("down", "down")
        assert box.text == "three"
        await pilot.press("down")
        assert box.text == "dr"  # past the newest: the draft comes back
        await pilot.press("down")
        assert box.text == "dr"

        box.text = "typed\nby hand"  # a multi-line message being written: arrows move the cursor
        box.move_cursor((1, 3))
        await pilot.press("up")
        assert box.text == "typed\nby hand" and box.cursor_location == (0, 3)

        box.text = ""
        await pilot.press("up", "enter")  # a recalled prompt is sent as it is
        await reply_done(pilot)
        assert shown(app)[-2] == ("user", "three")


async def test_history_includes_earlier_chats_and_earlier_runs(data_dir: Path) -> None:
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await chat(pilot, "from the first chat")
        await pilot.press("ctrl+n")
        await chat(pilot, "from the second chat")

    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+n")
        assert messages(app) == []
        await pilot.press("up")
        assert prompt(app).text == "from the second chat"
        await pilot.press("up")
        assert prompt(app).text == "from the first chat"


# ---- regenerate ---------------------------------------------------------------------------------
async def test_ctrl_r_replaces_the_last_reply(data_dir: Path) -> None:
    engine = FakeEngine(["First", " try."])
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await chat(pilot, "hello", "tell me more")
        engine.script = ["Second", " try."]
        await pilot.press("ctrl+s")  # regenerate with another strategy: same conversation, new reply
        await pilot.press("ctrl+r")
        await reply_done(pilot)

        assert engine.calls[-1] == engine.calls[1]  # asked exactly the same question again
        assert engine.calls[-1][-1] == {"role": "user", "content": "tell me more"}
        assert shown(app) == [("user", "hello"), ("assistant", "First try."),
                              ("user", "tell me more"), ("assistant", "Second try.")]
        assert app.chat.conversation[-1] == {"role": "assistant", "content": "Second try."}
        assert any(m.startswith("Regenerating with tree") for m, _ in notices(app))
        store = saved(data_dir)
        (record,) = store.chats()
        contents = [(m.role, m.content) for m in store.messages(record.id)]
        assert contents == [("user", "hello"), ("assistant", "First try."),
                            ("user", "tell me more"), ("assistant", "Second try.")]
        assert store.messages(record.id)[-1].stats["strategy"].startswith("tree")  # type: ignore[index]


async def test_a_regenerate_that_brings_nothing_back_keeps_the_old_reply(data_dir: Path) -> None:
    """Ctrl+R, then Esc before the new reply's first token: the reply it was to replace comes back
    (text, finish mark, saved stats), the user's message stays, nothing goes into the prompt."""
    engine = BlockingEngine(["First", " try."])
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await send(pilot, "hello")
        await wait_for(pilot, lambda: engine.blocking.is_set() and "try." in messages(app)[-1].source)
        await pilot.press("escape")
        await reply_done(pilot)
        before = saved(data_dir).messages(saved(data_dir).chats()[0].id)[-1]
        assert (before.role, before.content, before.finish_reason) == ("assistant", "First try.", "stopped")
        engine.script, engine.blocking = [], type(engine.blocking)()
        await pilot.press("ctrl+r")
        await wait_for(pilot, engine.blocking.is_set)
        await pilot.press("escape")
        await reply_done(pilot)
        assert shown(app) == [("user", "hello"), ("assistant", "First try.\n\n*(stopped)*")]
        assert messages(app)[-1].has_class("-stopped")
        assert app.chat.conversation == [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "First try."}]
        assert prompt(app).text == ""
        assert ("The new reply brought nothing back: the previous reply is kept.", "information") in notices(app)
        store = saved(data_dir)
        after = store.messages(store.chats()[0].id)
        assert [(m.role, m.content) for m in after] == [("user", "hello"), ("assistant", "First try.")]
        assert after[-1].stats == before.stats


async def test_edit_the_last_message_replaces_it_and_its_reply(data_dir: Path) -> None:
    """Palette "Edit the last message": the last user message goes into the prompt; Enter replaces
    it and its reply in the chat, the model's input and the saved history; Esc cancels."""
    engine = FakeEngine(["Sure", "."])
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await chat(pilot, "hello", "tell me more")
        app.chat.action_edit_last()
        await pilot.pause()
        assert prompt(app).text == "tell me more" and "editing your last message" in status(app)
        await pilot.press("escape")  # cancel: nothing changes
        await pilot.pause()
        assert prompt(app).text == "" and len(app.chat.conversation) == 4 and "editing" not in status(app)
        app.chat.action_edit_last()
        await pilot.pause()
        prompt(app).text = "tell me less"
        await pilot.press("enter")
        await reply_done(pilot)
        assert engine.calls[-1] == [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "Sure."},
                                    {"role": "user", "content": "tell me less"}]
        assert shown(app) == [("user", "hello"), ("assistant", "Sure."), ("user", "tell me less"), ("assistant", "Sure.")]
        store = saved(data_dir)
        assert [m.content for m in store.messages(store.chats()[0].id)] == ["hello", "Sure.", "tell me less", "Sure."]
        await chat(pilot, "and then?")  # no edit pending: a new turn
        assert len(app.chat.conversation) == 6


async def test_an_edit_of_the_last_message_gives_back_what_was_typed(data_dir: Path) -> None:
    """A half-written message in the prompt when "Edit the last message" starts comes back when the
    edit ends: Esc, the edited message sent, or another chat opened."""
    engine = FakeEngine(["Sure", "."])
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await chat(pilot, "hello")
        for end, last in (("escape", "hello"), ("send", "hello"), ("new chat", "hello again")):
            prompt(app).text = "my half-written draft"
            app.chat.action_edit_last()
            await pilot.pause()
            assert prompt(app).text == last
            if end == "escape":
                await pilot.press("escape")
            elif end == "send":
                prompt(app).text = "hello again"
                await pilot.press("enter")
                await reply_done(pilot)
                assert shown(app)[-2:] == [("user", "hello again"), ("assistant", "Sure.")]
            else:
                await pilot.press("ctrl+n")
            await pilot.pause()
            assert prompt(app).text == "my half-written draft", end
            assert "editing" not in status(app)
        app.chat.action_edit_last()  # "Edit" twice: the draft is still the one typed before the first
        app.chat.action_edit_last()
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()
        assert prompt(app).text == "my half-written draft"


async def _two_turns_stopped_after_their_first_words(pilot, engine: BlockingEngine, data_dir: Path) -> list:
    """"hello" and "tell me more" sent, each reply stopped (Esc) once the engine blocks after its
    script ("Sure."): the saved messages then."""
    for text in ("hello", "tell me more"):
        engine.blocking.clear()
        await send(pilot, text)
        await wait_for(pilot, engine.blocking.is_set)
        await pilot.press("escape")
        await reply_done(pilot)
    return saved(data_dir).messages(saved(data_dir).chats()[0].id)


@pytest.mark.parametrize("how", ["stopped", "failed"])
async def test_an_edit_that_brings_nothing_back_keeps_the_message_it_was_to_replace(data_dir: Path, how: str) -> None:
    """The edited message sent, and its reply stopped before the first token (Esc) or failed at once
    (an edit too long for the context): the message it was to replace and that message's reply
    come back (chat, screen, saved history with the reply's stats), and the edit is open again
    with the new text in the prompt, as a regenerate that brings nothing keeps the old reply.
    They were deleted for good, though nothing replaced them."""

    class EditFails(BlockingEngine):
        def stream_chat(self, messages, max_new_tokens, stop):  # type: ignore[no-untyped-def]
            if how == "failed" and messages[-1]["content"].startswith("edited"):
                self.calls.append(messages)
                raise RuntimeError("prompt is 9000 tokens but the context holds 8192; shorten it")
            yield from super().stream_chat(messages, max_new_tokens, stop)

    engine = EditFails(["Sure", "."])
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        before = await _two_turns_stopped_after_their_first_words(pilot, engine, data_dir)
        prompt(app).text = "a draft"
        app.chat.action_edit_last()
        await pilot.pause()
        engine.script, engine.blocking = [], type(engine.blocking)()
        prompt(app).text = "edited: tell me less"
        await pilot.press("enter")
        if how == "stopped":
            await wait_for(pilot, engine.blocking.is_set)
            await pilot.press("escape")
        await reply_done(pilot)
        assert [m["content"] for m in app.chat.conversation] == ["hello", "Sure.", "tell me more", "Sure."]
        assert shown(app)[2:] == [("user", "tell me more"), ("assistant", "Sure.\n\n*(stopped)*")]
        store = saved(data_dir)
        after = store.messages(store.chats()[0].id)
        assert [(m.role, m.content, m.stats) for m in after] == [(m.role, m.content, m.stats) for m in before]
        assert any(m.startswith("The edited message brought nothing back") for m, _ in notices(app))
        assert prompt(app).text == "edited: tell me less" and "editing your last message" in status(app)
        if how == "failed":
            assert ("Generation failed: prompt is 9000 tokens but the context holds 8192; shorten it", "error") in notices(app)
            await pilot.press("escape")  # the edit cancelled: the draft comes back, the chat as it was
            await pilot.pause()
            assert prompt(app).text == "a draft" and len(app.chat.conversation) == 4
        else:
            engine.script = ["Less", "."]
            engine.blocking = type(engine.blocking)()
            await pilot.press("enter")  # sent again, it replaces them, as the first Enter would have
            await wait_for(pilot, engine.blocking.is_set)
            await pilot.press("escape")
            await reply_done(pilot)
            assert [m["content"] for m in app.chat.conversation] == ["hello", "Sure.", "edited: tell me less", "Less."]
            assert prompt(app).text == "a draft"
            store = saved(data_dir)
            assert [m.content for m in store.messages(store.chats()[0].id)] == ["hello", "Sure.", "edited: tell me less", "Less."]


async def test_quitting_during_an_edits_reply_before_its_first_token_keeps_what_it_was_to_replace(data_dir: Path) -> None:
    """Ctrl+Q while the edited message's reply had not begun: the message it was to replace and its
    reply were deleted from the saved chat at Enter, and nothing replaced them."""
    engine = BlockingEngine(["Sure", "."])
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        before = await _two_turns_stopped_after_their_first_words(pilot, engine, data_dir)
        app.chat.action_edit_last()
        await pilot.pause()
        engine.script, engine.blocking = [], type(engine.blocking)()
        prompt(app).text = "edited: tell me less"
        await pilot.press("enter")
        await wait_for(pilot, engine.blocking.is_set)
        await pilot.press("ctrl+q")
    store = saved(data_dir)
    after = store.messages(store.chats()[0].id)
    assert [(m.role, m.content, m.stats) for m in after] == [(m.role, m.content, m.stats) for m in before]
    assert [m.content for m in after] == ["hello", "Sure.", "tell me more", "Sure."]


async def test_ctrl_r_is_refused_while_an_edit_is_open(data_dir: Path) -> None:
    """Ctrl+R with an edit of the last message open is refused, as "Continue" is: it ran and left
    the edit pending with nothing saying so (the status line went back to "done"), so the next
    message sent replaced the last exchange, new reply included, instead of following it."""
    engine = FakeEngine(["Sure", "."])
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await chat(pilot, "hello", "tell me more")
        app.chat.action_edit_last()
        await pilot.pause()
        await pilot.press("ctrl+r")
        await pilot.pause()
        assert len(engine.calls) == 2 and not app.chat.busy
        assert any("edit of your last message first" in m for m, _ in notices(app))
        assert "editing your last message" in status(app) and prompt(app).text == "tell me more"
        await pilot.press("escape")  # cancel the edit: then Ctrl+R and a new turn work as usual
        await pilot.pause()
        await pilot.press("ctrl+r")
        await reply_done(pilot)
        await chat(pilot, "and then?")
        assert [m["content"] for m in app.chat.conversation] == ["hello", "Sure.", "tell me more", "Sure.", "and then?", "Sure."]


async def test_ctrl_r_needs_a_reply_and_waits_for_the_running_one() -> None:
    engine = BlockingEngine(["..."])
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+r")
        assert ("Nothing to regenerate yet: send a message first.", "information") in notices(app)
        await send(pilot, "one")
        await wait_for(pilot, engine.blocking.is_set)
        await pilot.press("ctrl+r")
        assert any("still running" in m and sev == "warning" for m, sev in notices(app))
        assert len(engine.calls) == 1
        await pilot.press("escape")
        await reply_done(pilot)


# ---- copy ---------------------------------------------------------------------------------------
async def test_ctrl_y_copies_the_last_reply_with_osc_52(monkeypatch: pytest.MonkeyPatch) -> None:
    app = make_app(FakeEngine(["Some **Markdown**", " reply."]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+y")
        assert ("No reply to copy yet.", "information") in notices(app)
        written: list[str] = []
        assert app._driver is not None
        monkeypatch.setattr(app._driver, "write", written.append)
        await chat(pilot, "hi")
        prompt(app).text = "draft"
        await pilot.press("ctrl+y")  # even from the prompt (whose TextArea binds ctrl+y to redo)
        assert app.clipboard == "Some **Markdown** reply."
        osc = "\x1b]52;c;" + base64.b64encode("Some **Markdown** reply.".encode()).decode() + "\a"
        assert osc in written
        assert prompt(app).text == "draft"
        assert any(m.startswith("Copied the last reply (24 characters) with OSC 52") for m, _ in notices(app))


# ---- several chats, the chat list, persistence ------------------------------------------------------
async def test_new_chat_switch_and_relaunch(data_dir: Path) -> None:
    engine = FakeEngine(["Answer."])
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+n")
        assert ("This is already a new chat.", "information") in notices(app)
        await chat(pilot, "alpha question", "alpha follow-up")
        assert "alpha question" in screen_text(app).splitlines()[0]  # the title line
        await pilot.press("ctrl+n")
        assert messages(app) == [] and app.chat.conversation == [] and app.chat.chat_id is None
        assert "New chat" in screen_text(app).splitlines()[0]
        await chat(pilot, "beta question")

        await pilot.press("ctrl+l")
        listing = chat_list(app)
        assert listing.display and app.focused is listing.options
        assert [c.title for c in listing.chats] == ["beta question", "alpha question"]
        assert listing.options.highlighted == 1  # the open chat
        text = screen_text(app)
        assert "● beta question" in text and "alpha question" in text and "4 messages" in text
        await pilot.press("down", "enter")
        assert not listing.display and app.focused is prompt(app)
        assert shown(app) == [("user", "alpha question"), ("assistant", "Answer."),
                              ("user", "alpha follow-up"), ("assistant", "Answer.")]
        await chat(pilot, "alpha third")  # goes on with the reopened conversation
        assert engine.calls[-1][:4] == [
            {"role": "user", "content": "alpha question"}, {"role": "assistant", "content": "Answer."},
            {"role": "user", "content": "alpha follow-up"}, {"role": "assistant", "content": "Answer."}]

        await pilot.press("f4", "home", "enter")  # the "+ New chat" row
        assert messages(app) == [] and app.chat.chat_id is None

    # relaunch: the most recently updated chat is open again, the other one is in the list
    app = make_app(FakeEngine(["Again."]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert [m for m in shown(app) if m[0] == "user"] == [
            ("user", "alpha question"), ("user", "alpha follow-up"), ("user", "alpha third")]
        assert app.chat.conversation[-1] == {"role": "assistant", "content": "Answer."}
        assert "alpha question" in screen_text(app).splitlines()[0]
        await pilot.press("ctrl+l")
        assert [c.title for c in chat_list(app).chats] == ["alpha question", "beta question"]
        await pilot.press("down", "enter")
        assert shown(app) == [("user", "beta question"), ("assistant", "Answer.")]
        await pilot.press("ctrl+l", "escape")
        assert not chat_list(app).display and app.focused is prompt(app)


async def test_the_chat_lists_key_hints_fit_its_borders() -> None:
    """The list is 30 columns wide: its hints are split between the two borders so neither is cut
    (one 35-character subtitle was), and a long remapped key drops a hint rather than cut it."""
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+l")
        await pilot.pause()
        listing = chat_list(app)
        room = listing.size.width - 4
        assert listing.border_title == "Chats · / search" and listing.border_subtitle == "r rename · Del delete"
        assert len(listing.border_title) <= room and len(listing.border_subtitle) <= room
        app.keymap = {**(app.keymap or {}), "delete_chat": "ctrl+shift+backspace"}
        listing._fit_borders()
        assert listing.border_subtitle == "r rename"


async def test_rename_and_delete_from_the_chat_list(data_dir: Path) -> None:
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await chat(pilot, "keep me")
        await pilot.press("ctrl+n")
        await chat(pilot, "delete me")
        await pilot.press("ctrl+l", "r")
        box = app.query_one("#chat-rename")
        assert box.display and app.focused is box
        await pilot.press(*" never", "escape")  # Esc cancels the rename, not the list
        assert not box.display and chat_list(app).display and app.focused is chat_list(app).options
        assert [c.title for c in saved(data_dir).chats()] == ["delete me", "keep me"]
        await pilot.press("r", "ctrl+u", *"Doomed", "enter")
        assert "Doomed" in screen_text(app).splitlines()[0]
        assert [c.title for c in chat_list(app).chats] == ["Doomed", "keep me"]
        assert app.focused is chat_list(app).options

        await pilot.press("delete")
        assert any("Press Del again" in m for m, _ in notices(app))  # (the key as the help and the list's border name it)
        assert len(saved(data_dir).chats()) == 2
        await pilot.press("delete")  # the open chat goes: a new one takes its place
        assert [c.title for c in saved(data_dir).chats()] == ["keep me"]
        assert messages(app) == [] and app.chat.chat_id is None
        assert [c.title for c in chat_list(app).chats] == ["keep me"]
        await pilot.press("escape", "up")
        assert prompt(app).text == "keep me"  # the deleted chat's prompts left the history


async def test_editing_the_only_message_of_a_renamed_chat_keeps_its_name(data_dir: Path) -> None:
    """The edit of a chat's only message saves the chat again; a name the user gave it stays (it
    came back titled after the edited message), an automatic title follows the new message."""
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await chat(pilot, "hi")
        await pilot.press("ctrl+l", "r", "ctrl+u", *"My chat", "enter", "escape")
        await pilot.pause()
        app.chat.action_edit_last()
        await pilot.pause()
        prompt(app).text = "hello"
        await pilot.press("enter")
        await reply_done(pilot)
        assert [c.title for c in saved(data_dir).chats()] == ["My chat"] and app.chat.chat_title == "My chat"
        assert [m.content for m in saved(data_dir).messages(saved(data_dir).chats()[0].id)] == ["hello", "ok"]
        await pilot.press("ctrl+n")
        await chat(pilot, "first words")
        app.chat.action_edit_last()
        await pilot.pause()
        prompt(app).text = "other words"
        await pilot.press("enter")
        await reply_done(pilot)
        assert [c.title for c in saved(data_dir).chats()] == ["other words", "My chat"]  # automatic: follows


async def test_a_renamed_chat_stays_highlighted_and_down_moves_on(data_dir: Path) -> None:
    """Renaming a chat that is not the open one: the highlight stays on it (it jumped back to the open
    chat, so the next Down seemed swallowed and Delete offered the wrong chat)."""
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        for text in ("first", "second", "third"):
            await pilot.press("ctrl+n")
            await chat(pilot, text)
        await pilot.press("ctrl+l")
        await pilot.pause()
        await pilot.press("down", "down")  # the open chat ("third") is highlighted: down to "first"
        assert chat_list(app).highlighted_chat().title == "first"
        await pilot.press("r", "ctrl+u", *"Renamed", "enter")
        await pilot.pause()
        assert chat_list(app).highlighted_chat().title == "Renamed"
        idx = chat_list(app).options.highlighted
        await pilot.press("up")
        assert chat_list(app).options.highlighted == idx - 1
        await pilot.press("delete")
        assert any(f"“{chat_list(app).highlighted_chat().title}”" in m for m, _ in notices(app))
        assert chat_list(app).highlighted_chat().title != "Renamed"


async def test_switching_chats_waits_for_the_running_reply(data_dir: Path) -> None:
    engine = BlockingEngine(["..."])
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await send(pilot, "busy")
        await wait_for(pilot, engine.blocking.is_set)
        (record,) = saved(data_dir).chats()  # the user's message was committed when sent
        assert [(m.role, m.content) for m in saved(data_dir).messages(record.id)] == [("user", "busy")]
        await pilot.press("ctrl+n")
        assert any("before starting a new chat" in m for m, _ in notices(app))
        assert app.chat.chat_id is not None and len(messages(app)) == 2
        await pilot.press("escape")
        await reply_done(pilot)


async def test_quitting_mid_reply_saves_the_partial_reply_as_stopped(data_dir: Path) -> None:
    engine = BlockingEngine(["Half", " way"])
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await send(pilot, "long question")
        await wait_for(pilot, lambda: "way" in messages(app)[-1].source)
        await pilot.press("ctrl+q")
    store = saved(data_dir)
    (record,) = store.chats()
    last = store.messages(record.id)[-1]
    assert (last.role, last.content, last.finish_reason) == ("assistant", "Half way", "stopped")

    app = make_app(FakeEngine())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        reply = messages(app)[-1]
        assert reply.source == "Half way\n\n*(stopped)*" and reply.has_class("-stopped")
        assert app.chat.conversation[-1] == {"role": "assistant", "content": "Half way"}


async def test_a_chat_left_without_a_reply_can_be_answered_with_ctrl_r(data_dir: Path) -> None:
    store = ChatStore.open(data_dir / DB_NAME)  # what a kill -9 mid-reply leaves behind
    chat_id = store.new_chat()
    store.add_message(chat_id, "user", "unanswered")
    store.close()
    engine = FakeEngine(["Late answer."])
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        assert shown(app) == [("user", "unanswered")]
        assert any("has no reply" in m and "Ctrl+R" in m for m, _ in notices(app))
        await pilot.press("ctrl+r")
        await reply_done(pilot)
        assert engine.calls == [[{"role": "user", "content": "unanswered"}]]
        assert shown(app) == [("user", "unanswered"), ("assistant", "Late answer.")]
    assert [m.content for m in saved(data_dir).messages(chat_id)] == ["unanswered", "Late answer."]


def test_chat_list_dates_are_short_and_local() -> None:
    now = datetime(2026, 7, 14, 15, 0, tzinfo=timezone.utc).astimezone()
    same_day = now.replace(hour=9, minute=5).astimezone(timezone.utc).isoformat()
    assert when(same_day, today=now) == "09:05"
    assert when(now.replace(month=1, day=2).astimezone(timezone.utc).isoformat(), today=now) == "Jan 02"
    assert when("2024-03-01T10:00:00+00:00", today=now) == "2024-03-01"
    assert when("garbage", today=now) == "?"


async def test_chat_list_fits_80x24(data_dir: Path) -> None:
    app = make_app(FakeEngine(["A reply that is long enough to wrap in the narrow chat column " * 2]))
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await chat(pilot, "a first chat whose title is far too long for the chat list")
        await pilot.press("ctrl+n")
        await chat(pilot, "second")
        await pilot.press("ctrl+l")
        await pilot.pause()
        lines = screen_text(app).splitlines()
        assert len(lines) == 24 and all(len(line) <= 80 for line in lines)
        listing, box = chat_list(app), prompt(app)
        screen = app.screen.region
        for widget in (listing, box, app.chat.status_line):
            assert screen.contains_region(widget.region), widget
        assert listing.region.width == 30 and box.region.width >= 48
        assert listing.region.right <= box.region.x
        text = "\n".join(lines)
        assert "Chats" in lines[0] and "● second" in text
        assert "a first chat whose title …" in text  # cut, not wrapped
        assert "FakeLM-1M" in text and "sd k=5 greedy T=0" in text  # the status line
        assert "esc Close" in lines[-1] and "^s Strategy" in lines[-1]  # the footer
        assert not app.query_one(Dashboard).display  # 80 columns: no room for the dashboard


# ---- failures and the context -------------------------------------------------------------------
async def test_context_full_marks_the_reply_and_suggests_a_new_chat(data_dir: Path) -> None:
    engine = FakeEngine(["It is"], finish_reason="context")
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await chat(pilot, "long chat")
        reply = messages(app)[-1]
        assert reply.has_class("-context") and reply.source.startswith("It is")
        assert "Context full" in reply.source and "Ctrl+N" in reply.source
        assert (with_keys(CONTEXT_NOTICE), "warning") in notices(app)
        assert "Ctrl+N" in with_keys(CONTEXT_NOTICE) and "context full" in status(app)
        assert "Context full: the reply" in screen_text(app)

        engine.script = [""]  # the next turn does not fit at all: nothing comes back
        await send(pilot, "one more")
        await reply_done(pilot)
        assert shown(app)[-1][0] == "assistant" and len(messages(app)) == 2  # the refused turn is gone
        assert prompt(app).text == "one more"  # back in the prompt, to send in a new chat
        assert app.chat.conversation[-1]["role"] == "assistant"
        assert notices(app).count((with_keys(CONTEXT_NOTICE), "warning")) == 1
        assert (with_keys(TOO_LONG_NOTICE), "warning") in notices(app)

    (record,) = saved(data_dir).chats()
    last = saved(data_dir).messages(record.id)
    assert [m.content for m in last] == ["long chat", "It is"] and last[-1].finish_reason == "context"
    app = make_app(FakeEngine())
    async with app.run_test(size=SIZE) as pilot:  # the mark comes back with the chat
        await ready(pilot)
        assert messages(app)[-1].has_class("-context")


async def test_a_message_longer_than_the_context_is_a_context_notice_not_a_failure(data_dir: Path) -> None:
    """The engine refuses a prompt that does not fit even alone (ContextOverflowError, before any
    step): the message goes back into the prompt with the context's notice, not "Generation failed"."""
    from engine.errors import ContextOverflowError

    class TooLong(FakeEngine):
        def stream_chat(self, messages, max_new_tokens, stop):
            self.calls.append(messages)
            raise ContextOverflowError("prompt is 9000 tokens but the context holds 8192; shorten it")
            yield  # a generator, as the engine's

    app = make_app(TooLong())
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await send(pilot, "a very long message")
        await reply_done(pilot)
        assert (with_keys(TOO_LONG_NOTICE), "warning") in notices(app)
        assert not any(text.startswith("Generation failed") for text, _ in notices(app))
        assert prompt(app).text == "a very long message" and not messages(app)
        assert "error" not in status(app)


async def test_left_out_turns_are_told_once_and_shown_on_the_dashboard(data_dir: Path) -> None:
    """The engine left the oldest messages out to fit the context: a notice the first time (not
    every turn of the same window), the dashboard's context line says how many; the chat keeps
    every message and sends them all (the engine chooses the window)."""
    engine = FakeEngine(["It is"])
    app = make_app(engine)
    async with app.run_test(size=(140, 45), notifications=True) as pilot:
        await ready(pilot)
        await chat(pilot, "first")
        assert not any("left out" in m for m, _ in notices(app))
        engine.dropped_messages = 2
        await chat(pilot, "second")
        told = window_notice(engine.context_length, 2)
        assert notices(app).count((told, "information")) == 1
        assert "2 oldest messages left out" in screen_text(app)
        await chat(pilot, "third")  # the same window: not told again
        assert notices(app).count((told, "information")) == 1
        engine.dropped_messages = 4
        await chat(pilot, "fourth")
        assert (window_notice(engine.context_length, 4), "information") in notices(app)
        assert [m["content"] for m in engine.calls[-1] if m["role"] == "user"] == ["first", "second", "third", "fourth"]
        assert len(messages(app)) == 8
    assert window_notice(8192, 1).endswith("its 1 oldest message is left out of what the model reads (the chat keeps it).")


async def test_a_failed_first_message_is_not_saved_and_returns_to_the_prompt(data_dir: Path) -> None:
    class FailsAtOnce(FailingEngine):
        def stream_chat(self, messages, max_new_tokens, stop):  # type: ignore[no-untyped-def]
            self.calls.append(messages)
            raise RuntimeError("CUDA out of memory\nstack trace")
            yield  # a generator, like the real loop

    app = make_app(FailsAtOnce())
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await send(pilot, "too big")
        await reply_done(pilot)
        assert messages(app) == [] and app.chat.conversation == [] and app.chat.chat_id is None
        assert prompt(app).text == "too big"
        assert ("Generation failed: CUDA out of memory", "error") in notices(app)
    assert saved(data_dir).chats() == []


# ---- settings -----------------------------------------------------------------------------------
async def test_strategy_dashboard_and_theme_come_back(data_dir: Path) -> None:
    app = make_app(FakeEngine())
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert not app.query_one(Dashboard).display
        await pilot.press("ctrl+s", "ctrl+d")
        app.theme = "nord"
        await pilot.pause()
    store = saved(data_dir)
    assert store.get_setting(SETTING_STRATEGY)["name"] == "tree"
    assert store.get_setting(SETTING_DASHBOARD) is True and store.get_setting(SETTING_THEME) == "nord"

    engine = FakeEngine()
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert engine.strategy == preset("tree") and "tree tree=3,2,2,1,1" in status(app)
        assert app.query_one(Dashboard).display  # shown at 80 columns: the user asked for it
        assert app.theme == "nord"

    engine = FakeEngine()
    app = make_app(engine, initial_strategy=preset("pld"))  # the command line wins
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        assert engine.strategy == preset("pld")


async def test_unusable_saved_settings_fall_back_with_a_notice(data_dir: Path) -> None:
    store = ChatStore.open(data_dir / DB_NAME)
    store.set_setting(SETTING_STRATEGY, {**preset("sd").to_dict(), "draft_len": 0})
    store.set_setting(SETTING_THEME, "no-such-theme")
    store.close()
    engine = FakeEngine()
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        assert engine.strategy == preset("sd")
        assert any(m.startswith("Saved strategy not used: draft length must be between 1 and 64; using sd")
                   and sev == "warning" for m, sev in notices(app))
        assert any("'no-such-theme' is not available" in m for m, _ in notices(app))

    store = ChatStore.open(data_dir / DB_NAME)
    store.set_setting(SETTING_STRATEGY, preset("tree").to_dict())
    store.close()
    engine = FakeEngine(has_drafter=False, strategy=preset("pld"))  # this session cannot run it
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        assert engine.strategy == preset("pld")
        assert any("needs a drafter model" in m and "using pld" in m for m, _ in notices(app))


async def test_an_unusable_data_dir_keeps_the_app_working_in_memory(data_dir: Path) -> None:
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    data_dir.write_text("a file where the directory should be")
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        assert app.store.path is None
        assert any(str(data_dir) in m and "\n" not in m and sev == "error" for m, sev in notices(app))
        await chat(pilot, "still chatting")
        assert shown(app)[-1] == ("assistant", "ok")
        await pilot.press("f1")
        assert isinstance(app.screen, HelpScreen) and "not saved (in memory)" in screen_text(app)


async def test_a_damaged_chat_database_opens_without_a_traceback(data_dir: Path) -> None:
    """A chat database damaged by hand or by a bad disk comes up as a one-line notice, never a
    traceback: a schema_version that is not a number (the app goes on in memory and says why), or
    a message's stats that are JSON but not a table (the chat opens, the reply without a mark;
    both raised at start-up before)."""
    import sqlite3

    store = ChatStore.open(data_dir / DB_NAME)
    chat_id = store.new_chat()
    store.add_message(chat_id, "user", "hello")
    store.add_message(chat_id, "assistant", "hi there", {"finish_reason": "stopped", "tokens": 2})
    store.close()
    db = sqlite3.connect(data_dir / DB_NAME)
    db.execute("""UPDATE messages SET stats = '"stopped"' WHERE role = 'assistant'""")
    db.commit()
    db.close()
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        assert app.return_code is None
        assert shown(app) == [("user", "hello"), ("assistant", "hi there")]
        await chat(pilot, "and now?")
        assert shown(app)[-1] == ("assistant", "ok")

    db = sqlite3.connect(data_dir / DB_NAME)
    db.execute("UPDATE meta SET value = 'one' WHERE key = 'schema_version'")
    db.commit()
    db.close()
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        assert app.return_code is None and app.store.path is None
        assert any("schema_version is 'one'" in m and "\n" not in m and sev == "error" for m, sev in notices(app))
        await chat(pilot, "still chatting")
        assert shown(app)[-1] == ("assistant", "ok")


# ---- keys ---------------------------------------------------------------------------------------
async def test_new_keys_are_documented_and_do_not_collide(data_dir: Path) -> None:
    keys = {key for b in ChatScreen.BINDINGS for key in b.key.split(",")}  # type: ignore[union-attr]
    assert {"ctrl+n", "ctrl+l", "f4", "ctrl+r", "ctrl+y"} <= keys <= documented_keys()
    app_keys = {key for b in SpecChatApp.BINDINGS for key in b.key.split(",")}  # type: ignore[union-attr]
    assert not keys & app_keys and "ctrl+o" not in keys
    chat_list_help = next(what for _, k, what in KEYS if "ctrl+l" in k)
    assert "r rename" in with_keys(chat_list_help) and "Del Del delete" in with_keys(chat_list_help)
    list_keys = {b.key for b in ChatList.BINDINGS}  # type: ignore[union-attr]
    assert list_keys == {"escape", "r", "delete", "slash"}
    app = make_app(FakeEngine())
    async with app.run_test(size=(80, 40)) as pilot:
        await ready(pilot)
        await pilot.press("f1")
        text = screen_text(app)
        for shown_key in ("Ctrl+N", "Ctrl+L / F4", "Ctrl+R", "Ctrl+Y", "Up / Down", "Ctrl+Q"):
            assert shown_key in text
        assert "specchat.db" in text  # where the chats are, under the keys (the full path may wrap)
        store_line = app.screen.query_one("#help-store", Static).render()
        assert str(data_dir / DB_NAME) in str(store_line)


# ---- export -------------------------------------------------------------------------------------
def test_chat_markdown_and_export_file(tmp_path: Path) -> None:
    from datetime import datetime

    from app.export import chat_markdown, export_chat, slug

    conv = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4.\n\n```py\nprint(4)\n```\n"}]
    md = chat_markdown("Sums / arithmetic!", conv, "SmolLM2 (q8)")
    assert md.startswith("# Sums / arithmetic!\n\n*SmolLM2 (q8)*\n\n## You\n\nWhat is 2+2?\n\n## Assistant\n\n4.")
    assert "```py\nprint(4)\n```" in md
    assert slug("Sums / arithmetic!") == "sums-arithmetic" and slug("???") == "chat"
    path = export_chat(tmp_path / "out", "Sums", conv, now=datetime(2026, 11, 26, 10, 0, 0))
    assert path == tmp_path / "out" / "sums-20261126-100000.md"
    assert path.read_text() == chat_markdown("Sums", conv) and (path.stat().st_mode & 0o777) == 0o600


async def test_the_palette_exports_the_chat_beside_the_database(data_dir: Path) -> None:
    app = make_app(FakeEngine(["Four", "."]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        app.chat.action_export_chat()
        await pilot.pause()
        assert any("Nothing to export yet" in m for m, _ in notices(app))
        await chat(pilot, "What is 2+2?")
        await pilot.press("ctrl+p")
        await pilot.pause()
        await pilot.press(*"Export")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause(0.3)
        files = list((data_dir / "exports").glob("*.md"))
        assert len(files) == 1 and files[0].name.startswith("what-is-2-2-")
        assert "## You\n\nWhat is 2+2?\n\n## Assistant\n\nFour." in files[0].read_text()
        assert any(f"Exported 2 messages to {files[0]}" == m for m, _ in notices(app))


@pytest.mark.parametrize("script, shown", [
    (["Partial", " answer"], "## Assistant\n\nPartial answer\n\n*(still being written when exported)*"),
    # inside a code block: the block is closed before the note (it was code, as everything after it)
    (["```sh\n", "ls -la"], "```sh\nls -la\n```\n\n*(still being written when exported)*"),
], ids=["text", "code-block"])
async def test_an_export_mid_reply_includes_the_reply_so_far(data_dir: Path, script: list[str], shown: str) -> None:
    from markdown_it import MarkdownIt

    engine = BlockingEngine(script)
    app = make_app(engine)
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        await send(pilot, "Explain")
        await wait_for(pilot, lambda: engine.blocking.is_set() and script[-1] in (app.chat._run.text if app.chat._run else ""))
        app.chat.action_export_chat()
        await pilot.pause()
        files = list((data_dir / "exports").glob("*.md"))
        assert len(files) == 1
        text = files[0].read_text()
        assert shown in text
        assert "<p><em>(still being written when exported)</em></p>" in MarkdownIt("commonmark").render(text)  # not code
        assert any(m == f"Exported 2 messages to {files[0]}" for m, _ in notices(app))
        await pilot.press("escape")
        await reply_done(pilot)


async def test_an_export_of_one_message_says_message(data_dir: Path) -> None:
    """"Exported 1 message", not "1 messages" (a chat left with only the user's message)."""
    store = ChatStore.open(data_dir / DB_NAME)
    store.add_message(store.new_chat(), "user", "unanswered")
    store.close()
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=SIZE, notifications=True) as pilot:
        await ready(pilot)
        app.chat.action_export_chat()
        await pilot.pause()
        files = list((data_dir / "exports").glob("*.md"))
        assert len(files) == 1 and any(m == f"Exported 1 message to {files[0]}" for m, _ in notices(app))


# ---- chat search --------------------------------------------------------------------------------
def test_store_search_matches_titles_and_messages(tmp_path: Path) -> None:
    store = ChatStore.open(tmp_path / "s.db")
    a = store.new_chat("Fruit talk")
    store.add_message(a, "user", "are bananas yellow?")
    b = store.new_chat("Code")
    store.add_message(b, "user", "100% of 5_000?")
    store.new_chat("Empty")
    assert [c.title for c in store.chats("BANANA")] == ["Fruit talk"]  # in a message, any case
    assert [c.title for c in store.chats("fruit")] == ["Fruit talk"]  # in the title
    assert [c.title for c in store.chats("0% of 5_")] == ["Code"]  # % and _ are literal
    assert store.chats("_") == [c for c in store.chats() if c.title == "Code"]
    assert len(store.chats("")) == 3 and store.chats("nothing like it") == []


async def test_slash_in_the_chat_list_searches_as_you_type() -> None:
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        for text in ("apples are red", "bananas are yellow", "cherries are dark"):
            await pilot.press("ctrl+n")
            await chat(pilot, text)
        await pilot.press("ctrl+l")
        await pilot.pause()
        assert chat_list(app).options.option_count == 4  # "new chat" + 3
        await pilot.press("slash", *"banana")
        await pilot.pause()
        assert chat_list(app).options.option_count == 2
        assert [c.title for c in chat_list(app).chats] == ["bananas are yellow"]
        await pilot.press("enter")  # to the list: the match is highlighted below "new chat"
        await pilot.press("down", "enter")
        await pilot.pause()
        assert app.chat.conversation[0]["content"] == "bananas are yellow" and not chat_list(app).display
        await pilot.press("ctrl+l", "slash", *"zzz")
        await pilot.pause()
        assert chat_list(app).options.option_count == 2 and chat_list(app).chats == []  # "new chat" + the no-match row
        assert "no chats match “zzz”" in screen_text(app)
        assert chat_list(app).options.get_option_at_index(1).disabled
        await pilot.press("escape")  # clears the search: every chat again
        await pilot.pause()
        assert chat_list(app).options.option_count == 4 and chat_list(app).display
        await pilot.press("escape")
        await pilot.pause()
        assert not chat_list(app).display
