import engine, torch, time
from engine.models.common import attn_plan, _native_attention
from engine import native
K, G, E, P = 3, 3, 64, 512
kc = torch.randn(K, P, E).bfloat16(); vc = torch.randn(K, P, E).bfloat16()
for T in (1, 2, 4, 8, 16):
    q = torch.randn(K * G, T, E).bfloat16()
    mask = torch.ones(T, 300 + T, dtype=torch.bool).tril(300)
    plan = attn_plan(mask if T > 1 else None, 300 + T, T, G)
    f = lambda: _native_attention(plan.native, q, kc, vc, plan, 0.125)
    f(); t0 = time.perf_counter()
    for _ in range(300): f()
    print(T, f"{(time.perf_counter() - t0) / 300 * 1e6:.1f} us per layer")
