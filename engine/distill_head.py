"""`specchat distill head`: train a feature head (engine/feature_head.py, EAGLE-style) for a target.

1. Features: the target (bf16, the engine's own pass) reads each `distill data` reply whole; every
   position's final-norm hidden row and the target's greedy next token there are written to
   OUT/features/<data dir>/shardNNNN.safetensors, 500 replies a shard (a rerun skips finished
   shards; a larger ``--replies`` adds to them).
2. Training: the head learns, at every reply position t, the target's next hidden row f_{t+1} (smooth
   L1) and its greedy token there (cross-entropy over the draft vocabulary: the target's commonest
   greedy tokens in the data) from (token t+1, f_t) with noise on f (EAGLE §4); ``--unroll U`` runs
   U passes, each deeper one fed the previous one's predicted features, as a draft's deeper steps
   are (training-time test, HASS-style: a depth-u row reads the true rows before its chain, the chain's earlier
   nodes and itself, as drafting does). Time-boxed (``--minutes``); checkpoints to OUT every ``--save-every`` steps, and
   ``--init OUT`` resumes.
3. Evaluation: a greedy chain of 5 drafted from every step of each held-out reply, exactly as the
   drafter does (its own features fed back), against the target's greedy tokens: tokens a step.
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import random
import sys
import time
from pathlib import Path

SHARD = 500


def add_parser(dsub) -> None:
    h = dsub.add_parser("head", help="a feature head (a draft head over the target's own hidden rows, EAGLE-style) "
                                     "trained on `distill data` replies")
    h.add_argument("--data", required=True, nargs="+", metavar="DIR", help="`distill data` directories")
    h.add_argument("--out", required=True, metavar="DIR", help="the head's directory (`--drafter DIR` reads it)")
    h.add_argument("--target", default=None, metavar="REF")
    h.add_argument("--models", default=None, metavar="FILE")
    h.add_argument("--replies", type=int, default=4000, help="replies read from each directory (its first N)")
    h.add_argument("--minutes", type=float, default=30.0, help="training time")
    h.add_argument("--vocab", type=int, default=8192, help="draft vocabulary: the target's commonest greedy tokens")
    h.add_argument("--inter", type=int, default=1536, help="the layer's MLP width")
    h.add_argument("--lr", type=float, default=1e-3)
    h.add_argument("--batch-tokens", type=int, default=8192)
    h.add_argument("--unroll", type=int, default=3, help="draft depths trained a step (each deeper one fed the "
                   "previous one's predicted features, reading what drafting reads)")
    h.add_argument("--noise", type=float, default=0.1, help="Gaussian noise on the input features (x their RMS)")
    h.add_argument("--save-every", type=int, default=200)
    h.add_argument("--init", default=None, metavar="DIR", help="go on from this head")
    h.add_argument("--eval-data", default=None, nargs="+", metavar="DIR",
                   help="replies to evaluate the chain on (e.g. replies to the bench prompts); default: held-out replies")
    h.add_argument("--threads", type=int, default=None)
    h.add_argument("--device", default="cpu", help="cpu | cuda | auto: where the target reads the replies and the head "
                   "trains (a lent GPU: the same command, a bigger --replies and --minutes)")
    h.add_argument("--max-len", type=int, default=512, help="tokens of a reply (prompt included) read")


def _records(d):
    found = False
    for name in ("responses.jsonl.xz", "responses.jsonl"):
        p = Path(d) / name
        if p.exists():
            found = True
            op = lzma.open if name.endswith(".xz") else open
            with op(p, "rt") as f:
                for line in f:
                    try:
                        r = json.loads(line)
                        yield [int(t) for t in r["prompt_ids"]], [int(t) for t in r["response_ids"]]
                    except (ValueError, KeyError, TypeError):
                        continue  # a line cut by a kill
            break
    if not found:
        from .errors import SpecchatError

        raise SpecchatError(f"{d}: not a `distill data` directory (no responses.jsonl)")


def feature_dir(out: Path, d) -> Path:
    """Where the features of data directory ``d`` go under ``out``."""
    name = "-".join(Path(d).resolve().parts[-2:]).replace(" ", "_")
    return out / name


def extract(model, dirs, out: Path, limit: int, max_len: int, log=print) -> list[Path]:
    """Features of the first ``limit`` replies of each of ``dirs``, a directory under ``out`` each
    (shards of SHARD replies: a rerun skips finished ones, a larger ``limit`` adds to them)."""
    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from .errors import SpecchatError

    made = []
    model.allocate(max_len + 8)
    for d in dirs:
        fd = feature_dir(out, d)
        fd.mkdir(parents=True, exist_ok=True)
        meta = {"data": str(Path(d).resolve()), "max_len": max_len}
        mp = fd / "meta.json"
        if mp.exists() and json.loads(mp.read_text()) != meta:
            raise SpecchatError(f"{fd} holds features of other replies ({mp}); remove it or use another --out")
        mp.write_text(json.dumps(meta) + "\n")
        seqs = []
        for p, r in _records(d):
            seqs.append(((p + r)[:max_len], len(p)))
            if len(seqs) >= limit:
                break
        t0, done = time.perf_counter(), 0
        for s0 in range(0, len(seqs), SHARD):
            part = seqs[s0:s0 + SHARD]
            path = fd / f"shard{s0 // SHARD:04d}.safetensors"
            if path.exists():
                with safe_open(str(path), "pt") as f:
                    if f.get_slice("lens").get_shape()[0] >= len(part):
                        continue  # (a shard cut short by an earlier, smaller limit is redone)
            ids, feats, labels, lens, plens = [], [], [], [], []
            for seq, plen in part:
                model.cache.reset()
                with model.logging_hidden() as hidden:
                    model.verify(seq, list(range(-1, len(seq) - 1)))
                model.cache.reset()
                h = hidden[0]
                ids.append(torch.tensor(seq, dtype=torch.int32))
                feats.append(h.to(torch.bfloat16).cpu())
                labels.append(model.logits(h).argmax(-1).to(torch.int32).cpu())
                lens.append(len(seq))
                plens.append(plen)
                done += len(seq)
            tmp = path.with_suffix(".tmp")
            save_file({"ids": torch.cat(ids), "feat": torch.cat(feats).contiguous(), "label": torch.cat(labels),
                       "lens": torch.tensor(lens, dtype=torch.int32), "plens": torch.tensor(plens, dtype=torch.int32)}, str(tmp))
            tmp.rename(path)
            log(f"features {fd.name}/{path.name}: {min(s0 + SHARD, len(seqs))}/{len(seqs)} replies, "
                f"{done / (time.perf_counter() - t0):.0f} tokens/s")
        made.append(fd)
    return made


def load_features(dirs: list[Path], limit: int) -> list[dict]:
    """The first ``limit`` replies' features of each directory."""
    seqs = []
    for fdir in dirs:
        seqs.extend(_load_dir(fdir)[:limit])
    return seqs


