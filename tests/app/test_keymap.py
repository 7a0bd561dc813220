"""The user's keymap (app/keys.py): keymap.toml rebinds the app's keys by binding id; bad entries
are noticed in one line each and keep their defaults; the help, the footer and the notices name
the keys in use."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.keys import BINDINGS, KEYS, key_display, key_label, key_problem, keymap_path, load_keymap, normalize_key, parse_keymap, with_keys
from app.main import SpecChatApp
from app.screens import HelpScreen
from app.screens.chat import ChatScreen
from app.widgets.chat_list import ChatList
from app.widgets.draft_tree import DraftTreeView
from engine.cli import build_parser, main

from .fakes import FakeEngine
from .test_chat import SIZE, make_app, notices, ready, screen_text, wait_for


def test_the_table_of_bindings_is_the_apps() -> None:
    """Every binding has an id, BINDINGS lists each with its real default keys and a scope that
    matches where it is bound (priority ones: "app" on the app, "screen" on the chat screen), the
    help rows with ids show those bindings' keys, and the defaults never clash."""
    from textual.binding import Binding

    real: dict[str, Binding] = {}
    for cls in (SpecChatApp, ChatScreen, ChatList, DraftTreeView, HelpScreen, *_dialogs()):
        for b in cls.BINDINGS:
            assert isinstance(b, Binding) and b.id is not None, (cls, b)
            real[b.id] = b
            scope = BINDINGS[b.id][1]
            if cls is SpecChatApp:
                assert scope == ("app" if b.priority else "global"), b.id
            elif cls is ChatScreen:
                assert scope == ("screen" if b.priority else "global"), b.id
            else:
                assert scope not in ("app", "screen", "global"), b.id
    assert {b: k for b, (k, _) in BINDINGS.items()} == {b: x.key for b, x in real.items()}
    for bid, keys, what in KEYS:
        ids = (bid,) if isinstance(bid, str) else bid or ()
        if isinstance(bid, str):
            assert ",".join(normalize_key(k) for k in keys) == real[bid].key, bid  # type: ignore[misc]
        for b, k in zip(ids, keys if isinstance(bid, tuple) else ()):
            assert normalize_key(k) == real[b].key.split(",")[0]
        with_keys(what)  # every {id} in the text is a binding
    assert parse_keymap({}) == ({}, [])


def _dialogs() -> tuple[type, ...]:
    from app.screens.models import ModelsScreen
    from app.screens.system_prompt import SystemPromptScreen

    return ModelsScreen, SystemPromptScreen


@pytest.mark.parametrize("key, want", [
    ("ctrl+n", "ctrl+n"), (" F6 ", "f6"), ("Ctrl+[", "ctrl+left_square_bracket"), ("/", "slash"), ("slash", "slash"),
    ("alt+x", "alt+x"), ("ctrl+shift+up", "ctrl+shift+up"), ("escape", "escape"), ("ctrl+plus", "ctrl+plus"),
    ("ctrl+", None), ("+", None), ("foo", None), ("ctrl+ctrl+a", None), ("cmd+a", None), ("é", None), ("", None),
    ("R", "R"), ("Ctrl+R", "ctrl+r"), ("shift+ctrl+up", "ctrl+shift+up"), ("shift+a", "shift+a"), ("shift+alt+X", "alt+shift+x"),
    ("Alt+X", "alt+x"),
])
def test_key_names(key: str, want: str | None) -> None:
    assert normalize_key(key) == want


@pytest.mark.parametrize("key, why", [
    ("shift+a", "shifted character"), ("shift+y", "write \"Y\" for Shift+Y"), ("ctrl+shift+a", "Ctrl and the letter"), ("alt+slash", "without the Alt"),
    ("alt+1", "without the Alt"), ("ctrl+m", "Enter"), ("ctrl+left_square_bracket", "Esc"), ("ctrl+p", "palette"),
    ("ctrl+at", "ctrl+@"), ("alt+x", None), ("alt+shift+x", None), ("shift+f3", None), ("ctrl+shift+up", None), ("R", None),
])
def test_keys_terminals_do_not_deliver_as_named(key: str, why: str | None) -> None:
    got = key_problem(key)
    assert (got is None) if why is None else (got is not None and why in got)
    if why is not None:  # refused in any scope, one line
        keymap, problems = parse_keymap({"tree_latest": key})
        assert keymap == {} and len(problems) == 1 and why in problems[0]


