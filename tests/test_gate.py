"""The cost-aware draft length of the :auto strategies (engine/gate.py)."""

from __future__ import annotations

import pytest

from engine.costmodel import VerifyCost, fit
from engine.gate import DraftGate
from engine.generate import Decoder, run_generation
from engine.loading import load
from engine.strategy import StrategyError, from_spec, preset

# a CPU-like curve: 1-4 rows cheap, then a step (linear.c's register path ends at 4 rows)
POINTS = {1: 9.0, 2: 10.0, 4: 12.0, 8: 26.0, 16: 54.0}


def _cost() -> VerifyCost:
    return fit(POINTS, quadratic=True)


def test_verify_cost_interpolates_its_measured_points():
    c = _cost()
    assert c.at(1) == 9.0 and c.at(4) == 12.0
    assert c.at(3) == pytest.approx(11.0) and c.at(6) == pytest.approx(19.0)
    assert c.at(20) == pytest.approx(c(20))  # past the last point: the fit


def test_gate_fits_the_loops_step_times_as_one_smooth_curve():
    c = _cost()
    g = DraftGate(c)
    assert g.at(5) == pytest.approx(c.at(5))  # nothing seen yet: the start-up curve
    g.observe_step(1, 18.0)
    assert g.at(1) == pytest.approx(18.0) and g.at(8) == pytest.approx(2 * c.at(8))  # one size seen: a scale
    g = DraftGate(c)
    for n in (1, 2, 3, 6, 9):  # the loop's steps: 1.5 x the pass + 0.4 ms a row
        for _ in range(3):
            g.observe_step(n, 1.5 * c.at(n) + 0.4 * (n - 1))
    assert g.at(12) == pytest.approx(1.5 * c.at(12) + 0.4 * 11, rel=1e-6)
    assert g.at(1) == pytest.approx(1.5 * c.at(1), rel=1e-6)
    # noisy steps never make a node's marginal cost negative (e >= 0, s > 0)
    h = DraftGate(c)
    for n, ms in ((1, 30.0), (5, 29.0), (6, 33.0), (7, 30.5), (8, 31.0)):
        h.observe_step(n, ms)
    assert all(h.at(n + 1) >= h.at(n) for n in range(1, 20))


def test_gate_follows_acceptance_and_probes_when_shut():
    g = DraftGate(_cost(), probe=4)
    assert g.budget("ngram", 8) == 1  # the Beta(1, 2) prior: alpha 1/3 pays for a one-token draft here
    for _ in range(30):
        g.observe("ngram", depth=3, accepted=0, draft_ms=0.0, drafted=3)
    assert g.alpha("ngram") < 0.1
    ks = [g.budget("ngram", 8) for _ in range(8)]
    assert ks == [0, 0, 0, 1, 0, 0, 0, 1]  # shut, with a one-token probe every 4th step ...
    g.observe("ngram", depth=1, accepted=0, draft_ms=0.0, drafted=1)
    ks = [g.budget("ngram", 8) for _ in range(16)]
    assert ks.index(1) == 7  # ... whose wait doubles when a probe fails
    g.observe("ngram", depth=1, accepted=0, draft_ms=0.0, drafted=1)
    assert [g.budget("ngram", 8) for _ in range(16)].index(1) == 15
    for _ in range(30):
        g.observe("ngram", depth=8, accepted=8, draft_ms=0.0, drafted=8)
    assert g.alpha("ngram") > 0.9
    assert g.budget("ngram", 8) == 3  # 4 rows: the last cheap pass of this curve (7 tokens at 26 ms pay less)
    assert g.last["k"] == 3 and g.last["source"] == "ngram"
    flat = DraftGate(fit({1: 9.0, 2: 9.2, 4: 9.6, 8: 10.4, 16: 12.0}), sources=g.sources)
    assert flat.budget("ngram", 8) == 8  # where rows are nearly free (a GPU, bf16 with AMX) it drafts long


