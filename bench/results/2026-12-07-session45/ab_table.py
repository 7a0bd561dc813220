import json, glob, sys, statistics
from collections import defaultdict
res=defaultdict(lambda: defaultdict(list))
for f in sorted(glob.glob(sys.argv[1]+"/*.json")):
    side=f.split("/")[-1].split("-")[0]
    d=json.load(open(f))
    rows=[r for r in d["rows"] if r["engine"]=="specchat"]
    agg=defaultdict(lambda:[0,0.0,0])
    for r in rows:
        a=agg[r["strategy"]]; a[0]+=r["new_tokens"]; a[1]+=r["new_tokens"]/r["tokens_per_s"]; a[2]+= (not r["identical_to_ar"])
    ar=agg["ar"][0]/agg["ar"][1]
    for s,a in agg.items():
        res[side][s].append((a[0]/a[1], a[0]/a[1]/ar, a[2]))
    print(f.split("/")[-1], "  ".join(f"{s}:{a[0]/a[1]:.1f}({a[0]/a[1]/ar:.2f}x){'!' if a[2] else ''}" for s,a in agg.items()))
for side,d in res.items():
    print(side, "median:", "  ".join(f"{s}: {statistics.median(x[0] for x in v):.1f} tok/s {statistics.median(x[1] for x in v):.2f}x (n={len(v)}, not identical {sum(x[2] for x in v)})" for s,v in d.items()))
