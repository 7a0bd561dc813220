"""The live dashboard against scripted StepEvents: numbers, sparkline, depth table, tree, toggle."""

from __future__ import annotations

import sys
import threading
import time

import pytest
from textual.widgets import Sparkline

from app.dashboard_stats import DashboardStats, tree_depth
from app.screens import ChatScreen
from app.sysinfo import GpuProbe, GpuReading, MemoryMonitor, MemoryReading, memory_lines
from app.widgets import Dashboard, DraftTreeView, StepView
from app.widgets.step_view import SEGMENT_STYLES, render_steps
from engine.events import StepEvent

from .fakes import ScriptedEngine, tree_step
from .test_chat import make_app, ready, reply_done, screen_text, send, wait_for

WIDE = (140, 60)


def script() -> list[StepEvent]:
    """Four steps: nothing accepted; plain decoding; depth 1 of 2; depth 3 of 3 (the latest)."""
    plain = StepEvent(step=2, strategy="ar greedy", drafted=0, accepted=0, emitted=[7], text=" Hi",
                      segments=[(" Hi", "target")], ms=10.0)
    return [
        tree_step(1, ["A", "B"], [-1, -1], [], "C"),
        plain,
        tree_step(3, [" the", " a", " mat"], [-1, -1, 0], [0], " rug"),
        tree_step(4, ["The", " cat", " dog", " sat"], [-1, 0, 0, 1], [0, 1, 3], " on"),
    ]


class NoGpu:
    available = False

    def read(self) -> list[GpuReading]:
        raise AssertionError("an unavailable GPU is never read")


class OneGpu:
    available = True

    def read(self) -> list[GpuReading]:
        return [GpuReading(0, "FakeGPU 80GB", 3 * 1024, 80 * 1024, 45.0)]


@pytest.fixture(autouse=True)
def no_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests never touch a real NVML: the dashboard's default monitor sees no GPU."""
    monkeypatch.setattr("app.sysinfo.GpuProbe", NoGpu)


def dashboard(app: object) -> Dashboard:
    return app.chat.dashboard  # type: ignore[attr-defined, no-any-return]


# ---- pure numbers -------------------------------------------------------------------------------
def test_acceptance_by_depth_for_a_scripted_sequence() -> None:
    stats = DashboardStats()
    for ev in script():
        stats.add(ev)
    assert stats.spec_steps == 3  # the plain step is not a speculative one
    rows = stats.acceptance_by_depth()
    assert [d for d, _ in rows] == [1, 2, 3]
    assert [f for _, f in rows] == pytest.approx([2 / 3, 1 / 3, 1 / 3])
    assert list(stats.per_step) == [1, 1, 2, 4]
    assert stats.mean_tokens_per_step == pytest.approx(2.0)
    assert stats.tokens_per_s_avg == pytest.approx(200.0)  # 8 tokens in 4 x 10 ms
    assert tree_depth([-1, 0, 0, 1]) == 3 and tree_depth([]) == 0


def test_tokens_per_s_now_uses_the_last_ten_steps() -> None:
    stats = DashboardStats()
    for i in range(10):
        stats.add(tree_step(i, ["a"], [-1], [0], "b", ms=100.0))  # 2 tokens / 100 ms
    for i in range(10, 20):
        stats.add(tree_step(i, ["a"], [-1], [0], "b", ms=10.0))  # 2 tokens / 10 ms
    assert stats.tokens_per_s_now == pytest.approx(200.0)
    assert stats.tokens_per_s_avg == pytest.approx(40 / 1.1)


def test_step_view_colours_accepted_and_target_segments() -> None:
    text = render_steps(script()[2:])
    assert text.plain == " the rugThe cat sat on"
    styled = {text.plain[s.start:s.end]: str(s.style) for s in text.spans}
    assert styled[" rug"] == styled[" on"] == SEGMENT_STYLES["target"]
    assert styled[" the"] == styled[" sat"] == SEGMENT_STYLES["accepted"]


def test_memory_lines_show_a_gpu_only_when_there_is_one(monkeypatch: pytest.MonkeyPatch) -> None:
    reading = MemoryMonitor(gpu=NoGpu()).read()
    assert reading.rss_mb > 0 and reading.ram_total_mb > 0 and reading.gpus == []
    assert len(memory_lines(reading)) == 1 and "GPU" not in memory_lines(reading)[0]
    lines = memory_lines(MemoryReading(500, 8192, 16384, OneGpu().read()))
    assert lines == ["RSS 500 MiB · RAM 8.0/16.0 GiB (50%)", "GPU0 3.0/80.0 GiB · util 45% · FakeGPU 80GB"]
    monkeypatch.setitem(sys.modules, "pynvml", None)  # nvidia-ml-py not installed
    probe = GpuProbe()
    assert not probe.available and probe.read() == []


