"""ChatSession: the one object the UI and the CLI drive. Everything model-related is loaded here.

Contract used by the UI (app/ never imports torch; it imports this module inside a worker thread):

    session = ChatSession.load(target="smollm2-135m-instruct", drafter=None, strategy="sd")
    session.strategy = session.strategy.replace(name="tree")      # any time; read once per step
    for ev in session.stream_chat(messages, max_new_tokens=256, stop=threading.Event()):
        ...                                                         # engine.events.StepEvent

``messages`` is a list of {"role": "system"|"user"|"assistant", "content": str}; the model's chat
template renders them (a last assistant message is a reply to continue: ``continues_reply``); where they
no longer fit the context with room for the reply, the oldest turns are left out
(``fit_to_context``; the first event's ``dropped_messages`` says how many).
``stop.set()`` ends the reply after the current step (finish_reason "stopped"); the partial reply
stays valid.
"""

from __future__ import annotations

import hashlib
import threading
from array import array
from pathlib import Path
from dataclasses import dataclass
from typing import Iterator, Protocol

from .events import StepEvent
from .strategy import Strategy

LONG_BASELINE_CONTEXT = 512  # tokens of context of the plain-decoding baseline's second measure (~1.3 s of
# prefill for SmolLM2 q8 on a 2-core AVX2 EPYC: the measure took 3.6 s with 1,024, 0.7 s without)


class ChatEngine(Protocol):
    """What the UI needs from a session (a fake implements it in tests)."""

    strategy: Strategy
    description: str  # e.g. "SmolLM2-135M-Instruct (GGUF Q4_1) <- drafter: ..."
    context_length: int
    has_drafter: bool

    def stream_chat(
        self, messages: list[dict[str, str]], max_new_tokens: int, stop: threading.Event
    ) -> Iterator[StepEvent]: ...

    # optional: measure_baseline(new_tokens, stop, strategy=) -> Baseline (plain-decoding tok/s for the speedup,
    # sampling as ``strategy`` does)
    # optional: strategy_label(strategy=None) -> str (the label its steps carry; see strategy_label below)


def strategy_label(session, strategy: Strategy | None = None) -> str:
    """The label a status line shows for ``strategy`` (default: the session's current one): the same
    text the session's StepEvents carry (``pld tree<=16 auto`` where the strategy drafts datastore
    trees), for any ChatEngine; a session without ``strategy_label`` gets the plain label."""
    s = strategy if strategy is not None else session.strategy
    own = getattr(session, "strategy_label", None)
    return own(s) if callable(own) else s.label()


