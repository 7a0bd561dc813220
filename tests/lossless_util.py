"""Helpers of the end-to-end losslessness tests (tests/test_generate.py): the exact law of a tiny
target's first tokens, a chi-square test against it, a drafter that agrees with the target often
but not always, a drafter that is right for a chosen number of tokens and then wrong, and a flat
verify cost under which the cost-aware (:auto) strategies draft."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import torch

from engine.generate import Decoder, run_generation
from engine.sampling import probs_from_logits, repeat_penalized
from engine.tree import TokenTree

from .tiny import saved


def tokens_of(events) -> list[int]:
    return [t for e in events for t in e.emitted]


# ---- a drafter close to the target ---------------------------------------------------------------------
# noise on the output layer (in units of its weights' std) that leaves the target's own checkpoint
# accepting ~0.5-0.8 of its drafts at T = 1 on the tests' prompts: far enough from the target for a
# verifier's mistakes to show (they move the law towards q), close enough for drafts to be accepted
NEAR_NOISE = {"llama": 1.0, "mamba2": 0.2, "mamba": 0.15, "granite": 0.2, "gpt_neox": 1.0}


def near_drafter(kind: str, root: str, noise: float | None = None, seed: int = 1) -> Path:
    """The target ``kind``'s checkpoint with Gaussian noise added to its output layer, saved under
    ``root``: a drafter of the same family (a recurrent one for SSM targets) whose q is the
    target's p perturbed."""
    noise = NEAR_NOISE[kind] if noise is None else noise
    path = Path(root) / f"{kind}-near-{noise:g}-{seed}"
    if not (path / "config.json").exists():
        from transformers import AutoModelForCausalLM

        m = AutoModelForCausalLM.from_pretrained(saved(kind, root))
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            w = m.get_output_embeddings().weight
            w.add_(noise * w.std() * torch.randn(w.shape, generator=g))
        m.save_pretrained(path)
    return path


# ---- the exact law of plain sampling -------------------------------------------------------------------
def next_probs(model, context: Sequence[int], temperature: float, top_p: float = 1.0, repeat: tuple[float, int] | None = None,
               **cuts) -> torch.Tensor:
    """``model``'s next-token distribution (V,) after ``context``, as plain sampling computes it:
    the context but its last token prefilled, then a one-row pass over that token (float64)."""
    dec = Decoder(model)
    dec.start(list(context))
    logits = model.verify([context[-1]], [-1])[0].float()
    if repeat is not None and repeat[0] != 1.0:  # (penalty, window): plain decoding's repetition penalty
        logits = repeat_penalized(logits[None], [list(context)[-repeat[1]:]], repeat[0])[0]
    return probs_from_logits(logits, temperature, top_p, **cuts).double()


def exact_law(model, prompt: Sequence[int], temperature: float, top_p: float = 1.0, repeat: tuple[float, int] | None = None,
              **cuts) -> torch.Tensor:
    """P[x1, x2]: the exact probability that plain sampling's first two tokens after ``prompt`` are
    (x1, x2) (one pass per first token of positive probability). ``model`` is used through a cache
    of its own: the decoder under test keeps its state. ``cuts``: top_k, min_p (probs_from_logits)."""
    model = model.with_own_cache()
    p1 = next_probs(model, prompt, temperature, top_p, repeat, **cuts)
    law = torch.zeros(p1.shape[0], p1.shape[0], dtype=torch.float64)
    for x1 in torch.nonzero(p1 > 0).flatten().tolist():
        law[x1] = p1[x1] * next_probs(model, list(prompt) + [x1], temperature, top_p, repeat, **cuts)
    return law


def _chisquare(obs, exp, min_expected: float = 5.0) -> float:
    """Chi-square p-value of observed counts against expected ones (any scale); cells expected
    fewer than ``min_expected`` times are pooled (into the smallest other cell if the pool is
    still that small), as the approximation needs."""
    from scipy.stats import chisquare

    n, total = float(sum(obs)), float(sum(exp))
    cells = [(o, e * n / total) for o, e in zip(obs, exp) if e > 0]
    big = sorted((c for c in cells if c[1] >= min_expected), key=lambda c: c[1])
    pool = (sum(o for o, e in cells if e < min_expected), sum(e for o, e in cells if e < min_expected))
    if pool[1] > 0:
        if pool[1] >= min_expected or not big:
            big.append(pool)
        else:
            big[0] = (big[0][0] + pool[0], big[0][1] + pool[1])
    if len(big) < 2:  # one possible cell: nothing to compare
        return 1.0
    return float(chisquare([o for o, _ in big], [e for _, e in big]).pvalue)


