"""Keys applied in the order they were typed (Textual issue #6605, open upstream; PR #6631).

A widget's printable keys are inserted where the focused widget handles them, but its bound keys
(Backspace, Delete, arrows, Ctrl+...) run only once the Key event has bubbled to the App's queue
(``App._on_key`` -> ``_check_bindings``). When the event loop is starved (a reply decoding on a
2-core CPU), the input thread delivers a burst of keys, and a Backspace then lands behind
characters typed after it, which it deletes: "hello" + 5 Backspaces + "abc" became "hel"
(measured: 11 of 16 runs of a typing script corrupted under load, 0 of 10 with this).

The fix runs the focused widget's own non-priority bindings from its ``handle_key``, in key order;
Screen and App bindings still reach the App as before (running them inside the widget's task
could wait on the widget itself), and while one of those is on its way, the widget's keys after
it take the same way (Tab then Backspace in a burst: the Backspace is for the next field). It uses two private attributes (``Screen._modal_binding_chain``,
the keymap applied, focused widget first; ``Key._stop_propagation``), read defensively: where a
Textual release lacks them, keys take the stock path.
"""

from __future__ import annotations

from textual import events
from textual.app import App
from textual.widget import Widget

_stock_handle_key = Widget.handle_key


_stock_app_on_key = App._on_key


def _bubbling(app: App) -> list[events.Key]:
    """The Key events the focused widget let bubble to the App (Tab, Esc, Ctrl+...: the screen's and
    the app's bindings) that the App has not run yet; one stopped on the way no longer counts."""
    pending = app.__dict__.setdefault("_specchat_keys_bubbling", [])
    pending[:] = [e for e in pending if not getattr(e, "_stop_propagation", False)]
    return pending


async def _handle_key_in_order(self: Widget, event: events.Key) -> bool:
    if await _stock_handle_key(self, event):
        return True
    if getattr(event, "_stop_propagation", False) or self.app.focused is not self:
        return False
    pending = _bubbling(self.app)
    try:
        chain = self.screen._modal_binding_chain
    except AttributeError:  # another Textual: the stock path
        return False
    # while a key typed earlier still bubbles to the App (Tab, Esc), this one waits its turn
    # there too: running it now would put it before that one
    if not pending and chain and chain[0][0] is self:
        for binding in chain[0][1].key_to_bindings.get(event.key, ()):
            if not binding.priority and await self.app.run_action(binding.action, self):
                event.stop()
                return True
    pending.append(event)
    return False


async def _app_on_key_in_order(self: App, event: events.Key) -> None:
    pending = _bubbling(self)
    if any(e is event for e in pending):
        pending[:] = [e for e in pending if e is not event]
    await _stock_app_on_key(self, event)


def install() -> None:
    """Once, before the app runs (idempotent)."""
    Widget.handle_key = _handle_key_in_order  # type: ignore[method-assign]
    App._on_key = _app_on_key_in_order  # type: ignore[method-assign]
