"""Long chats (review s43): opening a chat of hundreds of messages mounts only the latest ones (it
mounted every message as its own Markdown widgets: 600 messages froze the UI for ~25-57 s, at
start-up too, since the app opens the last chat); earlier ones come in batches when the list is
scrolled to the top (or the "earlier messages" line is clicked), the scroll position kept. Every
path that maps widgets to conversation entries (edit, regenerate, Continue, copy, export, finish
marks) stays right with only part of the chat mounted. Also: an empty rename says why; Ctrl+Y
while a reply streams copies what is shown of it and says so."""

from __future__ import annotations

import time
from pathlib import Path

from app.store import DB_NAME, ChatStore
from app.widgets import ChatMessage, MessageList, PromptInput
from app.widgets.chat_message import reply_markdown

from .fakes import BlockingEngine, FakeEngine
from .test_chat import make_app, messages, notices, ready, reply_done, screen_text, send, wait_for
from .test_chat_features import chat, saved

TALL = (100, 40)
MOUNTED_BOUND = 40  # ChatMessages mounted right after opening a long chat, at most (all 600 before the fix)

REPLY = ("Here is a paragraph explaining things in **some** detail, with `code` and more words.\n\n"
         "- first point\n- second point with *emphasis*\n- third point\n\n"
         "```python\ndef f(x):\n    return x * 2\n```\n")


def reason_of(i: int, n_pairs: int, last: str | None) -> str | None:
    if i == n_pairs - 1:
        return last
    return "stopped" if i % 7 == 3 else "eos"


def seed(data_dir: Path, n_messages: int = 600, last: str | None = "eos", title: str = "long") -> int:
    """A stored chat of ``n_messages`` (question, reply) messages, each reply a paragraph, a list and
    a code block; every 7th reply (from the 4th) was stopped; the last one ended with ``last``."""
    store = ChatStore.open(data_dir / DB_NAME)
    chat_id = store.new_chat(title=title)
    pairs = n_messages // 2
    for i in range(pairs):
        store.add_message(chat_id, "user", f"question {i}")
        store.add_message(chat_id, "assistant", f"Reply {i}. " + REPLY,
                          {"finish_reason": reason_of(i, pairs, last), "tokens": 10, "steps": 3, "tok_s": 5.0})
    store.close()
    return chat_id


def mounted(app) -> list[ChatMessage]:
    return list(app.chat.query_one(MessageList).query_children(ChatMessage))


def check_tail(app) -> None:
    """The mounted messages are the conversation's last ones, in order, each with its finish mark."""
    shown = mounted(app)
    conv = app.chat.conversation
    assert shown and len(shown) <= len(conv)
    tail = conv[len(conv) - len(shown):]
    for widget, m in zip(shown, tail):
        assert widget.role == m["role"]
        assert widget.source.startswith(m["content"]) or m["role"] != "assistant" and widget.source == m["content"]


async def scroll_to_top(pilot, app) -> None:
    column = app.chat.query_one(MessageList)
    column.scroll_home(animate=False)
    await pilot.pause()
    await pilot.pause()


# ---- opening a long chat ---------------------------------------------------------------------------
async def test_opening_a_600_message_chat_mounts_only_the_latest_and_is_quick(data_dir: Path) -> None:
    seed(data_dir)
    app = make_app(FakeEngine(["ok"]))
    start = time.monotonic()
    async with app.run_test(size=TALL) as pilot:
        await ready(pilot)
        opened = time.monotonic() - start
        assert len(app.chat.conversation) == 600
        count = len(messages(app))
        assert 0 < count <= MOUNTED_BOUND, f"{count} messages mounted"
        assert opened < 8.0, f"opening took {opened:.1f} s"  # ~25 s on the 2-core machine before
        text = screen_text(app)
        assert "question 299" in text and "Reply 299." in text  # the latest show at once, at the bottom
        column = app.chat.query_one(MessageList)
        assert column.scroll_y == column.max_scroll_y > 0
        check_tail(app)
        began = time.monotonic()
        await send(pilot, "next")
        await reply_done(pilot)
        assert time.monotonic() - began < 4.0
        assert [(m.role, m.source) for m in mounted(app)[-2:]] == [("user", "next"), ("assistant", "ok")]
        assert len(saved(data_dir).messages(app.chat.chat_id)) == 602


