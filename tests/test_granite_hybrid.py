"""Granite-4.0-H (engine/models/granite_hybrid.py) against transformers' GraniteMoeHybridForCausalLM
on tiny random checkpoints: full forward, cached decoding, one-pass tree verify (STree scan in the
Mamba layers, tree attention in the attention layers), commit (activation replay + K/V
compaction), rollback, the decode loop, and config validation (STYLE.md item 6)."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from engine.errors import ModelLoadError
from engine.generate import Decoder, run_generation
from engine.loading import read_config, read_state_dict
from engine.models.granite_hybrid import GraniteHybrid, GraniteHybridConfig
from engine.models.common import as_t
from engine.strategy import preset

from .accept_util import oracle_runs
# transformers logits, state error, and tree helpers are the Mamba-2 tests' (same checks, same tolerances)
from .test_mamba2 import IDS, STATE_TOL, TOL, fresh, hf_logits, path_rows, random_tree, state_err

BASE = dict(vocab_size=96, hidden_size=64, intermediate_size=128, shared_intermediate_size=128, num_hidden_layers=4,
            num_attention_heads=4, num_key_value_heads=2, mamba_n_heads=8, mamba_d_head=16, mamba_d_state=16,
            mamba_d_conv=4, mamba_expand=2, mamba_chunk_size=8, num_local_experts=0, max_position_embeddings=512,
            # Granite's four multipliers, non-trivial (attention 1/16 is not 1/sqrt(head_dim 16) = 1/4)
            embedding_multiplier=12.0, attention_multiplier=1 / 16, residual_multiplier=0.3, logits_scaling=3.0)
SPECS = {
    # granite-4.0-h as published: NoPE, one group; untied head so greedy paths do not just echo the
    # last token (a tied head on a residual dominated by the x12 embedding does)
    "nope": dict(BASE, layer_types=["mamba", "attention", "mamba", "attention"], mamba_n_groups=1,
                 position_embedding_type="nope", tie_word_embeddings=False),
    # the options: RoPE, attention first, biases, two groups, tied head
    "rope": dict(BASE, layer_types=["attention", "mamba", "attention", "mamba"], mamba_n_groups=2,
                 position_embedding_type="rope", tie_word_embeddings=True, attention_bias=True, mamba_proj_bias=True),
}


def hf_granite(spec: dict, seed: int = 0):
    from transformers import GraniteMoeHybridConfig, GraniteMoeHybridForCausalLM

    torch.manual_seed(seed)
    m = GraniteMoeHybridForCausalLM(GraniteMoeHybridConfig(**spec)).eval()
    # Random init gives near-uniform logits, near-uniform attention and near-1 decays; give the
    # tests power: sharper weights (q/k more so, or attention would just average), per-step decays
    # exp(dt·A) over ~[0.1, 0.98], non-trivial D and norms, a final norm that undoes logits_scaling.
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
                p.copy_((4.0 if name == "model.norm.weight" else 1.0) * (1 + 0.3 * torch.randn_like(p)))
            elif name.endswith("bias"):
                p.copy_(0.3 * torch.randn_like(p))
            else:
                p.mul_(24.0 if "q_proj" in name or "k_proj" in name else 8.0)
    return m


@pytest.fixture(scope="module", params=sorted(SPECS))
def pair(request, tmp_path_factory):
    """(transformers model, its save_pretrained directory, our model loaded from that directory)."""
    path = tmp_path_factory.mktemp(f"granite-{request.param}")
    hf = hf_granite(SPECS[request.param])
    hf.save_pretrained(path)
    ours = GraniteHybrid(GraniteHybridConfig.from_hf(read_config(path), str(path)), read_state_dict(path))
    ours.allocate()
    return hf, path, ours


@torch.no_grad()
def hf_states(hf, ids):
    """Per layer: Mamba (conv state (C, K-1), ssm state (H, P, N)) or attention (K (K, L, E), V)."""
    cache = hf(torch.tensor([ids]), use_cache=True).past_key_values
    k1 = hf.config.mamba_d_conv - 1
    return [(cache.get_conv_state(i)[0, :, -k1:], cache.get_recurrent_state(i)[0]) if kind == "linear_attention"
            else (cache.layers[i].keys[0], cache.layers[i].values[0]) for i, kind in enumerate(hf.config.layer_types)]


def our_states(model):
    """The same list from our caches: Mamba slots of the SSM cache, committed rows of the K/V cache."""
    c = model.cache
    return [(c.ssm.conv[L["slot"]].clone(), c.ssm.ssm[L["slot"]].clone()) if L["kind"] == "mamba"
            else (c.kv.k[L["slot"], :, :c.length].clone(), c.kv.v[L["slot"], :, :c.length].clone()) for L in model.layers]


# ---- (1) full forward -------------------------------------------------------------------------------
def test_full_forward_matches_transformers(pair):
    hf, _, ours = pair
    ref = hf_logits(hf, IDS)
    got = ours.full_logits(IDS)
    err = (got - ref).abs().max().item()
    print(f"full forward max |dlogit| {err:.2e} (logit std {ref.std().item():.2f})")
    assert ref.std() > 1.0  # the test has power: logits are not near-uniform
    assert err <= TOL
    # ... and the attention layers matter: without them the logits move by far more than TOL
    saved = ours.layers
    ours.layers = [dict(L, wo=as_t(torch.zeros(L["wo"].shape[1], L["wo"].shape[0]), L["wo"].dtype), bo=None)
                   if L["kind"] == "attention" else L for L in saved]
    try:
        assert (ours.full_logits(IDS) - ref).abs().max().item() > 0.5
    finally:
        ours.layers = saved


# ---- (2) cached decoding ------------------------------------------------------------------------------
def test_prefill_then_one_token_at_a_time_equals_full_forward(pair):
    hf, _, ours = pair
    ref = hf_logits(hf, IDS)
    fresh(ours, IDS[:10])
    rows = []
    for t in IDS[10:]:
        rows.append(ours.verify([t], [-1])[0])
        ours.commit([0])
    err = (torch.stack(rows) - ref[10:]).abs().max().item()
    print(f"step-by-step max |dlogit| {err:.2e}")
    assert err <= TOL and ours.cache.length == len(IDS)


# ---- (3) tree verify: one pass, from a committed state that it leaves unchanged ----------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_tree_verify_equals_each_path_and_leaves_state(pair, seed):
    hf, _, ours = pair
    prefix, (tokens, parents) = IDS[:13], random_tree(random.Random(seed), 14)
    fresh(ours, prefix)
    before = our_states(ours)
    got = ours.verify(tokens, parents)
    err = max((got[i] - hf_logits(hf, prefix + [tokens[r] for r in path_rows(parents, i)])[-1]).abs().max().item()
              for i in range(len(tokens)))
    print(f"tree ({len(tokens)} nodes) max |dlogit| {err:.2e}")
    assert err <= TOL
    assert ours.cache.length == len(prefix) and ours.cache.scratch == len(tokens)
    assert all(torch.equal(x, y) for sa, sb in zip(before, our_states(ours)) for x, y in zip(sa, sb))
    again = ours.verify(tokens, parents)  # verify is repeatable: nothing leaked into the state
    assert torch.equal(got, again)


# ---- (4) commit = activation replay + K/V compaction ----------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_commit_a_path_then_continue(pair, seed):
    hf, _, ours = pair
    prefix, (tokens, parents) = IDS[:12], random_tree(random.Random(seed), 12)
    leaves = [i for i in range(len(tokens)) if i not in parents]
    for node in [max(leaves, key=lambda i: len(path_rows(parents, i))), parents[leaves[0]]]:  # deepest leaf, inner node
        rows = path_rows(parents, node)
        seq = prefix + [tokens[r] for r in rows]
        fresh(ours, prefix).verify(tokens, parents)
        ours.commit(rows)
        assert ours.cache.length == len(seq) and ours.cache.scratch == 0
        replayed = our_states(ours)
        cont = IDS[30:36]  # continuing from the committed path == a full forward
        got = ours.verify(cont, list(range(-1, len(cont) - 1)))
        assert (got - hf_logits(hf, seq + cont)[-len(cont):]).abs().max().item() <= TOL
        fresh(ours, prefix)
        for r in rows:  # the same tokens, step by step
            ours.verify([tokens[r]], [-1])
            ours.commit([0])
        err_step, err_hf = state_err(replayed, our_states(ours)), state_err(replayed, hf_states(hf, seq))
        print(f"path of {len(rows)}: replay vs step-by-step {err_step:.2e}, vs transformers {err_hf:.2e}")
        assert err_step <= STATE_TOL and err_hf <= STATE_TOL


def test_extend_adds_nodes_to_the_scratch_tree(pair):
    _, _, ours = pair
    tokens, parents = random_tree(random.Random(5), 12)
    fresh(ours, IDS[:9])
    whole = ours.verify(tokens, parents)
    ours.verify(tokens[:5], parents[:5])
    part = ours.extend(tokens[5:], parents[5:])
    assert (part - whole[5:]).abs().max().item() <= 1e-5
    assert ours.cache.scratch == len(tokens) and ours.cache.scratch_parents == parents


def test_commit_rejects_rows_that_are_not_a_chain(pair):
    _, _, ours = pair
    fresh(ours, IDS[:5])
    ours.verify([1, 2, 3], [-1, 0, 0])  # a fork: rows 1 and 2 are siblings
    with pytest.raises(ValueError, match="chain"):
        ours.commit([0, 1, 2])
    assert ours.cache.ssm.length == ours.cache.kv.length == 5  # neither side moved


@pytest.mark.parametrize("kind", ["mamba", "attention"])
def test_layouts_of_one_kind(kind, tmp_path):
    """transformers' default layout is all Mamba; all attention leaves the SSM cache with no layers."""
    hf = hf_granite(dict(SPECS["nope"], layer_types=[kind] * 4))
    hf.save_pretrained(tmp_path)
    ours = GraniteHybrid(GraniteHybridConfig.from_hf(read_config(tmp_path), str(tmp_path)), read_state_dict(tmp_path))
    assert (ours.full_logits(IDS) - hf_logits(hf, IDS)).abs().max().item() <= TOL
    ours.allocate()
    tokens, parents = random_tree(random.Random(3), 10)
    got = fresh(ours, IDS[:10]).verify(tokens, parents)
    rows = path_rows(parents, len(tokens) - 1)
    ours.commit(rows)
    seq = IDS[:10] + [tokens[r] for r in rows]
    assert (got[rows[-1]] - hf_logits(hf, seq)[-1]).abs().max().item() <= TOL
    assert (ours.verify([5], [-1])[0] - hf_logits(hf, seq + [5])[-1]).abs().max().item() <= TOL


