import sys, engine, torch, collections
sys.path.insert(0, '/work/main')
from engine.bench import load_prompts
from engine.generate import run_generation
from engine.session import ChatSession
from engine.strategy import preset
s = ChatSession.load(drafter=sys.argv[2], dtype=sys.argv[1])
dec, dr = s.decoder, s.decoder.drafters["model"]
ng = dec.drafters["ngram"]; corpus = ng.corpus
C = collections.Counter()
for p in load_prompts(None):
    ids = s.encode_chat([{"role": "user", "content": p["text"]}])
    dec.reset()
    evs, _ = run_generation(dec, ids, preset("ar"), 128)
    reply = [t for e in evs for t in e.emitted]
    with torch.inference_mode():
        m = dr.model.with_own_cache(); m.allocate(len(ids) + len(reply) + 8)
        lg = m.full_logits(ids + reply).float()[len(ids) - 1: len(ids) + len(reply) - 1]
    top = lg.topk(4, -1).indices
    if dr.draft_vocab is not None: top = dr.draft_vocab[top]
    seq = ids + reply; c = collections.Counter()
    for i, t in enumerate(reply):
        h = seq[:len(ids) + i]
        d1 = top[i, 0].item() == t; d4 = t in top[i].tolist()
        st = corpus.top(h[-corpus.n_max:], 3)
        s1 = bool(st) and st[0][0] == t; s3 = any(x == t for x, _ in st)
        cont = ng.continuations(h, 1, 1)
        cp = bool(cont) and cont[0][0] == t
        c['n'] += 1; c['d1'] += d1; c['d4'] += d4; c['s1'] += s1; c['s3'] += s3; c['cp'] += cp
        c['d1|s1|cp'] += d1 or s1 or cp; c['s1|cp'] += s1 or cp; c['all'] += d4 or s3 or cp
        c['cp_only'] += cp and not (d1 or s1)
    print(f"{p['name']:<10}", " ".join(f"{k} {v/c['n']:.2f}" for k, v in c.items() if k != 'n'), c['n'])
    C.update(c)
print("ALL       ", " ".join(f"{k} {v/C['n']:.3f}" for k, v in C.items() if k != 'n'), C['n'])