# ---- in the app ---------------------------------------------------------------------------------
async def test_dashboard_shows_speed_mean_and_last_step_after_a_reply() -> None:
    app = make_app(ScriptedEngine(script()))
    async with app.run_test(size=WIDE) as pilot:
        await ready(pilot)
        assert dashboard(app).display
        await send(pilot, "go")
        await reply_done(pilot)
        text = screen_text(app)
        assert "tok/s now 200.0 · avg 200.0" in text
        assert "tok/step 2.00 mean accepted length" in text
        assert "step 4: drafted 4, accepted 3" in text
        assert list(app.query_one(Sparkline).data or []) == [1, 1, 2, 4]  # one value per step
        for row in ("≥1  ████████░░░░  67%", "≥2  ████░░░░░░░░  33%", "≥3  ████░░░░░░░░  33%"):
            assert row in text
        assert " the rugThe cat sat on" in text  # the step view
        assert "RSS " in text and "RAM " in text
        assert "GPU" not in text  # no pynvml / no device: no GPU line, no error


async def test_opening_another_chat_clears_the_last_replys_numbers() -> None:
    """The dashboard's numbers belong to the chat they were measured in: a new chat (or another
    saved one) starts the panel empty, as a new reply does."""
    app = make_app(ScriptedEngine(script()))
    async with app.run_test(size=WIDE) as pilot:
        await ready(pilot)
        await send(pilot, "go")
        await reply_done(pilot)
        assert "step 4: drafted 4, accepted 3" in screen_text(app)
        await pilot.press("ctrl+n")
        await pilot.pause(0.3)
        assert dashboard(app).stats.last is None and not dashboard(app).stats.events
        assert "step 4: drafted 4" not in screen_text(app) and "tok/s now 200.0" not in screen_text(app)


