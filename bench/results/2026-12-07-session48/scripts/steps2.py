"""Where a decode step's time goes: the target's verify (C pass, head), drafting, acceptance, commit,
per step over the 12 bench prompts x 128: `python steps2.py pld:auto bf16|auto`."""
import sys, time, collections
import pathlib
exec((pathlib.Path(__file__).parent / 'steps.py').read_text().split("run(enc[0], 16)")[0])
acc = collections.defaultdict(float); cnt = collections.Counter()
def wrap(obj, name, key):
    f = getattr(obj, name)
    def g(*a, **k):
        t = time.perf_counter(); r = f(*a, **k); acc[key] += time.perf_counter() - t; cnt[key] += 1; return r
    setattr(obj, name, g)
tg = dec.target
wrap(tg, "verify", "target.verify"); wrap(tg, "forward_rows", "forward_rows"); wrap(tg, "logits", "logits")
wrap(tg, "commit", "target.commit"); wrap(dec, "_verify", "_verify(accept)"); wrap(dec, "_verify_pass", "_verify_pass")
wrap(dec, "_draft", "_draft")
run(enc[0], 16); acc.clear(); cnt.clear()
steps = 0; T = 0
for ids in enc:
    evs, summ, t = run(ids, 128); steps += len([e for e in evs if e.drafted or e.verify_ms]); T += t
print(f"{spec}: {steps} steps, wall {T*1e3/steps:.3f} ms/step")
for k in acc: print(f"  {k:20s} {acc[k]*1e3/steps:.3f} ms/step  ({cnt[k]} calls)")
