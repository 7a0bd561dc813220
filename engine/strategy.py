"""Strategy: the live-switchable knobs of the decode loop, read once per step.

A Strategy is a frozen value: the UI swaps the whole object between steps (``dataclasses.replace``)
and the loop picks up the new one at the next step without touching the committed state.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from .errors import SpecchatError
from .tree import parse_shape

STRATEGIES = ("ar", "pld", "sd", "tree", "mab", "optimal", "ersd", "hybrid")
ADAPTIVE = ("sd", "pld", "hybrid")  # the chain strategies with a cost-aware draft length (engine/gate.py)
VERIFIERS = ("auto", "greedy", "rs", "mss", "membership", "race")
VOCAB_BRIDGES = ("auto", "union", "tli", "slem", "slrs")
SSM_TREE_MODES = ("stree", "unrolled")
BACKTRACK_MODES = ("replay", "joint", "recompute")

# Options whose implementation lands in a later issue: they answer clearly instead of falling back.
NOT_YET = {
    "strategy": {},
    "vocab": {},
}


class StrategyError(SpecchatError, ValueError):
    """An invalid or unavailable combination of knobs; the message is one user-facing line."""


MAX_DRAFT_LEN = 64
MAX_NODE_BUDGET = 256
# logits / T overflows float32 once |logit| > 3.4e38 * T (engine/sampling.probs_from_logits): at 1e-37 a
# logit of 35 does, and sampling fails mid-reply; at 1e-6 only |logit| > 3e32 would. A T that small
# samples the argmax anyway, so it is refused with the way to say that (T = 0), not silently rounded.
MIN_TEMPERATURE = 1e-6
# a repeat penalty R < 1 multiplies a recent token's positive logit by 1/R (engine/sampling.repeat_penalized):
# at R = 1e-300 (0 in float32) every such logit became inf, and sampling failed mid-reply ("probability
# tensor contains inf or nan"); at 1e-6, with the temperature floor, only |logit| > 3e26 would overflow
MIN_REPEAT_PENALTY = 1e-6


# the sampling knobs: carried from one preset to the next (Strategy.sampling), `chat`'s flags
SAMPLING_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "repeat_last_n", "seed")


def check_temperature(t: float, name: str = "temperature") -> None:
    if 0.0 < t < MIN_TEMPERATURE:
        raise StrategyError(f"{name} {t:g} is too small to sample with (its softmax overflows): "
                            f"use 0 for greedy decoding, or at least {MIN_TEMPERATURE:g}")


def check_repeat_penalty(r: float, name: str = "repeat penalty") -> None:
    if 0.0 < r < MIN_REPEAT_PENALTY:
        raise StrategyError(f"{name} {r:g} is too small (the penalised logits overflow): "
                            f"use at least {MIN_REPEAT_PENALTY:g}, or 1 for no penalty")


def check_cuts(top_p: float, top_k: int, min_p: float, repeat_penalty: float, repeat_last_n: int,
               flags: bool = False) -> None:
    """The sampling cuts' and the repeat penalty's ranges, one line each: Strategy.validate's, and
    the CLI's before the seconds of loading (``flags``: named as the options, ``--top-p``)."""
    name = (lambda n: "--" + n) if flags else (lambda n: n)  # noqa: E731
    for n, v in (("top-p", top_p), ("min-p", min_p), ("repeat-penalty", repeat_penalty)):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise StrategyError(f"{name(n)} must be a finite number, got {v}")
    if not 0.0 < top_p <= 1.0:
        raise StrategyError(f"{name('top-p')} must be in (0, 1] (1: off), got {top_p:g}")
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
        raise StrategyError(f"{name('top-k')} must be >= 0 (an integer; 0: off), got {top_k}")
    if not 0.0 <= min_p <= 1.0:
        raise StrategyError(f"{name('min-p')} must be in [0, 1] (0: off), got {min_p:g}")
    if not 0.0 < repeat_penalty <= 10.0:
        raise StrategyError(f"{name('repeat-penalty')} must be in (0, 10] (1: off), got {repeat_penalty:g}")
    check_repeat_penalty(repeat_penalty, name("repeat-penalty"))
    if isinstance(repeat_last_n, bool) or not isinstance(repeat_last_n, int) or repeat_last_n < 1:
        raise StrategyError(f"{name('repeat-last-n')} must be at least 1 (an integer: the tokens of context the "
                            f"penalty looks back on), got {repeat_last_n}")