async def test_gpu_line_shows_when_a_device_is_found(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("app.sysinfo.GpuProbe", OneGpu)
    app = make_app(ScriptedEngine(script()))
    async with app.run_test(size=WIDE) as pilot:
        await ready(pilot)
        assert "GPU0 3.0/80.0 GiB · util 45%" in screen_text(app)


def test_a_deep_chain_is_one_line_of_the_tree_wrapped_between_tokens() -> None:
    """A 12-deep chain in a 40-column panel: a node a level left no room (Rich dropped the last
    levels and cut labels mid-word, "(targe" / "t)"); a run of single-child nodes is one line,
    wrapped between tokens, up to the last accepted node, after which the target's token and the
    rejected rest branch."""
    from rich.console import Console

    from app.widgets.draft_tree import render_tree

    def shown(ev, width=40) -> str:
        console = Console(width=width, record=True)
        console.print(render_tree(ev))
        return console.export_text()

    words = [f" word{i}" for i in range(12)]
    text = shown(tree_step(7, words, [-1] + list(range(11)), list(range(12)), " finally"))
    assert all(f"' word{i}'" in text for i in range(12)) and "→ ' finally' (target)" in text
    assert max(len(line) for line in text.splitlines()) <= 40
    # accepted up to word4: the run ends there; the target and the rejected rest are its children
    text = shown(tree_step(7, words, [-1] + list(range(11)), [0, 1, 2, 3, 4], " instead"), width=200)
    lines = text.splitlines()
    assert "✓ ' word0' ✓ ' word1' ✓ ' word2' ✓ ' word3' ✓ ' word4'" in lines[1]
    assert any(line.strip().startswith("├──   ' word5'   ' word6'") or line.strip().startswith("└──   ' word5'")
               for line in lines[2:])
    assert any("→ ' instead' (target)" in line for line in lines[2:])


async def test_tree_view_marks_the_accepted_path_and_brackets_step_through() -> None:
    app = make_app(ScriptedEngine(script()))
    async with app.run_test(size=WIDE) as pilot:
        await ready(pilot)
        await send(pilot, "go")
        await reply_done(pilot)
        tree = app.query_one(DraftTreeView)
        text = screen_text(app)
        for marked in ("✓ 'The'", "✓ ' cat'", "✓ ' sat'", "→ ' on' (target)"):
            assert marked in text
        assert "  ' dog'" in text and "✓ ' dog'" not in text
        assert "step 4 · drafted 4, accepted 3 · latest" in text

        tree.focus()
        await pilot.press("left_square_bracket")
        assert tree.shown is not None and tree.shown.step == 3
        text = screen_text(app)
        assert "✓ ' the'" in text and "→ ' rug' (target)" in text and "  ' mat'" in text
        assert "✓ 'The'" not in text
        await pilot.press("left_square_bracket")
        assert tree.shown.step == 2 and "plain decoding: no draft" in screen_text(app)
        await pilot.press("left_square_bracket", "left_square_bracket", "left_square_bracket")
        assert tree.shown.step == 1  # stops at the first step
        await pilot.press("right_square_bracket")
        assert tree.shown.step == 2
        await pilot.press("end")
        assert tree.index is None and tree.shown.step == 4


async def test_toggle_key_hides_and_shows_and_narrow_terminals_start_hidden() -> None:
    app = make_app(ScriptedEngine(script()))
    async with app.run_test(size=WIDE) as pilot:
        await ready(pilot)
        panel = dashboard(app)
        assert panel.display
        await pilot.press("ctrl+d")
        assert not panel.display and "speedup" not in screen_text(app)
        await pilot.press("f3")
        assert panel.display and "speedup" in screen_text(app)  # (no step yet: "tok/s —", no rate of 0.0)
        await pilot.resize_terminal(90, 24)
        await pilot.pause()
        assert not panel.display  # too narrow: hidden automatically
        await pilot.press("ctrl+d")
        assert panel.display  # ... but the key still shows it
        await pilot.press("ctrl+d")
        await pilot.resize_terminal(60, 20)
        await pilot.pause()
        await pilot.press("ctrl+d")  # it would leave the messages a dozen columns: refused, said
        await pilot.pause()
        assert not panel.display
        assert any("needs 76 columns beside the chat; this terminal has 60" in str(n.message)
                   for n in app._notifications)
        await pilot.resize_terminal(*WIDE)
        await pilot.pause()
        assert panel.display
    assert isinstance(app.chat, ChatScreen)


async def test_the_chat_list_never_crushes_the_messages_between_it_and_the_dashboard() -> None:
    """Opening the chat list where it and the dashboard would leave the messages under
    CHAT_MIN_WIDTH columns hides the dashboard until the list closes; with room, both stay."""
    from app.screens.chat import CHAT_MIN_WIDTH

    app = make_app(ScriptedEngine(script()))
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        panel = dashboard(app)
        assert panel.display
        await pilot.press("ctrl+l")
        await pilot.pause()
        assert app.chat.chat_list.display and not panel.display
        assert app.chat.query_one("#chat-column").size.width >= CHAT_MIN_WIDTH
        await pilot.press("ctrl+l")
        await pilot.pause()
        assert not app.chat.chat_list.display and panel.display
        await pilot.resize_terminal(140, 40)
        await pilot.pause()
        await pilot.press("ctrl+l")
        await pilot.pause()
        assert app.chat.chat_list.display and panel.display  # room for all three
        assert app.chat.query_one("#chat-column").size.width >= CHAT_MIN_WIDTH


async def test_resizing_with_the_chat_list_open_keeps_the_messages_uncrushed() -> None:
    """A resize while the chat list is open (it had hidden the dashboard for room) brought the
    dashboard back between them, the messages squeezed to ~26 columns; it comes back once the
    terminal has room for all three, or when the list closes."""
    from app.screens.chat import CHAT_MIN_WIDTH

    app = make_app(ScriptedEngine(script()))
    async with app.run_test(size=(100, 30)) as pilot:
        await ready(pilot)
        panel = dashboard(app)
        await pilot.press("ctrl+l")
        await pilot.pause()
        assert app.chat.chat_list.display and not panel.display
        for size in ((104, 30), (90, 30), (104, 30)):  # within the wide range, then across the threshold and back
            await pilot.resize_terminal(*size)
            await pilot.pause()
            assert app.chat.chat_list.display and not panel.display, size
            assert app.chat.query_one("#chat-column").size.width >= CHAT_MIN_WIDTH, size
        await pilot.resize_terminal(140, 40)  # room for all three
        await pilot.pause()
        assert app.chat.chat_list.display and panel.display
        await pilot.resize_terminal(104, 30)
        await pilot.pause()
        assert not panel.display
        await pilot.press("escape")  # the list closes: the dashboard is back
        await pilot.pause()
        assert not app.chat.chat_list.display and panel.display


async def test_a_dashboard_chosen_with_ctrl_d_stays_out_of_the_open_chat_lists_way() -> None:
    """The dashboard shown with Ctrl+D at 80 columns, then the chat list opened (the dashboard makes
    way): a resize, even of the height alone, brought the dashboard back between the list and the
    messages, 4 columns left to them, and the prompt's placeholder wrapped at width 0 ended the
    app with a traceback. It stays out of the way until there is room or the list closes; Ctrl+D
    with the list open is refused with a notice (it crashed the same way)."""
    from app.screens.chat import CHAT_MIN_WIDTH

    app = make_app(ScriptedEngine(script()))
    async with app.run_test(size=(80, 24), notifications=True) as pilot:
        await ready(pilot)
        panel = dashboard(app)
        column = app.chat.query_one("#chat-column")
        await pilot.press("ctrl+d")
        await pilot.press("ctrl+l")
        await pilot.pause()
        assert app.chat.chat_list.display and not panel.display
        for size in ((80, 23), (90, 24), (99, 30), (80, 24)):  # (from 100 columns the width decides again)
            await pilot.resize_terminal(*size)
            await pilot.pause()
            assert app.is_running and app.chat.chat_list.display and not panel.display, size
            assert column.size.width >= CHAT_MIN_WIDTH, size
        await pilot.press("ctrl+d")  # with the list open at 80 columns: refused, said
        await pilot.pause()
        assert app.is_running and not panel.display and column.size.width >= CHAT_MIN_WIDTH
        assert any("The chat list and the dashboard side by side need 116 columns; this terminal has 80" in str(n.message)
                   for n in app._notifications)
        await pilot.press("escape")  # the list closes: the dashboard chosen is back
        await pilot.pause()
        assert not app.chat.chat_list.display and panel.display
        await send(pilot, "still here")
        await reply_done(pilot)


async def test_an_empty_prompt_squeezed_to_no_column_does_not_end_the_app() -> None:
    """The chat list open in a terminal 31-34 columns wide leaves the prompt no text column: Textual
    wrapped its placeholder at width 0 and raised, ending the app. It draws nothing there now, and
    a wider terminal shows it again."""
    from app.widgets import PromptInput

    app = make_app(ScriptedEngine(script()))
    async with app.run_test(size=(80, 24)) as pilot:
        await ready(pilot)
        await pilot.press("ctrl+l")
        for width in (34, 32, 31):
            await pilot.resize_terminal(width, 12)
            await pilot.pause()
            assert app.is_running and app.query_one(PromptInput).content_size.width == 0, width
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        await pilot.press("escape")
        await pilot.pause()
        assert "Message  (Enter send" in screen_text(app)
        await send(pilot, "still here")
        await reply_done(pilot)


async def test_dashboard_repaints_are_bounded_during_a_fast_reply() -> None:
    steps = 200
    events = [tree_step(i, ["x", "y"], [-1, 0], [0], "z", ms=1.0) for i in range(1, steps + 1)]
    app = make_app(ScriptedEngine(events, step_delay_s=0.002))
    async with app.run_test(size=WIDE) as pilot:
        await ready(pilot)
        panel = dashboard(app)
        before = panel.repaints
        start = time.monotonic()
        await send(pilot, "fast")
        await reply_done(pilot)
        elapsed = time.monotonic() - start
        repaints = panel.repaints - before
        assert list(app.query_one(Sparkline).data or []) == [2] * steps
        assert repaints < steps / 4, f"{repaints} repaints for {steps} steps"
        assert repaints <= elapsed * 10 + 3, f"{repaints} repaints in {elapsed:.2f}s"
        assert len(app.query_one(StepView).render().plain) > 0  # type: ignore[union-attr]


async def test_dashboard_updates_mid_reply_and_hiding_it_returns_the_focus() -> None:
    gate = threading.Semaphore(0)
    app = make_app(ScriptedEngine(script(), gate=gate))
    async with app.run_test(size=WIDE) as pilot:
        await ready(pilot)
        await send(pilot, "go")
        gate.release()
        await wait_for(pilot, lambda: "step 1: drafted 2, accepted 0" in screen_text(app))
        assert app.chat.busy  # still streaming: the panel updated from the drained events
        app.query_one(DraftTreeView).focus()
        await pilot.press("ctrl+d")
        assert not dashboard(app).display and app.focused is app.query_one("#prompt")
        for _ in range(3):
            gate.release()
        await reply_done(pilot)
        await pilot.press("ctrl+d")
        assert "step 4: drafted 4, accepted 3" in screen_text(app)  # repainted when shown again


def test_speedup_is_against_the_measured_baseline_and_says_so() -> None:
    from app.widgets.dashboard import BaselineInfo, speed_text

    stats = DashboardStats()
    for ev in script():
        stats.add(ev)
    assert "not measured yet" in speed_text(stats).plain
    avg = stats.tokens_per_s_avg
    text = speed_text(stats, BaselineInfo(avg / 2, "measured at start, 48 tokens")).plain
    assert "×2.00" in text and f"vs ar {avg / 2:.1f} tok/s (measured at start, 48 tokens)" in text


def test_the_prompts_prefill_shows_from_the_first_event() -> None:
    """The first event of a chat reply carries the prompt's prefill (ChatSession.stream_chat):
    the speed panel shows its new tokens, seconds and rate; before any, a dash."""
    from app.widgets.dashboard import speed_text

    stats = DashboardStats()
    assert "prefill —" in speed_text(stats).plain
    events = script()
    events[0].prefill_s, events[0].prefill_tokens = 0.5, 200
    for ev in events:
        stats.add(ev)
    assert stats.summary.prefill_s == 0.5
    assert "prefill 200 new prompt tokens in 0.50 s, 400 tok/s" in speed_text(stats).plain


def test_the_context_line_shows_how_full_the_window_is() -> None:
    from app.widgets.dashboard import speed_text

    stats = DashboardStats()
    for ev in script():
        stats.add(ev)
    stats.last.position = 1700
    text = speed_text(stats, None, 2048)
    assert "context 1,700 / 2,048 tokens (83%)" in text.plain
    assert any("yellow" in str(span.style) for span in text.spans)  # past CONTEXT_WARN
    stats.last.position = 300
    assert "context 300 / 2,048 tokens (15%)" in speed_text(stats, None, 2048).plain
    assert "context" not in speed_text(stats).plain  # no window known: no line


def test_a_chat_replys_first_event_carries_its_prefill(smollm2_gguf_path) -> None:
    """ChatSession.stream_chat: the first event has the prefill's seconds and the tokens run (a
    second turn only its new ones: the cached prefix is reused); the later events none."""
    from engine.session import ChatSession

    s = ChatSession.load(target=str(smollm2_gguf_path), strategy="ar")
    turn = [{"role": "user", "content": "Name a colour."}]
    events = list(s.stream_chat(turn, 4, threading.Event()))
    n = len(s.encode_chat(turn))
    assert events[0].prefill_s > 0 and events[0].prefill_tokens == n - 1
    assert all(e.prefill_s == 0 and e.prefill_tokens == 0 for e in events[1:])
    reply = "".join(e.text for e in events)
    turn2 = turn + [{"role": "assistant", "content": reply}, {"role": "user", "content": "Another."}]
    first = next(iter(s.stream_chat(turn2, 2, threading.Event())))
    assert 0 < first.prefill_tokens < len(s.encode_chat(turn2)) - n


def test_baseline_fit_gives_plain_decoding_speed_at_a_context() -> None:
    from engine.session import Baseline

    b = Baseline(tokens_per_s=100.0, tokens=48, context=60.0, long_tokens_per_s=50.0, long_context=1060.0)
    assert b.fitted
    assert b.tokens_per_s_at(60.0) == pytest.approx(100.0) and b.tokens_per_s_at(1060.0) == pytest.approx(50.0)
    assert b.tokens_per_s_at(560.0) == pytest.approx(1000.0 / 15.0)  # 10 ms + 5 ms: linear in the context
    assert b.tokens_per_s_at(2060.0) == pytest.approx(1000.0 / 30.0)  # beyond the long measure: the same line
    assert b.tokens_per_s_at(10.0) == pytest.approx(100.0)  # never faster than the short measure
    flat = Baseline(tokens_per_s=100.0, tokens=48, context=60.0, long_tokens_per_s=120.0, long_context=1060.0)
    assert flat.tokens_per_s_at(5000.0) == pytest.approx(100.0)  # a faster long measure (noise): no slope
    alone = Baseline(tokens_per_s=100.0, tokens=48)
    assert not alone.fitted and alone.tokens_per_s_at(5000.0) == 100.0


def test_speedup_at_a_long_context_is_against_plain_decoding_there() -> None:
    from engine.session import Baseline

    from app.widgets.dashboard import BaselineInfo, speed_text

    def reply_at(start: int) -> DashboardStats:
        stats = DashboardStats()
        for i in range(10):  # 10 plain steps of 10 ms, one token each, from position `start`
            stats.add(StepEvent(step=i + 1, strategy="ar", drafted=0, accepted=0, emitted=[5], text="x", ms=10.0, position=start + i + 1))
        return stats

    stats = reply_at(2000)
    assert stats.mean_context == pytest.approx(2004.5) and stats.tokens_per_s_avg == pytest.approx(100.0)
    fit = Baseline(tokens_per_s=200.0, tokens=48, context=60.0, long_tokens_per_s=100.0, long_context=1060.0)
    text = speed_text(stats, BaselineInfo(200.0, "ar measured at load, 48 tokens", fit=fit)).plain
    want = 1000.0 / (5.0 + 5.0 * (2004.5 - 60.0) / 1000.0)
    assert f"×{100.0 / want:.2f}" in text and f"vs ar {want:.1f} tok/s (at this reply's ~2,004-token context" in text
    assert "~60 and ~1,060 tokens" in text
    # a short conversation keeps the load-time measure as it is (under half its context too)
    for start in (40, 10):
        text = speed_text(reply_at(start), BaselineInfo(200.0, "ar measured at load, 48 tokens", fit=fit)).plain
        assert "×0.50 vs ar 200.0 tok/s (ar measured at load, 48 tokens)" in text
    # an in-app ar reply at a long context (6,000 tokens, 40 tok/s) is the reference of a reply at
    # another context only moved there along the fit (it was taken as is, whatever the context)
    app_ref = BaselineInfo(40.0, "ar in the app, last such reply, 64 tokens", fit=fit, context=6000.0)
    text = speed_text(reply_at(2000), app_ref).plain
    want = 40.0 * fit.tokens_per_s_at(2004.5) / fit.tokens_per_s_at(6000.0)
    assert want > 80 and f"vs ar {want:.1f} tok/s (at this reply's ~2,004-token context, from ar in the app at ~6,000 tokens" in text
    text = speed_text(reply_at(5000), app_ref).plain  # near its own context: as it is
    assert "vs ar 40.0 tok/s (ar in the app, last such reply, 64 tokens)" in text


def test_policy_panel_shows_bandit_arms_and_optimal_ranks() -> None:
    from app.widgets.dashboard import policy_text

    assert "static tree" in policy_text(None).plain
    # hybrid:K's mixed chain: what ranked its candidates, and where each token came from
    mixed = {"policy": "mixed chain", "confidence": [-1.0, 4.83, 2.41, 0.35], "accepted": 2, "ranked_by": "scorer",
             "fitted_on": "assets/distill/smollm2-self-eval"}
    text = policy_text(mixed).plain
    assert "mixed chain" in text and "ranked by the drafter's chain scorer (fitted on smollm2-self-eval)" in text
    assert "sources copy 0.83= 0.41m 0.35" in text
    text = policy_text(dict(mixed, ranked_by="calibration", fitted_on=None)).plain
    assert "ranked by the gate's calibration" in text
    mab = {"policy": "mab", "rounds": 7, "lambda_gamma": 0.31, "lambda_ucb": 0.3, "chosen": [3, 2, 2, 1, 1],
           "arms": [{"shape": [3, 2, 2, 1, 1], "count": 4, "mean": -0.41}, {"shape": [1, 1, 1, 1, 1], "count": 3, "mean": -0.52}]}
    text = policy_text(mab).plain
    assert "round 7" in text and "λγ 0.31" in text
    assert "▶ 3,2,2,1,1" in text and "n=4" in text and "r̄=-0.410" in text and "  1,1,1,1,1" in text
    opt = {"policy": "optimal", "rounds": 3, "nodes": 12, "budget": 16, "depth": 5, "rank_acceptance": [0.61, 0.2, 0.07, 0.03]}
    text = policy_text(opt).plain
    assert "12 nodes (budget 16), depth 5" in text and "0.61 0.20 0.07 0.03" in text
    gate = {"policy": "gate", "source": "ngram", "alpha": 0.72, "k": 3, "k_max": 8, "probe": False}
    text = policy_text(gate).plain
    assert "draft-length gate · prompt lookup" in text and "α 0.72 · k = 3 of 8" in text
    text = policy_text(dict(gate, source="model", k=0)).plain
    assert "drafter model" in text and "plain step" in text
    # a chain cut by its own confidence: each token's p (copied tokens marked), the kept prefix, E
    cut = dict(gate, k=2, drafted=4, confidence=[-1.0, 0.91, 0.42, 0.1], expected=2.3)
    text = policy_text(cut).plain
    assert "k = 2 of 8" in text and "drafted 4 · p copy 0.91 0.42 0.10 · E 2.30 tokens" in text
    # hybrid:auto's mixed trees: the drafter model's probabilities (m) and tokens two sources agreed on (=)
    text = policy_text(dict(cut, source="tree", confidence=[4.93, 2.41, 0.3, -1.0])).plain
    assert "draft-length gate · copy + datastore + drafter" in text and "p 0.93= 0.41m 0.30 copy ·" in text
    text = policy_text(dict(cut, source="tree", drafter=False, drafter_ms=2.14, step_ms=3.31)).plain
    assert "drafter model out · 2.1 ms a step vs a 3.3 ms plain step" in text
    # sd:auto: whether running the drafter pays at all, with the two measured rates once there are
    text = policy_text(dict(gate, source="model", k=0, drafting=False, rates=(0.21, 0.25))).plain
    assert "drafter rests (plain steps pay better now) · 0.210 tok/ms drafting · 0.250 tok/ms plain" in text
    text = policy_text(dict(gate, source="model", drafting=True, rates=(None, None))).plain
    assert text.endswith("drafter runs") and "tok/ms" not in text
    spans = policy_text(cut).spans
    assert sum(1 for sp in spans if "green" in str(sp.style)) == 2  # the kept two


def test_policy_panel_never_shows_more_kept_nodes_than_its_maximum() -> None:
    """pld:auto with a datastore cuts a lookup tree of up to 15 nodes by confidence, while the
    gate's k_max is the chain cap (8): the panel read "k = 15 of 8"; the most is what was drafted."""
    from app.widgets.dashboard import policy_text

    tree_cut = {"policy": "gate", "source": "ngram", "alpha": 0.81, "k": 15, "k_max": 8, "probe": False,
                "drafted": 15, "confidence": [-1.0] * 15, "expected": 9.5}
    text = policy_text(tree_cut).plain
    assert "k = 15 of 15" in text and "of 8" not in text


def test_engine_measures_a_plain_decoding_baseline_on_its_own_cache(smollm2_gguf_path) -> None:
    from engine.session import ChatSession

    s = ChatSession.load(target=str(smollm2_gguf_path))
    s.decoder.start(s.encode_chat([{"role": "user", "content": "Hi"}]))
    before = s.decoder.target.cache.length
    b = s.measure_baseline(new_tokens=8, long_context=400)
    assert b.tokens == 8 and b.tokens_per_s > 0 and not b.stopped
    assert s.decoder.target.cache.length == before  # the conversation's state is untouched
    # and again after a long context: 4 tokens at ~402 tokens of context, the fit's second point
    assert b.fitted and b.long_tokens_per_s > 0 and b.long_context == pytest.approx(402.0) and b.context < 60
    assert b.tokens_per_s_at(b.long_context) == pytest.approx(min(b.long_tokens_per_s, b.tokens_per_s), rel=1e-6)


class BaselineEngine(ScriptedEngine):
    """A scripted engine that also measures a plain-decoding baseline (in the app's worker thread)."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.baseline_threads: list[str] = []
        self.baseline_strategies: list = []

    def measure_baseline(self, new_tokens: int = 48, stop: object = None, strategy=None):
        from engine.session import Baseline

        self.baseline_threads.append(threading.current_thread().name)
        self.baseline_strategies.append(strategy)
        sampling = strategy.sampling_label() if strategy is not None else "T=0"
        return Baseline(tokens_per_s=20.0 if sampling == "T=0" else 16.0, tokens=48, sampling=sampling)


async def test_dashboard_speedup_uses_the_baseline_measured_at_load() -> None:
    engine = BaselineEngine(script())
    app = make_app(engine)
    async with app.run_test(size=WIDE) as pilot:
        await ready(pilot)
        await wait_for(pilot, lambda: dashboard(app).baseline is not None)
        assert engine.baseline_threads and engine.baseline_threads[0] != threading.current_thread().name
        assert dashboard(app).baseline.tokens_per_s == 20.0
        await send(pilot, "go")
        await reply_done(pilot)
        dashboard(app).flush()
        await pilot.pause()
        from textual.widgets import Static

        text = str(app.query_one("#dash-speed", Static).content)
        assert "vs ar 20.0 tok/s (ar measured at load, 48 tokens)" in text and "speedup ×" in text
        # on demand, from the command palette
        await pilot.press("ctrl+p")
        await pilot.press(*"Measure plain")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await wait_for(pilot, lambda: len(engine.baseline_threads) == 2)
        await wait_for(pilot, lambda: dashboard(app).baseline is not None)
        assert dashboard(app).baseline.note == "ar measured on request, 48 tokens"  # it kept saying "at load"


def test_torch_cuda_allocator_line_only_with_cuda() -> None:
    reading = MemoryReading(rss_mb=500.0, ram_used_mb=4096.0, ram_total_mb=8192.0, gpus=[])
    assert not any("torch CUDA" in line for line in memory_lines(reading))
    lines = memory_lines(reading, (1234.4, 2048.0))
    assert lines[-1] == "torch CUDA allocated 1234 MiB · peak 2048 MiB"
    from engine.generate import torch_gpu_mb

    import torch

    if not torch.cuda.is_available():
        assert torch_gpu_mb() is None


async def test_a_plain_decoding_reply_in_the_app_becomes_the_speedup_reference() -> None:
    """A reply decoded with ar throughout (32+ tokens) is the speedup's reference from then on:
    measured beside the UI's work like the replies compared with it; a speculative reply is not."""
    from app.screens.chat import AR_BASELINE_MIN_TOKENS

    plain = [StepEvent(step=i, strategy="ar greedy T=0", drafted=0, accepted=0, emitted=[7], text=" x",
                       segments=[(" x", "target")], ms=20.0, position=3000 + i) for i in range(1, AR_BASELINE_MIN_TOKENS + 1)]
    engine = BaselineEngine(plain)
    app = make_app(engine)
    async with app.run_test(size=WIDE) as pilot:
        await ready(pilot)
        await wait_for(pilot, lambda: dashboard(app).baseline is not None)
        assert dashboard(app).baseline.tokens_per_s == 20.0  # the load-time measure first
        load_fit = dashboard(app).baseline.fit
        await send(pilot, "go")
        await reply_done(pilot)
        b = dashboard(app).baseline
        assert b.tokens_per_s == pytest.approx(50.0) and b.note == f"ar in the app, last such reply, {AR_BASELINE_MIN_TOKENS} tokens"
        # its context goes with it, and the load-time fit stays (a reply elsewhere is moved along it)
        assert 3000 < b.context < 3000 + AR_BASELINE_MIN_TOKENS and b.fit is load_fit
        engine.events = script()  # speculative steps (and a plain one): not a reference
        await send(pilot, "again")
        await reply_done(pilot)
        assert dashboard(app).baseline is b


async def test_a_sampled_reply_is_compared_with_plain_decoding_that_samples_the_same_way() -> None:
    """The load-time baseline samples as the session's strategy does (a draw and the cuts cost a
    sampled step more than an argmax), says so beside the speedup, and is measured again between
    replies where the sampling changed (here: greedy at load, then T=0.7 top-p=0.9)."""
    engine = BaselineEngine(script())
    app = make_app(engine)
    async with app.run_test(size=WIDE) as pilot:
        await ready(pilot)
        await wait_for(pilot, lambda: dashboard(app).baseline is not None)
        assert dashboard(app).baseline.sampling == "T=0" and engine.baseline_strategies[0].greedy
        engine.strategy = engine.strategy.replace(temperature=0.7, top_p=0.9)  # as the palette's toggles set it
        await send(pilot, "go")
        await reply_done(pilot)
        await wait_for(pilot, lambda: len(engine.baseline_threads) == 2 and dashboard(app).baseline is not None)
        b = dashboard(app).baseline
        assert b.sampling == "T=0.7 top-p=0.9" and b.tokens_per_s == 16.0
        assert engine.baseline_strategies[1].temperature == 0.7 and engine.baseline_strategies[1].top_p == 0.9
        dashboard(app).flush()
        await pilot.pause()
        from textual.widgets import Static

        text = str(app.query_one("#dash-speed", Static).content)
        assert "vs ar 16.0 tok/s (T=0.7 top-p=0.9; ar measured after the sampling changed, 48 tokens)" in text
        await send(pilot, "again")  # the same settings: no new measure
        await reply_done(pilot)
        await pilot.pause(0.2)
        assert len(engine.baseline_threads) == 2


def test_engine_baseline_samples_as_the_strategy_does(smollm2_gguf_path) -> None:
    from engine.session import ChatSession
    from engine.strategy import preset

    s = ChatSession.load(target=str(smollm2_gguf_path))
    b = s.measure_baseline(new_tokens=8, long_context=0, strategy=preset("pld", temperature=0.7, top_k=40))
    assert b.sampling == "T=0.7 top-k=40" and b.tokens == 8 and b.tokens_per_s > 0
    assert s.measure_baseline(new_tokens=4, long_context=0).sampling == "T=0"
