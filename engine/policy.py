"""Tree policies: which draft tree to grow at the next step (ALGORITHMS.md §3).

* ``ShapeBandit`` — mamba-drafters §4.2 and App. A.4: UCB (eq. 1) over a set of static shapes
  (the arms), with the speed-up reward of eq. 2 / eq. 4,

      r = -(T_target(n_k) / T_target(1) + lambda_gamma * gamma_k) / N_accept,

  where gamma_k is the arm's depth (drafter steps), n_k its node count, lambda_gamma =
  T_draft / T_target measured online (one drafter depth-step over one single-row target pass) and
  N_accept the tokens the step emitted (accepted drafts + the target's own token). Without a
  verify-cost model T_target(n)/T_target(1) = 1, which is eq. 2 exactly. Two departures, both
  for small step counts on machines where a wide tree costs several plain steps: an arm's
  estimate is a ratio of sums (throughput, E[N]/E[cost], not the per-step mean of -cost/N, which
  is biased against high-variance chains), and the UCB optimism sits on the per-rank acceptance
  that every step shares, not on per-arm counts (``ShapeBandit.choose``).
* ``OptimalTree`` — exponential-races §4, Alg. 3: running acceptance statistics r(i) of the i-th
  ranked child (a 0-th order Markov estimate, as in the paper's experiments), a node's value R =
  product of r along its rank path, and a max-heap over frontier candidates (first child, next
  sibling) that builds the best tree of k nodes in O(k log k). The node budget k is capped by the
  verify-cost model where a bigger pass cannot pay off on this machine (STree §4).

A tree is handed to the drafter as a *plan*: parent indices in rank order (node i's children are
drafted as its top-ranked tokens, first child = rank 1). Policies are per conversation: the decoder
drops them on reset.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from typing import Sequence

from .costmodel import VerifyCost
from .tree import static_tree_layout

DEFAULT_ARMS: tuple[tuple[int, ...], ...] = ((3, 2, 2, 1, 1), (3, 3, 2, 1), (2, 2, 2, 1, 1, 1), (1, 1, 1, 1, 1))


def plan_from_shape(shape: Sequence[int]) -> tuple[int, ...]:
    """The plan (parent per node, rank order, -1 = root) of a static shape (N1..Ngamma)."""
    return tuple(static_tree_layout(shape))


def plan_depth(plan: Sequence[int]) -> int:
    depth = [0] * len(plan)
    for i, p in enumerate(plan):
        depth[i] = 1 if p < 0 else depth[p] + 1
    return max(depth, default=0)


def child_ranks(parents: Sequence[int]) -> list[int]:
    """Rank (0-based, drafting order) of every node among its siblings."""
    seen: dict[int, int] = {}
    ranks = []
    for p in parents:
        ranks.append(seen.get(p, 0))
        seen[p] = ranks[-1] + 1
    return ranks


@dataclass
class StepTimes:
    """Running (EMA) estimates of one drafter depth-step and one single-row target pass, in ms.
    The single-row pass is read off each verify pass through what that pass is known to cost in
    single-row passes: the shape's own measured ratio, else the start-up curve for narrow passes
    (<= NARROW rows; it is measured on chains and reads wide trees low)."""

    draft_step_ms: float | None = None
    target_ms: float | None = None
    alpha: float = 0.2

    def update(self, draft_ms: float, depth: int, verify_ms: float, rows: int, cost: VerifyCost | None,
               rel: float | None = None) -> None:
        if depth > 0 and draft_ms > 0:
            d = draft_ms / depth
            self.draft_step_ms = d if self.draft_step_ms is None else (1 - self.alpha) * self.draft_step_ms + self.alpha * d
        if rel is None and (rows <= self.NARROW or self.target_ms is None):
            rel = cost.relative(rows) if cost is not None else 1.0
        if verify_ms > 0 and rel:
            t1 = verify_ms / rel  # what a 1-row pass would have cost
            self.target_ms = t1 if self.target_ms is None else (1 - self.alpha) * self.target_ms + self.alpha * t1

    NARROW = 16

    @property
    def lambda_gamma(self) -> float:
        if not self.draft_step_ms or not self.target_ms:
            return 0.0
        return self.draft_step_ms / self.target_ms


@dataclass
class Arm:
    """One shape's record. Its reward estimate is a ratio of sums, -(Σ cost) / (Σ emitted) over
    its pulls (cost in single-row target passes, eq. 2's numerator), not the mean of the
    per-step rewards -cost/N: E[1/N] > 1/E[N], most for the arms whose N varies most (a chain
    emits 1 token as often as 4), so the per-step mean would understate exactly the arms that
    win on throughput, which is E[N] / E[cost]."""

    shape: tuple[int, ...]
    count: int = 0
    total: float = 0.0  # sum of per-step eq. 2 rewards (telemetry)
    cost: float = 0.0  # sum of step costs, in single-row target passes
    emitted: float = 0.0  # sum of tokens emitted
    # This shape's own measured costs in single-row target passes (EMAs of each step's time over
    # the running single-row estimate at that moment). Ratios, not milliseconds: a shared 2-core
    # machine runs everything 1.5x slower for minutes at a time, and a tree measured during a
    # slow minute must not look cheap (or dear) against a chain measured in a fast one.
    draft_rel: float | None = None  # drafting, per depth
    verify_rel: float | None = None  # the verify pass

    @property
    def mean(self) -> float:
        return -self.cost / self.emitted if self.emitted else 0.0

    @property
    def nodes(self) -> int:
        return len(plan_from_shape(self.shape))


@dataclass
class ShapeBandit:
    """UCB over static tree shapes (mamba-drafters §4.2, eq. 1-2; App. A.4, eq. 3-4), with the
    arms' rewards tied together through shared acceptance-by-rank statistics (see ``choose``)."""

    arms: list[Arm]
    lambda_ucb: float = 0.3
    cost: VerifyCost | None = None
    times: StepTimes = field(default_factory=StepTimes)
    rounds: int = 0
    last: int = -1
    accept: "OptimalTree" = field(default_factory=lambda: OptimalTree())  # per-rank acceptance, every arm's steps

    memory: dict | None = None  # measured costs kept across conversations (see ``of``)

    @classmethod
    def of(cls, shapes: Sequence[Sequence[int]], lambda_ucb: float = 0.3, cost: VerifyCost | None = None,
           memory: dict | None = None) -> "ShapeBandit":
        """``memory``: a dict the caller keeps across conversations. The bandit's state (counts,
        rewards, acceptance) resets per conversation, but what a shape costs to draft and verify
        is a fact about this machine and model, not about the conversation: a new bandit starts
        from the times measured before (and keeps them up to date), so it does not pay again to
        learn that a 46-node tree costs three plain steps here."""
        if not shapes:
            raise ValueError("the bandit needs at least one shape")
        b = cls([Arm(tuple(s)) for s in shapes], lambda_ucb, cost, memory=memory)
        if memory:
            for a in b.arms:
                a.draft_rel, a.verify_rel = memory.get(a.shape, (None, None))
            b.times.draft_step_ms, b.times.target_ms = memory.get("times", (None, None))
            if "accept" in memory:  # earlier conversations' acceptance by rank, as a prior of <= PRIOR_STEPS visits per rank
                hits, visits = memory["accept"]
                ws = [min(1.0, cls.PRIOR_STEPS / max(v, 1e-9)) for v in visits]
                b.accept.hits = [h * w for h, w in zip(hits, ws)]
                b.accept.visits = [v * w for v, w in zip(visits, ws)]
        return b

    PRIOR_STEPS = 16.0  # how many steps' worth of evidence earlier conversations' acceptance counts for

    def choose(self) -> tuple[int, ...]:
        """The arm with the highest upper confidence bound on eq. 2's reward (eq. 1's rule), where
        the bound comes from what is actually unknown. An arm's reward is a known function of its
        costs (its own measured drafting and verify times, which carry over between
        conversations, or the cost curve until measured) and of the acceptance rate of each child
        rank, which every step informs whatever arm it pulled (a chain step observes rank 0, a
        tree step ranks 0..N-1 at every node on the accepted path). So each arm's estimate is its
        observed rewards plus PRIOR_WEIGHT pseudo-observations of the reward *predicted* from
        those shared statistics, and the optimism sits in the prediction: each rank's acceptance
        is taken at its upper confidence bound (``rank_bounds``), which is loose for a rank that
        few steps have observed and tight once many have. A wide tree is explored while the ranks
        only it can reveal might make it pay, and not again once they are known, instead of plain
        UCB's per-arm count bonus, which re-pulls in every conversation a tree already known to
        cost two or three plain steps on a CPU (measured: mab 69% of the best static arm on a
        2-core AVX2 machine; tests/banditsim.py replays the measured costs)."""
        bounds = self.rank_bounds()
        w = self.PRIOR_WEIGHT
        scores = []
        for a in self.arms:
            cost, tokens = self.predicted_step(a.shape, bounds)
            scores.append(-(a.cost + w * cost) / (a.emitted + w * tokens))
        self.last = max(range(len(self.arms)), key=scores.__getitem__)
        return self.arms[self.last].shape

    PRIOR_WEIGHT = 8.0  # steps' worth of evidence the shared-statistics prediction counts for in an arm's estimate

    def rank_bounds(self) -> list[float]:
        """Upper confidence bounds on each child rank's acceptance (Wilson's score bound for a
        binomial proportion, z = λ_UCB·sqrt(2 ln t) with t the rounds so far): 1 for a rank never
        observed, close to the observed rate after many visits; rates are small (0.1 for rank 2
        here), where the variance-aware bound is much tighter than Hoeffding's."""
        t = max(2.0, self.rounds + 1.0)
        z2 = 2.0 * self.lambda_ucb ** 2 * math.log(t)
        out = []
        for i in range(self.accept.max_rank):
            v = self.accept.visits[i]
            if v <= 0:
                out.append(1.0)
                continue
            p = min(1.0, max(0.0, self.accept.hits[i] / v))
            centre = p + z2 / (2 * v)
            spread = math.sqrt(z2 * (p * (1 - p) / v + z2 / (4 * v * v)))
            out.append(min(1.0, (centre + spread) / (1 + z2 / v)))
        return out

    def expected_accepted(self, shape: tuple[int, ...], rates: Sequence[float] | None = None) -> float:
        """Expected accepted draft tokens of a static shape under per-rank acceptance ``rates``
        (default: the shared estimates): depth d is reached when the target's token was among
        the top N_j at every j <= d."""
        r = rates if rates is not None else [self.accept.r(i) for i in range(self.accept.max_rank)]
        total, reach = 0.0, 1.0
        for n in shape:
            reach *= min(1.0, sum(r[i] for i in range(min(n, len(r)))))
            total += reach
        return total

    def predicted_reward(self, shape: tuple[int, ...], rates: Sequence[float] | None = None) -> float:
        """eq. 2's reward predicted for ``shape`` (its own drafting time when measured, else the
        measured arms' per-depth time scaled by width: a depth of w rows costs ~(1 + w/16) x a
        single row's on this CPU, measured with the shipped drafter)."""
        cost, tokens = self.predicted_step(shape, rates)
        return -cost / tokens

    def predicted_step(self, shape: tuple[int, ...], rates: Sequence[float] | None = None) -> tuple[float, float]:
        """(cost in single-row target passes, expected tokens emitted) of one step of ``shape``."""
        a = self._arm(shape)
        lam = a.draft_rel if a is not None and a.draft_rel is not None else self._width_scaled_lambda(shape)
        return self.rel_verify(shape) + lam * len(shape), 1.0 + self.expected_accepted(shape, rates)

    def _width_scaled_lambda(self, shape: tuple[int, ...]) -> float:
        def width(sh):
            return len(plan_from_shape(sh)) / max(1, len(sh))

        known = [(a.draft_rel / (1 + width(a.shape) / 16)) for a in self.arms if a.draft_rel is not None]
        if not known:
            return self.times.lambda_gamma
        return sum(known) / len(known) * (1 + width(shape) / 16)

    def observe(self, parents: Sequence[int], accepted: Sequence[int]) -> None:
        """Acceptance by child rank from a verified tree (shared by all arms' predictions; with a
        memory, the running totals over conversations too: the next conversation's prior)."""
        if self.memory is not None:
            before = (list(self.accept.hits), list(self.accept.visits))
            self.accept.update(parents, accepted)
            hits, visits = self.memory.get("accept", ([0.0] * len(before[0]), [0.0] * len(before[1])))
            self.memory["accept"] = ([h + a - b for h, a, b in zip(hits, self.accept.hits, before[0])],
                                     [v + a - b for v, a, b in zip(visits, self.accept.visits, before[1])])
        else:
            self.accept.update(parents, accepted)

    def lam(self, shape: tuple[int, ...]) -> float:
        """λγ for ``shape``: its own measured drafting time per depth over a 1-row target pass.
        On a GPU a depth of any width costs about the same (the paper's single λγ); on a CPU a wide
        depth costs more than a chain's, so each arm keeps its own (the shared one until measured)."""
        a = self._arm(shape)
        if a is None or a.draft_rel is None:
            return self.times.lambda_gamma
        return a.draft_rel

    def rel_verify(self, shape: tuple[int, ...]) -> float:
        """The verify pass of ``shape`` in single-token target steps: its own measured time when it
        has been pulled (tree rows with gaps and the growing context make the start-up curve, a
        chain at a 64-token prefix, read low: measured here 3.6 vs 2.9 for a 46-node tree), else
        the verify-cost curve's t(n) / t(1)."""
        a = self._arm(shape)
        if a is not None and a.verify_rel is not None:
            return a.verify_rel
        rows = len(plan_from_shape(shape)) + 1
        return self.cost.relative(rows) if self.cost is not None else 1.0

    def reward(self, shape: tuple[int, ...], emitted: int) -> float:
        return -(self.rel_verify(shape) + self.lam(shape) * len(shape)) / max(1, emitted)

    def _arm(self, shape: tuple[int, ...]) -> Arm | None:
        return next((a for a in self.arms if a.shape == tuple(shape)), None)

    def update(self, shape: tuple[int, ...], emitted: int, draft_ms: float, verify_ms: float, rows: int) -> float:
        """Book one round for the arm with ``shape``: ``emitted`` tokens, measured times."""
        a = self._arm(shape)
        self.times.update(draft_ms, len(shape), verify_ms, rows, self.cost, a.verify_rel if a is not None else None)
        al = self.times.alpha
        t1 = self.times.target_ms
        if a is not None and t1:
            if draft_ms > 0 and len(shape):
                d = draft_ms / len(shape) / t1
                a.draft_rel = d if a.draft_rel is None else (1 - al) * a.draft_rel + al * d
            if verify_ms > 0:
                v = verify_ms / t1
                a.verify_rel = v if a.verify_rel is None else (1 - al) * a.verify_rel + al * v
        if self.memory is not None:
            if a is not None:
                self.memory[a.shape] = (a.draft_rel, a.verify_rel)
            self.memory["times"] = (self.times.draft_step_ms, self.times.target_ms)
        r = self.reward(shape, emitted)
        if a is not None:
            a.count += 1
            a.total += r
            a.cost += -r * max(1, emitted)
            a.emitted += max(1, emitted)
        self.rounds += 1
        return r

    def snapshot(self) -> dict:
        return {"policy": "mab", "rounds": self.rounds, "lambda_gamma": round(self.times.lambda_gamma, 4),
                "lambda_ucb": self.lambda_ucb,
                "arms": [{"shape": list(a.shape), "count": a.count, "mean": round(a.mean, 4),
                          "lambda": round(self.lam(a.shape), 4)} for a in self.arms],
                "chosen": list(self.arms[self.last].shape) if self.last >= 0 else None}


@dataclass
class OptimalTree:
    """Exponential-races Alg. 3 over running per-rank acceptance statistics."""

    node_budget: int = 16
    max_depth: int = 8
    max_rank: int = 8
    prior_strength: float = 2.0
    cost: VerifyCost | None = None
    hits: list[float] = field(default_factory=list)
    visits: list[float] = field(default_factory=list)
    rounds: int = 0
    last_plan: tuple[int, ...] = ()
    budget_used: int = 0

    def __post_init__(self) -> None:
        self.hits = [0.0] * self.max_rank
        self.visits = [0.0] * self.max_rank

    def prior(self, i: int) -> float:
        """Before any evidence: rank 1 often right, each further rank half as likely."""
        return 0.6 * 0.5 ** i

    def r(self, i: int) -> float:
        """Estimated probability that the target's token is the drafter's rank-i (0-based) child."""
        if i >= self.max_rank:
            return 0.0
        k = self.prior_strength
        return (self.hits[i] + k * self.prior(i)) / (self.visits[i] + k)

    def expected_tokens(self, k: int) -> list[float]:
        """Expected tokens emitted by the best trees of 1..k nodes: 1 + sum of node values."""
        vals = sorted(self._values(k), reverse=True)
        out, acc = [], 1.0
        for v in vals:
            acc += v
            out.append(acc)
        return out

    def _values(self, k: int) -> list[float]:
        return [v for _, v in self._build(k)]

    def _build(self, k: int) -> list[tuple[int, float]]:
        """Alg. 3: (parent, value) of the k best nodes, in the order they join the tree."""
        nodes: list[tuple[int, float]] = []
        depth: list[int] = []
        # heap of (-value, tie, parent node, rank, parent depth)
        heap = [(-self.r(0), 0, -1, 0, 0)]
        tie = 1
        while heap and len(nodes) < k:
            negv, _, parent, rank, pdepth = heapq.heappop(heap)
            v = -negv
            if v <= 0:
                break
            nodes.append((parent, v))
            depth.append(pdepth + 1)
            me = len(nodes) - 1
            if pdepth + 1 < self.max_depth:  # first child of the new node
                heapq.heappush(heap, (-(v * self.r(0)), tie, me, 0, pdepth + 1))
                tie += 1
            pv = v / self.r(rank) if self.r(rank) > 0 else 0.0  # next sibling: same parent, next rank
            if rank + 1 < self.max_rank and pv > 0:
                heapq.heappush(heap, (-(pv * self.r(rank + 1)), tie, parent, rank + 1, pdepth))
                tie += 1
        return nodes

    def choose(self, max_nodes: int) -> tuple[int, ...]:
        k = max(1, min(self.node_budget, max_nodes))
        if self.cost is not None:
            # rows of the pass = nodes + root; keep k where the expected tokens per ms still grow
            exp = self.expected_tokens(k)
            k = max(1, self.cost.max_worthwhile([1.0] + exp) - 1)
        self.budget_used = k
        built = self._build(k)
        # the heap order lists parents before children and siblings in rank order
        self.last_plan = tuple(p for p, _ in built)
        return self.last_plan

    def update(self, parents: Sequence[int], accepted: Sequence[int]) -> None:
        """Book what the verifier did on a drafted tree: at every node on the accepted path (the
        root first) whose children were drafted, ranks 0..c-1 were observed and one (or none) hit."""
        children: dict[int, list[int]] = {}
        for i, p in enumerate(parents):
            children.setdefault(p, []).append(i)
        walk = [-1] + list(accepted)
        for j, node in enumerate(walk):
            kids = children.get(node, [])
            if not kids:
                break
            nxt = walk[j + 1] if j + 1 < len(walk) else None
            for rank, kid in enumerate(kids[: self.max_rank]):
                self.visits[rank] += 1
                if kid == nxt:
                    self.hits[rank] += 1
        self.rounds += 1

    def snapshot(self) -> dict:
        return {"policy": "optimal", "rounds": self.rounds, "nodes": len(self.last_plan), "budget": self.budget_used,
                "depth": plan_depth(self.last_plan), "rank_acceptance": [round(self.r(i), 3) for i in range(4)]}
