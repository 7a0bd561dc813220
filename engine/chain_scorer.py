"""Which token a mixed chain drafts at each depth (hybrid:K with a datastore; NgramDrafter.corpus_tree
with ``chain=True``): a linear scorer over what each draft source says of a candidate, fitted
offline for one drafter and datastore and shipped beside the drafter (``chain_scorer.json``).

At every depth of the chain the candidates are the context's copy (prompt lookup's latest longest
match, snakes-and-ladders §5.2), the n-gram datastore's top continuations (REST's datastore) and
the drafter model's top tokens (mamba-drafters §3). Greedy verification accepts the chain up to its
first wrong token, so a chain of K tokens is best served by drafting, at each depth, the candidate
likeliest to be the target's next token: a choice among a handful of candidates. The gate's
calibration bins (engine/gate.py) rank each source's own number apart (a copy's rate, a share, a
drafter probability, a two-source agreement); this scorer ranks a candidate by everything the
sources say of it together: the copy's match length, the datastore's share, rank and suffix length,
the drafter's probability and rank, the drafter's confidence in its own top token, and their
agreements. The weights come from a softmax over each position's candidates (a conditional logit)
fitted on held-out replies of the target (bench/results/2026-11-29-session39/scripts/rank_fit.py):
on SmolLM2's 300 self-prompted held-out replies, two-fold, a greedy chain of 5 so chosen accepts
2.64 tokens a step where the gate's bins accept 2.51-2.54 (the drafter alone 2.09-2.12).

Lossless whatever it picks: it only chooses which tokens to draft; verification is unchanged.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FILE = "chain_scorer.json"
FORMAT = "specchat-chain-scorer-1"
MAX_BYTES = 1 << 20

# The features of one candidate, in order (features() writes them).
NAMES = (
    "copy", "copy_len2", "copy_len3", "copy_len4", "copy_len5", "copy_len6+",
    "ds", "ds_share", "ds_rank1", "ds_rank2", "ds_rank3", "ds_suffix1", "ds_suffix2", "ds_suffix3", "ds_suffix4+",
    "dr", "dr_p", "dr_logp", "dr_rank1", "dr_rank2", "dr_rank3+",
    "dr_top_p", "ds_top_share", "sources", "dr_and_other",
    "dr_p_bin0", "dr_p_bin1", "dr_p_bin2", "dr_p_bin3", "dr_p_bin4",
    "dr_p_x_ds_share", "dr_p_x_copy", "ds_share_x_copy", "copy_x_dr_top_p", "ds_x_dr_top_p",
    "ds_share_suffix1", "ds_share_suffix2", "ds_share_suffix3", "ds_share_suffix4+", "three_sources", "dr_sqrt_p",
)
N = len(NAMES)


def features(copy_len: int = 0, ds: tuple[int, float] | None = None, ds_suffix: int = 0,
             dr: tuple[int, float] | None = None, dr_top_p: float = 0.0, ds_top_share: float = 0.0) -> list[float]:
    """A candidate's features: ``copy_len`` the copy's match length where the copy proposes it (0:
    it does not), ``ds`` (rank from 0, share) where the datastore does and ``ds_suffix`` the length
    of the context suffix the datastore matched, ``dr`` (rank from 0, probability) where the drafter
    model does; ``dr_top_p`` the drafter's probability of its own top token and ``ds_top_share``
    the datastore's top share at this position (0 where a source has nothing)."""
    v = [0.0] * N
    copy = 1.0 if copy_len > 0 else 0.0
    if copy:
        v[0] = 1.0
        v[1 + min(4, max(0, copy_len - 2))] = 1.0
    s = 0.0
    if ds is not None:
        r, s = ds
        v[6], v[7] = 1.0, s
        v[8 + min(2, r)] = 1.0
        v[11 + min(3, max(0, ds_suffix - 1))] = 1.0
        v[35 + min(3, max(0, ds_suffix - 1))] = s
    p = 0.0
    if dr is not None:
        r, p = dr
        p = p if math.isfinite(p) else 0.0  # a drafter's NaN: no evidence, not an error mid-reply
        v[15], v[16], v[17] = 1.0, p, math.log(max(p, 1e-6)) / 5.0
        v[18 + min(2, r)] = 1.0
        v[25 + min(4, int(p * 5))] = 1.0
        v[40] = math.sqrt(max(p, 0.0))
    n_src = copy + (ds is not None) + (dr is not None)
    v[21], v[22] = dr_top_p, ds_top_share
    v[23] = n_src / 3.0
    v[24] = 1.0 if dr is not None and n_src > 1 else 0.0
    v[30] = p * s
    v[31] = p * copy
    v[32] = s * copy
    v[33] = copy * dr_top_p
    v[34] = (1.0 if ds is not None else 0.0) * dr_top_p
    v[39] = 1.0 if n_src == 3 else 0.0
    return v


@dataclass(frozen=True)
class ChainScorer:
    weights: tuple[float, ...]
    meta: dict[str, Any]

    def score(self, x: list[float]) -> float:
        return sum(w * f for w, f in zip(self.weights, x) if f)

    def to_json(self) -> dict[str, Any]:
        return {"format": FORMAT, "features": list(NAMES), "weights": list(self.weights), **self.meta}

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n", encoding="utf-8")

    @classmethod
    def load(cls, path: str | Path) -> "ChainScorer":
        """Read a chain_scorer.json; ValueError (one line) where it is not one this version reads."""
        path = Path(path)
        try:
            if path.stat().st_size > MAX_BYTES:
                raise ValueError(f"larger than {MAX_BYTES} bytes")
            d = json.loads(path.read_text(encoding="utf-8"))
            if not isinstance(d, dict) or d.get("format") != FORMAT:
                raise ValueError(f"format is not {FORMAT!r}")
            if not isinstance(d.get("features"), list) or d["features"] != list(NAMES):
                raise ValueError("its features are not the ones this version computes")
            raw = d.get("weights")
            if (not isinstance(raw, list) or len(raw) != N
                    or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in raw)):
                raise ValueError(f"weights must be a list of {N} numbers")
            w = tuple(float(x) for x in raw)
            if not all(math.isfinite(x) for x in w):
                raise ValueError(f"weights must be {N} finite numbers")
        except (OSError, ValueError, KeyError, TypeError, OverflowError, RecursionError) as e:
            why = (str(e).splitlines() or [type(e).__name__])[0][:120]
            raise ValueError(f"{path}: not a chain scorer ({why})") from None
        meta = {k: v for k, v in d.items() if k not in ("format", "features", "weights")}
        return cls(w, meta)


def scorer_of(path: str | Path) -> ChainScorer | None:
    """The drafter directory ``path``'s chain scorer, or None without one."""
    f = Path(path) / FILE
    return ChainScorer.load(f) if f.is_file() else None