def test_shift_hint_names_the_users_key_never_another_letter() -> None:
    """The Shift refusal's example is the user's own letter; for a digit or punctuation there is no
    letter to name (it said 'write "R" for Shift+R' whatever the key)."""
    assert 'write "Y" for Shift+Y' in key_problem(normalize_key("Shift+Y"))  # type: ignore[arg-type]
    for key in ("shift+1", "shift+slash", "shift+space"):
        why = key_problem(key)
        assert why is not None and "Shift+R" not in why and "write that character" in why, key


def test_key_display() -> None:
    assert [key_display(k) for k in ("ctrl+s", "escape", "f2", "left_square_bracket", "ctrl+slash", "r", "delete")] == \
        ["Ctrl+S", "Esc", "F2", "[", "Ctrl+/", "r", "Del"]


def test_parse_keeps_good_entries_and_names_each_problem() -> None:
    keymap, problems = parse_keymap({
        "toggle_dashboard": "F3", "new_chat": ["ctrl+n", "f8"], "copy_reply": "ctrl+y, alt+c",
        "bogus": "f9", "stop": "q", "quit": 3, "models": "ctrl+banana", "rename_chat": "e",
    })
    assert keymap == {"toggle_dashboard": "f3", "new_chat": "ctrl+n,f8", "copy_reply": "ctrl+y,alt+c", "rename_chat": "e"}
    assert len(problems) == 4 and all("\n" not in p for p in problems)
    assert any("bogus" in p and "unknown" in p for p in problems)
    assert any(p.startswith("stop:") and "typing" in p for p in problems)  # a plain letter while typing
    assert any(p.startswith("quit:") for p in problems)
    assert any(p.startswith("models:") and "ctrl+banana" in p for p in problems)


def test_clashes_keep_the_defaults_until_none_is_left() -> None:
    # regenerate onto new_chat's key: regenerate keeps ctrl+r
    keymap, problems = parse_keymap({"regenerate": "ctrl+n"})
    assert keymap == {} and len(problems) == 1 and "Ctrl+N" in problems[0]
    # a swap is no clash
    assert parse_keymap({"regenerate": "ctrl+n", "new_chat": "ctrl+r"}) == ({"regenerate": "ctrl+n", "new_chat": "ctrl+r"}, [])
    # help and quit clash on f9 -> both keep their defaults; help back on f1 then clashes with
    # models -> models keeps ctrl+o too
    keymap, problems = parse_keymap({"help": "f9", "quit": "f9", "models": "f1"})
    assert keymap == {} and len(problems) == 2
    # the same key in different scopes is fine (r renames in the chat list; ctrl+r is global)
    assert parse_keymap({"tree_latest": "r"}) == ({"tree_latest": "r"}, [])


def test_keys_the_prompt_or_every_dialog_needs_are_refused() -> None:
    """A binding live while typing cannot take the prompt's editing keys (it would never fire, or
    take them away), and an app-wide priority binding cannot take a dialog's Esc (Esc would quit
    from every dialog); a binding keeps its own default (Ctrl+D) though the prompt binds it."""
    for bid, key, what in (("regenerate", "ctrl+j", "new line"), ("new_chat", "ctrl+a", "cursor line start"),
                           ("help", "ctrl+c", "copy"), ("copy_reply", "ctrl+z", "undo"), ("models", "f6", "select line")):
        keymap, problems = parse_keymap({bid: key})
        assert keymap == {} and len(problems) == 1 and what in problems[0] and problems[0].startswith(bid), problems
    keymap, problems = parse_keymap({"quit": "escape", "stop": "ctrl+g"})
    assert keymap == {"stop": "ctrl+g"} and len(problems) == 1 and "quit keeps" in problems[0]
    assert parse_keymap({"toggle_dashboard": "ctrl+d"}) == ({"toggle_dashboard": "ctrl+d"}, [])
    # the chat screen's priority keys are live over the chat list: not on its keys either
    keymap, problems = parse_keymap({"rename_chat": "ctrl+y"})
    assert keymap == {} and len(problems) == 1 and "copy_reply and rename_chat" in problems[0]
    # ... but a dialog's own keys are its own
    assert parse_keymap({"cancel_system": "ctrl+g"}) == ({"cancel_system": "ctrl+g"}, [])
    # a dialog with a text box has the focus in it: no typing or editing keys there either
    for key in ("q", "ctrl+a"):
        keymap, problems = parse_keymap({"cancel_system": key})
        assert keymap == {} and len(problems) == 1, problems
    assert parse_keymap({"close_models": "x"})[0] == {}


