"""One depth of a feature head's draft, idle: the layer (one C call, 1 row over 200 committed rows)
and the logits over its draft vocabulary, Q8_0 and fp32. Usage: python layer_cost.py HEAD_DIR"""
import sys, time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from engine.feature_head import as_llama, load_head  # noqa: E402

emb = torch.randn(49152, 576)
h = load_head(Path(sys.argv[1])).attach(emb, emb)
for q8 in (True, False):
    m = as_llama(h, 2312, q8=q8)
    c = m.cache
    x = torch.randn(200, 576)
    s, pos, mask = c.extend_plan(list(range(-1, 199)))
    m.forward_x(x, pos, s, mask)
    c.commit(range(200))

    def one():
        s, pos, mask = c.extend_plan([-1])
        m.forward_x(x[:1], pos, s, mask)
        c.clear_scratch()

    for _ in range(5):
        one()
    t = time.perf_counter()
    for _ in range(200):
        one()
    layer = (time.perf_counter() - t) / 200 * 1e6
    f = torch.randn(1, 576)
    t = time.perf_counter()
    for _ in range(200):
        m.logits(f)
    print(f"{'q8' if q8 else 'fp32'}: layer (1 row) {layer:.0f} us, logits over {h.vocab_size} tokens "
          f"{(time.perf_counter() - t) / 200 * 1e6:.0f} us")
