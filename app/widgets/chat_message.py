"""The conversation: a scrolling list of Markdown messages."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from textual.containers import VerticalScroll
from textual.widgets import Markdown

from ..keys import with_keys
from ..text_safety import safe_text

# How a reply that did not end normally is marked (after its text) and styled (CSS class); keys by
# binding id ({new_chat}), filled in with the user's keymap (app/keys.py).
FINISH_MARKS = {
    "stopped": "\n\n*(stopped)*",
    "error": "\n\n*(error)*",
    "context": "\n\n**Context full:** the reply reached the end of the model's context window; "
               "the next message leaves the oldest turns out (or **{new_chat}** for a new chat).",
}
FINISH_CLASSES = {"stopped": "-stopped", "error": "-error", "context": "-context"}


def user_markdown(text: str) -> str:
    """What the user typed, as Markdown that keeps their line breaks (hard breaks)."""
    return text.replace("\n", "  \n")


def system_markdown(text: str) -> str:
    """A system prompt as shown at the top of its chat."""
    return "*System prompt:* " + user_markdown(text)


def reply_markdown(text: str, finish_reason: str | None, keymap: Mapping[str, str] | None = None) -> str:
    """A reply's text with the mark of how it ended (none for eos / length), naming the keys
    ``keymap`` gives (the defaults' without one)."""
    return text + with_keys(FINISH_MARKS.get(finish_reason or "", ""), keymap)


def _safe_source(state) -> None:
    """markdown-it core rule, before ``normalize``: the text parsed is :func:`safe_text`'s (so
    every block, code included, and every streamed append is covered; ``source`` keeps the original)."""
    state.src = safe_text(state.src)


def _hard_breaks(state) -> None:
    """markdown-it core rule: every soft line break becomes a hard one (what its ``breaks`` option
    does for HTML output; Textual's renderer reads the token types, so they are changed here)."""
    for token in state.tokens:
        for child in token.children or ():
            if child.type == "softbreak":
                child.type = "hardbreak"


def _parser():
    """GitHub-flavoured Markdown with a line break kept wherever the text has one (as chat apps
    render replies): a model's list written "01: Monday\n02: Tuesday", a poem or an address stay
    on their lines instead of running into one paragraph. Code blocks are unaffected."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("gfm-like")
    md.core.ruler.before("normalize", "specchat_safe_source", _safe_source)
    md.core.ruler.push("specchat_hard_breaks", _hard_breaks)
    return md


class ChatMessage(Markdown):
    """One message rendered as Markdown; ``role`` is "user", "assistant" or "system" (CSS class ``-role``).

    ``source`` is what is displayed (user text with hard line breaks, a reply with its marks);
    the conversation sent to the engine is kept by the chat screen, not read back from here.
    """

    def __init__(self, role: str, content: str = "", finish_reason: str | None = None,
                 keymap: Mapping[str, str] | None = None, **kwargs: object) -> None:
        shown = (user_markdown(content) if role == "user" else system_markdown(content) if role == "system"
                 else reply_markdown(content, finish_reason, keymap))
        kwargs.setdefault("parser_factory", _parser)
        super().__init__(shown, classes=f"-{role}", **kwargs)  # type: ignore[arg-type]
        self.role = role
        self._mark_finish(finish_reason)

    @property
    def finish_reason(self) -> str | None:
        """How the reply shown ended, as its mark says (None: normally, or not a reply)."""
        return next((reason for reason, css in FINISH_CLASSES.items() if self.has_class(css)), None)

    def _mark_finish(self, finish_reason: str | None) -> None:
        for reason, css in FINISH_CLASSES.items():
            self.set_class(reason == finish_reason, css)

    async def finish(self, text: str, finish_reason: str | None) -> None:
        """Show the whole reply (after streaming) with the mark of how it ended."""
        await self.update(reply_markdown(text, finish_reason, getattr(self.app, "keymap", None)))
        self._mark_finish(finish_reason)


class MessageList(VerticalScroll, can_focus=False):
    """The message column. Anchored to the bottom while a reply streams, until the user scrolls."""

    @property
    def _keymap(self) -> Mapping[str, str] | None:
        """The user's keys (app/keys.py), for the marks that name one."""
        return getattr(self.app, "keymap", None)

    async def add_message(self, role: str, content: str = "", finish_reason: str | None = None) -> ChatMessage:
        message = ChatMessage(role, content, finish_reason, self._keymap)
        await self.mount(message)
        self.anchor()
        return message

    async def show(self, messages: Iterable[tuple[str, str, str | None]]) -> None:
        """Replace what is shown by ``messages``: (role, content, finish reason) each."""
        await self.remove_children()
        widgets = [ChatMessage(role, content, reason, self._keymap) for role, content, reason in messages]
        if widgets:
            await self.mount_all(widgets)
        self.scroll_end(animate=False)
        self.anchor()

    async def remove_last(self, count: int = 1) -> None:
        """Remove the last ``count`` messages (regenerate, a send that got nothing back)."""
        shown = list(self.query_children(ChatMessage))
        if count > 0 and shown:
            await self.remove_children(shown[-count:])
