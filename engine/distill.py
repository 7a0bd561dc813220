"""`specchat distill`: sequence-level distillation data from a target (mamba-drafters §3, App. A.3:
drafters trained on the target's own responses).

    specchat distill data --target REF --out DIR [--n N] [--max-new-tokens N] [--threads K]

writes DIR/prompts.jsonl (the project's own prompt set, engine/distill_prompts.py) and appends one
line per finished prompt to DIR/responses.jsonl — {"id", "kind", "prompt_ids", "response_ids",
"text"} — so an interrupted run resumes where it stopped (finished ids are skipped). Replies are
the target's greedy output, produced with a lossless speculative strategy (pld), so they are
exactly what plain greedy decoding would give. ``--batch N`` (default 16) decodes N prompts at a
time through the family's batched forward (Llama pages: ``forward_batch``): on this CPU a 16-row
bf16 step costs ~1.3x a 1-row step (reference/cpu-performance.md), so it is ~10x faster; rows may
differ from batch-1 greedy at rare near-ties of the logits, which does not matter for training
data. Families without a batched forward fall back to batch 1.
"""

from __future__ import annotations

import argparse
import json
import lzma
import os
import random
import sys
import time
from pathlib import Path


def add_parser(sub) -> None:
    d = sub.add_parser("distill", help="distillation data (and, later, drafter training) from a target")
    dsub = d.add_subparsers(dest="distill_cmd", required=True)
    data = dsub.add_parser("data", help="sample the target's replies over the project's prompt set (resumable)")
    data.add_argument("--target", default=None, metavar="REF")
    data.add_argument("--models", default=None, metavar="FILE")
    data.add_argument("--out", required=True, metavar="DIR")
    data.add_argument("--n", type=int, default=3000, help="prompts in the set")
    data.add_argument("--seed", type=int, default=0, help="prompt-set seed")
    data.add_argument("--max-new-tokens", type=int, default=192)
    data.add_argument("--threads", type=int, default=None, help="torch threads (leave a core free for other work)")
    data.add_argument("--dtype", choices=["fp32", "bf16"], default=None)
    data.add_argument("--self-prompts", type=int, default=0, metavar="N",
                      help="also N prompts sampled from the target itself (T=1), then answered greedily")
    data.add_argument("--batch", type=int, default=16, help="prompts decoded together (1 = the lossless batch-1 path)")
    data.add_argument("--prompts", default=None, metavar="FILE",
                      help="answer these prompts instead of the generated set (a JSON list of {name, text}, "
                           "e.g. assets/prompts/bench.json: replies to the evaluation prompts for `train --eval-data`)")
    data.add_argument("--limit", type=int, default=None, help="stop after this many new replies (for tests)")
    data.add_argument("--device", default="cpu", help="cpu | cuda | auto: where the target decodes (a GPU: "
                      "the dequantised weights, --dtype bf16 unless given; use a large --batch)")
    data.add_argument("--exclude", default=None, nargs="+", metavar="DIR",
                      help="skip the prompts of other `distill data` directories (more data, not the same again; "
                      "their prompts.jsonl and self_prompts.jsonl, plain or .xz)")
    data.add_argument("--time-budget", type=float, default=0.0, metavar="S",
                      help="stop taking new replies after S seconds (0: no limit); a rerun resumes")
    ng = dsub.add_parser("ngram", help="an n-gram datastore of the target's replies, for pld:auto (engine/drafters/corpus.py)")
    ng.add_argument("--data", required=True, nargs="+", metavar="DIR", help="`distill data` directories (indexed together)")
    ng.add_argument("--out", required=True, metavar="FILE", help="the .npz to write")
    ng.add_argument("--target", default=None, metavar="REF", help="the target whose tokenizer the replies use")
    ng.add_argument("--models", default=None, metavar="FILE")
    ng.add_argument("--n-max", type=int, default=4, help="longest context indexed (tokens)")
    ng.add_argument("--min-count", type=int, default=2, help="contexts of 2+ tokens seen fewer times are dropped")
    ng.add_argument("--branches", type=int, default=3, help="next tokens kept per context (the draft trees branch on them)")
    from .distill_head import add_parser as add_head
    from .distill_scorer import add_parser as add_scorer
    from .distill_train import add_parser as add_train

    add_train(dsub)
    add_scorer(dsub)
    add_head(dsub)


