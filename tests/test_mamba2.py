"""Mamba-2 (engine/models/mamba2.py) against transformers' Mamba2ForCausalLM on tiny random
checkpoints: full forward, cached decoding, the STree tree scan, activation-replay commit,
rollback, the mamba_ssm checkpoint format, and config validation (STYLE.md item 6)."""

from __future__ import annotations

import copy
import json
import math
import random

import pytest
import torch

from engine.errors import ModelLoadError
from engine.generate import Decoder, run_generation
from engine.loading import read_config, read_state_dict
from engine.models.mamba2 import Mamba2, Mamba2Config, remap_mamba_ssm_state_dict
from engine.strategy import preset

from .accept_util import oracle_runs
from .tiny import uncached_greedy

SPECS = {
    # one group, untied head; transformers chunk_size 8 so its reference also crosses chunks
    "g1": dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_heads=8, head_dim=16, expand=2, state_size=16,
               n_groups=1, conv_kernel=4, chunk_size=8, tie_word_embeddings=False),
    # two groups (B/C shared by 2 heads each), tied head, projection biases
    "g2": dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_heads=4, head_dim=32, expand=2, state_size=16,
               n_groups=2, conv_kernel=4, chunk_size=8, tie_word_embeddings=True, use_bias=True),
}
TOL = 1e-4  # logits, fp32
# States: 1e-5 relative to the state's scale. The scaled test weights give |S| up to ~120, where one
# fp32 ulp is ~8e-6, and transformers' own step-by-step and chunked states differ by ~4e-5.
STATE_TOL = 1e-5
IDS = [(7 * i * i + 3 * i + 1) % 96 for i in range(40)]


def hf_mamba2(kind: str, seed: int = 0):
    from transformers import Mamba2Config as HFConfig, Mamba2ForCausalLM

    torch.manual_seed(seed)
    m = Mamba2ForCausalLM(HFConfig(**SPECS[kind])).eval()
    # Random init gives near-uniform logits and near-1 decays; give the test power: sharper
    # weights, per-step decays exp(dt·A) spread over ~[0.1, 0.98], non-trivial D and norms.
    with torch.no_grad():
        for name, p in m.named_parameters():
            if name.endswith("A_log"):
                p.copy_(torch.empty_like(p).uniform_(0.5, 4.0).log())
            elif name.endswith("dt_bias"):
                dt = torch.empty_like(p).uniform_(0.05, 0.6)
                p.copy_(dt + torch.log(-torch.expm1(-dt)))  # softplus^-1
            elif name.endswith(".D"):
                p.copy_(torch.randn_like(p))
            elif "norm" in name:
                p.copy_(1 + 0.3 * torch.randn_like(p))
            else:
                p.mul_(2.5)
    return m


@pytest.fixture(scope="module", params=sorted(SPECS))
def pair(request, tmp_path_factory):
    """(transformers model, its save_pretrained directory, our model loaded from that directory)."""
    path = tmp_path_factory.mktemp(f"mamba2-{request.param}")
    hf = hf_mamba2(request.param)
    hf.save_pretrained(path)
    ours = Mamba2(Mamba2Config.from_hf(read_config(path), str(path)), read_state_dict(path))
    ours.allocate()
    return hf, path, ours


@torch.no_grad()
def hf_logits(hf, ids):
    return hf(torch.tensor([ids]), use_cache=False).logits[0]


@torch.no_grad()
def hf_states(hf, ids):
    """Per layer (conv state (C, K-1), ssm state (H, P, N)) after running ``ids`` from scratch."""
    cache = hf(torch.tensor([ids]), use_cache=True).cache_params
    k1 = hf.config.conv_kernel - 1
    return [(cache.get_conv_state(i)[0, :, -k1:], cache.get_recurrent_state(i)[0]) for i in range(hf.config.num_hidden_layers)]


def our_states(model):
    c = model.cache
    return [(c.conv[i].clone(), c.ssm[i].clone()) for i in range(model.cfg.num_layers)]


def state_err(a, b) -> float:
    """Max |difference| over layers and (conv, ssm), relative to max(1, max |state|)."""
    return max(((x - y).abs().max() / max(1.0, y.abs().max().item())).item() for sa, sb in zip(a, b) for x, y in zip(sa, sb))


