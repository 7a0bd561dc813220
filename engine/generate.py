"""The decode loop: draft -> verify -> commit, one StepEvent per target forward.

The Strategy is read once at the top of every step (``strategy`` may be a callable returning the
current one), so the UI can switch it between steps; the committed state — the target's cache,
the token history and the drafters' caches — does not depend on which strategy produced it.
"""

from __future__ import annotations

import resource
import sys
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

import torch

from . import native
from .drafters.base import DraftRequest
from .drafters.model import ModelDrafter
from .drafters.ngram import NgramDrafter
from .errors import ContextOverflowError, SpecchatError
from .events import GenerationSummary, StepEvent
from .models.base import CausalLM
from .policy import OptimalTree, ShapeBandit, child_ranks, plan_depth
from .sampling import race_noise, repeat_penalized
from .strategy import HYBRID_NGRAM_LEN, Strategy, StrategyError
from .tree import TokenTree
from .verify import accept, sample_next

PREFILL_PIECE = 256  # tokens of prefill between checks of a stop request (Decoder.start): the models' prefill chunk


def peak_rss_mb() -> float:
    """This process's peak resident memory in MB since it began (``ru_maxrss``: one system call, cheap
    enough for every step's event)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / (1024 * 1024) if sys.platform == "darwin" else r / 1024


def window_peak_rss_mb() -> float:
    """The peak resident memory in MB since :func:`reset_peak_rss` (Linux's VmHWM; bench: each row's
    own peak), else since the process began (:func:`peak_rss_mb`). Reads /proc: not for a step's path."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return peak_rss_mb()


def reset_peak_rss() -> bool:
    """Restart :func:`window_peak_rss_mb`'s peak from the current resident size (Linux: "5" to
    /proc/self/clear_refs). False where that cannot be done: the peak then stays the process's."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def torch_gpu_mb() -> tuple[float, float] | None:
    """torch's CUDA allocator: (allocated, peak) MB, or None when CUDA is not in use (never
    initialises CUDA itself)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    return torch.cuda.memory_allocated() / 2**20, torch.cuda.max_memory_allocated() / 2**20


