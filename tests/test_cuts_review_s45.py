"""Review of session 45's sampling cuts (top-k, min-p beside top-p): what a user met.

- a cut out of range (``--top-k -1``, ``--min-p 1.5``, ``--min-p nan``, ``--top-p 0``) without a
  ``--strategy`` was refused only once the model had loaded (seconds for SmolLM2, minutes for a big
  model or a download), or not at all by ``bench --verify-cost``; and behind a missing target's
  error, never named. Now one line, exit 2, before any model loads, for generate and bench.
- the palette accepted Top-p / Top-k / Min-p at T = 0, where greedy decoding reads none of them,
  marked it current and showed a label without it (``... T=0``): the README's rule is that a setting
  the current strategy does not read is dimmed with its reason. Now refused with the reason at
  T = 0, except the way back to "off" for a cut left over from sampling.
"""

from __future__ import annotations

import pytest

from app.commands import evaluate, toggles
from engine.strategy import preset

from .test_cli_review_s42 import no_loading, one_error  # noqa: F401 - no_loading is a fixture


# ---- the CLI: out-of-range cuts before any model loads ----------------------------------------------------------
CUT_ERRORS = [(("--top-k", "-1"), "--top-k must be >= 0"), (("--min-p", "1.5"), "--min-p must be in [0, 1]"),
              (("--min-p", "nan"), "--min-p must be a finite number"), (("--min-p", "-0.5"), "--min-p must be in [0, 1]"),
              (("--top-p", "0"), "--top-p must be in (0, 1]"), (("--top-p", "inf"), "--top-p must be a finite number")]


@pytest.mark.parametrize("knobs, says", CUT_ERRORS)
@pytest.mark.parametrize("temperature", ["0", "1"])
def test_generate_refuses_a_cut_out_of_range_before_loading_without_a_strategy(capsys, no_loading, knobs, says, temperature):  # noqa: F811
    """No --strategy: the default strategy is the loaded session's, so the cuts were checked only
    after loading (no_loading fails the test where a model would load)."""
    assert says in one_error(capsys, "generate", "--temperature", temperature, *knobs, "hi")


@pytest.mark.parametrize("knobs, says", CUT_ERRORS)
def test_generate_names_a_bad_cut_before_a_missing_target(capsys, knobs, says, tmp_path):
    """The cut's own error, not "no such file" for the target that was never reached."""
    assert says in one_error(capsys, "generate", "--target", str(tmp_path / "nowhere"), "--temperature", "1", *knobs, "hi")


@pytest.mark.parametrize("knobs, says", CUT_ERRORS[:3])
@pytest.mark.parametrize("mode", [(), ("--verify-cost",)])
def test_bench_refuses_a_cut_out_of_range_before_loading(capsys, no_loading, knobs, says, mode):  # noqa: F811
    assert says in one_error(capsys, "bench", *mode, "--temperature", "1", *knobs)


def test_cuts_in_range_still_pass_the_early_check(capsys, no_loading):  # noqa: F811
    """Values at the ends of the ranges are not refused early: the run goes on to load (no_loading)."""
    from engine.cli import main

    with pytest.raises(AssertionError, match="a model was loaded"):
        main(["generate", "--temperature", "1", "--top-k", "0", "--min-p", "1", "--top-p", "1", "hi"])
    with pytest.raises(AssertionError, match="a model was loaded"):
        main(["generate", "--top-k", "40", "--min-p", "0", "--top-p", "0.5", "hi"])


# ---- the palette: the cuts at T = 0 -----------------------------------------------------------------------------
def _toggle(group: str, value: str):
    return next(t for t in toggles() if t.group == group and t.value == value)


@pytest.mark.parametrize("group, value", [("Top-k", "40"), ("Min-p", "0.05"), ("Top-p", "0.9"), ("Top-k", "0")])
def test_palette_refuses_a_cut_greedy_decoding_does_not_read(group, value):
    new, why = evaluate(_toggle(group, value), preset("sd"), has_drafter=True)
    assert new is None and why and "temperature" in why.lower(), (new, why)


def test_palette_sets_the_cuts_when_sampling_and_clears_a_leftover_one_at_t0():
    s, why = evaluate(_toggle("Top-k", "40"), preset("sd", temperature=0.7), has_drafter=True)
    assert why is None and s.top_k == 40
    s, why = evaluate(_toggle("Temperature", "0"), s, has_drafter=True)
    assert why is None and s.greedy and s.top_k == 40  # the cut stays for the next sampled turn, unshown
    cleared, why = evaluate(_toggle("Top-k", "0"), s, has_drafter=True)  # the way back to off stays open
    assert why is None and cleared.top_k == 0
    again, why = evaluate(_toggle("Top-k", "20"), s, has_drafter=True)
    assert again is None and why
