"""Tokenizers: an HF ``tokenizer.json`` directory, a GGUF file's metadata, or plain bytes.

One class, ``Tokenizer``, wraps a ``tokenizers.Tokenizer`` (the Rust backend does the encoding) and
adds what the engine needs around it: stop ids, readable token strings, the raw bytes of a token,
and chat templates rendered in Jinja's sandbox. ``StreamDecoder`` turns ids into text as they
arrive without ever showing half a character. ``ByteTokenizer`` (256 bytes + 3 specials) serves
tests and byte-level drafters.

GGUF files carry no ``tokenizer.json``: ``from_gguf`` rebuilds one from ``tokenizer.ggml.*``. The
pre-tokenizer split is chosen from ``tokenizer.ggml.pre`` the way llama.cpp does
(``src/llama-vocab.cpp``), which for every name listed here is also what the model's original
``tokenizer.json`` does. Note transformers' own GGUF loader differs for ``smollm`` (it omits the
single-digit split, so e.g. ``"a  1"`` gets ``Ġ Ġ 1`` there and ``ĠĠ 1`` here and in the original),
and for control tokens outside the byte alphabet (DeepSeek-R1's ``<｜User｜>``), which it leaves out
and which are matched whole here, as in the original and in llama.cpp. Sentencepiece vocabularies
(``tokenizer.ggml.model == "llama"``: Llama 2, Mistral 7B...) get merges recovered from their
pieces' scores and the normaliser/decoder of Llama-2's ``tokenizer.json``
(``_spm_tokenizer_from_gguf_metadata``).
"""

from __future__ import annotations

import codecs
import json
import os
import re
import time
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import tokenizers
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers

from .errors import ModelLoadError


