"""Every key of the app, in one table: the help screen shows it and a test keeps it in step with
the bindings. Keys use Textual's names (``ctrl+s``); :func:`key_display` prettifies them."""

from __future__ import annotations

KEYS: list[tuple[tuple[str, ...], str]] = [
    (("enter",), "send the message"),
    (("shift+enter", "ctrl+j"), "new line in the message"),
    (("escape",), "stop the reply (the partial text is kept)"),
    (("up", "down"), "earlier / later prompts (empty or one-line box)"),
    (("pageup", "pagedown"), "scroll the conversation"),
    (("ctrl+r",), "regenerate the last reply (current strategy)"),
    (("ctrl+y",), "copy the last reply to the clipboard (OSC 52)"),
    (("ctrl+n",), "new chat"),
    (("ctrl+l", "f4"), "chats: Enter, / search, r rename, Del Del delete"),
    (("ctrl+s", "f2"), "next strategy preset, live (ar … hybrid)"),
    (("ctrl+d", "f3"), "show or hide the dashboard (off below 100 columns)"),
    (("[", "]"), "older / newer draft tree (tree focused; ← →; End)"),
    (("ctrl+o",), "models: pick, download (Esc cancels), switch"),
    (("f1",), "this help"),
    (("ctrl+p",), "command palette: every knob, live; baseline"),
    (("tab", "shift+tab"), "move the focus"),
    (("ctrl+c",), "copy the selected text"),
    (("ctrl+q",), "quit"),
]

_NAMES = {"escape": "Esc", "enter": "Enter", "tab": "Tab", "pageup": "PgUp", "pagedown": "PgDn"}


def key_display(key: str) -> str:
    """``ctrl+s`` -> ``Ctrl+S``, ``escape`` -> ``Esc``, ``f2`` -> ``F2``."""
    return "+".join(_NAMES.get(part, part.upper() if len(part) == 1 or part[0] == "f" else part.title())
                    for part in key.split("+"))


def documented_keys() -> set[str]:
    return {key for keys, _ in KEYS for key in keys}
