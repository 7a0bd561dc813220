"""The long-prefill path (issue 9 item 2): a Mamba-2 (or Granite-4.0-H hybrid) prompt through
dense chunked kernels, mamba_ssm's ``mamba_chunk_scan_combined`` and causal_conv1d's
``causal_conv1d_fn`` on CUDA when installed and asked for (SPECCHAT_MAMBA_SSM=1), the state
written straight in.

Checked here without them: each op's reference against the engine's own forms (the recurrence and
its replay contraction, a grouped conv1d); the model's prefill through the dense path equal to the
tree path + activation replay (state, next logits, greedy decoding); and the adapters' calls, made
against stand-in modules that check the layouts mamba_ssm and causal_conv1d document and compute
the same functions, so an argument in the wrong place or layout fails here, not on a GPU."""

from __future__ import annotations

import math
import sys
import types

import pytest
import torch
import torch.nn.functional as F

from engine import kernels
from engine.generate import Decoder, run_generation
from engine.loading import load
from engine.models.mamba2 import replay_state, tree_scan
from engine.strategy import preset
from engine.kernels.causal_conv import causal_conv, causal_conv_ref
from engine.kernels.chunk_scan import chunk_scan, chunk_scan_ref

from ..test_granite_hybrid import SPECS as GRANITE_SPECS, hf_granite
from ..test_mamba2 import hf_mamba2

PROMPT = [(11 * i * i + 5 * i + 2) % 96 for i in range(150)]


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


# ---- the references ----------------------------------------------------------------------------------
@pytest.mark.parametrize("T,C,K", [(1, 5, 4), (7, 12, 4), (33, 20, 2), (130, 9, 5)])
def test_causal_conv_ref_is_a_grouped_conv1d_continuing_the_state(T, C, K):
    g = torch.Generator().manual_seed(T)
    state, xbc = torch.randn(C, K - 1, generator=g), torch.randn(T, C, generator=g)
    w, b = torch.randn(K, C, generator=g), torch.randn(C, generator=g)
    out, new = causal_conv_ref(state, xbc, w, b)
    full = torch.cat([state, xbc.t()], 1)[None]  # (1, C, K-1+T)
    want = F.conv1d(full, w.t()[:, None, :], b, groups=C)[0].t()  # valid conv: T outputs
    assert out.shape == (T, C) and rel(out, want) < 1e-6
    assert torch.equal(new, full[0, :, -(K - 1):])
    out2, _ = causal_conv_ref(state, xbc, w, None)
    assert rel(out2 + b, want) < 1e-6


@pytest.mark.parametrize("T,H,P,G,N", [(1, 2, 3, 1, 4), (9, 4, 5, 2, 6), (40, 6, 8, 3, 16)])
def test_chunk_scan_ref_matches_the_engines_scan_and_replay(T, H, P, G, N):
    g = torch.Generator().manual_seed(T + H)
    x, B, C = torch.randn(T, H, P, generator=g), torch.randn(T, G, N, generator=g), torch.randn(T, G, N, generator=g)
    dt = F.softplus(torch.randn(T, H, generator=g) - 1)
    A = -torch.rand(H, generator=g) * 3 - 0.1
    state = torch.randn(H, P, N, generator=g)
    y, final = chunk_scan_ref(state, x, B, C, dt, A)
    anc = torch.tril(torch.ones(T, T, dtype=torch.bool))  # a chain: every earlier node is an ancestor
    assert rel(y, tree_scan(C, x, B, dt, dt * A, anc, state)) < 1e-5
    assert rel(final, replay_state(state, x, B, dt, dt * A)) < 1e-5


def test_unknown_backend_is_refused():
    with pytest.raises(ValueError, match="backend"):
        chunk_scan(torch.zeros(1, 1, 1), torch.zeros(1, 1, 1), torch.zeros(1, 1, 1), torch.zeros(1, 1, 1), torch.zeros(1, 1), torch.zeros(1), "cuda")
    with pytest.raises(ValueError, match="backend"):
        causal_conv(torch.zeros(1, 1), torch.zeros(1, 1), torch.zeros(2, 1), None, "triton")


