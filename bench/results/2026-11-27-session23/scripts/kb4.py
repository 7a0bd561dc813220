import time, torch, ctypes, sys
from engine import native
lib = native.lib()
lib.bf16_tune.argtypes=[ctypes.c_int]
from engine.models.quant import pack_bf16
g=torch.Generator().manual_seed(0)
Ws=[]
for i in range(30):
    for (n,k) in ((960,576),(576,576),(3072,576),(576,1536)):
        Ws.append((pack_bf16((torch.randn(n,k,generator=g)*0.05).bfloat16()),n,k))
Ws.append((pack_bf16((torch.randn(49152,576,generator=g)*0.05).bfloat16()),49152,576))
def run(x, rec, N, nt=2):
    R,K = x.shape; y=torch.empty(R,N)
    lib.linear_rows_bf16(x.data_ptr(), K, R, K, rec.data_ptr(), N, None, y.data_ptr(), nt)
modes=[int(a) for a in sys.argv[1:]]
res={}
for rnd in range(4):
  for m in modes:
    lib.bf16_tune(m)
    for R in (1,2,4,8,16):
        xs={k:torch.randn(R,k) for k in (576,1536)}
        best=1e9
        for rep in range(3):
            t0=time.perf_counter()
            for rec_,n,k in Ws: run(xs[k],rec_,n)
            best=min(best,time.perf_counter()-t0)
        res.setdefault((m,R),[]).append(best*1e3)
for m in modes:
    print(m, ' '.join('R%d %.2f'%(R,sorted(res[(m,R)])[1]) for R in (1,2,4,8,16)))