async def test_scrolling_to_the_top_loads_earlier_messages_and_keeps_the_view(data_dir: Path) -> None:
    seed(data_dir, 150)  # (600 would mount 50 batches: the whole cost the first open no longer pays)
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=TALL) as pilot:
        await ready(pilot)
        column = app.chat.query_one(MessageList)
        before = mounted(app)
        first = before[0]
        assert "earlier message" not in screen_text(app)  # (at the bottom: the line is above, off screen)
        # PageUp from the prompt until the top is reached: earlier messages come in above
        y_at_top = column.content_region.y + first.virtual_region.y  # where it is on screen at the top
        app.chat.query_one(PromptInput).focus()
        for _ in range(60):
            if len(mounted(app)) > len(before):
                break
            await pilot.press("pageup")
            await pilot.pause()
        await pilot.pause()
        after = mounted(app)
        assert len(after) > len(before)
        assert after[len(after) - len(before):] == before  # the new ones went above the old ones
        assert column.scroll_y > 0  # the view stays on what was shown, not at the oldest of the batch
        assert first.region.y == y_at_top  # the message at the top of the screen did not move
        assert first.source in screen_text(app).splitlines()[y_at_top]
        check_tail(app)

        # on to the first message: every one in order, each reply with its finish mark and class
        for _ in range(200):
            if len(mounted(app)) == 150:
                break
            await scroll_to_top(pilot, app)
        shown = mounted(app)
        assert len(shown) == 150
        check_tail(app)
        for i, widget in enumerate(shown[1::2]):
            reason = reason_of(i, 75, "eos")
            assert widget.finish_reason == (reason if reason == "stopped" else None)
            assert widget.has_class("-stopped") == (reason == "stopped")
            assert widget.source == reply_markdown(f"Reply {i}. " + REPLY, reason)
        await scroll_to_top(pilot, app)
        assert "earlier message" not in screen_text(app)  # nothing left to load: the line is gone
        assert "question 0" in screen_text(app)


async def test_the_earlier_messages_line_says_how_many_and_loads_on_click(data_dir: Path) -> None:
    seed(data_dir)
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=TALL) as pilot:
        await ready(pilot)
        column = app.chat.query_one(MessageList)
        count = len(mounted(app))
        line = column.earlier_line
        assert line.display
        assert f"{600 - count} earlier messages" in str(line.render())
        line.on_click()  # (off screen: a scroll to the top would load them first)
        await wait_for(pilot, lambda: len(mounted(app)) > count)
        check_tail(app)
        assert f"{600 - len(mounted(app))} earlier messages" in str(line.render())


async def test_a_short_chat_is_shown_whole_without_the_line(data_dir: Path) -> None:
    seed(data_dir, 10)
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=TALL) as pilot:
        await ready(pilot)
        assert len(mounted(app)) == 10
        assert not app.chat.query_one(MessageList).earlier_line.display


async def test_short_messages_fill_a_tall_screen(data_dir: Path) -> None:
    """The latest messages fill the screen even when they are short (one line each)."""
    store = ChatStore.open(data_dir / DB_NAME)
    chat_id = store.new_chat(title="short ones")
    for i in range(150):
        store.add_message(chat_id, "user", f"q{i}")
        store.add_message(chat_id, "assistant", f"a{i}", {"finish_reason": "eos"})
    store.close()
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=(100, 60)) as pilot:
        await ready(pilot)
        await pilot.pause()
        await pilot.pause()
        column = app.chat.query_one(MessageList)
        assert column.max_scroll_y > 0  # more mounted than one screen holds
        assert column.scroll_y == column.max_scroll_y
        assert len(mounted(app)) < 300
        check_tail(app)


