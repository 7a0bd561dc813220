"""Session 43: a reply that is a long or deeply nested Markdown list streams without rebuilding
the whole list on every append, and every item of a deep list is shown, in order.

Before: Textual's ``Markdown.append`` removed and remounted a list's whole widget tree on every
frame (a list is one top-level block), and markdown-it's ``maxNesting`` (20) dropped everything
after ~9 list levels, the rest of the reply included.
"""

from __future__ import annotations

import time

from textual.app import App, ComposeResult

from app.widgets.chat_message import (
    DEEP_MARK, MAX_LIST_DEPTH, ChatMessage, MessageList, StreamingBulletList, _parser,
)
from textual.widgets._markdown import MarkdownBlock, MarkdownParagraph

from .fakes import FakeEngine
from .test_chat import SIZE, make_app, messages, ready, reply_done, screen_text, send


def nested_list(depth: int, items: int) -> str:
    """``items`` bullets, item i at level ``i % depth`` (2 more spaces a level): down and down again."""
    return "".join("  " * (i % depth) + f"- item {i} word\n" for i in range(items))


def flat_paragraphs(items: int) -> str:
    return "".join(f"item {i} word\n\n" for i in range(items))


def chunks(text: str, size: int) -> list[str]:
    return [text[i:i + size] for i in range(0, len(text), size)]


def paragraph_texts(message: ChatMessage) -> list[str]:
    return [block._content.plain for block in message.query(MarkdownParagraph)]


def item_numbers(texts: list[str]) -> list[int]:
    return [int(text.split("item ", 1)[1].split()[0]) for text in texts if "item " in text]


class MessageApp(App[None]):
    def compose(self) -> ComposeResult:
        yield MessageList()


async def stream(message: ChatMessage, pieces: list[str], pilot) -> list[float]:
    """Append ``pieces`` one at a time, as the chat screen does once a frame; each one's seconds."""
    seconds = []
    for piece in pieces:
        start = time.perf_counter()
        await message.append(piece)
        await pilot.pause()
        seconds.append(time.perf_counter() - start)
    return seconds


# ---- every item, in order ---------------------------------------------------------------------
def test_deep_list_parses_every_item_in_order() -> None:
    text = nested_list(30, 60) + "\nafter the list\n"
    inlines = [t.content for t in _parser().parse(text) if t.type == "inline"]
    assert item_numbers(inlines) == list(range(60))  # was 0..8: maxNesting dropped the rest
    assert inlines[-1] == "after the list"
    deep = inlines[MAX_LIST_DEPTH]  # item 6, at depth 7: shown in its depth-6 ancestor, one mark
    assert deep.startswith(DEEP_MARK + " ") and deep.endswith("item 6 word")
    assert inlines[29] == f"{DEEP_MARK}24 ◦ item 29 word"  # depth 30: a number past 4 marks


def test_very_deep_list_and_quote_do_not_crash_the_parser() -> None:
    md = _parser()
    inlines = [t.content for t in md.parse(nested_list(120, 120)) if t.type == "inline"]
    assert item_numbers(inlines) == list(range(120))
    quote = [t for t in md.parse(">" * 100 + " deep\n") if t.type == "blockquote_open"]
    assert len(quote) == 6
    assert [t.content for t in md.parse(">" * 100 + " deep\n") if t.type == "inline"] == ["deep"]


async def test_streamed_deep_list_reply_shows_every_item() -> None:
    text = nested_list(30, 40)
    app = make_app(FakeEngine(chunks(text, 6)))
    async with app.run_test(size=(100, 40)) as pilot:
        await ready(pilot)
        await send(pilot, "a deep list please")
        await reply_done(pilot)
        reply = messages(app)[-1]
        assert reply.source == text
        assert item_numbers(paragraph_texts(reply)) == list(range(40))
        shown = screen_text(app)  # scrolled to the reply's end
        assert "item 30 word" in shown  # (item 39 is at depth 10: 4 marks)
        assert f"{DEEP_MARK * 4} ◦ item 39 word" in shown


