"""Sampling helpers shared by plain decoding, the drafters and the verifiers (engine/verify.py).

Pure tensor functions. Probability math is float32 whatever the logits' dtype: bf16 keeps ~3
significant digits, too few for the p/q ratios of rejection sampling or the top-p cut.

Shape letters: V vocabulary, R rows (any leading dims).

Draws (``sample``, ``draft_sample``, ``draw_rows``) invert the distribution function: one uniform
and a search of the float64 running sums (torch.multinomial's one draw races an exponential per
entry: ~10x slower over SmolLM2's 49k). The cuts' largest values come from engine/native/select.c.

Exponential races (exponential-races-sd.txt §3, Alg. 2 and 5): every vocabulary entry v gets an
arrival time e_v / p_v with e_v ~ Exp(1); the first arrival is distributed as p, and the first k
arrivals under q are a sample of k tokens from q without replacement. The noise e depends only on
(seed, absolute output position), so the target's winner at a position does not depend on what was
drafted there: ERSD emits exactly the tokens of plain autoregressive race sampling with that seed.
At temperature 0 the race winner is simply the argmax (p is one-hot in the limit); callers handle
T = 0 with argmax because ``probs_from_logits`` refuses it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable

import torch

from .strategy import check_cuts

_MASK64 = (1 << 64) - 1


def probs_from_logits(logits: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0,
                      min_p: float = 0.0) -> torch.Tensor:
    """softmax(logits / T) over the last dim, then the top-k, top-p and min-p cuts, each on the
    distribution the one before left, renormalised; float32. The order and the cuts are
    transformers' (temperature, ``TopKLogitsWarper``, ``TopPLogitsWarper``, ``MinPLogitsWarper``).

    logits: (..., V) any float dtype. top_k > 0 keeps the k most likely tokens and every token tied
    with the k-th (0: off). top_p keeps the smallest set of most likely tokens whose mass reaches
    top_p (the most likely token is always kept); ties at the cut break by token id. min_p > 0
    keeps the tokens at least min_p times as likely as the most likely one.
    """
    check_filters(temperature, top_p, top_k, min_p)
    probs = torch.softmax(logits.float() / temperature, dim=-1)  # (..., V)
    if 0 < top_k < probs.shape[-1]:
        kth = top_values(probs, top_k)[..., -1:]
        probs = probs.masked_fill(probs < kth, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    if top_p < 1.0:
        probs = nucleus(probs, top_p)
    if min_p > 0.0:
        probs = probs.masked_fill(probs < min_p * probs.amax(dim=-1, keepdim=True), 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def check_filters(temperature: float, top_p: float = 1.0, top_k: int = 0, min_p: float = 0.0) -> None:
    """``probs_from_logits``'s arguments in range, or a ValueError naming the one that is not (the
    cuts' ranges are the strategy's: engine/strategy.check_cuts)."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 here (got {temperature}); use argmax for T = 0")
    check_cuts(top_p, top_k, min_p, 1.0, 1)


def repeat_penalized(logits: torch.Tensor, windows: "list[list[int]]", penalty: float) -> torch.Tensor:
    """``logits`` (R, V) with each row's recent tokens penalised (the CTRL repetition penalty, as
    transformers' ``RepetitionPenaltyLogitsProcessor`` and llama.cpp's ``repeat_penalty``): a token
    in ``windows[r]`` has its logit divided by ``penalty`` where positive, multiplied where not,
    once however often it occurs. A new tensor; ``logits`` is not written. A row's window is its own
    context (engine/generate.py: the history and, in a tree, the row's path), so a verify pass
    penalises each row as plain decoding would at that position: greedy speculative decoding stays
    identical to greedy plain decoding with the same penalty."""
    V = logits.shape[-1]
    kept = [sorted({int(t) for t in w if 0 <= int(t) < V}) for w in windows]
    rows = [r for r, w in enumerate(kept) for _ in w]
    cols = [t for w in kept for t in w]
    out = logits.clone()
    if not cols:
        return out
    r, c = torch.tensor(rows, device=logits.device), torch.tensor(cols, device=logits.device)
    v = out[r, c]
    out[r, c] = torch.where(v > 0, v / penalty, v * penalty)
    return out


