"""engine/native: the C attention kernel against an fp64 reference, its shapes and fallbacks, and
the switch that turns it off. (Row exactness, tree rows vs plain decoding, is tested for both the
native and the torch implementation in tests/test_models.py.)"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import torch

from engine import native
from engine.models import common


def _ref(q, kc, vc, keys_per_row, scale):
    """fp64 softmax attention: q (H, T, E); kc, vc (K, P, E); row t attends to keys_per_row[t]."""
    H, T, E = q.shape
    K = kc.shape[0]
    G = H // K
    out = torch.zeros(T, H * E, dtype=torch.float64)
    for t in range(T):
        for h in range(H):
            k = kc[h // G, keys_per_row[t]].double()
            v = vc[h // G, keys_per_row[t]].double()
            p = torch.softmax(k @ q[h, t].double() * scale, 0)
            out[t, h * E:(h + 1) * E] = p @ v
    return out


needs_native = pytest.mark.skipif(native.lib() is None, reason=f"native kernels {native.status()}")


def test_the_kernel_builds_here_when_a_compiler_exists():
    if shutil.which(os.environ.get("SPECCHAT_CC", "cc")) is None:
        pytest.skip("no C compiler on this machine")
    assert native.status() == "on"


@needs_native
@pytest.mark.parametrize("K, G, E, P, T", [(3, 3, 64, 300, 1), (3, 3, 64, 37, 5), (1, 1, 32, 70, 3), (2, 4, 128, 129, 2),
                                           (4, 2, 16, 1000, 4), (5, 1, 48, 17, 17)])
def test_native_attention_matches_fp64(K, G, E, P, T, monkeypatch):
    """Causal chain rows over a cache: the kernel's bf16 output is the fp64 result rounded (about
    one bf16 ulp), at least as close as the torch implementation's (which rounds the
    probabilities to bf16 before the value product, as a plain bf16 attention does)."""
    monkeypatch.setattr(common, "NATIVE_ATTN", True)
    g = torch.Generator().manual_seed(K * 100 + E + T)
    H = K * G
    q = (2 * torch.randn(H, T, E, generator=g)).bfloat16()
    kn, vn = (torch.randn(K, T, E, generator=g).bfloat16() for _ in range(2))
    kc, vc = (torch.randn(K, P + T, E, generator=g).bfloat16() for _ in range(2))
    start = P
    mask = torch.ones(T, P + T, dtype=torch.bool).tril(start)
    plan = common.attn_plan(mask, P + T, T, G)
    assert plan.native is not None
    out = common.cached_attention(q, kn, vn, kc, vc, start, mask, E ** -0.5, plan)
    ref = _ref(q, kc, vc, [list(range(start + t + 1)) for t in range(T)], E ** -0.5)
    err = (out.double() - ref).abs()
    assert (err <= 2 ** -7 * ref.abs() + 1e-3).all(), err.max()  # within ~1 bf16 ulp (+ tiny absolute)
    monkeypatch.setattr(common, "NATIVE_ATTN", False)
    kc2, vc2 = kc.clone(), vc.clone()
    theirs = common.cached_attention(q, kn, vn, kc2, vc2, start, mask, E ** -0.5)
    assert err.max() <= (theirs.double() - ref).abs().max() + 1e-6


@needs_native
def test_shapes_the_kernel_does_not_take_fall_back_to_torch(monkeypatch):
    """E = 72 (not a multiple of 16): the torch implementation answers, same result as with the
    kernel switched off."""
    monkeypatch.setattr(common, "NATIVE_ATTN", True)
    g = torch.Generator().manual_seed(5)
    K, G, E, P, T = 2, 2, 72, 50, 3
    q = torch.randn(K * G, T, E, generator=g).bfloat16()
    kn, vn = (torch.randn(K, T, E, generator=g).bfloat16() for _ in range(2))
    kc, vc = (torch.randn(K, P + T, E, generator=g).bfloat16() for _ in range(2))
    mask = torch.ones(T, P + T, dtype=torch.bool).tril(P)
    a = common.cached_attention(q, kn, vn, kc.clone(), vc.clone(), P, mask, 0.1)
    monkeypatch.setattr(common, "NATIVE_ATTN", False)
    b = common.cached_attention(q, kn, vn, kc.clone(), vc.clone(), P, mask, 0.1)
    assert torch.equal(a, b)


@needs_native
def test_rows_are_the_same_whether_computed_serially_or_in_parallel(monkeypatch):
    """The kernel runs rows in parallel above a work threshold; a row's bits do not depend on it
    (one row alone vs the same row inside 300 rows)."""
    monkeypatch.setattr(common, "NATIVE_ATTN", True)
    g = torch.Generator().manual_seed(9)
    K, G, E, P, T = 3, 3, 64, 200, 300
    q = torch.randn(K * G, T, E, generator=g).bfloat16()
    kc, vc = (torch.randn(K, P + T, E, generator=g).bfloat16() for _ in range(2))
    mask = torch.ones(T, P + T, dtype=torch.bool).tril(P)
    big = common.cached_attention(q, kc[:, P:], vc[:, P:], kc.clone(), vc.clone(), P, mask, 0.125)
    for r in (0, 1, 150, 299):
        one = common.cached_attention(q[:, r:r + 1], kc[:, P + r:P + r + 1], vc[:, P + r:P + r + 1], kc.clone(), vc.clone(),
                                      P + r, None, 0.125)
        assert torch.equal(one[0], big[r])


def test_switching_the_kernels_off(tmp_path):
    """SPECCHAT_NATIVE=0: nothing is built, status says why, a bf16 model still decodes."""
    code = ("import torch; from engine import native; from engine.models import common;"
            "print(native.status());"
            "q=torch.randn(3,1,64).bfloat16(); k=torch.randn(1,1,64).bfloat16();"
            "c=torch.zeros(1,8,64).bfloat16();"
            "print(tuple(common.cached_attention(q,k,k,c,c.clone(),0,None,0.1).shape))")
    env = dict(os.environ, SPECCHAT_NATIVE="0", XDG_CACHE_HOME=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["off (SPECCHAT_NATIVE=0)", "(1, 192)"]
    assert not (tmp_path / "specchat").exists()


def test_a_missing_compiler_falls_back_with_a_reason(tmp_path):
    code = "from engine import native; print(native.status()); print(native.lib())"
    env = dict(os.environ, SPECCHAT_CC="no-such-cc-xyz", XDG_CACHE_HOME=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["off: no C compiler ('no-such-cc-xyz' not found)", "None"]


def test_the_shared_object_is_cached_by_source_and_cpu(tmp_path):
    """A fresh cache builds once; a second process reuses the file."""
    if shutil.which("cc") is None:
        pytest.skip("no C compiler on this machine")
    code = "from engine import native; print(native.status())"
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path))
    for _ in range(2):
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=180)
        assert r.stdout.strip() == "on", r.stderr
    built = list((tmp_path / "specchat" / "native").glob("specchat-*.so"))
    assert len(built) == 1


@needs_native
@pytest.mark.parametrize("K, N", [(576, 1536), (37, 5), (300, 17), (129, 64), (1536, 100)])
def test_native_linear_rows_are_exact_whatever_rides_with_them(K, N, monkeypatch):
    """engine/native/linear.c: every output one FMA chain over the input in order, so a row's bits
    are the same alone, in any group of rows, at any offset, on 1 or 2 threads, with a bias; the
    result is the fp64 product up to fp32 rounding, also for a prefill-sized pass."""
    g = torch.Generator().manual_seed(K + N)
    W = torch.randn(N, K, generator=g)
    b = torch.randn(N, generator=g)
    x = torch.randn(40, K, generator=g)
    lin = common.Linear(W, torch.float32, native=True)
    assert "native" in repr(lin)
    full, nobias = lin(x, b), lin(x)
    ref = (x.double() @ W.double().t() + b.double())
    assert torch.allclose(full.double(), ref, atol=1e-4 * K ** 0.5, rtol=1e-5)
    threads = torch.get_num_threads()
    try:
        for nt in (1, 2):
            torch.set_num_threads(nt)
            for a, e in [(0, 1), (7, 8), (0, 5), (3, 9), (10, 26), (1, 40), (2, 4), (5, 12), (0, 7)]:
                assert torch.equal(lin(x[a:e], b), full[a:e]), (nt, a, e)
                assert torch.equal(lin(x[a:e]), nobias[a:e]), (nt, a, e)
            for r in range(1, 21):  # every split into even groups of at most 6 rows
                assert torch.equal(lin(x[:r], b), full[:r]), (nt, r)
            assert torch.equal(lin(x[None, 3:9], b)[0], full[3:9])  # (B, T, K) inputs too
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(lin.dense(), W.t())
    assert torch.equal(lin.take_cols(torch.tensor([0, N - 1]))(x[:3]), lin(x[:3])[:, [0, N - 1]])
    big = torch.randn(300, K, generator=g)
    out = lin(big)
    assert torch.allclose(out, big @ W.t(), atol=1e-4 * K ** 0.5) and torch.equal(out[:40], lin(big[:40]))


@needs_native
@pytest.mark.parametrize("kind", ["llama", "mamba2"])
def test_greedy_strategies_equal_plain_greedy_through_the_native_linear(kind, tmp_path, monkeypatch):
    """With fp32 weights forced through linear.c (whatever this CPU's probe chose), every greedy
    strategy still emits plain greedy decoding's tokens, and the weights really took the kernel."""
    from engine.loading import load
    from engine.strategy import preset

    from .tiny import saved

    monkeypatch.setattr(common, "_NATIVE_LINEAR", {"on": True, "why": "on (test)"})
    target = load(str(saved(kind, str(tmp_path)))).model
    assert any(getattr(v, "_blocks", None) is not None for v in _linears(target))
    drafter = load(str(saved("draft", str(tmp_path)))).model
    _greedy_strategies_equal_ar(target, drafter, [preset("sd", draft_len=3), preset("sd", draft_len=6), preset("tree", tree=(3, 2, 2, 1, 1)),
                                                  preset("pld"), preset("mab"), preset("optimal"), preset("hybrid")])


def _greedy_strategies_equal_ar(target, drafter, strategies):
    from engine.generate import Decoder, run_generation
    from engine.strategy import preset

    for prompt in ([1, 5, 9, 3, 5, 9, 3, 7, 2, 5, 9], list(range(10, 40))):
        dec = Decoder(target, drafter)
        ref, _ = run_generation(dec, prompt, preset("ar"), 40)
        ref = [t for e in ref for t in e.emitted]
        for s in strategies:
            evs, _ = run_generation(dec, prompt, s, 40)
            assert [t for e in evs for t in e.emitted] == ref, (s.label(), prompt)


def _linears(model):
    """Every common.Linear reachable from a model's attributes (layers, mixers)."""
    seen, out, todo = set(), [], [model]
    while todo:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if isinstance(o, common.Linear):
            out.append(o)
        elif isinstance(o, (list, tuple)):
            todo.extend(o)
        elif isinstance(o, dict):
            todo.extend(o.values())
        elif hasattr(o, "__dict__") and type(o).__module__.startswith("engine."):
            todo.extend(vars(o).values())
    return out


@needs_native
@pytest.mark.parametrize("kind", ["mamba2", "mamba2_smol"])
def test_native_mamba2_draft_step_matches_the_torch_step(kind, tmp_path, monkeypatch):
    """engine/native/mamba2_step.c runs a drafter's fp32 Mamba-2 step (rows forked from the
    committed state) under common.fast_rows; its logits and the states it leaves match the torch
    step's closely (drafting only chooses proposals). Outside fast_rows the torch step runs."""
    from engine.loading import load

    from .tiny import saved

    monkeypatch.setattr(common, "_NATIVE_LINEAR", {"on": True, "why": "on (test)"})
    m = load(str(saved(kind, str(tmp_path)))).model
    m.allocate()
    m.prefill(list(range(3, 40)))
    toks = torch.tensor([5, 9, 11])
    a = m.fork(3)
    calls = []
    real = m._native_step
    monkeypatch.setattr(m, "_native_step", lambda *s: calls.append(real(*s)) or calls[-1])
    with torch.inference_mode():
        for step in range(4):
            before = {k: v.clone() for k, v in a.state.items()}
            ref = a.step(toks + step)  # torch
            assert calls[-1] is None
            after = {k: v.clone() for k, v in a.state.items()}
            for k, v in before.items():
                a.state[k].copy_(v)
            with common.fast_rows():
                got = a.step(toks + step)  # C, from the same states
            assert calls[-1] is not None
            assert torch.allclose(got, ref, atol=2e-4, rtol=1e-4), (got - ref).abs().max()
            for k in ("conv", "ssm"):
                assert torch.allclose(a.state[k], after[k], atol=1e-4, rtol=1e-3), (k, (a.state[k] - after[k]).abs().max())


@needs_native
def test_the_pool_serves_concurrent_callers_threads_and_a_forked_child():
    """engine/native/pool.c: one pool for every calling thread. Products called at once from four
    Python threads (ctypes drops the GIL) and from a forked child (which has no workers and must
    start its own) give the same bits as on the main thread; the first region after a worker is
    started runs (a worker that read the region counter only once it was running waited for the
    next region forever)."""
    g = torch.Generator().manual_seed(7)
    W = torch.randn(1536, 576, generator=g)
    x = torch.randn(8, 576, generator=g)
    lin = common.Linear(W, torch.float32, native=True)
    want = lin(x)
    import threading

    errors: list = []

    def hammer(i: int) -> None:
        try:
            for r in range(30):
                rows = 1 + (i + r) % 8
                if not torch.equal(lin(x[:rows]), want[:rows]):
                    errors.append((i, r))
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a caller hung in the pool"
    assert not errors, errors
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        ok = torch.equal(lin(x), want) and torch.equal(lin(x[:3]), want[:3])
        os._exit(0 if ok else 1)
    import time

    end = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < end:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked child hung in the pool")
    assert os.WIFEXITED(done[1]) and os.WEXITSTATUS(done[1]) == 0


def test_capped_threads_are_per_thread_and_restored():
    """native.capped(n) caps the threads this thread's kernel calls take (the drafter's C step
    beside a torch-pass target runs on one); nested caps restore, other threads keep theirs."""
    import threading

    full = torch.get_num_threads()
    assert native.threads() == full
    with native.capped(1):
        assert native.threads() == 1
        seen = []
        t = threading.Thread(target=lambda: seen.append(native.threads()))
        t.start()
        t.join()
        assert seen == [full]  # another thread is not capped
        with native.capped(None):
            assert native.threads() == full
        assert native.threads() == 1
        with native.capped(10 ** 6):
            assert native.threads() == full  # a cap never adds threads
    assert native.threads() == full


@needs_native
def test_a_drafter_beside_a_torch_pass_target_drafts_on_one_thread(tmp_path, monkeypatch):
    """Beside a bf16 target (torch's passes, OpenMP workers that may spin between them) the
    drafter's Mamba-2 C step runs on the calling thread alone, and only while drafting: the
    target's own calls and a q8/fp32 target's drafter keep every thread. Greedy output is
    unchanged (which thread computes a draft only decides proposals)."""
    from engine.generate import Decoder, run_generation
    from engine.loading import load
    from engine.models import mamba2
    from engine.strategy import preset

    from .tiny import saved

    monkeypatch.setattr(common, "_NATIVE_LINEAR", {"on": True, "why": "on (test)"})
    monkeypatch.setenv("SPECCHAT_NATIVE_BF16", "0")  # bf16 through torch (the bf16 C pass shares the pool)
    target = load(str(saved("llama", str(tmp_path))), dtype="bf16").model
    drafter = load(str(saved("mamba2", str(tmp_path)))).model  # fp32, the C step
    seen = []
    real = mamba2.Mamba2._native_step
    monkeypatch.setattr(mamba2.Mamba2, "_native_step",
                        lambda self, *a: (lambda lib: seen.append((lib is not None, native.threads())) or lib)(real(self, *a)))
    dec = Decoder(target, drafter)
    assert dec.draft_threads == 1
    prompt = list(range(10, 30))
    ref = [t for e in run_generation(dec, prompt, preset("ar"), 24)[0] for t in e.emitted]
    evs, summ = run_generation(dec, prompt, preset("sd", draft_len=4), 24)
    assert [t for e in evs for t in e.emitted] == ref
    drafted = [n for c, n in seen if c]
    assert drafted and set(drafted) == {1}, seen  # the C step ran, on one thread
    assert native.threads() == torch.get_num_threads()  # restored after the loop
    fp32 = load(str(saved("llama", str(tmp_path)))).model
    monkeypatch.setattr(type(fp32), "_native_table", lambda self: torch.zeros(1))  # as a C-pass target has
    assert Decoder(fp32, drafter).draft_threads is None  # the drafter shares the C pass's pool


@needs_native
def test_a_drafter_takes_the_c_path_whatever_the_targets_measure_chose(tmp_path, monkeypatch):
    """native_linear's measure (for targets) once found linear.c slower at 8 rows beside torch's
    spinning threads and left the shipped drafter in fp32 oneDNN (4x the bytes a draft token reads);
    a drafter loaded by a session takes linear.c (then Q8_0) wherever the kernels load, unless
    SPECCHAT_NATIVE_LINEAR=0 says otherwise."""
    from engine.session import ChatSession

    from .tiny import saved

    monkeypatch.setattr(common, "_NATIVE_LINEAR", {"on": False, "why": "off (test)"})
    monkeypatch.setenv("SPECCHAT_NATIVE_BF16", "0")  # a bf16 target in torch (the bf16 C pass holds its own records)
    W = torch.randn(48, 32)
    assert common.Linear(W, torch.float32)._blocks is None
    with common.loading_a_drafter():
        assert common.Linear(W, torch.float32)._blocks is not None
    assert common.Linear(W, torch.float32)._blocks is None  # only inside
    target, drafter = saved("llama", str(tmp_path)), saved("mamba2", str(tmp_path))
    s = ChatSession.load(target=str(target), drafter=str(drafter), dtype="bf16")
    lins = _linears(s.drafter.model)
    assert lins and all(v.native_weight() is not None for v in lins), lins
    assert not any(v.native_weight() is not None for v in _linears(s.target.model))  # the target: its own choice
    monkeypatch.setenv("SPECCHAT_NATIVE_LINEAR", "0")
    with common.loading_a_drafter():
        assert common.Linear(W, torch.float32)._blocks is None


# ---------------------------------------------------------------------------------------------
# glue_bf16.c: the operations between a bf16 llama pass's products (engine/models/llama._glue_rows)
# ---------------------------------------------------------------------------------------------
def _p(t):
    return t.data_ptr()


@needs_native
@pytest.mark.parametrize("D", [576, 64, 37])
def test_glue_add_rmsnorm_adds_as_torch_and_normalises_within_an_ulp(D):
    from engine.models.common import rms_norm

    g = torch.Generator().manual_seed(0)
    T = 5
    x = (3 * torch.randn(T, D, generator=g)).to(torch.bfloat16)
    a = torch.randn(T, D, generator=g).to(torch.bfloat16)
    w = torch.randn(D, generator=g).to(torch.bfloat16)
    out = torch.zeros(T, D, dtype=torch.bfloat16)
    x1 = x.clone()
    assert native.lib().bf16_add_rmsnorm(_p(x1), D, _p(a), D, T, D, _p(w), 1e-5, _p(out), D) == 0
    assert torch.equal(x1, x + a)  # the residual add: torch's bits
    ref = rms_norm(x + a, w, 1e-5)
    assert (out.float() - ref.float()).abs().max() <= (ref.float().abs() * 2 ** -7).max()  # a bf16 ulp at most
    assert (out != ref).float().mean() < 0.05
    # no residual: x unchanged; each row on its own (a row's bits do not depend on the others)
    one = torch.zeros(1, D, dtype=torch.bfloat16)
    x2 = x.clone()
    assert native.lib().bf16_add_rmsnorm(_p(x2), D, None, 0, T, D, _p(w), 1e-5, _p(out), D) == 0
    assert torch.equal(x2, x)
    for t in range(T):
        native.lib().bf16_add_rmsnorm(_p(x2[t]), D, None, 0, 1, D, _p(w), 1e-5, _p(one), D)
        assert torch.equal(one[0], out[t])


@needs_native
def test_glue_silu_mul_is_torchs_within_an_ulp_and_handles_extremes():
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(1)
    T, Fi = 3, 1536
    gu = (4 * torch.randn(T, 2 * Fi, generator=g)).to(torch.bfloat16)
    gu[0, :6] = torch.tensor([-200.0, -90.0, -1e-3, 0.0, 90.0, 200.0])
    out = torch.zeros(T, Fi, dtype=torch.bfloat16)
    assert native.lib().bf16_silu_mul(_p(gu), 2 * Fi, T, Fi, _p(out), Fi) == 0
    gate, up = gu.chunk(2, dim=-1)
    ref = F.silu(gate) * up
    assert torch.isfinite(out).all()
    assert (out.float() - ref.float()).abs().max() <= (ref.float().abs() * 2 ** -7).max() + 1e-30
    assert (out != ref).float().mean() < 0.02


@needs_native
@pytest.mark.parametrize("R", [64, 32])
def test_glue_rope_is_torchs_exactly_and_writes_the_kv_rows(R):
    from engine.models.common import Rope

    g = torch.Generator().manual_seed(2)
    T, H, K, E, P, start = 4, 9, 3, 64, 50, 17
    rope = Rope(R, {"rope_theta": 10000.0}, 128, torch.bfloat16)
    pos = torch.tensor([17, 18, 18, 19])
    cos, sin = rope.cos[pos].contiguous(), rope.sin[pos].contiguous()
    qkv = torch.randn(T, (H + 2 * K) * E, generator=g).to(torch.bfloat16)
    kc = torch.zeros(K, P, E, dtype=torch.bfloat16)
    vc = torch.zeros(K, P, E, dtype=torch.bfloat16)
    heads = qkv.view(T, H + 2 * K, E).transpose(0, 1)
    ref_qk = rope.rotate(heads[:H + K], cos, sin)
    ref_v = heads[H + K:].clone()
    got = qkv.clone()
    assert native.lib().bf16_rope_kv(_p(got), got.stride(0), T, H, K, E, R, _p(cos), _p(sin), R,
                                     _p(kc), _p(vc), P, start) == 0
    gh = got.view(T, H + 2 * K, E).transpose(0, 1)
    assert torch.equal(gh[:H + K], ref_qk)  # bit for bit: every product and sum rounded as torch's
    assert torch.equal(kc[:, start:start + T], ref_qk[H:]) and torch.equal(vc[:, start:start + T], ref_v)
    assert not kc[:, :start].any() and not kc[:, start + T:].any()


@needs_native
@pytest.mark.parametrize("kind", ["llama", "llama_hd64", "llama3_rope", "mistral"])
def test_glue_pass_is_close_to_the_torch_pass_and_its_rows_agree(kind, tmp_path, monkeypatch):
    """A bf16 llama pass through glue_bf16.c: close to the torch pass (the norm's and SiLU's last
    bits may differ), and a chain's verify rows equal one-token steps bit for bit."""
    from engine.loading import load
    from engine.models import llama

    from .tiny import saved

    path = str(saved(kind, str(tmp_path)))
    monkeypatch.setenv("SPECCHAT_NATIVE_BF16", "0")  # the torch bf16 pass (not the bf16 C pass)
    monkeypatch.setattr(llama, "GLUE_BF16", False)
    ref = load(path, dtype="bf16").model
    assert ref._glue() is None
    monkeypatch.setattr(llama, "GLUE_BF16", True)
    m = load(path, dtype="bf16").model
    assert m._glue() is not None
    ids = list(range(3, 40))
    a, b = m.full_logits(ids).float(), ref.full_logits(ids).float()
    assert (a - b).abs().max() <= 0.05 * b.abs().max() + 0.05
    m.allocate()
    m.prefill(ids[:20])
    chain = m.verify(ids[20:28], list(range(-1, 7))).clone()
    for i in range(8):
        step = m.verify([ids[20 + i]], [-1])
        assert torch.equal(step[0], chain[i]), i
        m.commit([0])


@needs_native
@pytest.mark.parametrize("pad, native_attn", [(2, True), (4, True), (7, True), (4, False)])
def test_glue_rows_do_not_depend_on_the_padding_or_the_pass(pad, native_attn, tmp_path, monkeypatch):
    """Whatever the products' padding (the rows of a 1-3 row pass beyond T are zeros, never read)
    and with the torch attention in place of the C kernel: a prefill in chunks then 1-token steps,
    one whole pass, and a tree verify with masked siblings give the same bits for the same rows."""
    from engine.loading import load

    from .tiny import saved

    monkeypatch.setenv("SPECCHAT_NATIVE_BF16", "0")  # the torch bf16 pass (not the bf16 C pass)
    m = load(str(saved("llama_hd64", str(tmp_path))), dtype="bf16").model
    assert m._glue() is not None
    monkeypatch.setattr(common, "_PAD_ROWS", {torch.bfloat16: pad})
    monkeypatch.setattr(common, "NATIVE_ATTN", native_attn)
    ids = [(7 * i + 3) % 90 + 1 for i in range(40)]
    whole = m.full_logits(ids)
    m.allocate()
    m.prefill(ids[:13], chunk=5)
    for i in range(13, 40):
        step = m.verify([ids[i]], [-1])
        assert torch.equal(step[0], whole[i]), i
        m.commit([0])
    m.rollback(30)  # a tree after ids[:30]: ids[30] with two children, the second one ids[31]
    tree = m.verify([ids[30], 5, ids[31], ids[32]], [-1, 0, 0, 2])
    assert torch.equal(tree[0], whole[30]) and torch.equal(tree[2], whole[31]) and torch.equal(tree[3], whole[32])


def test_a_zero_row_product_stays_empty(monkeypatch):
    if not common.packs(torch.bfloat16):
        pytest.skip("oneDNN does not pack bf16 here")
    lin = common.Linear(torch.randn(32, 16), torch.bfloat16)
    monkeypatch.setattr(common, "_PAD_ROWS", {torch.bfloat16: 4})
    assert lin(torch.zeros(0, 16, dtype=torch.bfloat16)).shape == (0, 32)


@needs_native
def test_glue_is_off_where_it_does_not_apply(tmp_path, monkeypatch):
    from engine.loading import load

    from .tiny import saved

    monkeypatch.setenv("SPECCHAT_NATIVE_BF16", "0")  # the torch bf16 pass (not the bf16 C pass)
    assert load(str(saved("qwen2", str(tmp_path))), dtype="bf16").model._glue() is None  # qkv bias
    assert load(str(saved("llama", str(tmp_path)))).model._glue() is None  # fp32
    monkeypatch.setenv("SPECCHAT_NATIVE_GLUE", "0")
    assert load(str(saved("llama", str(tmp_path))), dtype="bf16").model._glue() is None


@needs_native
def test_greedy_strategies_equal_plain_greedy_through_the_bf16_glue(tmp_path, monkeypatch):
    from engine.loading import load
    from engine.strategy import preset

    from .tiny import saved

    monkeypatch.setenv("SPECCHAT_NATIVE_BF16", "0")  # the torch bf16 pass (not the bf16 C pass)
    target = load(str(saved("llama", str(tmp_path))), dtype="bf16").model
    assert target._glue() is not None
    drafter = load(str(saved("draft", str(tmp_path)))).model
    _greedy_strategies_equal_ar(target, drafter, [preset("sd", draft_len=4), preset("tree", tree=(3, 2, 2, 1, 1)), preset("pld"),
                                                  preset("hybrid")])


@pytest.mark.parametrize("march", ["x86-64-v3", "x86-64", "native -mno-avx512bf16 -mno-avx512vnni"])
def test_kernels_build_for_cpus_without_this_ones_extensions(march, tmp_path):
    """The kernels are built with -march=native on the machine that runs them; every source must
    also build where AVX-512 BF16 / VNNI (or AVX2) are missing, falling back to its portable paths
    (a vector-only table referenced outside its #ifdef once broke every kernel on such CPUs)."""
    import platform
    import shutil
    import subprocess
    from pathlib import Path

    cc = os.environ.get("SPECCHAT_CC", "cc")
    if shutil.which(cc) is None or platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("needs an x86-64 C compiler")
    src = Path(native.__file__).parent
    flags = ["-O1", f"-march={march.split()[0]}", *march.split()[1:], "-shared", "-fPIC", "-std=c11", "-fopenmp"]
    r = subprocess.run([cc, *flags, "-o", str(tmp_path / "k.so"), *[str(src / s) for s in native.SOURCES], "-lm"],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