@dataclass
class Decoder:
    """Owns the target, the drafters and the token history of one conversation."""

    target: CausalLM
    drafter_model: CausalLM | None = None
    eos_ids: set[int] = field(default_factory=set)
    detokenize: Callable[[], object] | None = None  # factory of a StreamDecoder (push(ids) -> str)
    token_str: Callable[[int], str] | None = None  # readable token text, for the tree view
    target_tokenizer: object | None = None  # with drafter_tokenizer: a drafter of another vocabulary
    drafter_tokenizer: object | None = None  # is wrapped in a vocabulary bridge (engine/drafters/vocab.py)

    def __post_init__(self) -> None:
        self.target.allocate()
        self.history: list[int] = []  # committed tokens + the pending root
        self.prefilled = 0  # prompt tokens the last ``start`` ran through the target (not the reused prefix)
        self._pending: list[int] = []  # accepted tokens not yet in the target's state (--backtrack joint)
        self.drafters = {"ngram": NgramDrafter()}
        self.policies: dict[tuple, object] = {}  # tree policies (mab / optimal), per conversation
        self.shape_costs: dict = {}  # measured drafting/verify times per tree shape: kept across conversations
        self.verify_cost = None  # engine.costmodel.VerifyCost, calibrated on first use by a tree policy or gate
        self.gate = None  # engine.gate.DraftGate of the adaptive (:auto) strategies
        self._gated: str | None = None  # the gate's source of this step's draft
        self._gated_chain = False  # this step drafted a mixed chain (hybrid:K, _mixed_chain)
        self._drafted_nodes = 0  # nodes drafted this step, before a confidence cut (gate.choose)
        self._last_emitted = 1  # tokens the last step emitted
        # this step's measured arm (gate.with_drafter, gate.drafting_pays): ("tree" | "chain", whether
        # the drafter model ran), None for none
        self._arm_used: tuple[str, bool] | None = None
        self._arm_excess_ms = 0.0  # and the drafter's catch-up beyond a steady step's (_catch_up_excess)
        self._turn_start = 0  # the context's length when the reply began (start)
        # drafting beside a target whose passes are torch's (bf16 on a CPU) runs the drafter's C
        # kernels on this thread alone (engine.native.capped says why); beside the C pass, on its pool
        table = getattr(self.target, "_native_table", None)
        dev = getattr(self.target, "device", None) or getattr(getattr(self.target, "embed", None), "device", "cpu")
        cpu = torch.device(dev).type == "cpu"
        self.draft_threads: int | None = 1 if cpu and (table is None or table() is None) else None
        from .feature_head import FeatureHead

        head = self.drafter_model if isinstance(self.drafter_model, FeatureHead) else None
        if head is not None:
            self.drafter_model = None  # (no CausalLM of its own: it drafts from the target's rows)
        if self.drafter_model is not None:
            dm = self.drafter_model
            if dm is self.target or getattr(dm, "cache", None) is self.target.cache:
                dm = dm.with_own_cache()  # self-drafting: shared weights, separate cache
            from .drafters.vocab import BridgeDrafter, same_vocabulary

            if same_vocabulary(self.target_tokenizer, self.drafter_tokenizer):
                self.drafters["model"] = ModelDrafter(dm, self.target.vocab_size, draft_vocab=getattr(dm, "draft_vocab", None))
            else:
                self.drafters["model"] = BridgeDrafter(dm, self.target_tokenizer, self.drafter_tokenizer, self.target.vocab_size)
        self.features = None  # a feature drafter (attach_feature_head): fed the target's hidden rows
        if head is not None:
            self.attach_feature_head(head)

    def attach_feature_head(self, head) -> None:
        """Draft with ``head`` (engine/feature_head.FeatureHead) from this target's own hidden rows
        (engine/drafters/feature.py): it becomes the "model" drafter. Needs a target whose passes
        run ``CausalLM._run`` (the Transformer families) and a fresh conversation."""
        from .drafters.feature import FeatureDrafter
        from .models.base import CausalLM

        t = self.target
        embed = getattr(t, "embed", None)
        if type(t)._run is not CausalLM._run or not isinstance(embed, torch.Tensor):
            raise SpecchatError(f"a feature head drafts from a Transformer target's hidden rows; {type(t).__name__} has none to give")
        D = int(embed.shape[1])
        if head.cfg["hidden"] != D:
            raise SpecchatError(f"this feature head reads {head.cfg['hidden']}-wide hidden rows; the target's are {D} wide")
        with torch.inference_mode():  # the head's rows (V, D) whatever the family keeps (a tied embedding, a packed head)
            lm = t.logits(torch.eye(D, dtype=t.compute_dtype)).t().contiguous()
        self.reset()
        self.features = FeatureDrafter(head, embed, lm, t.cache.capacity)
        self.drafters["model"] = self.features

    def _feed_features(self, rows: torch.Tensor) -> None:
        """The target's hidden rows of the positions just committed (in order) to the feature drafter."""
        fd = self.features
        if fd.n_feat + rows.shape[0] != self.target.cache.length:
            fd.truncate(min(fd.n_feat, self.target.cache.length))  # misaligned: it drafts nothing until reset
            return
        fd.append(rows)

    @property
    def bridged(self) -> bool:
        """The drafter model speaks another vocabulary (a bridge translates its drafts)."""
        from .drafters.vocab import BridgeDrafter

        return isinstance(self.drafters.get("model"), BridgeDrafter)

    @property
    def has_drafter_model(self) -> bool:
        return "model" in self.drafters

    @property
    def context_length(self) -> int:
        return self.target.cache.capacity

    def reset(self) -> None:
        self.target.cache.reset()
        self.history = []
        self._pending = []
        self.policies = {}
        # acceptance is learnt per conversation, like the tree policies; the drafters' calibration carries over
        self.gate = self.gate.carried() if self.gate is not None else None
        for d in self.drafters.values():
            d.reset()

    # ---- prompt --------------------------------------------------------------------------------------------
    def start(self, prompt_ids: Sequence[int], stop: threading.Event | None = None) -> float:
        """Make ``prompt_ids`` the context; reuse the cached common prefix (multi-turn chat).
        Returns prefill seconds. The last prompt token stays pending (the first step's root).

        ``stop`` is checked before each PREFILL_PIECE tokens of prefill (a long prompt runs ~900
        tokens a second on a 2-core CPU): once set, the context is the prefix prefilled so far
        (``prefilled``), which a later ``start`` reuses, and ``steps`` stops at once. The pieces
        are the model's own prefill chunks, so the cache holds the same bits either way."""
        prompt_ids = [int(t) for t in prompt_ids]
        if not prompt_ids:
            raise SpecchatError("empty prompt: nothing to continue from")
        if len(prompt_ids) >= self.context_length:
            n = len(prompt_ids)
            fix = "shorten it" if n > 1 else "raise --max-context"
            raise ContextOverflowError(f"prompt is {n} token{'s' if n != 1 else ''} but the context holds "
                                       f"{self.context_length} (a reply needs room for one more); {fix}")
        V = self.target.vocab_size
        bad = [t for t in prompt_ids if t < 0 or t >= V]
        if bad:
            raise SpecchatError(f"token id {bad[0]} is outside the model's vocabulary (0..{V - 1})")
        cache = self.target.cache
        n = 0
        limit = min(cache.length, len(prompt_ids) - 1)
        while n < limit and self.history[n] == prompt_ids[n]:
            n += 1
        self._pending = []
        if n != cache.length and not getattr(cache, "prefix_rollback", False):
            n = 0  # a recurrent state cannot return to an earlier prefix: rebuild it
        cache.rollback(n)
        fd = self.features
        if fd is not None:
            fd.truncate(n)
        t0 = time.perf_counter()
        todo = prompt_ids[n:-1]
        piece = len(todo) if stop is None else PREFILL_PIECE
        done = 0
        try:
            with self.target.logging_hidden(fd is not None) as log:
                while done < len(todo):
                    if stop is not None and stop.is_set():
                        break
                    self.target.prefill(todo[done:done + piece])
                    done += min(piece, len(todo) - done)
            if log:
                self._feed_features(torch.cat(log))
        except BaseException:
            if fd is not None:
                fd.truncate(min(fd.n_feat, cache.length))
            # an error between pieces (out of memory on a long prompt): the chat goes on, so the history
            # must say what the cache holds now (the next start compares them), or nothing where unsure
            if cache.length == n + done:
                self.history = prompt_ids[:n + done + 1]
            else:
                cache.reset()
                self.history = []
            raise
        self.history = prompt_ids if done == len(todo) else prompt_ids[:n + done + 1]
        self.prefilled = done
        self._turn_start, self._last_emitted = len(self.history), 1
        return time.perf_counter() - t0

    # ---- steps ------------------------------------------------------------------------------------------------
    def steps(
        self,
        strategy: Strategy | Callable[[], Strategy],
        max_new_tokens: int,
        stop: threading.Event | None = None,
        stop_strings: Sequence[str] = (),
    ) -> Iterator[StepEvent]:
        """Yield one StepEvent per target forward until EOS, max_new_tokens, a full context or stop.

        ``stop_strings``: the reply ends with the token that completes the first of these texts
        (finish reason "stop_string"; the text holds it, as transformers' ``stop_strings`` keeps
        it); a step's accepted drafts after that token are dropped, so every strategy stops at the
        same token (it needs the tokenizer: ``detokenize``)."""
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        get = strategy if callable(strategy) else (lambda: strategy)
        s0 = get()
        gen = torch.Generator().manual_seed(int(s0.seed))
        decoder = self.detokenize() if self.detokenize else None
        stops = [x for x in stop_strings if x]
        if stops and decoder is None:
            raise SpecchatError("--stop needs the model's tokenizer to read its text (this model has none)")
        tail = ""  # the reply's last characters, where a stop string may have begun
        produced = 0
        step = 0
        while True:
            if stop is not None and stop.is_set():
                yield self._final(step, get(), decoder, "stopped")
                return
            s = get()
            room = self.context_length - len(self.history)
            if room <= 0:
                yield self._final(step, s, decoder, "context")
                return
            if produced >= max_new_tokens:  # (max_new_tokens 0: no draft, no verify pass for the gate to book)
                yield self._final(step, s, decoder, "length")
                return
            if (s.name in ("mab", "optimal") or s.adaptive) and self.verify_cost is None:
                self.calibrate()
            t0 = time.perf_counter()
            # whether the drafter model ran, where a measured arm decided, and its catch-up excess (set by _draft)
            self._arm_used, self._arm_excess_ms = None, 0.0
            # the pass holds the root, a joint step's pending chain and the tree (unrolled: a chain per leaf)
            cap = min(room - 1, 256, getattr(self.target.cache, "max_scratch", 512) - 1 - len(self._pending))
            with native.capped(self.draft_threads):
                tree, draft_s = self._draft(s, gen, cap)
            if s.ssm_tree == "unrolled":
                tree = tree.truncated(unrolled_fit(tree.parents, cap))
            t1 = time.perf_counter()
            logits, commit = self._verify_pass(s, tree, self.history[-1])
            path, bonus = self._verify(s, tree, logits, gen)
            commit([0] + [i + 1 for i in path])
            t2 = time.perf_counter()
            policy = self._book(s, tree, path, draft_s * 1000.0, (t2 - t1) * 1000.0)
            if s.adaptive and self.gate is not None:
                self.gate.observe_step(len(tree) + 1, (t2 - t1) * 1000.0)
                if self._arm_used is not None:  # what the drafter model brings, measured (gate.with_drafter)
                    arm, used = self._arm_used
                    self.gate.observe_mixed(used, len(path) + 1,
                                            max(0.0, draft_s * 1000.0 - self._arm_excess_ms) + (t2 - t1) * 1000.0, arm)
            if self._gated_chain and len(tree):
                self.gate.observe("chain", tree.max_depth, len(path), draft_s * 1000.0, len(tree), tree.confidence,
                                  tree.parents, path)
                sc = getattr(self.drafter_model, "chain_scorer", None)  # what chose each token (the dashboard's policy box)
                policy = {"policy": "mixed chain", "confidence": list(tree.confidence), "accepted": len(path),
                          "ranked_by": "scorer" if sc is not None else "calibration",
                          **({"fitted_on": sc.meta.get("fitted_on")} if sc is not None else {})}
            if s.adaptive and self._gated is not None:
                self.gate.observe(self._gated, tree.max_depth if len(tree) else 0, len(path), draft_s * 1000.0,
                                  max(self._drafted_nodes, len(tree)), tree.confidence, tree.parents, path)
                policy = dict(self.gate.last)
            emitted = tree.path_tokens(path) + [bonus]
            reason = None
            for j, t in enumerate(emitted):
                if t in self.eos_ids:
                    emitted = emitted[: j + 1]
                    reason = "eos"
                    break
            if stops and emitted:
                cut = _stop_cut(decoder, emitted, tail, stops, self.eos_ids)
                if cut is not None:  # (before EOS or at it: the text ends here either way)
                    emitted, reason = emitted[:cut], "stop_string"
            if produced + len(emitted) >= max_new_tokens:
                if len(emitted) > max_new_tokens - produced:
                    reason = None  # an EOS beyond the limit is cut with the rest: plain decoding ends on "length" there
                emitted = emitted[: max_new_tokens - produced]
                reason = reason or "length"
            produced += len(emitted)
            self.history.extend(emitted)
            self._last_emitted = len(emitted)
            if self.target.cache.length > len(self.history) - 1:  # tokens cut after EOS/limit
                self.target.cache.rollback(len(self.history) - 1)
                if self.features is not None:
                    self.features.truncate(self.target.cache.length)
            if len(self._pending) > len(self.history) - 1 - self.target.cache.length:
                self._pending = self._pending[: len(self.history) - 1 - self.target.cache.length]
            # Two segments, so the UI can colour drafted-and-accepted text apart from the target's own token.
            if reason in (None, "length") and len(self.history) >= self.context_length:
                reason = "context"  # (also at the token limit: the app offers Continue after "length", which a full context refuses)
            n_acc = min(len(path), len(emitted))  # drafted tokens cut after an EOS or the limit: not emitted, not counted
            seg_acc = decoder.push([t for t in emitted[:n_acc] if t not in self.eos_ids]) if decoder else ""
            seg_tgt = decoder.push([t for t in emitted[n_acc:] if t not in self.eos_ids]) if decoder else ""
            if reason and decoder:
                seg_tgt += decoder.flush()  # the last reply text holds every byte, an unfinished character's too
            text = seg_acc + seg_tgt
            if stops:
                tail = (tail + text)[-max(map(len, stops)):]
            step += 1
            ms = (t2 - t0) * 1000.0
            yield StepEvent(
                step=step, strategy=s.label(self.tree_nodes(s)), drafted=len(tree), accepted=n_acc, emitted=emitted, text=text,
                tree_tokens=list(tree.tokens), tree_parents=list(tree.parents), accepted_nodes=list(path[:n_acc]),
                draft_ms=draft_s * 1000.0, verify_ms=(t2 - t1) * 1000.0, ms=ms, position=len(self.history),
                finished=reason is not None, finish_reason=reason, rss_mb=peak_rss_mb(),
                segments=[(seg_acc, "accepted"), (seg_tgt, "target")],
                tree_text=[self.token_str(t) for t in tree.tokens] if self.token_str else [],
                gpu_mb=torch_gpu_mb(), shape=tree.widths(), accepted_ranks=[ranks[i] for i in path[:n_acc]] if (ranks := child_ranks(tree.parents)) else [],
                policy=policy, bridge=self._bridge_telemetry(s),
            )
            if reason is not None:
                return

    def _verify_pass(self, s: Strategy, tree: TokenTree, root: int):
        """One target forward over ``[root] + tree`` in the strategy's SSM modes; returns the
        logits (T + 1, V) and the commit to call with the accepted packed rows.

        --ssm-tree stree     the packed tree as is: one pass, shared prefixes computed once (STree).
        --ssm-tree unrolled  every root-to-leaf path as its own chain (repeated tokens): the
                             baseline of STree Table 1, in the same single pass.
        --backtrack replay   the model's commit (activation replay for SSM layers, KV compaction).
                   recompute re-run the accepted tokens through the model from the committed state.
                   joint     commit nothing now; prepend the accepted chain to the next pass, whose
                             commit then advances past it (Snakes and Ladders §3).
        """
        tokens, parents = tree.packed(root)
        rowmap = None
        if s.ssm_tree == "unrolled" and len(tree):
            tokens, parents, rowmap = unroll(tokens, parents)
        pre = self._pending  # a joint step's chain, even if the strategy has switched since
        m = len(pre)
        if m:
            tokens = pre + tokens
            parents = list(range(-1, m - 1)) + [p + m if p >= 0 else m - 1 for p in parents]
        fd = self.features
        with self.target.logging_hidden(fd is not None) as log:
            logits = self.target.verify(tokens, parents)
        rows_of = (lambda rows: rows) if rowmap is None else rowmap
        logits = logits[m:] if rowmap is None else logits[m:][rowmap(None)]

        def commit(rows: list[int]) -> None:
            new = [r + m for r in rows_of(rows)]
            if s.backtrack == "joint":
                self.target.commit(list(range(m)))  # the previous step's chain, advanced in this pass
                self._pending = [tokens[r] for r in new]
                if fd is not None:
                    self._feed_features(log[0][:m])
            elif s.backtrack == "recompute":
                done = [tokens[r] for r in range(m)] + [tokens[r] for r in new]
                self.target.cache.clear_scratch()
                with self.target.logging_hidden(fd is not None) as plog:
                    self.target.prefill(done)
                self._pending = []
                if fd is not None:
                    self._feed_features(torch.cat(plog))
            else:
                self.target.commit(list(range(m)) + new)
                self._pending = []
                if fd is not None:
                    self._feed_features(log[0][list(range(m)) + new])
        return logits, commit

    # ---- tree policies ------------------------------------------------------------------------------------
    def calibrate(self) -> None:
        """Measure the target's verify-cost curve t(n) on a separate cache (the conversation's
        state is untouched); the tree policies read it (STree §4)."""
        from .costmodel import calibrate

        from .costmodel import VerifyCost

        probe = self.target.with_own_cache()
        # a context capped below the probe's 64 + 32 + 1 rows (--max-context) measures what fits
        cap = getattr(probe, "max_context", None) or 1 << 30
        sizes = tuple(n for n in (1, 2, 4, 8, 16, 32) if n + 2 <= cap)
        try:
            if len(sizes) >= 2:
                self.verify_cost = calibrate(probe, sizes=sizes, prefix=min(64, cap - max(sizes) - 1), repeats=3)
            else:  # a context of 3 rows or fewer: nothing to compare, a flat curve (any unit)
                self.verify_cost = VerifyCost(1.0, 0.0)
        finally:
            probe.cache = None

    def _policy(self, s: Strategy):
        if s.name == "mab":
            key = ("mab", s.arms, s.lambda_ucb)
            if key not in self.policies:
                self.policies[key] = ShapeBandit.of(s.arms, s.lambda_ucb, self.verify_cost, memory=self.shape_costs)
        else:
            key = ("optimal", s.node_budget)
            if key not in self.policies:
                self.policies[key] = OptimalTree(node_budget=s.node_budget, cost=self.verify_cost)
        return self.policies[key]

    def _book(self, s: Strategy, tree: TokenTree, path: list[int], draft_ms: float, verify_ms: float) -> dict | None:
        """Give the step's outcome to the strategy's tree policy; return its telemetry."""
        if s.name not in ("mab", "optimal") or not len(tree):
            return None
        pol = self._policy(s)
        if s.name == "mab":
            pol.observe(tree.parents, path)
            pol.update(self._last_shape, len(path) + 1, draft_ms, verify_ms, len(tree) + 1)
        else:
            pol.update(tree.parents, path)
        return pol.snapshot()

    def _bridge_telemetry(self, s: Strategy) -> dict | None:
        if s.name == "ar" or s.drafter != "model" or not self.bridged:
            return None
        return dict(self.drafters["model"].last) or None

    def _final(self, step: int, s: Strategy, decoder, reason: str) -> StepEvent:
        text = decoder.flush() if decoder else ""
        return StepEvent(step=step, strategy=s.label(self.tree_nodes(s)), drafted=0, accepted=0, emitted=[], text=text,
                         position=len(self.history), finished=True, finish_reason=reason, rss_mb=peak_rss_mb())

    def _noise(self, s: Strategy, base: int) -> Callable[[int], torch.Tensor]:
        V = self.target.vocab_size
        return lambda d: race_noise(int(s.seed), base + d, V)

    def _budget(self, s: Strategy, source: str, k_max: int, by_confidence: bool = False) -> int:
        """An adaptive strategy's draft length for ``source`` now (engine/gate.py), else k_max;
        ``by_confidence``: k_max, the draft's own confidence cut (gate.choose) deciding instead."""
        if not s.adaptive:
            return k_max
        self._the_gate()
        self._gated = source
        if by_confidence:
            return self.gate.open_by_confidence(source, k_max)
        return self.gate.budget(source, k_max)

    def _the_gate(self):
        """The conversation's DraftGate, made on first use; one a mixed chain (hybrid:K) made before
        the verify cost was measured gets it once it is."""
        if self.gate is None:
            from .gate import DraftGate

            self.gate = DraftGate(self.verify_cost)
        elif self.gate.cost is None:
            self.gate.cost = self.verify_cost
        return self.gate

    def _draft(self, s: Strategy, gen: torch.Generator, max_nodes: int) -> tuple[TokenTree, float]:
        self._gated = None
        self._gated_chain = False  # a mixed chain (hybrid:K) whose calibration learns from this step
        self._drafted_nodes = 0  # nodes drafted this step, before a confidence cut
        if s.name == "ar" or max_nodes <= 0:
            return TokenTree.empty(), 0.0
        drafter = self.drafters.get(s.drafter)
        if drafter is None:
            raise StrategyError(f"strategy {s.name!r} needs a drafter model: none is loaded")
        t0 = time.perf_counter()
        if s.name == "hybrid" and s.adaptive and self._mixes(drafter):
            return self._mixed_tree(s, drafter, max_nodes, t0)
        if s.name == "hybrid" and s.greedy and s.verify in ("auto", "greedy") and self._mixes(drafter):
            return self._mixed_chain(s, drafter, max_nodes, t0)
        if s.name == "hybrid":
            # prompt lookup first: where the context repeats itself (summaries, rewrites, code,
            # SQL) matched continuations are free to draft and long (up to ngram_branches of them,
            # a trie, as pld drafts them); elsewhere the drafter model's chain. (Measured: adding
            # the model's chain to every lookup tree as one more branch cost more than it won.)
            req = DraftRequest(shape=(s.ngram_branches,) + (1,) * (HYBRID_NGRAM_LEN - 1), max_nodes=max_nodes,
                               ngram_min=s.ngram_min, ngram_max=s.ngram_max)
            tree = self.drafters["ngram"].propose(self.history, req)
            if len(tree):
                if not s.adaptive:
                    return tree, time.perf_counter() - t0
                k = self._budget(s, "ngram", min(len(tree), max_nodes))
                if k:
                    return tree.truncated(k), time.perf_counter() - t0
                # the gate has shut lookup off for now: the drafter model's chain, if it pays
        k = s.draft_len
        v = s.resolved_verify()
        mode = "race" if v == "race" else ("greedy" if s.greedy or v == "membership" else "sample")
        confident = corpus = False
        if s.adaptive:  # validate() allows it for sd / pld / hybrid only
            source = "ngram" if s.name == "pld" else "model"
            corpus = s.name == "pld" and getattr(drafter, "corpus", None) is not None
            # (with a datastore the chain costs microseconds and its own confidence cut decides,
            # a plain step included; the acceptance-rate gate would shut the copies off with it)
            # (a datastore's tree is capped at tree_nodes, not draft_len: the dashboard shows that cap)
            k = self._budget(s, source, min(s.tree_nodes if corpus else s.draft_len, max_nodes), by_confidence=corpus)
            if k == 0:
                if source == "model" and not self.bridged:  # a plain step: the measure of the arm without the drafter too
                    self._arm_used = ("chain", False)
                return TokenTree.empty(), time.perf_counter() - t0
            if source == "model" and not self.bridged:
                # whether running the drafter pays here at all, as measured (gate.drafting_pays):
                # the tokens it would catch up on beyond a steady step's (the last step's), counted
                # from the reply's start (a bridged drafter drafts in its own tokens: not measured;
                # the acceptance gate's probe drafts, or the probe would be lost)
                seen = max(len(getattr(drafter, "seen", ())), self._turn_start)
                lag = len(self.history) - seen - self._last_emitted
                use = True if self.gate.last.get("probe") else self.gate.drafting_pays(lag)
                self._arm_used = ("chain", use)
                self.gate.last.update(drafting=use, rates=self.gate.arm_rates("chain"))
                if not use:
                    self.gate.last["k"] = 0
                    return TokenTree.empty(), time.perf_counter() - t0
            # a drafter model's greedy chain, or prompt lookup continued from the target's n-gram
            # datastore: up to the full length, cut by the draft's own confidence (gate.py)
            confident = source == "model" and mode == "greedy" and getattr(drafter, "supports_confidence", False)
            if confident or corpus:
                k = min(s.draft_len, max_nodes)
        shape = tuple(s.tree) if s.name == "tree" else (1,) * k
        plan = None
        if s.name == "pld" and s.ngram_branches > 1 and not corpus:
            shape = (s.ngram_branches,) + (1,) * (k - 1)
            if s.adaptive:
                max_nodes = min(max_nodes, k)
        elif s.name == "mab":
            shape = self._policy(s).choose()
        elif s.name == "optimal":
            plan = self._policy(s).choose(max_nodes)
            shape = (1,) * plan_depth(plan)
        self._last_shape = shape
        if corpus:  # a best-first tree from the datastore, up to the larger of the length and node caps
            max_nodes = min(s.tree_nodes, max_nodes)
        req = DraftRequest(shape=shape, mode=mode, temperature=s.temperature, **s.filters, generator=gen,
                           noise_at_depth=self._noise(s, len(self.history)) if mode == "race" else None,
                           max_nodes=max_nodes, ngram_min=s.ngram_min, ngram_max=s.ngram_max, plan=plan,
                           vocab=s.resolved_vocab(bridged=s.drafter == "model" and self.bridged),
                           confidence=confident or corpus, corpus=corpus,
                           keep_going=self.gate.keep_going("model") if confident else None,
                           calibrate=(lambda p: self.gate.calibrated("ngram", p)) if corpus else None,
                           worth=self.gate.worth("ngram") if corpus else None)
        try:
            tree = drafter.propose(self.history, req)
        except OverflowError:  # the drafter's context is full (a smaller one than the target's): plain steps go on
            self._drafted_nodes = 0
            return TokenTree.empty(), time.perf_counter() - t0
        except ValueError as e:
            from .drafters.vocab import BridgeError

            if isinstance(e, BridgeError):
                raise StrategyError(str(e)) from None
            raise
        self._drafted_nodes = len(tree)
        if self._arm_used is not None:  # booked without the catch-up on the tokens of steps without it
            synced, sync_ms = getattr(drafter, "caught_up", 0), getattr(drafter, "sync_ms", 0.0)
            self._arm_excess_ms = self._catch_up_excess(synced, sync_ms)
            self.gate.observe_catch_up(synced, sync_ms)
        if corpus and not len(tree):
            self.gate.choose(self._gated, [], 0.0)  # nothing drafted: a plain step (counts toward the next probe)
        if (confident or corpus) and tree.confidence:
            tree = tree.truncated(self.gate.choose(self._gated, tree.confidence, (time.perf_counter() - t0) * 1000.0,
                                                   tree.parents))
        return tree, time.perf_counter() - t0

    def tree_nodes(self, s: Strategy) -> int | None:
        """The node cap of the best-first trees ``s`` drafts (pld:auto and hybrid:auto with a
        datastore), for its label; None for chains."""
        if not s.adaptive or s.name not in ("pld", "hybrid") or getattr(self.drafters.get("ngram"), "corpus", None) is None:
            return None
        if s.name == "hybrid" and not self._mixes(self.drafters.get(s.drafter)):
            return None
        return s.tree_nodes

    def _mixes(self, drafter) -> bool:
        """hybrid:auto grows one tree from the context's copy, the datastore and the drafter model
        together where it can: a datastore is attached and the drafter shares the target's
        vocabulary (a bridged drafter drafts strings, not target tokens)."""
        return (getattr(self.drafters.get("ngram"), "corpus", None) is not None and hasattr(drafter, "spine")
                and not self.bridged)

    def _mixed_tree(self, s: Strategy, drafter, max_nodes: int, t0: float) -> tuple[TokenTree, float]:
        """hybrid:auto with a datastore: a tree grown best first over the proposals of the
        context's latest match, the datastore and the drafter model (stepped along the path the
        tree favours), each calibrated to acceptance on its own (NgramDrafter.corpus_tree,
        engine/gate.py), then cut to the prefix with the most expected tokens per ms. Deterministic
        drafts: greedy verification, or membership when sampling (lossless either way)."""
        cap = min(s.tree_nodes, max_nodes)
        self._budget(s, "tree", cap, by_confidence=True)
        gate = self.gate
        use = gate.with_drafter()  # whether the drafter model pays here (measured, engine/gate.py)
        spine = None
        if use:
            try:
                spine = drafter.spine(self.history)
            except OverflowError:  # the drafter's context is full: the copy and the datastore go on alone
                use = False
        tree = self.drafters["ngram"].corpus_tree(self.history, cap, lambda p: gate.calibrated("tree", p), gate.worth("tree"),
                                                  ngram_min=s.ngram_min, ngram_max=s.ngram_max,
                                                  spine=spine)
        excess = 0.0
        if spine is not None:
            excess = self._catch_up_excess(spine.synced, spine.sync_ms)
            gate.observe_drafter(spine.spent_ms - excess)
        gate.last.update(drafter=use, drafter_ms=round(gate.drafter_ms or 0.0, 2), step_ms=round(gate.at(1), 2))
        # the step's outcome is booked without the catch-up on tokens of steps that went without it
        self._arm_used, self._arm_excess_ms = ("tree", use), excess
        self._drafted_nodes = len(tree)
        spent = (time.perf_counter() - t0) * 1000.0
        if not len(tree):
            gate.choose("tree", [], 0.0)  # nothing drafted: a plain step (counts toward the next probe)
            return tree, time.perf_counter() - t0
        return tree.truncated(gate.choose("tree", tree.confidence, spent, tree.parents)), time.perf_counter() - t0

    def _mixed_chain(self, s: Strategy, drafter, max_nodes: int, t0: float) -> tuple[TokenTree, float]:
        """hybrid:K, greedy, with a datastore: a chain of K tokens, each the likeliest right of the
        candidates at its depth (NgramDrafter.corpus_tree's chain): the context's copy, the
        datastore's top continuations and the drafter model's top tokens (stepped along the chain),
        each kind calibrated to acceptance on its own from the verified chains (engine/gate.py;
        source "chain", no cost cut: K is the length), or, where the drafter ships a chain scorer
        (engine/chain_scorer.py), the candidate it scores highest from all sources together.
        Offline on the evaluation replies, a chain of 5 so chosen accepts ~2.5 tokens a step where
        the drafter's own chain accepts ~2.05 (bench/results/2026-11-29-session37; with the scorer,
        2.57 end to end: session39). Greedy verification: lossless."""
        gate = self._the_gate()  # only its calibration is used here
        try:
            spine = drafter.spine(self.history)
        except OverflowError:  # the drafter's context is full: the copy and the datastore go on alone
            spine = None
        tree = self.drafters["ngram"].corpus_tree(self.history, min(s.draft_len, max_nodes),
                                                  lambda p: gate.calibrated("chain", p), None, ngram_min=s.ngram_min,
                                                  ngram_max=s.ngram_max, spine=spine, chain=True,
                                                  scorer=getattr(self.drafter_model, "chain_scorer", None))
        self._gated_chain = True
        self._drafted_nodes = len(tree)
        return tree, time.perf_counter() - t0

    def _windows(self, tree: TokenTree, n: int) -> list[list[int]]:
        """The last ``n`` tokens of each verify row's context: row 0 the history's, row i + 1 the
        history followed by the path to node i (``repeat_penalized``)."""
        tail = self.history[-n:]
        return [tail] + [(tail + tree.path_tokens(tree.path_to(i)))[-n:] for i in range(len(tree))]

    def _catch_up_excess(self, synced: int, sync_ms: float) -> float:
        """Milliseconds of this step's drafter catch-up (``synced`` tokens in ``sync_ms``) beyond
        what a drafter used every step would have spent (the last step's tokens): after steps
        without it, or at a reply's start, it catches up on many tokens at once, which says
        nothing of what it costs when used."""
        if synced <= 0:
            return 0.0
        steady = min(1.0, max(1, self._last_emitted) / synced)
        return sync_ms * (1.0 - steady)

    def _verify(self, s: Strategy, tree: TokenTree, logits: torch.Tensor, gen: torch.Generator) -> tuple[list[int], int]:
        v = s.resolved_verify()
        logits = logits.float()
        if s.repeat_penalty != 1.0:  # each row penalised over its own context: the history, then its path
            logits = repeat_penalized(logits, self._windows(tree, s.repeat_last_n), s.repeat_penalty)
        if not s.greedy and s.drafter == "model" and self.bridged and s.resolved_vocab(bridged=True) == "slrs":
            # string-level rejection sampling (heterogeneous-vocab Alg. 3): the bridge holds each
            # position's procedure start, to compute ψ; an empty chain is an ∅ proposal (rejected)
            return self.drafters["model"].slrs_verify(tree, logits, s.temperature, generator=gen, history=self.history,
                                                      **s.filters)
        if len(tree) == 0 and not tree.rejected_rows:  # (an empty union chain drew outside T: rejected, below)
            noise = race_noise(int(s.seed), len(self.history), self.target.vocab_size) if v == "race" and not s.greedy else None
            return [], sample_next(logits[0], s.temperature, generator=gen, noise=noise, **s.filters)
        method = v
        if v == "rs" and tree.max_depth != len(tree):  # not a chain: multi-step sampling is the tree form
            method = "mss"
        if method in ("rs", "mss") and tree.draft_probs is None:
            method = "membership"
        return accept(tree, logits, method=method, temperature=s.temperature, **s.filters, generator=gen,
                      noise_at_depth=self._noise(s, len(self.history)) if method == "race" else None)