def top_values(x: torch.Tensor, m: int) -> torch.Tensor:
    """``x.topk(m, dim=-1).values`` (descending, bit for bit) for a float32 CPU tensor through the C
    kernel (engine/native/select.c: ~5x faster than torch's topk at 40 or 256 of 49k entries);
    torch's elsewhere, and for a row holding a NaN."""
    V = x.shape[-1]
    if x.dtype == torch.float32 and x.device.type == "cpu" and 0 < m < V and x.numel():
        from . import native

        lb = native.lib()
        if lb is not None:
            flat = x.reshape(-1, V)
            if flat.stride(-1) != 1:
                flat = flat.contiguous()
            out = torch.empty(flat.shape[0], m, dtype=torch.float32)
            if lb.topk_values_f32(flat.data_ptr(), flat.shape[0], V, flat.stride(0), m, out.data_ptr()) == 0:
                return out.reshape(*x.shape[:-1], m)
    return x.topk(m, dim=-1).values


# a 49k-entry stable sort costs ~6 ms a row on a 2-core CPU; the 64 largest values ~15 us a row,
# the 256 largest ~30 (top_values; torch's topk 85-155)
NUCLEUS_TOPK = (64, 256)


def nucleus_by_sort(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The top-p cut by its definition: a stable descending sort, the tokens whose exclusive prefix
    mass is below top_p kept (the most likely always; ties in token order), renormalised."""
    sorted_p, order = probs.sort(dim=-1, descending=True, stable=True)
    mass_before = sorted_p.cumsum(dim=-1) - sorted_p  # exclusive prefix mass; 0 for the top token
    sorted_p = sorted_p.masked_fill(mass_before >= top_p, 0.0)
    kept = torch.zeros_like(probs).scatter_(-1, order, sorted_p)
    return kept / kept.sum(dim=-1, keepdim=True)


def nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """``nucleus_by_sort``'s result, bit for bit, from the 64 (else 256: ``NUCLEUS_TOPK``) largest
    values where every row's cut falls among them (else the sort, for the whole batch). The descending values,
    their prefix masses and so the kept count m are the same whatever order ties take; the kept set
    is every token above the m-th value plus the lowest-id tokens equal to it, as many as the stable
    sort keeps; the kept probabilities are summed in token order as there."""
    V = probs.shape[-1]
    flat = probs.reshape(-1, V)
    for m in NUCLEUS_TOPK:  # the fewest largest values holding every row's cut
        vals = top_values(flat, min(m, V))  # descending
        mass_before = vals.cumsum(dim=-1) - vals
        if bool((mass_before[:, -1] >= top_p).all()) or m >= V:
            break
    else:
        return nucleus_by_sort(probs, top_p)  # a cut past them somewhere (a flat distribution)
    m = (mass_before < top_p).sum(dim=-1, keepdim=True)  # >= 1: the top token's mass before is 0
    last = vals.gather(-1, m - 1)  # the smallest kept value
    need = m - (vals > last).sum(dim=-1, keepdim=True)  # of the tokens tied at it the sort keeps the lowest ids
    zero = torch.zeros((), dtype=flat.dtype)
    if bool(((vals[:, -1:] < last) & ((vals == last).sum(dim=-1, keepdim=True) == need)).all()):
        kept = torch.where(flat >= last, flat, zero)  # every tied token is kept (all of them are among vals)
    else:
        tied = flat == last
        kept = torch.where((flat > last) | (tied & (tied.cumsum(dim=-1) <= need)), flat, zero)
    return (kept / kept.sum(dim=-1, keepdim=True)).reshape(probs.shape)


DRAW_TOPK = 4096  # draw_rows's candidates


def draw_rows(probs: torch.Tensor, top_p: float, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of probs (R, V) from its top-p nucleus (R,): drawn among the ``DRAW_TOPK``
    most likely tokens where every row's nucleus lies among them, else from ``nucleus`` over the
    whole vocabulary. The same distribution either way (where tied tokens straddle the cut, which
    of them are kept may differ); a different random stream from ``sample``. For batched data
    generation (`distill data --self-prompts`): a 49k-entry sort and draw took 230 of a 48-row
    step's ~390 ms on a 2-core Xeon (session 32). Each draw inverts its row's distribution function
    (torch.multinomial raced an exponential per entry)."""
    if top_p < 1.0:
        vals, ids = probs.topk(min(DRAW_TOPK, probs.shape[-1]), dim=-1)
        mass_before = vals.cumsum(dim=-1) - vals
        if bool((mass_before[:, -1] >= top_p).all()):
            j = _invert_rows(vals.masked_fill(mass_before >= top_p, 0.0), generator)
            return ids.gather(-1, j[:, None])[:, 0]
        probs = nucleus(probs, top_p)
    return _invert_rows(probs, generator)


def _invert_rows(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One draw per row of probs (R, V) (non-negative, each row with mass), as ``sample`` draws."""
    return _invert(torch.cumsum(probs.float(), -1, dtype=torch.float64), 1, generator)[:, 0]


def _on_generator_device(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    # the draws need the generator on the tensor's device (a CPU generator with CUDA probs
    # raises); moving one row of V floats is cheaper than failing.
    if generator is not None and probs.device.type != generator.device.type:
        return probs.to(generator.device)
    return probs


def _cdf(probs: torch.Tensor) -> torch.Tensor:
    """The running sums of probs (V,) in float64, checked: a distribution with no mass, a NaN or an
    infinity is a ValueError (as torch.multinomial refuses them)."""
    c = torch.cumsum(probs, 0, dtype=torch.float64)
    total = float(c[-1])
    if not 0.0 < total < float("inf") or bool((probs < 0).any()):
        raise ValueError(f"invalid distribution to sample from (total mass {total}, or a negative entry)")
    return c


def _invert(c: torch.Tensor, n: int, generator: torch.Generator | None) -> torch.Tensor:
    """n independent draws (..., n) from each distribution whose running sums are a row of c (..., V):
    the first index whose sum exceeds u * total, u uniform in [0, 1) (a zero entry's sum equals its
    predecessor's, so it is never the first to exceed)."""
    total = c[..., -1:].contiguous()
    u = torch.rand(*c.shape[:-1], n, generator=generator, dtype=torch.float64, device=c.device) * total
    # (u * total may round up to the total: then the last entry with mass, never a zero one after it)
    return torch.minimum(torch.searchsorted(c, u, right=True), torch.searchsorted(c, total))


def sample(probs: torch.Tensor, generator: torch.Generator | None) -> int:
    """One token from probs (V,), non-negative, not necessarily normalised: by inverting its
    distribution function with one uniform draw (torch.multinomial's one draw is an exponential race
    over all V entries: ~0.9 ms a 49k-entry row on a 2-core Xeon, this ~0.08; session 47)."""
    return sampler(probs, generator)()


def sampler(probs: torch.Tensor, generator: torch.Generator | None) -> Callable[[], int]:
    """Draws from probs (V,) one at a time, each as ``sample`` makes it, the running sums made once
    (a rejection loop's repeated draws from one distribution)."""
    c = _cdf(_on_generator_device(probs.float(), generator))
    return lambda: int(_invert(c, 1, generator)[0])


def draft_sample(q: torch.Tensor, k: int, generator: torch.Generator | None, without_replacement: bool) -> list[int]:
    """k children drawn from q (V,): i.i.d., or without replacement in draw order.

    Without replacement is the sequential draw (each next token from q with the earlier ones removed,
    renormalised) that recursive rejection sampling assumes, done as that: each draw inverts the
    distribution function of what is left. Fewer than k tokens come back when q has fewer than k
    non-zero entries.
    """
    q = _on_generator_device(q.float(), generator)
    if without_replacement:
        k = min(k, int((q > 0).sum()))
    if k <= 0:
        return []
    if not without_replacement:
        return _invert(_cdf(q), k, generator).tolist()
    left, out = q.clone(), []
    for _ in range(k):
        t = int(_invert(_cdf(left), 1, generator)[0])
        out.append(t)
        left[t] = 0.0
    return out


def residual(target_probs: torch.Tensor, draft_probs: torch.Tensor) -> torch.Tensor:
    """norm(max(p - q, 0)): where a rejected draft sends the target (Leviathan et al.; mamba-drafters
    Alg. 1 line 16). A rejection implies some p_v > q_v, so the residual has mass unless float
    rounding ate it; then p itself is returned."""
    res = (target_probs.float() - draft_probs.float()).clamp_(min=0.0)
    total = float(res.sum())
    return res / total if total > 0.0 else target_probs.float()


# ---- exponential races ----------------------------------------------------------------------------
def _splitmix64(x: int) -> int:
    """splitmix64 finaliser (Steele et al.): a bijective 64-bit mix, stable across runs/platforms."""
    x = (x + 0x9E3779B97F4A7C15) & _MASK64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK64
    return x ^ (x >> 31)


def race_seed(seed: int, position: int) -> int:
    """Generator seed for the race at (seed, position). Python's hash() is salted per process and
    would break reproducibility across runs, hence splitmix64.

    torch's CPU generator (mt19937) keeps only the low 32 bits of its seed, so the high half is
    folded in: two (seed, position) pairs share noise with probability ~2^-32.
    """
    h = _splitmix64(_splitmix64(seed & _MASK64) ^ (position & _MASK64))
    return (h ^ (h >> 32)) & 0xFFFFFFFF


_NOISE_CACHE: "OrderedDict[tuple[int, int, int], torch.Tensor]" = OrderedDict()
_NOISE_CACHE_SIZE = 64  # a few steps of tree depth: the drafter and the verifier read the same positions
_NOISE_LOCK = threading.Lock()


def race_noise(seed: int, position: int, vocab: int) -> torch.Tensor:
    """i.i.d. Exp(1) noise (V,) float32 on CPU for absolute output ``position``, a function of
    (seed, position) only: bit-identical on every call (exponential-races Alg. 2 lines 3-5, Alg. 5
    line 6, with one race per output position rather than per tree node).

    Cached (LRU, 64 entries; drawing 49k exponentials costs ~0.7 ms); each call returns a fresh
    copy, so callers may modify it.
    """
    key = (int(seed), int(position), int(vocab))
    with _NOISE_LOCK:
        noise = _NOISE_CACHE.get(key)
        if noise is not None:
            _NOISE_CACHE.move_to_end(key)
            return noise.clone()
    gen = torch.Generator(device="cpu")
    gen.manual_seed(race_seed(seed, position))
    noise = torch.empty(vocab, dtype=torch.float32).exponential_(generator=gen)
    with _NOISE_LOCK:
        _NOISE_CACHE[key] = noise
        while len(_NOISE_CACHE) > _NOISE_CACHE_SIZE:
            _NOISE_CACHE.popitem(last=False)
    return noise.clone()


def race_arrivals(probs: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """Arrival times noise_v / p_v (..., V); tokens with p_v = 0 never arrive (+inf)."""
    probs = probs.float()
    noise = noise.to(device=probs.device, dtype=torch.float32)
    return torch.where(probs > 0, noise / probs, torch.inf)


def race_winner(probs: torch.Tensor, noise: torch.Tensor) -> int:
    """argmin_v noise_v / p_v: a sample from p (exponential-races §3; the Gumbel-max trick).

    At temperature 0 the winner is the argmax of p; callers use argmax directly there.
    """
    return int(race_arrivals(probs, noise).argmin())


def race_topk(q: torch.Tensor, noise: torch.Tensor, k: int) -> list[int]:
    """The first k arrivals of the race under q (V,), in arrival order: ERSD batch/tree drafts
    (exponential-races Alg. 5 line 10). Fewer than k when q has fewer non-zero entries."""
    arrivals = race_arrivals(q, noise)
    k = min(k, int((arrivals < torch.inf).sum()))
    if k <= 0:
        return []
    return arrivals.topk(k, largest=False, sorted=True).indices.tolist()