# the numeric options each subcommand has, and the least each takes (argparse checks the type only)
_MINIMA = {"n": 1, "batch": 1, "threads": 1, "max_new_tokens": 1, "self_prompts": 0, "limit": 0, "time_budget": 0,
           "k": 1, "chunk": 1, "seq_len": 2, "steps": 0, "d_model": 1, "layers": 1, "d_state": 1, "head_dim": 1,
           "save_every": 1, "eval_every": 0, "negatives": 0, "vocab_min_count": 0, "kd": 0, "n_max": 1, "min_count": 1,
           "branches": 1, "lr": 0, "folds": 1}


def check_args(args: argparse.Namespace) -> None:
    """One line for an option no distill subcommand can work with, before any loading: counts and
    sizes below their least, a --device torch does not know or has not here, a shape Mamba-2 cannot
    take."""
    import torch

    from .errors import SpecchatError

    for name, least in _MINIMA.items():
        value = getattr(args, name, None)
        if value is not None and not value >= least:  # `not >=`: NaN fails too
            raise SpecchatError(f"--{name.replace('_', '-')} must be >= {least}, got {value}")
    if getattr(args, "holdout", None) is not None and not 0 <= args.holdout < 1:  # 0: one reply held out
        raise SpecchatError(f"--holdout must be at least 0 and below 1, got {args.holdout}")
    device = getattr(args, "device", None)
    if device is not None and device != "auto":
        try:
            kind = torch.device(device).type
        except (RuntimeError, ValueError):
            raise SpecchatError(f"--device {device}: not a device (cpu, cuda, cuda:N or auto)") from None
        if kind == "cuda" and not torch.cuda.is_available():
            raise SpecchatError(f"--device {device}: no CUDA device here (torch {torch.__version__}); use --device cpu")
        if kind not in ("cpu", "cuda"):
            raise SpecchatError(f"--device {device}: only cpu and cuda are supported")
    if args.distill_cmd == "train" and not getattr(args, "init", None) and (2 * args.d_model) % args.head_dim:
        raise SpecchatError(f"--d-model {args.d_model} x 2 (the Mamba-2 inner width) must be a multiple of --head-dim "
                            f"{args.head_dim}")


def cmd_distill(args: argparse.Namespace) -> int:
    check_args(args)
    if args.distill_cmd == "data":
        return cmd_data(args)
    if args.distill_cmd == "export":
        from .distill_train import cmd_export

        return cmd_export(args)
    if args.distill_cmd == "topk":
        from .distill_train import cmd_topk

        return cmd_topk(args)
    if args.distill_cmd == "ngram":
        return cmd_ngram(args)
    if args.distill_cmd == "train":
        from .distill_train import cmd_train

        return cmd_train(args)
    if args.distill_cmd == "head":
        from .distill_head import cmd_head

        return cmd_head(args)
    if args.distill_cmd == "scorer":
        from .distill_scorer import cmd_scorer

        return cmd_scorer(args)
    raise SystemExit(2)