def _counts(samples, law: torch.Tensor):
    """Counts (V, V) of the samples' first two tokens, or None if one has probability 0."""
    obs = torch.zeros_like(law)
    for s in samples:
        a, b = s[0], s[1]
        if law[a, b] <= 0:
            return None
        obs[a, b] += 1
    return obs


def law_pvalue(samples: Sequence[tuple[int, ...]], law: torch.Tensor, min_expected: float = 5.0) -> float:
    """Chi-square goodness of fit of two-token samples to ``law`` (V, V). Cells: every outcome
    expected at least ``min_expected`` times; a first token's other outcomes pooled together where
    they are expected that often; whatever is left in one cell. An outcome of probability 0 gives 0."""
    obs_m = _counts(samples, law)
    if obs_m is None:
        return 0.0
    exp = law * len(samples)
    big = exp >= min_expected
    obs, expd = obs_m[big].tolist(), exp[big].tolist()
    rest_o = rest_e = 0.0
    for a in range(exp.shape[0]):
        small = (~big[a]) & (exp[a] > 0)
        e, o = float(exp[a][small].sum()), float(obs_m[a][small].sum())
        if e >= min_expected:
            obs.append(o)
            expd.append(e)
        else:
            rest_o, rest_e = rest_o + o, rest_e + e
    obs.append(rest_o)
    expd.append(rest_e)
    return _chisquare(obs, expd)


def _ratio_bins(p: torch.Tensor, q: torch.Tensor, bins: int) -> dict[int, int]:
    """Tokens of positive p ranked by q/p, cut into ``bins`` groups of about equal p mass."""
    idx = torch.nonzero(p > 0).flatten().tolist()
    idx.sort(key=lambda i: float(q[i] / p[i]))
    out, before = {}, 0.0
    for i in idx:
        out[i] = min(bins - 1, int((before + float(p[i]) / 2) * bins))
        before += float(p[i])
    return out


def ratio_pvalue(samples: Sequence[tuple[int, ...]], law: torch.Tensor, draft_law: torch.Tensor, bins: int = 4) -> float:
    """Chi-square goodness of fit of two-token samples to ``law`` on ``bins`` x ``bins`` cells
    chosen where a verifier's mistakes show: a speculative sampler that is wrong moves mass
    towards the drafter's likely tokens (too many accepted, a correction drawn from p rather than
    the residual, a q of the wrong temperature), so each token is ranked by q/p (the drafter's
    probability over the target's, in its own context: ``draft_law`` is the drafter's law of the
    same two tokens, exact_law of the drafter model) and cut into groups of equal target mass; a
    cell is (first token's group, second token's group). The cells depend on the models only, not
    on the samples: an exact test, with far more power than outcomes pooled by count (flat tiny
    targets leave ~1,000 distinct outcomes in 1,000 samples)."""
    obs_m = _counts(samples, law)
    if obs_m is None:
        return 0.0
    p1, q1 = law.sum(1), draft_law.sum(1)
    cell = torch.full(law.shape, -1, dtype=torch.long)
    for x1, b1 in _ratio_bins(p1, q1, bins).items():
        q2 = draft_law[x1] / q1[x1] if q1[x1] > 0 else torch.zeros_like(law[x1])
        for x2, b2 in _ratio_bins(law[x1] / p1[x1], q2, bins).items():
            cell[x1, x2] = b1 * bins + b2
    n = len(samples)
    obs = [float(obs_m[cell == c].sum()) for c in range(bins * bins)]
    exp = [float(law[cell == c].sum()) * n for c in range(bins * bins)]
    return _chisquare(obs, exp)


