# Session 27: transformers' Mamba-2 training step (d480 x 3, 8 x 512, bf16 autocast) with its own scan, a shift-add conv, and the lean scan (engine/mamba2_train.chunk_scan); checks gradients in fp32 first.  python lean_ab.py [small]
import sys, time, torch, torch.nn.functional as F
sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(__file__)))
import transformers.models.mamba2.modeling_mamba2 as mm
from transformers import Mamba2Config, Mamba2ForCausalLM
from lean import fast_conv
sys.path.insert(0, str(__import__('pathlib').Path(__file__).resolve().parents[4]))
from engine.mamba2_train import chunk_scan as lean_scan
torch.set_num_threads(2)
oc, os_ = mm.causal_conv1d_fn, mm.mamba2_chunk_scan
cfg = Mamba2Config(vocab_size=49152, hidden_size=480, num_hidden_layers=3, state_size=64, head_dim=64, num_heads=15, n_groups=1, expand=2, conv_kernel=4, chunk_size=128, tie_word_embeddings=True)
torch.manual_seed(0)
m = Mamba2ForCausalLM(cfg)
with torch.no_grad():
    for lay in m.backbone.layers: lay.mixer.dt_bias.add_(1.0)
B_, T = (8, 512) if len(sys.argv) < 2 else (2, 300)
x = torch.randint(0, 49152, (B_, T))
sub = torch.randint(0, 49152, (17758,))
y = torch.randint(0, 17758, (B_ * (T - 1),))
def step(amp=True):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        h = m.backbone(x).last_hidden_state[:, :-1].reshape(-1, 480)
        lg = (h @ m.get_input_embeddings().weight[sub].T).float()
    loss = F.cross_entropy(lg, y)
    m.zero_grad(set_to_none=True); loss.backward()
    return loss.item(), {k: p.grad.clone() for k, p in m.named_parameters() if p.grad is not None}
modes = {"orig": (oc, os_), "conv": (fast_conv, os_), "lean": (fast_conv, lean_scan)}
res = {}
for name, (c, s) in modes.items():
    mm.causal_conv1d_fn, mm.mamba2_chunk_scan = c, s
    res[name] = step(False)
for name in ("conv", "lean"):
    l, g = res[name]; l0, g0 = res["orig"]
    worst = max(((g[k] - g0[k]).norm() / (g0[k].norm() + 1e-30)).item() for k in g0)
    print(name, "loss", l0, l, "worst grad rel err", worst)
if len(sys.argv) < 2:
    for r in range(3):
        for name, (c, s) in modes.items():
            mm.causal_conv1d_fn, mm.mamba2_chunk_scan = c, s
            t = time.perf_counter(); step(); print(r, name, round(time.perf_counter() - t, 3), flush=True)
