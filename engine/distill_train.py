"""`specchat distill train`: train a small Mamba-2 drafter on a target's replies (mamba-drafters §3,
App. A.3: external Mamba drafters trained on target-generated data).

Training runs transformers' Mamba2ForCausalLM (its differentiable torch path; our model pages
are inference-only) and saves an HF-format directory (config.json, model.safetensors,
tokenizer) that `--drafter` loads through our own Mamba-2 page. The tied embedding starts as the
target's embedding projected onto its top principal directions (PCA to ``d_model``), so the
drafter begins in the target's token geometry instead of at random.

Resumable: every ``--save-every`` steps (and on Ctrl-C) DIR/train_state.pt holds model,
optimiser, step and data order; a new run with the same DIR continues. Tensors only, loaded with
``torch.load(weights_only=True)``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Iterator


def add_parser(dsub) -> None:
    e = dsub.add_parser("export", help="copy a trained drafter into a shippable directory (weights cast, no optimiser state)")
    e.add_argument("--from", dest="src", required=True, metavar="DIR", help="a `distill train` output directory")
    e.add_argument("--to", dest="dst", required=True, metavar="DIR")
    e.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], default="bf16")
    e.add_argument("--shrink-vocab", nargs="+", default=None, metavar="DIR",
                   help="store embedding rows only for the draft vocabulary, the tokenizer's special tokens and "
                        "every token seen --row-min-count times in these `distill data` directories (prompts and "
                        "replies), plus one row shared by all others (their mean): a deeper drafter for the same "
                        "file size; the loader widens it back, exact for every stored token")
    e.add_argument("--row-min-count", type=int, default=2, metavar="N")
    e.add_argument("--head-top", type=int, default=0, metavar="N",
                   help="keep only the draft vocabulary's N tokens most frequent in the replies of --head-data (and "
                        "the end-of-sequence tokens): the output layer a draft step computes shrinks to them "
                        "(FR-Spec's frequency-ranked draft vocabulary; lossless, only what is proposed changes)")
    e.add_argument("--head-data", nargs="+", default=None, metavar="DIR",
                   help="the `distill data` directories whose replies --head-top counts")
    t = dsub.add_parser("train", help="train a Mamba-2 drafter on distillation data (resumable)")
    t.add_argument("--data", required=True, nargs="+", metavar="DIR",
                   help="`distill data` directories (responses.jsonl or .jsonl.xz); several are trained on together")
    t.add_argument("--out", required=True, metavar="DIR")
    t.add_argument("--target", default=None, metavar="REF", help="the target (embedding init, tokenizer)")
    t.add_argument("--tokenizer", default=None, metavar="DIR",
                   help="the target's tokenizer from a Hugging Face directory (tokenizer.json, e.g. a drafter's) instead of "
                        "loading the target: for a machine without the target's weights (a lent GPU); the embedding then "
                        "starts at random, or from --init")
    t.add_argument("--time-budget", type=float, default=0.0, metavar="S",
                   help="stop after S seconds of training and save (0: no limit); the learning-rate schedule ends at the "
                        "step the budget reaches, re-estimated every 20 steps from the recent rate (the last ~100 steps)")
    t.add_argument("--models", default=None, metavar="FILE")
    t.add_argument("--d-model", type=int, default=384)
    t.add_argument("--layers", type=int, default=4)
    t.add_argument("--d-state", type=int, default=64)
    t.add_argument("--head-dim", type=int, default=64)
    t.add_argument("--seq-len", type=int, default=512, help="tokens per packed training row")
    t.add_argument("--batch", type=int, default=8, help="rows per step")
    t.add_argument("--steps", type=int, default=1000)
    t.add_argument("--lr", type=float, default=2e-3)
    t.add_argument("--save-every", type=int, default=50)
    t.add_argument("--threads", type=int, default=None)
    t.add_argument("--device", default="auto", help="auto | cpu | cuda")
    t.add_argument("--byte-level", action="store_true",
                   help="train a byte-level drafter (256 bytes + specials) on the same replies, for the [vocab] bridges")
    t.add_argument("--eval-every", type=int, default=0, help="report held-out loss and top-1 agreement every N steps")
    t.add_argument("--negatives", type=int, default=1024,
                   help="train the softmax over the tokens seen in the data plus this many random unseen tokens per step "
                        "(0 = the full vocabulary); the replies use a few thousand of the target's tokens, so this cuts "
                        "the output layer's cost several-fold and still pushes unseen tokens down")
    t.add_argument("--holdout", type=float, default=0.05, help="fraction of replies held out for the loss report (0: one reply)")
    t.add_argument("--kd", type=int, default=0, metavar="K",
                   help="distil the target's top-K next-token distribution (from `distill topk --k K`) instead of "
                        "only its greedy token: soft targets carry far more signal per token and curb overfitting")
    t.add_argument("--init", default=None, metavar="DIR",
                   help="start from a trained drafter (a `distill train` or `distill export` directory; bf16 weights are "
                        "widened to fp32) instead of a fresh model: its config sets the architecture (--d-model, --layers, "
                        "--d-state and --head-dim are ignored). A saved train_state.pt in --out still takes precedence")
    t.add_argument("--grow-layers", type=int, default=0, metavar="N",
                   help="with --init: deepen the drafter to N layers, each added layer a copy of the one before it "
                        "with its output projection zeroed, so the grown drafter starts out computing exactly what "
                        "--init did and training adds depth (a small drafter's agreement is capacity-bound: it "
                        "matches its training replies barely better than unseen ones)")
    t.add_argument("--amp", choices=["auto", "bf16", "off"], default="auto",
                   help="run the forward pass under bf16 autocast (the weights, optimiser and loss stay fp32): auto "
                        "= bf16 on CUDA (with TF32 matmuls), off on a CPU (bf16 there is ~1.35x faster on AVX-512 BF16, "
                        "far slower without it)")
    t.add_argument("--vocab-min-count", type=int, default=0, metavar="N",
                   help="train the softmax over the reply tokens seen at least N times in the training replies (plus "
                        "--negatives sampled others), drop predictions of any other token from the loss, and save that "
                        "set as the drafter's draft vocabulary (0: every token in the data, the default)")
    t.add_argument("--eval-data", default=None, metavar="DIR",
                   help="another `distill data` directory (e.g. replies to the evaluation prompts): its top-1 "
                        "agreement is reported beside the held-out one")
    k = dsub.add_parser("topk", help="the target's top-K next-token probabilities over distillation data (resumable)")
    k.add_argument("--data", required=True, metavar="DIR", help="a `distill data` directory")
    k.add_argument("--target", default=None, metavar="REF")
    k.add_argument("--models", default=None, metavar="FILE")
    k.add_argument("--k", type=int, default=8)
    k.add_argument("--dtype", choices=["fp32", "bf16"], default=None)
    k.add_argument("--batch", type=int, default=8, help="replies per forward pass")
    k.add_argument("--threads", type=int, default=None)
    k.add_argument("--chunk", type=int, default=256, help="replies per part file (the unit of resumption)")


def responses_file(data_dir: Path) -> Path:
    """DIR/responses.jsonl, or DIR/responses.jsonl.xz (how assets/ ships the larger sets)."""
    from .errors import SpecchatError

    for name in ("responses.jsonl", "responses.jsonl.xz"):
        if (data_dir / name).exists():
            return data_dir / name
    raise SpecchatError(f"{data_dir}: no responses.jsonl (run `specchat distill data` first)")


def ensure_dir(path: Path, what: str) -> Path:
    """Create the output directory ``path`` (parents too) and check that files can be written in it,
    before any long work: a one-line error naming ``what`` (e.g. "--out", "--out's directory") otherwise."""
    import os
    import tempfile

    from .errors import SpecchatError

    if path.exists() and not path.is_dir():
        raise SpecchatError(f"{path}: {what} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise SpecchatError(f"{path}: cannot create {what} ({e.strerror or e})") from None
    try:
        fd, probe = tempfile.mkstemp(dir=path, prefix=".specchat-probe-")
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise SpecchatError(f"{path}: cannot write into {what} ({e.strerror or e})") from None
    return path


def load_sequences(data_dir: Path, with_ids: bool = False) -> list:
    """(prompt + reply ids, index where the reply starts) per finished reply, in file order;
    ``with_ids`` prepends the reply's id."""
    import lzma

    from .errors import SpecchatError

    path = responses_file(data_dir)
    try:
        text = lzma.open(path, "rt", encoding="utf-8").read() if path.suffix == ".xz" else path.read_text(encoding="utf-8")
    except (OSError, EOFError, lzma.LZMAError, UnicodeDecodeError) as e:
        raise SpecchatError(f"{path}: cannot read the replies ({' '.join(str(e).split()) or type(e).__name__})") from None
    seqs = []
    for n, line in enumerate(text.splitlines(), 1):
        try:
            r = json.loads(line)
        except json.JSONDecodeError:
            continue  # a line cut by a kill
        if not isinstance(r, dict) or not r.get("response_ids"):
            continue
        ids = r.get("prompt_ids"), r["response_ids"]
        if not all(isinstance(x, list) and all(type(t) is int and 0 <= t < 1 << 31 for t in x) for x in ids):
            raise SpecchatError(f"{path}, line {n}: prompt_ids and response_ids must be lists of token ids")
        row = (ids[0] + ids[1], len(ids[0]))
        seqs.append((r.get("id"), *row) if with_ids else row)
    return seqs