def test_gate_charges_the_drafters_time():
    cheap, dear = DraftGate(_cost()), DraftGate(_cost())
    for g, ms in ((cheap, 0.1), (dear, 30.0)):
        for _ in range(20):
            g.observe("model", depth=3, accepted=2, draft_ms=ms * 3, drafted=3)
    assert cheap.budget("model", 5) >= 2
    assert dear.budget("model", 5) == 0


def test_auto_specs():
    s = from_spec("sd:auto")
    assert s.adaptive and s.draft_len == preset("sd").draft_len and "auto" in s.label()
    s = from_spec("pld:12:auto")
    assert s.adaptive and s.draft_len == 12
    assert not from_spec("pld:12").adaptive
    with pytest.raises(StrategyError):
        from_spec("tree:auto")
    with pytest.raises(StrategyError):
        preset("mab", adaptive=True).validate()


def test_auto_strategies_equal_plain_greedy_and_vary_their_length(tmp_path):
    from .tiny import saved

    target = load(str(saved("llama", str(tmp_path)))).model
    drafter = load(str(saved("draft", str(tmp_path)))).model  # often wrong: the gate must shut it off
    dec = Decoder(target, drafter)
    for prompt in ([1, 5, 9, 3, 5, 9, 3, 7, 2, 5, 9, 3, 5, 9], list(range(10, 40))):
        ref, _ = run_generation(dec, prompt, preset("ar"), 48)
        ref = [t for e in ref for t in e.emitted]
        for spec in ("sd:auto", "pld:auto", "hybrid:auto", "sd:3:auto"):
            evs, _ = run_generation(dec, prompt, from_spec(spec), 48)
            assert [t for e in evs for t in e.emitted] == ref, (spec, prompt)
            if spec == "sd:auto":
                drafted = [e.drafted for e in evs]
                assert 0 in drafted[1:], drafted  # the wrong drafter is shut off ...
                assert all(e.policy and "k" in e.policy for e in evs if e.drafted)
    assert dec.gate is not None and dec.gate.alpha("model") < 0.5


def test_confidence_is_calibrated_online_and_cuts_the_chain():
    g = DraftGate(_cost())
    assert g.calibrated("model", 0.95) == pytest.approx(0.95) and g.calibrated("model", 0.05) == pytest.approx(0.05)
    sure, unsure = [0.97, 0.95, 0.93, 0.96, 0.94], [0.05, 0.9, 0.9]
    assert g.choose("model", sure) == 3  # 4 rows: the last cheap pass of this curve (8 rows cost 26 ms)
    assert g.last["drafted"] == 5 and g.last["k"] == 3 and g.last["expected"] > 3.0
    assert g.choose("model", unsure) == 0  # the first token is unlikely: a plain step
    assert g.choose("model", [0.95, 0.15, 0.95]) == 1  # cut after the doubtful token
    # a drafter that is over-confident: its 0.9+ tokens are rejected; the calibration learns it
    for _ in range(40):
        g.observe("model", depth=2, accepted=0, draft_ms=1.0, drafted=2, confidence=[0.95, 0.95])
    assert g.calibrated("model", 0.95) < 0.1
    assert g.choose("model", sure) == 0
    # only judged tokens count: the accepted ones and the first rejected one
    h = DraftGate(_cost())
    h.observe("model", depth=3, accepted=1, draft_ms=1.0, drafted=3, confidence=[0.75, 0.35, 0.05])
    b = h.sources["model"]
    assert b.cal_n[7] == 3.0 and b.cal_hits[7] == pytest.approx(2 * 0.75 + 1)
    assert b.cal_n[3] == 3.0 and b.cal_hits[3] == pytest.approx(2 * 0.35)
    assert b.cal_n[0] == 2.0  # never judged


def test_keep_going_stops_drafting_where_no_token_could_pay():
    g = DraftGate(_cost())
    go = g.keep_going("model")
    assert go([0.95]) and go([0.95, 0.95])
    assert not go([0.05])  # 0.05 * t(1) = 0.45 ms cannot pay for a row (1 ms) and a draft step
    assert not go([0.95, 0.1, 0.1])
    g.sources["model"].ms_per_token = 20.0  # a slow drafter: no next step pays
    assert not go([0.95])


