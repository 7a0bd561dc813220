"""Vocabulary bridges (heterogeneous-vocab paper; engine/drafters/vocab.py): token maps on real
tokenizer pairs, SLEM's re-tokenization, greedy equivalence for every bridge with drafts that are
accepted (fully and in part: designed pairs, tests/accept_util.py), distribution tests for union,
TLI and SLRS, a permuted-vocabulary drafter that bridges back to perfect agreement, and what a
bridge refuses."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import tokenizers
import torch
from tokenizers import decoders, models, pre_tokenizers

from engine.drafters.base import DraftRequest
from engine.drafters.vocab import BridgeDrafter, BridgeError, VocabMap, same_vocabulary
from engine.generate import Decoder, run_generation
from engine.loading import load
from engine.slrs import PsiTooLarge
from engine.strategy import StrategyError, preset
from engine.tokenizer import ByteTokenizer, Tokenizer, bytes_to_unicode

from .test_generate import _seeded
from .accept_util import bigram_model, chain_bigram, exact_law_p, flat_cost, partial_steps
from .tiny import saved, sharpen, two_sample_p
from .vocab_pairs import permuted, smollm2, trained_bpe

ALPHA = "abcdefghijklmnopqrstuvwxyz .,"


def tokens_of(events):
    return [t for e in events for t in e.emitted]


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return str(tmp_path_factory.mktemp("vocab"))


def tiny_model(root: str, name: str, vocab: int, kind: str = "llama", seed: int = 0) -> Path:
    """A tiny random model with ``vocab`` ids (transformers save_pretrained), sharpened as tests/tiny.py does."""
    from transformers import AutoModelForCausalLM, LlamaConfig, Mamba2Config

    path = Path(root) / f"{name}-{vocab}-{kind}-{seed}"
    if (path / "config.json").exists():
        return path
    if kind == "llama":
        cfg = LlamaConfig(vocab_size=vocab, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                          num_key_value_heads=1, max_position_embeddings=1024, tie_word_embeddings=False)
    else:
        cfg = Mamba2Config(vocab_size=vocab, hidden_size=32, num_hidden_layers=1, num_heads=4, head_dim=16, state_size=8,
                           n_groups=1, expand=2, conv_kernel=4, tie_word_embeddings=False)
    torch.manual_seed(seed)
    sharpen(AutoModelForCausalLM.from_config(cfg)).save_pretrained(path)
    return path


def permuted_copy(src: Path, dst: Path, perm: list[int]) -> Path:
    """The model at ``src`` with its vocabulary re-indexed: new id d is old id perm[d]."""
    from transformers import AutoModelForCausalLM

    if (dst / "config.json").exists():
        return dst
    m = AutoModelForCausalLM.from_pretrained(src)
    idx = torch.tensor(perm)
    with torch.no_grad():
        m.get_input_embeddings().weight.copy_(m.get_input_embeddings().weight[idx].clone())
        m.get_output_embeddings().weight.copy_(m.get_output_embeddings().weight[idx].clone())
    m.save_pretrained(dst)
    return dst


# ---- token maps ----------------------------------------------------------------------------------------
PAIRS = {
    "bytes": lambda: ByteTokenizer(),
    "bpe-bytelevel": lambda: trained_bpe(1200, "bytelevel"),
    "bpe-lowercase": lambda: trained_bpe(1200, "metaspace", "lower"),
    "bpe-collapse": lambda: trained_bpe(1200, "metaspace", "collapse"),
}


@pytest.mark.parametrize("pair", PAIRS)
def test_vocab_map_pairs_tokens_that_spell_the_same_bytes(pair):
    t, d = smollm2(), PAIRS[pair]()
    assert not same_vocabulary(t, d)
    m = VocabMap(t, d)
    assert m.size > 200
    for dd, tt in zip(m.shared_d.tolist(), m.shared_t.tolist()):
        if d.is_special(dd):
            continue
        assert d.token_bytes(dd) == t.token_bytes(tt), (d.token_str(dd), t.token_str(tt))
    # the drafter's end of sequence ends the target's turn
    assert m.d2t[d.eos_id] == m.target_eos and t.id_to_token(m.target_eos) == "<|im_end|>"
    if pair == "bytes":
        # every byte SmolLM2 has as a token of its own (235 of 256: it lacks e.g. 0xC0, 0xFF), plus EOS
        singles = {t.token_bytes(i) for i in range(t.vocab_size) if len(t.token_bytes(i)) == 1 and not t.is_special(i)}
        assert m.size == len(singles) + 1 and len(singles) == 235


def test_same_vocabulary_is_not_bridged():
    t = smollm2()
    assert same_vocabulary(t, t) and same_vocabulary(None, t)
    p, _ = permuted(trained_bpe(96, alphabet=ALPHA))
    assert not same_vocabulary(trained_bpe(96, alphabet=ALPHA), p)


# ---- history and re-tokenization ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def smol_byte_bridge(root):
    """A bridge from a tiny random byte-level Mamba-2 drafter to SmolLM2's tokenizer."""
    drafter = load(str(tiny_model(root, "bytes", 264, "mamba2"))).model
    return BridgeDrafter(drafter, smollm2(), ByteTokenizer(), 49152)