def check_vocab(token_lists, vocab: int, where: object) -> None:
    """Every token id of the replies read inside the target's vocabulary (a one-line error)."""
    from .errors import SpecchatError

    top = max((max(ids) for ids in token_lists if ids), default=-1)
    if top >= vocab:
        raise SpecchatError(f"{where}: token id {top} is outside the target's vocabulary ({vocab} tokens)")


def cmd_topk(args: argparse.Namespace) -> int:
    """The target's top-``k`` next-token probabilities at every reply position (the position
    whose hidden state predicts reply token i, i.e. sequence positions start-1 .. n-2), written as
    DIR/topk{k}/part-NNNNN.pt = {"ids": [reply ids], "lens": [positions per reply], "tok": int32
    (P, k), "p": fp16 (P, k), "data": digest of the replies}. One part per ``--chunk`` replies;
    finished parts are skipped, so an interrupted run resumes, but only with the target and
    settings DIR/topk{k}/topk.json recorded (read_topk_record, check_topk_record). Rows are
    right-padded and batched through the family's ``forward_batch`` (full prefill, no decoding)."""
    import torch

    from .errors import SpecchatError
    from .loading import load
    from .registry import load_registry

    if args.threads:
        torch.set_num_threads(args.threads)
    data_dir = Path(args.data)
    seqs = load_sequences(data_dir, with_ids=True)
    out = ensure_dir(data_dir / f"topk{args.k}", "the top-k directory")  # before the target loads
    record = read_topk_record(out, args)  # parts of another --chunk, or unrecorded ones: refused before the load
    from .dtype_probe import slow_bf16_note

    loaded = load(args.target or "smollm2-135m-instruct", dtype=args.dtype, registry=load_registry(args.models))
    target = loaded.model
    if not hasattr(target, "forward_batch"):
        raise SpecchatError(f"{type(target).__name__}: no batched forward; top-k distillation needs a Llama-family target")
    check_vocab((toks for _, toks, _ in seqs), target.vocab_size, data_dir)  # an id past it: an IndexError mid-run
    check_topk_record(out, record, {"target": loaded.name, "weights": weights_digest(loaded.path),
                                    "compute": loaded.compute, "k": args.k, "chunk": args.chunk})
    if note := slow_bf16_note(args.dtype, model=target):  # once the run goes ahead: a refusal stays one line
        print(note, file=sys.stderr)
    n_layers, KH, E = target.kv_dims
    t0, done_pos = time.perf_counter(), 0
    for c0 in range(0, len(seqs), args.chunk):
        part = out / f"part-{c0 // args.chunk:05d}.pt"
        chunk = seqs[c0:c0 + args.chunk]
        digest = replies_digest(chunk)
        if part.exists():
            # done, unless the set grew since (a last part written short), its replies are others
            # under the same ids (`distill data` redone), or it is damaged: then redone
            try:
                d = torch.load(part, map_location="cpu", weights_only=True)
                if d["ids"] == [r[0] for r in chunk] and d.get("data") == digest:
                    continue
            except Exception:
                pass
        res: dict[str, tuple] = {}
        order = sorted(range(len(chunk)), key=lambda i: len(chunk[i][1]))
        for g in range(0, len(order), args.batch):
            rows = [chunk[i] for i in order[g:g + args.batch]]
            B, L = len(rows), max(len(r[1]) for r in rows)
            tokens = torch.zeros(B, L, dtype=torch.long)
            key_ok = torch.zeros(B, L, dtype=torch.bool)
            for b, (_, toks, _) in enumerate(rows):
                tokens[b, :len(toks)] = torch.tensor(toks)
                key_ok[b, :len(toks)] = True
            pos = torch.arange(L).expand(B, L)
            k_buf = torch.zeros(n_layers, B, KH, L, E, dtype=target.dtype)
            with torch.inference_mode():
                h = target.forward_batch(tokens, pos, k_buf, torch.zeros_like(k_buf), 0, key_ok)
                for b, (rid, toks, start) in enumerate(rows):
                    probs = torch.softmax(target.logits(h[b, start - 1:len(toks) - 1]).float(), -1)
                    p, t = probs.topk(args.k, dim=-1)
                    res[rid] = (t.to(torch.int32), p.to(torch.float16))
                    done_pos += len(toks) - start
            el = time.perf_counter() - t0
            print(f"\r[{c0 + g + B}/{len(seqs)}] {done_pos / el:6.0f} positions/s", end="", file=sys.stderr, flush=True)
        ids = [r[0] for r in chunk]
        torch.save({"ids": ids, "lens": [res[i][0].shape[0] for i in ids], "tok": torch.cat([res[i][0] for i in ids]),
                    "p": torch.cat([res[i][1] for i in ids]), "data": digest}, part.with_suffix(".tmp"))
        part.with_suffix(".tmp").replace(part)
    print(file=sys.stderr)
    return 0


