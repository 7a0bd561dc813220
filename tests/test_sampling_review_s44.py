"""Session 44 review of sampling (T > 0): defects found in the lossless paths, one test each.

* SLRS (heterogeneous-vocab Alg. 3) verified a chain with ψ of a *sampled* procedure when the
  chain had been drafted greedily (``--verify membership`` makes the loop draft in greedy mode):
  the argmax proposal was accepted w.p. min(1, p/ψ) with ψ < 1, far above its p.
* SLRS verification read the bridge's last procedure context even on a step that proposed nothing
  (an adaptive k = 0, a full context): a stale ∅ sent the step's token to a residual built from
  another position's ψ instead of plain p (and a stale greedy context crashed at T > 0).
"""

from __future__ import annotations

import pytest
import torch

from engine.generate import Decoder, run_generation
from engine.strategy import preset
from engine.tokenizer import ByteTokenizer
from engine.tree import TokenTree
from engine.verify import sample_next

from .accept_util import exact_law_p
from .test_vocab import fitted_byte_pair, root  # noqa: F401  (fixtures)


def tokens_of(events):
    return [t for e in events for t in e.emitted]


def test_slrs_with_membership_verification_keeps_the_target_distribution(fitted_byte_pair):  # noqa: F811
    """``sd@slrs --verify membership -T 1``: accepted by validate(); the drafter then drafts its
    argmax chain. Its first token must still be distributed as p."""
    target, drafter, t, prompt, law = fitted_byte_pair
    dec = Decoder(target, drafter, target_tokenizer=t, drafter_tokenizer=ByteTokenizer())
    s = preset("sd", draft_len=2, vocab="slrs", temperature=1.0, verify="membership").validate()
    n = 600
    firsts = [tokens_of(run_generation(dec, prompt, s.replace(seed=i), 1)[0])[0] for i in range(n)]
    p1 = law(prompt)
    assert exact_law_p(firsts, dict(enumerate(p1.tolist()))) > 1e-3


def test_a_slrs_step_without_a_proposal_samples_plain_p(fitted_byte_pair):  # noqa: F811
    """A step whose tree is empty because nothing was proposed this step (the adaptive gate's
    k = 0, a context with room for one token) must emit a plain sample of p, whatever context
    the bridge kept from an earlier step's procedures."""
    target, drafter, t, prompt, law = fitted_byte_pair
    dec = Decoder(target, drafter, target_tokenizer=t, drafter_tokenizer=ByteTokenizer())
    s = preset("sd", draft_len=2, vocab="slrs", temperature=1.0)
    run_generation(dec, prompt, s, 3)  # leaves the bridge's context of the last step's procedures
    bridge = dec.drafters["model"]
    assert bridge._slrs_ctx is not None
    stale = dict(bridge._slrs_ctx)
    logits = target.with_own_cache().full_logits(list(dec.history))[-1:].float()
    differ = 0
    for seed in range(40):
        bridge._slrs_ctx = dict(stale, empty_last=True, psi={})  # an earlier step ended on ∅
        g1, g2 = torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)
        got = dec._verify(s, TokenTree.empty(), logits, g1)
        want = sample_next(logits[0], 1.0, 1.0, g2)
        differ += got != ([], want)
    assert differ == 0
    # and a context left by a greedy step (T = 0) must not be read by a sampling one
    for seed in range(5):
        bridge._slrs_ctx = dict(stale, empty_last=True, psi={}, temperature=0.0)
        got = dec._verify(s, TokenTree.empty(), logits, torch.Generator().manual_seed(seed))
        assert got == ([], sample_next(logits[0], 1.0, 1.0, torch.Generator().manual_seed(seed)))


# ---- union: a first draw outside the target's vocabulary ------------------------------------------------------
from .test_vocab import hetero_pair  # noqa: E402,F401  (fixture)


@pytest.mark.parametrize("verify", ["auto", "rs", "mss"])
def test_union_draw_outside_t_is_verified_as_rejected(verify, hetero_pair):  # noqa: F811
    """The union bridge's chain stops at a draw outside T; drawn first, the chain is empty with
    row 0 in ``rejected_rows``: that draw was rejected, and the step must emit a sample of
    norm(max(p - q|T, 0)), not of p (the loop took every empty tree for a plain step). With q|T
    all on p's argmax a, the residual never emits a. Likewise after an accepted token, where
    ``--verify mss`` (the tree rule, which knows nothing of rejected rows) sampled p."""
    from engine.drafters.vocab import BridgeDrafter

    target, drafter, t, d = hetero_pair
    dec = Decoder(target, drafter, target_tokenizer=t, drafter_tokenizer=d)
    assert isinstance(dec.drafters["model"], BridgeDrafter)
    prompt = t.encode("the cat sat on the")
    dec.start(prompt)
    s = preset("sd", draft_len=3, vocab="union", temperature=1.0, verify=verify).validate()
    own = target.with_own_cache()
    logits = own.full_logits(list(prompt))[-1:].float()
    p = torch.softmax(logits[0], -1)
    a = int(p.argmax())
    q = torch.zeros(1, p.shape[0])
    q[0, a] = float(p[a])  # the rest of q's mass was outside T
    tree = TokenTree([], [], q, "iid", rejected_rows={0})
    got = [dec._verify(s, tree, logits, torch.Generator().manual_seed(i))[1] for i in range(300)]
    assert float(p[a]) > 0.05 and a not in got
    # one token drawn in T (q below p there: always accepted), then a draw outside T
    logits2 = own.full_logits(list(prompt) + [a])[-2:].float()
    p2 = torch.softmax(logits2[1], -1)
    b = int(p2.argmax())
    q2 = torch.zeros(2, p.shape[0])
    q2[0, a] = 0.5 * float(p[a])
    q2[1, b] = float(p2[b])
    tree = TokenTree([a], [-1], q2, "iid", rejected_rows={1})
    got = [dec._verify(s, tree, logits2, torch.Generator().manual_seed(i)) for i in range(300)]
    assert all(path == [0] for path, _ in got)
    assert float(p2[b]) > 0.05 and b not in [x for _, x in got]
