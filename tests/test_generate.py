"""The decode loop is lossless: greedy strategies equal plain greedy token for token (with drafts
accepted in full, in part and not at all), strategies switch live, sampling strategies keep the
target's exact distribution, membership verification and ERSD equal seeded plain sampling."""

from __future__ import annotations

import itertools

import pytest
import torch

from engine.generate import Decoder, run_generation
from engine.loading import load
from engine.strategy import StrategyError, preset

from .lossless_util import (
    NEAR_NOISE,
    OracleDrafter,
    draw,
    exact_law,
    flat_cost,
    hybrid_prompt,
    law_pvalue,
    lookup_prompt,
    near_drafter,
    next_logits,
    plain_next_logits,
    ratio_pvalue,
)
from .tiny import hf_greedy, saved, two_sample_p

PROMPTS = [
    [1, 5, 9, 3, 5, 9, 3, 7, 2, 5, 9],
    [4, 4, 4, 4, 4, 4],
    list(range(10, 40)),
    [7, 80, 81, 82, 83, 7, 80, 81, 82],
]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tiny"))


def tokens_of(events):
    return [t for e in events for t in e.emitted]


def greedy_strategies():
    return [preset("ar"), preset("pld"), preset("sd", draft_len=3), preset("sd", draft_len=6), preset("tree", tree=(3, 2, 2, 1, 1)),
            preset("tree", tree=(2, 2, 2)), preset("ersd"), preset("sd", draft_len=4, verify="membership"),
            preset("pld", ngram_branches=3), preset("mab"), preset("mab", arms=((2, 1), (1, 1, 1, 1, 1, 1, 1))),
            preset("optimal"), preset("optimal", node_budget=3), preset("hybrid"), preset("hybrid", draft_len=5)]


# "other": a different tiny model (almost never right: ~0 accepted); "self": the target drafting
# for itself (always right: everything accepted); "oracle": right for a few tokens, then wrong
# (tests/lossless_util.OracleDrafter), so that accepted paths stop short of the drafted ones and the
# commits, rollbacks and bonus tokens of partial paths run, on every kind of model
GREEDY_CASES = [(k, d) for k in ("llama", "gpt_neox", "mamba2") for d in ("other", "self")] + \
    [(k, "oracle") for k in ("llama", "gpt_neox", "mamba", "mamba2", "granite")]


@pytest.mark.parametrize("kind, drafter", GREEDY_CASES, ids=[f"{d}-{k}" for k, d in GREEDY_CASES])
def test_greedy_strategies_equal_plain_greedy(kind, drafter, root):
    path = saved(kind, root)
    target = load(str(path)).model
    dmodel = None if drafter == "oracle" else target if drafter == "self" else load(str(saved("draft", root))).model
    partial: dict[str, int] = {}
    for prompt in PROMPTS:
        ref = hf_greedy(path, prompt, 40)
        dec = Decoder(target, dmodel)
        state = plain_next_logits(target, list(prompt) + ref) if drafter == "oracle" else None
        for s in greedy_strategies():
            if drafter == "oracle":  # both drafters: pld's and hybrid's lookups too
                dec.drafters["model"] = dec.drafters["ngram"] = OracleDrafter(list(prompt) + ref)
            evs, summ = run_generation(dec, prompt, s, 40)
            assert tokens_of(evs) == ref, (s.label(), prompt)
            assert summ.new_tokens == 40 and summ.finish_reason == "length"
            if state is not None:  # and the committed state is plain decoding's, not just its argmax
                assert torch.allclose(next_logits(dec, s), state, rtol=1e-4, atol=1e-3), (s.label(), prompt)
            if drafter == "self" and s.name == "sd":
                # a model drafting for itself is always right: k accepted + 1 every full step
                assert all(e.accepted == s.draft_len for e in evs[:-1])
            key = repr(s)
            partial[key] = partial.get(key, 0) + sum(1 for e in evs if 0 < e.accepted < e.drafted)
    if drafter == "oracle":  # every strategy verified paths that stopped inside the draft
        assert all(n >= 3 for k, n in partial.items() if "name='ar'" not in k), partial


def test_strategy_switches_live_between_steps(root):
    path = saved("llama", root)
    target = load(str(path)).model
    dec = Decoder(target, load(str(saved("draft", root))).model)
    cycle = itertools.cycle([preset("ar"), preset("sd", draft_len=4), preset("pld"), preset("tree"), preset("mab"),
                             preset("optimal"), preset("ersd"), preset("hybrid")])
    seen = []

    def current():
        s = next(cycle)
        seen.append(s.name)
        return s

    prompt = PROMPTS[0]
    evs, _ = run_generation(dec, prompt, current, 60)
    assert tokens_of(evs) == hf_greedy(path, prompt, 60)
    assert {"ar", "sd", "pld", "tree", "mab", "optimal", "ersd", "hybrid"} <= set(seen)
    assert len({e.strategy.split()[0] for e in evs}) >= 4


