"""Drafter contract: ``propose(history, request) -> TokenTree``.

``history`` is every token of the context, ending with the pending root token (the last emitted
token, which the target has not processed yet). The tree's nodes continue after the root.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Sequence

import torch

from ..tree import TokenTree


@dataclass
class DraftRequest:
    """What to draft this step.

    shape   (N1, ..., Ngamma): every node at depth i-1 gets N_i children; a chain of k is (1,)*k
    mode    "greedy" (top-N by logit, deterministic), "sample" (draw from q; siblings without
            replacement, recorded in the tree) or "race" (first N arrivals of the exponential race)
    noise_at_depth(d)  Exp(1) noise for the output position at depth d+1 (race mode only)
    max_nodes          hard cap (context room)
    ngram_min/max      n-gram lookup: shortest / longest suffix match tried (model-free drafters)
    vocab              union | tli | slem: how a drafter with another vocabulary proposes
    confidence         greedy chains: record the drafter's probability of each drafted token in
                       the tree (TokenTree.confidence), and stop drafting once
                       ``keep_going(probabilities so far)`` says no (engine/gate.py)
    """

    shape: tuple[int, ...]
    mode: str = "greedy"
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # the target's sampling cuts, which a drafter's q takes too (engine/sampling.probs_from_logits)
    min_p: float = 0.0
    generator: torch.Generator | None = None
    noise_at_depth: Callable[[int], torch.Tensor] | None = None
    max_nodes: int = 256
    plan: tuple[int, ...] | None = None  # an arbitrary tree (parent per node, rank order); overrides shape
    ngram_min: int = 2
    ngram_max: int = 6
    vocab: str = "tli"  # the bridge for a drafter with another vocabulary (engine/drafters/vocab.py)
    confidence: bool = False
    keep_going: Callable[[list[float]], bool] | None = None
    corpus: bool = False  # n-gram drafter: a best-first tree from its datastore (NgramDrafter.corpus_tree)
    calibrate: Callable[[float], float] | None = None  # corpus trees: a confidence -> acceptance probability
    worth: Callable[[int, float], bool] | None = None  # corpus trees: whether a node of path probability P pays


class Drafter(Protocol):
    name: str

    def propose(self, history: Sequence[int], req: DraftRequest) -> TokenTree: ...

    def reset(self) -> None: ...