def _drop_partial_tail(path: Path) -> None:
    """A kill mid-write leaves a last line without its newline: cut it so appends stay valid."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as f:
            f.truncate(data.rfind(b"\n") + 1)


PROMPT_FILES = ("prompts.jsonl", "prompts.jsonl.xz", "self_prompts.jsonl", "self_prompts.jsonl.xz")


def read_prompts(path: Path) -> list[dict]:
    """The prompt records of a prompts.jsonl / self_prompts.jsonl ({"id", "kind", "text"} a line); a
    damaged line is a one-line error naming the file and line (a last line cut by a kill is skipped)."""
    from .errors import SpecchatError

    try:
        if path.suffix == ".xz":  # a shipped set's prompts (assets/distill/*/prompts.jsonl.xz)
            with lzma.open(path, "rt", encoding="utf-8") as f:
                text = f.read()
        else:
            text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, EOFError, lzma.LZMAError) as e:
        raise SpecchatError(f"{path}: cannot read the prompts ({' '.join(str(e).split()) or type(e).__name__})") from None
    lines, out = text.splitlines(), []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
            if not isinstance(r, dict) or not isinstance(r.get("text"), str):
                raise TypeError
        except (ValueError, TypeError):
            if n == len(lines) and not text.endswith("\n"):
                break  # a line cut by a kill
            raise SpecchatError(f"{path}, line {n}: not a prompt record (a JSON object with a \"text\" string)") from None
        out.append(r)
    return out


def batched_greedy(model, prompts: list[list[int]], max_new: int, eos_ids, batch: int = 16,
                   temperature: float = 0.0, top_p: float = 1.0, seed: int = 0):
    """Greedy replies for many prompts, ``batch`` at a time: yields (prompt index, reply ids) as
    rows finish (the reply keeps its EOS token, as the batch-1 path does). Prompts are grouped by
    length (left padding), and finished rows leave the batch so it shrinks instead of idling.
    ``temperature`` > 0 samples instead (top-p, seeded): used to draw the target's own prompts."""
    import torch

    from .sampling import draw_rows

    dev = model.embed.device
    gen = torch.Generator(device=dev).manual_seed(seed)

    def pick(logits: torch.Tensor) -> torch.Tensor:
        if temperature <= 0:
            return logits.argmax(-1)
        return draw_rows(torch.softmax(logits.float() / temperature, dim=-1), top_p, gen)

    # by length within windows of 16 batches (little padding), the windows in the given order: a
    # run stopped by its time budget has answered a fair share of every kind of prompt
    win = 16 * batch
    order = [i for w in range(0, len(prompts), win) for i in sorted(range(w, min(w + win, len(prompts))), key=lambda i: len(prompts[i]))]
    eos = torch.tensor(sorted(eos_ids), dtype=torch.long, device=dev)
    n_layers, K, E = model.kv_dims
    for g in range(0, len(order), batch):
        idx = order[g:g + batch]
        lens = torch.tensor([len(prompts[i]) for i in idx])
        B, L = len(idx), int(lens.max())
        P = L + max_new
        tokens = torch.zeros(B, L, dtype=torch.long)
        key_ok = torch.zeros(B, P, dtype=torch.bool)
        for b, i in enumerate(idx):
            tokens[b, L - len(prompts[i]):] = torch.tensor(prompts[i])
            key_ok[b, L - len(prompts[i]):] = True
        pos = (torch.arange(L)[None, :] - (L - lens)[:, None]).clamp(min=0)
        k_buf = torch.zeros(n_layers, B, K, P, E, dtype=model.dtype, device=dev)
        v_buf = torch.zeros_like(k_buf)
        tokens, key_ok, pos, lens = tokens.to(dev), key_ok.to(dev), pos.to(dev), lens.to(dev)
        with torch.inference_mode():
            h = model.forward_batch(tokens, pos, k_buf, v_buf, 0, key_ok)
            nxt = pick(model.logits(h[:, -1]))
            pos = lens.clone()
            alive = list(idx)
            outs: list[list[int]] = [[] for _ in idx]
            for step in range(max_new):
                done = torch.isin(nxt, eos) | (step + 1 >= max_new)
                for b, t in enumerate(nxt.tolist()):
                    outs[b].append(t)
                if bool(done.any()):
                    for b in torch.nonzero(done).flatten().tolist():
                        yield alive[b], outs[b]
                    keep = torch.nonzero(~done).flatten()
                    if keep.numel() == 0:
                        break
                    kl = keep.tolist()
                    alive, outs = [alive[b] for b in kl], [outs[b] for b in kl]
                    k_buf, v_buf = k_buf[:, keep], v_buf[:, keep]
                    key_ok, pos, nxt = key_ok[keep], pos[keep], nxt[keep]
                h = model.forward_batch(nxt[:, None], pos[:, None], k_buf, v_buf, L + step, key_ok)
                nxt = pick(model.logits(h[:, 0]))
                pos = pos + 1


SELF_PROMPT_MAX_TOKENS = 48


