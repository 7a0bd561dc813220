import time, torch, sys
from transformers import Mamba2ForCausalLM
torch.set_num_threads(2)
m = Mamba2ForCausalLM.from_pretrained("assets/mamba-drafter-smollm2", dtype=torch.float32)
m.train()
B, L = 8, 512
x = torch.randint(0, 16000, (B, L))
seen = torch.arange(17000)
opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
def step(amp):
    t0 = time.perf_counter()
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        h = m.backbone(x).last_hidden_state[:, :-1].reshape(-1, m.config.hidden_size)
        W = m.get_input_embeddings().weight
        logits = (h @ W[seen].T).float()
    loss = torch.nn.functional.cross_entropy(logits, x[:, 1:].reshape(-1))
    opt.zero_grad(); loss.backward(); opt.step()
    return time.perf_counter() - t0
for amp in (False, True, False, True):
    step(amp); print(amp, ["%.3f" % step(amp) for _ in range(2)])