def test_multi_turn_reuses_prefix_and_stays_exact(root):
    path = saved("llama", root)
    dec = Decoder(load(str(path)).model, load(str(saved("draft", root))).model)
    p1 = PROMPTS[2]
    out1 = tokens_of(run_generation(dec, p1, preset("sd"), 20)[0])
    p2 = p1 + out1 + [3, 4, 5]
    cached_before = dec.target.cache.length
    evs, summ = run_generation(dec, p2, preset("tree"), 20)
    assert cached_before >= len(p1)  # the prefix stayed in the cache
    assert tokens_of(evs) == hf_greedy(path, p2, 20)
    # regenerate: same prompt again gives the same reply
    assert tokens_of(run_generation(dec, p2, preset("ar"), 20)[0]) == tokens_of(evs)


def test_eos_and_context_limits(root):
    path = saved("llama", root)
    prompt = PROMPTS[0]
    ref = hf_greedy(path, prompt, 30)
    eos = ref[7]
    first = ref.index(eos)
    dec = Decoder(load(str(path)).model, eos_ids={eos})
    evs, summ = run_generation(dec, prompt, preset("pld"), 30)
    assert tokens_of(evs) == ref[: first + 1] and summ.finish_reason == "eos"
    # an EOS one token past the limit, drafted and accepted in the step the limit cuts: "length", as
    # plain decoding ends there (it was "eos", its EOS cut off)
    for n, reason in ((first, "length"), (first + 1, "eos")):
        for strategy in (preset("ar"), preset("sd", draft_len=4)):
            dec.drafters["model"] = OracleDrafter(list(prompt) + ref[: first + 1], good=(8,))
            dec.reset()
            evs, summ = run_generation(dec, prompt, strategy, n)
            assert tokens_of(evs) == ref[:n] and summ.finish_reason == reason, (n, strategy.label())
            assert strategy.name == "ar" or max(e.accepted for e in evs) >= 2
    small = load(str(path), max_context=len(prompt) + 5).model
    evs, summ = run_generation(Decoder(small), prompt, preset("ar"), 30)
    assert summ.finish_reason == "context" and len(tokens_of(evs)) == 5
    with pytest.raises(Exception, match="context holds"):
        Decoder(small).start(list(range(len(prompt) + 10)))


@pytest.mark.parametrize("cap_extra", [2, 5, 40])
def test_cost_aware_strategies_run_in_a_small_context(root, cap_extra):
    """The verify-cost curve is measured on a cache of the target's own size: a context capped below
    the probe's 64 + 32 + 1 rows (--max-context 48 failed the default pld:auto with "context full"
    before any token) measures the sizes that fit, and every strategy stays plain greedy decoding."""
    from engine.strategy import from_spec

    path = saved("llama", root)
    prompt = PROMPTS[0][:4]
    small = load(str(path), max_context=len(prompt) + cap_extra).model
    ref = tokens_of(run_generation(Decoder(small), prompt, preset("ar"), 60)[0])
    assert len(ref) == cap_extra
    for spec in ("pld:auto", "sd:auto", "mab", "optimal", "hybrid:auto"):
        dec = Decoder(load(str(path), max_context=len(prompt) + cap_extra).model, load(str(saved("draft", root))).model)
        evs, summ = run_generation(dec, prompt, from_spec(spec), 60)
        assert tokens_of(evs) == ref and summ.finish_reason == "context", spec
        assert dec.verify_cost is not None


def test_a_drafter_with_less_context_than_the_target_leaves_it_plain_steps(root):
    """A drafter whose own context fills before the target's (a Transformer drafter's real limit)
    raised OverflowError from every drafted step; the target now goes on with plain steps, the
    reply plain greedy decoding's to its end."""
    from engine.strategy import from_spec

    path = saved("llama", root)
    prompt = PROMPTS[0]
    ref = tokens_of(run_generation(Decoder(load(str(path)).model), prompt, preset("ar"), 40)[0])
    for spec in ("sd:4", "tree:2-2-1", "mab", "hybrid", "sd:auto", "hybrid:auto"):
        dec = Decoder(load(str(path)).model, load(str(saved("draft", root)), max_context=len(prompt) + 12).model)
        evs, summ = run_generation(dec, prompt, from_spec(spec), 40)
        assert tokens_of(evs) == ref and summ.finish_reason == "length", spec
        assert evs[-1].drafted == 0, spec  # the drafter full by then


def test_stop_event_ends_after_current_step(root):
    import threading

    dec = Decoder(load(str(saved("llama", root))).model)
    stop = threading.Event()
    dec.start(PROMPTS[0])
    out = []
    for ev in dec.steps(preset("ar"), 100, stop):
        out.append(ev)
        if len(out) == 3:
            stop.set()
    assert out[-1].finish_reason == "stopped" and sum(len(e.emitted) for e in out) == 3


