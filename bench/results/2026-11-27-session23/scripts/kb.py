import time, torch, os, sys
from engine import native
lib = native.lib(); print(native.status(), native.bf16_path())
def pack(w):  # (N,K) bf16 -> (nb, K/2, 16, 2)
    N,K = w.shape; nb=-(-N//16)
    wp = torch.zeros(nb*16, K, dtype=torch.bfloat16); wp[:N]=w
    return wp.view(nb,16,K//2,2).permute(0,2,1,3).contiguous()
def run(x, rec, N, nt=2):
    R,K = x.shape; y=torch.empty(R,N)
    rc = lib.linear_rows_bf16(x.data_ptr(), K, R, K, rec.data_ptr(), N, None, y.data_ptr(), nt); assert rc==0
    return y
g=torch.Generator().manual_seed(0)
K,N=576,1536
W=(torch.randn(N,K,generator=g)*0.05).bfloat16()
rec=pack(W)
x=torch.randn(8,K,generator=g)
y=run(x,rec,N)
ref=(x.bfloat16().float()@W.float().t())
print("max err vs fp32 ref", (y-ref).abs().max().item(), ref.abs().max().item())
for r in range(1,9):
    assert torch.equal(run(x[:r],rec,N), y[:r]), r
print("rows consistent")
# big: all SmolLM2 weights ~ 30 layers
Ws=[]
for i in range(30):
    for (n,k) in ((960,576),(576,576),(3072,576),(576,1536)):
        Ws.append((pack((torch.randn(n,k,generator=g)*0.05).bfloat16()),n,k))
Ws.append((pack((torch.randn(49152,576,generator=g)*0.05).bfloat16()),49152,576))
tot=sum(r.numel()*2 for r,_,_ in Ws); print("MB", tot/1e6)
for R in (1,2,4,8,16):
    xs={k:torch.randn(R,k) for k in (576,1536)}
    best=1e9
    for rep in range(5):
        t0=time.perf_counter()
        for rec_,n,k in Ws: run(xs[k],rec_,n)
        best=min(best,time.perf_counter()-t0)
    print(R, "rows %.2f ms  %.1f GB/s"%(best*1e3, tot/best/1e9))