# ---- rollback ---------------------------------------------------------------------------------------------
def test_rollback_only_where_the_recurrent_state_can_go(pair):
    hf, _, ours = pair
    fresh(ours, IDS[:12])
    ours.verify(IDS[12:20], list(range(-1, 7)))
    ours.commit(range(6))  # 12 -> 18
    ours.rollback(15)  # inside the last commit: the kept previous state + 3 replayed rows
    assert ours.cache.ssm.length == ours.cache.kv.length == 15
    assert state_err(our_states(ours), hf_states(hf, IDS[:15])) <= STATE_TOL
    with pytest.raises(ValueError, match="cannot roll back"):
        ours.rollback(11)
    nxt = ours.verify([IDS[15]], [-1])[0]
    assert (nxt - hf_logits(hf, IDS[:16])[-1]).abs().max().item() <= TOL
    ours.rollback(0)
    assert ours.cache.length == 0 and ours.cache.kv.length == 0 and not ours.cache.ssm.ssm.any()
    assert ours.cache.prefix_rollback is False


def test_with_own_cache_shares_weights_not_state(pair):
    hf, _, ours = pair
    fresh(ours, IDS[:10])
    twin = ours.with_own_cache()
    assert twin.cache is not ours.cache and twin.embed is ours.embed and twin.length == 0
    twin.prefill(IDS[:20])
    assert ours.cache.length == 10
    assert state_err(our_states(ours), hf_states(hf, IDS[:10])) <= STATE_TOL


