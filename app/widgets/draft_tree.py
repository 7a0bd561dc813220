"""The draft tree of one step (the latest by default), accepted path highlighted; [ and ] step."""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from rich.console import Console, ConsoleOptions, RenderableType, RenderResult
from rich.measure import Measurement
from rich.text import Text
from rich.tree import Tree
from textual.binding import Binding

from engine.events import StepEvent

from ..keys import app_keys
from .fit_static import FitStatic

ACCEPTED_STYLE = "bold green"
REJECTED_STYLE = "dim"
TARGET_STYLE = "bold magenta"
STEPPED_BACK_HINT = "({tree_newer} newer, {tree_latest} latest)"  # the keys the user's keymap gives them
MAX_TREE_NODES = 40  # a bigger draft tree (optimal:256, a datastore's) shows this many nodes and a count of the rest


def token_label(text: str) -> str:
    """A token as a short quoted string, whitespace made visible (``'\\n'``, ``' the'``)."""
    return repr(text)


def target_text(ev: StepEvent) -> str | None:
    """The target's own token this step (the correction or bonus), if the engine sent segments."""
    targets = [text for text, kind in ev.segments if kind == "target"]
    return targets[-1] if targets else None


def target_label(ev: StepEvent) -> str | None:
    """The target's own token as the tree shows it: None where the step emitted none (the token
    limit, or an EOS among the accepted drafted tokens, cut the step after them: the engine still
    sends an empty target segment), "end of text" where it was the EOS that ended the reply (no text)."""
    if len(ev.emitted) <= ev.accepted:
        return None
    text = target_text(ev)
    if not text and ev.finish_reason == "eos":  # the engine cuts a step at its EOS: the last emitted token is it
        return "end of text"
    return token_label(text) if text is not None else None


def shown_nodes(parents: list[int], accepted_nodes: list[int], limit: int) -> set[int] | None:
    """The nodes a tree of more than ``limit`` shows (None: all of them): the accepted path, then
    the others breadth first (the root's children, then theirs), a node only with its parent."""
    n = len(parents)
    if n <= limit:
        return None
    children: dict[int, list[int]] = {}
    for i, parent in enumerate(parents):
        children.setdefault(parent if 0 <= parent < i else -1, []).append(i)
    keep = {i for i in accepted_nodes if 0 <= i < n}
    queue = deque(children.get(-1, []))
    while queue and len(keep) < limit:
        i = queue.popleft()
        keep.add(i)
        queue.extend(children.get(i, []))
    return keep


class TokenRun:
    """Token labels side by side, wrapped between labels only (Rich wraps a Text at any space,
    and a token label such as ``' the'`` has one inside); a label wider than the line is cut
    with an ellipsis."""

    def __init__(self, labels: list[Text]):
        self.labels = labels

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        width = max(1, options.max_width)
        out = Text(no_wrap=True, overflow="ellipsis", end="")
        col = 0
        for lab in self.labels:
            if col and col + 1 + lab.cell_len > width:
                out.append("\n")
                col = 0
            elif col:
                out.append(" ")
                col += 1
            out.append_text(lab)
            col += lab.cell_len
        yield out

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        widths = [lab.cell_len for lab in self.labels]
        return Measurement(min(max(widths), options.max_width), sum(widths) + len(widths) - 1)


def render_tree(ev: StepEvent, position: str = "") -> RenderableType:
    """A Rich tree: ✓ marks the accepted path, → the target's token after it, the rest dimmed
    (laid out at the width it is drawn at: :class:`StepTree`)."""
    title = Text(f"step {ev.step}", style="bold")
    title.append(f" · drafted {ev.drafted}, accepted {ev.accepted}{position}", style="")
    if not ev.tree_parents:
        what = "plain decoding: no draft" if ev.drafted == 0 else "no tree data for this step"
        body = Text(f"({what})", style="dim")
        target = target_label(ev)
        if target is not None:
            body.append("\n→ " + target, style=TARGET_STYLE)
        return Text.assemble(title, "\n", body)
    return StepTree(ev, title)


GUIDE_WIDTH = 4  # columns a level of a Rich tree indents its labels by ("├── ")
MIN_LABEL_WIDTH = 18  # columns a level's labels keep at least ("→ ' the' (target)"); deeper levels are folded


