"""Review s42c, as a daily user: terminal control sequences in messages and pastes, the model picker
given the Hub id already loaded, and the Markdown export's line breaks and titles."""

from __future__ import annotations

from pathlib import Path

from markdown_it import MarkdownIt
from textual import events
from textual.app import App, ComposeResult
from textual.widgets import Input

from app.export import chat_markdown
from app.widgets.chat_message import ChatMessage, MessageList
from app.widgets.prompt import PromptInput
from engine import hub

from ..fakehub import FakeHub
from .test_models_screen import Loader, engine_named, make_app, notices, open_picker, wait_for
from .test_models_screen import fake, models_file  # noqa: F401 - fixtures

UNSAFE = {chr(c) for c in (*range(0x00, 0x09), *range(0x0B, 0x20), *range(0x7F, 0xA0))}


def drawn_controls(widget) -> set[str]:
    """The control characters in what ``widget`` and its children draw (what the terminal is sent)."""
    found: set[str] = set()
    for w in widget.walk_children(with_self=True):
        for y in range(w.size.height):
            for segment in w.render_line(y):
                found |= set(segment.text) & UNSAFE
    return found


class Column(App):
    def compose(self) -> ComposeResult:
        yield MessageList()
        yield PromptInput()


# ---- control characters --------------------------------------------------------------------------
async def test_escape_sequences_in_a_reply_never_reach_the_terminal() -> None:
    """A reply (or a message) holding ESC sequences was drawn as it was: "\\x1b[2J" cleared the
    terminal, colours leaked into the app, OSC set the terminal's title; the 8-bit CSI too. Now
    whole sequences go and other controls show as symbols, in paragraphs, code blocks and while
    streaming; ``source`` keeps the text."""
    reply = "red \x1b[31mALERT\x1b[0m \x1b]0;pwned\x07 bell\x07 \x9b2J end\n\n```\n\x1b[2Jcode \x1b\n```"
    app = Column()
    async with app.run_test(size=(80, 30)) as pilot:
        column = app.query_one(MessageList)
        whole = await column.add_message("assistant", reply)
        user = await column.add_message("user", "typed \x1b[2J here")
        streamed = await column.add_message("assistant", "")
        for i in range(0, len(reply), 3):  # sequences cut between appends
            await streamed.append(reply[i:i + 3])
        await pilot.pause()
        for message in (whole, user, streamed):
            assert drawn_controls(message) == set(), message.source
        assert whole.source.startswith(reply)
        await streamed.finish(reply, None)
        await pilot.pause()
        assert drawn_controls(streamed) == set()
        text = "\n".join(line.text for w in whole.walk_children() for line in
                         (w.render_line(y) for y in range(w.size.height)))
        assert "ALERT" in text and "code ␛" in text and "[31m" not in text and "pwned" not in text


async def test_a_paste_with_escape_sequences_is_inserted_without_them() -> None:
    """A paste of coloured terminal output went into the prompt as it was: drawn raw (the terminal
    acted on it) and sent to the model. A prompt given such text otherwise (history) draws none."""
    app = Column()
    async with app.run_test(size=(60, 12)) as pilot:
        box = app.query_one(PromptInput)
        box.focus()
        app.post_message(events.Paste("\x1b[1;32mok\x1b[0m 3 passed\x07\r\nnext line"))
        await pilot.pause()
        assert box.text == "ok 3 passed\nnext line"
        app.post_message(events.Paste("plain paste"))  # a clean paste: once, as it is
        await pilot.pause()
        assert box.text == "ok 3 passed\nnext lineplain paste"
        box.text = "recalled \x1b[2J text"
        await pilot.pause()
        assert drawn_controls(box) == set()
        assert box.render_line(0).text.startswith("recalled [2J text")  # (the cursor's cells unchanged)


# ---- the model picker ----------------------------------------------------------------------------------
async def test_the_hub_id_already_loaded_is_not_loaded_again(fake: FakeHub, models_file: Path) -> None:  # noqa: F811
    """A free Hub id in use, typed in the picker's box, was loaded again (without its drafter):
    now it says it is already loaded, as a models.toml row does."""
    hub.download("org/free")
    loader = Loader()
    app = make_app(models_file, loader, engine_named("org/free", drafter="local-model"))
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        screen = await open_picker(pilot)
        box = screen.query_one(Input)
        box.focus()
        box.value = "org/free"
        await pilot.press("enter")
        await wait_for(pilot, lambda: any("org/free is already loaded." in m for m, _ in notices(app)))
        await pilot.pause(0.2)
        assert loader.calls == [] and app.screen is screen


# ---- the Markdown export ---------------------------------------------------------------------------
def rendered(markdown: str) -> str:
    return MarkdownIt("commonmark").render(markdown)


def headings(markdown: str) -> list[str]:
    tokens = MarkdownIt("commonmark").parse(markdown)
    return [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]


