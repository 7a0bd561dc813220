"""Review as a daily user (session 42b): strategy switching, the keymap and help, the dashboard.
Each test failed before its fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.commands import evaluate, toggles
from app.keys import parse_keymap
from app.screens import ChatScreen, HelpScreen
from app.strategy_cycle import in_app, next_preset
from app.widgets.draft_tree import DraftTreeView, render_tree
from engine.strategy import preset

from .fakes import FakeEngine, ScriptedEngine, tree_step
from .test_chat import make_app, ready, reply_done, screen_text, send
from .test_dashboard_review_s41 import no_gpu, plain  # noqa: F401 - no_gpu: its autouse fixture, here too

WIDE = (140, 45)


def toggle(group: str, value: str):  # type: ignore[no-untyped-def]
    return next(t for t in toggles() if t.group == group and t.value == value)


# ---- the draft tree: a deep tree in the panel's width ------------------------------------------------------
def deep_tree(depth: int = 12):  # type: ignore[no-untyped-def]
    """An accepted path ``depth`` deep with a rejected sibling beside each accepted node (as an
    optimal or datastore tree has): no level is a single-child run."""
    words, parents, path = [], [], []
    prev = -1
    for d in range(depth):
        words += [f" acc{d}", f" rej{d}"]
        parents += [prev, prev]
        path.append(len(words) - 2)
        prev = path[-1]
    return tree_step(3, words, parents, path, " T")


def test_a_deep_tree_keeps_its_whole_accepted_path_and_target_token_in_the_panel() -> None:
    """At the dashboard's width a level of guides more each accepted token left the last ones no
    room: Rich dropped acc10, acc11 and the target's token, and cut labels mid-token."""
    ev = deep_tree()
    text = plain(render_tree(ev, " · latest"), width=42)
    for d in range(12):
        assert f"✓ ' acc{d}'" in text, text  # each accepted token, whole, on one line
    assert "→ ' T' (target)" in text, text
    assert text.index("' acc9'") < text.index("' acc11'") < text.index("→ ' T'")
    assert all(len(line) <= 42 for line in text.splitlines())
    # the rejected nodes under the fold are counted, not lost without a word
    hidden = sum(f"' rej{d}'" not in text for d in range(12))
    assert hidden and f"(+{hidden} below)" in text, text
    # a tree that fits is drawn as before, every node a level
    assert "below)" not in plain(render_tree(deep_tree(4)), width=42)
    wide = plain(render_tree(ev), width=140)
    assert "below)" not in wide and all(f"' rej{d}'" in wide for d in range(12))


# ---- the dashboard and the tree name the user's keys ------------------------------------------------------
async def test_the_dashboard_and_the_stepped_back_tree_name_the_keymaps_tree_keys(tmp_path: Path) -> None:
    keymap = tmp_path / "keymap.toml"
    keymap.write_text('tree_older = "alt+left"\ntree_newer = "alt+right"\ntree_latest = "home"\n')
    steps = [tree_step(i, [" a", " b"], [-1, 0], [0], " c") for i in range(1, 4)]
    app = make_app(ScriptedEngine(steps), keymap_file=str(keymap))
    async with app.run_test(size=WIDE) as pilot:
        await ready(pilot)
        await send(pilot, "hi")
        await reply_done(pilot)
        text = screen_text(app)
        assert "draft tree  (Alt+Left / Alt+Right step" in text, text  # was "([ / ] step": keys that do nothing now
        tree = app.query_one(DraftTreeView)
        tree.focus()
        await pilot.press("alt+left")
        await pilot.pause()
        assert tree.shown is not None and tree.shown.step == 2
        text = screen_text(app)
        assert "(Alt+Right newer, Home latest)" in text, text  # was "(] newer, End latest)"
    # without a keymap (and outside an app) the default keys, as before
    view = DraftTreeView()
    view.show(steps)
    view.action_older()
    assert "(] newer, End latest)" in plain(view.content, width=80)