def fresh(model, prefix):
    model.cache.reset()
    model.prefill(prefix)
    return model


def random_tree(rng: random.Random, n: int) -> tuple[list[int], list[int]]:
    """A packed tree: row 0 is the root (parent -1), row i hangs off any earlier row."""
    parents = [-1] + [rng.choice([i - 1, i - 1, rng.randrange(i)]) for i in range(1, n)]
    return [rng.randrange(96) for _ in range(n)], parents


def path_rows(parents, i):
    rows = []
    while i >= 0:
        rows.append(i)
        i = parents[i]
    return rows[::-1]


# ---- (1) full forward -------------------------------------------------------------------------------
def test_full_forward_matches_transformers(pair):
    hf, _, ours = pair
    ref = hf_logits(hf, IDS)
    got = ours.full_logits(IDS)
    err = (got - ref).abs().max().item()
    print(f"full forward max |dlogit| {err:.2e} (logit scale {ref.abs().max().item():.1f})")
    assert ref.std() > 1.0  # the test has power: logits are not near-uniform
    assert err <= TOL


# ---- (2) cached decoding ------------------------------------------------------------------------------
def test_prefill_then_one_token_at_a_time_equals_full_forward(pair):
    hf, _, ours = pair
    ref = hf_logits(hf, IDS)
    ours.cache.reset()
    ours.prefill(IDS[:11], chunk=4)  # chunk boundaries inside the prompt: non-zero initial states
    assert ours.cache.length == 11
    err = 0.0
    for t in range(11, len(IDS)):
        lg = ours.verify([IDS[t]], [-1])
        ours.commit([0])
        err = max(err, (lg[0] - ref[t]).abs().max().item())
    assert err <= TOL
    assert state_err(our_states(ours), hf_states(hf, IDS)) <= STATE_TOL
    assert ours.cache.length == len(IDS)


# ---- (3) chain verify from a non-empty committed state ---------------------------------------------
def test_chain_verify_from_committed_state_leaves_it_unchanged(pair):
    hf, _, ours = pair
    ref = hf_logits(hf, IDS)
    fresh(ours, IDS[:15])
    before = our_states(ours)
    chain = IDS[15:30]
    got = ours.verify(chain, list(range(-1, len(chain) - 1)))
    assert (got - ref[15:30]).abs().max().item() <= TOL
    assert ours.cache.length == 15
    assert all(torch.equal(a, c) and torch.equal(b, d) for (a, b), (c, d) in zip(before, our_states(ours)))
    again = ours.verify(chain, list(range(-1, len(chain) - 1)))  # verify is repeatable: nothing leaked
    assert torch.equal(got, again)


# ---- (4) commit = activation replay ------------------------------------------------------------------
def test_commit_replay_equals_step_by_step(pair):
    hf, _, ours = pair
    fresh(ours, IDS[:12])
    ours.verify(IDS[12:20], list(range(-1, 7)))
    ours.commit(range(5))  # accept 5 of 8
    replayed = our_states(ours)
    assert ours.cache.length == 17 and ours.cache.scratch == 0
    fresh(ours, IDS[:12])
    for t in IDS[12:17]:
        ours.verify([t], [-1])
        ours.commit([0])
    stepped = our_states(ours)
    err_step, err_hf = state_err(replayed, stepped), state_err(replayed, hf_states(hf, IDS[:17]))
    print(f"replay vs step-by-step {err_step:.2e}, vs transformers {err_hf:.2e}")
    assert err_step <= STATE_TOL and err_hf <= STATE_TOL
    # and decoding continues correctly from the replayed state
    nxt = ours.verify([IDS[17]], [-1])[0]
    assert (nxt - hf_logits(hf, IDS[:18])[-1]).abs().max().item() <= TOL