def self_prompts(tok, target, path: Path, n: int, seed: int, batch: int, exclude: frozenset[str] = frozenset()) -> list[dict[str, str]]:
    """``n`` user prompts written by the target itself (sampled at T=1, top-p 0.95 after the chat
    template's user header, up to the end of the turn): far more varied than templates, so the
    drafter sees the target's replies to the kind of messages people send. Appended to ``path``
    in seeded batches (resumable); duplicates, near-empty ones and evaluation prompts are dropped."""
    from .distill_prompts import eval_texts
    from .session import render_chat

    _drop_partial_tail(path)
    have = read_prompts(path) if path.exists() else []
    marker = "\x00PROMPT\x00"
    text = render_chat(tok, [{"role": "user", "content": marker}], add_generation_prompt=False)
    head = tok.encode(text[: text.index(marker)], add_special_tokens=False)
    seen = {p["text"] for p in have} | eval_texts() | exclude
    rounds = 0
    while len(have) < n and rounds < 4 * (n // max(1, batch) + 1):
        rows = [head] * min(batch, 4 * (n - len(have)))
        added = []
        for _, ids in batched_greedy(target, rows, SELF_PROMPT_MAX_TOKENS, tok.eos_ids, batch, temperature=1.0, top_p=0.95,
                                     seed=seed * 100_003 + len(have) + rounds):
            if not ids or ids[-1] not in tok.eos_ids:
                continue  # ran out of room mid-sentence
            t = tok.decode([i for i in ids if i not in tok.eos_ids]).strip()
            if len(t.split()) < 4 or t in seen:
                continue
            seen.add(t)
            added.append({"id": f"s{len(have) + len(added):05d}", "kind": "self", "text": t})
            if len(have) + len(added) >= n:
                break
        with path.open("a", encoding="utf-8") as f:
            f.write("".join(json.dumps(p) + "\n" for p in added))
        have += added
        rounds += 1
        print(f"\rself prompts: {len(have)}/{n}", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    return have[:n]


def cmd_data(args: argparse.Namespace) -> int:
    import torch

    from .distill_prompts import make_prompts
    from .generate import run_generation
    from .session import ChatSession, chat_ids
    from .strategy import preset

    if args.threads:
        torch.set_num_threads(args.threads)
    from .distill_train import ensure_dir

    out = ensure_dir(Path(args.out), "--out")
    prompts_path, resp_path = out / "prompts.jsonl", out / "responses.jsonl"
    from .errors import SpecchatError

    if (out / "responses.jsonl.xz").exists() and not resp_path.exists():
        # its finished replies would go unseen and `distill train` would read only the new file
        raise SpecchatError(f"{out}: its replies are in responses.jsonl.xz (a shipped set); decompress it "
                            f"(xz -dk {out / 'responses.jsonl.xz'}) to add to it, or use another --out")
    record = read_data_record(out, args)

    if args.prompts:
        from .bench import MAX_PROMPTS_BYTES
        from .registry import read_small

        raw = read_small(Path(args.prompts), "prompts file", MAX_PROMPTS_BYTES, SpecchatError)  # bounded: not /dev/zero's all
        try:
            prompts = [{"id": p["name"], "kind": p["name"], "text": p["text"]} for p in json.loads(raw.decode("utf-8"))]
        except (ValueError, KeyError, TypeError) as e:
            raise SpecchatError(f"{args.prompts}: not a JSON list of {{name, text}} prompts ({e})") from None
    else:
        prompts = make_prompts(args.n, args.seed)
    exclude: frozenset[str] = frozenset()
    for d in args.exclude or ():
        files = [Path(d) / name for name in PROMPT_FILES if (Path(d) / name).exists()]
        if not files:
            raise SpecchatError(f"--exclude {d}: not a `distill data` directory (no prompts.jsonl or self_prompts.jsonl)")
        exclude = exclude | frozenset(p["text"] for f in files for p in read_prompts(f))
    if exclude:
        prompts = [p for p in prompts if p["text"] not in exclude]
    done = set()
    _drop_partial_tail(resp_path)
    if resp_path.exists():
        for line in resp_path.read_text().splitlines():
            try:
                done.add(json.loads(line)["id"])
            except (ValueError, KeyError, TypeError):
                pass  # a line cut by a kill (or not a reply record): its prompt is simply redone
    from .dtype_probe import slow_bf16_note

    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    on_cpu = torch.device(device).type == "cpu"
    if on_cpu:
        session = ChatSession.load(target=args.target, drafter="ngram", models_file=args.models, dtype=args.dtype)
        target, tok = session.decoder.target, session.tokenizer
        if note := slow_bf16_note(args.dtype, model=target):
            print(note, file=sys.stderr)
        if tok is None:
            raise SpecchatError(f"{args.target or 'the target'}: no tokenizer beside the model, and the prompts are text; "
                                "give a target with one")
    else:
        # a GPU: batched rows straight through the target, no decoder
        from .loading import load
        from .registry import load_registry
        from .session import default_target_name

        reg = load_registry(args.models)
        loaded = load(args.target or default_target_name(reg), dtype=args.dtype, registry=reg, device=device)
        session, target, tok = None, loaded.model, loaded.tokenizer
        if tok is None or args.batch <= 1 or not hasattr(target, "forward_batch"):
            raise SpecchatError(f"--device {device} decodes batched rows (--batch > 1) of a Transformer target with a tokenizer; "
                                f"{loaded.name} is not one, or --batch is 1")

    check_data_record(out, record, session.target.name if session is not None else loaded.name)
    if not prompts_path.exists() or prompts_path.read_text().count("\n") != len(prompts):
        prompts_path.write_text("".join(json.dumps(p) + "\n" for p in prompts))
    if args.self_prompts:
        prompts = prompts + self_prompts(tok, target, out / "self_prompts.jsonl", args.self_prompts, args.seed, max(1, args.batch), exclude)
    todo = [p for p in prompts if p["id"] not in done]
    random.Random(args.seed).shuffle(todo)  # every kind of prompt in every stretch of the run (see batched_greedy)
    if args.limit:
        todo = todo[: args.limit]
    strategy = preset("pld")
    encoded = [chat_ids(tok, [{"role": "user", "content": p["text"]}]) for p in todo]
    if args.batch > 1 and hasattr(target, "forward_batch"):
        replies = batched_greedy(target, encoded, args.max_new_tokens, tok.eos_ids, args.batch)
    else:
        def one_by_one():
            for i, ids in enumerate(encoded):
                session.decoder.reset()
                events, _ = run_generation(session.decoder, ids, strategy, args.max_new_tokens)
                yield i, [t for e in events for t in e.emitted]

        replies = one_by_one()
    t0, new_tokens, made = time.perf_counter(), 0, 0
    with resp_path.open("a", encoding="utf-8") as f:
        for i, resp in replies:
            p, ids = todo[i], encoded[i]
            f.write(json.dumps({"id": p["id"], "kind": p["kind"], "prompt_ids": ids, "response_ids": resp,
                                "text": tok.decode([t for t in resp if t not in tok.eos_ids])}) + "\n")
            f.flush()
            os.fsync(f.fileno())  # a kill loses at most the reply being generated
            new_tokens += len(resp)
            made += 1
            el = time.perf_counter() - t0
            left = (len(todo) - made) * el / made
            print(f"\r[{len(done) + made}/{len(prompts)}] {new_tokens / el:5.1f} tok/s, ETA {left / 3600:4.1f} h ",
                  end="", file=sys.stderr, flush=True)
            if args.time_budget > 0 and el >= args.time_budget:
                print(f"\ntime budget of {args.time_budget:g} s spent: {made} new replies; run again to resume", file=sys.stderr, end="")
                break
    print(file=sys.stderr)
    return 0


DATA_RECORD = "data.json"  # what a `distill data` directory's replies were made with


def read_data_record(out: Path, args: argparse.Namespace) -> dict:
    """This run's settings that decide what a reply is ({"seed", "max_new_tokens", "prompts"}), checked
    against those OUT/data.json recorded (a one-line error where they differ: a resume would mix
    replies of two settings in one file, or, with another --seed, skip new prompts whose ids were
    done under other texts). The target is checked once loaded (check_data_record)."""
    from .errors import SpecchatError

    want = {"seed": args.seed, "max_new_tokens": args.max_new_tokens,
            "prompts": str(Path(args.prompts).resolve()) if args.prompts else None}
    path = out / DATA_RECORD
    if not path.exists():
        return want
    try:
        have = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(have, dict):
            raise ValueError
    except (OSError, UnicodeDecodeError, ValueError):
        raise SpecchatError(f"{path}: damaged (the settings {out}'s replies were made with); fix or remove it") from None
    for key, value in want.items():
        if key == "seed" and want["prompts"] is not None:
            continue  # with --prompts the seed only orders them (and seeds --self-prompts)
        if key in have and have[key] != value:
            flag = {"prompts": "--prompts", "seed": "--seed", "max_new_tokens": "--max-new-tokens"}[key]
            raise SpecchatError(f"{out}: its replies were made with {flag} {have[key]}, this run has {value}; "
                                "give the same to resume, or use another --out")
    return dict(have, **want)


def check_data_record(out: Path, record: dict, target: str) -> None:
    """The loaded target is the one OUT's replies came from (a one-line error otherwise); then
    OUT/data.json records this run's settings."""
    from .errors import SpecchatError

    if record.get("target") not in (None, target):
        raise SpecchatError(f"{out}: its replies were made by target {record['target']!r}, this run's is {target!r}; "
                            "resume with that target, or use another --out")
    path, tmp = out / DATA_RECORD, out / f".{DATA_RECORD}.tmp"
    tmp.write_text(json.dumps(dict(record, target=target)) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def cmd_ngram(args: argparse.Namespace) -> int:
    """Index the replies of `distill data` directories (engine/drafters/corpus.py) with the target's
    tokenizer's probe, so the datastore is only ever used with that tokenizer."""
    from .distill_train import check_vocab, ensure_dir, load_sequences, responses_file
    from .drafters.corpus import PROBE_TEXT, CorpusIndex
    from .errors import SpecchatError
    from .loading import load
    from .registry import load_registry

    data = [Path(d) for d in args.data]
    for d in data:
        responses_file(d)  # a missing set fails before the target loads
    if not 1 <= args.n_max <= 16 or args.min_count < 1 or not 1 <= args.branches <= 16:
        raise SpecchatError("--n-max must be 1..16, --min-count >= 1 and --branches 1..16")
    out = Path(args.out)
    if out.suffix != ".npz":  # numpy adds it: say where the file really goes
        out = out.with_name(out.name + ".npz")
    if out.is_dir():
        raise SpecchatError(f"{out}: --out is a directory (it names the .npz file to write)")
    ensure_dir(out.parent, "--out's directory")  # created and writable before the target loads and the replies are indexed
    reg = load_registry(args.models)
    target = load(args.target or "smollm2-135m-instruct", registry=reg, need_tokenizer=True)
    seqs = [s for d in data for s in load_sequences(d)]
    check_vocab((ids for ids, _ in seqs), target.model.vocab_size, " ".join(map(str, data)))
    t0 = time.perf_counter()
    index = CorpusIndex.build(seqs, n_max=args.n_max, min_count=args.min_count, branches=args.branches,
                              meta={"target": target.name, "probe": list(target.tokenizer.encode(PROBE_TEXT)),
                                    "data": " ".join(map(str, data)), "replies": len(seqs), "reply_tokens": sum(len(s) - st for s, st in seqs)})
    tmp = out.with_name(f".{out.name}.tmp.npz")  # then renamed: a failed write leaves an older datastore whole
    try:
        index.save(tmp)
        os.replace(tmp, out)
    except BaseException as e:  # a full disk, or Ctrl-C mid-write: no half-written file left behind
        tmp.unlink(missing_ok=True)
        if isinstance(e, OSError):
            raise SpecchatError(f"{out}: cannot write the datastore ({e.strerror or e})") from None
        raise
    print(f"indexed {len(seqs)} replies ({index.meta['reply_tokens']} tokens): {len(index)} contexts of 1..{args.n_max} tokens "
          f"in {time.perf_counter() - t0:.1f} s -> {out}", file=sys.stderr)
    return 0