def lookup_prompt(model, temperature: float, bases: Sequence[Sequence[int]], top_p: float = 1.0) -> list[int]:
    """A prompt whose prompt-lookup draft (pld: what followed the context's last n-gram where it
    occurred before) the target, sampling at ``temperature``, often accepts. Random tiny models
    repeat nothing on their own, so at T > 0 a lookup draft was almost never accepted (0.02 tokens
    a step). Candidates: one token repeated ([t] * 8, the three t likeliest to follow themselves),
    and for each of ``bases`` a prompt c + Y + c whose Y is the target's greedy reply to it (a few
    rounds towards that fixed point: the lookup after the second c proposes Y); the winner has the
    most expected accepted tokens in its first step, computed exactly."""
    from engine.drafters.ngram import NgramDrafter
    from engine.strategy import preset

    model = model.with_own_cache()
    V = model.vocab_size
    self_follow = sorted(((float(next_probs(model, [t] * 8, temperature, top_p)[t]), t) for t in range(V)), reverse=True)
    candidates = [[t] * 8 for _, t in self_follow[:3]]
    for c in bases:
        y: list[int] = []
        for _ in range(4):
            y = tokens_of(run_generation(Decoder(model), list(c) + y + list(c), preset("ar"), 8)[0])
        candidates.append(list(c) + y + list(c))

    def expected(prompt: list[int]) -> float:
        conts = NgramDrafter().continuations(prompt, 8, 1)
        e, reach, ctx = 0.0, 1.0, list(prompt)
        for t in conts[0] if conts else []:
            reach *= float(next_probs(model, ctx, temperature, top_p)[t])
            e += reach
            ctx.append(t)
        return e

    return max(candidates, key=expected)


def hybrid_prompt(target, drafter, temperature: float, candidates: int = 4) -> list[int]:
    """hybrid's two kinds of steps within the two tokens a law test sees: one token repeated
    ([t] * 8), so that the first step is a one-token lookup draft (accepted where the target
    samples t) and, where it is rejected, the second a drafter model's chain verified by rejection
    sampling. Of the ``candidates`` t likeliest to follow themselves (at least half as likely as
    the likeliest), the one after whose rejection the target and the drafter differ most (the
    expected total variation distance of their next distributions): where both are sure of the
    same token, no verifier's mistake can show."""
    target, drafter = target.with_own_cache(), drafter.with_own_cache()
    V = target.vocab_size
    self_follow = sorted(((float(next_probs(target, [t] * 8, temperature)[t]), t) for t in range(V)), reverse=True)

    def differ(t: int) -> float:
        p1 = next_probs(target, [t] * 8, temperature)
        p1[t] = 0.0
        score = 0.0
        for x in torch.topk(p1, 8).indices.tolist():
            ctx = [t] * 8 + [x]
            tv = 0.5 * float((next_probs(target, ctx, temperature) - next_probs(drafter, ctx, temperature)).abs().sum())
            score += float(p1[x]) * tv
        return score

    likely = [t for p, t in self_follow[:candidates] if p >= self_follow[0][0] / 2]
    return [max(likely, key=differ)] * 8


def draw(dec: Decoder, prompt: Sequence[int], strategy, seeds: Sequence[int], length: int = 2):
    """One reply of ``length`` tokens per seed: (the replies, accepted tokens per step)."""
    outs, accepted, steps = [], 0, 0
    for seed in seeds:
        evs, _ = run_generation(dec, prompt, strategy.replace(seed=seed), length)
        outs.append(tuple(tokens_of(evs)))
        accepted += sum(e.accepted for e in evs)
        steps += sum(1 for e in evs if e.emitted)
    return outs, accepted / max(steps, 1)


# ---- the committed state --------------------------------------------------------------------------------
def next_logits(dec: Decoder, strategy) -> torch.Tensor:
    """The target's logits (V,) for the token after the decoder's context, from its committed
    state (and a --backtrack joint step's pending chain) as ``strategy`` verifies: a state
    corrupted by a commit or rollback shows here even where the tiny model's argmax hides it."""
    logits, _ = dec._verify_pass(strategy, TokenTree.empty(), dec.history[-1])
    dec.target.cache.clear_scratch()
    return logits[0].float()