# ---- (5) trees: STree scan and replay along any path ---------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_tree_verify_and_commit_equal_each_path(pair, seed):
    hf, _, ours = pair
    rng = random.Random(seed)
    prefix = IDS[:13]
    tokens, parents = random_tree(rng, 14)
    fresh(ours, prefix)
    got = ours.verify(tokens, parents)
    err = 0.0
    for i in range(len(tokens)):
        seq = prefix + [tokens[r] for r in path_rows(parents, i)]
        err = max(err, (got[i] - hf_logits(hf, seq)[-1]).abs().max().item())
    print(f"tree ({len(tokens)} nodes, depth {max(len(path_rows(parents, i)) for i in range(len(tokens)))}) max |dlogit| {err:.2e}")
    assert err <= TOL
    leaves = [i for i in range(len(tokens)) if i not in parents]
    for node in leaves + [parents[leaves[0]]]:
        rows = path_rows(parents, node)
        fresh(ours, prefix)
        ours.verify(tokens, parents)
        ours.commit(rows)
        seq = prefix + [tokens[r] for r in rows]
        assert ours.cache.length == len(seq)
        assert state_err(our_states(ours), hf_states(hf, seq)) <= STATE_TOL


def test_extend_adds_nodes_to_the_scratch_tree(pair):
    _, _, ours = pair
    tokens, parents = random_tree(random.Random(5), 12)
    fresh(ours, IDS[:9])
    whole = ours.verify(tokens, parents)
    ours.verify(tokens[:5], parents[:5])
    part = ours.extend(tokens[5:], parents[5:])
    assert (part - whole[5:]).abs().max().item() <= 1e-5
    assert ours.cache.scratch == len(tokens)
    rows = path_rows(parents, len(tokens) - 1)
    ours.commit(rows)
    committed = our_states(ours)
    fresh(ours, IDS[:9] + [tokens[r] for r in rows])
    assert state_err(committed, our_states(ours)) <= STATE_TOL


def test_commit_rejects_rows_that_are_not_a_chain(pair):
    _, _, ours = pair
    fresh(ours, IDS[:5])
    ours.verify([1, 2, 3], [-1, 0, 0])  # a fork: rows 1 and 2 are siblings
    with pytest.raises(ValueError, match="chain"):
        ours.commit([0, 1, 2])


# ---- rollback ---------------------------------------------------------------------------------------------
def test_rollback_only_where_a_recurrent_state_can_go(pair):
    hf, _, ours = pair
    fresh(ours, IDS[:12])
    ours.verify(IDS[12:20], list(range(-1, 7)))
    ours.commit(range(6))  # 12 -> 18
    ours.rollback(18)  # no-op
    assert ours.cache.length == 18
    ours.rollback(15)  # inside the last commit: the kept previous state + 3 replayed rows
    assert ours.cache.length == 15
    assert state_err(our_states(ours), hf_states(hf, IDS[:15])) <= STATE_TOL
    with pytest.raises(ValueError, match="cannot roll back"):
        ours.rollback(11)  # before the last commit: gone
    ours.rollback(12)
    assert state_err(our_states(ours), hf_states(hf, IDS[:12])) <= STATE_TOL
    ours.rollback(0)
    assert ours.cache.length == 0 and not ours.cache.ssm.any() and not ours.cache.conv.any()
    assert ours.cache.prefix_rollback is False


def test_with_own_cache_shares_weights_not_state(pair):
    hf, _, ours = pair
    fresh(ours, IDS[:10])
    twin = ours.with_own_cache()
    assert twin.cache is not ours.cache and twin.embed is ours.embed and twin.length == 0
    twin.prefill(IDS[:20])
    assert ours.cache.length == 10
    assert state_err(our_states(ours), hf_states(hf, IDS[:10])) <= STATE_TOL


# ---- the decode loop ---------------------------------------------------------------------------------
def hf_greedy(hf, prompt, n):
    return uncached_greedy(lambda ids: hf_logits(hf, ids), prompt, n)


