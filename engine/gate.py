"""Cost-aware draft length for the chain strategies (``sd:auto``, ``pld:auto``, ``hybrid:auto``).

A draft pays only while the tokens it is expected to add outweigh what it costs: drafting (the
drafter model's steps) and verifying more rows (the target's pass over n rows, t(n), measured on
this machine by engine/costmodel.py). Once plain decoding is fast, as it is on a CPU with the
GGUF weights kept quantised (a SmolLM2 decode step ~9 ms, a 6-row pass ~22 ms), a weak or
unlucky draft makes decoding slower, not faster. So each step the gate picks the draft length

    k* = argmax_{0 <= k <= K}  E(k) / (t(k + 1) + k·d),   E(k) = (1 - α^{k+1}) / (1 - α)

with K the strategy's draft length, d the drafter's measured milliseconds per drafted token, and
α the drafter's recent per-token acceptance (exponentially weighted counts with a Beta(1, 2)
prior: a drafter starts out trusted for a short draft, not a long one). E(k) is the expected emitted tokens of a k-chain whose tokens are each accepted with
probability α (Leviathan et al. 2023, §3.1; ALGORITHMS.md §3 uses the same cost-benefit view for
trees, STree §4). k* = 0 is a plain decoding step. A source the gate has shut off is probed with a
one-token draft after ``probe`` steps, so α can recover when the text turns repetitive; each probe
that fails doubles the wait (up to 64 steps), one that is accepted resets it.

**The drafter's own confidence** (greedy chains of a drafter model): α is an average, but a
drafter's per-token acceptance varies a lot within a reply, and a distilled drafter knows when it
is sure. Measured on the 12 evaluation replies of SmolLM2 (teacher-forced, the shipped drafter):
tokens it gave probability 0.9+ matched the target's 96% of the time, 0.0-0.1 5%, and every bin
in between within 0.1 of its own probability (bench/drafter_confidence.py,
bench/results/2026-11-25-q8.md). So once the
gate lets the drafter in, the drafter drafts up to K and keeps its probability p_i of each token;
it stops stepping as soon as even a certain next token could not pay for its row and its draft
step (``keep_going``), and the chain is cut to the length that maximises

    E(k) / (t(k + 1) + C),   E(k) = 1 + Σ_{i<=k} Π_{j<=i} c(p_j)

(``choose``; C the drafting already spent), c the calibration of p to acceptance learnt online
from verified drafts (10 bins, each starting at its mid-point with weight 2, and one for tokens
copied from a context match). This is the dynamic draft length of SpecDec++ (Huang et al. 2024).
For trees (the n-gram datastore's, engine/drafters/ngram.py ``corpus_tree``, grown best first as
in EAGLE-2, Li et al. 2024) the same cut runs over the nodes in the order they were grown, E(k)
being 1 + the sum of the first k nodes' path probabilities, and ``worth`` stops the growth where
no candidate can pay for its row; a calibration that has cut every draft for ``probe`` steps
verifies one node anyway (``open_by_confidence``), so it can recover.

Lossless: the length is chosen from past steps, timings and the drafter's own numbers only, never
from the current step's target randomness, and every verifier is exact for whatever draft it is
given.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .costmodel import VerifyCost


@dataclass
class _Source:
    accepted: float = 0.0  # weighted accepted draft tokens
    tried: float = 0.0  # weighted draft positions the verifier looked at
    ms_per_token: float = 0.0  # drafting cost, EMA
    idle: int = 0  # steps in a row the gate has drafted nothing
    wait: int = 0  # steps between probes while shut (0 = the gate's ``probe``)
    probing: bool = False  # the last draft was a probe
    # calibration of the drafter's probability of a drafted token to its acceptance (CAL_BINS bins)
    # (one more bin, the last, for tokens copied from a context match: COPIED)
    # (then CAL_BINS for a drafter model's probability and CAL_BINS for tokens two sources agreed
    # on, in trees that mix sources: see MODEL / AGREE)
    cal_hits: list[float] = field(default_factory=lambda: _mid_points() + [CAL_PRIOR * COPIED_PRIOR]
                                  + _mid_points() + _mid_points())
    cal_n: list[float] = field(default_factory=lambda: [CAL_PRIOR] * (3 * CAL_BINS + 1))


CAL_BINS = 10
CAL_PRIOR = 2.0  # pseudo-observations per bin at its mid-point: a calibrated drafter until shown otherwise
# A bin's memory is bounded: past CAL_WINDOW judged tokens its counts shrink in proportion as new
# ones come (an exponential window), and a new conversation carries at most CAL_CARRY of them. Its
# counts used to grow without end, so after a reply stuck in a loop (SmolLM2 repeating a sentence
# for 300 tokens: copied tokens right ~94% of the time) the copy bin kept that rate into the next
# conversations, and the gate drafted 16-token copies that a normal reply rejected (the app, q8,
# hybrid: x0.65 on the next reply, session 29).
CAL_WINDOW = 256.0
CAL_CARRY = 64.0
COPIED = -1.0  # the confidence of a token copied from a context match (prompt lookup has no probability)
COPIED_PRIOR = 0.5
# Trees that mix sources (hybrid:auto: the context's copy, the datastore and a drafter model) keep
# one number per node and calibrate each kind in bins of its own: a datastore share p as itself, a
# drafter model's probability p as MODEL + p, and a token the drafter model and the copy or the
# datastore both proposed as AGREE + p (p the drafter's probability; measured on SmolLM2's
# evaluation replies, the two agreeing were right 73% of the time against 45-49% for either).
MODEL = 2.0
AGREE = 4.0


def _mid_points() -> list[float]:
    return [CAL_PRIOR * (i + 0.5) / CAL_BINS for i in range(CAL_BINS)]


def _bin(p: float) -> int:
    if p < 0:
        return CAL_BINS
    base = 0
    if p >= AGREE:
        p, base = p - AGREE, 2 * CAL_BINS + 1
    elif p >= MODEL:
        p, base = p - MODEL, CAL_BINS + 1
    return base + min(CAL_BINS - 1, max(0, int(p * CAL_BINS)))


def raw_probability(code: float) -> float:
    """The probability a node's confidence code carries (COPIED: 0.9), for an uncalibrated use."""
    if code < 0:
        return 0.9
    return code - AGREE if code >= AGREE else (code - MODEL if code >= MODEL else code)