def _load_dir(fdir: Path) -> list[dict]:
    from safetensors.torch import load_file

    seqs = []
    for p in sorted(fdir.glob("shard*.safetensors")):
        d = load_file(str(p))
        o = 0
        for n, pl in zip(d["lens"].tolist(), d["plens"].tolist()):
            seqs.append({"ids": d["ids"][o:o + n].long(), "plen": pl, "feat": d["feat"][o:o + n],
                         "label": d["label"][o:o + n].long()})
            o += n
    return seqs


def simulate(head, seqs, k: int = 5) -> tuple[float, list[float]]:
    """Tokens a step of a greedy chain of ``k`` drafted from every step of each reply (the head's own
    features fed back, its keys/values cached as the drafter's are), against the target's tokens."""
    import torch

    steps = toks = 0
    per_depth = [0] * k
    with torch.no_grad():
        for s in seqs:
            ids, plen, feat, lab = s["ids"], s["plen"], s["feat"].float(), s["label"]
            T = len(ids)
            x = head.inputs(ids[1:][None], feat[:-1][None])
            _, (K, V) = head.layer(x, torch.arange(T - 1))
            t = plen - 1
            while t < T - 2:
                past = (K[:, :, :t], V[:, :, :t])
                inp, p, acc = x[:, t:t + 1], t, 0
                for d in range(k):
                    f, (k1, v1) = head.layer(inp, torch.tensor([p]), past=past)
                    tok = int(head.vocab_ids[head.logits(f[0, -1]).argmax()])
                    if p + 1 >= T or tok != int(lab[p + 1]):
                        break
                    acc += 1
                    per_depth[d] += 1
                    past = (torch.cat([past[0], k1], 2), torch.cat([past[1], v1], 2))
                    inp = head.inputs(torch.tensor([[tok]]), f[:, -1:])
                    p += 1
                steps += 1
                toks += acc + 1
                t += acc + 1
    return toks / max(steps, 1), [a / max(steps, 1) for a in per_depth]


