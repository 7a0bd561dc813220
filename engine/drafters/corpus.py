"""A datastore of the target's own n-grams: model-free drafts where the context has no match.

Prompt lookup (engine/drafters/ngram.py) drafts only what the context already contains. A small
chat model's replies are also formulaic across conversations ("Here's a step-by-step guide",
"```python\\n", "In summary, ..."), so the n-grams of the target's own replies predict its next
token well: retrieval-based speculative decoding (REST, He et al. 2023), with an n-gram table in
place of a suffix array. Measured on the 12 evaluation replies of SmolLM2 (teacher-forced, the
table built from the 9,000 distillation replies in assets/distill/smollm2, none of which answer
an evaluation prompt): the table's top continuation (backing off from 4 tokens of context to 1)
is the target's next token 39.6% of the time (our q8 greedy replies), against 37.3% for the shipped
Mamba-2 drafter, at a cost of microseconds instead of ~0.2 ms a token (bench/drafter_confidence.py,
bench/results/2026-11-25-q8.md). The shipped table now indexes all 24,837 replies: on the fp32
evaluation replies its top continuation is right 48.2% of the time against 45.5% for the 9,000-reply
one (bench/datastore_eval.py, bench/results/2026-11-26-app-frames/ section 6).

The index: for n = 1..n_max, every reply position's preceding n tokens (prompt tokens included as
context) and the token that followed; per distinct context, the ``branches`` most frequent next
tokens and their shares c / (total + 1) (shrunk: two sightings are weaker evidence than two
hundred), kept where the context was seen at least ``min_count`` times (n >= 2). The n-gram
drafter grows trees from it best first (engine/drafters/ngram.py ``corpus_tree``). Contexts are
64-bit hashes (a collision only makes a draft wrong, never an output: verification is exact for
any draft), sorted for binary search. Stored as .npz with the tokenizer's encoding of a probe text, so an
index is never used with a tokenizer it was not built for.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable, Sequence

import numpy as np

from ..errors import SpecchatError

PROBE_TEXT = "The quick brown fox jumps over the lazy dog. def main():\n    return 42  # Überprüfung, 東京, 🙂"
_P = np.uint64(0x100000001B3)  # FNV-1a 64-bit prime
_BASIS = np.uint64(0xCBF29CE484222325)
_MASK = (1 << 64) - 1


def _hash_py(tokens: Sequence[int]) -> int:
    """The hash of one context (the same value as ``_hash_windows`` for that window)."""
    h = 0xCBF29CE484222325 ^ len(tokens)
    for t in tokens:
        h = ((h ^ (int(t) & 0xFFFFFFFF)) * 0x100000001B3) & _MASK
    return h


def _hash_windows(seq: np.ndarray, n: int) -> np.ndarray:
    """Hash of seq[i - n:i] for every i in [n, len(seq)], vectorised."""
    m = len(seq) - n + 1
    h = np.full(m, _BASIS ^ np.uint64(n), dtype=np.uint64)
    with np.errstate(over="ignore"):
        for j in range(n):
            h = (h ^ (seq[j:j + m].astype(np.uint64) & np.uint64(0xFFFFFFFF))) * _P
    return h


class CorpusIndex:
    """The most frequent next tokens (up to ``branches``, best first) after each context of
    1..n_max tokens (see module docstring)."""

    def __init__(self, keys: np.ndarray, tokens: np.ndarray, shares: np.ndarray, n_max: int, meta: dict):
        if tokens.ndim == 1:  # one continuation per context
            tokens, shares = tokens[:, None], shares[:, None]
        self.keys, self.tokens, self.shares = keys, tokens, shares  # (M,), (M, B) with -1 padding, (M, B)
        self.n_max = n_max
        self.meta = meta

    def __len__(self) -> int:
        return len(self.keys)

    # ---- building ------------------------------------------------------------------------------------
    @classmethod
    def build(cls, sequences: Iterable[tuple[Sequence[int], int]], n_max: int = 4, min_count: int = 2,
              meta: dict | None = None, branches: int = 3) -> "CorpusIndex":
        """``sequences``: (token ids, start) pairs; positions from ``start`` on are counted (a
        reply after its prompt), their contexts may reach back into the prompt. ``branches``:
        continuations kept per context (the datastore's trees branch on them)."""
        seqs = [(np.asarray(ids, dtype=np.int64), int(start)) for ids, start in sequences]
        keys, tokens, shares = [], [], []
        for n in range(1, n_max + 1):
            ks, ts = [], []
            for seq, start in seqs:
                if len(seq) <= n:
                    continue
                pos = np.arange(n, len(seq))  # position i is predicted from seq[i - n:i]
                keep = pos >= start
                ks.append(_hash_windows(seq[:-1], n)[keep])
                ts.append(seq[pos[keep]])
            if not ks or not sum(len(x) for x in ks):
                continue
            k, t, count, total = _top_next(np.concatenate(ks), np.concatenate(ts), branches)
            keep = total >= (min_count if n >= 2 else 1)  # 1-token contexts: the back-off of last resort
            keys.append(k[keep])
            tokens.append(t[keep])
            shares.append((count[keep] / (total[keep, None] + 1.0)).astype(np.float32))
        if not keys:
            raise SpecchatError("no reply tokens to index")
        k = np.concatenate(keys)
        order = np.argsort(k, kind="stable")
        return cls(k[order], np.concatenate(tokens)[order].astype(np.int32), np.concatenate(shares)[order], n_max,
                   dict(meta or {}, n_max=n_max, min_count=min_count, branches=branches, contexts=int(len(k))))

    def save(self, path: str | Path) -> None:
        np.savez_compressed(path, keys=self.keys, tokens=self.tokens, shares=self.shares,
                            meta=np.frombuffer(json.dumps(self.meta).encode(), dtype=np.uint8))

    @classmethod
    def load(cls, path: str | Path) -> "CorpusIndex":
        """Read an index written by ``save``; a missing or damaged file is a one-line error."""
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as z:
                keys, tokens, shares = z["keys"], z["tokens"], z["shares"]
                meta = json.loads(bytes(z["meta"]).decode())
        except FileNotFoundError:
            raise SpecchatError(f"{path}: no such n-gram datastore") from None
        except Exception as e:  # zip, key, JSON or dtype trouble: not an index we wrote
            raise SpecchatError(f"{path}: not an n-gram datastore ({type(e).__name__})") from None
        if not (keys.dtype == np.uint64 and len(keys) == len(tokens) == len(shares) and tokens.shape == shares.shape
                and tokens.ndim in (1, 2) and np.issubdtype(tokens.dtype, np.integer)
                and np.issubdtype(shares.dtype, np.floating) and isinstance(meta, dict)
                and isinstance(meta.get("n_max"), int) and 1 <= meta["n_max"] <= 16):
            raise SpecchatError(f"{path}: not an n-gram datastore (bad arrays or metadata)")
        if shares.size and not (np.isfinite(shares).all() and shares.min() >= 0 and shares.max() <= 1):
            raise SpecchatError(f"{path}: not an n-gram datastore (shares outside [0, 1])")
        return cls(keys, tokens, shares, meta["n_max"], meta)

    def max_token(self) -> int:
        """The largest token id the index can propose (-1 when empty)."""
        return int(self.tokens.max()) if self.tokens.size else -1

    def fits(self, tokenizer) -> bool:
        """Whether ``tokenizer`` encodes the probe text as the index's tokenizer did."""
        probe = self.meta.get("probe")
        try:
            return probe is not None and list(tokenizer.encode(PROBE_TEXT)) == list(probe)
        except Exception:
            return False

    # ---- lookup ----------------------------------------------------------------------------------------
    def top(self, context: Sequence[int], b: int | None = None) -> list[tuple[int, float]]:
        """Up to ``b`` most frequent next tokens after the longest indexed suffix of ``context``
        with their shares, best first; [] where no suffix is indexed."""
        return self.top_suffix(context, b)[0]

    def top_suffix(self, context: Sequence[int], b: int | None = None) -> tuple[list[tuple[int, float]], int]:
        """``top`` and the length of the suffix it matched (0 where none is indexed)."""
        for n in range(min(self.n_max, len(context)), 0, -1):
            h = np.uint64(_hash_py(context[len(context) - n:]))
            i = int(np.searchsorted(self.keys, h))
            if i < len(self.keys) and self.keys[i] == h:
                toks, shares = self.tokens[i, :b].tolist(), self.shares[i, :b].tolist()
                return [(t, p) for t, p in zip(toks, shares) if t >= 0], n
        return [], 0

    def next(self, context: Sequence[int]) -> tuple[int, float] | None:
        """The most frequent next token after the longest indexed suffix of ``context`` and its
        share, or None."""
        got = self.top(context, 1)
        return got[0] if got else None


def _top_next(k: np.ndarray, t: np.ndarray, b: int = 1) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per distinct context key: its ``b`` most frequent next tokens (ties: the smaller id; -1 pads
    a context with fewer) and their counts, (M, b) each, and the context's total count (M,)."""
    order = np.lexsort((t, k))
    k, t = k[order], t[order]
    first_pair = np.ones(len(k), dtype=bool)
    first_pair[1:] = (k[1:] != k[:-1]) | (t[1:] != t[:-1])
    starts = np.flatnonzero(first_pair)
    pk, pt = k[starts], t[starts]
    pc = np.diff(np.append(starts, len(k)))
    first_ctx = np.ones(len(pk), dtype=bool)
    first_ctx[1:] = pk[1:] != pk[:-1]
    ctx = np.cumsum(first_ctx) - 1
    total = np.add.reduceat(pc, np.flatnonzero(first_ctx))
    best = np.lexsort((pt, -pc, ctx))  # per context: the largest count first, then the smaller id
    lead = np.ones(len(best), dtype=bool)
    lead[1:] = ctx[best[1:]] != ctx[best[:-1]]
    group_start = np.flatnonzero(lead)
    rank = np.arange(len(best)) - np.repeat(group_start, np.diff(np.append(group_start, len(best))))
    M = len(group_start)
    tokens = np.full((M, b), -1, dtype=np.int64)
    counts = np.zeros((M, b), dtype=np.int64)
    keep = rank < b
    rows = ctx[best[keep]]
    tokens[rows, rank[keep]] = pt[best[keep]]
    counts[rows, rank[keep]] = pc[best[keep]]
    return pk[best[lead]], tokens, counts, total
