"""Every key of the app, in one table, and the user's keymap.

``KEYS`` is what the help screen shows (a test keeps it in step with the bindings): each row is
(binding id or None, default keys, what it does). Keys use Textual's names (``ctrl+s``);
:func:`key_display` prettifies them.

The keymap (as oterm's "keymap" block): a TOML file, ``keymap.toml`` in the data directory
(``$SPECCHAT_KEYMAP`` or ``specchat chat --keymap FILE`` elsewhere), maps binding ids to keys:

    toggle_dashboard = "f3"          # Ctrl+D is the prompt's delete-right again
    new_chat = ["ctrl+n", "alt+n"]

Each entry replaces all the default keys of that binding (Textual's ``App.set_keymap``). A file
that cannot be read, an unknown id, a key Textual cannot name, a plain character for a binding
that works while you type, or two bindings of the same scope on one key: each is one line in a
notice, and that entry keeps its default keys; nothing else is lost.
"""

from __future__ import annotations

import difflib
import functools
import os
import string
import tomllib
from collections.abc import Mapping
from pathlib import Path

KEYMAP_ENV = "SPECCHAT_KEYMAP"
KEYMAP_NAME = "keymap.toml"

# (binding id, or ids whose first keys the row shows, or None for fixed keys; default keys; what it
# does, naming other bindings' keys by id: with_keys)
KEYS: list[tuple[str | tuple[str, ...] | None, tuple[str, ...], str]] = [
    (None, ("enter",), "send the message"),
    (None, ("shift+enter", "ctrl+j"), "new line in the message"),
    ("stop", ("escape",), "stop the reply (the partial text is kept)"),
    (None, ("up", "down"), "earlier / later prompts (empty or one-line box)"),
    (None, ("pageup", "pagedown"), "scroll the conversation"),
    ("regenerate", ("ctrl+r",), "regenerate the last reply (current strategy)"),
    ("copy_reply", ("ctrl+y",), "copy the last reply to the clipboard (OSC 52)"),
    ("new_chat", ("ctrl+n",), "new chat"),
    ("toggle_chats", ("ctrl+l", "f4"), "chats: Enter, {search_chats} search, {rename_chat} rename, {delete_chat} {delete_chat} delete"),
    ("cycle_strategy", ("ctrl+s", "f2"), "next strategy preset, live (ar … hybrid)"),
    ("toggle_dashboard", ("ctrl+d", "f3"), "show or hide the dashboard (starts hidden below 100 columns)"),
    (("tree_older", "tree_newer"), ("[", "]"), "older / newer draft tree (focused; {tree_latest} latest)"),
    ("models", ("ctrl+o",), "models: pick, download ({close_models} cancels), switch"),
    ("help", ("f1",), "this help"),
    (None, ("ctrl+p",), "command palette: every knob, live; baseline"),
    (None, ("tab", "shift+tab"), "move the focus"),
    (None, ("ctrl+c",), "copy the selected text (none: stop the reply, as {stop})"),
    ("quit", ("ctrl+q",), "quit"),
]

# Every binding id a keymap may name -> (its default keys, scope). Scopes: "app", the app's
# priority bindings, live on every screen and dialog; "screen", the chat screen's priority ones,
# live over its widgets too; "global", the other bindings live while you type in the prompt; and
# one scope per widget or dialog. Bindings clash when their scopes are live together.
BINDINGS: dict[str, tuple[str, str]] = {
    "cycle_strategy": ("ctrl+s,f2", "app"), "models": ("ctrl+o", "app"), "quit": ("ctrl+q", "app"),
    "help": ("f1", "global"), "stop": ("escape", "global"), "toggle_chats": ("ctrl+l,f4", "global"),
    "new_chat": ("ctrl+n", "global"), "regenerate": ("ctrl+r", "global"),
    "toggle_dashboard": ("ctrl+d,f3", "screen"), "copy_reply": ("ctrl+y", "screen"),
    "tree_older": ("left_square_bracket,left", "tree"), "tree_newer": ("right_square_bracket,right", "tree"),
    "tree_latest": ("end", "tree"),
    "close_chats": ("escape", "chats"), "rename_chat": ("r", "chats"), "delete_chat": ("delete", "chats"),
    "search_chats": ("slash", "chats"),
    "close_help": ("escape,f1,q", "help"), "close_models": ("escape", "models"), "cancel_system": ("escape", "system"),
}
_WHILE_TYPING = ("app", "screen", "global")  # live while the prompt has the focus
_TEXT_BOX = (*_WHILE_TYPING, "system", "models")  # live while a text box has the focus (dialogs' too)