# ---- stand-ins for the two libraries, checking their documented layouts -------------------------------------
@pytest.fixture
def fake_libs(monkeypatch):
    calls = {"scan": 0, "conv": 0}

    def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None, seq_idx=None,
                                  cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, math.inf), return_final_states=False,
                                  return_varlen_states=False):
        b, L, H, P = x.shape  # x (batch, seqlen, nheads, headdim)
        assert dt.shape == (b, L, H) and A.shape == (H,) and B.shape[:2] == (b, L) and B.shape == C.shape
        assert H % B.shape[2] == 0 and initial_states.shape == (b, H, P, B.shape[3]) and isinstance(chunk_size, int)
        assert D is None and z is None and dt_bias is None and not dt_softplus and return_final_states
        calls["scan"] += 1
        ys, finals = zip(*(chunk_scan_ref(initial_states[i], x[i], B[i], C[i], dt[i], A) for i in range(b)))
        return torch.stack(ys).to(x.dtype), torch.stack(finals)

    def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                         final_states_out=None, activation=None):
        b, dim, L = x.shape  # x (batch, dim, seqlen), weight (dim, width)
        assert weight.dim() == 2 and weight.shape[0] == dim and activation in (None, "silu", "swish")
        assert bias is None or bias.shape == (dim,)
        calls["conv"] += 1
        W = weight.shape[1]
        return F.conv1d(F.pad(x, (W - 1, 0)), weight[:, None, :], bias, groups=dim)  # causal: (batch, dim, seqlen)

    ssd = types.ModuleType("mamba_ssm.ops.triton.ssd_combined")
    ssd.mamba_chunk_scan_combined = mamba_chunk_scan_combined
    cc = types.ModuleType("causal_conv1d")
    cc.causal_conv1d_fn = causal_conv1d_fn
    for name in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, "mamba_ssm.ops.triton.ssd_combined", ssd)
    monkeypatch.setitem(sys.modules, "causal_conv1d", cc)
    return calls


def test_adapters_call_the_libraries_in_their_documented_layout(fake_libs):
    g = torch.Generator().manual_seed(5)
    T, H, P, G, N, C, K = 37, 4, 8, 2, 16, 24, 4
    x, B, Cm = torch.randn(T, H, P, generator=g), torch.randn(T, G, N, generator=g), torch.randn(T, G, N, generator=g)
    dt, A, state = F.softplus(torch.randn(T, H, generator=g)), -torch.rand(H, generator=g) - 0.1, torch.randn(H, P, N, generator=g)
    for got, want in zip(chunk_scan(state, x, B, Cm, dt, A, "mamba_ssm"), chunk_scan_ref(state, x, B, Cm, dt, A)):
        assert rel(got, want) < 1e-6
    cs, xbc, w, b = torch.randn(C, K - 1, generator=g), torch.randn(T, C, generator=g), torch.randn(K, C, generator=g), torch.randn(C, generator=g)
    for got, want in zip(causal_conv(cs, xbc, w, b, "mamba_ssm"), causal_conv_ref(cs, xbc, w, b)):
        assert got.shape == want.shape and rel(got, want) < 1e-6
    assert fake_libs == {"scan": 1, "conv": 1}


# ---- the model ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def paths(tmp_path_factory):
    out = {}
    for kind, make in (("mamba2", lambda: hf_mamba2("g2")), ("granite", lambda: hf_granite(GRANITE_SPECS["nope"]))):
        out[kind] = tmp_path_factory.mktemp(kind)
        make().save_pretrained(out[kind])
    return out


@pytest.fixture
def mamba2_path(paths):
    return paths["mamba2"]


def fresh(path):
    m = load(str(path)).model
    m.allocate(512)
    return m


def ssm_state(m):
    c = m.cache.ssm if hasattr(m.cache, "kv") else m.cache  # a hybrid's SSM side, or the SSM cache itself
    return c.ssm, c.conv