# ---- what maps widgets to the conversation, on a long chat --------------------------------------------
async def test_edit_last_on_a_long_chat(data_dir: Path) -> None:
    chat_id = seed(data_dir)
    app = make_app(FakeEngine(["edited answer"]))
    async with app.run_test(size=TALL) as pilot:
        await ready(pilot)
        count = len(mounted(app))
        app.chat.action_edit_last()
        assert app.chat.query_one(PromptInput).text == "question 299"
        await send(pilot, "question 299, edited")
        await reply_done(pilot)
        conv = app.chat.conversation
        assert len(conv) == 600 and conv[-2:] == [{"role": "user", "content": "question 299, edited"},
                                                  {"role": "assistant", "content": "edited answer"}]
        assert len(mounted(app)) == count
        check_tail(app)
        rows = saved(data_dir).messages(chat_id)
        assert len(rows) == 600 and rows[-2].content == "question 299, edited" and rows[-3].content.startswith("Reply 298.")


async def test_an_edit_that_brings_nothing_back_keeps_the_long_chat(data_dir: Path) -> None:
    chat_id = seed(data_dir, last="stopped")
    engine = BlockingEngine([])
    app = make_app(engine)
    async with app.run_test(size=TALL, notifications=True) as pilot:
        await ready(pilot)
        count = len(mounted(app))
        app.chat.action_edit_last()
        await send(pilot, "changed my mind")
        await wait_for(pilot, engine.blocking.is_set)
        await pilot.press("escape")
        await reply_done(pilot)
        conv = app.chat.conversation
        assert len(conv) == 600 and conv[-2]["content"] == "question 299"
        shown = mounted(app)
        assert len(shown) == count
        assert shown[-1].finish_reason == "stopped" and shown[-1].has_class("-stopped")  # its mark came back
        check_tail(app)
        rows = saved(data_dir).messages(chat_id)
        assert len(rows) == 600 and rows[-1].finish_reason == "stopped"


async def test_the_finish_marks_of_an_unsaved_chat_map_to_their_messages(data_dir: Path) -> None:
    """``_messages_from`` reads an unsaved reply's finish mark from its widget: by conversation index,
    with only the latest messages mounted."""
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=TALL) as pilot:
        await ready(pilot)
        screen = app.chat
        shown = []
        screen.conversation = []
        for i in range(200):
            reason = "stopped" if i % 5 == 1 else "error" if i % 5 == 3 else None
            role = "user" if i % 2 == 0 else "assistant"
            screen.conversation.append({"role": role, "content": f"m{i}"})
            shown.append((role, f"m{i}", reason if role == "assistant" else None))
        await screen.query_one(MessageList).show(shown)
        assert len(mounted(app)) < 200
        got = screen._messages_from(0)
        assert [(r, c, (st or {}).get("finish_reason")) for r, c, st in got] == shown
        got = screen._messages_from(190)
        assert [(r, c, (st or {}).get("finish_reason")) for r, c, st in got] == shown[190:]


async def test_regenerate_on_a_long_chat(data_dir: Path) -> None:
    chat_id = seed(data_dir)
    app = make_app(FakeEngine(["a new reply"]))
    async with app.run_test(size=TALL, notifications=True) as pilot:
        await ready(pilot)
        count = len(mounted(app))
        await pilot.press("ctrl+r")
        await reply_done(pilot)
        assert len(app.chat.conversation) == 600
        assert app.chat.conversation[-1] == {"role": "assistant", "content": "a new reply"}
        assert len(mounted(app)) == count and mounted(app)[-1].source == "a new reply"
        assert mounted(app)[-2].source == "question 299"
        check_tail(app)
        rows = saved(data_dir).messages(chat_id)
        assert len(rows) == 600 and rows[-1].content == "a new reply"