def test_a_stop_during_prefill_keeps_the_prefix_done_and_the_next_start_reuses_it(root, monkeypatch):
    """Decoder.start checks ``stop`` between PREFILL_PIECE tokens of prefill: stopped after the first
    piece, the context is that prefix (the steps stop at once), and the next start prefills only
    the rest: the reply is still plain greedy's."""
    import threading

    import engine.generate as gen_mod

    monkeypatch.setattr(gen_mod, "PREFILL_PIECE", 8)

    class StopAfterFirstPiece(threading.Event):
        def __init__(self) -> None:
            super().__init__()
            self.asked = 0

        def is_set(self) -> bool:
            self.asked += 1
            return self.asked > 1

    path = saved("llama", root)
    dec = Decoder(load(str(path)).model)
    prompt = PROMPTS[2]  # 30 tokens: 29 to prefill, the last one the first step's root
    stop = StopAfterFirstPiece()
    dec.start(prompt, stop)
    assert dec.prefilled == 8 and dec.target.cache.length == 8 and dec.history == prompt[:9]
    assert [e.finish_reason for e in dec.steps(preset("ar"), 10, stop)] == ["stopped"]
    dec.start(prompt, threading.Event())
    assert dec.prefilled == 21 and dec.target.cache.length == 29  # the 8 prefilled tokens were reused
    assert tokens_of(dec.steps(preset("pld"), 12)) == hf_greedy(path, prompt, 12)


def test_invalid_combinations_are_refused():
    with pytest.raises(StrategyError, match="needs a drafter model"):
        preset("mab").validate(has_drafter_model=False)
    with pytest.raises(StrategyError, match="chooses trees for a drafter model"):
        preset("optimal", drafter="ngram").validate()
    with pytest.raises(StrategyError, match="needs a drafter model"):
        preset("sd").validate(has_drafter_model=False)
    with pytest.raises(StrategyError, match="n-gram drafts have none"):
        preset("pld", temperature=1.0, verify="rs").validate()
    with pytest.raises(StrategyError, match="no drafter vocabulary"):
        preset("pld", vocab="slrs").validate()
    with pytest.raises(StrategyError, match="combines prompt lookup with a drafter model"):
        preset("hybrid", drafter="ngram").validate()
    with pytest.raises(StrategyError, match="needs a drafter model"):
        preset("hybrid").validate(has_drafter_model=False)


# ---- sampling: end-to-end distribution tests ----------------------------------------------------------------
# Each sampling strategy's first two tokens are tested against the exact law of plain sampling from
# the target (tests/lossless_util.exact_law: one pass per first token), not against a second sample:
# a flat tiny target leaves ~1,000 distinct outcomes in 1,000 samples, too many to compare two
# samples of them. The drafter is the target's own checkpoint with its output layer perturbed
# (lossless_util.near_drafter): it agrees often enough for drafts to be accepted (a floor on accepted
# tokens a step is asserted: a strategy that drafts nothing, or whose drafts are never accepted,
# proves nothing) and disagrees enough for a wrong verifier to move the law towards q, which the
# chi-square's cells are chosen to see (lossless_util.ratio_pvalue). The membership verifiers
# reproduce plain sampling draw for draw: those are checked token for token instead.
_two_sample_p = two_sample_p
_SEEDED: dict = {}


def _seeded(key, make):
    """Samples drawn with fixed seeds are the same whenever they are drawn (laws, prompts: the
    same whenever they are computed): draw them once."""
    if key not in _SEEDED:
        _SEEDED[key] = make()
    return _SEEDED[key]


N_SAMPLES = 1000
P_PASS = 1e-3  # a lossless strategy's p-values must exceed this ...
P_FAIL = 1e-6  # ... and one with a subtle bug injected must fall below this
MIN_ACCEPTED = 0.3  # accepted drafted tokens a step, at least: speculation really runs
CLOSER = 0.3  # a drafter closer to the target (its noise scaled by this): for sharper laws and greedy drafts

SAMPLING = {
    "ar": preset("ar", temperature=1.0),                                               # the test itself: plain sampling
    "rs": preset("sd", draft_len=3, temperature=1.0),                                  # sequence rejection sampling
    "mss": preset("tree", tree=(2, 2), temperature=1.0),                               # multi-step, without replacement
    # shapes chosen from past steps (trees only: given a chain, the cost-aware bandit on a CPU takes it every step)
    "mab": preset("mab", temperature=1.0, arms=((2, 2), (3, 1), (2, 1, 1))),
    "optimal": preset("optimal", temperature=1.0, node_budget=5),                      # Alg. 3 trees, mss
    "hybrid": preset("hybrid", temperature=1.0),                                       # n-gram steps (membership) and model steps (rs)
    "auto": preset("hybrid", temperature=1.0, adaptive=True),                          # lengths chosen by the cost gate
    "sd-auto": preset("sd", temperature=1.0, adaptive=True),                           # sd:auto's gated chains
    "rs-top-p": preset("sd", draft_len=3, temperature=0.7, top_p=0.9),                 # a tempered, truncated q and p
    "ar-cuts": preset("ar", temperature=1.0, top_k=6, min_p=0.05),                     # plain sampling with cuts
    "rs-top-k": preset("sd", draft_len=3, temperature=1.0, top_k=6),                   # the k most likely tokens only
    "mss-cuts": preset("tree", tree=(2, 2), temperature=1.0, top_k=20, top_p=0.95, min_p=0.05),  # all three cuts
    "rs-repeat": preset("sd", draft_len=3, temperature=1.0, repeat_penalty=1.8, repeat_last_n=3),  # each row's own window
}
SAMPLING_CASES = [(k, t) for k in SAMPLING for t in ("llama", "mamba", "mamba2", "granite")
                  if k in ("rs", "mss") or t in ("llama", "mamba2")]