def test_drafter_history_is_the_exact_text(smol_byte_bridge, root):
    t = smollm2()
    text = "<|im_start|>user\nHé, 中文 and emoji 🙂 ok<|im_end|>\n<|im_start|>assistant\n"
    ids = t.encode(text)
    hist, held = smol_byte_bridge.drafter_history(ids)
    assert bytes(hist) == text.encode() and held == b""
    # an unfinished character: a text drafter waits for the rest of its bytes
    lower = trained_bpe(1200, "metaspace", "lower")
    br = BridgeDrafter(load(str(tiny_model(root, "lower", lower.vocab_size, "llama"))).model, t, lower, 49152)
    cut = [i for i in t.encode("x 🙂")]
    partial = cut[:-1] if len(t.token_bytes(cut[-1])) < 4 else cut
    h, held = br.drafter_history(partial)
    assert lower.decode(h).startswith("x")
    assert held == b"".join(t.token_bytes(i) for i in partial)[len("x ".encode()):] or held == b""


def test_slem_retokenizes_with_a_look_behind(smol_byte_bridge, monkeypatch):
    t = smollm2()
    br = smol_byte_bridge
    monkeypatch.setattr(br, "draft_cut", "none")  # every token the draft spells (the cut: the next test)
    hello = t.encode("Hello")
    root = hello[-1]
    # a draft that starts a new word: exactly the target's tokens for it
    assert br._retokenize(list(b" world, again"), root, t.token_bytes(root), b"") == t.encode(" world, again")
    # a draft that finishes the root's word: the look-behind would merge it into one token with the
    # root, which is not the history; the draft alone is encoded
    hel = t.encode("Hel")
    assert len(hel) == 1
    got = br._retokenize(list(b"lo there"), hel[0], t.token_bytes(hel[0]), b"")
    assert b"".join(t.token_bytes(i) for i in got) == b"lo there"
    # the drafter's end of sequence becomes the target's end of turn; a cut character is dropped
    got = br._retokenize(list(b" ok") + [ByteTokenizer.EOS], root, t.token_bytes(root), b"")
    assert got == t.encode(" ok") + [t.token_to_id("<|im_end|>")]
    got = br._retokenize(list(" é".encode())[:-1], root, t.token_bytes(root), b"")
    assert b"".join(t.token_bytes(i) for i in got) == b" "