DRAFTER_GAIN = 0.2  # hybrid:auto: the drafter model's proposals raise tokens a step by ~20% (see with_drafter)
DRAFTER_RECHECK = 32  # steps without the drafter model before its cost is measured again, doubling
DRAFTER_SAMPLES = 5  # the drafter's cost is the least of its last 5 measures
DRAFTER_RECHECK_MAX = 512  # while it keeps not paying (a re-measure catches the drafter up on them all)
MIXED_EXPLORE = 8  # the measured arms: at least one decision in 64, at most one in 8, takes the arm measured worse
MIXED_EXPLORE_MAX = 64  # an exploring step that loses doubles the wait, up to 64 (one that wins halves it)
MIXED_MIN = 4  # steps each arm needs before their measured rates decide
MIXED_DECAY = 0.97  # the arms' token and time sums decay per step of that arm (~30 steps of memory)
ARMS = ("tree", "chain")  # hybrid:auto's mixed trees; drafter-model chains (sd:auto, hybrid:auto without a datastore)


def _arm() -> dict[bool, list[float]]:
    return {True: [0.0, 0.0, 0.0, 0.0], False: [0.0, 0.0, 0.0, 0.0]}  # decayed tokens, ms; steps; decayed steps


@dataclass
class DraftGate:
    cost: VerifyCost
    decay: float = 0.9
    probe: int = 8
    sources: dict[str, _Source] = field(default_factory=dict)
    # hybrid:auto: the drafter model's measured costs a step (drafter_ms), steps without it, the wait
    drafter_costs: list[float] = field(default_factory=list)  # its last DRAFTER_SAMPLES measured costs (ms)
    _without: int = 0
    _recheck: int = DRAFTER_RECHECK
    catch_up_ms: float = 0.0  # the drafter model's catch-up cost a token (EMA; observe_catch_up)
    # per arm (ARMS: with_drafter's "tree", drafting_pays' "chain"), the steps with (True) and
    # without (False) the drafter model: [decayed tokens, decayed ms, steps, decayed steps]
    arms: dict[str, dict[bool, list[float]]] = field(default_factory=lambda: {a: _arm() for a in ARMS})
    _since_other: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ARMS, 0))
    _explore_every: dict[str, int] = field(default_factory=lambda: dict.fromkeys(ARMS, MIXED_EXPLORE))
    _explored: dict[str, bool] = field(default_factory=dict)  # the verdict an exploring step went against
    _fit: tuple[float, float] | None = None  # at(): (s, e) of the loop's step times, None = refit
    _at: dict[int, float] = field(default_factory=dict)  # at()'s values under the current _fit and cost
    _at_cost: VerifyCost | None = None  # the cost _at was computed from (the decoder may set one later)
    last: dict = field(default_factory=dict)  # the last decision, for the dashboard / tests
    # the verify step's wall time as the decode loop sees it, per row count n: [EMA ms, steps]
    observed: dict[int, list[float]] = field(default_factory=dict)

    def carried(self) -> "DraftGate":
        """The gate for a new conversation: what was learnt of each source's calibration (how
        often a token of confidence p is accepted: a property of the drafter and the target, not
        of one conversation) carries over; acceptance rates, probes and step timings start over."""
        g = DraftGate(self.cost, self.decay, self.probe)
        for name, src in self.sources.items():
            keep = [min(1.0, CAL_CARRY / n) if n > 0 else 1.0 for n in src.cal_n]  # at most CAL_CARRY a bin
            g.sources[name] = _Source(cal_hits=[h * k for h, k in zip(src.cal_hits, keep)],
                                      cal_n=[n * k for n, k in zip(src.cal_n, keep)])
        g.drafter_costs, g._recheck = list(self.drafter_costs), self._recheck  # what the drafter model costs here
        g.catch_up_ms = self.catch_up_ms
        # and what it brings (tokens per ms, with vs without)
        g.arms = {a: {k: list(v) for k, v in arm.items()} for a, arm in self.arms.items()}
        return g

    # ---- hybrid:auto: whether the drafter model joins the tree -------------------------------------
    def with_drafter(self) -> bool:
        """Whether this step's tree takes the drafter model in. Its proposals raise the tokens a
        step emits by about DRAFTER_GAIN (bf16 SmolLM2 with the shipped drafter and datastore, 12
        evaluation prompts, 2 Zen 4 cores: 2.55 tokens a step against 2.13 for the copy and the
        datastore alone), at the price of its catch-up and one step per path node, measured here
        (``observe_drafter``): it joins while that price is below DRAFTER_GAIN of a plain step.
        Beside a 30 ms bf16 step its ~3 ms pay; beside a 3.3 ms q8 step they do not. Without it,
        its cost is measured again after DRAFTER_RECHECK steps (the machine's load changes), the
        wait doubling up to DRAFTER_RECHECK_MAX while it keeps not paying: the step that
        re-measures pays for catching the drafter up on every token since."""
        if len(self.drafter_costs) < 2 or self.drafter_ms < DRAFTER_GAIN * self.at(1):  # never out on one measure
            self._without, self._recheck = 0, DRAFTER_RECHECK
            return self._mixed_arm()
        self._without += 1
        if self._without < self._recheck:
            return False
        self._without, self._recheck = 0, min(2 * self._recheck, DRAFTER_RECHECK_MAX)
        return True

    def _mixed_arm(self, name: str = "tree", extra_ms: float = 0.0) -> bool:
        """Where the drafter's cost passes the rule above, whether it pays as measured: the tokens
        per ms of the mixed steps taken with it against those taken without (``observe_mixed``;
        the rule counts only its drafting, not the larger verify pass its nodes make: bf16 SmolLM2
        on a 2-core Zen 4 took 2.52 tokens a step with it and 2.25 without, yet ran 1.97x against
        2.15x plain decoding). Every ``_explore_every`` decisions (MIXED_EXPLORE up to
        MIXED_EXPLORE_MAX; ``observe_mixed`` adapts it) one takes the arm measured worse, so both
        stay measured as the text changes; with no outcomes reported the drafter is taken."""
        w, wo = self.arms[name][True], self.arms[name][False]
        if w[2] < MIXED_EXPLORE:  # not measured with it yet
            return True
        # tokens/ms with (its steps' ms, plus ``extra_ms`` each: a catch-up this step needs) >= without
        better = wo[2] < MIXED_MIN or w[0] * wo[1] >= wo[0] * (w[1] + extra_ms * w[3])
        self._since_other[name] += 1
        if self._since_other[name] >= self._explore_every[name]:
            self._since_other[name] = 0
            self._explored[name] = better
            return not better
        return better

    def drafting_pays(self, lag: int = 0) -> bool:
        """sd:auto (and hybrid:auto without a datastore), once ``budget`` allows a drafter model's
        chain that is not a probe: whether to run the drafter this step at all, by the measured
        rule of hybrid:auto's trees (``_mixed_arm``): tokens per ms of the steps that drafted
        against those that did not. The cost-benefit cut
        of a drafted chain (``choose``) can only weigh what a draft adds against its rows; what
        it cost to learn the drafter's confidence (catching the drafter up on the last step's
        tokens and its first step) is spent either way. In q8 on a 2-core Zen 4 that was 0.7 ms
        beside a 4 ms step, and 85% of the chains were cut to nothing (sd:auto 0.9x plain
        decoding, 1.04-1.14 tokens a step; bench/results/2026-11-27-session21/).

        The steps with it are booked at a steady drafter's cost (without catching up on the tokens
        of the steps before that went without it); ``lag``, the tokens the drafter would catch
        up on now beyond a steady step's, is charged to this step's decision at the measured
        catch-up cost a token (``observe_catch_up``): a recurrent drafter run now and then pays
        for every token since, and where a plain step's acceptance gate (``budget``) lets it in
        only every few steps that cost decides. (The decoder counts ``lag`` from the start of
        the reply: catching up on the prompt is paid once whenever the drafter first runs.)"""
        return self._mixed_arm("chain", max(0, lag) * self.catch_up_ms)

    def observe_catch_up(self, tokens: int, ms: float) -> None:
        """The drafter model caught up on ``tokens`` tokens in ``ms`` (kept: the cost a token, EMA)."""
        if tokens >= 2:
            per = ms / tokens
            self.catch_up_ms = per if self.catch_up_ms == 0.0 else 0.8 * self.catch_up_ms + 0.2 * per

    def arm_rates(self, name: str) -> tuple[float | None, float | None]:
        """The measured tokens per ms of arm ``name``'s steps with and without the drafter model
        (None where not measured yet): for the dashboard."""
        return tuple(a[0] / a[1] if a[2] and a[1] > 0 else None for a in (self.arms[name][True], self.arms[name][False]))

    def observe_mixed(self, with_drafter: bool, tokens: int, ms: float, name: str = "tree") -> None:
        """A step's outcome for arm ``name``: ``tokens`` emitted in ``ms`` (drafting and verifying)."""
        explored = self._explored.pop(name, None)  # the verdict this step's decision explored against, if it did
        arm, other = self.arms[name][with_drafter], self.arms[name][not with_drafter]
        measured = arm[2] >= MIXED_MIN and other[2] >= MIXED_MIN  # (before this step)
        arm[0], arm[1], arm[2], arm[3] = (MIXED_DECAY * arm[0] + tokens, MIXED_DECAY * arm[1] + ms, arm[2] + 1,
                                          MIXED_DECAY * arm[3] + 1)
        if explored is None or explored is with_drafter or not measured:
            return
        # the exploring step: its arm now measures better (the verdict turns), or this step beat the
        # arm preferred (look again sooner: the sums change slowly), or neither (look again later)
        if arm[0] * other[1] >= other[0] * arm[1]:
            self._explore_every[name] = MIXED_EXPLORE
        elif tokens * other[1] > other[0] * ms:
            self._explore_every[name] = max(MIXED_EXPLORE, self._explore_every[name] // 2)
        else:
            self._explore_every[name] = min(2 * self._explore_every[name], MIXED_EXPLORE_MAX)

    @property
    def drafter_ms(self) -> float | None:
        """What the drafter model costs a step: the least of its last DRAFTER_SAMPLES measures (a
        step's noise only ever adds time; a first step's one-off set-up, or a busy moment, must
        not keep the drafter out for the hundreds of steps until it is measured again)."""
        return min(self.drafter_costs) if self.drafter_costs else None

    def observe_drafter(self, ms: float) -> None:
        """A step's tree took the drafter model in at a cost of ``ms``."""
        self.drafter_costs = (self.drafter_costs + [ms])[-DRAFTER_SAMPLES:]

    def at(self, n: int) -> float:
        """t(n), the milliseconds of a step that verifies n rows as the decode loop sees it (the
        pass plus what the loop does around it: the greedy check of n rows of logits, the
        commit): the start-up curve c(n) fitted to the loop's own step times as s·c(n) + e·(n-1)
        (weighted least squares over the row counts seen, each weighted by its steps up to 10;
        e >= 0). One smooth curve, not an average per row count: a node's marginal cost
        t(n + 1) - t(n) then follows the curve's shape instead of the noise of two steps. (On
        the 2-core Zen 4 EPYC in q8, a 2-row step took 1.3x a plain step in the loop while the
        bare passes measured 1.10x: e is that per-row overhead.)"""
        if self._at_cost is not self.cost:  # a new curve: the loop's fit to it too
            self._at.clear()
            self._fit, self._at_cost = None, self.cost
        v = self._at.get(n)
        if v is None:  # (a tree's cut asks for t(n) of every node count, ~50 times a step)
            if self._fit is None:
                self._fit = self._loop_fit()
            s, e = self._fit
            v = self._at[n] = s * self.cost.at(n) + e * (n - 1)
        return v

    def _loop_fit(self) -> tuple[float, float]:
        pts = [(self.cost.at(n), n - 1.0, o[0], min(o[1], 10)) for n, o in self.observed.items() if o[1] >= 1]
        if not pts:
            return 1.0, 0.0
        scc = sum(w * c * c for c, _, _, w in pts)
        sxx = sum(w * x * x for _, x, _, w in pts)
        scx = sum(w * c * x for c, x, _, w in pts)
        scy = sum(w * c * y for c, _, y, w in pts)
        sxy = sum(w * x * y for _, x, y, w in pts)
        det = scc * sxx - scx * scx
        if det > 1e-9 * max(scc * sxx, 1e-12):
            s, e = (scy * sxx - sxy * scx) / det, (sxy * scc - scy * scx) / det
            if s > 0 and e >= 0:
                return s, e
        return (scy / scc if scc > 0 else 1.0), 0.0

    def observe_step(self, rows: int, ms: float) -> None:
        """One verify step of ``rows`` rows (the root and the draft) took ``ms``."""
        o = self.observed.setdefault(rows, [ms, 0])
        o[0] = ms if o[1] == 0 else 0.8 * o[0] + 0.2 * ms
        o[1] += 1
        self._fit = None
        self._at.clear()

    def _source(self, source: str) -> _Source:
        """``source``'s record, made on first use (not a fresh _Source built and dropped on every
        call, as setdefault would: ~25 us each, and a mixed tree calibrates every candidate)."""
        s = self.sources.get(source)
        if s is None:
            s = self.sources[source] = _Source()
        return s

    def alpha(self, source: str) -> float:
        s = self.sources.get(source) or _Source()
        return (s.accepted + 1.0) / (s.tried + 3.0)

    def budget(self, source: str, k_max: int) -> int:
        """The draft length to use now (0 = a plain decoding step)."""
        s = self._source(source)
        a = min(self.alpha(source), 0.999)
        best_k, best = 0, 1.0 / self.at(1)
        for k in range(1, k_max + 1):
            expected = (1.0 - a ** (k + 1)) / (1.0 - a)
            rate = expected / (self.at(k + 1) + k * s.ms_per_token)
            if rate > best:
                best_k, best = k, rate
        s.probing = False
        if best_k == 0 and k_max > 0 and s.idle + 1 >= (s.wait or self.probe):
            best_k, s.probing = 1, True
        s.idle = 0 if best_k else s.idle + 1
        self.last = {"policy": "gate", "source": source, "alpha": round(a, 3), "k": best_k, "k_max": k_max,
                     "probe": s.probing}
        return best_k

    # ---- the drafter's confidence (greedy chains) ---------------------------------------------------
    def calibrated(self, source: str, p: float) -> float:
        """The acceptance probability of a drafted token the drafter gave probability ``p``."""
        s = self._source(source)
        b = _bin(p)
        return s.cal_hits[b] / s.cal_n[b]

    def _expected(self, source: str, confidence: list[float], parents: list[int] | None = None) -> list[float]:
        """E(k) for k = 0..len(confidence): expected tokens a pass over the draft's first k nodes
        emits, 1 + the sum of their path probabilities (a node is accepted only with all its
        ancestors; siblings exclude each other, so the sum over a tree is exact for greedy
        verification as for a chain). ``parents``: the tree's (topological order), else a chain."""
        out, e = [1.0], 1.0
        reach: list[float] = []
        for i, p in enumerate(confidence):
            up = parents[i] if parents is not None else i - 1
            reach.append((reach[up] if up >= 0 else 1.0) * self.calibrated(source, p))
            e += reach[-1]
            out.append(e)
        return out

    def keep_going(self, source: str) -> Callable[[list[float]], bool]:
        """For the drafter, after each drafted token (its probabilities so far): whether one more
        draft step can pay. Token i + 1 adds at most Π_{j<=i} c(p_j) expected tokens, and costs a
        row, t(i + 2) - t(i + 1), and a draft step d; it is worth drafting only if that could beat
        plain decoding's rate 1 / t(1)."""
        s = self._source(source)

        def go(confidence: list[float]) -> bool:
            reach = 1.0
            for p in confidence:
                reach *= self.calibrated(source, p)
            return self._pays(len(confidence), reach, s.ms_per_token)

        return go

    def _pays(self, n: int, reach: float, step_ms: float = 0.0) -> bool:
        """Whether a node of path probability ``reach`` added after ``n`` nodes could beat plain
        decoding's rate: reach * t(1) > t(n + 2) - t(n + 1) + the draft step it needs."""
        return reach * self.at(1) > self.at(n + 2) - self.at(n + 1) + step_ms

    def worth(self, source: str) -> Callable[..., bool]:
        """For a tree grown best first: whether its next node, of path probability ``reach`` (its
        calibrated confidences multiplied from the root), could pay for its row after ``n``
        nodes: reach * t(1) > t(n + 2) - t(n + 1), as in ``keep_going`` (the datastore's
        lookups cost microseconds: no draft step is charged). With ``step_ms``: whether a
        drafter model's step of that cost, to propose the children of a node reached with
        probability ``reach``, could pay (hybrid:auto's trees)."""
        s = self._source(source)

        def ok(n: int, reach: float, step_ms: float = 0.0) -> bool:
            if n == 0 and s.probing:  # a probe: one node whatever the calibration says (see choose)
                return True
            return self._pays(n, reach, step_ms)

        return ok

    def open_by_confidence(self, source: str, k_max: int) -> int:
        """Before a draft cut by its own confidence (``choose``), in place of ``budget``: the full
        length k_max, and whether this step is a probe. A calibration that has turned pessimistic
        would otherwise never see another verified node to correct it, so after ``probe`` steps
        without a draft one node is verified anyway (the wait doubling after each probe
        rejected, as for the acceptance-rate gate)."""
        s = self._source(source)
        s.probing = s.idle + 1 >= (s.wait or self.probe)
        self.last = {"policy": "gate", "source": source, "alpha": round(self.alpha(source), 3), "k": k_max,
                     "k_max": k_max, "probe": s.probing}
        return k_max

    def choose(self, source: str, confidence: list[float], spent_ms: float = 0.0, parents: list[int] | None = None) -> int:
        """The number of nodes (0 = none: a plain step) to verify of a draft whose nodes have
        ``confidence`` (a chain, or a tree in topological order with ``parents``, every prefix a
        tree): argmax_k E(k) / (t(k + 1) + spent_ms)."""
        expected = self._expected(source, confidence, parents)
        best_k, best = 0, 1.0 / (self.at(1) + spent_ms)
        for k in range(1, len(confidence) + 1):
            rate = expected[k] / (self.at(k + 1) + spent_ms)
            if rate > best:
                best_k, best = k, rate
        s = self._source(source)
        if best_k == 0 and confidence and s.probing:
            best_k = 1
        s.idle = 0 if best_k else s.idle + 1
        self.last = {**self.last, "k": best_k, "drafted": len(confidence), "confidence": [round(p, 2) for p in confidence],
                     "expected": round(expected[best_k], 2)}
        return best_k

    def observe(self, source: str, depth: int, accepted: int, draft_ms: float, drafted: int,
                confidence: list[float] | None = None, parents: list[int] | None = None,
                path: list[int] | None = None) -> None:
        """One verified draft: ``depth`` its longest chain, ``accepted`` the tokens kept, and the
        ms spent drafting its ``drafted`` nodes; for a draft with ``confidence`` (each node's own
        probability), the calibration learns from the nodes verification judged: the children of
        the root and of every accepted node, accepted or not (the rest were never judged). A
        chain's are its accepted tokens and the first rejected one; a tree's are given by
        ``parents`` and the accepted ``path`` (node indices)."""
        if depth <= 0:
            return
        s = self._source(source)
        if confidence:
            if parents is None:
                parents, path = list(range(-1, len(confidence) - 1)), list(range(accepted))
            on_path = set(path or ())
            for i, p in enumerate(confidence):
                if parents[i] < 0 or parents[i] in on_path:
                    b = _bin(p)
                    if s.cal_n[b] + 1.0 > CAL_WINDOW:  # the window: older tokens weigh less and less
                        k = (CAL_WINDOW - 1.0) / s.cal_n[b]
                        s.cal_n[b] *= k
                        s.cal_hits[b] *= k
                    s.cal_n[b] += 1.0
                    s.cal_hits[b] += 1.0 if i in on_path else 0.0
        if s.probing:
            s.wait = self.probe if accepted else min(2 * (s.wait or self.probe), 64)
        tried = accepted + (1 if accepted < depth else 0)
        s.accepted = self.decay * s.accepted + accepted
        s.tried = self.decay * s.tried + tried
        per = draft_ms / max(drafted, 1)
        s.ms_per_token = per if s.ms_per_token == 0.0 else 0.8 * s.ms_per_token + 0.2 * per
