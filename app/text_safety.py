"""Text a terminal would act on, made safe to show (no textual import: the store uses it too)."""

from __future__ import annotations

import re

# Terminal control sequences and characters in a message (a model's output, a paste): written to
# the screen as they were, ESC and the 8-bit CSI (U+009B) reached the terminal, where "\x1b[2J" in a
# reply cleared it, colours leaked into the rest of the app and OSC strings set its title or
# clipboard. Whole CSI / OSC sequences go (they only style a terminal); any other C0 or C1 control
# (but tab and the line breaks) is shown as its Unicode control picture, a lone surrogate as U+FFFD.
_SEQUENCE = re.compile(r"(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]|(?:\x1b\]|\x9d)[^\x07\x1b\x9c\n]*(?:\x07|\x1b\\|\x9c)")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")


def _picture(match: re.Match[str]) -> str:
    code = ord(match.group())
    if code < 0x20:
        return chr(0x2400 + code)  # ␛ for ESC, ␇ for BEL...
    return "\u2421" if code == 0x7F else "\ufffd"


def safe_text(text: str) -> str:
    """``text`` with nothing a terminal would act on: escape sequences removed, other control
    characters shown as symbols (line breaks and tabs kept; the line count never changes)."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(_picture, _SEQUENCE.sub("", text))


def strip_controls(text: str, sequences: bool = True) -> str:
    """``text`` without escape sequences (``sequences``: else only their control characters go) and
    control characters (tab and line breaks kept; a lone surrogate becomes U+FFFD): what a paste
    into the prompt keeps. Without ``sequences`` no cell is lost (a control character takes none)."""
    if not _CONTROL.search(text):
        return text
    return _CONTROL.sub(lambda m: "\ufffd" if m.group() >= "\ud800" else "",
                        _SEQUENCE.sub("", text) if sequences else text)
