"""Drafters with another vocabulary (heterogeneous-vocab paper; ALGORITHMS.md §6).

A ``BridgeDrafter`` wraps a drafter model whose tokenizer differs from the target's and answers
the usual ``propose(history, request) -> TokenTree`` with a tree **in the target's ids**, so the
verifiers and the decode loop do not change. Text (exactly: bytes) is the common ground:

* the target's history is turned into bytes token by token (``Tokenizer.token_bytes``: byte-level
  markers and sentencepiece ``▁``/``<0xNN>`` undone, special tokens spelled as written) and
  re-encoded with the drafter's tokenizer every step, so the drafter always sees the text the
  target produced, whatever the target's own segmentation (§3.2: the accepted history stays in
  target tokens; the drafter's copy is derived from it). The drafter's cache keeps its common
  prefix, so only the new tail runs (KV caching, §3.1);
* ``VocabMap`` pairs tokens that spell the same bytes (T ∩ D), specials by their text, and the
  drafter's end-of-sequence with the target's end of turn.

Bridges, per step (``DraftRequest.vocab``):

``tli``   Alg. 4: the drafter's distribution restricted to T ∩ D and renormalised (its output
          columns outside the intersection are dropped before softmax/top-k), tokens mapped to
          target ids, q carried over to the target's vocabulary; standard (tree) rejection
          sampling verifies. Any tree shape or policy.
``union`` Alg. 1: the drafter samples its full q; a token outside T has p = 0 and is always
          rejected. The chain stops at that draw and the tree records the rejected draw
          (``TokenTree.rejected_rows``) so the verifier samples the residual norm(max(p - q|T, 0))
          there, exactly as rejection sampling over T ∪ D would. Chains only: a sibling drawn
          outside T has no target row to sit in.
``slem``  Alg. 2: the drafter's draft is decoded to bytes and re-tokenized with the target's
          tokenizer, with a look-behind: the pending root token's bytes are re-encoded together
          with the draft and the proposal starts after the root when that re-encoding keeps it
          (else the draft alone is encoded). Exact-match verification (greedy at T = 0,
          target-sampling membership otherwise) makes it lossless for any proposal. Trees work:
          every root-to-leaf draft is re-tokenized and the results merged into a trie.
``slrs``  Alg. 3: string-level rejection sampling; see ``engine/slrs.py``.

Race (ERSD) drafting is refused through a bridge: its noise is indexed by target ids.
"""

from __future__ import annotations

from typing import Sequence

import torch

from ..errors import SpecchatError
from ..tree import TokenTree
from ..models.common import drafter_numerics, exact_rows
from .base import DraftRequest
from .model import ModelDrafter

BRIDGES = ("union", "tli", "slem", "slrs")


class BridgeError(SpecchatError, ValueError):
    """A bridge cannot serve this request (one user-facing line)."""


def is_byte_tokenizer(tok) -> bool:
    """Ids 0..255 are the 256 bytes and nothing else is text (ByteTokenizer, also once saved and
    loaded back from its tokenizer.json)."""
    from ..tokenizer import ByteTokenizer

    if isinstance(tok, ByteTokenizer) or getattr(tok, "name", "") == "bytes":
        return True
    if tok is None or tok.vocab_size > 272:
        return False
    return all(tok.token_bytes(i) == bytes([i]) for i in range(256)) and all(
        tok.is_special(i) for i in range(256, tok.vocab_size) if tok.id_to_token(i) is not None)


def token_key(tok, i: int):
    """What a token means as text: ("special", its text) or ("bytes", the bytes it adds)."""
    if tok.is_special(i):
        return ("special", tok.id_to_token(i))
    return ("bytes", tok.token_bytes(i))