def test_slem_proposes_only_what_ends_before_the_drafts_last_word(smol_byte_bridge, monkeypatch):
    """A draft cut short by its length ends inside a word most of the time, and the target spells a
    whole word otherwise than its start: SLEM proposes what ends before the draft's last
    pre-tokenizer piece ("piece", the default), or all but its last token ("token")."""
    t = smollm2()
    br = smol_byte_bridge
    assert br.draft_cut == "piece"
    root = t.encode("Hello")[-1]

    def spelled(draft: bytes, extra=()) -> bytes:
        return b"".join(t.token_bytes(i) for i in br._retokenize(list(draft) + list(extra), root, t.token_bytes(root), b""))

    assert spelled(b" world, again") == b" world,"
    assert spelled(b" rainbow forms wh") == b" rainbow forms"
    assert spelled(b" 123") == b" 12"  # SmolLM2 splits digits: each is a piece
    assert spelled(b" rainb") == b""  # nothing of the draft is sure to be how the target goes on
    assert spelled(b" world\n\n- it") == b" world\n\n-"
    assert spelled(" wörld, é".encode()) == " wörld,".encode()  # character offsets, not bytes
    # the drafter's end of sequence closes the draft: every token and the end of turn
    end = t.token_to_id("<|im_end|>")
    assert br._retokenize(list(b" ok") + [ByteTokenizer.EOS], root, t.token_bytes(root), b"") == t.encode(" ok") + [end]
    # an invalid UTF-8 sequence inside the draft: the pieces cannot be read, so all but the last token
    got = br._retokenize(list(b" ab \xff cd ef"), root, t.token_bytes(root), b"")
    full = br._spelling(t.encode(b" ab \xff cd ef".decode("utf-8", errors="replace")), b" ab \xff cd ef")
    assert got == full[:-1]
    monkeypatch.setattr(br, "draft_cut", "token")
    assert br._retokenize(list(b" world, again"), root, t.token_bytes(root), b"") == t.encode(" world, again")[:-1]
    # a tokenizer whose pieces cannot be told (a normaliser): all but the last token
    lower = trained_bpe(1200, "metaspace", "lower")
    assert lower.last_piece_start("ab cd") is None
    assert t.last_piece_start("Hi there") == 2 and t.last_piece_start("") is None


# ---- greedy: every bridge is plain greedy decoding, and its drafts are accepted ---------------------------------
# A designed pair per drafter tokenizer (tests/accept_util.bigram_model: real checkpoints whose next
# token depends on the last one only): the target answers the chat with TEXT over and over in
# SmolLM2's ids, and the drafter spells the same text in its own ids, wrong at one token of each
# period (the right one is its second choice: trees recover it). Every byte of TEXT occurs once, so
# a byte drafter's next byte is a function of its last; SmolLM2 splits it into multi-byte words
# (" the", "quick"), single bytes (",", "1") and an emoji in two tokens (a history that ends inside a
# character: a text drafter holds its first bytes back).
TEXT = " the,quick-brown:lazy.12\U0001F642"
CHAT = "<|im_start|>user\nWrite a haiku about the sea.<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def text_pairs(root):
    """pair -> a Decoder of the designed target and that pair's designed drafter (built once)."""
    t = smollm2()
    prompt = t.encode(CHAT)
    full = t.encode(CHAT + TEXT * 4)
    assert full[:len(prompt)] == prompt
    chain = full[len(prompt) - 1:]  # from the prompt's last token ("\n") on
    target = load(str(bigram_model(Path(root) / "spell-target", "llama", t.vocab_size, chain_bigram(chain),
                                   {chain[1]: 8.0}, base=0.0))).model
    made: dict = {}

    def get(pair: str) -> Decoder:
        if pair in made:
            return made[pair]
        d = PAIRS[pair]()
        if pair == "bytes":
            rows = chain_bigram(list((CHAT[-1] + TEXT * 4).encode()))
            rows[ord("k")] = {ord("!"): 8.0, ord("-"): 4.0}  # "quick!" first, "quick-" second
            kind, vocab, default = "mamba2", 264, {ord(" "): 8.0}
        else:
            dchain = d.encode(CHAT + TEXT * 4)[len(d.encode(CHAT)) - 1:]
            rows = chain_bigram(dchain)
            # the drafter re-encodes the target's history: where it ends at a target token inside a
            # drafter token ("-" of "-b"), its last token has a successor too
            text, at = CHAT + TEXT * 4, len(CHAT.encode())
            for tok in chain[1:-1]:
                at += len(t.token_bytes(tok))
                cut = text.encode()[:at].decode(errors="ignore")
                rows.setdefault(d.encode(cut)[-1], {d.encode(text[len(cut):])[0]: 8.0})
            row, n = d.token_to_id("row"), d.token_to_id("n")
            assert rows[row] == {n: 8.0}
            rows[row] = {d.token_to_id("s"): 8.0, n: 4.0}  # "brows" first, "brown" second
            kind, vocab, default = "llama", d.vocab_size, {dchain[1]: 8.0}
        drafter = load(str(bigram_model(Path(root) / f"spell-{pair}", kind, vocab, rows, default, base=0.0))).model
        made[pair] = dec = Decoder(target, drafter, target_tokenizer=t, drafter_tokenizer=d)
        dec.verify_cost = flat_cost()  # optimal's tree size from acceptance alone, not this machine's load
        return dec
    return get