TOPK_RECORD = "topk.json"  # what a top-k directory's parts were made with (cmd_topk)


def read_topk_record(out: Path, args: argparse.Namespace) -> dict | None:
    """What OUT's parts were made with (OUT/topk.json: {"target", "weights", "compute", "k",
    "chunk"}), or None where OUT holds no part yet. Checked here, before the target loads: a part
    of another --chunk (every part would be redone, the old layout's last ones left beside the new
    for `train --kd` to read), a damaged record, and parts without one. Those were written before
    runs recorded their target (session 42), so nothing says which target made them: resuming
    with another would mix two targets' top-k in one set, silently (the defect this record fixes);
    they are refused, never guessed at."""
    from .errors import SpecchatError

    start_over = f"remove {out} to start over"
    parts = sorted(out.glob("part-*.pt"))
    path = out / TOPK_RECORD
    if not parts:
        return None  # nothing to mix with: a record left by a run stopped before its first part binds nothing
    if not path.exists():
        raise SpecchatError(f"{out}: its {len(parts)} part(s) were written before `distill topk` recorded the target and "
                            f"settings that made them ({TOPK_RECORD}), so they cannot be matched to this run; {start_over}")
    try:
        have = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(have, dict):
            raise ValueError
    except (OSError, UnicodeDecodeError, ValueError):
        raise SpecchatError(f"{path}: damaged (the target and settings {out}'s parts were made with); fix it, "
                            f"or {start_over}") from None
    for key, value in (("k", args.k), ("chunk", args.chunk)):
        if have.get(key) != value:
            raise SpecchatError(f"{out}: its parts were made with --{key} {have.get(key)}, this run has {value}; give the same "
                                f"to resume, or {start_over}")
    return have


def check_topk_record(out: Path, have: dict | None, want: dict) -> None:
    """The loaded target (its name and weights, weights_digest) and compute type are the ones
    OUT's parts were made with (a one-line error otherwise: parts of two targets, or of bf16 and
    fp32, in one set); then OUT/topk.json records this run's (``want``)."""
    from .errors import SpecchatError

    if have is not None:
        start_over = f"remove {out} to start over"
        if (have.get("target"), have.get("weights")) != (want["target"], want["weights"]):
            def who(r: dict) -> str:
                return f"{r.get('target')!r} (weights sha256 {str(r.get('weights'))[:12]})"

            raise SpecchatError(f"{out}: its parts were made by target {who(have)}, this run's is {who(want)}; resume with "
                                f"that target, or {start_over}")
        if have.get("compute") != want["compute"]:
            raise SpecchatError(f"{out}: its parts were computed in {have.get('compute')}, this run's target computes in "
                                f"{want['compute']}; give the --dtype that made them to resume, or {start_over}")
    path, tmp = out / TOPK_RECORD, out / f".{TOPK_RECORD}.tmp"
    try:
        tmp.write_text(json.dumps(want) + "\n", encoding="utf-8")
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise SpecchatError(f"{path}: cannot write ({e.strerror or e})") from None


def weights_digest(path: Path) -> str:
    """sha256 of the files that decide a model's numbers: a .gguf file, or a directory's
    config.json and weights (*.safetensors, *.bin, *.gguf) in name order, contents only (a model
    moved, renamed or on another machine is the same one). The name alone cannot tell two
    checkpoints apart (runs/v1/model.gguf and runs/v2/model.gguf are both "model.gguf"); a full
    read costs ~1 s a GB, little beside a top-k run's hours."""
    import hashlib

    from .errors import SpecchatError

    files = [path] if path.is_file() else sorted(
        f for f in path.iterdir() if f.is_file() and (f.name == "config.json" or f.suffix in (".safetensors", ".bin", ".gguf")))
    h = hashlib.sha256()
    for f in files:
        try:
            with f.open("rb") as fh:
                h.update(f"{f.stat().st_size}\0".encode())
                while block := fh.read(1 << 20):
                    h.update(block)
        except OSError as e:
            raise SpecchatError(f"{f}: cannot read ({e.strerror or e})") from None
    return h.hexdigest()


def replies_digest(chunk: list) -> str:
    """sha256 of a part's replies ((id, prompt + reply ids, reply start) each): a part is done only
    for the very replies it was computed over, not for others that came to carry the same ids."""
    import hashlib

    return hashlib.sha256(json.dumps([list(r) for r in chunk], separators=(",", ":")).encode()).hexdigest()


def load_topk(data_dir: Path, k: int) -> dict:
    """reply id -> (tok int32 (n, k), p fp16 (n, k)) from `distill topk` parts."""
    import torch

    from .errors import SpecchatError

    parts = sorted((data_dir / f"topk{k}").glob("part-*.pt"))
    if not parts:
        raise SpecchatError(f"{data_dir}: no topk{k}/ parts (run `specchat distill topk --data {data_dir} --k {k}`)")
    out = {}
    for part in parts:
        d = torch.load(part, map_location="cpu", weights_only=True)
        o = 0
        for rid, n in zip(d["ids"], d["lens"]):
            out[rid] = (d["tok"][o:o + n], d["p"][o:o + n])
            o += n
    return out


def pack(seqs: list, seq_len: int, pad: int, kd: int = 0):
    """Pack sequences into rows of ``seq_len`` tokens; the loss covers the predictions of reply
    tokens only (the first from the last prompt token's hidden state). ``mask[t]`` marks token t as
    a target: the hidden state at t - 1 predicts it.

    With ``kd`` = K, sequences are (toks, start, (tok, p) | None) and two more tensors come back:
    soft targets (rows, seq_len, K) ids (int32) and probabilities (fp16), indexed by the position
    whose hidden state makes the prediction. Positions without top-K data get a one-hot of the
    next token."""
    import torch

    ids, mask = [], []
    for s in seqs:
        toks, start = s[0], s[1]
        ids.extend(toks)
        mask.extend([0] * start + [1] * (len(toks) - start))
    n = max(1, math.ceil(len(ids) / seq_len))
    ids += [pad] * (n * seq_len - len(ids))
    mask += [0] * (n * seq_len - len(mask))
    X, M = torch.tensor(ids).view(n, seq_len), torch.tensor(mask, dtype=torch.bool).view(n, seq_len)
    if not kd:
        return X, M
    flat = X.flatten()
    KT = torch.zeros(n * seq_len, kd, dtype=torch.int32)
    KP = torch.zeros(n * seq_len, kd, dtype=torch.float16)
    KT[:-1, 0] = flat[1:].to(torch.int32)
    KP[:, 0] = 1.0
    o = 0
    for toks, start, soft in seqs:
        if soft is not None and soft[0].shape[0] == len(toks) - start:
            KT[o + start - 1:o + len(toks) - 1] = soft[0][:, :kd]
            KP[o + start - 1:o + len(toks) - 1] = soft[1][:, :kd]
        o += len(toks)
    return X, M, KT.view(n, seq_len, kd), KP.view(n, seq_len, kd)


