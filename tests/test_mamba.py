"""Mamba-1 equivalence tests (STYLE.md item 6): our logits equal transformers' full forward; cached
step-by-step decoding, chain and tree verification from a non-empty committed state, and replay
commits all equal a plain forward from scratch.

transformers' own cached multi-token Mamba-1 forward starts its scan from a zero state
(reference/models.md §0 finding 4), so every reference here is a full, uncached forward.
"""

from __future__ import annotations

import pytest
import torch

from engine.drafters.ngram import NgramDrafter
from engine.errors import ModelLoadError
from engine.generate import Decoder, run_generation
from engine.loading import load, read_config, read_state_dict
from engine.models.mamba import Mamba, MambaConfig, selective_scan, tree_plan
from engine.strategy import preset
from engine.tree import TokenTree

from .tiny import saved, uncached_greedy

KINDS = {
    "tied": dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, state_size=16, expand=2, conv_kernel=4),
    # every option flipped: untied head, in/out biases, no conv bias, bf16-style residual, explicit dt rank, K=3
    "untied": dict(vocab_size=96, hidden_size=64, num_hidden_layers=2, state_size=8, expand=2, conv_kernel=3,
                   time_step_rank=5, use_bias=True, use_conv_bias=False, residual_in_fp32=False, tie_word_embeddings=False),
}
IDS = torch.randint(0, 96, (48,), generator=torch.Generator().manual_seed(1)).tolist()
# A packed tree in depth-first order (levels are not contiguous rows): row 0 is the pending root.
TREE_PARENTS = [-1, 0, 1, 2, 0, 4, 1, 6, 7, 4, 3]
TREE_TOKENS = [IDS[12], 5, 17, 33, 70, 2, 91, 40, 8, 64, 23]
TOL = 1e-4  # logits, fp32 vs transformers
# States: 1e-5 relative to the state's size in fp32 (a 9-row and a 1-row pass round their GEMMs
# differently in the last bit, and layer 1 sees layer 0's rounding: ~1e-6 relative is the floor);
# in fp64, where rounding vanishes, replay must equal step-by-step to 1e-10 absolute.
STATE_TOL = {torch.float32: 1e-5, torch.float64: 1e-10}
DTYPES = [torch.float32, torch.float64]


def hf_mamba(kind: str, seed: int = 0):
    """A tiny random MambaForCausalLM whose output depends on far history: slow decay (A in
    [-1.5, -0.1], dt in [0.01, 0.1]) and scaled projections, so a wrong start state is visible
    (changing all but the last 5 of 40 tokens moves the last logits by 3-5, logit std ~1.6).
    x_proj keeps its init scale: SSM states stay ~10, where fp32 GEMM rounding (activations of a
    9-row pass vs a 1-row pass differ in the last bit) stays near 1e-6 of the state."""
    from transformers import MambaConfig as HFConfig, MambaForCausalLM

    torch.manual_seed(seed)
    m = MambaForCausalLM(HFConfig(**KINDS[kind])).eval()
    with torch.no_grad():
        for n, p in m.named_parameters():
            if n.endswith("A_log"):
                p.copy_(torch.log(torch.empty_like(p).uniform_(0.1, 1.5)))
            elif "dt_proj.bias" in n:
                p.copy_(torch.log(torch.expm1(torch.empty_like(p).uniform_(0.01, 0.1))))  # inverse softplus
            elif n.endswith(".bias") and "dt_proj" not in n:
                p.normal_(0, 0.1)
            elif "out_proj" in n:
                p.mul_(4.0)
            elif "norm" not in n and "x_proj" not in n and not n.endswith(".D"):
                p.mul_(2.0)
    return m


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny models gain nothing from threads. Run alone, this module loads torch (and OpenMP)
    before engine/__init__ sets OMP_WAIT_POLICY=PASSIVE, and on a busy 2-core machine the
    spinning threads made it 10x slower (7 s vs 67 s)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """kind -> (saved directory, transformers model)."""
    out = {}
    for kind in KINDS:
        path = tmp_path_factory.mktemp(f"mamba-{kind}")
        hf = hf_mamba(kind)
        hf.save_pretrained(path)
        out[kind] = (path, hf)
    return out


def ours(path, max_context=None, dtype=torch.float32) -> Mamba:
    m = Mamba(MambaConfig.from_hf(read_config(path), str(path)), read_state_dict(path), dtype=dtype, max_context=max_context)
    m.allocate()
    return m


@torch.no_grad()
def hf_logits(hf, ids) -> torch.Tensor:
    return hf(torch.tensor([list(ids)]), use_cache=False).logits[0]


def state_of(m: Mamba):
    c = m.cache
    return c.length, [t.clone() for t in c.conv], [t.clone() for t in c.ssm]