# ---- the help key of the keymap closes the help, as F1 does ----------------------------------------------
async def test_the_help_key_from_the_keymap_also_closes_the_help(tmp_path: Path) -> None:
    keymap = tmp_path / "keymap.toml"
    keymap.write_text('help = "f5"\n')
    app = make_app(FakeEngine(), keymap_file=str(keymap))
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await pilot.press("f5")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("f5")  # it opened the help and then did nothing (F1, which no longer opens it, closed it)
        await pilot.pause()
        assert isinstance(app.screen, ChatScreen)
        await pilot.press("f5")
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")  # the dialog's own keys still close it
        await pilot.pause()
        assert isinstance(app.screen, ChatScreen)


# ---- the palette's ersd: as Ctrl+S picks it -----------------------------------------------------------------
def test_palette_ersd_races_ngram_drafts_without_a_drafter_model_as_ctrl_s_does() -> None:
    ersd = toggle("Strategy", "ersd")
    # no drafter model, from ar: the palette refused ersd ("needs a drafter model") while Ctrl+S picked it
    cycled = next_preset(preset("pld"), has_drafter=False).strategy  # sd, tree, mab, optimal skipped
    new, why = evaluate(ersd, preset("ar"), has_drafter=False)
    assert why is None and new is not None, why
    assert cycled is not None and new.label() == cycled.label() == "ersd k=5 ngram race T=0"
    # with a drafter model loaded, from pld: pld's n-gram drafts are pld itself, not the user's pick:
    # ersd raced n-gram drafts beside an idle drafter model
    new, why = evaluate(ersd, preset("pld"), has_drafter=True)
    assert new is not None and new.drafter == "model", new
    # n-gram drafts picked for sd ("Drafter: ngram") still carry over
    new, why = evaluate(ersd, preset("sd").replace(drafter="ngram"), has_drafter=True)
    assert new is not None and new.drafter == "ngram"


# ---- the palette's refusals name its entries, not command-line flags -----------------------------------
@pytest.mark.parametrize(("group", "value", "current", "says"), [
    ("Temperature", "0.7", preset("sd").replace(verify="greedy"), "Verifier: greedy needs temperature 0"),
    ("Verifier", "race", preset("sd"), "Verifier: race pairs with Strategy: ersd"),
    ("Verifier", "rs", preset("sd").replace(drafter="ngram"), "Verifier: rs needs draft probabilities"),
    ("Verifier", "greedy", preset("ersd"), "(Verifier: race)"),
])
def test_palette_refusals_name_the_palettes_entries_not_flags(group: str, value: str, current, says: str) -> None:  # type: ignore[no-untyped-def]
    new, why = evaluate(toggle(group, value), current, has_drafter=True)
    assert new is None and why is not None
    advice = in_app(why, "F9")
    assert says in advice and "--" not in advice, advice


def test_in_app_advice_for_a_hybrid_without_drafter_names_the_model_pickers_key() -> None:
    advice = in_app("hybrid combines prompt lookup with a drafter model (--drafter REF); without one use pld", "F9")
    assert advice == "hybrid combines prompt lookup with a drafter model (F9 picks a target with its drafter); without one use pld"


# ---- tokens per step: bars from 0, one column a step --------------------------------------------------
def bars(data: list[int], width: int = 10, height: int = 3) -> list[str]:
    from rich.color import Color

    from app.widgets.dashboard import StepBars  # (new in this session)

    r = StepBars(data, width=width, height=height, min_color=Color.from_rgb(0, 0, 0), max_color=Color.from_rgb(255, 0, 0))
    return plain(r, width=width).splitlines()


