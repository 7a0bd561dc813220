import sys, time, re
buf = ""; t = {}
while True:
    c = sys.stdin.read(1)
    if not c: break
    if c in "\r\n":
        m = re.match(r"step (\d+)/", buf)
        if m: t[int(m.group(1))] = time.time()
        buf = ""
    else: buf += c
ks = sorted(t)
if len(ks) > 6:
    a, b = ks[5], ks[-1]
    print(f"steps {a}->{b}: {(t[b]-t[a])/(b-a):.3f} s/step")