def test_confident_chains_record_p_and_stop_early(tmp_path):
    import torch

    from engine.drafters.base import DraftRequest
    from engine.drafters.model import ModelDrafter

    from .tiny import saved

    drafter = ModelDrafter(load(str(saved("draft", str(tmp_path)))).model, target_vocab=64)
    history = [1, 5, 9, 3, 5]
    full = drafter.propose(history, DraftRequest(shape=(1,) * 5))
    tree = drafter.propose(history, DraftRequest(shape=(1,) * 5, confidence=True))
    assert tree.tokens == full.tokens and len(tree.confidence) == 5 and full.confidence == []
    assert all(0.0 < p <= 1.0 for p in tree.confidence)
    # the first token's p is the softmax maximum of the drafter's logits after the history
    logits = drafter.model.with_own_cache().full_logits(history)[-1].float()
    assert tree.confidence[0] == pytest.approx(float(torch.softmax(logits[:64], -1).max()), rel=1e-4)
    seen = []
    short = drafter.propose(history, DraftRequest(shape=(1,) * 5, confidence=True,
                                                  keep_going=lambda c: seen.append(list(c)) or len(c) < 2))
    assert short.tokens == full.tokens[:2] and len(short.confidence) == 2 and seen[-1] == short.confidence
    assert short.truncated(1).confidence == short.confidence[:1]
    sampled = drafter.propose(history, DraftRequest(shape=(1,) * 3, mode="sample", temperature=1.0,
                                                    generator=torch.Generator().manual_seed(0), confidence=True))
    assert sampled.confidence == [] and len(sampled) == 3  # greedy chains only


def test_sd_auto_runs_the_drafter_only_while_drafting_measures_faster_than_plain_steps():
    """gate.drafting_pays: sd:auto's chains are the "chain" arm of the measured rule (tokens per ms
    with the drafter against plain steps); a drafter that steadily pays still loses a step whose
    catch-up (``lag`` tokens at the measured cost a token) would eat its gain."""
    from engine.gate import MIXED_EXPLORE

    g = DraftGate(_cost())
    for _ in range(MIXED_EXPLORE):  # not measured yet: it drafts
        assert g.drafting_pays()
        g.observe_mixed(True, 3, 15.0, "chain")  # 0.2 tokens/ms drafting
    for _ in range(8):
        g.observe_mixed(False, 1, 9.0, "chain")  # 0.111 tokens/ms plain
    assert g.drafting_pays(lag=0)
    g.observe_catch_up(1, 50.0)  # one token: a step's own sync, not a catch-up cost (ignored)
    assert g.catch_up_ms == 0.0
    g.observe_catch_up(20, 10.0)  # 0.5 ms a token
    assert g.catch_up_ms == pytest.approx(0.5)
    assert g.drafting_pays(lag=10)  # 3 tokens in 20 ms: still beats 1 in 9 ms
    assert not g.drafting_pays(lag=40)  # 3 tokens in 35 ms does not
    assert g.arms["tree"][True][2] == 0  # hybrid:auto's arm is apart
    nxt = g.carried()
    assert nxt.catch_up_ms == g.catch_up_ms and nxt.arms["chain"] == g.arms["chain"]