# The default suite checks every strategy on the attention target, the main ones on Mamba-2 and
# rejection sampling on Mamba-1; the Granite target and the other repeats run with -m slow (CI runs
# them after the default suite): a suite that must stay under 15 minutes on 2 cores.
SLOW_SAMPLING = {("mss", "mamba"), ("rs", "granite"), ("mss", "granite"), ("ar", "mamba2"), ("mss", "mamba2"),
                 ("optimal", "mamba2"), ("auto", "mamba2"), ("sd-auto", "mamba2"), ("rs-top-p", "mamba2"),
                 ("rs-top-k", "mamba2"), ("mss-cuts", "mamba2"), ("ar-cuts", "mamba2"), ("rs-repeat", "mamba2")}


def _lookup_prompt(kind, root, target, temperature):
    """A prompt whose lookup drafts the target often accepts (lossless_util.lookup_prompt)."""
    return _seeded(("lookup", kind, root, temperature), lambda: lookup_prompt(target, temperature, PROMPTS))


def _law_case(strategy, kind, root, monkeypatch, prompt=None, drafter_noise=None):
    """(decoder, prompt, the target's exact law, the drafter's) for a sampling strategy on ``kind``."""
    target = load(str(saved(kind, root))).model
    dpath = near_drafter(kind, root, drafter_noise)
    dec = Decoder(target, load(str(dpath)).model)
    if strategy.adaptive:  # a cost gate that drafts: the loop's timings on 2 busy cores would shut it
        flat_cost(monkeypatch, dec)
    if prompt is None and strategy.name == "hybrid":
        prompt = _seeded(("hybrid", kind, str(dpath), strategy.temperature),
                         lambda: hybrid_prompt(target, dec.drafters["model"].model, strategy.temperature))
    prompt = prompt or PROMPTS[0]
    T, cuts = strategy.temperature, strategy.filters
    rep = (strategy.repeat_penalty, strategy.repeat_last_n)
    key = tuple(sorted(cuts.items()))
    # (the drafter's law is its q: no penalty, which the target's verification applies)
    law = _seeded(("law", kind, root, tuple(prompt), T, key, rep), lambda: exact_law(target, prompt, T, repeat=rep, **cuts))
    draft_law = _seeded(("law", str(dpath), tuple(prompt), T, key), lambda: exact_law(dec.drafters["model"].model, prompt, T, **cuts))
    return dec, prompt, law, draft_law


def _law_pvalues(strategy, kind, root, monkeypatch, **kw):
    dec, prompt, law, draft_law = _law_case(strategy, kind, root, monkeypatch, **kw)
    outs, accepted = draw(dec, prompt, strategy, range(N_SAMPLES), 2)
    return ratio_pvalue(outs, law, draft_law), law_pvalue(outs, law), accepted


@pytest.mark.parametrize("case, target", [pytest.param(k, t, marks=pytest.mark.slow) if (k, t) in SLOW_SAMPLING else (k, t)
                                          for k, t in SAMPLING_CASES], ids=[f"{k}-{t}" for k, t in SAMPLING_CASES])
def test_sampling_strategies_keep_the_target_distribution(case, target, root, monkeypatch):
    """Chi-square against the exact law of plain sampling: the first two tokens of speculative
    sampling on attention, pure-SSM and hybrid targets (SSM modes: stree verify, replay commit),
    on cells where a wrong verifier shows (ratio_pvalue) and on the outcomes themselves (law_pvalue)."""
    strategy = SAMPLING[case]
    p_ratio, p_cells, accepted = _law_pvalues(strategy, target, root, monkeypatch)
    assert p_ratio > P_PASS and p_cells > P_PASS, (p_ratio, p_cells)
    assert case in ("ar", "ar-cuts") or accepted >= MIN_ACCEPTED, accepted


# A subtle bug injected into the verifiers (the correction drawn from p instead of the residual
# norm(max(p - q, 0)); drafts accepted with probability sqrt(min(1, p/q)) instead of min(1, p/q);
# after a partial acceptance, the correction drawn from p): the test above must fail, far below
# P_PASS, or it could not tell a lossless strategy from a wrong one.
def _residual_is_p(monkeypatch):
    import engine.verify as V

    monkeypatch.setattr(V, "residual", lambda p, q: p)


def _sqrt_acceptance(monkeypatch):
    import engine.verify as V

    monkeypatch.setattr(V, "_accept_draft", lambda p, q, g: float(torch.rand((), generator=g)) ** 2 * q < p)


def _p_after_a_partial_path(monkeypatch):
    import engine.verify as V

    def verify_rejection(tree, target_probs, draft_probs, generator):
        path = []
        for i, x in enumerate(tree.tokens):
            p, q = target_probs[i], draft_probs[i]
            if not V._accept_draft(float(p[x]), float(q[x]), generator):
                return path, V.sample(p if path else V.residual(p, q), generator)
            path.append(i)
        return path, V.sample(target_probs[len(tree)], generator)

    monkeypatch.setattr(V, "verify_rejection", verify_rejection)