def test_tokens_per_step_bars_start_from_zero_one_column_a_step() -> None:
    """Textual's sparkline scaled the least value to the bottom and stretched few values over the
    width: a one-step reply was a full-width full-height block, and a 4-tokens-a-step reply the same
    flat line as plain decoding."""
    from app.widgets.dashboard import spark_title

    one = bars([4])
    assert [line.rstrip() for line in one] == ["█", "█", "█"], one  # one column, not the whole width
    lines = bars([1, 4, 2])
    assert [line[:3] for line in lines] == [" █ ", " █▄", "▆██"], lines  # 1/4, full, 1/2 of three rows
    assert all(line[3:].strip() == "" for line in lines)
    many = bars(list(range(1, 31)), width=10)  # more steps than columns: each column its steps' most
    assert all(len(line) == 10 for line in many) and many[0][-1] == "█"
    assert spark_title([1, 4, 2]) == "tokens per step  (full bar = 4)"
    assert spark_title([]) == "tokens per step"


# ---- the keymap: a mistyped binding id names the one meant -----------------------------------------------
def test_an_unknown_binding_names_the_close_one() -> None:
    keymap, problems = parse_keymap({"toggle_dashbaord": "f9", "cycle-strategy": "f6", "zzz": "f7"})
    assert keymap == {}
    assert problems[0] == "unknown binding 'toggle_dashbaord' (did you mean 'toggle_dashboard'? see the README's key table)"
    assert "did you mean 'cycle_strategy'?" in problems[1]
    assert problems[2] == "unknown binding 'zzz' (see the README's key table)"


async def test_the_speedup_line_says_whether_the_baseline_is_being_measured_or_failed() -> None:
    """The dashboard said "not measured yet" both while the plain-decoding baseline was measured and
    after its measure failed (a toast said so for 6 s, then nothing did)."""
    import threading

    from app.widgets.dashboard import speed_text

    from .test_chat import wait_for
    from .test_dashboard import WIDE, dashboard

    gate = threading.Event()

    class SlowThenFailing(ScriptedEngine):
        def measure_baseline(self, new_tokens: int = 48, stop: object = None, strategy=None):
            gate.wait(5)
            raise RuntimeError("the cache is full")

    app = make_app(SlowThenFailing([tree_step(1, ["a"], [-1], [0], "b")]))
    async with app.run_test(size=WIDE) as pilot:
        await ready(pilot)
        dash = dashboard(app)
        await wait_for(pilot, lambda: dash.baseline_pending is not None)
        assert "measuring plain decoding" in speed_text(dash.stats, dash.baseline, None, dash.baseline_pending).plain
        gate.set()
        await wait_for(pilot, lambda: "could not be measured" in (dash.baseline_pending or ""))
        assert dash.baseline is None
        assert "could not be measured: Ctrl+P, Measure, to retry" in speed_text(dash.stats, None, None, dash.baseline_pending).plain


async def test_a_saved_strategy_the_model_cannot_run_is_explained_with_the_apps_keys(data_dir: Path) -> None:
    """The notice for a saved strategy the loaded model cannot run gave the command line's advice
    ("pass --drafter REF"), in an app where the model picker is the way."""
    from app.screens.chat import SETTING_STRATEGY
    from app.store import DB_NAME, ChatStore

    from .test_chat import notices

    store = ChatStore.open(data_dir / DB_NAME)
    store.set_setting(SETTING_STRATEGY, preset("sd").to_dict())
    store.close()
    engine = FakeEngine(strategy=preset("pld"), has_drafter=False)
    app = make_app(engine)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await ready(pilot)
        said = [m for m, _ in notices(app) if m.startswith("Saved strategy not used")]
        assert said and "Ctrl+O picks a target with its drafter" in said[0] and "--drafter" not in said[0], said


def test_tab_and_shift_tab_stay_the_focus_keys() -> None:
    """`tree_older = "tab"` was accepted, and Tab could then no longer move the focus out of the
    draft tree (Shift+Tab still could); the focus keys are refused for every binding."""
    keymap, problems = parse_keymap({"tree_older": "tab", "rename_chat": "shift+tab", "help": "f5"})
    assert keymap == {"help": "f5"}
    assert problems == ["tree_older: 'tab' moves the focus between the app's parts",
                        "rename_chat: 'shift+tab' moves the focus between the app's parts"]
