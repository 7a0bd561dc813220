"""A chat as a Markdown file (Ctrl+P: "Export this chat as Markdown")."""

from __future__ import annotations

import os
import re
from datetime import datetime
from pathlib import Path

_FENCE = re.compile(r" {0,3}(`{3,}|~{3,})(.*)")  # a CommonMark code fence line: its fence, then the rest


def close_fences(text: str) -> str:
    """``text`` with a code block it leaves open (a reply stopped or cut at the token limit inside
    one) closed: in the exported file, an open fence turned every later message into code."""
    fence = ""  # the open block's fence ("": none open)
    for line in text.splitlines():
        m = _FENCE.fullmatch(line)
        if m is None:
            continue
        mark, rest = m.groups()
        if not fence:
            if not (mark[0] == "`" and "`" in rest):  # (a backtick fence's info string has no backticks)
                fence = mark
        elif mark[0] == fence[0] and len(mark) >= len(fence) and not rest.strip():
            fence = ""
    return text if not fence else text.rstrip("\n") + "\n" + fence


def chat_markdown(title: str, conversation: list[dict[str, str]], model: str = "") -> str:
    """The chat as Markdown: the title, which model answered, then each message under a heading."""
    out = [f"# {title or 'Chat'}", ""]
    if model:
        out += [f"*{model}*", ""]
    for message in conversation:
        who = {"user": "You", "system": "System prompt"}.get(message["role"], "Assistant")
        out += [f"## {who}", "", close_fences(message["content"].rstrip()), ""]
    return "\n".join(out)


def slug(title: str) -> str:
    """A file-name-safe form of ``title`` (letters, digits and dashes; at most 40 characters)."""
    s = re.sub(r"[^A-Za-z0-9]+", "-", title).strip("-").lower()[:40].strip("-")
    return s or "chat"


def export_chat(folder: Path, title: str, conversation: list[dict[str, str]], model: str = "",
                now: datetime | None = None) -> Path:
    """Write the chat to ``folder``/``<slug>-<date-time>.md`` (``-2``, ``-3``... before ``.md`` where
    that file exists: an export never overwrites one; the folder made if needed; the file readable
    by its owner only, like the chat database) and return the path."""
    folder.mkdir(parents=True, exist_ok=True)
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    n = 1
    while True:
        path = folder / f"{slug(title)}-{stamp}{'' if n == 1 else f'-{n}'}.md"
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            break
        except FileExistsError:
            n += 1
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(chat_markdown(title, conversation, model))
    except BaseException:
        path.unlink(missing_ok=True)  # (a full disk: no half-written export left behind)
        raise
    return path