GREEDY = [
    ("tli", preset("sd", draft_len=4, vocab="tli")),
    ("union", preset("sd", draft_len=4, vocab="union")),
    ("slem", preset("sd", draft_len=8, vocab="slem")),  # (a byte drafter's 8 tokens: two or three words)
    ("auto", preset("sd", draft_len=8)),
    ("tli-tree", preset("tree", tree=(2, 2, 1), vocab="tli")),
    ("slem-tree", preset("tree", tree=(2, 2, 1, 1, 1, 1, 1, 1), vocab="slem")),
    ("tli-mab", preset("mab", vocab="tli", arms=((2, 1), (1, 1, 1)))),
    ("slem-optimal", preset("optimal", node_budget=24, vocab="slem")),
]


@pytest.mark.parametrize("pair", ["bytes", "bpe-bytelevel", "bpe-lowercase", "bpe-collapse"])
def test_every_bridge_is_plain_greedy_on_smollm2_pairs(pair, text_pairs):
    """SmolLM2's tokenizer on the designed target; drafters of another vocabulary. Every bridge's
    drafts are accepted, some in part (the correction from an inner row), and the output is the
    target's plain greedy text."""
    t = smollm2()
    dec = text_pairs(pair)
    assert dec.bridged
    prompt = t.encode(CHAT)
    ref = tokens_of(run_generation(dec, prompt, preset("ar"), 24)[0])
    assert t.decode(ref).startswith(TEXT + TEXT[:8])
    for name, s in GREEDY:
        evs, _ = run_generation(dec, prompt, s, 24)
        assert tokens_of(evs) == ref, name
        accepted = sum(e.accepted for e in evs)
        assert accepted >= 4 and partial_steps(evs) > 0, (name, [(e.accepted, e.drafted) for e in evs])


@pytest.fixture(scope="module")
def self_pair(root):
    """A tiny target with a trained 96-token BPE, and the same model under shuffled ids with the
    same shuffle applied to its tokenizer: bridged, the drafter is the target."""
    tok = trained_bpe(96, alphabet=ALPHA)
    ptok, perm = permuted(tok, seed=3)
    src = saved("llama", root)
    drafter = permuted_copy(src, Path(root) / "llama-permuted", perm)
    return load(str(src)).model, load(str(drafter)).model, tok, ptok


def test_a_permuted_self_drafter_is_accepted_in_full(self_pair):
    target, drafter, tok, ptok = self_pair
    dec = Decoder(target, drafter, target_tokenizer=tok, drafter_tokenizer=ptok)
    assert dec.bridged and dec.drafters["model"].map.size == 96
    prompt = tok.encode("the cat sat on the mat, and then")
    ref = tokens_of(run_generation(dec, prompt, preset("ar"), 40)[0])
    for vocab in ("tli", "union"):
        evs, summ = run_generation(dec, prompt, preset("sd", draft_len=4, vocab=vocab), 40)
        assert tokens_of(evs) == ref
        assert all(e.accepted == e.drafted for e in evs if e.drafted), vocab  # q = p: nothing rejected
    evs, _ = run_generation(dec, prompt, preset("sd", draft_len=4, vocab="slem"), 40)
    assert tokens_of(evs) == ref
    # SLEM proposes what ends before the draft's last word, re-encoded: the target's own tokens
    # but where its greedy path spells a word otherwise than the encoder would (19 of 22 measured)
    drafted = sum(e.drafted for e in evs)
    assert drafted >= 10 and sum(e.accepted for e in evs) >= 0.7 * drafted, [(e.accepted, e.drafted) for e in evs]
    # sampling: TLI's q is p, so rejection sampling accepts every draft
    evs, _ = run_generation(dec, prompt, preset("sd", draft_len=4, vocab="tli", temperature=1.0, seed=5), 40)
    drafted = sum(e.drafted for e in evs)
    assert drafted and sum(e.accepted for e in evs) >= 0.97 * drafted


