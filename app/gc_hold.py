"""Full garbage collections held off while a reply streams (the chat screen holds them)."""

from __future__ import annotations

import gc


class FullCollectionsHeld:
    """No full garbage collection while a reply streams: Python's oldest generation waits until
    the reply is done (the young ones still run), then collects as usual at the next young
    collection, while the engine is idle.

    A full collection walks every object the app made since the last freeze (the chat's Markdown
    widgets: it grows with the conversation) with the GIL held, and the decode thread needs the GIL
    between its C passes: each one stalled decoding for its whole length (28-45 ms, twice or three
    times per four replies in `bench/app_stream.py`; 85 ms by ten replies of one chat in
    `bench/app_ui_cost.py`). A reply allocates a few MB that young collections mostly free, so
    holding the oldest generation for a reply's length costs little memory.

    ``hold()`` and ``release()`` nest (a count), and ``release()`` restores the threshold that
    was in force before the first ``hold()``.
    """

    HELD_THRESHOLD = 1 << 30  # young collections before a full one, while held: never within a reply

    def __init__(self) -> None:
        self._depth = 0
        self._saved: tuple[int, int, int] | None = None

    @property
    def held(self) -> bool:
        return self._depth > 0

    def hold(self) -> None:
        if self._depth == 0:
            self._saved = gc.get_threshold()
            gc.set_threshold(self._saved[0], self._saved[1], self.HELD_THRESHOLD)
        self._depth += 1

    def release(self) -> None:
        if self._depth == 0:
            return
        self._depth -= 1
        if self._depth == 0 and self._saved is not None:
            gc.set_threshold(*self._saved)
            self._saved = None


FULL_COLLECTIONS = FullCollectionsHeld()