def _as_bytes(target_tok, ids: list[int], start: int, eos: int) -> tuple[list[int], int]:
    """(prompt + reply token ids, reply start) -> the same text as byte ids, EOS-terminated."""
    prompt = list(target_tok.decode(ids[:start], skip_special_tokens=False).encode("utf-8"))
    reply = [t for t in ids[start:] if t not in target_tok.eos_ids]
    return prompt + list(target_tok.decode(reply).encode("utf-8")) + [eos], len(prompt)


def pca_embedding(embed, d: int):
    """Project the target's (V, D) embedding onto its top-``d`` principal directions, rescaled to
    the initialiser's usual magnitude."""
    import torch

    E = embed.float()
    E = E - E.mean(0, keepdim=True)
    _, _, Vt = torch.linalg.svd(E[:: max(1, E.shape[0] // 8192)], full_matrices=False)  # directions from a subsample
    P = E @ Vt[:d].T
    P = P * (0.02 / P.std())
    if P.shape[1] < d:  # a drafter wider than its target: the remaining directions start at zero
        P = torch.cat([P, P.new_zeros(P.shape[0], d - P.shape[1])], 1)
    return P


def grow_layers(model, n: int) -> int:
    """Deepen a transformers Mamba2ForCausalLM to ``n`` layers in place, the new layers spread
    evenly (after old layer i come its copies); each copy's mixer output projection is zeroed, so
    its residual branch adds nothing until training moves it (the grown model's outputs equal the
    original's exactly). Returns how many layers were added."""
    import copy

    import torch

    layers = model.backbone.layers
    old = len(layers)
    if n <= old:
        return 0
    extra, grown = n - old, []
    for i, layer in enumerate(layers):
        grown.append(layer)
        for _ in range(extra // old + (1 if i < extra % old else 0)):
            blk = copy.deepcopy(layer)
            with torch.no_grad():
                blk.mixer.out_proj.weight.zero_()
                if blk.mixer.out_proj.bias is not None:
                    blk.mixer.out_proj.bias.zero_()
            grown.append(blk)
    for j, blk in enumerate(grown):
        blk.layer_idx = blk.mixer.layer_idx = j
    model.backbone.layers = torch.nn.ModuleList(grown)
    model.config.num_hidden_layers = n
    return extra


def load_for_training(init: Path):
    """A drafter directory as a transformers Mamba2ForCausalLM in fp32; a row-reduced export
    (`distill export --shrink-vocab`) is widened back to the full vocabulary first."""
    import torch
    from transformers import Mamba2Config, Mamba2ForCausalLM

    from .errors import SpecchatError
    from .loading import draft_vocab_of, expand_rows, read_config, read_state_dict

    cfg = read_config(init)
    if cfg.get("model_type") != "mamba2":  # transformers would fail on its config, or load it half at random
        raise SpecchatError(f"--init {init}: a {cfg.get('model_type') or 'untyped'} model, not a Mamba-2 drafter")
    dv = draft_vocab_of(init, cfg.get("vocab_size"))
    if dv is None or dv["row_ids"] is None:
        return Mamba2ForCausalLM.from_pretrained(str(init), dtype=torch.float32)
    sd = expand_rows(read_state_dict(init), dv["row_ids"], dv["vocab_size"], init)
    config = Mamba2Config.from_pretrained(str(init))
    config.vocab_size = dv["vocab_size"]
    model = Mamba2ForCausalLM(config)
    missing, unexpected = model.load_state_dict({k: v.float() for k, v in sd.items()}, strict=False)
    if unexpected or set(missing) - {"lm_head.weight"}:
        raise SpecchatError(f"--init {init}: weights do not fit a Mamba-2 drafter "
                            f"({', '.join((unexpected or sorted(missing))[:3])})")
    model.tie_weights()
    return model


def keep_freed_memory() -> bool:
    """glibc on Linux: serve large blocks from the heap and keep freed memory for reuse. A CPU
    training step allocates and frees its output layer's logits (~0.4 GB); by default glibc maps
    such blocks fresh and unmaps them on free, so every step faults them in again page by page
    (~100k minor faults a second measured in session 30, a fifth of the process's time in the
    kernel). Returns whether the settings took."""
    import ctypes

    if not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl has no mallopt)
    M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_MAX = -1, -2, -4
    return all(mallopt(opt, val) == 1 for opt, val in
               ((M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, (1 << 31) - 1), (M_TOP_PAD, 1 << 30)))


@contextlib.contextmanager
def sigterm_as_interrupt() -> Iterator[None]:
    """Within the block, SIGTERM stops the run as Ctrl-C does (the state saved, exit 130). A run
    started in the background (``nohup ... &``) ignores SIGINT, so ``kill -INT`` did nothing there
    and ``kill`` lost the steps since the last save. Main thread only; the old handler is back on exit."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum, frame):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def read_train_state(path: Path) -> dict:
    """DIR/train_state.pt (tensors only: ``weights_only``); a damaged one is a one-line error and
    stays where it is."""
    import torch

    from .errors import SpecchatError

    try:
        st = torch.load(path, map_location="cpu", weights_only=True)
        if not (isinstance(st, dict) and isinstance(st.get("model"), dict) and isinstance(st.get("opt"), dict)):
            raise TypeError(f"holds a {type(st).__name__} without model and optimiser state")
        int(st["step"]), int(st["order_seed"])
    except Exception as e:  # cut short (EOFError, a zip error), a pickle of other objects, missing keys
        why = " ".join(str(e).split())[:160] or type(e).__name__
        raise SpecchatError(f"{path}: damaged or not a training state ({why}); move it away to start over, "
                            "or use another --out") from None
    return st


def _shape_of(sd: dict) -> str:
    """A drafter state dict's shape in words: vocabulary x width, layers."""
    emb = sd.get("backbone.embeddings.weight")
    layers = {k.split(".")[2] for k in sd if k.startswith("backbone.layers.")}
    size = "x".join(map(str, emb.shape)) if hasattr(emb, "shape") else "no"
    return f"embedding {size}, {len(layers)} layers"


def cmd_train(args: argparse.Namespace) -> int:
    from .mamba2_train import lean_scan

    # transformers' Mamba-2 through a leaner chunked scan (~10-15% off a CPU step)
    with lean_scan(), sigterm_as_interrupt():
        return _train(args)


def _train(args: argparse.Namespace) -> int:
    import torch
    from transformers import Mamba2Config, Mamba2ForCausalLM

    from .errors import SpecchatError
    from .loading import load
    from .mamba2_train import chunked_cross_entropy
    from .registry import load_registry

    if args.threads:
        torch.set_num_threads(args.threads)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" else args.device
    data_dirs, out = [Path(d) for d in args.data], Path(args.out)
    if args.kd and len(data_dirs) > 1:
        raise SpecchatError("--kd reads the top-k targets of one --data directory; give one")
    data_dir = data_dirs[0]
    seqs = [s for d in data_dirs for s in load_sequences(d, with_ids=bool(args.kd))]
    ev = load_sequences(Path(args.eval_data)) if args.eval_data else None  # damaged: fails now, not after training
    ensure_dir(out, "--out")
    if args.kd:
        if args.byte_level:
            raise SpecchatError("--kd needs the target's vocabulary; it does not combine with --byte-level")
        soft = load_topk(data_dir, args.kd)
        seqs = [(toks, start, soft.get(rid)) for rid, toks, start in seqs]
        print(f"top-{args.kd} targets for {sum(s[2] is not None for s in seqs)}/{len(seqs)} replies", file=sys.stderr)
    if len(seqs) < 2:
        raise SpecchatError(f"{data_dir}: only {len(seqs)} replies; generate more data first")
    # every k-th reply is held out, so the held-out set mixes every prompt kind (templates, the
    # target's own prompts) in the proportions of the data
    every = max(2, round(1 / max(args.holdout, 1e-6)))
    held = [s for i, s in enumerate(seqs) if i % every == 0]
    train = [s for i, s in enumerate(seqs) if i % every != 0]

    if args.tokenizer and args.target:
        raise SpecchatError("--tokenizer stands in for --target: give one of them")
    if args.tokenizer:
        from .tokenizer import Tokenizer

        target = None
        tok = Tokenizer.from_hf_dir(args.tokenizer)
        V = -(-tok.vocab_size // 8) * 8
    else:
        target = load(args.target or "smollm2-135m-instruct", registry=load_registry(args.models))
        tok = target.tokenizer
        V = target.model.vocab_size
    check_vocab((row[0] for row in held + train), tok.vocab_size if args.tokenizer else V, " ".join(map(str, data_dirs)))
    if ev is not None:
        check_vocab((ids for ids, _ in ev), tok.vocab_size if args.tokenizer else V, args.eval_data)
    if args.byte_level:
        # a byte-level drafter (heterogeneous-vocab §3.4: byte drafters suit SLRS): the same replies
        # as UTF-8 bytes, the prompt as the target's rendered chat text (special tokens spelled out)
        from .tokenizer import ByteTokenizer

        target_tok, tok = tok, ByteTokenizer()
        held = [_as_bytes(target_tok, ids, start, tok.EOS) for ids, start in held]
        train = [_as_bytes(target_tok, ids, start, tok.EOS) for ids, start in train]
        V = -(-tok.vocab_size // 8) * 8  # 259 -> 264 rows: padding never seen, never proposed
    heads = 2 * args.d_model // args.head_dim
    cfg = Mamba2Config(vocab_size=V, hidden_size=args.d_model, num_hidden_layers=args.layers, state_size=args.d_state,
                       head_dim=args.head_dim, num_heads=heads, n_groups=1, expand=2, conv_kernel=4, chunk_size=128,
                       tie_word_embeddings=True, bos_token_id=tok.bos_id, eos_token_id=tok.eos_id if tok.eos_id is not None else min(tok.eos_ids, default=None),
                       pad_token_id=tok.pad_id)
    torch.manual_seed(0)
    if args.init:
        init = Path(args.init)
        if not (init / "config.json").exists() or not list(init.glob("*.safetensors")):
            raise SpecchatError(f"--init {init}: not a drafter directory (config.json and *.safetensors expected)")
        model = load_for_training(init)
        if model.config.vocab_size != V:
            what = "the byte vocabulary has" if args.byte_level else "the target has"
            raise SpecchatError(f"--init {init}: vocabulary of {model.config.vocab_size} tokens, {what} {V}")
        if args.grow_layers:
            grow_layers(model, args.grow_layers)
        cfg = model.config
    else:
        if args.grow_layers:
            raise SpecchatError("--grow-layers deepens an --init drafter; a fresh one takes --layers")
        model = Mamba2ForCausalLM(cfg)
    state_path = out / "train_state.pt"
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.95))
    step, order_seed = 0, 0
    resumed_schedule = None  # (the schedule's last step, the warm-up's) as a resumed run left them
    if state_path.exists():
        st = read_train_state(state_path)
        try:
            model.load_state_dict(st["model"])
            opt.load_state_dict(st["opt"])
        except (RuntimeError, ValueError, KeyError) as e:  # a run of another shape saved it: kept, never overwritten
            raise SpecchatError(f"{state_path}: a drafter of another shape than this run's ({_shape_of(st['model'])} "
                                f"saved, {_shape_of(model.state_dict())} here); resume with the options that saved it "
                                f"(--d-model, --layers, --d-state, --head-dim, --byte-level, --init, --grow-layers) "
                                f"or use another --out ({type(e).__name__})") from None
        step, order_seed = int(st["step"]), int(st["order_seed"])
        resumed_schedule = st.get("schedule")
        print(f"resuming at step {step}", file=sys.stderr)
    elif not args.byte_level and not args.init and target is not None:
        with torch.no_grad():
            model.get_input_embeddings().weight.copy_(pca_embedding(target.model.embed, args.d_model))
    del target
    if device == "cpu" and os.environ.get("SPECCHAT_MALLOC_DEFAULTS") != "1":
        keep_freed_memory()  # SPECCHAT_MALLOC_DEFAULTS=1 leaves glibc as it is (for an A/B)
    model.to(device).train()
    cuda = str(device).startswith("cuda")
    amp = args.amp if args.amp != "auto" else ("bf16" if cuda else "off")
    if cuda:
        torch.backends.cuda.matmul.allow_tf32 = True  # fp32 products on tensor cores (eval, and with --amp off)
        torch.backends.cudnn.allow_tf32 = True

    def autocast():
        """The forward pass's precision (--amp): bf16 autocast, or fp32 as it is."""
        return torch.autocast("cuda" if cuda else "cpu", dtype=torch.bfloat16, enabled=amp == "bf16")
    pad = tok.pad_id if tok.pad_id is not None else 0
    if args.kd:
        X, M, KT, KP = pack(train, args.seq_len, pad, args.kd)
        Xh, Mh = pack([s[:2] for s in held], args.seq_len, pad)
    else:
        X, M = pack(train, args.seq_len, pad)
        Xh, Mh = pack(held, args.seq_len, pad)
    evals = []
    if ev is not None:
        if args.byte_level:
            ev = [_as_bytes(target_tok, ids, start, tok.EOS) for ids, start in ev]
        Xe, Me = pack(ev, args.seq_len, pad)
        evals.append(("eval-data", Xe, Me))
    g = torch.Generator().manual_seed(order_seed)
    perm = torch.randperm(X.shape[0], generator=g)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"drafter: {n_params / 1e6:.1f}M params; {X.shape[0]} train rows x {args.seq_len} tokens, {Xh.shape[0]} held out; "
          f"device {device}, forward in {'bf16 autocast' if amp == 'bf16' else 'fp32'}", file=sys.stderr)

    total = args.steps  # the schedule's last step: --steps, or where --time-budget ends

    warm_end = None  # with --time-budget: the warm-up's length, fixed at the first estimate of the schedule's end
    marks = collections.deque(maxlen=6)  # (step, seconds) every 20 steps: the recent rate
    if resumed_schedule is not None and args.time_budget > 0:
        # until the first re-estimate (20 steps) a resumed run follows the schedule it left, not one
        # ending at --steps (its warm-up then ran to step steps/20: 20 steps at ~1% of --lr); a
        # finished one (continued with a new budget) starts its cosine again after the same warm-up
        warm_end = resumed_schedule[1]
        if resumed_schedule[0] > step:
            total = min(args.steps, int(resumed_schedule[0]))

    def lr_at(s: int) -> float:
        warm = warm_end or max(1, total // 20)
        if s < warm:
            return args.lr * (s + 1) / warm
        return args.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, (s - warm) / max(1, total - warm))))

    if args.vocab_min_count > 0 and not args.byte_level:
        # the draft vocabulary: reply tokens (those the loss covers) seen at least N times
        counts = torch.bincount(X[:, 1:][M[:, 1:]].flatten(), minlength=V)
        seen = torch.nonzero(counts >= args.vocab_min_count).flatten().to(device)
        print(f"draft vocabulary: {len(seen)} reply tokens seen >= {args.vocab_min_count} times "
              f"({counts[seen.cpu()].sum().item() / max(1, counts.sum().item()):.1%} of reply tokens)", file=sys.stderr)
    else:
        seen = torch.unique(torch.cat([X.flatten(), torch.tensor([pad])] + ([KT[KP > 0].long()] if args.kd else []))).to(device)
    unseen = torch.ones(V, dtype=torch.bool, device=device)
    unseen[seen] = False
    unseen = torch.nonzero(unseen).flatten()
    remap = torch.full((V,), -1, dtype=torch.long, device=device)
    remap[seen] = torch.arange(len(seen), device=device)
    full_softmax = args.negatives <= 0 or len(unseen) == 0 or args.byte_level
    print(f"softmax over {'all ' + str(V) if full_softmax else f'{len(seen)} seen + {args.negatives} sampled'} tokens", file=sys.stderr)

    def hidden_and_targets(x, m, bucket: int = 0):
        """The hidden states that predict reply tokens, and those tokens. ``bucket``: pad the rows
        up to a multiple of it (target -1: no loss), so the output layer's large blocks come in a
        few sizes a step reuses; with glibc's mmap off (keep_freed_memory) every new size grew
        the heap instead (~150 MB a step until the OOM killer, session 31)."""
        h = model.backbone(x.to(device)).last_hidden_state[:, :-1]
        keep = m[:, 1:].to(device)
        h, y = h[keep], x[:, 1:].to(device)[keep]
        if bucket and len(y) % bucket:
            pad = bucket - len(y) % bucket
            h = torch.cat([h, h.new_zeros(pad, h.shape[1])])
            y = torch.cat([y, y.new_full((pad,), -1)])
        return h, y

    # the output layer's loss a chunk of rows at a time, its gradients made in the forward
    # (mamba2_train.chunked_cross_entropy); SPECCHAT_CHUNKED_CE=0 keeps F.cross_entropy (A/B)
    chunked_ce = os.environ.get("SPECCHAT_CHUNKED_CE", "1").strip().lower() not in ("0", "off", "false", "no")

    def loss_of(x, m, idx):
        with autocast():
            h, y = hidden_and_targets(x, m, bucket=0 if args.kd else 512)
            W = model.get_input_embeddings().weight
            if full_softmax:
                Wl, y_sub = W, y
            else:
                neg = unseen[torch.randint(len(unseen), (args.negatives,), device=device)]
                sub = torch.cat([seen, neg])
                Wl, y_sub = W[sub], torch.where(y >= 0, remap[y.clamp(min=0)], -1)
            if not args.kd and chunked_ce:
                return chunked_cross_entropy(h, Wl, y_sub, mm_dtype=torch.bfloat16 if amp == "bf16" else torch.float32)
            logits = (h @ Wl.T).float()
        if not args.kd:
            # with --vocab-min-count, a target outside the draft vocabulary is a prediction the
            # drafter never makes: it leaves the loss (ignore_index) instead of being forced in
            return torch.nn.functional.cross_entropy(logits, y_sub, ignore_index=-1)
        keep = m[:, 1:].to(device)
        kt = KT[idx][:, :-1].to(device)[keep].long()
        kp = KP[idx][:, :-1].to(device)[keep].float()
        if not full_softmax:
            kp = kp * (remap[kt] >= 0)  # ids outside the softmax: dropped (zero-probability slots already)
            kt = remap[kt].clamp(min=0)
        logq = torch.log_softmax(logits, -1).gather(1, kt)
        covered = kp.sum(1)
        ok = covered > 0
        return -((kp[ok] * logq[ok]).sum(1) / covered[ok]).mean()

    def held_out_metrics(x, m) -> tuple[float, float]:
        """Full-vocabulary loss and top-1 agreement with the target's next token (the drafter's
        top token within its draft vocabulary): the per-token acceptance a greedy chain would see
        under teacher forcing."""
        W = model.get_input_embeddings().weight
        loss_sum, hits, n = 0.0, 0, 0
        for i in range(0, x.shape[0], 4):
            h, y = hidden_and_targets(x[i:i + 4], m[i:i + 4])
            for j in range(0, len(y), 512):
                logits = (h[j:j + 512] @ W.T).float()
                loss_sum += torch.nn.functional.cross_entropy(logits, y[j:j + 512], reduction="sum").item()
                # the drafter proposes from its draft vocabulary only (draft_vocab.json, saved below)
                top = logits.argmax(-1) if full_softmax else seen[logits[:, seen].argmax(-1)]
                hits += int((top == y[j:j + 512]).sum())
                n += len(y[j:j + 512])
        return loss_sum / max(1, n), hits / max(1, n)

    def save_state() -> None:
        tmp = state_path.with_suffix(".tmp")
        try:
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "order_seed": order_seed,
                        "schedule": [total, warm_end]}, tmp)
            tmp.replace(state_path)
        except OSError as e:  # a full disk: the last state saved stays whole, no half file beside it
            tmp.unlink(missing_ok=True)
            raise SpecchatError(f"{state_path}: cannot save the training state at step {step} ({e.strerror or e}); "
                                "the last one saved is kept") from None

    t0 = time.perf_counter()
    first = step
    try:
        while step < total:
            i0 = (step * args.batch) % X.shape[0]
            idx = perm[i0:i0 + args.batch]
            if len(idx) < args.batch:  # next epoch: a new order
                order_seed += 1
                perm = torch.randperm(X.shape[0], generator=torch.Generator().manual_seed(order_seed))
                idx = perm[: args.batch]
            for group in opt.param_groups:
                group["lr"] = lr_at(step)
            loss = loss_of(X[idx], M[idx], idx)
            opt.zero_grad(set_to_none=True)
            if torch.isfinite(loss):  # a batch with no target in the draft vocabulary has no loss (0/0): no update
                loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
            step += 1
            el = time.perf_counter() - t0
            if args.time_budget > 0:
                if el >= args.time_budget:
                    total = step
                elif (step - first) % 20 == 0:
                    # where the schedule ends follows the measured rate (over the last ~100 steps), so a
                    # machine that slows down (or speeds up) midway still ends the cosine on time
                    marks.append((step, el))
                    s0, e0 = marks[0] if len(marks) > 1 else (first, 0.0)
                    total = min(args.steps, step + max(1, int((args.time_budget - el) / ((el - e0) / (step - s0)))))
                    if warm_end is None:
                        warm_end = max(1, total // 20)
            print(f"\rstep {step}/{total} loss {loss.item():.3f} lr {lr_at(step):.2e} {el / 60:.1f} min", end="", file=sys.stderr, flush=True)
            if step % args.save_every == 0:
                save_state()
            if args.eval_every and step % args.eval_every == 0:
                model.eval()
                with torch.no_grad():
                    hl, ha = held_out_metrics(Xh[:16], Mh[:16])
                    extra = "".join(f", {name} loss {l:.3f} top-1 {a:.3f}" for name, Xe, Me in evals
                                    for l, a in [held_out_metrics(Xe, Me)])
                model.train()
                print(f"\nstep {step}: held-out loss {hl:.3f}, top-1 agreement {ha:.3f}{extra}", file=sys.stderr)
    except KeyboardInterrupt:
        save_state()
        print(f"\ninterrupted at step {step}; state saved to {state_path}", file=sys.stderr)
        return 130
    save_state()
    model.eval()
    with torch.no_grad():
        held_loss, held_acc = held_out_metrics(Xh[:32], Mh[:32])
        eval_scores = {name: held_out_metrics(Xe, Me) for name, Xe, Me in evals}
    for name, (l, a) in eval_scores.items():
        print(f"\n{name}: loss {l:.3f}, top-1 agreement {a:.3f}", file=sys.stderr, end="")
    print(f"\nheld-out loss {held_loss:.3f} (perplexity {math.exp(held_loss):.1f}), top-1 agreement {held_acc:.3f}", file=sys.stderr)
    model.to("cpu").save_pretrained(out, safe_serialization=True)
    tok.save(out)
    stale = out / "chain_scorer.json"  # hybrid:K's scorer was fitted to the old weights (specchat distill scorer)
    if stale.exists():
        stale.unlink()
        print(f"removed {stale}: fitted to the weights these replace (refit it with `specchat distill scorer`)", file=sys.stderr)
    if not full_softmax:
        # the tokens the drafter was trained to propose: its output layer shrinks to them at load time
        (out / "draft_vocab.json").write_text(json.dumps({"token_ids": seen.cpu().tolist()}))
    (out / "distill.json").write_text(json.dumps({"data": " ".join(map(str, data_dirs)), "replies": len(seqs), "steps": step, "held_out_loss": held_loss, "held_out_top1": held_acc,
                                                  **{f"{n}_top1": a for n, (_, a) in eval_scores.items()},
                                                  "params": n_params, "args": {k: v for k, v in vars(args).items() if k != "func"}}, indent=1))
    print(f"saved drafter to {out} (load it with --drafter {out})", file=sys.stderr)
    return 0


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


EXPORT_FILES = ("config.json", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                "chat_template.jinja", "draft_vocab.json", "distill.json")


def cmd_export(args: argparse.Namespace) -> int:
    """Weights cast to ``--dtype`` (safetensors), config, tokenizer, draft vocabulary and the training
    record; never train_state.pt. The result loads with ``--drafter DIR``."""
    import shutil

    import torch
    from safetensors import safe_open
    from safetensors.torch import save_file

    from .errors import SpecchatError
    from .loading import read_state_dict

    src, dst = Path(args.src), Path(args.dst)
    weights = sorted(src.glob("*.safetensors"))
    if not (src / "config.json").exists() or not weights:
        raise SpecchatError(f"{src}: not a trained drafter (config.json and *.safetensors expected)")
    if dst.exists() and os.path.samefile(dst, src):
        raise SpecchatError(f"{dst}: --to is the drafter being exported (--from); choose another directory")
    if dst.exists() and not dst.is_dir():
        raise SpecchatError(f"{dst}: --to exists and is not a directory")
    names = [w.name for w in weights] + [n for n in EXPORT_FILES if (src / n).exists()]
    for name in names:  # a file of --to linked to the source's: writing it would rewrite the source
        if (dst / name).exists() and os.path.samefile(dst / name, src / name):
            raise SpecchatError(f"{dst / name}: is {src / name} itself (a link); choose another --to")
    if dst.is_dir():  # every *.safetensors of a drafter directory loads: an earlier export's other shards would too
        other = sorted(p.name for p in dst.glob("*.safetensors") if p.name not in {w.name for w in weights})
        if other:
            raise SpecchatError(f"{dst}: holds other weights ({', '.join(other[:3])}) that would load with the export's; "
                                "choose another --to or remove them")
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    if (args.shrink_vocab or args.head_top or args.head_data) and is_byte_drafter(src):
        opt, why = (("--head-top", "it must be able to propose every byte for the vocabulary bridges to spell any text")
                    if args.head_top or args.head_data else
                    ("--shrink-vocab", "every byte needs an embedding row of its own for it to read any text"))
        raise SpecchatError(f"{src}: a byte-level drafter (256 bytes + specials), which {opt} does not apply to: {why}, "
                            f"and the replies it counts are in the target's tokens, not bytes; export it without {opt}")
    sd = read_state_dict(src)  # the loader's own checks: a damaged file is the one-line error `generate` gives
    shrunk = None
    if args.shrink_vocab:
        sd, shrunk = shrink_rows(src, sd, [Path(d) for d in args.shrink_vocab], args.row_min_count)
    head = None
    if args.head_top or args.head_data:
        if args.head_top <= 0 or not args.head_data:
            raise SpecchatError("--head-top N (N >= 1) and --head-data DIR... go together")
        head = head_top(src, shrunk[1] if shrunk else None, [Path(d) for d in args.head_data], args.head_top)
    ensure_dir(dst, "--to")  # only once everything read is known good
    total = 0
    for w in weights:
        with safe_open(str(w), framework="pt") as f:
            keys = list(f.keys())
        part = {k: sd[k].to(dt).contiguous() if sd[k].is_floating_point() else sd[k] for k in keys}
        tmp = dst / f".{w.name}.tmp"
        try:
            save_file(part, str(tmp), metadata={"format": "pt"})
            os.replace(tmp, dst / w.name)  # replaces a link at dst, never writes through it
            os.chmod(dst / w.name, 0o666 & ~_umask())  # safetensors writes 0600; an export is for others to load
            total += (dst / w.name).stat().st_size
        except OSError as e:
            tmp.unlink(missing_ok=True)
            raise SpecchatError(f"{dst / w.name}: cannot write the weights ({e.strerror or e})") from None
    for name in EXPORT_FILES:
        if (src / name).exists():
            try:
                shutil.copy2(src / name, dst / name)
            except OSError as e:
                raise SpecchatError(f"{dst / name}: cannot write ({e.strerror or e})") from None
    if shrunk is not None:
        cfg, dv = shrunk
        for name, obj in (("config.json", cfg), ("draft_vocab.json", dv)):
            try:
                (dst / name).write_text(json.dumps(obj, indent=1 if name == "config.json" else None) + "\n")
            except OSError as e:
                raise SpecchatError(f"{dst / name}: cannot write ({e.strerror or e})") from None
        print(f"embedding rows: {len(dv['row_ids'])} of {dv['vocab_size']} (one shared by the rest)", file=sys.stderr)
    if head is not None:
        dv, share = head
        try:
            (dst / "draft_vocab.json").write_text(json.dumps(dv) + "\n")
        except OSError as e:
            raise SpecchatError(f"{dst / 'draft_vocab.json'}: cannot write ({e.strerror or e})") from None
        print(f"draft vocabulary: {len(dv['token_ids'])} tokens ({share:.2%} of --head-data's reply tokens)", file=sys.stderr)
    # an earlier export's files this drafter has none of: its draft vocabulary would cut the new one's
    # proposals, its chain scorer was fitted to the weights just replaced
    written = {n for n in EXPORT_FILES if (src / n).exists()} | ({"config.json", "draft_vocab.json"} if shrunk else set())
    written |= {"draft_vocab.json"} if head is not None else set()
    stale = [n for n in (*EXPORT_FILES, "chain_scorer.json") if n not in written and (dst / n).is_file()]
    for name in stale:
        try:
            (dst / name).unlink()
        except OSError as e:
            raise SpecchatError(f"{dst / name}: an earlier export's, cannot remove it ({e.strerror or e})") from None
    if stale:
        print(f"removed {', '.join(stale)} from {dst}: an earlier export's, not this drafter's"
              + (" (refit chain_scorer.json with `specchat distill scorer`)" if "chain_scorer.json" in stale else ""),
              file=sys.stderr)
    print(f"exported {src} -> {dst} ({args.dtype}, {total / 2**20:.1f} MiB of weights)", file=sys.stderr)
    return 0


def is_byte_drafter(src: Path) -> bool:
    """``src``'s tokenizer is a byte vocabulary (256 bytes + specials, `distill train --byte-level`;
    engine/drafters/vocab.is_byte_tokenizer). Such a drafter has no token-level head to cut:
    `--head-top` counted the target's token ids of --head-data's replies as if they were bytes (ids
    5 and 6 kept as bytes 0x05 and 0x06; any id past 263 an "outside the target's vocabulary" error),
    and the draft_vocab.json it wrote was then ignored by the bridge that drafts for a token target
    (it builds its drafter without one) yet applied by `distill scorer` (session 42)."""
    from .drafters.vocab import is_byte_tokenizer
    from .tokenizer import Tokenizer

    return (src / "tokenizer.json").is_file() and is_byte_tokenizer(Tokenizer.from_hf_dir(src))


def head_top(src: Path, dv_json: dict | None, data_dirs: list[Path], n: int) -> tuple[dict, float]:
    """The draft vocabulary (``dv_json``, else ``src``'s draft_vocab.json, else every token) cut to
    its ``n`` tokens most frequent in the replies of ``data_dirs`` (ties: the lower id), and the
    config's end-of-sequence tokens: the draft_vocab.json to write, and the share of those replies'
    tokens it covers. The shipped SmolLM2 drafter's top-1 agreement was the same to four places
    at 8,192 of its 23,341 tokens, its draft step 40% cheaper (bench/results/2026-11-29-session37)."""
    import torch

    from .errors import SpecchatError
    from .loading import draft_vocab_of, read_config

    read_config(src)
    cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    V = int(cfg.get("vocab_size") or 0)
    if dv_json is None:
        dv = draft_vocab_of(src, V)
        dv_json = {"token_ids": dv["token_ids"].tolist()} if dv is not None else {"token_ids": list(range(V))}
        if dv is not None and dv.get("row_ids") is not None:
            dv_json.update(row_ids=dv["row_ids"].tolist(), vocab_size=dv["vocab_size"])
    full = int(dv_json.get("vocab_size", V))
    counts = torch.zeros(full, dtype=torch.long)
    for d in data_dirs:
        seqs = load_sequences(d)
        check_vocab((ids for ids, _ in seqs), full, d)
        replies = [t for ids, start in seqs for t in ids[start:]]
        counts += torch.bincount(torch.tensor(replies, dtype=torch.long), minlength=full)
    if counts.sum() == 0:
        raise SpecchatError(f"{' '.join(map(str, data_dirs))}: no reply tokens to count")
    have, c = dv_json["token_ids"], counts.tolist()
    keep = set(sorted(have, key=lambda t: (-c[t], t))[:n])
    eos = cfg.get("eos_token_id")
    keep |= set(eos if isinstance(eos, list) else [eos]) & set(have)
    out = dict(dv_json, token_ids=sorted(keep))
    return out, float(counts[out["token_ids"]].sum()) / float(counts.sum())


def shrink_rows(src: Path, sd: dict, data_dirs: list[Path], min_count: int) -> tuple[dict, tuple[dict, dict]]:
    """The state dict with its (vocab, d) tensors cut to the rows kept (see `distill export
    --shrink-vocab`), and the config and draft vocabulary that describe them."""
    import torch

    from .errors import SpecchatError
    from .loading import ROW_KEYS, draft_vocab_of, read_config

    read_config(src)  # the loader's checks (a one-line error); the raw JSON is rewritten as it was
    cfg = json.loads((src / "config.json").read_text(encoding="utf-8"))
    V = int(cfg.get("vocab_size") or 0)
    dv = draft_vocab_of(src, V)
    if dv is None:
        raise SpecchatError(f"{src}: no draft_vocab.json (train with --vocab-min-count); nothing says which rows it proposes")
    if dv["row_ids"] is not None:
        raise SpecchatError(f"{src}: its embedding is row-reduced already")
    counts = torch.zeros(V, dtype=torch.long)
    for d in data_dirs:
        seqs = load_sequences(d)
        check_vocab((ids for ids, _ in seqs), V, d)
        counts += torch.bincount(torch.tensor([t for ids, _ in seqs for t in ids], dtype=torch.long), minlength=V)
    keep = counts >= max(1, min_count)
    keep[dv["token_ids"]] = True
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = cfg.get(k)
        for t in (v if isinstance(v, list) else [v]):
            if isinstance(t, int) and 0 <= t < V:
                keep[t] = True
    try:  # the tokenizer's special (added) tokens: chat markers a prompt may hold
        for a in json.loads((src / "tokenizer.json").read_text(encoding="utf-8")).get("added_tokens", []):
            if isinstance(a.get("id"), int) and 0 <= a["id"] < V:
                keep[a["id"]] = True
    except (OSError, ValueError, AttributeError):
        pass
    rows = torch.nonzero(keep).flatten()
    rest = torch.nonzero(~keep).flatten()
    out, hit = dict(sd), False
    for k, w in sd.items():
        if k.endswith(ROW_KEYS) and w.dim() == 2 and w.shape[0] == V:
            shared = w[rest].float().mean(0, keepdim=True).to(w.dtype) if len(rest) else w.new_zeros(1, w.shape[1])
            out[k], hit = torch.cat([w[rows], shared]), True
    if not hit:
        raise SpecchatError(f"{src}: no embedding of {V} rows to shrink")
    row_ids = rows.tolist() + [-1]
    return out, ({**cfg, "vocab_size": len(row_ids)},
                 {"token_ids": dv["token_ids"].tolist(), "row_ids": row_ids, "vocab_size": V})