def test_decoder_greedy_strategies_equal_plain_greedy(pair):
    """Self-drafting (every draft accepted whole), then an oracle right for 0..5 tokens a step
    (accepted in part: the correction comes from an inner row and the commit stops mid-tree) in
    every SSM tree mode and backtrack mode."""
    hf, _, ours = pair
    prompt = [1, 5, 9, 3, 5, 9, 3, 7, 2, 5, 9]
    ref = hf_greedy(hf, prompt, 24)
    dec = Decoder(ours, ours)  # the model drafts for itself through its own cache
    for s in [preset("ar"), preset("pld"), preset("sd", draft_len=4), preset("tree", tree=(2, 2, 1))]:
        evs, summ = run_generation(dec, prompt, s, 24)
        assert [t for e in evs for t in e.emitted] == ref, s.label()
        if s.name == "sd":  # a model drafting for itself is always right
            assert all(e.accepted == 4 for e in evs[:-1])
        dec.reset()
    # (IDS[:12]: a prompt the tied-head g2 does not answer by repeating one token, which would hide
    # a wrong correction)
    modes = [dict(ssm_tree=t, backtrack=b) for t in ("stree", "unrolled") for b in ("replay", "joint", "recompute")]
    oracle_runs(dec, IDS[:12], hf_greedy(hf, IDS[:12], 24),
                [preset(n, **m, **k) for m in modes for n, k in (("sd", dict(draft_len=4)), ("tree", dict(tree=(2, 2, 1))))], 96)


# ---- (6) the mamba_ssm checkpoint format ---------------------------------------------------------------
def test_mamba_ssm_format_loads_and_equals_hf_format(pair, tmp_path):
    hf, path, ours = pair
    c = hf.config
    cfg = {"d_model": c.hidden_size, "d_intermediate": 0, "n_layer": c.num_hidden_layers, "vocab_size": c.vocab_size - 5,
           "ssm_cfg": {"layer": "Mamba2", "d_state": c.state_size, "d_conv": c.conv_kernel, "expand": c.expand,
                       "headdim": c.head_dim, "ngroups": c.n_groups, "bias": c.use_bias},
           "attn_layer_idx": [], "attn_cfg": {}, "rms_norm": True, "residual_in_fp32": True, "fused_add_norm": True,
           "pad_vocab_size_multiple": 16, "tie_embeddings": bool(c.tie_word_embeddings)}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    sd = {k.replace("backbone.embeddings.", "backbone.embedding."): v for k, v in hf.state_dict().items()}
    torch.save(sd, tmp_path / "pytorch_model.bin")
    mcfg = Mamba2Config.from_mamba_ssm(read_config(tmp_path), str(tmp_path))
    assert mcfg.vocab_size == 96 and mcfg.num_heads == c.num_heads  # 91 padded to a multiple of 16
    model = Mamba2(mcfg, remap_mamba_ssm_state_dict(read_state_dict(tmp_path)))
    assert model.vocab_size == 96
    assert (model.full_logits(IDS) - ours.full_logits(IDS)).abs().max().item() <= 1e-6


def test_mamba_ssm_unsupported_variants_are_refused():
    base = {"d_model": 64, "n_layer": 2, "vocab_size": 90, "ssm_cfg": {"layer": "Mamba2"}}
    for change in [{"attn_layer_idx": [1]}, {"d_intermediate": 128}, {"rms_norm": False},
                   {"ssm_cfg": {"layer": "Mamba1"}}, {"ssm_cfg": {"layer": "Mamba2", "headdim": 48}},
                   {"ssm_cfg": {"layer": "Mamba2", "norm_before_gate": True}}, {"n_layer": 0}]:
        with pytest.raises(ModelLoadError):
            Mamba2Config.from_mamba_ssm({**base, **change})


# ---- (7) config and checkpoint validation ----------------------------------------------------------------
BAD_FIELDS = [("hidden_size", None), ("num_heads", None), ("state_size", None), ("num_heads", 0), ("num_heads", -8),
              ("head_dim", 3), ("n_groups", 3), ("state_size", 1.5), ("vocab_size", "lots"), ("hidden_act", "gelu"),
              ("time_step_limit", [1.0, 0.0]), ("time_step_limit", "fast"), ("layer_norm_epsilon", 0), ("num_hidden_layers", 10 ** 9)]


@pytest.mark.parametrize("key,value", BAD_FIELDS)
def test_missing_or_absurd_config_fields_raise(pair, key, value):
    _, path, _ = pair
    cfg = read_config(path)
    if value is None:
        del cfg[key]
    else:
        cfg[key] = value
    with pytest.raises(ModelLoadError):
        Mamba2Config.from_hf(cfg, str(path))