async def test_continue_on_a_long_chat(data_dir: Path) -> None:
    chat_id = seed(data_dir, last="length")
    app = make_app(FakeEngine([" And more."]))
    async with app.run_test(size=TALL, notifications=True) as pilot:
        await ready(pilot)
        count = len(mounted(app))
        await app.chat.action_continue_reply()
        await reply_done(pilot)
        whole = "Reply 299. " + REPLY + " And more."
        assert app.chat.conversation[-1] == {"role": "assistant", "content": whole}
        assert len(mounted(app)) == count and mounted(app)[-1].source == whole
        check_tail(app)
        rows = saved(data_dir).messages(chat_id)
        assert len(rows) == 600 and rows[-1].content == whole and rows[-1].stats["continued"] == 1


async def test_copy_and_export_a_long_chat(data_dir: Path) -> None:
    seed(data_dir)
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=TALL, notifications=True) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+y")
        assert app.clipboard == "Reply 299. " + REPLY
        app.chat.action_export_chat()
        await pilot.pause()
        (path,) = (data_dir / "exports").glob("*.md")
        assert any(m == f"Exported 600 messages to {path}" for m, _ in notices(app)), notices(app)
        text = path.read_text()
        assert "question 0" in text and "Reply 0." in text and "Reply 299." in text


async def test_switching_chats_and_back_shows_the_latest(data_dir: Path) -> None:
    seed(data_dir, title="first long")
    seed(data_dir, 400, title="second long")
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=TALL) as pilot:
        await ready(pilot)
        assert app.chat.chat_title == "second long"
        await scroll_to_top(pilot, app)  # a batch loaded, then another chat
        first = next(c for c in saved(data_dir).chats() if c.title == "first long")
        await app.chat._show_chat(first.id)
        await pilot.pause()
        assert len(app.chat.conversation) == 600 and len(mounted(app)) <= MOUNTED_BOUND
        check_tail(app)
        assert "Reply 299." in screen_text(app)


# ---- small defects of the same review -------------------------------------------------------------
async def test_renaming_a_chat_to_blanks_says_why_and_keeps_the_title(data_dir: Path) -> None:
    app = make_app(FakeEngine(["ok"]))
    async with app.run_test(size=TALL, notifications=True) as pilot:
        await ready(pilot)
        await chat(pilot, "keep my name")
        await pilot.press("ctrl+l", "r", "ctrl+u", *"   ", "enter")
        await pilot.pause()
        said = [m for m, _ in notices(app) if "empty" in m]
        assert said and all("\n" not in m for m in said), notices(app)
        assert "keep my name" in said[-1]
        assert [c.title for c in saved(data_dir).chats()] == ["keep my name"]
        assert "keep my name" in screen_text(app).splitlines()[0]


async def test_copy_while_a_reply_streams_copies_what_is_shown_of_it(data_dir: Path) -> None:
    engine = BlockingEngine(["First", " reply"])
    app = make_app(engine)
    async with app.run_test(size=TALL, notifications=True) as pilot:
        await ready(pilot)
        await send(pilot, "one")
        await wait_for(pilot, engine.blocking.is_set)
        await pilot.press("escape")
        await reply_done(pilot)
        engine.blocking.clear()
        engine.script = ["Partial", " answer"]
        await send(pilot, "two")
        await wait_for(pilot, engine.blocking.is_set)
        await wait_for(pilot, lambda: mounted(app)[-1].source == "Partial answer")
        await pilot.press("ctrl+y")
        assert app.clipboard == "Partial answer"
        said = notices(app)[-1][0]
        assert "being written" in said and "14 characters" in said
        await pilot.press("escape")
        await reply_done(pilot)
        await pilot.press("ctrl+y")  # finished: the last reply, as before
        assert app.clipboard == "Partial answer"
        assert notices(app)[-1][0].startswith("Copied the last reply (14 characters)")