# ---- in place, not rebuilt ----------------------------------------------------------------------
async def test_streamed_list_is_updated_in_place_not_rebuilt() -> None:
    """Each append re-parses the list; the mounted item widgets are kept (counted by identity):
    before, every append replaced every one of them."""
    text = nested_list(5, 40)  # (within MAX_LIST_DEPTH: every level a real list)
    app = MessageApp()
    async with app.run_test(size=(100, 40)) as pilot:
        message = await app.query_one(MessageList).add_message("assistant")
        seen: set[int] = set()
        kept = []  # the widget first showing item 0: the same one at the end?
        for piece in chunks(text, 12):
            await message.append(piece)
            await pilot.pause()
            blocks = list(message.query(MarkdownBlock))
            seen.update(id(block) for block in blocks)
            kept.append(blocks[0])
        final = len(list(message.query(MarkdownBlock)))
        # ~one widget per item and list level, mounted once; before: all of them again every append
        assert len(seen) <= 2 * final, (len(seen), final)
        assert kept[-1] is kept[0]
        assert isinstance(message.children[0], StreamingBulletList)
        assert item_numbers(paragraph_texts(message)) == list(range(40))


async def test_streamed_ordered_and_bullet_lists_render_as_a_fresh_update() -> None:
    """A list streamed in place shows what the same text shows rendered at once (bullets, numbers
    re-aligned at 10, a paragraph's text growing, code in an item, items appended to inner lists)."""
    text = ("Steps:\n\n" + "".join(f"{i}. step **{i}**\n   - sub a\n   - sub b\n" for i in range(1, 12))
            + "\n- x\n  ```\n  code\n  ```\n- y\n  1. z\n\nafter\n")
    app = MessageApp()
    async with app.run_test(size=(100, 80)) as pilot:
        column = app.query_one(MessageList)
        streamed = await column.add_message("assistant")
        await stream(streamed, chunks(text, 5), pilot)
        whole = await column.add_message("assistant", text)
        await pilot.pause()

        def shape(message: ChatMessage) -> list[tuple[str, str]]:
            return [(type(w).__name__, str(getattr(w, "symbol", "")) + getattr(getattr(w, "_content", None), "plain", ""))
                    for w in message.query("*")]

        assert shape(streamed) == shape(whole)
        assert streamed.region.height == whole.region.height


# ---- time ---------------------------------------------------------------------------------------
async def test_deep_list_appends_cost_about_what_paragraphs_cost() -> None:
    """A generous bound for a noisy 2-core machine: the appends of a 30-level list take under 3x
    those of flat paragraphs of the same items (measured: ~1.25x; before: ~3.8x, and growing with the list)."""
    app = MessageApp()
    async with app.run_test(size=(100, 40)) as pilot:
        column = app.query_one(MessageList)
        flat = await column.add_message("assistant")
        await stream(flat, chunks(flat_paragraphs(40), 8), pilot)  # warm-up (CSS, caches)
        timings = {}
        for name, text in (("deep", nested_list(30, 40)), ("flat", flat_paragraphs(40))):
            await column.remove_children()
            message = await column.add_message("assistant")
            pieces = chunks(text, 16 if name == "deep" else 8)[:60]  # the same number of appends
            timings[name] = sum(sorted(await stream(message, pieces, pilot))[:50])  # less the 10 slowest
        assert timings["deep"] < 3.0 * timings["flat"], timings


async def test_a_textual_release_without_the_internals_falls_back_to_a_rebuild(monkeypatch) -> None:
    """The in-place update reads Textual's private widget state; where that fails (a release that
    changed it) the list is rebuilt whole, as Textual does, and the message still shows every item."""
    from app.widgets import chat_message

    async def broken(old, new):  # type: ignore[no-untyped-def]
        raise AttributeError("'MarkdownBulletList' object has no attribute '_blocks'")

    monkeypatch.setattr(chat_message, "_sync_list", broken)
    app = MessageApp()
    async with app.run_test(size=(100, 40)) as pilot:
        message = await app.query_one(MessageList).add_message("assistant")
        await stream(message, chunks(nested_list(4, 12), 7), pilot)
        assert item_numbers(paragraph_texts(message)) == list(range(12))