class ChatSession:
    """A loaded target (+ optional drafter model) behind the ChatEngine contract."""

    def __init__(self, target, drafter=None, strategy: Strategy | None = None, registry=None):
        from .generate import Decoder

        self.target = target  # engine.loading.Loaded
        self.drafter = drafter  # engine.loading.Loaded | None
        self.registry = registry
        self.drafter_error: str | None = None  # load(): why the registry's paired drafter is not in
        tok = target.tokenizer
        self.tokenizer = tok
        self.decoder = Decoder(
            target.model,
            drafter.model if drafter is not None else None,
            eos_ids=set(tok.eos_ids) if tok is not None else set(),
            detokenize=(lambda: _stream_decoder(tok)) if tok is not None else None,
            token_str=tok.token_str if tok is not None else None,
            target_tokenizer=tok,
            drafter_tokenizer=drafter.tokenizer if drafter is not None else None,
        )
        self.strategy = strategy or default_strategy(self.has_drafter)
        # stream_chat: how many replies each recent prompt (a digest of its ids) has drawn, so a
        # regenerate draws anew even after a Continue or another chat's turns came in between
        self._draws: dict[bytes, int] = {}

    # ---- construction ------------------------------------------------------------------------------
    @classmethod
    def load(cls, target: str | None = None, drafter: str | None = None, strategy: str | Strategy | None = None,
             models_file: str | None = None, dtype: str | None = None, max_context: int | None = None,
             datastore: str | None = None) -> "ChatSession":
        """``datastore``: an n-gram datastore for ``pld:auto`` (engine/drafters/corpus.py): a .npz
        path, "none", or None for the target's registry entry's own (used only where it was built
        with the target's tokenizer)."""
        from .errors import SpecchatError
        from .loading import load
        from .registry import load_registry
        from .strategy import from_spec

        reg = load_registry(models_file)
        target_ref = target or default_target_name(reg)
        tgt = load(target_ref, dtype=dtype, registry=reg, max_context=max_context)
        drf = None
        drafter_ref = drafter
        pairing = None
        if drafter_ref is None:
            pairing = reg.default_pairing(tgt.name)
            drafter_ref = pairing.drafter if pairing else None
        drafter_error = None
        if drafter_ref and drafter_ref not in ("ngram", "none"):
            try:
                from .models.common import loading_a_drafter

                from .feature_head import feature_head_dir, load_feature_head

                head_dir = feature_head_dir(drafter_ref, reg)
                if head_dir is not None:  # a draft head reading the target's hidden rows (engine/drafters/feature.py)
                    drf = load_feature_head(head_dir, tgt)
                else:
                    with loading_a_drafter():  # its fast path whatever the target's measure chose
                        drf = load(drafter_ref, dtype=_drafter_dtype(tgt.model), registry=reg, max_context=max_context)
                    check_bridgeable(tgt, drf)
                    _unbounded_if_ssm(drf)
            except SpecchatError as e:
                if drafter is not None:  # named by the user: their request fails, saying it was the drafter
                    raise _as_drafters(e, drafter_ref) from None
                # the registry's pairing: a chat never fails to start over a drafting aid
                drafter_error = f"the paired drafter {drafter_ref!r} was not loaded: {e}"
                drf, pairing = None, None
        if drf is not None:
            _drafter_weights(drf)
            if pairing is None:  # a drafter named explicitly: its registered pairing's measured strategy, if any
                pairing = reg.pairing(tgt.name, drf.name)
        strat = strategy if isinstance(strategy, Strategy) else (from_spec(strategy) if strategy else None)
        if strat is not None and drafter_ref == "ngram" and strat.drafter == "model":
            strat = strat.replace(drafter="ngram")
        best = pairing.strategy_for(tgt.compute) if pairing is not None else None
        if strat is None and best and drf is not None:
            strat = from_spec(best)  # the pairing's best measured strategy for this compute type (models.toml)
        if strat is not None:
            strat.validate(has_drafter_model=drf is not None)
        session = cls(tgt, drf, strat, reg)
        session.drafter_error = drafter_error
        session.drafter_size_warning = None
        if drf is not None and tgt.params and drf.params >= tgt.params:
            session.drafter_size_warning = (
                f"the drafter {drf.name} ({_in_units(drf.params)} parameters) is not smaller than the target {tgt.name} "
                f"({_in_units(tgt.params)}): drafting with it is likely slower than plain decoding")
        session.attach_datastore(datastore)
        return session

    def attach_datastore(self, ref: str | None) -> None:
        """Give the n-gram drafter a datastore (see ``load``). An explicit path that is missing,
        damaged, built for another tokenizer or proposing tokens outside the model's vocabulary is
        a one-line error; the registry's own is skipped where it does not apply, and where it is
        damaged the session loads without it (``datastore_error`` says why): a chat never fails
        to start over a drafting aid."""
        from .drafters.corpus import CorpusIndex
        from .errors import SpecchatError

        self.datastore = None
        self.datastore_error: str | None = None
        self.decoder.drafters["ngram"].corpus = None
        if ref == "none":
            return
        if ref is None:
            entry = self.registry.get(self.target.name) if self.registry is not None else None
            base = self.registry.path.parent if self.registry is not None and self.registry.path else None
            path = entry.datastore_path(base) if entry is not None else None
            if path is None:
                return
            try:  # missing (an install that lost assets/) or damaged: a warning, as for a paired drafter
                self._attach(CorpusIndex.load(path), path, explicit=False)
            except SpecchatError as e:
                self.datastore_error = str(e)
            return
        self._attach(CorpusIndex.load(Path(ref)), Path(ref), explicit=True)

    def _attach(self, index, path: Path, explicit: bool) -> None:
        from .errors import SpecchatError

        if self.tokenizer is None or not index.fits(self.tokenizer):
            if explicit:
                raise SpecchatError(f"{path}: this n-gram datastore was built with another tokenizer than {self.target.name}'s")
            return
        if index.max_token() >= self.target.model.vocab_size:  # a damaged file: its drafts could not be verified
            raise SpecchatError(f"{path}: n-gram datastore proposes token {index.max_token()}, outside "
                                f"{self.target.name}'s vocabulary (0..{self.target.model.vocab_size - 1})")
        self.decoder.drafters["ngram"].corpus = index
        self.datastore = str(path)

    # ---- ChatEngine ---------------------------------------------------------------------------------
    @property
    def has_drafter(self) -> bool:
        return self.drafter is not None

    def strategy_label(self, strategy: Strategy | None = None) -> str:
        """``strategy``'s label (default: the current one) as this session's steps carry it."""
        s = strategy if strategy is not None else self.strategy
        return s.label(self.decoder.tree_nodes(s))

    @property
    def context_length(self) -> int:
        return self.decoder.context_length

    @property
    def description(self) -> str:
        d = self.target.description
        if self.drafter is not None:
            d += f" <- {self.drafter.name}"
        return d

    def encode_chat(self, messages: list[dict[str, str]]) -> list[int]:
        from .errors import SpecchatError

        if self.tokenizer is None:
            raise SpecchatError(f"{self.target.name} has no tokenizer: chat needs one (use `generate --prompt-ids`)")
        if continues_reply(messages):
            return self._continuation_ids(messages)
        return chat_ids(self.tokenizer, messages)

    def _continuation_ids(self, messages: list[dict[str, str]]) -> list[int]:
        """A reply to continue: the header's ids, then the ids the model wrote the reply with where
        the cache still holds them (encoding its text may split it otherwise: a token split of the
        model's own, a character cut in two at the end), else its text encoded (``chat_ids``)."""
        tok = self.tokenizer
        head = template_ids(tok, messages[:-1])
        content = reply_to_continue(messages)
        history = self.decoder.history
        if history[: len(head)] == head:
            tail = history[len(head):]
            for n in range(len(tail), max(0, len(tail) - 8), -1):  # less an end of turn, a cut character
                if tok.decode(tail[:n]) == content:
                    return head + tail[:n]
        return head + tok.encode(content, add_special_tokens=False)

    def fit_chat(self, messages: list[dict[str, str]], max_new_tokens: int) -> tuple[list[int], int]:
        """The prompt ids of ``messages``, the oldest turns left out where the whole conversation
        would leave less than a reply's room in the context (:func:`fit_to_context`), and how
        many messages were left out."""
        if self.tokenizer is None:
            return self.encode_chat(messages), 0
        tok = self.tokenizer
        return fit_to_context(messages, self.encode_chat, lambda text: len(tok.encode(text)),
                             self.context_length, reply_reserve(max_new_tokens, self.context_length))

    def stream_chat(self, messages: list[dict[str, str]], max_new_tokens: int, stop: threading.Event) -> Iterator[StepEvent]:
        ids, dropped = self.fit_chat(messages, max_new_tokens)
        # a sampled reply's random stream is the strategy's seed mixed with the prompt (``redrawn``: each
        # turn draws its own numbers; the same seed and conversation write the same reply). A prompt
        # asked again (regenerate) is drawn anew, not an earlier reply again: the draws are counted per
        # prompt and seed, not only against the last prompt (a regenerate after Continue asked the
        # continued prompt in between and wrote the first reply again), and only where a token came
        # back (a send stopped in its prefill or failed drew nothing: its retry is the prompt's first)
        key = _prompt_key(ids)
        count = key + str(int(self.strategy.seed)).encode()  # a seed set anew: its first reply again
        redraw = self._draws.get(count, 0)
        prefill_s = self.decoder.start(ids, stop)  # stoppable between prefill pieces (Esc on a long prompt)
        first, drawn = True, False
        memo: list = [None, None]  # (the strategy, its redrawn form): once per strategy, not every step

        def current() -> Strategy:
            if memo[0] is not self.strategy:  # a live switch hands in a new Strategy object
                memo[0] = self.strategy
                memo[1] = redrawn(memo[0], redraw, key)
            return memo[1]

        for ev in self.decoder.steps(current, max_new_tokens, stop):
            if first:  # the first event carries the prompt's prefill (the dashboard shows it)
                ev.prefill_s, ev.prefill_tokens, first = prefill_s, self.decoder.prefilled, False
                ev.dropped_messages = dropped
            if ev.emitted and not drawn:
                drawn = True
                self._draws.pop(count, None)  # the most recent last (the oldest are forgotten first)
                self._draws[count] = redraw + 1
                while len(self._draws) > REMEMBERED_PROMPTS:
                    del self._draws[next(iter(self._draws))]
            yield ev

    def measure_baseline(self, new_tokens: int = 48, stop: threading.Event | None = None,
                         long_context: int = LONG_BASELINE_CONTEXT, strategy: Strategy | None = None) -> "Baseline":
        """Plain decoding (ar) speed of this target on this machine: the reference of the
        dashboard's speedup, greedy, or sampling as ``strategy`` samples (its temperature, cuts,
        penalty and seed: a draw and the cuts cost a sampled step more than an argmax, so a sampled
        reply is compared with plain decoding that samples the same way). Runs on a separate cache
        (the conversation's state is untouched), so a UI may call it from a worker thread between
        replies; prefill and a short warm-up excluded.

        Measured twice: after the short baseline prompt, and after a context of ``long_context``
        tokens (that prompt repeated; 0: not measured, nor without a KV cache or room for it),
        ``new_tokens // 2`` tokens there: a step's time grows with the context (attention reads
        every cached key), so a long conversation's reply is compared with plain decoding at its
        own context (``Baseline.tokens_per_s_at``), not with the short prompt's speed."""
        from .generate import Decoder, run_generation
        from .strategy import preset

        plain = preset("ar") if strategy is None else preset("ar").replace(**strategy.sampling)
        probe = self.target.model.with_own_cache()
        dec = Decoder(probe)  # no EOS: always ``new_tokens`` tokens
        ids = self.encode_chat([{"role": "user", "content": BASELINE_PROMPT}]) if self.tokenizer else list(range(1, 17))
        # a context shorter than the prompt and its tokens (--max-context 64: "prompt is 68 tokens but the
        # context holds 64 ... shorten it", of a prompt the user never wrote): its start, leaving the room
        ids = ids[:max(1, min(len(ids), dec.context_length - new_tokens - 1))]
        long_tps = long_ctx = 0.0
        try:
            run_generation(dec, ids, plain, 4, stop)  # warm-up
            dec.reset()
            _, summ = run_generation(dec, ids, plain, new_tokens, stop)
            stopped = summ.finish_reason == "stopped"
            n_long = max(4, new_tokens // 2)
            cap = getattr(probe.cache, "capacity", None) or 0  # a KV cache's rows (an SSM's state does not grow)
            if long_context > 2 * len(ids) and not stopped and long_context + n_long + 8 <= cap:
                dec.reset()
                long_ids = (ids * (long_context // len(ids) + 1))[:long_context]
                _, lsumm = run_generation(dec, long_ids, plain, n_long, stop)
                if lsumm.finish_reason != "stopped" and lsumm.tokens_per_s > 0:
                    long_tps, long_ctx = lsumm.tokens_per_s, long_context + lsumm.new_tokens / 2
        finally:
            probe.cache = None
        return Baseline(summ.tokens_per_s, summ.new_tokens, stopped=stopped, context=len(ids) + summ.new_tokens / 2,
                        long_tokens_per_s=long_tps, long_context=long_ctx, sampling=plain.sampling_label())


REMEMBERED_PROMPTS = 64  # prompts whose replies stream_chat counts (regenerate draws anew)


def _prompt_key(ids: list[int]) -> bytes:
    """A digest of prompt ids (a long conversation's prompt is thousands of ids: not kept whole)."""
    return hashlib.blake2b(array("q", ids).tobytes(), digest_size=16).digest()


def redrawn(strategy: Strategy, n: int, prompt: bytes | None = None) -> Strategy:
    """``strategy`` for the ``n``-th repeated reply to one prompt (0: itself): its seed moved on
    (greedy decoding draws nothing: unchanged). ``prompt`` (``_prompt_key`` of the prompt's ids):
    the seed is first mixed with the prompt, so each prompt has a random stream of its own (the same
    for the same seed and conversation: reproducible). Every reply used to start the same stream at
    the seed: each turn of a chat drew with the same numbers, and at T = 1 SmolLM2 answered "Pick
    another random number" six turns running with the very same reply, and other prompts' replies
    opened alike ("Regulars, the banana bear", "Regulars, the common unic")."""
    if strategy.greedy or (n <= 0 and prompt is None):
        return strategy
    seed = int(strategy.seed)
    if prompt is not None:
        mixed = hashlib.blake2b(str(seed).encode() + b"/" + prompt, digest_size=8).digest()
        seed = int.from_bytes(mixed, "little") >> 1
    return strategy.replace(seed=(seed + n * 0x9E3779B97F4A7C15) % (1 << 63))


BASELINE_PROMPT = "Describe a quiet morning in a small harbour town."


@dataclass(frozen=True)
class Baseline:
    """A measured plain-decoding speed (tokens/s over ``tokens`` decoded tokens, at a mean context
    of ``context`` tokens), and where measured, the speed at a long context as well."""

    tokens_per_s: float
    tokens: int
    stopped: bool = False
    context: float = 0.0
    long_tokens_per_s: float = 0.0  # 0: not measured
    long_context: float = 0.0
    sampling: str = "T=0"  # how the plain decoding measured drew its tokens (Strategy.sampling_label)

    @property
    def fitted(self) -> bool:
        return self.long_tokens_per_s > 0 and self.tokens_per_s > 0 and self.long_context > self.context

    def tokens_per_s_at(self, context: float) -> float:
        """Plain decoding's speed at ``context`` tokens of context: a token's time taken as linear
        in the context (the weights cost the same at any length, attention reads every cached key)
        through the two measures, never below the short one's; the short measure alone where there
        is no long one."""
        if not self.fitted:
            return self.tokens_per_s
        ms_short, ms_long = 1000.0 / self.tokens_per_s, 1000.0 / self.long_tokens_per_s
        slope = max(0.0, (ms_long - ms_short) / (self.long_context - self.context))
        return 1000.0 / (ms_short + slope * max(0.0, context - self.context))


def _as_drafters(e, ref: str):
    """``e`` (a SpecchatError) said of the drafter ``ref``: a damaged drafter's file read "Could not
    load the model: trunc/model.safetensors: ..." in the app, as if the target had failed."""
    if e.problem.startswith("the drafter "):
        return e
    try:
        out = type(e)(f"the drafter {ref!r} could not be loaded: {e}")
    except TypeError:  # (a subclass with other arguments)
        from .errors import SpecchatError

        out = SpecchatError(f"the drafter {ref!r} could not be loaded: {e}")
    return out


def load_warnings(session) -> list[str]:
    """What a session's load left out (``drafter_error``, ``datastore_error``) and what decodes without
    it, and a drafter that cannot pay (``drafter_size_warning``), a line each: the CLI prints them, the
    app shows them as a notice."""
    out = []
    note = getattr(getattr(session, "target", None), "note", None)
    if isinstance(note, str) and note:
        out.append(note)
    if getattr(session, "drafter_error", None):
        out.append(f"{session.drafter_error}; decoding without it")
    if getattr(session, "drafter_size_warning", None):
        out.append(session.drafter_size_warning)
    if getattr(session, "datastore_error", None):
        out.append(f"{session.datastore_error}; pld:auto drafts by prompt lookup alone")
    return out


def _in_units(n: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= size:
            return f"{n / size:.3g}{unit}"
    return str(n)


def _stream_decoder(tok):
    from .tokenizer import StreamDecoder

    return StreamDecoder(tok)


DROP_FRACTION = 3  # a full context leaves out the oldest turns a third of the context at a time
MESSAGE_OVERHEAD = 4  # template tokens a message adds to its text (role header, end mark): cut choice only
HEAD_TOKENS = 32  # and the template's own (a default system prompt, a date line): cut choice only


def reply_reserve(max_new_tokens: int, context_length: int) -> int:
    """The room a prompt leaves for the reply: ``max_new_tokens``, at most a quarter of the context."""
    return max(1, min(max_new_tokens, context_length // 4))


def fit_to_context(messages: list[dict[str, str]], encode, count, context_length: int,
                   reserve: int) -> tuple[list[int], int]:
    """A conversation that no longer fits: the prompt ids without its oldest turns (a rolling window).

    ``encode(messages) -> ids`` renders a conversation (the chat template); ``count(text) -> int``
    counts a message's tokens (to choose where to cut). The leading system messages and the last
    user turn always stay, and a window starts at a user turn. Returns (ids, messages left out);
    the ids may still not fit (one message longer than the context: ``Decoder.start`` says so).

    The window's start is replayed turn by turn from the message sizes: a turn whose window (with
    ``reserve`` tokens for its reply) no longer fits moves the start to the earliest user turn that
    leaves a third of the context free (``DROP_FRACTION``), or to that turn itself when none does
    (a long pasted document stays in view for the questions after it). The replay depends only on
    the messages, so the next turn passes the same starts: its prompt begins with the previous one
    and the cached prefix is reused; a move re-prefills the window once, then the turns go on from
    the cache for about a third of a context. Where the sizes' estimate was short, the start moves
    on to the next user turn until the real ids fit.
    """
    ids = encode(messages)
    if len(ids) + reserve <= context_length:
        return ids, 0
    n_head = leading_system(messages)
    head, body = messages[:n_head], messages[n_head:]
    users = [i for i, m in enumerate(body) if m.get("role") == "user"]
    if not users or users[-1] == 0:
        return ids, 0

    def size(m: dict[str, str]) -> int:
        return count(str(m.get("content", ""))) + MESSAGE_OVERHEAD

    ends = [0]  # ends[i]: the estimated tokens of body[:i]
    for m in body:
        ends.append(ends[-1] + size(m))
    fixed = sum(size(m) for m in head) + HEAD_TOKENS + reserve
    free = context_length - context_length // DROP_FRACTION
    start = 0
    for u in users:  # the turns in order: where each one's window started
        if fixed + ends[u + 1] - ends[start] <= context_length:
            continue
        start = next((s for s in users if start < s <= u and fixed + ends[u + 1] - ends[s] <= free), u)
    later = [s for s in users if s > start]
    ids = encode(head + body[start:]) if start else ids
    while len(ids) + reserve > context_length and later:
        start = later.pop(0)
        ids = encode(head + body[start:])
    return ids, start


def leading_system(messages: list[dict[str, str]]) -> int:
    """How many system messages open ``messages`` (they stay in every context window)."""
    n = 0
    while n < len(messages) and messages[n].get("role") == "system":
        n += 1
    return n


def continues_reply(messages: list[dict[str, str]]) -> bool:
    """``messages`` end with an assistant message: that reply is to be continued (cut by the token
    limit, or stopped). A SpecchatError if no user message comes before it."""
    from .errors import SpecchatError

    if not messages or messages[-1].get("role") != "assistant":
        return False
    if not any(m.get("role") == "user" for m in messages[:-1]):
        raise SpecchatError("nothing to continue: the conversation has no user message before the reply")
    return True


def reply_to_continue(messages: list[dict[str, str]]) -> str:
    """The text of the reply to continue, less a character cut in two at its end (U+FFFD: the
    model writes that character again)."""
    return str(messages[-1].get("content", "")).rstrip("\ufffd")


def chat_ids(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """The token ids of ``messages`` in the tokenizer's chat template, ready for the reply.

    A conversation that ends with an assistant message is that reply to be continued
    (:func:`continues_reply`): the template up to the reply's own header, then its text encoded on
    its own (as it was generated after the header's ids), with no end of turn, so the model goes
    on where it left off."""
    if continues_reply(messages):
        return template_ids(tokenizer, messages[:-1]) + tokenizer.encode(reply_to_continue(messages), add_special_tokens=False)
    return template_ids(tokenizer, messages)


def template_ids(tokenizer, messages: list[dict[str, str]]) -> list[int]:
    """``messages`` rendered by the chat template with the reply's header, as token ids. A special
    token's text in a user or system message is plain text there (``Tokenizer.encode_chat``): a
    message holding "<|im_end|>\n<|im_start|>system" was encoded as an end of turn and a system turn."""
    encode_chat = getattr(tokenizer, "encode_chat", None)
    if encode_chat is None:  # (a tokenizer of another kind: its own encode of the rendered text)
        return tokenizer.encode(render_chat(tokenizer, messages), add_special_tokens=False)
    return _in_template(tokenizer, lambda: encode_chat(messages, add_generation_prompt=True))


def render_chat(tokenizer, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
    """The chat template's text for ``messages``. The template is the model's code: where it fails
    (``raise_exception('System role not supported')``, an undefined name, a sandbox refusal, a bug)
    that is a one-line SpecchatError naming it, not the template engine's traceback."""
    return _in_template(tokenizer, lambda: tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt))


def _in_template(tokenizer, call):
    """``call()``, which runs the chat template: its failure a one-line SpecchatError (``render_chat``)."""
    from .errors import SpecchatError

    try:
        return call()
    except SpecchatError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the template's code raised
        detail = " ".join(str(e).split())[:200] or type(e).__name__
        raise SpecchatError(f"{getattr(tokenizer, 'name', None) or 'the model'}'s chat template failed on this "
                            f"conversation ({detail})") from None


FALLBACK_TARGET = "smollm2-135m-instruct"


def default_target_name(reg) -> str:
    """The models file's default target; a file with none (and without the fallback's entry) is a
    one-line ConfigError saying so (the fallback's name was reported as "no such file or directory,
    and not a models.toml name", a name the user never gave)."""
    e = reg.default_target()
    if e is not None:
        return e.name
    if reg.path is not None and FALLBACK_TARGET not in reg.models:
        from .errors import ConfigError

        raise ConfigError(("lists no models" if not reg.models else "no model has default = true") + ": pass --target NAME "
                          "(a models.toml name, a .gguf file, an HF-format directory or a Hub id), "
                          "or mark one model default = true", path=reg.path)
    return FALLBACK_TARGET


SSM_FAMILIES = ("mamba", "mamba2")  # pure state-space models: no positional limit, no per-token cache


def _unbounded_if_ssm(drf) -> None:
    """A pure SSM drafter's context is not the target's: its state has no positional limit and
    costs no memory per token, and a byte-level drafter counts bytes (~4 a token), so the
    target's token limit would fill it at a quarter of the conversation and every drafted step
    would then fail. Its limit is lifted to the family's own bound (the hybrids keep theirs:
    their attention layers hold a KV cache of that size)."""
    if getattr(drf.model, "family", None) in SSM_FAMILIES:
        from .models.mamba2 import DEFAULT_CAPACITY

        drf.model.max_context = max(drf.model.max_context, DEFAULT_CAPACITY)


def _drafter_dtype(target):
    """A drafter's dtype: on a CPU fp32 whatever the target's (then Q8_0 by ``_drafter_weights``:
    a Mamba-2 drafter's step is one C call a block, ~0.2 ms for the shipped one, against ~2.8 ms
    for its bf16 torch step; 2-core Zen 4); elsewhere the target's. A drafter's numbers choose
    proposals, never what is emitted: lossless in any dtype."""
    import torch

    dev = getattr(target, "device", None)
    if dev is None or torch.device(dev).type == "cpu":
        return torch.float32
    return target.dtype


def _drafter_weights(drf) -> None:
    """A drafter model's fp32 weights in Q8_0 where linear.c holds them (Mamba-2 drafters:
    ``quantize_for_drafting``): a draft step streams a quarter of the bytes, and a drafter's numbers
    never decide what is emitted. SPECCHAT_DRAFT_Q8=0 keeps fp32."""
    import os

    if os.environ.get("SPECCHAT_DRAFT_Q8", "1").strip().lower() in ("0", "off", "false", "no"):
        return
    q = getattr(drf.model, "quantize_for_drafting", None)
    if q is not None:
        q()


def default_strategy(has_drafter_model: bool) -> Strategy:
    from .strategy import preset

    # a cost-aware draft length (engine/gate.py): a draft that does not pay here is not made
    return preset("sd", adaptive=True) if has_drafter_model else preset("pld", adaptive=True)


def check_bridgeable(target, drafter) -> None:
    """A drafter with another vocabulary is bridged (engine/drafters/vocab.py), which translates
    text between the two tokenizers: both must be there (without tokenizers, ids are trusted)."""
    from .errors import SpecchatError

    if (target.tokenizer is None) != (drafter.tokenizer is None):
        raise SpecchatError(f"drafter {drafter.name} and target {target.name} both need a tokenizer to be paired")
    tv, dv = target.model.vocab_size, drafter.model.vocab_size
    if target.tokenizer is None and dv < tv:
        # the drafter reads the target's ids as they are: one past its embedding failed mid-reply (IndexError)
        raise SpecchatError(f"drafter {drafter.name} has {dv} token ids and target {target.name} {tv}: without tokenizers to "
                            "bridge them, a drafter must know every id of the target (give both a tokenizer)")