def same_vocabulary(a, b) -> bool:
    """True when two tokenizers give every id the same meaning (no bridge needed)."""
    if a is None or b is None:
        return True  # id-level use: trust the caller
    if a.vocab_size != b.vocab_size:
        return False
    step = max(1, a.vocab_size // 512)
    return all(token_key(a, i) == token_key(b, i) for i in range(0, a.vocab_size, step))


class VocabMap:
    """Token correspondence between a target tokenizer T and a drafter tokenizer D.

    ``d2t[d]`` is the target id spelling the same bytes as drafter token d (-1 if none);
    ``shared_d`` / ``shared_t`` list the intersection pairs (ascending drafter id). The
    drafter's EOS maps to the target's first end-of-turn id when their texts differ (a byte
    drafter's ``<|eos|>`` ends a reply as SmolLM2's ``<|im_end|>`` does).
    """

    def __init__(self, target_tok, drafter_tok, drafter_vocab: int | None = None):
        self.target_tok, self.drafter_tok = target_tok, drafter_tok
        t_index: dict = {}
        # A sentencepiece vocabulary spells most bytes twice: a normal piece ("t") and a
        # byte-fallback piece (<0x74>) the encoder never writes for them. Normal pieces first,
        # so a spelling is paired with the token the target actually produces.
        for i in _spelling_order(target_tok, range(target_tok.vocab_size)):
            k = token_key(target_tok, i)
            if k == ("bytes", b""):
                continue  # unused ids
            t_index.setdefault(k, i)
        D = drafter_vocab or drafter_tok.vocab_size
        d2t = torch.full((D,), -1, dtype=torch.long)
        self.target_eos = _turn_end(target_tok)
        # One drafter id per target id: two drafter tokens of one spelling (a sentencepiece
        # drafter's "t" and <0x74>) would put two columns of q on one target id, where TLI's
        # layout kept one of them (q understated: rejection sampling then accepts too often) and
        # a tree drawn without replacement could draw the same target token twice. The drafter's
        # EOS first (it ends the turn), then its normal pieces, then byte pieces; the others stay
        # outside the intersection (TLI restricts them away, union counts a draw as outside T).
        eos = drafter_tok.eos_id if drafter_tok.eos_id is not None and drafter_tok.eos_id < D else None
        order = ([eos] if eos is not None else []) + [d for d in _spelling_order(drafter_tok, range(min(D, drafter_tok.vocab_size)))
                                                      if d != eos]
        used: set[int] = set()
        for d in order:
            k = token_key(drafter_tok, d)
            t = t_index.get(k, -1) if k != ("bytes", b"") else -1
            if t < 0 and d == eos and self.target_eos is not None:
                t = self.target_eos
            if t >= 0 and t not in used:
                used.add(t)
                d2t[d] = t
        self.d2t = d2t
        self.shared_d = torch.nonzero(d2t >= 0).flatten()
        self.shared_t = d2t[self.shared_d]
        self.drafter_eos = drafter_tok.eos_id

    @property
    def size(self) -> int:
        return int(self.shared_d.numel())

    def to_target_probs(self, probs_d: torch.Tensor, target_vocab: int) -> torch.Tensor:
        """q over D (rows) -> q restricted to T ∩ D, laid out over the target's ids (not
        renormalised: for TLI q is already zero outside the intersection)."""
        out = torch.zeros(probs_d.shape[0], target_vocab, dtype=probs_d.dtype)
        out[:, self.shared_t] = probs_d[:, self.shared_d]
        return out


def _spelling_order(tok, ids):
    """``ids`` with sentencepiece byte-fallback pieces last (their order kept otherwise)."""
    ids = list(ids)
    is_byte = getattr(tok, "is_byte_piece", None)
    if is_byte is None:
        return ids
    byte = {i for i in ids if is_byte(i)}  # (one pass over the vocabulary)
    return [i for i in ids if i not in byte] + [i for i in ids if i in byte] if byte else ids


def _turn_end(tok) -> int | None:
    """The target token that ends a reply: the chat template's end of turn if it has one."""
    from ..tokenizer import END_OF_TURN_TOKENS

    for name in END_OF_TURN_TOKENS:
        i = tok.token_to_id(name)
        if i is not None and i in tok.eos_ids:
            return i
    return tok.eos_id if tok.eos_id is not None else (min(tok.eos_ids) if tok.eos_ids else None)


class HistoryBytes:
    """The bytes of a target token history, kept incrementally (common prefix reused)."""

    def __init__(self, tok):
        self.tok = tok
        self.ids: list[int] = []
        self.ends: list[int] = []  # byte offset after each token
        self.buf = bytearray()

    def of(self, history: Sequence[int]) -> bytes:
        n = 0
        m = min(len(self.ids), len(history))
        while n < m and self.ids[n] == history[n]:
            n += 1
        if n < len(self.ids):
            del self.buf[self.ends[n - 1] if n else 0:]
            del self.ids[n:], self.ends[n:]
        for t in history[n:]:
            self.buf += self.tok.token_bytes(int(t))
            self.ids.append(int(t))
            self.ends.append(len(self.buf))
        return bytes(self.buf)


def _utf8_complete(data: bytes) -> int:
    """Length of the longest prefix of ``data`` that does not end inside a UTF-8 character."""
    n = len(data)
    for back in range(1, min(4, n) + 1):
        b = data[n - back]
        if b & 0xC0 == 0x80:  # continuation byte: keep looking for the lead byte
            continue
        need = 1 if b < 0x80 else 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4 if b >> 3 == 0b11110 else 1
        return n if back >= need else n - back
    return n


class BridgeDrafter:
    """A drafter model with its own tokenizer, proposing trees in the target's ids."""

    name = "bridge"

    def __init__(self, model, target_tok, drafter_tok, target_vocab: int, label: str = "model"):
        D = max(int(getattr(model, "vocab_size", 0) or 0), drafter_tok.vocab_size)
        self.map = VocabMap(target_tok, drafter_tok, D)
        if self.map.size == 0:
            raise BridgeError("the drafter's vocabulary shares no token with the target's: no bridge can work")
        self.inner = ModelDrafter(model, D, label=label)
        self.target_tok, self.drafter_tok = target_tok, drafter_tok
        self.target_vocab = target_vocab
        self.bytes = HistoryBytes(target_tok)
        self.byte_level = is_byte_tokenizer(drafter_tok)
        self.last: dict = {}  # telemetry of the last proposal (bridge, drafted tokens, proposals)

    def reset(self) -> None:
        self.inner.reset()
        self.bytes = HistoryBytes(self.target_tok)
        self._slrs_ctx = None

    # ---- history ----------------------------------------------------------------------------------
    def drafter_history(self, history: Sequence[int]) -> tuple[list[int], bytes]:
        """The drafter's ids for the target's history, and the trailing bytes it does not see yet
        (an unfinished UTF-8 character, for text tokenizers). The ids spell the history's text
        itself: a sentencepiece drafter's encoder would put a "▁" of its own in front of it (and
        after each special token), a space the target never wrote (``encode_unprefixed``)."""
        data = self.bytes.of(history)
        if self.byte_level:
            return list(data), b""
        cut = _utf8_complete(data)
        ids = self.drafter_tok.encode_unprefixed(data[:cut].decode("utf-8", errors="replace"))
        bos = self.drafter_tok.bos_id
        if bos is not None and (not ids or ids[0] != bos) and (not ids or self._drafter_adds_bos()):
            ids = [bos, *ids]  # a drafter that reads every text after its BOS (Llama's <s>) gets one
        return ids or [0], data[cut:]

    def _drafter_adds_bos(self) -> bool:
        """Whether the drafter's tokenizer puts its BOS in front of a text it encodes (Llama-2's and
        Mistral's do: such a drafter was trained on texts after "<s>", and predicts worse without one;
        the target's history, spelled in the target's vocabulary, rarely has it)."""
        adds = getattr(self, "_adds_bos", None)
        if adds is None:
            tok = self.drafter_tok
            probe = tok.encode("a", add_special_tokens=True)
            adds = self._adds_bos = bool(probe) and tok.bos_id is not None and probe[0] == tok.bos_id
        return adds

    # ---- proposals --------------------------------------------------------------------------------
    @drafter_numerics
    def propose(self, history: Sequence[int], req: DraftRequest) -> TokenTree:
        bridge = req.vocab if req.vocab in BRIDGES else "tli"
        if req.mode == "race":
            raise BridgeError("ersd races on target ids; with a drafter of another vocabulary use sd, tree, mab or optimal")
        self._slrs_ctx = None  # an SLRS context belongs to the step that drafted it (slrs_verify)
        hist_d, held = self.drafter_history(history)
        if bridge == "tli":
            self.inner.restrict(self.map.shared_d)
        else:
            self.inner.restrict(None)
        if bridge == "union":
            if not _is_chain(req):
                raise BridgeError("the union bridge verifies chains only (a draw outside the target's vocabulary has no "
                                  "target row); use tli for trees")
            return self._union(hist_d, req)
        if bridge == "slem":
            return self._slem(history, hist_d, held, req)
        if bridge == "slrs":
            if held:
                raise BridgeError("slrs needs the drafter to see every byte of the history (a byte-level drafter)")
            with exact_rows():  # psi recomputes the drafter's q at verification: the same numbers as drafting
                return self._slrs(hist_d, req, _position(history))
        return self._tli(hist_d, req)

    def _tli(self, hist_d: list[int], req: DraftRequest) -> TokenTree:
        tree = self.inner.propose(hist_d, req)
        tokens = self.map.d2t[torch.tensor(tree.tokens, dtype=torch.long)].tolist() if len(tree) else []
        probs = self.map.to_target_probs(tree.draft_probs, self.target_vocab) if tree.draft_probs is not None else None
        self.last = {"bridge": "tli", "drafted": len(tree), "proposed": len(tree)}
        return TokenTree(tokens, list(tree.parents), probs, tree.sampling)

    def _union(self, hist_d: list[int], req: DraftRequest) -> TokenTree:
        tree = self.inner.propose(hist_d, req)
        tokens: list[int] = []
        rejected: set[int] = set()
        for d in tree.tokens:  # a chain: node i hangs under row i
            t = int(self.map.d2t[d])
            if t < 0:
                rejected.add(len(tokens))  # row len(tokens) drew a token outside T: rejected for sure
                break
            tokens.append(t)
        probs = None
        if tree.draft_probs is not None:
            probs = self.map.to_target_probs(tree.draft_probs[: len(tokens) + 1], self.target_vocab)
        self.last = {"bridge": "union", "drafted": len(tree), "proposed": len(tokens), "outside_target": len(rejected)}
        kind = tree.sampling if probs is not None else "deterministic"
        if req.mode == "greedy" or req.temperature <= 0:
            rejected = set()  # greedy verification ignores q: nothing to record
        return TokenTree(tokens, list(range(-1, len(tokens) - 1)), probs, kind, rejected_rows=rejected)

    def _slem(self, history: Sequence[int], hist_d: list[int], held: bytes, req: DraftRequest) -> TokenTree:
        from dataclasses import replace

        greedy = req.mode == "greedy" or req.temperature <= 0
        tree = self.inner.propose(hist_d, replace(req, mode="greedy" if greedy else "sample"))
        root = int(history[-1])
        root_bytes = self.target_tok.token_bytes(root)
        trie: dict[tuple[int, int], int] = {}  # (parent node, target token) -> node
        tokens: list[int] = []
        parents: list[int] = []
        for leaf_path in _leaf_paths(tree):
            proposal = self._retokenize([tree.tokens[i] for i in leaf_path], root, root_bytes, held)
            parent = -1
            for t in proposal[: req.max_nodes]:
                node = trie.get((parent, t))
                if node is None:
                    if len(tokens) >= req.max_nodes:
                        break
                    node = len(tokens)
                    trie[(parent, t)] = node
                    tokens.append(t)
                    parents.append(parent)
                parent = node
        self.last = {"bridge": "slem", "drafted": len(tree), "proposed": len(tokens)}
        return TokenTree(tokens, parents, None, "deterministic")

    def _retokenize(self, draft_d: list[int], root: int, root_bytes: bytes, held: bytes) -> list[int]:
        """Drafter tokens -> the target tokens that continue the history after the root
        (SLEM, Alg. 2 line 7, with the look-behind of §3.2)."""
        data = bytearray()
        eos = False
        for d in draft_d:
            if d == self.map.drafter_eos or self.drafter_tok.is_special(d):
                eos = d == self.map.drafter_eos
                break
            data += self.drafter_tok.token_bytes(d)
        if held:  # the drafter did not see the end of an unfinished character: its draft must redo it
            if not data.startswith(held):
                return []
            data = data[len(held):]
        data = bytes(data[: _utf8_complete(bytes(data))])
        cut_last = False
        if not eos and data and self.draft_cut != "none":
            # The draft stops where the drafter was stopped, most often inside a word, and the target
            # spells a whole word otherwise than its start ("rainb" is not how "rainbow" begins): the
            # last token proposed is then almost never accepted (bench/results/2026-11-29-session40).
            # Propose what ends before the draft's last pre-tokenizer piece, or, where the tokenizer
            # cannot tell the pieces, all but the last token. Lossless either way: exact-match
            # verification never depends on what was proposed.
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError:  # a byte drafter's invalid sequence inside the draft
                text = None
            start = self.target_tok.last_piece_start(text) if text is not None and self.draft_cut == "piece" else None
            if start is None:
                cut_last = True
            else:
                data = text[:start].encode("utf-8")
        out: list[int] = []
        if data:
            tok = self.target_tok
            if root_bytes and not tok.is_special(root):
                out = self._encode_after(root_bytes, data, root)
            if not out:
                out = self._encode_after(b"", data)
        if cut_last:
            out = out[:-1]
        if eos and self.map.target_eos is not None:
            out.append(self.map.target_eos)
        return out


    def _encode_after(self, lead: bytes, data: bytes, root: int | None = None) -> list[int]:
        """The target's tokens for ``lead + data`` after those spelling ``lead``, as far as they
        spell ``data``. An encoder may put bytes of its own in front of a text (sentencepiece's
        prefix space: Llama-2's Prepend("▁") writes "lo" as "▁lo", " Hello" as "▁▁" "H" ...): a text
        that begins with those bytes is encoded without them (" Hello" -> "Hello" -> "▁Hello"),
        else they are skipped with ``lead`` where the tokens have a boundary right after them (and,
        with ``root``, the last token before it is the root: the look-behind kept it); else []."""
        tok = self.target_tok
        text = (lead + data).decode("utf-8", errors="replace")
        ids = tok.encode(text)
        spelled = b"".join(tok.token_bytes(t) for t in ids)
        said = text.encode("utf-8")
        pre = spelled[: len(spelled) - len(said)] if len(spelled) > len(said) and spelled.endswith(said) else b""
        if pre and said.startswith(pre):
            # the text begins with what the encoder adds (" Hello" under a "▁" prefix, which
            # "▁▁" would swallow): encoding it without those bytes spells it exactly, prefix-free
            alt = tok.encode(said[len(pre):].decode("utf-8", errors="replace"))
            if b"".join(tok.token_bytes(t) for t in alt) == said:
                ids, pre = alt, b""
        skip, n, k = len(pre) + len(lead), 0, 0
        while k < len(ids) and n < skip:
            n += len(tok.token_bytes(ids[k]))
            k += 1
        if n != skip or (root is not None and (k == 0 or ids[k - 1] != root)):
            return []
        return self._spelling(ids[k:], data)

    def _spelling(self, ids: list[int], data: bytes) -> list[int]:
        """The longest prefix of ``ids`` whose bytes spell a prefix of ``data``: an encoder may add
        what the draft did not say (a sentencepiece prefix space, a normalised character)."""
        out, n = [], 0
        for t in ids:
            b = self.target_tok.token_bytes(t)
            if not b or data[n:n + len(b)] != b:
                break
            out.append(t)
            n += len(b)
        return out


    # ---- SLRS (engine/slrs.py) ------------------------------------------------------------------------
    def _procedure(self):
        from ..slrs import Procedure, TargetTrie

        if getattr(self, "_proc", None) is None:
            dt = self.drafter_tok
            D = self.inner.target_vocab
            draft_bytes = [None if (i >= dt.vocab_size or dt.is_special(i)) else dt.token_bytes(i) for i in range(D)]
            self._proc = Procedure(TargetTrie.of_tokenizer(self.target_tok), draft_bytes, dt.eos_id, self.map.target_eos,
                                   lookahead=self.slrs_lookahead)
        return self._proc

    slrs_lookahead = 16
    # SLEM's end of a draft cut short by its length: "piece" (before the last pre-tokenizer piece,
    # else as "token"), "token" (all but the last token) or "none" (every token it spells)
    draft_cut = "piece"

    def _pure_recurrent(self) -> bool:
        """The drafter forks a plain (conv, ssm) state (checked once: a fork allocates)."""
        if getattr(self, "_pure", None) is None:
            self._pure = self.inner.recurrent and not set(self.inner.model.fork(1).state) - {"conv", "ssm"}
        return self._pure

    def _slrs(self, hist_d: list[int], req: DraftRequest, position: tuple | None = None) -> TokenTree:
        """Chain of target tokens, one fresh Alg. 3 procedure per position (each starts from the
        drafter's state right after the previous token's bytes: the lookahead draws that fixed
        the previous token are not reused, they are conditioned on its end)."""
        from ..sampling import probs_from_logits, sample

        if not self._pure_recurrent():
            raise BridgeError("slrs drafts byte by byte from forked states: it needs a pure recurrent (Mamba) drafter")
        if not _is_chain(req):
            raise BridgeError("slrs verifies chains (one procedure per position); use tli or slem for trees")
        proc = self._procedure()
        greedy = req.mode == "greedy" or req.temperature <= 0
        cuts = (req.top_p, req.top_k, req.min_p)  # q's cuts, kept for psi (_q_after)
        logits = self.inner._sync(hist_d)[None]
        state = _copy_batch(self.inner.model.fork(1))
        starts: list[tuple[object, torch.Tensor]] = []  # per position: (state, logits) where its procedure starts
        tokens: list[int] = []
        empty_last = False
        drafted = 0  # drafter tokens drawn, over all procedures
        m = len(req.shape) if req.plan is None else len(req.plan)
        while len(tokens) < min(m, req.max_nodes):
            starts.append((_copy_batch(state), logits.clone()))
            seq: list[int] = []
            snaps = [(state, logits)]  # after k draft tokens of this procedure
            t = -2
            while t == -2:
                if greedy:
                    d = int(logits[0].argmax())
                else:
                    q = probs_from_logits(logits[0].float(), req.temperature, *cuts)
                    d = sample(q, req.generator)
                seq.append(d)
                drafted += 1
                t, used, nbytes = proc.run(seq)
                if t == -2:
                    state = _copy_batch(state)
                    logits = state.step(torch.tensor([d]))
                    snaps.append((state, logits))
            if t is None:
                empty_last = True
                break
            tokens.append(t)
            if t == self.map.target_eos and nbytes == 0:
                break
            acc, k = 0, 0
            while k < len(seq) and acc < nbytes:
                acc += len(proc.draft_bytes[seq[k]] or b"")
                k += 1
            if acc != nbytes or k >= len(snaps):
                break  # t ends inside a draft token: no drafter state to start the next procedure from
            state, logits = snaps[k]
        self._slrs_ctx = {"starts": starts, "tokens": tokens, "empty_last": empty_last, "temperature": req.temperature,
                          "cuts": cuts, "psi": {}, "greedy": greedy, "position": position}
        self.last = {"bridge": "slrs", "drafted": drafted, "proposed": len(tokens)}
        return TokenTree(tokens, list(range(-1, len(tokens) - 1)), None, "deterministic")

    def slrs_verify(self, tree: TokenTree, target_logits: torch.Tensor, temperature: float, top_p: float,
                    generator: torch.Generator | None, history: Sequence[int] | None = None, top_k: int = 0,
                    min_p: float = 0.0) -> tuple[list[int], int]:
        """Alg. 3 along the chain drafted by ``_slrs`` (sampling; at T = 0 exact match does).

        Only for the chain the procedures of this position sampled: a step that proposed nothing
        (an adaptive k = 0, a full context: ``propose`` did not run) or a chain drafted greedily
        (``--verify membership`` drafts the argmax, whose proposal probability is 1, not ψ) is
        verified by target-sampling membership, lossless for any chain. ``history``: the
        decoder's, to tell this step's context from an earlier one's."""
        from ..sampling import probs_from_logits, sample
        from ..slrs import slrs_accept
        from ..verify import accept

        ctx = getattr(self, "_slrs_ctx", None)
        if (ctx is None or ctx.get("greedy") or not ctx["temperature"] > 0
                or (history is not None and ctx.get("position") != _position(history))
                or list(tree.tokens) != ctx["tokens"][: len(tree)]):
            return accept(tree, target_logits, method="membership", temperature=temperature, top_p=top_p, generator=generator,
                          top_k=top_k, min_p=min_p)
        proc = self._procedure()
        rows = [probs_from_logits(target_logits[i].float(), temperature, top_p, top_k, min_p) for i in range(len(tree) + 1)]

        def psi_of(i: int, t: int) -> float:
            key = (i, t)
            if key not in ctx["psi"]:
                st, lg = ctx["starts"][i]
                ctx["psi"][key] = proc.psi(t, lambda prefixes: self._q_after(st, lg, prefixes, ctx["temperature"], ctx["cuts"]))
            return ctx["psi"][key]

        # the procedure's ∅ after the chain counts only where the chain is whole (not cut shorter after drafting)
        empty_last = ctx["empty_last"] and len(tree) == len(ctx["tokens"])
        chain = list(tree.tokens) + ([None] if empty_last else [])
        path, nxt = slrs_accept(chain, rows, psi_of, generator, greedy=False)
        path = [i for i in path if i < len(tree)]
        if nxt is None:
            nxt = sample(rows[len(tree)], generator)
        return path, nxt

    def _q_after(self, start, start_logits, prefixes, temperature, cuts) -> torch.Tensor:
        """The drafter's (tempered, cut: ``cuts`` = top_p, top_k, min_p as it drafted) distribution
        after each prefix of draft tokens, from ``start``."""
        from ..sampling import probs_from_logits

        L = len(prefixes[0])
        if L == 0:
            logits = start_logits.expand(len(prefixes), -1)
        else:
            batch = _copy_batch(start, rows=len(prefixes))
            for j in range(L):
                logits = batch.step(torch.tensor([p[j] for p in prefixes]))
        return torch.stack([probs_from_logits(r.float(), temperature, *cuts) for r in logits])


def _position(history: Sequence[int]) -> tuple:
    """Which decode position a history is at (its length and last tokens): an SLRS context is
    verified only at the position it was drafted for."""
    return (len(history), tuple(int(t) for t in history[-8:]))


def _copy_batch(batch, rows: int | None = None):
    """A private copy of a one-row recurrent DraftBatch (``rows`` copies of its row): pool
    buffers are shared between forks of one depth and size, snapshots must not be."""
    from ..ssm_cache import DraftBatch

    n = rows or batch.rows
    idx = torch.zeros(n, dtype=torch.long) if rows else torch.arange(batch.rows)
    state = {k: v.index_select(1, idx) for k, v in batch.state.items()}
    return DraftBatch(batch.model, batch.pool, batch.depth, n, state, batch.start, batch.steps)


def _is_chain(req: DraftRequest) -> bool:
    """The request asks for a chain (a plan or a shape with one child per node)."""
    if req.plan is not None:
        return all(p == i - 1 for i, p in enumerate(req.plan))
    return all(n == 1 for n in req.shape)


def _leaf_paths(tree: TokenTree) -> list[list[int]]:
    """Node indices of every root-to-leaf path."""
    if not len(tree):
        return []
    has_child = [False] * len(tree)
    for p in tree.parents:
        if p >= 0:
            has_child[p] = True
    paths = []
    for leaf in range(len(tree)):
        if has_child[leaf]:
            continue
        path, r = [], leaf
        while r >= 0:
            path.append(r)
            r = tree.parents[r]
        paths.append(path[::-1])
    return paths