def _live_together(a: str, b: str) -> bool:
    """Whether bindings of these scopes can both be live, so that one key for both is a clash. A
    focused widget's key over a non-priority screen key is not one: the widget wins while it has
    the focus (Esc closes the chat list, and stops a reply elsewhere)."""
    return a == b or "app" in (a, b) or {a, b} <= {"screen", "global", "tree", "chats"} and "screen" in (a, b)


def _prompt_keys() -> dict[str, str]:
    """Keys the prompt (a TextArea) and the app keep for themselves -> what they do there: a binding
    live while typing may keep its default among them, not take a new one."""
    from textual.widgets import TextArea

    keys = {k: (b.description or b.action.replace("_", " ")).lower() for b in TextArea.BINDINGS for k in b.key.split(",")}  # type: ignore[union-attr]
    # (plain keys, Enter and Tab are refused as typing keys, Ctrl+H/I/M/[ and Ctrl+P by key_problem)
    keys.update({"ctrl+j": "new line", "ctrl+c": "copy"})
    return keys


_NAMES = {"escape": "Esc", "enter": "Enter", "tab": "Tab", "pageup": "PgUp", "pagedown": "PgDn", "delete": "Del"}
_MODIFIERS = ("ctrl", "alt", "shift", "super", "meta", "hyper")
_NAMED = {"escape", "enter", "tab", "space", "backspace", "delete", "insert", "home", "end", "pageup", "pagedown",
          "up", "down", "left", "right", *(f"f{i}" for i in range(1, 25))}


@functools.cache
def _punctuation() -> dict[str, str]:
    """Textual's names of the punctuation keys -> the characters (``slash`` -> ``/``)."""
    from textual.keys import _character_to_key

    return {_character_to_key(c): c for c in string.punctuation}


def key_display(key: str) -> str:
    """``ctrl+s`` -> ``Ctrl+S``, ``escape`` -> ``Esc``, ``f2`` -> ``F2``, ``left_square_bracket`` -> ``[``;
    a plain letter stays as typed (``r``)."""
    punct = _punctuation()
    if len(key) == 1:
        return key

    def part(p: str) -> str:
        if p in _NAMES:
            return _NAMES[p]
        if p in punct:
            return punct[p]
        return p.upper() if len(p) == 1 or p[0] == "f" and p[1:].isdigit() else p.title()

    return "+".join(part(p) for p in key.split("+"))


def documented_keys() -> set[str]:
    return {key for _, keys, _ in KEYS for key in keys}


def keymap_path(override: str | os.PathLike | None = None) -> Path:
    """The keymap file: ``override``, else $SPECCHAT_KEYMAP, else ``keymap.toml`` in the data dir."""
    if override:
        return Path(override).expanduser()
    env = os.environ.get(KEYMAP_ENV)
    if env:
        return Path(env).expanduser()
    from .store import data_dir

    return data_dir() / KEYMAP_NAME


def normalize_key(key: str) -> str | None:
    """One key in Textual's long form (``ctrl+[`` -> ``ctrl+left_square_bracket``), or None where it
    is not a key Textual can name (an unknown name, a modifier alone, a repeated modifier)."""
    parts = key.strip().split("+")
    if any(p == "" for p in parts):
        return None
    *mods, base = parts
    mods = sorted(m.lower() for m in mods)  # Textual's order (its key events sort them)
    if len(set(mods)) != len(mods) or any(m not in _MODIFIERS for m in mods):
        return None
    if len(base) != 1 or mods:
        base = base.lower()  # "Ctrl+R", as the help shows it, is ctrl+r; a plain letter keeps its case ("R" is Shift+R)
    punct = _punctuation()
    if len(base) == 1 and base in string.punctuation:
        base = next(name for name, c in punct.items() if c == base)
    elif not (base in _NAMED or base in punct or len(base) == 1 and base in string.ascii_letters + string.digits):
        return None
    return "+".join([*mods, base])