def state_err(a, b) -> float:
    assert a[0] == b[0], f"lengths differ: {a[0]} vs {b[0]}"
    return max((x.double() - y.double()).abs().max().item() for x, y in zip(a[1] + a[2], b[1] + b[2]))


def state_ok(a, b, dtype) -> tuple[bool, float]:
    """(within tolerance, max abs error); fp32 is judged relative to the largest state entry."""
    err = state_err(a, b)
    scale = max(1.0, *(t.abs().max().item() for t in a[1] + a[2])) if dtype == torch.float32 else 1.0
    return err <= STATE_TOL[dtype] * scale, err


def stepwise(m: Mamba, prefix, tokens) -> list[torch.Tensor]:
    """The plain decoding reference: prefill, then one verify([t]) + commit([0]) per token."""
    m.cache.reset()
    m.prefill(prefix)
    rows = []
    for t in tokens:
        rows.append(m.verify([t], [-1])[0])
        m.commit([0])
    return rows


def path_to(parents, r):
    path = [r]
    while parents[path[-1]] >= 0:
        path.append(parents[path[-1]])
    return path[::-1]


@pytest.mark.parametrize("kind", list(KINDS))
def test_tiny_model_remembers_far_history(kind, models):
    """The tests below have power only if a wrong SSM start state changes the logits."""
    hf = models[kind][1]
    other = torch.randint(0, 96, (35,), generator=torch.Generator().manual_seed(5)).tolist() + IDS[35:40]
    assert (hf_logits(hf, IDS[:40])[-1] - hf_logits(hf, other)[-1]).abs().max().item() > 1.0


@pytest.mark.parametrize("kind", list(KINDS))
def test_logits_match_transformers(kind, models):
    path, hf = models[kind]
    m = ours(path)
    err = (m.full_logits(IDS[:40]) - hf_logits(hf, IDS[:40])).abs().max().item()
    print(f"{kind}: full forward max |dlogit| {err:.2e}")
    assert err <= TOL


@pytest.mark.parametrize("kind", list(KINDS))
def test_prefill_then_steps_equal_full_forward(kind, models):
    path, hf = models[kind]
    m = ours(path)
    ref = hf_logits(hf, IDS[:40])
    m.prefill(IDS[:10], chunk=4)  # chunk boundaries inside the prompt
    for i in range(10, 40):
        got = m.verify([IDS[i]], [-1])[0]
        m.commit([0])
        assert (got - ref[i]).abs().max().item() <= TOL, i
    assert m.cache.length == 40


@pytest.mark.parametrize("kind", list(KINDS))
def test_chain_verify_from_committed_state(kind, models):
    path, hf = models[kind]
    m = ours(path)
    ref = hf_logits(hf, IDS[:24])
    m.prefill(IDS[:15])
    before = state_of(m)
    got = m.verify(IDS[15:24], list(range(-1, 8)))
    err = (got - ref[15:24]).abs().max().item()
    print(f"{kind}: chain verify max |dlogit| {err:.2e}")
    assert err <= TOL
    assert state_err(before, state_of(m)) == 0.0 and m.cache.scratch == 9


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_replay_commit_equals_stepwise(kind, dtype, models):
    path, _ = models[kind]
    m, ref = ours(path, dtype=dtype), ours(path, dtype=dtype)
    for k in (1, 4, 9):
        m.cache.reset()
        m.prefill(IDS[:15])
        m.verify(IDS[15:24], list(range(-1, 8)))
        m.commit(list(range(k)))
        stepwise(ref, IDS[:15], IDS[15:15 + k])
        ok, err = state_ok(state_of(m), state_of(ref), dtype)
        print(f"{kind} {dtype}: replay of {k} rows, max state error {err:.2e}")
        assert ok
        nxt = IDS[15 + k]
        assert (m.verify([nxt], [-1]) - ref.verify([nxt], [-1])).abs().max().item() <= TOL


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_tree_verify_and_commit_every_path(kind, dtype, models):
    """STree verify: every node's logits equal a full forward of prefix + its root-to-node path
    (transformers in fp32; our own full forward in fp64, to 1e-10); committing any path by replay
    equals decoding that path token by token."""
    path, hf = models[kind]
    m, ref = ours(path, dtype=dtype), ours(path, dtype=dtype)
    prefix = IDS[:12]
    m.prefill(prefix)
    before = state_of(m)
    logits = m.verify(TREE_TOKENS, TREE_PARENTS)
    assert state_err(before, state_of(m)) == 0.0
    worst = 0.0
    for r in range(len(TREE_TOKENS)):
        ids = prefix + [TREE_TOKENS[j] for j in path_to(TREE_PARENTS, r)]
        want = hf_logits(hf, ids)[-1] if dtype == torch.float32 else ref.full_logits(ids)[-1]
        worst = max(worst, (logits[r] - want).abs().max().item())
    print(f"{kind} {dtype}: tree verify max |dlogit| {worst:.2e}")
    assert worst <= (TOL if dtype == torch.float32 else 1e-10)
    ref.allocate()
    worst = 0.0
    for r in range(len(TREE_TOKENS)):
        rows = path_to(TREE_PARENTS, r)
        m.verify(TREE_TOKENS, TREE_PARENTS)
        m.commit(rows)
        stepwise(ref, prefix, [TREE_TOKENS[j] for j in rows])
        ok, err = state_ok(state_of(m), state_of(ref), dtype)
        worst = max(worst, err)
        assert ok, (rows, err)
        m.rollback(12)  # back into the last commit: its start state
        assert state_err(state_of(m), before) == 0.0
    print(f"{kind} {dtype}: tree path commits, max state error {worst:.2e}")