def test_an_exploring_step_that_beats_the_preferred_arm_halves_the_wait_for_the_next():
    from engine.gate import MIXED_EXPLORE

    g = DraftGate(_cost())
    for _ in range(MIXED_EXPLORE):
        g.observe_mixed(True, 1, 20.0, "chain")
    for _ in range(MIXED_EXPLORE):
        g.observe_mixed(False, 1, 9.0, "chain")
    taken = []
    for _ in range(300):  # plain steps win; exploring confirms it, so it comes less and less often
        use = g.drafting_pays()
        taken.append(use)
        g.observe_mixed(use, 1, 20.0 if use else 9.0, "chain")
    assert g._explore_every["chain"] > MIXED_EXPLORE and taken.count(True) < 300 / MIXED_EXPLORE
    wait = g._explore_every["chain"]
    while not g.drafting_pays():  # the next exploring step ...
        g.observe_mixed(False, 1, 9.0, "chain")
    g.observe_mixed(True, 4, 12.0, "chain")  # ... drafts 4 tokens in 12 ms: worth looking again sooner
    assert g._explore_every["chain"] == wait // 2
    g.observe_mixed(False, 1, 4.0, "chain")  # a plain step no decision explored (the acceptance gate's):
    assert g._explore_every["chain"] == wait // 2  # it says nothing of the wait
    while not g.drafting_pays():
        g.observe_mixed(False, 1, 9.0, "chain")
    g.observe_mixed(True, 1, 20.0, "chain")  # an exploring step that loses: look again later
    assert g._explore_every["chain"] == wait


def test_sd_auto_with_a_drafter_that_never_pays_decodes_plain_steps_without_running_it(tmp_path, monkeypatch):
    """Where the chain arm says plain steps measure faster, sd:auto does not run the drafter model
    at all (no catch-up, no first step) and stays identical to plain greedy; the steps that drafted
    are booked to the chain arm, those that did not to the plain one."""
    from engine.drafters.model import ModelDrafter

    from .tiny import saved

    target = load(str(saved("llama", str(tmp_path)))).model
    drafter = load(str(saved("draft", str(tmp_path)))).model
    dec = Decoder(target, drafter)
    prompt = [1, 5, 9, 3, 5, 9, 3, 7, 2, 5, 9, 3, 5, 9]
    ref = [t for e in run_generation(dec, prompt, preset("ar"), 32)[0] for t in e.emitted]
    calls = []
    real = ModelDrafter.propose
    monkeypatch.setattr(ModelDrafter, "propose", lambda self, h, req: calls.append(len(h)) or real(self, h, req))
    monkeypatch.setattr(DraftGate, "budget", lambda self, source, k_max: k_max)  # the acceptance gate always lets it in
    monkeypatch.setattr(DraftGate, "drafting_pays", lambda self, lag=0: False)
    evs, _ = run_generation(dec, prompt, from_spec("sd:auto"), 32)
    assert [t for e in evs for t in e.emitted] == ref and calls == []
    assert all(e.drafted == 0 and e.policy.get("drafting") is False for e in evs)
    assert dec.gate.arms["chain"][False][2] == len(evs) and dec.gate.arms["chain"][True][2] == 0
    monkeypatch.setattr(DraftGate, "drafting_pays", lambda self, lag=0: True)
    evs, _ = run_generation(dec, prompt, from_spec("sd:auto"), 32)
    assert [t for e in evs for t in e.emitted] == ref and len(calls) == len(evs)
    assert dec.gate.arms["chain"][True][2] == len(evs)