def test_load_keymap_file(tmp_path: Path) -> None:
    assert load_keymap(tmp_path / "none.toml") == ({}, [])
    f = tmp_path / "keymap.toml"
    f.write_text('toggle_dashboard = "f3"\nnew_chat = ["ctrl+n", "f8"]\n')
    assert load_keymap(f) == ({"toggle_dashboard": "f3", "new_chat": "ctrl+n,f8"}, [])
    f.write_text('[keys]\nhelp = "f10"\n')
    assert load_keymap(f) == ({"help": "f10"}, [])
    f.write_bytes(b'\xef\xbb\xbfhelp = "f10"\r\n')  # Notepad's UTF-8 with a BOM and CRLF: was "not valid TOML"
    assert load_keymap(f) == ({"help": "f10"}, [])
    f.write_text('help = "f10\n')
    keymap, problems = load_keymap(f)
    assert keymap == {} and len(problems) == 1 and "not valid TOML" in problems[0] and "default keys" in problems[0]
    f.write_bytes(b'help = "\xff"')
    assert load_keymap(f)[0] == {} and len(load_keymap(f)[1]) == 1
    f.write_text('nope = "f10"\n')
    assert load_keymap(f)[1] == ["keymap.toml: unknown binding 'nope' (see the README's key table)"]
    # a keymap is read with a bound: a huge file (or /dev/zero given by mistake) is one problem
    f.write_bytes(b"#" * (2 << 20))
    keymap, problems = load_keymap(f)
    assert keymap == {} and problems == [f"{f}: keymap larger than 1 MB (not a keymap?): the default keys are used"]
    assert load_keymap(tmp_path)[0] == {} and "cannot read keymap" in load_keymap(tmp_path)[1][0]  # a directory


def test_keymap_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, data_dir: Path) -> None:
    assert keymap_path() == data_dir / "keymap.toml"
    monkeypatch.setenv("SPECCHAT_KEYMAP", str(tmp_path / "k.toml"))
    assert keymap_path() == tmp_path / "k.toml"
    assert keymap_path(str(tmp_path / "x.toml")) == tmp_path / "x.toml"


def test_with_keys() -> None:
    assert with_keys("press {stop}, or {new_chat} for a new chat") == "press Esc, or Ctrl+N for a new chat"
    assert with_keys("press {stop} {n}", {"stop": "ctrl+g,f9"}, n=3) == "press Ctrl+G 3"
    assert key_label({}, "toggle_chats") == "Ctrl+L"


async def test_the_app_uses_the_keymap(data_dir: Path) -> None:
    """keymap.toml in the data dir: the dashboard moves to F3 alone (Ctrl+D no longer toggles
    it), a new chat is also on F6, and the help, the title line and the notices say so."""
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "keymap.toml").write_text('toggle_dashboard = "f3"\nnew_chat = ["f8", "ctrl+n"]\nstop = "ctrl+g"\n')
    app = make_app(FakeEngine(["Hello", " there"]))
    async with app.run_test(size=(130, 40), notifications=True) as pilot:
        await ready(pilot)
        assert app.keymap == {"toggle_dashboard": "f3", "new_chat": "f8,ctrl+n", "stop": "ctrl+g"}
        assert not any(sev == "warning" for _, sev in notices(app))
        dash = app.chat.dashboard
        shown = dash.display
        await pilot.press("ctrl+d")
        await pilot.pause()
        assert dash.display == shown  # Ctrl+D is not the dashboard's any more
        await pilot.press("f3")
        await pilot.pause()
        assert dash.display != shown
        assert "F8 new" in screen_text(app)  # the title line names the first key
        assert app.chat.prompt.placeholder.endswith("F1 help)")
        await pilot.press("f1")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))
        text = screen_text(app)
        assert "F3" in text and "Ctrl+D" not in text and "Ctrl+G" in text and "Keys · 3 rebound in keymap.toml" in text
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, HelpScreen))