_SENT_AS = {"ctrl+h": "Backspace", "ctrl+i": "Tab", "ctrl+m": "Enter", "ctrl+left_square_bracket": "Esc"}


def key_problem(key: str) -> str | None:
    """Why a named key (``normalize_key``'s form) would not reach the app as itself in most
    terminals (without the kitty keyboard protocol), or None."""
    *mods, base = key.split("+")
    char = len(base) == 1 or base in _punctuation() or base == "space"
    if key in _SENT_AS:
        return f"arrives as {_SENT_AS[key]} in terminals"
    if key == "ctrl+p":
        return "is the command palette's key"
    if key in ("tab", "shift+tab"):  # bound in a widget, the focus could no longer leave it that way
        return "moves the focus between the app's parts"
    if key == "ctrl+at":
        return "cannot be bound by name (Textual calls it ctrl+@)"
    if "shift" in mods and char and "alt" not in mods:
        if "ctrl" in mods:
            return "arrives as Ctrl and the letter alone in most terminals"
        if len(base) == 1 and base.isalpha():  # the user's letter ("Shift+Y": write "Y")
            return f"arrives as the shifted character (write \"{base.upper()}\" for Shift+{base.upper()})"
        return "arrives as the character Shift types (write that character)"
    if "alt" in mods and char and not (len(base) == 1 and base.isalpha()):
        return "arrives without the Alt in most terminals (Alt works with letters)"
    return None


def _typing_key(key: str) -> bool:
    """A key that types: no ctrl/alt/super/meta/hyper, not F1-F24 or Esc."""
    *mods, base = key.split("+")
    if any(m in mods for m in ("ctrl", "alt", "super", "meta", "hyper")):
        return False
    return not (base == "escape" or base[0] == "f" and base[1:].isdigit())


def parse_keymap(data: Mapping[str, object]) -> tuple[dict[str, str], list[str]]:
    """A keymap table -> ({binding id: "key,key"}, problems). Entries with a problem are left out
    (their bindings keep the default keys)."""
    keymap: dict[str, str] = {}
    problems: list[str] = []
    for bid, value in data.items():
        if bid not in BINDINGS:
            close = difflib.get_close_matches(str(bid).lower().replace("-", "_"), BINDINGS, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}? " if close else ""  # a typo named no binding to write instead
            problems.append(f"unknown binding {bid!r} ({hint}see the README's key table)")
            continue
        raw = [value] if isinstance(value, str) else value
        if not isinstance(raw, list) or not raw or not all(isinstance(k, str) for k in raw):
            problems.append(f"{bid}: give a key or a list of keys, as \"ctrl+n\" or [\"ctrl+n\", \"alt+n\"]")
            continue
        keys = [k for item in raw for k in item.split(",")]  # the comma key itself is "comma"
        norm = [normalize_key(k) for k in keys]
        bad = [k for k, n in zip(keys, norm) if n is None]
        if bad:
            problems.append(f"{bid}: {bad[0]!r} is not a key name (as ctrl+n, alt+x, f6, escape, pageup)")
            continue
        why = [(k, w) for k, n in zip(keys, norm) if (w := key_problem(n))]  # type: ignore[arg-type]
        if why:
            problems.append(f"{bid}: {why[0][0]!r} {why[0][1]}")
            continue
        if BINDINGS[bid][1] in _TEXT_BOX:
            typing = [k for k, n in zip(keys, norm) if _typing_key(n)]  # type: ignore[arg-type]
            if typing:
                problems.append(f"{bid}: {typing[0]!r} is needed for typing; use a key with ctrl or alt, F1-F24 or escape")
                continue
            kept = _prompt_keys()
            defaults = BINDINGS[bid][0].split(",")
            taken = [(k, n) for k, n in zip(keys, norm) if n in kept and n not in defaults]
            if taken:
                problems.append(f"{bid}: {taken[0][0]!r} is the text box's {kept[taken[0][1]]}; pick another key")  # type: ignore[index]
                continue
        keymap[bid] = ",".join(dict.fromkeys(norm))  # type: ignore[arg-type]
    # two bindings of one scope on one key: the entries involved keep their default keys (again
    # until none clash: a default coming back may clash in turn)
    while True:
        live = [(bid, scope, key) for bid, (default, scope) in BINDINGS.items() for key in keymap.get(bid, default).split(",")]
        clashed: set[str] = set()
        for i, (a, sa, key) in enumerate(live):
            for b, sb, other in live[i + 1:]:
                if key == other and a != b and _live_together(sa, sb):
                    mine = [x for x in (a, b) if x in keymap]
                    if not set(mine) <= clashed:  # one line per entry set back
                        problems.append(f"{key_display(key)} is given to both {a} and {b}: "
                                        f"{' and '.join(mine)} keep{'s' if len(mine) == 1 else ''} the default keys")
                    clashed.update(mine)
        if not clashed:
            return keymap, problems
        keymap = {b: k for b, k in keymap.items() if b not in clashed}


