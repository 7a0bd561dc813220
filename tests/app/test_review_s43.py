"""Review as a daily user (session 43). Each test failed before its fix."""

from __future__ import annotations

from app.commands import evaluate, toggles
from engine.strategy import from_spec, preset

from .fakes import FakeEngine
from .test_chat import make_app, ready
from .test_continue import palette

SIZE = (120, 40)


def toggle(group: str, value: str):  # type: ignore[no-untyped-def]
    return next(t for t in toggles() if t.group == group and t.value == value)


def test_a_chain_preset_from_a_tree_takes_the_remembered_draft_length() -> None:
    """From a strategy without a draft length (tree, mab, optimal, ar, ersd) the palette's chain
    preset takes the app's remembered choice, as Ctrl+S does; from a chain preset its own."""
    for auto in (True, False):
        new, why = evaluate(toggle("Strategy", "sd"), preset("tree"), has_drafter=True, auto=auto)
        assert why is None and new.name == "sd" and new.adaptive is auto
    new, why = evaluate(toggle("Strategy", "hybrid"), preset("pld"), has_drafter=True, auto=True)
    assert why is None and not new.adaptive  # the running chain's own (fixed) length wins
    new, why = evaluate(toggle("Strategy", "tree"), preset("ar"), has_drafter=True, auto=True)
    assert why is None and new == preset("tree")  # a tree has no draft length to take


async def test_palette_and_ctrl_s_agree_on_the_draft_length() -> None:
    """pld:auto, Ctrl+S twice (sd:auto, tree), then the palette's "Strategy: sd" gave a fixed sd k=5
    where Ctrl+S keeps sd:auto; a fixed length picked in the palette is what Ctrl+S keeps after."""
    engine = FakeEngine(strategy=from_spec("pld:auto"))
    app = make_app(engine)
    async with app.run_test(size=SIZE) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+s", "ctrl+s")
        assert engine.strategy.name == "tree"
        await palette(pilot, "Strategy: sd")
        assert engine.strategy.name == "sd" and engine.strategy.adaptive
        await palette(pilot, "Draft length: 3")
        assert engine.strategy.name == "sd" and not engine.strategy.adaptive
        await pilot.press("ctrl+s")
        assert engine.strategy.name == "tree"
        await palette(pilot, "Strategy: hybrid")
        assert engine.strategy.name == "hybrid" and not engine.strategy.adaptive


def test_step_bars_use_no_private_textual_api() -> None:
    """The tokens-per-step bars bucketed and blended with Textual's private helpers
    (``textual.renderables._blend_colors``, ``Sparkline._buckets``), which a Textual release may
    move or drop: our own now, with the same results."""
    import ast
    from pathlib import Path

    from rich.color import Color

    from app.widgets import dashboard
    from app.widgets.dashboard import blend, step_columns

    tree = ast.parse(Path(dashboard.__file__).read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    assert not [m for m in imported if m != "__future__" and any(p.startswith("_") for p in m.split("."))], imported
    assert "._buckets" not in Path(dashboard.__file__).read_text()
    assert step_columns([1, 2, 3], 5) == [1, 2, 3]
    assert step_columns([1, 5, 2, 2, 3, 1, 4], 3) == [5, 2, 4]  # groups of 2, 2, 3: each group's most
    cols = step_columns(list(range(100)), 7)
    assert len(cols) == 7 and cols[-1] == 99 and cols == sorted(cols)
    mid = blend(Color.from_rgb(0, 0, 0), Color.from_rgb(200, 100, 50), 0.5)
    assert mid.triplet is not None and tuple(mid.triplet) == (100, 50, 25)
    assert blend(Color.parse("red"), Color.from_rgb(1, 2, 3), 0.5) == Color.from_rgb(1, 2, 3)  # no RGB form: the top colour