def plain_next_logits(model, context: Sequence[int]) -> torch.Tensor:
    """The same logits from plain decoding's state: ``context`` prefilled on a cache of its own."""
    model = model.with_own_cache()
    Decoder(model).start(list(context))
    return model.verify([context[-1]], [-1])[0].float()


# ---- the cost gate on a flat verify cost ---------------------------------------------------------------
def flat_cost(monkeypatch, dec: Decoder, ms: float = 50.0) -> None:
    """The cost-aware (:auto) strategies on a flat verify cost of ``ms`` a pass (a GPU-like curve)
    with the loop's own timings kept out (as in tests/test_corpus.py): on a CPU a tiny drafter's
    steps cost as much as the tiny target's and the gate would rightly draft almost nothing. At
    50 ms a pass the drafting costs nothing in comparison: drafts are as long as acceptance pays."""
    from engine.costmodel import fit
    from engine.drafters.model import Spine
    from engine.gate import DraftGate

    monkeypatch.setattr(DraftGate, "observe_step", lambda self, rows, ms: None)
    monkeypatch.setattr(DraftGate, "observe_drafter", lambda self, ms: None)
    monkeypatch.setattr(DraftGate, "observe_mixed", lambda self, *a, **k: None)
    monkeypatch.setattr(Spine, "ms", property(lambda self: 0.0))
    dec.verify_cost = fit({n: ms * (1 + 0.002 * n) for n in (1, 2, 4, 8, 16, 32)})
    dec.gate = None


# ---- a drafter right for a chosen number of tokens -----------------------------------------------------
class OracleDrafter:
    """Knows the greedy reply (``full`` = prompt + reply) and drafts trees of the requested shape
    (``req.plan`` or ``req.shape``, cut to ``req.max_nodes``) whose true branch is right for
    ``good[step]`` tokens and wrong below; the true child sits at rank ``step % children`` among
    its siblings (the others wrong tokens), so accepted paths take other than first children. An
    entry of ``good`` below 0 drafts nothing that step. For any strategy at T = 0: steps accept
    0 < accepted < drafted tokens, which exercises the commits and rollbacks of a partial path."""

    name = "oracle"

    def __init__(self, full: Sequence[int], good: Sequence[int] = (2, 0, 5, 1, 3, -1, 4, 1, 2, 6), vocab: int = 96):
        self.full, self.good, self.vocab = list(full), tuple(good), vocab
        self.reset()

    def reset(self) -> None:
        self.step = 0

    def _true(self, history: Sequence[int], depth: int) -> int | None:
        i = len(history) + depth - 1
        if list(history) != self.full[: len(history)] or i >= len(self.full):
            return None
        return self.full[i]

    def propose(self, history, req) -> TokenTree:
        from engine.policy import plan_from_shape

        n_good = self.good[self.step % len(self.good)]
        step = self.step
        self.step += 1
        if n_good < 0:
            return TokenTree.empty()
        plan = list(req.plan) if req.plan is not None else list(plan_from_shape(tuple(req.shape)))
        kids: dict[int, list[int]] = {}
        for i, p in enumerate(plan):
            kids.setdefault(p, []).append(i)
        tokens: list[int] = []
        parents: list[int] = []
        # breadth first over the plan, each node (plan id, tree index, on the true branch, depth)
        frontier = [(-1, -1, True, 0)]
        while frontier and len(tokens) < req.max_nodes:
            nxt = []
            for pid, node, on_true, depth in frontier:
                children = kids.get(pid, [])
                if not children:
                    continue
                truth = self._true(history, depth + 1)
                right = on_true and truth is not None and depth < n_good
                at = step % len(children) if right else -1
                for r, cid in enumerate(children):
                    if len(tokens) >= req.max_nodes:
                        break
                    if r == at:
                        tok = truth
                    else:  # a wrong token: never the true one
                        base = truth if truth is not None else 0
                        tok = (base + 1 + 7 * r + depth) % self.vocab
                        if tok == truth:
                            tok = (tok + 1) % self.vocab
                    tokens.append(tok)
                    parents.append(node)
                    nxt.append((cid, len(tokens) - 1, r == at, depth + 1))
            frontier = nxt
        return TokenTree(tokens, parents)