# ---- (5) the decode loop ---------------------------------------------------------------------------------
@torch.no_grad()
def hf_generate(hf, prompt, n):
    out = hf.generate(torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long), max_new_tokens=n,
                      min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def test_decoder_greedy_strategies_equal_transformers_generate(pair):
    hf, _, ours = pair
    prompt = [1, 5, 9, 3, 5, 9, 3, 7, 2, 5, 9]
    ref = hf_generate(hf, prompt, 24)
    dec = Decoder(ours, ours)  # the model drafts for itself through its own cache
    modes = [dict(ssm_tree=t, backtrack=b) for t in ("stree", "unrolled") for b in ("replay", "joint", "recompute")]
    strategies = [preset("ar"), preset("pld"), preset("sd", draft_len=4)] + [preset("tree", tree=(2, 2, 1), **m) for m in modes]
    for s in strategies + [preset("sd", draft_len=4, backtrack="joint"), preset("pld", backtrack="recompute")]:
        evs, _ = run_generation(dec, prompt, s, 24)
        assert [t for e in evs for t in e.emitted] == ref, s.label()
        if s.name == "sd":  # a model drafting for itself is always right
            assert all(e.accepted == 4 for e in evs[:-1])
        dec.reset()
    # an oracle right for 0..5 tokens a step: accepted in part (the correction from an inner row,
    # the commit stopping mid-tree: K/V compaction and SSM replay of a partial path) in every mode
    # (the rope spec's tied head answers any prompt by repeating its last token, which hides a
    # wrong correction; the nope spec's does not)
    oracle_runs(dec, prompt, ref, [preset(n, **m, **k) for m in modes for n, k in (("sd", dict(draft_len=4)),
                                                                                   ("tree", dict(tree=(2, 2, 1))))], 96)