# ---- sampling: union and TLI keep the target's distribution --------------------------------------------------
def _samples(dec, prompt, strategy, n, length):
    return [tuple(tokens_of(run_generation(dec, prompt, strategy.replace(seed=s), length)[0])) for s in range(n)]


_two_sample_p = two_sample_p


@pytest.fixture(scope="module")
def hetero_pair(root):
    """Target: tiny llama + a 96-token BPE; drafter: another tiny model + a 96-token BPE trained on
    other text (shared letters and some merges; other merges exist only in the drafter)."""
    t = trained_bpe(96, alphabet=ALPHA)
    d = trained_bpe(96, alphabet=ALPHA, offset=2000)
    return load(str(saved("llama", root))).model, load(str(saved("draft", root))).model, t, d


@pytest.mark.parametrize("case", ["tli-sd", "tli-tree", "union-sd", "slem-sd"])
def test_bridged_sampling_keeps_the_target_distribution(case, hetero_pair):
    target, drafter, t, d = hetero_pair
    m = VocabMap(t, d)
    assert 0 < m.size < 96  # a partial overlap: union meets draws outside T
    dec = Decoder(target, drafter, target_tokenizer=t, drafter_tokenizer=d)
    s = {"tli-sd": preset("sd", draft_len=3, vocab="tli", temperature=1.0),
         "tli-tree": preset("tree", tree=(2, 2), vocab="tli", temperature=1.0),
         "union-sd": preset("sd", draft_len=3, vocab="union", temperature=1.0),
         "slem-sd": preset("sd", draft_len=3, vocab="slem", temperature=1.0)}[case]
    prompt = t.encode("the cat sat on the")
    runs = [run_generation(dec, prompt, s.replace(seed=i), 12)[0] for i in range(100)]
    assert sum(e.accepted for r in runs for e in r) > 0  # the bridge's drafts do get accepted
    # the seeded plain-decoding draws (target, and the drafter for the power check) are the same
    # for every case of the module's pair: drawn once
    ref, bad = _seeded(("hetero", id(hetero_pair)), lambda: (_samples(dec, prompt, preset("ar", temperature=1.0), 1500, 2),
                                                             _samples(Decoder(drafter), prompt, preset("ar", temperature=1.0), 1500, 2)))
    got = _samples(dec, prompt, s, 1500, 2)
    assert _two_sample_p(ref, got) > 1e-3
    assert _two_sample_p(ref, bad) < 1e-3


def test_union_records_rejected_draws_and_refuses_trees(hetero_pair):
    target, drafter, t, d = hetero_pair
    br = BridgeDrafter(drafter, t, d, 96)
    prompt = t.encode("the cat sat on the")
    gen = torch.Generator().manual_seed(0)
    seen = 0
    for _ in range(200):
        tree = br.propose(prompt, DraftRequest(shape=(1, 1, 1), mode="sample", temperature=1.0, generator=gen, vocab="union"))
        if tree.rejected_rows:
            seen += 1
            assert tree.rejected_rows == {len(tree)}
            assert float(tree.draft_probs[len(tree)].sum()) < 1.0  # q restricted to T: the rest was a draw outside
    assert seen > 0
    dec = Decoder(target, drafter, target_tokenizer=t, drafter_tokenizer=d)
    with pytest.raises(StrategyError, match="chains only"):
        run_generation(dec, prompt, preset("tree", tree=(2, 2), vocab="union", temperature=1.0), 5)
    with pytest.raises(StrategyError, match="ersd"):
        run_generation(dec, prompt, preset("ersd", temperature=1.0), 5)


