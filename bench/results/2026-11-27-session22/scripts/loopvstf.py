"""sd:5 loop acceptance vs teacher-forced prediction (same bf16 ar reply)."""
import sys, engine, torch
sys.path.insert(0, '/work/main')
from engine.bench import load_prompts
from engine.generate import run_generation
from engine.session import ChatSession
from engine.strategy import preset, from_spec
dtype = sys.argv[1]; drafter = sys.argv[2]
s = ChatSession.load(drafter=drafter, dtype=dtype)
dec, dr = s.decoder, s.decoder.drafters["model"]
print("target", dec.target.dtype, "drafter", type(dr.model).__name__)
tot = dict(steps=0, acc=0, pred=0, mism=0, tfhit=0, ntok=0)
for p in load_prompts(None):
    ids = s.encode_chat([{"role": "user", "content": p["text"]}])
    dec.reset()
    evs, _ = run_generation(dec, ids, preset("ar"), 128)
    reply = [t for e in evs for t in e.emitted]
    with torch.inference_mode():
        m = dr.model.with_own_cache(); m.allocate(len(ids) + len(reply) + 8)
        lg = m.full_logits(ids + reply).float()[len(ids) - 1: len(ids) + len(reply) - 1]
    arg = lg.argmax(-1)
    pred = dr.draft_vocab[arg] if dr.draft_vocab is not None else arg
    hit = (pred == torch.tensor(reply)).tolist()
    dec.reset()
    evs2, _ = run_generation(dec, ids, from_spec("sd:5"), 128)
    reply2 = [t for e in evs2 for t in e.emitted]
    assert reply2 == reply[:len(reply2)], p["name"]
    pos = 0; mism = 0; acc = 0; pr = 0
    for e in evs2:
        # predicted accepted run from teacher forcing at reply position pos
        run = 0
        while run < min(e.drafted, len(hit) - pos) and hit[pos + run]:
            run += 1
        if e.drafted:
            pr += run; acc += e.accepted; mism += run != e.accepted
        pos += len(e.emitted)
    n = sum(1 for e in evs2 if e.drafted)
    print(f"{p['name']:<10} tf top1 {sum(hit)/len(hit):.3f} steps {len(evs2)} loop acc {acc} predicted {pr} mismatched steps {mism}/{n} tok/step {len(reply2)/len(evs2):.2f}")
    tot['steps'] += len(evs2); tot['acc'] += acc; tot['pred'] += pr; tot['mism'] += mism; tot['tfhit'] += sum(hit); tot['ntok'] += len(reply2)
print(tot, "tok/step", tot['ntok']/tot['steps'], "tf top1", tot['tfhit']/tot['ntok'])