def cmd_head(args: argparse.Namespace) -> int:
    import torch
    import torch.nn.functional as F

    from .errors import SpecchatError
    from .feature_head import FeatureHead, load_head
    from .loading import load
    from .registry import load_registry
    from .session import default_target_name

    if args.threads:
        torch.set_num_threads(args.threads)
    for name in ("replies", "vocab", "inter", "batch_tokens", "unroll", "save_every", "max_len"):
        if getattr(args, name) < 1:
            raise SpecchatError(f"--{name.replace('_', '-')} must be at least 1")
    if not (args.minutes >= 0 and args.lr > 0 and args.noise >= 0):  # (NaN fails too)
        raise SpecchatError("--minutes and --noise must be >= 0 and --lr > 0")
    out = Path(args.out)
    reg = load_registry(args.models)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    dev = torch.device(device)
    tgt = load(args.target or default_target_name(reg), dtype="bf16", registry=reg,
               device=None if dev.type == "cpu" else dev).model
    embed = getattr(tgt, "embed", None)
    from .models.base import CausalLM

    if type(tgt)._run is not CausalLM._run or not isinstance(embed, torch.Tensor):
        raise SpecchatError("a feature head needs a Transformer target (its hidden rows)")
    D = int(embed.shape[1])
    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    data = load_features(extract(tgt, args.data, out / "features", args.replies, args.max_len, log), args.replies)
    if args.eval_data:
        ev = load_features(extract(tgt, args.eval_data, out / "features", 10 ** 9, args.max_len, log), 10 ** 9)
        train = data
    else:
        ev, train = data[::20], [s for i, s in enumerate(data) if i % 20]
    with torch.inference_mode():
        lm = tgt.logits(torch.eye(D, dtype=tgt.compute_dtype)).t().float().contiguous()  # the head's rows (V, D)
    emb = embed.float().to(dev)
    lm = lm.to(dev)
    V = emb.shape[0]
    cnt = torch.zeros(V, dtype=torch.long)
    for s in train:
        lab = s["label"][s["plen"] - 1:]
        cnt.index_add_(0, lab, torch.ones(len(lab), dtype=torch.long))
    torch.manual_seed(0)
    random.seed(0)
    if args.init:
        m = load_head(Path(args.init)).to(dev).attach(emb, lm)
    else:
        vocab = cnt.argsort(descending=True)[:min(args.vocab, V)].sort().values
        m = FeatureHead(D, max(1, D // 64), 64, args.inter, vocab).to(dev).attach(emb, lm)
    remap = torch.full((V,), -100, dtype=torch.long)
    remap[m.vocab_ids.cpu()] = torch.arange(len(m.vocab_ids))
    cover = cnt[m.vocab_ids].sum().item() / max(cnt.sum().item(), 1)
    log(f"head {sum(p.numel() for p in m.parameters()) / 1e6:.2f}M params; {len(train)} replies "
        f"({sum(len(s['ids']) for s in train)} tokens) to train on, {len(ev)} to evaluate; draft vocabulary "
        f"{len(m.vocab_ids)} tokens covers {cover:.3f} of the target's greedy tokens")
    train.sort(key=lambda s: len(s["ids"]))
    batches, cur = [], []
    for s in train:
        if cur and (len(cur) + 1) * len(s["ids"]) > args.batch_tokens:
            batches.append(cur)
            cur = []
        cur.append(s)
    if cur:
        batches.append(cur)
    rms = float(torch.cat([s["feat"][:64].float() for s in train[:256]]).pow(2).mean().sqrt()) if train else 1.0
    opt = torch.optim.AdamW(m.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    budget = args.minutes * 60.0
    t0, step = time.perf_counter(), 0

    def save() -> None:
        m.save(out, meta={"target_hidden": D, "distill": {"data": [str(d) for d in args.data], "replies": len(train),
                                                           "steps": step, "minutes": round((time.perf_counter() - t0) / 60, 1)}})

    m.train()
    while batches and time.perf_counter() - t0 < budget:
        random.shuffle(batches)
        for b in batches:
            if time.perf_counter() - t0 >= budget:
                break
            L, B = max(len(s["ids"]) for s in b), len(b)
            ids = torch.zeros(B, L, dtype=torch.long)
            feat = torch.zeros(B, L, D)
            lab = torch.full((B, L), -100, dtype=torch.long)
            w = torch.zeros(B, L)
            for i, s in enumerate(b):
                n = len(s["ids"])
                ids[i, :n], feat[i, :n], lab[i, :n] = s["ids"], s["feat"].float(), remap[s["label"]]
                w[i, max(s["plen"] - 1, 0):n - 1] = 1.0
            ids, feat, lab, w = ids.to(dev), feat.to(dev), lab.to(dev), w.to(dev)
            frac = min((time.perf_counter() - t0) / max(budget, 1e-9), 1.0)
            lr = args.lr * min(1.0, (step + 1) / 100) * (0.1 + 0.45 * (1 + math.cos(math.pi * frac)))
            for g in opt.param_groups:
                g["lr"] = lr
            pos = torch.arange(L - 1, device=dev)
            wm = w[:, :-1]
            fin = feat[:, :-1] + args.noise * rms * torch.randn_like(feat[:, :-1])
            loss = 0.0
            keys, values = [], []
            with torch.autocast(dev.type, dtype=torch.bfloat16):
                for u in range(args.unroll):
                    x = m.inputs(ids[:, 1:], fin)
                    # pass 0: every row a depth-1 draft from true features; pass u: row p the depth-(u+1)
                    # node of the chain begun at p - u, reading what drafting would (layer_unrolled)
                    f, (k, v) = m.layer(x, pos) if u == 0 else m.layer_unrolled(x, pos, keys, values)
                    keys.append(k)
                    values.append(v)
                    wu = wm.clone()
                    wu[:, :u] = 0  # (rows with no chain before them)
                    lg = m.logits(f).float()
                    ce = F.cross_entropy(lg.reshape(-1, lg.shape[-1]), lab[:, 1:].reshape(-1), reduction="none").view(B, L - 1)
                    ce = (ce * wu * (lab[:, 1:] >= 0)).sum() / wu.sum().clamp(min=1)
                    reg_ = (F.smooth_l1_loss(f.float() / rms, feat[:, 1:] / rms, reduction="none").mean(-1) * wu).sum() / wu.sum().clamp(min=1)
                    loss = loss + ce + reg_
                    fin = torch.cat([feat[:, :1], f[:, :-1].detach().float()], 1)  # the next pass reads predictions
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            step += 1
            if step % 20 == 0:
                log(f"step {step} ({time.perf_counter() - t0:.0f} s): loss {float(loss.detach()):.3f}, lr {lr:.2e}")
            if step % args.save_every == 0:
                save()
    m.eval()
    save()
    m = m.cpu().attach(emb.cpu(), lm.cpu())
    tps, depth = simulate(m, ev)
    report = {"chain5_tokens_per_step": round(tps, 3), "accepted_by_depth": [round(x, 3) for x in depth],
              "eval": [str(d) for d in args.eval_data] if args.eval_data else "held-out replies", "steps": step}
    cfg = json.loads((out / "config.json").read_text())
    cfg["distill"]["eval"] = report
    (out / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    log(f"{step} steps; a greedy chain of 5 on {len(ev)} evaluation replies: {tps:.3f} tokens a step "
        f"(accepted at depth 1..5: {' '.join(f'{x:.3f}' for x in depth)})")
    print(json.dumps(report))
    return 0
