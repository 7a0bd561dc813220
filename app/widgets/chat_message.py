"""The conversation: a scrolling list of Markdown messages."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from markdown_it.token import Token
from textual import events
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widget import Widget
from textual.widgets import Markdown, Static

try:  # the list blocks Textual rebuilds whole on every append (below): its private module, so guarded
    from textual.widgets._markdown import (
        MarkdownBlock, MarkdownBullet, MarkdownBulletList, MarkdownFence, MarkdownList, MarkdownListItem,
        MarkdownOrderedList, MarkdownParagraph,
    )
except ImportError:  # a Textual release that moved them: lists are rebuilt per append, as Textual does
    MarkdownBulletList = MarkdownOrderedList = None  # type: ignore[assignment,misc]

from ..keys import with_keys
from ..text_safety import safe_text

# How a reply that did not end normally is marked (after its text) and styled (CSS class); keys by
# binding id ({new_chat}), filled in with the user's keymap (app/keys.py).
FINISH_MARKS = {
    "stopped": "\n\n*(stopped)*",
    "error": "\n\n*(error)*",
    "context": "\n\n**Context full:** the reply reached the end of the model's context window; "
               "the next message leaves the oldest turns out (or **{new_chat}** for a new chat).",
}
FINISH_CLASSES = {"stopped": "-stopped", "error": "-error", "context": "-context"}


def user_markdown(text: str) -> str:
    """What the user typed, as Markdown that keeps their line breaks (hard breaks)."""
    return text.replace("\n", "  \n")


def system_markdown(text: str) -> str:
    """A system prompt as shown at the top of its chat."""
    return "*System prompt:* " + user_markdown(text)


def reply_markdown(text: str, finish_reason: str | None, keymap: Mapping[str, str] | None = None) -> str:
    """A reply's text with the mark of how it ended (none for eos / length), naming the keys
    ``keymap`` gives (the defaults' without one)."""
    return text + with_keys(FINISH_MARKS.get(finish_reason or "", ""), keymap)


def _safe_source(state) -> None:
    """markdown-it core rule, before ``normalize``: the text parsed is :func:`safe_text`'s (so
    every block, code included, and every streamed append is covered; ``source`` keeps the original)."""
    state.src = safe_text(state.src)


def _hard_breaks(state) -> None:
    """markdown-it core rule: every soft line break becomes a hard one (what its ``breaks`` option
    does for HTML output; Textual's renderer reads the token types, so they are changed here)."""
    for token in state.tokens:
        for child in token.children or ():
            if child.type == "softbreak":
                child.type = "hardbreak"


# Deep nesting. markdown-it stops parsing at ``maxNesting`` token levels (20 in "gfm-like": a list
# and its item are two, so past ~9 list levels everything after, the rest of the reply included, was
# dropped); Textual gives every list level a list, a row, a bullet and a column widget, so a deep list
# is a deep widget tree whose layout grows with the depth, and 2 columns of width go per level.
MAX_NESTING = 256  # markdown-it's limit, raised: a list 127 levels deep still parses (tests: no RecursionError)
MAX_LIST_DEPTH = 6  # deeper list items are shown as lines in their level-6 ancestor (_clamp_nesting)
MAX_QUOTE_DEPTH = 6  # deeper block quotes are shown as the level-6 quote
DEEP_MARK = "›"  # one per level past MAX_LIST_DEPTH before a flattened item's bullet ("›››"), or "›5" from 5 on


def _deep_marker(depth: int, item: Token, ordered: bool) -> str:
    bullet = f"{item.info}{item.markup} " if ordered else Markdown.BULLETS[(depth - 1) % len(Markdown.BULLETS)]
    extra = depth - MAX_LIST_DEPTH
    return (DEEP_MARK * extra if extra < 5 else f"{DEEP_MARK}{extra}") + " " + bullet


def _marker_paragraph(marker: str, level: int) -> list[Token]:
    text = Token("text", "", 0, content=marker)
    return [Token("paragraph_open", "p", 1, level=level, block=True),
            Token("inline", "", 0, level=level + 1, content=marker, children=[text], block=True),
            Token("paragraph_close", "p", -1, level=level, block=True)]


def _clamp_nesting(state) -> None:
    """markdown-it core rule, last: lists nested deeper than :data:`MAX_LIST_DEPTH` and quotes deeper
    than :data:`MAX_QUOTE_DEPTH` are flattened into their ancestor at that depth.

    Every item keeps its text and its place in the reply; what is traded is the exact indentation:
    an item at depth ``d`` past the limit is a line of its level-``MAX_LIST_DEPTH`` ancestor's item,
    its text after ``d - MAX_LIST_DEPTH`` marks (:data:`DEEP_MARK`; "›5" for 5 and more) and its
    own bullet or number ("›› • item", "›7 1. item"); its nested content (paragraphs, code) follows it in the same column. A quote
    deeper than the limit is shown inside the limit's quote, without more bars. (Textual lays out a
    deep widget tree slowly, and a 30-level list leaves 80 columns no width for its text.)"""
    tokens = state.tokens
    if not any(t.level >= min(MAX_LIST_DEPTH, MAX_QUOTE_DEPTH) for t in tokens):  # none deeper than a limit
        return
    out: list[Token] = []
    lists: list[bool] = []  # the open lists, outermost first: ordered or not
    quotes = 0
    pending: tuple[str, int] | None = None  # a flattened item's marker, until its first text
    for token in tokens:
        kind = token.type
        if pending is not None and kind not in ("paragraph_open", "inline"):
            out.extend(_marker_paragraph(*pending))  # an item with no text first (empty, a code block)
            pending = None
        if kind in ("bullet_list_open", "ordered_list_open"):
            lists.append(kind == "ordered_list_open")
            if len(lists) > MAX_LIST_DEPTH:
                continue
        elif kind in ("bullet_list_close", "ordered_list_close"):
            lists.pop()
            if len(lists) >= MAX_LIST_DEPTH:
                continue
        elif kind == "list_item_open" and len(lists) > MAX_LIST_DEPTH:
            pending = (_deep_marker(len(lists), token, lists[-1]), token.level + 1)
            continue
        elif kind == "list_item_close" and len(lists) > MAX_LIST_DEPTH:
            continue
        elif kind == "blockquote_open":
            quotes += 1
            if quotes > MAX_QUOTE_DEPTH:
                continue
        elif kind == "blockquote_close":
            quotes -= 1
            if quotes >= MAX_QUOTE_DEPTH:
                continue
        elif kind == "inline" and pending is not None:
            token.children = [Token("text", "", 0, content=pending[0]), *(token.children or ())]
            token.content = pending[0] + token.content
            pending = None
        out.append(token)
    if pending is not None:
        out.extend(_marker_paragraph(*pending))
    state.tokens = out


def _parser():
    """GitHub-flavoured Markdown with a line break kept wherever the text has one (as chat apps
    render replies): a model's list written "01: Monday\n02: Tuesday", a poem or an address stay
    on their lines instead of running into one paragraph. Code blocks are unaffected. Lists and
    quotes nested past a depth are flattened (:func:`_clamp_nesting`), never dropped."""
    from markdown_it import MarkdownIt

    md = MarkdownIt("gfm-like", {"maxNesting": MAX_NESTING})
    md.core.ruler.before("normalize", "specchat_safe_source", _safe_source)
    md.core.ruler.push("specchat_hard_breaks", _hard_breaks)
    md.core.ruler.push("specchat_clamp_nesting", _clamp_nesting)
    return md


# Streaming a list. Textual's Markdown.append re-parses the reply from its last top-level block and,
# for any block but a paragraph or a code block, removes that block's widget and mounts the new
# one: a list is one top-level block, so every frame of a list reply unmounted and remounted every
# item so far (5 widgets per item and level: CSS, compose, layout, render), a frame's cost growing
# with the list (nested 30 levels, 60 items: ~230 ms a frame; flat, 60 items: ~500 ms at the end).
# The list blocks below update the mounted list in place instead: unchanged items are kept, a
# changed paragraph gets its new text, new items are mounted; anything else is rebuilt as before.
def _same_content(old: MarkdownBlock, new: MarkdownBlock) -> bool:
    if isinstance(old, MarkdownFence) and isinstance(new, MarkdownFence):  # (an unmounted fence has no _content)
        return (old.code, old.lexer) == (new.code, new.lexer)
    return old._content.plain == new._content.plain and list(old._content.spans) == list(new._content.spans)


async def _sync_blocks(column: Widget, blocks: list[MarkdownBlock]) -> None:
    """Make ``column``'s mounted blocks show ``blocks`` (unmounted, just parsed): the leading ones of
    the same kind are updated in place, the rest replaced."""
    shown = list(column.children)
    kept = 0
    for old, new in zip(shown, blocks):
        if type(old) is not type(new):
            break
        if isinstance(old, MarkdownList):
            if not await _sync_list(old, new):
                break
        elif isinstance(old, (MarkdownParagraph, MarkdownFence)):
            if not _same_content(old, new):
                await old._update_from_block(new)  # both update in place (same kind)
            old._copy_context(new)
        else:
            break
        old.source_range = new.source_range
        kept += 1
    if kept < len(shown):
        await column.remove_children(shown[kept:])
    if kept < len(blocks):
        await column.mount_all(blocks[kept:])


def _bullets(block: MarkdownList, items: list[MarkdownListItem]) -> list[str]:
    """The symbols Textual's list ``compose`` gives ``items`` (numbers right-aligned when ordered)."""
    if not isinstance(block, MarkdownOrderedList):
        return [item.bullet for item in items]
    try:
        start = int(items[0].bullet) if items else 1
    except ValueError:
        start = 1
    numbers = [f"{number}. " for number in range(start, start + len(items))]
    width = max((len(number) for number in numbers), default=0) + 1
    return [number.rjust(width) for number in numbers]


async def _sync_list(old: MarkdownList, new: MarkdownList) -> bool:
    """Update the mounted list ``old`` to show ``new`` in place; False (nothing changed) where its
    widgets are not the rows Textual's list ``compose`` makes (a Horizontal of a bullet and a column)."""
    rows = list(old.children)
    if not all(isinstance(row, Horizontal) and len(row.children) == 2
               and isinstance(row.children[0], MarkdownBullet) and isinstance(row.children[1], Vertical)
               for row in rows):
        return False
    items = [block for block in new._blocks if isinstance(block, MarkdownListItem)]
    symbols = _bullets(new, items)
    for row, item, symbol in zip(rows, items, symbols):
        bullet, column = row.children
        if bullet.symbol != symbol:
            bullet.symbol = symbol
        await _sync_blocks(column, item._blocks)
    if len(rows) > len(items):
        await old.remove_children(rows[len(items):])
    added = []
    for item, symbol in zip(items[len(rows):], symbols[len(rows):]):
        bullet = MarkdownBullet()
        bullet.symbol = symbol
        added.append(Horizontal(bullet, Vertical(*item._blocks)))
    if added:
        await old.mount_all(added)
    old._copy_context(new)
    new._blocks.clear()
    return True


class _InPlaceList:
    """A list block that a streamed append updates in place (:func:`_sync_list`). It reads Textual's
    private widget state (``_blocks``, ``_content``, ``_update_from_block``; Textual is pinned in
    scripts/constraints.txt): where a release changed that, the list is rebuilt whole, as Textual does."""

    async def _update_from_block(self, block: MarkdownBlock) -> None:
        try:
            done = type(block) is type(self) and await _sync_list(self, block)  # type: ignore[arg-type]
        except (AttributeError, TypeError):
            done = False
        if not done:
            await super()._update_from_block(block)  # type: ignore[misc]


_STREAMING_LISTS: dict[str, type] = {}
if MarkdownBulletList is not None and MarkdownOrderedList is not None:
    class StreamingBulletList(_InPlaceList, MarkdownBulletList):  # type: ignore[misc,valid-type]
        pass

    class StreamingOrderedList(_InPlaceList, MarkdownOrderedList):  # type: ignore[misc,valid-type]
        pass

    _STREAMING_LISTS = {"bullet_list_open": StreamingBulletList, "ordered_list_open": StreamingOrderedList}


class ChatMessage(Markdown):
    """One message rendered as Markdown; ``role`` is "user", "assistant" or "system" (CSS class ``-role``).

    ``source`` is what is displayed (user text with hard line breaks, a reply with its marks);
    the conversation sent to the engine is kept by the chat screen, not read back from here.
    Lists are the :class:`StreamingBulletList` / :class:`StreamingOrderedList` blocks, which a
    streamed append updates in place rather than rebuilds.
    """

    BLOCKS = {**Markdown.BLOCKS, **_STREAMING_LISTS}

    def __init__(self, role: str, content: str = "", finish_reason: str | None = None,
                 keymap: Mapping[str, str] | None = None, **kwargs: object) -> None:
        shown = (user_markdown(content) if role == "user" else system_markdown(content) if role == "system"
                 else reply_markdown(content, finish_reason, keymap))
        kwargs.setdefault("parser_factory", _parser)
        super().__init__(shown, classes=f"-{role}", **kwargs)  # type: ignore[arg-type]
        self.role = role
        self._mark_finish(finish_reason)

    @property
    def finish_reason(self) -> str | None:
        """How the reply shown ended, as its mark says (None: normally, or not a reply)."""
        return next((reason for reason, css in FINISH_CLASSES.items() if self.has_class(css)), None)

    def _mark_finish(self, finish_reason: str | None) -> None:
        for reason, css in FINISH_CLASSES.items():
            self.set_class(reason == finish_reason, css)

    async def finish(self, text: str, finish_reason: str | None) -> None:
        """Show the whole reply (after streaming) with the mark of how it ended."""
        await self.update(reply_markdown(text, finish_reason, getattr(self.app, "keymap", None)))
        self._mark_finish(finish_reason)


# A long chat. Every message mounted is a Markdown widget with a widget per block, list item and
# code line (a reply with a paragraph, a list and a code block: ~290 widgets), and Textual's CSS and
# layout run over the whole tree: opening a 600-message chat mounted ~170k widgets and froze the UI
# for ~25 s on the 2-core machine (57 s with a training job running), at start-up too (the last chat
# opens). Only the latest OPEN_MESSAGES are mounted when a chat is shown (more, in batches, while
# they do not fill the list's height); the earlier ones come EARLIER_BATCH at a time when the list
# is scrolled to its top, or the line above the messages (:class:`EarlierMessages`) is clicked.
OPEN_MESSAGES = 12
EARLIER_BATCH = 12
EARLIER_TEXT = "▲ {n} earlier message{s}: scroll up, or click here, to show more"


class EarlierMessages(Static):
    """The line above the mounted messages while earlier ones are not: how many, and how to show them."""

    def on_click(self) -> None:
        parent = self.parent
        if isinstance(parent, MessageList):
            parent.load_earlier()


class MessageList(VerticalScroll, can_focus=False):
    """The message column. Anchored to the bottom while a reply streams, until the user scrolls.

    A chat is shown (:meth:`show`) with only its latest messages mounted; the others wait in
    ``_earlier`` (oldest first, as (role, content, finish reason)) until :meth:`load_earlier` mounts
    the latest batch of them above the mounted ones, the view kept on what it showed. A message's
    index in the chat shown is its index among ``_earlier`` and then the mounted ChatMessages
    (:meth:`finish_reason_at`); the chat screen's conversation indices are these.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self._earlier: list[tuple[str, str, str | None]] = []
        self._loading = False  # a batch of earlier messages is being mounted
        self._shown_at = 0  # counts show()s: a batch or a fill check begun for a chat no longer shown stops
        self.earlier_line = EarlierMessages("", id="earlier-messages", markup=False)
        self.earlier_line.display = False

    def compose(self) -> ComposeResult:
        yield self.earlier_line

    @property
    def _keymap(self) -> Mapping[str, str] | None:
        """The user's keys (app/keys.py), for the marks that name one."""
        return getattr(self.app, "keymap", None)

    @property
    def earlier_count(self) -> int:
        """How many of the chat's first messages are not mounted (yet)."""
        return len(self._earlier)

    def finish_reason_at(self, index: int) -> str | None:
        """How the message at ``index`` of the chat shown ended, as its mark says, mounted or not."""
        if index < 0:
            return None
        if index < len(self._earlier):
            return self._earlier[index][2]
        shown = list(self.query_children(ChatMessage))
        index -= len(self._earlier)
        return shown[index].finish_reason if index < len(shown) else None

    def _message(self, role: str, content: str, finish_reason: str | None) -> ChatMessage:
        return ChatMessage(role, content, finish_reason, self._keymap)

    def _show_earlier_line(self) -> None:
        n = len(self._earlier)
        self.earlier_line.display = n > 0
        if n:
            self.earlier_line.update(EARLIER_TEXT.format(n=n, s="" if n == 1 else "s"))

    async def add_message(self, role: str, content: str = "", finish_reason: str | None = None) -> ChatMessage:
        message = self._message(role, content, finish_reason)
        await self.mount(message)
        self.anchor()
        return message

    async def show(self, messages: Iterable[tuple[str, str, str | None]]) -> None:
        """Replace what is shown by ``messages``: (role, content, finish reason) each; only the last
        OPEN_MESSAGES are mounted (then more while they do not fill the list: :meth:`_fill`)."""
        self._shown_at += 1
        every = list(messages)
        split = max(0, len(every) - OPEN_MESSAGES)
        self._earlier = every[:split]
        await self.remove_children(list(self.query_children(ChatMessage)))
        self._show_earlier_line()
        widgets = [self._message(*m) for m in every[split:]]
        if widgets:
            await self.mount_all(widgets)
        self.scroll_end(animate=False)
        self.anchor()
        if self._earlier:
            self.call_after_refresh(self._fill, self._shown_at)

    def _fill(self, shown_at: int) -> None:
        """While the mounted messages do not fill the list's height, the earlier ones come in."""
        if shown_at == self._shown_at and self._earlier and self.max_scroll_y <= 0 and self.size.height > 0:
            self.load_earlier(keep_view=False)

    def on_resize(self, event: events.Resize) -> None:
        if self._earlier:  # (a taller terminal: the messages may no longer fill it)
            self.call_after_refresh(self._fill, self._shown_at)

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        # scrolled to the top: the earlier messages (not where the messages do not fill the list: the
        # compositor puts an anchored list's short content at 0, and _fill is at work there)
        if self._earlier and new_value <= 0 < old_value and self.max_scroll_y > 0 and not self._loading:
            self.load_earlier()

    def load_earlier(self, keep_view: bool = True) -> None:
        """Mount the latest EARLIER_BATCH of the messages not mounted, above the mounted ones (one
        batch at a time). ``keep_view``: the view stays on the messages it showed (False: filling a
        list the messages do not fill, which stays at its bottom while anchored)."""
        if self._loading or not self._earlier:
            return
        self._loading = True
        self.run_worker(self._load_earlier(self._shown_at, keep_view), group="earlier-messages", exit_on_error=False)

    async def _load_earlier(self, shown_at: int, keep_view: bool) -> None:
        try:
            first = next(iter(self.query_children(ChatMessage)), None)
            if shown_at != self._shown_at or first is None or not self._earlier:
                return
            top = first.virtual_region.y - self.scroll_y  # where the first mounted message is in the view
            split = max(0, len(self._earlier) - EARLIER_BATCH)
            batch, self._earlier = self._earlier[split:], self._earlier[:split]  # (indices stay right meanwhile)
            with self.app.batch_update():
                self._show_earlier_line()
                await self.mount_all([self._message(*m) for m in batch], before=first)
            if keep_view:
                self.call_after_refresh(self._keep_view, first, top, shown_at)
            else:
                self.call_after_refresh(self._fill, shown_at)
        finally:
            self._loading = False
            if shown_at != self._shown_at:  # another chat was shown meanwhile: its fill waited for this one
                self.call_after_refresh(self._fill, self._shown_at)

    def _keep_view(self, first: ChatMessage, top: int, shown_at: int) -> None:
        """Scroll so that ``first`` is where it was in the view before the batch above it came."""
        if shown_at == self._shown_at and first.is_attached:
            self.scroll_to(y=first.virtual_region.y - top, animate=False, immediate=True)
        self._fill(shown_at)

    async def remove_last(self, count: int = 1) -> None:
        """Remove the last ``count`` messages (regenerate, a send that got nothing back)."""
        if count <= 0:
            return
        shown = list(self.query_children(ChatMessage))
        if shown:
            await self.remove_children(shown[-count:])
        past = count - len(shown)  # (more than are mounted: the earlier ones too)
        if past > 0 and self._earlier:
            del self._earlier[-past:]
            self._show_earlier_line()
