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


# HTML blocks that end only at their terminator (CommonMark's kinds 1 to 5), not at a blank line:
# one a message leaves open hid every later message of the export (a reply stopped in "<!-- ...")
_HTML_OPEN = [(re.compile(r" {0,3}<(script|pre|style|textarea)(?:[\s>]|$)", re.I), None),
              (re.compile(r" {0,3}<!--"), "-->"), (re.compile(r" {0,3}<\?"), "?>"),
              (re.compile(r" {0,3}<!\[CDATA\["), "]]>"), (re.compile(r" {0,3}<![A-Za-z]"), ">")]


def _parse(text: str):
    from markdown_it import MarkdownIt

    return MarkdownIt("gfm-like").parse(text)


def close_html(text: str) -> str:
    """``text`` with an HTML block it leaves open at its end (``<!--``, ``<pre>``, ``<script>``...)
    closed, as :func:`close_fences` closes a code block."""
    lines = text.splitlines()
    last = next((t for t in reversed(_parse(text)) if t.level == 0 and t.map), None)
    if last is None or last.type != "html_block" or last.map[1] < len(lines):
        return text
    first = lines[last.map[0]]
    for pattern, end in _HTML_OPEN:
        m = pattern.match(first)
        if m is None:
            continue
        end = end or f"</{m.group(1).lower()}>"
        block = "\n".join(lines[last.map[0]:])
        found = block.lower().find(end, m.end())
        return text if found >= 0 else text.rstrip("\n") + "\n" + end
    return text


def hard_breaks(text: str) -> str:
    """``text`` with each line break inside a paragraph made a hard one (two spaces before it), as the
    app shows messages: a Markdown viewer joined "01: Monday\n02: Tuesday", a poem or an address
    into one line. Code blocks and HTML are left as they are."""
    lines = text.split("\n")
    if len(lines) < 2:
        return text
    verbatim: set[int] = set()
    for token in _parse(text):
        if token.type in ("fence", "code_block", "html_block") and token.map:
            verbatim.update(range(*token.map))
    for i in range(len(lines) - 1):
        line = lines[i]
        if (i in verbatim or not line.strip() or not lines[i + 1].strip() or line.endswith(("  ", "\\"))):
            continue
        lines[i] = line.rstrip(" \t") + "  "
    return "\n".join(lines)


def heading(title: str) -> str:
    """A chat title as a level-1 heading: blank is "Chat"; a trailing run of ``#`` is escaped (a
    heading's closing sequence: "Issue #" came out as "Issue", "#" as an empty heading)."""
    title = title.strip() or "Chat"
    return "# " + re.sub(r"(^|\s)(#+)$", r"\1\\\2", title)


def chat_markdown(title: str, conversation: list[dict[str, str]], model: str = "") -> str:
    """The chat as Markdown: the title, which model answered, then each message under a heading."""
    out = [heading(title), ""]
    if model:
        out += [f"*{model}*", ""]
    for message in conversation:
        who = {"user": "You", "system": "System prompt"}.get(message["role"], "Assistant")
        out += [f"## {who}", "", hard_breaks(close_html(close_fences(message["content"].rstrip()))), ""]
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