async def test_the_chat_list_the_context_mark_and_the_download_name_the_users_keys(data_dir: Path) -> None:
    """Text that named a key as written, whatever the keymap: the chat list's "+ New chat (Ctrl+N)"
    row, its "Press Delete again" notice, a context-full reply's "Ctrl+N for a new chat" and the
    download's "Cancel (Esc)" button name the keys the keymap gives (the defaults' without one)."""
    from app.widgets import ChatMessage
    from app.widgets.download import DownloadPanel

    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "keymap.toml").write_text('new_chat = "f8"\ndelete_chat = "x"\nclose_models = "f10"\n')
    app = make_app(FakeEngine(["Hi"], finish_reason="context"))
    async with app.run_test(size=(130, 40), notifications=True) as pilot:
        await ready(pilot)
        app.chat.prompt.text = "hello"
        await pilot.press("enter")
        await wait_for(pilot, lambda: not app.chat.busy)
        await pilot.pause()
        reply = list(app.chat.query(ChatMessage))[-1]
        assert "**F8** for a new chat" in reply.source and "Ctrl+N" not in reply.source
        await app.chat._show_chat(app.chat.chat_id)  # shown again from the store: the same mark
        reply = list(app.chat.query(ChatMessage))[-1]
        assert "**F8** for a new chat" in reply.source
        await pilot.press("ctrl+l")
        await pilot.pause()
        assert "+ New chat  (F8)" in screen_text(app) and "Ctrl+N" not in screen_text(app)
        await pilot.press("x")  # (the open chat is highlighted)
        await pilot.pause()
        assert any(m.startswith("Press x again to delete") for m, _ in notices(app)), notices(app)
        await pilot.press("escape")
        await pilot.press("ctrl+o")
        await pilot.pause()
        assert str(app.screen.query_one("#download-cancel").label) == "Cancel (F10)"
        assert isinstance(app.screen.query_one(DownloadPanel), DownloadPanel)


async def test_a_bad_keymap_is_one_notice_and_the_defaults_stay(data_dir: Path) -> None:
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "keymap.toml").write_text('toggle_dashboard = "d"\nwhatever = "f5"\nhelp = "f10"\n')
    app = make_app(FakeEngine(["Hi"]))
    async with app.run_test(size=(130, 40), notifications=True) as pilot:
        await ready(pilot)
        assert app.keymap == {"help": "f10"}
        warned = [m for m, sev in notices(app) if sev == "warning"]
        assert len(warned) == 1 and warned[0].count("\n") == 1 and "toggle_dashboard" in warned[0] and "whatever" in warned[0]
        shown = app.chat.dashboard.display
        await pilot.press("ctrl+d")  # the default still works
        await pilot.pause()
        assert app.chat.dashboard.display != shown
        assert app.chat.prompt.placeholder.endswith("· F10 help)")
        await pilot.press("f10")
        await wait_for(pilot, lambda: isinstance(app.screen, HelpScreen))


async def test_markup_in_a_keymap_is_shown_as_written(data_dir: Path) -> None:
    """Text from keymap.toml reaches a notice as written: "[/x]" (a closing markup tag) does not
    stop the app."""
    data_dir.mkdir(parents=True, exist_ok=True)
    (data_dir / "keymap.toml").write_text('"[/x]" = "f5"\nhelp = "[/b]"\n')
    app = make_app(FakeEngine(["Hi"]))
    async with app.run_test(size=(130, 40), notifications=True) as pilot:
        await ready(pilot)
        warned = [m for m, sev in notices(app) if sev == "warning"]
        assert len(warned) == 1 and "[/x]" in warned[0] and "[/b]" in warned[0]
        await pilot.pause()
        assert app.is_running


def test_cli_keymap_option(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = build_parser().parse_args(["chat", "--keymap", str(tmp_path / "k.toml")])
    assert args.keymap == str(tmp_path / "k.toml")
    assert main(["chat", "--keymap", str(tmp_path / "missing.toml")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "missing.toml" in err and "no such file" in err