def _cuts_ignored_by_the_verifier(monkeypatch):
    """The verifier's target rows without the top-k and min-p cuts (plain sampling keeps them)."""
    import engine.verify as V

    rows = V._RowProbs
    monkeypatch.setattr(V, "_RowProbs", lambda logits, t, top_p, top_k=0, min_p=0.0: rows(logits, t, top_p))


BUGS = {"residual-is-p": _residual_is_p, "sqrt-acceptance": _sqrt_acceptance, "p-after-partial": _p_after_a_partial_path,
        "cuts-ignored": _cuts_ignored_by_the_verifier}
BUG_CASES = [("rs", "llama", "residual-is-p"), ("mss", "llama", "sqrt-acceptance"), ("rs", "llama", "p-after-partial"),
             ("auto", "llama", "residual-is-p"), ("sd-auto", "llama", "p-after-partial"), ("rs-top-p", "llama", "residual-is-p"),
             ("rs", "mamba2", "residual-is-p"), ("hybrid", "mamba2", "sqrt-acceptance"), ("mab", "mamba2", "residual-is-p"),
             ("rs-top-k", "llama", "cuts-ignored"), ("mss-cuts", "llama", "cuts-ignored")]
SLOW_BUGS = {("auto", "llama", "residual-is-p"), ("sd-auto", "llama", "p-after-partial"), ("rs-top-p", "llama", "residual-is-p"),
             ("hybrid", "mamba2", "sqrt-acceptance"), ("mab", "mamba2", "residual-is-p")}


@pytest.mark.parametrize("case, target, bug", [pytest.param(*c, marks=pytest.mark.slow) if c in SLOW_BUGS else c for c in BUG_CASES],
                         ids=["-".join(c) for c in BUG_CASES])
def test_the_distribution_test_catches_a_subtle_bug(case, target, bug, root, monkeypatch):
    BUGS[bug](monkeypatch)
    p_ratio, _, _ = _law_pvalues(SAMPLING[case], target, root, monkeypatch)
    assert p_ratio < P_FAIL, p_ratio


@pytest.mark.parametrize("strategy", [preset("tree", tree=(3, 2), temperature=0.5, top_p=0.5),
                                      preset("mab", temperature=0.5, top_p=0.5, arms=((3, 2), (2, 2, 1)))],
                         ids=["tree", "mab"])
def test_sampled_trees_with_top_p_keep_the_truncated_distribution(strategy, root, monkeypatch):
    """top-p (and a low temperature) leave the drafter's q fewer tokens than a tree node's planned
    children: the node gets the ones there are (it once indexed past them, an IndexError), and the
    first two tokens still follow plain top-p sampling's exact law."""
    # (a temperature of 0.5 doubles the perturbed drafter's distance from the target: a closer one)
    dec, prompt, law, draft_law = _law_case(strategy, "llama", root, monkeypatch, prompt=[4, 4, 4, 4],
                                            drafter_noise=NEAR_NOISE["llama"] * CLOSER)
    assert int((law.sum(1) > 0).sum()) > 2  # the nucleus keeps a few first tokens
    outs, accepted = draw(dec, prompt, strategy, range(N_SAMPLES), 2)
    assert ratio_pvalue(outs, law, draft_law) > P_PASS and law_pvalue(outs, law) > P_PASS
    assert accepted >= MIN_ACCEPTED, accepted


# Membership verification (STree's "naive sampling") samples the target's own token at each row
# with the step's generator, in the order plain sampling draws them: with the same seed it emits
# exactly plain sampling's tokens, whatever was drafted. That is checked token for token (a
# chi-square between the two would compare a sample with itself). The temperature is lower than
# above and the prompt one whose lookup drafts the target follows (lossless_util.lookup_prompt):
# membership accepts a draft only where the target samples it.
MEMBERSHIP_T = 0.5
MEMBERSHIP = {
    "membership-ngram": preset("pld", temperature=MEMBERSHIP_T),                                   # prompt lookup
    "membership-model": preset("sd", draft_len=3, temperature=MEMBERSHIP_T, verify="membership"),  # the drafter's greedy chain
    "datastore": preset("pld", temperature=MEMBERSHIP_T, adaptive=True),                           # an n-gram datastore's trees
    "mixed": preset("hybrid", temperature=MEMBERSHIP_T, adaptive=True),                            # + copy and drafter in one tree
}
MEMBERSHIP_CASES = [(k, t) for k in MEMBERSHIP for t in ("llama", "mamba", "mamba2", "granite")]
SLOW_MEMBERSHIP = {(k, t) for k, t in MEMBERSHIP_CASES if t in ("mamba", "granite")}


@pytest.mark.parametrize("case, target", [pytest.param(k, t, marks=pytest.mark.slow) if (k, t) in SLOW_MEMBERSHIP else (k, t)
                                          for k, t in MEMBERSHIP_CASES], ids=[f"{k}-{t}" for k, t in MEMBERSHIP_CASES])
