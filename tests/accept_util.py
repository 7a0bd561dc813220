"""Drafts that get accepted, for the losslessness tests (greedy identity and distribution tests
only detect a broken verifier, commit or bridge when drafts are accepted, fully and in part).

* ``OracleDrafter``    target ids from the known greedy continuation: right for ``good[step]``
                       tokens, then wrong (chains, or trees with a wrong sibling at every depth)
* ``WrongAfter``       a real drafter's tree with its first-ranked chain made wrong at a depth
                       (a model drafting for itself: accepted exactly up to that depth)
* ``TeacherForced``    the continuation's first ``good[step]`` tokens, then a real drafter's own
                       tree from there (a different model: its tokens are mostly rejected)
* ``bigram_model``     a real checkpoint (transformers save_pretrained: llama or Mamba-2) whose
                       next-token logits depend on the last token only, as a given table: its
                       layers' outputs are zeroed, so the residual stream is the embedding, a
                       one-hot of the token's row of the table (a designed target or drafter
                       over any vocabulary: a text it spells, a distribution it drafts)
* ``chain_bigram``     the table that spells a periodic text in a tokenizer's ids
* ``partial_steps``    steps with 0 < accepted < drafted
* ``oracle_runs``      strategies run with an ``OracleDrafter``: identity and exact acceptance
* ``assert_greedy_children``  each greedy sibling set is the top-k of the drafter's logits over
                       the columns it may propose
* ``exact_law_p``      goodness of fit of sampled outcomes to an exactly computed law
* ``flat_cost``        a fixed verify-cost curve: tree policies that do not follow the machine's load
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Mapping, Sequence

import torch

from engine.generate import run_generation
from engine.tree import TokenTree

NEG = -1.0e4  # a logit whose softmax is exactly 0 in fp32: q is sparse (ψ enumerates only what q allows)


def partial_steps(events) -> int:
    """Steps whose draft was accepted in part (0 < accepted < drafted; not the last step, which
    the length limit may cut): the target's own token after them is the correction at an inner
    row (what a wrong bonus or commit there would change)."""
    return sum(1 for e in events if 0 < e.accepted < e.drafted and not e.finished)


def _depth(req) -> int:
    if req.plan is not None:
        return max(_plan_depths(req.plan), default=0)
    return len(req.shape)


def _plan_depths(plan: Sequence[int]) -> list[int]:
    d: list[int] = []
    for p in plan:
        d.append(1 if p < 0 else d[p] + 1)
    return d


def _wrong(t: int, k: int, vocab: int, avoid=()) -> int:
    """A token != t (and not in ``avoid``), deterministic in (t, k)."""
    w = (t + 1 + 7 * k) % vocab
    while w == t or w in avoid:
        w = (w + 1) % vocab
    return w


class OracleDrafter:
    """Knows ``full`` (prompt + the target's greedy continuation). Step i drafts a chain (a
    shape of ones) or a tree of the request's depth whose first-ranked chain is right for
    ``good[i % len(good)]`` tokens and wrong at the next depth; trees add a wrong sibling before
    the first-ranked node at every depth (the accepted rows are not the first ones: a
    non-contiguous commit). ``log`` records (good, depth) per step: a step accepts exactly
    min(good, depth) tokens."""

    name = "oracle"

    def __init__(self, full: Sequence[int], vocab: int, good=(5, 2, 0, 3, 1, 4)):
        self.full, self.vocab, self.good = list(full), vocab, tuple(good)
        self.reset()

    def reset(self) -> None:
        self.step = 0
        self.log: list[tuple[int, int]] = []

    def propose(self, history, req) -> TokenTree:
        n_good = self.good[self.step % len(self.good)]
        self.step += 1
        depth = _depth(req)
        chain = req.plan is None and all(n == 1 for n in req.shape)
        truth = self.full[len(history):len(history) + depth]
        tokens: list[int] = []
        parents: list[int] = []
        parent = -1
        for d, t in enumerate(truth):
            main = t if d < n_good else _wrong(t, d, self.vocab)
            if not chain:
                tokens.append(_wrong(t, d + 1, self.vocab, avoid=(main,)))
                parents.append(parent)
            tokens.append(main)
            parents.append(parent)
            parent = len(tokens) - 1
        keep = min(len(tokens), req.max_nodes)
        tree = TokenTree(tokens[:keep], parents[:keep])
        self.log.append((n_good, tree.max_depth if len(tree) else 0))
        return tree


class WrongAfter:
    """``inner``'s tree with its first-ranked chain's node at depth ``wrong_at[step]`` (1-based;
    0: none) given a token that no sibling has and the drafter did not rank first: a model
    drafting for itself is then accepted for exactly that depth - 1 tokens. ``log``: per step
    (the depth made wrong, the tree's depth)."""

    def __init__(self, inner, vocab: int, wrong_at=(3, 1, 0, 2, 4)):
        self.inner, self.vocab, self.wrong_at = inner, vocab, tuple(wrong_at)
        self.name = getattr(inner, "name", "model")
        self.reset_log()

    def reset_log(self) -> None:
        self.step = 0
        self.log: list[tuple[int, int]] = []

    def reset(self) -> None:
        self.inner.reset()
        self.reset_log()

    def __getattr__(self, name):  # recurrent, seen, caught_up, ...: the inner drafter's
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def propose(self, history, req) -> TokenTree:
        tree = self.inner.propose(history, req)
        k = self.wrong_at[self.step % len(self.wrong_at)]
        self.step += 1
        tokens = list(tree.tokens)
        node, d = -1, 0
        while True:
            kids = [i for i, p in enumerate(tree.parents) if p == node]
            if not kids:
                break
            node, d = kids[0], d + 1  # the first-ranked child (greedy trees list children best first)
            if d == k:
                tokens[node] = _wrong(tokens[node], d, self.vocab, avoid={tokens[i] for i in kids})
                break
        self.log.append((k, tree.max_depth if len(tree) else 0))
        return TokenTree(tokens, list(tree.parents), tree.draft_probs, tree.sampling)


class TeacherForced:
    """The first ``good[step]`` tokens of ``full`` (a chain), then ``inner``'s own tree drafted
    after them (the drafter runs on the history plus those tokens: when the target accepts them,
    the drafter's next step is one token behind, as after any accepted draft of its own)."""

    def __init__(self, inner, full: Sequence[int], good=(2, 1, 3, 0, 2)):
        self.inner, self.full, self.good = inner, list(full), tuple(good)
        self.name = getattr(inner, "name", "model")
        self.step = 0
        self.log: list[int] = []  # the forced tokens of each step

    def reset(self) -> None:
        self.inner.reset()
        self.step = 0
        self.log = []

    def __getattr__(self, name):
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def propose(self, history, req) -> TokenTree:
        n = self.good[self.step % len(self.good)]
        self.step += 1
        depth = len(req.shape)
        forced = self.full[len(history):len(history) + min(n, depth - 1)]
        n = len(forced)
        self.log.append(n)
        tail = self.inner.propose(list(history) + forced, replace(req, shape=tuple(req.shape[n:]), max_nodes=req.max_nodes - n))
        tokens = forced + list(tail.tokens)
        parents = list(range(-1, n - 1)) + [p + n if p >= 0 else n - 1 for p in tail.parents]
        return TokenTree(tokens, parents)


# ---- designed checkpoints ----------------------------------------------------------------------------------
def bigram_model(path: Path, kind: str, vocab: int, rows: Mapping[int, Mapping[int, float]], default: Mapping[int, float],
                 base: float = NEG, seed: int = 0) -> Path:
    """save_pretrained a tiny ``kind`` ("llama" or "mamba2") model over ``vocab`` ids whose logits
    after token a are ``rows[a]`` (token -> logit; every other token ``base``), and ``default``
    after any token not in ``rows``. Built exactly: each token of ``rows`` has its own hidden
    dimension (the rest share one), the embedding is that one-hot, every layer's output
    projection is zero (attention, MLP or SSM add nothing to the residual), the final RMSNorm
    maps the one-hot to itself and the head's column for a dimension is its row of logits."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Mamba2Config

    path = Path(path)
    if (path / "config.json").exists():
        return path
    keys = sorted(rows)
    dim = {a: i for i, a in enumerate(keys)}
    junk = len(keys)
    H = max(16, 8 * math.ceil((junk + 1) / 8))
    if kind == "llama":
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=H, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=1, max_position_embeddings=4096, tie_word_embeddings=False)
        eps = cfg.rms_norm_eps
    else:
        cfg = Mamba2Config(vocab_size=vocab, hidden_size=H, num_hidden_layers=1, num_heads=H // 8, head_dim=16, state_size=8,
                           n_groups=1, expand=2, conv_kernel=4, tie_word_embeddings=False)
        eps = cfg.layer_norm_epsilon
    torch.manual_seed(seed)
    m = AutoModelForCausalLM.from_config(cfg)
    head = torch.full((vocab, H), base)
    for a, i in [(a, dim[a]) for a in keys] + [(None, junk)]:
        for t, logit in (rows[a] if a is not None else default).items():
            head[t, i] = logit
    emb = torch.zeros(vocab, H)
    emb[:, junk] = 1.0
    for a, i in dim.items():
        emb[a, junk] = 0.0
        emb[a, i] = 1.0
    with torch.no_grad():
        m.get_input_embeddings().weight.copy_(emb)
        m.get_output_embeddings().weight.copy_(head)
        for name, p in m.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight", "out_proj.weight")):
                p.zero_()
            elif name in ("model.norm.weight", "backbone.norm_f.weight"):
                p.fill_(math.sqrt(1.0 / H + eps))  # RMSNorm(one-hot) = one-hot
    m.save_pretrained(path)
    return path


def chain_bigram(ids: Sequence[int], margin: float = 8.0) -> dict[int, dict[int, float]]:
    """``bigram_model`` rows that make greedy decoding follow ``ids``: each token's successor in
    it at ``margin`` (a token must have one successor only)."""
    rows: dict[int, dict[int, float]] = {}
    for a, b in zip(ids, ids[1:]):
        if rows.setdefault(a, {b: margin}) != {b: margin}:
            raise ValueError(f"token {a} has two successors in the chain: {next(iter(rows[a]))} and {b}")
    return rows


def histories(prompt: Sequence[int], events) -> list[list[int]]:
    """The history each step drafted from (prompt + what the earlier steps emitted)."""
    out, h = [], list(prompt)
    for e in events:
        out.append(list(h))
        h += e.emitted
    return out


def assert_greedy_children(prompt: Sequence[int], events, logits_of, cols: Sequence[int] | None = None) -> int:
    """Every step's greedy draft: each node's children are the top-k of ``logits_of(history +
    the path to it)[-1]`` (k: how many it has) over the columns ``cols`` (None: all), i.e. the
    argmax of the drafter's full logits restricted to what it may propose, then the runners-up.
    Returns the number of sibling sets checked."""
    checked = 0
    keep = None if cols is None else torch.tensor(sorted(cols))
    for hist, e in zip(histories(prompt, events), events):
        tokens, parents = e.tree_tokens, e.tree_parents
        for node in [-1] + list(range(len(tokens))):
            kids = [i for i, p in enumerate(parents) if p == node]
            if not kids:
                continue
            path, r = [], node
            while r >= 0:
                path.append(tokens[r])
                r = parents[r]
            logits = logits_of(hist + path[::-1])[-1].float()
            if keep is not None:
                top = keep[torch.topk(logits[keep], len(kids)).indices]
            else:
                top = torch.topk(logits, len(kids)).indices
            assert sorted(tokens[i] for i in kids) == sorted(top.tolist()), (e.step, node, [tokens[i] for i in kids], top.tolist())
            checked += 1
    return checked


def oracle_runs(dec, prompt: Sequence[int], want: Sequence[int], strategies, vocab: int, good=(5, 2, 0, 3, 1, 4)) -> int:
    """Each strategy with an ``OracleDrafter`` as the decoder's drafter model (restored after):
    the output is ``want`` (plain greedy), every step but the last accepts exactly what the
    oracle got right, and some steps accept in part. Returns the partly accepted steps."""
    real = dec.drafters.get("model")
    partial = 0
    try:
        for s in strategies:
            oracle = OracleDrafter(list(prompt) + list(want), vocab, good)
            dec.drafters["model"] = oracle
            dec.reset()
            evs, _ = run_generation(dec, prompt, s, len(want))
            label = (s.label(), s.ssm_tree, s.backtrack)
            assert [t for e in evs for t in e.emitted] == list(want), label
            got = [(e.accepted, min(g, d)) for (g, d), e in zip(oracle.log, evs) if not e.finished]
            assert all(a == b for a, b in got), (label, got)
            assert partial_steps(evs) > 0, label
            partial += partial_steps(evs)
    finally:
        if real is None:
            dec.drafters.pop("model", None)
        else:
            dec.drafters["model"] = real
        dec.reset()
    return partial


def flat_cost():
    """A verify pass that costs about the same at any size (engine/costmodel.VerifyCost): set as a
    decoder's ``verify_cost``, the optimal tree's size depends on acceptance alone, not on this
    machine's timings (calibrated under load, it can shrink to one node: nothing accepted in part)."""
    from engine.costmodel import fit

    return fit({1: 1.0, 2: 1.0, 4: 1.01, 8: 1.02, 16: 1.04, 32: 1.08})


def exact_law_p(outcomes: Sequence, law: Mapping) -> float:
    """Chi-square goodness of fit of ``outcomes`` to an exactly known law (outcome -> probability;
    what it leaves out has the rest of the mass): outcomes expected 5 times or more are cells of
    their own, the rest one pooled cell."""
    from collections import Counter

    from scipy.stats import chisquare

    n = len(outcomes)
    seen = Counter(outcomes)
    cells = [k for k, p in law.items() if p * n >= 5]
    obs = [seen[k] for k in cells]
    exp = [law[k] * n for k in cells]
    rest_obs, rest_exp = n - sum(obs), n - sum(exp)
    if rest_exp > 1e-9 * n or rest_obs:
        obs.append(rest_obs)
        exp.append(max(rest_exp, 1e-12))
    return float(chisquare(obs, exp).pvalue)