def _stop_cut(decoder, emitted: Sequence[int], tail: str, stops: Sequence[str], eos_ids) -> int | None:
    """How many of this step's ``emitted`` tokens end the reply at a stop string: the count up to
    the token whose text completes one (the text before the step ending in ``tail``), or None.
    A fork of the streaming detokeniser (tokenizer.StreamDecoder) takes the tokens one at a time,
    the characters it holds back counted (end-of-turn tokens add no text, as in the reply); the
    step's own pushes then run on the real one."""
    probe = decoder.fork()
    text = tail
    for j, t in enumerate(emitted):
        if t not in eos_ids:
            text += probe.push([t])
            if any(x in text + probe.held() for x in stops):
                return j + 1
    return None


def unrolled_fit(parents: list[int], rows: int) -> int:
    """The most leading nodes of a tree (parents: -1 = the root) whose unrolled form (one chain
    per root-to-leaf path, :func:`unroll`) takes at most ``rows`` rows: a shape that fits as a tree
    can take several times its nodes unrolled (--ssm-tree unrolled failed with "context full" in a
    reply's last rows, and with "draft tree too large" on trees the strategy allows)."""
    depth: list[int] = []
    is_leaf: list[bool] = []
    total = 0
    for i, p in enumerate(parents):
        d = 1 if p < 0 else depth[p] + 1
        grown = d - (depth[p] if p >= 0 and is_leaf[p] else 0)  # a leaf's chain grows, or a new chain
        if total + grown > rows:
            return i
        total += grown
        if p >= 0:
            is_leaf[p] = False
        depth.append(d)
        is_leaf.append(True)
    return len(parents)