def test_an_export_keeps_the_line_breaks_the_app_shows() -> None:
    """The app shows every line break of a message (a list written "01: Monday\\n02: Tuesday", a
    poem, an address); the exported file ran those lines into one paragraph in any Markdown viewer.
    Code blocks (fenced, indented, in a list) and HTML stay byte for byte."""
    code = "```py\nx = 1   \ny = 2\n```"
    conv = [{"role": "system", "content": "Line one\nline two"},
            {"role": "user", "content": "Roses are red\nviolets are blue"},
            {"role": "assistant", "content": f"01: Monday\n02: Tuesday\n\n{code}\n\n- a\n\n      indented\n      code"}]
    md = chat_markdown("Days", conv)
    html = rendered(md)
    for pair in (("Line one", "line two"), ("Roses are red", "violets are blue"), ("01: Monday", "02: Tuesday")):
        assert f"{pair[0]}<br />\n{pair[1]}" in html, pair
    assert code in md and "      indented\n      code" in md
    assert headings(md) == ["Days", "System prompt", "You", "Assistant"]


def test_an_html_block_left_open_does_not_swallow_the_rest_of_the_export() -> None:
    """A message ending inside "<!--", "<pre>", "<script>" or "<?" (a reply stopped there) made
    every later message part of that HTML block: the next "## You" was no heading any more."""
    for opened in ("<!-- TODO: the rest", "<pre>\nsome output", "<script>alert(1)", "<?php echo 1;"):
        conv = [{"role": "user", "content": "q"}, {"role": "assistant", "content": opened},
                {"role": "user", "content": "next"}, {"role": "assistant", "content": "a"}]
        assert headings(chat_markdown("T", conv)) == ["T", "You", "Assistant", "You", "Assistant"], opened
    closed = "<!-- done -->\n\n<pre>x</pre>"
    assert f"## Assistant\n\n{closed}\n" in chat_markdown("T", [{"role": "assistant", "content": closed}])


def test_odd_titles_keep_their_text_as_the_heading() -> None:
    """"Issue #" came out as the heading "Issue" (a trailing # is a heading's closing sequence),
    "#" as an empty heading, a blank title as an empty heading instead of "Chat"."""
    for title, shown in (("Issue #", "<h1>Issue #</h1>"), ("#", "<h1>#</h1>"), ("   ", "<h1>Chat</h1>"),
                         ("C# vs F#", "<h1>C# vs F#</h1>"), ("a/b 🚀", "<h1>a/b 🚀</h1>")):
        assert rendered(chat_markdown(title, [{"role": "user", "content": "x"}])).startswith(shown), title


def test_a_title_from_a_message_with_escape_sequences_has_none() -> None:
    """A first message carrying "\\x1b[31m" (pasted terminal output) became a title with the ESC in
    it, drawn by the header and the chat list as it was."""
    from app.store import title_from

    assert title_from("\x1b[1;31merror\x1b[0m: build \x07failed") == "error: build failed"
    assert title_from("plain words") == "plain words"


async def test_a_model_picked_while_a_reply_runs_loads_when_it_ends(tmp_path) -> None:
    """A pick during a reply closed the picker and was refused ("stop it, then pick the model
    again"): it now loads once the reply ends, and the reply is not cut."""
    import threading

    from app.screens.models import ModelChoice

    from .fakes import FakeEngine
    from .test_chat import make_app as chat_app, notices, ready, send, wait_for

    gate = threading.Semaphore(0)
    first = FakeEngine(["a", "b", "c"], gate=gate)
    loads: list[str] = []

    def loader(target: str, drafter: object) -> FakeEngine:
        loads.append(target)
        return FakeEngine(["x"], description=f"{target} (fake)")

    app = chat_app(first, model_loader=loader)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await ready(pilot)
        await send(pilot, "go")
        gate.release()
        await wait_for(pilot, lambda: app.chat.busy)
        app.switch_model(ModelChoice("other"))
        await pilot.pause()
        assert loads == [] and app.chat.busy
        assert any("other loads once this reply ends" in m for m, _ in notices(app))
        for _ in range(5):
            gate.release()
        await wait_for(pilot, lambda: loads == ["other"])
        await wait_for(pilot, lambda: app.session is not None and "other" in app.session.description)
        assert len(first.calls) == 1 and first.steps_done >= 3  # the reply ran to its end


def test_an_entry_whose_hub_id_is_loaded_shows_as_loaded(tmp_path) -> None:
    """Started as `specchat chat org/cached`, the session's target is the Hub id: the models.toml
    entry with that hub_id showed "cached", and picking it loaded the same model again."""
    from app.screens.models import model_rows
    from engine.registry import load_registry

    from .test_models_screen import MODELS_TOML, write_models_file

    reg = load_registry(write_models_file(tmp_path, MODELS_TOML))
    rows = {r.name: r.status for r in model_rows(reg, current_target="org/cached", cache_dir=tmp_path / "cache")}
    assert rows["cached-model"] == "loaded" and rows["remote-model"] != "loaded"