def test_membership_sampling_equals_seeded_plain_sampling(case, target, root, monkeypatch):
    strategy = MEMBERSHIP[case]
    kind = target
    target = load(str(saved(kind, root))).model
    # a drafter closer to the target than the rejection sampling tests': its greedy drafts are the
    # target's likely tokens
    dec = Decoder(target, load(str(near_drafter(kind, root, NEAR_NOISE[kind] * CLOSER))).model)
    flat_cost(monkeypatch, dec)
    prompt = _lookup_prompt(kind, root, target, MEMBERSHIP_T)
    if strategy.adaptive:  # the datastore: replies the target sampled (seeds the test does not use)
        from engine.drafters.corpus import CorpusIndex

        seqs = [(prompt + tokens_of(run_generation(dec, prompt, preset("ar", temperature=MEMBERSHIP_T, seed=10**6 + i), 12)[0]),
                 len(prompt)) for i in range(8)]
        dec.drafters["ngram"].corpus = CorpusIndex.build(seqs, n_max=3, min_count=1)
    accepted = steps = partial = 0
    for seed in range(60):
        plain = tokens_of(run_generation(dec, prompt, preset("ar", temperature=MEMBERSHIP_T, seed=seed), 8)[0])
        evs, _ = run_generation(dec, prompt, strategy.replace(seed=seed), 8)
        assert tokens_of(evs) == plain, seed
        accepted += sum(e.accepted for e in evs)
        steps += len(evs)
        partial += sum(1 for e in evs if 0 < e.accepted < e.drafted)
    assert accepted >= MIN_ACCEPTED * steps and partial >= 5, (accepted, steps, partial)


@pytest.mark.parametrize("kind", ["llama", "mamba2", "granite"])
def test_ersd_equals_seeded_race_ar_token_for_token(kind, root):
    """ERSD emits exactly the tokens of plain race sampling with the same seed, whatever the drafter:
    a drafter model (close to the target: its race drafts are often the target's winners) and prompt
    lookup (on a prompt whose lookup the target follows, at a lower temperature: on the others it was
    never accepted, 0 tokens in 600 steps)."""
    target = load(str(saved(kind, root))).model
    dec = Decoder(target, load(str(near_drafter(kind, root, NEAR_NOISE[kind] * CLOSER))).model)
    runs = [("model", 0.8, prompt, 25) for prompt in PROMPTS[:2]]
    runs.append(("ngram", 0.4, _lookup_prompt(kind, root, target, 0.4), 12))
    accepted = {"model": 0, "ngram": 0}
    steps = {"model": 0, "ngram": 0}
    for seed in range(12):
        for drafter, T, prompt, n in runs:
            ar = tokens_of(run_generation(dec, prompt, preset("ar", verify="race", temperature=T, seed=seed), n)[0])
            evs = run_generation(dec, prompt, preset("ersd", temperature=T, seed=seed, drafter=drafter), n)[0]
            assert tokens_of(evs) == ar, (drafter, seed, prompt)
            accepted[drafter] += sum(e.accepted for e in evs)
            steps[drafter] += len(evs)
    assert all(accepted[d] >= MIN_ACCEPTED * steps[d] for d in accepted), (accepted, steps)


@pytest.mark.parametrize("kind", ["llama", "gpt_neox", "mamba", "mamba2", "granite"])
def test_ssm_tree_and_backtrack_modes_are_lossless_on_any_model(kind, root):
    """--ssm-tree unrolled and --backtrack recompute/joint transform the verify pass and the commit;
    on attention models too they must leave greedy output unchanged (SSM models: test_mamba*)."""
    path = saved(kind, root)
    dec = Decoder(load(str(path)).model, load(str(saved("draft", root))).model)
    prompt = PROMPTS[0]
    ref = hf_greedy(path, prompt, 30)
    drafters = dict(dec.drafters)
    state = plain_next_logits(dec.target, prompt + list(ref))
    for ssm_tree in ("stree", "unrolled"):
        for backtrack in ("replay", "recompute", "joint"):
            for s in (preset("tree", tree=(2, 2, 1)), preset("sd", draft_len=3), preset("pld")):
                s = s.replace(ssm_tree=ssm_tree, backtrack=backtrack)
                dec.drafters.update(drafters)
                assert tokens_of(run_generation(dec, prompt, s, 30)[0]) == ref, s
                # the drafters above accept nothing on most of these models: a drafter right for
                # some tokens then wrong makes every mode commit (replay, joint, recompute) and roll
                # back partial paths, through non-first children of the tree too
                dec.drafters["model"] = dec.drafters["ngram"] = OracleDrafter(list(prompt) + list(ref))
                evs = run_generation(dec, prompt, s, 30)[0]
                assert tokens_of(evs) == ref, ("oracle", s)
                assert sum(1 for e in evs if 0 < e.accepted < e.drafted) >= 2, ("oracle", s)
                # the state committed is plain decoding's (a tiny model's argmax can hide a wrong one)
                assert torch.allclose(next_logits(dec, s), state, rtol=1e-4, atol=1e-3), ("oracle", s)
    dec.drafters.update(drafters)


