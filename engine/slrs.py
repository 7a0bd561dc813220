"""String-level rejection sampling (SLRS; heterogeneous-vocab Alg. 3, Thm 3.2, §3.4, App. C).

The drafter (vocabulary D) drafts tokens one at a time; their bytes are read against a trie of the
target's token strings, and the *procedure* stops as soon as the first target token t1 is
determined (the lookahead S of Alg. 3):

* the bytes leave the trie (no target token starts with them): t1 is the longest target token that
  is a prefix of the drafted text ("maximal munch"), fixed whatever comes next;
* or ``lookahead`` draft tokens were drawn: t1 is the longest token prefix so far;
* or the drafter ends the text (EOS): t1 is the longest token prefix, or the target's end of turn
  when nothing was drafted.

If the text has no target-token prefix at all the procedure proposes nothing (∅); that counts as
a rejection. Alg. 3 accepts t1 with probability min(1, p(t1)/ψ(t1)), where

    ψ(t) = Σ over draft sequences d1..di on which the procedure stops with output t of Π q(dj)

is the exact probability that the procedure proposes t, and on rejection samples
norm(p − min(p, ψ)). Lossless for any stopping rule as long as ψ is that rule's exact proposal
probability (Thm 3.2's proof only uses that ψ is the law of t1; ∅ adds its mass to the rejection
branch, which is exactly the residual's normaliser).

ψ(t) only needs the drafter at the draft prefixes whose text is a prefix of str(t) or extends it
without passing a longer target token (``region``); longer tokens and other branches can never
end in t. Their number is what Lemma 3.1 warns about: for a byte drafter it is small (the trie
nodes between t and the next tokens), for drafters with multi-character tokens it grows like
2^(len t - 1). ``max_terms`` bounds it; past it ``PsiTooLarge`` names the token and the count.

The residual is sampled without ψ on the whole vocabulary: draw t' ~ p and keep it with
probability max(0, 1 − ψ(t')/p(t')) — exact rejection sampling from norm(p − min(p, ψ)) with
proposal p, needing ψ only at the drawn tokens (cached per position).

At T = 0 p is one-hot: Alg. 3 accepts t1 iff it is the target's argmax and otherwise emits the
argmax, so no ψ is computed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import torch

from .errors import SpecchatError
from .sampling import sampler


class PsiTooLarge(SpecchatError, ValueError):
    """ψ(t) has more terms than allowed (heterogeneous-vocab Lemma 3.1)."""


# ---- the target's token strings as a byte trie -----------------------------------------------------------
class TargetTrie:
    """Prefixes of the target's token strings. Node 0 is the empty prefix.

    ``token[n]``   target id whose string is exactly node n's prefix (-1: none)
    ``longest[n]`` the longest target token that is a prefix of node n's prefix (-1: none)
    """

    def __init__(self, strings: dict[int, bytes]):
        self.child: list[dict[int, int]] = [{}]
        self.token: list[int] = [-1]
        self.longest: list[int] = [-1]
        self.depth: list[int] = [0]
        self.string: dict[int, bytes] = {}
        for tid, s in sorted(strings.items(), key=lambda kv: (len(kv[1]), kv[0])):
            if not s:
                continue
            n = 0
            for b in s:
                nxt = self.child[n].get(b)
                if nxt is None:
                    nxt = len(self.token)
                    self.child[n][b] = nxt
                    self.child.append({})
                    self.token.append(-1)
                    self.longest.append(self.longest[n])
                    self.depth.append(self.depth[n] + 1)
                n = nxt
            if self.token[n] < 0:  # two ids with one string: the first (lowest id) is the token
                self.token[n] = tid
                self.string[tid] = s
                self.longest[n] = tid  # tokens go in by length: n has no children yet

    def walk(self, node: int, data: bytes) -> tuple[int, int]:
        """Follow ``data`` from ``node``: (last node reached, bytes consumed)."""
        for i, b in enumerate(data):
            nxt = self.child[node].get(b)
            if nxt is None:
                return node, i
            node = nxt
        return node, len(data)

    def node_of(self, s: bytes) -> int:
        node, k = self.walk(0, s)
        return node if k == len(s) else -1

    @classmethod
    def of_tokenizer(cls, tok) -> "TargetTrie":
        """The trie of ``tok``'s non-special tokens. A sentencepiece byte-fallback piece (<0x74>)
        whose bytes a normal piece also spells ("t") is left out: the encoder never writes it, so
        the procedure must propose the normal piece (ψ of the byte piece is then 0, exactly)."""
        strings = {i: tok.token_bytes(i) for i in range(tok.vocab_size) if not tok.is_special(i)}
        is_byte = getattr(tok, "is_byte_piece", None)
        if is_byte is not None:
            normal = {s for i, s in strings.items() if not is_byte(i)}
            strings = {i: s for i, s in strings.items() if not (is_byte(i) and s in normal)}
        return cls(strings)


# ---- the procedure -------------------------------------------------------------------------------------
@dataclass
class Procedure:
    """Alg. 3's drafting rule over a drafter vocabulary.

    draft_bytes[d]  the bytes of drafter token d (None for the drafter's EOS / specials)
    draft_eos       the drafter's end-of-sequence id; target_eos the target token it stands for
    lookahead       n: most draft tokens in one procedure
    """

    trie: TargetTrie
    draft_bytes: list[bytes | None]
    draft_eos: int | None
    target_eos: int | None
    lookahead: int = 8
    max_terms: int = 4096

    def run(self, drafts: Sequence[int]) -> tuple[int | None, int, int]:
        """Simulate the procedure on drafted tokens. Returns (t1 or None for ∅, draft tokens used,
        bytes of t1), or (-2, len, 0) when ``drafts`` ran out before it stopped.

        Chaining note: the draws the procedure read past t1's end decided where t1 ends, so they
        are *not* a fair start for the next position; each position's procedure drafts afresh
        from the drafter's state right after t1 (engine use: fork at that byte)."""
        node = 0
        for j, d in enumerate(drafts, start=1):
            data = self.draft_bytes[d] if d < len(self.draft_bytes) else None
            if d == self.draft_eos or data is None:
                if node == 0:
                    return (self.target_eos if d == self.draft_eos else None), j, 0
                return self._out(node), j, self.trie.depth[node]
            nxt, k = self.trie.walk(node, data)
            if k < len(data):
                return self._out(nxt), j, self.trie.depth[nxt]
            node = nxt
            if j >= self.lookahead:
                return self._out(node), j, self.trie.depth[node]
        return -2, len(drafts), 0

    def _out(self, node: int) -> int | None:
        t = self.trie.longest[node]
        return None if t < 0 else t

    # ---- ψ -----------------------------------------------------------------------------------------
    def psi(self, t: int, q_batch: Callable[[list[tuple[int, ...]]], torch.Tensor]) -> float:
        """ψ(t): the probability that the procedure proposes target token t.

        ``q_batch(prefixes)`` returns the drafter's distributions (len(prefixes), D) after each
        prefix of draft tokens (the empty prefix = the current context). Explored breadth-first,
        one q_batch call per depth; raises PsiTooLarge past ``max_terms`` prefixes."""
        target = self.trie.string.get(t)
        eos_only = t == self.target_eos and target is None
        if target is None and not eos_only:
            return 0.0  # a special token other than the end of turn: never proposed
        total = 0.0
        level: list[tuple[tuple[int, ...], int, float]] = [((), 0, 1.0)]  # (prefix, trie node, probability)
        explored = 0
        depth = 0
        while level:
            explored += len(level)
            if explored > self.max_terms:
                raise PsiTooLarge(f"ψ of target token {t} needs more than {self.max_terms} drafter prefixes "
                                  f"(heterogeneous-vocab Lemma 3.1); use a drafter with shorter tokens, a smaller lookahead, or slem/tli")
            q = q_batch([p for p, _, _ in level]).float()
            depth += 1
            nxt: list[tuple[tuple[int, ...], int, float]] = []
            for (prefix, node, w), qrow in zip(level, q):
                for d in torch.nonzero(qrow > 0).flatten().tolist():
                    pw = w * float(qrow[d])
                    data = self.draft_bytes[d] if d < len(self.draft_bytes) else None
                    if d == self.draft_eos or data is None:
                        out = (self.target_eos if d == self.draft_eos else None) if node == 0 else self._out(node)
                        total += pw if out == t else 0.0
                        continue
                    if eos_only:
                        continue
                    m, k = self.trie.walk(node, data)
                    if k < len(data):
                        total += pw if self._out(m) == t else 0.0
                        continue
                    if depth >= self.lookahead:
                        total += pw if self._out(m) == t else 0.0
                        continue
                    if self._compatible(m, target):
                        nxt.append((prefix + (d,), m, pw))
            level = nxt
        return total

    def _compatible(self, node: int, target: bytes) -> bool:
        """Can the procedure, continuing from ``node``, still end with output = target?"""
        depth = self.trie.depth[node]
        if depth < len(target):
            return self.trie.node_of(target[:depth]) == node
        if self.trie.node_of(target) < 0:
            return False
        # node extends target: it must lie below it without passing a longer token
        tid = self.trie.longest[node]
        return tid >= 0 and self.trie.string.get(tid) == target


def slrs_accept(tokens: Sequence[int | None], target_probs, psi_of: Callable[[int, int], float],
                generator: torch.Generator | None, greedy: bool) -> tuple[list[int], int | None]:
    """Alg. 3 along a chain of proposals, each from a fresh procedure at its position: returns
    (accepted indices, the token emitted after them, or None when all were accepted and the
    caller samples the bonus from the next row).

    ``target_probs[i]`` is p at the row before token i (row 0 = the root); ``psi_of(i, t)`` is the
    proposal probability of t by procedure i. A ``None`` token is the ∅ proposal: a rejection."""
    path: list[int] = []
    for i, t in enumerate(tokens):
        p = target_probs[i]
        if greedy:
            a = int(p.argmax())
            if t is None or a != t:
                return path, a
            path.append(i)
            continue
        if t is None:
            return path, residual_sample(p, lambda x, i=i: psi_of(i, x), generator)
        pt = float(p[t])
        psi = psi_of(i, t)
        u = float(torch.rand((), generator=generator))
        if u * psi < pt:  # accept w.p. min(1, p/ψ)
            path.append(i)
            continue
        return path, residual_sample(p, lambda x, i=i: psi_of(i, x), generator)
    return path, None


def residual_sample(p: torch.Tensor, psi: Callable[[int], float], generator: torch.Generator | None,
                    max_trials: int = 100_000) -> int:
    """A sample of norm(p − min(p, ψ)) by rejection from p: keep t ~ p w.p. max(0, 1 − ψ(t)/p(t))."""
    cache: dict[int, float] = {}
    draw = sampler(p, generator)
    for _ in range(max_trials):
        t = draw()
        if t not in cache:
            cache[t] = psi(t)
        keep = max(0.0, 1.0 - cache[t] / float(p[t]))
        if float(torch.rand((), generator=generator)) < keep:
            return t
    raise RuntimeError("SLRS residual: no sample kept (p and ψ nearly equal)")
