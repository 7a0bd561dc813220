"""The conversation: a scrolling list of Markdown messages."""

from __future__ import annotations

from textual.containers import VerticalScroll
from textual.widgets import Markdown


def user_markdown(text: str) -> str:
    """What the user typed, as Markdown that keeps their line breaks (hard breaks)."""
    return text.replace("\n", "  \n")


class ChatMessage(Markdown):
    """One message rendered as Markdown; ``role`` is "user" or "assistant" (CSS class ``-role``).

    ``source`` is what is displayed (user text with hard line breaks, a reply with its marks);
    the conversation sent to the engine is kept by the chat screen, not read back from here.
    """

    def __init__(self, role: str, content: str = "", **kwargs: object) -> None:
        shown = user_markdown(content) if role == "user" else content
        super().__init__(shown, classes=f"-{role}", **kwargs)  # type: ignore[arg-type]
        self.role = role


class MessageList(VerticalScroll, can_focus=False):
    """The message column. Anchored to the bottom while a reply streams, until the user scrolls."""

    async def add_message(self, role: str, content: str = "") -> ChatMessage:
        message = ChatMessage(role, content)
        await self.mount(message)
        self.anchor()
        return message