def bytes_to_unicode() -> dict[int, str]:
    """GPT-2's byte -> printable character table that byte-level BPE vocabularies are spelled in."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


_B2U = bytes_to_unicode()
_U2B = {c: b for b, c in _B2U.items()}
_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")  # sentencepiece byte-fallback pieces

# Tokens that end a turn in common chat formats. They join eos_ids when the chat template writes them.
END_OF_TURN_TOKENS = (
    "<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
    "<|end_of_text|>", "<|return|>", "<|end_of_turn|>",
)


# ---------------------------------------------------------------------------------------------
# Tokenizer
# ---------------------------------------------------------------------------------------------
class Tokenizer:
    """A ``tokenizers.Tokenizer`` plus the special ids and chat template of its model.

    ``encode``/``decode`` go straight to the backend, so special tokens written in the text (such
    as ``<|im_start|>`` from a chat template) are matched whole, as in transformers.
    """

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        *,
        bos_id: int | None = None,
        eos_id: int | None = None,
        extra_eos_ids: Iterable[int] = (),
        unk_id: int | None = None,
        pad_id: int | None = None,
        add_bos: bool = False,
        add_eos: bool = False,
        chat_template: str | None = None,
        name: str = "tokenizer",
    ):
        self.backend = backend
        self.name = name
        self.bos_id, self.eos_id, self.unk_id, self.pad_id = bos_id, eos_id, unk_id, pad_id
        # add_bos/add_eos: added by encode(add_special_tokens=True) on top of whatever the
        # backend's own post-processor adds (set only where the backend does not already).
        self.add_bos, self.add_eos = add_bos, add_eos
        self._unprefixed: Any = None  # encode_unprefixed's backend, made on first use
        self.chat_template = chat_template or None
        added = backend.get_added_tokens_decoder()
        self._special = {i for i, t in added.items() if t.special}
        self._vocab_size = max(backend.get_vocab_size(with_added_tokens=True), max(added, default=-1) + 1)
        self._bytes_cache: dict[int, bytes] = {}
        self._byte_level, self._metaspace = _decoder_kind(backend)
        self._template = None  # compiled lazily
        eos = {eos_id} if eos_id is not None else set()
        eos.update(int(i) for i in extra_eos_ids)
        if self.chat_template:
            for tok in END_OF_TURN_TOKENS:
                tid = backend.token_to_id(tok)
                if tid is not None and tok in self.chat_template:
                    eos.add(tid)
        self.eos_ids: set[int] = eos

    def __repr__(self) -> str:
        return (f"Tokenizer({self.name!r}, vocab_size={self.vocab_size}, bos_id={self.bos_id}, "
                f"eos_ids={sorted(self.eos_ids)}, chat_template={'yes' if self.chat_template else 'no'})")

    # -- basic mapping ------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        """Number of ids the tokenizer can produce (max id + 1, added tokens included)."""
        return self._vocab_size

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        ids = self.backend.encode(text, add_special_tokens=add_special_tokens).ids
        if add_special_tokens:
            if self.add_bos and self.bos_id is not None:
                ids = [self.bos_id, *ids]
            if self.add_eos and self.eos_id is not None:
                ids = [*ids, self.eos_id]
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        return self.backend.decode([int(i) for i in ids], skip_special_tokens=skip_special_tokens)

    def encode_unprefixed(self, text: str) -> list[int]:
        """``encode(text)`` without the space the encoder puts in front of a text of its own accord,
        so the ids spell ``text`` itself, as the vocabulary writes it inside a longer text.

        Sentencepiece-style encoders add a "▁" (``add_dummy_prefix``): Llama-2's and Mistral's
        ``Prepend("▁")`` normaliser, also in front of the text after each special token (ours from
        GGUF too), ``Metaspace(prepend_scheme="first"/"always")``, and GPT-2's ByteLevel
        ``add_prefix_space``. The vocabulary bridges hand a drafter the target's history this way
        (engine/drafters/vocab.py ``drafter_history``): through ``encode`` a sentencepiece drafter
        saw " Hi:" for the target's "Hi:", and "[INST]  Hi" for "[INST] Hi", a space the target
        never wrote. Only that prefix goes: a text that starts with a space keeps it (" Hi" is
        "▁Hi"), and a normaliser that changes the text (lowercasing) still does."""
        backend = self._unprefixed
        if backend is None:
            state = json.loads(self.backend.to_str())
            changed = _drop_prefix_space(state)
            backend = tokenizers.Tokenizer.from_str(json.dumps(state)) if changed else self.backend
            self._unprefixed = backend
        return backend.encode(text, add_special_tokens=False).ids

    def last_piece_start(self, text: str) -> int | None:
        """Where ``text``'s last pre-tokenizer piece starts (a character index), or None where that
        cannot be told from the text itself (no pre-tokenizer, or a normaliser that may move
        characters). No token spans two pieces, so ``text[:i]``'s tokens are, as a rule, how ``text``
        and any continuation of it begin, while the last piece's may change with what follows:
        SLEM's drafts end there (engine/drafters/vocab.py)."""
        backend = self.backend
        if backend.pre_tokenizer is None or backend.normalizer is not None or not text:
            return None
        try:
            pieces = backend.pre_tokenizer.pre_tokenize_str(text)
        except Exception:  # a pre-tokenizer that cannot run on a bare string: no cut
            return None
        return pieces[-1][1][0] if pieces else None

    def token_to_id(self, token: str) -> int | None:
        """Id of a token as the vocabulary spells it (``"Ġthe"``, ``"<|im_end|>"``), or None."""
        return self.backend.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The vocabulary's spelling of an id (byte-level markers kept), or None if unused."""
        return self.backend.id_to_token(int(token_id))

    def is_special(self, token_id: int) -> bool:
        return int(token_id) in self._special

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes this token contributes to decoded text (special tokens: their text).

        Exact for byte-level vocabularies (what ``decode`` of the whole sequence concatenates
        before turning bytes into text); sentencepiece vocabularies map ``▁`` to a space and
        ``<0xNN>`` pieces to their byte.
        """
        token_id = int(token_id)
        b = self._bytes_cache.get(token_id)
        if b is None:
            tok = self.backend.id_to_token(token_id)
            if tok is None:
                b = b""
            elif self._byte_level and all(c in _U2B for c in tok):
                b = bytes(_U2B[c] for c in tok)
            elif self._metaspace and token_id not in self._special and (m := _BYTE_TOKEN.match(tok)):
                b = bytes([int(m.group(1), 16)])
            elif self._metaspace and token_id not in self._special:
                b = tok.replace("\u2581", " ").encode("utf-8")
            else:
                # tokenizers' ByteLevel decoder keeps a token with a character outside the byte
                # alphabet (an added token like "<think> ") as its raw UTF-8: so do we.
                b = tok.encode("utf-8")
            self._bytes_cache[token_id] = b
        return b

    def is_byte_piece(self, token_id: int) -> bool:
        """A sentencepiece byte-fallback piece (``<0x41>``): the encoder writes one only for a byte
        no other piece spells, so where a normal piece spells the same bytes (``A``) that piece is
        the one the model produces (the vocabulary bridges pair and propose that one)."""
        token_id = int(token_id)
        if not self._metaspace or token_id in self._special:
            return False
        tok = self.backend.id_to_token(token_id)
        return tok is not None and _BYTE_TOKEN.match(tok) is not None

    def token_str(self, token_id: int) -> str:
        """A readable form of one token: ``"Ġthe"`` -> ``" the"``; a lone byte of a multibyte
        character shows as ``"\\xe4"``; special tokens as written."""
        if self.is_special(token_id):
            return self.id_to_token(token_id) or ""
        return self.token_bytes(token_id).decode("utf-8", errors="backslashreplace")

    # -- chat ---------------------------------------------------------------------------------
    def template_variables(self) -> dict[str, str]:
        """The special-token strings a chat template may read (as transformers passes them)."""
        out = {}
        for key, tid in (("bos_token", self.bos_id), ("eos_token", self.eos_id), ("unk_token", self.unk_id), ("pad_token", self.pad_id)):
            tok = self.id_to_token(tid) if tid is not None else None
            if tok is not None:
                out[key] = tok
        return out

    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **kwargs: Any) -> str:
        """Render a conversation to the prompt text the model was trained on.

        ``messages`` are ``{"role": ..., "content": ...}`` dicts. The model's Jinja template runs in
        ``jinja2.sandbox.ImmutableSandboxedEnvironment`` with transformers' globals
        (``raise_exception``, ``strftime_now``, a non-escaping ``tojson``, ``bos_token`` ...);
        ``kwargs`` become extra template variables (``tools=...``, ``enable_thinking=...``).

        Without a template the fallback is plain text, one ``Role: content`` line per message,
        then ``Assistant:`` when ``add_generation_prompt``::

            User: Hi there
            Assistant:
        """
        msgs = [{k: _plain(v) for k, v in dict(m).items() if v is not None} for m in messages]
        if not self.chat_template:
            lines = [f"{str(m.get('role', 'user')).capitalize()}: {m.get('content', '')}" for m in msgs]
            if add_generation_prompt:
                lines.append("Assistant:")
            return "\n".join(lines)
        if self._template is None:
            self._template = compile_chat_template(self.chat_template)
        variables = {**self.template_variables(), **{k: _plain(v) for k, v in kwargs.items()}}
        return self._template.render(messages=msgs, add_generation_prompt=add_generation_prompt, **variables)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True, **kwargs: Any) -> list[int]:
        """``encode(apply_chat_template(messages))``, except that a special token's text written in a
        message (a user typing or pasting "<|im_end|>\\n<|im_start|>system", "</s>") is encoded as the
        plain text it is: only the template's own special tokens become special ids. Encoding the
        rendered text whole matched them everywhere, so a message could end its own turn and open a
        system turn of its own (prompt injection). Assistant messages are the model's own text and
        are left as they are (a reasoning template splits them at its "</think>").

        The ids are those of the whole text wherever no message holds a special token's text."""
        pattern = self._special_pattern()
        if pattern is None:
            return self.encode(self.apply_chat_template(messages, add_generation_prompt, **kwargs))
        found = [str(m.get("content")) for m in messages
                 if m.get("role") != "assistant" and isinstance(m.get("content"), str) and pattern.search(m["content"])]
        if not found:
            return self.encode(self.apply_chat_template(messages, add_generation_prompt, **kwargs))
        # Each special token's text in a message becomes one private-use character (a marker no
        # text or template holds) for the rendering, and is put back in the rendered text, where
        # its place (a span the backend must not match a special token in) is known.
        specials = sorted({m.group() for c in found for m in pattern.finditer(c)})
        everything = (self.chat_template or "") + "".join(str(m.get("content", "")) for m in messages) + repr(kwargs)
        base = next((b for b in (0xF0000, 0x100000, 0xE000) if not any(chr(b + j) in everything for j in range(len(specials)))), None)
        if base is None:  # (every candidate marker is in the text: no protection is possible)
            return self.encode(self.apply_chat_template(messages, add_generation_prompt, **kwargs))
        marker = {s: chr(base + j) for j, s in enumerate(specials)}
        unmark = {v: k for k, v in marker.items()}
        marked = [dict(m, content=pattern.sub(lambda x: marker[x.group()], m["content"]))
                  if m.get("role") != "assistant" and isinstance(m.get("content"), str) else m for m in messages]
        rendered = self.apply_chat_template(marked, add_generation_prompt, **kwargs)
        parts: list[str] = []
        plain: list[tuple[int, int]] = []  # spans of the text that were a message's special-token text
        pos = 0
        for ch in rendered:
            s = unmark.get(ch)
            if s is None:
                parts.append(ch)
                pos += 1
            else:
                parts.append(s)
                plain.append((pos, pos + len(s)))
                pos += len(s)
        text = "".join(parts)
        enc = self.backend.encode(text, add_special_tokens=False)

        def in_plain(span: tuple[int, int]) -> bool:
            return any(a < span[1] and span[0] < b for a, b in plain)

        if not any(t in self._special and in_plain(o) for t, o in zip(enc.ids, enc.offsets)):
            return list(enc.ids)
        # The backend splits a text at its special tokens and encodes the pieces between them on
        # their own: so do we, at the template's special tokens only, the pieces encoded with
        # special tokens read as text.
        out: list[int] = []
        start = 0
        for t, (a, b) in zip(enc.ids, enc.offsets):
            if t in self._special and not in_plain((a, b)):
                out += self._plain_encode(text[start:a])
                out.append(t)
                start = b
        out += self._plain_encode(text[start:])
        return out

    def _special_pattern(self) -> "re.Pattern[str] | None":
        """A regex of the special tokens' texts, longest first (None: there are none)."""
        pat = getattr(self, "_special_re", False)
        if pat is False:
            added = self.backend.get_added_tokens_decoder()
            texts = sorted({t.content for i, t in added.items() if t.special and t.content}, key=lambda s: (-len(s), s))
            pat = re.compile("|".join(map(re.escape, texts))) if texts else None
            self._special_re = pat
        return pat

    def _plain_encode(self, text: str) -> list[int]:
        """``text``'s ids with special tokens' texts encoded as plain text (a copy of the backend
        with ``encode_special_tokens`` set: the shared one is never changed)."""
        if not text:
            return []
        backend = getattr(self, "_plain_backend", None)
        if backend is None:
            backend = tokenizers.Tokenizer.from_str(self.backend.to_str())
            backend.encode_special_tokens = True
            self._plain_backend = backend
        return list(backend.encode(text, add_special_tokens=False).ids)

    # -- files --------------------------------------------------------------------------------
    def save(self, directory: str | os.PathLike) -> Path:
        """Write ``tokenizer.json`` + ``tokenizer_config.json`` (+ ``generation_config.json`` for
        extra stop ids) so that ``Tokenizer.from_hf_dir`` (and transformers) can load it back."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        self.backend.save(str(d / "tokenizer.json"))
        cfg: dict[str, Any] = {"tokenizer_class": "PreTrainedTokenizerFast", "add_bos_token": self.add_bos,
                               "add_eos_token": self.add_eos, "clean_up_tokenization_spaces": False}
        cfg.update(self.template_variables())
        if self.chat_template:
            cfg["chat_template"] = self.chat_template
        (d / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2, ensure_ascii=False), encoding="utf-8")
        extra = sorted(self.eos_ids - {self.eos_id})
        if extra:
            gen = {"eos_token_id": ([self.eos_id] if self.eos_id is not None else []) + extra}
            (d / "generation_config.json").write_text(json.dumps(gen, indent=2), encoding="utf-8")
        return d

    @classmethod
    def from_hf_dir(cls, path: str | os.PathLike) -> "Tokenizer":
        """Load ``tokenizer.json`` with ``tokenizer_config.json`` and, when present,
        ``special_tokens_map.json``, ``generation_config.json``, ``config.json`` (stop ids) and
        ``chat_template.jinja`` (which wins over a template in ``tokenizer_config.json``)."""
        d = Path(path)
        tj = d / "tokenizer.json"
        if not tj.is_file():
            raise ModelLoadError("no tokenizer.json", path=d)
        try:
            backend = tokenizers.Tokenizer.from_file(str(tj))
        except Exception as e:  # the Rust error text is long and multi-line
            raise ModelLoadError(f"cannot parse tokenizer ({_first_line(e)})", path=tj) from None
        tcfg = _read_json(d / "tokenizer_config.json")
        smap = _read_json(d / "special_tokens_map.json")
        gen = _read_json(d / "generation_config.json")
        mcfg = _read_json(d / "config.json")

        def special(key: str) -> int | None:
            tok = _token_content(tcfg.get(key)) or _token_content(smap.get(key))
            return backend.token_to_id(tok) if tok else None

        bos_id, eos_id = special("bos_token"), special("eos_token")
        if bos_id is None and isinstance(mcfg.get("bos_token_id"), int):
            bos_id = mcfg["bos_token_id"]
        extra_eos: list[int] = []
        for src in (gen, mcfg):
            e = src.get("eos_token_id")
            if isinstance(e, int) and not isinstance(e, bool):
                extra_eos.append(e)
            elif isinstance(e, list):  # anything else (a float, a string, an object) is ignored
                extra_eos += [i for i in e if isinstance(i, int) and not isinstance(i, bool)]
        if eos_id is None and extra_eos:
            eos_id = extra_eos[0]

        template = None
        if (d / "chat_template.jinja").is_file():
            try:
                template = (d / "chat_template.jinja").read_text(encoding="utf-8")
            except UnicodeDecodeError:  # named here: the caller's catch-all named tokenizer.json
                raise ModelLoadError("not UTF-8 text", path=d / "chat_template.jinja") from None
            except OSError as e:
                raise ModelLoadError(f"cannot read ({e.strerror or e})", path=d / "chat_template.jinja") from None
        else:
            template = _pick_template(tcfg.get("chat_template"))

        # tokenizer_config's add_bos_token/add_eos_token win over the backend's post-processor,
        # as in transformers: add what is missing, drop a post-processor that adds unwanted ones.
        probe_plain = backend.encode("a", add_special_tokens=False).ids
        probe = backend.encode("a", add_special_tokens=True).ids
        adds_bos = bos_id is not None and len(probe) > len(probe_plain) and probe[0] == bos_id
        adds_eos = eos_id is not None and len(probe) > len(probe_plain) and probe[-1] == eos_id
        want_bos, want_eos = tcfg.get("add_bos_token"), tcfg.get("add_eos_token")
        if (want_bos is False and adds_bos) or (want_eos is False and adds_eos):
            backend.post_processor = None
            adds_bos = adds_eos = False
        return Tokenizer(  # not cls: subclasses such as ByteTokenizer build their own backend
            backend, bos_id=bos_id, eos_id=eos_id, extra_eos_ids=extra_eos,
            unk_id=special("unk_token"), pad_id=special("pad_token"),
            add_bos=bool(want_bos) and not adds_bos, add_eos=bool(want_eos) and not adds_eos,
            chat_template=template, name=d.name,
        )

    @classmethod
    def from_gguf(cls, source: Any) -> "Tokenizer":
        """Build the tokenizer a GGUF file describes in its ``tokenizer.ggml.*`` metadata.

        ``source``: a path, an ``engine.gguf.GGUFFile``, a ``gguf.GGUFReader``, or a metadata dict.
        Supported: ``tokenizer.ggml.model == "gpt2"`` (byte-level BPE) with the pre-tokenizers in
        ``GGUF_PRE_TOKENIZERS``, and ``"llama"`` (sentencepiece BPE with scores and byte fallback:
        Llama 2, Mistral 7B, TinyLlama...). Others raise ``ModelLoadError``.
        """
        if isinstance(source, (str, os.PathLike)):
            from .gguf import read_gguf

            with read_gguf(source) as f:
                return cls.from_gguf(f)
        where = getattr(source, "path", None)
        if hasattr(source, "metadata"):
            md = source.metadata
        elif hasattr(source, "fields"):  # gguf.GGUFReader
            md = {k: f.contents() for k, f in source.fields.items() if k.startswith(("tokenizer.", "general."))}
        elif isinstance(source, Mapping):
            md = source
        else:
            raise TypeError(f"from_gguf expects a path, GGUFFile, GGUFReader or metadata dict, got {type(source).__name__}")
        return _tokenizer_from_gguf_metadata(md, where)


# ---------------------------------------------------------------------------------------------
# GGUF tokenizer metadata -> tokenizers backend
# ---------------------------------------------------------------------------------------------
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                 r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                 r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# llama.cpp's fallback for files with no (or "default") pre-tokenizer: four splits in a row.
_DEFAULT_SPLITS = (r"[\p{P}\$\+<=>\^~\|]+", r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)",
                   r"\p{N}+", r"[0-9][0-9][0-9]")

# tokenizer.ggml.pre -> (split, ignore_merges, add_bos default, NFC), with llama.cpp's names and
# groups (llama-vocab.cpp). split: "gpt2" = ByteLevel's built-in GPT-2 regex
# 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ ; "digits+gpt2" = every
# digit alone first (SmolLM/StarCoder: their tokenizer.json has Digits(individual_digits) before
# ByteLevel); else a tuple of regexes applied in turn, each keeping matches and gaps ("isolated").
# ignore_merges: a pre-token that is itself in the vocabulary is taken whole (Llama 3's
# tokenizer.json sets the same flag). NFC: Qwen2's tokenizer.json normalises; llama.cpp does not.
# llama.cpp falls back to "default" for names it does not know; we refuse them instead, since a
# wrong split silently degrades every prompt.
GGUF_PRE_TOKENIZERS: dict[str, tuple[Any, bool, bool, bool]] = {
    **dict.fromkeys(("gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "trillion", "granite-docling", "exaone4",
                     "gigachat", "mellum", "a.x-4.0"), ("gpt2", False, False, False)),
    **dict.fromkeys(("smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"),
                    ("digits+gpt2", False, False, False)),
    **dict.fromkeys(("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2"),
                    ((_LLAMA3_SPLIT,), True, True, False)),
    **dict.fromkeys(("dbrx", "smaug-bpe"), ((_LLAMA3_SPLIT,), False, False, False)),
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "megrez"), ((_QWEN2_SPLIT,), False, False, True)),
    "stablelm2": ((_QWEN2_SPLIT,), False, False, False),
    "tekken": ((_TEKKEN_SPLIT,), True, True, False),
    "default": (_DEFAULT_SPLITS, False, False, False),
}

_CONTROL, _USER_DEFINED = 3, 4  # tokenizer.ggml.token_type values (llama.cpp's llama_token_type)
_LLAMA3_ENDS = ("<|end_of_text|>", "<|eom_id|>", "<|eot_id|>")


def _tokenizer_from_gguf_metadata(md: Mapping[str, Any], where: Any) -> Tokenizer:
    def fail(problem: str) -> ModelLoadError:
        return ModelLoadError(problem, path=where)

    kind = md.get("tokenizer.ggml.model")
    if kind is None:
        raise fail("has no tokenizer (no tokenizer.ggml.model in its metadata)")
    if kind == "llama":
        return _spm_tokenizer_from_gguf_metadata(md, where)
    if kind != "gpt2":
        what = {"bert": "WordPiece (bert)", "t5": "unigram (t5)"}.get(kind, repr(kind))
        raise fail(f"tokenizer model {what} is not supported (supported: gpt2 byte-level BPE, llama sentencepiece BPE)")
    tokens = md.get("tokenizer.ggml.tokens")
    merges = md.get("tokenizer.ggml.merges")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise fail("tokenizer.ggml.tokens is missing, empty or not a list of strings")
    if not isinstance(merges, list) or not all(isinstance(m, str) for m in merges):
        raise fail("tokenizer.ggml.merges is missing or not a list of strings (a gpt2 tokenizer needs its merges)")
    types = md.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    if not isinstance(types, list) or len(types) != len(tokens):
        raise fail(f"tokenizer.ggml.token_type does not have one entry per token ({len(tokens)})")
    pre_name = md.get("tokenizer.ggml.pre") or "default"
    if pre_name not in GGUF_PRE_TOKENIZERS:
        raise fail(f"pre-tokenizer {pre_name!r} is not supported (supported: {', '.join(sorted(GGUF_PRE_TOKENIZERS))})")
    split, ignore_merges, add_bos_default, nfc = GGUF_PRE_TOKENIZERS[pre_name]

    # Byte-level vocabularies spell every byte as a printable character; the rare token stored
    # otherwise gets respelled from its UTF-8 bytes (transformers' GGUF loader does the same).
    # Control and user-defined tokens are the HF tokenizer's added tokens, which llama.cpp's
    # converter stores as their plain text ("<｜User｜>", DeepSeek-R1's): they keep it, as the
    # added tokens below match that text.
    alphabet = set(_U2B)
    vocab: dict[str, int] = {}
    for i, (tok, ty) in enumerate(zip(tokens, types)):
        added = ty in (_CONTROL, _USER_DEFINED) and tok
        spelled = tok if added or set(tok) <= alphabet else "".join(_B2U[b] for b in tok.encode("utf-8"))
        vocab.setdefault(spelled, i)
    pairs = []
    for m in merges:
        a, sep, b = m.partition(" ")
        if not sep or not a or not b:
            raise fail(f"tokenizer.ggml.merges has a malformed entry {m!r}")
        pairs.append((a, b))
    try:
        bpe = models.BPE(vocab=vocab, merges=pairs, ignore_merges=ignore_merges)
    except Exception as e:
        raise fail(f"cannot build the BPE tokenizer from its metadata ({_first_line(e)})") from None
    backend = tokenizers.Tokenizer(bpe)
    if nfc:
        backend.normalizer = normalizers.NFC()
    if split == "gpt2":
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    elif split == "digits+gpt2":
        backend.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    else:
        backend.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(r), behavior="isolated") for r in split]
            + [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    backend.decoder = decoders.ByteLevel()

    # Control tokens (<|im_start|>) become special added tokens so they are matched whole in text
    # and skippable in decode; user-defined ones (<think>) are added but not special.
    special = [AddedToken(t, special=True, normalized=False)
               for t, ty in zip(tokens, types) if ty == _CONTROL and t and t in vocab]
    user = [AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, types) if ty == _USER_DEFINED and t and t in vocab]
    if special:
        backend.add_special_tokens(special)
    if user:
        backend.add_tokens(user)

    return _gguf_tokenizer(md, where, backend, tokens, types, add_bos_default)


def _gguf_tokenizer(md: Mapping[str, Any], where: Any, backend: tokenizers.Tokenizer, tokens: list[str],
                    types: list[int], add_bos_default: bool, default_ids: Mapping[str, int] | None = None) -> Tokenizer:
    """The ``Tokenizer`` around a backend built from GGUF metadata: special ids, stop ids, flags.
    ``default_ids``: ids llama.cpp assumes for keys a file leaves out (sentencepiece: bos 1, ...)."""
    def tid(key: str) -> int | None:
        v = md.get(key, (default_ids or {}).get(key))
        return int(v) if isinstance(v, int) and 0 <= v < len(tokens) else None

    add_bos = md.get("tokenizer.ggml.add_bos_token", add_bos_default)
    add_eos = md.get("tokenizer.ggml.add_eos_token", False)
    extra = [t for t in (tid("tokenizer.ggml.eot_token_id"), tid("tokenizer.ggml.eom_token_id")) if t is not None]
    # Llama 3.x stops at <|end_of_text|>, <|eom_id|> and <|eot_id|> (its generation_config.json;
    # llama.cpp too), but its file names one eos (Instruct: <|eot_id|>) and the chat template
    # writes only <|eot_id|>: in a file of that family all three stop generation.
    found = {t: i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == _CONTROL and t in _LLAMA3_ENDS}
    if "<|eot_id|>" in found and "<|end_of_text|>" in found:
        extra += found.values()
    # Qwen2/2.5/3 stop at <|im_end|> and <|endoftext|> (generation_config.json: [151645, 151643];
    # llama.cpp too), but the file names one eos (Instruct: <|im_end|>). Keyed on the architecture:
    # SmolLM2 (a llama file) has the same two tokens and its generation_config lists only <|im_end|>.
    if str(md.get("general.architecture", "")).startswith("qwen"):
        extra += [i for i, (t, ty) in enumerate(zip(tokens, types)) if ty == _CONTROL and t == "<|endoftext|>"]
    name = md.get("general.name") or (Path(where).name if where else "gguf")
    return Tokenizer(
        backend, bos_id=tid("tokenizer.ggml.bos_token_id"), eos_id=tid("tokenizer.ggml.eos_token_id"),
        extra_eos_ids=extra, unk_id=tid("tokenizer.ggml.unknown_token_id"), pad_id=tid("tokenizer.ggml.padding_token_id"),
        add_bos=bool(add_bos), add_eos=bool(add_eos), chat_template=md.get("tokenizer.chat_template"), name=str(name),
    )


# tokenizer.ggml.token_type values of pieces that sentencepiece never builds by merging: unknown
# and control (<unk>, <s>, [INST]) and user-defined pieces are matched whole, bytes (<0x0A>) only
# come from byte fallback.
_UNKNOWN, _BYTE = 2, 6
_SPM_NOT_MERGED = (_UNKNOWN, _CONTROL, _USER_DEFINED, _BYTE)
_SPM_DEFAULT_IDS = {"tokenizer.ggml.bos_token_id": (1, "<s>"), "tokenizer.ggml.eos_token_id": (2, "</s>"),
                    "tokenizer.ggml.unknown_token_id": (0, "<unk>")}


def _spm_tokenizer_from_gguf_metadata(md: Mapping[str, Any], where: Any) -> Tokenizer:
    """``tokenizer.ggml.model == "llama"``: sentencepiece BPE (Llama 1/2, Mistral 7B, TinyLlama,
    Vicuna...), built as the layout of those models' own ``tokenizer.json``.

    A GGUF stores no merges for these: each piece has a score, and sentencepiece (like llama.cpp's
    ``llm_tokenizer_spm``) repeatedly joins the adjacent pair whose joined piece scores highest. The
    same result comes from a BPE whose merges are every split ``a + b`` of every piece, ranked by
    that piece's score (transformers' GGUF loader recovers merges the same way). Characters with no
    piece become their UTF-8 bytes' ``<0xNN>`` pieces (byte fallback).

    Text goes through ``Prepend("▁")`` (when ``tokenizer.ggml.add_space_prefix``, default true) and
    ``Replace(" ", "▁")`` as a normaliser, as in Llama-2's and Mistral's ``tokenizer.json``: the
    prefix is added to each stretch of text between special tokens, which is also what llama.cpp
    does (a space before the text after each special token). transformers' own GGUF loader
    differs there: its ``Metaspace(prepend_scheme="first")`` adds it only at the start, so
    ``"[INST] Hi"`` gets ``▁Hi`` there and ``▁▁Hi`` here, in llama.cpp and in the original.
    Decoding turns ``▁`` back into spaces, joins byte pieces and strips one leading space.

    One inexactness: where two different pieces have the same score and their pairs overlap,
    sentencepiece joins the leftmost pair first, the BPE the lower-ranked one (here: the lower id).
    Real vocabularies give every mergeable piece its own score.
    """
    def fail(problem: str) -> ModelLoadError:
        return ModelLoadError(problem, path=where)

    tokens = md.get("tokenizer.ggml.tokens")
    if not isinstance(tokens, list) or not tokens or not all(isinstance(t, str) for t in tokens):
        raise fail("tokenizer.ggml.tokens is missing, empty or not a list of strings")
    scores = md.get("tokenizer.ggml.scores")
    if scores is None:
        raise fail("tokenizer model sentencepiece (llama) is not supported without tokenizer.ggml.scores "
                   "(the pieces' merge priorities)")
    if (not isinstance(scores, list) or len(scores) != len(tokens)
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in scores)):
        raise fail(f"tokenizer.ggml.scores is not a list of one number per token ({len(tokens)})")
    types = md.get("tokenizer.ggml.token_type")
    if types is None:
        # No types: bos/eos/unk (llama.cpp's default ids where the file names none) are still special.
        types = [1] * len(tokens)
        for key, (default, text) in _SPM_DEFAULT_IDS.items():
            v = md.get(key, default if tokens[default:default + 1] == [text] else None)
            if isinstance(v, int) and 0 <= v < len(tokens):
                types[v] = _UNKNOWN if key.endswith("unknown_token_id") else _CONTROL
    if not isinstance(types, list) or len(types) != len(tokens):
        raise fail(f"tokenizer.ggml.token_type does not have one entry per token ({len(tokens)})")

    # A piece listed twice keeps its last id, as in llama.cpp's token_to_id (never seen in practice).
    vocab = {tok: i for i, tok in enumerate(tokens)}
    ranked = []
    for tok, i in vocab.items():
        if len(tok) < 2 or types[i] in _SPM_NOT_MERGED:
            continue
        for k in range(1, len(tok)):
            left, right = tok[:k], tok[k:]
            if left in vocab and right in vocab:
                ranked.append((-float(scores[i]), i, k, left, right))
    ranked.sort()
    default_ids = {key: d for key, (d, text) in _SPM_DEFAULT_IDS.items() if tokens[d:d + 1] == [text]}
    unk = md.get("tokenizer.ggml.unknown_token_id", default_ids.get("tokenizer.ggml.unknown_token_id"))
    unk_token = tokens[unk] if isinstance(unk, int) and 0 <= unk < len(tokens) else None
    try:
        bpe = models.BPE(vocab=vocab, merges=[(a, b) for *_, a, b in ranked], byte_fallback=True,
                         unk_token=unk_token, fuse_unk=True)
    except Exception as e:
        raise fail(f"cannot build the sentencepiece tokenizer from its metadata ({_first_line(e)})") from None
    backend = tokenizers.Tokenizer(bpe)
    prefix = bool(md.get("tokenizer.ggml.add_space_prefix", True))
    backend.normalizer = normalizers.Sequence(
        ([normalizers.Prepend("\u2581")] if prefix else []) + [normalizers.Replace(" ", "\u2581")])
    backend.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse()]
        + ([decoders.Strip(" ", 1, 0)] if prefix else []))

    # Unknown and control pieces are special added tokens (matched whole in text, as llama.cpp
    # does when it parses specials, and skippable in decode); user-defined ones are added, not
    # special. normalized=False: they are looked for in the text as written, before the prefix,
    # so the text after one gets its own "▁" prefix, as in llama.cpp.
    special = [AddedToken(t, special=True, normalized=False)
               for i, (t, ty) in enumerate(zip(tokens, types)) if ty in (_UNKNOWN, _CONTROL) and t and vocab[t] == i]
    user = [AddedToken(t, special=False, normalized=False)
            for i, (t, ty) in enumerate(zip(tokens, types)) if ty == _USER_DEFINED and t and vocab[t] == i]
    if special:
        backend.add_special_tokens(special)
    if user:
        backend.add_tokens(user)
    return _gguf_tokenizer(md, where, backend, tokens, types, True, default_ids)


# ---------------------------------------------------------------------------------------------
# Byte tokenizer
# ---------------------------------------------------------------------------------------------
class ByteTokenizer(Tokenizer):
    """Ids 0..255 are the bytes of the UTF-8 text; 256 ``<|bos|>``, 257 ``<|eos|>``, 258 ``<|pad|>``.

    Built as a byte-level BPE with no merges, so ``save`` writes a ``tokenizer.json`` that
    ``Tokenizer.from_hf_dir`` (or transformers) loads back. Any text round-trips; specials written
    in the text are matched as specials.
    """

    BOS, EOS, PAD = 256, 257, 258
    SPECIALS = ("<|bos|>", "<|eos|>", "<|pad|>")

    def __init__(self, chat_template: str | None = None):
        backend = tokenizers.Tokenizer(models.BPE(vocab={_B2U[b]: b for b in range(256)}, merges=[]))
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        backend.decoder = decoders.ByteLevel()
        backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in self.SPECIALS])
        super().__init__(backend, bos_id=self.BOS, eos_id=self.EOS, pad_id=self.PAD,
                         chat_template=chat_template, name="bytes")


# ---------------------------------------------------------------------------------------------
# Streaming detokenisation
# ---------------------------------------------------------------------------------------------
class StreamDecoder:
    """Ids in, text out, as a chat UI wants it: never half a UTF-8 character, never U+FFFD for a
    character whose bytes are split across tokens (it is held until complete).

    ``"".join(push(...) for each chunk) + flush() == tokenizer.decode(all ids)``.

    Incremental detokenisation as in llama.cpp / vLLM: each ``push`` decodes a short window, a few
    already-emitted tokens of context (so decoders that treat the first token specially, like
    sentencepiece's leading space, see the same neighbours as in a full decode) plus the new ones,
    and emits the difference. Both ends of that window sit on character boundaries, found from the
    tokens' raw bytes: the end is the last point not inside an unfinished-but-valid UTF-8 sequence.
    Invalid bytes are emitted at once as U+FFFD, as no later byte can make them valid. Cost per
    call: O(new tokens + CONTEXT).

    One inexactness, for invalid UTF-8 from sentencepiece byte-fallback vocabularies only:
    tokenizers' ``ByteFallback`` turns every byte of a run of ``<0xNN>`` pieces into U+FFFD when
    the run is invalid anywhere, which cannot be known before the run ends; the streamed text may
    then hold fewer U+FFFD than a full decode. Byte-level (GPT-2 style) vocabularies are exact.
    """

    CONTEXT = 4  # tokens of already-emitted context kept in the window

    def __init__(self, tokenizer: Tokenizer, skip_special_tokens: bool = False):
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self._ids: list[int] = []  # window: ids[:read] emitted context, ids[read:] not yet emitted
        self._read = 0

    def push(self, ids: Iterable[int]) -> str:
        self._ids.extend(int(i) for i in ids)
        end = len(self._ids)
        while end > self._read and not self._is_boundary(end):  # usually 0 or 1 step
            end -= 1
        if end == self._read:
            return ""
        return self._emit(end)

    def flush(self) -> str:
        """Emit whatever is held (an unfinished character becomes U+FFFD, as in a full decode)."""
        out = self._emit(len(self._ids)) if len(self._ids) > self._read else ""
        self._ids, self._read = [], 0
        return out

    def fork(self) -> "StreamDecoder":
        """A copy with a window of its own: what is pushed to it leaves this one as it is."""
        other = StreamDecoder(self.tokenizer, self.skip_special_tokens)
        other._ids, other._read = list(self._ids), self._read
        return other

    def held(self) -> str:
        """The whole characters pushed but not emitted yet: a byte-level token can end a text and
        begin a character (SmolLM2's " \\xf0\\x9f", a space and half an emoji), and the token is
        held until that character is complete; its space is text already (an unfinished
        character at the end is left out)."""
        data = b"".join(self._bytes(i) for i in self._ids[self._read:])
        return _UTF8_PROBE(errors="replace").decode(data, False)

    def _bytes(self, i: int) -> bytes:
        if self.skip_special_tokens and self.tokenizer.is_special(i):
            return b""
        return self.tokenizer.token_bytes(i)

    def _is_boundary(self, pos: int) -> bool:
        """Whether a UTF-8 decoder is back in its initial state between ids[pos-1] and ids[pos]
        (ids[read] is known to be such a point): nothing is buffered there, or what is buffered
        is rejected by the next byte (then it is one U+FFFD whatever comes later, exactly what
        decoding the bytes cut at ``pos`` gives)."""
        parts, n, i = [], 0, pos
        while i > self._read and n < 4:  # an unfinished sequence is at most 3 bytes
            i -= 1
            parts.append(self._bytes(self._ids[i]))
            n += len(parts[-1])
        probe = _UTF8_PROBE(errors="replace")
        probe.decode(b"".join(reversed(parts)), False)
        held = probe.getstate()[0]
        if not held:
            return True
        nxt = next((b for i in self._ids[pos:] if (b := self._bytes(i))), b"")
        if not nxt:
            return False  # the next bytes may still complete it: hold
        return _UTF8_PROBE(errors="replace").decode(held + nxt[:1], False).startswith("\ufffd")

    def _emit(self, end: int) -> str:
        dec, skip = self.tokenizer.decode, self.skip_special_tokens
        before = dec(self._ids[:self._read], skip_special_tokens=skip)
        text = dec(self._ids[:end], skip_special_tokens=skip)
        out = text[len(before):] if text.startswith(before) else text[_common_prefix(before, text):]
        # Next context: the last CONTEXT emitted tokens, moved back to a character boundary.
        start = max(self._read, end - self.CONTEXT)
        while start > self._read and not self._is_boundary(start):
            start -= 1
        if not any(self._bytes(i) for i in self._ids[start:end]):
            start = 0  # only skipped/empty tokens: keep the old context, which still shows text
        del self._ids[:start]
        self._read = end - start
        return out


_UTF8_PROBE = codecs.getincrementaldecoder("utf-8")


def _common_prefix(a: str, b: str) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


# ---------------------------------------------------------------------------------------------
# Chat templates
# ---------------------------------------------------------------------------------------------
def compile_chat_template(source: str):
    """Compile a chat template in Jinja's immutable sandbox with the globals transformers gives
    templates. Templates come from model files, so nothing outside the sandbox is reachable."""
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _Generation(jinja2.ext.Extension):
        # {% generation %}...{% endgeneration %} marks assistant text for training masks;
        # rendering just keeps the body.
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return time.strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ModelLoadError(f"chat template does not compile (line {e.lineno}: {e.message})") from None


def _plain(v: Any) -> Any:
    """Only plain JSON-like data reaches a template (objects with methods could escape the sandbox)."""
    if v is None or type(v) in (str, int, float, bool):
        return v
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    if isinstance(v, str):  # subclasses (enums, numpy scalars) carry extra methods: strip them
        return str.__str__(v)
    if isinstance(v, bool):
        return bool(v)
    if isinstance(v, int):
        return int(v)
    if isinstance(v, float):
        return float(v)
    return str(v)


def _pick_template(t: Any) -> str | None:
    if isinstance(t, str):
        return t
    if isinstance(t, list):  # [{"name": "default", "template": ...}, {"name": "tool_use", ...}]
        named = {x.get("name"): x.get("template") for x in t if isinstance(x, dict)}
        return named.get("default") or next(iter(named.values()), None)
    return None


# ---------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------
def _drop_prefix_space(state: dict[str, Any]) -> bool:
    """Take the encoder's own prefix space out of a ``tokenizer.json`` state, in place
    (``Tokenizer.encode_unprefixed``): ``Prepend("▁")`` normalisers go, Metaspace pre-tokenizers
    prepend ``never``, ByteLevel ones add no prefix space. True if anything changed."""
    changed = False

    def walk(node: Any, list_key: str) -> Any:
        nonlocal changed
        if not isinstance(node, dict):
            return node
        kind = node.get("type")
        if kind == "Sequence" and isinstance(node.get(list_key), list):
            kept = [walk(n, list_key) for n in node[list_key]]
            node[list_key] = [n for n in kept if n is not None]
        elif kind == "Prepend" and node.get("prepend") == "\u2581":
            changed = True
            return None
        elif kind == "Metaspace":
            if node.get("prepend_scheme", "never") != "never" or node.get("add_prefix_space"):
                changed = True
                node["prepend_scheme"] = "never"
                if "add_prefix_space" in node:
                    node["add_prefix_space"] = False
        elif kind == "ByteLevel" and node.get("add_prefix_space"):
            changed = True
            node["add_prefix_space"] = False
        return node

    state["normalizer"] = walk(state.get("normalizer"), "normalizers")
    state["pre_tokenizer"] = walk(state.get("pre_tokenizer"), "pretokenizers")
    return changed


def _decoder_kind(backend: tokenizers.Tokenizer) -> tuple[bool, bool]:
    """(byte_level, sentencepiece-like) from the backend's decoder description."""
    dec = backend.decoder
    if dec is None:
        return False, False
    try:
        desc = json.dumps(json.loads(dec.__getstate__()))
    except Exception:
        return False, False
    byte_level = '"ByteLevel"' in desc
    return byte_level, not byte_level and any(k in desc for k in ('"Metaspace"', '"ByteFallback"', "\u2581", "\\u2581"))


def _read_json(p: Path) -> dict[str, Any]:
    if not p.is_file():
        return {}
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"invalid JSON ({e})", path=p) from None
    return data if isinstance(data, dict) else {}


def _token_content(v: Any) -> str | None:
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):  # serialized AddedToken
        return v["content"]
    return None


def _first_line(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return (s[0] if s else type(e).__name__)[:200]