def test_tli_acceptance_is_at_least_union_s(hetero_pair):
    """Theorem 4.1 on this pair: per-token acceptance Σ min(p, q') (TLI, q renormalised on T ∩ D)
    >= Σ min(p, q|T) (union), measured from the models' real distributions at many contexts."""
    target, drafter, t, d = hetero_pair
    m = VocabMap(t, d)
    dec_t, dec_d = Decoder(target), Decoder(drafter)
    worse = 0
    for s in range(30):
        ids = tokens_of(run_generation(dec_t, t.encode("the cat"), preset("ar", temperature=1.0, seed=s), 6)[0])
        ctx = t.encode("the cat") + ids
        dec_t.start(ctx)
        p = torch.softmax(dec_t.target.verify([ctx[-1]], [-1])[-1].float(), -1)
        text = t.decode(ctx)
        dctx = d.encode(text)
        dec_d.start(dctx)
        q = torch.softmax(dec_d.target.verify([dctx[-1]], [-1])[-1].float(), -1)
        q_t = torch.zeros(96)
        q_t[m.shared_t] = q[m.shared_d]
        union = float(torch.minimum(p, q_t).sum())
        tli = float(torch.minimum(p, q_t / q_t.sum()).sum())
        worse += tli < union - 1e-6
    assert worse == 0


# ---- SLRS through the decode loop (byte-level Mamba drafter) --------------------------------------------------
def test_slrs_is_plain_greedy_with_a_byte_drafter_on_smollm2(text_pairs):
    t = smollm2()
    dec = text_pairs("bytes")
    prompt = t.encode(CHAT)
    ref = tokens_of(run_generation(dec, prompt, preset("ar"), 24)[0])
    evs, _ = run_generation(dec, prompt, preset("sd", draft_len=4, vocab="slrs"), 24)
    assert tokens_of(evs) == ref
    assert sum(e.accepted for e in evs) >= 8 and partial_steps(evs) > 0, [(e.accepted, e.drafted) for e in evs]
    with pytest.raises(StrategyError, match="chains"):
        run_generation(dec, prompt, preset("tree", tree=(2, 1), vocab="slrs"), 4)


@pytest.fixture(scope="module")
def fitted_byte_pair(root):
    """Target: tiny llama + a 96-token sentencepiece-style BPE, with its exact next-token law
    ``law(ids)``; drafter: a byte-level Mamba-2 bigram fitted to the target's own two-token law
    after the prompt (close to the target, not equal: SLRS accepts ~0.8 tokens a step, rejects
    the rest and samples its residual)."""
    from collections import Counter

    t = trained_bpe(96, alphabet=ALPHA)
    target = load(str(saved("llama", root))).model
    own = target.with_own_cache()
    prompt = t.encode("the cat sat on the")

    def law(ids):
        return torch.softmax(own.full_logits(list(ids))[-1].double(), -1)

    g = torch.Generator().manual_seed(123)
    p1, p2 = law(prompt), {}
    counts: dict[int, Counter] = {}
    for x1 in torch.multinomial(p1, 3000, replacement=True, generator=g).tolist():
        if x1 not in p2:
            p2[x1] = law(prompt + [x1])
        x2 = int(torch.multinomial(p2[x1], 1, generator=g))
        b = t.token_bytes(prompt[-1])[-1:] + t.token_bytes(x1) + t.token_bytes(x2)
        for a, c in zip(b, b[1:]):
            counts.setdefault(a, Counter())[c] += 1
    alpha = set(ALPHA.encode())  # smoothed: every character of the alphabet possible after every byte
    rows = {a: {c: math.log((cnt[c] + 0.05) / (sum(cnt.values()) + 0.05 * len(alpha))) for c in alpha}
            for a, cnt in counts.items()}
    drafter = load(str(bigram_model(Path(root) / "fitted-bytes", "mamba2", 264, rows, {c: 0.0 for c in alpha}))).model
    return target, drafter, t, prompt, law