class StepTree:
    """One step's draft tree, built for the width it is drawn at: a level whose labels would keep
    fewer than MIN_LABEL_WIDTH columns is not drawn as a level. The deepest level that fits shows
    each node with the accepted path below it as one wrapped run (and the target's token), and a
    count of the other nodes under it: a deep tree with a rejected sibling beside each accepted
    node (an optimal or datastore tree) lost its deepest accepted tokens and the target's token
    off the panel's edge (Rich drops what has no room), its labels cut mid-token."""

    def __init__(self, ev: StepEvent, title: Text) -> None:
        self.ev, self.title = ev, title

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        yield self.build(options.max_width)

    def __rich_measure__(self, console: Console, options: ConsoleOptions) -> Measurement:
        return Measurement.get(console, options, self.build(options.max_width))

    def build(self, width: int) -> Tree:
        ev = self.ev
        max_level = max(1, (width - MIN_LABEL_WIDTH) // GUIDE_WIDTH)  # the title is level 0
        tree = Tree(self.title, guide_style="dim")
        accepted = set(ev.accepted_nodes)
        last_accepted = ev.accepted_nodes[-1] if ev.accepted_nodes else -1
        keep = shown_nodes(ev.tree_parents, ev.accepted_nodes, MAX_TREE_NODES)
        children: dict[int, list[int]] = {}
        every: dict[int, int] = {}  # children of each node in the whole tree (a run never hides a cut sibling)
        for i, parent in enumerate(ev.tree_parents):
            parent = parent if 0 <= parent < i else -1
            every[parent] = every.get(parent, 0) + 1
            if keep is None or i in keep:
                children.setdefault(parent, []).append(i)
        target = target_label(ev)
        target_text = Text("→ " + target + " (target)", style=TARGET_STYLE) if target is not None else None

        def label(i: int) -> Text:
            word = ev.tree_text[i] if i < len(ev.tree_text) else f"#{ev.tree_tokens[i]}" if i < len(ev.tree_tokens) else "?"
            if i in accepted:
                return Text("✓ " + token_label(word), style=ACCEPTED_STYLE)
            return Text("  " + token_label(word), style=REJECTED_STYLE)

        def below(i: int) -> int:
            """The shown nodes under ``i``."""
            todo, n = list(children.get(i, [])), 0
            while todo:
                n += 1
                todo.extend(children.get(todo.pop(), []))
            return n

        # a run of nodes with one child each (a chain: pld's and sd's drafts, a tree's tail) is one
        # line of the tree, wrapped between tokens: a node a level, 4 columns of guides each, left a
        # 12-deep chain no room in the panel (Rich dropped its last levels and cut labels mid-word).
        # A run ends at the last accepted node, whose children are the target's token and the rest.
        path = list(ev.accepted_nodes)
        stack: list[tuple[int, Tree, int]] = [(i, tree, 1) for i in reversed(children.get(-1, []))]
        nodes: dict[int, Tree] = {}
        target_shown = False
        while stack:
            i, parent_node, level = stack.pop()
            if level >= max_level and children.get(i):  # no room for another level: fold what is below
                run_ids = [i] + (path[path.index(i) + 1:] if i in accepted else [])
                run = [label(j) for j in run_ids]
                if last_accepted in run_ids and target_text is not None:
                    run.append(target_text)
                    target_shown = True
                hidden = below(i) - (len(run_ids) - 1)
                if hidden:
                    run.append(Text(f"(+{hidden} below)", style=REJECTED_STYLE))
                parent_node.add(TokenRun(run))
                continue
            run = [label(i)]
            while len(children.get(i, [])) == 1 and every.get(i, 0) == 1 and i != last_accepted:
                i = children[i][0]
                run.append(label(i))
            node = parent_node.add(run[0] if len(run) == 1 else TokenRun(run))
            nodes[i] = node
            stack.extend((c, node, level + 1) for c in reversed(children.get(i, [])))
        if target_text is not None and not target_shown:
            (nodes.get(last_accepted, tree)).add(target_text)
        if keep is not None:
            tree.add(Text(f"… {len(ev.tree_parents) - len(keep)} more draft nodes not shown", style=REJECTED_STYLE))
        return tree


class DraftTreeView(FitStatic, can_focus=True):
    """Shows one step of ``events``; follows the latest step until the user steps back with [."""

    BINDINGS = [
        Binding("left_square_bracket,left", "older", "Older step", id="tree_older"),
        Binding("right_square_bracket,right", "newer", "Newer step", id="tree_newer"),
        Binding("end", "latest", "Latest step", id="tree_latest"),
    ]

    def __init__(self, **kwargs: object) -> None:
        super().__init__(Text("No step yet.", style="dim"), **kwargs)  # type: ignore[arg-type]
        self.events: Sequence[StepEvent] = ()
        self.index: int | None = None  # None: follow the latest step
        self._pinned: StepEvent | None = None  # the step at ``index`` when it was chosen

    @property
    def shown(self) -> StepEvent | None:
        """The step on display."""
        if not self.events:
            return None
        i = len(self.events) - 1 if self.index is None else min(self.index, len(self.events) - 1)
        return self.events[i]

    def show(self, events: Sequence[StepEvent]) -> None:
        """Redraw from ``events`` (the reply's steps); called by the dashboard at <= 10 Hz."""
        self.events = events
        if self.index is not None and self._pinned is not None:
            # the dashboard keeps a reply's last MAX_HISTORY steps: once full, each new step drops the
            # oldest and moves the rest down one place; the step stepped back to keeps its place on screen
            k = min(self.index, len(events) - 1)
            while k >= 0 and events[k] is not self._pinned:
                k -= 1
            self.index = max(k, 0)
        ev = self.shown
        self._pinned = ev if self.index is not None else None
        if ev is None:
            self.update(Text("No step yet.", style="dim"))
            return
        n = len(self.events)
        i = n - 1 if self.index is None else min(self.index, n - 1)
        where = " · latest" if self.index is None else f" · {i + 1}/{n}  " + app_keys(self, STEPPED_BACK_HINT)
        self.update(render_tree(ev, where))

    def reset(self) -> None:
        """A new reply: follow its latest step."""
        self.index = None
        self.show(())

    def _step_to(self, index: int | None) -> None:
        """Show ``events[index]`` (None: the latest), an index into the events shown now."""
        self.index, self._pinned = index, None
        self.show(self.events)

    def action_older(self) -> None:
        n = len(self.events)
        if n:
            self._step_to(max(0, (n - 1 if self.index is None else self.index) - 1))

    def action_newer(self) -> None:
        if self.index is not None:
            self._step_to(None if self.index + 1 >= len(self.events) - 1 else self.index + 1)

    def action_latest(self) -> None:
        self._step_to(None)