@pytest.mark.parametrize("kind", ["mamba2", "granite"])
@pytest.mark.parametrize("chunk", [256, 64])  # one dense chunk; three (state carried between them)
def test_dense_prefill_equals_tree_prefill_and_replay(paths, kind, chunk):
    a, b = fresh(paths[kind]), fresh(paths[kind])
    a.prefill(PROMPT[:-1], chunk=chunk)
    b.prefill(PROMPT[:-1], chunk=chunk, backend="ref")
    assert a.cache.length == b.cache.length == len(PROMPT) - 1 and b.cache.scratch == 0
    (sa, ca), (sb, cb) = ssm_state(a), ssm_state(b)
    assert rel(sb, sa) < 1e-5 and rel(cb, ca) < 1e-6
    if kind == "granite":  # the attention layers' K/V rows are the same tokens' either way
        n = a.cache.length
        assert rel(b.cache.kv.k[:, :n], a.cache.kv.k[:, :n]) < 1e-5 and rel(b.cache.kv.v[:, :n], a.cache.kv.v[:, :n]) < 1e-5
    tail = [PROMPT[-1], 3, 5]
    assert (b.verify(tail, [-1, 0, 1]) - a.verify(tail, [-1, 0, 1])).abs().max().item() < 1e-4


def test_engine_takes_the_dense_path_only_when_asked(mamba2_path, monkeypatch, fake_libs):
    m = fresh(mamba2_path)
    monkeypatch.setattr(kernels, "USE_MAMBA_SSM", False)
    assert kernels.long_prefill_backend("cuda", 10_000) is None
    monkeypatch.setattr(kernels, "USE_MAMBA_SSM", True)
    monkeypatch.setattr(kernels, "LONG_PREFILL", 100)
    assert kernels.long_prefill_backend("cpu", 10_000) is None  # CUDA only
    assert kernels.long_prefill_backend("cuda", 99) is None and kernels.long_prefill_backend("cuda", 100) == "mamba_ssm"
    m.prefill(PROMPT[:-1])  # on a CPU the dispatch keeps the engine's own path
    assert fake_libs == {"scan": 0, "conv": 0}
    ref = fresh(mamba2_path)
    ref.prefill(PROMPT[:-1])
    # where the dispatch says so (a CUDA device, here pretended), the libraries run every layer
    monkeypatch.setattr(kernels, "long_prefill_backend", lambda device, n: "mamba_ssm" if n >= 100 else None)
    m.cache.reset()
    m.prefill(PROMPT[:-1])
    assert fake_libs == {"scan": m.cfg.num_layers, "conv": m.cfg.num_layers}
    assert rel(m.cache.ssm, ref.cache.ssm) < 1e-5


@pytest.mark.parametrize("kind", ["mamba2", "granite"])
def test_greedy_decoding_after_a_dense_prefill_is_unchanged(paths, kind, monkeypatch):
    mamba2_path = paths[kind]
    want, _ = run_generation(Decoder(fresh(mamba2_path)), PROMPT, preset("ar"), 12)
    monkeypatch.setattr(kernels, "long_prefill_backend", lambda device, n: "ref" if n >= 100 else None)
    dec = Decoder(fresh(mamba2_path))
    got, _ = run_generation(dec, PROMPT, preset("ar"), 12)
    assert [t for e in got for t in e.emitted] == [t for e in want for t in e.emitted]
    # the prompt was one commit that no rollback can enter: an edited prompt rebuilds from 0
    with pytest.raises(ValueError, match="reset and prefill again"):
        dec.target.cache.rollback(len(PROMPT) - 5)
    edited = PROMPT[:120] + [1, 2, 3]
    want2, _ = run_generation(Decoder(fresh(mamba2_path)), edited, preset("ar"), 8)
    got2, _ = run_generation(dec, edited, preset("ar"), 8)
    assert [t for e in got2 for t in e.emitted] == [t for e in want2 for t in e.emitted]


@pytest.mark.parametrize("kind", ["mamba2", "granite"])
def test_a_dense_prefill_past_the_context_fails_cleanly(paths, kind):
    m = load(str(paths[kind])).model
    m.allocate(64)
    with pytest.raises(OverflowError, match="context full"):
        m.prefill(PROMPT, backend="ref")
    assert m.cache.length == 0 and m.cache.scratch == 0  # nothing half-committed
