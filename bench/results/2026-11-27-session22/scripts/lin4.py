import engine, torch, time
from engine.models.common import Linear
torch.manual_seed(0)
Ws = [Linear(torch.randn(o, i), torch.bfloat16) for _ in range(30) for (o, i) in [(960, 576), (576, 576), (3072, 576), (576, 1536)]]
head = Linear(torch.randn(49152, 576), torch.bfloat16)
def run(make):
    xs = {i: make(i) for i in (576, 1536)}
    best = 1e9
    for r in range(9):
        t = time.perf_counter()
        for W in Ws: torch.ops.mkldnn._linear_pointwise(xs[W.shape[0]], W._packed, None, "none", [], "")
        torch.ops.mkldnn._linear_pointwise(xs[576], head._packed, None, "none", [], "")
        best = min(best, time.perf_counter() - t)
    return best * 1000
for rep in range(2):
    print("expand2", f"{run(lambda i: torch.randn(1, i).bfloat16().expand(2, -1)):.2f}",
          "contig2", f"{run(lambda i: torch.randn(2, i).bfloat16()):.2f}",
          "expand4", f"{run(lambda i: torch.randn(1, i).bfloat16().expand(4, -1)):.2f}",
          "contig4", f"{run(lambda i: torch.randn(4, i).bfloat16()):.2f}",
          "contig3", f"{run(lambda i: torch.randn(3, i).bfloat16()):.2f}",
          "contig5", f"{run(lambda i: torch.randn(5, i).bfloat16()):.2f}",
          "contig6", f"{run(lambda i: torch.randn(6, i).bfloat16()):.2f}")