def unroll(tokens: list[int], parents: list[int]):
    """Rewrite a packed tree (row 0 = root) as one chain per root-to-leaf path hanging off the
    root. Returns (tokens, parents, rowmap): rowmap(None) lists, for each original row, a row of
    the unrolled pass with the same ancestors (same logits); rowmap(rows) maps an accepted
    root-to-node chain of original rows onto one unrolled chain."""
    n = len(tokens)
    has_child = [False] * n
    for p in parents[1:]:
        has_child[p] = True
    out_t, out_p = [tokens[0]], [-1]
    first = [0] * n
    chains: list[dict[int, int]] = []  # per leaf: original row -> unrolled row
    for leaf in range(1, n):
        if has_child[leaf]:
            continue
        path = []
        r = leaf
        while r > 0:
            path.append(r)
            r = parents[r]
        prev, copy = 0, {0: 0}
        for r in reversed(path):
            out_t.append(tokens[r])
            out_p.append(prev)
            prev = len(out_t) - 1
            copy[r] = prev
            if not first[r]:
                first[r] = prev
        chains.append(copy)

    def rowmap(rows):
        if rows is None:
            return first
        chain = next(c for c in chains if rows[-1] in c)
        return [chain[r] for r in rows]

    return out_t, out_p, rowmap


def run_generation(decoder: Decoder, prompt_ids: Sequence[int], strategy, max_new_tokens: int,
                   stop: threading.Event | None = None, stop_strings: Sequence[str] = ()) -> tuple[list[StepEvent], GenerationSummary]:
    """Convenience for the CLI/bench/tests: run to completion and summarise."""
    summary = GenerationSummary()
    summary.prefill_s = decoder.start(prompt_ids)
    events = []
    for ev in decoder.steps(strategy, max_new_tokens, stop, stop_strings):
        events.append(ev)
        summary.add(ev)
    return events, summary