# ---- (6) config and checkpoint validation ----------------------------------------------------------------
def test_moe_variants_are_refused_clearly(pair):
    _, path, _ = pair
    cfg = read_config(path)
    for experts in (8, None):  # explicit, and absent (transformers' default is 8 experts)
        moe = dict(cfg, num_local_experts=experts) if experts else {k: v for k, v in cfg.items() if k != "num_local_experts"}
        with pytest.raises(ModelLoadError, match=r"MoE variants are not supported \(dense granite-4.0-h only\)"):
            GraniteHybridConfig.from_hf(moe, str(path))


def test_config_reads_granite_fields(pair):
    hf, path, ours = pair
    c = ours.cfg
    assert c.layer_kinds == tuple("mamba" if k == "linear_attention" else "attention" for k in hf.config.layer_types)
    assert (c.embedding_multiplier, c.attention_multiplier, c.residual_multiplier, c.logits_scaling) == (12.0, 1 / 16, 0.3, 3.0)
    assert c.mamba.num_layers == 2 and ours.kv_dims == (2, 2, 16) and ours.max_context == 512
    legacy = dict(read_config(path), layer_types=["mamba" if k == "linear_attention" else "attention" for k in hf.config.layer_types])
    assert GraniteHybridConfig.from_hf(legacy).layer_kinds == c.layer_kinds  # the names in published config.json files
    assert ours.describe()["attention_layers"] == [i for i, k in enumerate(c.layer_kinds) if k == "attention"]


BAD_FIELDS = [("layer_types", ["mamba"] * 3), ("layer_types", ["mamba", "moe", "mamba", "attention"]),
              ("position_embedding_type", "alibi"), ("hidden_size", None), ("mamba_d_head", 12), ("num_key_value_heads", 3),
              ("hidden_act", "gelu"), ("attention_multiplier", -1.0), ("logits_scaling", 0), ("mamba_n_groups", 3)]


@pytest.mark.parametrize("key,value", BAD_FIELDS)
def test_missing_or_absurd_config_fields_raise(pair, key, value):
    _, path, _ = pair
    cfg = read_config(path)
    if value is None:
        del cfg[key]
    else:
        cfg[key] = value
    with pytest.raises(ModelLoadError):
        GraniteHybridConfig.from_hf(cfg, str(path))


def test_missing_or_misshapen_tensors_raise(pair):
    _, path, ours = pair
    sd = read_state_dict(path)
    a = ours.cfg.layer_kinds.index("attention")
    m = ours.cfg.layer_kinds.index("mamba")
    for name in (f"model.layers.{m}.mamba.A_log", f"model.layers.{a}.self_attn.k_proj.weight", "model.norm.weight"):
        gone = {k: v for k, v in sd.items() if k != name}
        with pytest.raises(ModelLoadError, match="lacks tensor"):
            GraniteHybrid(ours.cfg, gone)
    cut = dict(sd)
    cut[f"model.layers.{a}.shared_mlp.input_linear.weight"] = sd[f"model.layers.{a}.shared_mlp.input_linear.weight"][:-1]
    with pytest.raises(ModelLoadError, match="input_linear"):
        GraniteHybrid(ours.cfg, cut)


def test_bf16_error_is_that_of_transformers_in_bf16(pair):
    hf, path, ours = pair
    low = GraniteHybrid(ours.cfg, read_state_dict(path), dtype=torch.bfloat16)
    ref, got = hf_logits(hf, IDS), low.full_logits(IDS).float()
    hf_err = (hf_logits(copy.deepcopy(hf).to(torch.bfloat16), IDS).float() - ref).abs().max().item()
    err = (got - ref).abs().max().item()
    print(f"bf16 max |dlogit| ours {err:.3f}, transformers {hf_err:.3f}")
    assert got.isfinite().all() and err <= 2 * hf_err