def test_slrs_sampling_keeps_the_target_distribution(fitted_byte_pair):
    """Two tokens drawn by SLRS (both from one step when the first is accepted), against the
    target's exact law: the first token's, and the pair's. A residual drawn from p instead of
    norm(p - min(p, ψ)) gives the first token p ~ 1e-10; accepting every proposal, 1e-185."""
    target, drafter, t, prompt, law = fitted_byte_pair
    dec = Decoder(target, drafter, target_tokenizer=t, drafter_tokenizer=ByteTokenizer())
    s = preset("sd", draft_len=2, vocab="slrs", temperature=1.0)
    n = 1000
    runs = [run_generation(dec, prompt, s.replace(seed=i), 2)[0] for i in range(n)]
    steps = [e for r in runs for e in r]
    assert sum(e.accepted for e in steps) >= 0.5 * len(steps)  # 0.8 measured
    outs = [tuple(tokens_of(r)) for r in runs]
    p1 = law(prompt)
    assert exact_law_p([o[0] for o in outs], dict(enumerate(p1.tolist()))) > 1e-3
    pairs = {}
    for x1 in torch.nonzero(p1 * n >= 1).flatten().tolist():
        pairs.update({(x1, x2): float(p1[x1] * q) for x2, q in enumerate(law(prompt + [x1]).tolist())})
    assert exact_law_p(outs, pairs) > 1e-3


# ---- what a bridge cannot do: refused with a line that names it ----------------------------------------------
def _byte_bpe(merges: list[tuple[str, str]], name: str) -> Tokenizer:
    """A byte-level BPE of the 256 bytes and one token per merge (left + right, in order)."""
    b2u = bytes_to_unicode()
    vocab = {b2u[b]: b for b in range(256)}
    for left, right in merges:
        vocab[left + right] = len(vocab)
    backend = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=list(merges)))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    backend.decoder = decoders.ByteLevel()
    return Tokenizer(backend, name=name)


def test_slrs_refuses_a_transformer_drafter_and_a_history_it_cannot_see(text_pairs):
    t = smollm2()
    dec = text_pairs("bpe-bytelevel")  # a llama drafter with a text tokenizer
    with pytest.raises(StrategyError, match=r"slrs drafts byte by byte from forked states: it needs a pure recurrent "
                                            r"\(Mamba\) drafter"):
        run_generation(dec, t.encode(CHAT), preset("sd", draft_len=4, vocab="slrs"), 4)
    # a history that ends inside a character (the emoji's first token): a text drafter holds its
    # first bytes back, and SLRS's procedure must read every byte from the drafter's own state
    cut = t.encode(CHAT + TEXT)[:-1]
    assert dec.drafters["model"].drafter_history(cut)[1] == "\U0001F642".encode()[:2]
    with pytest.raises(StrategyError, match="slrs needs the drafter to see every byte of the history"):
        run_generation(dec, cut, preset("sd", draft_len=4, vocab="slrs"), 4)


def test_a_drafter_sharing_no_token_with_the_target_is_refused(root):
    words = Tokenizer(tokenizers.Tokenizer(models.WordLevel({"hello": 0, "world": 1}, unk_token="hello")), name="words")
    target = load(str(tiny_model(root, "words", 2, "llama"))).model
    drafter = load(str(tiny_model(root, "bytes", 264, "mamba2", seed=1))).model
    with pytest.raises(BridgeError, match="the drafter's vocabulary shares no token with the target's: no bridge can work"):
        Decoder(target, drafter, target_tokenizer=words, drafter_tokenizer=ByteTokenizer())