@pytest.mark.parametrize("kind", ["llama", "mamba2", "granite"])
def test_unrolled_trees_fit_the_rows_left(kind, root):
    """An unrolled pass repeats shared prefixes (a chain per leaf), so a tree capped in nodes took
    several times as many rows: --ssm-tree unrolled failed with "context full" in a reply's last
    rows and with "draft tree too large" on shapes the strategy allows (212 and 254 nodes); a
    self-drafter's 256-deep chain left pending by --backtrack joint overflowed the scratch rows."""
    path = saved(kind, root)
    prompt = PROMPTS[0][:8]
    for extra in (6, 20):
        cap = len(prompt) + extra
        ref = tokens_of(run_generation(Decoder(load(str(path), max_context=cap).model), prompt, preset("ar"), 100)[0])
        dec = Decoder(load(str(path), max_context=cap).model, load(str(saved("draft", root)), max_context=cap).model)
        evs, summ = run_generation(dec, prompt, preset("tree", tree=(3, 2, 2, 1, 1), ssm_tree="unrolled"), 100)
        assert tokens_of(evs) == ref and summ.finish_reason == "context"
    ref = tokens_of(run_generation(Decoder(load(str(path)).model), prompt, preset("ar"), 12)[0])
    dec = Decoder(load(str(path)).model, load(str(saved("draft", root))).model)
    for shape in ((4, 4, 4, 2), (2,) * 7):
        evs, _ = run_generation(dec, prompt, preset("tree", tree=shape, ssm_tree="unrolled"), 12)
        assert tokens_of(evs) == ref, shape
    if kind != "granite":
        target = load(str(path)).model
        ref = tokens_of(run_generation(Decoder(target), prompt, preset("ar"), 300)[0])
        evs, _ = run_generation(Decoder(target, target), prompt, preset("tree", tree=(1,) * 256, backtrack="joint"), 300)
        assert tokens_of(evs) == ref and max(e.accepted for e in evs) > 200


def test_unrolled_fit_counts_a_chain_per_leaf():
    from engine.generate import unroll, unrolled_fit

    parents = [-1, 0, 1, 1, -1, 4]  # a -> b -> c, b -> d; e -> f: chains abc, abd, ef = 8 rows
    assert unrolled_fit(parents, 8) == 6 and unrolled_fit(parents, 100) == 6
    assert unrolled_fit(parents, 7) == 5 and unrolled_fit(parents, 3) == 3 and unrolled_fit(parents, 0) == 0
    for n in range(len(parents) + 1):  # the count is the unrolled pass's rows (root excluded)
        rows = len(unroll([0] + list(range(1, n + 1)), [-1] + [p + 1 for p in parents[:n]])[0]) - 1
        assert unrolled_fit(parents[:n], rows) == n and (rows == 0 or unrolled_fit(parents[:n], rows - 1) < n)


def test_the_last_steps_telemetry_counts_only_what_it_emitted(root):
    """A step cut by the token limit or an EOS emitted fewer tokens than the target accepted: its
    event counted the cut ones as accepted (8 accepted, 2 emitted), which inflated the acceptance
    rate in the dashboard, --json and bench. A negative token limit is refused (it emitted drafts)."""
    path = saved("llama", root)
    target = load(str(path)).model
    prompt = PROMPTS[0]
    full = tokens_of(run_generation(Decoder(target), prompt, preset("ar"), 20)[0])
    dec = Decoder(target, target)  # a self-drafter: every draft accepted
    evs, summ = run_generation(dec, prompt, preset("sd", draft_len=8), 2)
    assert tokens_of(evs) == full[:2] and evs[-1].accepted == 2 and evs[-1].accepted_nodes == [0, 1]
    assert summ.accepted == 2 and summ.drafted == 8
    dec.eos_ids = {full[3]}
    evs, summ = run_generation(dec, prompt, preset("sd", draft_len=8), 20)
    assert tokens_of(evs) == full[:4] and evs[-1].accepted == 4 == summ.accepted
    with pytest.raises(ValueError, match="max_new_tokens"):
        run_generation(dec, prompt, preset("sd", draft_len=4), -1)


def test_a_reply_ended_by_the_context_keeps_an_unfinished_characters_bytes(tmp_path):
    """A reply ended by the context flushed its stream decoder before the step knew it was the
    last: the bytes of a character cut at the end were dropped (the text no longer matched the
    ids), where a reply ended by its token limit keeps them (as U+FFFD)."""
    from engine.tokenizer import StreamDecoder

    from .test_vocab import tiny_model
    from .vocab_pairs import smollm2

    tok = smollm2()
    path = tiny_model(str(tmp_path), "smol-target", 49152, "llama")
    base = tok.encode("<|im_start|>user\nSay something in Japanese.<|im_end|>\n<|im_start|>assistant\n")
    for extra in range(1000, 1060):  # a prompt whose greedy reply cuts a character at some token
        prompt = base + [extra]
        out = tokens_of(run_generation(Decoder(load(str(path)).model), prompt, preset("ar"), 120)[0])
        stream, text, cut = StreamDecoder(tok), "", None
        for i, t in enumerate(out, 1):
            text += stream.push([t])
            if text != tok.decode(out[:i]):  # the stream holds a character's first bytes here
                cut = i
                break
        if cut:
            break
    assert cut, "no reply with a character cut across tokens"
    for how in ("length", "context"):
        cap = len(prompt) + cut if how == "context" else 1024
        dec = Decoder(load(str(path), max_context=cap).model, detokenize=lambda: StreamDecoder(tok))
        evs, summ = run_generation(dec, prompt, preset("ar"), cut if how == "length" else cut + 10)
        assert summ.finish_reason == how and "".join(e.text for e in evs) == tok.decode(tokens_of(evs)), how