@dataclass(frozen=True)
class Strategy:
    """What the next step does.

    name        ar | pld | sd | tree | mab | optimal | ersd | hybrid (greedy with a datastore: a
                chain of draft_len mixing the copy, the datastore and the drafter model token by
                token, Decoder._mixed_chain; else prompt lookup when the context repeats itself,
                else a chain of draft_len from the drafter model)
    drafter     "model" (the session's drafter model), "ngram" (prompt lookup) or "none"
    draft_len   chain length for sd/pld (K)
    tree        static shape (N1..Ngamma) for tree
    verify      auto | greedy | rs | mss | membership | race
    temperature 0 = greedy
    top_p, top_k, min_p
                the target's sampling cuts at T > 0 (engine/sampling.probs_from_logits: nucleus
                mass, most likely k (0: off), least share of the top token's probability (0: off));
                every strategy samples the cut distribution exactly
    repeat_penalty, repeat_last_n
                the CTRL repetition penalty (1 = off) on the tokens among the last repeat_last_n
                of each position's context (engine/sampling.repeat_penalized), greedy or sampling
    arms        mab: the static shapes the UCB bandit chooses among (mamba-drafters §4.2)
    lambda_ucb  mab: exploration weight of eq. 1
    node_budget optimal: most draft nodes of the Alg. 3 tree (the cost model may cap it lower)
    adaptive    sd/pld/hybrid: draft_len is a cap; each step drafts the length that maximises
                expected tokens per ms from the measured verify cost and recent acceptance
                (engine/gate.py; 0 = a plain step). Spec ``NAME:auto`` or ``NAME:K:auto``.
    """

    name: str = "sd"
    drafter: str = "model"
    draft_len: int = 5
    tree: tuple[int, ...] = (3, 2, 2, 1, 1)
    verify: str = "auto"
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    min_p: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int = 0
    vocab: str = "auto"
    ssm_tree: str = "stree"
    backtrack: str = "replay"
    ngram_min: int = 2
    ngram_max: int = 6
    ngram_branches: int = 3
    arms: tuple[tuple[int, ...], ...] = ((3, 2, 2, 1, 1), (3, 3, 2, 1), (2, 2, 2, 1, 1, 1), (1, 1, 1, 1, 1))
    lambda_ucb: float = 0.3
    node_budget: int = 16
    adaptive: bool = False

    # ---- derived --------------------------------------------------------------------------------
    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    @property
    def sampling(self) -> dict[str, Any]:
        """The sampling knobs (``SAMPLING_FIELDS``): what a preset picked live carries over."""
        return {k: getattr(self, k) for k in SAMPLING_FIELDS}

    @property
    def filters(self) -> dict[str, Any]:
        """The sampling cuts as keyword arguments of ``probs_from_logits`` and the verifiers."""
        return {"top_p": self.top_p, "top_k": self.top_k, "min_p": self.min_p}

    @property
    def speculative(self) -> bool:
        return self.name != "ar"

    def resolved_verify(self) -> str:
        """The verifier actually used (``auto`` resolved; ALGORITHMS.md §2)."""
        if self.verify != "auto":
            return self.verify
        if self.name == "ersd":
            return "race"
        if self.name == "ar":
            return "greedy" if self.greedy else "sample"
        if self.greedy:
            return "greedy"
        if self.drafter == "ngram" or self.name == "pld":
            return "membership"  # deterministic drafts: no q to reject against
        if self.name in ("tree", "mab", "optimal"):
            return "mss"
        return "rs"

    def resolved_vocab(self, bridged: bool) -> str:
        """The vocabulary bridge in use: "none" for a drafter sharing the target's tokenizer;
        ``auto`` is slem at T = 0 (exact match loses nothing there) and tli when sampling
        (heterogeneous-vocab §5: TLI is the sampling default of transformers too)."""
        if not bridged:
            return "none"
        if self.vocab != "auto":
            return self.vocab
        return "slem" if self.greedy else "tli"

    @property
    def tree_nodes(self) -> int:
        """The node cap of the best-first trees the adaptive strategies grow from a datastore
        (pld:auto, hybrid:auto): the larger of the draft length and the node budget."""
        return max(self.draft_len, self.node_budget)

    def label(self, tree_nodes: int | None = None) -> str:
        """Short description for status lines. ``tree_nodes``: an adaptive strategy drafting
        best-first trees of up to that many nodes (pld:auto / hybrid:auto with a datastore)
        rather than chains of draft_len."""
        parts = [self.name]
        if self.name in ("sd", "pld", "ersd", "hybrid"):
            if self.adaptive and tree_nodes:
                parts.append(f"tree<={tree_nodes} auto")
            else:
                parts.append(f"k<={self.draft_len} auto" if self.adaptive else f"k={self.draft_len}")
        if self.drafter == "ngram" and self.name not in ("pld", "ar"):
            parts.append("ngram")
        if self.name == "tree":
            parts.append("tree=" + ",".join(map(str, self.tree)))
        if self.name == "optimal":
            parts.append(f"nodes<={self.node_budget}")
        parts.append(self.resolved_verify())
        if self.vocab != "auto":
            parts.append(f"vocab={self.vocab}")
        parts.append(self.sampling_label())
        return " ".join(parts)

    def sampling_label(self) -> str:
        """The sampling part of ``label``: "T=0" (greedy) or the temperature and the cuts in force
        ("T=0.7 top-p=0.9"), and a repetition penalty ("rep=1.1/64")."""
        parts = ["T=0" if self.greedy else f"T={self.temperature:g}"]
        if not self.greedy:  # the cuts in force, where they are
            parts += [f"top-p={self.top_p:g}"] if self.top_p < 1.0 else []
            parts += [f"top-k={self.top_k}"] if self.top_k else []
            parts += [f"min-p={self.min_p:g}"] if self.min_p else []
        if self.repeat_penalty != 1.0:
            parts.append(f"rep={self.repeat_penalty:g}/{self.repeat_last_n}")
        return " ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["tree"] = list(self.tree)
        d["arms"] = [list(a) for a in self.arms]
        d["verify_resolved"] = self.resolved_verify()
        return d

    def replace(self, **changes: Any) -> "Strategy":
        return replace(self, **changes)

    # ---- validation -----------------------------------------------------------------------------
    def validate(self, has_drafter_model: bool = True) -> "Strategy":
        """Raise StrategyError (one line) for invalid or not-yet-available combinations."""
        if self.name not in STRATEGIES:
            raise StrategyError(f"unknown strategy {self.name!r}; choose one of {', '.join(STRATEGIES)}")
        if self.name in NOT_YET["strategy"]:
            raise StrategyError(f"strategy {self.name!r} is not available yet: it lands with {NOT_YET['strategy'][self.name]}")
        if self.verify not in VERIFIERS:
            raise StrategyError(f"unknown verifier {self.verify!r}; choose one of {', '.join(VERIFIERS)}")
        if self.vocab not in VOCAB_BRIDGES:
            raise StrategyError(f"unknown vocab bridge {self.vocab!r}; choose one of {', '.join(VOCAB_BRIDGES)}")
        if self.vocab in NOT_YET["vocab"]:
            raise StrategyError(f"vocab bridge {self.vocab!r} is not available yet: it lands with {NOT_YET['vocab'][self.vocab]}")
        if self.vocab != "auto" and self.name in ("pld", "ar") or self.vocab != "auto" and self.drafter == "ngram":
            raise StrategyError(f"--vocab {self.vocab} bridges a drafter model of another vocabulary; "
                                f"{'n-gram drafts have' if self.name != 'ar' else 'plain decoding has'} no drafter vocabulary")
        if self.ssm_tree not in SSM_TREE_MODES:
            raise StrategyError(f"unknown --ssm-tree {self.ssm_tree!r}; choose stree or unrolled")
        if self.backtrack not in BACKTRACK_MODES:
            raise StrategyError(f"unknown --backtrack {self.backtrack!r}; choose replay, joint or recompute")
        if self.temperature < 0:
            raise StrategyError("temperature must be >= 0")
        check_temperature(self.temperature)
        check_cuts(self.top_p, self.top_k, self.min_p, self.repeat_penalty, self.repeat_last_n)
        if self.draft_len < 1 or self.draft_len > MAX_DRAFT_LEN:
            raise StrategyError(f"draft length must be between 1 and {MAX_DRAFT_LEN}")
        if not 1 <= self.ngram_min <= self.ngram_max <= 32:
            raise StrategyError("n-gram sizes must satisfy 1 <= ngram_min <= ngram_max <= 32")
        if self.drafter not in ("model", "ngram", "none"):
            raise StrategyError(f"unknown drafter kind {self.drafter!r}")
        v = self.resolved_verify()
        if v == "greedy" and not self.greedy:
            raise StrategyError("--verify greedy needs temperature 0")
        if self.name == "ar":
            if v not in ("greedy", "sample", "race"):
                raise StrategyError(f"--verify {v} needs a drafter; plain decoding (ar) samples directly or by race")
            return self
        if self.drafter == "none":
            raise StrategyError(f"strategy {self.name!r} needs a drafter (--drafter REF or ngram)")
        if self.drafter == "model" and not has_drafter_model:
            raise StrategyError(f"strategy {self.name!r} needs a drafter model: pass --drafter REF (or use pld / --drafter ngram)")
        if self.drafter == "ngram" and v in ("rs", "mss"):
            raise StrategyError(f"--verify {v} needs draft probabilities; n-gram drafts have none (use membership)")
        if v == "race" and self.name != "ersd":
            raise StrategyError("--verify race pairs with --strategy ersd (or ar for the reference sampler)")
        if self.name == "ersd" and v != "race":
            raise StrategyError("ersd verifies by exponential race only (--verify race)")
        if self.name == "tree":
            parse_shape(",".join(map(str, self.tree)))
        if self.name == "mab":
            if not self.arms:
                raise StrategyError("mab needs at least one tree shape to choose from")
            for a in self.arms:
                parse_shape(",".join(map(str, a)))
            if self.lambda_ucb < 0:
                raise StrategyError("lambda_ucb must be >= 0")
        if self.name == "optimal" and not 1 <= self.node_budget <= MAX_NODE_BUDGET:
            raise StrategyError(f"the optimal tree's node budget must be between 1 and {MAX_NODE_BUDGET}")
        if self.adaptive and self.name not in ADAPTIVE:
            raise StrategyError(f"an adaptive draft length (:auto) is for sd, pld and hybrid, not {self.name}")
        if self.name == "hybrid" and self.drafter != "model":
            raise StrategyError("hybrid combines prompt lookup with a drafter model (--drafter REF); without one use pld")
        if self.name in ("mab", "optimal") and self.drafter == "ngram":
            raise StrategyError(f"{self.name} chooses trees for a drafter model; n-gram drafts come from matches (use pld)")
        return self