def test_tree_scan_equals_path_scans_exactly():
    """selective_scan over a tree gives each node the state of a plain scan along its path, bit for
    bit (odd sizes), which is why replaying cached activations reproduces the verified state."""
    g = torch.Generator().manual_seed(0)
    T, I, N = len(TREE_PARENTS), 37, 5
    x, B, S0 = torch.randn(T, I, generator=g), torch.randn(T, N, generator=g), torch.randn(I, N, generator=g)
    dt, A = torch.rand(T, I, generator=g) * 0.2, -torch.rand(I, N, generator=g) * 2
    S = selective_scan(x, dt, B, A, S0, tree_plan(TREE_PARENTS, 4)[0])
    for r in range(T):
        ix = torch.tensor(path_to(TREE_PARENTS, r))
        chain = tree_plan(list(range(-1, len(ix) - 1)), 4)[0]
        assert torch.equal(selective_scan(x[ix], dt[ix], B[ix], A, S0, chain)[-1], S[r]), r


def test_tree_plan_conv_windows():
    levels, win = tree_plan([-1, 0, 0, 1, 3], 4)  # committed conv rows are 0..2, node t is row 3 + t
    assert win.tolist() == [[0, 1, 2, 3], [1, 2, 3, 4], [1, 2, 3, 5], [2, 3, 4, 6], [3, 4, 6, 7]]
    assert [r for r, _ in levels] == [slice(0, 1), slice(1, 3), slice(3, 4), slice(4, 5)]
    with pytest.raises(ValueError):
        tree_plan([-1, 2, 0], 4)


def test_bf16_runs_and_is_close(models):
    """bf16 error judged against transformers' own bf16 error (STYLE.md item 5)."""
    import copy

    path, hf = models["tied"]
    ref = hf_logits(hf, IDS[:40])
    ours_err = (ours(path, dtype=torch.bfloat16).full_logits(IDS[:40]).float() - ref).abs().max().item()
    hf_err = (hf_logits(copy.deepcopy(hf).to(torch.bfloat16), IDS[:40]).float() - ref).abs().max().item()
    print(f"bf16 max |dlogit|: ours {ours_err:.3f}, transformers {hf_err:.3f}")
    assert ours_err <= 2 * hf_err + 0.05


def test_commit_rejects_rows_that_are_not_a_chain(models):
    m = ours(models["tied"][0])
    m.prefill(IDS[:5])
    m.verify(TREE_TOKENS, TREE_PARENTS)
    with pytest.raises(ValueError, match="chain"):
        m.commit([0, 1, 4])


def test_rollback_inside_last_commit_only(models):
    path, _ = models["tied"]
    m, ref = ours(path), ours(path)
    m.prefill(IDS[:10], chunk=6)
    with pytest.raises(ValueError, match="rewinds only"):
        m.rollback(5)  # before the last prefill chunk
    m.rollback(8)  # inside it (the recompute backtrack prefills the accepted tokens)
    stepwise(ref, IDS[:6], IDS[6:8])
    assert state_ok(state_of(m), state_of(ref), torch.float32)[0]
    m.prefill(IDS[8:10])
    m.verify(IDS[10:16], list(range(-1, 5)))
    m.commit(range(6))
    m.rollback(13)  # the decode loop cutting tokens after an EOS
    stepwise(ref, IDS[:10], IDS[10:13])
    assert state_ok(state_of(m), state_of(ref), torch.float32)[0]
    with pytest.raises(ValueError, match="rewinds only"):
        m.rollback(9)
    m.rollback(0)
    assert m.cache.length == 0 and all(not t.any() for t in m.cache.ssm + m.cache.conv)


def test_own_cache_is_independent(models):
    m = ours(models["tied"][0])
    m.prefill(IDS[:8])
    clone = m.with_own_cache()
    before = state_of(m)
    clone.prefill(IDS[:20])
    assert clone.cache.length == 20 and state_err(before, state_of(m)) == 0.0
    with pytest.raises(NotImplementedError):
        m.extend([1], [-1])
    assert m.cache.room() == m.cache.capacity - 8