def test_joint_backtrack_survives_live_switches(root):
    path = saved("llama", root)
    dec = Decoder(load(str(path)).model, load(str(saved("draft", root))).model)
    modes = itertools.cycle(["joint", "joint", "replay", "joint", "recompute", "unrolled"])

    def current():
        m = next(modes)
        return preset("tree", tree=(2, 1, 1), ssm_tree="unrolled") if m == "unrolled" else preset("sd", draft_len=3, backtrack=m)

    prompt = PROMPTS[3]
    assert tokens_of(run_generation(dec, prompt, current, 40)[0]) == hf_greedy(path, prompt, 40)


def test_unroll_maps_rows_and_chains():
    from engine.generate import unroll

    # root(0) -> a(1) -> b(2), a -> c(3); root -> d(4)
    tokens, parents = [9, 1, 2, 3, 4], [-1, 0, 1, 1, 0]
    t, p, rowmap = unroll(tokens, parents)
    assert t == [9, 1, 2, 1, 3, 4] and p == [-1, 0, 1, 0, 3, 0]  # a repeated once per leaf below it
    assert [t[r] for r in rowmap(None)] == tokens
    assert rowmap([0, 1, 3]) == [0, 3, 4] and rowmap([0, 4]) == [0, 5]


def test_strategy_specs():
    from engine.strategy import from_spec

    assert from_spec("tree:3-3-2-1").tree == (3, 3, 2, 1) and from_spec("tree:3-3-2-1").name == "tree"
    assert from_spec("sd:3").draft_len == 3 and from_spec("optimal:24").node_budget == 24
    assert from_spec("mab") == preset("mab")
    assert from_spec("sd:2", preset("sd", temperature=0.5)).temperature == 0.5
    for bad, msg in (("ar:3", "takes no parameter"), ("tree:3-x", "bad tree shape"), ("sd:x", "whole number, not 'x'"), ("sd:4:auto:auto", "whole number"), ("pld:", "nothing after"), ("nope", "unknown strategy")):
        with pytest.raises(StrategyError, match=msg):
            from_spec(bad)


@pytest.mark.parametrize("kind", ["llama", "gpt_neox", "mamba2", "granite"])
def test_greedy_strategies_identical_in_bf16(kind, root):
    """Lossless in the chosen dtype: in bf16 every greedy strategy equals bf16 plain decoding
    (one-row products run as two, attention reduces keys in a fixed block order)."""
    target = load(str(saved(kind, root)), dtype="bf16").model
    dec = Decoder(target, load(str(saved("draft", root)), dtype="bf16").model)
    strategies = [preset("pld"), preset("sd", draft_len=3), preset("tree", tree=(3, 2, 1)), preset("ersd"),
                  preset("mab", arms=((2, 1), (1, 1, 1))), preset("optimal", node_budget=6), preset("hybrid")]
    for prompt in PROMPTS:
        ref = tokens_of(run_generation(dec, prompt, preset("ar"), 30)[0])
        for s in strategies:
            assert tokens_of(run_generation(dec, prompt, s, 30)[0]) == ref, (kind, s.label())


def test_hybrid_drafts_by_prompt_lookup_when_the_context_repeats_and_by_the_model_otherwise(root):
    """hybrid: a step whose context suffix occurred before drafts the n-gram continuations (up to
    HYBRID_NGRAM_LEN tokens, no draft probabilities: greedy or membership verification); other
    steps draft a draft_len chain with the model (probabilities kept for rejection sampling)."""
    from engine.strategy import HYBRID_NGRAM_LEN

    target = load(str(saved("llama", root))).model
    dec = Decoder(target, load(str(saved("draft", root))).model)
    s = preset("hybrid", temperature=1.0, draft_len=3)
    gen = torch.Generator().manual_seed(0)
    dec.start([5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 5, 6])  # "5 6" occurred before: lookup fires
    tree, _ = dec._draft(s, gen, 64)
    assert tree.tokens == [7, 8, 9, 10, 11, 12, 13, 14][:HYBRID_NGRAM_LEN] and tree.draft_probs is None  # one match: one branch
    dec.reset()
    dec.start([20, 21, 22, 23])  # nothing repeats: the model drafts a chain of 3
    tree, _ = dec._draft(s, gen, 64)
    assert len(tree) == 3 and tree.parents == [-1, 0, 1] and tree.draft_probs is not None

