"""A chat as a Markdown file (Ctrl+P: "Export this chat as Markdown")."""

from __future__ import annotations

import os
import re
from datetime import datetime
from pathlib import Path


def chat_markdown(title: str, conversation: list[dict[str, str]], model: str = "") -> str:
    """The chat as Markdown: the title, which model answered, then each message under a heading."""
    out = [f"# {title or 'Chat'}", ""]
    if model:
        out += [f"*{model}*", ""]
    for message in conversation:
        who = {"user": "You", "system": "System prompt"}.get(message["role"], "Assistant")
        out += [f"## {who}", "", message["content"].rstrip(), ""]
    return "\n".join(out)


def slug(title: str) -> str:
    """A file-name-safe form of ``title`` (letters, digits and dashes; at most 40 characters)."""
    s = re.sub(r"[^A-Za-z0-9]+", "-", title).strip("-").lower()[:40].strip("-")
    return s or "chat"


def export_chat(folder: Path, title: str, conversation: list[dict[str, str]], model: str = "",
                now: datetime | None = None) -> Path:
    """Write the chat to ``folder``/``<slug>-<date-time>.md`` (the folder made if needed; the file
    readable by its owner only, like the chat database) and return the path."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    path = folder / f"{slug(title)}-{stamp}.md"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(chat_markdown(title, conversation, model))
    return path