def test_context_full(models):
    m = ours(models["tied"][0], max_context=16)
    assert m.cache.capacity == 16
    m.prefill(IDS[:12])
    with pytest.raises(OverflowError):
        m.verify(IDS[12:18], list(range(-1, 5)))


BAD_CONFIGS = [
    ({"hidden_size": None}, "hidden_size"),
    ({"num_hidden_layers": 0}, "num_hidden_layers"),
    ({"vocab_size": 10**9}, "vocab_size"),
    ({"state_size": -16}, "state_size"),
    ({"time_step_rank": "big"}, "time_step_rank"),
    ({"conv_kernel": 1000}, "conv_kernel"),
    ({"expand": 0}, "expand"),
    ({"hidden_act": "gelu"}, "hidden_act"),
]


@pytest.mark.parametrize("change,field", BAD_CONFIGS)
def test_bad_config_is_a_load_error(change, field, models):
    cfg = read_config(models["tied"][0])
    cfg.update(change)
    cfg = {k: v for k, v in cfg.items() if v is not None}
    with pytest.raises(ModelLoadError, match=field):
        MambaConfig.from_hf(cfg)


def test_bad_checkpoint_is_a_load_error(models):
    path = models["tied"][0]
    cfg = MambaConfig.from_hf(read_config(path))
    sd = read_state_dict(path)
    with pytest.raises(ModelLoadError, match="A_log"):
        Mamba(cfg, {k: v for k, v in sd.items() if not k.endswith("layers.1.mixer.A_log")})
    with pytest.raises(ModelLoadError, match="shape"):
        Mamba(cfg, {**sd, "backbone.layers.0.mixer.x_proj.weight": torch.zeros(3, 128)})
    untied = MambaConfig.from_hf({**read_config(path), "tie_word_embeddings": False})
    with pytest.raises(ModelLoadError, match="lm_head"):
        Mamba(untied, sd)


def hf_greedy(hf, prompt, n):
    return uncached_greedy(lambda ids: hf_logits(hf, ids), prompt, n)


class OracleDrafter:
    """Knows the greedy continuation; each step drafts a tree whose true branch is right for
    ``good[step]`` tokens, each true node with a wrong sibling: multi-token tree commits."""

    name = "oracle"

    def __init__(self, full: list[int], good=(5, 2, 0, 3, 1, 4)):
        self.full, self.good = full, good
        self.reset()

    def reset(self) -> None:
        self.step = 0

    def propose(self, history, req) -> TokenTree:
        n_good = self.good[self.step % len(self.good)]
        self.step += 1
        tokens, parents, parent = [], [], -1
        for d, t in enumerate(self.full[len(history):len(history) + 6]):
            tokens += [(t + 1 + d) % 96, t if d < n_good else (t + 7) % 96]  # wrong sibling, then the (maybe) true node
            parents += [parent, parent]
            parent = len(tokens) - 1
        return TokenTree(tokens[:req.max_nodes], parents[:req.max_nodes])


@pytest.mark.parametrize("kind", list(KINDS))
def test_decoder_greedy_strategies_equal_plain_greedy(kind, models, tmp_path):
    path, hf = models[kind]
    drafter = load(str(saved("draft", str(tmp_path)))).model  # a tiny llama with the same vocabulary
    prompt = [1, 5, 9, 3, 5, 9, 3, 7, 2, 5, 9]
    ref = hf_greedy(hf, prompt, 30)
    eos = ref[17]  # an EOS inside an accepted run makes the loop cut tokens (rollback into the last commit)
    cut = ref[: ref.index(eos) + 1]
    dec = Decoder(ours(path), drafter)
    oracle = OracleDrafter(prompt + ref)
    runs = [(preset("ar"), None), (preset("pld"), None), (preset("sd", draft_len=4), None),
            (preset("tree", tree=(3, 2, 2, 1, 1)), None), (preset("tree", tree=(2, 2, 2), ssm_tree="unrolled"), None)]
    runs += [(preset("pld", ssm_tree=t, backtrack=b), oracle) for t in ("stree", "unrolled") for b in ("replay", "joint", "recompute")]
    for s, drafter in runs:
        dec.drafters["ngram"] = drafter or NgramDrafter()
        for eos_ids, want in (((), ref), ((eos,), cut)):
            # the same prompt again: Decoder.start must rebuild the state (prefix_rollback = False)
            dec.eos_ids = set(eos_ids)
            evs, _ = run_generation(dec, prompt, s, 30)
            assert [t for e in evs for t in e.emitted] == want, (s.label(), s.ssm_tree, s.backtrack)
            assert dec.target.cache.length + len(dec._pending) == len(prompt) + len(want) - 1
            if drafter:
                assert sum(e.accepted for e in evs) >= len(want) // 2
