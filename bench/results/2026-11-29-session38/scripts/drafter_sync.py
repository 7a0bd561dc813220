import sys, time, torch, json
sys.path.insert(0, '.')
from engine.session import ChatSession
from engine.models.common import rms_norm
sess = ChatSession.load(drafter="assets/mamba-drafter-smollm2", dtype="bf16", strategy="ar")
dec = sess.decoder
d = dec.drafters["model"]
m = d.model
print(m.lm_head_t, getattr(m.lm_head_t, "shape", None))
P = json.load(open("assets/prompts/bench.json")); P = P if isinstance(P, list) else P["prompts"]
ids = sess.encode_chat([{"role": "user", "content": P[0].get("prompt") or P[0].get("text")}])
d.reset(); d._sync(ids)
def tm(f, n=50):
    ts = []
    for _ in range(n):
        t = time.perf_counter(); f(); ts.append(time.perf_counter() - t)
    ts.sort(); return round(ts[n // 2] * 1000, 3)
x = torch.randn(1, m.cfg.hidden_size)
print("head", tm(lambda: m.logits(x)))
print("norm+head", tm(lambda: m.logits(rms_norm(x, m.norm_f, m.cfg.norm_eps))))
lib = m._native_step(m.cache.conv[:, None], m.cache.ssm[:, None])
for T in ():
    xs = m.embed[torch.tensor(ids[:T])].float().contiguous()
    conv, ssm = m.cache.conv[:, None].clone(), m.cache.ssm[:, None].clone()
    print("c_layers", T, tm(lambda: m._c_layers(lib, xs.clone(), 1, T, conv, ssm)))
L = len(d.seen)
def catch(T):
    d.reset(); d._sync(ids)
    h = ids + [ids[5]] * T
    t = time.perf_counter(); d._sync(h); return time.perf_counter() - t
for T in (1, 2, 3):
    ts = sorted(catch(T) for _ in range(15)); print("sync", T, round(ts[7] * 1000, 3))
import cProfile, pstats
d.reset(); d._sync(ids)
hs = [ids + [ids[5]] * (i + 1) for i in range(300)]
pr = cProfile.Profile(); pr.enable()
for h in hs: d._sync(h)
pr.disable()
pstats.Stats(pr).sort_stats("tottime").print_stats(20)