def load_keymap(path: Path) -> tuple[dict[str, str], list[str]]:
    """The keymap in ``path`` (no file: an empty keymap), and its problems, one line each."""
    from engine.errors import ConfigError
    from engine.registry import MAX_MODELS_BYTES, read_small

    if not path.exists():
        return {}, []
    try:  # bounded: a keymap is a few lines, and /dev/zero given by mistake is not all of memory
        text = read_small(path, "keymap", MAX_MODELS_BYTES).decode("utf-8-sig")  # a BOM (Notepad) is fine
    except ConfigError as e:
        return {}, [f"{e}: the default keys are used"]
    except UnicodeDecodeError as e:
        return {}, [f"{path}: cannot read it ({e}): the default keys are used"]
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        return {}, [f"{path}: not valid TOML ({e}): the default keys are used"]
    if "keys" in data and isinstance(data["keys"], dict) and len(data) == 1:
        data = data["keys"]  # a [keys] table is fine too
    keymap, problems = parse_keymap(data)
    return keymap, [f"{path.name}: {p}" for p in problems]


def key_label(keymap: Mapping[str, str], binding_id: str) -> str:
    """The first key of a binding as shown (``Ctrl+N``), after the keymap."""
    return key_display(keymap.get(binding_id, BINDINGS[binding_id][0]).split(",")[0])


def keys_of(keymap: Mapping[str, str], binding_id: str | tuple[str, ...] | None, default: tuple[str, ...]) -> tuple[str, ...]:
    """A help row's keys after the keymap (a row of several ids: each one's first key)."""
    if binding_id is None:
        return default
    if isinstance(binding_id, tuple):
        if not any(b in keymap for b in binding_id):
            return default
        return tuple(keymap.get(b, BINDINGS[b][0]).split(",")[0] for b in binding_id)
    return tuple(keymap[binding_id].split(",")) if binding_id in keymap else default


def app_keys(node: object, template: str, **values: object) -> str:
    """``with_keys`` with the keymap of the app ``node`` (a widget or screen) runs in (none: the
    default keys, as for a widget drawn outside an app)."""
    try:
        app = getattr(node, "app", None)
    except RuntimeError:  # Textual's NoActiveAppError: a widget used on its own
        app = None
    return with_keys(template, getattr(app, "keymap", None), **values)


def with_keys(template: str, keymap: Mapping[str, str] | None = None, **values: object) -> str:
    """A notice naming keys by binding id (``"… or {new_chat} for a new chat"``), filled in with the
    keys the keymap gives them (``Ctrl+N`` by default); ``values`` fill the other fields."""
    labels = {bid: key_label(keymap or {}, bid) for bid in BINDINGS if "{" + bid + "}" in template}
    return template.format(**labels, **values)