# Named presets: what the TUI cycles through and what `--strategy NAME` starts from.
PRESETS: dict[str, Strategy] = {
    "ar": Strategy(name="ar", drafter="none"),
    "pld": Strategy(name="pld", drafter="ngram", draft_len=8),
    "sd": Strategy(name="sd", drafter="model", draft_len=5),
    "tree": Strategy(name="tree", drafter="model", tree=(3, 2, 2, 1, 1)),
    "mab": Strategy(name="mab", drafter="model"),
    "optimal": Strategy(name="optimal", drafter="model", node_budget=16),
    "ersd": Strategy(name="ersd", drafter="model", draft_len=5, verify="race"),
    "hybrid": Strategy(name="hybrid", drafter="model", draft_len=3),
}
CYCLE = ("ar", "pld", "sd", "tree", "mab", "optimal", "ersd", "hybrid")
HYBRID_NGRAM_LEN = 8  # hybrid: the prompt-lookup chain's length (pld's default)


def preset(name: str, **overrides: Any) -> Strategy:
    if name not in PRESETS:
        if name in NOT_YET["strategy"]:
            raise StrategyError(f"strategy {name!r} is not available yet: it lands with {NOT_YET['strategy'][name]}")
        raise StrategyError(f"unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}")
    return replace(PRESETS[name], **{k: v for k, v in overrides.items() if v is not None})