def test_missing_or_misshapen_tensors_raise(pair):
    _, path, _ = pair
    cfg = Mamba2Config.from_hf(read_config(path), str(path))
    sd = read_state_dict(path)
    gone = dict(sd)
    del gone["backbone.layers.1.mixer.A_log"]
    with pytest.raises(ModelLoadError, match="A_log"):
        Mamba2(cfg, gone)
    cut = dict(sd)
    cut["backbone.layers.0.mixer.in_proj.weight"] = sd["backbone.layers.0.mixer.in_proj.weight"][:-1]
    with pytest.raises(ModelLoadError, match="in_proj"):
        Mamba2(cfg, cut)


def test_config_reads_transformers_fields(pair):
    hf, path, ours = pair
    cfg = read_config(path)
    assert math.isinf(ours.cfg.dt_limit[1]) and ours.cfg.n_groups == hf.config.n_groups
    assert ours.describe()["family"] == "mamba2" and ours.max_context == 1 << 20
    no_groups = {k: v for k, v in cfg.items() if k != "n_groups"} | {"num_heads": 8, "head_dim": 16}
    assert Mamba2Config.from_hf(no_groups).n_groups == 8  # transformers' default


def test_bf16_error_is_that_of_transformers_in_bf16(pair):
    hf, path, ours = pair
    low = Mamba2(Mamba2Config.from_hf(read_config(path), str(path)), read_state_dict(path), dtype=torch.bfloat16)
    ref, got = hf_logits(hf, IDS), low.full_logits(IDS).float()
    hf_err = (hf_logits(copy.deepcopy(hf).to(torch.bfloat16), IDS).float() - ref).abs().max().item()
    err = (got - ref).abs().max().item()
    print(f"bf16 max |dlogit| ours {err:.3f}, transformers {hf_err:.3f}")
    assert got.isfinite().all() and err <= 2 * hf_err


def test_advance_fast_steps_the_committed_state_like_prefill(tmp_path, monkeypatch):
    """A drafter keeping up with the conversation (Mamba2 advance_fast, the C block): after a few
    tokens its logits and state match a prefill + verify of the same tokens to fp32 rounding, and
    its length and drafting go on from there; without the C step it declines (None)."""
    from engine.loading import load
    from engine.models import common

    from .tiny import saved

    monkeypatch.setattr(common, "_NATIVE_LINEAR", {"on": True, "why": "on (test)"})
    path = saved("mamba2", str(tmp_path))
    a, b = load(str(path)).model, load(str(path)).model
    for m in (a, b):
        m.allocate()
        m.prefill([3, 8, 1, 9, 4])
    with common.fast_rows():
        if a._native_step(a.cache.conv[:, None], a.cache.ssm[:, None]) is None:
            pytest.skip("no C step here")
        got = a.advance_fast([7, 2, 6])
    b.prefill([7, 2])
    want = b.verify([6], [-1])[-1]
    b.cache.commit([0])
    assert a.cache.length == b.cache.length == 8
    assert torch.allclose(got, want, atol=1e-4 * want.abs().max().item())
    # fp32 rounding relative to the state's scale: the random tiny model's states reach ~3e3, where
    # an Intel AVX-512 build's C step differed by 1.1e-3 (4e-7 of the scale; session 31)
    for x, y in ((a.cache.ssm, b.cache.ssm), (a.cache.conv, b.cache.conv)):
        assert torch.allclose(x, y, atol=1e-5 * max(1.0, y.abs().max().item()))
    assert a.advance_fast([5]) is None  # outside fast_rows (verify numerics): the caller takes verify
    a.cache.rollback(0)
    assert a.cache.length == 0