def test_slrs_refuses_a_psi_past_its_limit_through_the_decoder(root):
    """Lemma 3.1 in the decode loop: a drafter spelling runs of "a" in tokens of 1-4 characters
    has thousands of ways to spell the target's 16-character token "aaaa…" (compositions of 16
    into parts of 1-4): ψ of it is refused (past 4,096 drafter prefixes) when sampling; greedy
    SLRS needs no ψ and accepts it."""
    target_tok = _byte_bpe([("a", "a"), ("aa", "aa"), ("aaaa", "aaaa"), ("a" * 8, "a" * 8)], "a16")
    drafter_tok = _byte_bpe([("a", "a"), ("aa", "a"), ("aa", "aa")], "a4")
    a16 = target_tok.token_to_id("a" * 16)
    runs = {drafter_tok.token_to_id("a" * k): 0.0 for k in (1, 2, 3, 4)}
    target = load(str(bigram_model(Path(root) / "a16-target", "llama", target_tok.vocab_size, {}, {a16: 6.0}, base=0.0))).model
    drafter = load(str(bigram_model(Path(root) / "a4-drafter", "mamba2", drafter_tok.vocab_size, {}, runs))).model
    dec = Decoder(target, drafter, target_tokenizer=target_tok, drafter_tokenizer=drafter_tok)
    prompt = target_tok.encode("b")
    evs, _ = run_generation(dec, prompt, preset("sd", draft_len=2, vocab="slrs"), 6)
    assert tokens_of(evs) == [a16] * 6 and sum(e.accepted for e in evs) >= 3
    with pytest.raises(PsiTooLarge, match=r"ψ of target token \d+ needs more than 4096 drafter prefixes"):
        run_generation(dec, prompt, preset("sd", draft_len=2, vocab="slrs", temperature=1.0), 6)


def test_bridge_telemetry_reaches_the_step_events_and_the_dashboard(self_pair):
    from app.widgets.dashboard import policy_text

    target, drafter, tok, ptok = self_pair
    dec = Decoder(target, drafter, target_tokenizer=tok, drafter_tokenizer=ptok)
    evs, _ = run_generation(dec, tok.encode("the cat sat"), preset("sd", draft_len=3, vocab="slem"), 24)
    b = evs[0].bridge
    assert b["bridge"] == "slem" and b["drafted"] == 3
    assert sum(e.bridge["proposed"] for e in evs if e.bridge) >= 1
    assert "vocab bridge slem · 3 drafter tokens" in policy_text(None, b).plain
    evs, _ = run_generation(Decoder(target, target), tok.encode("the cat sat"), preset("sd", draft_len=3), 4)
    assert evs[0].bridge is None


def test_a_byte_drafter_keeps_drafting_past_the_targets_context_in_bytes(root):
    """A byte drafter counts bytes (~4 a token): loaded with the target's token limit it filled up
    at a quarter of the conversation and every bridged step raised OverflowError (the shipped
    pairing failed any reply past ~8 kB of chat). A session lifts a pure SSM drafter's limit; a
    drafter that is full anyway (a Transformer's real limit) leaves the target to plain steps."""
    from engine.session import ChatSession, _unbounded_if_ssm

    t = smollm2()
    n = 96
    target = load(str(tiny_model(root, "smol-target", 49152, "llama")), max_context=n).model
    text = "<|im_start|>user\n" + "Summarise this paragraph about harbours and boats. " * 3 + "<|im_end|>\n<|im_start|>assistant\n"
    prompt = t.encode(text)
    assert len(prompt) < n // 2 < n < len(text.encode())  # fits the target, not a byte drafter of the same limit
    ref = tokens_of(run_generation(Decoder(target), prompt, preset("ar"), 24)[0])
    for lifted in (True, False):
        drafter = load(str(tiny_model(root, "bytes", 264, "mamba2", seed=1)), max_context=n)
        if lifted:
            _unbounded_if_ssm(drafter)
        dec = Decoder(target, drafter.model, target_tokenizer=t, drafter_tokenizer=ByteTokenizer())
        events, summary = run_generation(dec, prompt, preset("sd", draft_len=8, vocab="slem"), 24)
        assert tokens_of(events) == ref and summary.finish_reason == "length"
        assert (sum(e.drafted for e in events) > 0) == lifted  # full: plain steps, no error
    # ChatSession.load lifts it (a same-vocabulary pair here: no tokenizers needed)
    s = ChatSession.load(target=str(tiny_model(root, "t264", 264, "llama")), drafter=str(tiny_model(root, "bytes", 264, "mamba2", seed=1)),
                         max_context=64, dtype="fp32")
    assert s.decoder.context_length == 64 and s.decoder.drafters["model"].model.cache.capacity > 1 << 16