def _count(param: str, what: str, most: int) -> int:
    # ASCII digits only: str.isdigit() is true of '²' (int() then fails with "invalid literal for
    # int()") and of '٣' (which int() reads as 3, where a tree shape refuses it)
    if not (param.isascii() and param.isdigit()):  # int() would say "invalid literal for int() with base 10: '4:auto'"
        raise ValueError(f"the {what} must be a whole number, not {param!r} (one ':auto' at most, after it)")
    if not 1 <= int(param) <= most:  # validate() says so too, but only once the models have loaded
        raise ValueError(f"the {what} must be between 1 and {most}, not {param}")
    return int(param)


def from_spec(spec: str, base: Strategy | None = None) -> Strategy:
    """A strategy from ``NAME`` or ``NAME:PARAM`` (bench --strategies, models.toml pairings):
    ``tree:3-2-2-1-1`` (shape), ``sd:4`` / ``pld:8`` / ``ersd:5`` (draft length), ``optimal:24``
    (node budget), ``sd:auto`` / ``pld:12:auto`` (a cost-aware draft length up to the preset's or
    K, engine/gate.py); a ``@BRIDGE`` suffix picks the vocabulary bridge (``sd:5@tli``, ``sd@slrs``).
    ``base``: the strategy NAME already built with the caller's other knobs (default: the
    preset). Not validated here."""
    if not spec.strip():  # `--strategy ""` (an unset shell variable) ran the default strategy
        raise StrategyError(f"empty strategy: choose one of {', '.join(STRATEGIES)} (or a spec such as sd:4, tree:3-2-1, pld:auto)")
    spec, at, vocab = spec.strip().partition("@")
    if at and not vocab:  # "sd@" ran as plain sd
        raise StrategyError(f"strategy {spec + '@'!r}: nothing after '@' (a vocab bridge: {', '.join(VOCAB_BRIDGES)})")
    name, _, param = spec.partition(":")
    s = base if base is not None else preset(name)
    if vocab:
        if vocab not in VOCAB_BRIDGES:
            raise StrategyError(f"strategy {spec + '@' + vocab!r}: unknown vocab bridge {vocab!r}; choose one of {', '.join(VOCAB_BRIDGES)}")
        s = s.replace(vocab=vocab)
    if not param:
        if ":" in spec:  # "pld:" ran as plain pld
            raise StrategyError(f"strategy {spec!r}: nothing after ':' (tree:3-2-2-1-1, sd:4, pld:8, sd:auto, pld:12:auto, optimal:24)")
        return s
    parts = param.split(":")
    if "auto" in parts and name in ADAPTIVE:
        parts.remove("auto")
        s = s.replace(adaptive=True)
        if not parts:
            return s
        param = ":".join(parts)
    try:
        if name == "tree":
            return s.replace(tree=parse_shape(param.replace("-", ",")))
        if name in ("sd", "pld", "ersd", "hybrid"):
            return s.replace(draft_len=_count(param, "draft length", MAX_DRAFT_LEN))
        if name == "optimal":
            return s.replace(node_budget=_count(param, "node budget", MAX_NODE_BUDGET))
    except ValueError as e:
        raise StrategyError(f"strategy {spec!r}: {e}") from None
    raise StrategyError(f"strategy {spec!r}: {name} takes no parameter (tree:3-2-2-1-1, sd:4, pld:8, sd:auto, pld:12:auto, optimal:24)")