def test_advance_fast_over_several_tokens_is_the_same_as_one_token_steps(tmp_path, monkeypatch):
    """advance_fast runs every catch-up token through each block in one C call (the projections over
    all rows at once, engine/native/mamba2_step.c mamba2_layers_f32): the state and logits are those
    of stepping the tokens one call at a time, bit for bit (the products are row-consistent), for
    fp32 and Q8_0 (drafting) weights."""
    from engine.loading import load
    from engine.models import common

    from .tiny import saved

    monkeypatch.setattr(common, "_NATIVE_LINEAR", {"on": True, "why": "on (test)"})
    path = saved("mamba2", str(tmp_path))
    calls: list[int] = []

    def counted(fn):
        def run(lib, x, B, T, conv, ssm):
            calls.append(T)
            return fn(lib, x, B, T, conv, ssm)
        return run

    for quant in (False, True):
        calls.clear()
        a, b = load(str(path)).model, load(str(path)).model
        for m in (a, b):
            if quant:
                m.quantize_for_drafting()
            m.allocate()
            m.prefill([3, 8, 1, 9, 4])
        with common.fast_rows():
            if a._native_step(a.cache.conv[:, None], a.cache.ssm[:, None]) is None:
                pytest.skip("no C step here")
            monkeypatch.setattr(a, "_c_layers", counted(a._c_layers))
            got = a.advance_fast([7, 2, 6, 5])
            assert calls == [4]  # one call for the four tokens
            for t in (7, 2, 6):
                assert b.advance_fast([t]) is not None
            want = b.advance_fast([5])
        assert a.cache.length == b.cache.length == 9
        assert torch.equal(got, want)
        assert torch.equal(a.cache.ssm, b.cache.ssm) and torch.equal(a.cache.conv, b.cache.conv)



def test_advance_fast_takes_a_long_catch_up_in_chunks(tmp_path, monkeypatch):
    """A catch-up longer than ADVANCE_ROWS goes in calls of at most that many tokens (bounded
    scratch), with the same state and logits as one call."""
    from engine.loading import load
    from engine.models import common, mamba2

    from .tiny import saved

    monkeypatch.setattr(common, "_NATIVE_LINEAR", {"on": True, "why": "on (test)"})
    path = saved("mamba2", str(tmp_path))
    a, b = load(str(path)).model, load(str(path)).model
    toks = [(7 * i + 3) % 50 for i in range(23)]
    for m in (a, b):
        m.allocate()
        m.prefill([3, 8, 1])
    with common.fast_rows():
        if a._native_step(a.cache.conv[:, None], a.cache.ssm[:, None]) is None:
            pytest.skip("no C step here")
        want = b.advance_fast(toks)
        monkeypatch.setattr(mamba2, "ADVANCE_ROWS", 5)
        got = a.advance_fast(toks)
    assert a.cache.length == b.cache.length == 26
    assert torch.equal(got, want) and torch.equal(a.cache.ssm, b.cache.ssm) and torch.equal(a.cache.conv, b.cache.conv)


def _close_probs(got, want) -> None:
    got, want = torch.as_tensor(got, dtype=torch.float64), torch.as_tensor(want, dtype=torch.float64)
    assert torch.allclose(got, want, rtol=1e-4, atol=1e-7), (got, want)


def _exact_head(m) -> None:
    """The torch step's head through linear.c like the C step's (not a GEMV over dequantised Q8_0
    weights, Linear._measure_gemv, whose fp32 activations are ~1/127 of a logit from the C
    head's 8-bit ones): the two then differ by fp32 rounding only."""
    m.lm_head_t._gemv = False


def _fast_drafter_pair(tmp_path, monkeypatch, quant: bool):
    from engine.loading import load
    from engine.models import common

    from .tiny import saved

    monkeypatch.setattr(common, "_NATIVE_LINEAR", {"on": True, "why": "on (test)"})
    path = saved("mamba2", str(tmp_path))
    models = [load(str(path)).model, load(str(path)).model]
    for m in models:
        if quant:
            m.quantize_for_drafting()
        m.allocate()
        m.prefill([3, 8, 1, 9, 4])
    return models


