"""Keys typed in a burst (the input thread's delivery while a reply starves the event loop) are
applied in order: a Backspace deletes what was typed before it, not what came after (app/key_order.py)."""

from __future__ import annotations

import pytest
from textual import events
from textual.app import App
from textual.widget import Widget
from textual.widgets import Input

import app.main  # noqa: F401  (installs key_order, as the app does)
from app import key_order
from app.widgets import PromptInput

BURST = list("hello") + ["backspace"] * 5 + list("abc") + ["left", "backspace", "x"]


class TwoFields(App):
    def compose(self):
        yield Input(id="search")
        yield PromptInput(id="prompt")


async def typed(widget_id: str) -> str:
    app = TwoFields()
    async with app.run_test() as pilot:
        w = app.query_one(widget_id)
        w.focus()
        await pilot.pause()
        for k in BURST:  # back to back, no awaiting: the order the terminal sent them
            app.post_message(events.Key(k, k if len(k) == 1 else None))
        await pilot.pause(0.3)
        return w.value if isinstance(w, Input) else w.text


@pytest.mark.parametrize("widget_id", ["#prompt", "#search"])
async def test_a_burst_of_keys_is_applied_in_typing_order(widget_id):
    assert Widget.handle_key is key_order._handle_key_in_order  # installed by app.main
    assert await typed(widget_id) == "axc"


async def test_the_stock_path_reorders_them(monkeypatch):
    """The check has power: without the fix the Backspaces land after later keys."""
    monkeypatch.setattr(Widget, "handle_key", key_order._stock_handle_key)
    assert await typed("#prompt") != "axc"


class Fields(App):
    def compose(self):
        yield Input(id="a")
        yield Input("xyz", id="b")


async def test_a_widget_key_after_tab_in_the_same_burst_goes_to_the_next_field():
    """Tab (a screen binding, run by the App) then Backspace in one burst: the Backspace waits for
    the Tab, as typed, and deletes in the next field (running it at once deleted in the first)."""
    app = Fields()
    async with app.run_test() as pilot:
        app.query_one("#a").focus()
        await pilot.pause()
        for k in ["a", "b", "tab", "backspace"]:
            app.post_message(events.Key(k, k if len(k) == 1 else None))
        await pilot.pause(0.3)
        assert (app.query_one("#a").value, app.query_one("#b").value) == ("ab", "xy")
        # and the next burst in the second field is in order again
        for k in BURST:
            app.post_message(events.Key(k, k if len(k) == 1 else None))
        await pilot.pause(0.3)
        assert app.query_one("#b").value == "axc"  # (focus selected "xy": the first key replaced it)