def test_sd_auto_charges_the_catch_up_from_the_replys_start_and_never_skips_a_probe(tmp_path, monkeypatch):
    """The lag gate.drafting_pays is charged counts the tokens since the drafter last ran beyond
    the last step's, from the reply's start (catching up on the prompt is paid once, whenever it
    first runs: charging it would keep the drafter out of every reply's first steps); the
    acceptance gate's probe drafts whatever the arm says (a probe skipped would leave the
    acceptance rate where it was)."""
    from engine.drafters.model import ModelDrafter

    from .tiny import saved

    target = load(str(saved("llama", str(tmp_path)))).model
    drafter = load(str(saved("draft", str(tmp_path)))).model
    dec = Decoder(target, drafter)
    prompt = list(range(10, 40))
    ref = [t for e in run_generation(dec, prompt, preset("ar"), 24)[0] for t in e.emitted]
    lags = []

    def pays(self, lag=0):
        lags.append(lag)
        return len(lags) % 4 == 0  # every 4th step drafts

    monkeypatch.setattr(DraftGate, "budget", lambda self, source, k_max: k_max)
    monkeypatch.setattr(DraftGate, "drafting_pays", pays)
    evs, _ = run_generation(dec, prompt, from_spec("sd:auto"), 24)
    assert [t for e in evs for t in e.emitted] == ref
    assert lags[0] <= 0  # the prompt is not charged
    # three plain steps of one token each, then the drafter runs: it catches up on 3 tokens, 2 beyond a steady step's
    assert lags[1:4] == [0, 1, 2] and evs[3].policy["drafting"] and lags[4] <= 0
    assert dec.gate.arms["chain"][True][2] == len(evs) // 4
    calls = []
    real = ModelDrafter.propose
    monkeypatch.setattr(ModelDrafter, "propose", lambda self, h, req: calls.append(1) or real(self, h, req))

    def probe(self, source, k_max):
        self.last = {"policy": "gate", "source": source, "k": 1, "k_max": k_max, "probe": True}
        return 1

    monkeypatch.setattr(DraftGate, "budget", probe)
    monkeypatch.setattr(DraftGate, "drafting_pays", lambda self, lag=0: False)
    evs, _ = run_generation(dec, prompt, from_spec("sd:auto"), 12)
    assert [t for e in evs for t in e.emitted] == ref[:12] and len(calls) == len(evs)


def test_calibration_memory_is_bounded_and_a_new_conversation_carries_little_of_it():
    """A bin's counts stop growing at CAL_WINDOW (older judgements shrink in proportion), so a loop
    of always-right copies is unlearnt within a window's worth of misses, not never; a new
    conversation carries at most CAL_CARRY judgements a bin, at the same rate."""
    from engine.gate import CAL_BINS, CAL_CARRY, CAL_WINDOW, COPIED

    g = DraftGate(_cost())
    for _ in range(2000):  # a reply stuck in a loop: every copied token right
        g.observe("pld", 1, 1, 0.1, 1, confidence=[COPIED])
    s = g.sources["pld"]
    assert s.cal_n[CAL_BINS] <= CAL_WINDOW + 1e-9 and g.calibrated("pld", COPIED) > 0.99
    for _ in range(int(CAL_WINDOW)):  # then every copy wrong
        g.observe("pld", 1, 0, 0.1, 1, confidence=[COPIED])
    assert g.calibrated("pld", COPIED) < 0.4
    rate = g.calibrated("pld", COPIED)
    nxt = g.carried()
    assert nxt.sources["pld"].cal_n[CAL_BINS] == pytest.approx(CAL_CARRY)
    assert nxt.calibrated("pld", COPIED) == pytest.approx(rate)
    untouched = nxt.sources["pld"].cal_n[0]
    assert untouched == pytest.approx(s.cal_n[0])  # a bin under the carry keeps its counts


def test_at_remembers_its_values_until_a_step_or_the_cost_changes_them():
    """Session 48: t(n) is kept per row count (a tree's cut asks ~50 times a step); a step's
    timing refits it and a new cost curve replaces it, exactly as computing it afresh."""
    from engine.costmodel import VerifyCost

    def fresh(g, n):  # the formula without the memo
        s, e = g._loop_fit()
        return s * g.cost.at(n) + e * (n - 1)

    g = DraftGate(VerifyCost(a=5.0, b=0.5, points={1: 5.5, 4: 7.0, 8: 9.0}))
    first = [g.at(n) for n in range(1, 12)]
    assert first == [fresh(g, n) for n in range(1, 12)]
    g.observe_step(4, 14.0)
    g.observe_step(1, 6.0)
    assert [g.at(n) for n in range(1, 12)] == [fresh(g, n) for n in range(1, 12)] != first
    g.cost = VerifyCost(a=10.0, b=1.0, points={1: 11.0, 8: 18.0})
    assert [g.at(n) for n in range(1, 12)] == [fresh(g, n) for n in range(1, 12)]