@pytest.mark.parametrize("quant", [False, True])
def test_draft_step_fast_is_the_torch_step(tmp_path, monkeypatch, quant):
    """Mamba2.draft_step_fast (engine/native/mamba2_step.c mamba2_draft_step: the blocks, the final
    norm, the head and the top k in one C call) steps a forked row like DraftBatch.step and names
    the same top k with the softmax's probabilities, over all columns, over a view of them with
    token ids, and declines (None) what it cannot serve."""
    from engine.models import common

    a, b = _fast_drafter_pair(tmp_path, monkeypatch, quant)
    _exact_head(b)
    V = a.lm_head_t.shape[1]
    with common.fast_rows():
        if a._native_step(a.cache.conv[:, None], a.cache.ssm[:, None]) is None:
            pytest.skip("no C step here")
        view = torch.tensor([1, 4, 5, 9, 17, 30, 31, 44])
        ids = torch.tensor([101, 104, 105, 109, 117, 130, 131, 144])
        fa, fb = a.fork(1), b.fork(1)
        for t, (v, i, k) in zip([7, 2, 6, 11], [(None, None, 3), (view, ids, 2), (None, None, 1), (view, None, 4)]):
            got = a.draft_step_fast(fa, t, k, V, v, i)
            logits = fb.step(torch.tensor([t]))[0].float()
            seen = logits if v is None else logits[v]
            p, top = torch.softmax(seen, -1).topk(k)
            want_ids = (top if i is None else i[top]).tolist() if v is None or i is not None else top.tolist()
            assert got is not None and got[0] == want_ids
            _close_probs(got[1], p)
            assert fa.steps == fb.steps
            assert torch.allclose(fa.state["ssm"], fb.state["ssm"], atol=1e-5 * max(1.0, fb.state["ssm"].abs().max().item()))
            assert torch.allclose(fa.state["conv"], fb.state["conv"], atol=1e-5 * max(1.0, fb.state["conv"].abs().max().item()))
        ids_only, _ = a.draft_step_fast(fa, 3, 2, V, None, None, want_p=False)
        assert len(ids_only) == 2
        steps = fa.steps
        assert a.draft_step_fast(fa, a.embed.shape[0], 1, V, None, None) is None  # no such token
        assert a.draft_step_fast(fa, 3, 9, V, view, None) is None  # more than the view holds
        assert a.draft_step_fast(a.fork(2), 3, 1, V, None, None) is None  # one row only
        assert fa.steps == steps
    assert a.draft_step_fast(a.fork(1), 3, 1, V, None, None) is None  # outside drafting numerics


@pytest.mark.parametrize("quant", [False, True])
def test_greedy_chains_and_spines_in_c_draft_what_the_torch_loop_drafts(tmp_path, monkeypatch, quant):
    """ModelDrafter.propose's greedy chains (and hybrid:auto's Spine) take the C draft step: the
    same tokens, confidences and early stop as the torch loop, with and without a draft
    vocabulary and a restriction (TLI's)."""
    from engine.drafters.base import DraftRequest
    from engine.drafters.model import ModelDrafter
    from engine.models import common, mamba2

    a, _ = _fast_drafter_pair(tmp_path, monkeypatch, quant)
    V = a.lm_head_t.shape[1]
    hist = [3, 8, 1, 9, 4, 12, 7]
    calls = []
    real = mamba2.Mamba2.draft_step_fast

    def counted(self, *args, **kw):
        out = real(self, *args, **kw)
        calls.append(out is not None)
        return out

    def off(self, *args, **kw):
        return None

    stop_after = lambda conf: len(conf) < 3  # noqa: E731
    for vocab in (None, torch.tensor(sorted(random.Random(1).sample(range(V), V // 2)))):
        for restrict in (None, torch.arange(0, V, 3)):
            got, want = {}, {}
            for mode, table in (("c", got), ("torch", want)):
                monkeypatch.setattr(mamba2.Mamba2, "draft_step_fast", counted if mode == "c" else off)
                d = ModelDrafter(a, V, draft_vocab=vocab)
                _exact_head(d.model)
                d.restrict(restrict)
                table["chain"] = d.propose(hist, DraftRequest(shape=(1,) * 5)).tokens
                t = d.propose(hist, DraftRequest(shape=(1,) * 6, confidence=True, keep_going=stop_after))
                table["stopped"], table["conf"] = t.tokens, t.confidence
                sp = d.spine(hist, k=3)
                cands = [sp.candidates()]
                for tok in (cands[0][0][0], 5, 2):
                    sp.advance(tok)
                    cands.append(sp.candidates())
                table["spine"] = cands
                d.reset()
            assert any(calls), "the C step never ran"
            calls.clear()
            assert got["chain"] == want["chain"] and len(got["chain"]) == 5
            assert got["stopped"] == want["stopped"] and len(got["stopped"]) == 3
            _close_probs(got["conf"], want["conf"])
            for g, w in zip(got["spine"], want["spine"]):
                assert [i for i, _ in g] == [i for i, _ in w]
                _close_probs([p for _, p in g], [p for _, p in w])
